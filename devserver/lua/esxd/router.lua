-- esxd.router: maps (method, path segments) to handlers, with ES's answers for unknown
-- paths (400 "no handler found") and wrong methods (405 with Allow).
local api_cluster = require "esxd.api_cluster"
local api_indices = require "esxd.api_indices"
local api_docs = require "esxd.api_docs"
local api_search = require "esxd.api_search"

local _M = {}

-- The REST API (es-spec/api/<name>.json) of each handler, for esxd.params.
local API = {
  [api_cluster.info] = "info", [api_cluster.ping] = "ping", [api_cluster.health] = "cluster.health",
  [api_search.bulk] = "bulk", [api_search.search] = "search", [api_search.count] = "count",
  [api_search.msearch] = "msearch", [api_indices.refresh] = "indices.refresh", [api_docs.index] = "index",
  [api_docs.get] = "get", [api_docs.exists] = "exists", [api_docs.delete] = "delete",
  [api_docs.create] = "create", [api_docs.update] = "update", [api_docs.source] = "get_source",
  [api_indices.create] = "indices.create", [api_indices.delete] = "indices.delete",
  [api_indices.exists] = "indices.exists", [api_indices.get] = "indices.get",
  [api_indices.get_mapping] = "indices.get_mapping", [api_indices.put_mapping] = "indices.put_mapping", [api_indices.get_field_mapping] = "indices.get_field_mapping",
}
_M.API = API

local routes = {
  { {}, { GET = api_cluster.info, HEAD = api_cluster.ping } },
  { { "_cluster", "health" }, { GET = api_cluster.health } },
  { { "_cluster", "health", ":index" }, { GET = api_cluster.health } },
  { { "_bulk" }, { POST = api_search.bulk, PUT = api_search.bulk } },
  { { "_search" }, { GET = api_search.search, POST = api_search.search } },
  { { "_count" }, { GET = api_search.count, POST = api_search.count } },
  { { "_msearch" }, { GET = api_search.msearch, POST = api_search.msearch } },
  { { "_refresh" }, { GET = api_indices.refresh, POST = api_indices.refresh } },
  { { "_mapping" }, { GET = api_indices.get_mapping } },
  { { "_mapping", "field", ":fields" }, { GET = api_indices.get_field_mapping } },
  { { ":index", "_bulk" }, { POST = api_search.bulk, PUT = api_search.bulk } },
  { { ":index", "_search" }, { GET = api_search.search, POST = api_search.search } },
  { { ":index", "_count" }, { GET = api_search.count, POST = api_search.count } },
  { { ":index", "_msearch" }, { GET = api_search.msearch, POST = api_search.msearch } },
  { { ":index", "_refresh" }, { GET = api_indices.refresh, POST = api_indices.refresh } },
  { { ":index", "_mapping" }, { GET = api_indices.get_mapping, PUT = api_indices.put_mapping,
    POST = api_indices.put_mapping } },
  { { ":index", "_mapping", "field", ":fields" }, { GET = api_indices.get_field_mapping } },
  { { ":index", "_doc" }, { POST = api_docs.index } },
  { { ":index", "_doc", ":id" }, { PUT = api_docs.index, POST = api_docs.index, GET = api_docs.get,
    HEAD = api_docs.exists, DELETE = api_docs.delete } },
  { { ":index", "_create", ":id" }, { PUT = api_docs.create, POST = api_docs.create } },
  { { ":index", "_update", ":id" }, { POST = api_docs.update } },
  { { ":index", "_source", ":id" }, { GET = api_docs.source, HEAD = api_docs.source } },
  { { ":new" }, { PUT = api_indices.create } },
  { { ":index" }, { PUT = api_indices.create, DELETE = api_indices.delete, HEAD = api_indices.exists,
    GET = api_indices.get } },
}

-- The names ES 8 has an API at ("/_x" alone, some method): those esxd implements (the first
-- line; another method is their 405) and those it does not (no handler). ES's path trie
-- prefers such a route to "/{index}"; for any other "/_x" (a typo such as "/_foo", or
-- "/_cluster", whose routes are all deeper) it falls back to "/{index}", and the index
-- resolver refuses the name: 400 invalid_index_name_exception.
local ES_ROOT_APIS = {}
for n in ([[_bulk _count _mapping _msearch _refresh _search
    _alias _aliases _analyze _async_search _capabilities _cat _component_template _connector
    _dangling _data_stream _features _field_caps _flush _forcemerge _health_report _index_template
    _inference _license _mget _mtermvectors _nodes _pit _query _query_rules _rank_eval _recovery
    _reindex _script_context _script_language _search_shards _segments _settings _shard_stores
    _snapshot _sql _stats _synonyms _tasks _template _xpack]]):gmatch("%S+") do
  ES_ROOT_APIS[n] = true
end

local function match(pattern, segs)
  if #pattern ~= #segs then return nil end
  local vars = {}
  for i, p in ipairs(pattern) do
    local s = segs[i]
    if p:sub(1, 1) == ":" then
      -- "/_x" alone is an API ES has and esxd lacks when ES has one there (no handler);
      -- otherwise, as before an index API's name ("/_x/_search"), ES reads "_x" as the
      -- index expression, which its resolver refuses
      if p == ":index" and #pattern == 1 and ES_ROOT_APIS[s] then
        return nil
      end
      if p == ":new" then p = ":index" end
      vars[p:sub(2)] = s
    elseif p ~= s then
      return nil
    end
  end
  return vars
end

-- Returns handler, vars; or nil, status, body-table, headers for routing failures.
function _M.find(method, segs, raw_path)
  local allowed
  for _, r in ipairs(routes) do
    -- PUT /{index} takes any name, "_x" too (ES's invalid index name 400); other methods on
    -- an ES API's "/_x" are APIs esxd lacks (GET /_alias, POST /_aliases, ...): no handler,
    -- not 405
    local new = r[1][1] == ":new"
    local vars = (not new or (allowed == nil and (r[2][method] or segs[1] == nil or not ES_ROOT_APIS[segs[1]])))
      and match(r[1], segs)
    if vars then
      local h = r[2][method]
      if h then return h, vars end
      allowed = allowed or {}
      -- (PUT /{index} is in two routes: each method is listed once)
      for m in pairs(r[2]) do
        local seen = false
        for _, a in ipairs(allowed) do if a == m then seen = true end end
        if not seen then allowed[#allowed + 1] = m end
      end
    end
  end
  if allowed then
    table.sort(allowed)
    return nil, 405, { error = "Incorrect HTTP method for uri [" .. raw_path .. "] and method [" .. method ..
      "], allowed: [" .. table.concat(allowed, ", ") .. "]", status = 405 }, { Allow = table.concat(allowed, ",") }
  end
  return nil, 400, { error = "no handler found for uri [" .. raw_path .. "] and method [" .. method .. "]" }
end

return _M
