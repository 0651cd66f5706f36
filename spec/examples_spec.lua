-- spec/examples_spec.lua -- runs every example in examples/ against a dev server it starts:
-- the bulk loader, the search script and the plain-Lua cache service under the flavour being
-- tested; the example nginx end to end and `examples/demo/run --no-wait` once (#nginx).
local ds = require "spec.support.devserver"
local socket = require "socket"
local free_port = require("spec.support.net").free_port
local run = require("spec.support.shell").run
local cjson = require "cjson"

local LUA = os.getenv("ESX_TEST_FLAVOUR") or "lua5.4"

-- GET/POST on 127.0.0.1:port -> status, body
local function http(port, method, path, body, headers)
  local c = assert(socket.connect("127.0.0.1", port))
  c:settimeout(10)
  local lines = { method .. " " .. path .. " HTTP/1.0", "Host: 127.0.0.1" }
  for k, v in pairs(headers or {}) do lines[#lines + 1] = k .. ": " .. v end
  lines[#lines + 1] = "Content-Length: " .. #(body or "")
  c:send(table.concat(lines, "\r\n") .. "\r\n\r\n" .. (body or ""))
  local resp = c:receive("*a") or ""
  c:close()
  return tonumber(resp:match("^HTTP/%d%.%d (%d+)")), resp:match("\r\n\r\n(.*)$")
end

local function wait_port(port)
  for _ = 1, 200 do
    local c = socket.connect("127.0.0.1", port)
    if c then c:close() return true end
    socket.sleep(0.025)
  end
  return false
end

-- examples/cache_service.lua in the background, its output to `out`, until it has served
-- `requests` requests -> a function that ends it if it is still running (a spec that failed
-- before the last request), for the spec's finally
local function cache_service(es_url, port, requests, out)
  local p = assert(io.popen(("%s examples/cache_service.lua --es %s --port %d --requests %d > %s 2>&1 & echo $!"):format(
    LUA, es_url, port, requests, out)))
  local pid = tonumber(p:read("*l"))
  p:close()
  return function()
    local f = pid and io.open("/proc/" .. pid .. "/cmdline")
    local cmdline = f and f:read("*a") or ""
    if f then f:close() end
    if cmdline:find("cache_service.lua", 1, true) then os.execute("kill " .. pid .. " 2>/dev/null") end
  end
end

describe("examples (plain Lua)", function()
  local es
  setup(function()
    es = ds.start{}
    local ok, out = run(LUA .. " examples/bulk_load.lua --es " .. es.url .. " --articles 12 --users 3000 --max-readers 600")
    assert(ok, out)
  end)
  teardown(function() es:stop() end)

  it("bulk_load.lua loads articles and reader sets with a progress bar", function()
    local ok, out = run(LUA .. " examples/bulk_load.lua --es " .. es.url .. " --articles 12 --users 3000 --max-readers 600")
    assert(ok, out)
    assert.matches("%[#+%] 100%%", out)
    assert.matches("loaded 12 articles and %d+ reader ids in [%d.]+ s %(%d+ ids/s%), failed 0", out)
    es:request("POST", "/_refresh")
    local _, count = es:json("GET", "/articles/_count")
    assert.equal(12, count.count)
    local _, doc = es:json("GET", "/readers/_doc/3")
    assert.is_true(#doc._source.user_ids >= 30 and #doc._source.user_ids <= 600)
  end)

  it("search.lua prints the matching articles, the most read ones, and errors by kind", function()
    es:request("PUT", "/reads/_doc/5-1", { article_id = 5, user_id = 1 })
    es:request("PUT", "/reads/_doc/5-2?refresh=true", { article_id = 5, user_id = 2 })
    local ok, out = run(LUA .. " examples/search.lua --es " .. es.url .. " --size 3 bulk")
    assert(ok, out)
    local n = tonumber(out:match("(%d+) articles match \"bulk\""))
    assert.is_true(n >= 1, out)
    assert.matches("#%d+ +Article %d+: [%w ]*bulk", out)
    assert.matches("#5 +2 reads", out)
    ok, out = run(LUA .. " examples/search.lua --es http://127.0.0.1:" .. free_port() .. " x")
    assert.is_false(ok)
    assert.matches("search.lua: connect: ", out)
  end)

  it("cache_service.lua shows a read at once when its reader set was not cached yet", function()
    local port = free_port()
    finally(cache_service(es.url, port, 2, "/dev/null"))
    assert.is_true(wait_port(port))
    -- nothing cached: mark_read has no set to update, so the next load must find the read in
    -- Elasticsearch, which a search sees only after a refresh
    assert.equal(204, (http(port, "POST", "/read?article=11&user=2998")))
    local status, body = http(port, "GET", "/articles?user=2998&page=1")
    assert.equal(200, status)
    local page = cjson.decode(body)
    assert.equal(11, page[2].id)
    assert.equal(true, page[2].read)
  end)

  it("cache_service.lua answers 400 to ids that are not integers, and stores no read for them", function()
    local port = free_port()
    finally(cache_service(es.url, port, 6, "/dev/null"))
    assert.is_true(wait_port(port))
    -- esx.cache raises on such ids: the service answered 500 (and a read was written first)
    assert.equal(400, (http(port, "GET", "/articles?user=1.5&page=1")))
    assert.equal(400, (http(port, "GET", "/articles?user=7&page=1.5")))
    assert.equal(400, (http(port, "GET", "/articles?user=-1&page=1")))
    assert.equal(400, (http(port, "GET", "/articles?user=7&page=1e300")))
    assert.equal(400, (http(port, "POST", "/read?article=1.5&user=7")))
    assert.equal(400, (http(port, "POST", "/read?article=3&user=2.5")))
    -- (LuaJIT's %d truncates: the read was stored as "1-7" and "3-2" before the cache raised)
    assert.equal(404, (es:json("GET", "/reads/_doc/1-7")))
    assert.equal(404, (es:json("GET", "/reads/_doc/3-2")))
  end)

  it("cache_service.lua answers 400 to a page past the last one a search can reach", function()
    local port = free_port()
    finally(cache_service(es.url, port, 2, "/dev/null"))
    assert.is_true(wait_port(port))
    -- Elasticsearch refuses from + size past index.max_result_window: the service answered 502
    local status, body = http(port, "GET", "/articles?user=7&page=501")
    assert.equal(400, status, body)
    assert.equal(400, (http(port, "GET", "/articles?user=7&page=1099511627776")))
  end)

  it("cache_service.lua serves read flags from esx.cache and marks reads", function()
    local port = free_port()
    local log = os.tmpname()
    local stop = cache_service(es.url, port, 5, log)
    finally(function()
      stop()
      os.remove(log)
    end)
    assert.is_true(wait_port(port))
    local status, body = http(port, "GET", "/articles?user=2999&page=1")
    assert.equal(200, status)
    local page = cjson.decode(body)
    assert.equal(12, #page)
    assert.equal(12, page[1].id)
    assert.equal(false, page[1].read)
    assert.equal(204, (http(port, "POST", "/read?article=12&user=2999")))
    status, body = http(port, "GET", "/articles?user=2999&page=1")
    assert.equal(true, cjson.decode(body)[1].read)
    status, body = http(port, "GET", "/stats")
    assert.equal(200, status)
    assert.equal(1, cjson.decode(body).pages.loads)
    assert.equal(404, (http(port, "GET", "/nope")))
    local out
    for _ = 1, 100 do
      out = io.open(log):read("*a")
      if out:find("served") then break end
      socket.sleep(0.05)
    end
    assert.matches("served 5 requests; pages hit %d+%% %(1 loads%), reader sets hit %d+%% %(12 loads%)", out)
    local _, doc = es:json("GET", "/reads/_doc/12-2999")
    assert.equal(2999, doc._source.user_id)
  end)
end)

describe("examples/articles.lua readers_loader", function()
  local es, articles, call
  setup(function()
    es = ds.start{}
    package.path = "./examples/?.lua;" .. package.path
    articles = require "articles"
    local esx = require "esx"
    local client = assert(esx.client{ hosts = { es.url }, request_timeout = 30000 })
    call = function(method, path, body)   -- as examples/cache_service.lua's
      local res, err = client:request(method, path, body)
      if not res then return nil, err end
      return cjson.decode(res.body)
    end
    -- the mappings examples/bulk_load.lua creates; article 7: a bulk-loaded set of 3 users
    -- and 10,050 reads recorded since (one more page than index.max_result_window)
    assert.equal(200, (es:request("PUT", "/readers", cjson.encode{ mappings = { properties = {
      article_id = { type = "long" }, user_ids = { type = "long" } } } })))
    assert.equal(200, (es:request("PUT", "/reads", cjson.encode{ mappings = { properties = {
      article_id = { type = "long" }, user_id = { type = "long" } } } })))
    assert.equal(201, (es:request("PUT", "/readers/_doc/7", cjson.encode{ article_id = 7, user_ids = { 1, 2, 3 } })))
    local lines = {}
    for u = 101, 10150 do
      local id, doc = articles.read_doc(7, u)
      lines[#lines + 1] = '{"index":{"_index":"reads","_id":"' .. id .. '"}}\n' .. cjson.encode(doc)
    end
    lines[#lines + 1] = '{"index":{"_index":"reads","_id":"8-5"}}\n{"article_id":8,"user_id":5}'
    local st = es:request("POST", "/_bulk?refresh=true", table.concat(lines, "\n") .. "\n",
      { ["Content-Type"] = "application/x-ndjson" }, { timeout = 60 })
    assert.equal(200, st)
  end)
  teardown(function() es:stop() end)

  it("loads every read, past the 10,000 hits one search returns", function()
    local ids = articles.readers_loader(call)(7)
    assert.equal(3 + 10050, #ids)
    local set = {}
    for _, u in ipairs(ids) do assert.is_nil(set[u], u); set[u] = true end
    for _, u in ipairs({ 1, 2, 3, 101, 10100, 10101, 10150 }) do assert.is_true(set[u], u) end
    assert.same({ 5 }, articles.readers_loader(call)(8))
  end)

  it("raises a clear error past MAX_READS instead of growing without a bound", function()
    local max = articles.MAX_READS
    finally(function() articles.MAX_READS = max end)
    articles.MAX_READS = 10049
    local ok, err = pcall(articles.readers_loader(call), 7)
    assert.is_false(ok)
    assert.matches("article 7 has more than 10049 reads since the bulk load %(MAX_READS%)", err)
    articles.MAX_READS = 10050
    assert.equal(10053, #articles.readers_loader(call)(7))
  end)
end)

describe("the example nginx and the demo #nginx", function()
  it("examples/nginx/run serves the collector, articles, metrics, stats and the dashboard", function()
    local es = ds.start{}
    local port = free_port()
    local dir = os.tmpname()
    os.remove(dir)
    finally(function() -- (the stop finds no nginx when the spec failed before its start)
      run(("examples/nginx/run stop --port %d --dir %s"):format(port, dir))
      os.execute("rm -rf " .. dir)
      es:stop()
    end)
    local ok, out = run(LUA .. " examples/bulk_load.lua --es " .. es.url .. " --articles 25 --users 2000 --max-readers 500")
    assert(ok, out)
    ok, out = run(("examples/nginx/run start --port %d --es-url %s --dir %s --rollup-window 2000"):format(port, es.url, dir))
    assert(ok, out)
    assert.equal("http://127.0.0.1:" .. port, out:match("%S+"))
    local status, body = http(port, "GET", "/articles?user=7&page=2")
    assert.equal(200, status)
    local page = cjson.decode(body)
    assert.equal(5, #page)
    assert.equal(5, page[1].id)
    assert.equal(204, (http(port, "POST", "/articles/read?article=5&user=7")))
    for _ = 1, 4 do -- both workers answer with the read flag set (shared cache)
      assert.equal(true, cjson.decode(select(2, http(port, "GET", "/articles?user=7&page=2")))[1].read)
    end
    -- a read of an article whose reader set no worker holds yet: the load that follows finds it
    assert.equal(204, (http(port, "POST", "/articles/read?article=25&user=9")))
    page = cjson.decode(select(2, http(port, "GET", "/articles?user=9&page=1")))
    assert.same({ 25, true }, { page[1].id, page[1].read })
    assert.equal(400, (http(port, "GET", "/articles?user=x&page=1")))
    -- a page no search can reach (from + size past index.max_result_window): 400, not 502
    assert.equal(200, (http(port, "GET", "/articles?user=7&page=500")))
    for _, p in ipairs{ 501, 2 ^ 40 } do
      local st, b = http(port, "GET", ("/articles?user=7&page=%d"):format(p))
      assert.equal(400, st, b)
      assert.matches("page must be 1%-500", b)
    end
    local events = {}
    for i = 1, 10 do
      events[i] = { site_id = "news", type = i <= 8 and "view" or "click", block_id = "hero",
                    variant = "A", user_id = "u" .. (i % 4) }
    end
    assert.equal(204, (http(port, "POST", "/collect", cjson.encode(events), { ["Content-Type"] = "application/json" })))
    local rows
    for _ = 1, 100 do
      local st, b = http(port, "GET", "/api/rollups?site=news")
      assert.equal(200, st)
      rows = cjson.decode(b).totals
      if #rows == 2 then break end
      socket.sleep(0.1)
    end
    table.sort(rows, function(a, b) return a.type < b.type end)
    assert.same({ "click", 2, 2 }, { rows[1].type, rows[1].count, rows[1].uniques })
    assert.same({ "view", 8, 4 }, { rows[2].type, rows[2].count, rows[2].uniques })
    -- a from or to that is not an integer is the client's mistake: 400, not the 500 of the
    -- error esx.collector.totals raises on it
    for _, q in ipairs{ "from=1.5", "to=now", "from=1e300", "to=0x1p60" } do
      local st, b = http(port, "GET", "/api/rollups?site=news&" .. q)
      assert.equal(400, st, q .. ": " .. tostring(b))
      assert.matches("must be an integer", b)
    end
    assert.equal(200, (http(port, "GET", "/api/rollups?site=news&from=0&to=")))
    -- a batch under max_body (64 KiB) stays in memory, as docs/nginx.md says to configure
    -- /collect: nginx's default client_body_buffer_size (16k) wrote it to a temporary file
    -- first, and the handler read it back from disk, on the worker's event loop
    local big = {}
    for i = 1, 20 do big[i] = { site_id = "big", type = "view", user_id = "u" .. i } end
    local batch = cjson.encode(big) .. string.rep(" ", 40000)
    assert.equal(204, (http(port, "POST", "/collect", batch, { ["Content-Type"] = "application/json" })))
    local log = io.open(dir .. "/error.log"):read("*a")
    assert.falsy(log:find("buffered to a temporary file", 1, true), log)
    local _, sites = http(port, "GET", "/api/sites")
    assert.same({ "news" }, cjson.decode(sites).sites)
    local _, metrics = http(port, "GET", "/metrics")
    assert.matches('esx_build_info{worker="0",version="[^"]+",flavour="luajit"} 1', metrics)
    assert.matches('esx_build_info{worker="1",version="[^"]+",flavour="luajit"} 1', metrics)
    assert.matches('esx_cache_', metrics)
    local _, stats = http(port, "GET", "/api/stats")
    assert.equal(2, #cjson.decode(stats).workers)
    status, body = http(port, "GET", "/dashboard/")
    assert.equal(200, status)
    assert.matches("<title>esx rollups</title>", body)
    assert.equal(404, (http(port, "GET", "/dashboard/test/package.json")))
  end)

  it("make demo's script drives traffic, reports equal counts and stops everything", function()
    local ok, out = run("examples/demo/run --no-wait --duration 5 --rate 150 < /dev/null")
    assert(ok, out)
    local accepted, indexed = out:match("accepted (%d+) %(collectors' own count: %d+%), indexed (%d+)  %-%- equal")
    assert.is_truthy(accepted, out)
    assert.equal(accepted, indexed)
    assert.is_true(tonumber(accepted) > 1000, out)
    assert.matches("rollup counts %(all sites, all instances%): " .. accepted .. "  %-%- equal", out)
    assert.matches("merged from 2 collector instances", out)
    assert.matches("hero +B +%d+ +%d+", out)
    assert.matches("bytes per reader", out)
    assert.matches("dashboard: http://127%.0%.0%.1:%d+/dashboard/%?site=news", out)
    assert.matches("== stopping", out)
    local es_port = out:match("dev server %(in%-memory Elasticsearch subset%) on port (%d+)")
    local web_port = out:match("starting nginx %(2 workers, examples/nginx%) on port (%d+)")
    assert.is_falsy(socket.connect("127.0.0.1", tonumber(es_port)))
    assert.is_falsy(socket.connect("127.0.0.1", tonumber(web_port)))
    -- and leaves none of their runtime directories behind
    local tmp = os.getenv("TMPDIR") or "/tmp"
    for _, d in ipairs{ tmp .. "/esxd-" .. es_port, tmp .. "/esx-example-" .. web_port } do
      assert.is_falsy(os.rename(d, d), d .. " is left behind")
    end
  end)

  it("make demo ES_URL=... uses that Elasticsearch and leaves it running", function()
    local es = ds.start{}
    finally(function() es:stop() end)
    local ok, out = run("examples/demo/run --no-wait --es-url " .. es.url .. " --duration 3 --rate 100 < /dev/null")
    assert(ok, out)
    assert.matches("using Elasticsearch at " .. es.url:gsub("%p", "%%%0"), out)
    assert.is_falsy(out:find("starting the dev server", 1, true))
    assert.matches("indexed %d+  %-%- equal", out)
    local status = es:request("GET", "/_cluster/health")
    assert.equal(200, status)
    local _, count = es:json("GET", "/articles/_count")
    assert.equal(60, count.count)
  end)
end)
