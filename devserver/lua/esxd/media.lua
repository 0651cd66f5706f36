-- esxd.media: the Accept and Content-Type headers as Elasticsearch 8 reads them
-- (RestRequest, ParsedMediaType, XContentType, RestCompatibleVersionHelper,
-- AbstractRestChannel.newBuilder): header syntax, the REST API compatibility version
-- (compatible-with=N), the format of a request body and the response Content-Type.
local errors = require "esxd.errors"

local _M = {}

local CURRENT, MINIMUM = 8, 7   -- RestApiVersion.current() / minimumSupported() in ES 8

local VND = "application/vnd.elasticsearch+"

-- XContentType's registry (type/subtype -> format); the vendor types take a numeric
-- compatible-with parameter (VERSION_PATTERN \d+).
local FORMATS = {
  ["application/json"] = "json", ["application/x-ndjson"] = "json", ["application/*"] = "json",
  ["application/smile"] = "smile", ["application/yaml"] = "yaml", ["application/cbor"] = "cbor",
  [VND .. "json"] = "vnd_json", [VND .. "x-ndjson"] = "vnd_json", [VND .. "smile"] = "vnd_smile",
  [VND .. "yaml"] = "vnd_yaml", [VND .. "cbor"] = "vnd_cbor",
}
local TYPE_OF = { json = "application/json", vnd_json = VND .. "json" }   -- mediaTypeWithoutParameters
local NAMES = { smile = "Smile", yaml = "YAML", cbor = "CBOR", vnd_smile = "Smile", vnd_yaml = "YAML", vnd_cbor = "CBOR" }

local TCHAR = "^[%w!#$%%&'*+%-.^_`|~]+$"   -- RFC 7230 tchar

-- Java's String.split(literal): trailing empty strings are dropped.
local function split(s, sep_pattern)
  local parts, pos = {}, 1
  while true do
    local a, b = s:find(sep_pattern, pos)
    if not a then parts[#parts + 1] = s:sub(pos); break end
    parts[#parts + 1] = s:sub(pos, a - 1)
    pos = b + 1
  end
  while #parts > 0 and parts[#parts] == "" do parts[#parts] = nil end
  return parts
end

local function trim(s) return (s:gsub("^%s+", ""):gsub("%s+$", "")) end

-- ParsedMediaType.parseMediaType: nil for a media range (a comma) or */*, else
-- {raw, type, params = {name = value}, order = {names}}; errors like ES's IllegalArgumentException.
local function parse(raw)
  if raw:find(",", 1, true) or raw == "*/*" then return nil end
  local elements = split(raw:lower(), "%s*;")
  local ts = split(elements[1] or "", "/")
  if not (#ts == 2 and trim(ts[1]):match(TCHAR) and trim(ts[2]):match(TCHAR)) then
    return nil, "invalid media-type [" .. raw .. "]"
  end
  local mt = { raw = raw, type = trim(ts[1]) .. "/" .. trim(ts[2]), params = {}, order = {} }
  for i = 2, #elements do
    local p = trim(elements[i])
    if p ~= "" then
      local kv = split(p, "=")
      if #kv ~= 2 or kv[1] == "" or kv[1]:match("%s$") or kv[2] == "" or kv[2]:match("^%s") then
        return nil, "invalid parameters for header [" .. raw .. "]"
      end
      local k = trim(kv[1])
      if mt.params[k] == nil then mt.order[#mt.order + 1] = k end
      mt.params[k] = trim(kv[2])
    end
  end
  return mt
end

-- ParsedMediaType.toMediaType: the format, or nil for an unknown type or a vendor type whose
-- compatible-with is not a number.
local function format_of(mt)
  local f = mt and FORMATS[mt.type]
  if f and f:sub(1, 4) == "vnd_" and mt.params["compatible-with"] and not mt.params["compatible-with"]:match("^%d+$") then
    return nil
  end
  return f
end

-- RestRequest.parseHeaderWithMediaType for one header.
local function read_header(headers, name)
  local v = headers[name:lower()]
  if v == nil then return nil end
  if type(v) == "table" then
    if #v > 1 then return nil, "Incorrect header [" .. name .. "]. Only one value should be provided" end
    v = v[1]
  end
  if not v:find("%S") then return nil, "Header [" .. name .. "] cannot be empty." end
  return parse(v)
end

-- RestRequest.MediaTypeHeaderException as ES renders it: the cause is nested, the root
-- cause is the header exception itself.
local function header_error(names, cause_type, reason)
  return errors.new(400, "media_type_header_exception", "Invalid media-type value on headers [" .. names .. "]",
    nil, { caused_by = { type = cause_type, reason = reason } })
end

-- RestCompatibleVersionHelper.parseVersion (Byte.parseByte). Returns version or nil, error.
local function version_of(mt, name)
  local s = mt and mt.params["compatible-with"]
  if s == nil then return nil end
  local n = s:match("^[+-]?%d+$") and tonumber(s)
  if not n then return nil, header_error(name, "number_format_exception", 'For input string: "' .. s .. '"') end
  if n < -128 or n > 127 then
    return nil, header_error(name, "number_format_exception", 'Value out of range. Value:"' .. s .. '" Radix:10')
  end
  return n
end

local function raw(mt) return mt and mt.raw or "null" end

-- RestCompatibleVersionHelper.getCompatibleVersion: the REST API version, or nil, error.
local function compatible_version(accept, ctype, has_body)
  local av, aerr = version_of(accept, "Accept")
  if aerr then return nil, aerr end
  local cv, cerr = version_of(ctype, "Content-Type")
  if cerr then return nil, cerr end
  local a, c = av or CURRENT, cv or CURRENT
  local function status(reason) return nil, header_error("Accept, Content-Type", "status_exception", reason) end
  if a > CURRENT or a < MINIMUM then
    return status("Accept version must be either version " .. CURRENT .. " or " .. MINIMUM .. ", but found " .. a ..
      ". Accept=" .. raw(accept))
  end
  if has_body then
    if c > CURRENT or c < MINIMUM then
      return status("Content-Type version must be either version " .. CURRENT .. " or " .. MINIMUM ..
        ", but found " .. c .. ". Content-Type=" .. raw(ctype))
    end
    if a ~= c then
      return status("A compatible version is required on both Content-Type and Accept headers if either one has " ..
        "requested a compatible version and the compatible versions must match. Accept=" .. raw(accept) ..
        ", Content-Type=" .. raw(ctype))
    end
    if (av == nil) ~= (cv == nil) then
      return status("A compatible version is required on both Content-Type and Accept headers if either one has " ..
        "requested a compatible version. Accept=" .. raw(accept) .. ", Content-Type=" .. raw(ctype))
    end
    if c < CURRENT then return MINIMUM end
  end
  if a < CURRENT then return MINIMUM end
  return CURRENT
end

-- AbstractRestChannel.newBuilder: ?format=, else Accept, else the Content-Type's format, else
-- JSON (the parameters always come from Accept). Returns the format and the header it came from.
local function response_format(accept, ctype, format_param)
  local f = format_param and ({ json = "json", vnd_json = "vnd_json" })[format_param:lower()]
  if f then return f end
  if format_of(accept) then return format_of(accept), accept end
  if format_of(ctype) then return format_of(ctype), ctype end
  return "json"
end

local function content_type(f, accept)
  local out = { TYPE_OF[f] or TYPE_OF.json }
  for _, k in ipairs(accept and accept.order or {}) do out[#out + 1] = k .. "=" .. accept.params[k] end
  return table.concat(out, ";")
end

-- Read a request's media headers. Returns {
--   content_type = the response Content-Type,
--   body_format  = the body's format ("json", "vnd_json", ...; nil: not one ES reads),
--   err          = an error value to answer with (a header ES refuses, or one esxd does not implement) }.
function _M.read(headers, has_body, format_param)
  local accept, aerr = read_header(headers, "Accept")
  if aerr then
    -- ES retries without the failed header to build the response
    local ctype = read_header(headers, "Content-Type")
    return { content_type = content_type(response_format(nil, ctype, format_param)),
      err = header_error("Accept", "illegal_argument_exception", aerr) }
  end
  local ctype, cerr = read_header(headers, "Content-Type")
  if cerr then
    return { content_type = content_type(response_format(accept, nil, format_param), accept),
      err = header_error("Content-Type", "illegal_argument_exception", cerr) }
  end
  local version, verr = compatible_version(accept, ctype, has_body)
  if verr then return { content_type = "application/json", err = verr } end
  local f, from = response_format(accept, ctype, format_param)
  local m = { content_type = content_type(f, accept), body_format = format_of(ctype) }
  if version ~= CURRENT or NAMES[m.body_format] or NAMES[f] then m.content_type = "application/json" end
  if version ~= CURRENT then
    -- v7 compatibility changes response shapes (types, total hits as a number, ...)
    m.err = errors.illegal_argument("esxd does not implement REST API compatibility with version " .. version ..
      " (compatible-with=" .. version .. "); send compatible-with=" .. CURRENT .. " or application/json")
  elseif has_body and NAMES[m.body_format] then
    m.err = errors.illegal_argument("esxd reads only JSON request bodies; Content-Type [" .. ctype.raw .. "] (" ..
      NAMES[m.body_format] .. ") is not implemented")
  elseif NAMES[f] then
    m.err = errors.illegal_argument("esxd answers only in JSON; [" .. from.raw .. "] asks for a " .. NAMES[f] ..
      " response, which is not implemented")
  end
  return m
end

return _M
