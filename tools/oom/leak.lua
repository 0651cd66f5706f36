-- tools/oom/leak.lua SCRIPT ARGS... -- runs tools/oom/SCRIPT (with ARGS as its arg) REPS times
-- (env, default 4) in one process under tools/failmalloc.c and prints the C heap's bytes in use
-- after each run ("INUSE <run> <bytes>").  Bytes that keep growing run after run are memory a
-- failure path leaks; a few runs' growth that then stays flat is not (finalizers, caches).
-- Run it under LuaJIT (luajit -joff): its own allocator keeps Lua's memory out of the count.
local fm = require "failmalloc"
local script = table.remove(arg, 1)
local reps = tonumber(os.getenv("REPS") or 4)
for i = 1, reps do
  dofile(script)
  collectgarbage(); collectgarbage()
  print("INUSE", i, fm.inuse())
end
