--- examples/demo/demo.lua -- drives the demo traffic against the example nginx with a live
-- progress line, then prints the report (examples/demo/report.lua).  Started by
-- examples/demo/run once Elasticsearch and nginx are up and the articles are loaded.
--
--   lua5.4 examples/demo/demo.lua --url http://127.0.0.1:8080 --es http://127.0.0.1:9200
--        [--duration 24] [--rate 400] [--concurrency 64] [--users 20000] [--articles 60]
--        [--site news]
-- Exits 1 when the events accepted and the events indexed (or the rollup counts) differ.

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. here .. "/../?.lua;" .. here .. "/../../lua/?.lua;" ..
  here .. "/../../lua/?/init.lua;" .. package.path
package.cpath = here .. "/../../build/" .. (jit and "luajit" or "lua5.4") .. "/?.so;" .. package.cpath

local socket = require "socket"
local esx = require "esx"
local cjson = require "cjson.safe"
local traffic = require "traffic"
local report = require "report"

local o = require("args").parse(arg, { url = "http://127.0.0.1:8080", es = "http://127.0.0.1:9200",
  -- concurrency: 5% of the requests are mark-reads, each holding its slot until Elasticsearch's
  -- next refresh (up to 1 s); with 32, at the spike's 1200 req/s they held every slot, the
  -- spike reached ~1000 req/s and its backlog was sent after it, at twice the base rate
  duration = 24, rate = 400, concurrency = 64, users = 20000, articles = 60, site = "news" },
  "usage: demo.lua --url URL --es URL [--duration s] [--rate n] [--concurrency n] [--users n] [--articles n] [--site id]")

math.randomseed(os.time())
local run = "r" .. os.time() .. math.random(1000, 9999) -- tags this run's events
local tty = (function() local ok = os.execute("test -t 1") return ok == true or ok == 0 end)()
local web = assert(esx.client{ hosts = { o.url }, name = "demo-web" })
local es = assert(esx.client{ hosts = { o.es }, name = "demo-es" })
local WINDOW = 5000
local from = math.floor(socket.gettime() * 1000 / WINDOW) * WINDOW

local function queue()
  local res = web:request("GET", "/api/stats")
  local doc = res and cjson.decode(res.body)
  local n = 0
  for _, w in ipairs(doc and doc.workers or {}) do n = n + w.collector.queued_events end
  return n
end

io.write(("== traffic: %d s at %d req/s (x3 spike from %g s to %g s), up to %d in flight, %d users, sites %s\n"):format(
  o.duration, o.rate, 0.4 * o.duration, 0.6 * o.duration, o.concurrency,
  o.users, table.concat(traffic.SITES, ",")))
io.write("   req/s (last 3 s) | HTTP statuses | events accepted | article pages read, marked read | events queued in the collectors\n")
local last_line = 0
-- (t, requests sent) every half second: the rate printed is that of the last 3 s, as far
-- apart as the lines are without a terminal.  p.rps, of the last half second alone, swings
-- from 0 to twice the rate while mark-reads that wait for Elasticsearch's refresh hold every
-- slot, and printed 0 req/s on lines whose counts had grown by a thousand requests.
local samples = { { t = 0, n = 0 } }
local summary = traffic.run{
  url = o.url, duration = o.duration, rate = o.rate, concurrency = o.concurrency,
  users = o.users, articles = o.articles, run = run,
  on_progress = function(p)
    samples[#samples + 1] = { t = p.t, n = p.s.requests }
    while #samples > 2 and p.t - samples[2].t >= 3 do table.remove(samples, 1) end
    if not tty and p.t - last_line < 3 then return end
    last_line = p.t
    local first = samples[1]
    local rps = p.t > first.t and (p.s.requests - first.n) / (p.t - first.t) or 0
    local st = {}
    for code, n in pairs(p.s.statuses) do st[#st + 1] = code .. ":" .. n end
    for kind, n in pairs(p.s.errors) do st[#st + 1] = kind .. ":" .. n end
    table.sort(st)
    local line = ("%5.1fs %s %5.0f req/s | %s | events %d | pages %d marks %d | queue %d"):format(
      p.t, p.spike and "SPIKE" or "     ", rps, table.concat(st, " "), p.s.accepted,
      p.s.articles, p.s.reads, queue())
    io.write(tty and ("\r\27[K" .. line) or (line .. "\n"))
    io.flush()
  end,
}
if tty then io.write("\n") end
io.write(("== sent %d requests in %.1f s (peak %.0f req/s over half a second)\n"):format(summary.requests,
  summary.seconds, summary.peak_rps))

local ok = report.print(es, web, { run = run, from = from, site = o.site, sites = traffic.SITES,
  timeout = 20, es_url = o.es, dashboard = o.url .. "/dashboard/?site=" .. o.site .. "&range=300" }, summary)
web:close()
es:close()
os.exit(ok and 0 or 1)
