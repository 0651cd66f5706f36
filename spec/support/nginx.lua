-- spec/support/nginx.lua -- starts a throwaway nginx (with the lua module and this checkout's
-- esx on its paths) on a free loopback port, for specs of code that runs inside nginx.
--
--   local nginx = require "spec.support.nginx"
--   local srv = nginx.start{ server = "location /t { content_by_lua_block { ... } }",
--                            http = "lua_shared_dict d 1m;", workers = 2,
--                            user = "nobody nogroup", -- (root only: workers of that user)
--                            daemon = false,          -- (the master is not forked off)
--                            worker_connections = 64 } -- (1024 by default)
--   local status, body = srv:get("/t")
--   local pids = srv:workers()
--   local conn = srv:start_get("/slow") ... local status, body = nginx.answer(conn)
--   srv:stop()

local socket = require "socket"
local free_port = require("spec.support.net").free_port

local _M = {}
local Server = {}
Server.__index = Server

local root = assert(io.popen("pwd")):read("*l")

local sh = require("spec.support.shell").ok

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function read(path)
  local f = io.open(path)
  if not f then return nil end
  local text = f:read("*a")
  f:close()
  return text
end

local CONF = [[
%s
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes %d;
daemon %s;
pid %s/nginx.pid;
error_log %s/error.log info;
%s
events { worker_connections %d; }
http {
  access_log off;
  client_body_temp_path %s/tmp/body;
  proxy_temp_path %s/tmp/proxy;
  fastcgi_temp_path %s/tmp/fastcgi;
  uwsgi_temp_path %s/tmp/uwsgi;
  scgi_temp_path %s/tmp/scgi;
  lua_package_path "%s/lua/?.lua;%s/lua/?/init.lua;%s/?.lua;/usr/share/lua/5.1/?.lua;/usr/share/lua/5.1/?/init.lua;;";
  lua_package_cpath "%s/build/luajit/?.so;/usr/lib/x86_64-linux-gnu/lua/5.1/?.so;;";
  %s
  server {
    listen 127.0.0.1:%d;
    %s
  }
}
]]

--- Starts nginx; raises if it does not come up (with its error log in the message).
function _M.start(opts)
  opts = opts or {}
  local port = opts.port or free_port()
  local dir = os.tmpname()
  os.remove(dir)
  assert(sh("mkdir -p " .. dir .. "/tmp"))
  local user = (read("/proc/self/status") or ""):match("\nUid:%s+0%s") and "user root;" or ""
  if opts.user then user = "user " .. opts.user .. ";" end -- workers of another user (as root)
  local daemon = opts.daemon ~= false
  local conf = CONF:format(user, opts.workers or 1, daemon and "on" or "off", dir, dir, opts.main or "",
    opts.worker_connections or 1024,
    dir, dir, dir, dir, dir, root, root, root, root, opts.http or "", port, opts.server or "")
  write(dir .. "/nginx.conf", conf)
  local cmd = "nginx -q -p " .. dir .. " -c " .. dir .. "/nginx.conf -e " .. dir .. "/error.log"
  -- daemon = false: the master stays the process started here (as in a container), in the
  -- background of this shell
  if not sh(daemon and cmd or cmd .. " >/dev/null 2>&1 &") then
    error("nginx did not start:\n" .. (read(dir .. "/error.log") or ""))
  end
  local srv = setmetatable({ port = port, dir = dir, url = "http://127.0.0.1:" .. port }, Server)
  for _ = 1, 200 do
    local c = socket.connect("127.0.0.1", port)
    if c and srv:pid() then c:close() return srv end
    if c then c:close() end
    socket.sleep(0.02)
  end
  srv:stop()
  error("nginx did not listen on port " .. port)
end

--- true while the process pid runs: not once it exited, even when not reaped yet (a zombie --
-- a daemon master's parent is PID 1, which in a container may reap a second or more later)
function _M.running(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if f then
    local stat = f:read("*a") or ""
    f:close()
    local state = stat:match(".*%) (%u)")
    return state ~= nil and state ~= "Z" and state ~= "X"
  end
  return sh("kill -0 " .. pid .. " 2>/dev/null")
end

function Server:pid()
  return tonumber(read(self.dir .. "/nginx.pid") or "")
end

--- the pids (numbers) of the master's children, its workers (and cache processes, none here)
function Server:workers()
  local p = assert(io.popen("pgrep -P " .. assert(self:pid(), "nginx wrote no pid file")))
  local pids = {}
  for line in p:lines() do pids[#pids + 1] = tonumber(line) end
  p:close()
  return pids
end

function Server:error_log()
  return read(self.dir .. "/error.log") or ""
end

--- Stops nginx (QUIT, then TERM after 5 s) and removes its directory.
function Server:stop()
  local pid = self:pid()
  if pid then
    sh("kill -QUIT " .. pid .. " 2>/dev/null")
    for i = 1, 250 do
      if not _M.running(pid) then break end
      if i == 250 then sh("kill -TERM " .. pid .. " 2>/dev/null") end
      socket.sleep(0.02)
    end
  end
  sh("rm -rf " .. self.dir)
end

--- Plain HTTP/1.0 GET/POST for specs: returns status, body, headers (lowercase names).
function Server:request(method, path, body, headers)
  local c = assert(socket.connect("127.0.0.1", self.port))
  c:settimeout(10)
  local lines = { method .. " " .. path .. " HTTP/1.0", "Host: 127.0.0.1" }
  for k, v in pairs(headers or {}) do lines[#lines + 1] = k .. ": " .. v end
  if body then lines[#lines + 1] = "Content-Length: " .. #body end
  assert(c:send(table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or "")))
  local response = c:receive("*a")
  c:close()
  local head, rest = response:match("^(.-)\r\n\r\n(.*)$")
  local status = tonumber(head:match("^HTTP/%d%.%d (%d+)"))
  local hdrs = {}
  for k, v in head:gmatch("\r\n([^:]+):%s*([^\r]*)") do hdrs[k:lower()] = v end
  return status, rest, hdrs
end

function Server:get(path, headers)
  return self:request("GET", path, nil, headers)
end

--- Sends a GET on a new connection and leaves the answer unread (for requests that must be in
-- flight together) -> the connection, for _M.answer.
function Server:start_get(path)
  local c = assert(socket.connect("127.0.0.1", self.port))
  c:settimeout(10)
  assert(c:send("GET " .. path .. " HTTP/1.0\r\nHost: x\r\n\r\n"))
  return c
end

--- Reads the answer on a connection start_get made, and closes it -> status, body.
function _M.answer(c)
  local data = c:receive("*a")
  c:close()
  local status = tonumber(data:match("^HTTP/%d%.%d (%d+)"))
  return status, data:match("\r\n\r\n(.*)$")
end

return _M
