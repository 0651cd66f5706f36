-- esxd.respond: writes a response: ES headers, optional gzip (Accept-Encoding), and the
-- delivery faults (stall, drip, truncated close, TCP reset, corrupt or multi-member gzip,
-- endless stream).
local gzip = require "esxd.gzip"
local conn = require "esxd.conn"

local _M = {}

local function set_common(status, headers)
  ngx.status = status
  ngx.header["X-Elastic-Product"] = "Elasticsearch"
  ngx.header["Content-Type"] = "application/json"
  for k, v in pairs(headers or {}) do ngx.header[k] = v end
end

-- Send status + body. accept_gzip: client sent Accept-Encoding: gzip. fault: rule or nil.
function _M.send(status, body, headers, accept_gzip, fault)
  body = body or ""
  fault = fault or {}
  set_common(status, headers)
  local head = ngx.req.get_method() == "HEAD"
  if fault.corrupt_gzip then
    body = gzip.corrupt(body)
    ngx.header["Content-Encoding"] = "gzip"
  elseif accept_gzip and #body > 0 and not head then
    -- gzip_members = n: the body in n slices, each its own gzip member, one after another
    local n, parts = math.min(fault.gzip_members or 1, #body), {}
    local step = math.ceil(#body / n)
    for i = 1, #body, step do parts[#parts + 1] = assert(gzip.compress(body:sub(i, i + step - 1))) end
    body = table.concat(parts)
    ngx.header["Content-Encoding"] = "gzip"
  end
  if fault.stall_ms and fault.stall_ms > 0 then
    ngx.update_time() -- a stale cached clock would end the stall early (timers count from it)
    ngx.sleep(fault.stall_ms / 1000)
  end

  if fault.endless then
    ngx.header["Content-Length"] = nil
    ngx.send_headers()
    local chunk = string.rep('{"_index":"endless","_id":"x","_source":{}},', 64)
    local ok = ngx.print('{"took":1,"hits":[')
    while ok do
      ok = ngx.print(chunk)
      if ok then ok = ngx.flush(true) end
      if ok then ngx.sleep(0.001) end
    end
    return ngx.exit(444)
  end

  local cut = fault.close_after_bytes or fault.reset_after_bytes
  if cut then
    ngx.header["Content-Length"] = #body
    ngx.send_headers()
    if cut > 0 then ngx.print(body:sub(1, cut)) end
    ngx.flush(true)
    if fault.reset_after_bytes then conn.set_reset_on_close() end
    return ngx.exit(444)
  end

  ngx.header["Content-Length"] = #body
  if fault.drip and not head then
    ngx.send_headers()
    local step = math.max(1, math.floor(fault.drip.bytes))
    local interval = (fault.drip.interval_ms or 0) / 1000
    for i = 1, #body, step do
      if not ngx.print(body:sub(i, i + step - 1)) then return ngx.exit(444) end
      if not ngx.flush(true) then return ngx.exit(444) end
      if i + step <= #body and interval > 0 then ngx.sleep(interval) end
    end
    return
  end
  if not head then ngx.print(body) end
end

-- 413 for an over-sized request body (ES answers with an empty body).
function _M.too_large()
  set_common(413, nil)
  ngx.header["Content-Length"] = 0
  ngx.header["Connection"] = "close"
end

return _M
