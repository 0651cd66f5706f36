--- examples/demo/traffic.lua -- the demo's synthetic traffic, sent with esx's own client pool
-- (client:send keeps up to `concurrency` requests in flight from one Lua process).
--
-- Page views of many users over several sites, each a beacon with a `view` event per block
-- (sticky A/B variant per user and block) and a `click` with a block- and variant-dependent
-- probability; plus article list reads (GET /articles) and mark-read calls (POST
-- /articles/read).  The rate triples in the middle fifth of the run (the spike).  Bounded:
-- at most rate * duration * 1.4 requests, and it stops at `duration` seconds.

local socket = require "socket"
local esx = require "esx"
local cjson = require "cjson.safe"

local _M = {}

_M.SITES = { "news", "shop", "travel", "games" }
_M.BLOCKS = { hero = 0.06, sidebar = 0.03, footer = 0.01 } -- click-through rate of variant A
_M.BLOCK_ORDER = { "hero", "sidebar", "footer" }
local VARIANT_LIFT = { A = 1.0, B = 1.5 }

local function variant(user, block)
  return (user * 31 + #block * 17) % 2 == 0 and "A" or "B"
end

-- A page view of `site` by `user`: the JSON array of its events.
local function page_view(site, user, run)
  local events, now = {}, math.floor(socket.gettime() * 1000)
  for _, block in ipairs(_M.BLOCK_ORDER) do
    local v = variant(user, block)
    local base = { site_id = site, block_id = block, variant = v, user_id = tostring(user),
                   ts = now, run = run }
    base.type = "view"
    events[#events + 1] = cjson.encode(base)
    if math.random() < _M.BLOCKS[block] * VARIANT_LIFT[v] then
      base.type = "click"
      events[#events + 1] = cjson.encode(base)
    end
  end
  return "[" .. table.concat(events, ",") .. "]", #events
end

--- run{url=, duration=s, rate=req/s, concurrency=, users=, articles=, run=, on_progress=fn(p)}
-- -> summary {requests, statuses = {[code] = n}, errors = {[kind] = n}, accepted = events
--    accepted (204 / 200 answers), accepted_by_site, articles = page reads, reads = mark-reads,
--    seconds, peak_rps}
function _M.run(o)
  local client = assert(esx.client{ hosts = { o.url }, max_per_route = o.concurrency,
    max_total = o.concurrency, max_retries = 0, retry_on_status = {}, pool_timeout = 5000,
    socket_timeout = 10000, name = "demo-traffic" })
  -- Connection: close -- each request comes from another browser, so the kernel spreads the
  -- connections over both workers (SO_REUSEPORT) instead of one keep-alive connection
  -- carrying everything to one of them.
  local statuses, close = { 200, 204, 400, 404, 413, 415, 429, 502, 503 }, { Connection = "close" }
  local OK = { ok_status = statuses, headers = close }
  local BEACON = { ok_status = statuses, headers = close, content_type = "application/json" }
  local s = { requests = 0, statuses = {}, errors = {}, accepted = 0, accepted_by_site = {},
              articles = 0, reads = 0, peak_rps = 0 }
  -- the requests in flight, in sending order: {pending, kind, site, events, done}; answers
  -- are settled as they come, so a slow one (a mark-read waits for Elasticsearch's next
  -- refresh, up to refresh_interval) does not hold up the ones sent after it
  local ring, head, tail, in_flight = {}, 1, 0, 0
  local pages = math.max(1, math.ceil(o.articles / 20))
  local start = socket.gettime()
  local spike_from, spike_to = 0.4 * o.duration, 0.6 * o.duration

  local function due(t) -- requests that should have been sent after t seconds
    local base = math.min(t, spike_from) + math.max(0, t - spike_to)
    local spike = math.max(0, math.min(t, spike_to) - spike_from)
    return math.floor(o.rate * (base + 3 * spike))
  end

  local function send_one()
    local r, user = math.random(), math.random(1, o.users)
    local item
    if r < 0.75 then
      local site = _M.SITES[math.random(#_M.SITES)]
      local body, n = page_view(site, user, o.run)
      item = { kind = "beacon", site = site, events = n,
               p = client:send("POST", "/collect", body, BEACON) }
    elseif r < 0.95 then
      item = { kind = "article", p = client:send("GET", ("/articles?user=%d&page=%d"):format(
        user, math.random(pages)), nil, OK) }
    else
      item = { kind = "read", p = client:send("POST", ("/articles/read?article=%d&user=%d"):format(
        math.random(o.articles), user), nil, OK) }
    end
    s.requests = s.requests + 1
    if not item.p then -- not even queued (the pool is closed or broken): count it, go on
      s.errors.send = (s.errors.send or 0) + 1
      return
    end
    tail = tail + 1
    ring[tail] = item
    in_flight = in_flight + 1
  end

  local function settle(item)
    local res, err = item.p:result()
    if not res then
      s.errors[err.kind] = (s.errors[err.kind] or 0) + 1
      return
    end
    s.statuses[res.status] = (s.statuses[res.status] or 0) + 1
    if item.kind == "beacon" then
      local n = 0
      if res.status == 204 then n = item.events
      elseif res.status == 200 then n = (cjson.decode(res.body) or {}).accepted or 0 end
      s.accepted = s.accepted + n
      s.accepted_by_site[item.site] = (s.accepted_by_site[item.site] or 0) + n
    elseif res.status < 300 then
      if item.kind == "article" then s.articles = s.articles + 1 else s.reads = s.reads + 1 end
    end
  end

  local last_report, last_requests = start, 0
  while true do
    local t = socket.gettime() - start
    local sending = t < o.duration
    while sending and in_flight < o.concurrency and s.requests < due(t) do send_one() end
    if head <= tail then
      local settled = false
      for i = head, tail do
        local item = ring[i]
        if not item.done and (item.p:ready() or (i == head and item.p:wait(2))) then
          item.done, settled = true, true
          in_flight = in_flight - 1
          settle(item)
        end
      end
      while head <= tail and ring[head].done do ring[head] = nil; head = head + 1 end
      if not settled then socket.sleep(0.002) end
    elseif not sending then
      break
    else
      socket.sleep(0.002)
    end
    local now = socket.gettime()
    if now - last_report >= 0.5 then
      local rps = (s.requests - last_requests) / (now - last_report)
      if rps > s.peak_rps then s.peak_rps = rps end
      last_report, last_requests = now, s.requests
      if o.on_progress then
        o.on_progress{ t = now - start, rps = rps, spike = t >= spike_from and t < spike_to,
                       in_flight = in_flight, s = s }
      end
    end
  end
  s.seconds = socket.gettime() - start
  client:close()
  return s
end

return _M
