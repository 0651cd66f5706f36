--- esx.nginx: the adapter between esx and nginx's lua module.
--
-- wait(pending) waits for a client request without blocking the worker: it connects a
-- cosocket to the engine's waiter socket (a unix socket the I/O thread owns), sends the
-- request id, and yields until the I/O thread writes one byte when the request is done.
-- No polling: a worker with many requests in flight costs nothing while it waits.

local ngx = ngx
local tostring, error, type, setmetatable = tostring, error, type, setmetatable
local core = require "esx.core"

local _M = {}

local SLICE_MS = 250 -- how often a wait re-checks the engine's health while nothing happens

local function now_ms()
  ngx.update_time()
  return ngx.now() * 1000
end

--- esx.nginx.wait(pending, timeout_ms?) -> res | nil, err   (yields; never blocks the worker)
-- Returns what pending:result() returns once the request is done.  With timeout_ms, gives
-- up after that long with nil, {kind = "request_timeout"} (the request itself goes on).
function _M.wait(pending, timeout)
  if type(pending) ~= "table" or not pending.ready then
    error("bad argument #1 to 'wait' (esx pending request expected)", 2)
  end
  if pending:ready() then return pending:result() end
  local deadline = timeout and (now_ms() + timeout)
  local path, perr = pending:waiter_path()
  if not path then return nil, perr end
  local sock = ngx.socket.tcp()
  local ok, err = sock:connect("unix:" .. path)
  if not ok then
    return nil, core.error("internal", "cannot reach the esx waiter socket: " .. tostring(err))
  end
  ok, err = sock:send(tostring(pending:id()) .. "\n")
  if not ok then
    sock:close()
    return nil, core.error("internal", "cannot register with the esx waiter: " .. tostring(err))
  end
  while true do
    local slice = SLICE_MS
    if deadline then
      local left = deadline - now_ms()
      if left <= 0 then
        sock:close()
        if pending:ready() then return pending:result() end
        return nil, core.error("request_timeout", "no answer within " .. timeout .. " ms")
      end
      if left < slice then slice = left end
    end
    sock:settimeout(slice)
    local data, rerr = sock:receive(1)
    if data or rerr ~= "timeout" then break end
    -- nothing yet: ready() also rebuilds an engine whose thread died
    if pending:ready() then break end
  end
  sock:close()
  if not pending:ready() then
    -- the waiter connection ended early (engine rebuilt): wait again on the new one
    return _M.wait(pending, deadline and (deadline - now_ms()) or nil)
  end
  return pending:result()
end

return _M
