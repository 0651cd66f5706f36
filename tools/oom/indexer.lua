-- tools/oom/indexer.lua URL SCOPE COUNT [settle] -- run under tools/failmalloc.c (LD_PRELOAD):
-- for n = 1, 2, ... the n-th allocation counted (scope "thread": Lua 5.4's own allocations
-- too, which raise "not enough memory") fails while a bulk indexer buffers and sends a batch
-- (with "settle": while close() reads the answer of a batch, two of whose four items the
-- server refused); once memory is back, close() must account for every operation add() took,
-- once: added == indexed + failed, every dropped one listed once, and every document it
-- counts as indexed is in the index.
-- Prints "FAIL ...", then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local esx = require "esx"

local url, scope, count = arg[1], arg[2] or "thread", tonumber(arg[3]) or 1
local settle = arg[4] == "settle"
local RUN = ("i%d%s"):format(os.time(), tostring({}):match("(%x+)$")) -- ASLR: one per process
local fails = 0
local function fail(...) fails = fails + 1; print("FAIL", ...) end
local es = assert(esx.client{ hosts = { url }, request_timeout = 5000 })
local doc = { text = ("z"):rep(200) }
local indexed = 0

local n, injected_total, clean = 0, 0, 0
while clean < 3 and n < 3000 do
  n = n + 1
  -- (add only buffers; flush sends one batch; close, after disarm, settles it -- with
  -- "settle", close settles it under the failures, and again after disarm if it raised)
  local bi = es:bulk_indexer{ flush_count = 100, backoff_min = 1, backoff_max = 1,
                              on_drop = function() end }
  local metas = {}
  for i = 1, 4 do metas[i] = { _index = RUN, _id = n .. "-" .. i } end
  local add, flush, close = bi.add, bi.flush, bi.close
  local function work()
    for i = 1, 4 do add(bi, "index", metas[i], doc) end
    flush(bi)
  end
  if settle then
    -- the batch is answered before the allocations fail: close() reads it under them
    assert(es:request("POST", "/_esx/faults", { path = "/_bulk", item_status = 400, item_count = 2,
                                                count = 1 }))
    work()
    bi.inflight[1].pending:wait()
    work = function() close(bi) end
  end
  fm.arm(n, count, scope)
  pcall(work) -- (nothing between arm and disarm may raise outside a pcall)
  local injected = fm.disarm()
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  local sum = bi:close()
  if sum.added ~= sum.indexed + sum.failed then
    fail(n, "added " .. sum.added .. " ~= indexed " .. sum.indexed .. " + failed " .. sum.failed)
  end
  if #sum.dropped ~= sum.failed then fail(n, #sum.dropped .. " listed dropped, " .. sum.failed .. " failed") end
  indexed = indexed + sum.indexed
end
assert(es:refresh(RUN))
local res = assert(es:request("GET", "/" .. RUN .. "/_count"))
local c = tonumber(res.body:match('"count"%s*:%s*(%d+)'))
if c ~= indexed then fail("the index holds " .. tostring(c) .. " documents, close() counted " .. indexed .. " indexed") end
es:close()
print("done", n, injected_total, fails)
