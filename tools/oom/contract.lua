-- tools/oom/contract.lua -- the contract the client sweeps (tools/oom/client.lua,
-- tools/oom/concurrent.lua) and the constructors' sweep (tools/oom/new.lua, i the name of the
-- constructor) hold each call of theirs to, and their count of violations.  The
-- scripts run from the checkout's root with ./?.lua on LUA_PATH (spec/oom_spec.lua):
--
--   local contract = require("tools.oom.contract").new()
--   local fail = contract.fail                    -- prints "FAIL ..." and counts it
--   local res = contract.answer(n, i, { pcall(es.get, es, "i", "1") }, injected)
--   if res and res._source == nil then fail(n, i, "wrong document") end
--   contract.nodes_alive(n, es)
--   print("done", n, injected_total, contract.fails)
--
-- (new() gives each run its own count: tools/oom/leak.lua runs a script several times in one
-- process, where require returns the module it loaded the first time.)

local _M = {}

function _M.new()
  local self = { fails = 0 } -- the violations reported so far

  --- Reports a violation: prints "FAIL" and the values given, counts it.
  function self.fail(...)
    self.fails = self.fails + 1
    print("FAIL", ...)
  end

  --- Holds the outcome r = { pcall(call) } of call i in sweep n, into which `injected`
  -- allocation failures were injected, to the contract: the call answers; or it returns
  -- nil, err of kind "internal" (esx's own failure, and only when a failure was injected);
  -- or it raises Lua's "not enough memory".  Anything else (another kind, a raise that blames
  -- the caller, a raised "hang") is a violation -> the answer when the call gave one (for the
  -- caller's checks of it), else nil.
  function self.answer(n, i, r, injected)
    local ok, res, err = r[1], r[2], r[3]
    if not ok then
      if not tostring(res):find("not enough memory", 1, true) then self.fail(n, i, "raised", tostring(res)) end
    elseif res == nil then
      if type(err) ~= "table" or err.kind ~= "internal" then
        self.fail(n, i, "error", type(err) == "table" and err.kind or "?", tostring(err))
      elseif injected == 0 then
        self.fail(n, i, "an error without an injected failure", tostring(err))
      end
    else
      return res
    end
  end

  --- esx's own shortage is not a node's failure: each node of client es marked dead after
  -- sweep n is a violation.
  function self.nodes_alive(n, es)
    for i, node in ipairs(es:stats().nodes) do
      if not node.alive then self.fail(n, "node " .. i .. " (" .. tostring(node.url) .. ") was marked dead") end
    end
  end

  return self
end

return _M
