-- esxd.errors: Elasticsearch-shaped errors. A handler raises or returns an error value
-- (errors.new ...) and respond.lua renders it as
-- {"error":{"root_cause":[...],"type":..,"reason":..,...},"status":N}.
local json = require "esxd.json"

local _M = {}
local ERR = {}
local unpack = table.unpack or unpack

-- ?error_trace=true: ES adds a "stack_trace" string to every error object. esxd has no Java
-- stack, so it writes ES's first line (exception class and message, [index] first) and one
-- frame naming esxd.
local function stack_trace(c)
  local class = c.type:gsub("^%l", string.upper):gsub("_(%l)", string.upper)
  local index
  for i = 1, #(c.fields or {}), 2 do if c.fields[i] == "index" then index = c.fields[i + 1] end end
  return (index and ("[" .. tostring(index) .. "] ") or "") .. "org.elasticsearch." .. class .. ": " ..
    tostring(c.reason) .. "\n\tat esxd (esxd dev server: no Java stack trace)"
end

-- cause: {type=, reason=, fields = ordered list {k, v, k, v}, caused_by = cause, root = list}
local function cause_obj(c, trace)
  local args = { "type", c.type, "reason", c.reason }
  for i = 1, #(c.fields or {}) do args[#args + 1] = c.fields[i] end
  if c.caused_by then
    args[#args + 1] = "caused_by"; args[#args + 1] = cause_obj(c.caused_by, trace)
  end
  if trace then args[#args + 1] = "stack_trace"; args[#args + 1] = stack_trace(c) end
  return json.obj(unpack(args))
end

-- errors.new(status, type, reason, fields?, opts?) -> error value.
-- fields: ordered flat list {"index", "foo", ...} added to the error object (and root cause).
-- opts.caused_by: nested cause; opts.root_cause: list of causes (defaults to the error itself
-- without caused_by); opts.headers: extra response headers.
function _M.new(status, etype, reason, fields, opts)
  opts = opts or {}
  return setmetatable({ status = status, type = etype, reason = reason, fields = fields or {},
    caused_by = opts.caused_by, root_cause = opts.root_cause, headers = opts.headers,
    extra_top = opts.extra_top }, ERR)
end

function _M.is(v) return type(v) == "table" and getmetatable(v) == ERR end

-- Render an error value to a JSON-encodable object. trace: ?error_trace=true.
function _M.body(e, trace)
  local roots = json.array()
  if e.root_cause then
    for _, c in ipairs(e.root_cause) do roots[#roots + 1] = cause_obj(c, trace) end
  else
    roots[1] = cause_obj({ type = e.type, reason = e.reason, fields = e.fields }, trace)
  end
  local err = json.obj("root_cause", roots, "type", e.type, "reason", e.reason)
  for i = 1, #e.fields, 2 do json.set(err, e.fields[i], e.fields[i + 1]) end
  for i = 1, #(e.extra_top or {}), 2 do json.set(err, e.extra_top[i], e.extra_top[i + 1]) end
  if e.caused_by then json.set(err, "caused_by", cause_obj(e.caused_by, trace)) end
  if trace then json.set(err, "stack_trace", stack_trace(e)) end
  return json.obj("error", err, "status", e.status)
end

-- Inner error object (as used in bulk items / msearch items): no "status" wrapper.
function _M.item(e)
  local o = cause_obj({ type = e.type, reason = e.reason, fields = e.fields, caused_by = e.caused_by })
  return o
end

-- Raise an error value (caught by the server's xpcall wrapper).
function _M.raise(...) error(_M.new(...), 0) end

-- Common ES errors ----------------------------------------------------------------------

function _M.index_not_found(name)
  return _M.new(404, "index_not_found_exception", "no such index [" .. name .. "]",
    { "resource.type", "index_or_alias", "resource.id", name, "index_uuid", "_na_", "index", name })
end

function _M.illegal_argument(reason)
  return _M.new(400, "illegal_argument_exception", reason)
end

function _M.parsing(reason)
  return _M.new(400, "parsing_exception", reason)
end

function _M.x_content_parse(reason)
  return _M.new(400, "x_content_parse_exception", reason)
end

function _M.validation(list)
  local parts = {}
  for i, m in ipairs(list) do parts[#parts + 1] = i .. ": " .. m .. ";" end
  return _M.new(400, "action_request_validation_exception", "Validation Failed: " .. table.concat(parts))
end

function _M.body_required()
  return _M.new(400, "parse_exception", "request body is required")
end

-- Java's exceptions, as opposed to Elasticsearch's own.
local JAVA = { illegal_argument_exception = true, number_format_exception = true, illegal_state_exception = true,
  unsupported_operation_exception = true }

-- Wrap a query-phase failure the way ES does (search_phase_execution_exception, all shards failed).
-- The shard's failure keeps its caused_by; the root cause is rendered without it, as ES does.
-- The top caused_by is ElasticsearchException.guessRootCauses of the shard's failure: a Java
-- exception comes wrapped in an ElasticsearchException named after it and caused by it.
function _M.search_phase(index, inner)
  local cause = { type = inner.type, reason = inner.reason, fields = inner.fields, caused_by = inner.caused_by }
  local shard = json.obj("shard", 0, "index", index or json.null, "node", "esxd-node-0000000000",
    "reason", cause_obj(cause))
  local top = cause
  if JAVA[inner.type] and not inner.caused_by then
    top = { type = inner.type, reason = inner.reason, fields = inner.fields,
      caused_by = { type = inner.type, reason = inner.reason, fields = inner.fields } }
  end
  local e = _M.new(inner.status or 400, "search_phase_execution_exception", "all shards failed", nil, {
    root_cause = { { type = inner.type, reason = inner.reason, fields = inner.fields } },
    caused_by = top,
    extra_top = { "phase", "query", "grouped", true, "failed_shards", json.array({ shard }) },
  })
  e.shard_failure = shard   -- the ShardSearchFailure (for _shards.failures) and its index
  e.failed_index = index
  return e
end

-- The failures of several indices' shards (each a search_phase value, one per index as ES's
-- ExceptionsHelper.groupBy groups them) as one SearchPhaseExecutionException: every group's
-- root cause and failed_shards entry; caused_by is the first failure's root cause for "all
-- shards failed", none for allow_partial_search_results=false's "Partial shards failure".
-- The status is SearchPhaseExecutionException.status's: the first 502, 503 or 504 (a failure
-- worth retrying), else the last other 5xx, else the first failure's.
local function phase_status(list)
  local status
  for _, e in ipairs(list) do
    if e.status >= 502 and e.status <= 504 then return e.status end
    if e.status >= 500 then status = e.status end
  end
  return status or list[1].status
end
_M.phase_status = phase_status

function _M.search_phase_all(list, reason)
  if #list == 1 and reason == "all shards failed" then return list[1] end
  local roots, shards = {}, json.array()
  local status = phase_status(list)
  for _, e in ipairs(list) do
    for _, r in ipairs(e.root_cause) do roots[#roots + 1] = r end
    shards[#shards + 1] = e.shard_failure
  end
  return _M.new(status, "search_phase_execution_exception", reason, nil, {
    root_cause = roots,
    caused_by = reason == "all shards failed" and list[1].caused_by or nil,
    extra_top = { "phase", "query", "grouped", true, "failed_shards", shards },
  })
end

-- A body that is not JSON: ES's XContentParseException prefixes the parser's message with
-- its location, "[line:col] ...", caused by the json_parse_exception. text: the body.
function _M.json_parse(msg, text)
  local line, col = json.error_position(text or "", msg)
  return _M.new(400, "x_content_parse_exception", "[" .. line .. ":" .. col .. "] " .. tostring(msg),
    nil, { caused_by = { type = "json_parse_exception", reason = tostring(msg) } })
end

return _M
