-- The fault matrix: each row is a fault the dev server (or the network) injects.  For the
-- client: what esx does, that the call returns within its deadline, and that no descriptor
-- is leaked.  For the collector: that every accepted event arrives exactly once.
-- README.md's "Fault matrix" table lists the same rows.
local esx = require "esx"
local ds = require "spec.support.devserver"
local net = require "spec.support.net"
local socket = require "socket"
local cjson = require "cjson"

local srv

local function now_ms() return socket.gettime() * 1000 end

local PID do
  local f = assert(io.open("/proc/self/stat"))
  PID = f:read("*l"):match("^(%d+)")
  f:close()
end

-- Upper time bounds stretch under sanitizers and valgrind (tools/run-sanitized sets it).
local SCALE = tonumber(os.getenv("ESX_TEST_TIME_SCALE")) or 1

-- sockets and anonymous inodes (eventfd, epoll) of this process: what an engine could leak
-- (pipes are left out: the listing's own pipe races with popen closing its other end)
local last_list = ""
local function open_fds()
  collectgarbage()
  collectgarbage()
  local p = io.popen("ls -l /proc/" .. PID .. "/fd")
  local n, list = 0, {}
  for line in p:lines() do
    local fd, target = line:match(" (%d+) %-> (.*)$")
    if fd and (target:find("^socket:") or target:find("^anon_inode:")) then
      n = n + 1
      list[#list + 1] = fd .. "=" .. target
    end
  end
  p:close()
  last_list = table.concat(list, " ")
  return n
end

local full_backlog, closed_port = net.full_backlog, net.closed_port

-- Each row: fault (dev server rule, or a host maker), client options, expected outcome
-- (kind, or status for a response), and the bound the call must return within (ms).
local rows = {
  { name = "connection refused", host = closed_port, opts = { max_retries = 0 }, kind = "connect", within = 1000 },
  { name = "connect timeout (backlog full)", host = full_backlog,
    opts = { connect_timeout = 200, max_retries = 0 }, kind = "connect_timeout", within = 1200 },
  { name = "stall before headers", fault = { stall_ms = 3000 }, opts = { socket_timeout = 300 },
    kind = "socket_timeout", within = 1300 },
  { name = "stall mid-body", fault = { drip = { bytes = 20, interval_ms = 3000 } },
    opts = { socket_timeout = 300 }, kind = "socket_timeout", within = 1300 },
  { name = "slow drip (activity, not silence)", fault = { drip = { bytes = 100, interval_ms = 50 } },
    opts = { socket_timeout = 400 }, status = 200, within = 5000 },
  { name = "reset mid-response", fault = { reset_after_bytes = 10, count = -1 },
    opts = { max_retries = 1 }, kind = "reset", within = 2000 },
  { name = "empty reply", fault = { empty_reply = true, count = -1 }, opts = { max_retries = 1 },
    kind = "reset", within = 2000 },
  { name = "truncated body", fault = { close_after_bytes = 10, count = -1 },
    opts = { max_retries = 1 }, kind = "reset", within = 2000 },
  { name = "reset once, then fine (retried)", fault = { reset_after_bytes = 10, count = 1 },
    opts = {}, status = 200, within = 2000 },
  { name = "corrupt gzip", fault = { corrupt_gzip = true }, opts = { compression = true },
    kind = "decode", within = 2000 },
  { name = "endless response", fault = { endless = true }, opts = { max_response_bytes = 1048576 },
    kind = "decode", within = 5000 },
  { name = "429 with Retry-After", fault = { status = 429, headers = { ["Retry-After"] = "1" } },
    opts = {}, status = 200, within = 2500 },
  { name = "429 without Retry-After", fault = { status = 429, count = 2 }, opts = {},
    status = 200, within = 2000 },
  { name = "503 (retried)", fault = { status = 503 }, opts = { dead_backoff_min = 1, dead_backoff_max = 1 },
    status = 200, within = 2000 },
  { name = "503 every time", fault = { status = 503, count = -1 },
    opts = { max_retries = 2, dead_backoff_min = 1, dead_backoff_max = 1 }, http = 503, within = 2000 },
}

setup(function() srv = ds.start{} end)
teardown(function() srv:stop() end)

describe("fault matrix: client", function()
  for _, row in ipairs(rows) do
    it(row.name, function()
      srv:reset()
      local before = open_fds()
      local host, cleanup = srv.url, nil
      local c
      finally(function() -- (the listener a row made is closed in the body, before the count)
        if c then c:close() end
        if cleanup then cleanup() end
      end)
      if row.host then host, cleanup = row.host() end
      if row.fault then
        local f = { path = "/" }
        for k, v in pairs(row.fault) do f[k] = v end
        srv:fault(f)
      end
      local opts = { hosts = { host } }
      for k, v in pairs(row.opts) do opts[k] = v end
      c = assert(esx.client(opts))
      local t0 = now_ms()
      local res, err = c:request("GET", "/")
      local took = now_ms() - t0
      if row.kind then
        assert.is_nil(res)
        assert.equal(row.kind, err.kind, tostring(err))
      elseif row.http then
        assert.is_nil(res)
        assert.equal("http", err.kind)
        assert.equal(row.http, err.status)
      else
        assert.is_table(res, tostring(err))
        assert.equal(row.status, res.status)
      end
      assert.is_true(took < row.within * SCALE, row.name .. " took " .. took .. " ms")
      c:close()
      c = nil
      if cleanup then cleanup(); cleanup = nil end
      srv:clear_faults()
      local before_list = last_list
      assert.is_true(open_fds() <= before, "descriptors leaked: " .. before_list .. " -> " .. last_list)
    end)
  end

  it("I/O thread killed: the next call rebuilds it, nothing leaks", function()
    srv:reset()
    local before = open_fds()
    local c = assert(esx.client{ hosts = { srv.url } })
    assert(c:request("GET", "/"))
    for _ = 1, 3 do
      c:_kill_io_thread()
      socket.sleep(0.02)
      assert.equal(200, (assert(c:request("GET", "/"))).status)
    end
    assert.equal(3, c:stats().rebuilds)
    c:close()
    local before_list = last_list
    assert.is_true(open_fds() <= before, "descriptors leaked: " .. before_list .. " -> " .. last_list)
  end)

  it("node restarted under load: marked dead, skipped, brought back", function()
    srv:reset()
    local other = ds.start{}
    local c
    finally(function() -- the first server, or the one started again on its port
      if c then c:close() end
      other:stop()
    end)
    c = assert(esx.client{ hosts = { srv.url, other.url }, dead_backoff_min = 300,
                           dead_backoff_max = 300, max_per_route = 4 })
    local port = other.port
    local pend = {}
    for i = 1, 8 do pend[i] = assert(c:send("GET", "/")) end
    other:stop()
    for i = 9, 24 do pend[i] = assert(c:send("GET", "/")) end
    for _, p in ipairs(pend) do
      assert.is_true(p:wait(5000))
      assert.equal(200, (assert(p:result())).status) -- every call lands on the live node
    end
    local dead = c:stats().nodes[2]
    assert.is_false(dead.alive)
    other = ds.start{ port = port }
    socket.sleep(0.35)
    for _ = 1, 6 do assert(c:request("GET", "/")) end
    assert.is_true(c:stats().nodes[2].alive)
  end)
end)

describe("fault matrix: collector (every accepted event indexed exactly once)", function()
  local bulk_faults = {
    { name = "stall before headers", rule = { stall_ms = 1500 } },
    { name = "reset mid-response", rule = { reset_after_bytes = 10 } },
    { name = "empty reply", rule = { empty_reply = true } },
    { name = "truncated body", rule = { close_after_bytes = 5 } },
    { name = "corrupt gzip", rule = { corrupt_gzip = true } },
    { name = "429 with Retry-After", rule = { status = 429, headers = { ["Retry-After"] = "1" } } },
    { name = "503", rule = { status = 503 } },
    { name = "413 (batch halved)", rule = { status = 413 } },
    { name = "200 with errors: true (items 429)", rule = { item_status = 429, item_count = 3 } },
  }
  for _, row in ipairs(bulk_faults) do
    it(row.name, function()
      srv:reset()
      local rule = { path = "/_bulk", count = 2 }
      for k, v in pairs(row.rule) do rule[k] = v end
      srv:fault(rule)
      local c = assert(esx.client{ hosts = { srv.url }, socket_timeout = 500, compression = true,
                                   dead_backoff_min = 1, dead_backoff_max = 1, max_retries = 0 })
      local col = assert(esx.collector{ sink = c, flush_interval = 20, retry_backoff_min = 20,
                                        retry_backoff_max = 200, rollup = false })
      local accepted = 0
      for i = 1, 10 do
        local evs = {}
        for j = 1, 5 do evs[j] = { site_id = "s", type = "view", event_id = "e" .. i .. "-" .. j } end
        local status = col:handle{ method = "POST", headers = { ["content-type"] = "application/json" },
                                   body = cjson.encode(evs) }
        if status == 204 then accepted = accepted + 5 end
      end
      assert.equal(50, accepted)
      assert.is_true(col:flush(15000), "not everything acknowledged")
      assert(c:refresh("events-*"))
      local res = assert(c:search("events-*", { size = 100, query = { match_all = {} } }))
      local seen = {}
      for _, h in ipairs(res.hits.hits) do
        assert.is_nil(seen[h._id], "duplicate " .. h._id)
        seen[h._id] = true
      end
      assert.equal(50, res.hits.total.value)
      local s = col:stats()
      assert.equal(50, s.shipped)
      assert.equal(0, s.dead_lettered)
      col:close()
      c:close()
    end)
  end
end)
