-- tools/oom/cache.lua SCOPE COUNT [shared] -- run under tools/failmalloc.c (LD_PRELOAD): for n = 1,
-- 2, ... the n-th allocation counted during one round of cache calls (misses that load pages
-- and reader sets, hits, read_articles_json, has_read, mark_read, a transaction, invalidations;
-- and COUNT - 1 after it, 0: every one after it) fails.  Each call must give the right answer,
-- return nil, err (a documented kind), or raise Lua's "not enough memory"; never a wrong
-- answer, a crash or a hang.  After each round the cache must answer right again.  Two passes:
-- a new cache per round (its first loads), then one cache for every round.
-- Prints "FAIL ..." per violation, then "done <sweeps> <injected> <failures>".
--
-- Scope "esx thread" (esx's own allocations) is what the spec runs.  Any scope that also
-- fails libroaring's allocations ("thread", "") crashes: CRoaring 0.2.66 (Debian 12's
-- libroaring0) does not check what its malloc/realloc return (roaring_bitmap_add_checked,
-- called by esx_rset_add for mark_read, writes through NULL), and has no allocator hook.
local fm = require "failmalloc"
local esx = require "esx"

local scope, count, shared = arg[1] or "esx", tonumber(arg[2]) or 1, arg[3] == "shared"
local fails = 0
local function fail(...) fails = fails + 1; print("FAIL", ...) end

-- the truth: articles 1..60, 20 a page; article a read by users a, a+1000, ... (100 readers)
-- and by every user that mark_read marked
local marked = {}
local function readers(a)
  local ids = {}
  for i = 0, 99 do ids[#ids + 1] = a + 1000 * i end
  for u in pairs(marked[a] or {}) do ids[#ids + 1] = u end
  return ids
end
local function is_reader(a, u) return (u - a) % 1000 == 0 and u >= a and u < a + 100000 or (marked[a] or {})[u] == true end

local function make() return assert(esx.cache{
  load_page = function(p)
    local list = {}
    for i = 1, 20 do
      local id = (p - 1) * 20 + i
      list[i] = { id = id, title = "article " .. id, tags = { "a", "b" } }
    end
    return list
  end,
  load_readers = readers,
  max_bytes = 1048576, shared = shared,
}) end
local cache = make()

local kinds = { internal = true, nomem = true } -- (no loader here fails: "load" would be esx's own failure blamed on it)

local function check_list(n, what, list, user, page)
  for i, a in ipairs(list) do
    local id = (page - 1) * 20 + i
    if a.id ~= id then fail(n, what, "article", i, "is", a.id) return end
    if a.read ~= is_reader(id, user) then fail(n, what, "article", id, "read", a.read, "for", user) return end
  end
  if #list ~= 20 then fail(n, what, "length", #list) end
end

local function outcome(n, what, ok, v, err)
  if not ok then
    if not tostring(v):find("not enough memory", 1, true) then fail(n, what, "raised", tostring(v)) end
    return nil
  end
  if v == nil then
    if type(err) ~= "table" or not kinds[err.kind] then
      fail(n, what, "error", type(err) == "table" and err.kind or "?", tostring(err))
    end
    return nil
  end
  return v
end

local user = 7
local function round(n, checked)
  local page = n % 3 + 1
  local list = outcome(n, "read_articles", pcall(cache.read_articles, cache, user, page))
  if list then check_list(n, "read_articles", list, user, page) end
  local json = outcome(n, "read_articles_json", pcall(cache.read_articles_json, cache, 1000 + page, page))
  if json and not json:find('"id":' .. ((page - 1) * 20 + 1), 1, true) then fail(n, "json", json:sub(1, 80)) end
  local a = n % 60 + 1
  local r = outcome(n, "has_read", pcall(cache.has_read, cache, a, a + 2000))
  if r ~= nil and r ~= true then fail(n, "has_read", a, r) end
  -- mark_read: the set grows (a new container for a far id)
  local u = 5000000 + n * 70000
  marked[a] = marked[a] or {}
  marked[a][u] = true
  local ok, m, merr = pcall(cache.mark_read, cache, a, u)
  if not ok or not m then
    -- the mark is lost in the cache: the set must then be dropped, or reads would lie
    marked[a][u] = nil
    outcome(n, "mark_read", ok, m, merr)
    if ok then fail(n, "mark_read", "returned", tostring(merr)) end
    -- (whether the cache still says false for u is checked below, against a fresh load)
    marked[a][u] = true
  end
  if n % 5 == 0 then outcome(n, "invalidate_pages", pcall(cache.invalidate_pages, cache)) end
  local tx = cache:transaction()
  outcome(n, "tx:mark_read", pcall(tx.mark_read, tx, a, u + 1))
  marked[a][u + 1] = true
  outcome(n, "tx:commit", pcall(tx.commit, tx))
end

local n, injected_total, seq = 0, 0, 0
round(0)
for pass = 1, 2 do
local clean, at = 0, 0
while clean < 3 and at < 5000 do
  at, seq = at + 1, seq + 1
  n = seq
  if pass == 1 then cache:close(); cache = make(); marked = {} end
  fm.arm(at, count, scope)
  round(n)
  local injected = fm.disarm()
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  -- without faults, every answer is right: has_read for the marks of this round
  local a = n % 60 + 1
  for _, u in ipairs{ 5000000 + n * 70000, 5000000 + n * 70000 + 1, a + 2000, a + 3 } do
    local r, err = cache:has_read(a, u)
    if r ~= is_reader(a, u) then fail(n, "after the round: has_read", a, u, tostring(r), tostring(err)) end
  end
  local list, err = cache:read_articles(user, 1)
  if not list then fail(n, "after the round: read_articles", tostring(err)) else check_list(n, "after", list, user, 1) end
end
end
local st = cache:stats()
print("stats", st.bytes, st.max_bytes)
cache:close()
print("done", n, injected_total, fails)
