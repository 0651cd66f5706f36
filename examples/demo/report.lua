--- examples/demo/report.lua -- what the demo prints after the traffic: events accepted vs
-- indexed, the rollups of one site merged across both nginx workers, the cache's hit ratios and
-- bytes per reader, and the client pools' stats.  Reads Elasticsearch with esx.client and the
-- example nginx's /api/stats (each worker's stats, published through a shared dict).

local socket = require "socket"
local cjson = require "cjson.safe"
local collector = require "esx.collector"

local _M = {}

local function printf(...) io.write(string.format(...), "\n") end

local function workers(web)
  local res = web:request("GET", "/api/stats")
  local doc = res and cjson.decode(res.body)
  return doc and doc.workers or {}
end

local function sum(list, get)
  local n = 0
  for _, w in ipairs(list) do n = n + (get(w) or 0) end
  return n
end

local function ratio(hits, misses)
  local n = hits + misses
  return n > 0 and string.format("%.1f %%", 100 * hits / n) or "-"
end

--- Waits until everything accepted is indexed and the rollups add up (or `timeout` s).
-- -> indexed events, rollup count total, rows of `site`, instances
local function settle(es, o, summary)
  local deadline = socket.gettime() + o.timeout
  local indexed, rolled, rows = 0, 0, {}
  while true do
    es:refresh("events-*,rollups-*")
    indexed = es:count("events-*", { query = { term = { run = o.run } } }) or 0
    rolled = 0
    for _, site in ipairs(o.sites) do
      local r = collector.totals(es, { site_id = site, from = o.from }) or {}
      if site == o.site then rows = r end
      rolled = rolled + sum(r, function(x) return x.count end)
    end
    if (indexed >= summary.accepted and rolled >= summary.accepted) or socket.gettime() > deadline then
      return indexed, rolled, rows
    end
    socket.sleep(0.5)
  end
end

local function instances(es, site, from)
  local res = es:search("rollups-*", { size = 0, query = { bool = { filter = {
      { term = { site_id = site } }, { range = { window_start = { gte = from } } } } } },
    aggs = { i = { terms = { field = "instance", size = 100 } } } })
  return res and res.aggregations and #res.aggregations.i.buckets or 0
end

-- Reader ids behind the cache: the bulk-loaded sets plus the reads recorded since.
local function reader_ids(es)
  local res = es:search("readers", { size = 1000, _source = { "user_ids" } })
  local n = 0
  for _, hit in ipairs(res and res.hits.hits or {}) do n = n + #hit._source.user_ids end
  return n + (es:count("reads", { query = { match_all = {} } }) or 0), res and #res.hits.hits or 0
end

--- print(es, web, o, summary) -> true when accepted == indexed.  o: run, from, site, sites,
-- timeout, dashboard
function _M.print(es, web, o, summary)
  local indexed, rolled, rows = settle(es, o, summary)
  local ws = workers(web)
  local col_accepted = sum(ws, function(w) return w.collector.accepted end)
  printf("\n== events")
  printf("  sent in %d requests: accepted %d (collectors' own count: %d), indexed %d%s",
    summary.requests, summary.accepted, col_accepted, indexed,
    indexed == summary.accepted and "  -- equal" or "  -- MISMATCH")
  printf("  rollup counts (all sites, all instances): %d%s", rolled,
    rolled == summary.accepted and "  -- equal" or "  -- MISMATCH")
  local shed = sum(ws, function(w) return w.collector.rejected.total end)
  printf("  rejected by the collectors: %d; dead-lettered (refused by Elasticsearch for good) %d; written ahead to the disk spool before the 2xx %d", shed,
    sum(ws, function(w) return w.collector.dead_lettered end), sum(ws, function(w) return w.collector.spooled end))

  printf("\n== rollups for site %q, merged from %d collector instances (esx.collector.totals)",
    o.site, instances(es, o.site, o.from))
  local by = {}
  for _, r in ipairs(rows) do
    local k = r.block_id .. "\0" .. r.variant
    by[k] = by[k] or { block = r.block_id, variant = r.variant, view = 0, click = 0, uniques = 0 }
    if r.type == "view" then by[k].view, by[k].uniques = r.count, r.uniques
    elseif r.type == "click" then by[k].click = r.count end
  end
  local keys = {}
  for k in pairs(by) do keys[#keys + 1] = k end
  table.sort(keys)
  printf("  %-8s %-7s %11s %7s %7s %15s", "block", "variant", "impressions", "clicks", "CTR", "unique visitors")
  for _, k in ipairs(keys) do
    local b = by[k]
    printf("  %-8s %-7s %11d %7d %6.2f%% %15d", b.block, b.variant, b.view, b.click,
      b.view > 0 and 100 * b.click / b.view or 0, b.uniques)
  end

  local ids, sets = reader_ids(es)
  printf("\n== cache (esx.cache, shared = true): %d articles, %d reader ids in Elasticsearch", sets, ids)
  for _, w in ipairs(ws) do
    local c = w.cache
    local full = c.readers.entries >= sets
    printf("  worker %d: pages hit %s, reader sets hit %s, loads of pages %d, of reader sets %d, %d sets in %d bytes%s",
      w.pid, ratio(c.pages.hits, c.pages.misses), ratio(c.readers.hits, c.readers.misses),
      c.pages.loads, c.readers.loads, c.readers.entries, c.readers.bytes,
      full and ids > 0 and string.format(" = %.2f bytes per reader", c.readers.bytes / ids) or "")
  end

  printf("\n== client pools (esx.client in each worker, to %s)", o.es_url)
  for _, w in ipairs(ws) do
    local c = w.client
    local failures = {}
    for k, v in pairs(c.failures) do if v > 0 then failures[#failures + 1] = string.format("%s=%d", k, v) end end
    printf("  worker %d: %d requests, %d retries, failures {%s}, pool now: in_use %d idle %d waiting %d, pool timeouts %d, sent %d bytes as %d on the wire (gzip)",
      w.pid, c.requests, c.retries, table.concat(failures, " "), c.pool.in_use, c.pool.idle or 0,
      c.pool.waiting, c.pool.pool_timeouts, c.bytes.sent_raw, c.bytes.sent_wire)
  end
  printf("\n== dashboard: %s", o.dashboard)
  return indexed == summary.accepted and rolled == summary.accepted
end

return _M
