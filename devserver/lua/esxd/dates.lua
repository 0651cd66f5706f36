-- esxd.dates: date parsing/formatting in UTC without os.time (no local time zone effects).
-- Accepts what ES's default date format accepts: strict_date_optional_time ("2024-05-01",
-- "2024-05-01T10:20:30", "...30.123Z", "...+02:00") or epoch_millis (number or digit string).
local floor = math.floor
local _M = {}

-- days since 1970-01-01 for a civil date (Howard Hinnant's algorithm)
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + floor(yoe / 4) - floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end
_M.days_from_civil = days_from_civil

local function civil_from_days(z)
  z = z + 719468
  local era = floor(z / 146097)
  local doe = z - era * 146097
  local yoe = floor((doe - floor(doe / 1460) + floor(doe / 36524) - floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + floor(yoe / 4) - floor(yoe / 100))
  local mp = floor((5 * doy + 2) / 153)
  local d = doy - floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return y, m, d
end
_M.civil_from_days = civil_from_days

-- Does this string look like a date for dynamic date detection?
function _M.looks_like_date(s)
  return type(s) == "string" and (s:match("^%d%d%d%d%-%d%d%-%d%d$") or s:match("^%d%d%d%d%-%d%d%-%d%d[T ]%d%d")) ~= nil
end

-- Parse to epoch milliseconds; returns number or nil.
function _M.parse(v)
  if type(v) == "number" then return v end
  if type(v) ~= "string" then return nil end
  if v:match("^%-?%d+$") then return tonumber(v) end
  local y, mo, d, rest = v:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)(.*)$")
  if not y then
    y, mo, rest = v:match("^(%d%d%d%d)%-(%d%d)(.*)$")
    d = "01"
    if not y then y, rest = v:match("^(%d%d%d%d)()$"); if y then mo, d, rest = "01", "01", "" end end
    if not y then return nil end
  end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  if mo < 1 or mo > 12 or d < 1 or d > 31 then return nil end
  local h, mi, s, ms = 0, 0, 0, 0
  local offset = 0
  if rest ~= "" then
    local hh, tail = rest:match("^[T ](%d%d)(.*)$")
    if not hh then return nil end
    h = tonumber(hh)
    local mm, tail2 = tail:match("^:(%d%d)(.*)$")
    if mm then
      mi = tonumber(mm); tail = tail2
      local ss, tail3 = tail:match("^:(%d%d)(.*)$")
      if ss then
        s = tonumber(ss); tail = tail3
        local frac, tail4 = tail:match("^[%.,](%d+)(.*)$")
        if frac then
          ms = floor(tonumber(("0." .. frac)) * 1000 + 0.5); tail = tail4
        end
      end
    end
    if tail == "Z" or tail == "" then offset = 0
    else
      local sign, oh, om = tail:match("^([%+%-])(%d%d):?(%d%d)$")
      if not sign then
        sign, oh = tail:match("^([%+%-])(%d%d)$"); om = "00"
      end
      if not sign then return nil end
      offset = (tonumber(oh) * 60 + tonumber(om)) * 60000
      if sign == "-" then offset = -offset end
    end
    if h > 23 or mi > 59 or s > 59 then return nil end
  end
  return ((days_from_civil(y, mo, d) * 24 + h) * 60 + mi) * 60000 + s * 1000 + ms - offset
end

-- Format epoch millis as ES does for date fields: 2024-05-01T10:20:30.000Z
function _M.format(ms)
  local days = floor(ms / 86400000)
  local rem = ms - days * 86400000
  local y, m, d = civil_from_days(days)
  local h = floor(rem / 3600000); rem = rem - h * 3600000
  local mi = floor(rem / 60000); rem = rem - mi * 60000
  local s = floor(rem / 1000); local milli = rem - s * 1000
  return string.format("%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", y, m, d, h, mi, s, milli)
end

return _M
