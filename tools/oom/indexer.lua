-- tools/oom/indexer.lua URL SCOPE COUNT -- run under tools/failmalloc.c (LD_PRELOAD): for
-- n = 1, 2, ... the n-th allocation counted (scope "thread": Lua 5.4's own allocations too,
-- which raise "not enough memory") fails while a bulk indexer buffers and sends a batch; once
-- memory is back, close() must account for every operation add() took: added == indexed +
-- failed, and every document it counts as indexed is in the index.
-- Prints "FAIL ...", then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local esx = require "esx"

local url, scope, count = arg[1], arg[2] or "thread", tonumber(arg[3]) or 1
local RUN = ("i%d%s"):format(os.time(), tostring({}):match("(%x+)$")) -- ASLR: one per process
local fails = 0
local function fail(...) fails = fails + 1; print("FAIL", ...) end
local es = assert(esx.client{ hosts = { url }, request_timeout = 5000 })
local doc = { text = ("z"):rep(200) }
local indexed = 0

local n, injected_total, clean = 0, 0, 0
while clean < 3 and n < 3000 do
  n = n + 1
  -- (add only buffers; flush sends one batch; close, after disarm, settles it: a raise in
  -- settling a batch is another matter, see the report of the sweeps)
  local bi = es:bulk_indexer{ flush_count = 100 }
  local metas = {}
  for i = 1, 4 do metas[i] = { _index = RUN, _id = n .. "-" .. i } end
  local add, flush = bi.add, bi.flush
  local function work()
    for i = 1, 4 do add(bi, "index", metas[i], doc) end
    flush(bi)
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
  indexed = indexed + sum.indexed
end
assert(es:refresh(RUN))
local res = assert(es:request("GET", "/" .. RUN .. "/_count"))
local c = tonumber(res.body:match('"count"%s*:%s*(%d+)'))
if c ~= indexed then fail("the index holds " .. tostring(c) .. " documents, close() counted " .. indexed .. " indexed") end
es:close()
print("done", n, injected_total, fails)
