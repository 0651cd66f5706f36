-- esxd.json: JSON for the dev server. Decoding is cjson's; encoding is our own so that we
-- control what cjson 2.1.0 cannot: empty arrays (json.array), key order (json.obj), floats
-- that must print as "1.0" (json.float) and raw JSON fragments spliced verbatim (json.raw,
-- used for stored _source bytes).
local cjson = require "cjson.safe"

local concat, format, gsub, type, pairs, ipairs = table.concat, string.format, string.gsub, type, pairs, ipairs
local floor, huge = math.floor, math.huge
local setmetatable, getmetatable, tostring, tonumber = setmetatable, getmetatable, tostring, tonumber

local _M = {}

local ARRAY, OBJ, FLOAT, RAW = {}, {}, {}, {}
_M.null = cjson.null

-- Mark t as a JSON array (so that {} encodes as []).
function _M.array(t) return setmetatable(t or {}, ARRAY) end

-- Ordered object: json.obj("k1", v1, "k2", v2, ...). Nil values are skipped.
function _M.obj(...)
  local n = select("#", ...)
  local t, order = {}, {}
  for i = 1, n, 2 do
    local k, v = select(i, ...)
    if v ~= nil then order[#order + 1] = k; t[k] = v end
  end
  return setmetatable({ __keys = order, __vals = t }, OBJ)
end

-- Append a key to an ordered object (or set a plain table field).
function _M.set(o, k, v)
  if getmetatable(o) == OBJ then
    if o.__vals[k] == nil and v ~= nil then o.__keys[#o.__keys + 1] = k end
    o.__vals[k] = v
  else
    o[k] = v
  end
  return o
end

function _M.get(o, k)
  if getmetatable(o) == OBJ then return o.__vals[k] end
  return o[k]
end

function _M.float(x) return setmetatable({ x }, FLOAT) end
function _M.raw(s) return setmetatable({ s }, RAW) end
function _M.is_raw(v) return type(v) == "table" and getmetatable(v) == RAW end

local escapes = { ['"'] = '\\"', ["\\"] = "\\\\", ["\b"] = "\\b", ["\f"] = "\\f",
  ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local function esc_char(c)
  return escapes[c] or format("\\u%04x", c:byte())
end
local function quote(s)
  return '"' .. gsub(s, '[%c"\\]', esc_char) .. '"'
end
_M.quote = quote

local function num(x, as_float)
  if x ~= x or x == huge or x == -huge then return "null" end
  if floor(x) == x and x > -9007199254740992 and x < 9007199254740992 then
    local s = format("%d", x)
    if as_float then s = s .. ".0" end
    return s
  end
  local s = format("%.15g", x)
  if tonumber(s) ~= x then s = format("%.17g", x) end
  return s
end
_M.number = num

local function is_seq(t)
  local n = #t
  if n == 0 then return false end
  local c = 0
  for _ in pairs(t) do c = c + 1; if c > n then return false end end
  return c == n
end

local encode
encode = function(v, buf)
  local t = type(v)
  if t == "string" then buf[#buf + 1] = quote(v)
  elseif t == "number" then buf[#buf + 1] = num(v)
  elseif t == "boolean" then buf[#buf + 1] = v and "true" or "false"
  elseif t == "nil" or v == cjson.null then buf[#buf + 1] = "null"
  elseif t == "table" then
    local mt = getmetatable(v)
    if mt == RAW then buf[#buf + 1] = v[1]
    elseif mt == FLOAT then buf[#buf + 1] = num(v[1], true)
    elseif mt == OBJ then
      buf[#buf + 1] = "{"
      local first = true
      for _, k in ipairs(v.__keys) do
        local val = v.__vals[k]
        if val ~= nil then
          if not first then buf[#buf + 1] = "," end
          first = false
          buf[#buf + 1] = quote(k); buf[#buf + 1] = ":"
          encode(val, buf)
        end
      end
      buf[#buf + 1] = "}"
    elseif mt == ARRAY or is_seq(v) then
      buf[#buf + 1] = "["
      for i = 1, #v do
        if i > 1 then buf[#buf + 1] = "," end
        encode(v[i], buf)
      end
      buf[#buf + 1] = "]"
    else
      buf[#buf + 1] = "{"
      local keys = {}
      for k in pairs(v) do keys[#keys + 1] = tostring(k) end
      table.sort(keys)
      for i, k in ipairs(keys) do
        if i > 1 then buf[#buf + 1] = "," end
        buf[#buf + 1] = quote(k); buf[#buf + 1] = ":"
        local val = v[k]
        if val == nil then val = v[tonumber(k)] end
        encode(val, buf)
      end
      buf[#buf + 1] = "}"
    end
  else
    buf[#buf + 1] = "null"
  end
end

function _M.encode(v)
  local buf = {}
  encode(v, buf)
  return concat(buf)
end

-- cjson 2.1.0 decodes [] and {} alike (an empty table), so a decoded value re-encoded (an
-- updated _source, a filter_path'd response) would turn [] into {}. Empty arrays are
-- therefore replaced by a marker string before decoding and by json.array() after.
local EMPTY = "\0esxd-empty-array\0"
local find, sub, match = string.find, string.sub, string.match

-- The index of the first match of pat (a set that holds '"' and the characters looked for,
-- as '["%[]') at or after i in the JSON text s that is not inside a string: nil when there is
-- none, false at an unterminated string.  For the rewrites of a text before decoding it
-- (mark_empty_arrays here, filter_path's numbers).
local function find_outside_strings(s, pat, i)
  while true do
    local j = find(s, pat, i)
    if not j or sub(s, j, j) ~= '"' then return j end
    local k = j + 1
    while true do
      local q = find(s, '["\\]', k)
      if not q then return false end
      if sub(s, q, q) == "\\" then k = q + 2 else i = q + 1; break end
    end
  end
end
_M.find_outside_strings = find_outside_strings

local function mark_empty_arrays(s)
  if not find(s, "%[%s*%]") then return nil end
  local out, pos, i = {}, 1, 1
  while true do
    local j = find_outside_strings(s, '["%[]', i)
    if j == false then return nil end -- an unterminated string: cjson reports it
    if not j then break end
    local close = match(s, "^%s*()%]", j + 1)
    if close then
      out[#out + 1] = sub(s, pos, j - 1)
      out[#out + 1] = '"\\u0000esxd-empty-array\\u0000"'
      pos, i = close + 1, close + 1
    else
      i = j + 1
    end
  end
  out[#out + 1] = sub(s, pos)
  return concat(out)
end

local function unmark(v)
  if v == EMPTY then return _M.array() end
  if type(v) == "table" then
    for k, e in pairs(v) do
      if e == EMPTY then v[k] = _M.array() elseif type(e) == "table" then unmark(e) end
    end
  end
  return v
end

-- Key order. cjson's tables forget the order of an object's keys, which ES's parsers follow
-- (a range query's later "gte" replaces an earlier "gt"). json.decode(s, true) walks the
-- text once more beside the decoded value and records each object's keys in document order;
-- json.keys(t) returns them, or nil for a table not decoded that way. The walk also finds
-- what cjson lets through and ES's parser refuses (JsonParser.Feature.
-- STRICT_DUPLICATE_DETECTION): a name given twice in one object.
local ORDER = setmetatable({}, { __mode = "k" })

local byte = string.byte
local B_OBJ, B_ARR, B_QUOTE, B_COMMA, B_CLOSE_OBJ, B_CLOSE_ARR = 123, 91, 34, 44, 125, 93

local function skip_ws(s, i) return find(s, "[^ \t\r\n]", i) or #s + 1 end

local function scan_string(s, i) -- s[i] is the opening quote; returns the raw text, next index
  local j = i + 1
  while true do
    local q = find(s, '["\\]', j)
    if not q then return sub(s, i + 1), #s + 1 end
    if byte(s, q) == 92 then j = q + 2 else return sub(s, i + 1, q - 1), q + 1 end
  end
end

-- Returns the index after the value at i, or nil and an error message in cjson's manner.
local walk
walk = function(s, i, v)
  i = skip_ws(s, i)
  local c = byte(s, i)
  if c == B_OBJ then
    local keys, seen = {}, {}
    if type(v) == "table" then ORDER[v] = keys end
    i = skip_ws(s, i + 1)
    if byte(s, i) == B_CLOSE_OBJ then return i + 1 end
    local n = 0
    while byte(s, i) == B_QUOTE do
      local raw, err
      raw, i = scan_string(s, i)
      local key = raw
      if find(raw, "\\", 1, true) then key = cjson.decode('"' .. raw .. '"') or raw end
      if seen[key] then return nil, "Duplicate field '" .. key .. "' at character " .. i end
      seen[key] = true
      n = n + 1
      keys[n] = key
      i = skip_ws(s, i) + 1 -- the colon
      i, err = walk(s, i, type(v) == "table" and v[key] or nil)
      if not i then return nil, err end
      i = skip_ws(s, i)
      if byte(s, i) ~= B_COMMA then break end
      i = skip_ws(s, i + 1)
    end
    return i + 1
  elseif c == B_ARR then
    local n, err = 0, nil
    i = skip_ws(s, i + 1)
    if byte(s, i) == B_CLOSE_ARR then return i + 1 end
    while i <= #s do
      n = n + 1
      i, err = walk(s, i, type(v) == "table" and v[n] or nil)
      if not i then return nil, err end
      i = skip_ws(s, i)
      if byte(s, i) ~= B_COMMA then break end
      i = i + 1
    end
    return i + 1
  elseif c == B_QUOTE then
    local _, j = scan_string(s, i)
    return j
  end
  return find(s, "[,%]} \t\r\n]", i) or #s + 1
end

function _M.keys(t) return ORDER[t] end

-- The 1-based [line, column] of a decode error of s: cjson says "at character N" (bytes).
function _M.error_position(s, err)
  local n = tonumber(tostring(err):match("at character (%d+)")) or 1
  local line, last = 1, 0
  for p in sub(s, 1, n - 1):gmatch("()\n") do line, last = line + 1, p end
  return line, n - last
end

-- The 1-based line and column (bytes) where the value at path (object keys and 1-based array
-- indices, {"stored_fields", 2}) starts in the JSON text s, as Jackson's token location
-- reports it; nil when s does not hold such a value. s must be JSON that decodes.
function _M.locate(s, path)
  local i = skip_ws(s, 1)
  for _, step in ipairs(path) do
    local c = byte(s, i)
    if type(step) == "string" then
      if c ~= B_OBJ then return nil end
      i = skip_ws(s, i + 1)
      local found = false
      while byte(s, i) == B_QUOTE do
        local raw
        raw, i = scan_string(s, i)
        local key = raw
        if find(raw, "\\", 1, true) then key = cjson.decode('"' .. raw .. '"') or raw end
        i = skip_ws(s, skip_ws(s, i) + 1) -- past the colon
        if key == step then found = true; break end
        i = walk(s, i)
        if not i then return nil end
        i = skip_ws(s, i)
        if byte(s, i) ~= B_COMMA then break end
        i = skip_ws(s, i + 1)
      end
      if not found then return nil end
    else
      if c ~= B_ARR then return nil end
      i = skip_ws(s, i + 1)
      for _ = 2, step do
        i = walk(s, i)
        if not i then return nil end
        i = skip_ws(s, i)
        if byte(s, i) ~= B_COMMA then return nil end
        i = skip_ws(s, i + 1)
      end
    end
  end
  if i > #s then return nil end
  local line, last = 1, 0
  for p in sub(s, 1, i - 1):gmatch("()\n") do line, last = line + 1, p end
  return line, i - last
end

-- The names of every object in a decoded value (cjson keeps one of each).
local function count_names(v)
  local n = 0
  for k, e in pairs(v) do
    if type(k) == "string" then n = n + 1 end
    if type(e) == "table" then n = n + count_names(e) end
  end
  return n
end

-- Decode; returns value or nil, message. Empty arrays come back as json.array() tables.
-- ordered: refuse duplicate names as ES does; true also records every object's key order
-- (json.keys), "strict" (documents) walks the text only when it may hold a duplicate: every
-- name ends with '"' then ':' (so might the odd escaped quote in a string), and cjson's
-- tables hold fewer names than the text only when one is given twice.
function _M.decode(s, ordered)
  local marked = type(s) == "string" and mark_empty_arrays(s)
  local v, err = cjson.decode(marked or s)
  if v == nil and err then
    if marked then return nil, select(2, cjson.decode(s)) end -- positions as in the text sent
    return nil, err
  end
  if marked then v = unmark(v) end
  if ordered == "strict" and type(v) == "table" then
    local _, n = gsub(s, '"%s*:', "")
    if n == count_names(v) then return v end
  end
  if ordered and type(v) == "table" then
    local ok, err = walk(s, 1, v)
    if not ok then return nil, err end
  end
  return v
end

-- Decode keeping every integer of 16 digits or more as its text (a json.raw value), as ES's
-- parser keeps a source's longs and big integers exactly: a double holds integers exactly
-- only up to 2^53, so a re-serialised source (filtered, merged by _update) would change
-- them. Other numbers are cjson's doubles. Returns value or nil, message.
local BIG = "\0esxd-int\0"
local function unmark_big(v)
  if type(v) ~= "table" or getmetatable(v) == RAW then return v end
  for k, e in pairs(v) do
    if type(e) == "string" and sub(e, 1, #BIG) == BIG then v[k] = _M.raw(sub(e, #BIG + 1))
    elseif type(e) == "table" then unmark_big(e) end
  end
  return v
end
function _M.decode_exact(s)
  if type(s) ~= "string" or not find(s, "%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d") then return _M.decode(s) end
  local out, pos, i = {}, 1, 1
  while true do
    local j = find_outside_strings(s, '["%-%d]', i)
    if j == false then return _M.decode(s) end -- an unterminated string: cjson reports it
    if not j then break end
    local e = find(s, "[^%-%+%.%deE]", j) or #s + 1
    local text = sub(s, j, e - 1)
    if find(text, "^%-?%d+$") and #text:gsub("^%-", "") >= 16 then
      out[#out + 1] = sub(s, pos, j - 1)
      out[#out + 1] = '"\\u0000esxd-int\\u0000' .. text .. '"'
      pos = e
    end
    i = e
  end
  out[#out + 1] = sub(s, pos)
  local v, err = _M.decode(concat(out))
  if v == nil then return nil, err end
  if type(v) == "string" and sub(v, 1, #BIG) == BIG then return _M.raw(sub(v, #BIG + 1)) end
  return unmark_big(v)
end

-- Is t an array made by json.array() (as decode makes every empty one)?
function _M.is_array(t) return type(t) == "table" and getmetatable(t) == ARRAY end

return _M
