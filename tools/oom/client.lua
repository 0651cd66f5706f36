-- tools/oom/client.lua URL SCOPE COUNT -- run under tools/failmalloc.c (LD_PRELOAD): for
-- n = 1, 2, ... the n-th allocation counted during one round of client calls (index, get,
-- search, bulk, a gzip-compressed bulk, bodies of 70 KB through index, bulk and a bulk indexer; and COUNT - 1 after it, 0: every one after it) fails.
-- Each call must succeed with the right answer, return nil, err of kind "internal" (esx's
-- own failure), or raise Lua's "not enough memory"; a raise that blames the caller, another
-- kind, a node marked dead, a crash or a hang is a failure (tools/oom/contract.lua).  After
-- each round the same client must work again.
-- Prints "FAIL ..." per violation, then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local esx = require "esx"
local contract = require("tools.oom.contract").new()

local url, scope, count = arg[1], arg[2] or "esx", tonumber(arg[3]) or 1
local es = assert(esx.client{ hosts = { url }, request_timeout = 5000, compression = true,
                              compression_min_bytes = 200 })
local fail = contract.fail
local RUN = ("c%d%s"):format(os.time(), tostring({}):match("(%x+)$")) -- ASLR: one per process

local LARGE = ("y"):rep(70000)
local big = {}
for i = 1, 40 do big[i] = { "index", { _index = RUN, _id = "b" .. i }, { n = i, text = ("x"):rep(50) } } end

local function round(n)
  local out = {}
  out[1] = { pcall(es.index, es, RUN, { n = n, name = "doc" .. n }, "d" .. n) }
  out[2] = { pcall(es.get, es, RUN, "d1") }
  out[3] = { pcall(es.search, es, RUN, { query = { match_all = {} }, size = 1 }) }
  out[4] = { pcall(es.bulk, es, { { "index", { _index = RUN, _id = "k" .. n }, { n = n } } }) }
  out[5] = { pcall(es.bulk, es, big) }
  out[6] = { pcall(es.request, es, "GET", "/" .. RUN .. "/_doc/d1") }
  -- bodies over the 64 KiB json_encode keeps between calls: encoded into new memory
  out[7] = { pcall(es.index, es, RUN, { text = LARGE }, "large") }
  out[8] = { pcall(es.bulk, es, { { "index", { _index = RUN, _id = "large2" }, { text = LARGE } } }) }
  local bi = es:bulk_indexer{ flush_bytes = 1048576 }
  local r = { pcall(bi.add, bi, "index", { _index = RUN, _id = "large3" }, { text = LARGE }) }
  if r[1] and r[2] then r = { pcall(bi.flush, bi) } end
  out[9] = r
  return out, bi -- closed once memory is back: close() waits out the retries of what failed
end

local n, injected_total, clean = 0, 0, 0
-- warm up (index created, d1 there)
local warm, wbi = round(1)
wbi:close()
for _, r in ipairs(warm) do if not (r[1] and r[2]) then fail("warm-up", tostring(r[2]), tostring(r[3])) end end
while clean < 3 and n < 3000 do
  n = n + 1
  fm.arm(n, count, scope)
  local out, bi = round(n)
  local injected = fm.disarm()
  local sum = bi:close()
  if sum.added ~= sum.indexed + sum.failed then
    fail(n, "bulk indexer: added ~= indexed + failed", sum.added, sum.indexed, sum.failed,
         tostring(out[9][2]), tostring(out[9][3]))
  end
  if os.getenv("OOM_TRACE") then
    local t = {}
    for i, r in ipairs(out) do t[i] = r[2] == nil and tostring(r[3]):sub(1, 60) or (r[1] and "ok" or tostring(r[2]):sub(1, 60)) end
    print(n, injected, os.clock(), table.concat(t, " | "))
  end
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  for i, r in ipairs(out) do
    local res = contract.answer(n, i, r, injected)
    if res == nil then -- no answer to check further
    elseif i == 2 and (res._source == nil or res._source.name ~= "doc1") then
      fail(n, i, "wrong document")
    elseif (i == 4 or i == 5 or i == 8) and (res.errors ~= false or #res.items ~= (i == 5 and 40 or 1)) then
      fail(n, i, "wrong bulk result", tostring(res.errors), #(res.items or {}))
    elseif i == 6 and (res.status ~= 200 or not res.body:find('"doc1"', 1, true)) then
      fail(n, i, "wrong response", res.status)
    end
  end
  contract.nodes_alive(n, es)
  -- heals at once
  local res, err = es:get(RUN, "d1")
  if not res then fail(n, "after the round", tostring(err)) end
end
local st = es:stats()
print("stats rebuilds", st.rebuilds)
es:close()
print("done", n, injected_total, contract.fails)
