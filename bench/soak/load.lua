-- bench/soak/load.lua -- wrk script of the soak, one kind of request per wrk process:
--   SOAK_KIND=collect   POST /collect of two events with unique event_ids (RUN-thread-n-1/2)
--   SOAK_KIND=articles  GET /articles?user=U&page=P (the esx.cache)
-- Each connection sends one request, waits for the answer, then SOAK_DELAY_MS (default 20).
-- done() prints "STATUS <kind> <status> <count>" lines, summed over the threads.
local run = os.getenv("SOAK_RUN") or "soak"
local kind = os.getenv("SOAK_KIND") or "collect"
local delay_ms = tonumber(os.getenv("SOAK_DELAY_MS") or "20")
local threads = {}
local n = 0
stats = {}   -- global, so that done() can read every thread's with thread:get

function setup(thread)
  thread:set("tid", #threads + 1)
  threads[#threads + 1] = thread
end

function delay() return delay_ms end

function request()
  n = n + 1
  if kind == "articles" then
    return wrk.format("GET", ("/articles?user=%d&page=%d"):format((n * 7919 + tid) % 5000, 1 + n % 3))
  end
  local id = ("%s-%d-%d"):format(run, tid, n)
  local body = ('[{"site_id":"site-%d","type":"impression","block_id":"b-%d","variant":"A","user_id":"u-%d","event_id":"%s-1","ts":%d},'
    .. '{"site_id":"site-%d","type":"click","block_id":"b-%d","variant":"A","user_id":"u-%d","event_id":"%s-2"}]')
    :format(n % 7, n % 11, n % 20011, id, n, n % 7, n % 11, n % 20011, id)
  return wrk.format("POST", "/collect", { ["Content-Type"] = "text/plain" }, body)
end

function response(status)
  stats[status] = (stats[status] or 0) + 1
end

function done()
  local total = {}
  for _, t in ipairs(threads) do
    for k, v in pairs(t:get("stats") or {}) do total[k] = (total[k] or 0) + v end
  end
  for k, v in pairs(total) do io.write(("STATUS %s %s %d\n"):format(kind, k, v)) end
end
