-- esx inside nginx: the module loads in a content_by_lua_block under the lua module's LuaJIT.
local nginx = require "spec.support.nginx"

describe("require 'esx' inside nginx #nginx", function()
  local srv
  setup(function()
    srv = nginx.start{
      workers = 2,
      server = [[
        location = /version {
          content_by_lua_block {
            local esx = require "esx"
            ngx.say(esx.version, " ", require("esx.core").flavour)
          }
        }
        location = /metrics {
          content_by_lua_block { ngx.print(require("esx").metrics()) }
        }
        location = /error {
          content_by_lua_block {
            local err = require("esx.core").error("http", "boom", { status = 502 })
            ngx.say(tostring(err), " ", err.status)
          }
        }
      ]],
    }
  end)
  teardown(function() if srv then srv:stop() end end)

  it("loads the LuaJIT build and reports the version", function()
    local status, body = srv:get("/version")
    assert.equal(200, status)
    assert.equal(require("esx").version .. " luajit\n", body)
  end)

  it("serves esx.metrics() as Prometheus text", function()
    local status, body = srv:get("/metrics")
    assert.equal(200, status)
    assert.truthy(body:find('flavour="luajit"} 1', 1, true))
  end)

  it("builds error objects with __tostring", function()
    local status, body = srv:get("/error")
    assert.equal(200, status)
    assert.equal("http: boom 502\n", body)
  end)
end)

-- esx.nginx.await against a stand-in for nginx's API: what it does when the waiter socket
-- wakes it before the request is done.
describe("esx.nginx.await", function()
  it("pauses, growing, between early wake-ups rather than reconnecting in a busy loop", function()
    local saved_ngx, saved_nginx = rawget(_G, "ngx"), package.loaded["esx.nginx"]
    finally(function()
      rawset(_G, "ngx", saved_ngx)
      package.loaded["esx.nginx"] = saved_nginx
    end)
    local done, connects, naps, clock = false, 0, {}, 0
    -- an engine with no room for one more waiter: every connection is woken at once
    local sock = {
      connect = function()
        connects = connects + 1
        if connects > 1000 then error("busy loop: " .. connects .. " connections") end
        return true
      end,
      send = function() return true end,
      settimeout = function() end,
      receive = function() return "1" end,
      close = function() end,
    }
    rawset(_G, "ngx", {
      get_phase = function() return "content" end,
      now = function() return clock end,
      update_time = function() end,
      socket = { tcp = function() return sock end },
      sleep = function(s)
        naps[#naps + 1] = s
        clock = clock + s
        done = #naps == 9 -- the request ends while the ninth pause runs
      end,
    })
    package.loaded["esx.nginx"] = nil
    local pending = { ready = function() return done end, id = function() return 7 end,
                      waiter_path = function() return "/nonexistent" end }
    assert.is_true(require("esx.nginx").await(pending))
    assert.same({ 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.064, 0.064 }, naps)
    assert.equal(9, connects)
  end)
end)

describe("esx.nginx.wait", function()
  it("raises on a timeout that is NaN or not a number, as pending:wait does", function()
    local nx = require("esx.nginx")
    local pending = { ready = function() return false end }
    assert.has_error(function() nx.wait(pending, 0 / 0) end,
      "bad argument #2 to 'wait' (timeout in ms expected, got NaN)")
    assert.has_error(function() nx.wait(pending, "5") end,
      "bad argument #2 to 'wait' (timeout in ms expected, got string)")
    assert.has_error(function() nx.await(pending, 0 / 0) end,
      "bad argument #2 to 'await' (timeout in ms expected, got NaN)")
  end)
end)
