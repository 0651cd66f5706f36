-- esxd.active_shards: ?wait_for_active_shards= on a one-node cluster. Each shard has exactly
-- one active copy, its primary (a replica is never assigned to the node holding its primary),
-- so a count above 1, or "all" on an index with replicas, can never be met: ES waits the
-- request's timeout for the copies and then fails (ReplicationOperation.checkActiveShardCount,
-- ActiveShardsObserver). esxd waits the same time with ngx.sleep, which yields the worker.
local errors = require "esxd.errors"
local params = require "esxd.params"

local _M = {}

-- The unmet count for parameter value v (already validated by esxd.params) on idx: nil when
-- one copy is enough, else the count as ES prints it ("2", "ALL") and the copies it needs.
-- Absent and -1 are ActiveShardCount.DEFAULT: index.write.wait_for_active_shards, 1.
function _M.unmet(v, idx)
  if v == nil or v == "-1" then return nil end
  if v == "all" then
    if idx.replicas == 0 then return nil end
    return "ALL", 1 + idx.replicas
  end
  local n = math.floor(tonumber(v))
  if n <= 1 then return nil end
  return tostring(n), n
end

-- The request's timeout (default dflt) as ES's TimeValue prints it, and in milliseconds.
function _M.timeout(args, dflt)
  local t = (args.timeout or dflt):lower():match("^%s*(.-)%s*$")
  if t == "0" then return "0s", 0 end
  if t == "-1" then return "-1", -1 end
  local num, unit = t:match("^([+-]?%d+)%s*(%a+)$")
  return tostring(math.floor(tonumber(num))) .. unit, params.time_ms(t)
end

-- Wait for copies that never come. timeout=-1 would wait forever in ES; esxd refuses it.
function _M.wait(ms, label)
  if ms < 0 then
    error(errors.illegal_argument("esxd refuses timeout=-1 with wait_for_active_shards=[" .. label ..
      "]: on one node the missing shard copies never start, so the request would never end"), 0)
  end
  if ms > 0 then
    -- nginx's timers count from its cached clock, which lags when the worker was busy: without
    -- the update the wait ended that much before the timeout
    ngx.update_time()
    ngx.sleep(ms / 1000)
  end
end

-- The write's failure once the wait is over.
function _M.failure(idx, label, needed, timeout, request)
  return errors.new(503, "unavailable_shards_exception", "[" .. idx.name .. "][0] Not enough active copies to meet " ..
    "shard count of [" .. label .. "] (have 1, needed " .. needed .. "). Timeout: [" .. timeout .. "], request: [" ..
    request .. "]", { "index_uuid", idx.uuid, "shard", "0", "index", idx.name })
end

-- XContentHelper.convertToJson(source, false): the JSON without insignificant whitespace.
function _M.compact(raw)
  local out, i, n = {}, 1, #raw
  while i <= n do
    local c = raw:sub(i, i)
    if c == '"' then
      local j = i + 1
      while j <= n do
        local d = raw:sub(j, j)
        if d == "\\" then j = j + 2 elseif d == '"' then break else j = j + 1 end
      end
      out[#out + 1] = raw:sub(i, j)
      i = j + 1
    else
      if not c:match("%s") then out[#out + 1] = c end
      i = i + 1
    end
  end
  return table.concat(out)
end

-- BulkShardRequest.toString: one item is printed, more are counted; refresh adds a suffix.
function _M.shard_request(idx, items, refresh)
  local what = #items == 1 and (items[1] .. "]") or (#items .. "] requests")
  local suffix = ({ ["true"] = " and a refresh", [""] = " and a refresh", wait_for = " blocking until refresh" })[refresh or "false"]
  return "BulkShardRequest [[" .. idx.name .. "][0]] containing [" .. what .. (suffix or "")
end

-- IndexRequest / DeleteRequest.toString
function _M.index_request(index, id, raw)
  return "index {[" .. index .. "][" .. id .. "], source[" .. _M.compact(raw) .. "]}"
end
function _M.delete_request(index, id) return "delete {[" .. index .. "][" .. id .. "]}" end

return _M
