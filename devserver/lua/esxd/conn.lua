-- esxd.conn: low-level connection control via LuaJIT FFI: make the next close of this
-- request's connection a TCP RST (SO_LINGER {1, 0}). Uses the request pointer from
-- resty.core.base and the leading fields of ngx_http_request_t / ngx_connection_t.
local ffi = require "ffi"
local base = require "resty.core.base"

ffi.cdef [[
typedef struct { uint32_t signature; void *connection; } esxd_ngx_http_request_head_t;
typedef struct { void *data; void *read; void *write; int fd; } esxd_ngx_connection_head_t;
struct esxd_linger { int l_onoff; int l_linger; };
int setsockopt(int sockfd, int level, int optname, const void *optval, unsigned int optlen);
]]

local SOL_SOCKET, SO_LINGER = 1, 13
local _M = {}

function _M.fd()
  local r = base.get_request()
  if r == nil then return nil end
  local req = ffi.cast("esxd_ngx_http_request_head_t *", r)
  local c = ffi.cast("esxd_ngx_connection_head_t *", req.connection)
  return c.fd
end

function _M.set_reset_on_close()
  local fd = _M.fd()
  if not fd then return false end
  local l = ffi.new("struct esxd_linger", 1, 0)
  return ffi.C.setsockopt(fd, SOL_SOCKET, SO_LINGER, l, ffi.sizeof(l)) == 0
end

return _M
