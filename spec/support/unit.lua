-- spec/support/unit.lua -- the tools/unit programs: C checks of parts of src/ that Lua cannot
-- reach (races, clocks, sizes), built with the sources they test and run by the specs.  Each
-- check prints "ok <name>" or "FAIL <name>" (tools/unit/check.h); the program exits with 1
-- when any failed.
--
--   require("spec.support.unit").run("rollup_grace", "src/rollup.c src/hll.c ... -lm", 8)
--
-- A spec that does nothing else ends its name with "(tools/unit)": the program is the same
-- whatever Lua drives busted, and tools/run-tests runs those specs under one flavour only.

local assert = require "luassert"

local _M = {}

--- Builds tools/unit/<name>.c with sources (C files and link flags), runs it, and asserts that
-- it printed no FAIL, exactly `checks` lines "ok ..." (a program that stopped half way prints
-- fewer) and exited 0 -> what it printed.
function _M.run(name, sources, checks)
  local bin = os.tmpname()
  local ok = os.execute("gcc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Isrc tools/unit/" .. name ..
    ".c " .. sources .. " -o " .. bin)
  assert.truthy(ok == true or ok == 0, "cannot build tools/unit/" .. name .. ".c")
  local p = io.popen(bin .. '; echo "exit=$?"')
  local out = p:read("*a")
  p:close()
  os.remove(bin)
  local code = tonumber(out:match("exit=(%d+)\n?$"))
  out = out:gsub("exit=%d+\n?$", "")
  assert.falsy(out:find("FAIL", 1, true), out)
  local n = 0
  for line in out:gmatch("[^\n]+") do
    if line:find("^ok ") then n = n + 1 end
  end
  assert.equal(checks, n, out)
  assert.equal(0, code, out)
  return out
end

return _M
