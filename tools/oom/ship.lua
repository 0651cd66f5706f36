-- tools/oom/ship.lua URL SCOPE COUNT [SPOOL_DIR] -- run under tools/failmalloc.c
-- (LD_PRELOAD): the collector's shipping.  For n = 1, 2, ... five events are accepted, then
-- the n-th allocation counted (and COUNT - 1 after it; 0: every one after it) fails while
-- col:flush() ships them (the shipper thread, the client's I/O thread: scope "esx").  At the
-- end every accepted event must be indexed exactly once and the rollup rows must count them;
-- and whenever col:flush() returns true, the rows written so far count every event.
-- Prints "FAIL ..." per violation, then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local esx = require "esx"

local url, scope, count, spool = arg[1], arg[2] or "esx", tonumber(arg[3]) or 1, arg[4]
local RUN = ("s%d%s"):format(os.time(), tostring({}):match("(%x+)$")) -- ASLR: one per process
local es = assert(esx.client{ hosts = { url }, request_timeout = 5000, compression = true,
                              compression_min_bytes = 100 })
local col = assert(esx.collector{ sink = es, flush_interval = 20, spool_dir = spool,
                                  retry_backoff_min = 10, retry_backoff_max = 50,
                                  rollup = { window = 1000, interval = 1000 },
                                  dead_letter = "/dev/null" })
local fails = 0
local function fail(...) fails = fails + 1; print("FAIL", ...) end

local accepted = {}
local n, injected_total, clean = 0, 0, 0
while clean < 3 and n < 2000 do
  n = n + 1
  local evs = {}
  for i = 0, 4 do
    evs[#evs + 1] = ('{"site_id":"%s","type":"view","event_id":"%s-%d-%d","user_id":"u%d"}')
      :format(RUN, RUN, n, i, i)
  end
  local s = col:handle{ method = "POST", body = "[" .. table.concat(evs, ",") .. "]",
                        headers = { ["content-type"] = "application/json" } }
  if s ~= 204 then fail(n, "intake without faults", s) end
  for i = 0, 4 do accepted[("%s-%d-%d"):format(RUN, n, i)] = true end
  fm.arm(n, count, scope)
  local ok, err = pcall(col.flush, col, 2000)
  local injected = fm.disarm()
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  if not ok then fail(n, "flush raised", tostring(err)) end
  if os.getenv("OOM_TRACE") then print(n, injected, tostring(err)) end
  if ok and err == true then
    -- flush() said done: the events and the rollup rows are acknowledged, now
    es:refresh("rollups-*")
    local t = esx.collector.totals(es, { site_id = RUN })
    local c = 0
    for _, row in ipairs(t or {}) do c = c + (row.count or 0) end
    if c ~= n * 5 then fail(n, "flush() returned true, the rollup rows count " .. c .. " of " .. n * 5) end
  end
end

local ok, err = col:flush(15000)
if not ok then fail("flush", tostring(err)) end
local st = col:stats()
ok, err = col:close(15000)
if not ok then fail("close", tostring(err)) end
if spool then -- what close left on disk: shipped by the next collector of the directory
  col = assert(esx.collector{ sink = es, rollup = false, spool_dir = spool, dead_letter = "/dev/null" })
  ok, err = col:flush(15000)
  if not ok then fail("flush after reopening the spool", tostring(err)) end
  col:close(5000)
end
assert(es:refresh("events-*"))
es:refresh("rollups-*")
local res = assert(es:search("events-*", { size = 10000, query = { term = { site_id = RUN } } }))
local got, total = {}, 0
for _, h in ipairs(res.hits.hits) do
  local id = h._source.event_id
  if got[id] then fail("indexed twice", id) end
  got[id] = true
  total = total + 1
  if not accepted[id] then fail("indexed but never accepted", id) end
end
for id in pairs(accepted) do
  if not got[id] then fail("accepted but not indexed", id) end
end
-- the rollup rows of this run count every accepted event
local t, terr = esx.collector.totals(es, { site_id = RUN })
if not t then fail("totals", tostring(terr))
else
  local c = 0
  for _, row in ipairs(t) do c = c + (row.count or 0) end
  if c ~= n * 5 then fail("rollup rows count", c, "events for", n * 5) end
end
print("stats", st.accepted, st.shipped, st.retried, st.dead_lettered, st.rollup_dropped, total)
es:close()
print("done", n, injected_total, fails)
