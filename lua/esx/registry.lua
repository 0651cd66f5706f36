--- esx.registry: the live esx objects of this Lua state, for esx.metrics().
--
-- Objects register themselves with a kind ("client", "collector", "cache", "bulk"), a name and a
-- function that, given the object, returns its stats table.  The set is weak-keyed and an
-- entry never refers to its object (LuaJIT has no ephemeron tables: a value that reached
-- its key would keep it alive), so registering never keeps an object alive; a closed object
-- unregisters itself.

local ipairs, pairs, type, tostring, concat, sort, format, floor, huge =
  ipairs, pairs, type, tostring, table.concat, table.sort, string.format, math.floor, math.huge

local _M = {}

local live = setmetatable({}, { __mode = "k" })
local sequence = 0

--- Registers obj; returns the name it was given ("client1", ... unless name: the next number
-- whose name no live object of the kind has).
-- stats_fn(obj) is called for esx.metrics(); it must not be a closure over obj.  An object
-- registered again stays one entry, in its place, under its name (or the new one given: a
-- rename), and takes no number: each registration used to count as a new object, so the
-- object got a new made-up name (its series broke in two) and the next object's number
-- skipped one.
function _M.add(obj, kind, name, stats_fn)
  local entry = live[obj]
  if entry then
    entry.kind, entry.stats = kind, stats_fn
    if name then entry.name = name end
    return entry.name
  end
  sequence = sequence + 1
  local order = sequence
  if not name then
    -- a made-up name skips the names live objects of its kind have: a user's "client2" (or
    -- an earlier object's made-up one, after a rename) made two series of one name, the
    -- later one exported as "client2#<n>", a name that changes with the order of creation
    local taken = {}
    for _, e in pairs(live) do
      if e.kind == kind then taken[e.name] = true end
    end
    name = kind .. sequence
    while taken[name] do
      sequence = sequence + 1
      name = kind .. sequence
    end
  end
  live[obj] = { kind = kind, name = name, stats = stats_fn, order = order }
  return name
end

function _M.remove(obj)
  live[obj] = nil
end

local function escape_label(s)
  return (tostring(s):gsub("[\\\"\n]", { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

-- The Prometheus type of each stats field, by kind and flattened path ("pool_in_use"); a
-- table whose every field has one type (e.g. bytes) is named by its own path.  Counters are
-- exported with the suffix _total; fields not listed are exported untyped.
local COUNTER, GAUGE = "counter", "gauge"
local types = {
  client = {
    requests = COUNTER, responses = COUNTER, retries = COUNTER, rebuilds = COUNTER,
    failures = COUNTER, bytes = COUNTER, pool_pool_timeouts = COUNTER, nodes_requests = COUNTER,
    pool_in_use = GAUGE, pool_idle = GAUGE, pool_open = GAUGE, pool_waiting = GAUGE,
    nodes_alive = GAUGE, nodes_failures = GAUGE, nodes_in_flight = GAUGE, nodes_dead_until = GAUGE,
  },
  collector = {
    requests = COUNTER, accepted = COUNTER, rejected = COUNTER, shipped = COUNTER,
    retried = COUNTER, dead_lettered = COUNTER, dead_letter_failed = COUNTER, spooled = COUNTER,
    replayed = COUNTER, spilled = COUNTER, spool_skipped_bytes = COUNTER,
    spool_segments_gone = COUNTER, spool_segments_refused = COUNTER,
    spool_segments_pid_reused = COUNTER,
    spool_sync_failed = COUNTER, bulk_requests = COUNTER,
    bulk_failures = COUNTER, rollup_dropped = COUNTER, rollup_written = COUNTER, rollup_lost = COUNTER,
    rate_unlimited = COUNTER, indices_created = COUNTER, index_create_failed = COUNTER,
    queued_events = GAUGE, queued_bytes = GAUGE, in_flight = GAUGE, delayed = GAUGE,
    spool_bytes = GAUGE, spool_claims_failing = GAUGE, rollup_rows = GAUGE, rollup_bytes = GAUGE, lag_ms = GAUGE, in_progress = GAUGE,
    utilization = GAUGE,
  },
  cache = {
    evictions = COUNTER, load_errors = COUNTER, waits = COUNTER, resets = COUNTER,
    pages_hits = COUNTER, pages_misses = COUNTER, pages_loads = COUNTER,
    pages_evictions = COUNTER, pages_expirations = COUNTER,
    readers_hits = COUNTER, readers_misses = COUNTER, readers_loads = COUNTER,
    readers_evictions = COUNTER, readers_expirations = COUNTER,
    bytes = GAUGE, log_bytes = GAUGE, pages_bytes = GAUGE, pages_entries = GAUGE,
    readers_bytes = GAUGE, readers_entries = GAUGE, seq = GAUGE, applied = GAUGE, shared = GAUGE,
  },
  bulk = {
    added = COUNTER, indexed = COUNTER, failed = COUNTER, retried = COUNTER, batches = COUNTER,
    split = COUNTER, on_drop_errors = COUNTER,
    buffered = GAUGE, in_flight = GAUGE, delayed = GAUGE,
  },
}

-- One line of HELP per family, by kind and flattened path (as `types`), from the field's
-- meaning in the docs (docs/client.md, collector.md, cache.md): a family without one is flagged
-- by promtool's lint, and the Prometheus UI shows it to whoever reads the series.  Plain text:
-- no backslash, no newline (HELP escapes neither here).
local help = {
  client = {
    requests = "Calls submitted.",
    responses = "Calls that ended with an HTTP response (any status).",
    retries = "Attempts after a call's first.",
    rebuilds = "Engines rebuilt after a fork or a dead I/O thread.",
    failures = "Calls that ended with an error, by error kind.",
    pool_in_use = "Connection slots taken.",
    pool_idle = "Open idle connections.",
    pool_open = "Open connections.",
    pool_waiting = "Calls waiting for a connection slot.",
    pool_pool_timeouts = "Calls that gave up waiting for a connection slot (pool_timeout).",
    bytes_sent_raw = "Request body bytes before gzip.",
    bytes_sent_wire = "Request body bytes as sent.",
    bytes_received_wire = "Response body bytes as received.",
    bytes_received_raw = "Response body bytes after inflation.",
    nodes_alive = "1 while the node is alive, 0 while it is marked dead.",
    nodes_failures = "Consecutive failures of the node.",
    nodes_requests = "Requests sent to the node.",
    nodes_in_flight = "Requests in flight on the node.",
    nodes_dead_until = "Wall-clock ms until which the node is marked dead (0 when alive).",
  },
  collector = {
    requests = "Requests that reached parsing.",
    accepted = "Events accepted (answered 2xx).",
    rejected = "Events or requests refused, by reason.",
    queued_events = "Events not yet acknowledged by Elasticsearch.",
    queued_bytes = "Bytes charged to queue_max_bytes.",
    in_flight = "Bulk requests in flight.",
    delayed = "Events waiting out a retry back-off.",
    shipped = "Events acknowledged by Elasticsearch (409 included).",
    retried = "Event retries scheduled.",
    dead_lettered = "Events Elasticsearch rejected for good, written to the dead-letter file.",
    dead_letter_failed = "Events whose dead-letter line could not be written: lost.",
    spooled = "Events written to the spool.",
    replayed = "Events loaded back from the spool.",
    spilled = "Events accepted while memory was full, written to disk only.",
    spool_bytes = "Bytes of the spool's files on disk.",
    spool_skipped_bytes = "Bytes of spool records skipped on replay (torn, damaged or gone).",
    spool_segments_gone = "Spool segments whose file was removed before their replay.",
    spool_segments_refused = "Spool segments left on disk: not this user's private file, or unreadable.",
    spool_segments_pid_reused = "Dead processes' segments claimed while their pid was reused.",
    spool_sync_failed = "fdatasync calls of the spool's files that failed.",
    spool_claims_failing = "Dead processes' spool segments whose claim failed at the last scan.",
    bulk_requests = "Bulk requests made.",
    bulk_failures = "Bulk requests that failed as a whole.",
    indices_created = "Indices this process created with esx's mappings.",
    index_create_failed = "Index creations refused for good.",
    rollup_rows = "Rollup rows held.",
    rollup_bytes = "Bytes the rollup rows, their sketches and the table's buckets hold.",
    rollup_dropped = "Events not counted in rollups (no row could be made, or no memory).",
    rollup_written = "Rollup row writes queued.",
    rollup_lost = "Rollup rows close() could not write or deliver: lost.",
    rate_unlimited = "Requests admitted without a rate bucket (max_sites full).",
    lag_ms = "Age in ms of the oldest unacknowledged event: the shipping lag.",
    in_progress = "Requests in progress.",
    utilization_concurrency = "in_progress / max_concurrent.",
    utilization_queue = "queued_bytes / queue_max_bytes.",
    utilization_lag_ms = "Age in ms of the oldest unacknowledged event.",
  },
  cache = {
    pages_hits = "List page lookups answered from the cache.",
    pages_misses = "List page lookups not in the cache.",
    pages_loads = "List pages loaded.",
    pages_entries = "List pages cached.",
    pages_bytes = "Bytes of the cached list pages.",
    pages_evictions = "List pages evicted to stay within max_bytes.",
    pages_expirations = "List pages expired.",
    readers_hits = "Reader set lookups answered from the cache.",
    readers_misses = "Reader set lookups not in the cache.",
    readers_loads = "Reader sets loaded.",
    readers_entries = "Reader sets cached.",
    readers_bytes = "Bytes of the cached reader sets.",
    readers_evictions = "Reader sets evicted to stay within max_bytes.",
    readers_expirations = "Reader sets expired.",
    bytes = "Bytes of both tiers, never above max_bytes.",
    evictions = "Entries evicted to stay within max_bytes.",
    load_errors = "Loader failures and bad data.",
    waits = "Callers that waited for another caller's load in this Lua state.",
    seq = "Change-log sequence written (by any worker). With shared = true the same value " ..
          "in every worker (one shared log): aggregate with max, not sum.",
    applied = "Change-log sequence applied in this process.",
    resets = "Times this process had fallen behind the change log and dropped its tiers.",
    log_bytes = "Bytes of the change-log (and, shared, hand-off) mapping, outside max_bytes. " ..
                "With shared = true one region, the same value in every worker: aggregate " ..
                "with max, not sum.",
    shared = "1 when the cache is shared between nginx workers (the shared option).",
  },
  bulk = {
    added = "Operations added.",
    indexed = "Operations indexed (done).",
    failed = "Operations given up on (dropped).",
    retried = "Operation retries scheduled.",
    batches = "Batches sent.",
    split = "Batches refused as a whole (too large) and split in two.",
    on_drop_errors = "on_drop callbacks that raised.",
    buffered = "Operations buffered, not yet sent.",
    in_flight = "Batches in flight.",
    delayed = "Operations waiting out a retry back-off.",
  },
}

-- Tables of counters by cause, exported as one family with the cause as a label
-- (esx_client_failures_total{kind="reset"}); their "total" entry is the family's sum, left out.
local by_label = {
  client = { failures = "kind" },
  collector = { rejected = "reason" },
}

-- Flattens a stats table into samples {name, labels, value, type}: nested keys join with "_";
-- lists of tables (e.g. nodes) become one series per element labelled by its `url` or index
-- (an id seen twice in one list -- a node listed twice -- gets "#<position>", and
-- "#<position>-<k>" should that be taken too).
local function flatten(kind, path, labels, t, out, typ)
  local known, helps = types[kind] or {}, help[kind] or {}
  for k, v in pairs(t) do
    local key = (path and (path .. "_") or "") .. tostring(k):gsub("[^%w_]", "_")
    local tv = type(v)
    local ktype = typ or known[key]
    local label = not path and by_label[kind] and by_label[kind][key]
    if tv == "number" or tv == "boolean" then
      out[#out + 1] = { "esx_" .. kind .. "_" .. key .. (ktype == COUNTER and "_total" or ""), labels,
                        tv == "boolean" and (v and 1 or 0) or v, ktype or "untyped", helps[key] }
    elseif label and tv == "table" then
      for cause, n in pairs(v) do
        if cause ~= "total" and type(n) == "number" then
          out[#out + 1] = { "esx_" .. kind .. "_" .. key .. "_total",
                            labels .. "," .. label .. '="' .. escape_label(cause) .. '"', n, COUNTER,
                            helps[key] }
        end
      end
    elseif tv == "table" then
      if #v > 0 and type(v[1]) == "table" then
        local seen = {}
        for i, item in ipairs(v) do
          local base = tostring(item.url or item.name or i)
          local id, k = base, 1
          -- (a node URL holds no '#' -- esx.client raises on one with a fragment -- but an
          -- item's name may: "#<position>" may be another item's id, then "-<k>" too)
          while seen[id] do
            id = base .. "#" .. i .. (k > 1 and ("-" .. k) or "")
            k = k + 1
          end
          seen[id] = true
          flatten(kind, key, labels .. ',item="' .. escape_label(id) .. '"', item, out, ktype)
        end
      else
        flatten(kind, key, labels, v, out, ktype)
      end
    end
  end
end

-- Go's ParseFloat reads what Prometheus reads: NaN, +Inf and -Inf, not C's nan/inf
local function number_text(v)
  if v ~= v then return "NaN" end
  if v == huge then return "+Inf" end
  if v == -huge then return "-Inf" end
  if v == floor(v) and v > -2^53 and v < 2^53 then return format("%d", v) end
  return format("%.17g", v)
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
  local samples, names = {}, {}
  for _, item in ipairs(objs) do
    local entry = item.entry
    local ok, stats = pcall(entry.stats, item.obj)
    if ok and type(stats) == "table" then
      -- two live objects of a kind with one name (a name given twice, an object replaced
      -- but not yet collected) would give duplicate series: the later ones get "#<n>", and
      -- "#<n>-<k>" should a name of that form be taken too
      local name, k = entry.name, 1
      while names[entry.kind .. "\0" .. name] do
        name = entry.name .. "#" .. entry.order .. (k > 1 and ("-" .. k) or "")
        k = k + 1
      end
      names[entry.kind .. "\0" .. name] = true
      flatten(entry.kind, nil, 'name="' .. escape_label(name) .. '"', stats, samples)
    end
  end
  sort(samples, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  local last
  for _, s in ipairs(samples) do
    if s[1] ~= last then
      if s[5] then lines[#lines + 1] = "# HELP " .. s[1] .. " " .. s[5] end
      lines[#lines + 1] = "# TYPE " .. s[1] .. " " .. s[4]
      last = s[1]
    end
    lines[#lines + 1] = format("%s{%s} %s", s[1], s[2], number_text(s[3]))
  end
  return concat(lines, "\n") .. "\n"
end

return _M
