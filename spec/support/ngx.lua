-- spec/support/ngx.lua -- stand-ins for nginx's `ngx` API, for specs that run esx.nginx under
-- plain busted (no nginx).  esx.nginx keeps the ngx it finds when it is loaded, so a spec loads
-- a fresh copy against its stand-in, and the real global (none under plain busted) and the
-- esx.nginx other specs use are left as they were.
--
--   local fake = require "spec.support.ngx"
--   local nx = fake.load_nginx{ get_phase = function() return "content" end, ... }
--   fake.with(stub, nx.collect, col)       -- a call made with stub as the global ngx
--   local sock = fake.socket{ receive = function() return nil, "timeout" end }
--   local nx = fake.load_nginx(fake.content(now, sleep, sock))   -- a handler that waits
--   local mod = fake.load("esx.cache", stub)  -- any module that keeps the ngx it finds
--   finally(fake.install(stub, { wait = ... }))  -- ngx and esx.nginx for the rest of an it()

local _M = {}

--- The module name loaded afresh with stub as the global ngx -> that module.  When it returns
-- (or raises), the global ngx and package.loaded[name] are what they were before.
function _M.load(name, stub)
  local saved_ngx, saved_mod = rawget(_G, "ngx"), package.loaded[name]
  rawset(_G, "ngx", stub)
  package.loaded[name] = nil
  local ok, mod = pcall(require, name)
  rawset(_G, "ngx", saved_ngx)
  package.loaded[name] = saved_mod
  if not ok then error(mod, 0) end
  return mod
end

--- esx.nginx loaded afresh with stub as the global ngx -> that module (see load).
function _M.load_nginx(stub)
  return _M.load("esx.nginx", stub)
end

--- Makes stub the global ngx and, when nginx is given, what require "esx.nginx" returns (both
-- read at the time of a call, as esx.client and esx.bulk do) -> a function that puts both back
-- as they were, for finally() or after_each().
function _M.install(stub, nginx)
  local saved_ngx, saved_nginx = rawget(_G, "ngx"), package.loaded["esx.nginx"]
  rawset(_G, "ngx", stub)
  if nginx ~= nil then package.loaded["esx.nginx"] = nginx end
  return function()
    rawset(_G, "ngx", saved_ngx)
    package.loaded["esx.nginx"] = saved_nginx
  end
end

local function put_back(saved, ok, ...)
  rawset(_G, "ngx", saved)
  if not ok then error((...), 0) end
  return ...
end

--- Calls fn(...) with stub as the global ngx (what esx reads at the time of a call, as the
-- client's phase check does) -> fn's results; the global is put back, also when fn raises.
function _M.with(stub, fn, ...)
  local saved = rawget(_G, "ngx")
  rawset(_G, "ngx", stub)
  return put_back(saved, pcall(fn, ...))
end

--- A stand-in for ngx.socket.tcp()'s cosocket: connects, sends and is woken ("1") at once;
-- the functions in overrides replace those.
function _M.socket(overrides)
  local sock = {
    connect = function() return true end,
    send = function() return true end,
    settimeout = function() end,
    receive = function() return "1" end,
    close = function() end,
  }
  for k, v in pairs(overrides or {}) do sock[k] = v end
  return sock
end

--- A stand-in for ngx in a content handler that waits on the waiter socket: ngx.now() is
-- now(), ngx.sleep(s) is sleep(s), and every ngx.socket.tcp() is sock.
function _M.content(now, sleep, sock)
  return {
    get_phase = function() return "content" end,
    now = now,
    update_time = function() end,
    socket = { tcp = function() return sock end },
    sleep = sleep,
  }
end

--- A stand-in for the pending request esx.nginx waits on: ready() is done(); waiter_path names
-- a socket that is not there (the stand-in cosocket does not look).
function _M.pending(done, result)
  return { ready = done, id = function() return 7 end,
           waiter_path = function() return "/nonexistent" end,
           result = result }
end

return _M
