-- bench/client/bulk.lua -- bulk compression through esx (Lua 5.4 or LuaJIT).
--
--   lua5.4 bench/client/bulk.lua ESXD_URL CANNED_URL SECONDS name=FILE ...
--
-- For each NDJSON bulk file and each gzip level (1, 6, 9):
--   wire:  one POST /_bulk with compression on to the dev server (ESXD_URL), which inflates
--          and indexes it; the bytes come from c:stats().bytes (sent_raw, sent_wire) of a
--          fresh client, and are checked against the body_wire_bytes / body_bytes that the
--          server logged (GET /_esx/requests).
--   speed: repeated POSTs of the same bulk to the canned endpoint (CANNED_URL), timing only
--          the c:send call -- esx gzips the body there, in the calling thread, before handing
--          the request to its I/O thread -- and waiting for each answer before the next send
--          so the I/O thread is idle while the clock runs.  MB/s = raw MB / CPU seconds in send.
--          The same loop with compression off gives the cost of send without gzip.
-- Prints lines "wire NAME LEVEL RAW WIRE SERVER_WIRE SERVER_RAW" and "speed NAME LEVEL MBPS REPS".

local esx = require "esx"
local cjson = require "cjson"
-- CPU time of the process (clock(3)): esx's I/O thread is idle while c:send compresses, so
-- this is the calling thread's time, and it does not count time the scheduler gave to other
-- processes on a busy machine.
local cpu_clock = os.clock

local esxd, canned, seconds = arg[1], arg[2], tonumber(arg[3])
assert(esxd and canned and seconds, "usage: bulk.lua ESXD_URL CANNED_URL SECONDS name=FILE ...")
local bulks = {}
for i = 4, #arg do
  local name, file = arg[i]:match("^([^=]+)=(.+)$")
  local f = assert(io.open(file, "rb"))
  bulks[#bulks + 1] = { name = name, data = f:read("a") }
  f:close()
end

local LEVELS = { 1, 6, 9 }
local NDJSON = { content_type = "application/x-ndjson" }

local function wire(b, level)
  local admin = esx.client { hosts = { esxd } }
  assert(admin:request("DELETE", "/_esx/requests"))
  local c = esx.client { hosts = { esxd }, compression = true, compression_level = level }
  local res = assert(c:request("POST", "/_bulk", b.data, NDJSON))
  local doc = cjson.decode(res.body)
  assert(doc.errors == false, "bulk had item errors")
  local bytes = c:stats().bytes
  local log = cjson.decode(assert(admin:request("GET", "/_esx/requests?path=/_bulk")).body)
  local entry = log.requests[#log.requests]
  assert(entry.headers["content-encoding"] == "gzip", "the bulk did not go out gzipped")
  c:close()
  admin:close()
  return bytes.sent_raw, bytes.sent_wire, entry.body_wire_bytes, entry.body_bytes
end

local function speed(b, level)
  local c = esx.client { hosts = { canned }, compression = level > 0,
                         compression_level = level > 0 and level or nil }
  local data = b.data
  local spent, reps = 0, 0
  repeat
    local t0 = cpu_clock()
    local p = assert(c:send("POST", "/_bulk", data, NDJSON))
    spent = spent + (cpu_clock() - t0)
    reps = reps + 1
    p:wait(30000)
    assert(p:result())
  until spent >= seconds and reps >= 3
  c:close()
  return #data * reps / 1e6 / spent, reps
end

for _, b in ipairs(bulks) do
  for _, level in ipairs(LEVELS) do
    io.write(string.format("wire %s %d %d %d %d %d\n", b.name, level, wire(b, level)))
    io.flush()
  end
end
for _, b in ipairs(bulks) do
  for _, level in ipairs({ 0, 1, 6, 9 }) do
    io.write(string.format("speed %s %d %.1f %d\n", b.name, level, speed(b, level)))
    io.flush()
  end
end
