-- bench/client/search.lua -- esx search driver (Lua 5.4 or LuaJIT).
--
--   lua5.4 bench/client/search.lua URL CONCURRENCY SECONDS [WARMUP_SECONDS]
--
-- Prints one line: "searches=N seconds=S rate=R errors=E cpu=C [server_cpu=V]" (C: CPU seconds
-- of the whole process -- Lua thread and esx's I/O thread -- during the measured S seconds; V:
-- CPU seconds of the server process BENCH_SERVER_PID, e.g. the nginx worker, during the same
-- S seconds, so that the warm-up's searches are not charged to the measured ones).
--
-- Every search sends the same query table (encoded to JSON per call, as the Node client
-- stringifies its object per call) and decodes the whole response into a Lua table (as the
-- Node client parses it), so both peers do the same work per search.  The decoder is the one
-- c:search uses (pending:json()).
--   concurrency 1:  c:search(index, query) in a loop -- the synchronous API.
--   concurrency N:  one process, N outstanding c:send pendings in a ring: the loop waits for
--                   the oldest (p:wait), decodes it (p:json) and sends the next search in its
--                   place, so N requests stay in flight.

local esx = require "esx"

local url, conc, seconds, warmup = arg[1], tonumber(arg[2]), tonumber(arg[3]), tonumber(arg[4] or "1")
assert(url and conc and seconds, "usage: search.lua URL CONCURRENCY SECONDS [WARMUP]")

local clock = require("socket").gettime -- wall time (os.clock is CPU time)

-- CPU seconds (user + system, all threads) the server process BENCH_SERVER_PID has used so far,
-- from /proc/PID/stat (BENCH_SERVER_HZ: clock ticks per second); nil without BENCH_SERVER_PID.
local server_pid, server_hz = os.getenv("BENCH_SERVER_PID"), tonumber(os.getenv("BENCH_SERVER_HZ") or "100")
local function server_cpu()
  if not server_pid or server_pid == "" then return nil end
  local f = io.open("/proc/" .. server_pid .. "/stat")
  local stat = f and f:read("*a")
  if f then f:close() end
  -- after the command name (in parentheses, may hold spaces): state is field 3, so utime and
  -- stime (fields 14 and 15) are the 12th and 13th words
  local rest = stat and stat:match(".*%) (.*)$")
  local w = {}
  for x in (rest or ""):gmatch("%S+") do w[#w + 1] = x end
  local u, s = tonumber(w[12]), tonumber(w[13])
  return u and s and (u + s) / server_hz or nil
end

local INDEX = "goods"
local PATH = "/" .. INDEX .. "/_search"
local QUERY = {
  query = { bool = {
    must = { { multi_match = { query = "オーバーサイズ パーカー", fields = { "name^2", "brand.name" } } } },
    filter = { { term = { gender = "men" } }, { range = { price = { lte = 20000 } } } },
  } },
  _source = { "goods_id", "name", "brand.name", "price", "sale_price", "image" },
  size = 10,
}

local c = esx.client { hosts = { url }, max_per_route = 16, max_total = 16, compression = false }

-- ESX_BENCH_RAW=1: transport only -- the response body is checked, not decoded (not the fair
-- comparison with Node, which always parses; it shows what the decoding costs).
local raw = os.getenv("ESX_BENCH_RAW") == "1"

-- res = {status, headers, body} -> true when it is the canned answer (size checked only)
local function good(res)
  return res ~= nil and res.status == 200 and #res.body > 1000
end

-- a finished pending -> true when it is the canned 10-hit answer, decoded as c:search does
local function good_pending(p)
  if raw then return good(p:result()) end
  local doc = p:json()
  return doc ~= nil and #doc.hits.hits == 10
end

local function run_sync(deadline)
  local n, errors = 0, 0
  repeat
    for _ = 1, 20 do
      local ok
      if raw then
        ok = good(c:request("POST", PATH, QUERY))
      else
        local doc = c:search(INDEX, QUERY)
        ok = doc and #doc.hits.hits == 10
      end
      if ok then n = n + 1 else errors = errors + 1 end
    end
  until clock() >= deadline
  return n, errors
end

local function run_async(deadline)
  local n, errors = 0, 0
  local ring = {}
  local function issue(i)
    local p, err = c:send("POST", PATH, QUERY)
    if not p then error("send failed: " .. tostring(err)) end
    ring[i] = p
  end
  for i = 1, conc do issue(i) end
  -- a ring in send order: wait for the oldest, decode it, send the next search in its place
  local i = 1
  repeat
    for _ = 1, 32 do
      local p = ring[i]
      p:wait(1000)
      if good_pending(p) then n = n + 1 else errors = errors + 1 end
      issue(i)
      i = i % conc + 1
    end
  until clock() >= deadline
  for k = 1, conc do ring[k]:wait(1000) end -- let the last ones finish before closing
  return n, errors
end

local run = conc == 1 and run_sync or run_async
if warmup > 0 then run(clock() + warmup) end
local srv0 = server_cpu()
local t0, cpu0 = clock(), os.clock() -- os.clock: CPU time of the process, all its threads
local n, errors = run(t0 + seconds)
local dt, cpu = clock() - t0, os.clock() - cpu0
local srv1 = server_cpu()
io.write(string.format("searches=%d seconds=%.3f rate=%.1f errors=%d cpu=%.3f%s\n", n, dt, n / dt, errors, cpu,
  srv0 and srv1 and string.format(" server_cpu=%.3f", srv1 - srv0) or ""))
c:close()
