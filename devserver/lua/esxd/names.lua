-- esxd.names: index name validation and index-expression resolution
-- ("a,b", "events-*", "_all", "*", "-excluded") following Elasticsearch's rules.
local errors = require "esxd.errors"
local json = require "esxd.json"

local _M = {}

local BAD_CHARS = { "\\", "/", "*", "?", '"', "<", ">", "|", " ", ",", "#", ":" }

-- Returns nil if valid, else an invalid_index_name_exception error value.
function _M.validate(name)
  local function bad(why)
    return errors.new(400, "invalid_index_name_exception", "Invalid index name [" .. name .. "], " .. why,
      { "index_uuid", "_na_", "index", name })
  end
  if name == "" then return bad("must not be empty") end
  for _, c in ipairs(BAD_CHARS) do
    if name:find(c, 1, true) and c ~= "#" and c ~= ":" then
      return bad('must not contain the following characters [ , ", *, \\, <, |, ,, >, /, ?]')
    end
  end
  if name:find("#", 1, true) then return bad("must not contain '#'") end
  if name:find(":", 1, true) then return bad("must not contain ':'") end
  local first = name:sub(1, 1)
  if first == "_" or first == "-" or first == "+" then return bad("must not start with '_', '-', or '+'") end
  if #name > 255 then return bad("index name is too long, (" .. #name .. " > 255)") end
  if name == "." or name == ".." then return bad("must not be '.' or '..'") end
  if name ~= name:lower() then return bad("must be lowercase") end
  return nil
end

local function glob_to_pattern(g)
  return "^" .. g:gsub("[%^%$%(%)%%%.%[%]%+%-%?]", "%%%0"):gsub("%*", ".*") .. "$"
end
_M.glob_to_pattern = glob_to_pattern

-- Resolve an index expression against the existing names (a sorted list).
-- opts.ignore_unavailable: drop missing concrete names instead of failing.
-- opts.allow_no_indices (default true): false makes a wildcard matching nothing, and an
-- expression resolving to no index, ES's 404 (IndexNameExpressionResolver.notFoundException).
-- opts.no_wildcards (expand_wildcards=none): wildcards and _all expand to nothing.
-- Returns list of names, or nil, error.
local function not_found(exprs)
  if #exprs == 0 or (#exprs == 1 and exprs[1] == "_all") then
    return errors.new(404, "index_not_found_exception", "no such index [_all] and no indices exist",
      { "resource.type", "index_or_alias", "resource.id", "_all", "index_uuid", "_na_", "index", "_all" })
  end
  if #exprs == 1 then return errors.index_not_found(exprs[1]) end
  local ids = json.array()
  for i, e in ipairs(exprs) do ids[i] = e end
  return errors.new(404, "index_not_found_exception", "no such index [null]",
    { "resource.type", "index_expression", "resource.id", ids })
end

function _M.resolve(expr, existing, opts)
  opts = opts or {}
  local strict = opts.allow_no_indices == false
  if expr == nil or expr == "" or expr == "_all" or expr == "*" then
    local out = {}
    if not opts.no_wildcards then
      for _, n in ipairs(existing) do
        if n:sub(1, 1) ~= "." then out[#out + 1] = n end
      end
    end
    if strict and #out == 0 then return nil, not_found(expr == "*" and { "*" } or {}) end
    return out
  end
  local exprs = {}
  for part in (expr .. ","):gmatch("([^,]*),") do exprs[#exprs + 1] = part end
  local set, out = {}, {}
  local exists = {}
  for _, n in ipairs(existing) do exists[n] = true end
  -- "-x" excludes only after a wildcard (ES's wildcardSeen): "a,-b" names an index "-b"
  local wildcard_seen = false
  for _, part in ipairs(exprs) do
    if part == "" then goto continue end
    local negate = false
    if part:sub(1, 1) == "-" and wildcard_seen then negate = true; part = part:sub(2) end
    -- IndexNameExpressionResolver.validateResourceExpression: only a lone "_all" means every
    -- index; in a list (or excluded) it is a name, and names starting with "_" are refused
    if part:sub(1, 1) == "_" then
      return nil, errors.new(400, "invalid_index_name_exception", "Invalid index name [" .. part ..
        "], must not start with '_'.", { "index_uuid", "_na_", "index", part })
    end
    if part:find("*", 1, true) then
      if opts.no_wildcards then goto continue end
      wildcard_seen = true
      local pat = glob_to_pattern(part)
      local matched = false
      for _, n in ipairs(existing) do
        if n:match(pat) and (part:sub(1, 1) == "." or n:sub(1, 1) ~= ".") then
          matched = true
          if negate then set[n] = nil elseif not set[n] then set[n] = true; out[#out + 1] = n end
        end
      end
      if strict and not matched then return nil, errors.index_not_found(part) end
    elseif negate then
      set[part] = nil
    elseif exists[part] then
      if not set[part] then set[part] = true; out[#out + 1] = part end
    elseif not opts.ignore_unavailable then
      if part:sub(1, 1) == "-" then
        return nil, errors.new(404, "index_not_found_exception", "no such index [" .. part .. "] and if you intended to " ..
          "exclude this index, ensure that you use wildcards that include it before explicitly excluding it",
          { "resource.type", "index_or_alias", "resource.id", part, "index_uuid", "_na_", "index", part })
      end
      return nil, errors.index_not_found(part)
    end
    ::continue::
  end
  local final = {}
  for _, n in ipairs(out) do if set[n] then final[#final + 1] = n end end
  if strict and #final == 0 then return nil, not_found(exprs) end
  return final
end

return _M
