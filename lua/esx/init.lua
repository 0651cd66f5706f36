--- esx: an Elasticsearch client pool, a beacon collector and a two-tier article cache
-- for Lua 5.4, LuaJIT 2.1 and nginx/OpenResty.
--
-- This is the public module; the C core is `esx.core`.  Each part is loaded on first use so
-- that `require "esx"` stays cheap in processes that use only one of them.

local core = require "esx.core"
local registry = require "esx.registry"

local _M = {
  version = core.version,
  _VERSION = "esx " .. core.version,
}

--- esx.cache(opts) -> a two-tier article cache (lua/esx/cache.lua, docs/cache.md).
function _M.cache(opts) return require("esx.cache").new(opts) end

--- esx.metrics() -> Prometheus text exposition of every live object's counters.
function _M.metrics()
  return registry.metrics(core.version, core.flavour)
end

return _M
