-- spec/support/shell.lua -- runs shell commands for specs of the examples and tools.
--
--   local run = require("spec.support.shell").run
--   local ok, out = run("lua5.4 examples/search.lua --es " .. url .. " x")

local _M = {}

--- Runs cmd in a shell -> ok (its exit status was 0), output (stdout and stderr together).
function _M.run(cmd)
  local p = io.popen("(" .. cmd .. ") 2>&1; echo \"exit=$?\"")
  local out = p:read("*a")
  p:close()
  local code = tonumber(out:match("exit=(%d+)\n?$"))
  return code == 0, (out:gsub("exit=%d+\n?$", ""))
end

return _M
