-- esxd.mapping_update: PUT /{index}/_mapping, the merge of a mapping update into an index's
-- mappings as ES's MapperService.merge (MergeReason.MAPPING_UPDATE) does it: new fields and
-- multi-fields are added, objects are merged, a field keeps its type (ES's 400
-- illegal_argument_exception "mapper [f] cannot be changed from type [a] to [b]", and the
-- object / nested conflicts of ObjectMapper and MapperErrors), parameters a field mapper
-- cannot update must keep their value ("Mapper for [f] conflicts with existing mapper:\n\t
-- Cannot update parameter [p] from [a] to [b]"), and the updateable ones take the update's
-- value (left out: the default again, as in ES, whose incoming mapper has its defaults).
-- Changes esxd cannot tell apart from ES's rules are refused with a 400 that says so.
local mapping = require "esxd.mapping"

local _M = {}

-- Parameters every field mapper may update (FieldMapper: meta, copy_to; multi-fields merge).
local ANY_UPDATEABLE = { meta = true, copy_to = true }
local NUMBER_UPDATEABLE = { ignore_malformed = true, coerce = true }
-- Parameters each field mapper may update (ES 8's Parameter(..., updateable = true, ...)).
local UPDATEABLE = {
  keyword = { ignore_above = true, eager_global_ordinals = true, split_queries_on_whitespace = true },
  text = { search_analyzer = true, search_quote_analyzer = true, fielddata = true,
    fielddata_frequency_filter = true, eager_global_ordinals = true },
  long = NUMBER_UPDATEABLE, integer = NUMBER_UPDATEABLE, short = NUMBER_UPDATEABLE, byte = NUMBER_UPDATEABLE,
  double = NUMBER_UPDATEABLE, float = NUMBER_UPDATEABLE, half_float = NUMBER_UPDATEABLE,
  scaled_float = NUMBER_UPDATEABLE, unsigned_long = { ignore_malformed = true },
  date = { ignore_malformed = true }, date_nanos = { ignore_malformed = true },
  ip = { ignore_malformed = true }, boolean = { ignore_malformed = true },
}
-- Parameters that cannot be updated, with the default ES prints for a mapping without them
-- (a function of the type where it depends on it).
local FIXED = {
  index = "true", doc_values = "true", store = "false", null_value = "null",
  format = function(ty) return mapping.is_date(ty) and mapping.default_format(ty) or nil end,
  analyzer = function(ty) return ty == "text" and "default" or nil end,
  normalizer = function(ty) return ty == "keyword" and "null" or nil end,
}

-- Object parameters an update may repeat but not change, with their defaults.
local OBJECT_FIXED = { enabled = true, subobjects = true, include_in_parent = false, include_in_root = false,
  store_array_source = false }

local ORDER = { index = 1, doc_values = 2, store = 3, analyzer = 4, format = 5, null_value = 6, normalizer = 7 }

local function deep_copy(t)
  if type(t) ~= "table" then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = deep_copy(v) end
  return setmetatable(c, getmetatable(t))
end

local sorted_keys = mapping.sorted_keys

local function is_object(def)
  return def.properties ~= nil or def.type == nil or def.type == "object" or def.type == "nested"
end

local function text_of(v) return mapping.java_string(v) end

local function same(a, b)
  if a == nil or b == nil then return a == b end
  return text_of(a) == text_of(b)
end

local function not_implemented(what, path)
  return "esxd does not implement changing [" .. what .. "] of [" .. path .. "] in a mapping update"
end

local merge_field

-- Merges the update's def u of field path into the current def e (same type): returns the
-- merged def, or nil and ES's (or esxd's) message.
merge_field = function(path, e, u)
  local ty = e.type
  if u.type ~= ty then
    return nil, "mapper [" .. path .. "] cannot be changed from type [" .. tostring(ty) .. "] to [" ..
      tostring(u.type) .. "]"
  end
  local updateable = UPDATEABLE[ty] or {}
  local conflicts, keys, seen = {}, {}, {}
  for _, t in ipairs({ e, u }) do
    for _, k in ipairs(sorted_keys(t)) do
      if not seen[k] then seen[k] = true; keys[#keys + 1] = k end
    end
  end
  -- in the order of the mappers' getParameters(), then by name
  table.sort(keys, function(a, b)
    local ra, rb = ORDER[a] or 99, ORDER[b] or 99
    if ra ~= rb then return ra < rb end
    return a < b
  end)
  for _, k in ipairs(keys) do
    if k ~= "type" and k ~= "fields" and not ANY_UPDATEABLE[k] and not updateable[k] and not same(e[k], u[k]) then
      local default = FIXED[k]
      if type(default) == "function" then default = default(ty) end
      if default == nil then return nil, nil, not_implemented(k, path) end
      local a = e[k] == nil and default or text_of(e[k])
      local b = u[k] == nil and default or text_of(u[k])
      if a ~= b then conflicts[#conflicts + 1] = "Cannot update parameter [" .. k .. "] from [" .. a .. "] to [" .. b .. "]" end
    end
  end
  if #conflicts > 0 then
    return nil, "Mapper for [" .. path .. "] conflicts with existing mapper:\n\t" .. table.concat(conflicts, "\n\t")
  end
  local merged = deep_copy(u)
  -- multi-fields: the current ones stay, the update's are added or merged into them
  if type(e.fields) == "table" then
    merged.fields = deep_copy(e.fields)
    for _, sub in ipairs(sorted_keys(type(u.fields) == "table" and u.fields or {})) do
      local su, se = u.fields[sub], e.fields[sub]
      if type(se) == "table" and type(su) == "table" then
        local m, msg, esxd = merge_field(path .. "." .. sub, se, su)
        if not m then return nil, msg, esxd end
        merged.fields[sub] = m
      else
        merged.fields[sub] = deep_copy(su)
      end
    end
  end
  return merged
end

local merge_props
-- Merges update properties into the current ones (cur: the index's mappings as GET shows
-- them, dynamic fields included). Writes into out (the new explicit properties) and delta
-- (what to load into the index's field tables). Returns nil, or ES's message, or nil, nil,
-- esxd's message.
merge_props = function(cur, upd, out, delta, prefix)
  for _, name in ipairs(sorted_keys(upd)) do
    local u = upd[name]
    if type(u) == "table" then
      local path = prefix and (prefix .. "." .. name) or name
      local e = type(cur) == "table" and cur[name] or nil
      if type(e) ~= "table" then
        out[name] = deep_copy(u)
        delta[name] = deep_copy(u)
      elseif is_object(e) then
        if e.type == "nested" and u.type ~= "nested" then
          return "can't merge a non-nested mapping [" .. path .. "] with a nested mapping"
        end
        if not is_object(u) then return "can't merge a non object mapping [" .. path .. "] with an object mapping" end
        if u.type == "nested" and e.type ~= "nested" then
          return "can't merge a non-nested mapping [" .. path .. "] with a nested mapping"
        end
        -- ObjectMapper.MergeResult: these cannot change (esxd does not give ES's message)
        for k, default in pairs(OBJECT_FIXED) do
          local was = e[k]
          if was == nil then was = default end
          if u[k] ~= nil and not same(u[k], was) then return nil, not_implemented(k, path) end
        end
        local o = type(out[name]) == "table" and out[name] or {}
        out[name] = o
        if u.dynamic ~= nil then o.dynamic = u.dynamic end
        if e.type == "nested" then o.type = "nested" end
        local d = { type = e.type, dynamic = u.dynamic, properties = {} }
        delta[name] = d
        if type(u.properties) == "table" then
          o.properties = type(o.properties) == "table" and o.properties or {}
          local msg, esxd = merge_props(e.properties, u.properties, o.properties, d.properties, path)
          if msg or esxd then return msg, esxd end
        end
      else
        if u.type == "nested" then
          return "can't merge a non-nested mapping [" .. path .. "] with a nested mapping"
        end
        if is_object(u) then return "can't merge a non object mapping [" .. path .. "] with an object mapping" end
        local m, msg, esxd = merge_field(path, e, u)
        if not m then return msg, esxd end
        out[name] = m
        delta[name] = deep_copy(m)
      end
    end
  end
end

-- Root mapping keys an update may set, and how: "replace" takes the update's value.
local ROOT = { properties = true, dynamic = "replace", date_detection = "replace",
  numeric_detection = "replace", _meta = "replace" }

-- Merges update (a decoded mapping, checked by mapping.mapping_error) into an index whose
-- explicit mappings are explicit (or nil) and whose mappings as GET shows them are current.
-- Returns the new explicit mappings and the delta (a mappings object whose properties are the
-- new and changed fields, for mapping.load), or nil, error kind ("es" or "esxd"), message.
function _M.merge(explicit, current, update)
  local out = deep_copy(explicit) or {}
  local delta = {}
  for _, k in ipairs(sorted_keys(update)) do
    local v = update[k]
    if ROOT[k] == "replace" then
      out[k] = deep_copy(v)
      delta[k] = deep_copy(v)
    elseif not ROOT[k] and not same(v, current[k]) then
      return nil, "esxd", not_implemented(k, "_doc")
    end
  end
  if type(update.properties) == "table" then
    out.properties = type(out.properties) == "table" and out.properties or {}
    delta.properties = {}
    local msg, esxd = merge_props(current.properties, update.properties, out.properties, delta.properties, nil)
    if msg then return nil, "es", msg end
    if esxd then return nil, "esxd", esxd end
  end
  return out, delta
end

return _M
