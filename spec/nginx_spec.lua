-- esx inside nginx: the module loads in a content_by_lua_block under the lua module's LuaJIT.
local nginx = require "spec.support.nginx"
local fake = require "spec.support.ngx"

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

describe("esx.nginx.metrics #nginx", function()
  local srv
  setup(function()
    srv = nginx.start{
      workers = 2,
      http = [[
        lua_shared_dict esx_metrics 1m;
        init_by_lua_block {
          local esx = require "esx"
          es = esx.client{ hosts = { "http://127.0.0.1:1" }, name = "es", max_retries = 0 }
          -- a natural mistake: called where the objects are made, in the master
          local _, err = pcall(require("esx.nginx").share_metrics, "esx_metrics")
          init_share_err = err
        }
        init_worker_by_lua_block { require("esx.nginx").share_metrics("esx_metrics", 100) }
      ]],
      server = [[
        location = /call { content_by_lua_block { es:request("GET", "/"); ngx.say(ngx.worker.id()) } }
        location = /metrics {
          content_by_lua_block { ngx.print(require("esx.nginx").metrics("esx_metrics")) }
        }
        location = /init_err { content_by_lua_block { ngx.say(init_share_err) } }
        location = /bad {
          content_by_lua_block {
            local ok, err = pcall(require("esx.nginx").metrics, "nope")
            ngx.say(err)
          }
        }
      ]],
    }
  end)
  teardown(function() if srv then srv:stop() end end)

  it("merges every worker's metrics, each sample labelled with its worker, each family once", function()
    local seen = {}
    for _ = 1, 40 do
      local status, body = srv:get("/call")
      assert.equal(200, status)
      seen[tonumber(body)] = (seen[tonumber(body)] or 0) + 1
    end
    require("socket").sleep(0.3) -- both workers have published since
    local status, body = srv:get("/metrics")
    assert.equal(200, status)
    for w = 0, 1 do
      assert.truthy(body:find('esx_build_info{worker="' .. w .. '",version="', 1, true), body)
    end
    local _, types = body:gsub("# TYPE esx_client_requests_total counter\n", "")
    assert.equal(1, types)
    local total = 0
    for w, n in body:gmatch('esx_client_requests_total{worker="(%d)",name="es"} (%d+)') do
      assert.equal(seen[tonumber(w)] or 0, tonumber(n))
      total = total + tonumber(n)
    end
    assert.equal(40, total)
    -- a family's samples are together, right after its TYPE line
    assert.truthy(body:find('# TYPE esx_client_requests_total counter\nesx_client_requests_total{worker="%d",name="es"} %d+\n' ..
      'esx_client_requests_total{worker="%d",name="es"} %d+\n'), body)
  end)

  it("raises saying where to call it when share_metrics is called in init_by_lua", function()
    local _, body = srv:get("/init_err")
    -- before: "lua/esx/nginx.lua:375: no request" (ngx.timer.every in the master)
    assert.matches("^esx.nginx.share_metrics: call it in init_worker_by_lua %(init_by_lua runs " ..
                   "in the master", body)
  end)

  it("raises naming a lua_shared_dict that is not there", function()
    local _, body = srv:get("/bad")
    assert.matches("bad argument #1 to 'metrics' %(no lua_shared_dict 'nope' in nginx.conf%)", body)
  end)
end)

-- esx.nginx.share_metrics against a stand-in for nginx's API in the privileged agent
-- (ngx.process.enable_privileged_agent, OpenResty's patched nginx): a process that runs
-- init_worker_by_lua but serves no request, and whose ngx.worker.id() is nil.
describe("esx.nginx.share_metrics in the privileged agent", function()
  it("publishes nothing and raises nothing, neither at the call nor at each interval", function()
    local ticks, stored, logged = {}, {}, {}
    local dict = { safe_set = function(_, k, v) stored[#stored + 1] = k return true end }
    local nx = fake.load_nginx({
      ERR = 4,
      get_phase = function() return "init_worker" end,
      worker = { id = function() return nil end, count = function() return 2 end },
      shared = { esx_metrics = dict },
      log = function(_, ...) logged[#logged + 1] = table.concat({ ... }) end,
      timer = {
        every = function(_, fn) ticks[#ticks + 1] = fn return true end,
        at = function(_, fn) ticks[#ticks + 1] = fn return true end,
      },
    })
    assert.is_true(nx.share_metrics("esx_metrics"))
    -- before: every tick raised "attempt to concatenate a nil value" (one error.log line each
    -- interval, for the life of the agent)
    for _, tick in ipairs(ticks) do tick(false) end
    assert.same({}, stored)
    assert.same({}, logged)
  end)
end)

-- esx.nginx.await against a stand-in for nginx's API: what it does when the waiter socket
-- wakes it before the request is done.
describe("esx.nginx.await", function()
  it("pauses, growing, between early wake-ups rather than reconnecting in a busy loop", function()
    local done, connects, naps, clock = false, 0, {}, 0
    -- an engine with no room for one more waiter: every connection is woken at once
    local sock = fake.socket{
      connect = function()
        connects = connects + 1
        if connects > 1000 then error("busy loop: " .. connects .. " connections") end
        return true
      end,
    }
    local nx = fake.load_nginx(fake.content(function() return clock end, function(s)
      naps[#naps + 1] = s
      clock = clock + s
      done = #naps == 9 -- the request ends while the ninth pause runs
    end, sock))
    local pending = fake.pending(function() return done end)
    assert.is_true(nx.await(pending))
    assert.same({ 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.064, 0.064 }, naps)
    assert.equal(9, connects)
  end)
end)

describe("esx.nginx.wait", function()
  -- A stand-in for nginx whose wall clock (ngx.now) steps by `step` seconds once the wait has
  -- started, as NTP or an operator may step it; the waiter socket sleeps for real for its
  -- timeout and wakes (the request done) after `answer_after` reads, or never.
  local function stepped_ngx(step, answer_after)
    local wall, reads, slept, timeout, done = 1.8e9, 0, 0, 0, false
    local sock = fake.socket{
      settimeout = function(_, ms) timeout = ms end,
      receive = function()
        reads = reads + 1
        if reads == 1 then wall = wall + step end
        if answer_after and reads >= answer_after then done = true return "1" end
        if slept > 3000 then error("the wait outlived its timeout by far") end
        require("socket").sleep(timeout / 1000)
        slept = slept + timeout
        return nil, "timeout"
      end,
    }
    local nx = fake.load_nginx(fake.content(function() return wall end, require("socket").sleep, sock))
    local pending = fake.pending(function() return done end, function() return { status = 200 } end)
    return nx, pending
  end

  it("is not ended early by a step of the wall clock forward", function()
    local nx, pending = stepped_ngx(3600, 3)
    local res, err = nx.wait(pending, 5000)
    assert.is_nil(err)
    assert.equal(200, res.status)
  end)

  it("is not stretched by a step of the wall clock back", function()
    local nx, pending = stepped_ngx(-3600, nil)
    local t0 = require("socket").gettime()
    local res, err = nx.wait(pending, 200)
    local took = require("socket").gettime() - t0
    assert.is_nil(res)
    assert.equal("request_timeout", err.kind)
    assert.is_true(took >= 0.19 and took < 1.5, "took " .. took .. " s")
  end)

  -- The I/O thread closed the waiter connection before it named its request (no room for one
  -- more waiter: woken at once), so the send fails; the request ends meanwhile, or later.
  local function closed_before_send(done_at_send, sends_failing)
    local done, sends, naps = false, 0, {}
    local sock = fake.socket{
      send = function()
        sends = sends + 1
        if sends <= sends_failing then
          if done_at_send then done = true end
          return nil, "closed"
        end
        done = true
        return true
      end,
    }
    local nx = fake.load_nginx(fake.content(function() return 0 end,
      function(s) naps[#naps + 1] = s end, sock))
    local pending = fake.pending(function() return done end, function() return { status = 200 } end)
    return nx, pending, naps, function() return sends end
  end

  it("returns the result of a request that ended while its waiter connection was closed before the send", function()
    local nx, pending = closed_before_send(true, 1)
    local res, err = nx.wait(pending, 5000)
    assert.is_nil(err) -- was internal: "cannot register with the esx waiter: closed"
    assert.equal(200, res.status)
  end)

  it("waits again, after a pause, when its waiter connection was closed before the send", function()
    local nx, pending, naps, sends = closed_before_send(false, 2)
    assert.is_true(nx.await(pending))
    assert.equal(3, sends())
    assert.same({ 0.001, 0.002 }, naps)
  end)

  it("gives up at its timeout when every waiter connection is closed before the send", function()
    local clock = 0
    local sock = fake.socket{ send = function() return nil, "closed" end }
    local nx = fake.load_nginx(fake.content(function() return clock end,
      function(s) clock = clock + s end, sock))
    local t0 = require("esx.core").now()
    local ok, err = nx.await(fake.pending(function() return false end), 30)
    assert.is_nil(ok)
    assert.equal("request_timeout", err.kind)
    assert.is_true(require("esx.core").now() - t0 < 1000)
  end)

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

  it("raises naming the argument when await is given no pending request, as wait does", function()
    local nx = require("esx.nginx")
    for _, bad in ipairs{ "x", 5, {} } do
      local ok, err = pcall(function() local r = nx.await(bad) return r end)
      assert.is_false(ok)
      assert.truthy(err:find("^[^:]*nginx_spec%.lua:%d+: bad argument #1 to 'await' %(esx pending request expected%)$"), err)
      ok, err = pcall(function() local r = nx.wait(bad) return r end)
      assert.is_false(ok)
      assert.truthy(err:find("^[^:]*nginx_spec%.lua:%d+: bad argument #1 to 'wait' %(esx pending request expected%)$"), err)
    end
  end)

  it("outside nginx: returns a finished request's result, and raises saying why for one still running", function()
    assert.is_nil(rawget(_G, "ngx")) -- (plain busted)
    local nx = require("esx.nginx")
    local c = require("esx").client{ hosts = { "http://127.0.0.1:1" }, max_retries = 0 }
    finally(function() c:close() end)
    local p = assert(c:send("GET", "/"))
    p:wait()
    local res, err = nx.wait(p)
    assert.is_nil(res)
    assert.equal("connect", err.kind)
    local running = { ready = function() return false end }
    local ok, msg = pcall(nx.wait, running)
    assert.is_false(ok)
    -- (it was "attempt to index upvalue 'ngx' (a nil value)")
    assert.equal("esx.nginx.wait: cannot wait outside nginx (no ngx): block with pending:wait()", msg)
  end)
end)

describe("esx.nginx.collect", function()
  it("raises naming the argument when it is not a collector", function()
    local nx = require("esx.nginx")
    for _, bad in ipairs{ false, "beacons", {} } do
      local ok, err = pcall(function() nx.collect(bad) end)
      assert.is_false(ok)
      assert.truthy(err:find("^[^:]*nginx_spec%.lua:%d+: bad argument #1 to 'collect' %(esx collector expected, got " ..
        type(bad) .. "%)$"), err)
    end
  end)

  it("gives back an abandoned request's slot after abandoned_after, however the wall clock steps", function()
    -- entries were stamped with ngx.now(), the wall clock: stepped back an hour, a slot that
    -- nginx abandoned stayed taken for an hour, and with max_concurrent = 1 every request
    -- got 503 meanwhile
    local wall, answers = 1.8e9, {}
    local stub = {
      OK = 0, WARN = 5, ERR = 4, status = 0, header = {},
      now = function() return wall end,
      update_time = function() end,
      log = function() end,
      req = { get_method = function() return "GET" end, get_headers = function() return {} end },
      print = function() end,
      send_headers = function() end,
      exit = function() end,
    }
    setmetatable(stub.header, { __newindex = function() end })
    local nx = fake.load_nginx(stub)
    local esx = require("esx")
    local c = esx.client{ hosts = { "http://127.0.0.1:1" }, max_retries = 0 }
    local col = esx.collector{ sink = c, max_concurrent = 1, abandoned_after = 50, rollup = false }
    finally(function() col:close(0) c:close() end)
    local function collect()
      fake.with(stub, nx.collect, col)
      answers[#answers + 1] = stub.status
    end
    -- a request that nginx ends without resuming its handler (the client aborted while its
    -- query was read, say): counted in, it never leaves
    local abandon = true
    stub.var = setmetatable({}, { __index = function(_, k)
      if k ~= "args" then return nil end
      if abandon then abandon = false coroutine.yield() end
      return "site_id=s1&type=view"
    end })
    fake.with(stub, coroutine.resume, coroutine.create(function() nx.collect(col) end))
    assert.equal(1, col:stats().in_progress)
    wall = wall - 3600 -- the wall clock steps back an hour
    require("socket").sleep(0.2) -- past abandoned_after
    collect()
    assert.same({ 200 }, answers)
  end)
end)

-- The bulk indexer's back-off is jittered so that indexers that were refused at the same
-- moment (429) do not retry at the same moment.  LuaJIT's math.random starts from one fixed
-- state, and every nginx worker inherits it from the master: the indexers of all workers drew
-- the same "random" jitter, and retried in step.
describe("esx.bulk's back-off jitter in nginx workers #nginx", function()
  it("differs from one worker to the other", function()
    local ds = require "spec.support.devserver"
    local es, web = ds.start{}, nil
    finally(function()
      if web then web:stop() end
      es:stop()
    end)
    es:fault{ path = "/_bulk", item_status = 429, count = 100 }
    web = nginx.start{
      workers = 2,
      http = ([[
        init_by_lua_block { package.loaded.jitter_client = require("esx").client{ hosts = { "%s" } } }
      ]]):format(es.url),
      server = [[
        location = /jitter {
          content_by_lua_block {
            local core = require "esx.core"
            -- 100 s, jittered: a wait in [50 s, 100 s); the retry never comes in this spec
            local bi = package.loaded.jitter_client:bulk_indexer{ backoff_min = 100000,
              backoff_max = 100000, max_retries = 1, flush_interval = 0 }
            package.loaded.jitter_keep = bi -- (not collected with an item it never sent)
            bi:add("index", { _index = "jitter" }, { n = 1 })
            bi:flush()
            local deadline = core.now() + 5000
            while not bi.delayed[1] and core.now() < deadline do ngx.sleep(0.01) end
            local d = bi.delayed[1]
            ngx.say(ngx.worker.id(), " ", d and math.floor(d.due - core.now()) or "none")
          }
        }
      ]],
    }
    local waits = {}
    for _ = 1, 60 do
      local status, body = web:get("/jitter")
      assert.equal(200, status, body)
      local id, wait = body:match("^(%d+) (%d+)")
      assert.truthy(id, body)
      waits[id] = waits[id] or tonumber(wait) -- each worker's first draw
      if waits["0"] and waits["1"] then break end
    end
    assert.truthy(waits["0"] and waits["1"], "both workers answered")
    -- identical draws differ by the ms or two between an add and its measure (each worker
    -- measures its own right after its add); independent ones by up to 50 s, within 20 ms of
    -- each other 2 x 20 / 50000 = 0.08% of the time (200 ms failed 1 run in ~125)
    assert.is_true(math.abs(waits["0"] - waits["1"]) > 20,
      ("worker 0 waits %d ms, worker 1 %d ms"):format(waits["0"], waits["1"]))
  end)
end)

-- The collector's retry back-off is jittered too (src/collector_queue.c), from a generator
-- seeded when the collector is made: one made in init_by_lua, as docs/nginx.md advises, was
-- seeded in the master, and the fork left every worker the same seed -- the workers' retries
-- of a 429 fell due in step.
describe("the collector's retry jitter in nginx workers #nginx", function()
  it("differs from one worker to the other for a collector made in init_by_lua", function()
    local ds = require "spec.support.devserver"
    local es, web = ds.start{}, nil
    finally(function()
      es:clear_faults() -- the workers' queues empty at their next retry: nginx stops at once
      if web then web:stop() end
      es:stop()
    end)
    es:fault{ path = "/_bulk", item_status = 429, count = 1000 } -- every item, every time
    web = nginx.start{
      workers = 2,
      http = ([[
        lua_shared_dict jitter 64k;
        init_by_lua_block {
          local esx = require "esx"
          -- a retry waits 1-2 s (backoff_max 2 s, equal jitter)
          package.loaded.jitter_col = assert(esx.collector{ sink = esx.client{ hosts = { "%s" } },
            flush_interval = 10, retry_backoff_min = 2000, retry_backoff_max = 2000 })
        }
        init_worker_by_lua_block {
          ngx.timer.at(0, function()
            local core, col = require "esx.core", package.loaded.jitter_col
            local status = col:handle{ method = "POST", body = '{"site_id":"s","type":"view"}',
                                       headers = { ["content-type"] = "application/json" } }
            -- the times between this worker's bulk requests: the back-offs it drew
            local times, last = {}, 0
            local deadline = core.now() + 20000
            while #times < 4 and core.now() < deadline do
              local n = col:stats().bulk_requests
              if n > last then last = n times[#times + 1] = core.now() end
              ngx.sleep(0.005)
            end
            local gaps = {}
            for i = 2, #times do gaps[#gaps + 1] = math.floor(times[i] - times[i - 1]) end
            ngx.shared.jitter:set(tostring(ngx.worker.id()), status .. " " .. table.concat(gaps, " "))
            col:close(0) -- (measured: nginx need not wait for the next retry to stop)
          end)
        }
      ]]):format(es.url),
      server = [[
        location = /gaps { content_by_lua_block { ngx.say(ngx.shared.jitter:get(ngx.var.arg_w)) } }
      ]],
    }
    local gaps = {}
    for _ = 1, 300 do
      for w = 0, 1 do
        local _, body = web:get("/gaps?w=" .. w)
        if body ~= "nil\n" then gaps[w] = gaps[w] or body end
      end
      if gaps[0] and gaps[1] then break end
      require("socket").sleep(0.1)
    end
    assert.truthy(gaps[0] and gaps[1], "both workers measured")
    local a, b = {}, {}
    for n in gaps[0]:gmatch("%d+") do a[#a + 1] = tonumber(n) end
    for n in gaps[1]:gmatch("%d+") do b[#b + 1] = tonumber(n) end
    assert.same({ 204, 204 }, { a[1], b[1] })
    assert.equal(4, #a, gaps[0])
    assert.equal(4, #b, gaps[1])
    -- drawn alike, the gaps differ by the polling's few ms; drawn apart, by up to 1 s each
    -- (all three within 50 ms of the other worker's: 0.1% of the time)
    local apart = false
    for i = 2, 4 do
      if math.abs(a[i] - b[i]) > 50 then apart = true end
    end
    assert.is_true(apart, "worker 0: " .. gaps[0] .. ", worker 1: " .. gaps[1])
  end)
end)
