--- examples/args.lua -- the command line of the example scripts: `--name value` pairs, each
-- name one of the defaults' keys, each value a number where the default is one.
--
--   local o = require("args").parse(arg, { es = "http://127.0.0.1:9200", port = 8081 },
--                                   "usage: cache_service.lua [--es URL] [--port P]")
--
-- An unknown name, a word that is not --name or a name without a value prints the usage line
-- and exits with status 2; a value that is not a number where one is expected raises.

local _M = {}

--- -> opts: defaults (the table itself), with the values given on the command line
function _M.parse(argv, defaults, usage)
  local i = 1
  while argv[i] do
    local name = argv[i]:match("^%-%-(.+)$")
    if not name or defaults[name] == nil or not argv[i + 1] then
      io.stderr:write(usage, "\n")
      os.exit(2)
    end
    local v = argv[i + 1]
    defaults[name] = type(defaults[name]) == "number" and assert(tonumber(v), name .. ": number expected") or v
    i = i + 2
  end
  return defaults
end

return _M
