-- spec/support/net.lua -- loopback endpoints that fail in known ways, for client specs.
--
--   local net = require "spec.support.net"
--   local url = net.closed_port()              -- connection refused
--   local url, close = net.full_backlog()      -- connects time out (SYNs go unanswered)
local socket = require "socket"

local _M = {}

--- A loopback URL nothing listens on.
function _M.closed_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return "http://127.0.0.1:" .. port
end

--- A loopback URL whose listener never accepts and whose accept queue is full, and the
-- function that closes it all.
function _M.full_backlog()
  local l = assert(socket.tcp())
  assert(l:bind("127.0.0.1", 0))
  assert(l:listen(0))
  local _, port = l:getsockname()
  local fill = {}
  for i = 1, 4 do
    local s = socket.tcp()
    s:settimeout(0.2)
    s:connect("127.0.0.1", port)
    fill[i] = s
  end
  return "http://127.0.0.1:" .. port, function()
    for _, s in ipairs(fill) do s:close() end
    l:close()
  end
end

return _M
