-- esxd.gzip: gzip compress / inflate via LuaJIT FFI to the system libz.
-- inflate caps the inflated size while inflating (never trusts the gzip trailer).
local ffi = require "ffi"

ffi.cdef [[
typedef struct esxd_z_stream_s {
  const unsigned char *next_in; unsigned int avail_in; unsigned long total_in;
  unsigned char *next_out; unsigned int avail_out; unsigned long total_out;
  const char *msg; void *state; void *zalloc; void *zfree; void *opaque;
  int data_type; unsigned long adler; unsigned long reserved;
} esxd_z_stream;
const char *zlibVersion(void);
int deflateInit2_(esxd_z_stream *strm, int level, int method, int windowBits, int memLevel,
                  int strategy, const char *version, int stream_size);
int deflate(esxd_z_stream *strm, int flush);
int deflateEnd(esxd_z_stream *strm);
int inflateInit2_(esxd_z_stream *strm, int windowBits, const char *version, int stream_size);
int inflate(esxd_z_stream *strm, int flush);
int inflateEnd(esxd_z_stream *strm);
]]

local z = ffi.load("z")
local Z_OK, Z_STREAM_END, Z_FINISH, Z_NO_FLUSH, Z_BUF_ERROR = 0, 1, 4, 0, -5
local CHUNK = 65536
local _M = {}

-- gzip-compress a string; returns the compressed string or nil, err.
function _M.compress(s)
  local strm = ffi.new("esxd_z_stream")
  if z.deflateInit2_(strm, 6, 8, 15 + 16, 8, 0, z.zlibVersion(), ffi.sizeof(strm)) ~= Z_OK then
    return nil, "deflateInit failed"
  end
  local out = {}
  local buf = ffi.new("unsigned char[?]", CHUNK)
  strm.next_in = s; strm.avail_in = #s
  while true do
    strm.next_out = buf; strm.avail_out = CHUNK
    local rc = z.deflate(strm, Z_FINISH)
    out[#out + 1] = ffi.string(buf, CHUNK - strm.avail_out)
    if rc == Z_STREAM_END then break end
    if rc ~= Z_OK and rc ~= Z_BUF_ERROR then z.deflateEnd(strm); return nil, "deflate failed" end
  end
  z.deflateEnd(strm)
  return table.concat(out)
end

-- Inflate gzip (or zlib) data. Returns string, or nil, kind, message where kind is
-- "too_large" (output would exceed max) or "corrupt".
function _M.inflate(s, max)
  local strm = ffi.new("esxd_z_stream")
  if z.inflateInit2_(strm, 15 + 32, z.zlibVersion(), ffi.sizeof(strm)) ~= Z_OK then
    return nil, "corrupt", "inflateInit failed"
  end
  local out, total = {}, 0
  local buf = ffi.new("unsigned char[?]", CHUNK)
  strm.next_in = s; strm.avail_in = #s
  while true do
    strm.next_out = buf; strm.avail_out = CHUNK
    local rc = z.inflate(strm, Z_NO_FLUSH)
    local n = CHUNK - strm.avail_out
    total = total + n
    if max and total > max then z.inflateEnd(strm); return nil, "too_large", "inflated body exceeds limit" end
    out[#out + 1] = ffi.string(buf, n)
    if rc == Z_STREAM_END then break end
    if rc ~= Z_OK and not (rc == Z_BUF_ERROR and n > 0) then
      local msg = strm.msg ~= nil and ffi.string(strm.msg) or ("zlib error " .. rc)
      if rc == Z_BUF_ERROR then msg = "unexpected end of compressed stream" end
      z.inflateEnd(strm)
      return nil, "corrupt", msg
    end
  end
  z.inflateEnd(strm)
  return table.concat(out)
end

-- A gzip body that any decoder rejects: a valid gzip header followed by a deflate block of
-- the reserved (invalid) type 3, then the rest of the real compressed bytes.
function _M.corrupt(s)
  local gz = assert(_M.compress(s))
  return gz:sub(1, 10) .. string.char(0xff) .. gz:sub(12)
end

return _M
