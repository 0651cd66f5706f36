--- esx.client: the Elasticsearch client pool.
--
-- The pool, the I/O thread, retries, timeouts and compression live in the C core
-- (src/engine*.c); this module checks options, encodes and decodes JSON, turns HTTP error
-- statuses into error objects and offers the Elasticsearch methods.  In nginx, calls made
-- from a phase that can yield wait through esx.nginx (the worker keeps serving); elsewhere
-- they block the calling thread.

local core = require "esx.core"
local json_encode = core.json_encode -- exact integers, unlike cjson 2.1.0 (src/ljson.h)
local options = require "esx.options"
local registry = require "esx.registry"
local cjson = require "cjson.safe"

local type, pairs, ipairs, tostring, tonumber, setmetatable, error, select =
  type, pairs, ipairs, tostring, tonumber, setmetatable, error, select
local concat, format, byte, gsub, floor = table.concat, string.format, string.byte, string.gsub, math.floor
local find = string.find
local new_error = core.error
-- responses are decoded by esx's own single-pass decoder (src/ljson.c): about twice as fast
-- as lua-cjson on search responses, with the same tables and the same null (cjson.null)
local json_decode = core.json_decode

local _M = {}

local MAX_SAFE = options.MAX_SAFE_INTEGER

local function ms(default) return { type = "integer", min = 0, max = MAX_SAFE, default = default } end

-- The node URLs of a hosts string: separated by commas or whitespace, except a comma in a
-- URL's credentials (up to the authority's last '@', the one esx_node_parse takes; RFC 3986
-- allows a raw ',' there): "http://u:p,ss@h:9200" was split into "http://u:p" and "ss@h:9200",
-- and refused for a bad port, though the same URL in a list was taken.
local function split_hosts(s)
  local list, pos = {}, 1
  while true do
    local from = s:find("[^,%s]", pos)
    if not from then return list end
    local stop = s:find("%s", from) or #s + 1 -- (no URL holds a space)
    local url = s:sub(from, stop - 1)
    local auth = url:match("^%a[%w+.-]*://()") or 1
    local auth_end = url:find("[/?#]", auth) or #url + 1
    local after = auth
    for at in url:sub(1, auth_end - 1):gmatch("()@") do
      if at >= auth then after = at end
    end
    local comma = url:find(",", after, true)
    if comma then url, stop = url:sub(1, comma - 1), from + comma - 1 end
    list[#list + 1] = url
    pos = stop
  end
end

local function check_hosts(v)
  local list
  if type(v) == "string" then
    list = split_hosts(v)
  elseif type(v) == "table" then
    list = {}
    for i, h in ipairs(v) do
      if type(h) ~= "string" then return nil, "entry " .. i .. " is not a string" end
      list[i] = h
    end
    -- a hole ({os.getenv("ES1"), os.getenv("ES2"), ...} with ES2 unset) must not drop the
    -- nodes after it silently
    for k in pairs(v) do
      if type(k) ~= "number" or k > #list then
        return nil, "list of node URLs expected (entry " .. #list + 1 .. " is nil, or a key is not an index)"
      end
    end
  else
    return nil, "string or table expected, got " .. type(v)
  end
  if #list == 0 then return nil, "no node URL given" end
  if #list > 64 then return nil, "at most 64 nodes" end
  for _, h in ipairs(list) do
    -- (the C side reads up to the first NUL: "http://a:9200\0x" would pass as "http://a:9200")
    if h:find("%z") then
      return nil, "node URL contains a space, a control character or a byte that is not ASCII " ..
        "(percent-encode it)" -- (as the C check says of the other control characters)
    end
    local ok, why = core.check_node_url(h)
    if not ok then return nil, why end
  end
  return list
end

local function check_statuses(v)
  if #v > 16 then return nil, "at most 16 statuses" end
  for i, s in pairs(v) do
    if type(i) ~= "number" or not options.is_integer(s) or s < 100 or s > 599 then
      return nil, "list of HTTP statuses (100-599) expected"
    end
  end
  -- the C side reads 1..#v: a hole ({502, nil, 504}) dropped the statuses after it (LuaJIT),
  -- or raised from inside esx (Lua 5.4)
  if not options.is_sequence(v) then return nil, "list of HTTP statuses (100-599) expected (a hole in the list)" end
  return v
end

-- esx frames every request itself: a caller's copy of these would contradict it.
local framing_headers = { ["content-length"] = true, ["transfer-encoding"] = true }

-- why header k = val cannot be sent, or nil
local function header_problem(k, val)
  if type(k) ~= "string" or not k:match("^[!#$%%&'*+.^_`|~%w-]+$") then
    return "header names must be HTTP tokens"
  end
  if framing_headers[k:lower()] then
    return "header '" .. k .. "' is esx's to set (request framing)"
  end
  -- esx sends a Content-Type with every body: a second one made Elasticsearch answer 400
  -- ("Invalid media-type value on headers [Content-Type]") to every request with a body
  if k:lower() == "content-type" then
    return "header '" .. k .. "' is esx's to set (per call: the content_type option)"
  end
  if type(val) ~= "string" or val:find("[%z\r\n]") then
    return "header '" .. k .. "' must be a string without CR, LF or NUL"
  end
end

local function check_headers(v)
  local n, bad = 0, false
  for k, val in pairs(v) do
    n = n + 1
    bad = bad or header_problem(k, val) ~= nil
  end
  if bad then
    -- the first in name order: pairs() visits keys in an order that differs between runs
    -- and between Lua 5.4 and LuaJIT, and the error must name the same header every time
    local names = {}
    for k in pairs(v) do
      if type(k) ~= "string" then return nil, "header names must be HTTP tokens" end
      names[#names + 1] = k
    end
    table.sort(names)
    for _, k in ipairs(names) do
      local why = header_problem(k, v[k])
      if why then return nil, why end
    end
  end
  if n > 32 then return nil, "at most 32 headers" end
  return v
end

local function no_crlf(v)
  if v:find("[%z\r\n]") then return nil, "must not contain CR, LF or NUL" end
  return v
end

-- A string the C config holds in a buffer of max + 1 bytes (src/config.h): checked here so
-- that a long one raises as every bad option does, at the caller's line, not from C.
local function bounded(max, check)
  return function(v)
    if #v > max then return nil, "longer than " .. max .. " bytes" end
    return check(v)
  end
end

local function no_nul(v)
  if v:find("%z") then return nil, "must not contain NUL" end
  return v
end

_M.schema = {
  hosts = { type = "any", check = check_hosts,
            default = function() return { "http://127.0.0.1:9200" } end },
  username = { type = "string", check = bounded(255, no_crlf) },
  password = { type = "string", check = bounded(255, no_crlf) },
  api_key = { type = "string", nonempty = true, check = bounded(511, no_crlf) },
  connect_timeout = ms(1000),
  socket_timeout = ms(30000),
  pool_timeout = ms(1000),
  request_timeout = ms(nil),
  max_per_route = { type = "integer", min = 1, max = 1024, default = 10 },
  max_total = { type = "integer", min = 1, max = 1024, default = 30 },
  compression = { type = "boolean", default = false },
  compression_min_bytes = { type = "integer", min = 0, max = MAX_SAFE, default = 0 },
  compression_level = { type = "integer", min = 1, max = 9, default = 1 },
  max_response_bytes = { type = "integer", min = 1024, max = 2 ^ 40, default = 100 * 1024 * 1024 },
  max_retries = { type = "integer", min = 0, max = 100, default = 3 },
  retry_on_status = { type = "table", check = check_statuses,
                      default = function() return { 502, 503, 504 } end },
  dead_backoff_min = ms(60000),
  dead_backoff_max = ms(1800000),
  resurrect = { type = "boolean", default = true },
  tls_verify = { type = "boolean", default = true },
  ca_file = { type = "string", nonempty = true, check = bounded(1023, no_nul) },
  headers = { type = "table", check = check_headers },
  name = { type = "string", nonempty = true, check = options.utf8_text },
}

local Client = {}
Client.__index = Client
_M.Client = Client

local Pending = {}
Pending.__index = Pending

-- The longest path and headers a request may have: a request head is at most 1 MiB (src/config.h
-- ESX_MAX_HEAD; libcurl's own limit is the same), of which the lines esx writes itself (the
-- request line's method and node prefix, Host, User-Agent, Accept, Authorization,
-- Content-Length, ...) take under 4 KiB, and libcurl copies a body under 64 KiB into the same
-- buffer.  Past it libcurl answered "Out of memory", the core "internal"; a caller's mistake,
-- as Elasticsearch refuses a request line over 4 KiB and headers over 16 KiB anyway.
local MAX_HEAD = 1048576 - 4096 - 65536

--- esx.client(opts) -> client.  Raises on a bad option; returns nil, err when the engine
-- cannot start.
function _M.new(opts)
  local o = options.check("esx.client", _M.schema, opts, 3)
  if o.password and not o.username then
    error("esx.client: bad option 'password' (given without 'username')", 2)
  end
  -- credentials in a node URL are a username/password too: both would be sent, one ignored
  local in_url
  for _, h in ipairs(o.hosts) do
    local userinfo = (h:match("^%a+://([^/?#]*)") or ""):match("^(.*)@")
    if userinfo then
      userinfo = userinfo:gsub("%%(%x%x)", function(x) return string.char(tonumber(x, 16)) end)
      if userinfo:find("^:.") then
        -- a password without a user name would be dropped without a word (no credentials)
        error("esx.client: bad option 'hosts' (a node URL has a password without a user name)", 2)
      end
      -- the first URL's would go to every node: another node's password to this one
      if in_url and in_url ~= userinfo then
        error("esx.client: bad option 'hosts' (node URLs with different credentials: one client " ..
              "sends one set to every node)", 2)
      end
      in_url = userinfo
    end
  end
  if in_url and o.username then
    error("esx.client: bad option 'username' (credentials are in a node URL too: use one)", 2)
  end
  if o.api_key and (o.username or in_url) then
    error("esx.client: bad option 'api_key' (use either api_key or username/password)", 2)
  end
  if o.dead_backoff_max < o.dead_backoff_min then
    error("esx.client: bad option 'dead_backoff_max' (must be >= dead_backoff_min)", 2)
  end
  local c, err = core.client_new(o)
  if not c then return nil, err end
  -- o is not kept: it holds the credentials (username, password, api_key, a node URL's
  -- user:pass), which live only in the C config from here on, so that no Lua field of the
  -- client -- open or closed -- shows them to a serializer or a log of the table
  -- bytes the client's own headers add to every request head (see MAX_HEAD)
  local head_bytes = 0
  for k, v in pairs(o.headers or {}) do head_bytes = head_bytes + #k + #v + 4 end
  if head_bytes > MAX_HEAD then
    error("esx.client: bad option 'headers' (longer than " .. MAX_HEAD .. " bytes in all)", 2)
  end
  local self = setmetatable({ c = c, head_bytes = head_bytes,
                              http_failures = { http = 0, not_found = 0, decode = 0 } }, Client)
  self.name = registry.add(self, "client", o.name, Client.stats)
  return self
end

-- Nginx: the phases in which a request handler may yield on a cosocket.
local yieldable_phase = { rewrite = true, server_rewrite = true, access = true, content = true,
                          timer = true, ssl_cert = true, ssl_session_fetch = true,
                          ssl_client_hello = true }

local function can_yield()
  local ngx = rawget(_G, "ngx")
  if not ngx or not ngx.get_phase then return false end
  return yieldable_phase[ngx.get_phase()] == true
end
_M.can_yield = can_yield

-- Waits for a pending request without blocking nginx when possible.
local function await(p, timeout)
  if can_yield() then
    return require("esx.nginx").await(p, timeout)
  end
  return p:wait(timeout)
end

local function error_summary(body)
  local doc = cjson.decode(body or "")
  if type(doc) == "table" and type(doc.error) == "table" then
    local e = doc.error
    return tostring(e.type) .. ": " .. tostring(e.reason)
  elseif type(doc) == "table" and type(doc.error) == "string" then
    return doc.error
  end
  return nil
end

-- s cut to at most n bytes (at a UTF-8 character's start) with "..." when it was longer: a
-- path or an error reason in an err.message, which ends up in logs (err.body keeps it all)
local function clip(s, n)
  if #s <= n then return s end
  while n > 0 and (byte(s, n + 1) or 0) >= 0x80 and byte(s, n + 1) < 0xC0 do n = n - 1 end
  return s:sub(1, n) .. "..."
end

-- Turns a raw response into res or nil, err per ok_status.
local function check_status(self, res, method, path, ok_status)
  local status = res.status
  if status >= 200 and status < 300 then return res end
  if ok_status then
    -- pairs, as the option's check: a hole ({409, nil, 404}) must not hide the statuses after it
    for _, s in pairs(ok_status) do
      if s == status then return res end
    end
  end
  local kind = status == 404 and "not_found" or "http"
  self.http_failures[kind] = self.http_failures[kind] + 1
  local summary = error_summary(res.body)
  return nil, new_error(kind, format("%s %s: HTTP %d%s", method, clip(path, 200), status,
    summary and (" " .. clip(summary, 400)) or ""), { status = status, body = res.body, node = res.node,
    headers = res.headers, retries = res.retries })
end

function Pending:ready()
  return self.p:ready()
end

--- pending:wait([timeout_ms]) -> true when done, false when timeout_ms passed first.
function Pending:wait(timeout)
  -- checked here, not only in C, so that the error points at the caller's line, not this one
  if timeout ~= nil and type(timeout) ~= "number" then
    error("bad argument #1 to 'wait' (number expected, got " .. type(timeout) .. ")", 2)
  elseif timeout ~= timeout then
    error("bad argument #1 to 'wait' (timeout is NaN)", 2)
  end
  return self.p:wait(timeout)
end

--- pending:result() -> res | nil, err.  Before the request is done: nil, nil.
-- The outcome is kept: reading it again must not count an HTTP failure again in stats.
function Pending:result()
  local o = self.outcome
  if not o then
    local res, err = self.p:result()
    if res then
      res, err = check_status(self.client, res, self.method, self.path, self.ok_status)
    elseif err == nil then
      return nil -- not done yet
    end
    o = { res, err }
    self.outcome = o
  end
  return o[1], o[2]
end

Pending.id = function(self) return self.p:id() end
Pending.waiter_path = function(self) return self.p:waiter_path() end

local violation = options.violation
local RETRIES = { type = "integer", min = 0, max = 100 }
local TIMEOUT = { type = "integer", min = 0, max = MAX_SAFE }

-- Per-call options, each with the reason a value is wrong (nil when it is right): a typo or a
-- value out of range raises, as the constructor's options do, instead of being ignored.
local send_opts = {
  ok_status = function(v)
    if type(v) ~= "table" then return "list of HTTP statuses (100-599) expected" end
    for i, st in pairs(v) do
      if type(i) ~= "number" or not options.is_integer(st) or st < 100 or st > 599 then
        return "list of HTTP statuses (100-599) expected"
      end
    end
    return nil
  end,
  retries = function(v)
    if type(v) == "boolean" then return nil end
    return violation(RETRIES, v)
  end,
  timeout = function(v) return violation(TIMEOUT, v) end,
  headers = function(v)
    if type(v) ~= "table" then return "table expected" end
    local _, why = check_headers(v)
    return why
  end,
  content_type = function(v)
    if type(v) ~= "string" then return "string expected, got " .. type(v) end
    local _, why = no_crlf(v)
    return why
  end,
}
local NO_OPTS = setmetatable({}, { __newindex = function() error("NO_OPTS is read-only", 2) end })
local upper = string.upper

local getinfo = debug.getinfo
-- the source prefix of esx's Lua files ("@/usr/share/lua/5.1/esx/"): this file's directory
local ESX_DIR = getinfo(1, "S").source:match("^(.*[/\\])") or getinfo(1, "S").source

-- Raises msg at the first caller outside esx's Lua files, so that a caller's mistake points
-- at the caller's line whichever method it went through (c:send, c:search, bi:add, ...).
local function raise(msg)
  local level = 2
  while true do
    local info = getinfo(level, "S")
    if not info or info.source:sub(1, #ESX_DIR) ~= ESX_DIR then break end
    level = level + 1
  end
  error(msg, level)
end

local function encode_body(body, fname)
  if body == nil or type(body) == "string" then return body end
  if type(body) == "table" then
    local s, err, why = json_encode(body)
    if not s then return nil, err, why end
    return s
  end
  -- (named as the encoding failure below: the body is argument #3 of request, #2 of search)
  raise("bad body to '" .. fname .. "' (string or table expected, got " .. type(body) .. ")")
end

-- header lines "Name: value" of a call's headers, and the bytes they add to the head
local function header_lines(h)
  if not h then return nil, 0 end
  local lines, n = {}, 0
  for k, v in pairs(h) do
    local line = k .. ": " .. v
    lines[#lines + 1] = line
    n = n + #line + 2
  end
  return lines, n
end

-- c:send, and every method through it; fname names the method the caller called.
local function send(self, fname, method, path, body, opts)
  if type(method) ~= "string" then raise("bad argument #1 to '" .. fname .. "' (string expected)") end
  if type(path) ~= "string" then raise("bad argument #2 to '" .. fname .. "' (string expected)") end
  if opts ~= nil then
    if type(opts) ~= "table" then raise("bad options to '" .. fname .. "' (table expected)") end
    -- of several bad options the first in string order is named, the same in every run (pairs()
    -- order differs between flavours and, strings' hashes being seeded at random, runs)
    local bad, bad_why
    for k, v in pairs(opts) do
      local check = send_opts[k]
      local why = not check and "unknown option" or check(v)
      if why and (bad == nil or tostring(k) < bad) then bad, bad_why = tostring(k), why end
    end
    if bad then raise("bad option '" .. bad .. "' to '" .. fname .. "' (" .. bad_why .. ")") end
  else
    opts = NO_OPTS
  end
  local encoded, err, why = encode_body(body, fname)
  if body ~= nil and not encoded then
    if why == "nomem" then -- esx's failure, not the body's: a call's error, counted as one
      local f = self.http_failures
      f.internal = (f.internal or 0) + 1
      return nil, new_error("internal", "out of memory encoding the body as JSON")
    end
    raise("bad body to '" .. fname .. "' (cannot be encoded as JSON: " .. tostring(err) .. ")")
  end
  local retries = opts.retries
  if retries == false then retries = 0 elseif retries == true then retries = nil end
  method = upper(method)
  -- (the core checks these too, but would name its own 'send' and argument numbers)
  if #method > 15 or not find(method, "^%u+$") then
    raise("bad argument #1 to '" .. fname .. "' (method must be 1-15 letters)")
  end
  -- '#' too: no request target holds one, and libcurl cuts the path there as a fragment
  -- (DELETE /idx/_doc/a#b would delete a)
  if byte(path, 1) ~= 47 or find(path, "[%z\1-\32\127#]") then
    raise("bad argument #2 to '" .. fname .. "' (path must start with '/' and contain no " ..
          "spaces, control characters or '#' (percent-encode it as %23))")
  end
  local lines, head = header_lines(opts.headers)
  head = head + #path + self.head_bytes + (opts.content_type and #opts.content_type or 0)
  -- bytes outside ASCII go out percent-encoded, three for one: counted only when that could
  -- matter (a common path is far below the bound even if every byte were encoded)
  if head + 2 * #path > MAX_HEAD then head = head + 2 * select(2, gsub(path, "[\128-\255]", "")) end
  if head > MAX_HEAD then
    raise("bad argument #2 to '" .. fname .. "' (path and headers longer than " .. MAX_HEAD ..
          " bytes)")
  end
  local p, serr = self.c:send(method, path, encoded, opts.content_type, lines, retries,
    opts.timeout)
  if not p then
    -- a call refused before the engine had it (no engine could be built: internal) ended
    -- with that kind too; the engine never saw it, so it is counted here
    local f = self.http_failures
    f[serr.kind] = (f[serr.kind] or 0) + 1
    return nil, serr
  end
  return setmetatable({ p = p, client = self, method = method, path = path,
                        ok_status = opts.ok_status }, Pending)
end

--- c:send(method, path, body?, opts?) -> pending | nil, err  (asynchronous)
-- opts: ok_status = {404, ...}, retries = n | false, timeout = ms, headers = {name = value},
-- content_type = "...".
function Client:send(method, path, body, opts)
  return send(self, "send", method, path, body, opts)
end

-- Sends, then waits for the answer -> the pending request, done | nil, err (not sent, or the
-- nginx waiter failed: then the request goes on).
local function sent(self, fname, method, path, body, opts)
  local p, err = send(self, fname, method, path, body, opts)
  if not p then return nil, err end
  local _, werr = await(p)
  if not p:ready() then return nil, werr end
  return p
end

--- c:request(method, path, body?, opts?) -> res = {status, headers, body} | nil, err
function Client:request(method, path, body, opts)
  local p, err = sent(self, "request", method, path, body, opts)
  if not p then return nil, err end
  return p:result()
end

-- A response that is not what the call reads (not JSON, not an object, no count, ...): counted
-- with the decode failures, and returned as nil, err of kind "decode" with the response's
-- status, body and node.
local function decode_failure(self, res, message)
  self.http_failures.decode = self.http_failures.decode + 1
  return nil, new_error("decode", message, { status = res.status, body = res.body, node = res.node })
end

local function decode(self, res, err)
  if not res then return nil, err end
  if res.body == "" then return {} end
  local doc, derr = json_decode(res.body)
  if doc == nil then return decode_failure(self, res, "response is not valid JSON: " .. derr.message) end
  return doc
end

--- pending:json() -> the result's body decoded as JSON (as c:search decodes) | nil, err.
-- Before the request is done: nil, nil.  An empty body decodes to {}.
function Pending:json()
  local o = self.json_outcome
  if o then return o[1], o[2] end
  local doc = self.p:json_body() -- a 2xx body decoded in C, without the res table
  if doc ~= false then return doc end
  -- an error or a body that is not JSON: kept, so that it is counted once (as result())
  local derr
  doc, derr = decode(self.client, self:result())
  self.json_outcome = { doc, derr }
  return doc, derr
end

-- The decoded response of a call that must answer an object or an array (a search, a
-- document, ...): a JSON scalar is no such answer -- 5 came back as the "response table",
-- false as false, nil (no error at all).
local function decoded_table(self, p)
  local doc, err = p:json()
  if doc == nil then return nil, err end
  if type(doc) ~= "table" then
    return decode_failure(self, p:result(), "response is JSON but not an object or array")
  end
  return doc
end

local function call(self, fname, method, path, body, opts)
  local p, err = sent(self, fname, method, path, body, opts)
  if not p then return nil, err end
  return decoded_table(self, p)
end

local function percent(c) return format("%%%02X", byte(c)) end

-- Elasticsearch index names: lowercase, not "." or "..", no \ / * ? " < > | space , #,
-- not starting with - _ +, at most 255 bytes.  Wildcards and lists are allowed where
-- ES allows them (search, count, refresh).
local function check_index(index, argn, fname, allow_multi)
  if type(index) == "table" and allow_multi then
    local parts = {}
    for i, v in ipairs(index) do parts[i] = check_index(v, argn, fname, true) end
    if #parts == 0 then raise(format("bad argument #%d to '%s' (empty index list)", argn, fname)) end
    return concat(parts, ",")
  end
  if type(index) ~= "string" then
    raise(format("bad argument #%d to '%s' (index name expected, got %s)", argn, fname, type(index)))
  end
  local bad = index == "" or index == "." or index == ".." or #index > 255 or
    index:find('[\\/?"<>| ,#%c%u]') or index:find("^[-_+]")
  if bad and allow_multi then
    -- (never "." or "..": "/../_search" is "/_search" to libcurl and to proxies, every index)
    bad = index == "" or index == "." or index == ".." or index:find('[\\/?"<>| #%c%u]') or
      index:find("^[-+]") and not index:find("^%-[%w*]")
  end
  if not allow_multi and index:find("*", 1, true) then bad = true end
  if bad then
    raise(format("bad argument #%d to '%s' (invalid index name %q)", argn, fname, index))
  end
  -- '%' is legal in index names, but sent raw the server decodes it ("r%61w" is "raw", another
  -- index); '+' some servers read as a space; bytes past ASCII Elasticsearch reads as Latin-1
  return (gsub(index, "[^%w%-%._~*:,]", percent))
end
_M.check_index = check_index

-- A number id as text: an integer in decimal digits, exactly ("%.17g" turned 2^53 + 1, a Lua
-- 5.4 integer, into ...992, another document, and 2^60 into "1.152921504606847e+18"), another
-- number in the fewest digits that read back the same.
local function number_id(n)
  if n == floor(n) and n >= -2 ^ 63 and n < 2 ^ 63 then return format("%d", n) end
  if n ~= n or n == math.huge or n == -math.huge then return nil end
  for digits = 15, 16 do
    local s = format("%." .. digits .. "g", n)
    if tonumber(s) == n then return s end
  end
  return format("%.17g", n)
end

local function escape_id(id, argn, fname)
  local t = type(id)
  if t == "number" then id = number_id(id) end
  if type(id) ~= "string" or id == "" then
    raise(format("bad argument #%d to '%s' (document id expected)", argn, fname))
  end
  if #id > 512 then raise(format("bad argument #%d to '%s' (id longer than 512 bytes)", argn, fname)) end
  -- "." and ".." as they are would be dot segments: "/docs/_doc/.." is "/docs/" to libcurl and
  -- to a proxy that normalizes paths (DELETE it, and the index is gone)
  if id == "." or id == ".." then return (gsub(id, "%.", "%%2E")) end
  return (gsub(id, "[^%w%-%._~]", percent))
end

local function search_path(index, endpoint, fname)
  if index == nil then return "/" .. endpoint end
  return "/" .. check_index(index, 1, fname, true) .. "/" .. endpoint
end

--- c:search(index, query) -> decoded response | nil, err
function Client:search(index, query, opts)
  return call(self, "search", "POST", search_path(index, "_search", "search"), query or {}, opts)
end

--- c:count(index, query) -> count, decoded response | nil, err
function Client:count(index, query, opts)
  local p, err = sent(self, "count", "POST", search_path(index, "_count", "count"), query or {}, opts)
  if not p then return nil, err end
  local doc, derr = decoded_table(self, p)
  if not doc then return nil, derr end
  -- a 2xx without a count (an empty body, a proxy's own answer) must fail as a run-time
  -- failure does: nil and the response in err's place was an err without a kind
  local n = doc.count
  if type(n) ~= "number" or n < 0 or n ~= floor(n) then
    return decode_failure(self, p:result(),
      "not a count response: no \"count\" that is a non-negative integer")
  end
  return n, doc
end

--- c:index(index, doc, id?) -> decoded response | nil, err
function Client:index(index, doc, id, opts)
  local name = check_index(index, 1, "index")
  if type(doc) ~= "table" and type(doc) ~= "string" then
    error("bad argument #2 to 'index' (document table or JSON string expected)", 2)
  end
  if id == nil then return call(self, "index", "POST", "/" .. name .. "/_doc", doc, opts) end
  return call(self, "index", "PUT", "/" .. name .. "/_doc/" .. escape_id(id, 3, "index"), doc, opts)
end

--- c:get(index, id) -> decoded document | nil, err (kind "not_found" on 404)
function Client:get(index, id, opts)
  return call(self, "get", "GET", "/" .. check_index(index, 1, "get") .. "/_doc/" .. escape_id(id, 2, "get"),
    nil, opts)
end

--- c:delete(index, id) -> decoded response | nil, err (kind "not_found" on 404)
function Client:delete(index, id, opts)
  return call(self, "delete", "DELETE",
    "/" .. check_index(index, 1, "delete") .. "/_doc/" .. escape_id(id, 2, "delete"), nil, opts)
end

--- c:refresh(index?) -> decoded response | nil, err
function Client:refresh(index, opts)
  return call(self, "refresh", "POST", search_path(index, "_refresh", "refresh"), nil, opts)
end

--- c:health() -> decoded cluster health | nil, err
function Client:health(opts)
  return call(self, "health", "GET", "/_cluster/health", nil, opts)
end

--- c:info() -> decoded root info | nil, err
function Client:info(opts)
  return call(self, "info", "GET", "/", nil, opts)
end

-- -> the line | nil, "nomem" (out of memory: esx's failure, returned, not raised).  A value
-- that cannot be JSON raises, naming operation i (1-based), what (metadata or document) and
-- the encoder's reason, as c:request's message does.
local function encode_line(t, i, what)
  local s, err, why = json_encode(t)
  if not s then
    if why == "nomem" then return nil, why end
    error(format("bad argument #1 to 'bulk' (operation %d: %s cannot be encoded as JSON: %s)", i, what,
      tostring(err)), 4)
  end
  return s
end

local bulk_actions = { index = true, create = true, update = true, delete = true }

--- Builds an NDJSON bulk body from a list of {action, meta, doc} -> body, number of operations
-- (nil for an NDJSON string: its operations are not parsed); nil, err (kind internal) when
-- memory runs out encoding them.
function _M.bulk_body(ops)
  if type(ops) == "string" then
    -- as for an empty list: a request without an operation is the caller's mistake
    if not find(ops, "%S") then error("bad argument #1 to 'bulk' (no operations)", 3) end
    if ops:sub(-1) ~= "\n" then ops = ops .. "\n" end
    return ops
  end
  if type(ops) ~= "table" then error("bad argument #1 to 'bulk' (NDJSON string or list expected)", 3) end
  local lines = {}
  -- every entry is an operation: ipairs would stop at a hole ({op1, nil, op3}) and send the
  -- operations before it as if they were all, without a word about the rest
  local n = 0
  for k in pairs(ops) do
    if type(k) ~= "number" or k < 1 or k % 1 ~= 0 then
      -- (c:bulk({op, refresh = true}): the options' place is the second argument)
      error(format("bad argument #1 to 'bulk' (key %s is not an operation's place in the list; " ..
        "options go in the second argument)", type(k) == "string" and ("'" .. k .. "'") or tostring(k)), 3)
    end
    n = n + 1
  end
  for i = 1, n do
    local op = ops[i]
    if type(op) ~= "table" then
      error(format("bad argument #1 to 'bulk' (operation %d: {action, meta, doc} expected, got %s)",
        i, type(op)), 3)
    end
    local action, meta, doc = op[1], op[2], op[3]
    if not bulk_actions[action] then
      error(format("bad argument #1 to 'bulk' (operation %d: unknown action %s)", i, tostring(action)), 3)
    end
    if type(meta) ~= "table" then
      error(format("bad argument #1 to 'bulk' (operation %d: metadata table expected)", i), 3)
    end
    if meta._index then check_index(meta._index, 1, "bulk") end
    local line = encode_line({ [action] = meta }, i, "metadata")
    if not line then return nil, new_error("internal", "out of memory encoding the operations") end
    lines[#lines + 1] = line
    if action == "delete" and doc ~= nil then
      -- (a document here is a mistake: it would not be sent, and nothing would say so)
      error(format("bad argument #1 to 'bulk' (operation %d: delete takes no document)", i), 3)
    end
    if action ~= "delete" then
      if doc == nil then
        error(format("bad argument #1 to 'bulk' (operation %d: %s needs a document)", i, action), 3)
      end
      if type(doc) ~= "table" and type(doc) ~= "string" then
        error(format("bad argument #1 to 'bulk' (operation %d: document table or JSON string expected, got %s)",
          i, type(doc)), 3)
      end
      if type(doc) == "string" and doc:find("\n", 1, true) then
        -- a newline ends the NDJSON line: the rest would be read as further operations
        error(format("bad argument #1 to 'bulk' (operation %d: document contains a newline)", i), 3)
      end
      line = type(doc) == "string" and doc or encode_line(doc, i, "document")
      if not line then return nil, new_error("internal", "out of memory encoding the operations") end
      lines[#lines + 1] = line
    end
  end
  if #lines == 0 then error("bad argument #1 to 'bulk' (no operations)", 3) end
  return concat(lines, "\n") .. "\n", n
end

local refresh_values = { [true] = "true", [false] = "false", ["true"] = "true", ["false"] = "false",
                         wait_for = "wait_for" }

--- c:bulk(ops, opts?) -> {took=, errors=bool, items={...}} | nil, err
function Client:bulk(ops, opts)
  local body, n = _M.bulk_body(ops)
  if not body then -- n: the error (out of memory)
    local f = self.http_failures
    f.internal = (f.internal or 0) + 1
    return nil, n
  end
  if opts ~= nil and type(opts) ~= "table" then error("bad argument #2 to 'bulk' (table expected)", 2) end
  local o = { content_type = "application/x-ndjson" }
  for k, v in pairs(opts or NO_OPTS) do o[k] = v end
  local path = "/_bulk"
  if o.index then path = "/" .. check_index(o.index, 2, "bulk") .. "/_bulk"; o.index = nil end
  if o.refresh ~= nil then
    local r = refresh_values[o.refresh]
    if not r then error("bad option 'refresh' to 'bulk' (true, false or \"wait_for\" expected)", 2) end
    path = path .. "?refresh=" .. r
    o.refresh = nil
  end
  local p, err = sent(self, "bulk", "POST", path, body, o)
  if not p then return nil, err end
  local doc, derr = decoded_table(self, p)
  if not doc then return nil, derr end
  -- A 2xx that is not a bulk response -- an empty body ({}), no "items", or (for a list) not one
  -- result per operation -- must not read as "no errors": what became of the operations is
  -- unknown.
  local items = doc.items
  if type(items) ~= "table" or n and #items ~= n then
    local res = p:result()
    if res and res.status >= 200 and res.status < 300 then
      return decode_failure(self, res, type(items) ~= "table" and "not a bulk response: no \"items\" list"
        or format("bulk response lists %d results for %d operations", #items, n))
    end
  end
  return doc
end

--- c:bulk_indexer(opts) -> a bulk indexer for big loads (see lua/esx/bulk.lua)
function Client:bulk_indexer(opts)
  -- (not a tail call: the indexer's option errors name the line that called this method)
  local bi, err = require("esx.bulk").new(self, opts)
  return bi, err
end

--- c:stats() -> counters, pool state, bytes and nodes
function Client:stats()
  local s, err = self.c:stats()
  if not s then return nil, err end
  -- responses that were not JSON count with the engine's own decode failures (gzip, size)
  for k, v in pairs(self.http_failures) do s.failures[k] = (s.failures[k] or 0) + v end
  return s
end

--- c:close() -- stops the engine; unfinished requests fail with kind "closed".
function Client:close()
  self.c:close()
  registry.remove(self)
end

function Client:__tostring()
  return "esx.client: " .. (self.name or "?")
end

-- Test hook: the I/O thread dies as if it had crashed; the next call rebuilds it.
function Client:_kill_io_thread()
  self.c:debug_kill_io_thread()
end

-- esx.client(opts), as the module is reached from require "esx": the module called is new(opts)
-- (a tail call: option errors still point at the caller's line)
setmetatable(_M, { __call = function(_, opts) return _M.new(opts) end })

-- c.search(...) / p.wait(...) with '.' raise "bad self to 'search' (...)" (see options.lua)
options.guard_methods(Client, "esx.client", "c")
options.guard_methods(Pending, "esx pending request", "pending")

return _M
