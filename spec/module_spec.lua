-- The module itself: loading, version, the error object, esx.metrics(), and the collector
-- against the conventions of API.md.
local esx = require "esx"
local core = require "esx.core"

describe("require 'esx'", function()
  it("loads the C core built for this Lua", function()
    local expected = jit and "luajit" or "lua5.4"
    assert.equal(expected, core.flavour)
  end)

  it("sets esx.version to a semantic version string", function()
    assert.is_string(esx.version)
    assert.truthy(esx.version:match("^%d+%.%d+%.%d+$"))
    assert.equal(core.version, esx.version)
  end)

  it("matches the version the rockspec ships", function()
    local f = assert(io.open("src/version.h"))
    local text = f:read("*a")
    f:close()
    assert.equal(text:match('ESX_VERSION "([^"]+)"'), esx.version)
  end)

  it("stays mapped when Lua unloads it at exit (its threads may outlive the Lua state)", function()
    -- the I/O thread of a client kept alive by a collector's bulk still in flight runs on
    -- when lua_close dlclose()s the module: with its code unmapped, the process crashed at
    -- exit about once in 60 runs (the close(-5) child of the collector spec below)
    local so = "build/" .. (jit and "luajit" or "lua5.4") .. "/esx/core.so"
    local p = io.popen("readelf -d " .. so .. " 2>&1")
    local dyn = p:read("*a")
    p:close()
    assert.truthy(dyn:find("NODELETE", 1, true), dyn)
  end)

  it("reaches the module functions the docs name through the constructors (esx.collector.totals)", function()
    -- docs/collector.md documents esx.collector.totals(client, q); with esx.collector a
    -- bare function that was "attempt to index a function value"
    assert.equal(require("esx.collector").totals, esx.collector.totals)
    assert.equal(require("esx.client").bulk_body, esx.client.bulk_body)
    assert.equal(require("esx.cache").new, esx.cache.new)
    local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
    finally(function() c:close() end)
    local ok, err = pcall(function() local r = esx.collector.totals(c, { site_id = "s1", form = 0 }) return r end)
    assert.is_false(ok)
    assert.truthy(err:find("^[^:]*module_spec%.lua:%d+: esx%.collector%.totals: bad option 'form' %(unknown option%)$"), err)
    -- and the constructors still point option errors at the caller's line
    for _, ctor in ipairs{ "client", "collector", "cache" } do
      ok, err = pcall(function() local o = esx[ctor]{ bogus = 1 } return o end)
      assert.is_false(ok)
      assert.truthy(err:find("^[^:]*module_spec%.lua:%d+: esx%." .. ctor .. ": bad option "), err)
    end
  end)

  it("raises 'bad self' naming the method for every method called with '.' instead of ':'", function()
    -- c.search("idx", q) passed "idx" as self: "attempt to index a nil value (local 'self')"
    -- deep inside, or a message about the wrong argument ("empty index list")
    local c = esx.client{ hosts = { "http://127.0.0.1:1" }, max_retries = 0 }
    local col = esx.collector{ sink = c, rollup = false }
    local cache = esx.cache{ load_page = function() return {} end, load_readers = function() return {} end }
    local p = assert(c:send("GET", "/"))
    local bi = assert(c:bulk_indexer())
    local tx = assert(cache:transaction())
    finally(function() bi:close(); col:close(0); c:close(); cache:close() end)
    for _, case in ipairs{
      { c, "esx.client", "c", { "search", "request", "send", "get", "bulk", "stats", "close", "bulk_indexer" } },
      { p, "esx pending request", "pending", { "ready", "wait", "result", "json", "id" } },
      { col, "esx.collector", "col", { "handle", "flush", "rollups", "stats", "close", "totals", "enter" } },
      { cache, "esx.cache", "cache", { "read_articles", "has_read", "mark_read", "invalidate_pages",
                                       "transaction", "stats", "close" } },
      { tx, "esx.cache transaction", "tx", { "mark_read", "invalidate_pages", "commit", "rollback" } },
      { bi, "esx bulk indexer", "bi", { "add", "flush", "stats", "close" } },
    } do
      local obj, what, var = case[1], case[2], case[3]
      for _, name in ipairs(case[4]) do
        for _, args in ipairs{ {}, { "idx", { size = 1 } }, { 1, 2 } } do
          local ok, err = pcall(function() local r = obj[name](args[1], args[2]) return r end)
          assert.is_false(ok, var .. "." .. name)
          local expected = "bad self to '" .. name .. "' (" .. what .. " expected, got " .. type(args[1]) ..
            "; call it as " .. var .. ":" .. name .. "(...))"
          assert.equal(expected, (tostring(err):gsub("^[^:]*module_spec%.lua:%d+: ", "")))
          assert.truthy(err:find("^[^:]*module_spec%.lua:%d+: "), err)
        end
      end
    end
  end)

  it("creates no globals", function()
    local before = {}
    for k in pairs(_G) do before[k] = true end
    package.loaded["esx"] = nil
    require "esx"
    for k in pairs(_G) do
      assert.is_true(before[k], "new global " .. tostring(k))
    end
  end)
end)

describe("esx error objects", function()
  it("carry kind and message and print as '<kind>: <message>'", function()
    local err = core.error("http", "search failed", { status = 503, node = "http://127.0.0.1:1" })
    assert.equal("http", err.kind)
    assert.equal("search failed", err.message)
    assert.equal(503, err.status)
    assert.equal("http://127.0.0.1:1", err.node)
    assert.equal("http: search failed", tostring(err))
  end)

  it("share one metatable", function()
    assert.equal(getmetatable(core.error("a", "b")), getmetatable(core.error("c", "d")))
  end)

  it("raises when kind is not a string", function()
    assert.has_error(function() core.error(nil, "x") end, "bad argument #1 to 'error' (string expected, got nil)")
  end)
end)

-- Reads Prometheus text exposition format 0.0.4 strictly: every line a HELP, a TYPE (once per
-- family, before its samples) or a sample; a family's samples together; names and label
-- names as the format allows; label values escaped (only \\, \" and \n); values Go's
-- ParseFloat reads; no series twice.  Returns {series = value text}, {family = type} and
-- {family = HELP text}.
local function read_exposition(text)
  assert.equal("\n", text:sub(-1))
  local series, types, helps, closed = {}, {}, {}, {}
  local current
  for line in text:gmatch("([^\n]*)\n") do
    local kw, fam, rest = line:match("^# (%u+) (%S+) ?(.*)$")
    if kw then
      assert.truthy(fam:match("^[a-zA-Z_:][a-zA-Z0-9_:]*$"), line)
      assert.is_nil(closed[fam] or (current == fam or nil), "metadata after samples: " .. line)
      if kw == "TYPE" then
        assert.is_nil(types[fam], "a second TYPE line: " .. line)
        assert.truthy(({ counter = 1, gauge = 1, untyped = 1, histogram = 1, summary = 1 })[rest], line)
        types[fam] = rest
      else
        assert.equal("HELP", kw)
        assert.is_nil(helps[fam], "a second HELP line: " .. line)
        helps[fam] = rest
      end
    else
      local name, labels, value = line:match("^([a-zA-Z_:][a-zA-Z0-9_:]*)(%b{}) (%S+)$")
      assert(name, "not a sample line: " .. line)
      if name ~= current then
        assert.is_nil(closed[name], "samples of " .. name .. " not together")
        if current then closed[current] = true end
        current = name
      end
      local inner, pos = labels:sub(2, -2), 1
      while pos <= #inner do
        local lname, after = inner:match('^([a-zA-Z_][a-zA-Z0-9_]*)="()', pos)
        assert(lname, "bad label in " .. line)
        pos = after
        while true do
          local c = inner:sub(pos, pos)
          assert(c ~= "" and c ~= "\n", "unterminated label value in " .. line)
          if c == '"' then break end
          if c == "\\" then
            assert.truthy(("\\\"n"):find(inner:sub(pos + 1, pos + 1), 1, true), "bad escape in " .. line)
            pos = pos + 1
          end
          pos = pos + 1
        end
        pos = pos + 1
        if pos <= #inner then
          assert.equal(",", inner:sub(pos, pos), line)
          pos = pos + 1
        end
      end
      assert.truthy(value == "NaN" or value == "+Inf" or value == "-Inf" or
                    (tonumber(value) and value:match("^[-+]?[%d.eE+-]+$")), "bad value in " .. line)
      assert.is_nil(series[name .. labels], "a second sample of " .. name .. labels)
      series[name .. labels] = value
    end
  end
  return series, types, helps
end

describe("esx.metrics", function()
  it("returns Prometheus text with the build info", function()
    local text = esx.metrics()
    assert.truthy(text:find('# TYPE esx_build_info gauge\n', 1, true))
    assert.truthy(text:find('esx_build_info{version="' .. esx.version .. '",flavour="'
      .. core.flavour .. '"} 1\n', 1, true))
  end)

  it("includes the counters of registered objects, nested keys joined by '_'", function()
    local registry = require "esx.registry"
    local obj = {}
    registry.add(obj, "test", "t1", function(o)
      assert(o == obj)
      return { requests = 3, pool = { in_use = 1 }, ok = true, ratio = 0.25,
               nodes = { { url = "http://a", alive = true } } }
    end)
    local text = esx.metrics()
    registry.remove(obj)
    assert.truthy(text:find('esx_test_requests{name="t1"} 3\n', 1, true))
    assert.truthy(text:find('esx_test_pool_in_use{name="t1"} 1\n', 1, true))
    assert.truthy(text:find('esx_test_ok{name="t1"} 1\n', 1, true))
    assert.truthy(text:find('esx_test_ratio{name="t1"} 0.25\n', 1, true))
    assert.truthy(text:find('esx_test_nodes_alive{name="t1",item="http://a"} 1\n', 1, true))
    assert.falsy(esx.metrics():find("esx_test_", 1, true))
  end)

  it("never keeps a registered object alive (LuaJIT has no ephemeron tables)", function()
    local registry = require "esx.registry"
    local gone = setmetatable({}, { __mode = "k" })
    do
      local obj = {}
      gone[obj] = true
      registry.add(obj, "test", "t2", function(o) return { n = 1, o = o } end)
    end
    collectgarbage()
    collectgarbage()
    assert.is_nil(next(gone))
    assert.falsy(esx.metrics():find('name="t2"', 1, true))
  end)

  it("is valid text format 0.0.4 with several clients, a collector and caches, one closed, one collected", function()
    local odd = 'we"ird\\name x'
    local c1 = esx.client{ hosts = { "http://127.0.0.1:1" }, name = odd }
    -- a node given twice, and a name given twice (a client replaced, the old one not yet collected)
    local c2 = esx.client{ hosts = { "http://127.0.0.1:1", "http://127.0.0.1:1" }, name = "dup" }
    local c3 = esx.client{ hosts = { "http://127.0.0.1:1" }, name = "dup" }
    local closed = esx.client{ hosts = { "http://127.0.0.1:1" }, name = "closed" }
    local col = esx.collector{ sink = c2, name = "beacons" }
    local function nothing() return {} end
    local cache = esx.cache{ load_page = nothing, load_readers = nothing, name = "articles" }
    finally(function()
      col:close(0)
      cache:close()
      for _, c in ipairs{ c1, c2, c3 } do c:close() end
    end)
    do esx.cache{ load_page = nothing, load_readers = nothing, name = "dropped" } end
    closed:close()
    collectgarbage()
    collectgarbage()
    local series, types = read_exposition(esx.metrics())
    assert.equal("0", series['esx_client_requests_total{name="we\\"ird\\\\name x"}'])
    local dups, nodes = 0, 0
    for k in pairs(series) do
      if k:find('^esx_client_requests_total{name="dup') then dups = dups + 1 end
      if k:find('^esx_client_nodes_alive{name="dup",') then nodes = nodes + 1 end
      assert.falsy(k:find('name="closed"', 1, true))
      assert.falsy(k:find('name="dropped"', 1, true))
    end
    assert.equal(2, dups)
    assert.equal(2, nodes)
    assert.equal("0", series['esx_collector_accepted_total{name="beacons"}'])
    assert.equal("0", series['esx_cache_pages_hits_total{name="articles"}'])
    assert.equal("counter", types.esx_client_requests_total)
    assert.equal("counter", types.esx_client_failures_total)
    assert.equal("gauge", types.esx_client_pool_in_use)
    assert.equal("gauge", types.esx_client_nodes_alive)
    assert.equal("counter", types.esx_collector_accepted_total)
    assert.equal("counter", types.esx_collector_rejected_total)
    -- the spool's counters of what it could not do, as counters
    assert.equal("0", series['esx_collector_spool_segments_refused_total{name="beacons"}'])
    assert.equal("0", series['esx_collector_spool_sync_failed_total{name="beacons"}'])
    assert.equal("0", series['esx_collector_rollup_lost_total{name="beacons"}'])
    assert.equal("gauge", types.esx_collector_queued_bytes)
    -- dead processes' segments whose claim fails now: 0 again once a scan claims them
    assert.equal("0", series['esx_collector_spool_claims_failing{name="beacons"}'])
    assert.equal("gauge", types.esx_collector_spool_claims_failing)
    assert.equal("gauge", types.esx_collector_utilization_queue)
    assert.equal("counter", types.esx_cache_pages_hits_total)
    assert.equal("gauge", types.esx_cache_bytes)
    -- counts by cause are one family with the cause as a label, without the sum
    assert.equal("0", series['esx_client_failures_total{name="dup",kind="reset"}'])
    assert.equal("0", series['esx_collector_rejected_total{name="beacons",reason="queue_full"}'])
    assert.is_nil(series['esx_collector_rejected_total{name="beacons",reason="total"}'])
    for family, typ in pairs(types) do
      assert.equal(typ == "counter", family:sub(-6) == "_total", family .. " is a " .. typ)
    end
  end)

  it("gives every family of a client, a collector, a cache and a bulk indexer a HELP line", function()
    -- promtool's lint flagged every family but esx_build_info ("no help text"), and the
    -- Prometheus UI showed nothing for them
    local c = esx.client{ hosts = { "http://127.0.0.1:1" }, name = "helped" }
    local col = esx.collector{ sink = c, name = "helped" }
    local function nothing() return {} end
    local cache = esx.cache{ load_page = nothing, load_readers = nothing, name = "helped", shared = true }
    local bi = c:bulk_indexer{ name = "helped" }
    finally(function()
      bi:close(0)
      col:close(0)
      cache:close()
      c:close()
    end)
    local _, types, helps = read_exposition(esx.metrics())
    local n = 0
    for family in pairs(types) do
      if family:find("^esx_%a+_") and family ~= "esx_build_info" then
        n = n + 1
        assert.truthy(helps[family] and helps[family]:find("%a"), family .. " has no HELP")
      end
    end
    assert.truthy(n > 80, n .. " families")
    assert.equal("Calls submitted.", helps.esx_client_requests_total)
    -- one shared region in every worker: a sum over nginx workers would count it once per worker
    assert.truthy(helps.esx_cache_seq:find("aggregate with max, not sum", 1, true))
    assert.truthy(helps.esx_cache_log_bytes:find("aggregate with max, not sum", 1, true))
  end)

  it("gives every item of a list its own series, whatever its id looks like", function()
    -- an item's id may hold a '#' (a node URL could, until esx.client refused fragments):
    -- {U, U .. "#3", U} named the third U#3 too (a duplicate series, which makes Prometheus
    -- refuse the whole scrape)
    local registry = require "esx.registry"
    local obj = {}
    local u = "http://127.0.0.1:1/a"
    registry.add(obj, "test", "t4", function()
      return { nodes = { { url = u, up = 1 }, { url = u .. "#3", up = 2 }, { url = u, up = 3 } } }
    end)
    finally(function() registry.remove(obj) end)
    local series = read_exposition(esx.metrics())
    local values = {}
    for k, v in pairs(series) do
      if k:find('^esx_test_nodes_up{name="t4"') then values[#values + 1] = tonumber(v) end
    end
    table.sort(values)
    assert.same({ 1, 2, 3 }, values)
  end)

  it("keeps an object registered again as one entry, under its name, taking no new number", function()
    local registry = require "esx.registry"
    local a, b = {}, {}
    local function stats() return { n = 1 } end
    local first = registry.add(a, "retest", nil, stats)
    finally(function() registry.remove(a) registry.remove(b) end)
    -- registered again without a name: the same name (it was "retest<n+1>", a second series)
    assert.equal(first, registry.add(a, "retest", nil, stats))
    -- the next object's number follows the first's (it skipped the one the second add took)
    local n = tonumber(first:match("%d+$"))
    assert.equal("retest" .. (n + 1), registry.add(b, "retest", nil, stats))
    -- a name given renames it: one series, under the new name
    assert.equal("renamed", registry.add(a, "retest", "renamed", stats))
    local series = read_exposition(esx.metrics())
    local names = {}
    for k in pairs(series) do
      local name = k:match('^esx_retest_n{name="([^"]*)"}$')
      if name then names[#names + 1] = name end
    end
    table.sort(names)
    assert.same({ "renamed", "retest" .. (n + 1) }, names)
  end)

  it("gives an object without a name one no live object of its kind has", function()
    -- the made-up "client<n>" was taken from a counter alone: a client the user named
    -- "client<n+1>" and the next unnamed one shared a name (two series, one renamed "#<n>")
    local a = esx.client{ hosts = { "http://127.0.0.1:1" } }
    local n = tonumber(a.name:match("^client(%d+)$"))
    local b = esx.client{ hosts = { "http://127.0.0.1:1" }, name = "client" .. (n + 2) }
    local d = esx.client{ hosts = { "http://127.0.0.1:1" }, name = "client" .. (n + 3) }
    local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
    finally(function() a:close() b:close() c:close() d:close() end)
    assert.equal("client" .. (n + 4), c.name)
    local series = read_exposition(esx.metrics())
    assert.equal("0", series['esx_client_requests_total{name="client' .. (n + 4) .. '"}'])
    assert.equal("0", series['esx_client_requests_total{name="client' .. (n + 2) .. '"}'])
  end)

  it("writes NaN and infinities as Prometheus reads them", function()
    local registry = require "esx.registry"
    local obj = {}
    registry.add(obj, "test", "t3", function()
      return { nan = 0 / 0, inf = math.huge, ninf = -math.huge, big = 2 ^ 60, tiny = 1e-300 }
    end)
    finally(function() registry.remove(obj) end)
    local series = read_exposition(esx.metrics())
    assert.equal("NaN", series['esx_test_nan{name="t3"}'])
    assert.equal("+Inf", series['esx_test_inf{name="t3"}'])
    assert.equal("-Inf", series['esx_test_ninf{name="t3"}'])
    assert.equal(2 ^ 60, tonumber(series['esx_test_big{name="t3"}']))
    assert.equal(1e-300, tonumber(series['esx_test_tiny{name="t3"}']))
  end)

  it("lets an unclosed client be collected", function()
    local gone = setmetatable({}, { __mode = "k" })
    do
      local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
      gone[c] = true
    end
    collectgarbage()
    collectgarbage()
    assert.is_nil(next(gone))
  end)
end)

-- esx.collector against API.md's conventions (the collector's own behaviour is in
-- collector_spec.lua).  A call that would hang runs in a child process under `timeout`.
describe("esx.collector's API", function()
  -- Runs Lua code in a child process (this checkout's modules), killed after 10 s; returns
  -- what it printed.
  local function child(code)
    local run, script = require("spec.support.child").script(code)
    local p = io.popen("timeout 10 " .. run .. " 2>&1")
    local out = p:read("*a")
    p:close()
    os.remove(script)
    return out
  end

  it("returns nil, closed for a sink client that is closed (it could never ship what it accepts)", function()
    local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
    c:close()
    local col, err = esx.collector{ sink = c }
    assert.is_nil(col)
    assert.equal("closed", err.kind)
  end)

  it("names the option when an index pattern has an unknown conversion", function()
    local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
    finally(function() c:close() end)
    local why = "conversion %Q can give an invalid index name (use %Y %y %C %G %g %m %d %j %H %I %M %S " ..
      "%U %V %W %u %w %F)"
    assert.has_error(function() esx.collector{ sink = c, index = "events-%Q" } end,
      "esx.collector: bad option 'index' (" .. why .. ")")
    assert.has_error(function() esx.collector{ sink = c, rollup = { index = "rollups-%Q" } } end,
      "esx.collector: bad option 'rollup' (bad option 'index' (" .. why .. "))")
  end)

  it("does not wait in flush or close for events a closed sink client can never ship", function()
    -- col:flush() without a timeout waited for ever, col:close() its whole 10 s
    local out = child([[
      local esx, core = require "esx", require "esx.core"
      local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
      local col = esx.collector{ sink = c, rollup = false }
      assert(col:handle{ method = "POST", body = '{"site_id":"s1","type":"view"}' } == 204)
      c:close()
      local t0 = core.now()
      local ok, err = col:flush()
      print("flush", ok, tostring(err))
      ok, err = col:close()
      print("close", ok, err and err.kind, err and err.undelivered, core.now() - t0 < 2000)
    ]])
    assert.equal("flush\tnil\tclosed: the collector's sink client is closed: the events still queued " ..
                 "cannot be shipped\nclose\tnil\trequest_timeout\t1\ttrue\n", out)
  end)

  it("takes a negative timeout of flush and close as 0, not as no limit", function()
    local out = child([[
      local esx = require "esx"
      local col = esx.collector{ sink = esx.client{ hosts = { "http://127.0.0.1:1" } } }
      assert(col:handle{ method = "POST", body = '{"site_id":"s1","type":"view"}' } == 204)
      local ok, err = col:flush(-5)
      print("flush", ok, err and err.kind)
      io.stdout:flush()
      print("bad", pcall(col.flush, col, 0 / 0))
      io.stdout:flush()
      ok, err = col:close(-5)
      print("close", ok, err and err.kind, err and err.undelivered)
    ]])
    assert.equal("flush\tnil\trequest_timeout\n" ..
                 "bad\tfalse\tbad argument #1 to 'flush' (timeout is NaN)\n" ..
                 "esx.collector: close: 1 rollup rows were not delivered and there is no spool to " ..
                 "keep them: they are lost\n" ..
                 "close\tnil\trequest_timeout\t1\n", out)
  end)
end)
