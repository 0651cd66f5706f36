-- esxd.faults: the ordered list of fault-injection rules set through POST /_esx/faults.
-- match() returns the first rule for a request and consumes one of its uses.
local json = require "esxd.json"

local _M = {}
local rules = {}
local next_id = 0

local FIELDS = { path = "string", method = "string", count = "number", status = "number", headers = "table",
  stall_ms = "number", drip = "table", close_after_bytes = "number", reset_after_bytes = "number",
  corrupt_gzip = "boolean", gzip_members = "number", empty_reply = "boolean", endless = "boolean", item_status = "number",
  item_count = "number" }

-- Validate and append a rule. Returns id or nil, message.
function _M.add(spec)
  if type(spec) ~= "table" then return nil, "fault spec must be a JSON object" end
  for k, v in pairs(spec) do
    if k == "body" then
      if type(v) ~= "string" and type(v) ~= "table" then return nil, "[body] must be a string or an object" end
    elseif not FIELDS[k] then
      return nil, "unknown fault field [" .. tostring(k) .. "]"
    elseif type(v) ~= FIELDS[k] then
      return nil, "fault field [" .. k .. "] must be a " .. FIELDS[k]
    end
  end
  if spec.path == nil then return nil, "fault field [path] is required (an exact path or \"*\")" end
  if spec.drip and (type(spec.drip.bytes) ~= "number" or spec.drip.bytes < 1 or type(spec.drip.interval_ms) ~= "number") then
    return nil, "[drip] needs numeric bytes (>= 1) and interval_ms"
  end
  if spec.gzip_members and (spec.gzip_members < 1 or spec.gzip_members > 64 or spec.gzip_members % 1 ~= 0) then
    return nil, "[gzip_members] must be an integer 1..64"
  end
  if spec.status and (spec.status < 100 or spec.status > 599) then return nil, "[status] must be 100..599" end
  if spec.item_status and (spec.item_status < 100 or spec.item_status > 599) then return nil, "[item_status] must be 100..599" end
  next_id = next_id + 1
  local rule = {}
  for k, v in pairs(spec) do rule[k] = v end
  rule.id = next_id
  rule.count = spec.count or 1
  rule.applied = 0
  if rule.method then rule.method = rule.method:upper() end
  rules[#rules + 1] = rule
  return next_id
end

function _M.clear() rules = {} end

function _M.list()
  local out = json.array()
  for _, r in ipairs(rules) do out[#out + 1] = r end
  return out
end

function _M.match(method, path)
  for i, r in ipairs(rules) do
    if (r.path == "*" or r.path == path) and (r.method == nil or r.method == method) then
      r.applied = r.applied + 1
      if r.count > 0 then
        r.count = r.count - 1
        if r.count == 0 then table.remove(rules, i) end
      end
      return r
    end
  end
  return nil
end

-- Default ES-shaped body for an injected status.
local TYPES = {
  [400] = { "illegal_argument_exception", "injected fault" },
  [401] = { "security_exception", "injected fault: authentication required" },
  [403] = { "security_exception", "injected fault: action is unauthorized" },
  [404] = { "resource_not_found_exception", "injected fault: not found" },
  [409] = { "version_conflict_engine_exception", "injected fault: version conflict" },
  [413] = { "content_too_long_exception", "injected fault: request too large" },
  [429] = { "es_rejected_execution_exception", "rejected execution of coordinating operation [injected fault]" },
  [500] = { "exception", "injected fault: internal error" },
  [502] = { "exception", "injected fault: bad gateway" },
  [503] = { "cluster_block_exception", "blocked by: [SERVICE_UNAVAILABLE/1/state not recovered / initialized];" },
  [504] = { "exception", "injected fault: gateway timeout" },
}
function _M.default_error(status)
  local t = TYPES[status] or { "exception", "injected fault: status " .. status }
  return t[1], t[2]
end

return _M
