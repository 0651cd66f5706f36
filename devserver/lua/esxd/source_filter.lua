-- esxd.source_filter: the _source parameter of search/get: false, true, "pattern",
-- ["a", "b.*"], or {"includes": [...], "excludes": [...]}; wildcards allowed.
local json = require "esxd.json"
local names = require "esxd.names"

local _M = {}
local null = json.null

local function is_obj(t) return type(t) == "table" and t ~= null and (next(t) == nil or #t == 0) end

local function as_list(v)
  if v == nil or v == null then return {} end
  if type(v) == "string" then
    local out = {}
    for p in v:gmatch("[^,]+") do out[#out + 1] = p end
    return out
  end
  if type(v) == "table" then return v end
  return {}
end

local function compile(list)
  local out = {}
  for _, p in ipairs(list) do out[#out + 1] = { raw = p, pat = names.glob_to_pattern(p) } end
  return out
end

-- A pattern matches a path, or the path of an object it is under: ES's filter automaton
-- (makeMatchDotsInFieldNames) takes "a" for a dotted key "a.b" too.
local function matches(pats, path)
  for _, p in ipairs(pats) do
    if path:match(p.pat) then return true end
    local i = path:find(".", 1, true)
    while i do
      if path:sub(1, i - 1):match(p.pat) then return true end
      i = path:find(".", i + 1, true)
    end
  end
  return false
end

local function may_match_below(pats, path)
  for _, p in ipairs(pats) do
    if p.raw:find("*", 1, true) or p.raw:sub(1, #path + 1) == path .. "." then return true end
  end
  return false
end

local filt
local function filt_value(v, path, inc, exc)
  if json.is_raw(v) then return v end -- an exact integer (exact_source)
  if is_obj(v) and next(v) ~= nil then return filt(v, path, inc, exc) end
  if type(v) == "table" and v ~= null and #v > 0 then
    local arr = json.array()
    for _, e in ipairs(v) do
      if is_obj(e) and next(e) ~= nil then
        local s = filt(e, path, inc, exc)
        if next(s) ~= nil then arr[#arr + 1] = s end
      else
        arr[#arr + 1] = e
      end
    end
    return arr
  end
  return v
end

filt = function(node, prefix, inc, exc)
  local out = {}
  for k, v in pairs(node) do
    local p = prefix and (prefix .. "." .. k) or k
    if #exc > 0 and matches(exc, p) then
      -- excluded
    elseif #inc == 0 or matches(inc, p) then
      out[k] = filt_value(v, p, {}, exc)
    elseif type(v) == "table" and v ~= null and may_match_below(inc, p) then
      local sub = filt_value(v, p, inc, exc)
      if next(sub) ~= nil then out[k] = sub end
    end
  end
  return out
end

-- Parse a _source spec (body value or URL param). Returns nil for "whole source",
-- false for "no source", or {inc=, exc=}.
function _M.parse(spec, includes_param, excludes_param)
  local inc, exc = {}, {}
  if spec == false or spec == "false" then return false end
  if spec == nil or spec == true or spec == "true" then
    if not includes_param and not excludes_param then return nil end
  elseif is_obj(spec) then
    inc = as_list(spec.includes or spec.include)
    exc = as_list(spec.excludes or spec.exclude)
  else
    inc = as_list(spec)
  end
  if includes_param then inc = as_list(includes_param) end
  if excludes_param then exc = as_list(excludes_param) end
  if #inc == 0 and #exc == 0 then return nil end
  return { inc = compile(inc), exc = compile(exc) }
end

-- The source fetch of an update (FetchSourceContext): nil when the request does not ask for
-- the source, else { filter = spec } (spec nil: the whole source). body_spec: the update
-- body's _source (it replaces the URL parameters, as ES parses the body after them).
function _M.update_fetch(body_spec, spec, includes_param, excludes_param)
  local f
  if body_spec ~= nil then
    f = _M.parse(body_spec)
  elseif spec ~= nil or includes_param ~= nil or excludes_param ~= nil then
    f = _M.parse(spec, includes_param, excludes_param)
  else
    return nil
  end
  if f == false then return nil end
  return { filter = f }
end

-- The record's source for re-serialising: rec.source (doubles, for queries), except that a
-- source holding integers a double cannot hold exactly (beyond 2^53) is decoded again with
-- them kept as their text (json.decode_exact), as ES returns them. Not to be modified.
function _M.exact_source(rec)
  if rec.exact == nil then
    rec.exact = false
    if rec.raw:find("%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d") then rec.exact = json.decode_exact(rec.raw) or false end
  end
  return rec.exact or rec.source
end

-- Returns a JSON-encodable source value for a stored record.
function _M.apply(f, rec)
  if f == nil then return json.raw(rec.raw) end
  return filt(_M.exact_source(rec), nil, f.inc, f.exc)
end

return _M
