-- bench/collector/hey_phase.lua -- one row of the spike table from hey's output (bench/collector/run).
--
--   lua5.4 bench/collector/hey_phase.lua HEY_OUTPUT TARGET_RATE PHASE [HEY_EXIT_STATUS]
--   lua5.4 bench/collector/hey_phase.lua --ok HEY_OUTPUT      -> the 2xx answers hey counted
--
-- A phase in which hey failed (non-zero exit status, or no summary) or saw no answer at all is
-- reported as such, never as a phase with a 0.00 % error rate.
local function parse(f)
  local h = io.open(f)
  local t = h and h:read("*a") or ""
  if h then h:close() end
  local st, total = {}, 0
  local sd = t:match("Status code distribution:(.-)\n\n") or t:match("Status code distribution:(.*)") or ""
  for code, n in sd:gmatch("%[(%d+)%]%s+(%d+) responses") do st[code] = tonumber(n); total = total + tonumber(n) end
  local errs = 0
  local ed = t:match("Error distribution:(.*)") or ""
  for n in ed:gmatch("%[(%d+)%]") do errs = errs + tonumber(n) end
  local ok = 0
  for code, n in pairs(st) do if code:match("^2") then ok = ok + n end end
  return t, st, total, errs, ok
end

if arg[1] == "--ok" then
  local _, _, _, _, ok = parse(arg[2])
  print(ok)
  return
end

local f, rate, ph, rc = arg[1], arg[2], arg[3], tonumber(arg[4] or "0") or 0
local t, st, total, errs, ok = parse(f)
local rps = t:match("Requests/sec:%s*([%d.]+)")
local p50 = t:match("50%% in ([%d.]+) secs") or "nan"
local p99 = t:match("99%% in ([%d.]+) secs") or "nan"
local other = total - ok - (st["503"] or 0) - (st["429"] or 0)
local bad = total - ok + errs
local rate_cell
if rc ~= 0 then
  rate_cell = string.format("**hey failed (exit %d)**", rc)
elseif not rps then
  rate_cell = "**hey printed no summary**"
elseif total + errs == 0 then
  rate_cell = "**no answers**"
else
  rate_cell = string.format("%.2f %%", bad * 100 / (total + errs))
end
print(string.format("| %s | %s | %.0f | %d | %d | %d | %d | %d | %d | %s | %.1f | %.1f |", ph, rate, tonumber(rps) or 0,
  total + errs, ok, st["503"] or 0, st["429"] or 0, other, errs, rate_cell,
  tonumber(p50) and p50 * 1000 or 0/0, tonumber(p99) and p99 * 1000 or 0/0))
