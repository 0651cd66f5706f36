-- esxd.api_search: HTTP handlers for _search, _count, _msearch and _bulk.
local json = require "esxd.json"
local errors = require "esxd.errors"
local search = require "esxd.search"
local bulk = require "esxd.bulk"
local params = require "esxd.params"

local _M = {}
local null = json.null

function _M.search(ctx)
  return search.search(ctx.vars.index, ctx.args, ctx:json(true), ctx.started, ngx.unescape_uri(ctx.path), ctx.body)
end

-- RestCountAction parses either the body or the q parameters (q, df, ...), so with a body
-- those parameters are left unconsumed: ES's "unrecognized parameters" 400.
local COUNT_Q = { "q", "df", "analyzer", "analyze_wildcard", "lenient", "default_operator" }

function _M.count(ctx)
  local body = ctx:json(true)
  local path = ngx.unescape_uri(ctx.path)
  if body ~= nil then
    local unused = {}
    for _, k in ipairs(COUNT_Q) do if ctx.args[k] ~= nil then unused[#unused + 1] = k end end
    if #unused > 0 then error(params.unrecognized_error("count", path, unused), 0) end
  end
  return search.count(ctx.vars.index, ctx.args, body, path)
end

function _M.bulk(ctx)
  local ops, err = bulk.parse(ctx.body, ctx.vars.index, ctx.args)
  if not ops then error(err, 0) end
  local fault
  if ctx.fault and ctx.fault.item_status then
    fault = { status = ctx.fault.item_status, count = ctx.fault.item_count }
  end
  return 200, bulk.execute(ops, ctx.args, fault, ctx.started)
end

-- The keys ES's MultiSearchRequest accepts in a header line (the others are a 400).
local MSEARCH_HEADER = { index = true, indices = true, search_type = true, ccs_minimize_roundtrips = true,
  request_cache = true, preference = true, routing = true, allow_partial_search_results = true,
  expand_wildcards = true, ignore_unavailable = true, allow_no_indices = true, ignore_throttled = true }

-- Errors that ES reports per search in an msearch response (found while executing it); the
-- others come from parsing the request and fail the whole msearch.
local ITEM_ERRORS = { index_not_found_exception = true, search_phase_execution_exception = true,
  invalid_index_name_exception = true }

function _M.msearch(ctx)
  -- MultiSearchRequest.maxConcurrentSearchRequests, set before the body is read
  local mcs = ctx.args.max_concurrent_searches
  if mcs ~= nil and tonumber(mcs) < 1 then
    error(errors.illegal_argument("maxConcurrentSearchRequests must be positive"), 0)
  end
  local body = ctx.body
  if body == nil or body == "" then
    error(errors.new(400, "parse_exception", "request body or source parameter is required"), 0)
  end
  if body:sub(-1) ~= "\n" then
    error(errors.illegal_argument("The msearch request must be terminated by a newline [\\n]"), 0)
  end
  local lines = {}
  for l in body:gmatch("([^\n]*)\n") do lines[#lines + 1] = l end
  -- RestMultiSearchAction parses every header and search body first (a malformed one fails
  -- the whole request), then MultiSearchRequest.validate gathers every search's
  -- SearchRequest.validate messages into one 400 (none runs), and only then are the searches
  -- run, each answering in its own item (missing indices, shard failures)
  local items = {}
  local i = 1
  while i <= #lines do
    local header, herr = json.decode(lines[i], true)
    if lines[i]:match("^%s*$") then header = {} end
    if header == nil or type(header) ~= "table" then
      error(errors.x_content_parse("[" .. i .. ":1] Malformed msearch header: " .. tostring(herr or "expected an object")), 0)
    end
    local qline = lines[i + 1]
    if qline == nil then break end
    local q, qerr = json.decode(qline, true)
    if q == nil then
      error(errors.x_content_parse("[" .. (i + 1) .. ":1] Malformed msearch body: " .. tostring(qerr)), 0)
    end
    for k in pairs(header) do
      if not MSEARCH_HEADER[k] then
        error(errors.illegal_argument("key [" .. tostring(k) .. "] is not supported in the metadata section"), 0)
      end
    end
    -- SearchRequest.searchType(String): SearchType.fromString
    local st = header.search_type
    if st ~= nil and st ~= null and st ~= "query_then_fetch" and st ~= "dfs_query_then_fetch" then
      error(errors.illegal_argument("No search type for [" .. tostring(st) .. "]"), 0)
    end
    local idx = header.index or header.indices
    if type(idx) == "table" then idx = table.concat(idx, ",") end
    if idx == nil then idx = ctx.vars.index end
    local args = {}
    for k, v in pairs(ctx.args) do args[k] = v end
    if header.ignore_unavailable ~= nil then args.ignore_unavailable = tostring(header.ignore_unavailable) end
    if header.allow_no_indices ~= nil then args.allow_no_indices = tostring(header.allow_no_indices) end
    if header.expand_wildcards ~= nil then
      local ew = header.expand_wildcards
      args.expand_wildcards = type(ew) == "table" and table.concat(ew, ",") or tostring(ew)
    end
    -- parses the search body: its errors fail the whole request
    local invalid = search.search(idx, args, q, nil, nil, qline, true)
    items[#items + 1] = { idx = idx, args = args, q = q, qline = qline, invalid = invalid }
    i = i + 2
  end
  local invalid = {}
  if #items == 0 then invalid[1] = "no requests added" end
  for _, it in ipairs(items) do
    for _, m in ipairs(it.invalid) do invalid[#invalid + 1] = m end
  end
  if #invalid > 0 then error(errors.validation(invalid), 0) end
  local responses = json.array()
  for _, it in ipairs(items) do
    local ok, st, res = pcall(search.search, it.idx, it.args, it.q, ngx.now(), nil, it.qline)
    if ok then
      json.set(res, "status", st)
      responses[#responses + 1] = res
    elseif errors.is(st) and ITEM_ERRORS[st.type] then
      responses[#responses + 1] = errors.body(st)
    else
      error(st, 0)
    end
  end
  ngx.update_time()
  local took = math.floor((ngx.now() - ctx.started) * 1000)
  return 200, json.obj("took", took, "responses", responses)
end

return _M
