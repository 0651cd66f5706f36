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
  -- JSON arrays a Lua table cannot express by itself (src/ljson_encode.c, docs/client.md
  -- "Table bodies"): a table with this metatable is always an array, [] when empty ...
  array_mt = core.array_mt,
  -- ... and this value (a light userdata) is [].
  empty_array = core.empty_array,
}

-- The constructors, loaded on first use: esx.client (lua/esx/client.lua, docs/client.md),
-- esx.cache (lua/esx/cache.lua, docs/cache.md), esx.collector (lua/esx/collector.lua).
-- Each is the module itself, callable (its __call tail-calls the module's `new`, so option
-- errors point at the caller's line): the module functions the docs name through it, such
-- as esx.collector.totals, are there too.
local constructors = { client = "esx.client", cache = "esx.cache", collector = "esx.collector" }

setmetatable(_M, {
  __index = function(t, name)
    local module = constructors[name]
    if not module then return nil end
    local m = require(module)
    rawset(t, name, m)
    return m
  end,
})

--- esx.metrics() -> Prometheus text exposition of every live object's counters.
function _M.metrics()
  return registry.metrics(core.version, core.flavour)
end

return _M
