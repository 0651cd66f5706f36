--- esx.options: checks a constructor's options table against a schema.
--
-- Typos must not pass silently: an unknown option name, a value of the wrong type or one out
-- of range raises an error that names the option and the constructor, pointing at the
-- caller's line.  The result is a new table with every option present (defaults filled in),
-- so the code behind a constructor never sees a missing or ill-typed value.
--
-- A schema maps option names to specs:
--   { type = "integer"|"number"|"boolean"|"string"|"function"|"table"|"any",
--     default = <value or function returning a fresh value>, min = n, max = n,
--     required = true, check = function(v) -> normalized | nil, reason }

local type, pairs, tostring, error, floor = type, pairs, tostring, error, math.floor
local huge = math.huge

local _M = {}

local MAX_SAFE = 9007199254740991

local function is_integer(v)
  return type(v) == "number" and v == floor(v) and v >= -MAX_SAFE and v <= MAX_SAFE
end

local function describe_type(v)
  if type(v) == "number" and v ~= floor(v) then return "non-integer number" end
  return type(v)
end

-- Returns nil when v satisfies spec, else the reason it does not.
local function violation(spec, v)
  local t = spec.type
  if t == "integer" then
    if not is_integer(v) then return "integer expected, got " .. describe_type(v) end
  elseif t ~= "any" and type(v) ~= t then
    return t .. " expected, got " .. type(v)
  end
  if t == "integer" or t == "number" then
    if v ~= v then return "number expected, got NaN" end
    if spec.min and v < spec.min then return "must be >= " .. tostring(spec.min) end
    if spec.max and v > spec.max then return "must be <= " .. tostring(spec.max) end
  elseif t == "string" and spec.nonempty and v == "" then
    return "must not be empty"
  end
  return nil
end

--- A `check` for names that become metric labels: UTF-8, as the Prometheus text format
-- requires (a stray byte would make every scrape of esx.metrics() fail), without control
-- characters (C0, DEL, C1): a NUL went into the exposition text as it was, which parsers
-- written in C cut there, and a newline or escape split or garbled the log lines that name
-- the object.
function _M.utf8_text(v)
  local i, n, byte = 1, #v, string.byte
  while i <= n do
    local c = byte(v, i)
    local len, lo, hi = 1, 0x80, 0xBF -- the sequence's length; the range of its 2nd byte
    local c2 = c == 0xC2 and byte(v, i + 1) -- U+0080..U+009F: C1
    if c < 0x20 or c == 0x7F or (c2 and c2 >= 0x80 and c2 <= 0x9F) then
      return nil, "must not contain control characters"
    end
    if c >= 0xC2 and c <= 0xDF then len = 2
    elseif c >= 0xE0 and c <= 0xEF then
      len = 3
      if c == 0xE0 then lo = 0xA0 elseif c == 0xED then hi = 0x9F end -- no overlongs, surrogates
    elseif c >= 0xF0 and c <= 0xF4 then
      len = 4
      if c == 0xF0 then lo = 0x90 elseif c == 0xF4 then hi = 0x8F end -- no overlongs, > U+10FFFF
    elseif c >= 0x80 then
      return nil, "must be UTF-8 text"
    end
    for k = 1, len - 1 do
      local b = byte(v, i + k)
      if not b or b < (k == 1 and lo or 0x80) or b > (k == 1 and hi or 0xBF) then
        return nil, "must be UTF-8 text"
      end
    end
    i = i + len
  end
  return v
end

--- Validates `opts` (a table or nil) against `schema`; returns the filled-in copy.
-- `ctor` names the constructor in messages; `level` is passed to error() (default 3: the
-- caller of the function that called check).
function _M.check(ctor, schema, opts, level)
  level = level or 3
  if opts == nil then
    opts = {}
  elseif type(opts) ~= "table" then
    error("bad argument #1 to " .. ctor .. " (table expected, got " .. type(opts) .. ")", level)
  end
  -- Of several bad (or missing required) options, the one first in string order (byte order
  -- in the C locale) is named:
  -- pairs() visits keys in an order that differs between Lua 5.4 and LuaJIT and, as string
  -- hashes are seeded at random, from one run to the next -- esx.cache() named 'load_page'
  -- in one run and 'load_readers' in the next.
  local out, bad, bad_reason = {}, nil, nil
  local function refuse(name, reason)
    name = tostring(name)
    if bad == nil or name < bad then bad, bad_reason = name, reason end
  end
  for name, v in pairs(opts) do
    local spec = type(name) == "string" and schema[name] or nil
    local reason
    if spec then reason = violation(spec, v) else reason = "unknown option" end
    if not reason and spec.check then
      local normalized, why = spec.check(v)
      if normalized == nil then
        reason = why or "invalid value"
      else
        v = normalized
      end
    end
    if reason then refuse(name, reason) else out[name] = v end
  end
  if bad then error(ctor .. ": bad option '" .. bad .. "' (" .. bad_reason .. ")", level) end
  for name, spec in pairs(schema) do
    if out[name] == nil and spec.required then refuse(name, "required") end
  end
  if bad then error(ctor .. ": bad option '" .. bad .. "' (" .. bad_reason .. ")", level) end
  for name, spec in pairs(schema) do
    if out[name] == nil then
      local d = spec.default
      if type(d) == "function" then d = d() end
      out[name] = d
    end
  end
  return out
end

--- Makes every method of `class` (its functions but the metamethods) raise a clear error when
-- called with '.' instead of ':' -- `c.search("idx", q)` passed "idx" as self and failed with
-- "attempt to index" deep inside, or with a message about the wrong argument.  `what` names
-- the object ("esx.client"), `var` the variable of the advice ("c").  The check is a tail
-- call away from the method, so the method's own errors still point at the caller's line.
-- Call it once the class has all its methods.
function _M.guard_methods(class, what, var)
  local getmetatable = getmetatable
  for name, f in pairs(class) do
    if type(name) == "string" and type(f) == "function" and name:sub(1, 2) ~= "__" then
      class[name] = function(self, ...)
        if getmetatable(self) ~= class then
          error("bad self to '" .. name .. "' (" .. what .. " expected, got " .. type(self) ..
                "; call it as " .. var .. ":" .. name .. "(...))", 2)
        end
        return f(self, ...)
      end
    end
  end
end

--- true when the table's keys are exactly 1..n (a list without holes)
function _M.is_sequence(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  for i = 1, n do
    if t[i] == nil then return false end
  end
  return true
end

_M.is_integer = is_integer
-- violation(spec, v) -> nil, or why v does not satisfy spec (as check words it), for values
-- checked outside an options table (the client's per-call options)
_M.violation = violation
_M.MAX_SAFE_INTEGER = MAX_SAFE
_M.INFINITY = huge

return _M
