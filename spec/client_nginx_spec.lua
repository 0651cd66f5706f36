-- esx.client inside nginx: a client created in init_by_lua (the master) works in every
-- forked worker, and a slow search waits without blocking the worker.
local ds = require "spec.support.devserver"
local nginx = require "spec.support.nginx"
local socket = require "socket"
local cjson = require "cjson"

local es, web

local function now_ms() return socket.gettime() * 1000 end

setup(function()
  es = ds.start{}
  web = nginx.start{
    workers = 2,
    http = ([[
      init_by_lua_block {
        local esx = require "esx"
        package.loaded.test_client = assert(esx.client{ hosts = { "%s" }, socket_timeout = 5000 })
        -- used once in the master, before the fork
        assert(package.loaded.test_client:info())
        package.loaded.burst_client = assert(esx.client{ hosts = { "%s" }, max_total = 1000,
                                                         max_per_route = 1000 })
      }
      # a search made in the server_rewrite phase waits through esx.nginx as well
      server_rewrite_by_lua_block {
        if ngx.var.uri == "/srewrite" then
          local res, err = package.loaded.test_client:search("slow", { query = { match_all = {} } })
          ngx.ctx.answer = res and "ok" or tostring(err)
        end
      }
    ]]):format(es.url, es.url),
    server = [[
      location = /info {
        content_by_lua_block {
          local c = package.loaded.test_client
          local info, err = c:info()
          if not info then ngx.status = 500 ngx.say(tostring(err)) return end
          local s = c:stats()
          ngx.say(require("cjson").encode({ pid = ngx.worker.pid(), tagline = info.tagline,
                                            rebuilds = s.rebuilds }))
        }
      }
      location = /slow {
        content_by_lua_block {
          local c = package.loaded.test_client
          local res, err = c:search("slow", { query = { match_all = {} } })
          ngx.say(res and "ok" or tostring(err))
        }
      }
      location = /srewrite {
        content_by_lua_block { ngx.say(ngx.ctx.answer) }
      }
      location = /send {
        content_by_lua_block {
          local c = package.loaded.test_client
          local p = assert(c:send("GET", "/_cluster/health"))
          local res, err = require("esx.nginx").wait(p)
          ngx.say(res and res.status or tostring(err))
        }
      }
      location = /await {
        content_by_lua_block {
          local c = package.loaded.test_client
          local p = assert(c:send("GET", "/_cluster/health"))
          local ok, err = require("esx.nginx").await(p)
          local doc = ok and p:json()
          ngx.say(tostring(ok), " ", doc and doc.status or tostring(err))
          ok, err = require("esx.nginx").await(assert(c:send("GET", "/awaitslow/_search")), 50)
          ngx.say(tostring(ok), " ", err and err.kind)
        }
      }
      location = /fraction {
        content_by_lua_block {
          local c = package.loaded.test_client
          local p = assert(c:send("GET", "/fracslow/_search"))
          ngx.update_time()
          local t0 = ngx.now()
          local res, err = require("esx.nginx").wait(p, 0.5)
          ngx.update_time()
          ngx.say(tostring(res), " ", err and err.kind, " ", math.floor((ngx.now() - t0) * 1000))
        }
      }
      location = /phases {
        content_by_lua_block { ngx.say("ok") }
        header_filter_by_lua_block {
          local p = assert(package.loaded.test_client:send("GET", "/phases/_search"))
          local ok, err = pcall(require("esx.nginx").wait, p)
          ngx.log(ngx.ERR, "header_filter wait: ", tostring(ok), " ", err)
        }
        log_by_lua_block {
          local p = assert(package.loaded.test_client:send("GET", "/phases/_search"))
          local ok, err = pcall(require("esx.nginx").wait, p)
          ngx.log(ngx.ERR, "log wait: ", tostring(ok), " ", err)
        }
      }
      location = /burst {
        content_by_lua_block {
          local c, wait = package.loaded.burst_client, require("esx.nginx").wait
          local n, threads, counts = tonumber(ngx.var.arg_n), {}, {}
          for i = 1, n do
            threads[i] = ngx.thread.spawn(function()
              local res, err = wait(assert(c:send("GET", "/burst/_search")), 30000)
              return res and tostring(res.status) or tostring(err)
            end)
          end
          for i = 1, n do
            local _, r = ngx.thread.wait(threads[i])
            counts[r] = (counts[r] or 0) + 1
          end
          for r, k in pairs(counts) do ngx.say(k, " ", r) end
        }
      }
      location = /fast {
        content_by_lua_block { ngx.say("fast ", ngx.worker.pid()) }
      }
      location = /rmdir {
        content_by_lua_block {
          local c = package.loaded.test_client
          local p = assert(c:send("GET", "/_cluster/health"))
          local old = assert(p:waiter_path())
          assert(require("esx.nginx").wait(p))
          -- a /tmp cleaner takes the waiter socket's directory away
          assert(os.execute("rm -rf " .. old:match("^(.*)/")))
          local res, err = c:search("rmdir", { query = { match_all = {} } })
          local new = c.c:waiter_path()
          ngx.say(res and "ok" or tostring(err), " ", tostring(new ~= old))
        }
      }
    ]],
  }
end)

teardown(function()
  if web then web:stop() end
  if es then es:stop() end
end)

describe("esx.client in nginx #nginx", function()
  it("works in every worker when created in init_by_lua before the fork", function()
    local pids = {}
    for _ = 1, 40 do
      local status, body = web:get("/info")
      assert.equal(200, status, body)
      local doc = cjson.decode(body)
      assert.equal("You Know, for Search", doc.tagline)
      assert.equal(1, doc.rebuilds) -- each worker built its own engine once
      pids[doc.pid] = true
    end
    local n = 0
    for _ in pairs(pids) do n = n + 1 end
    assert.is_true(n >= 1)
    assert.falsy(web:error_log():find("[alert]", 1, true))
  end)

  it("waits for a pending request with esx.nginx.wait", function()
    local status, body = web:get("/send")
    assert.equal(200, status)
    assert.equal("200\n", body)
  end)

  it("waits with esx.nginx.await and reads the answer with pending:json", function()
    es:fault{ path = "/awaitslow/_search", stall_ms = 1000, count = 1 }
    local status, body = web:get("/await")
    assert.equal(200, status)
    local first, second = body:match("^([^\n]*)\n([^\n]*)\n$")
    assert.matches("^true %a+$", first) -- the cluster's health colour
    assert.equal("nil request_timeout", second)
  end)

  it("gives up after a timeout of less than a millisecond (not lua_socket_read_timeout)", function()
    -- the cosocket truncates its timeout to whole ms, and takes 0 as "the default (60 s)"
    es:fault{ path = "/fracslow/_search", stall_ms = 2000, count = 1 }
    local status, body = web:get("/fraction")
    assert.equal(200, status)
    local res, kind, ms = body:match("^(%S+) (%S+) (%d+)\n$")
    assert.equal("nil", res)
    assert.equal("request_timeout", kind)
    assert.is_true(tonumber(ms) < 500, body)
  end)

  it("raises a clear error in phases that cannot yield", function()
    es:fault{ path = "/phases/_search", stall_ms = 300, count = 2 } -- not done before wait is called
    local status, body = web:get("/phases")
    assert.equal(200, status)
    assert.equal("ok\n", body)
    local log
    for _ = 1, 50 do -- the log phase runs after the answer
      log = web:error_log()
      if log:find("log wait:", 1, true) then break end
      socket.sleep(0.02)
    end
    assert.truthy(log:find("header_filter wait: false esx.nginx.wait: cannot wait in nginx's " ..
                           "header_filter phase (it cannot yield)", 1, true), log)
    assert.truthy(log:find("log wait: false esx.nginx.wait: cannot wait in nginx's log phase", 1, true), log)
  end)

  it("does not advise a timer in init_by_lua and exit_worker_by_lua, where none can start", function()
    es:fault{ path = "/nophase/_search", stall_ms = 300, count = 2 } -- not done before wait is called
    local srv
    finally(function() if srv then srv:stop() end end) -- (a no-op once it quit)
    srv = nginx.start{
      workers = 1,
      http = ([[
        init_by_lua_block {
          local c = assert(require("esx").client{ hosts = { "%s" } })
          package.loaded.exit_client = c
          local _, err = pcall(require("esx.nginx").wait, assert(c:send("GET", "/nophase/_search")))
          ngx.log(ngx.ERR, "init wait: ", err)
        }
        exit_worker_by_lua_block {
          local c = package.loaded.exit_client
          local _, err = pcall(require("esx.nginx").wait, assert(c:send("GET", "/nophase/_search")))
          ngx.log(ngx.ERR, "exit_worker wait: ", err)
        }
      ]]):format(es.url),
    }
    local pid = srv:pid()
    os.execute("kill -QUIT " .. pid)
    for _ = 1, 250 do
      if not nginx.running(pid) then break end
      socket.sleep(0.02)
    end
    local log = srv:error_log()
    for _, phase in ipairs({ "init", "exit_worker" }) do
      local line = log:match(phase .. " wait: ([^\n]*)")
      assert.truthy(line, log)
      assert.truthy(line:find("esx.nginx.wait: cannot wait in nginx's " .. phase ..
                              " phase (it cannot yield): block the worker with pending:wait()", 1, true), line)
      -- before: "wait in a timer (ngx.timer.at)", which raises in both ("no request",
      -- "API disabled in the context of exit_worker_by_lua*")
      assert.falsy(line:find("timer", 1, true), line)
    end
  end)

  it("waits for 900 requests of one worker at once (the waiter socket's backlog overflows)", function()
    -- the light threads connect to the waiter socket faster than the I/O thread (busy
    -- opening 900 connections) accepts: past its listen backlog, connect() fails with EAGAIN
    assert.equal(200, (es:request("PUT", "/burst")))
    es:fault{ path = "/burst/_search", stall_ms = 300, count = 900 }
    local status, body = web:get("/burst?n=900")
    assert.equal(200, status)
    assert.equal("900 200\n", body)
  end)

  it("waits again once the waiter socket's directory was removed (a /tmp cleaner)", function()
    -- the engine listened on a path that was gone: every wait of more than a second failed
    -- with "internal: cannot reach the esx waiter socket" for the life of the worker
    if es:request("HEAD", "/rmdir") ~= 200 then assert.equal(200, (es:request("PUT", "/rmdir"))) end
    es:fault{ path = "/rmdir/_search", stall_ms = 1500, count = 1 } -- longer than its connect retries
    local status, body = web:get("/rmdir")
    assert.equal(200, status)
    assert.equal("ok true\n", body)
  end)

  for _, path in ipairs{ "/slow", "/srewrite" } do
  it("does not stall other requests on the worker while a search is slow (" .. path .. ")", function()
    -- one worker would serve both; with two, pin by trying until /fast lands on the
    -- worker that holds the slow search: every /fast must be quick regardless.
    if es:request("HEAD", "/slow") ~= 200 then assert.equal(200, (es:request("PUT", "/slow"))) end
    es:fault{ path = "/slow/_search", stall_ms = 1500, count = -1 }
    local slows = {}
    for i = 1, 4 do slows[i] = web:start_get(path) end
    socket.sleep(0.1)
    local worst = 0
    for _ = 1, 10 do
      local t0 = now_ms()
      local status = web:get("/fast")
      assert.equal(200, status)
      worst = math.max(worst, now_ms() - t0)
    end
    assert.is_true(worst < 500, "a /fast request took " .. worst .. " ms")
    for _, c in ipairs(slows) do
      local status, body = nginx.answer(c)
      assert.equal(200, status)
      assert.equal("ok\n", body)
    end
    es:clear_faults()
  end)
  end
end)

describe("esx.nginx.wait with few descriptors #nginx", function()
  -- A worker short of descriptors cannot accept its waiters: the waiter socket stays readable
  -- with connections in its backlog.  Polled at once again, it spun the I/O thread at 100 %
  -- of a core for as long as the shortage lasted (2.6-3.0 s of CPU in a 3 s stall).
  local es2, web2
  setup(function()
    es2 = ds.start{}
    web2 = nginx.start{
      workers = 1,
      main = "worker_rlimit_nofile 300;",
      http = ([[
        lua_socket_log_errors off;
        init_by_lua_block {
          package.loaded.c = assert(require("esx").client{ hosts = { "%s" }, max_total = 100,
                                                            max_per_route = 100 })
        }]]):format(es2.url),
      server = [[
        location = /burst { content_by_lua_block {
          local c, wait = package.loaded.c, require("esx.nginx").wait
          local ps, threads, counts = {}, {}, {}
          for j = 1, 10 do ps[j] = assert(c:send("GET", "/fd/_search")) end
          for i = 1, 200 do
            threads[i] = ngx.thread.spawn(function()
              local res, err = wait(ps[(i % 10) + 1], 10000)
              return res and tostring(res.status) or err.kind
            end)
          end
          for i = 1, 200 do
            local _, r = ngx.thread.wait(threads[i])
            counts[r] = (counts[r] or 0) + 1
          end
          ngx.say(require("cjson").encode(counts))
        } }
      ]] }
  end)
  teardown(function()
    if web2 then web2:stop() end
    if es2 then es2:stop() end
  end)

  local function cpu_s(pid) -- utime + stime of a process, all threads, in s
    local f = assert(io.open("/proc/" .. pid .. "/stat"))
    local s = f:read("*a")
    f:close()
    local fields = {}
    for x in s:match("%) (.*)"):gmatch("%S+") do fields[#fields + 1] = x end
    return (tonumber(fields[12]) + tonumber(fields[13])) / 100
  end

  it("pauses accepting instead of spinning when accept() fails with EMFILE", function()
    assert.equal(200, (es2:request("PUT", "/fd")))
    es2:fault{ path = "/fd/_search", stall_ms = 2000, count = 10 }
    local worker = web2:workers()[1]
    local c0 = cpu_s(worker)
    local status, body = web2:get("/burst")
    local used = cpu_s(worker) - c0
    assert.equal(200, status)
    local counts = cjson.decode(body)
    local n = 0
    for r, k in pairs(counts) do
      assert.truthy(r == "200" or r == "internal", body) -- internal: documented, no descriptor
      n = n + k
    end
    assert.equal(200, n)
    assert.is_true(used < 1.0, "the worker used " .. used .. " s of CPU during a 2 s stall")
  end)
end)

describe("esx.nginx.wait in a worker out of worker_connections #nginx", function()
  -- each wait holds one of the worker's connections (its cosocket to the waiter socket); past
  -- worker_connections nginx fails the connect with a stale errno, and the wait failed with
  -- "cannot reach the esx waiter socket: no such file or directory" -- of a file that was there
  local es3, web3
  setup(function()
    es3 = ds.start{}
    web3 = nginx.start{
      workers = 1,
      worker_connections = 64,
      http = ([[
        lua_socket_log_errors off;
        init_by_lua_block {
          package.loaded.c = assert(require("esx").client{ hosts = { "%s" }, max_total = 100,
                                                            max_per_route = 100 })
        }]]):format(es3.url),
      server = [[
        location = /burst { content_by_lua_block {
          local c, wait = package.loaded.c, require("esx.nginx").wait
          local threads, counts = {}, {}
          for i = 1, 80 do
            threads[i] = ngx.thread.spawn(function()
              local res, err = wait(assert(c:send("GET", "/wc/_search")), 10000)
              return res and tostring(res.status) or err.kind .. ": " .. err.message
            end)
          end
          for i = 1, 80 do
            local _, r = ngx.thread.wait(threads[i])
            counts[r] = (counts[r] or 0) + 1
          end
          ngx.say(require("cjson").encode(counts))
        } }
      ]] }
  end)
  teardown(function()
    if web3 then web3:stop() end
    if es3 then es3:stop() end
  end)

  it("returns nil, err of kind internal naming worker_connections", function()
    assert.equal(200, (es3:request("PUT", "/wc")))
    es3:fault{ path = "/wc/_search", stall_ms = 2000, count = 80 } -- past the connect retries
    local status, body = web3:get("/burst")
    assert.equal(200, status)
    local failed = 0
    for r, k in pairs(cjson.decode(body)) do
      if r ~= "200" then
        assert.matches("^internal: cannot reach the esx waiter socket: .* %(or the worker is " ..
                       "out of worker_connections: each wait holds one%)$", r)
        failed = failed + k
      end
    end
    assert.is_true(failed > 0, body)
  end)
end)

describe("a client made in init_by_lua of a master that is not forked off (daemon off) #nginx", function()
  it("leaves nginx's signals to the master: every worker killed is started again", function()
    local fg
    finally(function() if fg then fg:stop() end end)
    fg = nginx.start{
      workers = 4,
      daemon = false,
      http = [[
        init_by_lua_block {
          -- its I/O thread lives in the master: before, it took the master's signals
          -- (SIGCHLD) whenever they came while the master was busy, unblocked
          fg_client = assert(require("esx").client{ hosts = { "http://127.0.0.1:1" } })
        }
      ]],
      server = "location = /t { return 204; }",
    }
    local deadline = socket.gettime() + 10
    while #fg:workers() < 4 and socket.gettime() < deadline do socket.sleep(0.02) end
    for try = 1, 40 do
      -- every worker at once: their deaths come in while the master respawns the first
      os.execute("kill -9 " .. table.concat(fg:workers(), " "))
      local n
      deadline = socket.gettime() + 2
      repeat
        socket.sleep(0.02)
        n = #fg:workers()
      until n == 4 or socket.gettime() > deadline
      assert.equal(4, n, "workers running after kill #" .. try)
    end
    assert.equal(204, (fg:get("/t")))
  end)
end)
