-- spec/support/net.lua -- loopback endpoints that fail in known ways, for client specs.
--
--   local net = require "spec.support.net"
--   local port = net.free_port()               -- a loopback port free now (for a server)
--   local url = net.closed_port()              -- connection refused
--   local url, close = net.full_backlog()      -- connects time out (SYNs go unanswered)
--   local l = net.listener()                   -- a server the spec answers by hand
local socket = require "socket"

local _M = {}

--- A loopback port nothing listens on now (the kernel's pick), as a number: for a server a
-- spec is about to start, or for a port that refuses connections.
function _M.free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

--- A loopback URL nothing listens on.
function _M.closed_port()
  return "http://127.0.0.1:" .. _M.free_port()
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

--- A loopback listener (127.0.0.1, or "::1" only) a spec answers by hand, byte by byte if it likes:
--   local l = net.listener(); ...; local conn = l:accept(); local req = l.read_request(conn)
-- l.url is its http:// URL; l:accept(timeout_s) returns the next connection (nil on timeout);
-- l:close() closes it.
function _M.listener(address)
  local l
  if address == "::1" then -- IPv6 loopback only
    l = assert(socket.tcp6())
    assert(l:setoption("ipv6-v6only", true))
    assert(l:bind("::1", 0))
    assert(l:listen(32))
  else
    l = assert(socket.bind("127.0.0.1", 0))
  end
  local _, port = l:getsockname()
  local self = { url = "http://127.0.0.1:" .. port, port = port }
  function self:accept(timeout)
    l:settimeout(timeout or 5)
    local conn = l:accept()
    if conn then
      conn:settimeout(5)
      conn:setoption("tcp-nodelay", true)
    end
    return conn
  end
  function self:close() l:close() end
  return self
end

--- Reads one request from conn: {method=, target=, version=, headers = {lower-name = value},
-- order = {names as sent}, head = raw head, body = string}, or nil, err.
function _M.read_request(conn)
  local line, err = conn:receive("*l")
  if not line then return nil, err end
  local req = { headers = {}, order = {}, head = line .. "\r\n" }
  req.method, req.target, req.version = line:match("^(%S+) (%S+) (HTTP/%d%.%d)$")
  while true do
    local h, herr = conn:receive("*l")
    if not h then return nil, herr end
    req.head = req.head .. h .. "\r\n"
    if h == "" then break end
    local name, value = h:match("^([^:]+):%s*(.-)%s*$")
    if name then
      req.headers[name:lower()] = value
      req.order[#req.order + 1] = name
    end
  end
  local n = tonumber(req.headers["content-length"] or "0")
  req.body = n > 0 and assert(conn:receive(n)) or ""
  return req
end

--- Sends s on conn one byte at a time (each its own write), to split it at every position.
function _M.send_bytes(conn, s)
  for i = 1, #s do assert(conn:send(s:sub(i, i))) end
end

return _M
