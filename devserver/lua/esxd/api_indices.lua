-- esxd.api_indices: index create / delete / exists / get and _refresh.
local json = require "esxd.json"
local errors = require "esxd.errors"
local store = require "esxd.store"
local search = require "esxd.search"
local dates = require "esxd.dates"
local mapping = require "esxd.mapping"
local active_shards = require "esxd.active_shards"
local names = require "esxd.names"
local settings = require "esxd.settings"
local mapping_update = require "esxd.mapping_update"

local _M = {}

local CREATE_KEYS = { settings = true, mappings = true, aliases = true }

-- MapperService.parseMapping: "Failed to parse mapping: " + the cause's message. ES's root
-- cause is the innermost Elasticsearch exception: the mapper's own mapper_parsing_exception,
-- or the wrapper itself when the cause is a Java one (cause: its type, e.g. an
-- illegal_argument_exception for a field named "").
local function mapper_parsing(msg, cause)
  local reason = "Failed to parse mapping: " .. msg
  return errors.new(400, "mapper_parsing_exception", reason, nil,
    { caused_by = { type = cause or "mapper_parsing_exception", reason = msg },
      root_cause = { { type = "mapper_parsing_exception", reason = cause and reason or msg } } })
end

function _M.create(ctx)
  local name = ctx.vars.index
  local body = ctx:json(true)
  if body ~= nil then
    if type(body) ~= "table" or #body > 0 then
      error(errors.parsing("unknown key [body] for create index"), 0)
    end
    for k, v in pairs(body) do
      if not CREATE_KEYS[k] then
        -- CreateIndexRequest.source: an ElasticsearchParseException, i.e. parse_exception
        error(errors.new(400, "parse_exception", "unknown key [" .. k .. "] for create index"), 0)
      end
      if type(v) ~= "table" then
        error(errors.parsing("Failed to parse [" .. k .. "]: expected an object"), 0)
      end
    end
  end
  if body ~= nil and type(body.aliases) == "table" and next(body.aliases) ~= nil then
    -- ES would make each alias a name that searches, counts, terms lookups and writes resolve
    -- to this index; esxd has no aliases, and ignoring them left a 404 for every use of the
    -- name later: refused here instead, as esxd refuses what it does not implement
    local list = {}
    for _, a in ipairs(json.keys(body.aliases) or {}) do list[#list + 1] = "[" .. a .. "]" end
    error(errors.illegal_argument("esxd does not implement aliases: index [" .. name .. "] cannot be created with " ..
      "aliases " .. table.concat(list, ", ") .. "; create it without them and use the index name"), 0)
  end
  if body ~= nil and type(body.mappings) == "table" then
    -- CreateIndexRequest.mapping / MappingParser: {"_doc": {...}} (the one type name ES 8
    -- still takes) is the same mapping as {...}
    local first = next(body.mappings)
    if first == "_doc" and next(body.mappings, first) == nil and type(body.mappings._doc) == "table" then
      body.mappings = body.mappings._doc
    end
    local msg, cause = mapping.mapping_error(body.mappings)
    if msg then error(mapper_parsing(msg, cause), 0) end
  end
  local idx, err = store.create(name, body)
  if err then error(err, 0) end
  -- ActiveShardsObserver: the index exists; waiting `timeout` (default 30s) for copies that
  -- one node never starts ends with shards_acknowledged false
  local label = active_shards.unmet(ctx.args.wait_for_active_shards, idx)
  if label then
    local ok, werr = pcall(active_shards.wait, select(2, active_shards.timeout(ctx.args, "30s")), label)
    if not ok then
      store.delete(name) -- refused (timeout=-1): the request leaves no index behind
      error(werr, 0)
    end
  end
  return 200, json.obj("acknowledged", true, "shards_acknowledged", label == nil, "index", name)
end

local function resolve_strict(expr, ctx)
  local list = search.targets(expr, ctx.args)
  if #list == 0 and not (ctx.args.allow_no_indices == "true" or ctx.args.ignore_unavailable == "true") then
    -- _all (what GET /_mapping targets) expands like "*": IndicesOptions.strictExpandOpen
    -- allows it to match no index
    if expr == "_all" or expr:find("*", 1, true) then return list end
    error(errors.index_not_found(expr), 0)
  end
  return list
end

function _M.delete(ctx)
  local expr = ctx.vars.index
  -- ES 8 default: action.destructive_requires_name = true (DestructiveOperations: every
  -- expression of a list is checked)
  for part in (expr .. ","):gmatch("([^,]*),") do
    if part == "_all" or part:find("*", 1, true) then
      error(errors.illegal_argument("Wildcard expressions or all indices are not allowed"), 0)
    end
  end
  local list = resolve_strict(expr, ctx)
  for _, idx in ipairs(list) do store.delete(idx.name) end
  return 200, json.obj("acknowledged", true)
end

function _M.exists(ctx)
  local ok, list = pcall(search.targets, ctx.vars.index, ctx.args)
  if ok and #list > 0 then return 200, nil end
  -- a name the resolver refuses ("_x") is its 400, as ES answers; a missing index is 404
  if not ok and errors.is(list) and list.status ~= 404 then error(list, 0) end
  return 404, nil
end

local function deep_copy(t)
  if type(t) ~= "table" then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = deep_copy(v) end
  return setmetatable(c, getmetatable(t)) -- json.array(): an empty array stays one
end

-- The index's mappings as ES shows them: the explicit mappings as given, plus the dynamic
-- fields (objects as "properties", a dynamic text field with its "keyword" sub-field with
-- ignore_above 256, as ES's default dynamic template for strings).
-- ES's mapping parser reads a dotted field name as an object path: {"a.b": {...}} shows as
-- {"a": {"properties": {"b": {...}}}}, merged with an "a" given as well.
local function expand_dotted_props(props)
  if type(props) ~= "table" then return end
  local dotted = {}
  for name in pairs(props) do
    if type(name) == "string" and name:find("^[^%.]+%.[^%.]") then dotted[#dotted + 1] = name end
  end
  table.sort(dotted)
  for _, name in ipairs(dotted) do
    local head, tail = name:match("^([^%.]+)%.(.+)$")
    local node = props[head]
    if node == nil then node = {}; props[head] = node end
    if type(node) == "table" and (node.type == nil or node.type == "object" or node.type == "nested") then
      node.properties = node.properties or {}
      if node.properties[tail] == nil then
        node.properties[tail] = props[name]
        props[name] = nil
      end
    end
  end
  for _, def in pairs(props) do
    if type(def) == "table" then expand_dotted_props(def.properties) end
  end
end

local function mappings_of(idx)
  local explicit = type(idx.mappings) == "table" and idx.mappings or nil
  local out = deep_copy(explicit) or {}
  expand_dotted_props(out.properties)
  local known = {}
  if explicit then mapping.load(known, explicit.properties) end
  local paths = {}
  for path in pairs(idx.types) do
    if not known[path] then paths[#paths + 1] = path end
  end
  local function depth(p) return select(2, p:gsub("%.", "")) end
  table.sort(paths, function(a, b)
    local da, db = depth(a), depth(b)
    if da ~= db then return da < db end
    return a < b
  end)
  local dyn_object = {}
  local function node_at(path)
    local props, node = out.properties, nil
    for part in path:gmatch("[^%.]+") do
      if type(props) ~= "table" then return nil end
      node = props[part]
      if type(node) ~= "table" then return nil end
      props = node.properties
    end
    return node
  end
  for _, path in ipairs(paths) do
    local ty = idx.types[path]
    local parent, last = path:match("^(.*)%.([^%.]+)$")
    if not parent then last = path end
    local pty = parent and idx.types[parent]
    if parent and pty and pty ~= "object" and pty ~= "nested" then
      local pnode = node_at(parent)
      if pnode then
        pnode.fields = pnode.fields or {}
        if pnode.fields[last] == nil then
          pnode.fields[last] = (ty == "keyword" and pty == "text") and { type = "keyword", ignore_above = 256 }
            or { type = ty }
        end
      end
    else
      local container
      if parent then
        local pnode = node_at(parent)
        if pnode then
          if dyn_object[pnode] then pnode.type = nil end
          pnode.properties = pnode.properties or {}
          container = pnode.properties
        end
      else
        out.properties = out.properties or {}
        container = out.properties
      end
      if container and container[last] == nil then
        -- a dynamic template's mapping as it was applied, else ES's default dynamic one
        local node = deep_copy(mapping.template_def(idx.types, path)) or { type = ty }
        if ty == "object" then dyn_object[node] = true end
        container[last] = node
      end
    end
  end
  return out
end

function _M.get(ctx)
  local list = resolve_strict(ctx.vars.index, ctx)
  local human = ctx.args.human == "" or ctx.args.human == "true"
  local out = json.obj()
  for _, idx in ipairs(list) do
    json.set(out, idx.name, json.obj(
      "aliases", {},
      "mappings", mappings_of(idx),
      "settings", { index = settings.nested(idx.flat_settings, { number_of_shards = tostring(idx.shards),
        number_of_replicas = tostring(idx.replicas), uuid = idx.uuid,
        provided_name = idx.name, creation_date = tostring(idx.created),
        creation_date_string = human and dates.format(idx.created) or nil }) }))
  end
  return 200, out
end

-- GET /_mapping, GET /{index}/_mapping (indices.get_mapping): {"<index>":{"mappings":{...}}}
-- for each resolved index, the mappings as GET /{index} shows them.
function _M.get_mapping(ctx)
  local list = resolve_strict(ctx.vars.index or "_all", ctx)
  local out = json.obj()
  for _, idx in ipairs(list) do json.set(out, idx.name, json.obj("mappings", mappings_of(idx))) end
  return 200, out
end


-- PUT/POST /{index}/_mapping (indices.put_mapping): merges the body into each resolved
-- index's mappings (esxd.mapping_update); every index is checked before any changes, as ES
-- applies one update to all of them or none. {"acknowledged":true}.
function _M.put_mapping(ctx)
  local body = ctx:json()
  if type(body) ~= "table" or #body > 0 or json.is_array(body) then
    error(errors.new(400, "parse_exception", "Failed to parse content to map"), 0)
  end
  -- RestPutMappingAction: {"_doc": {...}} is a typed request, refused in 8.x
  local first = next(body)
  if first == "_doc" and next(body, first) == nil then
    error(errors.illegal_argument("Types cannot be provided in put mapping requests"), 0)
  end
  local msg, cause = mapping.mapping_error(body)
  if msg then error(mapper_parsing(msg, cause), 0) end
  -- dotted names are object paths: {"a.c": ...} updates a's c (and conflicts as that would)
  expand_dotted_props(body.properties)
  -- PutMappingRequest's indices options: no missing index, no expression matching nothing
  local resolved, rerr = names.resolve(ctx.vars.index, store.names(), {
    ignore_unavailable = ctx.args.ignore_unavailable == "" or ctx.args.ignore_unavailable == "true",
    no_wildcards = ctx.args.expand_wildcards == "none",
    allow_no_indices = ctx.args.allow_no_indices == "" or ctx.args.allow_no_indices == "true" })
  if not resolved then error(rerr, 0) end
  local plans = {}
  for _, name in ipairs(resolved) do
    local idx = store.get(name)
    local explicit, delta, reason = mapping_update.merge(idx.mappings, mappings_of(idx), body)
    if not explicit then error(errors.illegal_argument(reason), 0) end
    local lerr = store.update_mapping_error(idx, delta)
    if lerr then error(lerr, 0) end
    plans[#plans + 1] = { idx, explicit, delta }
  end
  for _, p in ipairs(plans) do store.update_mapping(p[1], p[2], p[3]) end
  return 200, json.obj("acknowledged", true)
end

-- The field mappers of a mappings tree: full path -> {leaf = name, def = node}; objects are
-- not field mappers, a field's multi-fields ("fields") are.
local function field_mappers(props, prefix, out)
  if type(props) ~= "table" then return out end
  for name, def in pairs(props) do
    if type(def) == "table" then
      local path = prefix and (prefix .. "." .. name) or name
      if def.properties ~= nil or def.type == nil or def.type == "object" or def.type == "nested" then
        field_mappers(def.properties, path, out)
      else
        out[path] = { leaf = name, def = def }
        if type(def.fields) == "table" then
          for sub, sdef in pairs(def.fields) do
            if type(sdef) == "table" then out[path .. "." .. sub] = { leaf = sub, def = sdef } end
          end
        end
      end
    end
  end
  return out
end

-- GET [/{index}]/_mapping/field/{fields} (indices.get_field_mapping): for each resolved index,
-- {"mappings":{"<full name>":{"full_name":..,"mapping":{"<leaf name>":{...}}}}} for the
-- fields named or matched by a wildcard (unknown names are left out); 404 when no index matched.
function _M.get_field_mapping(ctx)
  local list = resolve_strict(ctx.vars.index or "_all", ctx)
  local wanted = {}
  for f in ctx.vars.fields:gmatch("[^,]+") do wanted[#wanted + 1] = f end
  local out = json.obj()
  for _, idx in ipairs(list) do
    local fields = field_mappers(mappings_of(idx).properties, nil, {})
    local paths = {}
    for path in pairs(fields) do paths[#paths + 1] = path end
    table.sort(paths)
    local picked, m = {}, json.obj()
    for _, f in ipairs(wanted) do
      local pat = f:find("*", 1, true) and names.glob_to_pattern(f)
      for _, path in ipairs(paths) do
        if not picked[path] and (path == f or (pat and path:match(pat))) then
          picked[path] = true
          json.set(m, path, json.obj("full_name", path, "mapping", json.obj(fields[path].leaf, fields[path].def)))
        end
      end
    end
    json.set(out, idx.name, json.obj("mappings", m))
  end
  return #list == 0 and #wanted > 0 and 404 or 200, out
end

function _M.refresh(ctx)
  local list = search.targets(ctx.vars.index, ctx.args)
  for _, idx in ipairs(list) do store.refresh(idx) end
  local total, ok = 0, 0
  for _, idx in ipairs(list) do
    ok = ok + idx.shards
    total = total + idx.shards * (1 + idx.replicas)
  end
  return 200, json.obj("_shards", json.obj("total", total, "successful", ok, "failed", 0))
end

return _M
