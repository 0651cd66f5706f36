-- esxd.params: URL parameter checking per API, as Elasticsearch's BaseRestHandler does it.
-- Every API lists the parameters of its REST spec (es-spec/api/<api>.json) with a kind:
--   ok      accepted; honoured by the handler, or a no-op on one node with one shard
--   bool    as ok, but the value must parse as ES's booleans ("", "true", "false")
--   int/long, time, refresh: as ok, with ES's parse errors for bad values
--   default:<v>  a boolean that esxd honours only at its default value <v>; the other
--           value is refused like an unknown parameter
--   no      documented but not implemented: refused like an unknown parameter
-- Parameters that are not listed (and are not one of the common ones) get ES's 400
-- "request [path] contains unrecognized parameter: [x] -> did you mean [y]?".
local errors = require "esxd.errors"

local _M = {}

local COMMON = { error_trace = "bool", filter_path = "ok", pretty = "bool", human = "bool", format = "format" }

local WRITE = { wait_for_active_shards = "active_shards", refresh = "refresh", routing = "ok", timeout = "time" }

local function api(base, t)
  local out = {}
  for k, v in pairs(base or {}) do out[k] = v end
  for k, v in pairs(t) do out[k] = v end
  return out
end

local SEARCH_COMMON = { ignore_unavailable = "bool", ignore_throttled = "bool", allow_no_indices = "bool",
  expand_wildcards = "ok", preference = "ok", routing = "ok", project_routing = "no" }

local GET_COMMON = { preference = "ok", realtime = "bool", refresh = "bool", routing = "ok", _source = "ok",
  _source_excludes = "ok", _source_includes = "ok", version = "long", version_type = "ok" }

_M.APIS = {
  info = {},
  ping = {},
  ["cluster.health"] = { index = "path", expand_wildcards = "ok", level = "ok", ["local"] = "bool",
    master_timeout = "time", timeout = "time", wait_for_active_shards = "active_shards", wait_for_nodes = "ok",
    wait_for_events = "ok", wait_for_no_relocating_shards = "bool", wait_for_no_initializing_shards = "bool",
    wait_for_status = "ok" },
  bulk = api(WRITE, { index = "path", _source = "ok", _source_excludes = "ok", _source_includes = "ok",
    pipeline = "ok", require_alias = "bool", require_data_stream = "default:false",
    list_executed_pipelines = "default:false", include_source_on_error = "default:true" }),
  count = api(SEARCH_COMMON, { index = "path", min_score = "float", q = "ok", analyzer = "no",
    analyze_wildcard = "bool", default_operator = "operator", df = "ok", lenient = "bool", terminate_after = "no" }),
  -- create: RestIndexAction's create handler also reads op_type, if_seq_no and if_primary_term
  -- (not in create.json), so ES accepts them and then validates them
  create = api(WRITE, { index = "path", id = "path", op_type = "ok", if_seq_no = "long", if_primary_term = "long",
    version = "long", version_type = "ok", pipeline = "ok",
    include_source_on_error = "default:true", require_alias = "bool", require_data_stream = "default:false" }),
  index = api(WRITE, { index = "path", id = "path", op_type = "ok", version = "long", version_type = "ok",
    if_seq_no = "long", if_primary_term = "long", pipeline = "ok", require_alias = "bool",
    require_data_stream = "default:false", include_source_on_error = "default:true" }),
  delete = api(WRITE, { index = "path", id = "path", if_seq_no = "long", if_primary_term = "long",
    version = "long", version_type = "ok" }),
  get = api(GET_COMMON, { index = "path", id = "path", force_synthetic_source = "default:false",
    stored_fields = "ok", _source_exclude_vectors = "default:false" }),
  exists = api(GET_COMMON, { index = "path", id = "path", stored_fields = "ok" }),
  get_source = api(GET_COMMON, { index = "path", id = "path", stored_fields = "no" }),
  update = api({ wait_for_active_shards = "active_shards", refresh = "refresh", routing = "ok", timeout = "time" },
    { index = "path", id = "path", _source = "ok", _source_excludes = "ok", _source_includes = "ok",
      lang = "ok", retry_on_conflict = "int", version = "update_version", version_type = "update_version", if_seq_no = "long", if_primary_term = "long",
      require_alias = "bool", include_source_on_error = "default:true" }),
  ["indices.create"] = { index = "path", wait_for_active_shards = "active_shards", timeout = "time", master_timeout = "time" },
  ["indices.delete"] = { index = "path", timeout = "time", master_timeout = "time", ignore_unavailable = "bool",
    allow_no_indices = "bool", expand_wildcards = "ok" },
  ["indices.exists"] = { index = "path", ["local"] = "bool", ignore_unavailable = "bool", allow_no_indices = "bool",
    expand_wildcards = "ok", flat_settings = "bool", include_defaults = "bool" },
  ["indices.get"] = { index = "path", ["local"] = "bool", ignore_unavailable = "bool", allow_no_indices = "bool",
    expand_wildcards = "ok", flat_settings = "no", include_defaults = "no", master_timeout = "time",
    features = "no" },
  ["indices.get_mapping"] = { index = "path", ["local"] = "bool", ignore_unavailable = "bool",
    allow_no_indices = "bool", expand_wildcards = "ok", master_timeout = "time" },
  -- (write_index_only: there are no aliases or data streams, so it selects nothing)
  ["indices.put_mapping"] = { index = "path", timeout = "time", master_timeout = "time", ignore_unavailable = "bool",
    allow_no_indices = "bool", expand_wildcards = "ok", write_index_only = "bool" },
  ["indices.get_field_mapping"] = { index = "path", fields = "path", ["local"] = "bool",
    ignore_unavailable = "bool", allow_no_indices = "bool", expand_wildcards = "ok", include_defaults = "no" },
  ["indices.refresh"] = { index = "path", ignore_unavailable = "bool", allow_no_indices = "bool",
    expand_wildcards = "ok" },
  msearch = api(SEARCH_COMMON, { index = "path", search_type = "search_type", max_concurrent_searches = "int",
    typed_keys = "bool", pre_filter_shard_size = "int", max_concurrent_shard_requests = "int",
    rest_total_hits_as_int = "bool", ccs_minimize_roundtrips = "bool", include_named_queries_score = "default:false",
    preference = false }),  -- not in the msearch spec: RestMultiSearchAction does not read it
  search = api(SEARCH_COMMON, { index = "path", analyzer = "no", analyze_wildcard = "bool",
    ccs_minimize_roundtrips = "bool", default_operator = "operator", df = "ok", explain = "default:false",
    stored_fields = "ok", docvalue_fields = "ok", from = "int", force_synthetic_source = "default:false",
    lenient = "bool", q = "ok", scroll = "no", search_type = "search_type", size = "int", sort = "ok", _source = "ok",
    _source_excludes = "ok", _source_includes = "ok", _source_exclude_vectors = "default:false",
    terminate_after = "no", stats = "ok", suggest_field = "no", suggest_mode = "no", suggest_size = "no",
    suggest_text = "no", timeout = "time", track_scores = "bool", track_total_hits = "ok",
    allow_partial_search_results = "bool", typed_keys = "bool", version = "bool",
    seq_no_primary_term = "bool", request_cache = "bool", batched_reduce_size = "int",
    max_concurrent_shard_requests = "int", pre_filter_shard_size = "int", rest_total_hits_as_int = "bool",
    include_named_queries_score = "default:false" }),
}

-- APIs whose handler never reads a body: ES answers a body with 400 (BaseRestHandler).
_M.BODYLESS = { info = true, ping = true, ["cluster.health"] = true, delete = true, get = true, exists = true,
  get_source = true, ["indices.delete"] = true, ["indices.exists"] = true, ["indices.get"] = true,
  ["indices.refresh"] = true, ["indices.get_mapping"] = true, ["indices.get_field_mapping"] = true }

-- ES's Booleans.parseBoolean as used by RestRequest.paramAsBoolean ("" means true).
function _M.bool(v, name)
  if v == nil then return nil end
  if v == "" or v == "true" or v == true then return true end
  if v == "false" or v == false then return false end
  error(errors.illegal_argument("Failed to parse value [" .. tostring(v) .. "] as only [true] or [false] are allowed."), 0)
end

local TIME_UNITS = { "nanos", "micros", "ms", "s", "m", "h", "d" }

-- ES's TimeValue.parseTimeValue (validation only).
local function check_time(name, v)
  local s = v:lower():match("^%s*(.-)%s*$")
  if s == "-1" or s == "0" then return end
  for _, u in ipairs(TIME_UNITS) do
    if #s > #u and s:sub(-#u) == u and not (u == "s" and s:sub(-2) == "ms") then
      local num = s:sub(1, -#u - 1):match("^%s*(.-)%s*$")
      if num:match("^[+-]?%d+$") then
        if tonumber(num) < -1 then
          error(errors.illegal_argument("failed to parse setting [" .. name .. "] with value [" .. v ..
            "] as a time value: negative durations are not supported"), 0)
        end
        return
      end
      if tonumber(num) then
        error(errors.new(400, "parse_exception", "failed to parse [" .. v .. "], fractional time values are not supported"), 0)
      end
      error(errors.new(400, "parse_exception", "failed to parse [" .. v .. "]"), 0)
    end
  end
  error(errors.new(400, "parse_exception", "failed to parse setting [" .. name .. "] with value [" .. v ..
    "] as a time value: unit is missing or unrecognized"), 0)
end

_M.check_time = check_time

-- A time value that passed check_time, in milliseconds (-1 stays -1).
function _M.time_ms(v)
  local s = v:lower():match("^%s*(.-)%s*$")
  if s == "-1" or s == "0" then return tonumber(s) end
  local scale = { nanos = 1e-6, micros = 1e-3, ms = 1, s = 1000, m = 60000, h = 3600000, d = 86400000 }
  local num, unit = s:match("^([+-]?%d+)%s*(%a+)$")
  return tonumber(num) * scale[unit]
end

local function check_number(kind, name, v)
  local ok = v:match("^[+-]?%d+$") ~= nil
  local n = ok and tonumber(v)
  if ok and kind == "int" and (n > 2147483647 or n < -2147483648) then ok = false end
  if not ok then
    error(errors.illegal_argument("Failed to parse " .. kind .. " parameter [" .. name .. "] with value [" .. v .. "]"), 0)
  end
end

-- Lucene's LevenshteinDistance: 1 - edits / max(len).
local function similarity(a, b)
  local n, m = #a, #b
  if n == 0 or m == 0 then return (n == m) and 1 or 0 end
  local prev = {}
  for j = 0, m do prev[j] = j end
  for i = 1, n do
    local cur = { [0] = i }
    local ca = a:byte(i)
    for j = 1, m do
      local cost = (ca == b:byte(j)) and 0 or 1
      cur[j] = math.min(cur[j - 1] + 1, prev[j] + 1, prev[j - 1] + cost)
    end
    prev = cur
  end
  return 1 - prev[m] / math.max(n, m)
end

local function unrecognized(path, invalid, candidates)
  table.sort(invalid)
  local parts = {}
  for _, bad in ipairs(invalid) do
    local scored = {}
    for _, c in ipairs(candidates) do
      local d = similarity(bad, c)
      if d > 0.5 then scored[#scored + 1] = { d, c } end
    end
    table.sort(scored, function(x, y)
      if x[1] ~= y[1] then return x[1] > y[1] end
      return x[2] < y[2]
    end)
    local s = "[" .. bad .. "]"
    if #scored > 0 then
      local names = {}
      for i, t in ipairs(scored) do names[i] = t[2] end
      s = s .. " -> did you mean " .. (#names > 1 and "any of " or "") .. "[" .. table.concat(names, ", ") .. "]?"
    end
    parts[#parts + 1] = s
  end
  return errors.illegal_argument("request [" .. path .. "] contains unrecognized parameter" ..
    (#invalid > 1 and "s" or "") .. ": " .. table.concat(parts, ", "))
end

-- Check the URL parameters of a request for API `name`. path: the decoded request path.
-- Raises ES's errors: a bad value first (as ES parses parameters before checking for
-- unknown ones), then all unrecognized parameters in one message.
function _M.check(name, args, path)
  local spec = _M.APIS[name]
  if not spec then return end
  local keys = {}
  for k in pairs(args) do keys[#keys + 1] = k end
  table.sort(keys)
  local invalid = {}
  for _, k in ipairs(keys) do
    local kind = spec[k] or COMMON[k]
    local v = args[k]
    if kind == nil or kind == "no" or kind == "path" then
      invalid[#invalid + 1] = k
    elseif kind == "bool" then
      _M.bool(v, k)
    elseif kind:sub(1, 8) == "default:" then
      if tostring(_M.bool(v, k)) ~= kind:sub(9) then invalid[#invalid + 1] = k end
    elseif kind == "float" then
      if not tonumber(v) then
        error(errors.illegal_argument("Failed to parse float parameter [" .. k .. "] with value [" .. v .. "]"), 0)
      end
    elseif kind == "int" or kind == "long" then
      check_number(kind, k, v)
    elseif kind == "time" then
      check_time(k, v)
    elseif kind == "refresh" then
      if v ~= "" and v ~= "true" and v ~= "false" and v ~= "wait_for" then
        error(errors.illegal_argument("Unknown value for refresh: [" .. v .. "]."), 0)
      end
    elseif kind == "format" then
      -- only JSON responses: yaml, cbor and smile are not implemented
      local f = v:lower()
      if f == "yaml" or f == "cbor" or f == "smile" then invalid[#invalid + 1] = k end
    elseif kind == "active_shards" then
      -- ActiveShardCount.parseString ("all" or an int >= -1); esxd.active_shards honours it
      local n = v:match("^[+-]?%d+$") and tonumber(v)
      if v ~= "all" and not n then
        error(errors.illegal_argument("cannot parse ActiveShardCount[" .. v .. "]"), 0)
      end
      if n and n < -1 then error(errors.illegal_argument("shardCount cannot be negative: " .. v), 0) end
    elseif kind == "search_type" then
      if v ~= "query_then_fetch" and v ~= "dfs_query_then_fetch" then   -- SearchType.fromString
        error(errors.illegal_argument("No search type for [" .. v .. "]"), 0)
      end
    elseif kind == "operator" then
      local op = v:lower()                                               -- Operator.fromString
      if op ~= "and" and op ~= "or" then
        error(errors.illegal_argument("No enum constant org.elasticsearch.index.query.Operator." .. v:upper()), 0)
      end
    elseif kind == "update_version" then
      -- RestUpdateAction reads version / version_type only to refuse them
      error(errors.validation({ "internal versioning can not be used for optimistic concurrency control. " ..
        "Please use `if_seq_no` and `if_primary_term` instead" }), 0)
    end
  end
  if #invalid == 0 then return end
  error(_M.unrecognized_error(name, path, invalid), 0)
end

-- The "unrecognized parameters" error for API `name`; the other accepted parameters are the
-- did-you-mean candidates.
function _M.unrecognized_error(name, path, invalid)
  local spec = _M.APIS[name] or {}
  local bad = {}
  for _, k in ipairs(invalid) do bad[k] = true end
  local candidates = {}
  for k, kind in pairs(spec) do
    if kind and kind ~= "no" and not bad[k] then candidates[#candidates + 1] = k end
  end
  for k in pairs(COMMON) do if not bad[k] then candidates[#candidates + 1] = k end end
  return unrecognized(path, invalid, candidates)
end

return _M
