-- bench/client/report.lua -- turns the raw lines of bench/client/run into
-- bench/results/client.md (tables), client.dat (for plotting) and client.gp (gnuplot script
-- that draws client.png).
--
--   lua5.4 bench/client/report.lua RESULTS_FILE OUT_DIR

local results_file, out_dir = arg[1], arg[2]
assert(results_file and out_dir, "usage: report.lua RESULTS_FILE OUT_DIR")

local search, wire, speed, info = {}, {}, {}, { machine = {}, version = {}, config = {} }
for line in io.lines(results_file) do
  local kind, rest = line:match("^(%S+) (.*)$")
  if kind == "search" then
    local name, conc, kv = rest:match("^(%S+) (%d+) (.*)$")
    local r = {}
    for k, v in kv:gmatch("([%w_]+)=([%d.]+)") do r[k] = tonumber(v) end
    conc = tonumber(conc)
    search[name] = search[name] or {}
    search[name][conc] = search[name][conc] or {}
    table.insert(search[name][conc], r)
  elseif kind == "wire" then
    local name, level, raw, w, sw, sr = rest:match("^(%S+) (%d+) (%d+) (%d+) (%d+) (%d+)")
    wire[name] = wire[name] or {}
    wire[name][tonumber(level)] = { raw = tonumber(raw), wire = tonumber(w), server_wire = tonumber(sw),
                                    server_raw = tonumber(sr) }
  elseif kind == "speed" then
    local name, level, mbps, reps = rest:match("^(%S+) (%d+) ([%d.]+) (%d+)")
    speed[name] = speed[name] or {}
    speed[name][tonumber(level)] = { mbps = tonumber(mbps), reps = tonumber(reps) }
  elseif info[kind] then
    local key, value = rest:match("^(%S+) ?(.*)$")
    info[kind][key] = value
  end
end

local PEERS = { "wrk", "esx-lua5.4", "esx-luajit", "node" }
local ALL_PEERS = { "wrk", "esx-lua5.4", "esx-luajit", "node", "esx-lua5.4-raw", "esx-luajit-raw",
                    "esx-lua5.4-placed", "esx-luajit-placed" }
local PEER_LABEL = { wrk = "wrk (ceiling)", ["esx-lua5.4"] = "esx, Lua 5.4", ["esx-luajit"] = "esx, LuaJIT",
                     ["esx-lua5.4-raw"] = "*esx, Lua 5.4, body not decoded*",
                     ["esx-luajit-raw"] = "*esx, LuaJIT, body not decoded*",
                     ["esx-lua5.4-placed"] = "*esx, Lua 5.4, threads placed*",
                     ["esx-luajit-placed"] = "*esx, LuaJIT, threads placed*",
                     node = "@elastic/elasticsearch " .. (info.version["node-client"] or "") .. " (Node " ..
                       (info.version.node or "?") .. ")" }
local BULKS = { "events", "products" }
local BULK_LABEL = { events = "browser events", products = "product catalog" }
local TARGET_SAVED = { events = 80, products = 90 }
local LEVELS = { 1, 6, 9 }
local CONCS = { 1, 16 }

local md = {}
local function w(...) md[#md + 1] = table.concat({ ... }) end
local function fmt_int(n)
  local s = string.format("%d", math.floor(n + 0.5))
  return (s:reverse():gsub("(%d%d%d)", "%1,"):reverse():gsub("^,", ""))
end
local function median(list)
  if #list == 0 then return nil end
  table.sort(list)
  local m = (#list + 1) // 2
  return #list % 2 == 1 and list[m] or (list[m] + list[m + 1]) / 2
end
local function rounds(peer, conc) return search[peer] and search[peer][conc] or {} end
local function field(peer, conc, f)
  local v = {}
  for _, r in ipairs(rounds(peer, conc)) do v[#v + 1] = f(r) end
  return v
end
-- median searches/s over the rounds
local function rate(peer, conc) return median(field(peer, conc, function(r) return r.rate end)) end
local function rate_range(peer, conc)
  local v = field(peer, conc, function(r) return r.rate end)
  if #v < 2 then return "" end
  table.sort(v)
  return string.format(" (%s–%s)", fmt_int(v[1]), fmt_int(v[#v]))
end
-- median CPU microseconds per search: the client process, the nginx worker
local function cpu_us(peer, conc)
  return median(field(peer, conc, function(r) return r.cpu and r.cpu / r.searches * 1e6 end))
end
local function server_us(peer, conc)
  return median(field(peer, conc, function(r) return r.server_cpu and r.server_cpu / r.searches * 1e6 end))
end
local function cores(peer, conc)
  return median(field(peer, conc, function(r) return r.cpu and r.cpu / r.seconds end))
end
local function ratio(a, b) if a and b and b > 0 then return string.format("%.2fx", a / b) end return "–" end
local function saved(name, level)
  local x = wire[name] and wire[name][level]
  return x and (1 - x.wire / x.raw) * 100
end

w("## Client benchmark (`bench/client/run`)")
w("")
w("Measured ", info.machine.date or "?", " on ", info.machine.nproc or "?", " cores (", info.machine.cpu or "?",
  "), Linux ", info.machine.kernel or "?", "; esx ", info.version.esx or "?", ", Lua ", info.version["lua5.4"] or "?",
  ", LuaJIT ", info.version.luajit or "?", ", Node ", info.version.node or "?", ", nginx ",
  info.version.nginx or "?", ", wrk ", info.version.wrk or "?", ", zlib ", info.version.zlib or "?", ".")
w("All traffic is on loopback; the peers ran one after the other in the same run, so compare ratios",
  " rather than absolute figures (the machine is shared and has 2 cores: the server, the client and",
  " the client's I/O thread compete for them).")
w("")
w("### Searches per second")
w("")
w("Canned endpoint: nginx with **1 worker** (so every peer meets the same single-process server),",
  " `return 200` with a ", info.config.body or "?", "-byte Elasticsearch 8 search response (10 hits,",
  " `X-Elastic-Product: Elasticsearch`, `application/json`; `bench/client/search_response.json`).",
  " Each peer sends `POST /goods/_search` with the same query for ", info.config.seconds or "?",
  " s (the clients after a ", info.config.warmup or "?", " s warm-up) per round, in one process: esx at concurrency",
  " 16 keeps 16 `c:send` pendings outstanding, Node 16 concurrent `client.search` promises, wrk",
  " `-t1 -c16`. The clients encode the query and decode the response on every search; wrk does",
  " neither.")
w("")
local bg, over = {}, 0
for _, p in ipairs(ALL_PEERS) do for _, c in ipairs(CONCS) do
  for _, r in ipairs(rounds(p, c)) do
    if r.background then
      bg[#bg + 1] = r.background
      if r.background > tonumber(info.config.quiet_busy or "1") then over = over + 1 end
    end
  end
end end
w("Median over ", info.config.rounds or "?", " rounds (min–max in brackets); ratios are of medians.")
if #bg > 0 then
  table.sort(bg)
  w("The machine is shared: before each measurement the run waited (≤ ", info.config.quiet_wait or "?",
    " s each, ≤ ", info.config.quiet_budget or "?", " s in all) for other processes to use ≤ ", string.format("%.0f%%", tonumber(info.config.quiet_busy) * 100),
    " of it; their share just before the measurements was median ", string.format("%.0f%%", median(bg) * 100),
    ", max ", string.format("%.0f%%", bg[#bg] * 100), " (", over, " of ", #bg, " measurements started above the bar).")
end
w("")
w("| peer | c=1 searches/s | c=16 searches/s | c=16 vs node | c=16 vs wrk | c=1 vs node | c=1 vs wrk |")
w("|---|--:|--:|--:|--:|--:|--:|")
for _, p in ipairs(ALL_PEERS) do
  local r1, r16 = rate(p, 1), rate(p, 16)
  if r1 or r16 then
    w("| ", PEER_LABEL[p], " | ", r1 and fmt_int(r1) or "–", rate_range(p, 1), " | ", r16 and fmt_int(r16) or "–",
      rate_range(p, 16), " | ", ratio(r16, rate("node", 16)), " | ", ratio(r16, rate("wrk", 16)), " | ",
      ratio(r1, rate("node", 1)), " | ", ratio(r1, rate("wrk", 1)), " |")
  end
end
local errs = 0
for _, p in ipairs(ALL_PEERS) do for _, c in ipairs(CONCS) do
  for _, r in ipairs(rounds(p, c)) do errs = errs + (r.errors or 0) end
end end
w("")
-- The same medians over only the measurements that started on a quiet machine.
local bar = tonumber(info.config.quiet_busy or "0")
local function quiet_rate(peer, conc)
  local v = {}
  for _, r in ipairs(rounds(peer, conc)) do
    if r.background and r.background <= bar then v[#v + 1] = r.rate end
  end
  return median(v), #v
end
local all_quiet = true
for _, p in ipairs(PEERS) do
  if not quiet_rate(p, 16) then all_quiet = false end
end
if all_quiet and over > 0 then
  w("Only the measurements that started on a quiet machine (≤ ", string.format("%.0f%%", bar * 100),
    " busy), c=16 medians:")
  w("")
  w("| peer | c=16 searches/s (quiet) | measurements | vs node | vs wrk |")
  w("|---|--:|--:|--:|--:|")
  local qn, qw = quiet_rate("node", 16), quiet_rate("wrk", 16)
  for _, p in ipairs(ALL_PEERS) do
    local r, n = quiet_rate(p, 16)
    if r then
      w("| ", PEER_LABEL[p], " | ", fmt_int(r), " | ", n, " | ", ratio(r, qn), " | ", ratio(r, qw), " |")
    end
  end
  w("")
end
w("Failed or short searches: ", errs, ". Rows in italics are for analysis only: esx checking the",
  " status and body size instead of decoding the JSON (`ESX_BENCH_RAW=1`), i.e. the transport alone;",
  " and esx with its threads placed by hand for the run (`taskset`: the Lua thread alone on CPU 1,",
  " the I/O thread together with the nginx worker on CPU 0), i.e. the same code without the",
  " scheduler's placement -- the three busy threads share two cores, and the kernel otherwise",
  " wakes them across cores and leaves a core idle part of the time.")
w("")
w("Targets at c=16: esx ≥ 3x the Node client and ≥ 0.4x wrk.")
w("")
for _, p in ipairs({ "esx-lua5.4", "esx-luajit" }) do
  local r, n, k = rate(p, 16), rate("node", 16), rate("wrk", 16)
  if r and n and k then
    w("- ", PEER_LABEL[p], ": ", string.format("%.2fx", r / n), " node (", r / n >= 3 and "met" or "**missed**",
      "), ", string.format("%.2fx", r / k), " wrk (", r / k >= 0.4 and "met" or "**missed**", ").")
  end
end
w("")
w("CPU per search (median over rounds; the client is the whole process -- for esx the Lua thread",
  " plus its I/O thread, for Node the main thread plus libuv -- the server is the nginx worker;",
  " both over the measured seconds only, the clients' warm-up left out). Both share the machine's ",
  info.machine.nproc or "?", " cores, so at c=16 the searches/s are at most nproc / (client + server",
  " CPU per search), less when a core idles:")
w("")
w("| peer | client µs/search c=1 | client µs/search c=16 | client cores busy c=16 | nginx µs/search c=16 |")
w("|---|--:|--:|--:|--:|")
local function f1(x) return x and string.format("%.1f", x) or "–" end
for _, p in ipairs(ALL_PEERS) do
  if rate(p, 1) or rate(p, 16) then
    w("| ", PEER_LABEL[p], " | ", f1(cpu_us(p, 1)), " | ", f1(cpu_us(p, 16)), " | ",
      cores(p, 16) and string.format("%.2f", cores(p, 16)) or "–", " | ", f1(server_us(p, 16)), " |")
  end
end
w("")
w("CPU per search relative to Node at c=16 (less sensitive to other load on the machine than",
  " searches/s; \"x less CPU\" = Node µs ÷ esx µs):")
w("")
for _, p in ipairs({ "esx-lua5.4", "esx-luajit", "esx-lua5.4-raw", "esx-luajit-raw", "esx-lua5.4-placed",
                    "esx-luajit-placed" }) do
  local e, n = cpu_us(p, 16), cpu_us("node", 16)
  if e and n then
    w("- ", PEER_LABEL[p], ": ", string.format("%.1f µs vs %.1f µs, %.2fx less CPU", e, n, n / e), ".")
  end
end
w("")
w("### Bulk: bytes on the wire with compression on")
w("")
w("Two ~1 MB NDJSON bulks made by `bench/client/datagen.lua` (fixed seed, same bytes every run):",
  " **browser events** (", info.config.events_docs or "?", " beacons: site/block/variant/type, a random",
  " 48-bit `user_id`, a random 32-bit `event_id` that is also the `_id`, timestamps, URL, referrer, user",
  " agent, viewport) and **product catalog** (", info.config.products_docs or "?", " fashion products:",
  " Japanese names, brand, category, prices, colours with per-size stock and SKU, tags, description,",
  " dates). Each is sent once per level through esx (`compression = true, compression_level = L`)",
  " to the dev server, which inflates and indexes it; bytes from `c:stats().bytes`, checked against",
  " the body sizes the server logged.")
w("")
w("| bulk | raw bytes | level | wire bytes | saved | server saw (wire / raw) |")
w("|---|--:|--:|--:|--:|---|")
for _, b in ipairs(BULKS) do
  for _, l in ipairs(LEVELS) do
    local x = wire[b] and wire[b][l]
    if x then
      local ok = x.server_wire == x.wire and x.server_raw == x.raw
      w("| ", BULK_LABEL[b], " | ", fmt_int(x.raw), " | ", l, " | ", fmt_int(x.wire), " | ",
        string.format("%.1f%%", saved(b, l)), " | ", fmt_int(x.server_wire), " / ", fmt_int(x.server_raw),
        ok and " (same)" or " (**differs**)", " |")
    end
  end
end
w("")
for _, b in ipairs(BULKS) do
  local parts = {}
  for _, l in ipairs(LEVELS) do
    local s = saved(b, l)
    if s then parts[#parts + 1] = string.format("level %d %.1f%% (%s)", l, s,
      s >= TARGET_SAVED[b] and "met" or "**missed**") end
  end
  w("- ", BULK_LABEL[b], ", target ≥ ", TARGET_SAVED[b], "% saved: ", table.concat(parts, ", "), ".")
end
w("")
w("### Compression throughput")
w("")
w("esx gzips a request body inside `c:send`, in the calling thread (in nginx: the worker), before",
  " the I/O thread sees it. MB/s = raw MB / CPU time spent in `c:send` (CPU, not wall time, so that",
  " other processes on the machine do not count), repeated for ≥ 1 s per level",
  " against the canned endpoint (each answer awaited before the next send). \"off\" is the same loop",
  " without compression: the cost of `c:send` itself.")
w("")
w("| bulk | off MB/s | level 1 MB/s | level 6 MB/s | level 9 MB/s | ms per MB at 1 / 6 / 9 |")
w("|---|--:|--:|--:|--:|--:|")
for _, b in ipairs(BULKS) do
  local s = speed[b] or {}
  local function mb(l) return s[l] and string.format("%.0f", s[l].mbps) or "–" end
  local function ms(l) return s[l] and string.format("%.1f", 1000 / s[l].mbps) or "–" end
  w("| ", BULK_LABEL[b], " | ", mb(0), " | ", mb(1), " | ", mb(6), " | ", mb(9), " | ", ms(1), " / ", ms(6),
    " / ", ms(9), " |")
end
w("")
-- Break-even: the link speed below which level 6 gets a bulk onto the wire sooner than
-- level 1 (compress time + wire bytes / bandwidth).
w("Choosing the default: level L costs `raw/speed(L)` of CPU and saves wire bytes. Going from",
  " level 1 to level 6 pays off in time only on links slower than (wire₁ − wire₆) / (t₆ − t₁):")
w("")
for _, b in ipairs(BULKS) do
  local s, x = speed[b], wire[b]
  if s and x and s[1] and s[6] and x[1] and x[6] then
    local t1, t6 = x[1].raw / 1e6 / s[1].mbps, x[6].raw / 1e6 / s[6].mbps
    local dbytes = x[1].wire - x[6].wire
    local be = dbytes / (t6 - t1)
    w("- ", BULK_LABEL[b], ": level 6 sends ", string.format("%.0f%%", dbytes / x[1].wire * 100),
      " fewer bytes than level 1 for ", string.format("%.1f", (t6 - t1) * 1000), " ms more CPU per bulk",
      " (", string.format("%.1fx", t6 / t1), "); break-even link ", string.format("%.1f MB/s (%.0f Mbit/s)", be / 1e6, be * 8 / 1e6), ".")
  end
end
w("")
do -- the pick, from the figures above
  local t = {}
  for _, b in ipairs(BULKS) do
    local sp, x = speed[b], wire[b]
    if sp and x and sp[1] and sp[6] and sp[9] and x[1] and x[6] and x[9] then
      t[#t + 1] = string.format("%s: level 1 saves %.1f%% at %.1f ms/MB, level 6 %.1f%% at %.1f ms/MB, level 9 %.1f%% at %.1f ms/MB",
        BULK_LABEL[b], saved(b, 1), 1000 / sp[1].mbps, saved(b, 6), 1000 / sp[6].mbps, saved(b, 9), 1000 / sp[9].mbps)
    end
  end
  if #t > 0 then
    w("**Default: level 1.** ", table.concat(t, "; "), ". Level 1 takes most of the saving for the",
      " least CPU, and that CPU is spent in the caller's thread (an nginx worker serves nothing",
      " meanwhile); level 6 is worth it only where bytes cost more than CPU (slow or metered links,",
      " like the seed's traffic-billed batch); level 9 adds under a point over level 6 for 2–3x its CPU.")
    w("")
  end
end

local f = assert(io.open(out_dir .. "/client.md", "w"))
f:write(table.concat(md, "\n"), "\n")
f:close()

-- client.dat: gnuplot data, two indexed blocks.
local dat = {}
dat[#dat + 1] = "# bench/client/run " .. (info.machine.date or "")
dat[#dat + 1] = "# block 0: peer  c1_searches_per_s  c16_searches_per_s"
for _, p in ipairs(PEERS) do
  dat[#dat + 1] = string.format('"%s" %.1f %.1f', p, rate(p, 1) or 0, rate(p, 16) or 0)
end
dat[#dat + 1] = ""
dat[#dat + 1] = ""
dat[#dat + 1] = "# block 1: level  events_saved_pct  products_saved_pct  events_MBps  products_MBps"
for _, l in ipairs(LEVELS) do
  dat[#dat + 1] = string.format("%d %.2f %.2f %.1f %.1f", l, saved("events", l) or 0, saved("products", l) or 0,
    speed.events and speed.events[l] and speed.events[l].mbps or 0,
    speed.products and speed.products[l] and speed.products[l].mbps or 0)
end
f = assert(io.open(out_dir .. "/client.dat", "w"))
f:write(table.concat(dat, "\n"), "\n")
f:close()

f = assert(io.open(out_dir .. "/client.gp", "w"))
local gp = ([[
# gnuplot script written by bench/client/report.lua; draws client.png from client.dat
set terminal pngcairo size 1100,460 font ",10"
set output "OUT/client.png"
set multiplot layout 1,2 title "esx client benchmark (DATE)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set grid ytics
set key top left
set title "searches/s, canned nginx (1 worker)"
set yrange [0:*]
plot "OUT/client.dat" index 0 using 2:xtic(1) title "c=1", "" index 0 using 3 title "c=16"
set title "bulk gzip through esx: % saved (bars; targets 80/90 dashed), MB/s (lines)"
set xrange [-0.5:2.5]
set yrange [0:125]
set ytics 0,20,100
set y2range [0:*]
set arrow 1 from graph 0, first 80 to graph 1, first 80 nohead dt 2 lc rgb "gray40"
set arrow 2 from graph 0, first 90 to graph 1, first 90 nohead dt 2 lc rgb "gray40"
set y2tics
set ylabel "% bytes saved"
set y2label "MB/s"
set key top center horizontal maxcols 2
plot "OUT/client.dat" index 1 using 2:xtic(sprintf("level %d", $1)) title "events % saved", \
     "" index 1 using 3 title "products % saved", \
     "" index 1 using 0:4 axes x1y2 with linespoints lw 2 title "events MB/s", \
     "" index 1 using 0:5 axes x1y2 with linespoints lw 2 title "products MB/s"
unset multiplot
]]):gsub("OUT", out_dir):gsub("DATE", info.machine.date or "")
f:write(gp)
f:close()
