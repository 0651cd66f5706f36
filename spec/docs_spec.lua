-- docs: keeps the reference pages honest.  Reads the option schemas, the objects' methods,
-- their stats and every error kind the sources can produce, and checks that the pages under
-- docs/ document each one: an option row with its default, a **syntax:** line per method, a
-- row in docs/errors.md per error kind.  A new option, method or kind without documentation
-- fails here.

local read = require("spec.support.shell").read_file

local function lines(s)
  local t = {}
  for l in (s .. "\n"):gmatch("(.-)\n") do t[#t + 1] = l end
  return t
end

-- The text of the section that starts with the heading line `heading` (e.g. "## esx.client"),
-- up to the next heading of the same or a higher level.
local function section(doc, heading)
  local level = #heading:match("^(#+)")
  local out, inside = {}, false
  for _, l in ipairs(lines(doc)) do
    if inside then
      local h = l:match("^(#+) ")
      if h and #h <= level then break end
      out[#out + 1] = l
    elseif l == heading then
      inside = true
      out[1] = l
    end
  end
  assert(inside, "heading not found: " .. heading)
  return table.concat(out, "\n")
end

-- The table row documenting option `name` (first cell lists `name`), split into cells.
local function option_row(text, name)
  for _, l in ipairs(lines(text)) do
    if l:sub(1, 1) == "|" then
      local cells = {}
      for c in l:sub(2):gmatch("([^|]*)|") do cells[#cells + 1] = c end
      if cells[1] and cells[1]:find("`" .. name .. "`", 1, true) then return cells end
    end
  end
  return nil
end

local function render_scalar(v)
  if type(v) == "number" then
    if v == math.floor(v) then return string.format("%.0f", v) end
    return tostring(v)
  end
  return tostring(v)
end

local function contains_value(cell, v)
  local s = render_scalar(v)
  if type(v) == "number" then
    return cell:find("%f[%d]" .. s .. "%f[%D]") ~= nil
  end
  return cell:find(s, 1, true) ~= nil
end

-- Checks every option of `schema` against the option table in `text`; `prefix` names nested
-- options ("rollup.").  Returns a list of problems.
local function check_options(schema, text, prefix, problems)
  prefix = prefix or ""
  problems = problems or {}
  local names = {}
  for name in pairs(schema) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local spec = schema[name]
    local full = prefix .. name
    local row = option_row(text, full)
    if not row then
      problems[#problems + 1] = "no option row for `" .. full .. "`"
    else
      local cell = row[2] or ""
      local d = spec.default
      if type(d) == "function" then d = d() end
      if spec.required then
        if not cell:find("required", 1, true) then
          problems[#problems + 1] = "`" .. full .. "`: default cell does not say required"
        end
      elseif d == nil then
        if not cell:find("%S") then
          problems[#problems + 1] = "`" .. full .. "`: empty default cell"
        end
      elseif type(d) == "table" then
        if #d > 0 then
          for _, v in ipairs(d) do
            if not contains_value(cell, v) then
              problems[#problems + 1] = "`" .. full .. "`: default element " .. render_scalar(v) ..
                " not in " .. cell
            end
          end
        else
          -- a table of named fields (the collector's rollup): one row per field
          local sub = {}
          for k, v in pairs(d) do sub[k] = { default = v } end
          check_options(sub, text, full .. ".", problems)
        end
      elseif not contains_value(cell, d) then
        problems[#problems + 1] = "`" .. full .. "`: default " .. render_scalar(d) ..
          " not in " .. cell
      end
    end
  end
  return problems
end

-- Option names listed in the first column of the option table in `text` that `schema` does
-- not have (a removed or renamed option the page still documents).  "a.b" names a field of a
-- table-valued option a.
local function stale_options(schema, text)
  local stale = {}
  local in_table = false
  for _, l in ipairs(lines(text)) do
    if l:match("^| option | default |") then
      in_table = true
    elseif in_table and l:sub(1, 1) ~= "|" then
      break
    elseif in_table and not l:match("^|%-") then
      local first = l:match("^|([^|]*)|") or ""
      for name in first:gmatch("`([%w_.]+)`") do
        local top, field = name:match("^([%w_]+)%.([%w_]+)$")
        local spec = schema[top or name]
        if not spec then
          stale[#stale + 1] = name
        elseif field then
          local d = spec.default
          if type(d) == "function" then d = d() end
          if type(d) ~= "table" or d[field] == nil then stale[#stale + 1] = name end
        end
      end
    end
  end
  return stale
end

-- Public methods of a metatable-style class: functions not starting with "_".
local function methods(class)
  local t = {}
  for k, v in pairs(class) do
    if type(k) == "string" and type(v) == "function" and k:sub(1, 1) ~= "_" then
      t[#t + 1] = k
    end
  end
  table.sort(t)
  return t
end

local function syntax_lines(doc)
  local t = {}
  for _, l in ipairs(lines(doc)) do
    if l:find("**syntax:**", 1, true) then t[#t + 1] = l end
  end
  return t
end

-- Names (from `names`) without a **syntax:** line containing `<sep><name>(`.
local function missing_syntax(doc, names, sep)
  local have = syntax_lines(doc)
  local missing = {}
  for _, name in ipairs(names) do
    local found = false
    for _, l in ipairs(have) do
      if l:find(sep .. name .. "(", 1, true) then found = true break end
    end
    if not found then missing[#missing + 1] = sep .. name end
  end
  return missing
end

local function assert_none(list, what)
  assert(#list == 0, what .. ":\n  " .. table.concat(list, "\n  "))
end

-- A client that never connects anywhere (port 1), for introspection only.
local function offline_client()
  return assert(require("esx").client{ hosts = "http://127.0.0.1:1", max_retries = 0,
                                       name = "docs_spec" })
end

local client_doc = read("docs/client.md")
local collector_doc = read("docs/collector.md")
local nginx_doc = read("docs/nginx.md")
local errors_doc = read("docs/errors.md")
local tuning_doc = read("docs/tuning.md")

describe("docs/client.md", function()
  it("documents every client option with its default", function()
    local schema = require("esx.client").schema
    assert_none(check_options(schema, section(client_doc, "## esx.client")),
      "docs/client.md options")
    assert_none(stale_options(schema, section(client_doc, "## esx.client")),
      "docs/client.md documents options esx.client does not have")
  end)

  it("documents every bulk indexer option with its default", function()
    local schema = require("esx.bulk").schema
    assert_none(check_options(schema, section(client_doc, "## c:bulk_indexer")),
      "docs/client.md bulk indexer options")
    assert_none(stale_options(schema, section(client_doc, "## c:bulk_indexer")),
      "docs/client.md documents bulk indexer options that do not exist")
  end)

  it("has a **syntax:** line for every Client method", function()
    assert_none(missing_syntax(client_doc, methods(require("esx.client").Client), "c:"),
      "client methods without a syntax line")
  end)

  it("has a **syntax:** line for every pending and bulk indexer method", function()
    local c = offline_client()
    local p = assert(c:send("GET", "/"))
    local pending_class = getmetatable(p)
    p:wait(5000)
    local bi_class = getmetatable(assert(c:bulk_indexer()))
    c:close()
    assert_none(missing_syntax(client_doc, methods(pending_class), "pending:"),
      "pending methods without a syntax line")
    assert_none(missing_syntax(client_doc, methods(bi_class), "bi:"),
      "bulk indexer methods without a syntax line")
  end)

  it("names every field of c:stats() and every failure kind counted", function()
    local c = offline_client()
    local s = assert(c:stats())
    c:close()
    local missing = {}
    for _, t in ipairs({ s, s.failures, s.pool, s.bytes }) do
      for k in pairs(t) do
        if not client_doc:find("`" .. k .. "`", 1, true) then missing[#missing + 1] = k end
      end
    end
    table.sort(missing)
    assert_none(missing, "c:stats() fields not in docs/client.md")
  end)
end)

describe("docs/collector.md", function()
  local function offline_collector()
    local c = offline_client()
    local dl = os.tmpname()
    local col = assert(require("esx").collector{ sink = c, dead_letter = dl })
    return col, function()
      col:close(0)
      c:close()
      os.remove(dl)
    end
  end

  it("documents every collector option with its default", function()
    local schema = require("esx.collector").schema
    assert_none(check_options(schema, section(collector_doc, "## esx.collector")),
      "docs/collector.md options")
    assert_none(stale_options(schema, section(collector_doc, "## esx.collector")),
      "docs/collector.md documents options esx.collector does not have")
  end)

  it("has a **syntax:** line for every Collector method and module function", function()
    local col, done = offline_collector()
    local class = getmetatable(col)
    done()
    assert_none(missing_syntax(collector_doc, methods(class), "col:"),
      "collector methods without a syntax line")
    local fns = {}
    for k, v in pairs(require("esx.collector")) do
      if type(v) == "function" and k ~= "new" then fns[#fns + 1] = k end
    end
    assert_none(missing_syntax(collector_doc, fns, "esx.collector."),
      "esx.collector functions without a syntax line")
  end)

  it("names every field of col:stats() and every rejection reason", function()
    local col, done = offline_collector()
    local s = assert(col:stats())
    done()
    local missing = {}
    for _, t in ipairs({ s, s.rejected, s.utilization }) do
      for k in pairs(t) do
        if not collector_doc:find("`" .. k .. "`", 1, true) then missing[#missing + 1] = k end
      end
    end
    table.sort(missing)
    assert_none(missing, "col:stats() fields not in docs/collector.md")
  end)

  it("lists every status col:handle can answer", function()
    for _, status in ipairs({ 200, 204, 400, 403, 405, 413, 415, 429, 503 }) do
      assert(collector_doc:find("| " .. status .. " |", 1, true),
        "status " .. status .. " missing from the statuses table")
    end
  end)
end)

describe("docs/nginx.md", function()
  it("has a **syntax:** line for every esx.nginx function", function()
    local fns = {}
    for k, v in pairs(require("esx.nginx")) do
      if type(v) == "function" then fns[#fns + 1] = k end
    end
    assert.is_true(#fns >= 2)
    assert_none(missing_syntax(nginx_doc, fns, "."), "esx.nginx functions without a syntax line")
  end)
end)

describe("docs/cache.md", function()
  it("exists, is linked from the other pages, and documents the cache's options if exposed", function()
    local cache_doc = read("docs/cache.md")
    for name, doc in pairs({ client = client_doc, collector = collector_doc, nginx = nginx_doc,
                             errors = errors_doc, tuning = tuning_doc }) do
      assert(doc:find("(cache.md", 1, true), "docs/" .. name .. ".md does not link cache.md")
    end
    local schema = require("esx.cache").schema
    if schema then
      assert_none(check_options(schema, section(cache_doc, "## esx.cache")),
        "docs/cache.md options")
      assert_none(stale_options(schema, section(cache_doc, "## esx.cache")),
        "docs/cache.md documents options esx.cache does not take")
    end
  end)

  it("names every field of cache:stats()", function()
    local cache = assert(require("esx").cache{ load_page = function() return {} end,
                                               load_readers = function() return {} end })
    local s = assert(cache:stats())
    cache:close()
    local text = section(read("docs/cache.md"), "## cache:stats")
    local missing = {}
    for k, v in pairs(s) do
      if type(v) == "table" then -- `pages.hits`, and `readers.hits`, … (same fields)
        if not text:find("`" .. k .. ".", 1, true) then missing[#missing + 1] = k end
        for f in pairs(v) do
          if not text:find("." .. f .. "`", 1, true) then missing[#missing + 1] = k .. "." .. f end
        end
      elseif not text:find("`" .. k .. "`", 1, true) then
        missing[#missing + 1] = k
      end
    end
    table.sort(missing)
    assert_none(missing, "cache:stats() fields not in docs/cache.md")
  end)
end)

-- Every error kind the sources can produce: the C transport kinds (src/request.h), kinds given
-- literally to esx_lerror_fail/esx_lerror_push or chosen in a `const char *kind = ...;`
-- expression in src/*.c, and kinds given to core.error / new_error / make_error or chosen in
-- a `local kind = ...` line in lua/esx/*.lua.
local function error_kinds()
  local kinds = {}
  local function add(k, where) kinds[k] = kinds[k] or where end
  for k in read("src/request.h"):gmatch('#define%s+ESX_E[%w_]+%s+"([%w_]+)"') do
    add(k, "src/request.h")
  end
  local function files(cmd)
    local t = {}
    local h = io.popen(cmd)
    for f in h:lines() do t[#t + 1] = f end
    h:close()
    return t
  end
  for _, path in ipairs(files("ls src/*.c")) do
    local src = read(path)
    for k in src:gmatch('esx_lerror_fail%(%s*L%s*,%s*"([%w_]+)"') do add(k, path) end
    for k in src:gmatch('esx_lerror_push%(%s*L%s*,%s*"([%w_]+)"') do add(k, path) end
    for expr in src:gmatch("const char %*kind%s*=(.-);") do
      for k in expr:gmatch('"([%w_]+)"') do add(k, path) end
    end
  end
  for _, path in ipairs(files("ls lua/esx/*.lua")) do
    local src = read(path)
    for _, fn in ipairs({ "core%.error", "new_error", "make_error" }) do
      for k in src:gmatch(fn .. '%(%s*"([%w_]+)"') do add(k, path) end
    end
    for line in src:gmatch("local kind%s*=([^\n]*)") do
      for k in line:gmatch('"([%w_]+)"') do add(k, path) end
    end
  end
  return kinds
end

describe("docs/errors.md", function()
  local kinds = error_kinds()

  it("finds the kinds API.md lists (the scan itself works)", function()
    for _, k in ipairs({ "pool_timeout", "connect_timeout", "connect", "socket_timeout",
                         "request_timeout", "http", "not_found", "decode", "no_nodes", "closed",
                         "load", "reset", "internal" }) do
      assert(kinds[k], "the source scan did not find kind " .. k)
    end
  end)

  it("has a row for every error kind the code can produce", function()
    local missing = {}
    for k, where in pairs(kinds) do
      if not errors_doc:find("\n| `" .. k .. "` |", 1, true) then
        missing[#missing + 1] = k .. " (" .. where .. ")"
      end
    end
    table.sort(missing)
    assert_none(missing, "error kinds without a row in docs/errors.md")
  end)

  it("documents in client.md every kind the client counts in stats().failures", function()
    local c = offline_client()
    local s = assert(c:stats())
    c:close()
    for k in pairs(s.failures) do
      if k ~= "json" then
        assert(client_doc:find("| `" .. k .. "` |", 1, true), "client.md Errors lacks " .. k)
      end
    end
  end)
end)

describe("docs/tuning.md", function()
  -- The run a results file holds: "Measured 2026-11-30 04:29 UTC" (client), "benchmark
  -- (2026-11-30T03:53Z" (cache) or the first "2026-11-30 04:52 UTC" (collector); tuning.md
  -- names the run it quotes the same way.
  local function run_stamp(results)
    return results:match("Measured (%d+%-%d+%-%d+ %d+:%d+ UTC)")
      or results:match("benchmark %((%d+%-%d+%-%d+T%d+:%d+Z)")
      or results:match("(%d%d%d%d%-%d%d%-%d%d %d%d:%d%d UTC)")
  end

  -- Rows of the "Measured figures" table whose source is exactly a results file quote it: every
  -- number in the value cell must appear in that file as written.  When the file holds a newer
  -- run than the one tuning.md names, the figures are stale rather than wrong: pending, with a
  -- message saying what to refresh (a benchmark rerun must not turn the suite red).
  it("quotes bench/results verbatim, and says what is still to be measured", function()
    local measured = section(tuning_doc, "## Measured figures")
    local problems, stale, rows = {}, {}, 0
    local results_of = {}
    for _, l in ipairs(lines(measured)) do
      local value, source = l:match("^|[^|]*|([^|]*)|%s*`(bench/results/[%w_.-]+)`%s*|$")
      if value then
        rows = rows + 1
        if results_of[source] == nil then
          local f = io.open(source, "rb")
          results_of[source] = f and f:read("*a") or false
          if f then f:close() end
        end
        local results = results_of[source]
        if not results then
          problems[#problems + 1] = source .. " does not exist"
        else
          local stamp = run_stamp(results)
          if stamp and not tuning_doc:find(stamp, 1, true) then
            stale[source] = stamp
          else
            for figure in value:gmatch("%d[%d,.]*") do
              figure = figure:gsub("[.,]$", "")
              if not results:find(figure, 1, true) then
                problems[#problems + 1] = figure .. " not in " .. source .. " (" .. l .. ")"
              end
            end
          end
        end
      end
    end
    assert.is_true(rows > 0, "no measured rows found")
    assert_none(problems, "docs/tuning.md figures that the results do not have")
    if not io.open("bench/results/collector.md") then
      assert(tuning_doc:find("still to be measured", 1, true))
    end
    local notes = {}
    for source, stamp in pairs(stale) do
      notes[#notes + 1] = source .. " now holds the run of " .. stamp
    end
    if #notes > 0 then
      table.sort(notes)
      pending("docs/tuning.md Measured figures quote an older run: " .. table.concat(notes, "; "))
    end
  end)
end)

-- GitHub's heading anchors: lower case, punctuation other than "-" and "_" dropped, spaces
-- turned into "-".
local function anchors(doc)
  local t = {}
  for _, l in ipairs(lines(doc)) do
    local h = l:match("^#+%s+(.-)%s*$")
    if h then
      local a = h:lower():gsub("[^%w%-_ ]", ""):gsub(" ", "-")
      t[a] = true
    end
  end
  return t
end

-- `dir/../x/./y` -> `x/y` (paths relative to the repository's root)
local function normalise(path)
  local out = {}
  for part in path:gmatch("[^/]+") do
    if part == ".." and #out > 0 and out[#out] ~= ".." then out[#out] = nil
    elseif part ~= "." then out[#out + 1] = part end
  end
  return table.concat(out, "/")
end

describe("links between the pages", function()
  -- every page a user reads: the reference pages (all of docs/, not a list to keep up to date:
  -- cache.md was missing from it), the READMEs they start from and link to
  local pages = { "README.md", "examples/README.md", "devserver/README.md", "bench/README.md" }
  local ls = io.popen("ls docs/*.md")
  for l in ls:lines() do pages[#pages + 1] = l end
  ls:close()

  it("point at files that exist and headings that exist", function()
    local problems = {}
    for _, page in ipairs(pages) do
      local doc = read(page)
      local dir = page:match("^(.*)/") or "."
      -- (code blocks hold no links, and a `](` in them is code)
      doc = doc:gsub("\n```.-\n```", "\n")
      for target in doc:gmatch("%]%(([^)%s]+)%)") do
        if not target:match("^%a[%w+.-]*:") then
          local file, anchor = target:match("^([^#]*)#?(.*)$")
          local path = file == "" and page or normalise(dir .. "/" .. file)
          local f = io.open(path, "rb")
          if not f then
            problems[#problems + 1] = page .. " -> " .. target .. " (no file)"
          else
            local text = f:read("*a") or "" -- (nil for a directory)
            f:close()
            if anchor ~= "" and path:match("%.md$") and not anchors(text)[anchor] then
              problems[#problems + 1] = page .. " -> " .. target .. " (no heading)"
            end
          end
        end
      end
    end
    assert_none(problems, "broken links")
  end)

  it("include every page of docs/ in README.md's Documentation section (the index)", function()
    local index = section(read("README.md"), "## Documentation")
    local missing = {}
    for _, page in ipairs(pages) do
      if page:match("^docs/") and not index:find("](" .. page .. ")", 1, true) then
        missing[#missing + 1] = page
      end
    end
    assert_none(missing, "docs/ pages README.md's Documentation does not link")
  end)

  it("comment nginx configuration with #, not Lua's --, outside the *_by_lua_block bodies", function()
    -- nginx reads `-- text` after a directive as a directive named "--" and does not start
    -- (README.md's configuration did that, twice)
    local problems = {}
    for _, page in ipairs(pages) do
      for block in read(page):gmatch("\n```nginx\n(.-)\n```") do
        local conf = block:gsub("_by_lua_block%s*%b{}", "_by_lua_block {}")
        for l in (conf .. "\n"):gmatch("(.-)\n") do
          local code = l:gsub('"[^"]*"', '""'):gsub("'[^']*'", "''"):gsub("#.*", "")
          if code:find("%-%-") then problems[#problems + 1] = page .. ": " .. l end
        end
      end
    end
    assert_none(problems, "Lua comments in nginx configuration")
  end)
end)
