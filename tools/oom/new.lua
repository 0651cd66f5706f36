-- tools/oom/new.lua URL SCOPE COUNT SPOOL_DIR -- run under tools/failmalloc.c (LD_PRELOAD):
-- the constructors (esx.client, esx.collector with a spool, esx.cache) and their first use
-- with the n-th allocation failing (and COUNT - 1 after it; 0: every one after it).  Each
-- must return an object, nil, err of kind internal (only when a failure was injected into the
-- round), or raise Lua's "not enough memory" (tools/oom/contract.lua); an object made must
-- then work.  Prints "FAIL ...", then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local esx = require "esx"
local contract = require("tools.oom.contract").new()

local url, scope, count, spool = arg[1], arg[2] or "esx", tonumber(arg[3]) or 1, arg[4]
local fail = contract.fail
-- the object a constructor's outcome r = { pcall(...) } gave, if any (checked once disarmed)
local function made(r) return r[1] and r[2] or nil end

local n, injected_total, clean = 0, 0, 0
while clean < 3 and n < 3000 do
  n = n + 1
  fm.arm(n, count, scope)
  local made_es = { pcall(esx.client, { hosts = { url }, request_timeout = 3000 }) }
  local es = made(made_es)
  local made_col = es and { pcall(esx.collector, { sink = es, spool_dir = spool, dead_letter = "/dev/null" }) }
  local col = made_col and made(made_col)
  local status = col and select(2, pcall(col.handle, col, { method = "POST", body = '{"site_id":"s","type":"v"}' }))
  local made_cache = { pcall(esx.cache, { load_page = function() return { { id = 1 } } end,
                                          load_readers = function() return { 1, 2 } end }) }
  local cache = made(made_cache)
  local injected = fm.disarm()
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  -- the contract, with what was injected into the round known: an error without an injected
  -- failure is a violation too
  contract.answer(n, "esx.client", made_es, injected)
  if made_col then contract.answer(n, "esx.collector", made_col, injected) end
  contract.answer(n, "esx.cache", made_cache, injected)
  if es then
    local r, err = es:info()
    if not r then fail(n, "client made under faults fails after them", tostring(err)) end
  end
  if col then
    local s = col:handle{ method = "POST", body = '{"site_id":"s","type":"v"}' }
    if s ~= 204 then fail(n, "collector made under faults answers", s) end
    local ok, err = col:flush(5000)
    if not ok then fail(n, "collector flush", tostring(err)) end
    col:close(5000)
  end
  if status ~= nil and status ~= 204 and status ~= 503 then fail(n, "intake under faults answered", status) end
  if cache then
    local l, err = cache:read_articles(1, 1)
    if not l or l[1].read ~= true then fail(n, "cache made under faults", tostring(err)) end
    cache:close()
  end
  if es then es:close() end
end
print("done", n, injected_total, contract.fails)
