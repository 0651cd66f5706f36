-- spec.support.devserver: start/stop an esxd dev server from busted specs and talk to it
-- with a small raw HTTP/1.1 client (luasocket, luasec for --tls). Works in Lua 5.1-5.4.
--
--   local ds = require "spec.support.devserver"
--   local srv = ds.start{ user = "u", password = "p", tls = false, max_body = 1048576 }
--   local status, headers, body = srv:request("GET", "/", nil, { ["Accept"] = "application/json" })
--   srv:fault{ path = "/_bulk", status = 429 } ; srv:clear_faults() ; srv:requests("/_bulk")
--   srv:reset() ; srv:stop()
-- srv.url, srv.port, srv.dir (runtime directory: error.log, nginx.conf, cert.pem), srv.ca_file
local socket = require "socket"
local cjson = require "cjson"

local _M = {}

local function here()
  local src = debug.getinfo(1, "S").source:gsub("^@", "")
  local dir = src:match("^(.*)/[^/]*$") or "."
  return dir
end

-- repository root (two levels above spec/support)
local ROOT = here() .. "/../.."
_M.esxd = ROOT .. "/devserver/esxd"

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- cmd in a shell -> ok (it exited 0), its output (stdout and stderr)
local run = require("spec.support.shell").run

local function port_free(port)
  local s = socket.tcp()
  s:setoption("reuseaddr", true)
  local ok = s:bind("127.0.0.1", port)
  s:close()
  return ok ~= nil
end

local seeded = false
local function pick_port()
  if not seeded then
    math.randomseed(os.time() + math.floor((socket.gettime() % 1) * 1e6))
    seeded = true
  end
  for _ = 1, 200 do
    local p = math.random(20000, 59999)
    if port_free(p) then return p end
  end
  error("devserver: no free loopback port found")
end

-- gzip / gunzip through the gzip command line tool (no zlib binding needed).
local function filter(cmd, data)
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "wb")); f:write(data); f:close()
  local h = io.popen(cmd .. " < " .. sh_quote(tmp) .. " 2>/dev/null")
  local out = h:read("*a"); h:close()
  os.remove(tmp)
  return out
end
function _M.gzip(data) return filter("gzip -c", data) end
function _M.gunzip(data) return filter("gzip -dc", data) end

local Server = {}
Server.__index = Server

local function connect(self, timeout)
  local sock = socket.tcp()
  sock:settimeout(timeout or 10)
  local ok, err = sock:connect("127.0.0.1", self.port)
  if not ok then sock:close(); return nil, err end
  if self.tls then
    local ssl = require "ssl"
    local s, serr = ssl.wrap(sock, { mode = "client", protocol = "any", verify = "peer",
      cafile = self.ca_file, options = { "all" } })
    if not s then sock:close(); return nil, serr end
    s:settimeout(timeout or 10)
    if s.sni then s:sni("localhost") end
    local hok, herr = s:dohandshake()
    if not hok then s:close(); return nil, herr end
    sock = s
  end
  return sock
end

local function read_line(sock)
  local line, err = sock:receive("*l")
  return line, err
end

-- Low-level request. body: string or Lua table (JSON-encoded). headers: name -> value.
-- opts: {gzip = true (compress the body), timeout = seconds, raw = true (don't gunzip)}.
-- Returns status, headers (lowercase names), body, err ("closed", "timeout" when cut short).
function Server:request(method, path, body, headers, opts)
  opts = opts or {}
  headers = headers or {}
  local h = {}
  for k, v in pairs(headers) do h[k:lower()] = { k, v } end
  if type(body) == "table" then
    body = cjson.encode(body)
    if not h["content-type"] then h["content-type"] = { "Content-Type", "application/json" } end
  end
  if opts.gzip and body then
    body = _M.gzip(body)
    h["content-encoding"] = { "Content-Encoding", "gzip" }
  end
  if body and not h["content-type"] then h["content-type"] = { "Content-Type", "application/json" } end
  if not h["host"] then h["host"] = { "Host", "127.0.0.1:" .. self.port } end
  if not h["connection"] then h["connection"] = { "Connection", "close" } end
  if body then h["content-length"] = { "Content-Length", tostring(#body) } end
  local lines = { method .. " " .. path .. " HTTP/1.1" }
  for _, kv in pairs(h) do lines[#lines + 1] = kv[1] .. ": " .. kv[2] end
  local req = table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or "")
  local sock, cerr = connect(self, opts.timeout)
  if not sock then return nil, nil, nil, cerr end
  local sent, serr = sock:send(req)
  if not sent then sock:close(); return nil, nil, nil, serr end
  local status_line, err = read_line(sock)
  if not status_line then sock:close(); return nil, nil, nil, err end
  local status = tonumber(status_line:match("^HTTP/%d%.%d (%d+)"))
  local rh = {}
  while true do
    local l, lerr = read_line(sock)
    if not l then sock:close(); return status, rh, nil, lerr end
    if l == "" then break end
    local k, v = l:match("^([^:]+):%s*(.-)%s*$")
    if k then
      k = k:lower()
      rh[k] = rh[k] and (rh[k] .. ", " .. v) or v
    end
  end
  local out, rerr = "", nil
  if method == "HEAD" or status == 204 or status == 304 then
    out = ""
  elseif rh["transfer-encoding"] and rh["transfer-encoding"]:lower():find("chunked") then
    local parts = {}
    while true do
      local sz, e = read_line(sock)
      if not sz then rerr = e; break end
      local n = tonumber(sz:match("^%x+"), 16)
      if not n then rerr = "bad chunk"; break end
      if n == 0 then read_line(sock); break end
      local data, e2, partial = sock:receive(n)
      if not data then parts[#parts + 1] = partial; rerr = e2; break end
      parts[#parts + 1] = data
      read_line(sock)
      if opts.max_bytes and #table.concat(parts) >= opts.max_bytes then rerr = "max_bytes"; break end
    end
    out = table.concat(parts)
  elseif rh["content-length"] then
    local n = tonumber(rh["content-length"])
    if n > 0 then
      local data, e, partial = sock:receive(n)
      if data then out = data else out = partial or ""; rerr = e end
    end
  else
    local data, e, partial = sock:receive("*a")
    out = data or partial or ""
    if not data then rerr = e end
  end
  sock:close()
  if not opts.raw and not rerr and rh["content-encoding"] == "gzip" and #out > 0 then
    local plain = _M.gunzip(out)
    if plain == "" then rerr = "corrupt gzip" else out = plain end
  end
  return status, rh, out, rerr
end

-- JSON convenience: returns status, decoded body (or raw string), headers.
function Server:json(method, path, body, headers, opts)
  local st, h, b, err = self:request(method, path, body, headers, opts)
  local ok, v = pcall(cjson.decode, b or "")
  return st, ok and v or b, h, err
end

local function control(self, method, path, body)
  local st, _, b = self:request(method, path, body and cjson.encode(body) or nil,
    body and { ["Content-Type"] = "application/json" } or nil)
  local ok, v = pcall(cjson.decode, b or "")
  if st ~= 200 then error("devserver control " .. method .. " " .. path .. " failed: " .. tostring(st) .. " " .. tostring(b), 3) end
  return ok and v or b
end

-- Append a fault rule (see devserver/README.md); returns its id.
function Server:fault(spec) return control(self, "POST", "/_esx/faults", spec).id end
function Server:clear_faults() return control(self, "DELETE", "/_esx/faults") end
-- Request log: {counts = {path = n}, requests = {...}}; path filters both.
function Server:requests(path)
  local q = path and ("?path=" .. path:gsub("[^%w%-%._~/]", function(c) return string.format("%%%02X", c:byte()) end)) or ""
  return control(self, "GET", "/_esx/requests" .. q)
end
function Server:clear_requests() return control(self, "DELETE", "/_esx/requests") end
-- Drop all indices, faults and the request log.
function Server:reset()
  control(self, "DELETE", "/_esx/data")
  control(self, "DELETE", "/_esx/faults")
  control(self, "DELETE", "/_esx/requests")
end

function Server:stop()
  if self.stopped then return end
  self.stopped = true
  -- its runtime directory (logs, config) goes with it once it stopped: a test run would
  -- otherwise leave one in $TMPDIR per server it started
  if run(sh_quote(_M.esxd) .. " stop --port " .. self.port) then run("rm -rf " .. sh_quote(self.dir)) end
end

-- Start a server on a free port. opts: user, password, tls, max_body, workers,
-- keepalive_timeout (ms an idle keep-alive connection stays open; default 75000).
function _M.start(opts)
  opts = opts or {}
  local last
  for _ = 1, 5 do
    local port = opts.port or pick_port()
    local cmd = sh_quote(_M.esxd) .. " start --port " .. port
    if opts.user then cmd = cmd .. " --user " .. sh_quote(opts.user) .. " --password " .. sh_quote(opts.password or "") end
    if opts.max_body then cmd = cmd .. " --max-body " .. math.floor(opts.max_body) end
    if opts.tls then cmd = cmd .. " --tls" end
    if opts.workers then cmd = cmd .. " --workers " .. opts.workers end
    if opts.keepalive_timeout then cmd = cmd .. " --keepalive-timeout " .. math.floor(opts.keepalive_timeout) end
    local ok, out = run(cmd)
    local url = out:match("(https?://[%d%.:]+)")
    if ok and url then
      local srv = setmetatable({ port = port, url = url, tls = opts.tls and true or false,
        ca_file = out:match("ca_file (%S+)"), user = opts.user, password = opts.password,
        dir = (function()
          local tmp = os.getenv("TMPDIR")
          if tmp == nil or tmp == "" then tmp = "/tmp" end
          return (tmp:gsub("/+$", "")) .. "/esxd-" .. port
        end)() }, Server)
      return srv
    end
    last = out
    if not out:find("is in use", 1, true) then break end
  end
  error("devserver: esxd failed to start: " .. tostring(last), 2)
end

_M.Server = Server
return _M
