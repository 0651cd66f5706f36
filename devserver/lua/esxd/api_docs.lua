-- esxd.api_docs: single-document APIs: index (PUT/POST _doc, auto id), _create, get, exists,
-- delete and _update. Writes go through esxd.store.
local json = require "esxd.json"
local errors = require "esxd.errors"
local store = require "esxd.store"
local source_filter = require "esxd.source_filter"
local params = require "esxd.params"
local active_shards = require "esxd.active_shards"
local names = require "esxd.names"
local fetch_fields = require "esxd.fetch_fields"

local _M = {}

local function refresh_flag(args)
  local r = args.refresh
  return r ~= nil and r ~= "false"
end

local function write_opts(ctx, op_type)
  local a = ctx.args
  local op = a.op_type and a.op_type:lower()   -- IndexRequest.opType lowercases
  if op ~= nil and op ~= "create" and op ~= "index" then
    error(errors.illegal_argument("opType must be 'create' or 'index', found: [" .. tostring(a.op_type) .. "]"), 0)
  end
  return { op_type = op_type or op or "index", if_seq_no = a.if_seq_no, if_primary_term = a.if_primary_term,
    version = a.version, version_type = a.version_type,
    refresh = refresh_flag(a) and a.refresh ~= "wait_for", wait_for = a.refresh == "wait_for", routing = a.routing }
end

-- java.net.URLEncoder.encode (form encoding: space is "+"; letters, digits and .-*_ kept)
local function form_encode(s)
  return (tostring(s):gsub("[^%w%.%-%*_ ]", function(c) return ("%%%02X"):format(c:byte()) end):gsub(" ", "+"))
end

-- 201 Created carries ES's Location header (DocWriteResponse.getLocation).
local function finish(st, res, opts)
  if not st then error(res, 0) end
  -- refresh=wait_for: answer once a refresh made the write visible (a noop wrote nothing)
  if opts.wait_for and json.get(res, "result") ~= "noop" then
    local idx = store.get(json.get(res, "_index"))
    if idx and store.wait_for_refresh({ idx })[idx.name] then store.mark_forced(res) end
  end
  if st == 201 then
    local loc = "/" .. form_encode(json.get(res, "_index")) .. "/_doc/" .. form_encode(json.get(res, "_id"))
    if opts.routing then loc = loc .. "?routing=" .. form_encode(opts.routing) end
    return st, res, { Location = loc }
  end
  return st, res
end

local function doc_body(ctx)
  if ctx.body == nil or ctx.body == "" then error(errors.body_required(), 0) end
  local src, err = json.decode(ctx.body, "strict") -- duplicate names refused, as in ES
  if src == nil then
    local line, col = json.error_position(ctx.body, err)
    error(errors.new(400, "document_parsing_exception", "[" .. line .. ":" .. col .. "] failed to parse: " .. tostring(err), nil,
      { caused_by = { type = "json_parse_exception", reason = tostring(err) } }), 0)
  end
  return src
end

local function check_index_name(name)
  local bad = require("esxd.names").validate(name)
  if bad then error(bad, 0) end
end

-- require_alias=true: esxd has no aliases, so (as in ES for a name that is not an alias,
-- whether or not such an index exists) the write fails.
local function check_require_alias(ctx)
  if params.bool(ctx.args.require_alias, "require_alias") then
    local name = ctx.vars.index
    error(errors.new(404, "index_not_found_exception",
      "no such index [" .. name .. "] and [require_alias] request flag is [true] and [" .. name .. "] is not an alias",
      { "index_uuid", "_na_", "index", name }), 0)
  end
end

local function check_pipeline(args)
  if args.pipeline and args.pipeline ~= "_none" then
    error(errors.illegal_argument("pipeline with id [" .. args.pipeline .. "] does not exist"), 0)
  end
end

-- wait_for_active_shards above what one node has: ES validates the request, auto-creates the
-- index, then the shard-level write waits `timeout` (default 1m) for copies and fails (503).
local function await_copies(ctx, kind, id, opts, item)
  if ctx.args.wait_for_active_shards == nil then return end
  local verrs = store.validate_write(kind, id, opts)
  if not verrs or #verrs > 0 then return end   -- store.index / delete_doc answer with the error
  local idx
  if kind == "delete" then idx = store.get(ctx.vars.index) else idx = store.ensure_index(ctx.vars.index) end
  if not idx then return end
  local label, needed = active_shards.unmet(ctx.args.wait_for_active_shards, idx)
  if not label then return end
  local timeout, ms = active_shards.timeout(ctx.args, "1m")
  active_shards.wait(ms, label)
  error(active_shards.failure(idx, label, needed, timeout,
    active_shards.shard_request(idx, { item(idx) }, ctx.args.refresh)), 0)
end

local function write_doc(ctx, id, src, opts)
  local raw = ctx.body:gsub("^%s+", ""):gsub("%s+$", "")
  if ctx.args.wait_for_active_shards ~= nil and id == nil then id = store.new_id() end
  await_copies(ctx, "index", id, opts, function(idx) return active_shards.index_request(idx.name, id, raw) end)
  local st, res = store.index(ctx.vars.index, id, src, raw, opts)
  return finish(st, res, opts)
end

function _M.index(ctx)
  check_index_name(ctx.vars.index)
  check_pipeline(ctx.args)
  local src = doc_body(ctx)
  local opts = write_opts(ctx)
  check_require_alias(ctx)
  local id = ctx.vars.id
  if ctx.method == "PUT" and id == nil then
    error(errors.new(405, "illegal_argument_exception", "PUT requires an id"), 0)
  end
  return write_doc(ctx, id, src, opts)
end

function _M.create(ctx)
  -- RestIndexAction.CreateHandler takes op_type, but only "create"
  local op = ctx.args.op_type
  if op ~= nil and op:lower() ~= "create" then
    error(errors.illegal_argument("opType must be 'create', found: [" .. op .. "]"), 0)
  end
  check_index_name(ctx.vars.index)
  check_pipeline(ctx.args)
  local src = doc_body(ctx)
  local opts = write_opts(ctx, "create")
  check_require_alias(ctx)
  return write_doc(ctx, ctx.vars.id, src, opts)
end

-- An update body is UpdateRequest's own JSON, not a document: a syntax error there is the
-- parser's x_content_parse_exception, as for a search body.
local function update_body(ctx)
  if ctx.body == nil or ctx.body == "" then error(errors.body_required(), 0) end
  local body, err = json.decode(ctx.body, "strict")
  if body == nil then error(errors.json_parse(err, ctx.body), 0) end
  return body
end

function _M.update(ctx)
  check_index_name(ctx.vars.index)
  local body = update_body(ctx)
  local opts = write_opts(ctx)
  check_require_alias(ctx)
  local a = ctx.args
  opts.retry_on_conflict = a.retry_on_conflict
  opts.exact_body = json.decode_exact(ctx.body) -- (its integers exact in the stored source)
  opts.fetch = source_filter.update_fetch(type(body) == "table" and body._source or nil, a._source,
    a._source_includes, a._source_excludes)
  local st, res = store.update(ctx.vars.index, ctx.vars.id, body, opts)
  return finish(st, res, opts)
end

function _M.delete(ctx)
  local opts = write_opts(ctx)
  await_copies(ctx, "delete", ctx.vars.id, opts,
    function(idx) return active_shards.delete_request(idx.name, ctx.vars.id) end)
  local st, res = store.delete_doc(ctx.vars.index, ctx.vars.id, opts)
  return finish(st, res, opts)
end

-- The record a get-style request sees: real time (the latest write) unless realtime=false
-- (the state as of the last refresh); refresh=true refreshes the index first; version (with
-- version_type) must equal the document's version, else ES's 409.
local function lookup(ctx)
  local a = ctx.args
  local idx = store.get(ctx.vars.index)
  if not idx then
    -- the resolver's answer: a name starting with "_" is ES's invalid_index_name_exception
    local _, err = names.resolve(ctx.vars.index, store.names())
    error(err or errors.index_not_found(ctx.vars.index), 0)
  end
  if params.bool(a.refresh, "refresh") then store.refresh(idx) end
  local rec
  if params.bool(a.realtime, "realtime") == false then rec = idx.visible[ctx.vars.id]
  else rec = idx.docs[ctx.vars.id] end
  local vt = a.version_type
  if vt ~= nil and vt ~= "internal" and vt ~= "external" and vt ~= "external_gte" then
    error(errors.illegal_argument("No version type match [" .. vt .. "]"), 0)
  end
  if rec and a.version ~= nil and tonumber(a.version) ~= -3 and tonumber(a.version) ~= rec.version then
    error(errors.new(409, "version_conflict_engine_exception",
      ("[%s]: version conflict, current version [%d] is different than the one provided [%s]")
        :format(rec.id, rec.version, a.version),
      { "index_uuid", idx.uuid, "shard", "0", "index", idx.name }), 0)
  end
  return idx, rec
end

-- stored_fields without _source (and no _source parameter) leaves _source out, as in ES.
local function source_spec(a)
  local f = source_filter.parse(a._source, a._source_includes, a._source_excludes)
  if a.stored_fields ~= nil and a._source == nil then
    local wants = false
    for s in a.stored_fields:gmatch("[^,]+") do if s == "_source" then wants = true end end
    if not wants then return false end
  end
  return f
end

-- ?stored_fields=a,b on a get (ShardGetService): the values of the named fields mapped with
-- "store": true, as the field type displays its stored values; exact names only (no patterns;
-- an unknown or unstored name, or a metadata field, gives nothing). nil when none has a value.
local function stored_fields(idx, rec, spec)
  if spec == nil then return nil end
  local list = {}
  for s in spec:gmatch("[^,]+") do
    if not s:find("*", 1, true) and s:sub(1, 1) ~= "_" then list[#list + 1] = s end
  end
  if #list == 0 then return nil end
  local ok, plan = pcall(fetch_fields.plan, idx, nil, nil, list)
  if not ok then
    -- (a date format esxd cannot print: the search's shard failure, as the get's error)
    if errors.is(plan) and plan.shard_failure then
      local c = plan.root_cause[1]
      error(errors.new(plan.status, c.type, c.reason), 0)
    end
    error(plan, 0)
  end
  return fetch_fields.fetch(plan, rec, idx.types)
end

function _M.get(ctx)
  local idx, rec = lookup(ctx)
  if not rec then
    return 404, json.obj("_index", idx.name, "_id", ctx.vars.id, "found", false)
  end
  local f = source_spec(ctx.args)
  local res = json.obj("_index", idx.name, "_id", rec.id, "_version", rec.version, "_seq_no", rec.seq_no,
    "_primary_term", 1, "_routing", rec.routing, "found", true)
  if f ~= false then json.set(res, "_source", source_filter.apply(f, rec)) end
  local fields = stored_fields(idx, rec, ctx.args.stored_fields)
  if fields then json.set(res, "fields", fields) end
  return 200, res
end

function _M.exists(ctx)
  if not store.get(ctx.vars.index) and ctx.vars.index:sub(1, 1) ~= "_" then return 404, nil end
  local _, rec = lookup(ctx)
  if rec then return 200, nil end
  return 404, nil
end

-- GET and HEAD /{index}/_source/{id} (RestGetSourceAction): a FetchSourceContext that does
-- not fetch (?_source=false, whatever else is given) is refused before the lookup.
function _M.source(ctx)
  if ctx.args._source == "false" then
    error(errors.validation({ "fetching source can not be disabled" }), 0)
  end
  local idx, rec = lookup(ctx)
  if not rec then
    error(errors.new(404, "resource_not_found_exception", "Document not found [" .. idx.name .. "]/[" .. ctx.vars.id .. "]"), 0)
  end
  local a = ctx.args
  local f = source_filter.parse(a._source, a._source_includes, a._source_excludes)
  return 200, source_filter.apply(f or nil, rec)
end

return _M
