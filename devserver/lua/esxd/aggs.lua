-- esxd.aggs: aggregations over the matched documents: terms, date_histogram, histogram,
-- sum, min, max, avg, value_count, cardinality (exact), stats; bucket aggregations nest.
local errors = require "esxd.errors"
local mapping = require "esxd.mapping"
local dates = require "esxd.dates"
local json = require "esxd.json"
local suggest = require "esxd.suggest"

local _M = {}
local null = json.null
local floor = math.floor

local function bad(reason) errors.raise(400, "illegal_argument_exception", reason) end

-- The searched indices, by the merged types table the aggregations run with (search.lua
-- registers them): a shard failure names the first index whose field lacks field data.
local indices_by_types = setmetatable({}, { __mode = "k" })
function _M.set_indices(types, idxs) indices_by_types[types] = idxs end
local function failing_index(types, field)
  for _, idx in ipairs(indices_by_types[types] or {}) do
    if mapping.fielddata_error(idx.types, field) then return idx.name end
  end
end

local function fielddata_error(field, index)
  error(errors.search_phase(index, errors.new(400, "illegal_argument_exception",
    "Fielddata is disabled on [" .. field .. "] in [" .. tostring(index) .. "]. Text fields are not optimised for operations that require per-document field data like aggregations and sorting, so these operations are disabled by default. Please use a keyword field instead. Alternatively, set fielddata=true on [" .. field .. "] in order to load field data by uninverting the inverted index. Note that this can use significant memory.")), 0)
end

-- Sorting and aggregating need field data: a text field only has it with "fielddata": true,
-- and a field mapped with "doc_values": false has none (ES's shard failure).
local function need_fielddata(types, field)
  if field == "_id" then
    -- IdFieldMapper: no field data in ES 8 (indices.id_field_data.enabled is false), as for sort
    local first = (indices_by_types[types] or {})[1]
    error(errors.search_phase(first and first.name, errors.new(400, "illegal_argument_exception", "Fielddata access on " ..
      "the _id field is disallowed, you can re-enable it by updating the dynamic cluster setting: " ..
      "indices.id_field_data.enabled")), 0)
  end
  local msg = mapping.fielddata_error(types, field)
  if msg == "text" then
    fielddata_error(field, failing_index(types, field))
  elseif msg then
    error(errors.search_phase(failing_index(types, field), errors.new(400, "illegal_argument_exception", msg)), 0)
  end
end

-- ValuesSourceRegistry: the numeric metrics and the histograms take numeric, date and boolean
-- fields; a field whose values are bytes or addresses (keyword, text with fielddata, ip) is
-- ES's shard failure (after the field data check, as ValuesSourceConfig loads it first).
local BYTES = { keyword = true, text = true, ip = true, wildcard = true, version = true,
  constant_keyword = true, match_only_text = true }
local function need_numeric(types, field, kind)
  local ty = mapping.type_of(types, field)
  if not BYTES[ty] then return end
  local index
  for _, idx in ipairs(indices_by_types[types] or {}) do
    if mapping.type_of(idx.types, field) == ty then index = idx.name; break end
  end
  error(errors.search_phase(index, errors.new(400, "illegal_argument_exception",
    "Field [" .. field .. "] of type [" .. ty .. "] is not supported for aggregation [" .. kind .. "]")), 0)
end

-- A field's values as its field data has them: a text field's (with "fielddata": true) are
-- its tokens.
local function fielddata_values(rec, field, types, ty)
  if field == "_index" then
    -- IndexFieldMapper: every document's value is its index's name
    for _, idx in ipairs(indices_by_types[types] or {}) do
      if (idx.visible and idx.visible[rec.id] == rec) or (idx.docs and idx.docs[rec.id] == rec) then return { idx.name } end
    end
    return {}
  end
  local vals = mapping.values(rec.source, field, types)
  if ty ~= "text" then return vals end
  local out = {}
  for _, v in ipairs(vals) do
    if type(v) ~= "table" then
      for _, tok in ipairs(mapping.tokens(v)) do out[#out + 1] = tok end
    end
  end
  return out
end

local function need_field(kind, spec)
  if type(spec) ~= "table" or type(spec.field) ~= "string" then
    bad("Required one of fields [field, script], but none were specified. ")
  end
  return spec.field
end

-- numeric value of a doc value for metrics
local function numeric(ty, v)
  if mapping.is_date(ty) then return dates.parse(v) end
  if type(v) == "boolean" then return v and 1 or 0 end
  return tonumber(v)
end

local metric = {}

local function collect_numbers(docs, field, types, kind)
  local ty = mapping.type_of(types, field)
  need_fielddata(types, field)
  need_numeric(types, field, kind)
  local out = {}
  for _, rec in ipairs(docs) do
    for _, v in ipairs(mapping.values(rec.source, field, types)) do
      local n = numeric(ty, v)
      if n then out[#out + 1] = n end
    end
  end
  return out, ty
end

-- A date or boolean field's metrics carry their values formatted with the field's
-- DocValueFormat, as ES's InternalSum / InternalAvg / InternalMin / InternalMax /
-- InternalStats print them (a date truncated to a whole millisecond; DocValueFormat.BOOLEAN:
-- "true" for anything but 0); name: the string field's name.
local function value_string(ty, v)
  if ty == "boolean" then return v ~= 0 and "true" or "false" end
  return dates.format(v < 0 and math.ceil(v) or math.floor(v))
end
local function with_date_string(o, ty, v, name)
  if (mapping.is_date(ty) or ty == "boolean") and v ~= null then
    json.set(o, name or "value_as_string", value_string(ty, v))
  end
  return o
end

metric.sum = function(spec, docs, types)
  local nums, ty = collect_numbers(docs, need_field("sum", spec), types, "sum")
  local s = 0
  for _, n in ipairs(nums) do s = s + n end
  return with_date_string(json.obj("value", json.float(s)), ty, s)
end
metric.min = function(spec, docs, types)
  local nums, ty = collect_numbers(docs, need_field("min", spec), types, "min")
  local m
  for _, n in ipairs(nums) do if m == nil or n < m then m = n end end
  return with_date_string(json.obj("value", m and json.float(m) or null), ty, m or null)
end
metric.max = function(spec, docs, types)
  local nums, ty = collect_numbers(docs, need_field("max", spec), types, "max")
  local m
  for _, n in ipairs(nums) do if m == nil or n > m then m = n end end
  return with_date_string(json.obj("value", m and json.float(m) or null), ty, m or null)
end
metric.avg = function(spec, docs, types)
  local nums, ty = collect_numbers(docs, need_field("avg", spec), types, "avg")
  if #nums == 0 then return json.obj("value", null) end
  local s = 0
  for _, n in ipairs(nums) do s = s + n end
  return with_date_string(json.obj("value", json.float(s / #nums)), ty, s / #nums)
end
metric.stats = function(spec, docs, types)
  local nums, ty = collect_numbers(docs, need_field("stats", spec), types, "stats")
  local s, mn, mx = 0, nil, nil
  for _, n in ipairs(nums) do
    s = s + n
    if mn == nil or n < mn then mn = n end
    if mx == nil or n > mx then mx = n end
  end
  local o = json.obj("count", #nums, "min", mn and json.float(mn) or null, "max", mx and json.float(mx) or null,
    "avg", #nums > 0 and json.float(s / #nums) or null, "sum", json.float(s))
  if #nums > 0 then
    with_date_string(o, ty, mn, "min_as_string")
    with_date_string(o, ty, mx, "max_as_string")
    with_date_string(o, ty, s / #nums, "avg_as_string")
    with_date_string(o, ty, s, "sum_as_string")
  end
  return o
end
metric.value_count = function(spec, docs, types)
  local field = need_field("value_count", spec)
  need_fielddata(types, field)
  local ty = mapping.type_of(types, field)
  local n = 0
  for _, rec in ipairs(docs) do n = n + #fielddata_values(rec, field, types, ty) end
  return json.obj("value", n)
end
metric.cardinality = function(spec, docs, types)
  local field = need_field("cardinality", spec)
  local ty = mapping.type_of(types, field)
  need_fielddata(types, field)
  local seen, n = {}, 0
  for _, rec in ipairs(docs) do
    for _, v in ipairs(fielddata_values(rec, field, types, ty)) do
      if ty == "ip" then v = mapping.ip_bytes(v) or v end
      local k = type(v) .. ":" .. tostring(v)
      if not seen[k] then seen[k] = true; n = n + 1 end
    end
  end
  return json.obj("value", n)
end

local run_aggs

-- sub-aggregation results merged into a bucket object
local function add_subs(bucket, subspec, docs, types)
  if subspec then
    local res = run_aggs(subspec, docs, types)
    for _, k in ipairs(res.__keys) do json.set(bucket, k, res.__vals[k]) end
  end
  return bucket
end

local bucket = {}

-- integer option of an aggregation, or a 400 like ES's parser gives
local function int_opt(agg, name, v, default)
  if v == nil then return default end
  local n = tonumber(v)
  if not n or n ~= math.floor(n) then
    errors.raise(400, "x_content_parse_exception", "[1:1] [" .. agg .. "] failed to parse field [" .. name .. "]")
  end
  return n
end

bucket.terms = function(spec, docs, types, subspec, name)
  local field = need_field("terms", spec)
  local ty = mapping.type_of(types, field)
  need_fielddata(types, field)
  local size = int_opt("terms", "size", spec.size, 10)
  -- TermsAggregationBuilder.size names the aggregation, not its type
  if size < 1 then bad("[size] must be greater than 0. Found [" .. size .. "] in [" .. tostring(name) .. "]") end
  local min_doc = int_opt("terms", "min_doc_count", spec.min_doc_count, 1)
  if spec.order ~= nil and type(spec.order) ~= "table" then
    errors.raise(400, "x_content_parse_exception", "[1:1] [terms] failed to parse field [order]")
  end
  local groups, order = {}, {}
  for _, rec in ipairs(docs) do
    local seen = {}
    for _, v in ipairs(fielddata_values(rec, field, types, ty)) do
      if type(v) ~= "table" then
        local key = v
        if mapping.is_date(ty) then key = dates.parse(v) elseif ty and mapping.NUMERIC[ty] then key = tonumber(v) end
        -- an ip's doc value is its 16 bytes: buckets group and order by them
        if ty == "ip" then key = mapping.ip_bytes(v) end
        if ty == "boolean" then key = (v == true or v == "true") and 1 or 0 end
        if key ~= nil then
          local gk = type(key) .. ":" .. tostring(key)
          if not seen[gk] then
            seen[gk] = true
            local g = groups[gk]
            if not g then g = { key = key, docs = {} }; groups[gk] = g; order[#order + 1] = g end
            g.docs[#g.docs + 1] = rec
          end
        end
      end
    end
  end
  -- ordering
  local ord = spec.order or { _count = "desc" }
  local ok_key, dir = next(ord)
  if type(ord) == "table" and #ord > 0 then ok_key, dir = next(ord[1]) end
  dir = tostring(dir or "desc"):lower()
  local function keycmp(a, b)
    if type(a.key) == type(b.key) then return a.key < b.key end
    return tostring(a.key) < tostring(b.key)
  end
  local metric_vals = {}
  -- (ES 8 dropped the _term alias of _key: it is a sub-aggregation path like any other name)
  if ok_key ~= "_count" and ok_key ~= "_key" then
    local aggname, prop = tostring(ok_key):match("^([^%.]+)%.?(.*)$")
    if not subspec or not subspec[aggname] then
      bad("Invalid aggregation order path [" .. tostring(ok_key) .. "]. The provided aggregation [" .. tostring(aggname) .. "] either does not exist, or is a pipeline aggregation and cannot be used to sort the buckets.")
    end
    for _, g in ipairs(order) do
      local r = run_aggs({ [aggname] = subspec[aggname] }, g.docs, types).__vals[aggname]
      local v = json.get(r, prop ~= "" and prop or "value")
      if type(v) == "table" then v = v[1] end
      metric_vals[g] = (v == null or v == nil) and -math.huge or v
    end
  end
  table.sort(order, function(a, b)
    if ok_key == "_key" then
      if dir == "asc" then return keycmp(a, b) else return keycmp(b, a) end
    elseif ok_key == "_count" then
      if #a.docs ~= #b.docs then
        if dir == "asc" then return #a.docs < #b.docs end
        return #a.docs > #b.docs
      end
      return keycmp(a, b)
    else
      local va, vb = metric_vals[a], metric_vals[b]
      if va ~= vb then if dir == "asc" then return va < vb end return va > vb end
      return keycmp(a, b)
    end
  end)
  local buckets, other = json.array(), 0
  for _, g in ipairs(order) do
    if #g.docs >= min_doc then
      if #buckets < size then
        local b = json.obj("key", ty == "ip" and mapping.ip_format(g.key) or g.key)
        if mapping.is_date(ty) then json.set(b, "key_as_string", dates.format(g.key)) end
        if ty == "boolean" then json.set(b, "key_as_string", g.key == 1 and "true" or "false") end
        json.set(b, "doc_count", #g.docs)
        buckets[#buckets + 1] = add_subs(b, subspec, g.docs, types)
      else
        other = other + #g.docs
      end
    end
  end
  return json.obj("doc_count_error_upper_bound", 0, "sum_other_doc_count", other, "buckets", buckets)
end

local UNIT_MS = { ms = 1, s = 1000, m = 60000, h = 3600000, d = 86400000 }
local CAL = { minute = "1m", ["1m"] = "1m", hour = "1h", ["1h"] = "1h", day = "1d", ["1d"] = "1d",
  week = "1w", ["1w"] = "1w", month = "1M", ["1M"] = "1M", quarter = "1q", ["1q"] = "1q",
  year = "1y", ["1y"] = "1y" }

-- returns function(ms) -> bucket start, function(start) -> next start
local function interval_fns(spec)
  if spec.fixed_interval ~= nil then
    local n, unit = tostring(spec.fixed_interval):match("^(%d+)(%a+)$")
    local mult = unit and UNIT_MS[unit]
    if not mult or tonumber(n) == 0 then
      bad("failed to parse setting [date_histogram.fixedInterval] with value [" .. tostring(spec.fixed_interval) .. "] as a time value: unit is missing or unrecognized")
    end
    local step = tonumber(n) * mult
    return function(ms) return floor(ms / step) * step end, function(s) return s + step end
  end
  if spec.calendar_interval ~= nil then
    local c = CAL[tostring(spec.calendar_interval)]
    if not c then
      bad("The supplied interval [" .. tostring(spec.calendar_interval) .. "] could not be parsed as a calendar interval.")
    end
    if c == "1m" or c == "1h" or c == "1d" then
      local step = UNIT_MS[c:sub(2)]
      return function(ms) return floor(ms / step) * step end, function(s) return s + step end
    end
    if c == "1w" then
      local wk = 7 * 86400000
      local monday = 4 * 86400000 -- 1970-01-05 was a Monday
      return function(ms) return floor((ms - monday) / wk) * wk + monday end, function(s) return s + wk end
    end
    local months = c == "1M" and 1 or c == "1q" and 3 or 12
    local function start(ms)
      local y, m = dates.civil_from_days(floor(ms / 86400000))
      local idx = (y * 12 + (m - 1))
      idx = idx - idx % months
      return dates.days_from_civil(floor(idx / 12), idx % 12 + 1, 1) * 86400000
    end
    return start, function(s)
      local y, m = dates.civil_from_days(floor(s / 86400000))
      local idx = y * 12 + (m - 1) + months
      return dates.days_from_civil(floor(idx / 12), idx % 12 + 1, 1) * 86400000
    end
  end
  if spec.interval ~= nil then
    bad("[interval] on [date_histogram] is not supported, use [fixed_interval] or [calendar_interval]")
  end
  bad("Invalid interval specified, must be non-null and non-empty")
end

bucket.date_histogram = function(spec, docs, types, subspec)
  local field = need_field("date_histogram", spec)
  local startf, nextf = interval_fns(spec)
  -- ES prints key_as_string only when the field has a date format (not for long fields)
  local fty = mapping.type_of(types, field)
  need_fielddata(types, field)
  need_numeric(types, field, "date_histogram")
  local with_string = not (fty and mapping.NUMERIC[fty])
  local min_doc = int_opt("date_histogram", "min_doc_count", spec.min_doc_count, 0)
  local groups, keys = {}, {}
  for _, rec in ipairs(docs) do
    local seen = {}
    for _, v in ipairs(mapping.values(rec.source, field, types)) do
      local ms = dates.parse(v)
      if ms then
        local k = startf(ms)
        if not seen[k] then
          seen[k] = true
          local g = groups[k]
          if not g then g = {}; groups[k] = g; keys[#keys + 1] = k end
          g[#g + 1] = rec
        end
      end
    end
  end
  table.sort(keys)
  local buckets = json.array()
  if #keys > 0 then
    local k = keys[1]
    local last = keys[#keys]
    local guard = 0
    while k <= last do
      local g = groups[k] or {}
      if #g >= min_doc then
        local b = json.obj("key_as_string", with_string and dates.format(k) or nil, "key", k, "doc_count", #g)
        buckets[#buckets + 1] = add_subs(b, subspec, g, types)
      end
      if min_doc > 0 and #g == 0 then
        -- skip straight to the next populated key
        local nxt
        for _, kk in ipairs(keys) do if kk > k then nxt = kk; break end end
        if not nxt then break end
        k = nxt
      else
        k = nextf(k)
      end
      guard = guard + 1
      if guard > 100000 then
        errors.raise(400, "too_many_buckets_exception", "Trying to create too many buckets. Must be less than or equal to: [65536] but was [100001]. This limit can be set by changing the [search.max_buckets] cluster level setting.",
          { "max_buckets", 65536 })
      end
    end
  end
  return json.obj("buckets", buckets)
end

bucket.histogram = function(spec, docs, types, subspec, name)
  local field = need_field("histogram", spec)
  local interval = tonumber(spec.interval)
  if not interval or interval <= 0 then bad("[interval] must be >0 for histogram aggregation [" .. tostring(name) .. "]") end
  local ty = mapping.type_of(types, field)
  need_fielddata(types, field)
  need_numeric(types, field, "histogram")
  local min_doc = int_opt("histogram", "min_doc_count", spec.min_doc_count, 0)
  local groups, keys = {}, {}
  for _, rec in ipairs(docs) do
    local seen = {}
    for _, v in ipairs(mapping.values(rec.source, field, types)) do
      local n = numeric(ty, v)
      if n then
        local k = floor(n / interval) * interval
        if not seen[k] then
          seen[k] = true
          if not groups[k] then groups[k] = {}; keys[#keys + 1] = k end
          groups[k][#groups[k] + 1] = rec
        end
      end
    end
  end
  table.sort(keys)
  local buckets = json.array()
  if #keys > 0 then
    local k = keys[1]
    while k <= keys[#keys] do
      local g = groups[k] or {}
      if #g >= min_doc then
        buckets[#buckets + 1] = add_subs(json.obj("key", json.float(k), "doc_count", #g), subspec, g, types)
      end
      k = k + interval
    end
  end
  return json.obj("buckets", buckets)
end

-- Options each aggregation accepts. Unknown ones are ES's x_content_parse_exception
-- "[terms] unknown field [x]"; options ES has but esxd does not implement (include/exclude,
-- missing, script, time_zone, offset, bounds, keyed, format, ...) get the same answer instead of
-- being ignored (a table lists the only values accepted, i.e. the defaults). shard_size,
-- execution_hint, collect_mode, shard_min_doc_count and precision_threshold change nothing with
-- one shard and exact counting.
local UTC = { "UTC", "Z", "+00:00", "GMT", "Etc/UTC" }
local METRIC_OPTS = { field = true }
local AGG_OPTS = {
  terms = { field = true, size = true, min_doc_count = true, order = true, shard_size = true,
    execution_hint = true, collect_mode = true, shard_min_doc_count = true, show_term_doc_count_error = { false } },
  date_histogram = { field = true, fixed_interval = true, calendar_interval = true, interval = true,
    min_doc_count = true, time_zone = UTC, keyed = { false } },
  histogram = { field = true, interval = true, min_doc_count = true, keyed = { false } },
  sum = METRIC_OPTS, min = METRIC_OPTS, max = METRIC_OPTS, avg = METRIC_OPTS, stats = METRIC_OPTS,
  value_count = METRIC_OPTS, cardinality = { field = true, precision_threshold = true },
}

local function check_agg_options(kind, body)
  local allowed = AGG_OPTS[kind]
  if not allowed or type(body) ~= "table" then return end
  for k, v in pairs(body) do
    local a = allowed[k]
    local ok = a == true
    if type(a) == "table" then for _, d in ipairs(a) do if v == d then ok = true end end end
    if not ok then errors.raise(400, "x_content_parse_exception", "[" .. kind .. "] unknown field [" .. tostring(k) .. "]") end
  end
end

-- The aggregation types ES 8 registers (server, modules and the default distribution's
-- plugins, pipelines included): the candidates of its "did you mean".
local ES_AGGS = {}
for w in ([[adjacency_matrix auto_date_histogram avg avg_bucket boxplot bucket_correlation
  bucket_count_ks_test bucket_script bucket_selector bucket_sort cardinality categorize_text change_point
  children composite cumulative_cardinality cumulative_sum date_histogram date_range derivative
  diversified_sampler extended_stats extended_stats_bucket filter filters frequent_item_sets geo_bounds
  geo_centroid geo_distance geo_line geohash_grid geohex_grid geotile_grid global histogram inference
  ip_prefix ip_range matrix_stats max max_bucket median_absolute_deviation min min_bucket missing
  moving_fn moving_percentiles multi_terms nested normalize parent percentile_ranks percentiles
  percentiles_bucket random_sampler range rare_terms rate reverse_nested sampler scripted_metric
  serial_diff significant_terms significant_text stats stats_bucket string_stats sum sum_bucket t_test
  terms time_series top_hits top_metrics value_count variable_width_histogram weighted_avg]]):gmatch("%S+") do
  ES_AGGS[#ES_AGGS + 1] = w
end

-- AggregatorFactories.parseAggregators: ES's parsing_exception caused by the registry's
-- named_object_not_found_exception.
local function unknown_type(kind)
  errors.raise(400, "parsing_exception", "Unknown aggregation type [" .. kind .. "]" .. suggest.suffix(kind, ES_AGGS), nil,
    { caused_by = { type = "named_object_not_found_exception", reason = "[1:1] unknown field [" .. kind .. "]" } })
end

-- The JSON token ES's parser sees at a value (json.decode marks empty arrays).
local function token(v)
  if v == null then return "VALUE_NULL" end
  if type(v) == "table" then return (json.is_array(v) or #v > 0) and "START_ARRAY" or "START_OBJECT" end
  if type(v) == "number" then return "VALUE_NUMBER" end
  if type(v) == "boolean" then return "VALUE_BOOLEAN" end
  return "VALUE_STRING"
end

local function perr(reason) errors.raise(400, "parsing_exception", reason) end

local function no_sub_aggs(name, kind)
  bad("Aggregator [" .. name .. "] of type [" .. kind .. "] cannot accept sub-aggregations")
end

local function sorted_names(t)
  local names = {}
  for k in pairs(t) do names[#names + 1] = k end
  table.sort(names)
  return names
end

-- AggregatorFactories.parseAggregators: ES parses the whole tree before any shard runs, so a
-- malformed sub-aggregation fails the request even where no bucket would run it.
local function parse_aggs(spec)
  for _, name in ipairs(sorted_names(spec)) do
    local def = spec[name]
    if name:find("[%[%]>]") then
      perr("Invalid aggregation name [" .. name .. "]. Aggregation names can contain any character except '[', ']', and '>'")
    end
    if token(def) ~= "START_OBJECT" then
      perr("Aggregation definition for [" .. name .. " starts with a [" .. token(def) .. "], expected a [START_OBJECT].")
    end
    local kind, sub
    for _, k in ipairs(sorted_names(def)) do
      local v = def[k]
      if token(v) ~= "START_OBJECT" then
        perr("Expected [START_OBJECT] under [" .. k .. "], but got a [" .. token(v) .. "] in [" .. name .. "]")
      end
      if k == "aggs" or k == "aggregations" then
        if sub then perr("Found two sub aggregation definitions under [" .. name .. "]") end
        sub = v
      elseif k ~= "meta" then
        if kind then perr("Found two aggregation type definitions in [" .. name .. "]: [" .. kind .. "] and [" .. k .. "]") end
        kind = k
        if not bucket[k] and not metric[k] then
          unknown_type(k)
        end
        check_agg_options(k, v)
      end
    end
    if not kind then perr("Missing definition for aggregation [" .. name .. "]") end
    -- the sub-aggregations are parsed before the builder takes them; a metric's
    -- LeafOnly.subAggregations refuses them (an IllegalArgumentException since ES 8.14)
    if sub then parse_aggs(sub) end
    if sub and metric[kind] then no_sub_aggs(name, kind) end
  end
end

run_aggs = function(spec, docs, types)
  local out = json.obj()
  if type(spec) ~= "table" then errors.raise(400, "parsing_exception", "Expected [START_OBJECT] under [aggs], but got a [VALUE]") end
  local names = {}
  for name in pairs(spec) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local def = spec[name]
    if type(def) ~= "table" then
      errors.raise(400, "parsing_exception", "Expected [START_OBJECT] under [" .. tostring(name) .. "], but got a [VALUE_STRING] in [" .. tostring(name) .. "]")
    end
    local sub = def.aggs or def.aggregations
    local kind, body
    for k, v in pairs(def) do
      if k ~= "aggs" and k ~= "aggregations" and k ~= "meta" then
        if kind then errors.raise(400, "parsing_exception", "Found two aggregation type definitions in [" .. name .. "]: [" .. kind .. "] and [" .. k .. "]") end
        kind, body = k, v
      end
    end
    if not kind then errors.raise(400, "parsing_exception", "Missing definition for aggregation [" .. name .. "]") end
    check_agg_options(kind, body)
    if bucket[kind] then
      json.set(out, name, bucket[kind](body, docs, types, sub, name))
    elseif metric[kind] then
      if sub then no_sub_aggs(name, kind) end
      json.set(out, name, metric[kind](body, docs, types))
    else
      unknown_type(kind)
    end
  end
  return out
end

_M.run = run_aggs
-- spec: the search body's "aggs" object (search.lua checks that it is one); raises ES's
-- parse errors for the whole tree.
_M.parse = parse_aggs

-- ?typed_keys: ES prefixes every aggregation name with its result type ("sterms#by_site"):
-- terms are sterms / lterms (integers, dates, booleans) / dterms (floating point) / umterms
-- (unmapped field); the others use their own name.
local FLOATS = { double = true, float = true, half_float = true, scaled_float = true }
local function type_name(kind, body, types)
  if kind ~= "terms" then return kind end
  local ty = type(body) == "table" and type(body.field) == "string" and mapping.type_of(types, body.field)
  if not ty then return "umterms" end
  if FLOATS[ty] then return "dterms" end
  if mapping.NUMERIC[ty] or mapping.is_date(ty) or ty == "boolean" then return "lterms" end
  return "sterms"
end

local function type_keys(spec, out, types)
  if type(spec) ~= "table" or type(out) ~= "table" or not out.__keys then return end
  for i, name in ipairs(out.__keys) do
    local def = spec[name]
    if type(def) == "table" then
      local kind, body
      for k, v in pairs(def) do
        if k ~= "aggs" and k ~= "aggregations" and k ~= "meta" then kind, body = k, v end
      end
      local res = out.__vals[name]
      local sub = def.aggs or def.aggregations
      if sub and type(res) == "table" then
        for _, b in ipairs(json.get(res, "buckets") or {}) do type_keys(sub, b, types) end
      end
      local typed = type_name(kind, body, types) .. "#" .. name
      out.__keys[i] = typed
      out.__vals[name] = nil
      out.__vals[typed] = res
    end
  end
end
_M.type_keys = type_keys

return _M
