-- tools/oom/concurrent.lua URL SCOPE COUNT [K] -- run under tools/failmalloc.c (LD_PRELOAD):
-- a fresh client (no connection yet) sends K requests (6) at once, the server answering each
-- after 100 ms, and for n = 1, 2, ... the n-th allocation counted from the sends on (and
-- COUNT - 1 after it, 0: every one after it) fails -- in the calls, or in the I/O thread
-- opening the connections and watching them (epoll_ctl).  Each request must succeed,
-- return nil, err of kind "internal", or raise Lua's "not enough memory"; connect_timeout or
-- socket_timeout (a connection left out of the poll), another kind, a node marked dead, a
-- crash or a hang is a failure (tools/oom/contract.lua).  The client must work again once
-- memory is back.
-- Prints "FAIL ..." per violation, then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local esx = require "esx"
local contract = require("tools.oom.contract").new()

local url, scope, count = arg[1], arg[2] or "esx", tonumber(arg[3]) or 0
local K = tonumber(arg[4]) or 6
local fail = contract.fail

-- every answer after 100 ms: the K requests are in flight together
local ctl = assert(esx.client{ hosts = { url } })
assert(ctl:request("POST", "/_esx/faults", { path = "/", stall_ms = 100, count = -1 }))
ctl:close()

local n, injected_total, clean = 0, 0, 0
while clean < 3 and n < 3000 do
  n = n + 1
  -- socket_timeout far below request_timeout: a request nobody polls ends as socket_timeout
  -- (no retry: the kind of the first failure is the answer)
  local es = assert(esx.client{ hosts = { url }, max_total = K, max_per_route = K,
                                socket_timeout = 300, request_timeout = 10000, max_retries = 0 })
  fm.arm(n, count, scope)
  local sent = {}
  for i = 1, K do sent[i] = { pcall(es.send, es, "GET", "/") } end
  local out = {}
  for i, s in ipairs(sent) do
    if s[1] and s[2] then
      local p = s[2]
      if not p:wait(15000) then
        out[i] = { false, "hang" }
      else
        out[i] = { true, p:result() }
      end
    else
      out[i] = s
    end
  end
  local injected = fm.disarm()
  if os.getenv("OOM_TRACE") then
    local t = {}
    for i, r in ipairs(out) do t[i] = r[1] and (r[2] and "ok" or tostring(r[3]):sub(1, 50)) or tostring(r[2]):sub(1, 50) end
    print(n, injected, table.concat(t, " | "))
  end
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  for i, r in ipairs(out) do
    local res = contract.answer(n, i, r, injected)
    if res and res.status ~= 200 then fail(n, i, "status", res.status) end
  end
  contract.nodes_alive(n, es)
  -- (a path the stall does not hold: this request need not wait 100 ms)
  local res2, err2 = es:request("GET", "/_cluster/health")
  if not res2 then fail(n, "after the round", tostring(err2)) end
  es:close()
end
ctl = assert(esx.client{ hosts = { url } })
ctl:request("DELETE", "/_esx/faults")
ctl:close()
print("done", n, injected_total, contract.fails)
