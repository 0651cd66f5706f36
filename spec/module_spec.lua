-- The module itself: loading, version, the error object and esx.metrics().
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
    assert.has_error(function() core.error(nil, "x") end)
  end)
end)

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
