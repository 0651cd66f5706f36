--- esx.registry: the live esx objects of this Lua state, for esx.metrics().
--
-- Objects register themselves with a kind ("client", "collector", "cache"), a name and a
-- function that, given the object, returns its stats table.  The set is weak-keyed and an
-- entry never refers to its object (LuaJIT has no ephemeron tables: a value that reached
-- its key would keep it alive), so registering never keeps an object alive; a closed object
-- unregisters itself.

local ipairs, pairs, type, tostring, concat, sort, format =
  ipairs, pairs, type, tostring, table.concat, table.sort, string.format

local _M = {}

local live = setmetatable({}, { __mode = "k" })
local sequence = 0

--- Registers obj; returns the name it was given ("client1", ... unless name).
-- stats_fn(obj) is called for esx.metrics(); it must not be a closure over obj.
function _M.add(obj, kind, name, stats_fn)
  sequence = sequence + 1
  name = name or (kind .. sequence)
  live[obj] = { kind = kind, name = name, stats = stats_fn, order = sequence }
  return name
end

function _M.remove(obj)
  live[obj] = nil
end

local function escape_label(s)
  return (tostring(s):gsub("[\\\"\n]", { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

-- Flattens a stats table into metric lines: nested keys join with "_"; lists of tables
-- (e.g. nodes) become one series per element labelled by its `url` or index.
local function flatten(prefix, labels, t, out)
  for k, v in pairs(t) do
    local key = prefix .. "_" .. tostring(k):gsub("[^%w_]", "_")
    local tv = type(v)
    if tv == "number" then
      out[#out + 1] = { key, labels, v }
    elseif tv == "boolean" then
      out[#out + 1] = { key, labels, v and 1 or 0 }
    elseif tv == "table" then
      if #v > 0 and type(v[1]) == "table" then
        for i, item in pairs(v) do
          local id = item.url or item.name or i
          flatten(key, labels .. ',item="' .. escape_label(id) .. '"', item, out)
        end
      else
        flatten(key, labels, v, out)
      end
    end
  end
end

function _M.metrics(version, flavour)
  local lines = {
    "# HELP esx_build_info esx module version and Lua flavour.",
    "# TYPE esx_build_info gauge",
    format('esx_build_info{version="%s",flavour="%s"} 1', version, flavour),
  }
  local objs = {}
  for obj, entry in pairs(live) do objs[#objs + 1] = { obj = obj, entry = entry } end
  sort(objs, function(a, b) return a.entry.order < b.entry.order end)
  local samples = {}
  for _, item in ipairs(objs) do
    local entry = item.entry
    local ok, stats = pcall(entry.stats, item.obj)
    if ok and type(stats) == "table" then
      flatten("esx_" .. entry.kind, 'name="' .. escape_label(entry.name) .. '"', stats, samples)
    end
  end
  sort(samples, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local last
  for _, s in ipairs(samples) do
    if s[1] ~= last then
      lines[#lines + 1] = "# TYPE " .. s[1] .. " untyped"
      last = s[1]
    end
    local v = s[3]
    local text = (v == math.floor(v) and v > -2^53 and v < 2^53) and format("%d", v) or format("%.17g", v)
    lines[#lines + 1] = format("%s{%s} %s", s[1], s[2], text)
  end
  return concat(lines, "\n") .. "\n"
end

return _M
