-- esxd.bulk: the _bulk API. Parses the NDJSON body with Elasticsearch's request-level
-- errors (malformed action lines, missing final newline, missing index) and applies each
-- item through esxd.store, producing per-item results and errors. Also supports the
-- item_status fault (the first N items fail with an injected status instead of applying).
local json = require "esxd.json"
local errors = require "esxd.errors"
local store = require "esxd.store"
local names = require "esxd.names"
local source_filter = require "esxd.source_filter"
local active_shards = require "esxd.active_shards"

local _M = {}
local null = json.null

local ACTIONS = { index = true, create = true, update = true, delete = true }
local META = { _index = true, _id = true, routing = true, op_type = true, version = true, version_type = true,
  if_seq_no = true, if_primary_term = true, pipeline = true, retry_on_conflict = true, require_alias = true,
  require_data_stream = true, list_executed_pipelines = true, _type = false }
local META_OBJECTS = { dynamic_templates = true, _source = true }

local function kind(v)
  if type(v) == "table" and v ~= null then
    if json.is_array(v) then return "START_ARRAY" end -- [] (json.decode marks empty arrays)
    if next(v) == nil or #v == 0 then return "START_OBJECT" end
    return "START_ARRAY"
  end
  if type(v) == "number" then return "VALUE_NUMBER" end
  if type(v) == "boolean" then return "VALUE_BOOLEAN" end
  if v == null then return "VALUE_NULL" end
  return "VALUE_STRING"
end

local function malformed(line, msg)
  return errors.illegal_argument("Malformed action/metadata line [" .. line .. "], " .. msg)
end

-- Parse the body into a list of operations; returns ops or nil, error.
function _M.parse(body, default_index, params)
  if body == nil or body == "" then return nil, errors.body_required() end
  if body:sub(-1) ~= "\n" then
    return nil, errors.illegal_argument("The bulk request must be terminated by a newline [\\n]")
  end
  local lines = {}
  for l in body:gmatch("([^\n]*)\n") do lines[#lines + 1] = (l:gsub("\r$", "")) end
  local ops = {}
  local i = 1
  while i <= #lines do
    local line = lines[i]
    local lineno = i
    if line:match("^%s*$") then
      return nil, malformed(lineno, "expected START_OBJECT but found [null]")
    end
    local action, derr = json.decode(line, "strict")
    if action == nil then
      return nil, errors.new(400, "x_content_parse_exception", "[" .. lineno .. ":1] Unexpected character: " .. tostring(derr),
        nil, { caused_by = { type = "json_parse_exception", reason = tostring(derr) } })
    end
    if kind(action) ~= "START_OBJECT" then
      return nil, malformed(lineno, "expected START_OBJECT but found [" .. kind(action) .. "]")
    end
    local name, meta = next(action)
    if name == nil then return nil, malformed(lineno, "expected FIELD_NAME but found [END_OBJECT]") end
    if next(action, name) ~= nil then
      return nil, malformed(lineno, "expected END_OBJECT but found [FIELD_NAME]")
    end
    if not ACTIONS[name] then
      return nil, malformed(lineno, "expected one of [create, delete, index, update] but found [" .. tostring(name) .. "]")
    end
    if kind(meta) ~= "START_OBJECT" then
      return nil, malformed(lineno, "expected START_OBJECT but found [" .. kind(meta) .. "]")
    end
    for k, v in pairs(meta) do
      if META_OBJECTS[k] then
        -- accepted and ignored
      elseif not META[k] then
        if kind(v) == "START_OBJECT" or kind(v) == "START_ARRAY" then
          return nil, malformed(lineno, "expected a simple value for field [" .. k .. "] but found [" .. kind(v) .. "]")
        end
        return nil, errors.illegal_argument("Action/metadata line [" .. lineno .. "] contains an unknown parameter [" .. k .. "]")
      elseif kind(v) == "START_OBJECT" or kind(v) == "START_ARRAY" then
        return nil, malformed(lineno, "expected a simple value for field [" .. k .. "] but found [" .. kind(v) .. "]")
      end
    end
    -- BulkRequestParser's checks of an action line, before its source line is read
    local dyn = meta.dynamic_templates
    local has_dyn = type(dyn) == "table" and dyn ~= null and next(dyn) ~= nil
    if name == "delete" and has_dyn then
      return nil, errors.illegal_argument("Delete request in line [" .. lineno .. "] does not accept dynamic_templates")
    end
    if name == "update" then
      local vt = meta.version_type
      if vt ~= nil and vt ~= null and vt ~= "internal" and vt ~= "external" and vt ~= "external_gte" then
        return nil, errors.illegal_argument("No version type match [" .. tostring(vt) .. "]")
      end
      if (meta.version ~= nil and meta.version ~= null and tonumber(meta.version) ~= -3) or
        (vt ~= nil and vt ~= null and vt ~= "internal") then
        return nil, errors.illegal_argument("Update requests do not support versioning. " ..
          "Please use `if_seq_no` and `if_primary_term` instead")
      end
      if meta.require_data_stream == true or meta.require_data_stream == "true" then
        return nil, errors.illegal_argument("Update requests do not support the `require_data_stream` flag, " ..
          "as data streams do not support update operations")
      end
      if has_dyn then
        return nil, errors.illegal_argument("Update request in line [" .. lineno .. "] does not accept dynamic_templates")
      end
    end
    local op = { action = name, index = meta._index ~= nil and tostring(meta._index) or default_index,
      id = meta._id ~= nil and meta._id ~= null and tostring(meta._id) or nil, meta = meta, line = lineno }
    if name == "index" and meta.op_type == "create" then op.action = "create" end
    if name ~= "delete" then
      if i + 1 > #lines then break end -- ES ignores a trailing action without a source line
      op.source_line = lines[i + 1]
      i = i + 2
      if name == "update" then
        local ub, uerr = json.decode(op.source_line, "strict")
        if ub == nil or kind(ub) ~= "START_OBJECT" then
          return nil, errors.new(400, "x_content_parse_exception",
            "[" .. (lineno + 1) .. ":1] [UpdateRequest] failed to parse: " .. tostring(uerr or "expected an object"))
        end
        -- a body UpdateRequest cannot parse fails the whole request, as in ES
        local perr = store.update_body_error(ub)
        if perr then return nil, perr end
        op.update = ub
      end
    else
      i = i + 1
    end
    ops[#ops + 1] = op
  end
  -- BulkRequest.validate: every item's own validation, all in one 400
  local missing = {}
  for _, op in ipairs(ops) do
    if op.index == nil or op.index == "" then missing[#missing + 1] = "index is missing" end
    if op.action == "delete" or op.action == "update" then
      if op.id == nil then missing[#missing + 1] = "id is missing" end
    end
    if op.action == "update" then
      local m = op.meta
      for _, e in ipairs(store.validate_update(op.update, { if_seq_no = m.if_seq_no, if_primary_term = m.if_primary_term,
        retry_on_conflict = m.retry_on_conflict })) do
        missing[#missing + 1] = e
      end
    else
      local m = op.meta
      local errs, verr = store.validate_write(op.action == "delete" and "delete" or "index", op.id,
        { op_type = op.action, version = m.version, version_type = m.version_type,
          if_seq_no = m.if_seq_no, if_primary_term = m.if_primary_term })
      if not errs then return nil, verr end
      for _, e in ipairs(errs) do missing[#missing + 1] = e end
    end
  end
  if #missing > 0 then return nil, errors.validation(missing) end
  if #ops == 0 then return nil, errors.validation({ "no requests added" }) end
  return ops
end

local REJECT = {
  [429] = { "es_rejected_execution_exception", "rejected execution of primary operation [coordinating_and_primary_bytes=0, replica_bytes=0, all_bytes=0, primary_operation_bytes=0, max_coordinating_and_primary_bytes=0] (esxd injected fault)" },
  [400] = { "mapper_parsing_exception", "failed to parse (esxd injected fault)" },
  [409] = { "version_conflict_engine_exception", "version conflict (esxd injected fault)" },
  [404] = { "index_not_found_exception", "no such index (esxd injected fault)" },
  [503] = { "unavailable_shards_exception", "primary shard is not active (esxd injected fault)" },
}

local function item_error(op, id, status, e)
  return json.obj("_index", op.index, "_id", id or null, "status", status, "error", errors.item(e))
end

local function truthy(v) return v == true or v == "true" or v == "" end

local function pipeline_of(op, params)
  if op.action ~= "index" and op.action ~= "create" then return nil end
  local p = op.meta.pipeline or params.pipeline
  if p ~= nil and p ~= "_none" then return p end
end

-- The checks ES makes on the coordinating node, before an item reaches its shard.
local function coordinating_error(op, params)
  local bad = names.validate(op.index)
  if bad then return bad end
  local require_alias = op.meta.require_alias
  if require_alias == nil then require_alias = params.require_alias end
  if truthy(require_alias) then -- esxd has no aliases
    return errors.new(404, "index_not_found_exception",
      "no such index [" .. op.index .. "] and [require_alias] request flag is [true] and [" .. op.index .. "] is not an alias",
      { "index_uuid", "_na_", "index", op.index })
  end
  local pipeline = pipeline_of(op, params)
  if pipeline then return errors.illegal_argument("pipeline with id [" .. tostring(pipeline) .. "] does not exist") end
end

-- UpdateRequest.toString (the partial documents print with esxd's key order)
local function update_request(op, id)
  local u, out = op.update, { "update {[" .. op.index .. "][" .. tostring(id) .. "], doc_as_upsert[" ..
    tostring(u.doc_as_upsert == true) .. "]" }
  if type(u.doc) == "table" then out[#out + 1] = ", doc[index {[null][null], source[" .. json.encode(u.doc) .. "]}]" end
  if type(u.upsert) == "table" then out[#out + 1] = ", upsert[index {[null][null], source[" .. json.encode(u.upsert) .. "]}]" end
  out[#out + 1] = ", scripted_upsert[" .. tostring(u.scripted_upsert == true) .. "], detect_noop[" ..
    tostring(u.detect_noop ~= false) .. "]}"
  return table.concat(out)
end

-- wait_for_active_shards: the indices whose shard requests cannot get enough copies, after
-- waiting the bulk's timeout once (ES's shard requests wait in parallel). Auto-creates the
-- indices the items write to, as ES does first. Returns index name -> the items' error.
local function unmet_shards(ops, params)
  if params.wait_for_active_shards == nil then return {} end
  local unmet, order = {}, {}
  for _, op in ipairs(ops) do
    if not coordinating_error(op, params) then
      if op.action ~= "delete" and op.action ~= "update" and op.id == nil then op.auto_id = store.new_id() end
      local idx = store.get(op.index)
      if not idx and op.action ~= "delete" then idx = store.ensure_index(op.index) end
      local label, needed
      if idx then label, needed = active_shards.unmet(params.wait_for_active_shards, idx) end
      if label then
        local u = unmet[op.index]
        if not u then
          u = { idx = idx, label = label, needed = needed, items = {} }
          unmet[op.index] = u; order[#order + 1] = u
        end
        local id = op.id or op.auto_id
        u.items[#u.items + 1] = (op.action == "delete" and active_shards.delete_request(op.index, id))
          or (op.action == "update" and update_request(op, id))
          or active_shards.index_request(op.index, id, op.source_line)
      end
    end
  end
  if #order == 0 then return unmet end
  local timeout, ms = active_shards.timeout(params, "1m")
  active_shards.wait(ms, order[1].label)
  local out = {}
  for name, u in pairs(unmet) do
    out[name] = active_shards.failure(u.idx, u.label, u.needed, timeout,
      active_shards.shard_request(u.idx, u.items, params.refresh))
  end
  return out
end

-- Execute parsed ops. fault: {status=, count=} or nil. Returns response object.
function _M.execute(ops, params, fault, started)
  local refresh = params.refresh ~= nil and params.refresh ~= "false" and params.refresh ~= "wait_for"
  local wait_for = params.refresh == "wait_for"
  local items = json.array()
  local any_error = false
  local touched = {}
  local written = {}   -- refresh=wait_for: {index, item response} of each write
  local failed_left = fault and (fault.count or math.huge) or 0
  local unmet = unmet_shards(ops, params)
  for _, op in ipairs(ops) do
    local st, res, err
    local id = op.id
    if op.action ~= "delete" and op.action ~= "update" and id == nil then id = op.auto_id or store.new_id() end
    if fault and failed_left > 0 then
      failed_left = failed_left - 1
      local r = REJECT[fault.status] or { "exception", "esxd injected item failure" }
      local e = errors.new(fault.status, r[1], r[2])
      items[#items + 1] = json.obj(op.action, item_error(op, id, fault.status, e))
      any_error = true
      goto continue
    end
    do
      err = coordinating_error(op, params) or unmet[op.index]
      if err then
        -- refused on the coordinating node, or its shard lacks copies: not applied
      elseif op.action == "index" or op.action == "create" then
        if op.id == "" then
          err = errors.illegal_argument("if _id is specified it must not be empty")
        else
          local src, derr = json.decode(op.source_line, "strict")
          if src == nil or type(src) ~= "table" or (#src > 0) then
            local line, col = 1, 1
            if derr then line, col = json.error_position(op.source_line, derr) end
            err = errors.new(400, "document_parsing_exception", "[" .. line .. ":" .. col .. "] failed to parse: " .. tostring(derr or "root must be an object"),
              nil, { caused_by = { type = "json_parse_exception", reason = tostring(derr or "not an object") } })
          else
            st, res = store.index(op.index, id, src, op.source_line,
              { op_type = op.action, if_seq_no = op.meta.if_seq_no, if_primary_term = op.meta.if_primary_term,
                version = op.meta.version, version_type = op.meta.version_type,
                routing = op.meta.routing ~= nil and tostring(op.meta.routing) or params.routing })
            if not st then err = res end
          end
        end
      elseif op.action == "update" then
        -- _source: the action line's, else the update body's, else the URL's
        local fetch
        if op.meta._source ~= nil then fetch = source_filter.update_fetch(op.meta._source)
        else
          fetch = source_filter.update_fetch(op.update._source, params._source, params._source_includes,
            params._source_excludes)
        end
        st, res = store.update(op.index, id, op.update,
          { exact_body = json.decode_exact(op.source_line), if_seq_no = op.meta.if_seq_no, if_primary_term = op.meta.if_primary_term, fetch = fetch,
            routing = op.meta.routing ~= nil and tostring(op.meta.routing) or params.routing })
        if not st then err = res end
      else
        st, res = store.delete_doc(op.index, id,
          { if_seq_no = op.meta.if_seq_no, if_primary_term = op.meta.if_primary_term,
            version = op.meta.version, version_type = op.meta.version_type })
        if not st then err = res end
      end
      if err then
        any_error = true
        items[#items + 1] = json.obj(op.action, item_error(op, id, err.status, err))
      else
        touched[op.index] = true
        if wait_for and json.get(res, "result") ~= "noop" then written[#written + 1] = { op.index, res } end
        if refresh then json.set(res, "forced_refresh", true) end
        json.set(res, "status", st)
        items[#items + 1] = json.obj(op.action, res)
      end
    end
    ::continue::
  end
  if refresh then
    for name in pairs(touched) do
      local idx = store.get(name)
      if idx then store.refresh(idx) end
    end
  elseif wait_for then
    -- one wait per index touched (ES: a bulk takes one refresh listener slot per shard)
    local list, seen = {}, {}
    for _, w in ipairs(written) do
      local idx = store.get(w[1])
      if idx and not seen[idx] then seen[idx] = true; list[#list + 1] = idx end
    end
    local forced = store.wait_for_refresh(list)
    for _, w in ipairs(written) do
      if forced[w[1]] then store.mark_forced(w[2]) end
    end
  end
  ngx.update_time()
  local took = math.floor((ngx.now() - (started or ngx.now())) * 1000)
  return json.obj("took", took, "errors", any_error, "items", items)
end

return _M
