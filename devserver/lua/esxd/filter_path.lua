-- esxd.filter_path: the ?filter_path= response filter (comma-separated dotted paths, "*"
-- matches one level, "**" any number of levels, a leading "-" excludes). Arrays are
-- transparent: a path applies to every element.
local json = require "esxd.json"

local _M = {}
local null = json.null
local unpack = table.unpack or unpack

local function seg_match(pat, key)
  if pat == "*" then return true end
  if not pat:find("*", 1, true) then return pat == key end
  return key:match("^" .. pat:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", ".*") .. "$") ~= nil
end

local function is_array(t) return type(t) == "table" and #t > 0 end

-- Keep the parts of v matched by the include paths (lists of segments). Returns value or nil.
local function include(v, paths)
  for _, p in ipairs(paths) do if #p == 0 then return v end end
  if type(v) ~= "table" or v == null then return nil end
  if is_array(v) then
    local out = json.array()
    for _, e in ipairs(v) do
      local r = include(e, paths)
      if r ~= nil then out[#out + 1] = r end
    end
    return #out > 0 and out or nil
  end
  local out, any = {}, false
  for k, child in pairs(v) do
    local sub = {}
    for _, p in ipairs(paths) do
      if p[1] == "**" then
        sub[#sub + 1] = p                                   -- ** keeps matching deeper
        if p[2] and seg_match(p[2], k) then sub[#sub + 1] = { unpack(p, 3) } end
        if not p[2] then sub[#sub + 1] = {} end
      elseif seg_match(p[1], k) then
        sub[#sub + 1] = { unpack(p, 2) }
      end
    end
    if #sub > 0 then
      local r = include(child, sub)
      if r ~= nil then out[k] = r; any = true end
    end
  end
  return any and out or nil
end

local function exclude(v, p)
  if type(v) ~= "table" or v == null or #p == 0 then return end
  if is_array(v) then
    for _, e in ipairs(v) do exclude(e, p) end
    return
  end
  for k in pairs(v) do
    if seg_match(p[1], k) then
      if #p == 1 then v[k] = nil else exclude(v[k], { unpack(p, 2) }) end
    end
  end
end

-- Numbers pass through the filter as the text they were (a Long.MAX_VALUE sort value must not
-- come back as 9.2233720368547758e+18, nor 1.0 as 1): outside strings, each number becomes a
-- marked string before decoding, and its text again in the filtered output.
local MARKED = '"\\u0000esxd%-number\\u0000([^"]*)"'
local find, sub, find_outside_strings = string.find, string.sub, json.find_outside_strings

local function mark_numbers(s)
  local out, pos, i = {}, 1, 1
  while true do
    local j = find_outside_strings(s, '["%-%d]', i)
    if j == false then return s end -- an unterminated string: leave the text to the decoder
    if not j then break end
    local e = find(s, "[^%-%+%.%deE]", j) or #s + 1
    out[#out + 1] = sub(s, pos, j - 1)
    out[#out + 1] = '"\\u0000esxd-number\\u0000' .. sub(s, j, e - 1) .. '"'
    pos, i = e, e
  end
  out[#out + 1] = sub(s, pos)
  return table.concat(out)
end

-- Apply a filter_path expression to a JSON text; returns the filtered JSON text.
function _M.apply(expr, text)
  if text == "" then return text end
  local v = json.decode(mark_numbers(text))
  if type(v) ~= "table" then return text end
  local inc, exc = {}, {}
  for part in expr:gmatch("[^,]+") do
    part = part:match("^%s*(.-)%s*$")
    local neg = part:sub(1, 1) == "-"
    if neg then part = part:sub(2) end
    local segs = {}
    for s in part:gmatch("[^%.]+") do segs[#segs + 1] = s end
    if #segs > 0 then
      if neg then exc[#exc + 1] = segs else inc[#inc + 1] = segs end
    end
  end
  if #inc > 0 then v = include(v, inc) or {} end
  for _, p in ipairs(exc) do exclude(v, p) end
  return (json.encode(v):gsub(MARKED, "%1"))
end

return _M
