--- examples/nginx/esx_app.lua -- the handlers of the example nginx (nginx.conf.template).
--
-- init(cfg) runs in init_by_lua, in the master, before the workers fork: it creates one
-- esx.client, one esx.collector (each worker becomes its own collector instance, with its own
-- spool segments and rollup rows) and one esx.cache with shared = true (a mark_read or an
-- invalidation in one worker is seen by the other before its next answer; concurrent misses
-- in both workers load a page or reader set once; each worker keeps its own tiers).  The cache loaders read Elasticsearch through the client with
-- client:send + esx.nginx.wait, so a miss never blocks the worker.
-- Every other function is a content handler, the per-worker stats timer, or exit_worker.

local esx = require "esx"
local esx_nginx = require "esx.nginx"
local collector_mod = require "esx.collector"
local articles = require "articles"
local cjson = require "cjson.safe" -- (an empty list encodes as {}: the page accepts both)

local _M = {}
local client, col, cache

-- call() for the loaders: asynchronous request, waited for without blocking the worker.
local function call(method, path, body)
  local p, err = client:send(method, path, body)
  if not p then return nil, err end
  local res, werr = esx_nginx.wait(p, 10000)
  if not res then return nil, werr end
  return cjson.decode(res.body)
end

--- init{es_url=, spool_dir=, rollup_window=, rollup_interval=} (init_by_lua)
function _M.init(cfg)
  -- (a mark_read's refresh=wait_for holds its connection until the next refresh, up to the
  -- index's refresh_interval, 1 s: the pool is sized for the marks of a second, not the
  -- default 10 per node, or the searches behind them wait out pool_timeout)
  client = assert(esx.client{ hosts = { cfg.es_url }, compression = true,
                              compression_min_bytes = 1024, name = "es",
                              max_per_route = 64, max_total = 64 })
  col = assert(esx.collector{ sink = client, spool_dir = cfg.spool_dir, flush_interval = 250,
    rollup = { window = cfg.rollup_window, interval = cfg.rollup_interval }, name = "beacons" })
  cache = esx.cache{ shared = true, name = "articles", page_ttl = 5000, readers_ttl = 600000,
    load_page = articles.page_loader(call), load_readers = articles.readers_loader(call) }
end

local function json(status, value)
  ngx.status = status
  ngx.header["Content-Type"] = "application/json"
  ngx.header["Cache-Control"] = "no-store"
  ngx.print(cjson.encode(value))
  return ngx.exit(ngx.OK)
end

local function id_arg(name)
  local v = tonumber(ngx.var["arg_" .. name])
  if not v or v < 0 or v ~= math.floor(v) or v >= 2 ^ 53 then
    return json(400, { error = "query parameter '" .. name .. "' must be an integer id" })
  end
  return v
end

-- An optional time in ms (nil when absent or empty).  esx.collector.totals raises on one that
-- is not an integer (caller mistakes raise): a client's ?from=1.5 or ?to=now was a 500.
local function ms_arg(name)
  local raw = ngx.var["arg_" .. name]
  if raw == nil or raw == "" then return nil end
  local v = tonumber(raw)
  if not v or v ~= math.floor(v) or v <= -2 ^ 53 or v >= 2 ^ 53 then
    return json(400, { error = "query parameter '" .. name .. "' must be an integer (ms)" })
  end
  return v
end

--- location = /collect
function _M.collect()
  return esx_nginx.collect(col)
end

--- location = /articles  GET ?user=U&page=P -> the page's articles with `read` for U
function _M.articles()
  local user, page = id_arg("user"), id_arg("page")
  -- (a page past MAX_PAGE was the client's mistake answered 502: Elasticsearch refuses it)
  if page < 1 or page > articles.MAX_PAGE then
    return json(400, { error = "page must be 1-" .. articles.MAX_PAGE })
  end
  local body, err = cache:read_articles_json(user, page)
  if not body then return json(502, { error = tostring(err) }) end
  ngx.header["Content-Type"] = "application/json"
  ngx.print(body)
end

--- location = /articles/read  POST ?article=A&user=U -> stores the read, then marks the cache
function _M.mark_read()
  if ngx.req.get_method() ~= "POST" then return json(405, { error = "POST expected" }) end
  local article, user = id_arg("article"), id_arg("user")
  local id, doc = articles.read_doc(article, user)
  local res
  -- refresh=wait_for: when the article's reader set is not cached, mark_read has nothing to
  -- update and the next load searches "reads", where the read must be visible by then
  local p, err = client:send("PUT", "/reads/_doc/" .. id .. "?refresh=wait_for", doc)
  if p then res, err = esx_nginx.wait(p, 10000) end
  if not res then return json(502, { error = tostring(err) }) end
  cache:mark_read(article, user) -- every worker sees it before its next answer
  ngx.status = 204
  return ngx.exit(ngx.OK)
end

--- location = /api/rollups  ?site=S[&from=ms&to=ms] -> totals and per-window series, merged
-- across every collector instance (both workers here, every host in production).
function _M.rollups()
  local site = ngx.var.arg_site
  if not site or not site:match("^[%w_.-]+$") then return json(400, { error = "site expected" }) end
  local q = { site_id = site, from = ms_arg("from"), to = ms_arg("to") }
  local totals, err = collector_mod.totals(client, q)
  if not totals then return json(502, { error = tostring(err) }) end
  q.by_window = true
  local series, serr = collector_mod.totals(client, q)
  if not series then return json(502, { error = tostring(serr) }) end
  return json(200, { site = site, window = col.o.rollup.window, totals = totals, series = series })
end

--- location = /api/sites -> the site ids that have rollups
function _M.sites()
  local res, err = client:search("rollups-*", { size = 0,
    aggs = { sites = { terms = { field = "site_id", size = 1000 } } } })
  if not res then return json(502, { error = tostring(err) }) end
  local sites = {}
  for _, b in ipairs(res.aggregations and res.aggregations.sites.buckets or {}) do
    sites[#sites + 1] = b.key
  end
  table.sort(sites)
  return json(200, { sites = sites })
end

-- Per-worker stats, written every 250 ms into a shared dict so that any worker can answer
-- /api/stats for all of them.
local function publish(premature)
  if premature then return end
  local s = { pid = ngx.worker.pid(), collector = col:stats(), cache = cache:stats(),
              client = client:stats() }
  ngx.shared.esx_stats:set("worker:" .. ngx.worker.id(), cjson.encode(s), 5)
end

--- init_worker_by_lua
function _M.init_worker()
  publish()
  ngx.timer.every(0.25, publish)
  require("esx.nginx").share_metrics("esx_metrics")
end

--- exit_worker_by_lua: on a graceful stop or a reload, the worker's collector sends what it
-- holds in memory and the open window's rollup rows (within 5 s; the spool keeps the rest)
function _M.exit_worker()
  col:close(5000)
end

--- location = /api/stats -> {workers = {stats of each worker}}
function _M.stats()
  local workers = {}
  for i = 0, ngx.worker.count() - 1 do
    local s = ngx.shared.esx_stats:get("worker:" .. i)
    workers[#workers + 1] = s and cjson.decode(s) or nil
  end
  return json(200, { workers = workers })
end

--- location = /metrics -> Prometheus text of every worker's esx objects
function _M.metrics()
  ngx.header["Content-Type"] = "text/plain; version=0.0.4"
  ngx.print(require("esx.nginx").metrics("esx_metrics"))
end

return _M
