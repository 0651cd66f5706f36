-- tools/oom/core.lua SCOPE COUNT -- run under tools/failmalloc.c (LD_PRELOAD): for n = 1,
-- 2, ... the n-th allocation counted during one round of esx.core's parsers and encoders
-- (json_decode, json_encode, gunzip, events_parse, event_from_query, bulk_response_parse,
-- HyperLogLog new/add/merge/serialize/deserialize/union; and COUNT - 1 after it, 0: every one
-- after it) fails.  Each must give the right answer, fail as documented (docs/errors.md), or
-- raise Lua's "not enough memory".  Prints "FAIL ...", then "done <sweeps> <injected> <failures>".
local fm = require "failmalloc"
local core = require "esx.core"

local scope, count = arg[1] or "esx", tonumber(arg[2]) or 1
local fails = 0
local function fail(...) fails = fails + 1; print("FAIL", ...) end

-- s through a shell filter (gzip -c, base64 -w0): the bytes it prints
local function filter(cmd, s)
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "wb")); f:write(s); f:close()
  local p = io.popen(cmd .. " < " .. tmp)
  local out = p:read("*a"); p:close(); os.remove(tmp)
  return out
end
local function gz(s) return filter("gzip -c", s) end
local function b64(s) return filter("base64 -w0", s) end

local doc = { hits = { total = { value = 3 }, hits = {} } }
local parts = {}
for i = 1, 50 do parts[i] = ('{"_id":"%d","_source":{"title":"t%d","n":%d,"tags":["a","b"]}}'):format(i, i, i) end
local text = '{"hits":{"total":{"value":50},"hits":[' .. table.concat(parts, ",") .. ']}}'
local big = ("0123456789"):rep(20000)
local big_gz = gz(big)
local events = {}
for i = 1, 20 do events[i] = ('{"site_id":"s","type":"view","user_id":%d,"n":{"a":[1,2,3]}}'):format(i) end
local events_body = "[" .. table.concat(events, ",") .. "]"
local items = {}
for i = 1, 30 do items[i] = '{"create":{"_id":"' .. i .. '","status":' .. (i % 3 == 0 and 429 or 201) .. '}}' end
local bulk_body = '{"took":3,"errors":true,"items":[' .. table.concat(items, ",") .. ']}'

local function raised(n, what, e)
  if not tostring(e):find("not enough memory", 1, true) then fail(n, what, "raised", tostring(e)) end
end

SKETCHES = {}
for k = 0, 1 do
  local h = core.hll_new()
  for i = 1 + k * 300, 300 + k * 300 do h:add("u" .. i) end
  SKETCHES[k + 1] = b64(h:serialize())
end

local checks = {
  { "json_decode", function() return core.json_decode(text) end,
    function(v) return v.hits.total.value == 50 and #v.hits.hits == 50 and v.hits.hits[50]._source.n == 50 end,
    { decode = "?" } },
  { "json_encode", function() return core.json_encode({ text = big, list = { 1, 2, 3 } }) end,
    function(v) return #v > 200000 end, nil, true },
  { "gunzip", function() return core.gunzip(big_gz, 1e6) end, function(v) return v == big end, nil, true },
  { "events_parse", function() return core.events_parse(events_body, 1700000000000, 100) end,
    function(v) return type(v) == "table" and #v == 20 end, { nomem = true } },
  { "event_from_query", function() return core.event_from_query("site_id=s&type=view&user_id=42", 1700000000000) end,
    function(v) return type(v) == "table" and #v == 1 end, { nomem = true, too_big = true } },
  { "bulk_response_parse", function() return core.bulk_response_parse(bulk_body, 30) end,
    function(v) return type(v) == "table" end, { decode = "?" } },
  { "hll", function()
      local h, e = core.hll_new()
      if not h then return nil, e end
      for i = 1, 300 do local ok, err = h:add("u" .. i); if not ok then return nil, err end end
      local h2, e2 = core.hll_new()
      if not h2 then return nil, e2 end
      for i = 200, 600 do local ok, err = h2:add("u" .. i); if not ok then return nil, err end end
      local ok, err = h:merge(h2)
      if not ok then return nil, err end
      local s = h:serialize()
      local h3, derr = core.hll_deserialize(s)
      if not h3 then return nil, derr end
      return h3:estimate()
    end, function(v) return math.abs(v - 600) < 30 end, { nomem = true } },
  -- the rollup rows' sketches (base64), as esx.collector.totals merges them
  { "hll_union", function() return core.hll_union(SKETCHES) end,
    function(v) return math.abs(v - 600) < 30 end, { internal = true, decode = "?" } },
}

local n, injected_total, clean = 0, 0, 0
while clean < 3 and n < 5000 do
  n = n + 1
  fm.arm(n, count, scope)
  local results = {}
  for i, c in ipairs(checks) do results[i] = { pcall(c[2]) } end
  local injected = fm.disarm()
  injected_total = injected_total + injected
  if injected == 0 then clean = clean + 1 end
  for i, c in ipairs(checks) do
    local r = results[i]
    local ok, v, err = r[1], r[2], r[3]
    if not ok then raised(n, c[1], v)
    elseif v == nil or v == false then
      if c[5] then -- a reason string (gunzip) or a message (json_encode)
        if c[1] == "gunzip" and err ~= "nomem" then fail(n, c[1], "reason", tostring(err)) end
        if c[1] == "json_encode" and r[4] ~= "nomem" then fail(n, c[1], "no nomem", tostring(err)) end
      elseif type(err) ~= "table" or not (c[4] or {})[err.kind] then
        fail(n, c[1], "error", type(err) == "table" and err.kind or type(err), tostring(err))
      elseif c[4][err.kind] == "?" then
        fail(n, c[1], "error kind " .. err.kind .. " for esx's own failure", tostring(err))
      end
    elseif not c[3](v) then
      fail(n, c[1], "wrong answer")
    end
  end
end
print("done", n, injected_total, fails)
