-- spec/support/shell.lua -- runs shell commands for specs of the examples and tools.
--
--   local run = require("spec.support.shell").run
--   local ok, out = run("lua5.4 examples/search.lua --es " .. url .. " x")
--   assert(ok("mkdir -m 1777 " .. dir), dir)

local _M = {}

--- Runs cmd in a shell, its output not captured -> true when it exited 0.  (os.execute's own
-- result cannot be asserted: LuaJIT returns the wait status, a number, true also on failure.)
function _M.ok(cmd)
  local ok = os.execute(cmd)
  return ok == true or ok == 0
end

--- Runs cmd in a shell -> ok (its exit status was 0), output (stdout and stderr together).
function _M.run(cmd)
  local p = io.popen("(" .. cmd .. ") 2>&1; echo \"exit=$?\"")
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("exit=(%d+)\n?$"))
  return code == 0, (out:gsub("exit=%d+\n?$", ""))
end

--- The whole content of the file at path (closed again); raises when it cannot be read.
function _M.read_file(path)
  local f = assert(io.open(path, "rb"))
  local text = f:read("*a")
  f:close()
  return text
end

return _M
