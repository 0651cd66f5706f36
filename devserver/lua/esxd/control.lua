-- esxd.control: the /_esx/ control API (never authenticated, never counted):
-- faults (POST/GET/DELETE /_esx/faults), request log (GET/DELETE /_esx/requests),
-- data reset (DELETE /_esx/data), refresh everything (POST /_esx/refresh), health probe.
local json = require "esxd.json"
local faults = require "esxd.faults"
local inspect = require "esxd.inspect"
local store = require "esxd.store"

local _M = {}

local function reply(status, obj)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["X-Elastic-Product"] = "Elasticsearch"
  local body = json.encode(obj)
  ngx.header["Content-Length"] = #body
  ngx.print(body)
end

local function bad(msg) return reply(400, { ok = false, error = msg }) end

function _M.handle(method, path, args)
  if path == "/_esx/health" and (method == "GET" or method == "HEAD") then
    return reply(200, { ok = true })
  elseif path == "/_esx/faults" then
    if method == "POST" then
      ngx.req.read_body()
      local raw = ngx.req.get_body_data()
      if not raw then
        local f = ngx.req.get_body_file()
        if f then local fh = io.open(f, "rb"); raw = fh:read("*a"); fh:close() end
      end
      local spec, err = json.decode(raw or "")
      if spec == nil then return bad("fault spec is not valid JSON: " .. tostring(err)) end
      local id, msg = faults.add(spec)
      if not id then return bad(msg) end
      return reply(200, json.obj("ok", true, "id", id))
    elseif method == "DELETE" then
      faults.clear()
      return reply(200, { ok = true })
    elseif method == "GET" then
      return reply(200, json.obj("faults", faults.list()))
    end
  elseif path == "/_esx/requests" then
    if method == "GET" then
      return reply(200, inspect.report(args.path))
    elseif method == "DELETE" then
      inspect.reset()
      return reply(200, { ok = true })
    end
  elseif path == "/_esx/data" and method == "DELETE" then
    store.drop_all()
    return reply(200, { ok = true })
  elseif path == "/_esx/refresh" and method == "POST" then
    store.refresh_all()
    return reply(200, { ok = true })
  end
  return reply(404, { ok = false, error = "unknown control endpoint " .. method .. " " .. path })
end

return _M
