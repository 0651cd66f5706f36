-- The raw C bindings (esx.core) called with arguments the Lua layer would have refused: they
-- raise naming what is wrong, and free the C memory they had allocated before the raise.
-- The leak half of that is proved by the AddressSanitizer run (`make asan`, LeakSanitizer
-- on): a binding that raises with C memory it alone points to fails the suite there.
-- Under that run's host (tools/sanlua.c) the "out of memory" tests also make every Lua
-- allocation of a call, in turn, the one that fails, so that each raise point is taken once.
local core = require "esx.core"
local ds = require "spec.support.devserver"

local NOWHERE = "http://127.0.0.1:9" -- nothing is sent: a client is only built and closed

local has_san, san = pcall(require, "sanlua")
local oom_it = has_san and it or pending -- elsewhere: nothing to inject the failures with

-- Calls f(...) once per Lua allocation it makes, that allocation and every later one failing
-- as when memory runs out.  Each call must raise Lua's memory error or return normally (a
-- binding may turn the failure into nil, err).  Returns how many allocations f made.
local function sweep(f, ...)
  for n = 1, 100000 do
    local injected, ok, err = san.oom_pcall(n, f, ...)
    if not injected then
      assert(ok, err)
      return n - 1
    end
    assert(ok or err == "not enough memory", err)
  end
  error("more than 100000 allocations")
end

describe("core.client_new", function()
  local function headers(n)
    local h = {}
    for i = 1, n do h[string.format("X-H%02d", i)] = "v" .. i end
    return h
  end

  it("returns a client with 32 headers, the most there may be", function()
    local c = core.client_new{ hosts = { NOWHERE }, headers = headers(32) }
    assert.equal("userdata", type(c))
    c:close()
  end)

  it("raises when 'headers' has more than 32 entries, freeing the lines already built", function()
    assert.has_error(function() core.client_new{ hosts = { NOWHERE }, headers = headers(33) } end,
      "esx.client: option 'headers' has more than 32 entries")
  end)

  it("raises when a header name is not a string, freeing the lines already built", function()
    -- an integer key: converting it in place would also break the table walk
    assert.has_error(function() core.client_new{ hosts = { NOWHERE }, headers = { "x" } } end,
      "esx.client: bad option 'headers' (names and values must be strings)")
    assert.has_error(function()
      core.client_new{ hosts = { NOWHERE }, headers = { ["X-A"] = "a", [true] = "b" } }
    end, "esx.client: bad option 'headers' (names and values must be strings)")
  end)

  it("raises when a header value is not a string, freeing the lines already built", function()
    assert.has_error(function()
      core.client_new{ hosts = { NOWHERE }, headers = { ["X-A"] = "a", ["X-B"] = {} } }
    end, "esx.client: bad option 'headers' (names and values must be strings)")
    assert.has_error(function()
      core.client_new{ hosts = { NOWHERE }, headers = { ["X-A"] = "a", ["X-B"] = 7 } }
    end, "esx.client: bad option 'headers' (names and values must be strings)")
  end)

  it("raises when a header name or value has CR, LF or NUL, or a name is empty or has ':'", function()
    local bad = {
      { ["X-A"] = "a\r\nB: c" }, { ["X-A"] = "a\0b" }, { ["X\nA"] = "a" },
      { [""] = "a" }, { ["X-A: b"] = "c" }, { ["X A"] = "c" },
    }
    for _, h in ipairs(bad) do
      h["X-Ok"] = "fine" -- built before or after the bad one, as the table walk goes
      assert.has_error(function() core.client_new{ hosts = { NOWHERE }, headers = h } end,
        "esx.client: bad option 'headers' (names must be non-empty tokens without ':', " ..
        "spaces or control characters; values without CR, LF or NUL)")
    end
  end)
end)

describe("core.gunzip", function()
  oom_it("frees its output when Lua runs out of memory taking it as a string", function()
    local gz = ds.gzip(string.rep("esx ", 50000))
    assert.equal(200000, #core.gunzip(gz, 1e6))
    assert.is_true(sweep(core.gunzip, gz, 1e6) >= 1)
  end)
end)

describe("core.json_decode", function()
  oom_it("frees an unescaped string's buffer when Lua runs out of memory taking it", function()
    local long = string.rep("a\\nb", 100) -- 400 bytes with escapes: the heap path
    local text = '{"k":"' .. long .. '","l":["' .. long .. '"]}'
    assert.equal(string.rep("a\nb", 100), core.json_decode(text).k)
    assert.is_true(sweep(core.json_decode, text) >= 3)
  end)
end)

describe("core.hll_union", function()
  it("returns nil, err when an entry is a number (never a sketch)", function()
    local est, err = core.hll_union({ 1234567890.5 })
    assert.is_nil(est)
    assert.equal("decode", err.kind)
    assert.equal("sketch 1 is not a valid HyperLogLog", err.message)
  end)

  oom_it("frees its sketches when Lua runs out of memory on an entry", function()
    sweep(function() return core.hll_union({ math.random(1, 2 ^ 30) + 0.5 }) end)
  end)

  it("returns the union sketch too when asked (what totals folds each search's rows into)", function()
    local a, b = core.hll_new(), core.hll_new()
    for i = 1, 3 do a:add("u" .. i) end
    for i = 3, 5 do b:add("u" .. i) end
    local mime = require "mime"
    local est, sketch = core.hll_union({ mime.b64(a:serialize()), mime.b64(b:serialize()) }, true)
    assert.equal(5, math.floor(est + 0.5))
    assert(a:merge(b))
    assert.equal(a:serialize(), (mime.unb64(sketch)))
    assert.equal(1, select("#", core.hll_union({})))
  end)

  oom_it("frees the union's C buffers when Lua runs out of memory making its string", function()
    local h = core.hll_new()
    for i = 1, 5000 do h:add("u" .. i) end -- dense
    local s = require("mime").b64(h:serialize())
    sweep(function() return core.hll_union({ s }, true) end)
  end)
end)

describe("core.cache_new", function()
  local cfg = { max_bytes = 1e6, page_ttl = 1e4, readers_ttl = 1e4, max_pages = 10 }

  oom_it("frees the core when Lua runs out of memory after creating it", function()
    -- the registry reference it takes last allocates only when the registry's array is
    -- full: one more cache kept open per round walks its length past a power of two
    local kept = {}
    for _ = 1, 40 do
      assert.is_true(sweep(function()
        local cc = core.cache_new(cfg, {})
        cc:close()
      end) >= 1)
      kept[#kept + 1] = core.cache_new(cfg, {})
    end
    for _, cc in ipairs(kept) do cc:close() end
  end)
end)

describe("core.cache_json", function()
  oom_it("frees its text when Lua runs out of memory taking it as a string", function()
    local v = { title = string.rep("x", 5000), tags = { "a", "b" }, n = 1 }
    assert.equal(5000, #core.cache_json(v) - #'{"title":"","tags":["a","b"],"n":1}')
    assert.is_true(sweep(core.cache_json, v) >= 1)
  end)
end)

describe("cache:poll", function()
  local PAGE = 1
  local cfg = { max_bytes = 1e6, page_ttl = 1e6, readers_ttl = 1e6, max_pages = 10, shared = true }

  oom_it("frees the published page when Lua runs out of memory rebuilding it", function()
    local cc = core.cache_new(cfg, {})
    local now = core.cache_clock()
    local st, ticket = cc:lock(PAGE, 1, 5000, now)
    assert.equal("acquired", st)
    local page = { { id = 1, title = string.rep("t", 300) }, { id = 2, title = "u" } }
    assert.is_true(cc:page_put(1, page, now, cc:seq(), ticket))
    local function poll()
      local s, t = cc:lock(PAGE, 1, 5000, now)
      if s ~= "busy" then return s end -- the page went to the local tier: nothing to poll
      return cc:poll(PAGE, 1, t, now)
    end
    local s, got = poll()
    assert.equal("done", s)
    assert.equal(string.rep("t", 300), got[1].title)
    sweep(poll)
    cc:close()
  end)
end)

describe("cache:read_json", function()
  local cfg = { max_bytes = 1e6, page_ttl = 1e6, readers_ttl = 1e6, max_pages = 10 }

  oom_it("answers from its pre-encoded page, and closes at once, after Lua ran out of memory in it", function()
    -- a raise while it listed the missing reader sets left the cache busy and read_json's
    -- text in use: every later read_json answered nil (render in Lua), and close() waited
    -- for the __gc
    local cc = core.cache_new(cfg, {})
    local now = core.cache_clock()
    local page = {}
    for i = 1, 40 do page[i] = { id = i, title = "t" .. i } end
    assert.is_true(cc:page_put(1, page, now, cc:seq()))
    local json, missing = cc:read_json(1, 7, now)
    assert.is_nil(json)
    assert.equal(40, #missing)
    assert.is_true(sweep(cc.read_json, cc, 1, 7, now) >= 1)
    for i = 1, 40 do assert.is_true(cc:readers_put(i, { 7 }, now, cc:seq())) end
    assert.matches('^%[{.*"read":true}%]$', cc:read_json(1, 7, now))
    cc:close()
    assert.matches("(closed)", tostring(cc), 1, true)
  end)
end)
