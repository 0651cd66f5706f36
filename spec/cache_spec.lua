-- esx.cache: the two-tier article cache (docs/cache.md).  Runs under Lua 5.4 and LuaJIT.
local esx = require "esx"
local cache_mod = require "esx.cache"
local reference = require "bench.cache.reference"

local cjson = require "cjson"

local MAX_SAFE = 9007199254740991

-- A tiny database the loaders read: pages of articles and readers per article.
local function new_db()
  local db = { pages = {}, readers = {}, page_loads = 0, readers_loads = 0, fail = false }
  function db.load_page(page_no)
    db.page_loads = db.page_loads + 1
    if db.fail then error("db down") end
    local out = {}
    for i, a in ipairs(db.pages[page_no] or {}) do out[i] = { id = a.id, title = a.title } end
    return out
  end
  function db.load_readers(article)
    db.readers_loads = db.readers_loads + 1
    if db.fail then error("db down") end
    local out = {}
    for id in pairs(db.readers[article] or {}) do out[#out + 1] = id end
    table.sort(out)
    return out
  end
  return db
end

local function sample_db()
  local db = new_db()
  db.pages[1] = { { id = 1, title = "one" }, { id = 2, title = "two" }, { id = 3, title = "three" } }
  db.pages[2] = { { id = 4, title = "four" } }
  db.readers[1] = { [7] = true, [8] = true }
  db.readers[2] = { [8] = true, [2 ^ 40 + 5] = true }
  db.readers[3] = {}
  db.readers[4] = { [MAX_SAFE] = true }
  return db
end

local function new_cache(db, extra)
  local opts = { load_page = db.load_page, load_readers = db.load_readers }
  for k, v in pairs(extra or {}) do opts[k] = v end
  return esx.cache(opts)
end

local function flags(list)
  local out = {}
  for i, a in ipairs(list) do out[i] = a.read end
  return out
end

-- Leaves an unreachable object whose finalizer calls f.
local function garbage_with_gc(f)
  if newproxy then
    getmetatable(newproxy(true)).__gc = f
  else
    setmetatable({}, { __gc = f })
  end
end

-- Runs each function in its own coroutine, round-robin, until all are done; returns the
-- results {first, second} of each.
local function run_all(fns)
  local cos, results = {}, {}
  for i, f in ipairs(fns) do cos[i] = coroutine.create(f) end
  local alive = #cos
  local rounds = 0
  while alive > 0 do
    alive = 0
    rounds = rounds + 1
    assert(rounds < 10000, "coroutines never finished")
    for i, co in ipairs(cos) do
      if coroutine.status(co) ~= "dead" then
        local ok, a, b = coroutine.resume(co)
        assert(ok, a)
        if coroutine.status(co) == "dead" then results[i] = { a, b } else alive = alive + 1 end
      end
    end
  end
  return results
end

-- The shared lock slot a key would hash to without the cache's seed (mix64(key ^ kind << 60)
-- % 64): what an outsider who reads src/cache.c computes to crowd ids into one slot.
-- (each flavour's 64-bit arithmetic is syntax the other cannot parse: loaded from text)
local unseeded_lock_slot = assert(load(jit and [[
  local ffi, bit = require "ffi", require "bit"
  return function(kind, key)
    local x = ffi.new("uint64_t", key)
    x = bit.bxor(x, bit.lshift(ffi.new("uint64_t", kind), 60)) + 0x9e3779b97f4a7c15ULL
    x = bit.bxor(x, bit.rshift(x, 30)) * 0xbf58476d1ce4e5b9ULL
    x = bit.bxor(x, bit.rshift(x, 27)) * 0x94d049bb133111ebULL
    return tonumber(bit.bxor(x, bit.rshift(x, 31)) % 64)
  end]] or [[
  return function(kind, key)
    local x = (math.tointeger(key) ~ (kind << 60)) + 0x9e3779b97f4a7c15
    x = (x ~ (x >> 30)) * 0xbf58476d1ce4e5b9
    x = (x ~ (x >> 27)) * 0x94d049bb133111eb
    return (x ~ (x >> 31)) & 63
  end]]))()

describe("esx.cache(opts)", function()
  it("creates a cache with the documented defaults", function()
    local c = new_cache(sample_db())
    local s = c:stats()
    assert.same({ hits = 0, misses = 0, loads = 0, entries = 0, bytes = 0, evictions = 0,
                  expirations = 0 }, s.pages)
    assert.equal(0, s.bytes)
    assert.is_false(s.shared)
    assert.truthy(tostring(c):match("^esx%.cache: cache%d+$"))
    c:close()
  end)

  it("keeps pages 1-10 for 5000 ms and reader sets for 600000 ms by default", function()
    local now, loads = 1000000, { page = 0, readers = 0 }
    local c = esx.cache{ clock = function() return now end,
      load_page = function(p) loads.page = loads.page + 1 return { { id = p } } end,
      load_readers = function() loads.readers = loads.readers + 1 return { 7 } end }
    for p = 1, 11 do assert(c:read_articles(7, p)) end
    assert.same({ 11, 11 }, { loads.page, loads.readers })
    for p = 1, 11 do assert(c:read_articles(7, p)) end
    assert.equal(12, loads.page) -- page 11 only: beyond max_pages
    assert.equal(10, c:stats().pages.entries)
    now = now + 4999
    assert(c:read_articles(7, 1))
    assert.equal(12, loads.page)
    now = now + 1
    assert(c:read_articles(7, 1))
    assert.equal(13, loads.page)
    now = 1000000 + 599999
    assert.is_true(c:has_read(2, 7))
    assert.equal(11, loads.readers)
    now = now + 1
    assert.is_true(c:has_read(2, 7))
    assert.equal(12, loads.readers)
    c:close()
  end)

  it("raises naming the clock option when the clock returns no finite number", function()
    -- a string was reported as "bad argument #2 to 'page_get'" (an internal method), and a
    -- NaN or an infinity read while an entry was stored gave it an expiry that never comes:
    -- the entry was served for ever, whatever the ttl
    for _, bad in ipairs{ "1000", 0 / 0, math.huge, -math.huge } do
      local now, loads = 1000, 0
      local c = esx.cache{ clock = function() return now end, page_ttl = 10,
        load_page = function() loads = loads + 1 return { { id = 1 } } end,
        load_readers = function() return { 7 } end }
      now = bad
      local ok, err = pcall(c.read_articles, c, 7, 1)
      assert.is_false(ok)
      assert.matches("esx.cache: bad option 'clock' (returned ", err, 1, true)
      ok, err = pcall(c.mark_read, c, 1, 7)
      assert.is_false(ok)
      assert.matches("esx.cache: bad option 'clock' (returned ", err, 1, true)
      now = 1000
      assert(c:read_articles(7, 1))
      now = 1000 + 10 -- past page_ttl: loaded again
      assert(c:read_articles(7, 1))
      assert.equal(2, loads)
      c:close()
    end
  end)

  it("raises naming a missing loader", function()
    assert.has_error(function() esx.cache{ load_page = function() end } end,
      "esx.cache: bad option 'load_readers' (required)")
    -- both missing: the same one named in every run and flavour (it was pairs() order)
    assert.has_error(function() esx.cache{} end, "esx.cache: bad option 'load_page' (required)")
    assert.has_error(function() esx.cache() end, "esx.cache: bad option 'load_page' (required)")
  end)

  it("raises naming an unknown option", function()
    local db = new_db()
    assert.has_error(function()
      esx.cache{ load_page = db.load_page, load_readers = db.load_readers, max_byte = 1 }
    end, "esx.cache: bad option 'max_byte' (unknown option)")
  end)

  it("raises naming an option of the wrong type or out of range", function()
    local db = new_db()
    assert.has_error(function() new_cache(db, { page_ttl = "5" }) end,
      "esx.cache: bad option 'page_ttl' (number expected, got string)")
    assert.has_error(function() new_cache(db, { max_bytes = -1 }) end,
      "esx.cache: bad option 'max_bytes' (must be >= 0)")
    assert.has_error(function() new_cache(db, { max_pages = 1.5 }) end,
      "esx.cache: bad option 'max_pages' (integer expected, got non-integer number)")
    assert.has_error(function() new_cache(db, { shared = 1 }) end,
      "esx.cache: bad option 'shared' (boolean expected, got number)")
    -- nginx's semaphore waits take whole ms in a C int: a longer wait would not be one
    assert.has_error(function() new_cache(db, { lock_timeout = math.huge }) end,
      "esx.cache: bad option 'lock_timeout' (must be <= 2147483647)")
    new_cache(db, { lock_timeout = 2147483647 }):close()
  end)

  it("is the same constructor as require('esx.cache').new", function()
    local db = new_db()
    local c = cache_mod.new{ load_page = db.load_page, load_readers = db.load_readers }
    assert.equal(cache_mod.Cache, getmetatable(c))
    c:close()
  end)
end)

describe("cache:read_articles(user_id, page_no)", function()
  it("returns copies of the page's articles with read flags for the user", function()
    local db = sample_db()
    local c = new_cache(db)
    local list = assert(c:read_articles(7, 1))
    assert.same({ { id = 1, title = "one", read = true }, { id = 2, title = "two", read = false },
                  { id = 3, title = "three", read = false } }, list)
    assert.same({ true, true, false }, flags(assert(c:read_articles(8, 1))))
    assert.same({ false, true, false }, flags(assert(c:read_articles(2 ^ 40 + 5, 1))))
    assert.same({ true }, flags(assert(c:read_articles(MAX_SAFE, 2))))
    assert.equal(1 + 1, db.page_loads)
    assert.equal(4, db.readers_loads)
    list[1].title = "changed" -- copies: the cached page is untouched
    assert.equal("one", c:read_articles(7, 1)[1].title)
  end)

  it("counts hits, misses and loads per tier", function()
    local c = new_cache(sample_db())
    c:read_articles(7, 1)
    c:read_articles(8, 1)
    local s = c:stats()
    assert.same({ 1, 1, 1, 1 }, { s.pages.hits, s.pages.misses, s.pages.loads, s.pages.entries })
    assert.same({ 3, 3, 3, 3 }, { s.readers.hits, s.readers.misses, s.readers.loads,
                                  s.readers.entries })
    assert.equal(s.pages.bytes + s.readers.bytes, s.bytes)
  end)

  it("does not cache pages beyond max_pages", function()
    local db = sample_db()
    local c = new_cache(db, { max_pages = 1 })
    c:read_articles(7, 2)
    c:read_articles(7, 2)
    assert.equal(2, db.page_loads)
    c:read_articles(7, 1)
    c:read_articles(7, 1)
    assert.equal(3, db.page_loads)
  end)

  it("in nginx, expires entries after their ttl however the wall clock steps (ngx.now)", function()
    -- the default clock in nginx was ngx.now(), the wall clock: stepped back an hour (NTP,
    -- an operator), a page of page_ttl = 100 ms was served for an hour and 100 ms
    local core = require "esx.core"
    local wall = 1.8e9
    local mod = require("spec.support.ngx").load("esx.cache", { now = function() return wall end,
                                                                sleep = function() end })
    local db = sample_db()
    local c = mod.new{ load_page = db.load_page, load_readers = db.load_readers, page_ttl = 100,
                       readers_ttl = 100 }
    finally(function() c:close() end)
    c:read_articles(7, 1)
    assert.same({ 1, 3 }, { db.page_loads, db.readers_loads })
    wall = wall - 3600 -- the wall clock steps back an hour
    local t0 = core.cache_clock()
    while core.cache_clock() - t0 < 150 do end -- past both ttls
    c:read_articles(7, 1)
    assert.same({ 2, 6 }, { db.page_loads, db.readers_loads })
    wall = wall + 7200 -- and forward two: nothing fresh expires before its ttl
    c:read_articles(7, 1)
    assert.same({ 2, 6 }, { db.page_loads, db.readers_loads })
  end)

  -- With ttl for one tier (and clock, when given), five reads of a page whose reader set and
  -- page do not fit together: the entry of that tier is expired as stored, so it evicts
  -- nothing, is not kept, and the other tier's entry stays (loaded once).
  local function assert_expired_as_stored(ttl, clock)
    local ids = {}
    for i = 1, 1000 do ids[i] = i * 40 end -- a set of ~2 KB: the page and it do not fit together
    for _, kind in ipairs{ "readers", "pages" } do
      local loads = { pages = 0, readers = 0 }
      local c = esx.cache{ max_bytes = 2600, clock = clock,
        readers_ttl = kind == "readers" and ttl or nil,
        page_ttl = kind == "pages" and ttl or nil,
        load_page = function() loads.pages = loads.pages + 1 return { { id = 1, title = "t" } } end,
        load_readers = function() loads.readers = loads.readers + 1 return ids end }
      for _ = 1, 5 do
        assert.same({ { id = 1, title = "t", read = false } }, c:read_articles(7, 1))
      end
      local s = c:stats()
      assert.same({ 0, 0 }, { s.evictions, s[kind].entries })
      assert.equal(1, kind == "readers" and loads.pages or loads.readers)
      assert.equal(5, loads[kind])
    end
  end

  it("does not evict live entries for an entry its ttl of 0 has already expired", function()
    assert_expired_as_stored(0)
  end)

  it("does not evict live entries for an entry a ttl too small to move `now` has already expired", function()
    -- now + ttl == now in floating point (1e-300 ms on a clock at 1e6 ms): expired as stored,
    -- as with a ttl of 0
    assert_expired_as_stored(1e-300, function() return 1e6 end)
  end)

  it("reloads a page after page_ttl and a reader set after readers_ttl", function()
    local db, now = sample_db(), 0
    local c = new_cache(db, { clock = function() return now end, page_ttl = 100,
                              readers_ttl = 1000 })
    c:read_articles(7, 1)
    now = 99
    c:read_articles(7, 1)
    assert.same({ 1, 3 }, { db.page_loads, db.readers_loads })
    now = 100
    c:read_articles(7, 1)
    assert.same({ 2, 3 }, { db.page_loads, db.readers_loads })
    now = 1000
    c:read_articles(7, 1)
    assert.same({ 3, 6 }, { db.page_loads, db.readers_loads })
    assert.equal(3, c:stats().readers.expirations)
  end)

  it("returns nil, err when load_page fails, and caches nothing", function()
    local db = sample_db()
    db.fail = true
    local c = new_cache(db)
    local list, err = c:read_articles(7, 1)
    assert.is_nil(list)
    assert.equal("load", err.kind)
    assert.truthy(err.message:find("db down", 1, true))
    assert.truthy(tostring(err):match("^load: loader failed: "))
    db.fail = false
    assert.truthy(c:read_articles(7, 1))
    assert.equal(2, db.page_loads)
  end)

  it("returns nil, err when load_readers fails, and caches nothing", function()
    local db = sample_db()
    local c = new_cache(db)
    local real = db.load_readers
    c._load_readers = function(a) if a == 2 then error("readers down") end return real(a) end
    local list, err = c:read_articles(7, 1)
    assert.is_nil(list)
    assert.equal("load", err.kind)
    c._load_readers = real
    assert.same({ true, false, false }, flags(assert(c:read_articles(7, 1))))
  end)

  it("returns nil, err when load_page returns bad data", function()
    local c = esx.cache{ load_readers = function() return {} end,
      load_page = function(p)
        if p == 1 then return { { title = "no id" } } end
        if p == 2 then return "nope" end
        if p == 3 then return { 42 } end
        if p == 4 then return nil, "no such page" end
        return { { id = -1 } }
      end }
    local cases = {
      [1] = "bad data from load_page: article 1 has no integer id in [0, 2^53)",
      [2] = "bad data from load_page: load_page did not return a table",
      [3] = "bad data from load_page: article 1 is a number, not a table",
      [4] = "loader returned no data: no such page",
      [5] = "bad data from load_page: article 1 has no integer id in [0, 2^53)",
    }
    for p, message in pairs(cases) do
      local list, err = c:read_articles(1, p)
      assert.is_nil(list)
      assert.same({ "load", message }, { err.kind, err.message })
    end
    assert.equal(0, c:stats().pages.entries)
  end)

  it("returns nil, err when a loader's list has an entry before 1 (a list counted from 0)", function()
    -- {[0] = a, b, c}: its length is 2 and ipairs starts at 1, so entry 0 -- an article, or a
    -- reader whose flag then read false -- was left out without a word, as after a hole
    for _, shared in ipairs{ false, true } do
      local c = esx.cache{ shared = shared, load_readers = function() return {} end,
        load_page = function() return { [0] = { id = 1 }, { id = 2 }, { id = 3 } } end }
      local list, err = c:read_articles(1, 1)
      assert.is_nil(list)
      assert.same({ "load", "bad data from load_page: not a list: entry 0 is not nil (a list starts at 1)" },
        { err.kind, err.message })
      list, err = c:read_articles_json(1, 1)
      assert.is_nil(list)
      assert.equal("load", err.kind)
      assert.equal(0, c:stats().pages.entries)
      c._load_readers = function() return { [-2] = 4, [0] = 7, 8, 9 } end
      local read
      read, err = c:has_read(2, 7)
      assert.is_nil(read)
      assert.same({ "load", "bad data from load_readers: not a list: entry -2 is not nil (a list starts at 1)" },
        { err.kind, err.message })
      assert.equal(0, c:stats().readers.entries)
      c._load_readers = function() return { 7, 8, [1.5] = 3, total = 2 } end -- (not positions)
      assert.is_true(c:has_read(2, 7))
      c:close()
    end
  end)

  it("returns nil, err when a loader's list has a hole (the entries after it were dropped silently)", function()
    -- {a, b, [10] = d}: the list's length is 2 in both flavours, and the 10th article (or
    -- reader) was left out without a word -- shown to nobody, or its reader's flag false
    local function holed(a, b, d) return { a, b, [10] = d } end
    for _, shared in ipairs{ false, true } do
      local c = esx.cache{ shared = shared, load_readers = function() return {} end,
        load_page = function() return holed({ id = 1 }, { id = 2 }, { id = 10 }) end }
      local list, err = c:read_articles(1, 1)
      assert.is_nil(list)
      assert.same({ "load", "bad data from load_page: not a list: entry 3 is nil, entry 10 is not" },
        { err.kind, err.message })
      list, err = c:read_articles_json(1, 1)
      assert.is_nil(list)
      assert.equal("bad data from load_page: not a list: entry 3 is nil, entry 10 is not", err.message)
      assert.equal(0, c:stats().pages.entries)
      c._load_page = function() return { { id = 1, tags = holed(1, 2, 4) } } end -- (nested: any table)
      assert.equal(1, #assert(c:read_articles(1, 1)))
      local entries = c:stats().readers.entries -- (article 1's set, loaded just above)
      c._load_readers = function() return holed(5, 6, 7) end
      local read
      read, err = c:has_read(2, 7)
      assert.is_nil(read)
      assert.same({ "load", "bad data from load_readers: not a list: entry 3 is nil, entry 10 is not" },
        { err.kind, err.message })
      assert.equal(entries, c:stats().readers.entries)
      c._load_readers = function() local l = holed(5, 6, 7); l.total = 3; return l end
      read, err = c:has_read(2, 7)
      assert.equal("bad data from load_readers: not a list: entry 3 is nil, entry 10 is not", err.message)
      -- keys that are not list positions are left alone, as before (a page's own fields)
      c._load_readers = function() return { 5, 6, 7, total = 3 } end
      assert.is_true(c:has_read(2, 7))
      c:close()
    end
  end)

  it("returns nil, err when an article's id is not its own field (metatables are not consulted)", function()
    local Article = { __index = function(t, k) if k == "id" then return rawget(t, "_id") end end }
    for _, shared in ipairs{ false, true } do
      local c = esx.cache{ shared = shared, load_readers = function() return {} end,
        load_page = function(p) return { { id = 9 }, setmetatable({ _id = p }, Article) } end }
      local list, err = c:read_articles(1, 1)
      assert.is_nil(list)
      assert.same({ "load", "bad data from load_page: article 2 has no integer id in [0, 2^53)" },
        { err.kind, err.message })
      assert.equal(0, c:stats().pages.entries)
      c:close()
    end
  end)

  it("returns nil, err when load_readers returns bad data", function()
    local c = esx.cache{ load_page = function() return { { id = 1 } } end,
      load_readers = function() return { 1, 2, -3 } end }
    local list, err = c:read_articles(1, 1)
    assert.is_nil(list)
    assert.same({ "load", "bad data from load_readers: reader 3 is not an integer in [0, 2^53)" },
      { err.kind, err.message })
    c._load_readers = function() return { 1, 2 ^ 53 } end
    list, err = c:read_articles(1, 1)
    assert.same({ "load", "bad data from load_readers: reader 2 is not an integer in [0, 2^53)" },
      { err.kind, err.message })
    c._load_readers = function() return { 1, 2.5 } end
    list, err = c:has_read(1, 1)
    assert.equal("bad data from load_readers: reader 2 is not an integer in [0, 2^53)", err.message)
    -- far outside any integer type, and NaN: refused without converting them (undefined in C)
    for _, bad in ipairs({ 1e300, -1e300, 0 / 0, math.huge }) do
      c._load_readers = function() return { 1, bad } end
      list, err = c:has_read(1, 1)
      assert.equal("bad data from load_readers: reader 2 is not an integer in [0, 2^53)", err.message)
    end
    assert.equal(0, c:stats().readers.entries)
  end)

  it("returns nil, err when the cache is closed", function()
    local c = new_cache(sample_db())
    c:close()
    local list, err = c:read_articles(7, 1)
    assert.is_nil(list)
    assert.same({ "closed", "the cache is closed" }, { err.kind, err.message })
  end)

  it("raises on arguments of the wrong type", function()
    local c = new_cache(sample_db())
    assert.has_error(function() c:read_articles("7", 1) end,
      "bad argument #1 to 'read_articles' (user_id must be an integer in [0, 2^53), got string)")
    assert.has_error(function() c:read_articles(-1, 1) end,
      "bad argument #1 to 'read_articles' (user_id must be an integer in [0, 2^53), got number out of range or not an integer)")
    assert.has_error(function() c:read_articles(7, 0) end,
      "bad argument #2 to 'read_articles' (page_no must be an integer in [1, 2^53), got 0)")
    assert.has_error(function() c:read_articles(7, nil) end,
      "bad argument #2 to 'read_articles' (page_no must be an integer in [1, 2^53), got nil)")
    -- past 2^53 - 1 (not ">= 1", which 2^53 is): the message gives the upper bound too
    assert.has_error(function() c:read_articles(7, 2 ^ 53) end,
      "bad argument #2 to 'read_articles' (page_no must be an integer in [1, 2^53), got " .. tostring(2 ^ 53) .. ")")
    assert.has_error(function() c:read_articles(7, 1.5) end,
      "bad argument #2 to 'read_articles' (page_no must be an integer in [1, 2^53), got 1.5)")
  end)

  it("keeps nested values and other fields of articles", function()
    local c = esx.cache{ load_readers = function() return { 1 } end,
      load_page = function() return { { id = 9, tags = { "a", "b" }, score = 1.5, hot = true } } end }
    local a = c:read_articles(1, 1)[1]
    assert.same({ id = 9, tags = { "a", "b" }, score = 1.5, hot = true, read = true }, a)
  end)
end)

describe("cache:read_articles_json(user_id, page_no)", function()
  it("returns the same list as read_articles, as JSON text", function()
    local db = sample_db()
    local c = new_cache(db)
    for _, u in ipairs{ 7, 8, 2 ^ 40 + 5, 99 } do
      for p = 1, 2 do
        local json = c:read_articles_json(u, p)
        assert.is_string(json)
        assert.same(c:read_articles(u, p), cjson.decode(json))
      end
    end
    assert.equal(2, db.page_loads)
    assert.equal(4, db.readers_loads)
  end)

  it("loads the page and the missing reader sets on a miss, once", function()
    local db = sample_db()
    local c = new_cache(db)
    assert.equal('[{"id":4,"title":"four","read":true}]',
      (c:read_articles_json(MAX_SAFE, 2):gsub('{"title":"four","id":4', '{"id":4,"title":"four"')))
    assert.same({ 1, 1 }, { db.page_loads, db.readers_loads })
    c:read_articles_json(MAX_SAFE, 2)
    assert.same({ 1, 1 }, { db.page_loads, db.readers_loads })
  end)

  it("loads a reader set that cannot be cached once per call, not once per attempt", function()
    for _, extra in ipairs{ { max_bytes = 4000 }, { readers_ttl = 0 } } do
      local big = {}
      for i = 1, 20000 do big[i] = i * 7 end -- ~40 kB as a bitmap: over max_bytes = 4000
      local loads = 0
      local opts = { load_page = function() return { { id = 1, title = "a" }, { id = 2 } } end,
        load_readers = function(a) loads = loads + 1 return a == 1 and big or { 8 } end }
      for k, v in pairs(extra) do opts[k] = v end
      local c = esx.cache(opts)
      c:read_articles(1, 1) -- the page is cached; the set of article 1 is not
      loads = 0
      local json = c:read_articles_json(7, 1)
      assert.same({ { id = 1, title = "a", read = true }, { id = 2, read = false } }, cjson.decode(json))
      -- article 1 once; article 2 (cacheable, except with readers_ttl = 0) at most once
      assert.equal(extra.readers_ttl == 0 and 2 or 1, loads)
      loads = 0
      assert.same({ { id = 1, title = "a", read = false }, { id = 2, read = true } },
        cjson.decode(c:read_articles_json(8, 1)))
      assert.equal(extra.readers_ttl == 0 and 2 or 1, loads)
    end
  end)

  it("counts hits, misses and loads as read_articles does", function()
    local a, b = new_cache(sample_db(), { max_pages = 1 }), new_cache(sample_db(), { max_pages = 1 })
    for _, call in ipairs{ { 7, 1 }, { 8, 1 }, { 7, 2 }, { 9, 2 }, { 7, 1 } } do
      a:read_articles(call[1], call[2])
      b:read_articles_json(call[1], call[2])
    end
    local sa, sb = a:stats(), b:stats()
    assert.same(sa.pages, sb.pages)
    assert.same({ sa.readers.hits, sa.readers.misses, sa.readers.loads },
                { sb.readers.hits, sb.readers.misses, sb.readers.loads })
  end)

  it("counts each lookup once when it falls back to tables (a page cached without its text, a reader set larger than max_bytes)", function()
    local big = {}
    for i = 1, 100000 do big[i] = i * 3 end
    local function pair(page)
      local function mk()
        return esx.cache{ max_bytes = 20000, load_page = function() return page end,
          load_readers = function(id) return id == 1 and big or { 7 } end }
      end
      return mk(), mk()
    end
    for _, page in ipairs{ { { id = 1 }, { id = 2 } },                  -- set 1 is not cacheable
                           { { id = 2, title = string.rep("x", 9000) } } } do -- no room for the text
      local a, b = pair(page)
      for _ = 1, 3 do
        a:read_articles(7, 1)
        b:read_articles_json(7, 1)
      end
      local sa, sb = a:stats(), b:stats()
      assert.same({ 2, 1 }, { sa.pages.hits, sa.pages.misses })
      assert.same(sa.pages, sb.pages)
      assert.same({ sa.readers.hits, sa.readers.misses, sa.readers.loads },
                  { sb.readers.hits, sb.readers.misses, sb.readers.loads })
    end
  end)

  it("encodes pages that are not cached (beyond max_pages) the same way", function()
    local db = sample_db()
    local c = new_cache(db, { max_pages = 1 })
    assert.same(c:read_articles(8, 2), cjson.decode(c:read_articles_json(8, 2)))
    assert.equal(2, db.page_loads)
  end)

  it("answers an empty page with [] whether it is cached or not", function()
    for _, extra in ipairs{ {}, { max_pages = 1 }, { max_bytes = 0 } } do
      local c = esx.cache{ load_page = function() return {} end, load_readers = function() return {} end,
        max_pages = extra.max_pages, max_bytes = extra.max_bytes }
      assert.equal("[]", c:read_articles_json(1, 1)) -- cached, except with max_bytes = 0
      assert.equal("[]", c:read_articles_json(1, 2)) -- beyond max_pages = 1
      assert.equal("[]", c:read_articles_json(1, 2))
    end
  end)

  it("escapes strings and encodes nested values, replacing what JSON cannot hold by null", function()
    local c = esx.cache{ load_readers = function() return { 1 } end,
      load_page = function() return { { id = 1, t = 'a"b\\c\n\1', list = { 1, 2.5, true }, obj = { k = "v" },
                                        empty = {}, f = print, nan = 0 / 0, read = "ignored" } } end }
    local got = cjson.decode(c:read_articles_json(1, 1))
    assert.same({ { id = 1, t = 'a"b\\c\n\1', list = { 1, 2.5, true }, obj = { k = "v" }, empty = {},
                    f = cjson.null, nan = cjson.null, read = true } }, got)
  end)

  it("writes the short escapes, \\u00XX for other control characters, and number keys as strings", function()
    local c = esx.cache{ load_readers = function() return { 1 } end,
      load_page = function() return { { id = 1, t = 'q"\\\t\r\1\127', keys = { [2.5] = "a", [3] = "b", x = 1 } } } end }
    local json = c:read_articles_json(1, 1)
    assert.truthy(json:find('"t":"q\\"\\\\\\t\\r\\u0001\127"', 1, true), json)
    assert.same({ ["2.5"] = "a", ["3"] = "b", x = 1 }, cjson.decode(json)[1].keys)
  end)

  it("writes a table as an array only when its keys are exactly 1..n, in both Lua flavours", function()
    local holes = { 1, 2, 3 }
    holes[1] = nil
    holes.x = "y" -- LuaJIT's #holes is 3, and it has 3 keys: once written [null,2,3]
    local c = esx.cache{ load_readers = function() return { 1 } end,
      load_page = function() return { { id = 1, holes = holes, list = { "a", "b" },
                                         sparse = { [1] = "a", [3] = "c" }, empty = {} } } end }
    local got = cjson.decode(c:read_articles_json(1, 1))[1]
    assert.same({ ["2"] = 2, ["3"] = 3, x = "y" }, got.holes)
    assert.same({ "a", "b" }, got.list)
    assert.same({ ["1"] = "a", ["3"] = "c" }, got.sparse)
    assert.same({}, got.empty)
    c:close()
  end)

  it("writes esx.empty_array and an empty esx.array_mt table as [], as the client's encoder does, cached or not", function()
    local core = require "esx.core"
    local page = function()
      return { { id = 1, tags = esx.empty_array, sizes = setmetatable({}, esx.array_mt),
                 list = setmetatable({ "a", "b" }, esx.array_mt), obj = {}, other = setmetatable({}, {}),
                 -- a document as esx's decoder reads it from Elasticsearch: its [] a table with esx.array_mt
                 src = core.json_decode('{"labels":[],"nested":[[],{"x":[]}]}') } }
    end
    local want = { tags = "[]", sizes = "[]", list = '["a","b"]', obj = "{}", other = "{}" }
    for _, max_bytes in ipairs{ 1e6, 0 } do -- pre-encoded when cached; core.cache_json when not
      local c = esx.cache{ load_readers = function() return { 1 } end, load_page = page, max_bytes = max_bytes }
      local json = c:read_articles_json(1, 1)
      for k, v in pairs(want) do
        assert.truthy(json:find('"' .. k .. '":' .. v, 1, true), k .. " in " .. json)
      end
      local src = cjson.decode(json)[1].src
      assert.truthy(json:find('"labels":[]', 1, true), json)
      assert.truthy(json:find('"nested":[[],{"x":[]}]', 1, true), json)
      assert.equal(2, #src.nested)
      assert.equal(max_bytes > 0 and 1 or 0, c:stats().pages.entries)
      c:close()
    end
    -- the same from core.cache_json directly, at the top level too
    assert.equal("[]", core.cache_json(esx.empty_array))
    assert.equal("[]", core.cache_json(setmetatable({}, esx.array_mt)))
    assert.equal('{"a":[]}', core.cache_json({ a = esx.empty_array }))
  end)

  it("writes an esx.array_mt table with holes as an array with null, as the client's encoder does, cached or not", function()
    local core = require "esx.core"
    local fork = require "spec.support.cjson_fork"
    local cj, restore = fork.install("cjson")
    finally(restore)
    local page = function()
      return { { id = 1, tags = setmetatable({ 1, nil, 3 }, esx.array_mt),
                 lead = setmetatable({ [2] = "b" }, esx.array_mt),
                 nested = { setmetatable({ [3] = { k = setmetatable({ nil, true }, esx.array_mt) } }, esx.array_mt) },
                 ca = setmetatable({ "x", nil, "z" }, cj.array_mt),
                 -- json_encode refuses an excessively sparse array; the page encoder cannot: an object
                 sparse = setmetatable({ [20] = 1 }, esx.array_mt) } }
    end
    local want = { tags = "[1,null,3]", lead = '[null,"b"]', nested = '[[null,null,{"k":[null,true]}]]',
                   ca = '["x",null,"z"]' }
    for _, max_bytes in ipairs{ 1e6, 0 } do -- pre-encoded when cached; core.cache_json when not
      local c = esx.cache{ load_readers = function() return { 1 } end, load_page = page, max_bytes = max_bytes }
      local json = c:read_articles_json(1, 1)
      for k, v in pairs(want) do
        assert.truthy(json:find('"' .. k .. '":' .. v, 1, true), k .. " in " .. json)
        assert.equal(v, core.json_encode(page()[1][k])) -- the client's encoder: the same text
      end
      assert.truthy(json:find('"sparse":{"20":1}', 1, true), json)
      assert.is_nil(core.json_encode(page()[1].sparse))
      c:close()
    end
    assert.equal("[1,null,3]", core.cache_json(setmetatable({ 1, nil, 3 }, esx.array_mt)))
    assert.equal('{"1":1,"3":3}', core.cache_json({ 1, nil, 3 })) -- unmarked: keys exactly 1..n only
  end)

  it("writes OpenResty lua-cjson's empty_array, array_mt and empty_array_mt (empty) as [] when the loaded cjson has them", function()
    local core = require "esx.core"
    local fork = require "spec.support.cjson_fork"
    local cj, restore = fork.install("cjson")
    finally(restore)
    local page = function()
      return { { id = 1, a = cj.empty_array, b = setmetatable({}, cj.array_mt), c = setmetatable({}, cj.empty_array_mt),
                 d = setmetatable({ k = 1 }, cj.empty_array_mt) } }
    end
    for _, max_bytes in ipairs{ 1e6, 0 } do
      local c = esx.cache{ load_readers = function() return { 1 } end, load_page = page, max_bytes = max_bytes }
      local json = c:read_articles_json(1, 1)
      for k, v in pairs{ a = "[]", b = "[]", c = "[]", d = '{"k":1}' } do
        assert.truthy(json:find('"' .. k .. '":' .. v, 1, true), k .. " in " .. json)
      end
      c:close()
    end
    restore() -- unloaded: nothing to esx, as for json_encode (light userdata: null, as before)
    assert.equal("null", core.cache_json(cj.empty_array))
    assert.equal("{}", core.cache_json(setmetatable({}, cj.array_mt)))
  end)

  it("writes numbers that read back as the same number", function()
    local c = esx.cache{ load_readers = function() return { 1 } end,
      load_page = function() return { { id = 1, score = 0.1 + 0.2, big = 2^53, price = 19.99 } } end }
    local json = c:read_articles_json(1, 1)
    assert.truthy(json:find('"score":0.30000000000000004', 1, true), json)
    assert.truthy(json:find('"big":9007199254740992', 1, true), json)
    assert.truthy(json:find('"price":19.99', 1, true), json)
  end)

  it("lists the missing articles of the page it looked up when a finalizer changes the cache meanwhile", function()
    -- read_json read the page's pre-encoded blob between Lua allocations (the list of missing
    -- ids): a __gc that invalidated the page freed the blob under the loop (use after free)
    local core = require "esx.core"
    finally(function()
      collectgarbage("setpause", 200)
      collectgarbage("setstepmul", 200)
    end)
    local c = core.cache_new({ max_bytes = 1e7, page_ttl = 60000, readers_ttl = 60000, max_pages = 10 }, {})
    local now = core.cache_clock()
    local function page(base)
      local l = {}
      for i = 1, 1000 do l[i] = { id = base + i, title = "t" .. i } end
      return l
    end
    local mine, other = page(0), page(100000)
    collectgarbage("setpause", 100)
    collectgarbage("setstepmul", 1000)
    for _ = 1, 5 do
      assert.is_true(c:page_put(1, mine, now, c:seq()))
      local armed, done = false, false
      for _ = 1, 300 do
        garbage_with_gc(function()
          if armed and not done then
            done = true
            c:apply({ 3, 0, 0 }, now)            -- invalidate_pages: frees the blob
            c:page_put(1, other, now, c:seq())   -- and reuses its memory
            c:read_json(1, 1, now)               -- nested: leaves the scratch buffer alone
          end
        end)
      end
      armed = true
      local json, missing = c:read_json(1, 1, now)
      armed = false
      assert.is_nil(json)
      assert.equal(1000, #missing)
      for i, id in ipairs(missing) do
        if id ~= i then assert.equal(i, id) end
      end
    end
  end)

  it("returns nil, err when a loader fails", function()
    local db = sample_db()
    db.fail = true
    local c = new_cache(db)
    local json, err = c:read_articles_json(7, 1)
    assert.is_nil(json)
    assert.equal("load", err.kind)
    db.fail = false
    c:read_articles(7, 1)
    c:invalidate_article(2)
    db.fail = true
    json, err = c:read_articles_json(7, 1)
    assert.is_nil(json)
    assert.equal("load", err.kind)
  end)

  it("returns nil, err when the cache is closed", function()
    local c = new_cache(sample_db())
    c:close()
    local json, err = c:read_articles_json(7, 1)
    assert.is_nil(json)
    assert.equal("closed", err.kind)
  end)

  it("raises on arguments of the wrong type", function()
    local c = new_cache(sample_db())
    assert.has_error(function() c:read_articles_json(7, "1") end,
      "bad argument #2 to 'read_articles_json' (page_no must be an integer in [1, 2^53), got string)")
  end)
end)

describe("cache:has_read(article_id, user_id)", function()
  it("answers from the cached reader set, loading it once", function()
    local db = sample_db()
    local c = new_cache(db)
    assert.is_true(c:has_read(1, 7))
    assert.is_false(c:has_read(1, 9))
    assert.is_true(c:has_read(2, 2 ^ 40 + 5))
    assert.is_false(c:has_read(2, 2 ^ 40 + 6))
    assert.is_false(c:has_read(2, 5))
    assert.is_true(c:has_read(4, MAX_SAFE))
    assert.is_false(c:has_read(99, 7))
    assert.equal(4, db.readers_loads)
  end)

  it("returns nil, err when the loader fails", function()
    local db = sample_db()
    db.fail = true
    local c = new_cache(db)
    local v, err = c:has_read(1, 7)
    assert.is_nil(v)
    assert.equal("load", err.kind)
  end)

  it("returns nil, err when the cache is closed", function()
    local c = new_cache(sample_db())
    c:close()
    local v, err = c:has_read(1, 7)
    assert.is_nil(v)
    assert.equal("closed", err.kind)
  end)

  it("raises on arguments of the wrong type", function()
    local c = new_cache(sample_db())
    assert.has_error(function() c:has_read(nil, 1) end,
      "bad argument #1 to 'has_read' (article_id must be an integer in [0, 2^53), got nil)")
    assert.has_error(function() c:has_read(1, 2 ^ 53) end,
      "bad argument #2 to 'has_read' (user_id must be an integer in [0, 2^53), got number out of range or not an integer)")
  end)

  it("answers correctly for a set larger than max_bytes (not cached)", function()
    local big = {}
    for i = 1, 20000 do big[i] = i * 3 end
    local c = esx.cache{ load_page = function() return {} end,
      load_readers = function() return big end, max_bytes = 4096 }
    assert.is_true(c:has_read(1, 300))
    assert.is_false(c:has_read(1, 301))
    assert.equal(0, c:stats().readers.entries)
    assert.equal(2, c:stats().readers.loads)
  end)
end)

describe("cache:mark_read(article_id, user_id)", function()
  it("updates a cached set in place, without a reload", function()
    local db = sample_db()
    local c = new_cache(db)
    assert.is_false(c:has_read(1, 9))
    assert.is_true(c:mark_read(1, 9))
    assert.is_true(c:mark_read(1, 2 ^ 52))
    assert.is_true(c:has_read(1, 9))
    assert.is_true(c:has_read(1, 2 ^ 52))
    assert.equal(1, db.readers_loads)
    assert.same({ true, false, false }, flags(c:read_articles(9, 1)))
  end)

  -- Exact sizes for CRoaring 0.2.66 and glibc on 64-bit (Debian 12): each block malloc takes
  -- for a struct or payload (its request and size word, rounded up to 16, at least 32: a
  -- run's payload grows inside its block, so the first marks cost nothing).  mark_read keeps the total up to date from the one
  -- container it touched; tools/unit/rset_bytes.c checks such totals against mallinfo2.
  -- (That a mark costs O(log containers) rather than O(readers) is not asserted: no
  -- deterministic measure of cost exists here, and timing would flake.)
  it("keeps the reader tier's bytes exact as marks grow sets, container by container", function()
    local function sizes(ids, marks)
      local c = esx.cache{ load_page = function() return {} end, load_readers = function() return ids end }
      c:has_read(1, 0)
      local out = { c:stats().readers.bytes }
      for _, u in ipairs(marks) do
        c:mark_read(1, u)
        local s = c:stats()
        assert.equal(s.bytes, s.readers.bytes)
        out[#out + 1] = s.readers.bytes
      end
      return out
    end
    local run, array, bitset, scattered, low = {}, {}, {}, {}, {}
    for i = 1, 10000 do run[i] = i end
    for i = 1, 1000 do array[i] = i * 7 end
    for i = 1, 30000 do bitset[i] = i * 2 end
    for i = 1, 5000 do scattered[i] = i * 65536 + 1 end
    for i = 1, 5000 do low[i] = i end
    -- a run container: new runs inside its block, a run extended, an id already there
    assert.same({ 320, 320, 320, 320, 320 }, sizes(run, { 20001, 20003, 10001, 5 }))
    -- an array container grows its capacity once, then has room
    assert.same({ 2304, 3296, 3296, 3296, 3296 }, sizes(array, { 8, 9, 10, 7 }))
    -- a bitset container never grows; 2^20 adds an array container (and the key vectors grow)
    assert.same({ 8496, 8496, 8496, 8592, 8592 }, sizes(bitset, { 1, 3, 2 ^ 20, 2 }))
    -- 5,000 containers: a new first container grows the key vectors
    assert.same({ 375232, 389072, 389072, 389136, 389136 },
      sizes(scattered, { 2, 65536 * 7 + 9, 65536 * 9000 + 1, 3 }))
    -- ids >= 2^32 add parts (a bitmap each, and the part table)
    assert.same({ 320, 512, 688, 688, 832 }, sizes(low, { 2 ^ 40 + 1, 2 ^ 41 + 1, 2 ^ 40 + 2, 2 ^ 42 + 65536 }))
  end)

  it("measures a reader set's memory as the blocks malloc holds, within 5% (tools/unit)", function()
    require("spec.support.unit").run("rset_bytes", "src/cache_rset.c -lroaring", 12)
  end)

  -- The database has the read before mark_read is called; the load in flight read the
  -- database before that.  A caller that marked and then joined that load must see its mark
  -- when the set cannot be cached and it is answered from the loaded list.
  local function join_after_mark(opts, readers, between)
    local gate = false
    local c = esx.cache{ max_bytes = opts.max_bytes, load_page = function() return {} end,
      load_readers = function()
        local snapshot = {}
        for i, v in ipairs(readers) do snapshot[i] = v end
        while not gate do coroutine.yield() end -- a slow query
        return snapshot
      end }
    local a = coroutine.create(function() return c:has_read(1, 42) end)
    assert(coroutine.resume(a)) -- the load starts
    readers[#readers + 1] = 42 -- user 42 reads article 1: the database first,
    opts.mark(c) -- then the cache
    if between then between(c) end
    local b = coroutine.create(function() return c:has_read(1, 42) end)
    assert(coroutine.resume(b))
    assert.equal("suspended", coroutine.status(b)) -- joined the load
    gate = true
    local _, read_a = coroutine.resume(a)
    local ok, read_b, err = coroutine.resume(b)
    assert.is_true(ok)
    assert.same({ true, true }, { read_a, read_b })
    assert.is_nil(err)
    assert.equal(1, c:stats().readers.loads)
    return c
  end

  local function plain_mark(c) assert.is_true(c:mark_read(1, 42)) end
  local function tx_mark(c)
    local tx = c:transaction()
    tx:mark_read(1, 42)
    assert.is_true(tx:commit())
  end

  it("gives the mark to callers joining a load in flight when the set is larger than max_bytes", function()
    for _, mark in ipairs{ plain_mark, tx_mark } do
      local readers = {}
      for i = 1, 5000 do readers[i] = i * 1000 end -- scattered: ~40 kB
      local c = join_after_mark({ max_bytes = 2000, mark = mark }, readers)
      assert.equal(0, c:stats().readers.entries)
    end
  end)

  it("gives the mark to callers joining a load in flight when marks overran the change log", function()
    for _, mark in ipairs{ plain_mark, tx_mark } do
      local c = join_after_mark({ mark = mark }, { 5, 6 }, function(c)
        for i = 1, 5000 do c:mark_read(1000 + i, 7) end -- other users' reads: past the log
      end)
      assert.equal(0, c:stats().readers.entries)
    end
  end)

  it("bounds the marks recorded on a load in flight that was abandoned, and no longer joins it", function()
    local first = true
    local c = esx.cache{ load_page = function() return {} end,
      load_readers = function()
        if first then first = false coroutine.yield() end -- never resumed: a killed light thread
        return { 5 }
      end }
    local abandoned = coroutine.create(function() return c:has_read(1, 0) end)
    assert(coroutine.resume(abandoned))
    assert.equal("suspended", coroutine.status(abandoned))
    collectgarbage()
    collectgarbage()
    local before = collectgarbage("count")
    for u = 1, 100000 do c:mark_read(1, u) end -- article 1 is never read meanwhile
    collectgarbage()
    collectgarbage()
    local grown = collectgarbage("count") - before
    assert.is_true(grown < 256, ("%.0f KiB kept for 100,000 marks"):format(grown))
    -- the next read loads by itself (the database has the reads) rather than wait on it
    local reader = coroutine.create(function() return c:has_read(1, 5) end)
    local ok, read = coroutine.resume(reader)
    assert.is_true(ok)
    assert.equal("dead", coroutine.status(reader))
    assert.is_true(read)
    assert.equal(2, c:stats().readers.loads)
  end)

  it("drops a set that has expired instead of growing it, which evicted a live set", function()
    local big = 2 ^ 40 + 1 -- a mark that adds a part to a set {1}: it grows the set
    local probe = esx.cache{ load_page = function() return {} end, load_readers = function() return { 1 } end }
    probe:has_read(1, 0)
    local one = probe:stats().bytes
    probe:mark_read(1, big)
    local grown = probe:stats().bytes - one
    assert.is_true(grown > 0)
    for _, mark in ipairs{ "plain", "tx" } do
      local t, loads = 0, 0
      local c = esx.cache{ readers_ttl = 100, max_bytes = 2 * one + grown - 1, clock = function() return t end,
        load_page = function() return {} end,
        load_readers = function() loads = loads + 1 return { 1 } end }
      c:has_read(1, 0) -- expires at 100
      t = 50
      c:has_read(2, 0) -- expires at 150
      t = 99
      c:has_read(1, 0) -- a hit: article 2's set is the least recently used
      t = 120 -- article 1's set has expired, article 2's is live
      if mark == "plain" then
        c:mark_read(1, big)
      else
        local tx = c:transaction()
        tx:mark_read(1, big)
        tx:commit()
      end
      local s = c:stats()
      assert.same({ 1, 1, 0, one }, { s.readers.entries, s.readers.expirations, s.evictions, s.bytes })
      assert.is_true(c:has_read(2, 1)) -- still cached
      assert.equal(2, loads)
      assert.is_false(c:has_read(1, big)) -- the database does not have it: loaded again
      assert.equal(3, loads)
    end
  end)

  it("does nothing to an article that is not cached", function()
    local db = sample_db()
    local c = new_cache(db)
    c:mark_read(3, 1)
    assert.equal(0, c:stats().readers.entries)
    assert.is_false(c:has_read(3, 1)) -- the database does not have it
  end)

  it("returns nil, err when the cache is closed", function()
    local c = new_cache(sample_db())
    c:close()
    local ok, err = c:mark_read(1, 1)
    assert.is_nil(ok)
    assert.equal("closed", err.kind)
  end)

  it("raises on arguments of the wrong type", function()
    local c = new_cache(sample_db())
    assert.has_error(function() c:mark_read(1, "x") end,
      "bad argument #2 to 'mark_read' (user_id must be an integer in [0, 2^53), got string)")
  end)
end)

describe("cache:invalidate_pages()", function()
  it("drops tier 1 only: the next read reloads the page, not the reader sets", function()
    local db = sample_db()
    local c = new_cache(db)
    c:read_articles(7, 1)
    table.insert(db.pages[1], 1, { id = 4, title = "four" })
    assert.is_true(c:invalidate_pages())
    local list = c:read_articles(7, 1)
    assert.equal(4, #list)
    assert.equal(2, db.page_loads)
    assert.equal(4, db.readers_loads) -- only the new article's set
  end)

  it("returns nil, err when the cache is closed", function()
    local c = new_cache(sample_db())
    c:close()
    local ok, err = c:invalidate_pages()
    assert.is_nil(ok)
    assert.equal("closed", err.kind)
  end)
end)

describe("cache:invalidate_article(article_id)", function()
  it("drops one reader set", function()
    local db = sample_db()
    local c = new_cache(db)
    c:read_articles(7, 1)
    db.readers[2][7] = true
    assert.is_true(c:invalidate_article(2))
    assert.same({ true, true, false }, flags(c:read_articles(7, 1)))
    assert.equal(4, db.readers_loads)
    assert.equal(1, db.page_loads)
  end)

  it("returns nil, err when the cache is closed", function()
    local c = new_cache(sample_db())
    c:close()
    local ok, err = c:invalidate_article(1)
    assert.is_nil(ok)
    assert.equal("closed", err.kind)
  end)

  it("raises on arguments of the wrong type", function()
    local c = new_cache(sample_db())
    assert.has_error(function() c:invalidate_article({}) end,
      "bad argument #1 to 'invalidate_article' (article_id must be an integer in [0, 2^53), got table)")
  end)
end)

describe("cache:transaction()", function()
  it("applies mark_read and invalidations on commit, in order", function()
    local db = sample_db()
    local c = new_cache(db)
    c:read_articles(7, 1)
    local tx = c:transaction()
    assert.is_true(tx:mark_read(3, 7))
    assert.is_true(tx:invalidate_pages())
    assert.is_true(tx:invalidate_article(1))
    assert.is_true(tx:mark_read(1, 99)) -- after the invalidation: lands on nothing
    assert.is_false(c:has_read(3, 7))
    assert.equal(1, c:stats().pages.entries)
    assert.is_true(tx:commit())
    assert.is_true(c:has_read(3, 7))
    assert.equal(0, c:stats().pages.entries)
    assert.is_false(c:has_read(1, 99)) -- reloaded from the database
    assert.equal(4, db.readers_loads)
  end)

  it("drops everything on rollback", function()
    local c = new_cache(sample_db())
    c:read_articles(7, 1)
    local tx = c:transaction()
    tx:mark_read(3, 7)
    tx:invalidate_pages()
    assert.is_true(tx:rollback())
    assert.is_false(c:has_read(3, 7))
    assert.equal(1, c:stats().pages.entries)
  end)

  it("never lets a load that started before an invalidation put back older data", function()
    local db = sample_db()
    local c = new_cache(db)
    local snapshot = { 7 } -- what the database said when the slow load started
    c._load_readers = function()
      db.readers_loads = db.readers_loads + 1
      local s = snapshot
      coroutine.yield()
      return s
    end
    local co = coroutine.create(function() return c:has_read(1, 8) end)
    assert(coroutine.resume(co)) -- the load is in flight
    local tx = c:transaction()
    tx:invalidate_article(1) -- article 1's readers changed in the database
    tx:commit()
    snapshot = { 7, 8 }
    local ok, answer = coroutine.resume(co)
    assert.is_true(ok)
    assert.is_false(answer) -- the old snapshot answers its own call ...
    c._load_readers = function() db.readers_loads = db.readers_loads + 1 return snapshot end
    assert.is_true(c:has_read(1, 8)) -- ... but was not cached
    assert.equal(2, db.readers_loads)
  end)

  it("never lets a mark recorded before an invalidation of its article put back a read the database dropped", function()
    for _, shared in ipairs{ false, true } do
      local db = sample_db() -- article 1: readers 7 and 8
      local c = new_cache(db, { shared = shared })
      local tx = c:transaction()
      db.readers[1][42] = true -- the transaction's write (its database commit comes first)
      assert.is_true(tx:mark_read(1, 42))
      tx:mark_read(2, 42) -- an article nobody invalidated: marked as usual
      db.readers[1] = { [7] = true } -- then a rewrite of article 1's readers drops 42 ...
      c:invalidate_article(1)
      assert.is_false(c:has_read(1, 42)) -- (... and a read loads the rewritten set)
      assert.is_false(c:has_read(2, 42))
      db.readers[2][42] = true
      assert.is_true(tx:commit()) -- the cache's commit comes last
      assert.equal(db.readers[1][42] == true, c:has_read(1, 42)) -- false: the set was dropped
      assert.equal(3, db.readers_loads) -- ... and loaded again
      assert.is_true(c:has_read(2, 42)) -- marked in place
      assert.equal(3, db.readers_loads)
      -- a mark recorded after the invalidation is applied as usual
      local tx2 = c:transaction()
      db.readers[1][43] = true
      tx2:mark_read(1, 43)
      assert.is_true(tx2:commit())
      assert.is_true(c:has_read(1, 43))
      assert.equal(3, db.readers_loads)
      c:close()
    end
  end)

  it("replays marks made during a load onto its result", function()
    local db = sample_db()
    local c = new_cache(db)
    c._load_readers = function()
      db.readers_loads = db.readers_loads + 1
      coroutine.yield()
      return { 7 }
    end
    local co = coroutine.create(function() return c:has_read(1, 8) end)
    assert(coroutine.resume(co))
    c:mark_read(1, 8)
    assert(coroutine.resume(co))
    assert.is_true(c:has_read(1, 8))
    assert.equal(1, db.readers_loads)
  end)

  it("does not cache a page loaded across invalidate_pages", function()
    local db = sample_db()
    local c = new_cache(db)
    c._load_page = function(p)
      db.page_loads = db.page_loads + 1
      coroutine.yield()
      return { { id = 1 } }
    end
    local co = coroutine.create(function() return c:read_articles(7, 1) end)
    assert(coroutine.resume(co))
    c:invalidate_pages()
    local ok, list = coroutine.resume(co)
    assert.is_true(ok)
    assert.equal(1, #list)
    assert.equal(0, c:stats().pages.entries)
  end)

  it("returns nil, err on commit when the cache is closed", function()
    local c = new_cache(sample_db())
    local tx = c:transaction()
    tx:mark_read(1, 1)
    c:close()
    local ok, err = tx:commit()
    assert.is_nil(ok)
    assert.equal("closed", err.kind)
    local t2, err2 = c:transaction()
    assert.is_nil(t2)
    assert.equal("closed", err2.kind)
  end)

  it("lets a transaction whose commit found the cache closed be rolled back, as nothing was committed", function()
    local c = new_cache(sample_db())
    local tx = c:transaction()
    tx:mark_read(1, 1)
    c:close()
    local ok, err = tx:commit()
    assert.is_nil(ok)
    assert.equal("closed", err.kind)
    assert.is_true(tx:rollback()) -- raised "the transaction is already committed"
    assert.has_error(function() tx:commit() end,
      "bad call to 'commit' (the transaction is already rolled back)")
  end)

  it("raises when used after commit or rollback", function()
    local c = new_cache(sample_db())
    local tx = c:transaction()
    tx:commit()
    assert.has_error(function() tx:mark_read(1, 1) end,
      "bad call to 'mark_read' (the transaction is already committed)")
    assert.has_error(function() tx:commit() end,
      "bad call to 'commit' (the transaction is already committed)")
    local tx2 = c:transaction()
    tx2:rollback()
    assert.has_error(function() tx2:invalidate_pages() end,
      "bad call to 'invalidate_pages' (the transaction is already rolled back)")
  end)

  it("raises at the line of the call made after commit or rollback", function()
    -- mark_read and the invalidations raised one level too high, at the line that called
    -- the function that made the call (commit and rollback were right)
    local c = new_cache(sample_db())
    local tx = c:transaction()
    tx:commit()
    local calls = {
      { "mark_read", function() tx:mark_read(1, 1) end },
      { "invalidate_article", function() tx:invalidate_article(1) end },
      { "invalidate_pages", function() tx:invalidate_pages() end },
      { "commit", function() tx:commit() end },
      { "rollback", function() tx:rollback() end },
    }
    for _, call in ipairs(calls) do
      local line = debug.getinfo(call[2], "S").linedefined
      local ok, err = pcall(function() call[2]() end)
      assert.is_false(ok)
      assert.matches("cache_spec%.lua:" .. line .. ": bad call to '" .. call[1] ..
        "' %(the transaction is already committed%)$", err)
    end
  end)
end)

describe("cache:stats()", function()
  it("reports bytes per tier, entries, hits, misses, loads and evictions", function()
    local c = new_cache(sample_db())
    c:read_articles(7, 1)
    local s = c:stats()
    for _, tier in ipairs{ "pages", "readers" } do
      for _, k in ipairs{ "hits", "misses", "loads", "entries", "bytes", "evictions" } do
        assert.is_number(s[tier][k], tier .. "." .. k)
      end
    end
    assert.is_number(s.evictions)
    assert.is_number(s.bytes)
    assert.truthy(s.pages.bytes > 0 and s.readers.bytes > 0)
  end)

  it("appears in esx.metrics()", function()
    local c = new_cache(sample_db(), { name = "articles" })
    c:read_articles(7, 1)
    local text = esx.metrics()
    assert.truthy(text:find('esx_cache_pages_loads_total{name="articles"} 1', 1, true))
    c:close()
    assert.is_nil(esx.metrics():find('name="articles"', 1, true))
  end)

  it("is collected when unreachable, even though esx.metrics() lists it", function()
    local alive = setmetatable({}, { __mode = "k" })
    do
      local c = new_cache(sample_db())
      c:read_articles(7, 1)
      alive[c] = true
    end
    collectgarbage()
    collectgarbage()
    assert.is_nil(next(alive))
    assert.is_string(esx.metrics())
  end)

  it("returns nil, err when the cache is closed", function()
    local c = new_cache(sample_db())
    assert.is_true(c:close())
    assert.is_true(c:close())
    local s, err = c:stats()
    assert.is_nil(s)
    assert.equal("closed", err.kind)
  end)
end)

-- An object whose finalizer calls f, left for the collector (LuaJIT runs __gc on userdata only).
describe("cache:close()", function()
  it("frees the core at once after a call that raised midway (a clock that returned no number)", function()
    -- page_put, readers_put, apply and poll counted themselves busy before reading their
    -- arguments: a raise left the count set, and every later close() only asked the
    -- userdata's __gc to free the core (and read_json, raised out of memory, answered in Lua
    -- for ever)
    for _, case in ipairs{ -- the call, and which of its clock readings is passed to the core method
      { function(c) return c:mark_read(1, 9) end, 1 },      -- apply
      { function(c) return c:invalidate_pages() end, 1 },   -- apply
      { function(c) local tx = c:transaction() tx:invalidate_article(1) return tx:commit() end, 1 },
      { function(c) return c:read_articles(7, 2) end, 2 },  -- page_put of a miss
      { function(c) return c:has_read(4, 7) end, 2 },       -- readers_put of a miss
    } do
      local call, nth = case[1], case[2]
      local t = 1000
      local c = new_cache(sample_db(), { clock = function() return t end })
      assert(c:read_articles(7, 1))
      local ud = c._cc
      local clock_calls = 0
      c._clock = function() -- nil for the call that stores or applies
        clock_calls = clock_calls + 1
        if clock_calls >= nth then return nil end
        return t
      end
      local ok, v, err = pcall(call, c) -- raised, or (a put inside a load) a load error
      assert.is_true(not ok or (v == nil and err.kind == "load"))
      c._clock = function() return t end
      assert.is_true(c:close())
      assert.matches("(closed)", tostring(ud), 1, true)
    end
  end)

  it("outlives a close from a finalizer that runs while it builds an answer", function()
    -- read_flags looked the core up between Lua allocations: a __gc calling close() freed it
    -- under the loop (a NULL dereference; read_json would read freed memory)
    local core = require "esx.core"
    finally(function()
      collectgarbage("setpause", 200)
      collectgarbage("setstepmul", 200)
    end)
    for _, method in ipairs{ "read_flags", "read_json", "poll" } do
      local c = core.cache_new({ max_bytes = 1e7, page_ttl = 60000, readers_ttl = 60000,
                                 max_pages = 10, shared = method == "poll" }, {})
      local now = core.cache_clock()
      local list = {}
      for i = 1, 5000 do list[i] = { id = i, title = "t" .. i } end
      local ticket -- poll: the page is another worker's hand-off, rebuilt into Lua tables here
      if method == "poll" then
        local st
        st, ticket = c:lock(1, 3, 5000, now)
        assert.equal("acquired", st)
        assert(c:page_put(3, list, now, 0, ticket))
      else
        assert(c:page_put(1, list, now, 0))
      end
      for _ = 1, 2000 do garbage_with_gc(function() c:close() end) end
      collectgarbage("setpause", 100)
      collectgarbage("setstepmul", 100)
      -- answered, or refused as closed when the finalizers ran first: never a crash
      local ok, err
      if method == "poll" then
        ok, err = pcall(c.poll, c, 1, 3, ticket, now)
      else
        ok, err = pcall(c[method], c, method == "read_flags" and list or 1, 1, now)
      end
      assert.is_true(ok or tostring(err):find("the cache is closed", 1, true) ~= nil, tostring(err))
      collectgarbage("collect") -- every finalizer ran: the cache is closed, not half
      assert.has_error(function() c:stats() end, "esx.cache: the cache is closed")
    end
  end)
end)

describe("cache:page_put() and cache:apply()", function()
  it("outlive a close from a finalizer that runs while they store or apply", function()
    -- page_put measures and encodes the page in Lua memory, apply may take a userdata for
    -- its batch: a __gc calling close() freed the core under them (a NULL dereference)
    local core = require "esx.core"
    finally(function()
      collectgarbage("setpause", 200)
      collectgarbage("setstepmul", 200)
    end)
    local page = {}
    for i = 1, 2000 do page[i] = { id = i, title = string.rep("t", 50) .. i, tags = { "a", "b" } } end
    local batch = {}
    for i = 1, 3000 do batch[#batch + 1] = 1; batch[#batch + 1] = i; batch[#batch + 1] = i end
    for _, method in ipairs{ "page_put", "apply" } do
      local c = core.cache_new({ max_bytes = 1e7, page_ttl = 1e6, readers_ttl = 1e6, max_pages = 10 }, {})
      local closed = false
      collectgarbage("setpause", 100)
      collectgarbage("setstepmul", 1000)
      for _ = 1, 200 do
        garbage_with_gc(function() if not closed then closed = true c:close() end end)
        local ok, err
        if method == "page_put" then
          ok, err = pcall(c.page_put, c, 1, page, core.cache_clock(), 0)
        else
          ok, err = pcall(c.apply, c, batch, core.cache_clock())
        end
        assert.is_true(ok or tostring(err):find("the cache is closed", 1, true) ~= nil, tostring(err))
        if closed then break end
      end
      assert.is_true(closed, "no finalizer ran during the " .. method .. " calls")
      collectgarbage("collect")
      assert.has_error(function() c:stats() end, "esx.cache: the cache is closed")
    end
  end)

  it("apply raises on an op, an id or a sequence that is not an integer in range (esx.core directly)", function()
    -- apply cast the batch's ids with (uint64_t)lua_tonumber unchecked: a NaN, a negative, a
    -- fraction or a number past 2^64 was undefined behaviour (UBSan), and an unknown op was
    -- logged for every process.  The public API checks them; esx.core is reachable too.
    local core = require "esx.core"
    local c = core.cache_new({ max_bytes = 1e7, page_ttl = 1e6, readers_ttl = 1e6, max_pages = 10 }, {})
    local now = core.cache_clock()
    local function apply(...) return pcall(c.apply, c, ...) end
    local bad = { 0 / 0, -1, 1.5, 2 ^ 53, 2 ^ 65, -2 ^ 65, 1 / 0, "7", true }
    for _, v in ipairs(bad) do
      for pos = 2, 3 do -- the article, the user
        local batch = { 1, 1, 7 }
        batch[pos] = v
        local ok, err = apply(batch, now)
        assert.is_false(ok, "accepted " .. tostring(v) .. " at " .. pos)
        assert.matches("bad argument #2 to '.-' %(entry " .. pos .. " must be an integer in %[0, 2%^53%)%)", err)
      end
      local ok, err = apply({ v, 1, 7 }, now) -- the op
      assert.is_false(ok, "accepted op " .. tostring(v))
      assert.matches("bad argument #2 to '.-' %(entry 1 must be an op", err)
      if type(v) == "number" then -- a transaction's sequence
        ok, err = apply({ 1, 1, 7 }, now, { v })
        assert.is_false(ok, "accepted sequence " .. tostring(v))
        assert.matches("bad argument #4 to '.-' %(entry 1 must be a sequence", err)
      end
    end
    for _, op in ipairs{ 0, 4, 2 ^ 32 + 1 } do
      assert.is_false((apply({ op, 1, 7 }, now)))
    end
    assert.is_false((apply({ 1, 1 }, now))) -- not a whole triple
    -- a batch past the 8 ops kept on the C stack is checked the same, to its last entry
    local long = {}
    for i = 1, 12 do long[#long + 1] = 1; long[#long + 1] = i; long[#long + 1] = 7 end
    long[#long] = 0 / 0
    assert.is_false((apply(long, now)))
    assert.equal(0, c:stats().seq) -- nothing was logged
    c:apply({ 1, 1, 7, 2, 2, 0, 3, 0, 0 }, now, { 0 }) -- a good batch still applies
    assert.equal(3, c:stats().seq)
    c:close()
    -- cache_new's sizes the same: a NaN or a size past size_t was cast unchecked
    local good = { max_bytes = 1e7, page_ttl = 1e6, readers_ttl = 1e6, max_pages = 10 }
    for _, field in ipairs{ "max_bytes", "max_pages", "page_ttl", "readers_ttl" } do
      for _, v in ipairs{ 0 / 0, -1, 1e300 } do
        local cfg = {}
        for k, x in pairs(good) do cfg[k] = x end
        cfg[field] = v
        if not (v == 1e300 and field:find("ttl")) then -- (an endless ttl is a double: fine)
          local ok, err = pcall(core.cache_new, cfg, {})
          assert.is_false(ok, field .. " = " .. tostring(v))
          assert.matches("out of range", err)
        end
      end
    end
  end)
end)

describe("memory", function()
  it("measures about 1.3 bytes per reader for 100,000 readers among 1,000,000 ids", function()
    local ids, seen = {}, {}
    math.randomseed(42)
    while #ids < 100000 do
      local id = math.random(0, 999999)
      if not seen[id] then seen[id] = true ids[#ids + 1] = id end
    end
    local c = esx.cache{ load_page = function() return {} end, load_readers = function() return ids end }
    assert.is_false(c:has_read(1, 1000001))
    local per = c:stats().readers.bytes / #ids
    assert.truthy(per > 1.0 and per < 1.5, per)
  end)

  it("keeps a few readers scattered over 2^53 in about 8 bytes each", function()
    math.randomseed(3)
    local ids = {}
    for i = 1, 1000 do ids[i] = math.random(0, 2 ^ 40) end
    local c = esx.cache{ load_page = function() return {} end, load_readers = function() return ids end }
    assert.is_true(c:has_read(1, ids[500]))
    local per = c:stats().readers.bytes / #ids
    assert.truthy(per < 9, per)
  end)

  it("answers exactly while a set grows from the array form back to bitmaps", function()
    math.randomseed(4)
    local ids, truth = {}, {}
    for i = 1, 100 do ids[i] = math.random(0, 2 ^ 53 - 1) truth[ids[i]] = true end
    local c = esx.cache{ load_page = function() return {} end, load_readers = function() return ids end }
    c:has_read(1, 0)
    for _ = 1, 6000 do
      local u = math.random() < 0.5 and math.random(0, 2 ^ 53 - 1) or math.random(0, 70000)
      truth[u] = true
      c:mark_read(1, u)
    end
    for u in pairs(truth) do assert.is_true(c:has_read(1, u)) end
    for _ = 1, 2000 do
      local u = math.random(0, 2 ^ 53 - 1)
      assert.equal(truth[u] == true, c:has_read(1, u))
    end
    assert.equal(1, c:stats().readers.loads)
  end)

  it("run-optimises dense ranges", function()
    local ids = {}
    for i = 1, 100000 do ids[i] = i end
    local c = esx.cache{ load_page = function() return {} end, load_readers = function() return ids end }
    c:has_read(1, 1)
    assert.truthy(c:stats().readers.bytes < 400, c:stats().readers.bytes)
  end)

  -- A page is measured as 56 bytes per distinct table, 40 per key/value slot, and each string
  -- key or value its length + 24 where it occurs; an entry adds 96 (docs/cache.md).
  local function page_cache(page, extra)
    local loads = 0
    local opts = { load_readers = function() return {} end,
      load_page = function() loads = loads + 1 return page end }
    for k, v in pairs(extra or {}) do opts[k] = v end
    local c = esx.cache(opts)
    return c, function() return loads end
  end

  it("measures a page with a cycle once per table, caches it, and refuses it as JSON", function()
    local art = { id = 1 }
    art.me = art
    local c, loads = page_cache({ art })
    local list = c:read_articles(7, 1)
    assert.equal(1, #list)
    assert.equal(art, list[1].me)
    assert.same({ 1, 1 }, { c:stats().pages.entries, loads() })
    -- list 56 + 40; article 56 + (40 + "id" 26) + (40 + "me" 26); entry 96 (no JSON blob)
    assert.equal(96 + 188 + 96, c:stats().pages.bytes)
    local json, err = c:read_articles_json(7, 1)
    assert.is_nil(json)
    assert.equal("load", err.kind)
    assert.equal("cannot encode the page from load_page as JSON: a table contains itself " ..
      "(a cycle cannot be JSON)", err.message)
    assert.equal(1, loads())
    -- a load error like any other: counted (once per answer it fails, as the page stays cached)
    assert.equal(1, c:stats().load_errors)
    assert.is_nil(c:read_articles_json(7, 1))
    assert.equal(2, c:stats().load_errors)
    c:read_articles(7, 1)
    assert.equal(2, c:stats().load_errors)
  end)

  it("measures many articles sharing a table with back-references in linear time", function()
    local author = { name = "x", articles = {} }
    local page = {}
    for i = 1, 2000 do page[i] = { id = i, author = author } author.articles[i] = page[i] end
    local c = page_cache(page)
    assert.equal(2000, #c:read_articles(7, 1))
    -- list and author.articles 56 + 2000 * 40 each; article 56 + 66 + (40 + "author" 30);
    -- author 56 + (40 + "name" 28 + "x" 25) + (40 + "articles" 32); entry 96
    assert.equal(2 * (56 + 2000 * 40) + 2000 * 192 + 221 + 96, c:stats().pages.bytes)
  end)

  it("counts a table shared by several articles once", function()
    local shared = { name = "shared" }
    local a = page_cache({ { id = 1, t = shared }, { id = 2, t = shared } })
    local b = page_cache({ { id = 1, t = { name = "shared" } }, { id = 2, t = { name = "shared" } } })
    assert.equal(a:read_articles_json(7, 1), b:read_articles_json(7, 1)) -- same JSON blob
    -- the second copy: 56 + 40 + "name" 28 + "shared" 30
    assert.equal(154, b:stats().pages.bytes - a:stats().pages.bytes)
  end)

  it("measures strings and tables at every depth", function()
    local function deep(len)
      local t = { s = string.rep("x", len) }
      for _ = 1, 20 do t = { t } end -- deeper than JSON's 16 levels: encoded as null
      return { { id = 1, meta = t } }
    end
    local a, b = page_cache(deep(100)), page_cache(deep(1100))
    assert.equal(a:read_articles_json(7, 1), b:read_articles_json(7, 1)) -- same JSON blob
    assert.equal(1000, b:stats().pages.bytes - a:stats().pages.bytes)
  end)

  it("does not cache a page larger than max_bytes however deep its data", function()
    local t = { blob = string.rep("x", 200000) }
    for _ = 1, 20 do t = { t } end
    local c, loads = page_cache({ { id = 1, meta = t } }, { max_bytes = 100000 })
    assert.equal(t, c:read_articles(7, 1)[1].meta)
    c:read_articles(7, 1)
    assert.same({ 0, 0, 2 }, { c:stats().pages.entries, c:stats().pages.bytes, loads() })
  end)

  -- docs/cache.md: "a page whose text would not fit is cached without it".  The page below
  -- measures 2311 bytes (+ 96 of entry overhead) and its pre-encoded JSON about 2040: with
  -- max_bytes = 3000 the page fits (with its article's empty reader set, 160) but not with its
  -- text, so it must be cached without the text, not reloaded on every read.
  it("caches a page without its JSON text when only the text does not fit in max_bytes", function()
    local c, loads = page_cache({ { id = 1, title = string.rep("x", 2000) } }, { max_bytes = 3000 })
    c:read_articles(7, 1)
    c:read_articles(7, 1)
    assert.same({ 1, 2407, 1 }, { c:stats().pages.entries, c:stats().pages.bytes, loads() })
    assert.same({ { id = 1, title = string.rep("x", 2000), read = false } },
      cjson.decode(c:read_articles_json(7, 1)))
    assert.same({ 1, 2407, 1 }, { c:stats().pages.entries, c:stats().pages.bytes, loads() })
    assert.truthy(c:stats().bytes <= 3000)
  end)

  it("does not cache a page holding a function or full userdata (unmeasurable)", function()
    for _, v in ipairs{ print, io.stdout, coroutine.create(print) } do
      local c, loads = page_cache({ { id = 1, x = { v } } })
      assert.equal(v, c:read_articles(7, 1)[1].x[1])
      c:read_articles(7, 1)
      assert.same({ 0, 2 }, { c:stats().pages.entries, loads() })
    end
    local c, loads = page_cache({ { id = 1, x = cjson.null } }) -- light userdata: a slot
    c:read_articles(7, 1)
    c:read_articles(7, 1)
    assert.same({ 1, 1 }, { c:stats().pages.entries, loads() })
  end)

  it("never exceeds max_bytes under adversarial keys", function()
    math.randomseed(7)
    local max = 200000
    local c = esx.cache{ max_bytes = max, max_pages = 50,
      load_page = function(p)
        local out = {}
        for i = 1, 20 do out[i] = { id = math.random(0, MAX_SAFE), title = string.rep("x", p * 10) } end
        return out
      end,
      load_readers = function(a)
        local out = {}
        local kind = a % 3
        for i = 1, (kind == 0 and 3000 or 300) do
          if kind == 0 then out[i] = math.random(0, 2 ^ 20) -- dense
          elseif kind == 1 then out[i] = math.random(0, MAX_SAFE) -- one part per id
          else out[i] = math.random(0, 2 ^ 32) * 2 ^ 21 + i end -- high keys everywhere
        end
        return out
      end }
    local peak = 0
    for step = 1, 1500 do
      local r = math.random()
      if r < 0.4 then
        assert.truthy(c:has_read(math.random(0, MAX_SAFE), math.random(0, MAX_SAFE)) ~= nil)
      elseif r < 0.6 then
        assert.truthy(c:read_articles(math.random(0, MAX_SAFE), math.random(1, 50)))
      else
        c:mark_read(math.random(0, MAX_SAFE), math.random(0, MAX_SAFE))
      end
      local s = c:stats()
      assert.truthy(s.bytes <= max, "step " .. step .. ": " .. s.bytes)
      assert.equal(s.bytes, s.pages.bytes + s.readers.bytes)
      if s.bytes > peak then peak = s.bytes end
    end
    assert.truthy(c:stats().evictions > 0)
    assert.truthy(peak > max / 2)
  end)

  it("keeps the bound when mark_read grows a set, evicting least recently used", function()
    local c = esx.cache{ max_bytes = 3000, load_page = function() return {} end,
      load_readers = function() return {} end }
    c:has_read(1, 0)
    c:has_read(2, 0)
    for u = 1, 2000 do c:mark_read(2, u * 65536) end -- many containers
    local s = c:stats()
    assert.truthy(s.bytes <= 3000, s.bytes)
    assert.truthy(s.evictions >= 1)
  end)
end)

describe("single flight", function()
  it("calls the loader once for concurrent misses of one key (coroutines)", function()
    local db = sample_db()
    local c = new_cache(db)
    local loads = 0
    c._load_readers = function(a)
      loads = loads + 1
      for _ = 1, 3 do coroutine.yield() end
      return { 7 }
    end
    local fns = {}
    for i = 1, 10 do fns[i] = function() return c:has_read(1, i % 2 == 0 and 7 or 8) end end
    local results = run_all(fns)
    assert.equal(1, loads)
    for i = 1, 10 do assert.equal(i % 2 == 0, results[i][1]) end
    assert.equal(9, c:stats().waits)
  end)

  it("calls load_page once for concurrent read_articles of one page", function()
    local db = sample_db()
    local c = new_cache(db)
    local real = db.load_page
    c._load_page = function(p) coroutine.yield() return real(p) end
    local fns = {}
    for i = 1, 5 do fns[i] = function() return c:read_articles(7, 1) end end
    local results = run_all(fns)
    assert.equal(1, db.page_loads)
    assert.equal(3, db.readers_loads)
    for i = 1, 5 do assert.same({ true, false, false }, flags(results[i][1])) end
  end)

  it("shares a loader error with every waiter, and caches nothing", function()
    local c = new_cache(sample_db())
    local loads = 0
    c._load_readers = function() loads = loads + 1 coroutine.yield() error("boom") end
    local results = run_all{ function() return c:has_read(1, 7) end,
                             function() return c:has_read(1, 7) end }
    assert.equal(1, loads)
    assert.equal("load", results[1][2].kind)
    assert.equal(results[1][2], results[2][2])
    assert.equal(0, c:stats().readers.entries)
  end)

  it("loads by itself when it cannot wait (main thread)", function()
    local c = new_cache(sample_db())
    local loads = 0
    c._load_readers = function() loads = loads + 1 coroutine.yield() return { 7 } end
    local co = coroutine.create(function() return c:has_read(1, 7) end)
    assert(coroutine.resume(co))
    c._load_readers = function() loads = loads + 1 return { 7 } end
    assert.is_true(c:has_read(1, 7)) -- main thread: cannot yield
    assert.equal(2, loads)
    assert(coroutine.resume(co))
  end)

  it("counts in waits only the callers that paused, once each", function()
    local c = new_cache(sample_db())
    c._load_readers = function() coroutine.yield() return { 7 } end
    local co = coroutine.create(function() return c:has_read(1, 7) end)
    assert(coroutine.resume(co)) -- loads, in flight
    local waiter = coroutine.create(function() return c:has_read(1, 8) end)
    assert(coroutine.resume(waiter)) -- pauses on that load
    c._load_readers = function() return { 7 } end
    assert.is_true(c:has_read(1, 7)) -- main thread: cannot pause, loads by itself
    assert(coroutine.resume(co))
    local ok, v = coroutine.resume(waiter)
    assert.same({ true, false }, { ok, v })
    assert.equal(1, c:stats().waits)
  end)

  it("stops waiting after lock_timeout and loads by itself", function()
    local db = sample_db()
    local c = new_cache(db, { lock_timeout = 0 })
    local loads = 0
    c._load_readers = function()
      loads = loads + 1
      coroutine.yield()
      return { 7 }
    end
    local results = run_all{ function() return c:has_read(1, 7) end,
                             function() return c:has_read(1, 7) end }
    assert.equal(2, loads)
    assert.is_true(results[1][1])
    assert.is_true(results[2][1])
  end)

  it("returns nil, err (closed) to callers whose load outlived close()", function()
    local c = new_cache(sample_db(), { shared = true })
    c._load_readers = function() coroutine.yield() return { 7 } end
    local results = run_all{
      function() return c:has_read(1, 7) end,
      function() c._readers_flights = {} return c:has_read(1, 7) end,
      function() c:close() return true end,
    }
    assert.equal("closed", results[1][2].kind)
    assert.equal("closed", results[2][2].kind)
  end)

  it("shares a load among concurrent misses however many mark_read calls come meanwhile", function()
    local loads = 0
    local c = esx.cache{ lock_timeout = 5000, load_readers = function() return {} end,
      load_page = function() loads = loads + 1; coroutine.yield(); return { { id = 1 } } end }
    local a = coroutine.create(function() return c:read_articles(1, 1) end)
    assert(coroutine.resume(a)) -- A is loading page 1
    for u = 1, 5000 do assert(c:mark_read(7, u)) end -- more marks than the change log holds
    local b = coroutine.create(function() return c:read_articles(2, 1) end)
    assert(coroutine.resume(b)) -- B joins A's load: marks do not make it stale
    assert.equal(1, loads)
    local ok_a, list_a = coroutine.resume(a)
    assert.is_true(ok_a)
    assert.equal(1, #list_a)
    local ok_b, list_b = coroutine.resume(b)
    assert.is_true(ok_b)
    assert.equal(1, #list_b)
    assert.equal(1, loads)
    assert.equal(1, #c:read_articles(3, 1)) -- and the page is cached
    assert.equal(1, loads)
  end)

  it("returns nil, err (closed) to a caller whose wait outlived close()", function()
    local c = esx.cache{ lock_timeout = 100, load_readers = function() return {} end,
      load_page = function() while true do coroutine.yield() end end }
    local a = coroutine.create(function() return c:read_articles(1, 1) end)
    local b = coroutine.create(function() return c:read_articles(2, 1) end)
    assert(coroutine.resume(a)) -- A's load never ends
    assert(coroutine.resume(b)) -- B waits on it
    c:close()
    local clock = require("esx.core").cache_clock
    local t0 = clock()
    while clock() - t0 < 150 do end -- past the load's deadline
    local ok, list, err = coroutine.resume(b)
    assert.is_true(ok, list)
    assert.is_nil(list)
    assert.equal("closed", err.kind)
  end)

  it("never hands a page load begun before invalidate_pages() to a caller arriving after it", function()
    local rows = { { id = 1 } }
    local loads = 0
    local c = esx.cache{ load_readers = function() return {} end,
      load_page = function()
        loads = loads + 1
        local snapshot = {}
        for i, a in ipairs(rows) do snapshot[i] = { id = a.id } end
        coroutine.yield() -- a slow query: the snapshot is taken
        return snapshot
      end }
    local a = coroutine.create(function() return c:read_articles(7, 1) end)
    assert(coroutine.resume(a)) -- A is loading page 1 (one article)
    rows[2] = { id = 2 }        -- a writer adds an article ...
    c:invalidate_pages()        -- ... and invalidates
    local b = coroutine.create(function() return c:read_articles(7, 1) end)
    assert(coroutine.resume(b)) -- B arrives after the invalidation: loads by itself
    local ok_a, list_a = coroutine.resume(a)
    local ok_b, list_b = coroutine.resume(b)
    assert.is_true(ok_a and ok_b)
    assert.equal(1, #list_a) -- A's own call answers with its own snapshot
    assert.equal(2, #list_b)
    assert.equal(2, loads)
    assert.equal(0, c:stats().waits)
    assert.equal(2, #c:read_articles(7, 1)) -- and B's page is the one cached
    assert.equal(2, loads)
  end)

  it("never hands a reader-set load begun before invalidate_article() to a caller arriving after it", function()
    local snapshot = { 7 }
    local loads = 0
    local c = esx.cache{ load_page = function() return {} end,
      load_readers = function()
        loads = loads + 1
        local s = snapshot
        coroutine.yield()
        return s
      end }
    local a = coroutine.create(function() return c:has_read(1, 8) end)
    assert(coroutine.resume(a))
    snapshot = { 7, 8 }
    c:invalidate_article(1)
    local b = coroutine.create(function() return c:has_read(1, 8) end)
    assert(coroutine.resume(b))
    local _, read_a = coroutine.resume(a)
    local _, read_b = coroutine.resume(b)
    assert.is_false(read_a)
    assert.is_true(read_b)
    assert.equal(2, loads)
    assert.is_true(c:has_read(1, 8))
    assert.equal(2, loads)
  end)

  -- A loader whose coroutine is never resumed again (nginx: a light thread killed while its
  -- loader waits on a cosocket) leaves its in-flight record behind.
  local function abandoned(lock_timeout)
    local loads, waits = 0, 0
    local c = esx.cache{ lock_timeout = lock_timeout, load_readers = function() return {} end,
      wait = function() waits = waits + 1 coroutine.yield() return true end,
      load_page = function()
        loads = loads + 1
        if loads == 1 then coroutine.yield() end -- the first load is abandoned here
        return { { id = 1 } }
      end }
    assert(coroutine.resume(coroutine.create(function() return c:read_articles(1, 1) end)))
    return c, function() return loads end, function() return waits end
  end

  it("forgets abandoned loads past their deadline, however many keys they were of", function()
    -- a load whose coroutine is never resumed (a killed light thread) stayed registered
    -- under its key until that key was missed again: one record per abandoned page number or
    -- article id (chosen by whoever sends the requests), kept for ever
    local c = esx.cache{ lock_timeout = 0, shared = true,
      load_page = function() coroutine.yield() return {} end,     -- never resumed
      load_readers = function() coroutine.yield() return {} end }
    local function count(t) local n = 0 for _ in pairs(t) do n = n + 1 end return n end
    for i = 1, 3000 do
      local co = coroutine.create(function() return c:read_articles(1, 100 + i) end)
      assert(coroutine.resume(co))
      co = coroutine.create(function() return c:has_read(i, 1) end)
      assert(coroutine.resume(co))
      local t0 = require("esx.core").cache_clock()
      while require("esx.core").cache_clock() - t0 < 0.01 do end -- past the deadline
    end
    assert.is_true(count(c._page_flights) <= 200, count(c._page_flights) .. " page loads kept")
    assert.is_true(count(c._readers_flights) <= 200, count(c._readers_flights) .. " reader-set loads kept")
    assert.is_true(count(c._held[1]) + count(c._held[2]) <= 400, "shared locks kept")
    c:close()
  end)

  it("keeps the shared lock of a newer load of a key when an older load it overtook ends", function()
    -- the older load's end forgot the newer one's ticket: close() then did not give that
    -- lock back, and other workers waited lock_timeout for it
    local c = new_cache(sample_db(), { shared = true })
    c._load_readers = function() coroutine.yield() return { 7 } end
    local a = coroutine.create(function() return c:has_read(1, 7) end)
    assert(coroutine.resume(a)) -- loads article 1 under the shared lock
    c:invalidate_article(1)
    local b = coroutine.create(function() return c:has_read(1, 7) end)
    assert(coroutine.resume(b)) -- does not join a's load: takes the lock over and loads
    local ticket = c._held[2][1]
    assert.is_number(ticket)
    assert(coroutine.resume(a)) -- a's load ends
    assert.equal("dead", coroutine.status(a))
    assert.equal(ticket, c._held[2][1])
    assert(coroutine.resume(b))
    assert.is_nil(c._held[2][1])
    c:close()
  end)

  it("does not make a caller arriving after an abandoned load's deadline wait for it", function()
    local c, loads, waits = abandoned(20)
    local clock = require("esx.core").cache_clock
    local t0 = clock()
    while clock() - t0 < 25 do end -- past the abandoned load's deadline (start + 20 ms)
    local co = coroutine.create(function() return c:read_articles(7, 1) end)
    local ok, list = coroutine.resume(co)
    assert.is_true(ok)
    assert.equal("dead", coroutine.status(co)) -- answered at once
    assert.same({ { id = 1, read = false } }, list)
    assert.same({ 2, 0, 0 }, { loads(), waits(), c:stats().waits })
  end)

  it("lets waiters of an abandoned load give up at its deadline, then load once for all", function()
    local c, loads, waits = abandoned(200) -- (all three arrive well within 200 ms)
    local clock = require("esx.core").cache_clock
    local cos = {}
    for i = 1, 3 do cos[i] = coroutine.create(function() return c:read_articles(i, 1) end) end
    local t0, results, alive = clock(), {}, 3
    while alive > 0 do
      assert(clock() - t0 < 10000, "waiters never gave up")
      alive = 0
      for i, co in ipairs(cos) do
        if coroutine.status(co) ~= "dead" then
          local ok, v = coroutine.resume(co)
          assert(ok, v)
          if coroutine.status(co) == "dead" then results[i] = v else alive = alive + 1 end
        end
      end
    end
    assert.equal(2, loads()) -- the abandoned load and one reload: the others took its result
    for i = 1, 3 do assert.same({ { id = 1, read = false } }, results[i]) end
    assert.equal(3, c:stats().waits)
    assert.truthy(waits() >= 3)
    assert.equal(1, c:stats().pages.entries)
  end)

  it("counts one page lookup per call when the waiters of an abandoned load look at the cache again", function()
    local c = abandoned(200)
    local cos = {}
    for i = 1, 3 do cos[i] = coroutine.create(function() return c:read_articles(i, 1) end) end
    local alive = 3
    while alive > 0 do
      alive = 0
      for _, co in ipairs(cos) do
        if coroutine.status(co) ~= "dead" then
          assert(coroutine.resume(co))
          if coroutine.status(co) ~= "dead" then alive = alive + 1 end
        end
      end
    end
    local s = c:stats()
    assert.same({ 0, 4, 2 }, { s.pages.hits, s.pages.misses, s.pages.loads }) -- four calls, four misses
  end)

  it("uses opts.wait to pause waiters", function()
    local waits = 0
    local db = sample_db()
    local c = new_cache(db, { wait = function() waits = waits + 1 coroutine.yield() return true end })
    local real = db.load_readers
    c._load_readers = function(a) coroutine.yield() coroutine.yield() return real(a) end
    run_all{ function() return c:has_read(1, 7) end, function() return c:has_read(1, 7) end }
    assert.truthy(waits >= 1)
  end)

  it("lets loaders yield under " .. require("esx.core").flavour, function()
    -- LuaJIT cannot yield across C: this passes because the loader is called from Lua
    local c = esx.cache{
      load_page = function() coroutine.yield("io") return { { id = 1 } } end,
      load_readers = function() coroutine.yield("io") return { 5 } end }
    local co = coroutine.create(function() return c:read_articles(5, 1) end)
    local ok, v = coroutine.resume(co)
    assert.same({ true, "io" }, { ok, v })
    ok, v = coroutine.resume(co)
    assert.same({ true, "io" }, { ok, v })
    ok, v = coroutine.resume(co)
    assert.is_true(ok)
    assert.same({ { id = 1, read = true } }, v)
  end)
end)

describe("shared = true (outside nginx: one process)", function()
  it("refuses a handed-off reader set that is truncated or has bytes past its last part (tools/unit)", function()
    require("spec.support.unit").run("rset_blob", "src/cache_rset.c -lroaring", 5)
  end)

  it("serves a page whose hand-off copy ends exactly at the slot's size (an empty table last)", function()
    -- 't' and its 4-byte count did not fit: the count was patched in past the buffer
    -- (a heap overflow the sanitizer run catches)
    local c = esx.cache{ shared = true,
      load_page = function() return { { string.rep("x", 512 * 1024 - 1 - 42), {}, id = 1 } } end,
      load_readers = function() return {} end }
    local page = assert(c:read_articles(7, 1))
    assert.equal(1, #page)
    assert.equal(512 * 1024 - 1 - 42, #page[1][1])
    c:close()
  end)

  it("works like a local cache and counts the change log", function()
    local db = sample_db()
    local c = new_cache(db, { shared = true })
    assert.same({ true, false, false }, flags(c:read_articles(7, 1)))
    c:mark_read(2, 7)
    local tx = c:transaction()
    tx:invalidate_pages()
    tx:mark_read(3, 7)
    tx:commit()
    assert.same({ true, true, true }, flags(c:read_articles(7, 1)))
    local s = c:stats()
    assert.is_true(s.shared)
    assert.equal(3, s.seq)
    assert.equal(3, s.applied)
    assert.equal(0, s.resets)
    c:close()
  end)

  -- Another worker is simulated by a second in-flight table: the second caller does not see
  -- the first one's in-process record, so it meets the shared lock, waits on it, and takes
  -- the result from the hand-off buffer.
  it("hands a loaded reader set to a caller waiting on the shared lock", function()
    local db = sample_db()
    local c = new_cache(db, { shared = true })
    local loads = 0
    c._load_readers = function(a)
      loads = loads + 1
      coroutine.yield()
      coroutine.yield()
      return { 7, 2 ^ 40 + 1, 123456 }
    end
    local results = run_all{
      function() return c:has_read(1, 7) end,
      function()
        c._readers_flights = {} -- "another worker"
        return c:has_read(1, 2 ^ 40 + 1)
      end,
    }
    assert.equal(1, loads)
    assert.is_true(results[1][1])
    assert.is_true(results[2][1])
  end)

  it("loads a key once across workers while another key of the same lock slot loads", function()
    local c = new_cache(sample_db(), { shared = true })
    local loads, release = {}, false
    c._load_readers = function(a)
      loads[a] = (loads[a] or 0) + 1
      repeat coroutine.yield() until release or a ~= 1
      coroutine.yield()
      return { 7 }
    end
    local a = coroutine.create(function() return c:has_read(1, 7) end)
    assert(coroutine.resume(a)) -- article 1 holds its shared lock, loading
    local other = 2 -- an article whose lock slot is article 1's
    while c._cc:slot_home(2, other) ~= c._cc:slot_home(2, 1) do other = other + 1 end
    assert.is_number(other)
    local results = run_all{
      function() c._readers_flights = {} return c:has_read(other, 7) end, -- two workers miss it
      function() c._readers_flights = {} return c:has_read(other, 8) end,
    }
    assert.same({ { true }, { false } }, { { results[1][1] }, { results[2][1] } })
    assert.equal(1, loads[other]) -- once, not once per worker
    release = true
    assert(coroutine.resume(a))
    c:close()
  end)

  it("loads ids chosen to share a lock slot once across workers (the slots' hash is seeded)", function()
    -- the homes were mix64(key) % 64 without a seed: four slow loads of ids an outsider
    -- picked to share one home held all four slots any of them may take, and every worker
    -- missing a fifth such id loaded it by itself
    local c = new_cache(sample_db(), { shared = true })
    local ids = {}
    local id = 100
    while #ids < 5 do
      if unseeded_lock_slot(2, id) == unseeded_lock_slot(2, 100) then ids[#ids + 1] = id end
      id = id + 1
    end
    local loads, release = {}, false
    c._load_readers = function(a)
      loads[a] = (loads[a] or 0) + 1
      repeat coroutine.yield() until release or a == ids[5]
      coroutine.yield()
      return { 7 }
    end
    local holders = {}
    for i = 1, 4 do -- four slow loads hold their shared locks
      holders[i] = coroutine.create(function() return c:has_read(ids[i], 7) end)
      assert(coroutine.resume(holders[i]))
    end
    local results = run_all{
      function() c._readers_flights = {} return c:has_read(ids[5], 7) end, -- two workers miss it
      function() c._readers_flights = {} return c:has_read(ids[5], 8) end,
    }
    assert.same({ true, false }, { results[1][1], results[2][1] })
    assert.equal(1, loads[ids[5]]) -- once, not once per worker
    release = true
    for i = 1, 4 do
      while coroutine.status(holders[i]) ~= "dead" do assert(coroutine.resume(holders[i])) end
    end
    c:close()
  end)

  it("seeds the lock slots' hash per cache", function()
    local homes = {}
    for i = 1, 4 do
      local c = new_cache(sample_db(), { shared = true })
      local h = {}
      for key = 1, 8 do h[key] = c._cc:slot_home(2, key) end
      homes[i] = table.concat(h, ",")
      c:close()
    end
    assert.is_false(homes[1] == homes[2] and homes[2] == homes[3] and homes[3] == homes[4])
  end)

  it("loads a reader set once across workers when its last hand-off is older than the change log", function()
    local db = sample_db()
    local c = new_cache(db, { shared = true, max_bytes = 300 }) -- room for one small set
    local loads = 0
    c._load_readers = function(a)
      loads = loads + 1
      coroutine.yield()
      return db.load_readers(a)
    end
    local function as_worker(a, u) return function() c._readers_flights = {} return c:has_read(a, u) end end
    run_all{ as_worker(1, 7) } -- published for the other workers
    for u = 1, 4100 do c:mark_read(3, u) end -- busy marking elsewhere: the log moves on
    run_all{ as_worker(2, 8) } -- (and article 1 leaves this worker's tiers)
    assert.equal(1, c:stats().readers.entries)
    loads = 0
    local results = run_all{ as_worker(1, 7), as_worker(1, 8), as_worker(1, 9) }
    assert.same({ true, true, false }, { results[1][1], results[2][1], results[3][1] })
    assert.equal(1, loads) -- once for all, not once per worker
    c:close()
  end)

  it("hands a large bitmap set (portable Roaring format) to a waiting caller", function()
    local c = new_cache(sample_db(), { shared = true })
    local ids = {}
    for i = 1, 50000 do ids[i] = i * 7 end
    ids[#ids + 1] = 2 ^ 50 + 3
    local loads = 0
    c._load_readers = function()
      loads = loads + 1
      coroutine.yield()
      return ids
    end
    local results = run_all{
      function() return c:has_read(1, 7 * 777) end,
      function() c._readers_flights = {} return c:has_read(1, 2 ^ 50 + 3) end,
      function() c._readers_flights = {} return c:has_read(1, 8) end,
    }
    assert.equal(1, loads)
    assert.same({ true, true, false }, { results[1][1], results[2][1], results[3][1] })
  end)

  it("hands a loaded page to a caller waiting on the shared lock", function()
    local db = sample_db()
    local c = new_cache(db, { shared = true })
    local loads = 0
    c._load_page = function()
      loads = loads + 1
      coroutine.yield()
      return { { id = 1, title = "t", tags = { "a", 2 }, score = 0.5, ok = false } }
    end
    local results = run_all{
      function() return c:read_articles(7, 1) end,
      function()
        c._page_flights = {}
        return c:read_articles(8, 1)
      end,
    }
    assert.equal(1, loads)
    assert.same({ { id = 1, title = "t", tags = { "a", 2 }, score = 0.5, ok = false, read = true } },
      results[1][1])
    assert.same({ { id = 1, title = "t", tags = { "a", 2 }, score = 0.5, ok = false, read = true } },
      results[2][1])
  end)

  it("hands a page over with its floats and integers apart (Lua 5.4 subtypes)", function()
    local c = new_cache(sample_db(), { shared = true })
    local loads = 0
    c._load_page = function()
      loads = loads + 1
      coroutine.yield()
      return { { id = 1, score = 1.0, rank = 2, ratio = 0.5, big = 2 ^ 60 } }
    end
    local results = run_all{
      function() return c:read_articles(7, 1) end,
      function()
        c._page_flights = {} -- "another worker": takes the page from the hand-off buffer
        return c:read_articles(7, 1)
      end,
    }
    assert.equal(1, loads)
    local a = results[2][1][1]
    assert.same({ id = 1, score = 1.0, rank = 2, ratio = 0.5, big = 2 ^ 60, read = true }, a)
    if math.type then -- Lua 5.4; LuaJIT has one number type
      assert.same({ "integer", "float", "integer", "float", "float" },
        { math.type(a.id), math.type(a.score), math.type(a.rank), math.type(a.ratio), math.type(a.big) })
    end
  end)

  it("hands a page holding cjson.null over, but not one holding a full userdata", function()
    for _, case in ipairs{ { value = cjson.null, loads = 1 }, { value = io.stdout, loads = 2 } } do
      local c = new_cache(sample_db(), { shared = true })
      local loads = 0
      c._load_page = function()
        loads = loads + 1
        coroutine.yield()
        return { { id = 1, subtitle = case.value, tags = { case.value } } }
      end
      local results = run_all{
        function() return c:read_articles(7, 1) end,
        function()
          c._page_flights = {} -- "another worker"
          return c:read_articles(7, 1)
        end,
      }
      assert.equal(case.loads, loads)
      assert.same({ { id = 1, subtitle = case.value, tags = { case.value }, read = true } }, results[2][1])
      assert.equal(case.value, results[2][1][1].subtitle)
      c:close()
    end
  end)

  it("hands a page with esx.empty_array and esx.array_mt tables over, still [] in the other worker's JSON", function()
    -- the hand-off copy dropped metatables (an empty esx.array_mt table, as the decoder gives
    -- every empty JSON array, came back {}) and refused esx.empty_array (each worker loaded)
    local core = require "esx.core"
    local fork = require "spec.support.cjson_fork"
    local cj, restore = fork.install("cjson")
    local c
    finally(function() restore() if c then c:close() end end)
    c = new_cache(sample_db(), { shared = true })
    local loads = 0
    c._load_page = function()
      loads = loads + 1
      coroutine.yield()
      return { { id = 1, tags = esx.empty_array, sizes = setmetatable({}, esx.array_mt),
                 list = setmetatable({ "a" }, esx.array_mt), ca = setmetatable({}, cj.array_mt),
                 ce = setmetatable({}, cj.empty_array_mt), cn = cj.empty_array, obj = {},
                 holed = setmetatable({ 1, nil, 3 }, esx.array_mt),
                 src = core.json_decode('{"labels":[],"n":[[]]}') } }
    end
    local results = run_all{
      function() return c:read_articles(7, 1) end,
      function()
        c._page_flights = {} -- "another worker": takes the page from the hand-off buffer
        return c:read_articles(7, 1)
      end,
    }
    assert.equal(1, loads)
    local a = results[2][1][1]
    assert.equal(esx.empty_array, a.tags)
    assert.equal(esx.empty_array, a.cn) -- cjson's, as esx's: both are []
    for _, k in ipairs{ "sizes", "list", "ca", "ce" } do assert.equal(esx.array_mt, getmetatable(a[k]), k) end
    assert.equal(esx.array_mt, getmetatable(a.src.labels))
    assert.equal(esx.array_mt, getmetatable(a.src.n[1]))
    assert.is_nil(getmetatable(a.obj))
    assert.is_nil(getmetatable(a.src.n))
    local json = core.cache_json(a)
    for k, v in pairs{ tags = "[]", sizes = "[]", list = '["a"]', ca = "[]", ce = "[]", cn = "[]", obj = "{}",
                       holed = "[1,null,3]" } do
      assert.truthy(json:find('"' .. k .. '":' .. v, 1, true), k .. " in " .. json)
    end
    assert.truthy(json:find('"labels":[]', 1, true), json)
    assert.truthy(json:find('"n":[[]]', 1, true), json)
    -- what the client would send of it is the same (field by field: key order is the table's)
    assert.equal("[]", core.json_encode(a.src.labels))
    assert.equal("[[]]", core.json_encode(a.src.n))
    assert.equal("[]", core.json_encode(a.tags))
  end)

  -- The cache's core is wrapped to count (and bound) the polls of the shared lock.
  local function counting_core(c, poll)
    local cc, n = c._cc, { polls = 0 }
    c._cc = setmetatable({}, { __index = function(_, k)
      if k == "poll" then
        return function(_, ...)
          n.polls = n.polls + 1
          assert(n.polls <= 100, "polled the shared lock 100 times: a busy loop")
          return (poll or cc.poll)(cc, ...)
        end
      end
      local v = cc[k]
      if type(v) == "function" then return function(_, ...) return v(cc, ...) end end
      return v
    end })
    return n
  end

  it("does not offer other workers a reader set it could not cache (larger than max_bytes)", function()
    local db = sample_db()
    for u = 1, 300 do db.readers[1][u * 1000003] = true end -- far larger than max_bytes
    local c = new_cache(db, { shared = true, max_bytes = 300 })
    local n = counting_core(c)
    assert.is_true(c:has_read(1, 7)) -- answered from the list, not cached
    c._readers_flights = {} -- "another worker" misses it too
    assert.is_true(c:has_read(1, 1000003))
    assert.equal(2, db.readers_loads) -- it cannot be cached anywhere: each loads it ...
    assert.equal(0, n.polls) -- ... without copying a useless hand-off out of shared memory first
    c:close()
  end)

  it("does not spin on a shared page whose article ids come from a metatable", function()
    local Article = { __index = function(t, k) if k == "id" then return rawget(t, "_id") end end }
    local waits = 0
    local c = new_cache(sample_db(), { shared = true, max_bytes = 600, page_ttl = 60000,
      wait = function() waits = waits + 1 return true end })
    c._load_page = function(p) return { setmetatable({ _id = p, title = "t" }, Article) } end
    local message = "bad data from load_page: article 1 has no integer id in [0, 2^53)"
    for _, p in ipairs{ 1, 2 } do -- (without the check: page 2 evicts page 1 here, not from
      local list, err = c:read_articles(1, p) -- the slot, whose copy lost its metatables)
      assert.is_nil(list)
      assert.same({ "load", message }, { err.kind, err.message })
    end
    local n = counting_core(c)
    local list, err = c:read_articles(1, 1)
    assert.is_nil(list)
    assert.same({ "load", message }, { err.kind, err.message })
    assert.same({ 0, 0 }, { n.polls, waits }) -- nothing was published: the lock is free
  end)

  it("waits, within lock_timeout, when a result it could not take is offered again", function()
    local db = sample_db()
    local waits = 0
    local c = new_cache(db, { shared = true, wait = function() waits = waits + 1 return false end })
    local cc = c._cc
    local n = counting_core(c, function() return "gone" end)
    local real_lock = cc.lock
    getmetatable(c._cc).__index = (function(index)
      return function(t, k)
        if k == "lock" then -- the same published result, every time
          return function(_, kind, key, ...)
            real_lock(cc, kind, key, ...)
            return "busy", 4242
          end
        end
        return index(t, k)
      end
    end)(getmetatable(c._cc).__index)
    assert.same({ true }, { c:has_read(1, 7) })
    assert.same({ 1, 1 }, { n.polls, waits }) -- polled once, paused (could not): loaded itself
    assert.equal(1, db.readers_loads)
  end)

  it("takes over a shared lock whose load began before an invalidation of its key", function()
    local c = new_cache(sample_db(), { shared = true })
    local snapshot = { 7 }
    local loads = 0
    c._load_readers = function()
      loads = loads + 1
      local s = snapshot
      if loads == 1 then coroutine.yield() end
      return s
    end
    local a = coroutine.create(function() return c:has_read(1, 8) end)
    assert(coroutine.resume(a)) -- A holds the shared lock of article 1, loading
    snapshot = { 7, 8 }
    c:invalidate_article(1)
    local b = coroutine.create(function()
      c._readers_flights = {} -- "another worker", arriving after the invalidation
      return c:has_read(1, 8)
    end)
    local ok, read_b = coroutine.resume(b)
    assert.is_true(ok)
    assert.equal("dead", coroutine.status(b)) -- did not wait for A
    assert.is_true(read_b)
    local _, read_a = coroutine.resume(a)
    assert.is_true(read_a) -- A's stale list was not cached: A answers from B's set
    assert.equal(2, loads)
    assert.is_true(c:has_read(1, 8))
    assert.equal(2, loads)
  end)

  it("does not hand a waiter a page published by a load an invalidation overtook", function()
    local c = new_cache(sample_db(), { shared = true })
    local rows = { { id = 1 } }
    local loads = 0
    c._load_page = function()
      loads = loads + 1
      local snapshot = {}
      for i, r in ipairs(rows) do snapshot[i] = { id = r.id } end
      if loads == 1 then coroutine.yield() end
      return snapshot
    end
    local a = coroutine.create(function() return c:read_articles(7, 1) end)
    assert(coroutine.resume(a)) -- A holds the shared lock of page 1
    local b = coroutine.create(function()
      c._page_flights = {} -- "another worker": waits on the shared lock
      return c:read_articles(7, 1)
    end)
    assert(coroutine.resume(b))
    assert.equal("suspended", coroutine.status(b))
    rows[2] = { id = 2 }
    c:invalidate_pages()
    local _, list_a = coroutine.resume(a) -- A publishes its (now stale) page
    assert.equal(1, #list_a)
    local ok, list_b = coroutine.resume(b)
    assert.is_true(ok)
    assert.equal(2, #list_b)
    assert.equal(2, loads)
  end)

  it("answers has_read from the set when the hand-off it shared was evicted before it looked", function()
    local readers = { [1] = { 7, 8 }, [2] = {} }
    for i = 1, 3000 do readers[2][i] = i * 977 end -- article 2: a set that pushes article 1 out
    local c = new_cache(sample_db(), { shared = true, max_bytes = 8800 })
    local loads, gate = { 0, 0 }, false
    c._load_readers = function(a)
      loads[a] = loads[a] + 1
      while a == 1 and not gate do coroutine.yield() end
      return readers[a]
    end
    local function finish(co)
      local ok, v, err
      repeat ok, v, err = coroutine.resume(co) assert(ok, v) until coroutine.status(co) == "dead"
      return v, err
    end
    local x = coroutine.create(function()
      c._readers_flights = {} -- "another worker": holds the shared lock of article 1, loading
      return c:has_read(1, 0)
    end)
    assert(coroutine.resume(x))
    local flights = {} -- this worker: A waits on the shared lock, B joins A's load
    local a = coroutine.create(function() c._readers_flights = flights return c:has_read(1, 7) end)
    local b = coroutine.create(function() return c:has_read(1, 7) end)
    assert(coroutine.resume(a))
    assert(coroutine.resume(b))
    gate = true
    assert.is_false(finish(x)) -- publishes article 1
    assert.is_true(finish(a)) -- takes it from the slot: cached here
    assert.is_false(c:has_read(2, 7)) -- a load that evicts article 1 before B looks
    assert.equal(1, c:stats().readers.entries)
    assert.same({ true }, { finish(b) }) -- not cached: B loads the list by itself
    assert.same({ 2, 1 }, loads)
  end)

  it("returns nil, err (closed) to a caller whose shared hand-off was evicted and the cache closed", function()
    local c = new_cache(sample_db(), { shared = true, max_bytes = 7500 })
    local gate = false
    c._load_readers = function(a)
      while a == 1 and not gate do coroutine.yield() end
      return a == 1 and { 7 } or {}
    end
    local x = coroutine.create(function() c._readers_flights = {} return c:has_read(1, 0) end)
    assert(coroutine.resume(x))
    local flights = {}
    local a = coroutine.create(function() c._readers_flights = flights return c:has_read(1, 7) end)
    local b = coroutine.create(function() return c:has_read(1, 7) end)
    assert(coroutine.resume(a))
    assert(coroutine.resume(b))
    gate = true
    assert(coroutine.resume(x))
    assert(coroutine.resume(a))
    assert.equal("dead", coroutine.status(a))
    c:invalidate_article(1) -- (not cached when B looks)
    c._load_readers = function() c:close() return { 7 } end -- closed while B loads by itself
    local ok, v, err = coroutine.resume(b)
    assert.is_true(ok)
    assert.is_nil(v)
    assert.equal("closed", err.kind)
  end)

  it("gives the shared lock back when storing a loaded result raises (a clock that returned no number)", function()
    -- the raise left the lock held: every other worker missing the key waited lock_timeout
    local clock_calls = 0
    local c = new_cache(sample_db(), { shared = true, clock = function()
      clock_calls = clock_calls + 1
      if clock_calls == 4 then return nil end -- sync, page_get, lock, then the put's
      return require("esx.core").cache_clock()
    end })
    local list, err = c:read_articles(7, 2)
    assert.is_nil(list)
    assert.equal("load", err.kind)
    assert.equal("acquired", (c._cc:lock(1, 2, 5000, require("esx.core").cache_clock())))
    c:close()
  end)

  it("hands a page load to the workers waiting for it with page_ttl = 0 (coalesced, not cached)", function()
    -- a waiter reaching a result older than page_ttl must not store it, but may answer from
    -- it: it waited for that very load
    local t = 0
    local c = new_cache(sample_db(), { shared = true, page_ttl = 0, clock = function() return t end })
    local loads = 0
    c._load_page = function()
      loads = loads + 1
      coroutine.yield()
      coroutine.yield()
      t = t + 1
      return { { id = 1, title = "one" } }
    end
    local function worker(u) return function() c._page_flights = {} return c:read_articles(u, 1) end end
    local results = run_all{ worker(7), worker(8), worker(9) }
    assert.equal(1, loads)
    for i = 1, 3 do assert.equal("one", results[i][1][1].title) end
    assert.equal(0, c:stats().pages.entries)
    c:close()
  end)

  it("lets the waiters of a result too large to hand off load side by side, not one after another", function()
    -- the holder could not publish (over the 512 KiB hand-off buffer): its waiters saw the
    -- lock "gone", took it again one at a time, and each waited for the previous one's load
    -- -- which could not be published either -- until lock_timeout
    local ids = {}
    for i = 1, 65536 do ids[i] = i * 65536 + 1 end -- one id per container: ~650 KB serialised
    local c = new_cache(sample_db(), { shared = true, lock_timeout = 60000 })
    local loading, gate = 0, false
    c._load_readers = function()
      loading = loading + 1
      repeat coroutine.yield() until gate
      coroutine.yield()
      loading = loading - 1
      return ids
    end
    local function worker(u) return function() c._readers_flights = {} return c:has_read(1, u) end end
    local x = coroutine.create(worker(65537))
    assert(coroutine.resume(x)) -- "another worker" holds article 1's shared lock, loading
    local w = { coroutine.create(worker(1)), coroutine.create(worker(65536 * 3 + 1)) }
    for i = 1, 2 do assert(coroutine.resume(w[i])) end -- two more workers wait on that lock
    gate = true
    while coroutine.status(x) ~= "dead" do assert(coroutine.resume(x)) end -- not published
    gate = false
    for _ = 1, 5 do -- (a few polls each)
      for i = 1, 2 do
        if coroutine.status(w[i]) ~= "dead" then assert(coroutine.resume(w[i])) end
      end
    end
    assert.equal(2, loading) -- both load now: neither waits for the other's load
    gate = true
    local results = {}
    for i = 1, 2 do
      local ok, v
      repeat ok, v = coroutine.resume(w[i]) assert(ok, v) until coroutine.status(w[i]) == "dead"
      results[i] = v
    end
    assert.same({ false, true }, results)
    c:close()
  end)

  it("lets one waiter load again for all when the holder's load fails", function()
    local c = new_cache(sample_db(), { shared = true })
    local loads = 0
    c._load_readers = function()
      loads = loads + 1
      coroutine.yield()
      coroutine.yield()
      if loads == 1 then error("first load fails") end
      return { 7 }
    end
    local function worker(u) return function() c._readers_flights = {} return c:has_read(1, u) end end
    local results = run_all{ worker(7), worker(7), worker(8) }
    assert.equal("load", results[1][2].kind)
    assert.same({ true, false }, { results[2][1], results[3][1] })
    assert.equal(2, loads) -- the failed load and one retry, not one per waiting worker
    c:close()
  end)

  it("lets waiters load by themselves when the holder fails", function()
    local c = new_cache(sample_db(), { shared = true })
    local loads = 0
    c._load_readers = function()
      loads = loads + 1
      coroutine.yield()
      if loads == 1 then error("first load fails") end
      return { 7 }
    end
    local results = run_all{
      function() return c:has_read(1, 7) end,
      function() c._readers_flights = {} return c:has_read(1, 7) end,
    }
    assert.equal(2, loads)
    assert.equal("load", results[1][2].kind)
    assert.is_true(results[2][1])
  end)

  it("does not store a handed-off reader set that expired while its waiter waited, evicting a live one", function()
    -- the waiter stored the result with its expiry in the past (published + readers_ttl):
    -- dead on arrival, it pushed a live set out of max_bytes, then was dropped at the next look
    local t = 0
    local big = {}
    for i = 1, 3000 do big[i] = i * 977 end -- 8,624 bytes: with a small set (208), over 8,700
    local c = new_cache(sample_db(), { shared = true, readers_ttl = 100, max_bytes = 8700,
                                       clock = function() return t end })
    local loads, gate = 0, false
    c._load_readers = function(a)
      if a ~= 1 then return { 7 } end
      loads = loads + 1
      while not gate do coroutine.yield() end
      return loads == 1 and big or { 7 }
    end
    local function finish(co)
      local ok, v, err
      repeat ok, v, err = coroutine.resume(co) assert(ok, v) until coroutine.status(co) == "dead"
      return v, err
    end
    local x = coroutine.create(function() c._readers_flights = {} return c:has_read(1, 977) end)
    assert(coroutine.resume(x)) -- "another worker" holds article 1's shared lock, loading
    local w = coroutine.create(function() c._readers_flights = {} return c:has_read(1, 7) end)
    assert(coroutine.resume(w)) -- this worker waits on that lock
    gate = true
    assert.is_true(finish(x)) -- published at 0: fresh until 100
    t = 120
    assert.is_true(c:has_read(2, 7)) -- a live set (until 220)
    local evictions = c:stats().evictions
    t = 150 -- the waiter looks at the slot again: the hand-off expired at 100
    assert.same({ false }, { finish(w) }) -- answered from the hand-off (7 is not among its ids)
    assert.equal(1, loads)
    assert.is_nil(c._cc:has_read(1, 7, t, true)) -- not stored
    assert.is_true(c._cc:has_read(2, 7, t, true)) -- still cached
    local s = c:stats()
    assert.equal(evictions, s.evictions)
    assert.equal(1, s.readers.entries) -- article 2 only
    c:close()
  end)

  it("answers a waiter from a reader-set hand-off that expired while it waited, with the marks logged since, without storing it", function()
    -- a page hand-off that had outlived its TTL answered its waiter; a reader set was loaded
    -- again by it, though it was the result of the very load it had waited for
    local t = 0
    local c = new_cache(sample_db(), { shared = true, readers_ttl = 100,
                                       clock = function() return t end })
    local loads, gate = 0, false
    c._load_readers = function(a)
      if a ~= 1 then return {} end
      loads = loads + 1
      while not gate do coroutine.yield() end
      local ids = { 7, 2 ^ 40 + 5 } -- two Roaring parts (over 4,096 ids: not kept as an array)
      for i = 1000, 5999 do ids[#ids + 1] = i end
      return ids
    end
    local function finish(co)
      local ok, v, err
      repeat ok, v, err = coroutine.resume(co) assert(ok, v) until coroutine.status(co) == "dead"
      return v, err
    end
    local x = coroutine.create(function() c._readers_flights = {} return c:has_read(1, 7) end)
    assert(coroutine.resume(x)) -- "another worker" holds article 1's shared lock, loading
    local w = coroutine.create(function() c._readers_flights = {} return c:has_read(1, 9) end)
    assert(coroutine.resume(w)) -- this worker waits on that lock
    local j = coroutine.create(function()
      c._readers_flights = {}
      return c:read_articles_json(2 ^ 40 + 5, 1)
    end)
    assert(coroutine.resume(j)) -- and so does a JSON page whose first article is 1
    gate = true
    assert.is_true(finish(x)) -- published at 0: fresh until 100
    c._readers_flights = {} -- (the mark below is not recorded on the waiters' loads here)
    t = 50
    c:mark_read(1, 9) -- logged after the hand-off: replayed onto the waiters' copies
    t = 150 -- the waiters look at the slot again: the hand-off expired at 100
    assert.same({ true }, { finish(w) }) -- from the hand-off, with the mark
    local json = finish(j)
    assert.equal(1, loads) -- neither waiter loaded it again
    assert.same({ true, false, false }, flags(cjson.decode(json)))
    assert.is_nil(c._cc:has_read(1, 7, t, true)) -- not stored
    c:close()
  end)

  it("hands off a reader set until the log has moved a whole ring past the marks it holds, not past its load's start", function()
    -- the holder published the set with its load's start sequence, though it had replayed
    -- the marks logged up to its put: the set stopped being offered 4,096 entries after the
    -- start, and a worker that missed it then loaded it again
    local big = {}
    for i = 1, 3000 do big[i] = i * 977 end -- 8,624 bytes: with a small set (208), over 8,700
    local c = new_cache(sample_db(), { shared = true, max_bytes = 8700 })
    local loads, gate = 0, false
    c._load_readers = function(a)
      if a == 2 then return big end
      loads = loads + 1
      while not gate do coroutine.yield() end
      return { 7 }
    end
    local x = coroutine.create(function() return c:has_read(1, 7) end)
    assert(coroutine.resume(x)) -- holds article 1's shared lock, loading from sequence 0
    for i = 1, 100 do c:mark_read(3, i) end -- logged while it loads: replayed at its put
    gate = true
    local ok, v
    repeat ok, v = coroutine.resume(x) assert(ok, v) until coroutine.status(x) == "dead"
    assert.is_true(v) -- cached here and published, up to date at sequence 100
    for i = 1, 4000 do c:mark_read(3, i) end -- the log: 4,100 past the start, 4,000 past 100
    assert.is_false(c:has_read(2, 7)) -- article 2's set evicts article 1's here
    assert.is_nil(c._cc:has_read(1, 7, require("esx.core").cache_clock(), true))
    c._readers_flights = {}
    assert.is_true(c:has_read(1, 7)) -- "another worker" missing it: takes the hand-off
    assert.equal(1, loads)
    assert.is_true(c._cc:has_read(1, 7, require("esx.core").cache_clock(), true)) -- cached again
    c:close()
  end)

  -- Debian's lua-posix has no Lua 5.4 build: this runs under LuaJIT.
  local has_posix, unistd = pcall(require, "posix.unistd")
  if has_posix then
    it("drops, not grows, a set expired while its waiter waited when another process marks it meanwhile", function()
      -- the waiter stored the hand-off at `now - age` (the result's load time) and applied
      -- the other processes' changes logged meanwhile at that time too: a mark of a set that
      -- had expired at the waiter's now grew it instead of dropping it (docs: a set past its
      -- readers_ttl is dropped by a mark, never grown at the expense of live entries)
      local wait = require("posix.sys.wait")
      local t = 0
      local c = new_cache(sample_db(), { shared = true, readers_ttl = 100,
                                         clock = function() return t end })
      assert.is_true(c:has_read(1, 7)) -- article 1 cached at 0: expires at 100
      local gate = false
      c._load_readers = function()
        while not gate do coroutine.yield() end
        return { 8 }
      end
      local x = coroutine.create(function() c._readers_flights = {} return c:has_read(2, 8) end)
      assert(coroutine.resume(x)) -- "another worker" holds article 2's shared lock, loading
      local w = coroutine.create(function() c._readers_flights = {} return c:has_read(2, 8) end)
      assert(coroutine.resume(w)) -- this worker waits on that lock
      t, gate = 40, true
      while coroutine.status(x) ~= "dead" do assert(coroutine.resume(x)) end -- published at 40
      local pid = unistd.fork()
      if pid == 0 then -- another process marks a read of article 1
        local ok = pcall(c.mark_read, c, 1, 2 ^ 40 + 1)
        unistd._exit(ok and 0 or 1)
      end
      local _, _, status = wait.wait(pid)
      assert.equal(0, status)
      t = 120 -- article 1 expired at 100; the hand-off, loaded at 40, is fresh until 140
      local ok, v = coroutine.resume(w)
      assert.is_true(ok)
      assert.is_true(v)
      local s = c:stats()
      assert.equal(1, s.readers.expirations) -- article 1 dropped by the mark
      assert.equal(1, s.readers.entries) -- article 2 only
      c:close()
    end)

    -- Forks "another worker" of c that waits for a byte on w, then misses c's reader set of
    -- article 1 and exits 0 when it loaded it itself (the shared lock given back) in under 1 s.
    local function fork_missing_worker(c)
      local r, w = unistd.pipe()
      local pid = unistd.fork()
      if pid == 0 then
        unistd.close(w)
        unistd.read(r, 1)
        c._readers_flights = {}
        c._load_readers = function() return { 7 } end
        c._wait = function() require("socket").sleep(0.01) return true end -- a blocking wait
        local clock = require("esx.core").cache_clock
        local t0 = clock()
        local v = c:has_read(1, 7)
        unistd._exit((v == true and clock() - t0 < 1000) and 0 or 1)
      end
      unistd.close(r)
      return pid, w
    end

    it("gives back on close() the shared locks of its loads, for other processes to load at once", function()
      local wait = require("posix.sys.wait")
      local c = new_cache(sample_db(), { shared = true, lock_timeout = 3000 })
      c._load_readers = function() coroutine.yield() return { 7 } end
      local co = coroutine.create(function() return c:has_read(1, 7) end)
      assert(coroutine.resume(co)) -- this process holds the shared lock of article 1, loading
      local pid, w = fork_missing_worker(c)
      c:close()
      unistd.write(w, "x")
      unistd.close(w)
      local _, _, status = wait.wait(pid)
      assert.equal(0, status) -- without the hand-back: 3 s (lock_timeout) of waiting, then 1
      local ok, v, err = coroutine.resume(co)
      assert.is_true(ok)
      assert.is_nil(v)
      assert.equal("closed", err.kind)
    end)

    it("gives back the shared locks of its loads when collected without close(), for other processes to load at once", function()
      -- a cache dropped while its loader yields (in nginx: a request aborted, its light
      -- thread and the cache object with it) was freed by __gc without giving its shared
      -- locks back: the other processes waited for them until lock_timeout
      local wait = require("posix.sys.wait")
      local c = new_cache(sample_db(), { shared = true, lock_timeout = 3000 })
      c._load_readers = function() coroutine.yield() return { 7 } end
      local co = coroutine.create(function() return c:has_read(1, 7) end)
      assert(coroutine.resume(co)) -- this process holds the shared lock of article 1, loading
      local pid, w = fork_missing_worker(c)
      local gone = setmetatable({ c }, { __mode = "v" })
      c, co = nil, nil -- the cache and its loading coroutine dropped, never closed
      collectgarbage("collect")
      collectgarbage("collect")
      assert.is_nil(gone[1]) -- collected
      unistd.write(w, "x")
      unistd.close(w)
      local _, _, status = wait.wait(pid)
      assert.equal(0, status) -- without the hand-back: 3 s (lock_timeout) of waiting, then 1
    end)

    it("does not let a forked child give back or publish under its parent's shared lock", function()
      -- a child inherits the parent's held tickets (the cache's record of its loads, a
      -- loader's coroutine): its close() released the parent's lock while the parent still
      -- loaded, and every other process loaded the key again alongside it
      local wait = require("posix.sys.wait")
      local c = new_cache(sample_db(), { shared = true, lock_timeout = 3000 })
      finally(function() c:close() end)
      c._load_readers = function() coroutine.yield() return { 7 } end
      local co = coroutine.create(function() return c:has_read(1, 7) end)
      assert(coroutine.resume(co)) -- this process holds the shared lock of article 1, loading
      local clock = require("esx.core").cache_clock
      local pid = unistd.fork()
      if pid == 0 then -- the child finishes the inherited load (publishing), then closes
        local ok = pcall(function()
          while coroutine.status(co) ~= "dead" do assert(coroutine.resume(co)) end
          c:close()
        end)
        unistd._exit(ok and 0 or 1)
      end
      local _, _, status = wait.wait(pid)
      assert.equal(0, status)
      -- still this process's load: another process finds the lock busy, not free or done
      local st, ticket = c._cc:lock(2, 1, 3000, clock())
      assert.equal("busy", st)
      assert.equal("busy", (c._cc:poll(2, 1, ticket, clock())))
      local ok, v = coroutine.resume(co)
      while ok and coroutine.status(co) ~= "dead" do ok, v = coroutine.resume(co) end
      assert.is_true(ok)
      assert.is_true(v)
    end)
  end
end)

describe("model-based randomized test", function()
  -- Thousands of random operations against esx.cache and the plain-Lua reference model
  -- (bench/cache/reference.lua) sharing one database and one clock: every answer, every
  -- error and every load count must agree.
  local function run(seed, steps, shared)
    math.randomseed(seed)
    local db = new_db()
    local now = 0
    local clock = function() return now end
    local n_articles = 30
    for a = 1, n_articles do
      db.readers[a] = {}
      for _ = 1, math.random(0, 20) do db.readers[a][math.random(0, 40)] = true end
    end
    db.readers[5][2 ^ 45 + 3] = true
    for p = 1, 6 do
      db.pages[p] = {}
      for i = 1, math.random(0, 6) do
        db.pages[p][i] = { id = math.random(1, n_articles), title = "t" .. math.random(1, 1000) }
      end
    end
    local opts = { load_page = db.load_page, load_readers = db.load_readers, clock = clock,
                   page_ttl = 50, readers_ttl = 400, max_pages = 4 }
    local real = esx.cache(opts)
    if shared then
      real:close()
      opts.shared = true
      real = esx.cache(opts)
      opts.shared = nil
    end
    local ref = reference.new(opts)
    local counts_before = { db.page_loads, db.readers_loads }
    local tx, txops = nil, nil
    local function both(f)
      local r1, e1 = f(real)
      local r2, e2 = f(ref)
      if r1 == nil then
        assert.equal("load", e1.kind)
        assert.equal("load", e2)
        assert.is_nil(r2)
      else
        assert.same(r2, r1)
      end
    end
    local user = function() return math.random(0, 40) == 0 and 2 ^ 45 + 3 or math.random(0, 42) end
    for step = 1, steps do
      local r = math.random(1, 100)
      db.fail = math.random(1, 25) == 1
      if r <= 22 then
        local u, p = user(), math.random(1, 6)
        both(function(c) return c:read_articles(u, p) end)
      elseif r <= 30 then
        local u, p = user(), math.random(1, 6)
        both(function(c)
          if c == ref then return c:read_articles(u, p) end
          local json, err = c:read_articles_json(u, p)
          if not json then return nil, err end
          return cjson.decode(json)
        end)
      elseif r <= 50 then
        local a, u = math.random(1, n_articles + 2), user()
        both(function(c) return c:has_read(a, u) end)
      elseif r <= 62 then -- a user reads an article: database, then cache
        local a, u = math.random(1, n_articles), user()
        db.readers[a] = db.readers[a] or {}
        if tx then
          txops[#txops + 1] = { "mark", a, u }
          tx:mark_read(a, u)
        else
          db.readers[a][u] = true
          real:mark_read(a, u)
          ref:mark_read(a, u)
        end
      elseif r <= 66 then -- an article is added to a page
        local p = math.random(1, 6)
        table.insert(db.pages[p], 1, { id = math.random(1, n_articles), title = "new" .. step })
        if tx then
          txops[#txops + 1] = { "pages" }
          tx:invalidate_pages()
        else
          real:invalidate_pages()
          ref:invalidate_pages()
        end
      elseif r <= 70 then -- an article's readers are rewritten
        local a = math.random(1, n_articles)
        if tx then
          txops[#txops + 1] = { "article", a }
          tx:invalidate_article(a)
        else
          db.readers[a] = { [math.random(0, 40)] = true }
          real:invalidate_article(a)
          ref:invalidate_article(a)
        end
      elseif r <= 74 then -- a silent change: only TTLs make it visible
        local a = math.random(1, n_articles)
        db.readers[a][math.random(0, 40)] = true
      elseif r <= 78 then
        if not tx then
          tx, txops = real:transaction(), {}
        elseif math.random(1, 2) == 1 then
          assert.is_true(tx:commit())
          for _, op in ipairs(txops) do
            if op[1] == "mark" then
              db.readers[op[2]][op[3]] = true
              ref:mark_read(op[2], op[3])
            elseif op[1] == "pages" then
              ref:invalidate_pages()
            else
              db.readers[op[2]] = { [7] = true }
              ref:invalidate_article(op[2])
            end
          end
          tx = nil
        else
          assert.is_true(tx:rollback()) -- (page inserts stay in the database: TTL shows them)
          tx = nil
        end
      else
        now = now + math.random(0, 60)
      end
      db.fail = false
    end
    local s = real:stats()
    assert.equal(ref.stats.page_loads, s.pages.loads)
    assert.equal(ref.stats.readers_loads, s.readers.loads)
    assert.equal(db.page_loads - counts_before[1], 2 * s.pages.loads)
    assert.equal(db.readers_loads - counts_before[2], 2 * s.readers.loads)
    real:close()
    return s
  end

  for _, seed in ipairs{ 1, 2, 3, 4, 5 } do
    it("agrees with the reference model over 3000 operations (seed " .. seed .. ")", function()
      local s = run(seed, 3000)
      assert.truthy(s.pages.hits > 0 and s.readers.hits > 0)
      assert.truthy(s.pages.expirations > 0 and s.readers.expirations > 0)
    end)
  end

  -- Under a tight max_bytes (constant eviction) the load counts are not predictable, but when
  -- every change goes through the cache every answer must equal the database.
  local function truth_run(seed, steps, max_bytes)
    math.randomseed(seed)
    local db = new_db()
    local n_articles = 40
    for a = 1, n_articles do
      db.readers[a] = {}
      for _ = 1, math.random(0, 300) do db.readers[a][math.random(0, 5000)] = true end
    end
    for p = 1, 8 do
      db.pages[p] = {}
      for i = 1, math.random(1, 8) do db.pages[p][i] = { id = math.random(1, n_articles), title = "t" .. i } end
    end
    local c = esx.cache{ load_page = db.load_page, load_readers = db.load_readers,
                         max_bytes = max_bytes, max_pages = 8 }
    local function expected(u, p)
      local out = {}
      for i, a in ipairs(db.pages[p]) do
        out[i] = { id = a.id, title = a.title, read = db.readers[a.id][u] == true }
      end
      return out
    end
    local tx, pending
    for _ = 1, steps do
      local r = math.random(1, 100)
      local u = math.random(0, 5000)
      db.fail = math.random(1, 30) == 1
      if r <= 30 then
        local p = math.random(1, 8)
        local list, err = c:read_articles(u, p)
        if list then assert.same(expected(u, p), list) else assert.equal("load", err.kind) end
      elseif r <= 45 then
        local p = math.random(1, 8)
        local json, err = c:read_articles_json(u, p)
        if json then assert.same(expected(u, p), cjson.decode(json)) else assert.equal("load", err.kind) end
      elseif r <= 60 then
        local a = math.random(1, n_articles)
        local v, err = c:has_read(a, u)
        if v ~= nil then assert.equal(db.readers[a][u] == true, v) else assert.equal("load", err.kind) end
      elseif r <= 80 then
        local a = math.random(1, n_articles)
        if tx then
          pending[#pending + 1] = { a, u }
          tx:mark_read(a, u)
        else
          db.readers[a][u] = true
          c:mark_read(a, u)
        end
      elseif r <= 85 then
        local p = math.random(1, 8)
        db.pages[p][math.random(1, #db.pages[p])] = { id = math.random(1, n_articles), title = "n" }
        c:invalidate_pages()
      elseif r <= 90 then
        local a = math.random(1, n_articles)
        db.readers[a] = { [math.random(0, 5000)] = true }
        c:invalidate_article(a)
      else
        if not tx then
          tx, pending = c:transaction(), {}
        else
          if math.random(1, 2) == 1 then
            for _, m in ipairs(pending) do db.readers[m[1]][m[2]] = true end
            tx:commit()
          else
            tx:rollback()
          end
          tx = nil
        end
      end
      db.fail = false
      local s = c:stats()
      assert.truthy(s.bytes <= max_bytes)
    end
    return c:stats()
  end

  for _, seed in ipairs{ 11, 12, 13 } do
    it("answers as the database under constant eviction (seed " .. seed .. ")", function()
      local s = truth_run(seed, 2500, 6000)
      assert.truthy(s.evictions > 100, s.evictions)
    end)
  end

  for _, seed in ipairs{ 6, 7 } do
    it("agrees with the reference model with shared = true (seed " .. seed .. ")", function()
      local s = run(seed, 3000, true)
      assert.is_true(s.shared)
      assert.equal(s.seq, s.applied)
    end)
  end
end)
