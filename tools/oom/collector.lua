-- tools/oom/collector.lua URL SCOPE COUNT [SPOOL_DIR] -- run under tools/failmalloc.c
-- (LD_PRELOAD): for n = 1, 2, ... the n-th allocation counted during one collector intake
-- (and COUNT - 1 after it; 0: every one after it) fails (scope: see failmalloc.c; a POST of five
-- events, the second and the fourth invalid) fails, and every answer is checked against the contract: a
-- status of the list, a 2xx whose "accepted" plus the indexes of "rejected" (real, increasing
-- body positions) make the five events, each accepted event indexed exactly once, none that
-- was refused.  With SPOOL_DIR, accepted events left on disk must be shipped by the next
-- collector of that directory.  Prints "FAIL ..." per violation, then "done <sweeps> <injected>".
local fm = require "failmalloc"
local esx = require "esx"
local cjson = require "cjson"

local url, scope, count, spool = arg[1], arg[2] or "esx thread", tonumber(arg[3]) or 1, arg[4]
local es = assert(esx.client{ hosts = { url }, request_timeout = 5000 })
local col = assert(esx.collector{ sink = es, rollup = false, flush_interval = 50,
                                  spool_dir = spool, dead_letter = "/dev/null" })
local RUN = ("r%d%s"):format(os.time(), tostring({}):match("(%x+)$")) -- ASLR: one per process
local function id_of(n, i) return ("%s-e%d-%d"):format(RUN, n, i) end
local fails = 0
local function fail(...) fails = fails + 1; print("FAIL", ...) end

local accepted_ids, refused_ids = {}, {}
-- two passes: a new collector's intake (its scratch buffers grow), then a warm one's (only
-- the queued events allocate)
local n, injected_total, seq = 0, 0, 0
for _ = 1, 2 do
local clean, at = 0, 0
while clean < 3 and at < 400 do
  at, seq = at + 1, seq + 1
  n = seq
  local evs = {}
  for i = 0, 4 do
    local e = { site_id = "s", type = "view", event_id = id_of(n, i) }
    if i == 1 or i == 3 then e.type = nil end -- invalid: missing type
    evs[#evs + 1] = e
  end
  local body = cjson.encode(evs)
  fm.arm(at, count, scope)
  local ok, status, _, rbody = pcall(col.handle, col, { method = "POST", body = body,
                                              headers = { ["content-type"] = "application/json" } })
  local injected = fm.disarm(); if os.getenv("OOM_TRACE") then print(n, injected, ok, status, rbody) end
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  if not ok then
    -- Lua's own allocations may raise "not enough memory"; nothing else may
    if not tostring(status):find("not enough memory", 1, true) then fail(n, "raised", status) end
    for i = 0, 4 do refused_ids[id_of(n, i)] = "unknown" end
  elseif status == 200 then
    local r = cjson.decode(rbody)
    if r.rejected == nil then -- the list could not be encoded: "accepted" and an error only
      if type(r.accepted) ~= "number" or type(r.error) ~= "string" then fail(n, "200 body", rbody) end
      r.rejected = {}
      for i = 0, 4 do refused_ids[id_of(n, i)] = "unknown" end
      goto continue
    end
    if r.accepted < 1 then fail(n, "a 200 that accepted nothing (not retried by the tag)", rbody) end
    local seen, last, total = {}, -1, r.accepted
    for _, rj in ipairs(r.rejected) do
      if type(rj.index) ~= "number" or rj.index < 0 or rj.index > 4 or rj.index <= last then
        fail(n, "rejected index not a real increasing position", rbody)
      end
      last = rj.index
      seen[rj.index] = true
      total = total + 1
    end
    if total ~= 5 then fail(n, "accepted + rejected ~= 5", rbody) end
    if not (seen[1] and seen[3]) then fail(n, "an invalid event is not among rejected", rbody) end
    for i = 0, 4 do
      local id = id_of(n, i)
      if seen[i] then refused_ids[id] = true else accepted_ids[id] = true end
    end
  elseif status == 503 then
    if type(rbody) ~= "string" or not pcall(cjson.decode, rbody) then fail(n, "503 without a JSON body", rbody) end
    for i = 0, 4 do refused_ids[id_of(n, i)] = true end
  else
    fail(n, "unexpected status", status, rbody)
  end
  ::continue::
end
end

-- a request without faults still works, and everything accepted ships
local s = col:handle{ method = "POST", body = '{"site_id":"s","type":"view","event_id":"' .. RUN .. '-last"}',
                      headers = { ["content-type"] = "application/json" } }
if s ~= 204 then fail("after the sweep", "status", s) end
accepted_ids[RUN .. "-last"] = true
local ok, err = col:flush(10000)
if not ok then fail("flush", tostring(err)) end
if spool then
  -- events left in a write-ahead segment (when even the spool's overflow write ran out of
  -- memory) wait for the next collector of the spool_dir: replayed, not lost
  col:close(5000)
  col = assert(esx.collector{ sink = es, rollup = false, flush_interval = 50,
                              spool_dir = spool, dead_letter = "/dev/null" })
  ok, err = col:flush(10000)
  if not ok then fail("flush after reopening the spool", tostring(err)) end
end
assert(es:refresh("events-*"))
local res = assert(es:search("events-*", { size = 10000, query = { match_all = {} } }))
local got = {}
for _, h in ipairs(res.hits.hits) do
  local id = h._source.event_id
  if id:sub(1, #RUN + 1) ~= RUN .. "-" then goto next end
  if got[id] then fail("indexed twice", id) end
  got[id] = true
  if not accepted_ids[id] and refused_ids[id] ~= "unknown" then fail("indexed but refused", id) end
  ::next::
end
for id in pairs(accepted_ids) do
  if not got[id] then fail("accepted but not indexed", id) end
end
local st = col:stats()
print("stats", st.accepted, st.shipped, st.rejected.nomem, st.rejected.invalid)
col:close(5000)
es:close()
print("done", n, injected_total, fails)
