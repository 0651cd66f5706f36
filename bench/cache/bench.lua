--- bench/cache/bench.lua -- the seed's scenario, esx.cache side by side with the pure-Lua
-- reference (bench/cache/reference.lua: the same two tiers with Lua tables as sets), in one
-- run of one Lua (lua5.4 or luajit).  Prints markdown table rows; bench/cache/run collects
-- them into bench/results/cache.md.
--
--   lua5.4 bench/cache/bench.lua [quick]
--
-- Memory: esx reports what it holds (stats().bytes: each structure and container as the block
-- malloc takes for it); the reference's memory is the Lua heap growth
-- (collectgarbage("count")) while it holds the same sets.  Speed: read_articles calls per
-- second for pages of 20 articles, every reader set cached, random users.
package.path = "./lua/?.lua;./lua/?/init.lua;./?.lua;" .. package.path

local esx = require "esx"
local reference = require "bench.cache.reference"
local flavour = require("esx.core").flavour

local quick = arg and arg[1] == "quick"
local ARTICLES = 100
local READERS = quick and 20000 or 100000
local ID_SPACE = quick and 200000 or 1000000
local PAGE_SIZE = 20
local CALLS = quick and 20000 or 200000

local clock = os.clock
local random = math.random

local function heap_kb()
  collectgarbage("collect")
  collectgarbage("collect")
  return collectgarbage("count")
end

-- readers[a] = list of READERS distinct ids below ID_SPACE (partial Fisher-Yates).
local function dense_readers(seed)
  math.randomseed(seed)
  local pool = {}
  for i = 1, ID_SPACE do pool[i] = i - 1 end
  local out = {}
  for a = 1, ARTICLES do
    local list = {}
    for i = 1, READERS do
      local j = random(i, ID_SPACE)
      pool[i], pool[j] = pool[j], pool[i]
      list[i] = pool[i]
    end
    out[a] = list
  end
  return out
end

local function sparse_readers(seed, n, max_id)
  math.randomseed(seed)
  local out = {}
  for a = 1, ARTICLES do
    local list, seen = {}, {}
    while #list < n do
      local id = random(0, max_id)
      if not seen[id] then seen[id] = true list[#list + 1] = id end
    end
    out[a] = list
  end
  return out
end

local function pages_of(n_articles)
  local pages = {}
  for a = 1, n_articles do
    local p = math.floor((a - 1) / PAGE_SIZE) + 1
    pages[p] = pages[p] or {}
    table.insert(pages[p], { id = a, title = "Article number " .. a, author = "member" .. (a % 97),
                             created_at = 1700000000000 + a })
  end
  return pages
end

local function make(kind, readers, pages)
  local opts = {
    load_page = function(p) return pages[p] end,
    load_readers = function(a) return readers[a] end,
    max_pages = 10, page_ttl = 1e12, readers_ttl = 1e12,
  }
  if kind == "esx" then
    opts.max_bytes = 1024 * 1024 * 1024
    return esx.cache(opts)
  end
  return reference.new(opts)
end

-- Loads every reader set; returns bytes held (esx: stats; reference: heap growth).
local function fill(kind, readers, pages)
  local before = heap_kb()
  local c = make(kind, readers, pages)
  for a = 1, ARTICLES do assert(c:has_read(a, 0) ~= nil) end
  for p = 1, #pages do assert(c:read_articles(0, p)) end
  local bytes
  if kind == "esx" then
    bytes = c:stats().bytes
  else
    bytes = (heap_kb() - before) * 1024
  end
  return c, bytes
end

local function rate(c, pages)
  local n_pages = #pages
  for i = 1, 1000 do c:read_articles(random(0, ID_SPACE - 1), (i % n_pages) + 1) end
  local t0 = clock()
  local read = 0
  for i = 1, CALLS do
    local list = c:read_articles(random(0, ID_SPACE - 1), (i % n_pages) + 1)
    if list[1].read then read = read + 1 end
  end
  local dt = clock() - t0
  return CALLS / dt, read
end

-- read_articles/s while an article is "added" (invalidate_pages) every 100 calls: the seed's
-- TPS drop on every new post came from evicting every per-user entry.
local function rate_invalidating(c, pages)
  local n_pages = #pages
  local t0 = clock()
  for i = 1, CALLS do
    if i % 100 == 0 then c:invalidate_pages() end
    c:read_articles(random(0, ID_SPACE - 1), (i % n_pages) + 1)
  end
  return CALLS / (clock() - t0)
end

local ok_cjson, cjson = pcall(require, "cjson")

-- JSON pages per second: esx read_articles_json vs the reference's read_articles + cjson.
local function rate_json(kind, c, pages)
  if kind ~= "esx" and not ok_cjson then return nil end
  local n_pages = #pages
  local f
  if kind == "esx" then
    f = function(u, p) return c:read_articles_json(u, p) end
  else
    f = function(u, p) return cjson.encode(c:read_articles(u, p)) end
  end
  for i = 1, 1000 do f(random(0, ID_SPACE - 1), (i % n_pages) + 1) end
  local t0 = clock()
  local bytes = 0
  for i = 1, CALLS do bytes = bytes + #f(random(0, ID_SPACE - 1), (i % n_pages) + 1) end
  return CALLS / (clock() - t0)
end

local function fmt(n)
  if n >= 1e6 then return string.format("%.1f M", n / 1e6) end
  if n >= 1e3 then return string.format("%.1f k", n / 1e3) end
  return string.format("%.2f", n)
end

local rows = {}
local function row(...) rows[#rows + 1] = "| " .. table.concat({ ... }, " | ") .. " |" end

-- Each implementation is measured alone (the other's heap freed), so that neither pays for
-- the other's garbage collection.
local function measure(kind, gen, pages)
  local readers = gen()
  local c, bytes = fill(kind, readers, pages)
  -- the loaders' input lists are not needed any more (TTLs are infinite): drop them so that
  -- neither implementation's speed pays for garbage collection over them
  for a = 1, ARTICLES do readers[a] = nil end
  collectgarbage("collect")
  local r = rate(c, pages)
  local rj = rate_json(kind, c, pages)
  local ri = rate_invalidating(c, pages)
  if kind == "esx" then c:close() end
  c = nil
  collectgarbage("collect")
  return bytes, r, rj, ri
end

local function scenario(label, gen, n_readers, pages)
  local total = ARTICLES * n_readers
  local ebytes, erate, ejson, einv = measure("esx", gen, pages)
  local rbytes, rrate, rjson, rinv = measure("ref", gen, pages)
  row(flavour, "memory, " .. label,
    string.format("%.2f B/reader (%s B)", ebytes / total, fmt(ebytes)),
    string.format("%.2f B/reader (%s B)", rbytes / total, fmt(rbytes)),
    string.format("1/%.1f", rbytes / ebytes))
  row(flavour, "read_articles/s (pages of 20), " .. label, fmt(erate), fmt(rrate),
    string.format("%.2fx", erate / rrate))
  row(flavour, "read_articles/s with invalidate_pages() every 100 calls, " .. label, fmt(einv),
    fmt(rinv), string.format("%.2fx", einv / rinv))
  if rjson then
    row(flavour, "JSON pages/s: read_articles_json vs read_articles + cjson.encode, " .. label,
      fmt(ejson), fmt(rjson), string.format("%.2fx", ejson / rjson))
  end
end

local pages = pages_of(ARTICLES)
-- 1. dense: 100 articles x 100,000 readers among 1,000,000 ids (the input lists exist before
-- and after each fill, so they are not counted)
scenario(string.format("%d articles x %d readers of %d ids", ARTICLES, READERS, ID_SPACE),
  function() return dense_readers(1) end, READERS, pages)
-- 2. sparse: 1,000 readers among ids up to 2^40
scenario("sparse: 100 articles x 1,000 readers among ids < 2^40",
  function() return sparse_readers(2, 1000, 2 ^ 40) end, 1000, pages)

for _, r in ipairs(rows) do print(r) end
