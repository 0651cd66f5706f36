-- esxd.api_cluster: GET / (info), HEAD / (ping) and GET /_cluster/health[/{index}].
local json = require "esxd.json"
local store = require "esxd.store"
local search = require "esxd.search"

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

function _M.health(ctx)
  local idxs = search.targets(ctx.vars.index, ctx.args)
  local n = 0
  if ctx.vars.index then
    for _, idx in ipairs(idxs) do n = n + idx.shards end
  else
    for _, name in ipairs(store.names()) do n = n + store.get(name).shards end
  end
  local human = ctx.args.human == "" or ctx.args.human == "true"
  return 200, json.obj(
    "cluster_name", "esxd",
    "status", "green",
    "timed_out", false,
    "number_of_nodes", 1,
    "number_of_data_nodes", 1,
    "active_primary_shards", n,
    "active_shards", n,
    "relocating_shards", 0,
    "initializing_shards", 0,
    "unassigned_shards", 0,
    "delayed_unassigned_shards", 0,
    "number_of_pending_tasks", 0,
    "number_of_in_flight_fetch", 0,
    "task_max_waiting_in_queue", human and "0s" or nil,
    "task_max_waiting_in_queue_millis", 0,
    "active_shards_percent", human and "100.0%" or nil,
    "active_shards_percent_as_number", json.float(100))
end

_M.VERSION = VERSION
return _M
