--- esx.nginx: the adapter between esx and nginx's lua module.
--
-- wait(pending) waits for a client request without blocking the worker: it connects a
-- cosocket to the engine's waiter socket (a unix socket the I/O thread owns), sends the
-- request id, and yields until the I/O thread writes one byte when the request is done.
-- No polling: a worker with many requests in flight costs nothing while it waits.

local ngx = ngx
local tostring, error, type, pcall = tostring, error, type, pcall
local ceil, max = math.ceil, math.max
local concat = table.concat
local core = require "esx.core"

local _M = {}

-- How often a wait re-checks the engine's health while nothing happens (a dead I/O thread is
-- rebuilt by that check).  nginx logs each read timeout unless `lua_socket_log_errors off`.
local SLICE_MS = 1000

-- Deadlines are measured on esx's monotonic clock (core.now), not on nginx's ngx.now(), which
-- is the wall clock: a step of it (NTP, an operator) would end a wait at once, or stretch it
-- by the size of the step.
local now_ms = core.now

-- How long a wait keeps trying to connect to the waiter socket before it fails with
-- `internal`.  A burst of waits -- hundreds of a worker's requests waiting at once, as in a
-- spike -- fills the socket's listen backlog faster than the I/O thread accepts, and
-- connect() fails with EAGAIN: that is no reason to fail the requests.
local CONNECT_RETRY_MS = 1000

-- Connects sock to the waiter socket, retrying with a growing sleep (1 ms to 64 ms).
-- Returns the socket; true when the request ended meanwhile; or nil, err.
local function connect_waiter(pending, sock, path, deadline, timeout)
  local delay, give_up = 1, now_ms() + CONNECT_RETRY_MS
  while true do
    local ok, err = sock:connect("unix:" .. path)
    if ok then return sock end
    local now = now_ms()
    if pending:ready() then return true end
    if deadline and now >= deadline then
      return nil, core.error("request_timeout", "no answer within " .. timeout .. " ms")
    end
    if now >= give_up then
      -- A worker out of worker_connections (each wait holds one) fails the connect with
      -- whatever errno was set last ("no such file or directory", "no such device or
      -- address"... of a file that is there): when the file is there (opening a socket file
      -- fails with ENXIO, not ENOENT), name that cause too.
      local f, _, code = io.open(path)
      if f then f:close() end
      local hint = code ~= 2 and " (or the worker is out of worker_connections: each wait holds one)" or ""
      return nil, core.error("internal", "cannot reach the esx waiter socket: " .. tostring(err) .. hint)
    end
    local nap = delay
    if deadline and deadline - now < nap then nap = deadline - now end
    ngx.sleep(nap / 1000)
    if pending:ready() then return true end
    local perr
    path, perr = pending:waiter_path() -- (a new one if the engine was rebuilt meanwhile)
    if not path then return nil, perr end
    if delay < 64 then delay = delay * 2 end
    sock = ngx.socket.tcp()
  end
end

--- esx.nginx.wait(pending, timeout_ms?) -> res | nil, err   (yields; never blocks the worker)
-- Returns what pending:result() returns once the request is done.  With timeout_ms, gives
-- up after that long with nil, {kind = "request_timeout"} (the request itself goes on).
-- Waits until pending is done: true, or nil, err (the waiter socket failed, or timeout_ms
-- passed: the request itself goes on).  What wait and the client's own calls share; the
-- client's decoded calls then read the answer with pending:json(), without a res table.
-- timeout: nil (none) or ms; NaN or another type raises, as pending:wait does, and a negative
-- one is 0 (the deadline passed already).
local function check_timeout(timeout, fname)
  if timeout == nil then return nil end
  if type(timeout) ~= "number" or timeout ~= timeout then
    error("bad argument #2 to '" .. fname .. "' (timeout in ms expected, got " ..
          (type(timeout) == "number" and "NaN" or type(timeout)) .. ")", 3)
  end
  return timeout < 0 and 0 or timeout
end

local function check_pending(pending, fname)
  if type(pending) ~= "table" or not pending.ready then
    error("bad argument #1 to '" .. fname .. "' (esx pending request expected)", 3)
  end
end

-- Phases in which ngx.timer.at raises ("no request", "API disabled"): the master's init and
-- a worker's exit.
local no_timer_phase = { init = true, exit_worker = true }

function _M.await(pending, timeout)
  check_pending(pending, "await")
  timeout = check_timeout(timeout, "await")
  if pending:ready() then return true end
  if ngx == nil then -- plain Lua: there is no light thread to yield
    error("esx.nginx.wait: cannot wait outside nginx (no ngx): block with pending:wait()", 0)
  end
  local deadline = timeout and (now_ms() + timeout)
  local made, sock = pcall(ngx.socket.tcp)
  if not made then -- a phase without cosockets: it cannot yield either
    local phase = tostring(ngx.get_phase())
    -- no timer can start in the master (init) or in an exiting worker: do not advise one
    if no_timer_phase[phase] then
      error("esx.nginx.wait: cannot wait in nginx's " .. phase .. " phase (it cannot yield): " ..
            "block the worker with pending:wait()", 0)
    end
    error("esx.nginx.wait: cannot wait in nginx's " .. phase .. " phase " ..
          "(it cannot yield): wait in a timer (ngx.timer.at), or block the worker with " ..
          "pending:wait()", 0)
  end
  local nap = 0
  while true do
    local path, perr = pending:waiter_path()
    if not path then return nil, perr end
    local cerr
    sock, cerr = connect_waiter(pending, sock, path, deadline, timeout)
    if sock == true then return true end
    if not sock then return nil, cerr end
    -- A send that fails found the connection closed by the I/O thread before it named the
    -- request: it had no room to track one more waiter (it wakes such a one at once), or the
    -- engine went away.  Meanwhile the request may have ended -- it was "internal" then,
    -- instead of the result -- or not: either way this is an early wake-up, as below.
    local sent = sock:send(tostring(pending:id()) .. "\n")
    while sent do
      local slice = SLICE_MS
      if deadline then
        local left = deadline - now_ms()
        if left <= 0 then
          sock:close()
          if pending:ready() then return true end
          return nil, core.error("request_timeout", "no answer within " .. timeout .. " ms")
        end
        -- whole ms, at least 1: the cosocket truncates its timeout to an integer, and 0 means
        -- lua_socket_read_timeout (60 s by default), not "now"
        if left < slice then slice = ceil(left) end
      end
      sock:settimeout(slice)
      local data, rerr = sock:receive(1)
      if data or rerr ~= "timeout" then break end
      -- nothing yet: ready() also rebuilds an engine whose thread died
      if pending:ready() then break end
    end
    sock:close()
    if pending:ready() then return true end
    -- The waiter connection ended before the request: the engine was rebuilt, or it had no
    -- room to track one more waiter and woke this one at once.  Wait again, after a pause
    -- that grows (1 to 64 ms), so that an engine full of waiters is polled, not spun on.
    nap = nap == 0 and 1 or (nap < 64 and nap * 2 or 64)
    if deadline and deadline - now_ms() < nap then nap = ceil(max(deadline - now_ms(), 0)) end
    if nap > 0 then ngx.sleep(nap / 1000) end
    if pending:ready() then return true end
    if deadline and now_ms() >= deadline then
      return nil, core.error("request_timeout", "no answer within " .. timeout .. " ms")
    end
    sock = ngx.socket.tcp()
  end
end

function _M.wait(pending, timeout)
  check_pending(pending, "wait")
  timeout = check_timeout(timeout, "wait")
  local ok, err = _M.await(pending, timeout)
  -- a request that ended while the waiter socket failed has its result: that, not the error
  if not ok and not pending:ready() then return nil, err end
  return pending:result()
end

local function read_body(max)
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if body then return body end
  -- nginx buffered the body to a file (client_body_buffer_size smaller than the body)
  local path = ngx.req.get_body_file()
  if not path then return nil end
  local f, err = io.open(path, "rb")
  if not f then return nil, err end
  body = f:read(max + 1) -- one byte past the limit is enough to answer 413
  f:close()
  return body or ""
end

local function post_body(col)
  local raw, rerr = read_body(col.o.max_body)
  if raw == nil and rerr then error("cannot read the request body: " .. tostring(rerr)) end
  return raw
end

-- The request's Content-Encoding.  nginx before 1.23 gives only the first of several
-- Content-Encoding headers in $http_content_encoding (1.23 joins them): "identity" then
-- "gzip" would read as identity.  So a request that has one is looked at whole (a header
-- table only for those), and several are joined, which the collector refuses with 415.
local function content_coding(var)
  local coding = var.http_content_encoding
  if coding == nil then return nil end
  local all = ngx.req.get_headers(0)["content-encoding"]
  if type(all) == "table" then return concat(all, ", ") end
  return coding
end

-- The request's answer from the collector: method, body (POST), query (GET) and the three
-- headers it reads, taken one by one from ngx.var rather than from a header table.
-- `early` is the POST body when collect read it before counting the request.
local function collect_answer(col, method, early)
  local var = ngx.var
  local raw, query
  if method == "POST" then
    raw = early or post_body(col)
  elseif method == "GET" then
    query = var.args or ""
  end
  return col:_answer(method, query, raw, var.http_content_type, content_coding(var),
                     var.http_origin)
end

-- Requests this adapter counted in, by a number of their own, and when.  When a client
-- aborts its upload, or client_body_timeout fires, nginx ends the request without resuming
-- its coroutine: the pcall in collect never returns and its col:leave() never runs, and the
-- entry would hold a max_concurrent slot for the life of the worker.  So its entries older
-- than `abandoned_after` are taken as abandoned and their slots given back (the handler does
-- nothing else that waits: a live request that old is an upload slower than any beacon).
-- An entry leaves exactly once: with its request, or here.  (Not keyed by the coroutine: the
-- lua module reuses the coroutine of a request it ended for a later one, whose entry then
-- took the abandoned one's place, and that slot never came back.)  The entries are kept per
-- collector, weakly: an abandoned request's entry held its collector -- its shipper thread,
-- its memory, its spool_dir -- for the worker's life once the user dropped it.
local holders = setmetatable({}, { __mode = "k" }) -- col -> { [id] = since (ms) }
local holder_seq = 0

local function reclaim(col)
  local entries = holders[col]
  if not entries then return false end
  local now = now_ms() -- (monotonic: a step of the wall clock must not hold or free slots)
  local limit = col.o.abandoned_after
  local n = 0
  for id, since in pairs(entries) do
    if now - since >= limit then
      entries[id] = nil
      col:leave()
      n = n + 1
    end
  end
  if n > 0 then
    ngx.log(ngx.WARN, "esx collector: ", n, " request(s) in progress for over ",
            col.o.abandoned_after, " ms (ended by nginx: client abort or body timeout) ",
            "gave back their max_concurrent slot")
  end
  return n > 0
end

-- Each collector's last reclaim, so that abandoned slots are also given back while it is not
-- full: stats().in_progress and utilization.concurrency (what to scale on) would otherwise
-- count aborted uploads until traffic filled the collector.
local last_reclaim = setmetatable({}, { __mode = "k" })

local function reclaim_now_and_then(col, now)
  if (last_reclaim[col] or 0) + 1000 <= now then
    last_reclaim[col] = now
    if not col._reclaim then col._reclaim = reclaim end -- col:stats() calls it too
    reclaim(col)
  end
end

local function origin() return ngx.var.http_origin end

-- A failure of ours (the spool cannot be written: disk full, permissions) is answered 503
-- with a message of its own; what went wrong is logged here, at most once a second per
-- collector, with how many requests it refused meanwhile.
local failure_logged = setmetatable({}, { __mode = "k" })

local function log_failure(col, detail)
  local last = failure_logged[col]
  local now = now_ms()
  if last and now < last.at + 1000 then
    last.quiet = last.quiet + 1
    return
  end
  local quiet = last and last.quiet or 0
  failure_logged[col] = { at = now, quiet = 0 }
  ngx.log(ngx.ERR, "esx collector: answered 503: ", detail,
          quiet > 0 and (" (and " .. quiet .. " more in the last second)") or "")
end

local function send(status, headers, body)
  ngx.status = status
  local header = ngx.header
  for i = 1, #headers, 2 do header[headers[i]] = headers[i + 1] end
  if body ~= "" then ngx.print(body) else ngx.send_headers() end
  return ngx.exit(ngx.OK)
end

--- esx.nginx.collect(col) -- the collector as an nginx content handler:
--   location = /collect { content_by_lua_block { require("esx.nginx").collect(col) } }
-- Counts the request as in progress from the start of the handler to the response (so
-- slow uploads count against max_concurrent), reads the body even when nginx buffered it
-- to a file, and sends the collector's status, headers and body.
-- The answer to a POST whose Content-Length is over max_body, given without reading the body
-- (nginx would take it whole, to a file past client_body_buffer_size, and hold the request's
-- slot meanwhile, only for it to get 413); or nil.  (A lying Content-Length is nginx's.)
local function too_large(col, declared)
  local n = tonumber(declared)
  if not n or n <= col.o.max_body then return nil end
  local var = ngx.var
  return col:_answer("POST", nil, nil, var.http_content_type, content_coding(var), var.http_origin, n)
end

function _M.collect(col)
  if type(col) ~= "table" or type(col._answer) ~= "function" then
    -- (nil -- a collector made in a phase that did not run, say -- failed inside esx)
    error("bad argument #1 to 'collect' (esx collector expected, got " .. type(col) .. ")", 2)
  end
  local method = ngx.req.get_method()
  local early
  if method == "POST" then
    local declared = ngx.var.content_length
    if not declared then
      -- A body without Content-Length (chunked, HTTP/2) is measured while nginx reads it:
      -- past client_max_body_size nginx answers 413 itself and never resumes this handler, so
      -- its slot would stay taken until abandoned_after.  Read it before counting the request.
      early = post_body(col) or ""
    else
      local status, headers, body = too_large(col, declared)
      if status then return send(status, headers, body) end
    end
  end
  local now = now_ms()
  reclaim_now_and_then(col, now)
  local ok, status, headers, body = col:_enter(reclaim, origin)
  if not ok then return send(status, headers, body) end
  holder_seq = holder_seq + 1
  local id = holder_seq
  local entries = holders[col]
  if not entries then
    entries = {}
    holders[col] = entries
  end
  entries[id] = now
  local detail
  ok, status, headers, body, detail = pcall(collect_answer, col, method, early)
  if entries[id] then
    entries[id] = nil
    col:leave()
  end
  if not ok then
    ngx.log(ngx.ERR, "esx collector: ", status)
    return ngx.exit(500)
  end
  if detail then log_failure(col, detail) end
  return send(status, headers, body)
end

-- ---------------------------------------------------------------- metrics of every worker

-- Every worker is its own process with its own objects, and a scrape of /metrics reaches one
-- worker: its counters alone, a different worker's on the next scrape (counters that seem to
-- jump back and forth).  So each worker publishes its esx.metrics() into a lua_shared_dict,
-- and the scrape merges all of them, each sample labelled with its worker.

local METRICS_KEY = "esx.metrics:"
local published_dicts = {}  -- dict name -> interval (ms) of this worker's publisher
local warned = {}           -- dict name -> true once a full dict was logged

local function shared_dict(name, fname)
  if type(name) ~= "string" then
    error("bad argument #1 to '" .. fname .. "' (lua_shared_dict name expected)", 3)
  end
  local dict = ngx.shared[name]
  if not dict then
    error("bad argument #1 to '" .. fname .. "' (no lua_shared_dict '" .. name .. "' in nginx.conf)", 3)
  end
  return dict
end

-- Writes this worker's text into the dict and returns it (nil when esx.metrics failed:
-- logged); a dict without room is logged once.
local function publish(dict, name, interval)
  local ok, text = pcall(require("esx").metrics)
  if not ok then
    ngx.log(ngx.ERR, "esx.nginx.share_metrics: ", text)
    return nil
  end
  -- kept three intervals: a worker that died (and was not replaced) drops out
  local stored, err = dict:safe_set(METRICS_KEY .. ngx.worker.id(), text, 3 * interval / 1000)
  if not stored and not warned[name] then
    warned[name] = true
    ngx.log(ngx.ERR, "esx.nginx.share_metrics: cannot store this worker's metrics in lua_shared_dict '",
            name, "' (", err, "): make it bigger")
  end
  return text
end

--- esx.nginx.share_metrics(dict, interval_ms?) -- in init_worker_by_lua: this worker publishes
-- its esx.metrics() into the lua_shared_dict named dict every interval_ms (default 1000), for
-- esx.nginx.metrics(dict).  Raises on a missing dict or a bad interval.
function _M.share_metrics(name, interval)
  local dict = shared_dict(name, "share_metrics")
  if interval == nil then interval = 1000 end
  if type(interval) ~= "number" or interval ~= interval or interval < 10 or interval > 3600000 then
    error("bad argument #2 to 'share_metrics' (interval in ms, 10-3600000, expected)", 2)
  end
  if published_dicts[name] then return true end
  if ngx.get_phase() == "init" then
    -- the master: no worker id to publish under, and no timers (ngx.timer.every raised "no
    -- request", which did not say what was wrong)
    error("esx.nginx.share_metrics: call it in init_worker_by_lua (init_by_lua runs in the " ..
          "master, which has no worker to publish for)", 2)
  end
  -- OpenResty's privileged agent runs init_worker_by_lua too, but serves no request and has
  -- no worker id: its publisher raised at every interval (a nil id in the key).  Nothing to do.
  if ngx.worker.id() == nil then return true end
  local function tick(premature)
    if not premature then publish(dict, name, interval) end
  end
  local ok, err = ngx.timer.every(interval / 1000, tick)
  if not ok then error("esx.nginx.share_metrics: cannot start its timer: " .. tostring(err), 2) end
  published_dicts[name] = interval -- (only once its timer runs: a failed call can be repeated)
  ngx.timer.at(0, tick)
  return true
end

-- Adds worker="id" as the first label of every sample line.
local function label_samples(lines, text, id)
  local label = 'worker="' .. id .. '"'
  for line in text:gmatch("[^\n]+") do
    local kind, name = line:match("^# (%u+) (%S+)")
    if kind then
      lines[#lines + 1] = { head = true, name = name, text = line }
    elseif line:sub(1, 1) ~= "#" then
      local name, rest = line:match("^([^{%s]+)(.*)$")
      if name then
        if rest:sub(1, 1) == "{" then
          rest = (rest:sub(2, 2) == "}" and "{" .. label or "{" .. label .. ",") .. rest:sub(2)
        else
          rest = "{" .. label .. "}" .. rest
        end
        lines[#lines + 1] = { name = name, text = name .. rest }
      end
    end
  end
end

--- esx.nginx.metrics(dict) -> text: the esx.metrics() of every worker that publishes into the
-- lua_shared_dict named dict (esx.nginx.share_metrics), merged into one Prometheus exposition:
-- a family's HELP and TYPE once, then its samples of every worker, labelled worker="<id>".
-- This worker's part is taken fresh; the others' are at most one interval old.
function _M.metrics(name)
  local dict = shared_dict(name, "metrics")
  local interval = published_dicts[name]
  if not interval then
    error("bad argument #1 to 'metrics' (call esx.nginx.share_metrics('" .. name ..
          "') in init_worker_by_lua first)", 2)
  end
  local own = publish(dict, name, interval)
  local self_id = ngx.worker.id()
  local order, families = {}, {}
  for id = 0, ngx.worker.count() - 1 do
    local text = id == self_id and own or dict:get(METRICS_KEY .. id)
    if text then
      local lines = {}
      label_samples(lines, text, id)
      local family
      for _, l in ipairs(lines) do
        -- a sample belongs to the family of the HELP/TYPE before it (its name may add
        -- _total, _bucket...); one without is its own family
        if l.head or not family then
          family = families[l.name]
          if not family then
            family = { heads = {}, samples = {}, head_from = id }
            families[l.name] = family
            order[#order + 1] = l.name
          end
        end
        if l.head then
          if family.head_from == id then family.heads[#family.heads + 1] = l.text end
        else
          family.samples[#family.samples + 1] = l.text
        end
      end
    end
  end
  local out = {}
  for _, n in ipairs(order) do
    local f = families[n]
    for _, l in ipairs(f.heads) do out[#out + 1] = l end
    for _, l in ipairs(f.samples) do out[#out + 1] = l end
  end
  out[#out + 1] = ""
  return concat(out, "\n")
end

return _M
