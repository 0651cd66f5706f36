-- tools/oom/fork.lua URL -- LuaJIT only (fork through the FFI), under tools/failmalloc.c: a
-- collector with rollups, used in the parent, is adopted by a forked child (as an nginx
-- worker adopts the master's) while every allocation of esx's fails.  The child's first
-- request may be refused; every event it accepts must be counted in its rollup rows or in
-- rollup_dropped (a child that could not make its rollup table must not go on without one).
-- Prints "FAIL ...", then "done <sweeps> <injected> <failures>".
local ffi = require "ffi"
ffi.cdef [[ int fork(void); int waitpid(int pid, int *status, int options); void _exit(int); ]]
local fm = require "failmalloc"
local esx = require "esx"

local url = arg[1]
local es = assert(esx.client{ hosts = { url } })
local col = assert(esx.collector{ sink = es, dead_letter = "/dev/null", rollup = { window = 60000 } })
local BODY = '{"site_id":"f","type":"view","user_id":"u1"}'
local s = col:handle{ method = "POST", body = BODY }
assert(s == 204, "parent intake " .. tostring(s))
col:flush(5000)

local fails, injected_total, sweeps = 0, 0, 0
for n = 1, 40 do
  sweeps = sweeps + 1
  local pid = ffi.C.fork()
  if pid == 0 then
    io.stdout:setvbuf("no")
    fm.arm(n, 1, "esx thread")
    local first = col:handle{ method = "POST", body = BODY }
    local injected = fm.disarm()
    local accepted = first == 204 and 1 or 0
    for _ = 1, 3 do
      if col:handle{ method = "POST", body = BODY } == 204 then accepted = accepted + 1 end
    end
    local rows = col:rollups() or {}
    local count = 0
    for _, r in ipairs(rows) do if r.site_id == "f" then count = count + r.count end end
    local st, code_extra = col:stats(), 0
    local dropped = st.rollup_dropped -- (counted: an event memory ran out adding)
    if st.rejected.spool ~= 0 then -- (no spool here: memory that ran out is nomem)
      print("FAIL", n, "a refusal for want of memory counted as spool")
      code_extra = 1
    end
    local code = (injected > 0 and 10 or 0) + (code_extra or 0)
    if count + dropped ~= accepted then
      print("FAIL", n, "child accepted " .. accepted .. " events, its rollup rows count " .. count ..
            ", rollup_dropped " .. dropped)
      code = code + 1
    end
    ffi.C._exit(code) -- no exit handlers: the parent's objects are the parent's
  end
  local st = ffi.new("int[1]")
  ffi.C.waitpid(pid, st, 0)
  local code = bit.rshift(st[0], 8)
  if bit.band(st[0], 0x7f) ~= 0 then
    fails = fails + 1
    print("FAIL", n, "child killed by signal " .. bit.band(st[0], 0x7f))
  elseif code % 10 ~= 0 then
    fails = fails + 1
  end
  if code >= 10 then injected_total = injected_total + 1 elseif n > 1 then break end
end
col:close(5000)
print("done", sweeps, injected_total, fails)
