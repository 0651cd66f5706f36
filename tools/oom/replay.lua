-- tools/oom/replay.lua URL SCOPE COUNT DIR -- run under tools/failmalloc.c (LD_PRELOAD): a
-- spool_dir holding events a closed collector could not ship (its sink down) is replayed by a
-- new collector while the n-th allocation (and COUNT - 1 after it; 0: every one after it)
-- fails; once memory is back every event must be indexed exactly once.  Prints "FAIL ...",
-- then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local esx = require "esx"

local url, scope, count, dir = arg[1], arg[2] or "esx", tonumber(arg[3]) or 1, arg[4]
local RUN = ("p%d%s"):format(os.time(), tostring({}):match("(%x+)$")) -- ASLR: one per process
local fails = 0
local function fail(...) fails = fails + 1; print("FAIL", ...) end
local es = assert(esx.client{ hosts = { url }, request_timeout = 5000 })
local down = assert(esx.client{ hosts = { "http://127.0.0.1:1" }, request_timeout = 200, max_retries = 0 })

local n, injected_total, clean = 0, 0, 0
local ids = {}
while clean < 3 and n < 500 do
  n = n + 1
  local spool = ("%s/s%d"):format(dir, n)
  local col = assert(esx.collector{ sink = down, spool_dir = spool, rollup = false, dead_letter = "/dev/null" })
  for i = 1, 5 do
    local id = ("%s-%d-%d"):format(RUN, n, i)
    ids[id] = true
    local s = col:handle{ method = "POST", body = ('{"site_id":"%s","type":"v","event_id":"%s"}'):format(RUN, id) }
    if s ~= 204 then fail(n, "intake", s) end
  end
  col:close(0)
  fm.arm(n, count, scope)
  local ok, c2 = pcall(esx.collector, { sink = es, spool_dir = spool, rollup = false, dead_letter = "/dev/null",
                                        retry_backoff_min = 10, retry_backoff_max = 50 })
  if ok and c2 then pcall(c2.flush, c2, 300) end
  local injected = fm.disarm()
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  if ok and c2 then
    local fok, ferr = c2:flush(10000)
    if not fok then fail(n, "flush after the faults", tostring(ferr)) end
    c2:close(5000)
  end
  -- what is still on disk (the constructor failed, or a scan for orphans ran out of memory:
  -- the next scan is 2 s later) is replayed by the next collector of the directory
  local c3 = assert(esx.collector{ sink = es, spool_dir = spool, rollup = false, dead_letter = "/dev/null" })
  local fok, ferr = c3:flush(10000)
  if not fok then fail(n, "flush of the next collector", tostring(ferr)) end
  c3:close(5000)
end
assert(es:refresh("events-*"))
local res = assert(es:search("events-*", { size = 10000, query = { term = { site_id = RUN } } }))
local got = {}
for _, h in ipairs(res.hits.hits) do
  local id = h._source.event_id
  if got[id] then fail("indexed twice", id) end
  got[id] = true
end
for id in pairs(ids) do if not got[id] then fail("accepted but not indexed", id) end end
es:close(); down:close()
print("done", n, injected_total, fails)
