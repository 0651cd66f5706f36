-- spec/support/child.lua -- Lua scripts for a child process that loads this checkout's esx
-- (lua/ and build/<flavour>/, with the interpreter of this run): for specs of what would
-- crash, hang or exit busted, or must run as another user.
--
--   local child = require "spec.support.child"
--   local cmd, path = child.script("print(require('esx').version)")
--   local out = io.popen("timeout 10 " .. cmd .. " 2>&1"):read("*a")

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

return _M
