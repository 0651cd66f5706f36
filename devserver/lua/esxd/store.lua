-- esxd.store: the in-memory indices and documents, near-real-time visibility (a document
-- becomes searchable on refresh), sequence numbers and versions, and the write operations
-- (index / create / update / delete) shared by the document APIs and _bulk.
local json = require "esxd.json"
local errors = require "esxd.errors"
local names = require "esxd.names"
local mapping = require "esxd.mapping"
local source_filter = require "esxd.source_filter"
local settings = require "esxd.settings"
local params = require "esxd.params"

local _M = {}
local null = json.null
local add_get

local indices = {}          -- name -> index
local id_counter = 0

local function now_ms() return math.floor(ngx.now() * 1000) end

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
local function b64url(bytes)
  local out = {}
  for i = 1, #bytes, 3 do
    local a, b, c = bytes:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    for k = 3, 0, -1 do
      local idx = math.floor(n / 64 ^ k) % 64
      out[#out + 1] = B64:sub(idx + 1, idx + 1)
    end
  end
  return table.concat(out)
end

-- 20-character URL-safe id (15 bytes: time, counter, randomness), like ES's auto ids.
function _M.new_id()
  id_counter = (id_counter + 1) % 16777216
  local t = now_ms()
  local bytes = {}
  for i = 5, 0, -1 do bytes[#bytes + 1] = string.char(math.floor(t / 256 ^ i) % 256) end
  bytes[#bytes + 1] = string.char(math.floor(id_counter / 65536) % 256, math.floor(id_counter / 256) % 256, id_counter % 256)
  for _ = 1, 6 do bytes[#bytes + 1] = string.char(math.random(0, 255)) end
  return b64url(table.concat(bytes))
end

local function uuid()
  local s = {}
  for _ = 1, 16 do s[#s + 1] = string.char(math.random(0, 255)) end
  return b64url(table.concat(s) .. "\0\0"):sub(1, 22)
end
_M.uuid = uuid

function _M.names()
  local out = {}
  for n in pairs(indices) do out[#out + 1] = n end
  table.sort(out)
  return out
end

function _M.get(name) return indices[name] end

-- Create an index. body: decoded create body (settings/mappings) or nil.
function _M.create(name, body)
  local bad = names.validate(name)
  if bad then return nil, bad end
  if indices[name] then
    return nil, errors.new(400, "resource_already_exists_exception",
      "index [" .. name .. "/" .. indices[name].uuid .. "] already exists",
      { "index_uuid", indices[name].uuid, "index", name })
  end
  local idx = { name = name, uuid = uuid(), created = now_ms(), types = {}, docs = {}, count = 0,
    visible = {}, visible_list = {}, dead = 0, changed = {}, dirty = false, seq_no = -1, tombstones = {}, formats = {},
    dynamic = {},
    settings = type(body) == "table" and body.settings or nil, mappings = nil }
  -- settings as ES reads them (dotted, "index." prefixed); unknown names are ES's 400
  local flat = settings.flatten(type(body) == "table" and body.settings or nil)
  local unknown = settings.validate(flat)
  if unknown then return nil, unknown end
  idx.flat_settings = flat
  -- number_of_shards / number_of_replicas: all documents live in one table whatever the
  -- count, but the _shards numbers ES reports follow them
  local nshards, serr = settings.number(flat, "index.number_of_shards", 1, 1024)
  if serr then return nil, serr end
  local nreplicas, rerr = settings.number(flat, "index.number_of_replicas", 0)
  if rerr then return nil, rerr end
  -- the mapping limits a document's new fields (and the explicit mappings) must stay within
  local lerr
  idx.total_fields_limit, lerr = settings.number(flat, "index.mapping.total_fields.limit", 0, nil, 64)
  if lerr then return nil, lerr end
  idx.depth_limit, lerr = settings.number(flat, "index.mapping.depth.limit", 1, nil, 64)
  if lerr then return nil, lerr end
  idx.max_result_window, lerr = settings.number(flat, "index.max_result_window", 1)
  if lerr then return nil, lerr end
  idx.max_docvalue_fields_search, lerr = settings.number(flat, "index.max_docvalue_fields_search", 0)
  if lerr then return nil, lerr end
  idx.nested_limit, lerr = settings.number(flat, "index.mapping.nested_fields.limit", 0, nil, 64)
  if lerr then return nil, lerr end
  local max_terms
  max_terms, lerr = settings.number(flat, "index.max_terms_count", 1)
  if lerr then return nil, lerr end
  mapping.register_limits(idx.types, { max_terms_count = max_terms or 65536 })
  idx.nested_limit = idx.nested_limit or 50
  -- index.refresh_interval (ES's timeSetting, default 1s): how often auto_refresh makes
  -- writes searchable; -1 turns the automatic refresh off
  local ri = flat["index.refresh_interval"]
  if ri ~= nil and ri ~= null then
    local ok, e = pcall(params.check_time, "index.refresh_interval", tostring(ri))
    if not ok and e.type == "illegal_argument_exception" then return nil, e end
    if not ok then
      return nil, errors.new(400, "illegal_argument_exception", e.reason, nil,
        { caused_by = { type = e.type, reason = e.reason } })
    end
    idx.refresh_ms = params.time_ms(tostring(ri))
  end
  idx.refresh_ms = idx.refresh_ms or 1000
  idx.last_refresh = now_ms()
  idx.total_fields_limit = idx.total_fields_limit or 1000
  idx.depth_limit = idx.depth_limit or 20
  mapping.register_formats(idx.types, idx.formats)
  -- index.mapping.ignore_malformed (flat, or nested as {"index":{"mapping":{...}}} /
  -- {"mapping":{...}}): the default of every field that takes "ignore_malformed"
  idx.malformed = {}
  mapping.register_malformed(idx.types, idx.malformed)
  idx.copy_from = {}
  mapping.register_copy_to(idx.types, idx.copy_from)
  idx.null_values = {}
  mapping.register_null_values(idx.types, idx.null_values)
  idx.ignore_above = {}
  mapping.register_ignore_above(idx.types, idx.ignore_above)
  mapping.register_disabled(idx.types, {})
  -- index.mapping.coerce: the default "coerce" of numeric fields
  mapping.register_defs(idx.types, { [""] = { coerce = flat["index.mapping.coerce"] } })
  local im = flat["index.mapping.ignore_malformed"]
  if im ~= nil then idx.malformed[""] = im end
  idx.shards = nshards or 1
  idx.replicas = nreplicas or 1
  if type(body) == "table" and type(body.mappings) == "table" then
    idx.mappings = body.mappings
    mapping.load(idx.types, body.mappings.properties, nil, idx.formats, idx.dynamic, idx.malformed, idx.copy_from,
      idx.null_values)
    if body.mappings.dynamic ~= nil then idx.dynamic[""] = body.mappings.dynamic end
    idx.no_date_detection = body.mappings.date_detection == false
    local dformats, _, unsupported = mapping.dynamic_date_formats(body.mappings)
    if unsupported then return nil, errors.illegal_argument(unsupported) end
    mapping.register_date_formats(idx.types, dformats)
    local nd = body.mappings.numeric_detection
    mapping.register_numeric_detection(idx.types, nd == true or nd == "true")
    if type(body.mappings.dynamic_templates) == "table" then
      mapping.register_templates(idx.types, body.mappings.dynamic_templates)
    end
    local over = mapping.limits_error(idx.types, idx.total_fields_limit, idx.depth_limit, idx.nested_limit)
    if over then return nil, errors.illegal_argument(over) end
  end
  indices[name] = idx
  return idx
end

-- The field tables of idx with a mapping update applied, or nil and ES's limits error:
-- delta is what esxd.mapping_update.merge returned (the new and changed fields, and the root
-- keys an update sets). Checked on copies first; nothing changes when it fails.
function _M.update_mapping_error(idx, delta)
  if type(delta.properties) ~= "table" then return nil end
  local trial = {}
  for k, v in pairs(idx.types) do trial[k] = v end
  mapping.load(trial, delta.properties)
  local over = mapping.limits_error(trial, idx.total_fields_limit, idx.depth_limit, idx.nested_limit)
  if over then return errors.illegal_argument(over) end
end

-- Applies a mapping update: explicit becomes the index's explicit mappings, and the delta's
-- fields are loaded again, their updateable parameters (ignore_above, ignore_malformed,
-- copy_to) replaced rather than added to.
function _M.update_mapping(idx, explicit, delta)
  local function clear(props, prefix)
    for name, def in pairs(props) do
      local path = prefix and (prefix .. "." .. name) or name
      if type(def) == "table" and def.properties then
        clear(def.properties, path)
      elseif type(def) == "table" then
        idx.malformed[path] = nil
        idx.ignore_above[path] = nil
        for sub in pairs(type(def.fields) == "table" and def.fields or {}) do idx.ignore_above[path .. "." .. sub] = nil end
        for _, list in pairs(idx.copy_from) do
          for i = #list, 1, -1 do if list[i] == path then table.remove(list, i) end end
        end
      end
    end
  end
  if type(delta.properties) == "table" then
    clear(delta.properties, nil)
    mapping.load(idx.types, delta.properties, nil, idx.formats, idx.dynamic, idx.malformed, idx.copy_from,
      idx.null_values)
  end
  if delta.dynamic ~= nil then idx.dynamic[""] = delta.dynamic end
  if delta.date_detection ~= nil then idx.no_date_detection = delta.date_detection == false end
  if delta.numeric_detection ~= nil then
    local nd = delta.numeric_detection
    mapping.register_numeric_detection(idx.types, nd == true or nd == "true")
  end
  idx.mappings = explicit
end

function _M.delete(name) indices[name] = nil end

function _M.drop_all() indices = {} end

-- Make the current documents visible to search. Incremental: only ids written since the
-- last refresh are looked at; replaced records are marked dead in visible_list (searches
-- skip them) and the list is compacted when more than half of it is dead.
function _M.refresh(idx)
  idx.refresh_gen = (idx.refresh_gen or 0) + 1 -- (what refresh=wait_for waits on)
  if not idx.dirty then return end
  local vis, list = idx.visible, idx.visible_list
  local added = {}
  for id in pairs(idx.changed) do
    local old, new = vis[id], idx.docs[id]
    if old ~= new then
      if old then old.dead = true; idx.dead = idx.dead + 1 end
      vis[id] = new
      if new then added[#added + 1] = new end
    end
  end
  table.sort(added, function(a, b) return a.seq_no < b.seq_no end)
  for _, rec in ipairs(added) do list[#list + 1] = rec end
  if idx.dead > 1000 and idx.dead * 2 > #list then
    local live = {}
    for _, rec in ipairs(list) do if not rec.dead then live[#live + 1] = rec end end
    idx.visible_list, idx.dead = live, 0
  end
  idx.changed, idx.dirty = {}, false
end

function _M.refresh_all()
  for _, idx in pairs(indices) do _M.refresh(idx) end
end

-- The automatic refresh (a 100 ms timer): each index whose refresh_interval has passed since
-- its last automatic refresh; never one with refresh_interval -1.
function _M.auto_refresh()
  local now = now_ms()
  for _, idx in pairs(indices) do
    if idx.refresh_ms >= 0 and now - idx.last_refresh >= idx.refresh_ms - 5 then
      idx.last_refresh = now
      _M.refresh(idx)
    end
  end
end

-- refresh=wait_for (ES's RefreshListeners): the request waits for each of the indices' next
-- refresh: the automatic one (every index.refresh_interval; never with -1), POST /_refresh,
-- or another write's refresh=true. When index.max_refresh_listeners (default 1000) requests
-- already wait on an index, the request refreshes it instead, as ES does. list: indices;
-- returns the set of index names it refreshed itself (their responses say forced_refresh).
function _M.wait_for_refresh(list)
  local forced, waiting = {}, {}
  for _, idx in ipairs(list) do
    local max = tonumber(idx.flat_settings and idx.flat_settings["index.max_refresh_listeners"]) or 1000
    if (idx.refresh_waiters or 0) >= max then
      _M.refresh(idx)
      forced[idx.name] = true
    else
      idx.refresh_waiters = (idx.refresh_waiters or 0) + 1
      waiting[#waiting + 1] = { idx, idx.refresh_gen or 0 }
    end
  end
  for _, w in ipairs(waiting) do
    local idx, gen = w[1], w[2]
    -- (a deleted index ends the wait: ES fails the listeners of a closed shard)
    while (idx.refresh_gen or 0) == gen and indices[idx.name] == idx do ngx.sleep(0.01) end
    idx.refresh_waiters = idx.refresh_waiters - 1
  end
  return forced
end

-- A write response that refreshed the index: "forced_refresh": true after "result", where
-- ES's DocWriteResponse puts it.
function _M.mark_forced(res)
  local keys = res.__keys
  for i, k in ipairs(keys) do
    if k == "result" then table.insert(keys, i + 1, "forced_refresh"); break end
  end
  res.__vals.forced_refresh = true
end

local function ensure_index(name)
  local idx = indices[name]
  if idx then return idx end
  return _M.create(name, nil)
end
_M.ensure_index = ensure_index

local function shards(n) return json.obj("total", n or 2, "successful", n == 0 and 0 or 1, "failed", 0) end
_M.shards = shards

local function result(idx, id, rec_version, seq_no, res, forced)
  -- one node: the primary succeeds, its replicas are unassigned but counted in total
  return json.obj("_index", idx.name, "_id", id, "_version", rec_version, "result", res,
    "forced_refresh", forced or nil,
    "_shards", shards(res == "noop" and 0 or 1 + idx.replicas), "_seq_no", seq_no, "_primary_term", 1)
end

local function conflict(idx, id, reason)
  return errors.new(409, "version_conflict_engine_exception", "[" .. id .. "]: " .. reason,
    { "index_uuid", idx.uuid, "shard", "0", "index", idx.name })
end

local function check_cas(idx, id, cur, opts)
  if opts.if_seq_no == nil and opts.if_primary_term == nil then return nil end
  local want_seq, want_term = tonumber(opts.if_seq_no), tonumber(opts.if_primary_term)
  if want_seq == nil then
    return errors.new(400, "action_request_validation_exception",
      "Validation Failed: 1: ifSeqNo is unassigned, but primary term is [" .. tostring(opts.if_primary_term) .. "];")
  end
  if want_term == nil then
    return errors.new(400, "action_request_validation_exception",
      "Validation Failed: 1: ifSeqNo is set, but primary term is [0];")
  end
  if not cur then
    return conflict(idx, id, ("version conflict, required seqNo [%d], primary term [%d]. but no document was found"):format(want_seq, want_term))
  end
  if cur.seq_no ~= want_seq or want_term ~= 1 then
    return conflict(idx, id, ("version conflict, required seqNo [%d], primary term [%d]. current document has seqNo [%d] and primary term [1]"):format(want_seq, want_term, cur.seq_no))
  end
end

-- ES's request validation of a write (IndexRequest / DeleteRequest.validate with
-- DocWriteRequest.validateSeqNoBasedCASParams): returns the list of messages (empty if
-- valid), or nil, error for an unknown version type. kind: "index" or "delete".
-- MATCH_ANY is -3, MATCH_DELETED -4; an unset if_seq_no / if_primary_term is unassigned.
function _M.validate_write(kind, id, opts)
  local errs = {}
  local vt = opts.version_type or "internal"
  if vt ~= "internal" and vt ~= "external" and vt ~= "external_gte" then
    return nil, errors.illegal_argument("No version type match [" .. tostring(vt) .. "]")
  end
  local v = opts.version == nil and -3 or tonumber(opts.version)
  local has_seq, has_term = opts.if_seq_no ~= nil, opts.if_primary_term ~= nil
  if kind == "index" and opts.op_type == "create" then
    if vt ~= "internal" then
      return { "create operations only support internal versioning. use index instead" }
    elseif v ~= -3 and v ~= -4 then
      return { "create operations do not support explicit versions. use index instead" }
    elseif has_seq or has_term then
      return { "create operations do not support compare and set. use index instead" }
    end
  end
  local valid
  if v == nil or v ~= math.floor(v) then valid = false
  elseif vt == "internal" then valid = v > 0 or v == -3 or v == -4
  else valid = v >= 0 end
  if not valid then
    errs[#errs + 1] = ("illegal version value [%s] for version type [%s]"):format(tostring(opts.version or -3), vt:upper())
  end
  if vt == "internal" and v ~= -3 and v ~= -4 then
    errs[#errs + 1] = "internal versioning can not be used for optimistic concurrency control. " ..
      "Please use `if_seq_no` and `if_primary_term` instead"
  end
  if has_seq and (vt ~= "internal" or v ~= -3) then
    errs[#errs + 1] = "compare and write operations can not use versioning"
  end
  if has_seq and not has_term then errs[#errs + 1] = "ifSeqNo is set, but primary term is [0]" end
  if has_term and not has_seq then
    errs[#errs + 1] = "ifSeqNo is unassigned, but primary term is [" .. tostring(opts.if_primary_term) .. "]"
  end
  if id and #id > 512 then
    errs[#errs + 1] = ("id [%s] is too long, must be no longer than 512 bytes but was: %d"):format(id, #id)
  end
  return errs
end

local function validation_error(errs)
  if errs and #errs > 0 then return errors.validation(errs) end
end

-- External versioning (version_type external / external_gte): the caller's version must be
-- higher than (external) or at least (external_gte) the document's, deleted documents
-- included, and becomes the document's version.  Returns the version to store (nil for
-- internal versioning) or nil, error.
local function check_version(idx, id, cur, opts)
  local vt = opts.version_type
  if vt == nil and opts.version == nil then return nil end
  vt = vt or "internal"
  if vt ~= "internal" and vt ~= "external" and vt ~= "external_gte" then
    return nil, errors.illegal_argument("No version type match [" .. tostring(vt) .. "]")
  end
  local v = tonumber(opts.version)
  if vt == "internal" then
    if opts.version == nil then return nil end
    return nil, errors.new(400, "action_request_validation_exception",
      "Validation Failed: 1: internal versioning can not be used for optimistic concurrency control. " ..
      "Please use `if_seq_no` and `if_primary_term` instead;")
  end
  if opts.op_type == "create" then
    return nil, errors.new(400, "action_request_validation_exception",
      "Validation Failed: 1: create operations only support internal versioning. use index instead;")
  end
  if v == nil or v < 0 or v ~= math.floor(v) then
    return nil, errors.new(400, "action_request_validation_exception",
      ("Validation Failed: 1: illegal version value [%s] for version type [%s];")
        :format(tostring(opts.version or -3), vt:upper()))
  end
  local have = cur and cur.version or idx.tombstones[id]
  if have and (vt == "external" and have >= v or vt == "external_gte" and have > v) then
    return nil, conflict(idx, id, ("version conflict, current version [%d] is %s the one provided [%d]")
      :format(have, vt == "external" and "higher or equal to" or "higher than", v))
  end
  return v
end

local function doc_parse_error(id, bad)
  if bad.concrete then
    return errors.new(400, "document_parsing_exception",
      ("[1:1] object mapping for [%s] tried to parse field [%s] as object, but found a concrete value")
        :format(bad.field, bad.key))
  end
  local preview = type(bad.value) == "table" and "{...}" or tostring(bad.value)
  if bad.object then
    return errors.new(400, "document_parsing_exception",
      ("[1:1] failed to parse field [%s] of type [%s] in document with id '%s'. Preview of field's value: '%s'")
        :format(bad.field, bad.type, id, preview))
  end
  -- the value parser's reason, where esxd words it (an ip, "coerce": false)
  local cause = bad.cause and { caused_by = { type = bad.cause_type or "illegal_argument_exception", reason = bad.cause } } or nil
  return errors.new(400, "document_parsing_exception",
    ("[1:1] failed to parse field [%s] of type [%s] in document with id '%s'. Preview of field's value: '%s'")
      :format(bad.field, bad.type, id, preview), nil, cause)
end

local function put(idx, id, source, raw, cur, opts, external)
  -- (the raw text: a date field reads a number from its text, which decoding loses)
  local bad_name = mapping.empty_name(idx.types, idx.dynamic, source)
  if bad_name == "" then
    return nil, errors.new(400, "document_parsing_exception", "[1:1] failed to parse: " .. mapping.EMPTY_NAME, nil,
      { caused_by = { type = "illegal_argument_exception", reason = mapping.EMPTY_NAME } })
  elseif type(bad_name) == "table" then
    return nil, errors.new(400, "document_parsing_exception", "[1:1] failed to parse: " .. bad_name.reason, nil,
      { caused_by = { type = "illegal_argument_exception", reason = bad_name.reason } })
  elseif bad_name then
    return nil, errors.new(400, "document_parsing_exception", "[1:1] " .. mapping.blank_name_reason(bad_name))
  end
  local texts = mapping.number_texts(raw)
  local bad = mapping.check(idx.types, source, nil, idx.formats, idx.malformed, texts)
  if bad then return nil, doc_parse_error(id, bad) end
  local new = mapping.strict(idx.types, idx.dynamic, source)
  if new then
    return nil, errors.new(400, "strict_dynamic_mapping_exception",
      ("[1:1] mapping set to strict, dynamic introduction of [%s] within [%s] is not allowed"):format(new.field, new.within))
  end
  local over = mapping.new_fields_error(idx.types, source, idx.no_date_detection, idx.dynamic,
    idx.total_fields_limit, idx.depth_limit)
  if over then
    return nil, errors.new(400, "document_parsing_exception", "[1:1] failed to parse: " .. over, nil,
      { caused_by = { type = "illegal_argument_exception", reason = over } })
  end
  local conflict, bad_new = mapping.dynamic_conflict(idx.types, source, idx.no_date_detection, idx.dynamic, texts)
  if bad_new then return nil, doc_parse_error(id, bad_new) end
  if conflict then return nil, errors.illegal_argument(conflict) end
  mapping.learn(idx.types, source, nil, idx.no_date_detection, idx.dynamic, nil, texts)
  idx.seq_no = idx.seq_no + 1
  local version = external or (cur and cur.version + 1 or (idx.tombstones[id] or 0) + 1)
  -- routing: the write's, else (an update) the document's current one, as ES keeps it
  local routing = opts.routing
  if routing == nil and opts.keep_routing and cur then routing = cur.routing end
  local rec = { id = id, source = source, raw = raw, version = version, seq_no = idx.seq_no, routing = routing }
  if not cur then idx.count = idx.count + 1 end
  idx.docs[id] = rec
  idx.tombstones[id] = nil
  idx.changed[id] = true
  idx.dirty = true
  if opts.refresh then _M.refresh(idx) end
  return rec
end

local function check_id(id)
  if id == "" then return errors.illegal_argument("if _id is specified it must not be empty") end
  if id and #id > 512 then
    return errors.new(400, "action_request_validation_exception",
      ("Validation Failed: 1: id [%s] is too long, must be no longer than 512 bytes but was: %d;"):format(id, #id))
  end
end

-- Index (or create) a document. source: decoded table; raw: its JSON text.
-- opts: op_type ("index"|"create"), if_seq_no, if_primary_term, version, version_type,
-- refresh (bool).
-- Returns status, result-object or nil, error.
function _M.index(name, id, source, raw, opts)
  opts = opts or {}
  local verrs, vterr = _M.validate_write("index", id, opts)
  if not verrs then return nil, vterr end
  if #verrs > 0 then return nil, validation_error(verrs) end
  local bad_id = check_id(id)
  if bad_id then return nil, bad_id end
  if type(source) ~= "table" or (#source > 0) then
    return nil, errors.new(400, "document_parsing_exception", "[1:1] failed to parse: root must be an object",
      nil, { caused_by = { type = "not_x_content_exception", reason = "Compressor detection can only be called on some xcontent bytes or compressed xcontent bytes" } })
  end
  local idx, err = ensure_index(name)
  if not idx then return nil, err end
  if id == nil then id = _M.new_id() end
  local cur = idx.docs[id]
  if opts.op_type == "create" and cur then
    return nil, conflict(idx, id, ("version conflict, document already exists (current version [%d])"):format(cur.version))
  end
  local external, verr = check_version(idx, id, cur, opts)
  if verr then return nil, verr end
  local cas = check_cas(idx, id, cur, opts)
  if cas then return nil, cas end
  local rec, perr = put(idx, id, source, raw, cur, opts, external)
  if not rec then return nil, perr end
  return cur and 200 or 201, result(idx, id, rec.version, rec.seq_no, cur and "updated" or "created", opts.refresh)
end

function _M.delete_doc(name, id, opts)
  opts = opts or {}
  local verrs, vterr = _M.validate_write("delete", id, opts)
  if not verrs then return nil, vterr end
  if #verrs > 0 then return nil, validation_error(verrs) end
  local idx = indices[name]
  -- ES auto-creates the index for a delete only with external versioning
  local external_vt = opts.version_type == "external" or opts.version_type == "external_gte"
  if not idx and external_vt and not names.validate(name) then idx = ensure_index(name) end
  if not idx then return nil, errors.index_not_found(name) end
  local cur = idx.docs[id]
  local external, verr = check_version(idx, id, cur, opts)
  if verr then return nil, verr end
  local cas = check_cas(idx, id, cur, opts)
  if cas then return nil, cas end
  idx.seq_no = idx.seq_no + 1
  if not cur then
    local v = external or (idx.tombstones[id] or 0) + 1
    idx.tombstones[id] = v
    return 404, result(idx, id, v, idx.seq_no, "not_found", opts.refresh)
  end
  local v = external or cur.version + 1
  idx.docs[id] = nil
  idx.count = idx.count - 1
  idx.tombstones[id] = v
  idx.changed[id] = true
  idx.dirty = true
  if opts.refresh then _M.refresh(idx) end
  return 200, result(idx, id, v, idx.seq_no, "deleted", opts.refresh)
end

local function deep_equal(a, b)
  if a == b then return true end
  if type(a) ~= "table" or type(b) ~= "table" then return false end
  if json.is_array(a) ~= json.is_array(b) and next(a) == nil and next(b) == nil then return false end -- [] vs {}
  for k, v in pairs(a) do if not deep_equal(v, b[k]) then return false end end
  for k in pairs(b) do if a[k] == nil then return false end end
  return true
end

local function is_object(t)
  return type(t) == "table" and t ~= null and not json.is_array(t) and (next(t) == nil or #t == 0)
end

-- XContentHelper.update: two objects merge (an empty one changes nothing), anything else
-- replaces
local function merge(dst, src)
  for k, v in pairs(src) do
    if is_object(v) and is_object(dst[k]) then merge(dst[k], v)
    else dst[k] = v end
  end
end

local function copy(t)
  if type(t) ~= "table" or t == null then return t end
  local c = {}
  for k, v in pairs(t) do c[k] = copy(v) end
  return setmetatable(c, getmetatable(t)) -- json.array(): an empty array stays one
end

-- The "get" object of an update response when the source was asked for (_source):
-- fetch = { filter = source_filter spec or nil for the whole source }.
add_get = function(res, rec, fetch)
  if fetch and rec then
    json.set(res, "get", json.obj("_seq_no", rec.seq_no, "_primary_term", 1, "found", true,
      "_source", source_filter.apply(fetch.filter, rec)))
  end
  return res
end

-- UpdateRequest.fromXContent's errors for an update body (an object): unknown keys, a doc
-- that is not an object. Returns the error or nil.
local UPDATE_KEYS = { doc = true, doc_as_upsert = true, upsert = true, detect_noop = true, _source = true,
  scripted_upsert = true, script = true }
function _M.update_body_error(body)
  for k in pairs(body) do
    if not UPDATE_KEYS[k] then
      return errors.x_content_parse("[1:2] [UpdateRequest] unknown field [" .. tostring(k) .. "]")
    end
  end
  if body.doc ~= nil and not is_object(body.doc) then
    return errors.x_content_parse("[1:8] [UpdateRequest] doc doesn't support values of type: " ..
      (body.doc == null and "VALUE_NULL" or type(body.doc) == "table" and "START_ARRAY"
        or "VALUE_" .. type(body.doc):upper()))
  end
end

-- ES's UpdateRequest.validate (after DocWriteRequest.validateSeqNoBasedCASParams): the list
-- of messages, empty if valid. body: the decoded update body; opts: if_seq_no,
-- if_primary_term, retry_on_conflict.
function _M.validate_update(body, opts)
  local errs = {}
  local has_seq, has_term = opts.if_seq_no ~= nil, opts.if_primary_term ~= nil
  if has_seq and not has_term then errs[#errs + 1] = "ifSeqNo is set, but primary term is [0]" end
  if has_term and not has_seq then
    errs[#errs + 1] = "ifSeqNo is unassigned, but primary term is [" .. tostring(opts.if_primary_term) .. "]"
  end
  if has_seq then
    if (tonumber(opts.retry_on_conflict) or 0) > 0 then
      errs[#errs + 1] = "compare and write operations can not be retried"
    end
    if body.doc_as_upsert == true then errs[#errs + 1] = "compare and write operations can not be used with upsert" end
    if body.upsert ~= nil and body.upsert ~= null then
      errs[#errs + 1] = "upsert requests don't support `if_seq_no` and `if_primary_term`"
    end
  end
  local has_doc, has_script = body.doc ~= nil and body.doc ~= null, body.script ~= nil and body.script ~= null
  if not has_script and not has_doc then errs[#errs + 1] = "script or doc is missing" end
  if has_script and has_doc then errs[#errs + 1] = "can't provide both script and doc" end
  if not has_doc and body.doc_as_upsert == true then
    errs[#errs + 1] = "doc must be specified if doc_as_upsert is enabled"
  end
  return errs
end

-- Partial update. body: decoded update body {doc=, doc_as_upsert=, upsert=, detect_noop=}.
function _M.update(name, id, body, opts)
  opts = opts or {}
  if type(body) ~= "table" then return nil, errors.x_content_parse("[1:1] update request body must be an object") end
  local perr = _M.update_body_error(body)
  if perr then return nil, perr end
  local verrs = _M.validate_update(body, opts)
  if #verrs > 0 then return nil, validation_error(verrs) end
  if body.script ~= nil then
    return nil, errors.illegal_argument("esxd does not support scripts in update requests")
  end
  local bad_id = check_id(id)
  if bad_id then return nil, bad_id end
  -- the body with its integers exact (json.decode_exact), when the caller decoded it so
  local ebody = opts.exact_body or body
  local idx = indices[name]
  local cur = idx and idx.docs[id]
  if not cur then
    if body.doc_as_upsert == true or body.upsert ~= nil then
      local src = body.doc_as_upsert == true and body.doc or body.upsert
      if not is_object(src) then return nil, errors.x_content_parse("[1:1] upsert must be an object") end
      local esrc = ebody.doc_as_upsert == true and ebody.doc or ebody.upsert
      local st, res = _M.index(name, id, src, json.encode(esrc),
        { refresh = opts.refresh, op_type = "create", routing = opts.routing })
      if st and opts.fetch then add_get(res, indices[name].docs[id], opts.fetch) end
      return st, res
    end
    -- an update auto-creates its index like any other write (only deletes do not)
    if not idx then
      local err
      idx, err = ensure_index(name)
      if not idx then return nil, err end
    end
    return nil, errors.new(404, "document_missing_exception", "[" .. id .. "]: document missing",
      { "index_uuid", idx.uuid, "shard", "0", "index", name })
  end
  local cas = check_cas(idx, id, cur, opts)
  if cas then return nil, cas end
  -- merged with exact integers (source_filter.exact_source), as ES merges its parsed maps
  local exact = source_filter.exact_source(cur)
  local merged = copy(exact)
  merge(merged, ebody.doc)
  if body.detect_noop ~= false and deep_equal(merged, exact) then
    return 200, add_get(result(idx, id, cur.version, cur.seq_no, "noop"), cur, opts.fetch)
  end
  opts.keep_routing = true
  local raw = json.encode(merged)
  local rec, perr = put(idx, id, json.decode(raw), raw, cur, opts) -- (doubles again, for queries)
  if not rec then return nil, perr end
  return 200, add_get(result(idx, id, rec.version, rec.seq_no, "updated", opts.refresh), rec, opts.fetch)
end

return _M
