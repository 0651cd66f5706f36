-- esxd.fetch_fields: the search body's "fields" and "docvalue_fields" options, as ES 8's
-- FetchFieldsPhase and FetchDocValuesPhase build each hit's "fields" object: field names and
-- "*" patterns over the index's mapped fields (multi-fields included, objects and metadata
-- fields not), every value in an array; "fields" reads _source through the mappings
-- (null_value, ignore_above, ignore_malformed, dates formatted), "docvalue_fields" the doc
-- values (sorted; keywords and ips deduplicated; copy_to targets included); stored_fields the
-- fields mapped with "store": true, presented as "fields" presents them.
local json = require "esxd.json"
local errors = require "esxd.errors"
local names = require "esxd.names"
local mapping = require "esxd.mapping"
local dates = require "esxd.dates"
local decimal_format = require "esxd.decimal_format"

local _M = {}
local null = json.null

local function is_obj(t)
  return type(t) == "table" and t ~= null and not json.is_array(t) and (next(t) == nil or #t == 0)
end

local function kind(v)
  if is_obj(v) then return "START_OBJECT" end
  if type(v) == "table" and v ~= null then return "START_ARRAY" end
  if type(v) == "number" then return "VALUE_NUMBER" end
  if type(v) == "boolean" then return "VALUE_BOOLEAN" end
  if v == null then return "VALUE_NULL" end
  return "VALUE_STRING"
end

local FF_KEYS = { field = true, format = true, include_unmapped = true }

-- SearchSourceBuilder.parseXContent: "fields" / "docvalue_fields" take an array only; each
-- entry is FieldAndFormat.fromXContent: a name, or {"field", "format", "include_unmapped"}.
function _M.parse(spec, key)
  if spec == nil then return nil end
  if kind(spec) ~= "START_ARRAY" then
    errors.raise(400, "parsing_exception", "Unknown key for a " .. kind(spec) .. " in [" .. key .. "].")
  end
  local out = {}
  for _, e in ipairs(spec) do
    if is_obj(e) then
      for k in pairs(e) do
        if not FF_KEYS[k] then errors.raise(400, "x_content_parse_exception", "[fetch_field_and_format] unknown field [" .. k .. "]") end
      end
      if type(e.field) ~= "string" then errors.raise(400, "x_content_parse_exception", "Required [field]") end
      if e.format ~= nil and e.format ~= null and type(e.format) ~= "string" then
        errors.raise(400, "x_content_parse_exception", "[fetch_field_and_format] format doesn't support values of type: " .. kind(e.format))
      end
      local iu = e.include_unmapped
      if iu ~= nil and type(iu) ~= "boolean" and iu ~= "true" and iu ~= "false" then
        errors.raise(400, "x_content_parse_exception", "[fetch_field_and_format] include_unmapped doesn't support values of type: " .. kind(iu))
      end
      out[#out + 1] = { field = e.field, format = e.format ~= null and e.format or nil, include_unmapped = iu == true or iu == "true" }
    elseif type(e) == "string" or type(e) == "number" or type(e) == "boolean" then
      out[#out + 1] = { field = type(e) == "number" and json.number(e) or tostring(e) }
    else
      errors.raise(400, "x_content_parse_exception", "[fetch_field_and_format] Expected START_OBJECT but was: " .. kind(e))
    end
  end
  return out
end

-- Date formats ------------------------------------------------------------------------

-- java.time's pattern letters (DateTimeFormatterBuilder.appendPattern); esxd prints y, M,
-- d, H, m, s, S and quoted literals.
local JAVA_LETTERS = {}
for c in ("GuyDMLdQqYwWEecFahKkHmsSAnNVvzOXxZpgB"):gmatch(".") do JAVA_LETTERS[c] = true end
local PRINTED = { y = true, M = true, d = true, H = true, m = true, s = true, S = true }
local MONTHS = { "January", "February", "March", "April", "May", "June", "July", "August", "September",
  "October", "November", "December" }
local NAMED = {
  strict_date_optional_time = "iso", date_optional_time = "iso", strict_date_optional_time_nanos = "iso",
  strict_date_time = "iso", date_time = "iso", epoch_millis = "millis", epoch_second = "second",
  strict_date = "yyyy-MM-dd", date = "yyyy-MM-dd", basic_date = "yyyyMMdd",
  strict_date_hour_minute_second = "yyyy-MM-dd'T'HH:mm:ss", date_hour_minute_second = "yyyy-MM-dd'T'HH:mm:ss",
  strict_year_month_day = "yyyy-MM-dd", year_month_day = "yyyy-MM-dd",
}

local function unimplemented(format)
  return errors.new(400, "illegal_argument_exception", "esxd does not implement the date format [" .. format ..
    "]: it prints the named formats strict_date_optional_time, epoch_millis, epoch_second, date, " ..
    "basic_date, date_hour_minute_second and patterns of y, M, d, H, m, s, S and quoted text")
end

-- A pattern's tokens ({letter, count} or literal strings), or raises ES's error (whole: the
-- format as given, for the message) / esxd's for what it cannot print (only when print).
local function tokens(pattern, whole, print)
  local out, i, n = {}, 1, #pattern
  local function bad(msg) error(errors.new(400, "illegal_argument_exception", "Invalid format: [" .. whole .. "]: " .. msg), 0) end
  while i <= n do
    local c = pattern:sub(i, i)
    if c:match("%a") then
      local j = i
      while pattern:sub(j + 1, j + 1) == c do j = j + 1 end
      if not JAVA_LETTERS[c] then bad("Unknown pattern letter: " .. c) end
      if print and not PRINTED[c] then error(unimplemented(whole), 0) end
      out[#out + 1] = { c, j - i + 1 }
      i = j + 1
    elseif c == "'" then
      local lit, j = {}, i + 1
      while true do
        if j > n then bad("Pattern ends with an incomplete string literal: " .. pattern) end
        local d = pattern:sub(j, j)
        if d == "'" then
          if pattern:sub(j + 1, j + 1) == "'" then lit[#lit + 1] = "'"; j = j + 2 else break end
        else lit[#lit + 1] = d; j = j + 1 end
      end
      out[#out + 1] = (j == i + 1) and "'" or table.concat(lit)
      i = j + 1
    elseif c == "{" or c == "}" or c == "#" then
      bad("Pattern includes reserved character: '" .. c .. "'")
    elseif c == "[" or c == "]" then
      if print then error(unimplemented(whole), 0) end
      i = i + 1
    else
      out[#out + 1] = c
      i = i + 1
    end
  end
  return out
end

local function pad(v, w) return string.format("%0" .. w .. "d", v) end

-- A printer for a date "format" (DateFormatter.forPattern: "a||b" prints with a, each part
-- must parse), or raises.
function _M.date_printer(format)
  local parts = {}
  for p in (format .. "||"):gmatch("(.-)||") do parts[#parts + 1] = p end
  if format == "" or #parts == 0 then
    error(errors.new(400, "illegal_argument_exception", "No date pattern provided"), 0)
  end
  local printer
  for k, p in ipairs(parts) do
    local named = NAMED[p]
    -- the whole pattern is checked first (ES's "Unknown pattern letter" comes before esxd's
    -- "does not implement" for a letter esxd does not print)
    local toks = (named == nil or (named ~= "iso" and named ~= "millis" and named ~= "second"))
      and tokens(named or p, format, false) or nil
    if toks and k == 1 then tokens(named or p, format, true) end
    if k == 1 then
      if named == "iso" then printer = dates.format
      elseif named == "millis" then printer = function(ms) return string.format("%d", ms) end
      elseif named == "second" then
        printer = function(ms)
          local s = math.floor(ms / 1000)
          local rem = ms - s * 1000
          if rem == 0 then return string.format("%d", s) end
          return (string.format("%d.%03d", s, rem):gsub("0+$", ""))
        end
      else
        printer = function(ms)
          local days = math.floor(ms / 86400000)
          local rem = ms - days * 86400000
          local y, mo, d = dates.civil_from_days(days)
          local f = { y = y, M = mo, d = d, H = math.floor(rem / 3600000), m = math.floor(rem % 3600000 / 60000),
            s = math.floor(rem % 60000 / 1000) }
          local buf = {}
          for _, t in ipairs(toks) do
            if type(t) == "string" then buf[#buf + 1] = t
            else
              local c, w = t[1], t[2]
              if c == "S" then buf[#buf + 1] = (pad(math.floor(rem % 1000), 3) .. "000000"):sub(1, w)
              elseif c == "y" and w == 2 then buf[#buf + 1] = pad(f.y % 100, 2)
              elseif c == "M" and w >= 3 then buf[#buf + 1] = w == 3 and MONTHS[mo]:sub(1, 3) or MONTHS[mo]
              else buf[#buf + 1] = pad(f[c], w) end
            end
          end
          return table.concat(buf)
        end
      end
    end
  end
  return printer
end

-- Values ----------------------------------------------------------------------------------

local INTEGRAL = { long = true, integer = true, short = true, byte = true, unsigned_long = true }
local FLOATING = { double = true, float = true, half_float = true, scaled_float = true }
local STRINGS = { keyword = true, text = true, match_only_text = true, wildcard = true, constant_keyword = true }

local function as_bool(v)
  if v == true or v == "true" then return true end
  if v == false or v == "false" or v == "" then return false end
end

local function instant(v)
  if type(v) == "number" then return v end
  return dates.parse(v)
end

-- One value as the field type presents it (nil: left out).
local function present(ty, v, printer)
  if type(v) == "table" then return nil end  -- an object where a value was expected
  if STRINGS[ty] then return mapping.java_string(v) end
  if INTEGRAL[ty] then
    local x = tonumber(v)
    if not x then return nil end
    return x < 0 and math.ceil(x) or math.floor(x)
  end
  if FLOATING[ty] then
    local x = tonumber(v)
    return x and json.float(x) or nil
  end
  if ty == "boolean" then return as_bool(v) end
  if ty == "ip" then
    local b = mapping.ip_bytes(tostring(v))
    return b and mapping.ip_format(b) or nil
  end
  if mapping.is_date(ty) then
    local ms = instant(v)
    return ms and printer(ms) or nil
  end
  return v
end

-- The index's mapped field names that a pattern names (objects are not fields).
local function matching(types, pattern)
  if not pattern:find("*", 1, true) then
    local ty = types[pattern]
    if ty and ty ~= "object" and ty ~= "nested" then return { pattern } end
    return {}
  end
  local pat, out = names.glob_to_pattern(pattern), {}
  for path, ty in pairs(types) do
    if ty ~= "object" and ty ~= "nested" and path:match(pat) then out[#out + 1] = path end
  end
  table.sort(out)
  return out
end

local function field_fail(idx, reason, status, etype)
  error(errors.search_phase(idx.name, errors.new(status or 400, etype or "illegal_argument_exception", reason)), 0)
end

-- The metadata fields of an ES 8 index, for "fields": those whose value a hit can show, and
-- those whose field type has no value fetcher ("Cannot fetch values for internal field").
local META_FIELDS = { _id = true, _index = true, _version = true, _routing = true, _ignored = true,
  _source = "internal", _seq_no = "internal", _field_names = "internal", _tier = "internal" }
local META_VALUE = {
  _id = function(rec) return rec.id end,
  _index = function(rec, idx_name) return idx_name end,
  _version = function(rec) return rec.version end,
  _routing = function(rec) return rec.routing end,
  _ignored = function() return nil end,
}

local function no_format(idx, path, ty, format)
  if format ~= nil and not mapping.is_date(ty) then
    field_fail(idx, "Field [" .. path .. "] of type [" .. ty .. "] doesn't support formats.")
  end
end

local function printer_for(idx, ty, path, format)
  if not mapping.is_date(ty) then return nil end
  local ok, p = pcall(_M.date_printer, format or mapping.format_of(idx.types, path) or mapping.default_format(ty))
  if not ok then
    if errors.is(p) then error(errors.search_phase(idx.name, p), 0) end
    error(p, 0)
  end
  return p
end

-- What an index's shard fetches for "fields" (list) and "docvalue_fields" (dv): the resolved
-- fields with their printers; raises the shard's failure (a format the field does not take,
-- a text field without field data among docvalue_fields, too many docvalue_fields).
-- stored: stored_fields' names and patterns (without _source / _none_): the fields mapped
-- with "store": true among them.
function _M.plan(idx, list, dv, stored)
  local plan = { fields = {}, unmapped = {}, dv = {}, stored = {}, meta = {} }
  for _, name in ipairs(stored or {}) do
    for _, path in ipairs(matching(idx.types, name)) do
      if mapping.stored(idx.types, path) then
        local ty = idx.types[path]
        plan.stored[#plan.stored + 1] = { path = path, ty = ty, printer = printer_for(idx, ty, path, nil) }
      end
    end
  end
  for _, f in ipairs(list or {}) do
    -- a metadata field named exactly (patterns never match them): ES 8's value fetchers
    -- return _id, _index, _version and _routing (_ignored: esxd keeps none); the others'
    -- throw, the shard's failure
    local meta = META_FIELDS[f.field]
    if meta == "internal" then
      field_fail(idx, "Cannot fetch values for internal field [" .. f.field .. "].", 500, "unsupported_operation_exception")
    elseif meta then
      plan.meta[#plan.meta + 1] = f.field
    end
    for _, path in ipairs(matching(idx.types, f.field)) do
      local ty = idx.types[path]
      no_format(idx, path, ty, f.format)
      plan.fields[#plan.fields + 1] = { path = path, ty = ty, printer = printer_for(idx, ty, path, f.format) }
    end
    if f.include_unmapped then plan.unmapped[#plan.unmapped + 1] = names.glob_to_pattern(f.field) end
  end
  local dvs = {}
  for _, f in ipairs(dv or {}) do
    for _, path in ipairs(matching(idx.types, f.field)) do dvs[#dvs + 1] = { path = path, format = f.format } end
  end
  local limit = idx.max_docvalue_fields_search or 100
  if #dvs > limit then
    field_fail(idx, "Trying to retrieve too many docvalue_fields. Must be less than or equal to: [" .. limit ..
      "] but was [" .. #dvs .. "]. This limit can be set by changing the [index.max_docvalue_fields_search] index level setting.")
  end
  for _, f in ipairs(dvs) do
    local ty = idx.types[f.path]
    local fd = mapping.fielddata_error(idx.types, f.path)
    if fd == "text" then
      field_fail(idx, "Fielddata is disabled on [" .. f.path .. "] in [" .. idx.name .. "]. Text fields are not optimised for operations that require per-document field data like aggregations and sorting, so these operations are disabled by default. Please use a keyword field instead. Alternatively, set fielddata=true on [" .. f.path .. "] in order to load field data by uninverting the inverted index. Note that this can use significant memory.")
    elseif fd then
      field_fail(idx, fd)
    end
    -- a number's format is a java.text.DecimalFormat pattern (DocValueFormat.Decimal)
    local number_printer
    if f.format ~= nil and mapping.NUMERIC[ty] then
      local ok, pr = pcall(decimal_format.printer, f.format)
      if not ok then
        if errors.is(pr) then field_fail(idx, pr.reason, pr.status, pr.type) end
        error(pr, 0)
      end
      number_printer = pr
    else
      no_format(idx, f.path, ty, f.format)
    end
    plan.dv[#plan.dv + 1] = { path = f.path, ty = ty, printer = number_printer or printer_for(idx, ty, f.path, f.format),
      number_format = number_printer ~= nil }
  end
  return plan
end

-- The unmapped leaf values of a document, by dotted path (arrays flattened, nulls left out).
local function leaves(node, prefix, out)
  if type(node) ~= "table" or node == null then
    if node ~= null and node ~= nil then
      local l = out[prefix]
      if not l then l = {}; out[prefix] = l; out[#out + 1] = prefix end
      l[#l + 1] = node
    end
    return
  end
  if #node > 0 or json.is_array(node) then
    for _, e in ipairs(node) do leaves(e, prefix, out) end
    return
  end
  for k, v in pairs(node) do leaves(v, prefix and (prefix .. "." .. k) or k, out) end
end

local function mapped_above(types, path)
  local p = path
  while true do
    local ty = types[p]
    if ty and ty ~= "object" and ty ~= "nested" then return true end
    p = p:match("^(.*)%.[^%.]+$")
    if not p then return false end
  end
end

local function sorted_unique(vals, cmp, unique)
  table.sort(vals, cmp)
  if not unique then return vals end
  local out = {}
  for _, v in ipairs(vals) do if out[#out] ~= v then out[#out + 1] = v end end
  return out
end

-- The hit's "fields" object, or nil when it has none (ES leaves the key out then).
-- idx_name: the hit's index (for "_index").
function _M.fetch(plan, rec, types, idx_name)
  local res, any = json.obj(), false
  local function put(path, arr)
    if #arr > 0 and json.get(res, path) == nil then json.set(res, path, arr); any = true end
  end
  for _, name in ipairs(plan.meta or {}) do
    local v = META_VALUE[name](rec, idx_name)
    if v ~= nil then put(name, json.array({ v })) end
  end
  -- stored fields first (StoredFieldsPhase), as the values the field stored; then fields
  for _, list in ipairs{ plan.stored, plan.fields } do
    for _, f in ipairs(list) do
      local arr = json.array()
      for _, v in ipairs(mapping.values(rec.source, f.path, types, true)) do
        local x = present(f.ty, v, f.printer)
        if x ~= nil then arr[#arr + 1] = x end
      end
      put(f.path, arr)
    end
  end
  if #plan.unmapped > 0 then
    local all = {}
    leaves(rec.source, nil, all)
    for _, path in ipairs(all) do
      if not mapped_above(types, path) then
        for _, pat in ipairs(plan.unmapped) do
          if path:match(pat) then
            local arr = json.array()
            for _, v in ipairs(all[path]) do arr[#arr + 1] = v end
            put(path, arr)
            break
          end
        end
      end
    end
  end
  for _, f in ipairs(plan.dv) do
    local vals, ty = {}, f.ty
    for _, v in ipairs(mapping.values(rec.source, f.path, types)) do
      if ty == "text" then
        for _, t in ipairs(mapping.tokens(v)) do vals[#vals + 1] = t end
      elseif type(v) ~= "table" then
        if INTEGRAL[ty] or FLOATING[ty] then
          local x = tonumber(v)
          if x and INTEGRAL[ty] then x = x < 0 and math.ceil(x) or math.floor(x) end
          vals[#vals + 1] = x
        elseif mapping.is_date(ty) then vals[#vals + 1] = instant(v)
        elseif ty == "boolean" then local b = as_bool(v); if b ~= nil then vals[#vals + 1] = b and 1 or 0 end
        elseif ty == "ip" then vals[#vals + 1] = mapping.ip_bytes(tostring(v)) or nil
        else vals[#vals + 1] = mapping.java_string(v) end
      end
    end
    -- SORTED_SET doc values (keywords, ips, text field data) hold each value once;
    -- SORTED_NUMERIC ones every value
    vals = sorted_unique(vals, nil, not (INTEGRAL[ty] or FLOATING[ty] or mapping.is_date(ty) or ty == "boolean"))
    local arr = json.array()
    for _, x in ipairs(vals) do
      if f.number_format then x = f.printer(x)
      elseif FLOATING[ty] then x = json.float(x)
      elseif mapping.is_date(ty) then x = f.printer(x)
      elseif ty == "boolean" then x = x == 1
      elseif ty == "ip" then x = mapping.ip_format(x) end
      arr[#arr + 1] = x
    end
    put(f.path, arr)
  end
  return any and res or nil
end

return _M
