--- bench/cache/reference.lua -- the same two tiers as esx.cache in plain Lua, with Lua tables
-- as reader sets.  It is the baseline of the benchmark (bench/cache/run) and the reference
-- model of the randomized test (spec/cache_spec.lua): same options (without max_bytes,
-- shared, lock_timeout, wait), same answers, same load counts, no memory bound.


local _M = {}
local Ref = {}
Ref.__index = Ref

function _M.new(opts)
  return setmetatable({
    load_page = opts.load_page, load_readers = opts.load_readers,
    page_ttl = opts.page_ttl or 5000, readers_ttl = opts.readers_ttl or 600000,
    max_pages = opts.max_pages or 10,
    clock = opts.clock or os.clock,
    pages = {}, readers = {},
    stats = { page_loads = 0, readers_loads = 0 },
  }, Ref)
end

local function load(fn, arg)
  local ok, v = pcall(fn, arg)
  if not ok or not v then return nil, "load" end
  return v
end

function Ref:get_page(page_no)
  local now = self.clock()
  local e = self.pages[page_no]
  if e and now < e.expires then return e.list end
  self.pages[page_no] = nil
  self.stats.page_loads = self.stats.page_loads + 1
  local list, err = load(self.load_page, page_no)
  if not list then return nil, err end
  if page_no <= self.max_pages then
    self.pages[page_no] = { list = list, expires = now + self.page_ttl }
  end
  return list
end

function Ref:get_set(article)
  local now = self.clock()
  local e = self.readers[article]
  if e and now < e.expires then return e.set end
  self.readers[article] = nil
  self.stats.readers_loads = self.stats.readers_loads + 1
  local list, err = load(self.load_readers, article)
  if not list then return nil, err end
  local set = {}
  for i = 1, #list do set[list[i]] = true end
  self.readers[article] = { set = set, expires = now + self.readers_ttl }
  return set
end

function Ref:read_articles(user_id, page_no)
  local list, err = self:get_page(page_no)
  if not list then return nil, err end
  local out = {}
  for i = 1, #list do
    local a = list[i]
    local set, serr = self:get_set(a.id)
    if not set then return nil, serr end
    local copy = {}
    for k, v in pairs(a) do copy[k] = v end
    copy.read = set[user_id] == true
    out[i] = copy
  end
  return out
end

function Ref:has_read(article_id, user_id)
  local set, err = self:get_set(article_id)
  if not set then return nil, err end
  return set[user_id] == true
end

function Ref:mark_read(article_id, user_id)
  local e = self.readers[article_id]
  if e then e.set[user_id] = true end
  return true
end

function Ref:invalidate_article(article_id)
  self.readers[article_id] = nil
  return true
end

function Ref:invalidate_pages()
  self.pages = {}
  return true
end

return _M
