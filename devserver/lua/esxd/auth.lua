-- esxd.auth: HTTP authentication like ES security: Basic user:password, or
-- "ApiKey base64(id:key)" where id:key is the same user:password pair. Returns nil when the
-- request may proceed, else a 401 security_exception error value.
local errors = require "esxd.errors"
local config = require "esxd.config"

local _M = {}
local CHALLENGE = 'Basic realm="security" charset="UTF-8"'

local function fail(reason)
  return errors.new(401, "security_exception", reason,
    { "header", { ["WWW-Authenticate"] = { CHALLENGE, "ApiKey" } } },
    { headers = { ["WWW-Authenticate"] = CHALLENGE } })
end

function _M.check(authz, path)
  if not config.user then return nil end
  if not authz or authz == "" then
    return fail("missing authentication credentials for REST request [" .. path .. "]")
  end
  local scheme, cred = authz:match("^(%S+)%s+(%S+)%s*$")
  scheme = scheme and scheme:lower()
  local decoded = cred and ngx.decode_base64(cred)
  local expected = config.user .. ":" .. (config.password or "")
  if scheme == "basic" then
    if decoded == expected then return nil end
    local user = decoded and decoded:match("^([^:]*)") or ""
    return fail("unable to authenticate user [" .. user .. "] for REST request [" .. path .. "]")
  elseif scheme == "apikey" then
    if decoded == expected then return nil end
    return fail("unable to authenticate with provided credentials and anonymous access is not allowed for this request")
  end
  return fail("missing authentication credentials for REST request [" .. path .. "]")
end

return _M
