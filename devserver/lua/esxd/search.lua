-- esxd.search: _search and _count execution over one or more indices: index resolution,
-- query matching against the refreshed (visible) documents, sorting, paging, total hits
-- tracking, _source filtering and aggregations.
local json = require "esxd.json"
local errors = require "esxd.errors"
local store = require "esxd.store"
local names = require "esxd.names"
local query = require "esxd.query"
local aggs = require "esxd.aggs"
local mapping = require "esxd.mapping"
local dates = require "esxd.dates"
local source_filter = require "esxd.source_filter"
local fetch_fields = require "esxd.fetch_fields"

local _M = {}
local null = json.null
local MAX_WINDOW = 10000

-- an object (json.decode marks empty arrays, so [] is not one)
local function is_obj(t)
  return type(t) == "table" and t ~= null and not json.is_array(t) and (next(t) == nil or #t == 0)
end

local function truthy(v) return v == "" or v == "true" or v == true end

-- Resolve index targets. Returns list of index objects or raises.
local WILDCARD_STATES = { open = true, closed = true, hidden = true, none = true, all = true }

-- expand_wildcards: esxd has no closed or hidden indices, so open/closed/hidden/all all
-- expand to the (non-dot) indices; "none" alone expands wildcards to nothing.
local function expand_none(v)
  if v == nil then return false end
  local none, any = false, false
  for w in (v .. ","):gmatch("([^,]*),") do
    if not WILDCARD_STATES[w] then errors.raise(400, "illegal_argument_exception", "No valid expand wildcard value [" .. w .. "]") end
    if w == "none" then none = true else any = true end
  end
  return none and not any
end

function _M.targets(expr, params)
  local list, err = names.resolve(expr, store.names(), { ignore_unavailable = truthy(params.ignore_unavailable),
    no_wildcards = expand_none(params.expand_wildcards), allow_no_indices = params.allow_no_indices ~= "false" })
  if not list then error(err, 0) end
  local out = {}
  for _, n in ipairs(list) do out[#out + 1] = store.get(n) end
  return out
end

-- n: the searched indices (their shard count) or a number of shards; failures: the
-- search_phase errors of the indices whose shards failed (all of an index's shards fail
-- alike, and ES's ExceptionsHelper.groupBy lists them once, as the first shard's failure)
local function shards_obj(n, failures)
  local failed, list = 0, nil
  if type(n) == "table" then
    local total, bad = 0, {}
    for _, e in ipairs(failures or {}) do bad[e.failed_index] = true end
    for _, idx in ipairs(n) do
      total = total + (idx.shards or 1)
      if bad[idx.name] then failed = failed + (idx.shards or 1) end
    end
    n = total
  end
  if failures and #failures > 0 then
    list = json.array()
    for _, e in ipairs(failures) do list[#list + 1] = e.shard_failure end
  end
  return json.obj("total", n, "successful", n - failed, "skipped", 0, "failed", failed, "failures", list)
end
_M.shards_obj = shards_obj

local KNOWN = { query = true, from = true, size = true, sort = true, _source = true, track_total_hits = true,
  aggs = true, aggregations = true, timeout = true, track_scores = true, version = true, seq_no_primary_term = true,
  stored_fields = true, explain = true, min_score = true, post_filter = true, terminate_after = true,
  profile = true, docvalue_fields = true, fields = true, highlight = true, search_after = true,
  collapse = true, runtime_mappings = true, indices_boost = true, pit = true, suggest = true, rescore = true,
  script_fields = true, stats = true }
_M.KNOWN = KNOWN
-- Valid in ES but not implemented by esxd: refused (with ES's unknown-key error) rather than
-- ignored, since ignoring them changes which hits come back (collapse, terminate_after) or
-- leaves out what the caller asked for. explain / profile: only false.
local UNSUPPORTED = { pit = true, collapse = true, terminate_after = true, rescore = true,
  indices_boost = true, script_fields = true, runtime_mappings = true, highlight = true, suggest = true,
  explain = "unless_false", profile = "unless_false" }

local function json_kind(v)
  if is_obj(v) then return "START_OBJECT" end
  if type(v) == "table" then return "START_ARRAY" end
  if type(v) == "number" then return "VALUE_NUMBER" end
  if type(v) == "boolean" then return "VALUE_BOOLEAN" end
  if v == null then return "VALUE_NULL" end
  return "VALUE_STRING"
end
_M.json_kind = json_kind

local function int_param(name, v, default)
  if v == nil or v == null then return default end
  local n = tonumber(v)
  if not n or n ~= math.floor(n) then
    errors.raise(400, "illegal_argument_exception", "Failed to parse int parameter [" .. name .. "] with value [" .. tostring(v) .. "]")
  end
  return n
end

local SORT_KEYS = { order = true, missing = true, unmapped_type = true, mode = true }

-- Build the list of sort clauses: {field=, dir=, missing=, unmapped_type=, mode=}
local function parse_sort(spec)
  if spec == nil or spec == null then return nil end
  local items = {}
  if type(spec) == "string" then
    for part in spec:gmatch("[^,]+") do
      local f, d = part:match("^([^:]+):?(.*)$")
      items[#items + 1] = { field = f, dir = d ~= "" and d or nil }
    end
  else
    if type(spec) ~= "table" then errors.raise(400, "parsing_exception", "[sort] unexpected token [" .. json_kind(spec) .. "]") end
    local list = is_obj(spec) and { spec } or spec
    for _, s in ipairs(list) do
      if type(s) == "string" then items[#items + 1] = { field = s }
      elseif is_obj(s) then
        for f, o in pairs(s) do
          if type(o) == "string" then items[#items + 1] = { field = f, dir = o }
          elseif is_obj(o) then
            -- FieldSortBuilder's parser ("field_sort"): a key it does not know is its error,
            -- and so are the ones esxd does not implement (numeric_type, format, nested, the
            -- modes other than min and max), rather than being ignored
            for k, v in pairs(o) do
              if not SORT_KEYS[k] or (k == "mode" and v ~= "min" and v ~= "max") then
                errors.raise(400, "x_content_parse_exception", "[field_sort] unknown field [" .. tostring(k) .. "]")
              end
            end
            items[#items + 1] = { field = f, dir = o.order, missing = o.missing, unmapped_type = o.unmapped_type,
              mode = o.mode }
          else errors.raise(400, "parsing_exception", "[" .. f .. "] failed to parse field [sort]") end
        end
      else
        errors.raise(400, "parsing_exception", "[sort] unexpected token [" .. json_kind(s) .. "]")
      end
    end
  end
  for _, it in ipairs(items) do
    if it.dir ~= nil then
      it.dir = tostring(it.dir):lower()
      if it.dir ~= "asc" and it.dir ~= "desc" then
        errors.raise(400, "illegal_argument_exception", "Unknown SortOrder [" .. it.dir .. "]")
      end
    else
      it.dir = (it.field == "_score") and "desc" or "asc"
    end
  end
  return items
end

local function sort_value(hit, it)
  if it.field == "_score" then return hit.score end
  if it.field == "_doc" then return hit.order end
  if it.field == "_index" then return hit.index end
  local ty = hit.types and mapping.type_of(hit.types, it.field)
  local fd = hit.types and mapping.fielddata_error(hit.types, it.field)
  if fd and fd ~= "text" then
    error(errors.search_phase(hit.index, errors.new(400, "illegal_argument_exception", fd)), 0)
  end
  if fd == "text" then
    error(errors.search_phase(hit.index, errors.new(400, "illegal_argument_exception",
      "Fielddata is disabled on [" .. it.field .. "] in [" .. hit.index .. "]. Text fields are not optimised for operations that require per-document field data like aggregations and sorting, so these operations are disabled by default. Please use a keyword field instead. Alternatively, set fielddata=true on [" .. it.field .. "] in order to load field data by uninverting the inverted index. Note that this can use significant memory.")), 0)
  end
  -- the field's doc values, as the mapping makes them (null_value, copy_to, ignore_above,
  -- ignore_malformed, epoch formats), as queries and aggregations see them
  local vals = mapping.values(hit.rec.source, it.field, ty and hit.types or nil)
  local parent = #vals == 0 and hit.types and mapping.multi_field_parent(hit.types, it.field)
  if parent then vals = mapping.values(hit.rec.source, parent, hit.types) end
  if ty == "text" then -- "fielddata": true: the field data are the tokens
    local toks = {}
    for _, v in ipairs(vals) do
      if type(v) ~= "table" then for _, t in ipairs(mapping.tokens(v)) do toks[#toks + 1] = t end end
    end
    vals = toks
  end
  if #vals == 0 and it.missing ~= nil and it.missing ~= "_first" and it.missing ~= "_last" then
    vals = { it.missing } -- a custom missing value: the document sorts as if it had it
  end
  local best
  for _, v in ipairs(vals) do
    local x = v
    if mapping.is_date(ty) then x = dates.parse(v)
    elseif ty and mapping.NUMERIC[ty] then x = tonumber(v)
    elseif ty == "ip" then x = mapping.ip_bytes(v)   -- ordered by its bytes, printed canonically
    elseif type(v) == "boolean" then x = v and 1 or 0 end
    if x ~= nil and type(x) ~= "table" then
      -- the mode: min for asc, max for desc unless given (SortMode)
      local low = (it.mode or (it.dir == "asc" and "min" or "max")) == "min"
      if best == nil or (type(best) == type(x) and ((low and x < best) or (not low and x > best))) then best = x end
    end
  end
  return best
end

-- The sort value ES shows for a document without a value: the extreme its numeric sort type
-- sorts last (or first) with, Long.MAX_VALUE / MIN_VALUE for the integral types, dates and
-- booleans (SortField.Type.LONG), +/-Infinity (a string, as Jackson writes it) for the
-- floating ones; null for keywords, text and ip.
local LONG_SORTED = { long = true, integer = true, short = true, byte = true, date = true, date_nanos = true,
  boolean = true }
local FLOAT_SORTED = { double = true, float = true, half_float = true, scaled_float = true }
local function missing_sort_value(ty, it)
  local high = (it.dir == "asc") == (it.missing ~= "_first")
  if LONG_SORTED[ty] then return json.raw(high and "9223372036854775807" or "-9223372036854775808") end
  if FLOAT_SORTED[ty] then return high and "Infinity" or "-Infinity" end
  return nil
end

-- FieldSortBuilder.build on a shard, documents or not: a field the index does not map fails
-- it unless unmapped_type names a type to sort it as; _id has no field data in ES 8
-- (indices.id_field_data.enabled is false).
local SORT_META = { _score = true, _doc = true, _index = true }
local function sort_check(idx, it)
  local where = { "index_uuid", idx.uuid, "index", idx.name }
  if it.field == "_id" then
    error(errors.search_phase(idx.name, errors.new(400, "illegal_argument_exception", "Fielddata access on the _id " ..
      "field is disallowed, you can re-enable it by updating the dynamic cluster setting: indices.id_field_data.enabled")), 0)
  end
  if not SORT_META[it.field] and it.unmapped_type == nil and mapping.type_of(idx.types, it.field) == nil then
    error(errors.search_phase(idx.name, errors.new(400, "query_shard_exception",
      "No mapping found for [" .. it.field .. "] in order to sort on", where)), 0)
  end
end

-- Where x sorts against y for one sort clause: -1 (x first), 0 (a tie) or 1. nil is a
-- document without a value: first with missing "_first", else last, whatever the order.
local function cmp_value(x, y, it)
  if x == y then return 0 end
  if x == nil then return it.missing == "_first" and -1 or 1 end
  if y == nil then return it.missing == "_first" and 1 or -1 end
  if type(x) ~= type(y) then x, y = tostring(x), tostring(y) end
  if x == y then return 0 end
  local less = x < y
  if it.dir == "desc" then less = not less end
  return less and -1 or 1
end

-- Where a hit's sort values sort against a tuple of values (another hit's, or search_after's).
local function cmp_values(a, b, sorts)
  for i, it in ipairs(sorts) do
    local c = cmp_value(a[i], b[i], it)
    if c ~= 0 then return c end
  end
  return 0
end

-- search_after (SearchAfterBuilder.fromXContent): an array of strings, numbers, booleans
-- and nulls, at least one; anything else is the key ES's parser does not know.
local function parse_search_after(v)
  if v == nil then return nil end
  if json_kind(v) ~= "START_ARRAY" then
    errors.raise(400, "parsing_exception", "Unknown key for a " .. json_kind(v) .. " in [search_after].")
  end
  for _, e in ipairs(v) do
    local k = json_kind(e)
    if k == "START_OBJECT" or k == "START_ARRAY" then
      errors.raise(400, "parsing_exception", "Expected [VALUE_STRING] or [VALUE_NUMBER] or [VALUE_BOOLEAN] or " ..
        "[VALUE_NULL] but found [" .. k .. "] inside search_after.")
    end
  end
  if #v == 0 then errors.raise(400, "illegal_argument_exception", "Values must contains at least one value.") end
  return v
end

-- The Lucene sort type a clause compares with on this index (SearchAfterBuilder.extractSortType).
local INT_SORTED = { integer = true, short = true, byte = true, boolean = true }
local BOXED = { int = "java.lang.Integer.intValue()", long = "java.lang.Long.longValue()",
  double = "java.lang.Double.doubleValue()", float = "java.lang.Float.floatValue()" }
local function sort_kind(ty, it)
  if it.field == "_doc" then return "int" end
  if it.field == "_score" then return "float" end
  if INT_SORTED[ty] then return "int" end
  if LONG_SORTED[ty] then return "long" end
  if ty == "double" or ty == "scaled_float" then return "double" end
  if FLOAT_SORTED[ty] then return "float" end
  return "string"
end

-- The search_after values for one index's shard (SearchService.parseSource, then
-- SearchAfterBuilder.buildFieldDoc and the comparators' setTopValue), in the space
-- sort_value puts a hit's values in: a value equal to what a document without the field
-- sorts as (Long.MIN/MAX, -/+Infinity) is that document's nil.
local function search_after_values(idx, after, sorts)
  local function fail(status, etype, reason, opts)
    error(errors.search_phase(idx.name, errors.new(status, etype, reason, nil, opts)), 0)
  end
  if not sorts or (#sorts == 1 and sorts[1].field == "_score" and sorts[1].dir == "desc") then
    fail(400, "illegal_argument_exception", "Sort must contain at least one field.")
  end
  if #after ~= #sorts then
    fail(400, "illegal_argument_exception", "search_after has " .. #after .. " value(s) but sort has " .. #sorts .. ".")
  end
  local out = {}
  for i, it in ipairs(sorts) do
    local v = after[i]
    local ty = it.field == "_index" and "keyword" or (mapping.type_of(idx.types, it.field) or it.unmapped_type)
    local kind = sort_kind(ty, it)
    if v == null then
      -- a numeric comparator's setTopValue unboxes it
      if BOXED[kind] then
        fail(500, "null_pointer_exception", 'Cannot invoke "' .. BOXED[kind] .. '" because "value" is null')
      end
    elseif kind == "string" then
      if type(v) == "number" then v = json.number(v) else v = tostring(v) end
      if ty == "ip" then
        local b = mapping.ip_bytes(v)
        if not b then fail(400, "illegal_argument_exception", "'" .. v .. "' is not an IP string literal.") end
        v = b
      end
      out[i] = v
    else
      local x = type(v) == "number" and v or nil
      if x == nil and type(v) == "string" then
        if v == "Infinity" or v == "-Infinity" then
          if kind == "double" or kind == "float" then x = v == "Infinity" and math.huge or -math.huge end
        elseif mapping.is_date(ty) and not v:match("^%-?%d+$") then x = dates.parse(v)
        else x = tonumber(v) end
      end
      if x == nil then
        local text = tostring(v)
        fail(400, "illegal_argument_exception", "Failed to parse search_after value for field [" .. it.field .. "].",
          { caused_by = { type = "number_format_exception", reason = 'For input string: "' .. text .. '"' } })
      end
      if kind == "int" then x = x < 0 and math.ceil(x) or math.floor(x) end
      local miss = missing_sort_value(ty, it)
      if (kind == "long" or kind == "int") and miss and x == tonumber(miss[1]) then x = nil
      elseif (kind == "double" or kind == "float") and miss and ((miss == "Infinity" and x == math.huge) or
          (miss == "-Infinity" and x == -math.huge)) then x = nil
      elseif ty == "date_nanos" and (type(v) == "number" or v:match("^%-?%d+$")) then x = x / 1e6 end
      out[i] = x
    end
  end
  return out
end

local function total_hits(n, tth, as_int)
  if tth == false then
    if as_int then return -1 end
    return nil
  end
  if tth == true or tth == -1 then
    if as_int then return n end
    return json.obj("value", n, "relation", "eq")
  end
  local limit = tth
  if n > limit then return json.obj("value", limit, "relation", "gte") end
  if as_int then return n end
  return json.obj("value", n, "relation", "eq")
end

local REQUEST_MINIMUMS = {
  { "batched_reduce_size", 2, "batchedReduceSize must be >= 2" },
  { "pre_filter_shard_size", 1, "preFilterShardSize must be >= 1" },
  { "max_concurrent_shard_requests", 1, "maxConcurrentShardRequests must be >= 1" },
}

-- The query compiled for one index. A failure of the shard's query phase (a value the field
-- cannot parse, ...) is ES's search_phase_execution_exception; request-level parse errors
-- stay as they are. SearchExecutionContext.toQuery wraps what building the query throws in a
-- query_shard_exception "failed to create query: ..." naming the index.
local function compile_on(q, idx)
  local okq, matcher = pcall(query.compile, q or { match_all = {} }, idx.types, idx.name)
  if not okq then
    local e = matcher
    local where = { "index_uuid", idx.uuid, "index", idx.name }
    if errors.is(e) and e.type == "query_shard_exception" then   -- rethrown as it is
      error(errors.search_phase(idx.name, errors.new(400, e.type, e.reason, where)), 0)
    elseif errors.is(e) and e.type ~= "parsing_exception" and e.type ~= "x_content_parse_exception" then
      error(errors.search_phase(idx.name, errors.new(400, "query_shard_exception", "failed to create query: " .. e.reason,
        where, { caused_by = { type = e.type, reason = e.reason, fields = e.fields, caused_by = e.caused_by } })), 0)
    end
    error(e, 0)
  end
  return matcher
end

-- RestSearchAction / RestCountAction parse the body before the indices are resolved: a query
-- that does not parse is a 400 even when no index matches (or the index is missing). The
-- query is compiled once without mappings for its parse errors; type-dependent failures
-- (a value a field cannot parse) are left to each index's compile_on. (The parsers' own
-- illegal_argument_exceptions, an empty clause or an unknown operator, are parse errors too.)
-- A terms lookup's missing index is found here too: ES fetches lookups on the coordinator
-- before it resolves the searched indices.
local PARSE_ERRORS = { parsing_exception = true, x_content_parse_exception = true, illegal_argument_exception = true,
  index_not_found_exception = true }
local function parse_query(q)
  if q == nil then return end
  local ok, e = pcall(query.compile, q, {})
  if not ok and errors.is(e) and PARSE_ERRORS[e.type] then
    error(e, 0)
  end
end

-- StoredFieldsContext.fromXContent / fromRestRequest: a name or a list of names (the URL's
-- split on commas); "_none_" alone is {none = true}, with other names ES's 400. text: the
-- body's JSON text, for the location of an entry that is no value.
local function parse_stored_fields(v, from_url, text)
  local list = {}
  if from_url then
    for f in v:gmatch("[^,]+") do list[#list + 1] = f end
  elseif type(v) == "string" then
    list[1] = v
  elseif json_kind(v) == "START_ARRAY" then
    -- numbers and booleans are their text; a null, an object or an array is ES 8.15's
    -- parser.text() failure, an IllegalStateException (500) with the token's location
    for i, f in ipairs(v) do
      if type(f) == "number" then list[#list + 1] = json.number(f)
      elseif type(f) == "string" or type(f) == "boolean" then list[#list + 1] = tostring(f)
      else
        local line, col = json.locate(text or "", { "stored_fields", i })
        errors.raise(500, "illegal_state_exception", "Can't get text on a " .. json_kind(f) ..
          (line and (" at " .. line .. ":" .. col) or ""))
      end
    end
  elseif v == nil then
    return nil
  else
    errors.raise(400, "parsing_exception", "Expected [VALUE_STRING] or [START_ARRAY] in [stored_fields] but found [" ..
      json_kind(v) .. "]")
  end
  if #list == 1 and list[1] == "_none_" then return { none = true } end
  for _, f in ipairs(list) do
    if f == "_none_" then errors.raise(400, "illegal_argument_exception", "cannot combine _none_ with other fields") end
  end
  return list
end

-- SearchRequest.validate (ES 8.13+, on the coordinating node, before the indices are
-- resolved), in its order: a from > 0 with search_after, then "_none_" stored fields with a
-- requested _source (sreq) or the fields option. Returns the list of messages, maybe empty.
local function validation_messages(from, after, sf, sreq, want_fields)
  local list = {}
  if from > 0 and after then list[#list + 1] = "[from] parameter must be set to 0 when [search_after] is used" end
  if sf and sf.none then
    if sreq then list[#list + 1] = "[stored_fields] cannot be disabled if [_source] is requested" end
    if want_fields then list[#list + 1] = "[stored_fields] cannot be disabled when using the [fields] option" end
  end
  return list
end

-- Does the request ask for _source (FetchSourceContext.fetchSource())? The URL's _source,
-- _source_includes or _source_excludes replace the body's _source (RestSearchAction):
-- they fetch unless _source is "false". The body's fetches unless it is false.
local function source_requested(params, body)
  if params._source ~= nil or params._source_includes ~= nil or params._source_excludes ~= nil then
    return params._source ~= "false"
  end
  return body._source ~= nil and body._source ~= false and body._source ~= null
end

-- Run a search. expr: index expression or nil; params: URI args; body: decoded body or nil;
-- text: the body's JSON text (for the locations in ES's messages), or nil. With
-- validate_only, it parses the request (raising its parse errors) and returns the list of
-- SearchRequest.validate's messages without running it (_msearch validates every search
-- before it runs any).
function _M.search(expr, params, body, started, path, text, validate_only)
  body = body or {}
  -- SearchSourceBuilder.parseXContent
  if not is_obj(body) then errors.raise(400, "parsing_exception", "Expected [START_OBJECT] but found [" .. json_kind(body) .. "]") end
  for k, v in pairs(body) do
    if not KNOWN[k] or (UNSUPPORTED[k] and not (UNSUPPORTED[k] == "unless_false" and v == false)) then
      errors.raise(400, "parsing_exception", "Unknown key for a " .. json_kind(v) .. " in [" .. k .. "].")
    end
  end
  -- RestSearchAction sets these on the SearchRequest after parsing the body; its setters
  -- refuse values below their minimum (msearch applies the last two to every search)
  for _, r in ipairs(REQUEST_MINIMUMS) do
    local v = params[r[1]]
    if v ~= nil and tonumber(v) < r[2] then errors.raise(400, "illegal_argument_exception", r[3]) end
  end
  local from = int_param("from", params.from or body.from, 0)
  -- RestSearchAction: a size parameter of -1 is no size parameter (the body's, else 10)
  local usize = params.size
  if usize ~= nil and int_param("size", usize) == -1 then usize = nil end
  local size = int_param("size", usize or body.size, 10)
  if from < 0 then errors.raise(400, "illegal_argument_exception", "[from] parameter cannot be negative but was [" .. from .. "]") end
  if size < 0 then errors.raise(400, "illegal_argument_exception", "[size] parameter cannot be negative, found [" .. size .. "]") end
  local as_int = truthy(params.rest_total_hits_as_int)
  local tth = params.track_total_hits
  if tth == nil then tth = body.track_total_hits end
  if tth == "true" then tth = true elseif tth == "false" then tth = false end
  if tth == nil then tth = as_int and true or MAX_WINDOW end
  if type(tth) ~= "boolean" then
    local n = tonumber(tth)
    if not n then errors.raise(400, "illegal_argument_exception", "Failed to parse int parameter [track_total_hits] with value [" .. tostring(tth) .. "]") end
    if n < -1 then errors.raise(400, "illegal_argument_exception", "[track_total_hits] parameter must be positive or equals to -1, got " .. n) end
    tth = n
    if as_int and n ~= -1 then
      errors.raise(400, "illegal_argument_exception", "[rest_total_hits_as_int] cannot be used if the tracking of total hits is not accurate, got " .. n)
    end
  end
  local sorts = parse_sort(params.sort or body.sort)
  local after = parse_search_after(body.search_after)
  -- the URL's _source, _source_includes, _source_excludes, when any is given, replace the
  -- body's _source (RestSearchAction sets FetchSourceContext.parseFromRestRequest over it)
  local url_source = params._source ~= nil or params._source_includes ~= nil or params._source_excludes ~= nil
  local srcf
  if url_source then
    srcf = source_filter.parse(params._source, params._source_includes, params._source_excludes)
  else
    srcf = source_filter.parse(body._source)
  end
  local agg_spec = body.aggs or body.aggregations
  if agg_spec ~= nil and not is_obj(agg_spec) then
    errors.raise(400, "parsing_exception", "Unknown key for a " .. json_kind(agg_spec) .. " in [" ..
      (body.aggs ~= nil and "aggs" or "aggregations") .. "].")
  end
  -- before the indices are resolved, as RestSearchAction parses the body first
  if agg_spec ~= nil then aggs.parse(agg_spec) end
  -- the URL's stored_fields replaces the body's (RestSearchAction)
  local sf = parse_stored_fields(body.stored_fields, false, text)
  if params.stored_fields ~= nil then sf = parse_stored_fields(params.stored_fields, true) end
  local want_fields = fetch_fields.parse(body.fields, "fields")
  local want_dv = fetch_fields.parse(body.docvalue_fields, "docvalue_fields")
  -- RestSearchAction adds ?docvalue_fields=a,b to the body's
  if type(params.docvalue_fields) == "string" then
    want_dv = want_dv or {}
    for f in params.docvalue_fields:gmatch("[^,]+") do want_dv[#want_dv + 1] = { field = f } end
  end
  local q = body.query
  -- the URL's q replaces the body's query (RestSearchAction applies it after the body)
  local uq = _M.url_query(params, path)
  if uq then q = uq end
  if q ~= nil and not is_obj(q) then errors.raise(400, "parsing_exception", "Unknown key for a " .. json_kind(q) .. " in [query].") end
  local post = body.post_filter
  parse_query(q)
  parse_query(post)
  local invalid = validation_messages(from, after, sf, source_requested(params, body), want_fields)
  if validate_only then return invalid end
  if #invalid > 0 then error(errors.validation(invalid), 0) end
  local idxs = _M.targets(expr, params)
  local min_score = tonumber(body.min_score)

  local hits, all_docs = {}, {}
  local agg_types = {}
  local order = 0
  -- Each index's shards run the query phase on their own, as in ES: one whose query, result
  -- window, sort or aggregations fail is a shard failure; the others' results are returned
  -- with _shards.failed / failures (AbstractSearchAsyncAction), unless every shard failed.
  local ok_idxs, failures = {}, {}
  local matched, all_max = 0, nil   -- every hit (search_after leaves some out of hits), the top score
  for _, idx in ipairs(idxs) do
    local idx_hits, idx_docs, idx_matched, idx_max = {}, {}, 0, nil
    local okr, err = pcall(function()
      local matcher = compile_on(q, idx)
      local pf = post and compile_on(post, idx)
      local window = idx.max_result_window or MAX_WINDOW
      if from + size > window then
        error(errors.search_phase(idx.name, errors.new(400, "illegal_argument_exception",
          ("Result window is too large, from + size must be less than or equal to: [%d] but was [%d]. See the scroll api for a more efficient way to request large data sets. This limit can be set by changing the [index.max_result_window] index level setting.")
            :format(window, from + size))), 0)
      end
      for _, it in ipairs(sorts or {}) do sort_check(idx, it) end
      local idx_after = after and search_after_values(idx, after, sorts)
      for _, rec in ipairs(idx.visible_list) do
        local ok, score = false, 0
        if not rec.dead then ok, score = matcher(rec) end
        if ok and (not min_score or score >= min_score) then
          idx_docs[#idx_docs + 1] = rec
          if not pf or pf(rec) then
            order = order + 1
            local h = { rec = rec, score = score, index = idx.name, types = idx.types, order = order }
            if sorts then
              h.sv = {}
              for i, it in ipairs(sorts) do h.sv[i] = sort_value(h, it) end
            end
            idx_matched = idx_matched + 1
            if idx_max == nil or score > idx_max then idx_max = score end
            -- search_after: only the hits after those values (a tie is not after them: ES's
            -- FieldDoc for search_after has doc id Integer.MAX_VALUE), counted all the same
            if not idx_after or cmp_values(h.sv, idx_after, sorts) > 0 then idx_hits[#idx_hits + 1] = h end
          end
        end
      end
      if agg_spec then   -- this index's own aggregation (its field types) fails on its shard
        aggs.set_indices(idx.types, { idx })
        aggs.run(agg_spec, idx_docs, idx.types)
      end
    end)
    if okr then
      ok_idxs[#ok_idxs + 1] = idx
      for k, v in pairs(idx.types) do if agg_types[k] == nil then agg_types[k] = v end end
      mapping.inherit(agg_types, idx.types)
      for _, rec in ipairs(idx_docs) do all_docs[#all_docs + 1] = rec end
      for _, h in ipairs(idx_hits) do hits[#hits + 1] = h end
      matched = matched + idx_matched
      if idx_max ~= nil and (all_max == nil or idx_max > all_max) then all_max = idx_max end
    elseif errors.is(err) and err.shard_failure then
      failures[#failures + 1] = err
    else
      error(err, 0)
    end
  end
  if #failures > 0 and #ok_idxs == 0 then error(errors.search_phase_all(failures, "all shards failed"), 0) end
  if #failures > 0 and params.allow_partial_search_results == "false" then
    error(errors.search_phase_all(failures, "Partial shards failure"), 0)
  end

  -- sorting
  local by_score = sorts == nil
  if sorts then
    table.sort(hits, function(a, b)
      local c = cmp_values(a.sv, b.sv, sorts)
      if c ~= 0 then return c < 0 end
      return a.order < b.order
    end)
    for _, it in ipairs(sorts) do if it.field == "_score" then by_score = true end end
  else
    table.sort(hits, function(a, b)
      if a.score ~= b.score then return a.score > b.score end
      return a.order < b.order
    end)
  end
  local track_scores = by_score or body.track_scores == true or truthy(params.track_scores)
  local want_version = body.version == true or truthy(params.version)
  local want_seq_no = body.seq_no_primary_term == true or truthy(params.seq_no_primary_term)

  local out_hits = json.array()
  local max_score
  if track_scores then max_score = all_max end
  -- stored_fields: [] drops _source; "_none_" drops _id and _source too
  local none = false
  local want_stored
  if sf ~= nil then
    none = sf.none
    -- stored_fields names the stored fields whose values the hits carry in "fields"
    for _, f in ipairs(sf) do
      if f ~= "_source" then
        want_stored = want_stored or {}
        want_stored[#want_stored + 1] = f
      end
    end
    local wants_source = false
    for _, f in ipairs(sf) do if f == "_source" then wants_source = true end end
    if not wants_source and body._source == nil and not url_source then srcf = false end
  end
  -- the fetch phase: each index with hits on the page builds its "fields" plan; one that
  -- fails (a format its field does not take, ...) is that index's shard failure, and its
  -- hits are left out
  local plans, fetch_failed = {}, {}
  local page = {}
  for i = from + 1, math.min(#hits, from + size) do
    local h = hits[i]
    if (want_fields or want_dv or want_stored) and plans[h.index] == nil and not fetch_failed[h.index] then
      local okp, plan = pcall(fetch_fields.plan, store.get(h.index), want_fields, want_dv, want_stored)
      if okp then plans[h.index] = plan
      elseif errors.is(plan) and plan.shard_failure then
        fetch_failed[h.index] = true
        failures[#failures + 1] = plan
      else error(plan, 0) end
    end
    if not fetch_failed[h.index] then page[#page + 1] = h end
  end
  if next(fetch_failed) then
    local failed_names = {}
    for _, e in ipairs(failures) do failed_names[e.failed_index] = true end
    local all_failed = true
    for _, idx in ipairs(idxs) do if not failed_names[idx.name] then all_failed = false end end
    if all_failed then error(errors.search_phase_all(failures, "all shards failed"), 0) end
    if params.allow_partial_search_results == "false" then
      error(errors.search_phase_all(failures, "Partial shards failure"), 0)
    end
  end
  for _, h in ipairs(page) do
    local hit = json.obj("_index", h.index, "_id", (not none) and h.rec.id or nil,
      "_version", want_version and h.rec.version or nil,
      "_seq_no", want_seq_no and h.rec.seq_no or nil,
      "_primary_term", want_seq_no and 1 or nil,
      "_score", track_scores and json.float(h.score) or null,
      "_routing", h.rec.routing)
    if srcf ~= false then json.set(hit, "_source", source_filter.apply(srcf, h.rec)) end
    if plans[h.index] then json.set(hit, "fields", fetch_fields.fetch(plans[h.index], h.rec, h.types, h.index)) end
    if sorts then
      local sv = json.array()
      for k, it in ipairs(sorts) do
        local v = h.sv[k]
        if it.field == "_score" then v = json.float(v) end
        -- a date_nanos field sorts on nanoseconds since the epoch (esxd keeps milliseconds)
        if type(v) == "number" and v == math.floor(v) and h.types and mapping.type_of(h.types, it.field) == "date_nanos" then
          v = json.raw(string.format("%d", v) .. (v ~= 0 and "000000" or ""))
        end
        if type(v) == "string" and h.types and mapping.type_of(h.types, it.field) == "ip" then v = mapping.ip_format(v) end
        -- a long sort value is a JSON integer, 1e17 is 100000000000000000 (json.number writes
        -- numbers past 2^53 with an exponent); esxd's values are doubles, so past 2^53 it is the
        -- nearest double's integer, and at 2^63 Long.MAX / MIN
        if type(v) == "number" and v == math.floor(v) and (v >= 2 ^ 53 or v <= -2 ^ 53) and h.types
            and LONG_SORTED[mapping.type_of(h.types, it.field) or it.unmapped_type] then
          v = json.raw(v >= 2 ^ 63 and "9223372036854775807" or v <= -2 ^ 63 and "-9223372036854775808"
            or string.format("%d", v))
        end
        if v == nil and h.types then v = missing_sort_value(mapping.type_of(h.types, it.field) or it.unmapped_type, it) end
        sv[k] = v == nil and null or v
      end
      json.set(hit, "sort", sv)
    end
    out_hits[#out_hits + 1] = hit
  end
  local hits_obj = json.obj("total", total_hits(matched, tth, as_int),
    "max_score", (max_score ~= nil and matched > 0 and size > 0) and json.float(max_score) or null, "hits", out_hits)
  ngx.update_time()
  local took = math.floor((ngx.now() - (started or ngx.now())) * 1000)
  local res = json.obj("took", took, "timed_out", false, "_shards", shards_obj(idxs, failures), "hits", hits_obj)
  if agg_spec then
    aggs.set_indices(agg_types, ok_idxs)
    local ares = aggs.run(agg_spec, all_docs, agg_types)
    if truthy(params.typed_keys) then aggs.type_keys(agg_spec, ares, agg_types) end
    json.set(res, "aggregations", ares)
  end
  return 200, res
end

-- ES's RestActions.urlParamsToQueryBuilder: ?q= (with df, default_operator, lenient) is a
-- query_string query; those parameters without q are a 400.
local Q_PARAMS = { "df", "analyzer", "analyze_wildcard", "lenient", "default_operator" }
function _M.url_query(params, path)
  if params.q then return _M.q_to_query(params.q, params) end
  local present = {}
  for _, k in ipairs(Q_PARAMS) do if params[k] ~= nil then present[#present + 1] = k end end
  if #present > 0 then
    errors.raise(400, "illegal_argument_exception", "request [" .. tostring(path) .. "] contains parameters [" ..
      table.concat(present, ", ") .. "] but query string parameter 'q' is absent")
  end
end

-- ?q= (with df, default_operator, lenient) becomes a query_string query.
function _M.q_to_query(q, params)
  params = params or {}
  return { query_string = { query = q, default_field = params.df, default_operator = params.default_operator,
    lenient = params.lenient == "true" or params.lenient == "" } }
end

-- _count
function _M.count(expr, params, body, path)
  local has_body = body ~= nil
  body = body or {}
  if not is_obj(body) then errors.raise(400, "parsing_exception", "request body must be an object") end
  for k, v in pairs(body) do
    if k ~= "query" then errors.raise(400, "parsing_exception", "request does not support [" .. k .. "]") end
  end
  local q = body.query
  -- RestCountAction reads q (and df, ...) only without a body
  if not has_body then q = _M.url_query(params, path) end
  parse_query(q)
  local idxs = _M.targets(expr, params)
  local min_score = params.min_score and tonumber(params.min_score)
  local n, failures = 0, {}
  for _, idx in ipairs(idxs) do
    -- _count is a size-0 search in ES: the same shard failures, partial results included
    local okc, matcher = pcall(compile_on, q, idx)
    if okc then
      for _, rec in ipairs(idx.visible_list) do
        if not rec.dead then
          local ok, score = matcher(rec)
          if ok and (not min_score or score >= min_score) then n = n + 1 end
        end
      end
    elseif errors.is(matcher) and matcher.shard_failure then
      failures[#failures + 1] = matcher
    else
      error(matcher, 0)
    end
  end
  if #failures > 0 and #failures == #idxs then error(errors.search_phase_all(failures, "all shards failed"), 0) end
  return 200, json.obj("count", n, "_shards", shards_obj(idxs, failures))
end

return _M
