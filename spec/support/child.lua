-- spec/support/child.lua -- Lua scripts for a child process that loads this checkout's esx
-- (lua/ and build/<flavour>/, with the interpreter of this run): for specs of what would
-- crash, hang or exit busted, or must run as another user.
--
--   local child = require "spec.support.child"
--   local cmd, path = child.script("print(require('esx').version)")
--   local out = io.popen("timeout 10 " .. cmd .. " 2>&1"):read("*a")
--   local err, seconds, ok = child.run(cmd)   -- its stderr, how long it ran, exited 0
--   local err, seconds, ok = child.run_script("...")   -- the two above, the script removed

local socket = require "socket"

local _M = {}

--- the interpreter of this run: "luajit" or "lua5.4"
_M.lua = jit and "luajit" or "lua5.4"

--- Writes code to path (a new temporary file when nil), after the lines that put this
-- checkout's modules first on its paths -> the command that runs it, path.
function _M.script(code, path)
  path = path or os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write('package.path = "./lua/?.lua;./lua/?/init.lua;" .. package.path\n',
          'package.cpath = "./build/', _M.lua, '/?.so;" .. package.cpath\n', code)
  f:close()
  return _M.lua .. " " .. path, path
end

--- Runs cmd in a shell and waits for it, its stdout not captured -> what it wrote on stderr,
-- the seconds it took, true when it exited 0.  (os.execute's own result cannot be asserted:
-- LuaJIT returns the wait status, a number.)
function _M.run(cmd)
  local errfile = os.tmpname()
  local t0 = socket.gettime()
  local status = os.execute("(" .. cmd .. ") 2>" .. errfile)
  local seconds = socket.gettime() - t0
  local f = assert(io.open(errfile))
  local err = f:read("*a")
  f:close()
  os.remove(errfile)
  return err, seconds, status == true or status == 0
end

--- Runs code in a Lua process of its own (written by _M.script to a temporary file, removed
-- afterwards) -> what it wrote on stderr, the seconds it took, true when it exited 0.
function _M.run_script(code)
  local cmd, path = _M.script(code)
  local err, seconds, ok = _M.run(cmd)
  os.remove(path)
  return err, seconds, ok
end

return _M
