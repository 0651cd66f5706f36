-- esxd.server: the nginx entry points. handle() runs every request: control API, request
-- log, fault matching, body reading (gzip inflate with a cap), auth, media headers (esxd.media),
-- content-type check, routing under xpcall (genuine bugs become an ES-shaped 500), and the
-- response (its Content-Type from esxd.media).
local json = require "esxd.json"
local errors = require "esxd.errors"
local router = require "esxd.router"
local respond = require "esxd.respond"
local faults = require "esxd.faults"
local inspect = require "esxd.inspect"
local control = require "esxd.control"
local auth = require "esxd.auth"
local gzip = require "esxd.gzip"
local store = require "esxd.store"
local config = require "esxd.config"
local filter_path = require "esxd.filter_path"
local params = require "esxd.params"
local pretty = require "esxd.pretty"
local media = require "esxd.media"

local _M = {}

function _M.init_worker()
  math.randomseed(math.floor(ngx.now() * 1000) + ngx.worker.pid())
  -- ES's default refresh_interval: make writes searchable within 1 s (or each index's
  -- index.refresh_interval, to a tenth of a second; -1: never). refresh=wait_for requests
  -- wait for these refreshes.
  ngx.timer.every(0.1, function(premature)
    if not premature then store.auto_refresh() end
  end)
end

local function split_path(path)
  local segs = {}
  for s in path:gmatch("[^/]+") do segs[#segs + 1] = ngx.unescape_uri(s) end
  return segs
end

local function read_body()
  ngx.req.read_body()
  local data = ngx.req.get_body_data()
  if not data then
    local f = ngx.req.get_body_file()
    if f then
      local fh = io.open(f, "rb")
      if fh then data = fh:read("*a"); fh:close() end
    end
  end
  return data
end

local Ctx = {}
Ctx.__index = Ctx

-- Decode the JSON body; optional=true allows an absent body (returns nil).
function Ctx:json(optional)
  if self.body == nil or self.body:match("^%s*$") then
    if optional then return nil end
    error(errors.body_required(), 0)
  end
  local v, err = json.decode(self.body, true) -- key order: ES's parsers follow it
  if v == nil then error(errors.json_parse(err, self.body), 0) end
  return v
end

local function render(v)
  if v == nil then return "" end
  if type(v) == "string" then return v end
  return json.encode(v)
end

local function run(ctx)
  local authz = ctx.headers["authorization"]
  if type(authz) == "table" then authz = authz[1] end
  local aerr = auth.check(authz, ctx.path)
  if aerr then error(aerr, 0) end
  -- ES authenticates in the HTTP pipeline (HttpHeadersValidator), then checks the media
  -- headers while building the RestRequest, before routing
  if ctx.media.err then error(ctx.media.err, 0) end
  if ctx.body and ctx.body ~= "" and not ctx.media.body_format then
    -- RestController.sendContentTypeErrorMessage (several values were refused by esxd.media)
    local ct = ctx.headers["content-type"]
    ctx.error_response = true
    if ct == nil then return 406, { error = "Content-Type header is missing", status = 406 } end
    return 406, { error = "Content-Type header [" .. ct .. "] is not supported", status = 406 }
  end
  -- ES's "no handler found" / "Incorrect HTTP method" messages quote request.uri(), query included
  local h, vars, body, hdrs = router.find(ctx.method, ctx.segs, ctx.uri)
  if not h then ctx.error_response = true; return vars, body, hdrs end
  local api = router.API[h]
  params.check(api, ctx.args, ngx.unescape_uri(ctx.path))
  if params.BODYLESS[api] and ctx.body and #ctx.body > 0 then
    error(errors.illegal_argument("request [" .. ctx.method .. " " .. ngx.unescape_uri(ctx.path) ..
      "] does not support having a body"), 0)
  end
  ctx.vars = vars
  return h(ctx)
end

function _M.handle()
  local started = ngx.now()
  local method = ngx.req.get_method()
  local request_uri = ngx.var.request_uri or "/"
  local path = request_uri:match("^[^?]*")
  local query = request_uri:match("%?(.*)$") or ""
  local args = ngx.req.get_uri_args(200)
  for k, v in pairs(args) do
    if v == true then args[k] = "" elseif type(v) == "table" then args[k] = tostring(v[#v]) end
  end
  if path == "/_esx" or path:sub(1, 6) == "/_esx/" then
    return control.handle(method, path, args)
  end
  local headers = ngx.req.get_headers(200)
  local entry = inspect.record(method, path, query, headers)
  local fault = faults.match(method, path)
  if fault and fault.empty_reply then
    entry.status = 0
    return ngx.exit(444)
  end

  local wire = read_body()
  entry.body_wire_bytes = wire and #wire or 0
  local mt = media.read(headers, wire ~= nil and #wire > 0, args.format)
  local body = wire
  local status, out, hdrs
  -- ES renders errors with ?error_trace=true's stack_trace, and never filters them (filter_path)
  local is_error = false
  local trace = args.error_trace == "" or args.error_trace == "true"
  local enc = headers["content-encoding"]
  if type(enc) == "table" then enc = enc[1] end
  if wire and #wire > 0 and enc and enc:lower():find("gzip", 1, true) then
    local inflated, kind, msg = gzip.inflate(wire, config.max_body)
    if not inflated then
      if kind == "too_large" then
        entry.status = 413
        respond.too_large()
        return
      end
      local e = errors.new(400, "illegal_argument_exception", "Failed to decompress request body: " .. tostring(msg),
        nil, { caused_by = { type = "zip_exception", reason = tostring(msg) } })
      status, out = 400, errors.body(e, trace)
      is_error = true
    end
    body = inflated
  end
  entry.body_bytes = body and #body or 0

  if not status then
    if fault and fault.status then
      status = fault.status
      if fault.body ~= nil then
        out = fault.body
        if type(out) == "table" then out = json.encode(out) end
      else
        local t, r = faults.default_error(status)
        out = errors.body(errors.new(status, t, r))
      end
    else
      local ctx = setmetatable({ method = method, path = path, uri = request_uri, segs = split_path(path), args = args,
        headers = headers, body = body, started = started, fault = fault, media = mt }, Ctx)
      local ok, s, o, h = xpcall(run, function(e)
        if errors.is(e) then return e end
        return { bug = tostring(e), trace = debug.traceback(tostring(e), 2) }
      end, ctx)
      if ok then
        status, out, hdrs = s, o, h
        is_error = ctx.error_response == true
      elseif errors.is(s) then
        status, out, hdrs = s.status, errors.body(s, trace), s.headers
        is_error = true
      else
        is_error = true
        ngx.log(ngx.ERR, "esxd internal error: ", s.trace)
        status = 500
        out = errors.body(errors.new(500, "exception", "esxd internal error: " .. s.bug), trace)
      end
    end
  end
  local out_headers = { ["Content-Type"] = mt.content_type }
  for k, v in pairs(hdrs or {}) do out_headers[k] = v end
  for k, v in pairs(fault and fault.headers or {}) do out_headers[k] = v end
  entry.status = status
  local text = render(out)
  if args.filter_path and args.filter_path ~= "" and not (fault and fault.status) and not is_error then
    local okf, filtered = pcall(filter_path.apply, args.filter_path, text)
    if okf then text = filtered end
  end
  if (args.pretty == "" or args.pretty == "true") and not (fault and fault.status) then
    text = pretty.format(text)
  end
  local ae = headers["accept-encoding"]
  if type(ae) == "table" then ae = table.concat(ae, ",") end
  local accept_gzip = ae and ae:lower():find("gzip", 1, true) ~= nil
  return respond.send(status, text, out_headers, accept_gzip, fault)
end

-- error_page 413 target: body larger than --max-body.
function _M.too_large()
  local request_uri = ngx.var.request_uri or "/"
  local path = request_uri:match("^[^?]*")
  if not (path == "/_esx" or path:sub(1, 6) == "/_esx/") then
    local entry = inspect.record(ngx.req.get_method(), path, request_uri:match("%?(.*)$") or "", ngx.req.get_headers(200))
    entry.status = 413
    entry.body_wire_bytes = tonumber(ngx.var.http_content_length) or 0
  end
  respond.too_large()
end

return _M
