-- spec/support/cjson_fork.lua -- a stand-in for OpenResty's lua-cjson fork, for the specs of
-- esx's encoder: the markers it exports (cjson.empty_array, a light userdata other than
-- NULL; cjson.array_mt and cjson.empty_array_mt, two tables) and cjson.null, installed as
-- package.loaded[name] ("cjson" or "cjson.safe") the way `require` leaves a loaded module.
--
--   local fork = require "spec.support.cjson_fork"
--   local cj, restore = fork.install("cjson")   -- call restore() in the it's one finally
--   local doc, text = fork.document(esx, cj)    -- a body with every marker, and its JSON
local _M = {}

function _M.new()
  local up
  local function f() return up end
  return {
    null = require("cjson").null,
    empty_array = debug.upvalueid(f, 1), -- a light userdata, as the fork's is
    array_mt = {},
    empty_array_mt = {},
  }
end

--- Installs a new stand-in as package.loaded[name]; returns it and the function that puts
-- back what was there.
function _M.install(name)
  local saved = package.loaded[name]
  local cj = _M.new()
  package.loaded[name] = cj
  return cj, function() package.loaded[name] = saved end
end

--- A document holding every marker, nested in objects inside an array (one key per object, so
-- that the text is one), and the JSON it must be sent as.
function _M.document(esx, cj)
  local A = esx.array_mt
  local list = setmetatable({
    { e = esx.empty_array },
    { a = setmetatable({}, A) },
    { n = setmetatable({ 1, nil, 3 }, A) },
    { c = cj.empty_array },
    { ca = setmetatable({}, cj.array_mt) },
    { cn = setmetatable({ "x" }, cj.array_mt) },
    { ce = setmetatable({}, cj.empty_array_mt) },
    { co = setmetatable({ k = 1 }, cj.empty_array_mt) },
    { z = cj.null },
    { d = { deep = { deeper = esx.empty_array } } },
  }, A)
  return { m = list },
    '{"m":[{"e":[]},{"a":[]},{"n":[1,null,3]},{"c":[]},{"ca":[]},{"cn":["x"]},{"ce":[]},' ..
    '{"co":{"k":1}},{"z":null},{"d":{"deep":{"deeper":[]}}}]}'
end

return _M
