-- esx.collector inside nginx: created in init_by_lua (master), serving 2 workers; bodies
-- buffered to files; and a worker killed with SIGKILL loses nothing it acknowledged.
local ds = require "spec.support.devserver"
local nginx = require "spec.support.nginx"
local esx = require "esx"
local cjson = require "cjson"
local socket = require "socket"
local shell_ok = require("spec.support.shell").ok

local es, web, client, spool

local function tmpdir()
  local d = os.tmpname()
  os.remove(d)
  os.execute("mkdir -p " .. d)
  return d
end

local function indexed(prefix)
  assert(client:refresh("events-*"))
  local q = prefix and { prefix = { event_id = prefix } } or { match_all = {} }
  local n = client:count("events-*", { query = q })
  return n
end

setup(function()
  es = ds.start{}
  client = assert(esx.client{ hosts = { es.url } })
  spool = tmpdir()
  web = nginx.start{
    workers = 2,
    http = ([[
      client_body_buffer_size 1k;   # larger bodies go to a temp file: the adapter reads it
      client_max_body_size 64k;
      init_by_lua_block {
        local esx = require "esx"
        local c = assert(esx.client{ hosts = { "%s" }, connect_timeout = 200,
                                     dead_backoff_min = 100, dead_backoff_max = 200 })
        package.loaded.test_collector = assert(esx.collector{ sink = c, spool_dir = "%s",
          flush_interval = 50, retry_backoff_min = 50, retry_backoff_max = 200,
          spool_sync_interval = 0 })
      }
    ]]):format(es.url, spool),
    server = [[
      location = /collect {
        content_by_lua_block { require("esx.nginx").collect(package.loaded.test_collector) }
      }
      location = /stats {
        content_by_lua_block {
          ngx.say(require("cjson").encode(package.loaded.test_collector:stats()))
        }
      }
    ]],
  }
end)

teardown(function()
  if web then web:stop() end
  client:close()
  es:stop()
  os.execute("rm -rf " .. spool)
end)

describe("graceful shutdown without a spool #nginx", function()
  it("flushes what is in memory when nginx stops (exit_worker_by_lua)", function()
    es:reset()
    es:fault{ path = "/_bulk", stall_ms = 800, count = 1 }
    local quiet = nginx.start{
      workers = 1,
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.mem_collector = assert(esx.collector{
            sink = assert(esx.client{ hosts = { "%s" } }), flush_interval = 60000 })
        }
        exit_worker_by_lua_block { package.loaded.mem_collector:close(10000) }
      ]]):format(es.url),
      server = [[
        location = /collect {
          content_by_lua_block { require("esx.nginx").collect(package.loaded.mem_collector) }
        }
      ]],
    }
    finally(function() quiet:stop() end) -- (stopped already when the spec ran to its end)
    for i = 1, 15 do
      local status = quiet:request("POST", "/collect",
        cjson.encode({ site_id = "s1", type = "view", event_id = "g" .. i }),
        { ["Content-Type"] = "application/json" })
      assert.equal(204, status)
    end
    assert.equal(0, indexed("g")) -- a minute-long flush_interval: all of them are in memory
    quiet:stop() -- QUIT: graceful
    assert.equal(15, indexed("g"))
  end)
end)

describe("esx.nginx.collect #nginx", function()
  it("accepts events in every worker and ships them", function()
    es:reset()
    for i = 1, 20 do
      local status = web:request("POST", "/collect",
        cjson.encode({ site_id = "s1", type = "view", event_id = "w" .. i }),
        { ["Content-Type"] = "application/json" })
      assert.equal(204, status)
    end
    local deadline = socket.gettime() + 10
    while indexed() < 20 and socket.gettime() < deadline do socket.sleep(0.1) end
    assert.equal(20, indexed())
  end)

  it("reads a body nginx buffered to a file", function()
    es:reset()
    local evs = {}
    for i = 1, 40 do evs[i] = { site_id = "s1", type = "view", event_id = "f" .. i, pad = string.rep("x", 50) } end
    local body = cjson.encode(evs)
    assert.is_true(#body > 1024)
    local status = web:request("POST", "/collect", body, { ["Content-Type"] = "application/json" })
    assert.equal(204, status)
    local deadline = socket.gettime() + 10
    while indexed() < 40 and socket.gettime() < deadline do socket.sleep(0.1) end
    assert.equal(40, indexed())
  end)

  it("answers a pixel beacon and a preflight", function()
    local status, body, headers = web:get("/collect?site_id=s1&type=view")
    assert.equal(200, status)
    assert.equal("image/gif", headers["content-type"])
    assert.equal("GIF89a", body:sub(1, 6))
    status, _, headers = web:request("OPTIONS", "/collect", nil,
      { Origin = "https://a.example", ["Access-Control-Request-Method"] = "POST" })
    assert.equal(204, status)
    assert.equal("*", headers["access-control-allow-origin"])
  end)

  it("sends each answer's headers: 204, 405, 415, with and without an Origin", function()
    local ev = cjson.encode({ site_id = "s1", type = "view" })
    for _ = 1, 3 do -- the common answers' header lists are shared between requests
      local status, body, headers = web:request("POST", "/collect", ev, { ["Content-Type"] = "text/plain" })
      assert.equal(204, status)
      assert.equal("", body)
      assert.equal("no-store", headers["cache-control"])
      assert.is_nil(headers["access-control-allow-origin"])
      status, _, headers = web:request("POST", "/collect", ev,
        { ["Content-Type"] = "text/plain;charset=UTF-8", Origin = "https://a.example" })
      assert.equal(204, status)
      assert.equal("no-store", headers["cache-control"])
      assert.equal("*", headers["access-control-allow-origin"])
      assert.is_nil(headers["access-control-allow-credentials"])
      status, body, headers = web:request("PUT", "/collect", ev, { Origin = "https://a.example" })
      assert.equal(405, status)
      assert.equal("GET, POST, OPTIONS", headers["allow"])
      assert.equal("application/json", headers["content-type"])
      assert.equal("*", headers["access-control-allow-origin"])
      assert.equal("method not allowed", cjson.decode(body).error)
      status, _, headers = web:request("POST", "/collect", ev, { ["Content-Type"] = "text/html" })
      assert.equal(415, status)
      assert.equal("no-store", headers["cache-control"])
      assert.is_nil(headers["allow"])
    end
  end)

  it("answers 415 when Content-Encoding is given twice (nginx 1.22's $http_ var keeps the first)", function()
    local ev = cjson.encode({ site_id = "s1", type = "view" })
    local gz = ds.gzip(ev)
    -- (a header value with a line break in it: the spec's client writes it as a second header)
    for _, case in ipairs{ { "identity\r\nContent-Encoding: gzip", ev }, { "identity\r\nContent-Encoding: gzip", gz },
                           { "gzip\r\nContent-Encoding: gzip", ds.gzip(gz) } } do
      local status, body = web:request("POST", "/collect", case[2],
        { ["Content-Type"] = "text/plain", ["Content-Encoding"] = case[1] })
      assert.equal(415, status, body)
      assert.equal("unsupported content encoding", cjson.decode(body).error)
    end
    local status = web:request("POST", "/collect", gz, { ["Content-Type"] = "text/plain", ["Content-Encoding"] = "gzip" })
    assert.equal(204, status)
  end)

  it("answers 503 without the spool's path when the spool cannot be used, and logs what went wrong", function()
    local dir = tmpdir()
    local broken = nginx.start{
      workers = 1,
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.broken = assert(esx.collector{
            sink = assert(esx.client{ hosts = { "%s" } }), spool_dir = "%s", dead_letter = "/dev/null" })
        }
      ]]):format(es.url, dir),
      server = [[
        location = /collect { content_by_lua_block { require("esx.nginx").collect(package.loaded.broken) } }
      ]],
    }
    finally(function() broken:stop() os.execute("rm -rf " .. dir) end)
    os.execute("rm -rf " .. dir .. " && touch " .. dir) -- before a worker opens it
    local ev = cjson.encode({ site_id = "s1", type = "view" })
    for _ = 1, 3 do
      local status, body, headers = broken:request("POST", "/collect", ev, { ["Content-Type"] = "text/plain" })
      assert.equal(503, status)
      assert.equal("1", headers["retry-after"])
      assert.equal('{"error":"the collector cannot store events now"}', body)
    end
    local log = broken:error_log()
    local _, lines = log:gsub("esx collector: answered 503: cannot use spool_dir " .. dir:gsub("%p", "%%%0"), "")
    assert.equal(1, lines, log) -- once a second, not once per request
  end)

  it("gives back the max_concurrent slots of uploads nginx ended (body timeout, abort)", function()
    local small = nginx.start{
      workers = 1,
      http = ([[
        client_body_timeout 1s;
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.small_collector = assert(esx.collector{
            sink = assert(esx.client{ hosts = { "%s" } }), max_concurrent = 2, abandoned_after = 1500,
            allowed_origins = { "https://shop.example" } })
        }
      ]]):format(es.url),
      server = [[
        location = /collect {
          content_by_lua_block { require("esx.nginx").collect(package.loaded.small_collector) }
        }
      ]],
    }
    finally(function() small:stop() end)
    local ev = cjson.encode({ site_id = "s1", type = "view" })
    -- two uploads that stall after 10 of 100 body bytes, then one that closes mid-body
    local stalled = {}
    for i = 1, 2 do
      local c = assert(socket.connect("127.0.0.1", small.port))
      assert(c:send("POST /collect HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" ..
                    "Content-Length: 100\r\n\r\n0123456789"))
      stalled[i] = c
    end
    socket.sleep(0.2)
    -- both slots are taken: refused at once, with the CORS headers a tag needs to see it
    local status, body, headers = small:request("POST", "/collect", ev,
      { ["Content-Type"] = "text/plain", Origin = "https://shop.example" })
    assert.equal(503, status)
    assert.equal("too many requests in progress", cjson.decode(body).error)
    assert.equal("1", headers["retry-after"])
    assert.equal("https://shop.example", headers["access-control-allow-origin"])
    assert.equal("true", headers["access-control-allow-credentials"])
    assert.equal("Retry-After", headers["access-control-expose-headers"])
    socket.sleep(1.2) -- client_body_timeout ends both requests; their handlers never return
    for _, c in ipairs(stalled) do c:close() end
    -- the slots come back: a request is admitted within a few seconds
    local deadline = socket.gettime() + 10
    repeat
      status = small:request("POST", "/collect", ev, { ["Content-Type"] = "text/plain" })
      if status ~= 204 then socket.sleep(0.2) end
    until status == 204 or socket.gettime() > deadline
    assert.equal(204, status)
    assert.truthy(small:error_log():find("gave back their max_concurrent slot", 1, true))
  end)

  it("stops counting aborted uploads, one after the other, after abandoned_after, full or not", function()
    local roomy = nginx.start{
      workers = 1,
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.roomy = assert(esx.collector{
            sink = assert(esx.client{ hosts = { "%s" } }), max_concurrent = 3, abandoned_after = 1500 })
        }
      ]]):format(es.url),
      server = [[
        location = /collect { content_by_lua_block { require("esx.nginx").collect(package.loaded.roomy) } }
        location = /stats { content_by_lua_block {
          local s = package.loaded.roomy:stats()
          ngx.say(s.in_progress, " ", s.utilization.concurrency) } }
      ]],
    }
    finally(function() roomy:stop() end)
    for _ = 1, 2 do -- two uploads that send 4 of 100 bytes and go away
      local c = assert(socket.connect("127.0.0.1", roomy.port))
      assert(c:send("POST /collect HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" ..
                    "Content-Length: 100\r\n\r\n0123"))
      socket.sleep(0.1)
      c:close()
    end
    assert.equal("2 0.66666666666667\n", select(2, roomy:get("/stats")))
    socket.sleep(2.5) -- past abandoned_after; the collector was never full
    assert.equal("0 0\n", select(2, roomy:get("/stats")))
  end)

  it("lets a collector with an aborted upload counted in be collected once it is dropped", function()
    -- the adapter's table of requests in progress held the collector of an upload nginx
    -- ended until that collector reclaimed it: one dropped meanwhile never was collected
    -- (its shipper thread, its memory and its spool_dir's hold stayed for the worker's life)
    local dropper = nginx.start{
      workers = 1,
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.drop_sink = assert(esx.client{ hosts = { "%s" } })
          package.loaded.drop_col = assert(esx.collector{ sink = package.loaded.drop_sink,
            abandoned_after = 60000 })
          package.loaded.drop_weak = setmetatable({ package.loaded.drop_col }, { __mode = "v" })
        }
      ]]):format(es.url),
      server = [[
        location = /collect {
          content_by_lua_block { require("esx.nginx").collect(package.loaded.drop_col) }
        }
        location = /drop { content_by_lua_block {
          local before = package.loaded.drop_col:stats().in_progress
          package.loaded.drop_col = nil
          collectgarbage()
          collectgarbage()
          ngx.say(before, " ", package.loaded.drop_weak[1] and "pinned" or "collected") } }
      ]],
    }
    finally(function() dropper:stop() end)
    local c = assert(socket.connect("127.0.0.1", dropper.port))
    assert(c:send("POST /collect HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" ..
                  "Content-Length: 100\r\n\r\n0123"))
    socket.sleep(0.1)
    c:close()
    socket.sleep(0.2)
    local status, body = dropper:get("/drop")
    assert.equal(200, status)
    assert.equal("1 collected\n", body)
  end)

  it("answers 413 at once, by its Content-Length, to a body over max_body that nginx would take", function()
    local roomy = nginx.start{
      workers = 1,
      http = ([[
        client_max_body_size 1m;
        client_body_buffer_size 1k;
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.lean = assert(esx.collector{
            sink = assert(esx.client{ hosts = { "%s" } }), max_body = 1024,
            allowed_origins = { "https://shop.example" } })
        }
      ]]):format(es.url),
      server = [[
        location = /collect { content_by_lua_block { require("esx.nginx").collect(package.loaded.lean) } }
        location = /stats { content_by_lua_block {
          local s = package.loaded.lean:stats()
          ngx.say(s.in_progress, " ", s.rejected.too_large) } }
      ]],
    }
    finally(function() roomy:stop() end)
    -- 100 KiB announced, 10 bytes sent: the answer must not wait for (nor store) the rest
    local c = assert(socket.connect("127.0.0.1", roomy.port))
    assert(c:send("POST /collect HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" ..
                  "Origin: https://shop.example\r\nContent-Length: 102400\r\n\r\n0123456789"))
    c:settimeout(1)
    local head = {}
    repeat
      local line = c:receive("*l")
      head[#head + 1] = line
    until not line or line == ""
    c:close()
    local _, stats = roomy:get("/stats")
    assert.equal("HTTP/1.1 413 Request Entity Too Large", head[1])
    local text = table.concat(head, "\n")
    assert.truthy(text:find("\nAccess-Control-Allow-Origin: https://shop.example\n", 1, true), text)
    assert.truthy(text:find("\nCache-Control: no-store\n", 1, true), text)
    assert.equal("0 1\n", stats)
  end)

  describe("with bodies of unknown length (chunked)", function()
    local tight
    setup(function()
      tight = nginx.start{
        workers = 1,
        http = ([[
          client_max_body_size 1k;
          client_body_buffer_size 1k;
          init_by_lua_block {
            local esx = require "esx"
            package.loaded.tight_collector = assert(esx.collector{
              sink = assert(esx.client{ hosts = { "%s" } }), max_concurrent = 2 })
          }
        ]]):format(es.url),
        server = [[
          location = /collect {
            content_by_lua_block { require("esx.nginx").collect(package.loaded.tight_collector) }
          }
          location = /stats {
            content_by_lua_block {
              ngx.say(package.loaded.tight_collector:stats().in_progress)
            }
          }
        ]],
      }
    end)
    teardown(function() if tight then tight:stop() end end)

    -- Sends raw bytes on one connection; returns the statuses of the answers (up to the close,
    -- or 1 s).
    local function pipeline(raw)
      local c = assert(socket.connect("127.0.0.1", tight.port))
      assert(c:send(raw))
      c:settimeout(1)
      local data = ""
      repeat
        local chunk, err, partial = c:receive(4096)
        data = data .. (chunk or partial or "")
      until err
      c:close()
      local statuses = {}
      for s in data:gmatch("HTTP/1%.1 (%d%d%d)") do statuses[#statuses + 1] = tonumber(s) end
      return statuses
    end

    local STATS = "GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"

    it("accepts a chunked body, and gives the slot back when nginx refuses one as too large", function()
      local ev = cjson.encode({ site_id = "s1", type = "view" })
      local statuses = pipeline("POST /collect HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" ..
        "Transfer-Encoding: chunked\r\n\r\n" .. string.format("%x", #ev) .. "\r\n" .. ev .. "\r\n0\r\n\r\n" .. STATS)
      assert.same({ 204, 200 }, statuses)
      -- over client_max_body_size: nginx answers 413 itself and ends the handler unresumed
      for _ = 1, 3 do
        statuses = pipeline("POST /collect HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n" ..
          "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n800\r\n" .. string.rep("a", 2048) .. "\r\n0\r\n\r\n")
        assert.same({ 413 }, statuses)
      end
      local status = tight:request("POST", "/collect", ev, { ["Content-Type"] = "text/plain" })
      assert.equal(204, status)
      local _, body = tight:get("/stats")
      assert.equal("0\n", body)
    end)
  end)

  it("ships every event exactly once across nginx -s reload (HUP), old workers and new", function()
    es:reset()
    local master = web:pid()
    local old = web:workers()
    local function post(id)
      return web:request("POST", "/collect", cjson.encode({ site_id = "s1", type = "view", event_id = id }),
        { ["Content-Type"] = "application/json" })
    end
    for i = 1, 20 do assert.equal(204, post("hup" .. i)) end
    os.execute("kill -HUP " .. master)
    local deadline = socket.gettime() + 10
    local now
    repeat -- new workers from the new configuration (init_by_lua ran again in the master)
      socket.sleep(0.05)
      now = web:workers()
      local fresh = 0
      for _, pid in ipairs(now) do
        local was = false
        for _, o in ipairs(old) do if o == pid then was = true end end
        if not was then fresh = fresh + 1 end
      end
    until (fresh >= 2 and #now == 2) or socket.gettime() > deadline
    assert.equal(2, #now)
    for i = 21, 40 do assert.equal(204, post("hup" .. i)) end
    deadline = socket.gettime() + 15
    while indexed("hup") < 40 and socket.gettime() < deadline do socket.sleep(0.1) end
    assert.equal(40, indexed("hup"))
    socket.sleep(0.5)
    assert.equal(40, indexed("hup")) -- exactly once
    local log = web:error_log()
    assert.falsy(log:find("exited on signal", 1, true), log)
    assert.falsy(log:find("%[alert%]") or log:find("%[crit%]") or log:find("%[emerg%]"), log)
  end)

  it("loses nothing a worker acknowledged when it is killed with SIGKILL", function()
    es:reset()
    local port = es.port
    es:stop() -- nothing can be shipped: every accepted event is only in memory and the spool
    -- (the specs after this one, and the teardown, want it back on its port)
    finally(function() if es.stopped then es = ds.start{ port = port } end end)
    local accepted = 0
    for i = 1, 30 do
      local status = web:request("POST", "/collect",
        cjson.encode({ site_id = "s1", type = "view", event_id = "sigkill" .. i }),
        { ["Content-Type"] = "application/json" })
      if status == 204 then accepted = accepted + 1 end
    end
    assert.equal(30, accepted)
    for _, pid in ipairs(web:workers()) do os.execute("kill -9 " .. pid) end
    socket.sleep(0.3) -- the master starts new workers
    es = ds.start{ port = port }
    -- a new worker claims the dead workers' segments on its first request and replays them
    local deadline = socket.gettime() + 15
    while socket.gettime() < deadline do
      web:get("/stats")
      if indexed("sigkill") >= 30 then break end
      socket.sleep(0.2)
    end
    -- (a prefix no generated event_id has: with "k", an event of an earlier test still being
    -- shipped or replayed whose generated id began with "k" -- 1 in 64 -- counted here too)
    assert.equal(30, indexed("sigkill"))
    socket.sleep(0.5)
    assert.equal(30, indexed("sigkill")) -- exactly once
  end)
end)

describe("a reload (HUP) after a worker was killed #nginx", function()
  it("leaves the dead worker's spool segments to the workers: the master does not claim them", function()
    local dir = tmpdir()
    local sink = ds.start{}
    local port = sink.port
    sink:stop() -- down: what the worker accepts stays in its spool
    local hup = nginx.start{
      workers = 1,
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          local c = assert(esx.client{ hosts = { "http://127.0.0.1:%d" }, connect_timeout = 200,
                                       dead_backoff_min = 100, dead_backoff_max = 200 })
          package.loaded.hup_collector = assert(esx.collector{ sink = c, spool_dir = "%s",
            flush_interval = 50, retry_backoff_min = 50, retry_backoff_max = 200,
            spool_sync_interval = 0 })
        }
      ]]):format(port, dir),
      server = [[
        location = /collect {
          content_by_lua_block { require("esx.nginx").collect(package.loaded.hup_collector) }
        }
        location = /stats {
          content_by_lua_block { ngx.say(package.loaded.hup_collector:stats().queued_events) }
        }
      ]],
    }
    local c
    finally(function()
      hup:stop()
      if c then c:close() end
      sink:stop() -- the one started again, or (stopped already) the first
      os.execute("rm -rf " .. dir)
    end)
    for i = 1, 10 do
      assert.equal(204, hup:request("POST", "/collect",
        cjson.encode({ site_id = "s1", type = "view", event_id = "orph" .. i }),
        { ["Content-Type"] = "application/json" }))
    end
    local master = hup:pid()
    local first = hup:workers()
    for _, pid in ipairs(first) do os.execute("kill -9 " .. pid) end
    local deadline = socket.gettime() + 10
    repeat socket.sleep(0.05) until (#hup:workers() == 1 and hup:workers()[1] ~= first[1])
      or socket.gettime() > deadline
    -- the reload frees the previous configuration's Lua state (and its collector) in the
    -- master; the killed worker's segment must stay a dead process's, for a worker to replay
    os.execute("kill -HUP " .. master)
    deadline = socket.gettime() + 10
    -- ("start worker processes" then "start worker process <pid>": twice at the start, once
    -- at the respawn, twice at the reload)
    repeat socket.sleep(0.05)
    until select(2, hup:error_log():gsub("start worker process", "")) >= 5 or socket.gettime() > deadline
    socket.sleep(0.5)
    local p = io.popen("ls " .. dir)
    local listing = p:read("*a")
    p:close()
    assert.falsy(listing:find("seg%-" .. master .. "%-"), listing)
    sink = ds.start{ port = port }
    c = assert(esx.client{ hosts = { sink.url } })
    local n = 0
    deadline = socket.gettime() + 15
    while socket.gettime() < deadline do
      hup:get("/stats") -- a worker's collector starts (and claims orphans) on first use
      assert(c:refresh("events-*"))
      n = c:count("events-*", { query = { prefix = { event_id = "orph" } } }) or 0
      if n >= 10 then break end
      socket.sleep(0.2)
    end
    assert.equal(10, n)
  end)
end)

describe("a graceful stop with a spool while the sink is down #nginx", function()
  it("keeps the rollup rows with the events: the next nginx writes both", function()
    local dir = tmpdir()
    local sink = ds.start{}
    local port = sink.port
    sink:stop() -- down: nothing is acknowledged before the stop
    local function conf()
      return {
        workers = 1,
        http = ([[
          init_by_lua_block {
            local esx = require "esx"
            local c = assert(esx.client{ hosts = { "http://127.0.0.1:%d" }, connect_timeout = 200,
                                         dead_backoff_min = 100, dead_backoff_max = 200 })
            package.loaded.roll_collector = assert(esx.collector{ sink = c, spool_dir = "%s",
              flush_interval = 50, retry_backoff_min = 50, retry_backoff_max = 200 })
          }
          exit_worker_by_lua_block { package.loaded.roll_collector:close(300) }
        ]]):format(port, dir),
        server = [[
          location = /collect {
            content_by_lua_block { require("esx.nginx").collect(package.loaded.roll_collector) }
          }
          location = /stats {
            content_by_lua_block { ngx.say(package.loaded.roll_collector:stats().queued_events) }
          }
        ]],
      }
    end
    local web1, web2, c
    finally(function()
      if web1 then web1:stop() end
      if web2 then web2:stop() end
      if c then c:close() end
      sink:stop()
      os.execute("rm -rf " .. dir)
    end)
    web1 = nginx.start(conf())
    for i = 1, 12 do
      assert.equal(204, web1:request("POST", "/collect",
        cjson.encode({ site_id = "roll", type = "view", event_id = "roll" .. i, user_id = "u" .. i }),
        { ["Content-Type"] = "application/json" }))
    end
    web1:stop() -- QUIT: exit_worker_by_lua closes the collector; the sink is still down
    web1 = nil
    sink = ds.start{ port = port }
    c = assert(esx.client{ hosts = { sink.url } })
    web2 = nginx.start(conf()) -- its worker replays the first one's segments
    local events, rows, counted = 0, 0, 0
    local deadline = socket.gettime() + 15
    while socket.gettime() < deadline do
      web2:get("/stats")
      assert(c:refresh("*"))
      events = c:count("events-*", { query = { prefix = { event_id = "roll" } } }) or 0
      local res = c:search("rollups-*", { size = 100, query = { term = { site_id = "roll" } } })
      rows, counted = 0, 0
      for _, hit in ipairs(res and res.hits.hits or {}) do
        rows = rows + 1
        counted = counted + hit._source.count
      end
      if events >= 12 and counted >= 12 then break end
      socket.sleep(0.2)
    end
    assert.equal(12, events)
    assert.equal(1, rows)
    assert.equal(12, counted) -- before: 0 rows (lost at the stop, while the events were kept)
  end)
end)

describe("a collector made by a root master for workers of another user #nginx", function()
  local status = assert(io.open("/proc/self/status"))
  local is_root = status:read("*a"):match("\nUid:%s+0%s") ~= nil
  status:close()
  local it_root = is_root and it or pending

  -- nginx with workers of user nobody and a collector made in init_by_lua with `option`
  -- (`spool_dir = "..."` or `dead_letter = "..."`); one event refused for good must reach the
  -- dead-letter file `file`.
  local function dead_letter_as_nobody(option, file, event_id)
    es:reset()
    local web_nobody = nginx.start{
      workers = 1,
      user = "nobody nogroup",
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.nobody_collector = assert(esx.collector{
            sink = assert(esx.client{ hosts = { "%s" } }), %s, flush_interval = 50 })
        }
      ]]):format(es.url, option),
      server = [[
        location = /collect {
          content_by_lua_block { require("esx.nginx").collect(package.loaded.nobody_collector) }
        }
        location = /stats {
          content_by_lua_block {
            local st = package.loaded.nobody_collector:stats()
            ngx.say(st.dead_lettered, " ", st.dead_letter_failed)
          }
        }
      ]],
    }
    local ok, err = pcall(function()
      es:fault{ path = "/_bulk", item_status = 400, count = 1 } -- refused for good
      assert.equal(204, web_nobody:request("POST", "/collect",
        cjson.encode({ site_id = "s1", type = "view", event_id = event_id }),
        { ["Content-Type"] = "application/json" }))
      local body
      local deadline = socket.gettime() + 10
      repeat
        socket.sleep(0.1)
        body = select(2, web_nobody:get("/stats"))
      until body ~= "0 0\n" or socket.gettime() > deadline
      assert.equal("1 0\n", body) -- "1 1": the line was lost
      local f = assert(io.open(file))
      local text = f:read("*a")
      f:close()
      assert.truthy(text:find('"' .. event_id .. '"', 1, true), text)
    end)
    web_nobody:stop()
    es:clear_faults()
    assert(ok, err)
  end

  it_root("writes dead letters to the default file in the spool_dir given to the workers' user", function()
    local base = tmpdir()
    finally(function() os.execute("rm -rf " .. base) end)
    local dir = base .. "/spool"
    -- as the docs say: the spool_dir belongs to the workers' user, in a directory of root's
    -- (before: root's master made the file 0600, root's, and the workers lost every line)
    assert(shell_ok("chmod 755 " .. base .. " && mkdir " .. dir .. " && chown nobody:nogroup " ..
      dir .. " && chmod 700 " .. dir))
    dead_letter_as_nobody(('spool_dir = "%s"'):format(dir), dir .. "/dead-letter.ndjson", "nobody1")
  end)

  it_root("has workers write dead letters through the master's descriptor to a file in root's directory", function()
    -- as the default in /tmp: root's master makes the file (0600, root's), which a worker
    -- of another user cannot open again after the fork
    local base = tmpdir()
    finally(function() os.execute("rm -rf " .. base) end)
    assert(shell_ok("chmod 755 " .. base))
    dead_letter_as_nobody(('dead_letter = "%s"'):format(base .. "/dead.ndjson"), base .. "/dead.ndjson",
      "rootfile1")
  end)
end)

describe("a worker killed with SIGKILL, with col:stats() in init_worker_by_lua #nginx", function()
  it("has its spool replayed by the worker started in its place, without a request", function()
    local dir = tmpdir()
    local sink = ds.start{}
    local port = sink.port
    sink:stop()
    local idle = nginx.start{
      workers = 1,
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          local c = assert(esx.client{ hosts = { "http://127.0.0.1:%d" }, connect_timeout = 200,
                                       dead_backoff_min = 100, dead_backoff_max = 200 })
          package.loaded.idle_collector = assert(esx.collector{ sink = c, spool_dir = "%s",
            flush_interval = 50, retry_backoff_min = 50, retry_backoff_max = 200 })
        }
        init_worker_by_lua_block { package.loaded.idle_collector:stats() } # (docs/nginx.md)
      ]]):format(port, dir),
      server = [[
        location = /collect {
          content_by_lua_block { require("esx.nginx").collect(package.loaded.idle_collector) }
        }
      ]],
    }
    local c
    finally(function()
      idle:stop()
      if c then c:close() end
      sink:stop()
      os.execute("rm -rf " .. dir)
    end)
    for i = 1, 5 do
      assert.equal(204, idle:request("POST", "/collect",
        cjson.encode({ site_id = "s1", type = "view", event_id = "idle" .. i }),
        { ["Content-Type"] = "application/json" }))
    end
    local killed = idle:workers()
    os.execute("kill -9 " .. table.concat(killed, " "))
    sink = ds.start{ port = port }
    c = assert(esx.client{ hosts = { sink.url } })
    local n = 0
    local deadline = socket.gettime() + 10
    while socket.gettime() < deadline do -- no request to nginx meanwhile
      assert(c:refresh("events-*"))
      n = c:count("events-*", { query = { prefix = { event_id = "idle" } } }) or 0
      if n >= 5 then break end
      socket.sleep(0.2)
    end
    assert.equal(5, n)
  end)
end)
