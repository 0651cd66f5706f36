-- spec/support/proc.lua -- what this process holds, from /proc/self: for specs that check
-- that objects dropped or closed give their threads and descriptors back.
local lfs = require "lfs"

local _M = {}

--- the process's thread count
function _M.threads()
  local f = assert(io.open("/proc/self/status"))
  local n = tonumber(f:read("*a"):match("Threads:%s*(%d+)"))
  f:close()
  return n
end

--- the process's open descriptors (with the one lfs.dir holds while it lists them)
function _M.fds()
  local n = 0
  for _ in lfs.dir("/proc/self/fd") do n = n + 1 end
  return n
end

return _M
