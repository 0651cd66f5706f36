-- esxd.api_docs: single-document APIs: index (PUT/POST _doc, auto id), _create, get, exists,
-- delete and _update. Writes go through esxd.store.
local json = require "esxd.json"
local errors = require "esxd.errors"
local store = require "esxd.store"
local source_filter = require "esxd.source_filter"

local _M = {}

local function refresh_flag(args)
  local r = args.refresh
  return r ~= nil and r ~= "false"
end

local function write_opts(ctx, op_type)
  local a = ctx.args
  if a.op_type ~= nil and a.op_type ~= "create" and a.op_type ~= "index" then
    error(errors.illegal_argument("opType must be 'create' or 'index', found: [" .. tostring(a.op_type) .. "]"), 0)
  end
  return { op_type = op_type or a.op_type or "index", if_seq_no = a.if_seq_no, if_primary_term = a.if_primary_term,
    version = a.version, version_type = a.version_type,
    refresh = refresh_flag(a), wait_for = a.refresh == "wait_for" }
end

local function finish(st, res, opts)
  if not st then error(res, 0) end
  if opts.wait_for then json.set(res, "forced_refresh", nil) end
  return st, res
end

local function doc_body(ctx)
  if ctx.body == nil or ctx.body == "" then error(errors.body_required(), 0) end
  local src, err = json.decode(ctx.body)
  if src == nil then
    error(errors.new(400, "document_parsing_exception", "[1:1] failed to parse: " .. tostring(err), nil,
      { caused_by = { type = "json_parse_exception", reason = tostring(err) } }), 0)
  end
  return src
end

local function check_index_name(name)
  local bad = require("esxd.names").validate(name)
  if bad then error(bad, 0) end
end

local function check_pipeline(args)
  if args.pipeline and args.pipeline ~= "_none" then
    error(errors.illegal_argument("pipeline with id [" .. args.pipeline .. "] does not exist"), 0)
  end
end

function _M.index(ctx)
  check_index_name(ctx.vars.index)
  check_pipeline(ctx.args)
  local src = doc_body(ctx)
  local opts = write_opts(ctx)
  local id = ctx.vars.id
  if ctx.method == "PUT" and id == nil then
    error(errors.new(405, "illegal_argument_exception", "PUT requires an id"), 0)
  end
  local st, res = store.index(ctx.vars.index, id, src, (ctx.body:gsub("^%s+", ""):gsub("%s+$", "")), opts)
  return finish(st, res, opts)
end

function _M.create(ctx)
  check_index_name(ctx.vars.index)
  check_pipeline(ctx.args)
  local src = doc_body(ctx)
  local opts = write_opts(ctx, "create")
  local st, res = store.index(ctx.vars.index, ctx.vars.id, src, (ctx.body:gsub("^%s+", ""):gsub("%s+$", "")), opts)
  return finish(st, res, opts)
end

function _M.update(ctx)
  check_index_name(ctx.vars.index)
  local body = doc_body(ctx)
  local opts = write_opts(ctx)
  local st, res = store.update(ctx.vars.index, ctx.vars.id, body, opts)
  return finish(st, res, opts)
end

function _M.delete(ctx)
  local opts = write_opts(ctx)
  local st, res = store.delete_doc(ctx.vars.index, ctx.vars.id, opts)
  return finish(st, res, opts)
end

function _M.get(ctx)
  local idx = store.get(ctx.vars.index)
  if not idx then error(errors.index_not_found(ctx.vars.index), 0) end
  local rec = idx.docs[ctx.vars.id]
  if not rec then
    return 404, json.obj("_index", idx.name, "_id", ctx.vars.id, "found", false)
  end
  local a = ctx.args
  local f = source_filter.parse(a._source, a._source_includes, a._source_excludes)
  local res = json.obj("_index", idx.name, "_id", rec.id, "_version", rec.version, "_seq_no", rec.seq_no,
    "_primary_term", 1, "found", true)
  if f ~= false then json.set(res, "_source", source_filter.apply(f, rec)) end
  return 200, res
end

function _M.exists(ctx)
  local idx = store.get(ctx.vars.index)
  if idx and idx.docs[ctx.vars.id] then return 200, nil end
  return 404, nil
end

function _M.source(ctx)
  local idx = store.get(ctx.vars.index)
  if not idx then error(errors.index_not_found(ctx.vars.index), 0) end
  local rec = idx.docs[ctx.vars.id]
  if not rec then
    error(errors.new(404, "resource_not_found_exception", "Document not found [" .. idx.name .. "]/[" .. ctx.vars.id .. "]"), 0)
  end
  local a = ctx.args
  local f = source_filter.parse(a._source, a._source_includes, a._source_excludes)
  return 200, source_filter.apply(f or nil, rec)
end

return _M
