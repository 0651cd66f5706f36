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
  return active, unassigned
end

function _M.health(ctx)
  local wanted = ctx.args.wait_for_status
  if wanted and not RANK[wanted:lower()] then
    error(errors.illegal_argument("unknown cluster health status [" .. wanted .. "]"), 0)
  end
  local active, unassigned = shard_counts(ctx)
  local status = unassigned > 0 and "yellow" or "green"
  local timed_out = false
  if wanted and RANK[status] > RANK[wanted:lower()] then
    -- as ES: wait up to `timeout` (30s) for the status, then answer 408 with what it is
    local deadline = ngx.now() + params.time_ms(ctx.args.timeout or "30s") / 1000
    repeat
      ngx.sleep(0.05)
      active, unassigned = shard_counts(ctx)
      status = unassigned > 0 and "yellow" or "green"
    until RANK[status] <= RANK[wanted:lower()] or ngx.now() >= deadline
    timed_out = RANK[status] > RANK[wanted:lower()]
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
    "active_shards_percent_as_number", json.float(percent))
end

_M.VERSION = VERSION
return _M
