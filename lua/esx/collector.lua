--- esx.collector: the beacon collector handler.
--
-- The HTTP decisions (method, CORS, content type and coding, status codes) are made here;
-- parsing, validation, admission, the queue, shipping, rollups and the spool are the C
-- core's (src/collector.c).  col:handle(req) answers at once: it never waits for
-- Elasticsearch, and it sheds load with 503/429 and Retry-After instead of queueing requests.

local core = require "esx.core"
local json_encode = core.json_encode -- exact integers, unlike cjson 2.1.0 (src/ljson.h)
local options = require "esx.options"
local registry = require "esx.registry"

local type, pairs, ipairs, tostring, setmetatable, error, tonumber, select =
  type, pairs, ipairs, tostring, setmetatable, error, tonumber, select
local concat, format, lower, ceil, floor = table.concat, string.format, string.lower, math.ceil, math.floor

local _M = {}

-- 1x1 transparent GIF for pixel beacons
local PIXEL = "GIF89a\1\0\1\0\128\0\0\0\0\0\255\255\255\33\249\4\1\0\0\0\0\44\0\0\0\0\1\0\1\0\0\2\2\68\1\0\59"

local function int(min, max, default)
  return { type = "integer", min = min, max = max, default = default }
end

-- Conversions an index pattern may use: digits only, never padded with spaces, in every
-- locale (%F is %Y-%m-%d).  %e, %k and %l pad with a space ("events-2023.12. 5" on the 1st to
-- the 9th), names (%b, %a, %p) hold capitals, %c %D %T %R %r %x %X slashes, colons or spaces.
local INDEX_CONVERSIONS = "YyCGgmdjHIMSUVWuwF"

-- instants to format: every month, days 1-9 and later ones, hours 0-23 (UTC, 2023-2024)
local probe_times = {}
do
  local days_before = { 0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334 }
  for _, yb in ipairs({ { 2023, 1672531200 }, { 2024, 1704067200 } }) do
    local year, base = yb[1], yb[2]
    for m = 1, 12 do
      local leap = year == 2024 and m > 2 and 1 or 0
      for _, d in ipairs({ 1, 5, 9, 10, 28 }) do
        local h = (m * 7 + d) % 24
        probe_times[#probe_times + 1] = base + ((days_before[m] + leap + d - 1) * 24 + h) * 3600 + 59 * 60 + 59
      end
    end
  end
  for h = 0, 23 do probe_times[#probe_times + 1] = 1704067200 + 4 * 86400 + h * 3600 end
end

local function check_index_fmt(v)
  if #v > 120 then return nil, "too long" end
  -- (LuaJIT's os.date stops at a NUL, so the probes below passed it, and C raised from inside)
  if v:find("%z") then return nil, "must not contain NUL" end
  local i = 1
  while true do
    local at = v:find("%", i, true)
    if not at then break end
    local c = v:sub(at + 1, at + 1)
    if c == "" then return nil, "ends with a lone %" end
    if not INDEX_CONVERSIONS:find(c, 1, true) then
      return nil, "conversion %" .. c .. " can give an invalid index name (use %" ..
        INDEX_CONVERSIONS:gsub(".", "%0 %%"):sub(1, -3) .. ")"
    end
    i = at + 2
  end
  -- every instant must give a valid name (the literal parts included)
  local check = require("esx.client").check_index
  for _, t in ipairs(probe_times) do
    local valid, probe = pcall(os.date, "!" .. v, t)
    if not valid then return nil, "not a valid strftime pattern (" .. v .. ")" end
    local ok = pcall(check, probe, 1, "collector")
    if not ok or probe:find(":", 1, true) then
      return nil, "does not give a valid index name (" .. tostring(probe) .. ")"
    end
  end
  return v
end

-- Ports a browser leaves out of the Origin it sends.
local DEFAULT_PORTS = { http = "80", https = "443" }

-- Why a listed origin can never equal an Origin header, or nil.  Origins are compared as
-- strings, and a browser sends scheme://host[:port] in lower case, without a path (nor a
-- trailing slash) and without its scheme's default port: "https://Shop.example/" answered
-- every request from https://shop.example 403, silently.
local function origin_problem(o)
  if o == "*" or o == "null" then return nil end
  local scheme, rest = o:match("^(%a[%w+.-]*)://(.*)$")
  if not scheme or rest:find("@", 1, true) then return "is not an origin (scheme://host[:port])" end
  local host, port = rest:match("^(%[[%x:.]+%])(.*)$")
  if not host then host, port = rest:match("^([^/?#@:%[%]]+)(.*)$") end
  if not host then return "is not an origin (scheme://host[:port])" end
  if port ~= "" then
    local p = port:match("^:(%d+)$")
    if not p then return "has a path, query or trailing slash (browsers send scheme://host[:port] only)" end
    if p:sub(1, 1) == "0" or tonumber(p) > 65535 then return "has an invalid port" end
    if DEFAULT_PORTS[scheme:lower()] == p then
      return "names its scheme's default port (browsers leave it out)"
    end
  end
  if o:find("%u") then return "has capitals (browsers send scheme and host in lower case)" end
  return nil
end

local function check_origins(v)
  for i, o in pairs(v) do
    if type(i) ~= "number" or type(o) ~= "string" or o:find("[%s%c]") then
      return nil, "list of origins (strings) expected"
    end
  end
  -- (read with ipairs: the origins after a hole were refused with 403)
  if not options.is_sequence(v) then return nil, "list of origins (strings) expected (a hole in the list)" end
  for _, o in ipairs(v) do
    local problem = origin_problem(o)
    if problem then return nil, ("%q %s"):format(o, problem) end
  end
  return v
end

local rollup_schema = {
  window = int(1000, 86400000, 60000),
  index = { type = "string", check = check_index_fmt, default = "rollups-%Y.%m.%d" },
  interval = int(100, 3600000, 10000),
  max_rows = int(1, 10000000, 100000),
}

local function check_rollup(v)
  if v == false then return v end
  if type(v) ~= "table" then return nil, "table or false expected, got " .. type(v) end
  local ok, r = pcall(options.check, "esx.collector rollup", rollup_schema, v, 1)
  if not ok then return nil, (tostring(r):gsub("^.-esx%.collector rollup: ", "")) end
  return r
end

local function check_dir(v)
  if v:find("%c") then return nil, "must not contain control characters" end
  if #v > 380 then return nil, "too long" end
  return v
end

local function check_instance(v)
  if not v:match("^[%w_.-]+$") or #v > 100 then return nil, "1-100 characters of [A-Za-z0-9_.-]" end
  return v
end

_M.schema = {
  sink = { type = "table", required = true },
  index = { type = "string", check = check_index_fmt, default = "events-%Y.%m.%d" },
  create_index = { type = "boolean" },
  max_concurrent = int(1, 1000000, 50),
  abandoned_after = int(1, 86400000, 60000),
  max_body = int(64, 64 * 1024 * 1024, 65536),
  max_events = int(1, 100000, 100),
  queue_max_bytes = int(4096, 2 ^ 40, 64 * 1024 * 1024),
  batch_max_bytes = int(1024, 1024 * 1024 * 1024, 1024 * 1024),
  batch_max_events = int(1, 1000000, 5000),
  flush_interval = int(1, 3600000, 1000),
  bulk_concurrency = int(1, 64, 2),
  retry_backoff_min = int(1, 3600000, 100),
  retry_backoff_max = int(1, 3600000, 30000),
  spool_dir = { type = "string", nonempty = true, check = check_dir },
  spool_sync_interval = int(0, 3600000, 1000),
  spool_segment_bytes = int(4096, 1024 * 1024 * 1024, 4 * 1024 * 1024),
  spool_max_bytes = int(4096, 2 ^ 50, 1024 * 1024 * 1024),
  dead_letter = { type = "string", nonempty = true, check = check_dir },
  dead_letter_max_bytes = int(4096, 2 ^ 50, 1024 * 1024 * 1024),
  allowed_origins = { type = "table", check = check_origins, default = function() return { "*" } end },
  rollup = { type = "any", check = check_rollup,
             default = function() return options.check("rollup", rollup_schema, {}, 1) end },
  site_rate = { type = "number", min = 0.001, max = 1e9 },
  site_burst = { type = "number", min = 1, max = 1e9 },
  max_sites = int(1, 10000000, 100000),
  instance = { type = "string", check = check_instance },
  name = { type = "string", nonempty = true, check = options.utf8_text },
}

local Collector = {}
Collector.__index = Collector

--- esx.collector(opts) -> collector.  Raises on a bad option; nil, err when it cannot start.
function _M.new(opts)
  local o = options.check("esx.collector", _M.schema, opts, 3)
  if getmetatable(o.sink) ~= require("esx.client").Client then
    error("esx.collector: bad option 'sink' (esx.client expected)", 2)
  end
  if o.retry_backoff_max < o.retry_backoff_min then
    error("esx.collector: bad option 'retry_backoff_max' (must be >= retry_backoff_min)", 2)
  end
  if o.site_burst and not o.site_rate then
    error("esx.collector: bad option 'site_burst' (given without 'site_rate')", 2)
  end
  if not o.spool_dir and o.queue_max_bytes < o.max_body then
    -- a request max_body allows could never be taken: memory is all there is
    error("esx.collector: bad option 'queue_max_bytes' (must be >= max_body without spool_dir)", 2)
  end
  local tmp = os.getenv("TMPDIR")
  if tmp == nil or tmp == "" then tmp = "/tmp" end -- ("TMPDIR=" would give the root directory)
  local dead_letter = o.dead_letter or
    (o.spool_dir and (o.spool_dir .. "/dead-letter.ndjson")) or (tmp .. "/esx-dead-letter.ndjson")
  local rollup = o.rollup or {}
  -- by default esx creates the indices it names by the day (see docs: create_index), not a
  -- fixed name, which may be an alias or a data stream the user manages
  local function create(pattern)
    if o.create_index ~= nil then return o.create_index end
    return pattern ~= nil and pattern:find("%", 1, true) ~= nil
  end
  local c, err = core.collector_new(o.sink.c, {
    index = o.index, max_body = o.max_body, max_events = o.max_events,
    queue_max_bytes = o.queue_max_bytes,
    batch_max_bytes = o.batch_max_bytes, batch_max_events = o.batch_max_events,
    flush_interval = o.flush_interval, bulk_concurrency = o.bulk_concurrency,
    retry_backoff_min = o.retry_backoff_min, retry_backoff_max = o.retry_backoff_max,
    spool_dir = o.spool_dir, spool_sync_interval = o.spool_sync_interval,
    spool_segment_bytes = o.spool_segment_bytes, spool_max_bytes = o.spool_max_bytes,
    dead_letter = dead_letter, dead_letter_max_bytes = o.dead_letter_max_bytes,
    rollup_window = o.rollup and rollup.window or 0, rollup_index = rollup.index or "rollups",
    rollup_interval = rollup.interval, rollup_max_rows = rollup.max_rows,
    instance = o.instance, site_rate = o.site_rate,
    site_burst = o.site_burst or (o.site_rate and o.site_rate), max_sites = o.max_sites,
    create_index = create(o.index), create_rollup_index = create(rollup.index),
  })
  if not c then return nil, err end
  local allowed, any = {}, false
  for _, origin in ipairs(o.allowed_origins) do
    if origin == "*" then any = true else allowed[origin] = true end
  end
  local self = setmetatable({ c = c, o = o, sink = o.sink, any_origin = any, origins = allowed,
                              cors_lists = {}, busy_lists = {}, dead_letter = dead_letter, refused = {} }, Collector)
  self.name = registry.add(self, "collector", o.name, Collector.stats)
  return self
end

local JSON_TYPE = "application/json"

-- Out of memory (json_encode's only failure for these tables) must not leave an answer
-- without a body: fallback, a fixed text that says what the status alone cannot.
local function json_body(t, fallback)
  return json_encode(t) or fallback or '{"error":"out of memory"}'
end

-- Answers carry their headers as a flat list {name, value, name, value, ...}.  The lists of
-- the common answers are made once and shared (read only): no table per request.  col:handle
-- gives its caller a fresh map; esx.nginx.collect sets the list's headers directly.
-- Every answer carries `Vary: Origin`: its CORS headers depend on the request's Origin (none
-- without one, the origin echoed with credentials for a listed one, "*" for the others, a
-- 403 for a refused one), so a shared cache must not serve one origin's answer to another.
local NO_STORE = { "Cache-Control", "no-store", "Vary", "Origin" }
local STAR = { "Cache-Control", "no-store", "Vary", "Origin", "Access-Control-Allow-Origin", "*" }

-- The CORS part of an answer: the shared list for that origin (no Origin header, a listed
-- origin, any origin under "*"), or nil for a refused origin.  A listed origin's list is made
-- on its first request and kept: there are at most #allowed_origins of them.
local function cors(self, origin)
  if not origin then return NO_STORE end
  local h = self.cors_lists[origin]
  if h then return h end
  if self.origins[origin] then
    h = { "Cache-Control", "no-store", "Vary", "Origin", "Access-Control-Allow-Origin", origin,
          "Access-Control-Allow-Credentials", "true" }
    self.cors_lists[origin] = h
    return h
  end
  if self.any_origin then return STAR end
  return nil
end

-- a new list: base's headers, then the given name/value pairs
local function with(base, ...)
  local h = {}
  for i = 1, #base do h[i] = base[i] end
  local n = #h
  for i = 1, select("#", ...) do h[n + i] = (select(i, ...)) end
  return h
end

local function first(v)
  if type(v) == "table" then return v[1] end
  return v
end

-- Refusals decided here (before the C core sees the body) are counted per reason.
local lua_reasons = { [403] = "origin", [405] = "method", [413] = "too_large", [415] = "unsupported",
                      [400] = "not_json" } -- (an empty body, or one that is not valid gzip)

local function count(self, reason)
  local r = self.refused
  r[reason] = (r[reason] or 0) + 1
end

local function error_answer(base, status, message, extra, ...)
  local doc = { error = message }
  if extra then for k, v in pairs(extra) do doc[k] = v end end
  return status, with(base, "Content-Type", JSON_TYPE, ...), json_body(doc)
end

-- An answer with Retry-After (503, 429): a cross-origin tag can read the header only when
-- it is exposed (it is not a CORS-safelisted response header).
local function retry_answer(base, status, message, seconds)
  if base == NO_STORE then
    return error_answer(base, status, message, nil, "Retry-After", seconds)
  end
  return error_answer(base, status, message, nil, "Retry-After", seconds,
                      "Access-Control-Expose-Headers", "Retry-After")
end

local BUSY_BODY = '{"error":"too many requests in progress"}'

-- The 503 for max_concurrent, with the CORS headers of the request's origin (a browser
-- hides an answer without them from the tag, which then sees a network error instead).
local function busy_answer(self, origin)
  local base = cors(self, origin) or NO_STORE
  local list = self.busy_lists[base]
  if not list then
    list = select(2, retry_answer(base, 503, "", "1"))
    self.busy_lists[base] = list
  end
  return 503, list, BUSY_BODY
end

local function rejects_list(rejects)
  local list = {}
  for i, r in ipairs(rejects) do list[i] = { index = r.index, error = r.error } end
  return list
end

local accepted_types = {
  ["application/json"] = true, ["text/plain"] = true, ["application/x-ndjson"] = true,
}

-- Content-Type values seen, and whether their media type is accepted.  The key is what the
-- client sent, so the cache is bounded; past the bound a value is simply parsed again.
local ctype_seen, ctype_count, CTYPE_CACHE_MAX = {}, 0, 256

local function ctype_accepted(ctype)
  local ok = ctype_seen[ctype]
  if ok == nil then
    -- an empty (or blank) value names no media type: taken as no Content-Type at all, as
    -- a header that is missing is (some proxies and beacon libraries send it empty)
    ok = ctype:find("^%s*$") ~= nil or
         accepted_types[lower(ctype:match("^%s*([^;%s]+)") or "")] == true
    if ctype_count < CTYPE_CACHE_MAX then
      ctype_seen[ctype] = ok
      ctype_count = ctype_count + 1
    end
  end
  return ok
end

-- The query string of a GET: q itself, or the table q written back; nil when it is longer
-- than max (checked on the raw string before anything is made of it, and as the table is
-- written: a table of long values is refused at the first max bytes, not written whole first).
local function query_string(q, max)
  if q == nil then return "" end
  if type(q) == "string" then
    if #q > max then return nil end
    return q
  end
  -- as ngx.req.get_uri_args gives it: a list for a repeated name, true for a bare one; each
  -- written back as it came, so that both forms make the same event (or the same refusal)
  local parts, len = {}, -1
  local function enc(s)
    s = tostring(s)
    if #s > max then return nil end -- percent-encoded it would be longer still
    return (s:gsub("[^%w%-%._~]", function(c) return format("%%%02X", c:byte()) end))
  end
  local function pair(k, v)
    local ek = enc(k)
    local ev = ek and v ~= true and enc(v)
    if not ek or (v ~= true and not ev) then return false end
    local part = v == true and ek or (ek .. "=" .. ev)
    len = len + 1 + #part
    if len > max then return false end
    parts[#parts + 1] = part
    return true
  end
  for k, v in pairs(q) do
    if type(v) == "table" then
      for _, x in ipairs(v) do
        if not pair(k, x) then return nil end
      end
    elseif not pair(k, v) then
      return nil
    end
  end
  return concat(parts, "&")
end

-- The answer to one request: status, header list (shared for the common answers: do not
-- change it), body, and whether the refusal is counted already (the C core counts its own).
-- `declared`: the body's Content-Length when an adapter answers before reading the body.
local function answer(self, method, query, body, ctype, coding, origin, declared)
  local base = cors(self, origin)
  if not base then
    return error_answer(NO_STORE, 403, "origin not allowed")
  end
  if method == "OPTIONS" then
    return 204, with(base, "Access-Control-Allow-Methods", "POST, GET, OPTIONS",
                     "Access-Control-Allow-Headers", "Content-Type, Content-Encoding",
                     "Access-Control-Max-Age", "86400"), ""
  end
  local from_query = false
  if method == "GET" then
    from_query, body = true, query_string(query, self.o.max_body)
    if not body then -- a pixel's query is its body
      return error_answer(base, 413, "query string larger than " .. self.o.max_body .. " bytes")
    end
  elseif method ~= "POST" then
    return error_answer(base, 405, "method not allowed", nil, "Allow", "GET, POST, OPTIONS")
  else
    if ctype and not ctype_accepted(ctype) then
      return error_answer(base, 415, "unsupported content type")
    end
    body = body or ""
    local max = self.o.max_body
    if (declared or #body) > max then
      return error_answer(base, 413, "body larger than " .. max .. " bytes")
    end
    if coding then
      coding = lower(coding:match("^%s*(.-)%s*$"))
      -- x-gzip is gzip (RFC 9110 8.4.1.3: a recipient SHOULD take it so; old tags send it)
      if coding == "gzip" or coding == "x-gzip" then
        local plain, why = core.gunzip(body, max)
        if not plain then
          if why == "too_large" then
            return error_answer(base, 413, "body inflates past " .. max .. " bytes")
          end
          if why == "nomem" then -- our failure, not the client's: like the core's, 503
            count(self, "nomem")
            local s, h, b = retry_answer(base, 503, "out of memory inflating the body", "1")
            return s, h, b, true -- counted
          end
          return error_answer(base, 400, "body is not valid gzip")
        end
        body = plain
      elseif coding ~= "identity" and coding ~= "" then
        return error_answer(base, 415, "unsupported content encoding")
      end
    end
    if body == "" then return error_answer(base, 400, "empty body") end
  end
  local status, accepted, rejects, retry_after, message, detail = self.c:ingest(body, from_query)
  if status == 204 then
    if from_query then
      return 200, with(base, "Content-Type", "image/gif"), PIXEL, true
    end
    return 204, base, "", true
  end
  local s, h, b
  if status == 200 then
    s, h, b = 200, with(base, "Content-Type", JSON_TYPE),
      json_body({ accepted = accepted, rejected = rejects_list(rejects) },
                '{"accepted":' .. accepted .. ',"error":"out of memory listing the rejected events"}')
  elseif status == 429 or status == 503 then
    s, h, b = retry_answer(base, status, message, tostring(ceil(retry_after / 1000)))
  elseif status == 400 and #rejects > 0 then
    s, h, b = error_answer(base, 400, message, { rejected = rejects_list(rejects) })
  else
    s, h, b = error_answer(base, status, message)
  end
  return s, h, b, true, detail
end

-- for esx.nginx.collect: status, header list (read only), body; refusals counted; and, for
-- a failure of ours (the spool), what went wrong, for the log only (it names paths).
function Collector:_answer(method, query, body, ctype, coding, origin, declared)
  local status, list, b, from_core, detail = answer(self, method, query, body, ctype, coding, origin,
                                                    declared)
  local reason = not from_core and lua_reasons[status]
  if reason then count(self, reason) end -- the core counts its own refusals
  return status, list, b, detail
end

-- Content-Encoding given more than once (a list, as header tables hold repeated headers) is
-- more than one coding: only one is taken.
local function one_coding(v)
  if type(v) == "table" and #v > 1 then return concat(v, ", ") end
  return first(v)
end

-- An answer as handle gives it: the headers' name, value list made a table.
local function with_header_table(status, list, body)
  local headers = {}
  for i = 1, #list, 2 do headers[list[i]] = list[i + 1] end
  return status, headers, body
end

local function handle(self, req)
  local h = req.headers or {}
  return with_header_table(self:_answer(req.method, req.query, req.body, first(h["content-type"]),
                                        one_coding(h["content-encoding"]), first(h.origin)))
end

-- The headers handle reads, and whether a value is one it can read: absent, a string, or a
-- list of strings (a header given more than once).
local READ_HEADERS = { "content-type", "content-encoding", "origin" }

local function header_value(v)
  if v == nil or type(v) == "string" then return true end
  if type(v) ~= "table" then return false end
  for i = 1, #v do
    if type(v[i]) ~= "string" then return false end
  end
  return true
end

--- col:handle(req[, entered]) -> status, headers, body
-- req = {method=, path=, query=, headers=<lowercase names>, body=, remote_addr=}.
-- `entered` is for adapters that counted the request with col:enter() themselves.
function Collector:handle(req, entered)
  if type(req) ~= "table" or type(req.method) ~= "string" then
    error("bad argument #1 to 'handle' (request table with a method expected)", 2)
  end
  if req.body ~= nil and type(req.body) ~= "string" then
    error("bad argument #1 to 'handle' (req.body must be a string)", 2)
  end
  local h, q = req.headers, req.query
  if h ~= nil then
    if type(h) ~= "table" then error("bad argument #1 to 'handle' (req.headers must be a table)", 2) end
    for _, name in ipairs(READ_HEADERS) do
      if not header_value(h[name]) then
        error("bad argument #1 to 'handle' (req.headers['" .. name ..
              "'] must be a string or a list of strings)", 2)
      end
    end
  end
  if q ~= nil and type(q) ~= "string" and type(q) ~= "table" then
    error("bad argument #1 to 'handle' (req.query must be a string or a table)", 2)
  end
  if not entered then
    if not self.c:enter(self.o.max_concurrent) then
      count(self, "concurrency")
      return with_header_table(busy_answer(self, first((req.headers or {}).origin)))
    end
  end
  local ok, status, headers, body = pcall(handle, self, req)
  if not entered then self.c:leave() end
  if not ok then error(status, 0) end
  return status, headers, body
end

--- col:enter() -> true when the request may proceed (counts it as in progress); false when
-- max_concurrent requests are in progress (answer 503 with Retry-After).  col:leave() ends it.
function Collector:enter()
  -- closed: nothing to count a request against (handle would answer 503 closed)
  if self.closed then return nil, core.error("closed", "the collector is closed") end
  local ok = self.c:enter(self.o.max_concurrent)
  if not ok then count(self, "concurrency") end
  return ok
end

-- for esx.nginx.collect: col:enter(), and when full, reclaim(col) -- which gives back
-- entries of requests nginx abandoned, returning true if it did -- then one more try.
-- Returns true, or false with the 503's status, header list (read only) and body for the
-- request's origin (origin_fn() returns its Origin header, asked for only then).
function Collector:_enter(reclaim, origin_fn)
  local max = self.o.max_concurrent
  if self.c:enter(max) or (reclaim(self) and self.c:enter(max)) then return true end
  count(self, "concurrency")
  return false, busy_answer(self, origin_fn())
end

function Collector:leave()
  -- a caller's mistake (a second leave, or handle(req, true) of a request never entered):
  -- counted, it would take in_progress below 0 and let requests past max_concurrent
  if not self.c:leave() then
    error("bad call to 'leave' (no request in progress: each col:leave() ends one col:enter() " ..
          "that returned true)", 2)
  end
end

-- A timeout argument: nil (no limit), or a number of ms; a negative one -- a deadline
-- already passed, deadline - now -- is 0, not "no limit" as the core would take it.
local function check_timeout(timeout, fname)
  if timeout == nil then return nil end
  if type(timeout) ~= "number" then
    error("bad argument #1 to '" .. fname .. "' (number expected, got " .. type(timeout) .. ")", 3)
  end
  if timeout ~= timeout then error("bad argument #1 to '" .. fname .. "' (timeout is NaN)", 3) end
  if timeout < 0 then return 0 end
  return timeout
end

-- true when the sink client was closed: nothing queued can be shipped any more
local function sink_closed(self)
  local _, err = self.sink:stats()
  return err ~= nil
end

--- col:flush([timeout_ms]) -> true once everything accepted so far is acknowledged.
function Collector:flush(timeout)
  if self.closed then return nil, core.error("closed", "the collector is closed") end
  timeout = check_timeout(timeout, "flush")
  -- with the sink closed the queue can only be waited on: without a timeout, for ever
  if sink_closed(self) and not self.c:flush(0) then
    return nil, core.error("closed", "the collector's sink client is closed: the events still " ..
      "queued cannot be shipped")
  end
  local ok, err = self.c:flush(timeout)
  if ok then return true end
  if err then return nil, err end -- the shipper cannot run here (its spool, a thread)
  return nil, core.error("request_timeout", "events still queued after " .. tostring(timeout) .. " ms")
end

--- col:rollups() -> rows of the current window
function Collector:rollups()
  if self.closed then return nil, core.error("closed", "the collector is closed") end
  return self.c:rollups()
end

--- col:stats() -> counters (see docs/collector.md)
function Collector:stats()
  if self.closed then return nil, core.error("closed", "the collector is closed") end
  -- (esx.nginx.collect sets _reclaim: slots of requests nginx ended without resuming the
  -- handler, older than abandoned_after, are given back before they are counted)
  if self._reclaim then self._reclaim(self) end
  local s = self.c:stats()
  for reason, n in pairs(self.refused) do s.rejected[reason] = (s.rejected[reason] or 0) + n end
  -- every documented reason from the start, 0 until it happens: a series that appears only
  -- with its first refusal hides that refusal from rate() and increase()
  for _, reason in pairs(lua_reasons) do s.rejected[reason] = s.rejected[reason] or 0 end
  s.rejected.concurrency = s.rejected.concurrency or 0
  local total = 0
  for _, n in pairs(s.rejected) do total = total + n end
  s.rejected.total = total
  s.utilization = {
    concurrency = s.in_progress / self.o.max_concurrent,
    queue = s.queued_bytes / self.o.queue_max_bytes,
    lag_ms = s.lag_ms,
  }
  return s
end

--- col:close([timeout_ms = 10000]) -> true | nil, err  Flushes (or leaves events in the
-- spool) and stops.  Without a spool, events that could not be delivered in time are
-- reported in err.undelivered.
function Collector:close(timeout)
  if self.closed then return true end
  timeout = check_timeout(timeout, "close")
  -- with the sink closed nothing more can be acknowledged: no point in waiting
  if sink_closed(self) then timeout = 0 end
  local left = self.c:close(timeout or 10000)
  self.closed = true
  registry.remove(self)
  if left > 0 and not self.o.spool_dir then
    return nil, core.error("request_timeout", left .. " events were not acknowledged before close",
      { undelivered = left })
  end
  return true
end

--- esx.collector.totals(client, {site_id=, from=, to=[, index=][, by_window=]}) -> rows
-- Sums the rollup rows of every instance for a site and time range: counts add, HyperLogLog
-- registers merge.  Rows: {block_id, variant, type, count, uniques[, window_start]}.
local TOTALS_QUERY = {
  site_id = { type = "string", required = true },
  from = { type = "integer" },   -- ms of window_start, inclusive
  to = { type = "integer" },     -- exclusive
  index = { type = "string", default = "rollups-*" },
  by_window = { type = "boolean", default = false },
}

-- What is wrong with a stored rollup row's fields, or nil: rows come from an index that
-- anything may have written to, and one that is not as esx writes it must fail the totals
-- (nil, err), not raise in the middle of them or be added up as something it is not.
local function row_problem(s, by_window)
  for _, f in ipairs{ "block_id", "variant", "type" } do
    if type(s[f]) ~= "string" then return f .. " is not a string" end
  end
  local c = s.count
  if type(c) ~= "number" or c < 0 or c ~= floor(c) or c >= 2 ^ 53 then
    return "count is not a non-negative integer"
  end
  if s.hll ~= nil and type(s.hll) ~= "string" then return "hll is not a string" end
  if by_window and (type(s.window_start) ~= "number" or type(s.window or 0) ~= "number") then
    return "window_start or window is not a number"
  end
  return nil
end

local PAGE = 10000 -- rows one search reads (index.max_result_window's default)

-- The index expression without the name a search's 404 says does not exist, or nil when err
-- is not such a 404 (a proxy's own, or for a name not in the expression): an index not made
-- yet -- a fixed rollup.index before its first row -- holds no rows, as a pattern that
-- matches nothing does ("" when no name is left).
local function without_missing(index, err)
  if type(err) ~= "table" or err.kind ~= "not_found" or type(err.body) ~= "string" then return nil end
  local doc = core.json_decode(err.body)
  local e = type(doc) == "table" and doc.error
  if type(e) ~= "table" or e.type ~= "index_not_found_exception" or type(e.index) ~= "string" then
    return nil
  end
  local left, found = {}, false
  for name in index:gmatch("[^,]+") do
    if name == e.index and not found then found = true else left[#left + 1] = name end
  end
  return found and concat(left, ",") or nil
end

local function search_rows(client, index, filter, lo, hi, size, dir)
  local range = {}
  if lo then range.gte = lo end
  if hi then range.lt = hi end
  local f = { filter }
  if next(range) then f[2] = { range = { window_start = range } } end
  local body = { size = size, query = { bool = { filter = f } }, sort = { { window_start = dir } },
    track_total_hits = true }
  local res, err = client:search(index, body)
  while not res do -- (each turn drops one name of the expression)
    index = without_missing(index, err)
    if not index then return nil, err end
    if index == "" then return {}, 0 end
    res, err = client:search(index, body)
  end
  -- a 2xx that is not a search response (an empty body, a proxy's own answer) fails the
  -- totals as a malformed row does, rather than raising from in here
  local h = type(res) == "table" and type(res.hits) == "table" and res.hits or nil
  local hits = h and h.hits
  if type(hits) ~= "table" then
    return nil, core.error("decode", "search response has no hits.hits list")
  end
  for i = 1, #hits do
    if type(hits[i]) ~= "table" or type(hits[i]._source) ~= "table" then
      return nil, core.error("decode", "search response hit " .. i .. " has no _source")
    end
  end
  -- a 2xx with failed shards (or a search timeout) holds only the other shards' rows: summed,
  -- they would under-count without a word
  local shards = type(res._shards) == "table" and res._shards or {}
  local failed = tonumber(shards.failed) or 0
  if failed > 0 or res.timed_out == true then
    local f = type(shards.failures) == "table" and shards.failures[1]
    local why = type(f) == "table" and type(f.reason) == "table" and f.reason.reason
    return nil, core.error("partial", failed > 0
      and ("%d shard(s) failed the rollup search: %s"):format(failed, tostring(why or "no reason given"))
      or "the rollup search timed out", { shards_failed = failed })
  end
  local total = type(h.total) == "table" and h.total.value or h.total
  return hits, type(total) == "number" and total or #hits
end

-- A search's failure that a smaller range can avoid: its 2xx answer was cut off at the
-- client's max_response_bytes (10,000 rows with dense sketches are some 170 MB).
local function too_big(err)
  return type(err) == "table" and err.kind == "decode" and type(err.status) == "number" and
    err.status >= 200 and err.status < 300 and type(err.message) == "string" and
    err.message:find("max_response_bytes", 1, true) ~= nil -- (not a proxy's 200 in HTML)
end

-- Passes the hits of the rows matching filter with window_start in [lo, hi) (nil: open) to
-- each(hits), a search's worth at a time: one search when they are at most PAGE and their
-- answer fits in the client's max_response_bytes, else the range is split in two by
-- window_start (rows of one window_start are read by one search: never split, never counted
-- twice).  Returns true, or nil, err (too_many when one window_start has more rows; the
-- search's decode error when the rows of one window_start do not fit; each's own error).
local function read_rows(client, index, filter, lo, hi, each)
  local hits, total = search_rows(client, index, filter, lo, hi, PAGE, "asc")
  local first, cut
  if hits then
    if total <= #hits then return each(hits) end
    first = hits[1] and hits[1]._source.window_start
    hits = nil -- (not held while the halves are read)
  elseif too_big(total) then
    cut = total
    local bottom, err = search_rows(client, index, filter, lo, hi, 1, "asc")
    if not bottom then return nil, err end
    first = bottom[1] and bottom[1]._source.window_start
  else
    return nil, total
  end
  local top, err = search_rows(client, index, filter, lo, hi, 1, "desc")
  if not top then return nil, err end
  local last = top[1] and top[1]._source.window_start
  if type(first) ~= "number" or type(last) ~= "number" or first >= last then
    if cut then return nil, cut end
    return nil, core.error("too_many", ("%d rollup rows have window_start %s; totals reads at most %d of one window start")
      :format(total, tostring(first), PAGE), { rows = total })
  end
  local mid = first + floor((last - first + 1) / 2)
  local ok
  ok, err = read_rows(client, index, filter, first, mid, each)
  if not ok then return nil, err end
  return read_rows(client, index, filter, mid, last + 1, each)
end

-- A stored row, for an error's message: its _id and index.
local function row_name(hit)
  return ("rollup row %s of index %s"):format(tostring(hit._id), tostring(hit._index))
end

-- level: error()'s level for the caller's line (esx.collector.totals or col:totals)
local function totals(client, q, level)
  if type(q) ~= "table" or type(q.site_id) ~= "string" then
    error("bad argument #2 to 'totals' (table with site_id expected)", level)
  end
  q = options.check("esx.collector.totals", TOTALS_QUERY, q, level + 1)
  local index = q.index
  -- site_id is a keyword where a mapping says so, and text with a .keyword subfield under
  -- Elasticsearch's dynamic mapping: ask for either, then keep exact matches only (a text
  -- match for "shop" would also find "shop-eu").
  local site = { bool = { should = { { term = { site_id = q.site_id } },
                                     { term = { ["site_id.keyword"] = q.site_id } } },
                          minimum_should_match = 1 } }
  local groups, order = {}, {}
  -- Each search's rows are added up as they come, and each group's sketches merged into one:
  -- the totals of a long range hold one search's rows at a time, not every row of the range
  -- (a week of one-minute rows with dense sketches is gigabytes).
  local function add(hits)
    local touched = {}
    for _, hit in ipairs(hits) do
      local s = hit._source
      if s.site_id ~= q.site_id then goto continue end
      local bad = row_problem(s, q.by_window)
      if bad then return nil, core.error("decode", row_name(hit) .. " is not valid: " .. bad) end
      -- by window: one row per window start and length (instances may differ in rollup.window)
      local key = concat({ s.block_id, s.variant, s.type,
        q.by_window and format("%.0f\0%.0f", s.window_start, s.window or 0) or "" }, "\0")
      local g = groups[key]
      if not g then
        g = { block_id = s.block_id, variant = s.variant, type = s.type, count = 0, sketches = {},
              rows = {}, window_start = q.by_window and s.window_start or nil,
              window = q.by_window and s.window or nil }
        groups[key] = g
        order[#order + 1] = key
      end
      g.count = g.count + (s.count or 0)
      if s.hll and s.hll ~= "" then
        g.sketches[#g.sketches + 1] = s.hll
        g.rows[#g.sketches] = hit -- (whose sketch it is, for the error)
      end
      touched[g] = true
      ::continue::
    end
    for g in pairs(touched) do
      local est, sketch = core.hll_union(g.sketches, true)
      if not est then
        -- "sketch N is not a valid HyperLogLog": say which row, as for a malformed row
        local n = sketch.kind == "decode" and tonumber(sketch.message:match("^sketch (%d+) "))
        if n and g.rows[n] then
          return nil, core.error("decode", row_name(g.rows[n]) .. " is not valid: hll is not a valid HyperLogLog")
        end
        return nil, sketch
      end
      g.uniques = floor(est + 0.5)
      -- (by window, a group is whole once its search is read: rows of one window_start are
      -- never split between searches)
      g.sketches = q.by_window and {} or { sketch }
      g.rows = {} -- (the union's sketch is no row's)
    end
    return true
  end
  local ok, err = read_rows(client, index, site, q.from, q.to, add)
  if not ok then return nil, err end
  local rows = {}
  for _, key in ipairs(order) do
    local g = groups[key]
    g.sketches, g.rows = nil, nil
    rows[#rows + 1] = g
  end
  return rows
end

--- col:totals(q) -> esx.collector.totals(col's sink, q)
function _M.totals(client, q)
  if getmetatable(client) ~= require("esx.client").Client then
    -- (it failed inside esx: "attempt to call a nil value (method 'search')")
    error("bad argument #1 to 'totals' (esx.client expected, got " .. type(client) .. ")", 2)
  end
  local rows, err = totals(client, q, 3) -- (not a tail call: level 3 is the caller)
  return rows, err
end

function Collector:totals(q)
  if self.closed then return nil, core.error("closed", "the collector is closed") end
  -- by default the indices this collector writes its rows to (each conversion of
  -- rollup.index a wildcard), not "rollups-*": with its own rollup.index it found no rows
  if type(q) == "table" and q.index == nil and self.o.rollup then
    local own = {}
    for k, v in pairs(q) do own[k] = v end
    own.index = (self.o.rollup.index:gsub("%%.", "*"):gsub("%*+", "*"))
    q = own
  end
  local rows, err = totals(self.sink, q, 3)
  return rows, err
end

function Collector:__tostring()
  return "esx.collector: " .. (self.name or "?")
end

-- esx.collector(opts), as the module is reached from require "esx": the module called is new(opts)
-- (a tail call: option errors still point at the caller's line)
setmetatable(_M, { __call = function(_, opts) return _M.new(opts) end })

-- col.flush() with '.' raises "bad self to 'flush' (...)" (see options.lua)
options.guard_methods(Collector, "esx.collector", "col")

return _M
