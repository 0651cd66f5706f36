-- tools/oom/rollups.lua URL SCOPE COUNT -- run under tools/failmalloc.c (LD_PRELOAD): for
-- n = 1, 2, ... the n-th allocation counted during one collector intake (and COUNT - 1 after
-- it; 0: every one after it) fails, while the event's rollup row and its HyperLogLog sketch
-- are made or grown: a POST of one event with a user_id, to a row of its own that is new
-- (the row, its sketch and the sketch's first list are made) or holds 8 users already (the
-- sketch's list grows).  Every accepted event must be counted in its row -- in `count` and,
-- its user_id, in `uniques` -- or, as a whole, in stats.rollup_dropped: a sketch that could
-- not take a user_id must not lower `uniques` unseen.  Prints "FAIL ..." per violation,
-- then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local esx = require "esx"
local cjson = require "cjson"

local url, scope, count = arg[1], arg[2] or "esx thread", tonumber(arg[3]) or 1
local es = assert(esx.client{ hosts = { url }, request_timeout = 5000 })
local DAY = 86400000
local col = assert(esx.collector{ sink = es, flush_interval = 50, dead_letter = "/dev/null",
                                  rollup = { window = DAY } })
local RUN = ("r%d%s"):format(os.time(), tostring({}):match("(%x+)$"))
local fails = 0
local function fail(...) fails = fails + 1; print("FAIL", ...) end
local JSON = { ["content-type"] = "application/json" }

local function post(evs)
  return col:handle{ method = "POST", body = cjson.encode(evs), headers = JSON }
end

local function event(block, user)
  return { site_id = "s", type = "view", block_id = block, user_id = user }
end

-- the row of block in the open window (nil when it has none)
local function row_of(block)
  for _, r in ipairs(col:rollups()) do
    if r.block_id == block then return r end
  end
end

local function day() return math.floor(os.time() / 86400) end

local n, injected_total = 0, 0
-- before: the users the block's row holds before the armed request (0: no row yet)
for _, before in ipairs{ 0, 8 } do
  local clean, at = 0, 0
  while clean < 3 and at < 400 do
    at, n = at + 1, n + 1
    local block = ("%s-%d-%d"):format(RUN, before, at)
    if before > 0 then
      local evs = {}
      for i = 1, before do evs[i] = event(block, "u" .. i) end
      local s = post(evs)
      if s ~= 204 then fail(n, "unarmed post", s) end
    end
    local d, dropped = day(), col:stats().rollup_dropped
    fm.arm(at, count, scope)
    local ok, status = pcall(post, { event(block, "u" .. (before + 1)) })
    local injected = fm.disarm()
    injected_total = injected_total + injected
    if injected == 0 then clean = clean + 1 end
    local row, now_dropped = row_of(block), col:stats().rollup_dropped
    local count_, uniques = row and row.count or 0, row and row.uniques or 0
    if os.getenv("OOM_TRACE") then print(n, at, injected, ok, status, count_, uniques, now_dropped - dropped) end
    if day() ~= d then
      -- the window ended meanwhile: the row is not in col:rollups()
    elseif not ok then
      if not tostring(status):find("not enough memory", 1, true) then fail(n, "raised", status) end
    elseif status == 204 then
      local counted = count_ == before + 1 and uniques == before + 1 and now_dropped == dropped
      local not_counted = count_ == before and uniques == before and now_dropped == dropped + 1
      if not (counted or not_counted) then
        fail(n, ("accepted: count %d, uniques %d, rollup_dropped +%d (the row had %d users)")
          :format(count_, uniques, now_dropped - dropped, before))
      end
    elseif status == 503 then
      if count_ ~= before or uniques ~= before then
        fail(n, ("refused, yet counted: count %d, uniques %d"):format(count_, uniques))
      end
    else
      fail(n, "unexpected status", status)
    end
  end
end

col:close(5000)
es:close()
print("done", n, injected_total, fails)
