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

-- The second of ES's default dynamic_date_formats (RootObjectMapper's
-- DYNAMIC_DATE_TIME_FORMATTERS after strict_date_optional_time): a string it reads makes a
-- date field with this mapping format.
_M.SLASH_FORMAT = "yyyy/MM/dd HH:mm:ss||yyyy/MM/dd||epoch_millis"

-- Is s written as SLASH_FORMAT's patterns write dates ("2015/09/02", "2015/09/02 10:00:00")?
function _M.is_slash(s)
  return type(s) == "string" and (s:match("^%d%d%d%d/%d%d/%d%d$") or s:match("^%d%d%d%d/%d%d/%d%d %d%d:%d%d:%d%d$")) ~= nil
end

-- Does this string look like a date for dynamic date detection?
function _M.looks_like_date(s)
  return type(s) == "string" and ((s:match("^%d%d%d%d%-%d%d%-%d%d$") or s:match("^%d%d%d%d%-%d%d%-%d%dT%d%d")) ~= nil
    or _M.is_slash(s))
end

-- Parse to epoch milliseconds; returns number or nil. round_up: ES's round-up parser (range
-- bounds gt / lte, DateFormatter's roundupParser): the components the string leaves out are
-- month 1, day 1, 23:59:59.999 rather than midnight. zone_ms: the offset of a string without
-- one (a range query's time_zone); epoch millis are instants and ignore it. epoch: the
-- field's format is only epoch_millis / epoch_second, so every digit string is epoch millis;
-- otherwise strict_date_optional_time is tried first, as ES does, and takes exactly four
-- digits as a year ("2024" is 2024-01-01, not 2024 ms after the epoch).
function _M.parse(v, round_up, zone_ms, epoch)
  if type(v) == "number" then return v end
  if type(v) ~= "string" then return nil end
  if v:match("^%-?%d+$") and (epoch or not v:match("^%d%d%d%d$")) then return tonumber(v) end
  if _M.is_slash(v) then -- SLASH_FORMAT's dates (which fields take them: mapping.date_fits)
    return _M.parse(v:sub(1, 4) .. "-" .. v:sub(6, 7) .. "-" .. v:sub(9, 10) .. (#v > 10 and ("T" .. v:sub(12)) or ""),
      round_up, zone_ms, epoch)
  end
  local y, mo, d, rest = v:match("^(%d%d%d%d)%-(%d%d)%-(%d%d)(.*)$")
  if not y then
    y, mo, rest = v:match("^(%d%d%d%d)%-(%d%d)(.*)$")
    d = "01"
    if not y then y, rest = v:match("^(%d%d%d%d)()$"); if y then mo, d, rest = "01", "01", "" end end
    if not y then return nil end
  end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  if mo < 1 or mo > 12 or d < 1 or d > 31 then return nil end
  -- java.time resolves strictly: no February 30th (it was March 1st)
  local ny, nm = y, mo + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  if d > days_from_civil(ny, nm, 1) - days_from_civil(y, mo, 1) then return nil end
  local h, mi, s, ms = 0, 0, 0, 0
  if round_up then h, mi, s, ms = 23, 59, 59, 999 end
  local offset = zone_ms or 0
  if rest ~= "" then
    -- strict_date_optional_time separates the time with a 'T' only: "2024-01-02 10:00" is
    -- not a date there (a date field refuses it, dynamic mapping makes it text)
    local hh, tail = rest:match("^T(%d%d)(.*)$")
    if not hh then return nil end
    h = tonumber(hh)
    local mm, tail2 = tail:match("^:(%d%d)(.*)$")
    if mm then
      mi = tonumber(mm); tail = tail2
      local ss, tail3 = tail:match("^:(%d%d)(.*)$")
      if ss then
        s = tonumber(ss); tail = tail3
        local frac, tail4 = tail:match("^[%.,](%d+)(.*)$")
        if frac and #frac > 9 then return nil end -- appendFraction(NANO_OF_SECOND, 1, 9)
        if frac then
          -- java.time keeps nanoseconds and ES's millisecond resolution truncates them:
          -- ".9999" is 999 ms, not the next second
          ms = tonumber((frac .. "00"):sub(1, 3)); tail = tail4
        end
      end
    end
    if tail == "Z" then offset = 0
    elseif tail == "" then offset = zone_ms or 0
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

-- The offset in ms of a time_zone that is a fixed UTC offset, as java.time.ZoneId.of reads
-- one ("Z", "UTC", "GMT", "UT", "Etc/UTC", "+01:00", "-08", "+0530", "+1", "UTC+01:00", ...);
-- nil for anything else (region ids such as "Europe/Paris" need tz rules esxd does not have).
local UTC_IDS = { Z = true, UTC = true, GMT = true, UT = true, ["Etc/UTC"] = true, ["Etc/GMT"] = true,
  ["Etc/UCT"] = true, UCT = true, ["Etc/Universal"] = true, Universal = true, ["Etc/Zulu"] = true, Zulu = true }
function _M.zone_offset(z)
  if type(z) ~= "string" then return nil end
  if UTC_IDS[z] then return 0 end
  local prefix, off = z:match("^(%a*)([%+%-].*)$")
  if not prefix or (prefix ~= "" and prefix ~= "UTC" and prefix ~= "GMT" and prefix ~= "UT") then return nil end
  local sign, h, m, sec = off:match("^([%+%-])(%d%d?)$")
  if not sign then sign, h, m = off:match("^([%+%-])(%d%d):?(%d%d)$") end
  if not sign then sign, h, m, sec = off:match("^([%+%-])(%d%d):(%d%d):(%d%d)$") end
  if not sign then sign, h, m, sec = off:match("^([%+%-])(%d%d)(%d%d)(%d%d)$") end
  if not sign then return nil end
  h, m, sec = tonumber(h), tonumber(m or 0), tonumber(sec or 0)
  if h > 18 or m > 59 or sec > 59 or (h == 18 and (m > 0 or sec > 0)) then return nil end
  local ms = ((h * 60 + m) * 60 + sec) * 1000
  return sign == "-" and -ms or ms
end

local DAY = 86400000

local function days_in_month(y, m)
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  return days_from_civil(ny, nm, 1) - days_from_civil(y, m, 1)
end

-- local millis plus n calendar months, the day clamped to the month's length (plusMonths)
local function plus_months(l, n)
  local days = floor(l / DAY)
  local rem = l - days * DAY
  local y, m, d = civil_from_days(days)
  local idx = y * 12 + (m - 1) + n
  local ny, nm = floor(idx / 12), idx % 12 + 1
  local dim = days_in_month(ny, nm)
  if d > dim then d = dim end
  return days_from_civil(ny, nm, d) * DAY + rem
end

local UNIT_MS = { w = 7 * DAY, d = DAY, h = 3600000, H = 3600000, m = 60000, s = 1000 }

-- JavaDateMathParser.parseMath: apply the date math in s (what follows "now" or "||", e.g.
-- "-1d/d", "+1M/M") to the instant ms, in the time zone of offset zone_ms. "/unit" rounds down
-- to the unit's start, or with round_up to its last millisecond. Returns the instant, or nil
-- and ES's exception type and reason.
function _M.apply_math(ms, s, round_up, zone_ms)
  zone_ms = zone_ms or 0
  local l = ms + zone_ms
  local i, n = 1, #s
  while i <= n do
    local c = s:sub(i, i); i = i + 1
    local round, sign = false, 1
    if c == "/" then round = true
    elseif c == "-" then sign = -1
    elseif c ~= "+" then return nil, "parse_exception", "operator not supported for date math [" .. s .. "]" end
    if i > n then return nil, "parse_exception", "truncated date math [" .. s .. "]" end
    local num = 1
    local digits = s:match("^%d+", i)
    if digits then
      i = i + #digits
      if i > n then return nil, "parse_exception", "truncated date math [" .. s .. "]" end
      num = tonumber(digits)
      -- Integer.parseInt
      if num > 2147483647 then return nil, "number_format_exception", 'For input string: "' .. digits .. '"' end
    end
    if round and num ~= 1 then
      return nil, "parse_exception", "rounding `/` can only be used on single unit types [" .. s .. "]"
    end
    local unit = s:sub(i, i); i = i + 1
    if unit == "y" or unit == "M" then
      local months = unit == "y" and 12 or 1
      if round then
        local y, m = civil_from_days(floor(l / DAY))
        l = days_from_civil(y, unit == "y" and 1 or m, 1) * DAY
        if round_up then l = plus_months(l, months) end
      else
        l = plus_months(l, sign * num * months)
      end
    elseif UNIT_MS[unit] then
      local step = UNIT_MS[unit]
      if round then
        if unit == "w" then
          local days = floor(l / DAY)
          l = (days - (days + 3) % 7) * DAY -- previous or same Monday (1970-01-05 was one)
        else
          l = floor(l / step) * step
        end
        if round_up then l = l + step end
      else
        l = l + sign * num * step
      end
    else
      -- a multi-byte character is reported whole, as Java's char is
      local ch = s:match("^[\192-\247][\128-\191]*", i - 1) or unit
      return nil, "parse_exception", "unit [" .. ch .. "] not supported for date math [" .. s .. "]"
    end
    if round and round_up then l = l - 1 end
  end
  return l - zone_ms
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
