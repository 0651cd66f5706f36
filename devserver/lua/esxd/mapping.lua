-- esxd.mapping: per-index field types (explicit mappings from index creation plus ES-style
-- dynamic mapping on first sight) and field value extraction from _source.
-- Dynamic rules as in ES: boolean -> boolean, integer -> long, fraction -> float,
-- date-looking string -> date, other string -> text with a ".keyword" keyword sub-field.
local dates = require "esxd.dates"
local json = require "esxd.json"

local _M = {}
local null = json.null

-- Field types Elasticsearch knows (core and bundled modules). esxd implements the common ones
-- (see README); any other name is ES's mapper_parsing_exception at index creation.
local ES_TYPES = {}
for t in ([[binary boolean keyword constant_keyword wildcard long integer short byte double float
  half_float scaled_float unsigned_long date date_nanos alias object flattened nested join integer_range
  float_range long_range double_range date_range ip_range ip version murmur3 aggregate_metric_double
  histogram text match_only_text annotated_text completion search_as_you_type token_count dense_vector
  sparse_vector rank_feature rank_features geo_point geo_shape point shape percolator semantic_text
  counted_keyword passthrough]]):gmatch("%S+") do ES_TYPES[t] = true end

-- Calls fn(sub, type) for each multi-field of def (its "fields") that declares a type; the
-- first call returning a value ends the walk, and each_field returns what it returned.
local function each_field(def, fn)
  if type(def.fields) ~= "table" then return nil end
  for sub, sdef in pairs(def.fields) do
    if type(sdef) == "table" and type(sdef.type) == "string" then
      local a, b = fn(sub, sdef.type)
      if a ~= nil then return a, b end
    end
  end
end

-- The parameters each field type's mapper takes (ES 8's FieldMapper.Builder getParameters(),
-- plus "type", "fields" and "copy_to", which every field mapper parses). Types not listed
-- here are not checked.
local function set_of(s)
  local t = { type = true, fields = true, copy_to = true, synthetic_source_keep = true }
  for w in s:gmatch("%S+") do t[w] = true end
  return t
end
local NUMBER_PARAMS = set_of([[index doc_values store ignore_malformed coerce null_value script
  on_script_error meta time_series_dimension time_series_metric]])
local DATE_PARAMS = set_of([[index doc_values store format locale null_value ignore_malformed script
  on_script_error meta]])
local PARAMS = {
  keyword = set_of([[index doc_values store null_value eager_global_ordinals ignore_above index_options
    norms similarity normalizer split_queries_on_whitespace script on_script_error meta
    time_series_dimension]]),
  text = set_of([[analyzer search_analyzer search_quote_analyzer index store index_options index_phrases
    index_prefixes norms term_vector position_increment_gap similarity eager_global_ordinals fielddata
    fielddata_frequency_filter meta]]),
  long = NUMBER_PARAMS, integer = NUMBER_PARAMS, short = NUMBER_PARAMS, byte = NUMBER_PARAMS,
  double = NUMBER_PARAMS, float = NUMBER_PARAMS, half_float = NUMBER_PARAMS,
  scaled_float = set_of([[index doc_values store ignore_malformed coerce null_value meta scaling_factor
    time_series_dimension time_series_metric]]),
  unsigned_long = set_of([[index doc_values store ignore_malformed null_value meta time_series_dimension
    time_series_metric]]),
  date = DATE_PARAMS, date_nanos = DATE_PARAMS,
  boolean = set_of([[index doc_values store null_value script on_script_error meta ignore_malformed
    time_series_dimension]]),
  ip = set_of([[index doc_values store ignore_malformed null_value script on_script_error meta
    time_series_dimension]]),
  binary = set_of("doc_values store meta"),
}
-- ObjectMapper / NestedObjectMapper / RootObjectMapper: what they consume; anything left is
-- MappingParser.checkNoRemainingFields's error.
local OBJECT_PARAMS = { type = true, properties = true, dynamic = true, enabled = true, subobjects = true,
  store_array_source = true, synthetic_source_keep = true }
local NESTED_PARAMS = { include_in_parent = true, include_in_root = true }
for k in pairs(OBJECT_PARAMS) do NESTED_PARAMS[k] = true end
local ROOT_PARAMS = { date_detection = true, numeric_detection = true, dynamic_date_formats = true,
  date_formats = true, dynamic_templates = true, runtime = true }
for k in pairs(OBJECT_PARAMS) do if k ~= "type" then ROOT_PARAMS[k] = true end end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do if type(k) == "string" then keys[#keys + 1] = k end end
  table.sort(keys)
  return keys
end
_M.sorted_keys = sorted_keys -- (the string keys of t, sorted: mapping_update.lua too)

-- A decoded JSON value as Java's toString prints the parsed map (Map {k=v, ...}, List [a, b]).
local function java_string(v)
  if v == null then return "null" end
  if type(v) == "number" and math.floor(v) == v and math.abs(v) < 2 ^ 53 then
    return string.format("%d", v)
  end
  if type(v) ~= "table" then return tostring(v) end
  local parts = {}
  if #v > 0 then
    for _, e in ipairs(v) do parts[#parts + 1] = java_string(e) end
    return "[" .. table.concat(parts, ", ") .. "]"
  end
  for _, k in ipairs(sorted_keys(v)) do parts[#parts + 1] = k .. "=" .. java_string(v[k]) end
  return "{" .. table.concat(parts, ", ") .. "}"
end
_M.java_string = java_string

-- "Mapping definition for [x] has unsupported parameters:  [k : v]" (two spaces, as ES). At
-- the root, "_" keys are metadata fields (_source, _routing, _meta, ...), not checked here.
local function remaining(prefix, def, allowed)
  local out = {}
  for _, k in ipairs(sorted_keys(def)) do
    if not allowed[k] and not (allowed == ROOT_PARAMS and k:sub(1, 1) == "_") then
      out[#out + 1] = " [" .. k .. " : " .. java_string(def[k]) .. "]"
    end
  end
  if #out > 0 then return prefix .. " has unsupported parameters: " .. table.concat(out) end
end

-- The field mapper's parameter check (FieldMapper.Builder.parse): nil, or ES's message.
local function field_params(name, def, ty)
  local allowed = PARAMS[ty]
  if not allowed then return nil end
  for _, k in ipairs(sorted_keys(def)) do
    if k == "boost" then return "Unknown parameter [boost] on mapper [" .. name .. "]" end
    if not allowed[k] then
      return "unknown parameter [" .. k .. "] on mapper [" .. name .. "] of type [" .. ty .. "]"
    end
  end
  if type(def.fields) == "table" then
    for _, sub in ipairs(sorted_keys(def.fields)) do
      local sdef = def.fields[sub]
      if type(sdef) == "table" and type(sdef.type) == "string" then
        local msg = field_params(sub, sdef, sdef.type)
        if msg then return msg end
      end
    end
  end
end

-- A date field's "format" that esxd's date parser does not read (or no format at all): ES
-- would parse dates with it (or refuse a pattern Java does not take); esxd refuses it rather
-- than read such a field's dates with the default format.
-- (what: where the format is, by default "field [name]")
local function date_format_error(name, def, ty, what)
  if (ty ~= "date" and ty ~= "date_nanos") or def.format == nil then return nil end
  local f = def.format
  if type(f) ~= "string" or f:match("^[%s|]*$") or _M.parts_take("", f) == nil then
    return "esxd does not implement the date format [" .. java_string(f) .. "] of " .. (what or "field [" .. name .. "]") .. ": its " ..
      "date parser reads strict_date_optional_time, date_optional_time, strict_date_optional_time_nanos, " ..
      "yyyy/MM/dd, yyyy/MM/dd HH:mm:ss, epoch_millis and epoch_second (joined with ||) only"
  end
end

-- ES's reason for a field named "" (ObjectMapper.TypeParser for mappings, the document
-- parser's DotExpandingXContentParser for documents), an IllegalArgumentException.
_M.EMPTY_NAME = "field name cannot be an empty string"

local properties_error
-- Returns nil, or the reason of ES's mapper_parsing_exception for mappings ES refuses (the
-- part after "Failed to parse mapping: "): a field type ES does not know, a parameter the
-- field's mapper does not take, an object or root mapping key ES does not know, a field
-- named "". The type of ES's cause as second value when it is no mapper_parsing_exception.
function _M.mapping_error(mappings)
  if type(mappings) ~= "table" then return nil end
  local msg = properties_error(mappings.properties)
  if msg then return msg, (msg == _M.EMPTY_NAME or msg == _M.BLANK_NAME) and "illegal_argument_exception" or nil end
  msg = select(2, _M.dynamic_date_formats(mappings)) or _M.templates_error(mappings.dynamic_templates)
  if msg then return msg end
  return remaining("Root mapping definition", mappings, ROOT_PARAMS)
end

properties_error = function(props)
  if type(props) ~= "table" then return nil end
  for _, name in ipairs(sorted_keys(props)) do
    local def = props[name]
    if name == "" then return _M.EMPTY_NAME end
    if _M.is_blank(name) then return _M.BLANK_NAME end
    if type(def) == "table" then
      local ty = def.type
      if type(ty) == "string" and not ES_TYPES[ty] then
        return "No handler for type [" .. ty .. "] declared on field [" .. name .. "]"
      end
      if ty == nil or ty == "object" or ty == "nested" then
        local msg = properties_error(def.properties)
          or remaining("Mapping definition for [" .. name .. "]", def, ty == "nested" and NESTED_PARAMS or OBJECT_PARAMS)
        if msg then return msg end
      else
        local sub, sty = each_field(def, function(s, t) if not ES_TYPES[t] then return s, t end end)
        if sub then return "No handler for type [" .. sty .. "] declared on field [" .. sub .. "]" end
        local msg = field_params(name, def, ty) or date_format_error(name, def, ty)
          or each_field(def, function(sub, sty) return date_format_error(sub, def.fields[sub], sty) end)
        if msg then return msg end
      end
    end
  end
end

-- "ignore_above" of keyword fields (explicit, and ES's 256 on a dynamic text field's
-- "keyword" sub-field), by types table: longer strings are kept in _source only.
local ignore_above_by_types = setmetatable({}, { __mode = "k" })
-- objects mapped with "enabled": false (ES skips whatever they hold), by types table
local disabled_by_types = setmetatable({}, { __mode = "k" })
function _M.register_disabled(types, disabled) disabled_by_types[types] = disabled end
-- the other per-field registries (defined with their users below)
local formats_by_types, malformed_by_types, copy_from_by_types, null_values_by_types
function _M.register_ignore_above(types, limits) ignore_above_by_types[types] = limits end
-- the explicit (or template-made) mapping of each leaf field and multi-field, by types
-- table and path, for the parameters read at search time (index, doc_values, fielddata, coerce)
local defs_by_types = setmetatable({}, { __mode = "k" })
function _M.register_defs(types, defs) defs_by_types[types] = defs end

-- A dynamic text field's "keyword" sub-field (ES's default dynamic template for strings).
local function dynamic_keyword(types, path)
  types[path .. ".keyword"] = "keyword"
  local limits = ignore_above_by_types[types]
  if limits then limits[path .. ".keyword"] = 256 end
end

-- Load explicit "properties" into the flat types table (and, when formats is given, the
-- date fields' "format" strings into formats, the objects' "dynamic" settings into
-- dynamic, the fields' "ignore_malformed" into malformed, their "copy_to" into
-- copy_from: target path -> list of source paths, and their "null_value" into null_values).
function _M.load(types, props, prefix, formats, dynamic, malformed, copy_from, null_values)
  if type(props) ~= "table" then return end
  for name, def in pairs(props) do
    if type(def) == "table" then
      local path = prefix and (prefix .. "." .. name) or name
      -- a dotted name ("a.b") is an object path in mappings too: a is an object
      if type(name) == "string" and name:find(".", 1, true) then
        local at = prefix
        for part in name:gmatch("([^%.]+)%.") do
          at = at and (at .. "." .. part) or part
          if types[at] == nil then types[at] = "object" end
        end
      end
      if dynamic and def.dynamic ~= nil then dynamic[path] = def.dynamic end
      if dynamic and def.enabled == false then dynamic[path] = false end -- not parsed at all
      if def.enabled == false and disabled_by_types[types] then disabled_by_types[types][path] = true end
      if def.properties then
        types[path] = def.type or "object"
        _M.load(types, def.properties, path, formats, dynamic, malformed, copy_from, null_values)
      elseif type(def.type) == "string" then
        types[path] = def.type
        if formats and type(def.format) == "string" then formats[path] = def.format end
        if malformed and def.ignore_malformed ~= nil then malformed[path] = def.ignore_malformed end
        if null_values and def.null_value ~= nil and def.null_value ~= null then null_values[path] = def.null_value end
        if copy_from and def.copy_to ~= nil then
          for _, t in ipairs(type(def.copy_to) == "table" and def.copy_to or { def.copy_to }) do
            if type(t) == "string" then
              copy_from[t] = copy_from[t] or {}
              table.insert(copy_from[t], path)
            end
          end
        end
        each_field(def, function(sub, ty) types[path .. "." .. sub] = ty end)
        local defs = defs_by_types[types]
        if defs then
          defs[path] = def
          each_field(def, function(sub) defs[path .. "." .. sub] = def.fields[sub] end)
        end
        local limits = ignore_above_by_types[types]
        if limits then
          if tonumber(def.ignore_above) then limits[path] = tonumber(def.ignore_above) end
          for sub, sdef in pairs(type(def.fields) == "table" and def.fields or {}) do
            if type(sdef) == "table" and tonumber(sdef.ignore_above) then
              limits[path .. "." .. sub] = tonumber(sdef.ignore_above)
            end
          end
        end
      end
    end
  end
end

local date_fits
-- A root mapping's "dynamic_date_formats" (or its old name "date_formats") as
-- RootObjectMapper reads it: a list of formats, "none" (no date detection) or one format;
-- nil when not given. An error message (ES's, or esxd's for a format its date parser does
-- not read) as second value.
function _M.dynamic_date_formats(mappings)
  local v = mappings.dynamic_date_formats
  if v == nil then v = mappings.date_formats end
  if v == nil or v == null then return nil end
  local list = {}
  if type(v) == "table" and (#v > 0 or json.is_array(v)) then
    for i, f in ipairs(v) do
      list[i] = type(f) == "number" and java_string(f) or tostring(f)
      if list[i]:sub(1, 6) == "epoch_" then return nil, "Epoch [" .. list[i] .. "] is not supported as dynamic date format" end
    end
  elseif tostring(v) ~= "none" then
    list[1] = type(v) == "table" and java_string(v) or tostring(v)
  end
  for _, f in ipairs(list) do
    if f == "" or _M.parts_take("", f) == nil then
      return nil, nil, "esxd does not implement the date format [" .. f .. "] in [dynamic_date_formats]: its " ..
        "date parser reads strict_date_optional_time, date_optional_time, yyyy/MM/dd, yyyy/MM/dd HH:mm:ss, " ..
        "epoch_millis and epoch_second (joined with ||) only"
    end
  end
  return list
end

-- "dynamic_date_formats" by types table (nil: ES's defaults)
local date_formats_by_types = setmetatable({}, { __mode = "k" })
function _M.register_date_formats(types, list) date_formats_by_types[types] = list end

local function is_number_text(v)
  if v:match("^[%+%-]?%d+$") and tonumber(v) and math.abs(tonumber(v)) < 2 ^ 63 then return true end
  local d = v:match("^%s*(.-)%s*$"):gsub("[fFdD]$", "")
  return (d:match("^[%+%-]?%d*%.?%d*[eE]?[%+%-]?%d*$") and d:match("%d") and tonumber(d))
    or d:match("^[%+%-]?Infinity$") or d == "NaN"
end

-- no_dates: the index's mappings say "date_detection": false (strings are text, whatever
-- they look like). numeric: "numeric_detection": true, after date detection (ES's
-- DocumentParser): a string Long.parseLong reads is a long, one Double.parseDouble reads a float.
-- dformats: the index's dynamic_date_formats, tried in turn on strings that are no numbers;
-- a date's second value is the format that read it (nil: ES's default format).
-- text: a number's JSON text (number_texts), when known: ES's parser gives 1.0 and 1e2
-- (floating point tokens) a float field, 99999999999999999999 (a big integer) a long one.
local function infer(v, no_dates, numeric, dformats, text)
  local t = type(v)
  if t == "boolean" then return "boolean" end
  if t == "number" then
    if text then return text:find("[.eE]") and "float" or "long" end
    return (math.floor(v) == v) and "long" or "float"
  end
  if t == "string" then
    if not no_dates and dformats then
      if not is_number_text(v) then
        for _, f in ipairs(dformats) do
          if _M.parts_take(v, f) and date_fits(v, f) then
            return "date", f ~= _M.default_format("date") and f or nil
          end
        end
      end
    elseif not no_dates and dates.looks_like_date(v) and dates.parse(v) then
      return "date", dates.is_slash(v) and dates.SLASH_FORMAT or nil
    end
    if numeric then
      if v:match("^[%+%-]?%d+$") and tonumber(v) and math.abs(tonumber(v)) < 2 ^ 63 then return "long" end
      local d = v:match("^%s*(.-)%s*$"):gsub("[fFdD]$", "")
      if d:match("^[%+%-]?%d*%.?%d*[eE]?[%+%-]?%d*$") and d:match("%d") and tonumber(d)
          or d:match("^[%+%-]?Infinity$") or d == "NaN" then
        return "float"
      end
    end
    return "text"
  end
  return nil
end

-- "numeric_detection": true, by types table
local numeric_by_types = setmetatable({}, { __mode = "k" })
function _M.register_numeric_detection(types, on) numeric_by_types[types] = on or nil end

-- The "dynamic" setting in force for new fields of the object at prefix (nil: the root):
-- the nearest object's own setting, else the root mapping's ("" in dynamic).
local function dynamic_of(dynamic, prefix)
  while prefix do
    if dynamic[prefix] ~= nil then return dynamic[prefix] end
    prefix = prefix:match("^(.*)%.[^%.]*$")
  end
  return dynamic[""]
end

-- New fields are not mapped where "dynamic" is false (or the object is "enabled": false):
-- Elasticsearch keeps them in _source only, so they cannot be searched or aggregated.
local function maps_new(dynamic, prefix)
  if dynamic == nil or next(dynamic) == nil then return true end
  local d = dynamic_of(dynamic, prefix)
  return d ~= false and d ~= "false"
end

-- Record types of fields first seen in this document (dynamic: the index's "dynamic"
-- settings by object path, as mapping.load fills them; nil: all true).
-- "dynamic_templates" of the root mapping, by types table (a list as given).
local templates_by_types = setmetatable({}, { __mode = "k" })
function _M.register_templates(types, templates) templates_by_types[types] = templates end

-- Regex.simpleMatch: "*" wildcards; pattern may be a list (any of them).
local function simple_match(pattern, s)
  if type(pattern) == "table" then
    for _, p in ipairs(pattern) do if simple_match(p, s) then return true end end
    return false
  end
  if type(pattern) ~= "string" then return false end
  return s:match("^" .. pattern:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", ".*") .. "$") ~= nil
end

-- The match_mapping_type name of a dynamically detected type.
local MATCH_TYPE = { text = "string", long = "long", float = "double", boolean = "boolean", date = "date" }

-- The first dynamic template matching a new leaf field (ES's RootObjectMapper.findTemplate):
-- its mapping, or nil. match_pattern "regex" (Java regular expressions) is not supported:
-- such templates never match.
local function template_for(types, path, name, ty)
  local list = templates_by_types[types]
  if type(list) ~= "table" then return nil end
  for _, entry in ipairs(list) do
    local _, t = next(type(entry) == "table" and entry or {})
    if type(t) == "table" and type(t.mapping) == "table" and t.match_pattern ~= "regex" then
      local mmt = t.match_mapping_type
      local ok = mmt == nil or mmt == "*" or mmt == MATCH_TYPE[ty]
        or (type(mmt) == "table" and (simple_match(mmt, MATCH_TYPE[ty] or "") or simple_match(mmt, "*")))
      ok = ok and (t.match == nil or simple_match(t.match, name))
        and (t.unmatch == nil or not simple_match(t.unmatch, name))
        and (t.path_match == nil or simple_match(t.path_match, path))
        and (t.path_unmatch == nil or not simple_match(t.path_unmatch, path))
      if t.unmatch_mapping_type ~= nil and simple_match(t.unmatch_mapping_type, MATCH_TYPE[ty] or "") then ok = false end
      if ok then return t.mapping end
    end
  end
end

-- A dynamic template whose mapping can make a date field with a format esxd's date parser
-- does not read: esxd's reason for refusing the mappings (as for an explicit date field's
-- format; ES would map new fields with it), or nil. A template maps dates when its type is
-- date / date_nanos, or is left out or "{dynamic_type}" and its match_mapping_type takes
-- "date".
function _M.templates_error(list)
  if type(list) ~= "table" then return nil end
  for _, entry in ipairs(list) do
    local tname, t = next(type(entry) == "table" and entry or {})
    local m = type(t) == "table" and t.mapping
    if type(m) == "table" and type(tname) == "string" then
      local what = "dynamic template [" .. tname .. "]"
      local ty = m.type
      local mmt = t.match_mapping_type
      local dates = (mmt == nil or simple_match(mmt, "date") or simple_match(mmt, "*") or mmt == "*")
        and not (t.unmatch_mapping_type ~= nil and simple_match(t.unmatch_mapping_type, "date"))
      if ty == nil or (type(ty) == "string" and ty:find("{dynamic_type}", 1, true)) then ty = dates and "date" or nil end
      local msg = type(ty) == "string" and date_format_error(tname, m, ty, what)
        or each_field(m, function(sub, sty) return date_format_error(sub, m.fields[sub], sty, what) end)
      if msg then return msg end
    end
  end
end

-- The mappings dynamic templates made, by types table and path (for GET _mapping).
local template_defs_by_types = setmetatable({}, { __mode = "k" })
function _M.template_def(types, path)
  local d = template_defs_by_types[types]
  return d and d[path]
end

-- Map a new leaf field (name: its key, path: its full path) for the value v: a matching
-- dynamic template's mapping ("{name}" / "{dynamic_type}" replaced), else ES's defaults.
local function map_new(types, path, name, v, no_dates, text)
  local ty, dformat = infer(v, no_dates, numeric_by_types[types], date_formats_by_types[types], text)
  if not ty then return end
  local def = template_for(types, path, name, ty)
  if def then
    local function subst(x)
      if type(x) == "string" then return (x:gsub("{name}", name):gsub("{dynamic_type}", ty)) end
      if type(x) ~= "table" or x == null then return x end
      local c = {}
      for k2, e in pairs(x) do c[k2] = subst(e) end
      return c
    end
    def = subst(def)
    if def.type == nil then def.type = ty end
    -- the template's date mapper is parsed with the detected date format as its default
    -- (DocumentParserContext.dynamicTemplateParserContext): a slash date keeps its format
    if ty == "date" and dformat and _M.is_date(def.type) and def.format == nil then def.format = dformat end
    if def.type ~= "object" and def.type ~= "nested" and def.properties == nil then
      local prefix = #path > #name and path:sub(1, #path - #name - 1) or nil
      _M.load(types, { [name] = def }, prefix, formats_by_types[types], nil,
        malformed_by_types[types], copy_from_by_types[types], null_values_by_types[types])
      template_defs_by_types[types] = template_defs_by_types[types] or {}
      template_defs_by_types[types][path] = def
      return
    end
  end
  types[path] = ty
  if ty == "text" then dynamic_keyword(types, path) end
  if ty == "date" and dformat then
    -- detected by the second default dynamic date format, or one of the index's
    -- dynamic_date_formats: the field has it as its format
    local formats = formats_by_types[types]
    if formats then formats[path] = dformat end
    template_defs_by_types[types] = template_defs_by_types[types] or {}
    template_defs_by_types[types][path] = { type = "date", format = dformat }
  end
end

-- A document's dotted field name ("a.b": 1) is an object path, as ES's
-- DotExpandingXContentParser reads it: {"a": {"b": 1}}. Returns that one-key object for a
-- name with a dot, or nil (names ES refuses, such as ".a" or "a..b", are dotted_name_error's).
local function expand_dotted(k, v)
  if type(k) ~= "string" or not k:find(".", 1, true) then return nil end
  local head, tail = k:match("^([^%.]+)%.(.*)$")
  if not head or _M.dotted_name_error(k) then return nil end
  tail = tail:gsub("%.+$", "")  -- (Java's split drops trailing empty parts: "a.b." is a.b)
  if tail == "" then return { [head] = v } end
  return { [head] = { [tail] = v } }
end

-- ES's reason (DotExpandingXContentParser.splitAndValidatePath, an IllegalArgumentException)
-- for a dotted field name it cannot split into object names, or nil.
function _M.dotted_name_error(k)
  if not k:find(".", 1, true) then return nil end
  local parts = {}
  for part in (k .. "."):gmatch("([^%.]*)%.") do parts[#parts + 1] = part end
  while #parts > 0 and parts[#parts] == "" do parts[#parts] = nil end
  if #parts == 0 then return "field name cannot contain only dots" end
  for _, part in ipairs(parts) do
    if part == "" then return "field name cannot contain only whitespace: ['" .. k .. "']" end
    if _M.is_blank(part) then
      return "field name starting or ending with a [.] makes object resolution ambiguous: [" .. k .. "]"
    end
  end
end

-- conflict (a table, or nil): the first new field of this document that an array gives
-- both an object and a value is recorded there ({path=, first=: the type the earlier element
-- mapped, "object" or a leaf type, second=: the later one's}); types must then be a scratch
-- layer over the index's types (rawget tells the fields this document mapped).
-- texts: number_texts of the document (or nil), seen: how many numbers of each path were
-- met (as check takes them). With conflict, each field mapped by a value is listed in
-- conflict.created ({path=, value=, text=}), for new_value_error.
local function learn(types, obj, prefix, no_dates, dynamic, conflict, texts, seen)
  local new_ok = maps_new(dynamic, prefix)
  if texts and not seen then seen = {} end
  local function text_of(path, e)
    if not texts or type(e) ~= "number" or not texts[path] then return nil end
    local n = (seen[path] or 0) + 1
    seen[path] = n
    return texts[path][n]
  end
  local function new_leaf(path, k, e)
    local text = text_of(path, e)
    if types[path] ~= nil then return end
    map_new(types, path, k, e, no_dates, text)
    if conflict and types[path] ~= nil then
      conflict.created = conflict.created or {}
      table.insert(conflict.created, { path = path, value = e, text = text })
    end
  end
  for k, v in pairs(obj) do
    local expanded = expand_dotted(k, v)
    if expanded then
      learn(types, expanded, prefix, no_dates, dynamic, conflict, texts, seen)
    elseif type(k) == "string" then
      local path = prefix and (prefix .. "." .. k) or k
      if types[path] == nil and not new_ok then
        -- unmapped, and not mapped now: kept in _source only (nor is anything under it)
      elseif type(v) == "table" and v ~= null then
        if #v > 0 or json.is_array(v) then
          -- ES flattens arrays of arrays: [[], 1] holds one long
          local flat = {}
          local function flatten(a)
            for _, e in ipairs(a) do
              if type(e) == "table" and e ~= null and (#e > 0 or json.is_array(e)) then flatten(e)
              else flat[#flat + 1] = e end
            end
          end
          flatten(v)
          for _, e in ipairs(flat) do
            local mine = conflict and not conflict.path and rawget(types, path)
            if type(e) == "table" then
              if mine and mine ~= "object" then
                conflict.path, conflict.first, conflict.second = path, mine, "object"
              end
              if types[path] == nil then types[path] = "object" end
              learn(types, e, path, no_dates, dynamic, conflict, texts, seen)
            elseif e ~= null and mine == "object" then
              conflict.path, conflict.first = path, "object"
            else
              new_leaf(path, k, e)
            end
          end
        else
          if types[path] == nil then types[path] = "object" end
          learn(types, v, path, no_dates, dynamic, conflict, texts, seen)
        end
      elseif v ~= null then
        new_leaf(path, k, v)
      end
    end
  end
end
_M.learn = learn

-- ES's mapping limits (MappingLookup.checkFieldLimit / checkObjectDepthLimit). The total
-- counts every object, field and multi-field (the types table's entries; the root and the
-- metadata fields are not counted). An object at path p is at depth (dots in p) + 2.
local function too_deep(path, limit)
  local _, dots = path:gsub("%.", "")
  return dots + 2 > limit
end

local function count(types)
  local n = 0
  for _ in next, types do n = n + 1 end
  return n
end

-- nil, or the reason of ES's error for mappings (explicit, at index creation) over the limits,
-- in MappingLookup.checkLimits' order: total fields, depth, nested fields.
function _M.limits_error(types, total_limit, depth_limit, nested_limit)
  if count(types) > total_limit then return "Limit of total fields [" .. total_limit .. "] has been exceeded" end
  local deep, nested = nil, 0
  for path, ty in next, types do
    if (ty == "object" or ty == "nested") and too_deep(path, depth_limit) and (not deep or #path < #deep or #path == #deep and path < deep) then
      deep = path
    end
    if ty == "nested" then nested = nested + 1 end
  end
  if deep then return "Limit of mapping depth [" .. depth_limit .. "] has been exceeded due to object field [" .. deep .. "]" end
  if nested > nested_limit then return "Limit of nested fields [" .. nested_limit .. "] has been exceeded" end
end

-- nil, or the reason of ES's error for a document whose new fields would take the mappings
-- over the limits (DocumentParserContext.addDynamicMapper). The document is mapped on a
-- scratch layer over types (learn writes there; reads fall through), so nothing changes.
-- ES checks each new mapper in document order and reports the new fields counted so far
-- ("while adding new fields [n]"); esxd goes in path order (objects before what they hold,
-- a field together with its multi-fields), which gives ES's n unless the fields' order
-- in the document changes which one crosses the limit.
function _M.new_fields_error(types, obj, no_dates, dynamic, total_limit, depth_limit)
  local trial = setmetatable({}, { __index = types })
  templates_by_types[trial] = templates_by_types[types]
  numeric_by_types[trial] = numeric_by_types[types]
  learn(trial, obj, nil, no_dates, dynamic)
  local paths = {}
  for path in next, trial do paths[#paths + 1] = path end
  if #paths == 0 then return nil end
  table.sort(paths)
  for _, path in ipairs(paths) do
    local ty = trial[path]
    if (ty == "object" or ty == "nested") and too_deep(path, depth_limit) then
      return "Limit of mapping depth [" .. depth_limit .. "] has been exceeded due to object field [" .. path .. "]"
    end
  end
  local remaining = total_limit - count(types)
  if #paths <= remaining then return nil end
  -- a new field's multi-fields are added with it, as one mapper
  local size = {}
  for _, path in ipairs(paths) do
    local parent = _M.multi_field_parent(trial, path)
    if parent and rawget(trial, parent) then size[parent] = (size[parent] or 1) + 1; size[path] = 0 end
  end
  local n = 0
  for _, path in ipairs(paths) do
    if size[path] ~= 0 then
      n = n + (size[path] or 1)
      if n > remaining then
        return "Limit of total fields [" .. total_limit .. "] has been exceeded while adding new fields [" .. n .. "]"
      end
    end
  end
end

-- nil, or ES's reason for refusing a document whose array gives one new field both an
-- object and a value ({"l": [1, {"q": 1}]}): ES maps each element on its own while parsing
-- and fails merging the two mappers into the mapping update (ObjectMapper.Builder's
-- buildMappers: FieldMapper.merge, ObjectMapper.merge), an IllegalArgumentException. The
-- earlier element's mapper is the one merged into (ES goes by its dynamic mappers' map,
-- which for a field and its sub-fields is the document's order in the common cases).
-- A value that does not fit the field it maps (an integer past a long's range, a string
-- a template maps as a number), or a later value of the same new field that its mapper cannot
-- read, is ES's parse error, as second value ({field=, type=, value=, cause=}, as check
-- gives it).
function _M.dynamic_conflict(types, obj, no_dates, dynamic, texts)
  local trial = setmetatable({}, { __index = types })
  templates_by_types[trial] = templates_by_types[types]
  numeric_by_types[trial] = numeric_by_types[types]
  date_formats_by_types[trial] = date_formats_by_types[types]
  disabled_by_types[trial] = disabled_by_types[types]
  for _, reg in ipairs({ formats_by_types, malformed_by_types, defs_by_types }) do
    if reg[types] then reg[trial] = setmetatable({}, { __index = reg[types] }) end
  end
  local c = {}
  learn(trial, obj, nil, no_dates, dynamic, c, texts)
  for _, made in ipairs(c.created or {}) do
    local bad = _M.new_value_error(trial, made.path, made.value, made.text)
    if bad then return nil, bad end
  end
  -- the later values of a field this document maps are parsed by its new mapper, as in ES
  -- ([1, "x"] maps a long, which cannot read "x")
  if not c.path then return nil, _M.check(trial, obj, nil, formats_by_types[trial], malformed_by_types[trial], texts) end
  if c.first == "object" then return "can't merge a non object mapping [" .. c.path .. "] with an object mapping" end
  return "mapper [" .. c.path .. "] cannot be changed from type [" .. c.first .. "] to [object]"
end

-- Java's String.isBlank (Character.isWhitespace on every character), for a name that is
-- not "": ASCII blanks and controls 0x1C-0x1F, and Unicode's space, line and paragraph
-- separators but the no-break ones (U+00A0, U+2007, U+202F).
local UNICODE_BLANKS = { "\225\154\128", "\226\128[\128-\134\136-\138\168\169]", "\226\129\159",
  "\227\128\128" }
function _M.is_blank(name)
  local rest = name:gsub("[ \t\n\v\f\r\28-\31]", "")
  for _, p in ipairs(UNICODE_BLANKS) do rest = rest:gsub(p, "") end
  return rest == ""
end

-- ES's reasons for a blank field name: ObjectMapper.TypeParser's for mappings (indices
-- created on 8.6+; an IllegalArgumentException, as for ""), and the document parser's
-- (DocumentParser.innerParseObject, a document_parsing_exception of its own) with the path.
_M.BLANK_NAME = "field name cannot contain only whitespaces"
function _M.blank_name_reason(path) return "Field name cannot contain only whitespace: [" .. path .. "]" end

-- "" when the document has a field named "" where ES's parser reads it, the path of a
-- field whose name is blank there, or {reason=} for a dotted name ES cannot split
-- (dotted_name_error): not inside an "enabled": false object, nor inside an unmapped object
-- or array where "dynamic" is false (ES skips those without reading their names); nil when
-- it has none of them.
local function empty_name(types, dynamic, obj, prefix)
  for k, v in pairs(obj) do
    if k == "" then return "" end
    if type(k) == "string" and _M.is_blank(k) then return prefix and (prefix .. "." .. k) or k end
    local dotted = type(k) == "string" and _M.dotted_name_error(k)
    if dotted then return { reason = dotted } end
  end
  for k, v in pairs(obj) do
    if type(k) == "string" and type(v) == "table" then
      local path = prefix and (prefix .. "." .. k) or k
      local disabled = disabled_by_types[types]
      local skipped = (disabled and disabled[path]) or (types[path] == nil and not maps_new(dynamic, prefix))
      if not skipped then
        local function walk(e)
          if type(e) ~= "table" then return nil end
          if #e > 0 or json.is_array(e) then
            for _, x in ipairs(e) do
              local bad = walk(x)
              if bad then return bad end
            end
            return nil
          end
          return empty_name(types, dynamic, e, path)
        end
        local bad = walk(v)
        if bad then return bad end
      end
    end
  end
  return nil
end
function _M.empty_name(types, dynamic, obj) return empty_name(types, dynamic, obj, nil) end

-- "dynamic": "strict": the first field of obj that is not mapped while new fields are
-- refused where it sits, as {field=, within=} (within: the object's path, "_doc" at the
-- root), or nil.
local function strict(types, dynamic, obj, prefix)
  for k, v in pairs(obj) do
    local expanded = expand_dotted(k, v)
    if expanded then
      local bad = strict(types, dynamic, expanded, prefix)
      if bad then return bad end
    elseif type(k) == "string" and v ~= null then
      local path = prefix and (prefix .. "." .. k) or k
      local is_table = type(v) == "table"
      if types[path] == nil and not (is_table and next(v) == nil and json.is_array(v))
        and dynamic_of(dynamic, prefix) == "strict" then
        return { field = k, within = prefix or "_doc" }
      end
      local ty = types[path]
      if is_table and (ty == nil or ty == "object" or ty == "nested") then
        local elems = (#v > 0) and v or { v }
        for _, e in ipairs(elems) do
          if type(e) == "table" and e ~= null and next(e) ~= nil and #e == 0 then
            local bad = strict(types, dynamic, e, path)
            if bad then return bad end
          end
        end
      end
    end
  end
end
function _M.strict(types, dynamic, obj)
  if dynamic == nil or next(dynamic) == nil then return nil end
  return strict(types, dynamic, obj, nil)
end

-- date and date_nanos fields hold instants (esxd keeps milliseconds for both)
function _M.is_date(ty) return ty == "date" or ty == "date_nanos" end
function _M.default_format(ty)
  return ty == "date_nanos" and "strict_date_optional_time_nanos||epoch_millis" or "strict_date_optional_time||epoch_millis"
end

local NUMERIC = { long = true, integer = true, short = true, byte = true, double = true, float = true,
  half_float = true, scaled_float = true, unsigned_long = true }
_M.NUMERIC = NUMERIC

-- Does a value fit a date field with this mapping "format"? Without one, ES's default
-- strict_date_optional_time||epoch_millis. A format made only of epoch_millis / epoch_second
-- takes numbers and digit strings (with an optional fraction), as ES's epoch parsers do: an
-- ISO-8601 string is then ES's document_parsing_exception. Other formats: as the default.
local function epoch_only(format)
  if type(format) ~= "string" or format == "" then return false end
  for f in format:gmatch("[^|]+") do
    f = f:match("^%s*(.-)%s*$")
    if f ~= "epoch_millis" and f ~= "epoch_second" then return false end
  end
  return true
end
_M.epoch_only = epoch_only

-- A string a date field with this format reads as an epoch, in milliseconds (else nil): with
-- an epoch-only format every digit string (fraction allowed); otherwise a digit string that
-- strict_date_optional_time does not take first (four digits are a year). The first epoch
-- parser in the format decides the unit: epoch_second counts seconds.
local function epoch_scale(format)
  if type(format) ~= "string" then return 1 end
  for f in format:gmatch("[^|]+") do
    f = f:match("^%s*(.-)%s*$")
    if f == "epoch_second" then return 1000 end
    if f == "epoch_millis" then return 1 end
  end
  return 1
end
_M.epoch_scale = epoch_scale

function _M.epoch_string(v, format)
  if type(v) ~= "string" then return nil end
  if epoch_only(format) then
    if not v:match("^%-?%d+%.?%d*$") then return nil end
  elseif not v:match("^%-?%d+$") or v:match("^%d%d%d%d$") then
    return nil
  end
  return tonumber(v) * epoch_scale(format)
end

-- A JSON number's text as ES's date parsers read it (DateFieldMapper parses a number from
-- its text): epoch_millis takes 1-19 digits within Long.MAX_VALUE and at most 6 decimals,
-- epoch_second 9; an exponent form (1.7e12) is no date in any format (ES #48472).
local LONG_MAX = "9223372036854775807"
local function epoch_text_fits(text, format)
  local int, frac = text:match("^%-?(%d+)%.?(%d*)$")
  if not int or #int > #LONG_MAX or (#int == #LONG_MAX and int > LONG_MAX) then return false end
  local seconds = type(format) == "string" and format:find("epoch_second", 1, true)
  return #frac <= (seconds and 9 or 6)
end

-- The parts of a mapping format whose strings esxd reads as ES does, each with what it takes
-- (the calendar check is dates.parse's). A string fits a format made only of them when one
-- of its parts takes it, as ES tries each parser in turn: "yyyy/MM/dd||epoch_millis" refuses
-- "2015-09-03", which has no ISO parser there.
local function iso_text(v) return not dates.is_slash(v) end -- (digit strings: as dates.parse reads them)
local function epoch_text(v) return v:match("^%-?%d+%.?%d*$") ~= nil end
local STRING_PARTS = {
  strict_date_optional_time = iso_text, date_optional_time = iso_text, strict_date_optional_time_nanos = iso_text,
  epoch_millis = epoch_text, epoch_second = epoch_text,
  ["yyyy/MM/dd"] = function(v) return v:match("^%d%d%d%d/%d%d/%d%d$") ~= nil end,
  ["yyyy/MM/dd HH:mm:ss"] = function(v) return v:match("^%d%d%d%d/%d%d/%d%d %d%d:%d%d:%d%d$") ~= nil end,
}
_M.STRING_PARTS = STRING_PARTS
-- true / false: does a part of format take the string v; nil when format has another part.
local function parts_take(v, format)
  local any = false
  for f in format:gmatch("[^|]+") do
    local takes = STRING_PARTS[f:match("^%s*(.-)%s*$")]
    if not takes then return nil end
    if takes(v) then any = true end
  end
  return any
end
_M.parts_take = parts_take

-- text: the number's text in the document, when it is not a plain integer of up to 15 digits
-- (number_texts below), which decoding loses.
function date_fits(v, format, text)
  if text and type(v) == "number" and not epoch_text_fits(text, format) then return false end
  if epoch_only(format) then
    return type(v) == "number" or (type(v) == "string" and v:match("^%-?%d+%.?%d*$") ~= nil)
  end
  if type(v) == "string" and type(format) == "string" and parts_take(v, format) == false then return false end
  -- "2015/09/02" only where the format has those patterns (a dynamically detected one)
  if dates.is_slash(v) and not (type(format) == "string" and format:find("yyyy/MM/dd", 1, true)) then return false end
  return dates.parse(v) ~= nil
end
_M.date_fits = date_fits

-- The texts of a document's numbers by dotted path, in document order, from its raw JSON
-- (valid: it was decoded), for the date fields: nil when every number is a plain integer of
-- up to 15 digits (one find per pattern for the common document), as those decode exactly.
local find, sub, match = string.find, string.sub, string.match
local function string_end(s, i) -- i: the opening quote; returns the index after the closing one
  local k = i + 1
  while true do
    local q = find(s, '["\\]', k)
    if sub(s, q, q) == "\\" then k = q + 2 else return q + 1 end
  end
end
local function scan_value(s, i, path, out)
  i = find(s, "[^ \t\r\n]", i)
  local c = sub(s, i, i)
  if c == "{" or c == "[" then
    local close = c == "{" and "}" or "]"
    i = find(s, "[^ \t\r\n]", i + 1)
    if sub(s, i, i) == close then return i + 1 end
    while true do
      local p = path
      if c == "{" then
        local j = string_end(s, i)
        local key = sub(s, i + 1, j - 2)
        if find(key, "\\", 1, true) then key = json.decode(sub(s, i, j - 1)) end
        p = path and (path .. "." .. key) or key
        i = find(s, ":", j, true) + 1
      end
      i = find(s, "[^ \t\r\n]", scan_value(s, i, p, out))
      if sub(s, i, i) ~= "," then return i + 1 end
      i = find(s, "[^ \t\r\n]", i + 1)
    end
  elseif c == '"' then
    return string_end(s, i)
  end
  local num = match(s, "^%-?%d+%.?%d*[eE]?[%+%-]?%d*", i)
  if num and num ~= "" then
    if path then
      local l = out[path]
      if not l then l = {}; out[path] = l end
      l[#l + 1] = num
    end
    return i + #num
  end
  return i + #match(s, "^%a+", i) -- true, false, null
end
function _M.number_texts(raw)
  if type(raw) ~= "string" or not (find(raw, "%d[eE.]") or find(raw, "%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d")) then
    return nil
  end
  local out = {}
  scan_value(raw, 1, nil, out)
  return out
end

-- The date fields' mapping formats of an index, by its types table (store.create registers
-- them), so that the query DSL parses a date field's values with the field's format.
formats_by_types = setmetatable({}, { __mode = "k" })
function _M.register_formats(types, formats) formats_by_types[types] = formats end
function _M.format_of(types, path)
  local f = types and formats_by_types[types]
  return f and f[path]
end

-- The query limits of an index (index.max_terms_count), by its types table like the formats.
local limits_by_types = setmetatable({}, { __mode = "k" })
function _M.register_limits(types, limits) limits_by_types[types] = limits end
function _M.limits_of(types) return types and limits_by_types[types] or {} end

-- Validate a document against explicit/learned numeric, date and boolean types (formats:
-- the date fields' mapping formats, or nil).
-- Returns nil or an error description {field=, type=, value=}.
-- Does a scalar value fit a field of type ty (format: a date field's mapping format)?
-- The integer types' ranges (NumberFieldMapper: "Value [x] is out of range for an integer").
local RANGE = { byte = { -128, 127 }, short = { -32768, 32767 }, integer = { -2147483648, 2147483647 },
  long = { -2 ^ 63, 2 ^ 63 }, unsigned_long = { 0, 2 ^ 64 } }

-- ES's InetAddresses.forString (Guava's parser): dotted-quad IPv4 without leading zeros,
-- IPv6 with at most one "::", an optional trailing dotted quad and a "%scope".
local function ipv4(s)
  local n = 0
  for part in (s .. "."):gmatch("([^.]*)%.") do
    n = n + 1
    if not part:match("^%d%d?%d?$") or (#part > 1 and part:sub(1, 1) == "0") or tonumber(part) > 255 then
      return false
    end
  end
  return n == 4
end

local function ipv6(s)
  local colons = select(2, s:gsub(":", ""))
  if colons < 2 or colons > 8 then return false end
  local skipped, skip = 8 - (colons + 1), false
  local i = s:find("::", 1, true)
  if i then
    if s:find("::", i + 1, true) then return false end
    skip, skipped = true, skipped + 1
    if i == 1 then skipped = skipped + 1 end
    if i == #s - 1 then skipped = skipped + 1 end
  end
  if s:sub(1, 1) == ":" and s:sub(2, 2) ~= ":" then return false end
  if s:sub(-1) == ":" and s:sub(-2, -2) ~= ":" then return false end
  if skip and skipped <= 0 then return false end
  if not skip and colons + 1 ~= 8 then return false end
  for part in (s .. ":"):gmatch("([^:]*):") do
    if #part > 4 then return false end
  end
  -- empty parts only next to the "::"
  local stripped = s:gsub("::", ":x:", 1)
  for part in (stripped .. ":"):gmatch("([^:]*):") do
    if part == "" and not (stripped:sub(1, 1) == ":" or stripped:sub(-1) == ":") then return false end
  end
  return true
end

local function is_ip(v)
  if type(v) ~= "string" then return false end
  local has_colon, has_dot, pct = false, false, nil
  for i = 1, #v do
    local c = v:sub(i, i)
    if c == "." then has_dot = true
    elseif c == ":" then
      if has_dot then return false end
      has_colon = true
    elseif c == "%" then pct = i; break
    elseif not c:match("%x") then return false end
  end
  if has_colon then
    local s = pct and v:sub(1, pct - 1) or v
    if pct and pct == #v then return false end
    if has_dot then
      local head, quad = s:match("^(.*:)([^:]*)$")
      if not head or not ipv4(quad) then return false end
      s = head .. "0:0"
    end
    return ipv6(s)
  elseif has_dot then
    return not pct and ipv4(v)
  end
  return false
end
_M.is_ip = is_ip

-- An IP string literal as the 16 bytes ES indexes (IPv4 as IPv4-mapped IPv6, so
-- "::ffff:1.2.3.4" is "1.2.3.4"), or nil. Byte order is numeric order.
function _M.ip_bytes(v)
  if not is_ip(v) then return nil end
  local s = v:gsub("%%.*$", "")
  local function quad(q)
    local a, b, c, d = q:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
    return string.char(tonumber(a), tonumber(b), tonumber(c), tonumber(d))
  end
  if not s:find(":", 1, true) then return ("\0"):rep(10) .. "\255\255" .. quad(s) end
  local head, q = s:match("^(.*:)([^:]*%.[^:]*)$")
  if head then
    local b4 = quad(q)
    s = head .. string.format("%x:%x", b4:byte(1) * 256 + b4:byte(2), b4:byte(3) * 256 + b4:byte(4))
  end
  local left, right = s:match("^(.-)::(.*)$")
  local function groups(part)
    local out = {}
    for g in part:gmatch("[^:]+") do out[#out + 1] = tonumber(g, 16) end
    return out
  end
  local l, r = groups(left or s), groups(right or "")
  local all = {}
  for _, g in ipairs(l) do all[#all + 1] = g end
  for _ = 1, 8 - #l - #r do all[#all + 1] = 0 end
  for _, g in ipairs(r) do all[#all + 1] = g end
  local bytes = {}
  for i = 1, 8 do bytes[i] = string.char(math.floor(all[i] / 256), all[i] % 256) end
  return table.concat(bytes)
end

-- The 16 bytes of an address as ES prints it (NetworkAddress.format, RFC 5952): an IPv4-mapped
-- address as a dotted quad, IPv6 in lower case with its longest run (the first of equal ones)
-- of two or more zero groups as "::".
function _M.ip_format(b)
  if b:sub(1, 12) == ("\0"):rep(10) .. "\255\255" then
    return string.format("%d.%d.%d.%d", b:byte(13, 16))
  end
  local g = {}
  for i = 1, 8 do g[i] = b:byte(2 * i - 1) * 256 + b:byte(2 * i) end
  local best, best_len, i = nil, 1, 1
  while i <= 8 do
    if g[i] == 0 then
      local j = i
      while j < 8 and g[j + 1] == 0 do j = j + 1 end
      if j - i + 1 > best_len then best, best_len = i, j - i + 1 end
      i = j + 1
    else
      i = i + 1
    end
  end
  local function hex(from, to)
    local out = {}
    for k = from, to do out[#out + 1] = string.format("%x", g[k]) end
    return table.concat(out, ":")
  end
  if not best then return hex(1, 8) end
  return hex(1, best - 1) .. "::" .. hex(best + best_len, 8)
end

-- "ip/prefix" (InetAddresses.parseCidr): the address's bytes and the prefix length in bits
-- of the 16 bytes, or nil.
function _M.ip_cidr(v)
  if type(v) ~= "string" then return nil end
  local addr, len = v:match("^([^/]+)/(%d+)$")
  local b = addr and _M.ip_bytes(addr)
  if not b then return nil end
  len = tonumber(len)
  local v4 = not addr:find(":", 1, true)
  if len > (v4 and 32 or 128) then return nil end
  return b, v4 and len + 96 or len
end

-- Does the 16-byte address a lie in the prefix (bytes p, bits n)?
function _M.ip_in_prefix(a, p, n)
  local full = math.floor(n / 8)
  if a:sub(1, full) ~= p:sub(1, full) then return false end
  local rest = n % 8
  if rest == 0 then return true end
  local shift = 2 ^ (8 - rest)
  return math.floor(a:byte(full + 1) / shift) == math.floor(p:byte(full + 1) / shift)
end

-- date_nanos holds nanoseconds since the epoch in a long: 1970 .. 2262-04-11T23:47:16.854Z
local NANOS_MAX_MS = 9223372036854

-- The Java class XContentParser's number readers name when "coerce": false refuses a value.
local COERCE_CLASS = { long = "Long", integer = "Integer", short = "Short", byte = "Byte", double = "Double",
  float = "Float", half_float = "Float", scaled_float = "Double" }

-- The number types whose string values XContentParser reads with Double.parseDouble (the
-- integer ones check the range after), and the Java text of its NumberFormatException.
local PARSED_AS_DOUBLE = { integer = true, short = true, byte = true, double = true, float = true,
  half_float = true, scaled_float = true }
local RANGE_NAME = { integer = "an integer", short = "a short", byte = "a byte", long = "a long" }
local function decimal_text(s)
  return s:match("^[+-]?%d+%.?%d*[eE][+-]?%d+$") or s:match("^[+-]?%.%d+[eE][+-]?%d+$")
    or s:match("^[+-]?%d+%.?%d*$") or s:match("^[+-]?%.%d+$")
end

-- A string in a number field that is no number as ES reads it: false, the type and reason of
-- ES's caused_by (Numbers.toLong's IllegalArgumentException for a long, Double.parseDouble's
-- NumberFormatException for the others, which trims the string first); nil when it is one.
local function number_string_error(ty, s)
  if ty == "long" then
    if not decimal_text(s) then return false, "illegal_argument_exception", 'For input string: "' .. s .. '"' end
  elseif PARSED_AS_DOUBLE[ty] then
    local t = s:gsub("^[%c ]+", ""):gsub("[%c ]+$", "")
    if t == "" then return false, "number_format_exception", "empty String" end
    if not decimal_text(t) then return false, "number_format_exception", 'For input string: "' .. t .. '"' end
  end
  return nil
end

-- Returns true, or false and (for some types) the reason of ES's caused_by, and its type
-- when that is not illegal_argument_exception.
-- strict: the field's (or index's) "coerce" is false.
local function fits(ty, e, format, strict, text)
  if NUMERIC[ty] then
    -- NumberFieldMapper.value: with coerce, an empty string is a null (null_value, or nothing)
    if e == "" and not strict then return true end
    if type(e) == "string" and not (strict and COERCE_CLASS[ty]) then
      local bad, ctype, why = number_string_error(ty, e)
      if bad == false then return false, why, ctype end
    end
    local class = strict and COERCE_CLASS[ty]
    -- XContentParser.checkCoerceString: any string, number or not ("" included)
    if class and type(e) == "string" then return false, class .. " value passed as String" end
    local n = (type(e) == "number" or type(e) == "string") and tonumber(e)
    if not n or n ~= n then return false end
    if class and RANGE[ty] and n ~= math.floor(n) then
      return false, tostring(n) .. " cannot be converted to " .. class .. " without data loss"
    end
    local r = RANGE[ty]
    -- coerce (the default) truncates a fraction: 127.9 is 127 for a byte
    if r then
      local t = n < 0 and math.ceil(n) or math.floor(n)
      -- (a double cannot tell 2^63 - 1 from 2^63: long's and unsigned_long's maxima pass)
      if t < r[1] or t > r[2] then
        -- a string past the range: XContentParser's IllegalArgumentException
        if type(e) == "string" and RANGE_NAME[ty] then
          return false, "Value [" .. e .. "] is out of range for " .. RANGE_NAME[ty]
        end
        return false
      end
    end
    return true
  end
  if ty == "date" then return date_fits(e, format, text) end
  if ty == "date_nanos" then
    local ms = date_fits(e, format) and dates.parse(e)
    return ms ~= nil and ms ~= false and ms >= 0 and ms <= NANOS_MAX_MS
  end
  if ty == "ip" then
    if is_ip(e) then return true end
    return false, "'" .. tostring(e) .. "' is not an IP string literal."
  end
  if ty == "boolean" then
    if type(e) == "boolean" or e == "true" or e == "false" or e == "" then return true end
    -- Booleans.parseBoolean, as XContentParser.booleanValue reads a string
    if type(e) == "string" then return false, "Failed to parse value [" .. e .. "] as only [true] or [false] are allowed." end
    return false
  end
  return true
end

-- "ignore_malformed": the field types whose mappers take it, and the index's settings by
-- path ("" holds the index.mapping.ignore_malformed default), registered by types table
-- like the date formats. A malformed value of such a field is kept in _source only.
local TAKES_IGNORE_MALFORMED = { date = true, date_nanos = true, boolean = true, ip = true }
for t in pairs(NUMERIC) do TAKES_IGNORE_MALFORMED[t] = true end
malformed_by_types = setmetatable({}, { __mode = "k" })
function _M.register_malformed(types, malformed) malformed_by_types[types] = malformed end
-- "copy_to": the fields whose values each target field indexes too, by types table.
copy_from_by_types = setmetatable({}, { __mode = "k" })
function _M.register_copy_to(types, copy_from) copy_from_by_types[types] = copy_from end
-- "null_value": what a field indexes for a JSON null, by types table.
null_values_by_types = setmetatable({}, { __mode = "k" })
function _M.register_null_values(types, null_values) null_values_by_types[types] = null_values end
local function ignores_malformed(malformed, path, ty)
  if not malformed or not TAKES_IGNORE_MALFORMED[ty] then return false end
  local v = malformed[path]
  if v == nil then v = malformed[""] end
  return v == true or v == "true"
end

-- "coerce": false on the field, else the index.mapping.coerce setting (defs[""]).
local function strict_numbers(types, path)
  local defs = defs_by_types[types]
  if not defs then return false end
  local c = defs[path] and defs[path].coerce
  if c == nil then c = defs[""] and defs[""].coerce end
  return c == false or c == "false"
end

-- texts: number_texts of the document's raw JSON, or nil; seen: how many numbers of each
-- path were met (to take each one's text, in document order).
local function check(types, obj, prefix, formats, malformed, texts, seen)
  for k, v in pairs(obj) do
    local expanded = expand_dotted(k, v)
    if expanded then
      seen = seen or (texts and {})
      local bad = check(types, expanded, prefix, formats, malformed, texts, seen)
      if bad then return bad end
    elseif type(k) == "string" then
      local path = prefix and (prefix .. "." .. k) or k
      local ty = types[path]
      local vals = (type(v) == "table" and v ~= null and #v > 0) and v or { v }
      for _, e in ipairs(vals) do
        local text
        if texts and type(e) == "number" then
          seen = seen or {}
          local n = (seen[path] or 0) + 1
          seen[path] = n
          text = texts[path] and texts[path][n]
        end
        if type(e) == "table" and e ~= null then
          if next(e) ~= nil and #e == 0 then
            if ty and ty ~= "object" and ty ~= "nested" and ty ~= "flattened" then
              return { field = path, type = ty, value = e, object = true }
            end
            seen = seen or (texts and {})
            local bad = check(types, e, path, formats, malformed, texts, seen)
            if bad then return bad end
          end
        elseif e ~= null and (ty == "object" or ty == "nested") then
          -- DocumentParser.parseObjectOrNested: a value where an object is mapped
          local disabled = disabled_by_types[types]
          if not (disabled and disabled[path]) then return { field = path, key = k, value = e, concrete = true } end
        elseif e ~= null and ty and not ignores_malformed(malformed, path, ty) then
          local ok, cause, ctype = fits(ty, e, formats and formats[path], NUMERIC[ty] and strict_numbers(types, path),
                                 text)
          if not ok then return { field = path, type = ty, value = text or e, cause = cause, cause_type = ctype } end
        end
      end
    end
  end
end
_M.check = check

-- The parse error of the value that mapped a new field (learn's conflict.created), or nil.
function _M.new_value_error(types, path, e, text)
  local ty = types[path]
  if ty == nil or ty == "object" or ty == "nested" then return nil end
  local malformed = malformed_by_types[types]
  if ignores_malformed(malformed, path, ty) then return nil end
  local formats = formats_by_types[types]
  local ok, cause, ctype = fits(ty, e, formats and formats[path], NUMERIC[ty] and strict_numbers(types, path), text)
  if not ok then return { field = path, type = ty, value = text or e, cause = cause, cause_type = ctype } end
end

-- All values at a dotted path (arrays flattened). "x.keyword" falls back to "x".
-- keep_null: a null at the path is collected too (as json.null).
local function collect(node, parts, i, out, keep_null)
  if node == nil then return end
  if node == null then
    if keep_null and i > #parts then out[#out + 1] = null end
    return
  end
  if type(node) == "table" and #node > 0 then
    for _, e in ipairs(node) do collect(e, parts, i, out, keep_null) end
    return
  end
  if i > #parts then
    -- an empty array (or object) holds no value: exists does not match it, as in ES
    if node ~= null and not (type(node) == "table" and next(node) == nil) then out[#out + 1] = node end
    return
  end
  if type(node) ~= "table" then return end
  -- try the longest dotted key first (documents may contain literal "a.b" keys)
  for j = #parts, i, -1 do
    local key = table.concat(parts, ".", i, j)
    local child = node[key]
    if child ~= nil then collect(child, parts, j + 1, out, keep_null) end
  end
  -- a dotted key under the path ("a.b.c" for the object a.b) holds that object, as ES
  -- expands it: the object is there (for exists)
  local rest = table.concat(parts, ".", i) .. "."
  for k, child in pairs(node) do
    if type(k) == "string" and k:sub(1, #rest) == rest and #k > #rest and child ~= null then
      out[#out + 1] = { [k:sub(#rest + 1)] = child }
    end
  end
end

local function split(path)
  local parts = {}
  for p in path:gmatch("[^%.]+") do parts[#parts + 1] = p end
  return parts
end

-- The parent field of a multi-field path ("t" for "t.raw" where t is a text, keyword, ...
-- field), else nil. Without types, any "x.keyword" is taken as one.
function _M.multi_field_parent(types, path)
  local parent = path:match("^(.*)%.[^%.]+$")
  if not parent then return nil end
  if not types then return path:sub(-8) == ".keyword" and parent or nil end
  local pty = types[parent]
  if pty and pty ~= "object" and pty ~= "nested" and pty ~= "flattened" then return parent end
  if path:sub(-8) == ".keyword" and pty == nil then return parent end
end

-- types (the index's): a path the index has not mapped has no values, as in ES, where a
-- field kept only in _source ("dynamic": false, "enabled": false) matches nothing.
-- Code points in a UTF-8 string (bytes that are not continuation bytes).
local function utf8_len(str)
  local _, n = str:gsub("[^\128-\191]", "")
  return n
end

-- A malformed value of an "ignore_malformed" field is not indexed: it has no value either.
-- no_copy_to: leave out what copy_to adds (the search "fields" option reads _source only).
function _M.values(source, path, types, no_copy_to)
  if types and _M.type_of(types, path) == nil then return {} end
  local out = {}
  local nv = types and null_values_by_types[types]
  nv = nv and nv[path]
  collect(source, split(path), 1, out, nv ~= nil)
  local ty = types and types[path]
  if NUMERIC[ty] and not strict_numbers(types, path) then
    -- with coerce, a number field reads "" as a null (NumberFieldMapper.value)
    local kept = {}
    for _, v in ipairs(out) do
      if v ~= "" then kept[#kept + 1] = v elseif nv ~= nil then kept[#kept + 1] = null end
    end
    out = kept
  end
  if nv ~= nil then -- ES indexes null_value for each null
    for i, v in ipairs(out) do if v == null then out[i] = nv end end
  end
  if #out == 0 then
    -- a multi-field ("t.raw" of a text field t, dynamic "x.keyword") indexes its parent's values
    local parent = _M.multi_field_parent(types, path)
    if parent then collect(source, split(parent), 1, out) end
  end
  -- copy_to: the target indexes the source fields' values as its own (_source is unchanged)
  local from = types and not no_copy_to and copy_from_by_types[types]
  from = from and from[path]
  if from then
    for _, src in ipairs(from) do collect(source, split(src), 1, out) end
  end
  local limit = types and ignore_above_by_types[types]
  limit = limit and limit[path]
  if limit then -- a longer string is not indexed (ES counts UTF-16 units; esxd code points)
    local kept = {}
    for _, v in ipairs(out) do
      if not (type(v) == "string" and utf8_len(v) > limit) then kept[#kept + 1] = v end
    end
    out = kept
  end
  if ty and ignores_malformed(malformed_by_types[types], path, ty) then
    local format = _M.format_of(types, path)
    local kept = {}
    for _, v in ipairs(out) do
      if type(v) == "table" or fits(ty, v, format, NUMERIC[ty] and strict_numbers(types, path)) then kept[#kept + 1] = v end
    end
    out = kept
  end
  if ty and _M.is_date(ty) then
    -- the instants of the values the field's format reads as epochs: an epoch-only field's
    -- digit strings ("2024" is not the year there), and epoch_second's numbers and strings
    -- in seconds
    local format = _M.format_of(types, path)
    local scale = epoch_scale(format)
    if scale ~= 1 or epoch_only(format) then
      for i, v in ipairs(out) do
        if type(v) == "number" then out[i] = v * scale
        else out[i] = _M.epoch_string(v, format) or v end
      end
    end
  end
  return out
end

-- Field type of a path in an index (nil: not mapped; an explicit text field has no
-- "keyword" sub-field unless its mapping gives one).
function _M.type_of(types, path)
  return types[path]
end

-- dst: a types table merged from several indices' (aggregations run over all searched
-- indices at once); it takes src's per-field registrations too (date formats,
-- ignore_malformed, copy_to, null_value, ignore_above), the first index's winning for a path as for the types.
function _M.inherit(dst, src)
  for _, reg in ipairs({ formats_by_types, malformed_by_types, copy_from_by_types, null_values_by_types,
    ignore_above_by_types, defs_by_types }) do
    local s = reg[src]
    if s then
      local d = reg[dst] or {}
      reg[dst] = d
      for k, v in pairs(s) do if d[k] == nil then d[k] = v end end
    end
  end
end

local function is_false(v) return v == false or v == "false" end

-- The types whose fields have doc values unless "doc_values": false (text has none).
local DOC_VALUES = { keyword = true, date = true, date_nanos = true, boolean = true, ip = true }
for t in pairs(NUMERIC) do DOC_VALUES[t] = true end

local function def_of(types, path)
  local defs = types and defs_by_types[types]
  return defs and defs[path]
end

-- Is the field mapped with "store": true (what stored_fields returns)?
function _M.stored(types, path)
  local def = def_of(types, path)
  return def ~= nil and (def.store == true or def.store == "true")
end

-- nil, or ES's reason for a query on a field that is neither indexed ("index": false) nor
-- has doc values: keyword, numeric, date, boolean and ip fields stay searchable through
-- their doc values, as in ES 8.
function _M.not_searchable(types, path)
  local def = def_of(types, path)
  if not def or not is_false(def.index) then return nil end
  if DOC_VALUES[types[path]] and not is_false(def.doc_values) then return nil end
  return "Cannot search on field [" .. path .. "] since it is not indexed nor has doc values."
end

-- Can an exists query find the field's values? ES's exists query reads doc values (or norms),
-- else the _field_names field, where a field without them is recorded only when it is indexed
-- or stored (a stored text or keyword field only without norms): a field neither indexed, stored
-- nor with doc values is never found.
function _M.exists_findable(types, path)
  if not _M.not_searchable(types, path) then return true end
  local def = def_of(types, path)
  local stored = def.store == true or def.store == "true"
  if types[path] == "text" then return stored and is_false(def.norms) end
  if types[path] == "keyword" then return stored and not (def.norms == true or def.norms == "true") end
  return stored
end

-- Sorting and aggregating need field data: nil (there is), or "text" (a text field without
-- "fielddata": true; the caller words ES's message with the index name), or ES's reason
-- for a field mapped with "doc_values": false.
function _M.fielddata_error(types, path)
  local ty = types and types[path]
  local def = def_of(types, path)
  if ty == "text" then
    if def and (def.fielddata == true or def.fielddata == "true") then return nil end
    return "text"
  end
  if def and DOC_VALUES[ty] and is_false(def.doc_values) then
    return "Can't load fielddata on [" .. path .. "] because fielddata is unsupported on fields of type [" .. ty .. "]. Use doc values instead."
  end
end

-- ES standard analyzer, approximately: lowercase, split on non-alphanumeric (UTF-8 bytes kept).
function _M.tokens(s)
  local out = {}
  s = tostring(s):lower()
  for tok in s:gmatch("[%w\128-\255_]+") do out[#out + 1] = tok end
  return out
end

return _M
