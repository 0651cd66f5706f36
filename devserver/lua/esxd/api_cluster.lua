-- esxd.api_cluster: GET / (info), HEAD / (ping) and GET /_cluster/health[/{index}].
local json = require "esxd.json"
local store = require "esxd.store"
local search = require "esxd.search"
local params = require "esxd.params"
local errors = require "esxd.errors"

local _M = {}
local VERSION = "8.15.0"
local cluster_uuid

function _M.info()
  cluster_uuid = cluster_uuid or store.uuid()
  return 200, json.obj(
    "name", "esxd-node",
    "cluster_name", "esxd",
    "cluster_uuid", cluster_uuid,
    "version", json.obj(
      "number", VERSION,
      "build_flavor", "default",
      "build_type", "esxd",
      "build_hash", "0000000000000000000000000000000000000000",
      "build_date", "2024-08-05T10:05:34.233336849Z",
      "build_snapshot", false,
      "lucene_version", "9.11.1",
      "minimum_wire_compatibility_version", "7.17.0",
      "minimum_index_compatibility_version", "7.0.0"),
    "tagline", "You Know, for Search")
end

function _M.ping() return 200, nil end

-- Health of a one-node cluster: every primary is active; a replica can never be assigned to
-- the node that holds its primary, so an index with replicas is yellow (as a one-node
-- Elasticsearch is, with the default number_of_replicas of 1).
local RANK = { green = 0, yellow = 1, red = 2 }

local function shard_counts(ctx)
  local idxs
  if ctx.vars.index then
    idxs = search.targets(ctx.vars.index, ctx.args)
  else
    idxs = {}
    for _, name in ipairs(store.names()) do idxs[#idxs + 1] = store.get(name) end
  end
  local active, unassigned = 0, 0
  for _, idx in ipairs(idxs) do
    active = active + idx.shards
    unassigned = unassigned + idx.shards * idx.replicas
  end
  return active, unassigned, idxs
end

-- ClusterStatsLevel.of: the level parameter, any case; RestClusterHealthAction checks it
-- after the wait_for_* parameters.
local LEVELS = { cluster = true, indices = true, shards = true }
local function parse_level(v)
  if v == nil then return "cluster" end
  if not LEVELS[v:lower()] then
    error(errors.illegal_argument("level parameter must be one of [cluster] or [indices] or [shards] but was [" ..
      v .. "]"), 0)
  end
  return v:lower()
end

-- The "indices" object of level=indices / shards (ClusterIndexHealth, ClusterShardHealth):
-- on one node every primary is active and every replica unassigned.
local function indices_health(idxs, level)
  local out = json.obj()
  for _, idx in ipairs(idxs) do
    local ih = json.obj(
      "status", idx.replicas > 0 and "yellow" or "green",
      "number_of_shards", idx.shards,
      "number_of_replicas", idx.replicas,
      "active_primary_shards", idx.shards,
      "active_shards", idx.shards,
      "relocating_shards", 0,
      "initializing_shards", 0,
      "unassigned_shards", idx.shards * idx.replicas)
    if level == "shards" then
      local shards = json.obj()
      for i = 0, idx.shards - 1 do
        json.set(shards, tostring(i), json.obj(
          "status", idx.replicas > 0 and "yellow" or "green",
          "primary_active", true,
          "active_shards", 1,
          "relocating_shards", 0,
          "initializing_shards", 0,
          "unassigned_shards", idx.replicas))
      end
      json.set(ih, "shards", shards)
    end
    json.set(out, idx.name, ih)
  end
  return out
end

-- Priority, for wait_for_events (RestClusterHealthAction: Priority.valueOf(upper case))
local PRIORITIES = { IMMEDIATE = true, URGENT = true, HIGH = true, NORMAL = true, LOW = true, LANGUID = true }

local function no_enum(class, v)
  return errors.illegal_argument("No enum constant org.elasticsearch." .. class .. "." .. v:upper())
end

-- wait_for_nodes (TransportClusterHealthAction): "N", ">=N", "<=N", ">N", "<N" or
-- ge(N) / le(N) / gt(N) / lt(N), compared with the one node; Integer.parseInt's error else.
local NODE_CMP = {
  { ">=", 2, 0, function(n) return 1 >= n end }, { "ge(", 3, 1, function(n) return 1 >= n end },
  { "<=", 2, 0, function(n) return 1 <= n end }, { "le(", 3, 1, function(n) return 1 <= n end },
  { ">", 1, 0, function(n) return 1 > n end }, { "gt(", 3, 1, function(n) return 1 > n end },
  { "<", 1, 0, function(n) return 1 < n end }, { "lt(", 3, 1, function(n) return 1 < n end },
}

local function nodes_met(spec)
  if spec == nil or spec == "" then return true end
  local num, cmp = spec, function(n) return n == 1 end
  for _, c in ipairs(NODE_CMP) do
    if spec:sub(1, #c[1]) == c[1] then
      num = spec:sub(c[2] + 1, #spec - c[3]); cmp = c[4]
      break
    end
  end
  local n = num:match("^[+-]?%d+$") and tonumber(num)
  if not n or n > 2147483647 or n < -2147483648 then
    error(errors.new(400, "number_format_exception", 'For input string: "' .. num .. '"'), 0)
  end
  return cmp(n)
end

-- wait_for_active_shards (ActiveShardCount; "default" / -1 and 0 wait for nothing): "all"
-- is met when no shard copy is unassigned, a number when that many copies are active.
local function active_met(spec, active, unassigned)
  if spec == nil then return true end
  if spec == "all" then return unassigned == 0 end
  return tonumber(spec) <= 0 or active >= tonumber(spec)
end

function _M.health(ctx)
  local a = ctx.args
  local wanted = a.wait_for_status
  if wanted and not RANK[wanted:lower()] then error(no_enum("cluster.health.ClusterHealthStatus", wanted), 0) end
  if a.wait_for_events and not PRIORITIES[a.wait_for_events:upper()] then
    error(no_enum("common.Priority", a.wait_for_events), 0)
  end
  local level = parse_level(a.level)
  wanted = wanted and wanted:lower()
  local active, unassigned, status, idxs
  local function met()
    active, unassigned, idxs = shard_counts(ctx)
    status = unassigned > 0 and "yellow" or "green"
    return (not wanted or RANK[status] <= RANK[wanted]) and active_met(a.wait_for_active_shards, active, unassigned)
      and nodes_met(a.wait_for_nodes)
  end
  local timed_out = false
  if not met() then
    -- as ES: wait up to `timeout` (30s) for every condition, then answer 408 with what it is
    ngx.update_time() -- the cached clock lags when the worker was busy
    local deadline = ngx.now() + params.time_ms(a.timeout or "30s") / 1000
    repeat
      ngx.sleep(0.05)
      timed_out = not met()
    until not timed_out or ngx.now() >= deadline
  end
  local human = ctx.args.human == "" or ctx.args.human == "true"
  local percent = active + unassigned == 0 and 100 or 100 * active / (active + unassigned)
  return timed_out and 408 or 200, json.obj(
    "cluster_name", "esxd",
    "status", status,
    "timed_out", timed_out,
    "number_of_nodes", 1,
    "number_of_data_nodes", 1,
    "active_primary_shards", active,
    "active_shards", active,
    "relocating_shards", 0,
    "initializing_shards", 0,
    "unassigned_shards", unassigned,
    "delayed_unassigned_shards", 0,
    "number_of_pending_tasks", 0,
    "number_of_in_flight_fetch", 0,
    "task_max_waiting_in_queue", human and "0s" or nil,
    "task_max_waiting_in_queue_millis", 0,
    "active_shards_percent", human and string.format("%.1f%%", percent) or nil,
    "active_shards_percent_as_number", json.float(percent),
    "indices", level ~= "cluster" and indices_health(idxs, level) or nil)
end

_M.VERSION = VERSION
return _M
