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
