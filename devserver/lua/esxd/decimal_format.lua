-- esxd.decimal_format: the number "format" of docvalue_fields, as ES 8's DocValueFormat.Decimal
-- prints doc values: java.text.DecimalFormat with Locale.ROOT's symbols and HALF_UP rounding.
-- esxd reads the usual patterns: a prefix and a suffix (literal text, 'quoted' text, % and
-- per mille), "#", "0" and "," before an optional "." and "0"s then "#"s, and a ";" negative
-- subpattern (its prefix and suffix); the exponent (E), the currency sign and digits in a
-- suffix are refused with esxd's 400.
local errors = require "esxd.errors"

local _M = {}

local PERMILLE = "\226\128\176"   -- U+2030
local CURRENCY = "\194\164"       -- U+00A4

local function unimplemented(p, what)
  error(errors.new(400, "illegal_argument_exception", "esxd does not implement " .. what ..
    " in the number format [" .. p .. "]: it prints prefixes and suffixes, #, 0, ',' and '.', " ..
    "% and per mille, and ';' negative subpatterns"), 0)
end

local function malformed(p) error(errors.new(400, "illegal_argument_exception", 'Malformed pattern "' .. p .. '"'), 0) end

-- One subpattern from position i: {prefix, suffix, int = {min, grouping}, frac = {min, max},
-- multiplier, point}, and where it ended (at the ";" or past the end). neg: the negative
-- subpattern, whose number part only separates its prefix from its suffix.
local function subpattern(p, i, neg)
  local out = { prefix = {}, suffix = {}, multiplier = 1 }
  local phase, affix = 0, out.prefix
  local left, zeros, right, point, grouping = 0, 0, 0, nil, -1
  local n = #p
  while i <= n do
    local c = p:sub(i, i)
    if phase ~= 1 then
      if c == "#" or c == "0" or c == "," or c == "." then
        if phase == 2 then unimplemented(p, "digits after the suffix") end
        phase = 1
        goto continue
      elseif c == "'" then
        local j, lit = i + 1, {}
        if p:sub(j, j) == "'" then affix[#affix + 1] = "'"; i = j + 1; goto continue end
        while true do
          if j > n then malformed(p) end
          local d = p:sub(j, j)
          if d == "'" then
            if p:sub(j + 1, j + 1) == "'" then lit[#lit + 1] = "'"; j = j + 2 else break end
          else lit[#lit + 1] = d; j = j + 1 end
        end
        affix[#affix + 1] = table.concat(lit)
        i = j + 1
        goto continue
      elseif c == ";" then
        if phase == 0 or neg then
          error(errors.new(400, "illegal_argument_exception", "Unquoted special character ';' in pattern \"" .. p .. '"'), 0)
        end
        break
      elseif c == "%" or p:sub(i, i + 2) == PERMILLE then
        if out.multiplier ~= 1 then
          error(errors.new(400, "illegal_argument_exception", "Too many percent/per mille characters in pattern \"" .. p .. '"'), 0)
        end
        out.multiplier = c == "%" and 100 or 1000
        affix[#affix + 1] = c == "%" and "%" or PERMILLE
        i = i + (c == "%" and 1 or 3)
        goto continue
      elseif p:sub(i, i + 1) == CURRENCY then
        unimplemented(p, "the currency sign")
      end
      affix[#affix + 1] = c
      i = i + 1
    else
      if neg then
        if c == "#" or c == "0" or c == "," or c == "." or c == "E" then i = i + 1
        else phase, affix = 2, out.suffix end
        goto continue
      end
      if c == "#" then
        if zeros > 0 then right = right + 1 else left = left + 1 end
        if grouping >= 0 and not point then grouping = grouping + 1 end
      elseif c == "0" then
        if right > 0 then
          error(errors.new(400, "illegal_argument_exception", "Unexpected '0' in pattern \"" .. p .. '"'), 0)
        end
        zeros = zeros + 1
        if grouping >= 0 and not point then grouping = grouping + 1 end
      elseif c == "," then
        grouping = 0
      elseif c == "." then
        if point then
          error(errors.new(400, "illegal_argument_exception", "Multiple decimal separators in pattern \"" .. p .. '"'), 0)
        end
        point = left + zeros + right
      elseif c == "E" then
        unimplemented(p, "the exponent")
      else
        phase, affix = 2, out.suffix
        goto continue
      end
      i = i + 1
    end
    ::continue::
  end
  if neg then return out, i end
  -- DecimalFormat.applyPattern: "##.###" is "#0.###", ".###" is ".0##"
  if zeros == 0 and left > 0 and point then
    local k = point
    if k == 0 then k = k + 1 end
    right = left - k
    left = k - 1
    zeros = 1
  end
  if (not point and right > 0) or (point and (point < left or point > left + zeros)) or grouping == 0 then
    malformed(p)
  end
  local total = left + zeros + right
  local eff = point or total
  out.min_int = eff - left
  out.max_frac = point and (total - point) or 0
  out.min_frac = point and (left + zeros - point) or 0
  out.grouping = grouping > 0 and grouping or nil
  out.always_point = point ~= nil and (point == 0 or point == total)
  return out, i
end

-- The shortest decimal digits that read back as x (>= 0, finite), as Double.toString's
-- digits that DecimalFormat starts from: integer part, fraction part.
local function shortest(x)
  local d, e
  for k = 1, 17 do
    local s = string.format("%." .. (k - 1) .. "e", x)
    if tonumber(s) == x or k == 17 then
      local m, ex = s:match("^([%d%.]+)e([-+]%d+)$")
      d, e = m:gsub("%.", ""), tonumber(ex) + 1
      break
    end
  end
  d = d:gsub("0+$", "")
  if d == "" then return "", "" end
  if e <= 0 then return "", string.rep("0", -e) .. d end
  if e >= #d then return d .. string.rep("0", e - #d), "" end
  return d:sub(1, e), d:sub(e + 1)
end

-- A printer for a DecimalFormat pattern (a function of a number to a string), or raises ES's
-- 400 for a malformed pattern (esxd's for what it does not implement).
function _M.printer(p)
  local pos, i = subpattern(p, 1, false)
  if p == "" then pos.max_frac = 340 end
  local negp
  if p:sub(i, i) == ";" then negp = subpattern(p, i + 1, true) end
  local pprefix, psuffix = table.concat(pos.prefix), table.concat(pos.suffix)
  local nprefix, nsuffix
  if negp and (table.concat(negp.prefix) ~= pprefix or table.concat(negp.suffix) ~= psuffix) then
    nprefix, nsuffix = table.concat(negp.prefix), table.concat(negp.suffix)
  else
    nprefix, nsuffix = "-" .. pprefix, psuffix
  end
  return function(x)
    if x ~= x then return "NaN" end
    local negative = x < 0 or (x == 0 and 1 / x < 0)
    x = math.abs(x) * pos.multiplier
    local int, frac = shortest(x)
    -- HALF_UP at max_frac on the shortest digits (DigitList); a last digit 5 is a tie only
    -- if the double is exactly that decimal: its exact expansion decides
    if #frac > pos.max_frac then
      local r = frac:byte(pos.max_frac + 1) - 48
      local up = r > 5 or (r == 5 and frac:sub(pos.max_frac + 2):find("[1-9]") ~= nil)
      if r == 5 and not up then
        local ex = string.format("%." .. (pos.max_frac + 30) .. "f", x):match("%.(%d+)$")
        up = ex:byte(pos.max_frac + 1) - 48 >= 5
      end
      local digits = int .. frac:sub(1, pos.max_frac)
      if up then
        local t, carry = {}, 1
        for k = #digits, 1, -1 do
          local d = digits:byte(k) - 48 + carry
          carry = d >= 10 and 1 or 0
          t[k] = string.char(48 + d % 10)
        end
        digits = (carry == 1 and "1" or "") .. table.concat(t)
      end
      int = digits:sub(1, #digits - pos.max_frac)
      frac = digits:sub(#digits - pos.max_frac + 1)
    end
    int = int:gsub("^0+", "")
    frac = frac:gsub("0+$", "")
    if #frac < pos.min_frac then frac = frac .. string.rep("0", pos.min_frac - #frac) end
    if #int < pos.min_int then int = string.rep("0", pos.min_int - #int) .. int end
    if pos.grouping and #int > pos.grouping then
      local g, parts = pos.grouping, {}
      local first = #int % g
      if first > 0 then parts[1] = int:sub(1, first) end
      for k = first + 1, #int, g do parts[#parts + 1] = int:sub(k, k + g - 1) end
      int = table.concat(parts, ",")
    end
    if #frac == 0 and #int == 0 then int = "0" end
    local num = int .. ((#frac > 0 or pos.always_point) and ("." .. frac) or "")
    if negative then return nprefix .. num .. nsuffix end
    return pprefix .. num .. psuffix
  end
end

return _M
