-- esxd.query: the query DSL subset. compile(query, types) turns a query object into a
-- function(rec) -> matched(bool), score(number). Scores are simple: 1.0 per matching
-- filter-like query, the number of matched tokens for match, sums for bool (see README).
-- Malformed queries raise ES-shaped errors (parsing_exception etc.).
local errors = require "esxd.errors"
local mapping = require "esxd.mapping"
local dates = require "esxd.dates"
local json = require "esxd.json"
local suggest = require "esxd.suggest"

local _M = {}
local null = json.null
local values = mapping.values

local function perr(reason) errors.raise(400, "parsing_exception", reason) end

-- an object (json.decode marks empty arrays, so [] is not one)
local function is_obj(t)
  return type(t) == "table" and t ~= null and not json.is_array(t) and (next(t) == nil or #t == 0)
end

-- The JSON token ES's parser sees at a value.
local function token(v)
  if v == null then return "VALUE_NULL" end
  if type(v) == "table" then return is_obj(v) and "START_OBJECT" or "START_ARRAY" end
  if type(v) == "number" then return "VALUE_NUMBER" end
  if type(v) == "boolean" then return "VALUE_BOOLEAN" end
  return "VALUE_STRING"
end
local function is_value(v) return v ~= null and type(v) ~= "table" end

-- single "field": value-or-object entry of a leaf query (ignoring known options)
local function field_entry(qname, body)
  if not is_obj(body) then perr("[" .. qname .. "] query malformed, no start_object after query name") end
  local field, val
  for k, v in pairs(body) do
    if k ~= "boost" and k ~= "_name" then
      if field then perr("[" .. qname .. "] query doesn't support multiple fields, found [" .. field .. "] and [" .. k .. "]") end
      field, val = k, v
    end
  end
  if not field then perr("[" .. qname .. "] query malformed, no field") end
  return field, val
end

-- Options of a leaf query's field object. ES refuses keys it does not know with
-- "[q] query does not support [k]"; esxd gives the same answer for options it does not
-- implement (a value of false means: accepted only at its default, given as the second
-- entry), rather than ignoring them and returning other hits than ES would.
local OPTIONS = {
  term = { value = true, boost = true, _name = true, case_insensitive = true },
  prefix = { value = true, boost = true, _name = true, case_insensitive = true, rewrite = true },
  wildcard = { value = true, wildcard = true, boost = true, _name = true, case_insensitive = true, rewrite = true },
  query_string = { query = true, default_field = true, default_operator = true, lenient = true,
    boost = true, _name = true, analyze_wildcard = true, allow_leading_wildcard = true,
    auto_generate_synonyms_phrase_query = true, enable_position_increments = true,
    max_determinized_states = true, rewrite = true, escape = { false } },
  match = { query = true, boost = true, _name = true, operator = true, minimum_should_match = true,
    auto_generate_synonyms_phrase_query = true, lenient = true, prefix_length = true, max_expansions = true,
    fuzzy_transpositions = true, fuzzy_rewrite = true,
    fuzziness = { 0, "0" }, analyzer = { "standard" }, zero_terms_query = { "none", "NONE" } },
  match_phrase = { query = true, boost = true, _name = true, slop = { 0, "0" }, analyzer = { "standard" },
    zero_terms_query = { "none", "NONE" } },
  multi_match = { query = true, fields = true, boost = true, _name = true, operator = true,
    minimum_should_match = true, tie_breaker = true, lenient = true, auto_generate_synonyms_phrase_query = true,
    fuzzy_transpositions = true, prefix_length = true, max_expansions = true,
    type = { "best_fields", "most_fields", "phrase" }, fuzziness = { 0, "0" }, analyzer = { "standard" },
    zero_terms_query = { "none", "NONE" }, slop = { 0, "0" } },
}

local function check_options(qname, v)
  if not is_obj(v) then return end
  local allowed = OPTIONS[qname]
  for k, val in pairs(v) do
    local a = allowed[k]
    local ok = a == true
    if type(a) == "table" then
      for _, d in ipairs(a) do if val == d then ok = true end end
    end
    if not ok then perr("[" .. qname .. "] query does not support [" .. tostring(k) .. "]") end
  end
end

-- comparable form of a document value for a field type
local function norm(ty, v)
  if mapping.is_date(ty) then return dates.parse(v) end
  if ty and mapping.NUMERIC[ty] then return tonumber(v) end
  if ty == "ip" then return mapping.ip_bytes(v) end
  if ty == "boolean" then
    if v == true or v == "true" then return true end
    if v == false or v == "false" then return false end
    return nil
  end
  if type(v) == "number" then return v end
  if type(v) == "boolean" then return tostring(v) end
  return v
end

local function term_matches(ty, docval, qval, ci)
  if ty == "text" then
    local q = tostring(qval)
    for _, tok in ipairs(mapping.tokens(docval)) do
      if tok == q or (ci and tok == q:lower()) then return true end
    end
    return false
  end
  if mapping.is_date(ty) and type(qval) == "table" then
    -- a date term is the range date_term gives
    local x = dates.parse(docval)
    return x ~= nil and x >= qval[1] and x <= qval[2]
  end
  if ty == "ip" and type(qval) == "string" and qval:find("/", 1, true) then
    -- IpFieldType.termQuery: "ip/prefix" matches the addresses in the range
    local p, n = mapping.ip_cidr(qval)
    local a = mapping.ip_bytes(docval)
    return p ~= nil and a ~= nil and mapping.ip_in_prefix(a, p, n)
  end
  local a, b = norm(ty, docval), norm(ty, qval)
  if a == nil or b == nil then
    if ty == nil and type(docval) ~= type(qval) then
      return tostring(docval) == tostring(qval)
    end
    return false
  end
  if ci and type(a) == "string" and type(b) == "string" then return a:lower() == b:lower() end
  if type(a) ~= type(b) then return tostring(a) == tostring(b) end
  return a == b
end

-- DateFieldType.parseToLong through JavaDateMathParser.parse: a date query value with ES's
-- date math ("now-1d/d", "2024-01-01||+1M/M"). round_up is ES's roundUpProperty (true for gt
-- and lte bounds): "/unit" then gives the unit's last millisecond, and a date without math its
-- missing components as 23:59:59.999 (see dates.parse). format: the query's, else the field's;
-- zone_ms: the time_zone's offset. A value that does not parse is ES's parse_exception.
local function date_value(x, round_up, format, zone_ms, ty)
  local function fail(v)
    errors.raise(400, "parse_exception", "failed to parse date field [" .. tostring(v) .. "] with format [" ..
      (format or mapping.default_format(ty)) .. "]")
  end
  local function parse(v, up)
    if v == "" then errors.raise(400, "parse_exception", "cannot parse empty datetime") end
    -- a number is epoch millis whatever the format (DateFieldType parses it with
    -- EPOCH_MILLIS); a string with the format, epoch_second in seconds
    local ms = mapping.date_fits(v, format) and
      (mapping.epoch_string(v, format) or dates.parse(v, up, zone_ms, mapping.epoch_only(format)))
    if not ms then fail(v) end
    return ms
  end
  if type(x) ~= "string" then return parse(x, round_up) end
  local base, math_s
  if x:sub(1, 3) == "now" then
    base, math_s = math.floor(ngx.now() * 1000), x:sub(4)
  else
    local i = x:find("||", 1, true)
    if not i then return parse(x, round_up) end
    base, math_s = parse(x:sub(1, i - 1), false), x:sub(i + 2)
  end
  local ms, etype, reason = dates.apply_math(base, math_s, round_up, zone_ms)
  if not ms then errors.raise(400, etype, reason) end
  return ms
end

-- DateFieldType.termQuery is rangeQuery(v, v, true, true): the value rounded down to the value
-- rounded up, so "2024-02-29" is that whole day and "now/d" today (date math included).
local function date_term(types, field, ty, v)
  local format = mapping.format_of(types, field)
  return { date_value(v, false, format, nil, ty), date_value(v, true, format, nil, ty) }
end

-- A term / terms value on a date or numeric field is parsed like the field's own values, as
-- ES's field types do when they build the query: one that does not parse fails the shard
-- with the error range bounds get.
local function check_term_value(types, field, ty, v)
  if mapping.is_date(ty) then
    return date_term(types, field, ty, v)
  elseif ty and mapping.NUMERIC[ty] and tonumber(v) == nil then
    errors.raise(400, "number_format_exception", "For input string: \"" .. tostring(v) .. "\"")
  elseif ty == "boolean" and v ~= true and v ~= false and v ~= "true" and v ~= "false" then
    -- BooleanFieldType.indexedValueForSearch
    errors.raise(400, "illegal_argument_exception", "Can't parse boolean value [" .. tostring(v) .. "], expected [true] or [false]")
  elseif ty == "ip" then
    local s = tostring(v)
    local addr, len = s:match("^(.-)/(.*)$")
    if not mapping.ip_bytes(addr or s) then
      errors.raise(400, "illegal_argument_exception", "'" .. (addr or s) .. "' is not an IP string literal.")
    end
    if addr and not mapping.ip_cidr(s) then
      errors.raise(400, "illegal_argument_exception", "Illegal prefix length [" .. len .. "] in [" .. s ..
        "]. Must be 0-32 for IPv4 ranges, 0-128 for IPv6 ranges")
    end
  end
end

-- MappedFieldType.prefixQuery / wildcardQuery: only string fields have them; the others throw
-- a QueryShardException (kind: "prefix" or "wildcard").
local function need_string_field(types, field, kind)
  local ty = mapping.type_of(types, field)
  if ty and (mapping.NUMERIC[ty] or mapping.is_date(ty) or ty == "boolean" or ty == "ip") then
    errors.raise(400, "query_shard_exception", "Can only use " .. kind .. " queries on keyword, text and wildcard fields - not on [" ..
      field .. "] which is of type [" .. ty .. "]")
  end
end

-- A field neither indexed nor with doc values cannot be queried (a shard failure in ES).
local function searchable(types, field)
  local msg = mapping.not_searchable(types, field)
  if msg then errors.raise(400, "illegal_argument_exception", msg) end
end

local compile, ES_QUERIES

local function compile_list(v, types, what)
  if v == nil then return {} end
  if is_obj(v) then return { compile(v, types) } end
  if type(v) ~= "table" then perr("[bool] query does not support [" .. what .. "]") end
  local out = {}
  for _, q in ipairs(v) do out[#out + 1] = compile(q, types) end
  return out
end

local function msm(spec, n)
  if spec == nil then return nil end
  if type(spec) == "number" then
    if spec < 0 then return math.max(0, n + spec) end
    return spec
  end
  local s = tostring(spec)
  local pct = s:match("^(%-?%d+)%%$")
  if pct then
    local p = tonumber(pct)
    local c = math.floor(n * math.abs(p) / 100)
    if p < 0 then return n - c end
    return c
  end
  local num = tonumber(s)
  if num then return num < 0 and math.max(0, n + num) or num end
  perr("[bool] failed to parse minimum_should_match [" .. s .. "]")
end

local builders = {}

-- The name of the index a query is being compiled for (nil when it is only parsed): the
-- _index metadata field compares its terms with it.
local compiling_index

-- The _index field's queries (IndexFieldType, a ConstantFieldType): every document of the
-- index when its name matches (matches(name): ci, the name lower-cased), else none.
local function index_query(ci, matches)
  local name = compiling_index
  if name and matches(ci and name:lower() or name) then return function() return true, 1.0 end end
  return builders.match_none()
end

-- termQuery / termsQuery: a value matching the name (Regex.simpleMatch: "*" wildcards)
local function index_terms(list, ci)
  return index_query(ci, function(name)
    for _, v in ipairs(list) do
      local pat = tostring(v)
      if ci then pat = pat:lower() end
      if pat:find("*", 1, true) then
        if name:match("^" .. pat:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", ".*") .. "$") then return true end
      elseif pat == name then
        return true
      end
    end
    return false
  end)
end

builders.match_all = function() return function() return true, 1.0 end end
builders.match_none = function() return function() return false, 0 end end

builders.term = function(body, types)
  local field, v = field_entry("term", body)
  check_options("term", v)
  searchable(types, field)
  local ci = false
  if is_obj(v) then
    ci = v.case_insensitive == true
    if v.value == nil then perr("[term] query does not support [" .. field .. "]") end
    v = v.value
  end
  if type(v) == "table" then perr("[term] query does not support array of values") end
  -- the _id metadata field: IdFieldType.termQuery is the ids query
  if field == "_id" then return builders.ids({ values = { v } }) end
  if field == "_index" then return index_terms({ v }, ci) end
  local ty = mapping.type_of(types, field)
  v = check_term_value(types, field, ty, v) or v
  return function(rec)
    for _, dv in ipairs(values(rec.source, field, types)) do
      if term_matches(ty, dv, v, ci) then return true, 1.0 end
    end
    return false, 0
  end
end

-- XContentMapValues.extractRawValues: the values at a dotted path of a source, arrays
-- flattened (nulls skipped); a key may itself contain dots ("a.b" tried when "a" is absent),
-- and a scalar met before the path ends is taken as it is, as ES does.
local function raw_values(part, elems, i, out)
  if i > #elems then return end
  local key = elems[i]
  local cur = part[key]
  local nxt = i + 1
  while (cur == nil or cur == null) and nxt <= #elems do
    key = key .. "." .. elems[nxt]
    cur = part[key]
    nxt = nxt + 1
  end
  if cur == nil or cur == null then return end
  local function walk(v)
    if v == null then return end
    if is_obj(v) then raw_values(v, elems, nxt, out)
    elseif type(v) == "table" then for _, x in ipairs(v) do walk(x) end
    else out[#out + 1] = v end
  end
  if type(cur) == "table" and not is_obj(cur) then
    for _, x in ipairs(cur) do walk(x) end
  else
    walk(cur)
  end
end

-- TermsQueryBuilder.doRewrite / fetch: a terms lookup is a real-time get of the document
-- (a missing index fails the whole search with index_not_found_exception) whose _source
-- values at path are the terms; a missing document gives no terms (match_none).
local TERMS_LOOKUP = { index = true, id = true, path = true, routing = true, type = true }
local function terms_lookup(spec)
  local missing = {}
  for _, k in ipairs({ "index", "id", "path" }) do if spec[k] == nil then missing[#missing + 1] = k end end
  if #missing > 0 then errors.raise(400, "illegal_argument_exception", "Required [" .. table.concat(missing, ", ") .. "]") end
  for k, v in pairs(spec) do
    if not TERMS_LOOKUP[k] then errors.raise(400, "x_content_parse_exception", "[terms_lookup] unknown field [" .. k .. "]") end
    if type(v) == "table" then errors.raise(400, "x_content_parse_exception", "[terms_lookup] failed to parse field [" .. k .. "]") end
  end
  local store = require "esxd.store"
  local idx = store.get(tostring(spec.index))
  if not idx then error(errors.index_not_found(tostring(spec.index)), 0) end
  local rec = idx.docs[tostring(spec.id)]
  local out = {}
  if rec and type(rec.source) == "table" then
    local elems = {}
    for e in tostring(spec.path):gmatch("[^.]+") do elems[#elems + 1] = e end
    raw_values(rec.source, elems, 1, out)
  end
  return out
end

builders.terms = function(body, types)
  local field, list = field_entry("terms", body)
  if is_obj(list) then
    -- an object is a terms lookup (TermsLookup's ConstructingObjectParser requires index, id
    -- and path); no terms rewrite to match_none before the field is looked at
    list = terms_lookup(list)
    if #list == 0 then return builders.match_none() end
  end
  if type(list) ~= "table" then
    perr("[terms] query does not support [" .. field .. "]")
  end
  if field == "_id" then return builders.ids({ values = list }) end -- IdFieldType.termsQuery
  if field == "_index" then return index_terms(list) end
  local ty = mapping.type_of(types, field)
  -- TermsQueryBuilder.doToQuery (a field that is not mapped was rewritten to match_none)
  local max = mapping.limits_of(types).max_terms_count or 65536
  if ty and #list > max then
    errors.raise(400, "illegal_argument_exception", "The number of terms [" .. #list .. "] used in the Terms Query request " ..
      "has exceeded the allowed maximum of [" .. max .. "]. This maximum can be set by changing the [index.max_terms_count] index level setting.")
  end
  searchable(types, field)
  local qs = {}
  for i, q in ipairs(list) do qs[i] = check_term_value(types, field, ty, q) or q end
  list = qs
  return function(rec)
    for _, dv in ipairs(values(rec.source, field, types)) do
      for _, q in ipairs(list) do
        if term_matches(ty, dv, q) then return true, 1.0 end
      end
    end
    return false, 0
  end
end

builders.ids = function(body)
  if not is_obj(body) then perr("[ids] query malformed, no start_object after query name") end
  local set = {}
  if body.values ~= nil and (type(body.values) ~= "table" or (is_obj(body.values) and next(body.values) ~= nil)) then
    perr("[ids] failed to parse field [values]")
  end
  for _, id in ipairs(body.values or {}) do set[tostring(id)] = true end
  return function(rec) if set[rec.id] then return true, 1.0 end return false, 0 end
end

builders.exists = function(body, types)
  if not is_obj(body) then perr("[exists] query malformed, no start_object after query name") end
  -- ExistsQueryBuilder.fromXContent
  for k, v in pairs(body) do
    if not is_value(v) then perr("[exists] unknown token [" .. token(v) .. "] after [" .. k .. "]") end
    if k ~= "field" and k ~= "boost" and k ~= "_name" then perr("[exists] query does not support [" .. k .. "]") end
  end
  if body.field == nil then perr("[exists] must be provided with a [field]") end
  local field = tostring(body.field)
  if not mapping.exists_findable(types, field) then return builders.match_none() end
  return function(rec)
    if #values(rec.source, field, types) > 0 then return true, 1.0 end
    return false, 0
  end
end

builders.prefix = function(body, types)
  local field, v = field_entry("prefix", body)
  check_options("prefix", v)
  searchable(types, field)
  need_string_field(types, field, "prefix")
  local ci = false
  if is_obj(v) then ci = v.case_insensitive == true; v = v.value end
  v = tostring(v)
  if field == "_index" then
    return index_query(ci, function(name) return name:sub(1, #v) == (ci and v:lower() or v) end)
  end
  local ty = mapping.type_of(types, field)
  return function(rec)
    for _, dv in ipairs(values(rec.source, field, types)) do
      local cands = ty == "text" and mapping.tokens(dv) or { tostring(dv) }
      for _, c in ipairs(cands) do
        if ci then c = c:lower() end
        if c:sub(1, #v) == (ci and v:lower() or v) then return true, 1.0 end
      end
    end
    return false, 0
  end
end

builders.wildcard = function(body, types)
  local field, v = field_entry("wildcard", body)
  check_options("wildcard", v)
  searchable(types, field)
  need_string_field(types, field, "wildcard")
  local ci = false
  if is_obj(v) then ci = v.case_insensitive == true; v = v.value or v.wildcard end
  if ci then v = tostring(v):lower() end
  local pat = "^" .. tostring(v):gsub("[%^%$%(%)%%%.%[%]%+%-]", "%%%0"):gsub("%*", ".*"):gsub("%?", ".") .. "$"
  if field == "_index" then return index_query(ci, function(name) return name:match(pat) ~= nil end) end
  local ty = mapping.type_of(types, field)
  return function(rec)
    for _, dv in ipairs(values(rec.source, field, types)) do
      local cands = ty == "text" and mapping.tokens(dv) or { tostring(dv) }
      for _, c in ipairs(cands) do
        if ci then c = c:lower() end
        if c:match(pat) then return true, 1.0 end
      end
    end
    return false, 0
  end
end

-- The range formats esxd reads: these parsers, alone or joined with "||"
local RANGE_FORMATS = { strict_date_optional_time = true, date_optional_time = true, epoch_millis = true,
  epoch_second = true }
local function range_format_ok(f)
  if type(f) ~= "string" or f == "" then return false end
  for part in (f .. "||"):gmatch("(.-)||") do
    if not RANGE_FORMATS[part] then return false end
  end
  return true
end
local RANGE_KEYS = { gt = true, gte = true, lt = true, lte = true, format = true, time_zone = true,
  boost = true, relation = true, from = true, to = true, include_lower = true, include_upper = true }

-- the keys' order when it is not known (a query not decoded from a body)
local RANGE_ORDER = { "from", "to", "include_lower", "include_upper", "gt", "gte", "lt", "lte" }

builders.range = function(body, types)
  -- RangeQueryBuilder.fromXContent: only objects (a field's bounds) at this level
  if is_obj(body) then
    for k, v in pairs(body) do
      if not is_obj(v) then perr("[range] query does not support [" .. k .. "]") end
    end
  end
  local field, spec = field_entry("range", body)
  for k, val in pairs(spec) do
    if not RANGE_KEYS[k] then perr("[range] query does not support [" .. k .. "]") end
    -- esxd's dates are ISO-8601 / epoch millis in fixed UTC offsets only: region time zones and
    -- other formats are refused
    if k == "time_zone" and not dates.zone_offset(val) then perr("[range] query does not support [time_zone]") end
    if k == "format" and not range_format_ok(val) then perr("[range] query does not support [format]") end
  end
  searchable(types, field)
  local ty = mapping.type_of(types, field)
  local is_date = mapping.is_date(ty)
  -- the query's format, else the field's mapping format (epoch_millis: numbers only), as ES
  -- RangeQueryBuilder.fromXContent reads the keys in order: gt / gte / from set the lower
  -- bound, gt / gte / include_lower its inclusion (the upper one likewise), so the last key
  -- given wins ({"gt": 1, "gte": 2} is gte 2)
  local from, to, incl_lower, incl_upper = null, null, true, true
  for _, k in ipairs(json.keys(spec) or RANGE_ORDER) do
    local val = spec[k]
    if val ~= nil then
      if k == "from" then from = val
      elseif k == "to" then to = val
      elseif k == "include_lower" then incl_lower = val ~= false and val ~= "false"
      elseif k == "include_upper" then incl_upper = val ~= false and val ~= "false"
      elseif k == "gt" then from, incl_lower = val, false
      elseif k == "gte" then from, incl_lower = val, true
      elseif k == "lt" then to, incl_upper = val, false
      elseif k == "lte" then to, incl_upper = val, true end
    end
  end
  local format = spec.format or mapping.format_of(types, field)
  if is_date and not spec.format then
    -- DateFieldType.rangeQuery: a number among the bounds forces epoch_millis on all of them
    if type(from) == "number" or type(to) == "number" then format = "epoch_millis" end
  end
  local zone_ms = spec.time_zone and dates.zone_offset(spec.time_zone)
  local function conv(x, round_up)
    if x == nil or x == null then return nil end
    -- the query's own format parses numbers too (as their text: epoch_second's are seconds)
    if is_date and spec.format and type(x) == "number" then x = json.number(x) end
    if is_date then return date_value(x, round_up, format, zone_ms, ty) end
    if ty and mapping.NUMERIC[ty] then
      local n = tonumber(x)
      if not n then errors.raise(400, "number_format_exception", "For input string: \"" .. tostring(x) .. "\"") end
      return n
    end
    if ty == "ip" then
      local b = mapping.ip_bytes(x)
      if not b then errors.raise(400, "illegal_argument_exception", "'" .. tostring(x) .. "' is not an IP string literal.") end
      return b
    end
    if ty == nil and type(x) == "number" then return x end
    return tostring(x)
  end
  -- DateFieldType.rangeQuery rounds gt and lte bounds up (roundUp = !includeLower / includeUpper)
  local gt, gte, lt, lte
  if incl_lower then gte = conv(from, false) else gt = conv(from, true) end
  if incl_upper then lte = conv(to, true) else lt = conv(to, false) end
  return function(rec)
    for _, dv in ipairs(values(rec.source, field, types)) do
      local x
      if is_date then x = dates.parse(dv)
      elseif ty == "ip" then x = mapping.ip_bytes(dv)
      elseif type(gt or gte or lt or lte) == "number" then x = tonumber(dv)
      else x = tostring(dv) end
      if x ~= nil and type(x) == type(gt or gte or lt or lte or x)
        and (gt == nil or x > gt) and (gte == nil or x >= gte)
        and (lt == nil or x < lt) and (lte == nil or x <= lte) then
        return true, 1.0
      end
    end
    return false, 0
  end
end

builders.match = function(body, types)
  local field, v = field_entry("match", body)
  check_options("match", v)
  searchable(types, field)
  local op = "or"
  local min_match, lenient
  if is_obj(v) then
    if v.query == nil then perr("[match] requires query value") end
    op = tostring(v.operator or "or"):lower()
    if op ~= "or" and op ~= "and" then errors.raise(400, "illegal_argument_exception", "No enum constant org.elasticsearch.index.query.Operator." .. op:upper()) end
    min_match = v.minimum_should_match
    lenient = v.lenient == true or v.lenient == "true"
    v = v.query
  end
  -- _index: the name is one term (its term query), as for a keyword
  if field == "_index" then return index_terms({ v }) end
  local ty = mapping.type_of(types, field)
  if ty ~= "text" and ty ~= nil then
    -- keyword / numeric / date / boolean: the query is not tokenised but is the field's term
    -- query (MatchQueryParser.termQuery), whose value the field parses unless lenient
    if not lenient then v = check_term_value(types, field, ty, v) or v
    elseif mapping.is_date(ty) then
      -- lenient: a value the field cannot parse matches nothing
      local ok, r = pcall(check_term_value, types, field, ty, v)
      if not ok then return builders.match_none() end
      v = r
    end
    return function(rec)
      for _, dv in ipairs(values(rec.source, field, types)) do
        if term_matches(ty, dv, v) then return true, 1.0 end
      end
      return false, 0
    end
  end
  local qtoks = mapping.tokens(type(v) == "boolean" and tostring(v) or v)
  local need = op == "and" and #qtoks or (msm(min_match, #qtoks) or 1)
  return function(rec)
    if #qtoks == 0 then return false, 0 end
    local have = {}
    for _, dv in ipairs(values(rec.source, field, types)) do
      for _, tok in ipairs(mapping.tokens(dv)) do have[tok] = true end
    end
    local n = 0
    for _, q in ipairs(qtoks) do if have[q] then n = n + 1 end end
    if n >= need and n > 0 then return true, n * 1.0 end
    return false, 0
  end
end

-- Are the tokens qtoks (at least one) in a row in toks?
local function phrase_in(toks, qtoks)
  local n = #qtoks
  for i = 1, #toks - n + 1 do
    local j = 0
    while j < n and toks[i + j] == qtoks[j + 1] do j = j + 1 end
    if j == n then return true end
  end
  return false
end

-- match_phrase (MatchPhraseQueryBuilder): on a text field, the query's tokens one after the
-- other in one value (ES's position_increment_gap keeps a phrase from spanning two values of
-- an array); other fields take it as match does, as their term query. Scores the number of
-- the phrase's tokens. slop other than 0 is refused (not implemented).
builders.match_phrase = function(body, types)
  local field, v = field_entry("match_phrase", body)
  check_options("match_phrase", v)
  searchable(types, field)
  if is_obj(v) then
    if v.query == nil then perr("[match_phrase] requires query value") end
    v = v.query
  end
  local ty = mapping.type_of(types, field)
  if field == "_index" or (ty ~= "text" and ty ~= nil) then return builders.match({ [field] = v }, types) end
  local qtoks = mapping.tokens(type(v) == "boolean" and tostring(v) or v)
  local n = #qtoks
  return function(rec)
    if n == 0 then return false, 0 end
    for _, dv in ipairs(values(rec.source, field, types)) do
      if phrase_in(mapping.tokens(dv), qtoks) then return true, n * 1.0 end
    end
    return false, 0
  end
end

-- multi_match (MultiMatchQueryBuilder): match (or match_phrase for type phrase) on each
-- field; best_fields scores the best field plus tie_breaker times the others, most_fields
-- the sum. Fields: names, "name^boost" (the boost is not used: see Scoring), "*" patterns
-- over the mapped fields (lenient there, as ES's field expansion), default every field
-- (index.query.default_field "*").
builders.multi_match = function(body, types)
  if not is_obj(body) then perr("[multi_match] query malformed, no start_object after query name") end
  check_options("multi_match", body)
  if body.query == nil then perr("No text specified for multi_match query") end
  local kind = body.type or "best_fields"
  local lenient = body.lenient == true or body.lenient == "true"
  local list = body.fields
  if list == nil then list = { "*" } elseif type(list) ~= "table" then list = { list } end
  local names, seen = {}, {}
  local function add(f, len)
    if not seen[f] then seen[f] = true; names[#names + 1] = { f, len } end
  end
  for _, f in ipairs(list) do
    f = tostring(f):gsub("%^[%d%.]*$", "")
    if f:find("*", 1, true) then
      local pat = "^" .. f:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", ".*") .. "$"
      local all = {}
      for path, ty in pairs(types or {}) do
        if ty ~= "object" and ty ~= "nested" and path:match(pat) then all[#all + 1] = path end
      end
      table.sort(all)
      for _, path in ipairs(all) do add(path, true) end
    else
      add(f, lenient)
    end
  end
  local parts = {}
  for _, e in ipairs(names) do
    local field, len = e[1], e[2]
    local ok, fn = pcall(function()
      if kind == "phrase" then return builders.match_phrase({ [field] = body.query }, types) end
      return builders.match({ [field] = { query = body.query, operator = body.operator,
        minimum_should_match = body.minimum_should_match, lenient = len } }, types)
    end)
    if ok then parts[#parts + 1] = fn
    elseif not len then error(fn, 0) end
  end
  local tie = tonumber(body.tie_breaker) or 0
  return function(rec)
    local best, sum, any = 0, 0, false
    for _, fn in ipairs(parts) do
      local m, sc = fn(rec)
      if m then
        any = true
        sum = sum + sc
        if sc > best then best = sc end
      end
    end
    if not any then return false, 0 end
    if kind == "most_fields" then return true, sum end
    return true, best + tie * (sum - best)
  end
end

builders.bool = function(body, types)
  if not is_obj(body) then perr("[bool] query malformed, no start_object after query name") end
  for k in pairs(body) do
    if k ~= "must" and k ~= "filter" and k ~= "should" and k ~= "must_not" and k ~= "minimum_should_match"
      and k ~= "boost" and k ~= "_name" and k ~= "adjust_pure_negative" then
      perr("[bool] query does not support [" .. k .. "]")
    end
  end
  local must = compile_list(body.must, types, "must")
  local filter = compile_list(body.filter, types, "filter")
  local should = compile_list(body.should, types, "should")
  local must_not = compile_list(body.must_not, types, "must_not")
  local need = msm(body.minimum_should_match, #should)
  if need == nil then need = (#must == 0 and #filter == 0) and (#should > 0 and 1 or 0) or 0 end
  local scoring = #must > 0 or #should > 0
  return function(rec)
    local score = 0
    for _, q in ipairs(must) do
      local ok, s = q(rec)
      if not ok then return false, 0 end
      score = score + s
    end
    for _, q in ipairs(filter) do if not q(rec) then return false, 0 end end
    for _, q in ipairs(must_not) do if q(rec) then return false, 0 end end
    local n = 0
    for _, q in ipairs(should) do
      local ok, s = q(rec)
      if ok then n = n + 1; score = score + s end
    end
    if n < need then return false, 0 end
    if not scoring then return true, 0.0 end
    return true, score
  end
end

builders.constant_score = function(body, types)
  if not is_obj(body) then perr("[constant_score] query malformed, no start_object after query name") end
  -- ConstantScoreQueryBuilder.fromXContent
  for k, v in pairs(body) do
    if (is_obj(v) and k ~= "filter") or (is_value(v) and k ~= "boost" and k ~= "_name") then
      perr("[constant_score] query does not support [" .. k .. "]")
    end
    if not is_obj(v) and not is_value(v) then perr("unexpected token [" .. token(v) .. "]") end
  end
  if body.filter == nil then perr("[constant_score] requires a 'filter' element") end
  local f = compile(body.filter, types)
  local boost = tonumber(body.boost) or 1.0
  return function(rec) if f(rec) then return true, boost end return false, 0 end
end

-- query_string (and ?q=): a small subset of Lucene syntax: whitespace-separated clauses,
-- each "field:value" or "value" (default field, else all fields), quoted phrases matched as
-- all their tokens, "*" / "?" wildcards (lowercased on text fields), optional +/- prefixes,
-- combined as Lucene's classic QueryParser combines them (QueryParserBase.addClause): AND /
-- && make the clause and the one before required, OR / || make them optional under
-- default_operator AND, NOT / ! / - prohibit, + requires; a query of prohibited clauses only
-- matches every other document (ES's fixNegativeQueryIfNeeded). lenient makes a clause whose
-- value does not fit a numeric/date field match nothing.
local function qs_clauses(text)
  local out = {}
  local i, n = 1, #text
  while i <= n do
    local c = text:sub(i, i)
    if c:match("%s") then i = i + 1
    else
      local j = i
      local inq = false
      while j <= n do
        local d = text:sub(j, j)
        if d == '"' then inq = not inq
        elseif d:match("%s") and not inq then break end
        j = j + 1
      end
      out[#out + 1] = text:sub(i, j - 1)
      i = j
    end
  end
  return out
end

builders.query_string = function(body, types)
  if not is_obj(body) or body.query == nil then perr("[query_string] requires 'query' element") end
  check_options("query_string", body)
  local op = tostring(body.default_operator or "or"):lower()
  local lenient = body.lenient == true or body.lenient == "true"
  local df = body.default_field or body.df
  if df == "*" then df = nil end
  local parts = {}
  -- QueryParserBase.addClause: the occurrence of a clause from its conjunction and modifier,
  -- which may also change the clause before it
  local function add(conj, mod, fn)
    local prev = parts[#parts]
    if prev and conj == "and" and prev.occur ~= "must_not" then prev.occur = "must" end
    if prev and op == "and" and conj == "or" and prev.occur ~= "must_not" then prev.occur = "should" end
    local occur
    if mod == "not" then occur = "must_not"
    elseif op == "and" then occur = conj ~= "or" and "must" or "should"
    else occur = (mod == "req" or conj == "and") and "must" or "should" end
    parts[#parts + 1] = { occur = occur, fn = fn }
  end
  local conj, mod
  for _, clause in ipairs(qs_clauses(tostring(body.query))) do
    if clause == "AND" or clause == "&&" then conj = "and"
    elseif clause == "OR" or clause == "||" then conj = "or"
    elseif clause == "NOT" then mod = "not"
    else
      local c1 = clause:sub(1, 1)
      if c1 == "+" then mod = "req"; clause = clause:sub(2)
      elseif c1 == "-" or c1 == "!" then mod = "not"; clause = clause:sub(2) end
      local field, value = clause:match("^([%w_%.%-%*]+):(.+)$")
      if not field then field, value = df, clause end
      if clause == "*" or (field and value == "*") then
        add(conj, mod, field and builders.exists({ field = field }) or builders.match_all())
      else
        local fn
        local phrase = value:match('^"(.*)"$')
        local ty = field and mapping.type_of(types, field)
        local skip = false
        local prefix = not phrase and value:match("^[^%*%?]*%*$")
        local wild = not phrase and value:find("[%*%?]")
        if field and ty and wild and (mapping.NUMERIC[ty] or mapping.is_date(ty) or ty == "boolean" or ty == "ip") then
          -- QueryStringQueryParser.getPrefixQuerySingle / getWildcardQuerySingle: "12*" is the
          -- field type's prefix query, "1?" / "1*2" its (normalized) wildcard query, which only
          -- string fields have (lenient: no match)
          if lenient then skip = true else need_string_field(types, field, prefix and "prefix" or "wildcard") end
        elseif field and ty and mapping.NUMERIC[ty] and not tonumber(value) then
          if lenient then skip = true
          else errors.raise(400, "number_format_exception", 'For input string: "' .. value .. '"') end
        end
        -- a date field's value is its term query (DateFieldType.termQuery), built by match below:
        -- date math ("now-1d"), the field's format, and the parse failure unless lenient
        if not skip then
          if value:find("[%*%?]") and not phrase then
            local v = (ty == nil or ty == "text") and value:lower() or value
            if field then
              fn = builders.wildcard({ [field] = v }, types)
            else
              local pat = "^" .. v:gsub("[%^%$%(%)%%%.%[%]%+%-]", "%%%0"):gsub("%*", ".*"):gsub("%?", ".") .. "$"
              fn = function(rec)
                local function walk(node)
                  if type(node) == "table" then
                    for _, x in pairs(node) do if walk(x) then return true end end
                  elseif node ~= nil and node ~= null then
                    for _, t in ipairs(mapping.tokens(node)) do if t:match(pat) then return true end end
                  end
                  return false
                end
                return walk(rec.source), 1.0
              end
            end
          elseif field and phrase and (ty == nil or ty == "text") then
            -- a quoted value is a phrase query (the field's analyzer, tokens in a row)
            fn = builders.match_phrase({ [field] = phrase }, types)
          elseif field then
            fn = builders.match({ [field] = { query = phrase or value, operator = phrase and "and" or "or", lenient = lenient } }, types)
          else
            local qt = mapping.tokens(phrase or value)
            fn = function(rec)
              local have = {}
              local in_row = false
              local function walk(node)
                if type(node) == "table" then
                  for _, x in pairs(node) do walk(x) end
                elseif node ~= nil and node ~= null then
                  local toks = mapping.tokens(node)
                  for _, t in ipairs(toks) do have[t] = true end
                  if phrase and #qt > 0 and phrase_in(toks, qt) then in_row = true end
                end
              end
              walk(rec.source)
              local n = 0
              for _, t in ipairs(qt) do if have[t] then n = n + 1 end end
              if n > 0 and (not phrase or in_row) then return true, n * 1.0 end
              return false, 0
            end
          end
          add(conj, mod, fn)
        else
          -- lenient: ES's newLenientFieldQuery, a clause that matches nothing
          add(conj, mod, builders.match_none())
        end
      end
      conj, mod = nil, nil
    end
  end
  local positive = false
  for _, p in ipairs(parts) do if p.occur ~= "must_not" then positive = true end end
  return function(rec)
    local score, any = 0, not positive and #parts > 0
    for _, p in ipairs(parts) do
      local ok, sc = p.fn(rec)
      if p.occur == "must_not" then
        if ok then return false, 0 end
      elseif p.occur == "must" then
        if not ok then return false, 0 end
        any = true; score = score + sc
      elseif ok then
        any = true; score = score + sc
      end
    end
    if any then return true, score end
    return false, 0
  end
end

-- AbstractQueryBuilder.parseInnerQueryBuilder. ES's "empty clause" reason ends with the
-- clause's position ("found at [1:11]"), which esxd does not track.
-- The queries ES 8 registers (server, modules, the default distribution's plugins): the
-- candidates of its "did you mean" (esxd implements some of them, see README).
ES_QUERIES = {}
for w in ([[bool boosting combined_fields constant_score dis_max distance_feature exists
  field_masking_span function_score fuzzy geo_bounding_box geo_distance geo_grid geo_polygon geo_shape
  has_child has_parent ids intervals knn match match_all match_bool_prefix match_none match_phrase
  match_phrase_prefix more_like_this multi_match nested parent_id percolate pinned prefix query_string
  range rank_feature regexp rule script script_score semantic shape simple_query_string span_containing
  span_field_masking span_first span_multi span_near span_not span_or span_term span_within
  sparse_vector term terms terms_set text_expansion weighted_tokens wildcard wrapper]]):gmatch("%S+") do
  ES_QUERIES[#ES_QUERIES + 1] = w
end

compile = function(q, types)
  if not is_obj(q) then perr("[_na] query malformed, must start with start_object") end
  if next(q) == nil then errors.raise(400, "illegal_argument_exception", "query malformed, empty clause found") end
  local name, body
  for k, v in pairs(q) do
    if name then perr("[" .. name .. "] malformed query, expected [END_OBJECT] but found [FIELD_NAME]") end
    name, body = k, v
  end
  if not name then return builders.match_all() end
  local b = builders[name]
  if not b then
    errors.raise(400, "parsing_exception", "unknown query [" .. name .. "]" .. suggest.suffix(name, ES_QUERIES), nil,
      { caused_by = { type = "named_object_not_found_exception", reason = "[1:1] unknown field [" .. name .. "]" } })
  end
  return b(body, types)
end

-- compile(query, types[, index name]) -> matcher(rec) -> matched, score
function _M.compile(q, types, index)
  compiling_index = index
  return compile(q, types)
end
_M.is_obj = is_obj

return _M
