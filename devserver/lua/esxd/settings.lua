-- esxd.settings: an index's creation settings as ES reads them: flattened to dotted keys
-- with the "index." prefix (Settings.Builder.loadFromMap + normalizePrefix), and checked
-- against the index-scoped settings ES knows (AbstractScopedSettings.validate).
local errors = require "esxd.errors"
local json = require "esxd.json"
local suggest = require "esxd.suggest"

local _M = {}
local null = json.null

-- IndexScopedSettings' built-in index settings (and the common x-pack ones). esxd applies
-- number_of_shards, number_of_replicas, mapping.ignore_malformed, mapping.total_fields.limit,
-- mapping.depth.limit, max_result_window, max_terms_count and refresh_interval (store.lua); the others are accepted and change nothing
-- (see README).
local KNOWN = {}
for w in ([[number_of_shards number_of_replicas number_of_routing_shards routing_partition_size
  auto_expand_replicas hidden codec refresh_interval max_result_window max_inner_result_window
  max_rescore_window max_docvalue_fields_search max_script_fields max_ngram_diff max_shingle_diff
  max_terms_count max_regex_length max_refresh_listeners max_slices_per_scroll
  max_adjacency_matrix_filters highlight.max_analyzed_offset mapping.total_fields.limit
  mapping.total_fields.ignore_dynamic_beyond_limit mapping.depth.limit mapping.nested_fields.limit
  mapping.nested_objects.limit mapping.field_name_length.limit mapping.dimension_fields.limit
  mapping.ignore_malformed mapping.coerce mapping.ignore_above gc_deletes default_pipeline
  final_pipeline search.idle.after translog.durability translog.sync_interval
  translog.flush_threshold_size translog.generation_threshold_size translog.retention.age
  translog.retention.size soft_deletes.enabled soft_deletes.retention_lease.period
  soft_deletes.retention.operations merge.scheduler.max_thread_count merge.scheduler.max_merge_count
  merge.scheduler.auto_throttle routing.allocation.enable routing.rebalance.enable
  routing.allocation.total_shards_per_node unassigned.node_left.delayed_timeout priority
  query.default_field query_string.lenient query.parse.allow_unmapped_fields sort.field sort.order
  sort.mode sort.missing shard.check_on_startup load_fixed_bitset_filters_eagerly
  write.wait_for_active_shards requests.cache.enable queries.cache.enabled store.type store.preload
  store.stats_refresh_interval flush_after_merge compound_format warmer.enabled blocks.read_only
  blocks.read blocks.write blocks.metadata blocks.read_only_allow_delete allocation.max_retries
  lifecycle.name lifecycle.rollover_alias lifecycle.origination_date lifecycle.parse_origination_date
  lifecycle.indexing_complete mode routing_path time_series.start_time time_series.end_time
  creation_date]]):gmatch("%S+") do KNOWN["index." .. w] = true end
-- group and affix settings: any key under these prefixes
local GROUPS = { "index.analysis.", "index.similarity.", "index.routing.allocation.include.",
  "index.routing.allocation.require.", "index.routing.allocation.exclude.",
  "index.routing.allocation.initial_recovery.", "index.search.slowlog.", "index.indexing.slowlog.",
  "index.merge.policy." }

-- {"index":{"mapping":{"total_fields":{"limit":5}}}}, {"mapping.total_fields.limit":5} and
-- {"index.mapping.total_fields.limit":5} are all "index.mapping.total_fields.limit" = 5.
-- Arrays are values ([] too); objects nest.
function _M.flatten(settings)
  local out = {}
  local function walk(t, prefix)
    for k, v in pairs(t) do
      local key = prefix .. tostring(k)
      if type(v) == "table" and v ~= null and not json.is_array(v) and #v == 0 then
        walk(v, key .. ".")
      else
        out[key:sub(1, 6) == "index." and key or "index." .. key] = v
      end
    end
  end
  if type(settings) == "table" then walk(settings, "") end
  return out
end

local function known(key)
  if KNOWN[key] then return true end
  for _, g in ipairs(GROUPS) do
    if key:sub(1, #g) == g and #key > #g then return true end
  end
  return false
end

-- nil, or ES's 400 for the first (in key order) setting ES does not know.
function _M.validate(flat)
  local keys = {}
  for k in pairs(flat) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, key in ipairs(keys) do
    if not known(key) then
      local names = {}
      for k in pairs(KNOWN) do names[#names + 1] = k end
      local close = suggest.close(key, names, 0.7)
      local msg = "unknown setting [" .. key .. "]"
      if #close == 1 then
        msg = msg .. " did you mean [" .. close[1] .. "]?"
      elseif #close > 1 then
        msg = msg .. " did you mean any of [" .. table.concat(close, ", ") .. "]?"
      else
        msg = msg .. " please check that any required plugins are installed, or check the breaking changes documentation for removed settings"
      end
      return errors.illegal_argument(msg)
    end
  end
  local v = flat["index.mapping.total_fields.ignore_dynamic_beyond_limit"]
  if v ~= nil and v ~= false and v ~= "false" then
    return errors.illegal_argument("esxd does not implement [index.mapping.total_fields.ignore_dynamic_beyond_limit]: " ..
      "new fields beyond the limit fail the document")
  end
end

-- A setting's value as ES keeps it: a string (5 -> "5", true -> "true"), lists of strings.
local function as_string(v)
  if type(v) == "number" and v == math.floor(v) and math.abs(v) < 2 ^ 53 then return string.format("%d", v) end
  if type(v) == "table" and v ~= null then
    local out = json.array()
    for i, e in ipairs(v) do out[i] = as_string(e) end
    return out
  end
  if v == null then return null end
  return tostring(v)
end

-- The index's settings for GET /{index}: base (the "index" object esxd always shows) with
-- the given settings nested under it as ES prints them ({"mapping":{"total_fields":
-- {"limit":"2000"}}}); base's own keys win.
function _M.nested(flat, base)
  local keys = {}
  for k in pairs(flat or {}) do keys[#keys + 1] = k end
  table.sort(keys)
  for _, key in ipairs(keys) do
    local parts = {}
    for p in key:sub(7):gmatch("[^.]+") do parts[#parts + 1] = p end
    local node = base
    for i = 1, #parts - 1 do
      local nxt = node[parts[i]]
      if nxt == nil then nxt = {}; node[parts[i]] = nxt end
      if type(nxt) ~= "table" or json.is_array(nxt) then node = nil; break end
      node = nxt
    end
    if node and #parts > 0 and node[parts[#parts]] == nil then node[parts[#parts]] = as_string(flat[key]) end
  end
  return base
end

-- Setting.intSetting / longSetting's parse of flat[key]: nil (not given), the number, or
-- nil and ES's 400. max: the setting's maximum (nil: none); bits: 32 (int) or 64 (long).
function _M.number(flat, key, min, max, bits)
  local v = flat[key]
  if v == nil or v == null then return nil end
  local s = tostring(v)
  local n = s:match("^[+-]?%d+$") and tonumber(s)
  local lim = bits == 64 and 2 ^ 63 or 2147483648
  if not n or n >= lim or n < -lim then
    return nil, errors.new(400, "illegal_argument_exception", "Failed to parse value [" .. s .. "] for setting [" .. key .. "]",
      nil, { caused_by = { type = "number_format_exception", reason = 'For input string: "' .. s .. '"' } })
  end
  if n < min then
    return nil, errors.illegal_argument("Failed to parse value [" .. s .. "] for setting [" .. key .. "] must be >= " .. min)
  end
  if max and n > max then
    return nil, errors.illegal_argument("Failed to parse value [" .. s .. "] for setting [" .. key .. "] must be <= " .. max)
  end
  return n
end

return _M
