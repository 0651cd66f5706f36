--- esx.bulk: a bulk indexer for big loads.
--
--   local bi = client:bulk_indexer{ flush_bytes = 5242880, flush_count = 1000, flush_interval = 1000,
--                                   concurrency = 2 }
--   bi:add("index", { _index = "products", _id = "42" }, { name = "..." })
--   local summary = bi:close{ timeout = 60000 } -- {added, indexed, failed, retried, batches, dropped = {...}}
--
-- Buffers operations into _bulk requests (flushed by bytes, by count, and once the oldest is
-- flush_interval old), keeps at most
-- `concurrency` of them in flight, retries items that the server rejected with 429 (or a
-- retryable 5xx) with jittered exponential back-off, splits a batch the server refused as
-- too large (413) or as malformed (400), or whose answer passed the client's
-- max_response_bytes, and reports every item it gives up on with its reason — through
-- `on_drop(item, reason)` and in the summary -- those close() gives up on when its timeout
-- passes too.  Nothing is dropped silently.

local core = require "esx.core"
local json_encode = core.json_encode -- exact integers, unlike cjson 2.1.0 (src/ljson.h)
local options = require "esx.options"
local registry = require "esx.registry"

local type, pairs, ipairs, next, select, pcall, tostring, setmetatable, getmetatable, error, remove, concat, floor =
  type, pairs, ipairs, next, select, pcall, tostring, setmetatable, getmetatable, error, table.remove, table.concat,
  math.floor
-- jitter from the kernel: math.random's state is the same in every LuaJIT process (never
-- seeded at start) and in every nginx worker (forked from the master), so indexers of several
-- processes answered 429 together drew the same back-offs and came back in step
local random = core.random
local insert = table.insert

local _M = {}

_M.schema = {
  flush_bytes = { type = "integer", min = 1, max = 2 ^ 31, default = 5 * 1024 * 1024 },
  flush_count = { type = "integer", min = 1, max = 1000000, default = 1000 },
  -- ms; 0: off (a buffer goes out only when full, at flush() and close())
  flush_interval = { type = "integer", min = 0, max = 3600000, default = 1000 },
  concurrency = { type = "integer", min = 1, max = 64, default = 2 },
  max_retries = { type = "integer", min = 0, max = 100, default = 5 },
  backoff_min = { type = "integer", min = 0, max = 3600000, default = 100 },
  backoff_max = { type = "integer", min = 0, max = 3600000, default = 10000 },
  on_drop = { type = "function" },
  keep_dropped = { type = "integer", min = 0, max = 1000000, default = 10000 },
  name = { type = "string", nonempty = true, check = options.utf8_text },
}

-- items answered 429 or any 5xx are retried (as the collector does); others are dropped
local function retryable(status) return status == 429 or status >= 500 end
local RETRY_AFTER_MAX = 30000
-- (the _id for the request-order check, result for a delete of a missing document)
local BULK_PATH = "/_bulk?filter_path=items.*._id,items.*.status,items.*.result,items.*.error"
local actions = { index = true, create = true, update = true, delete = true }

local Indexer = {}
Indexer.__index = Indexer

local function now() return core.now() end

-- In nginx, true in the phases where ngx.sleep and esx.nginx.wait may yield (ngx.sleep
-- raises "API disabled" anywhere else: init_worker, set, log, filters, ...).
local can_yield = require("esx.client").can_yield

local function sleep(ms)
  if ms <= 0 then return end
  if can_yield() then
    rawget(_G, "ngx").sleep(ms / 1000)
  else
    core.sleep(ms)
  end
end

-- An indexer collected without close() -- forgotten, or a load cut short by an error -- holds
-- operations nobody will send or count: buffered ones, retries waiting out a back-off, and
-- batches whose answer is never read.  Dropped silently, that is what this module promises
-- never to do; as a collector collected without close() does, it says so on stderr (nginx:
-- the error log).  (A proxy carries the finalizer: LuaJIT's tables have no __gc.)
local newproxy = rawget(_G, "newproxy")

local function unsent(self)
  local n = #self.buf + #self.delayed
  for _, b in ipairs(self.splits) do n = n + #b end
  return n
end

local function watch(self)
  local function gc()
    if self.closed then return end
    local c = self.counters
    local open = c.added - c.indexed - c.failed
    if open > 0 then
      io.stderr:write(string.format("esx bulk indexer %s: collected without close(): %d of %d added " ..
        "operations have no outcome (%d waiting to be sent)\n", tostring(self.name), open, c.added,
        unsent(self)))
    end
  end
  if newproxy then
    local p = newproxy(true)
    getmetatable(p).__gc = gc
    return p
  end
  return setmetatable({}, { __gc = gc })
end

function _M.new(client, opts)
  if getmetatable(client) ~= require("esx.client").Client then
    -- (an indexer without a client failed only at its first send)
    error("bad argument #1 to 'esx.bulk.new' (esx.client expected, got " .. type(client) .. ")", 2)
  end
  local o = options.check("bulk_indexer", _M.schema, opts, 4)
  -- as the client's dead_backoff_* and the collector's retry_backoff_*: a cap below the first
  -- delay would silently replace it
  if o.backoff_max < o.backoff_min then
    error("bulk_indexer: bad option 'backoff_max' (must be >= backoff_min)", 3)
  end
  -- a closed client is used as every closed object is: nil, {kind = "closed"} (an indexer
  -- made from it could only drop what it is given)
  local _, cerr = client:stats()
  if cerr then return nil, cerr end
  local self = setmetatable({
    client = client, o = o,
    buf = {}, buf_bytes = 0,          -- items waiting for the next batch
    inflight = {},                    -- {pending, items}
    splits = {},                      -- halves of a batch refused as a whole (413, 400)
    notify = {},                      -- {item, reason} for on_drop, once the batch is settled
    delayed = {},                     -- items waiting out a back-off: {item, due}
    delayed_bytes = 0,
    counters = { added = 0, indexed = 0, failed = 0, retried = 0, batches = 0, split = 0,
                 on_drop_errors = 0 },
    dropped = {},
  }, Indexer)
  -- in esx.metrics() while open, as every object with stats (API.md); Indexer.stats is no
  -- closure over self, so the registry never keeps a forgotten indexer alive
  self.name = registry.add(self, "bulk", o.name, Indexer.stats)
  self.watch = watch(self)
  return self
end

local function backoff(self, attempt)
  local base = self.o.backoff_min * 2 ^ (attempt - 1)
  if base > self.o.backoff_max then base = self.o.backoff_max end
  return floor(base / 2 + random() * base / 2)
end

-- The item is counted and listed at once; on_drop is called once the whole batch is settled
-- (notify), so that a callback that yields (in nginx, a log sent on a cosocket) cannot leave the
-- rest of the batch unaccounted for while another light thread runs (and closes the indexer).
-- Lua out of memory raises here with nothing done (the item is then dropped again, by the
-- settle that goes on where this one stopped): what allocates comes first, the count last.
local function drop(self, item, reason)
  local rec = #self.dropped < self.o.keep_dropped and
    { action = item.action, meta = item.meta, reason = reason }
  local n = self.o.on_drop and { item, reason }
  if rec then self.dropped[#self.dropped + 1] = rec end
  if n then
    local q = self.notify
    local ok, err = pcall(rawset, q, #q + 1, n)
    if not ok then
      if rec then self.dropped[#self.dropped] = nil end
      error(err, 0)
    end
  end
  self.counters.failed = self.counters.failed + 1
end

local function notify(self)
  local q = self.notify
  while q[1] do
    local n = remove(q, 1)
    -- a callback that raises must not take the rest of the batch with it: the item stays
    -- counted and listed, and the callback's failure is counted and its first message kept
    local ok, cerr = pcall(self.o.on_drop, n[1], n[2])
    if not ok then
      self.counters.on_drop_errors = self.counters.on_drop_errors + 1
      self.on_drop_error = self.on_drop_error or tostring(cerr)
    end
  end
end

-- not_before: the least wait the server asked for (Retry-After), in ms.  item.retries counts
-- against max_retries; item.attempts counts sends, which also include the batches a refused
-- one was split into (send_now).  due: the due times given to the items of one batch so far,
-- by retry number -- they fall due together and go out together: each with its own jitter,
-- they fell due one by one and went out as many small bulks, multiplying the requests sent
-- to a cluster that had just answered 429 (the jitter spreads batches and indexers apart).
-- (As drop: Lua out of memory raises with the item neither counted nor listed.)
local function retry_later(self, item, reason, due, not_before)
  if item.retries >= self.o.max_retries then
    drop(self, item, reason .. " (after " .. self.o.max_retries .. " retries)")
    return
  end
  local retries = item.retries + 1
  local at = due[retries]
  if not at then
    local wait = backoff(self, retries)
    if not_before and not_before > wait then wait = not_before end
    at = now() + wait
    due[retries] = at
  end
  self.delayed[#self.delayed + 1] = { item = item, due = at }
  item.retries = retries
  item.last_reason = reason -- (for a close() that gives up on it: see give_up)
  self.counters.retried = self.counters.retried + 1
  self.delayed_bytes = self.delayed_bytes + #item.line
end

-- The Retry-After (seconds or an HTTP-date) of a whole request answered 429, in ms, capped at
-- 30 s as the client caps it; nil when there is none.  (The requests go out with retries = 0,
-- so the client's own 429 handling does not see it.)
local function retry_after(err)
  local h = err.status == 429 and type(err.headers) == "table" and err.headers["retry-after"]
  local ms = type(h) == "string" and core.retry_after_ms(h)
  if not ms then return nil end
  return ms < RETRY_AFTER_MAX and ms or RETRY_AFTER_MAX
end

-- True once the indexer's client is closed, for good: nothing can ever be sent again.
local function client_closed(self)
  local s, err = self.client:stats()
  return s == nil and err.kind == "closed"
end

-- Whole-request failures in which the request never reached a node (nothing was applied).
local not_sent = { pool_timeout = true, connect_timeout = true, connect = true, no_nodes = true }

-- A batch that failed as a whole: its items are retried -- unless the client is closed, for
-- good (no retry can ever be sent): then they are dropped at once, with the reason.  After a
-- failure that may have come after the node applied the batch (a timeout, a reset, a 502 from a
-- proxy), the items are marked: a 409 for a create's retry is then the earlier attempt's own write.
--
-- These (and settle) take a batch's entry {items, done, due}: entry.done counts the items, from
-- the first, that have their outcome.  Each item is counted last, once what it allocates is
-- in place, and entry.done moves past it then: Lua out of memory raises with every item either
-- accounted for or not touched, and the entry, still listed in flight, is settled again from
-- entry.done on (settle_entry).
local function batch_failed(self, entry, err)
  local final = err.kind == "closed" and client_closed(self)
  local maybe_applied = not not_sent[err.kind] and err.status ~= 429
  local not_before, reason = retry_after(err), tostring(err)
  local items = entry.items
  for i = entry.done + 1, #items do
    local it = items[i]
    if final then
      drop(self, it, reason)
    else
      if maybe_applied then it.maybe_applied = true end
      retry_later(self, it, reason, entry.due, not_before)
    end
    entry.done = i
  end
end

-- A 2xx whose results cannot be read item by item: what became of each item is unknown, so
-- each is marked (a 409 for the retry may be this attempt's own write) and retried.
local function outcome_unknown(self, entry, reason)
  local items = entry.items
  for i = entry.done + 1, #items do
    items[i].maybe_applied = true
    retry_later(self, items[i], reason, entry.due)
    entry.done = i
  end
end

-- Puts the two halves of a batch's items without an outcome on the list of batches to send
-- (pump sends them, as slots free up: settling never waits, see settle_oldest).  Both or
-- neither: half of them settled alone again as the refused batch, one item would be dropped
-- as the one at fault.
local function split(self, entry)
  local items, from = entry.items, entry.done + 1
  local half = floor((#items - from + 1) / 2)
  local a, b = {}, {}
  for i = from, #items do
    if i < from + half then a[#a + 1] = items[i] else b[#b + 1] = items[i] end
  end
  local q = self.splits
  q[#q + 1] = a
  local ok, err = pcall(rawset, q, #q + 1, b)
  if not ok then
    q[#q] = nil
    error(err, 0)
  end
  entry.done = #items
  self.counters.split = self.counters.split + 1
end

-- The action an item's result is listed under: an index with op_type "create" is a create
-- (Elasticsearch lists its result under "create", and answers it 409 when the document exists).
local function result_action(it)
  if it.action == "index" and it.meta.op_type == "create" then return "create" end
  return it.action
end

-- Reads a finished batch's outcome: per-item results, or a whole-request failure (entry.err:
-- the request could not be sent).  Goes on from entry.done (see batch_failed).
local function settle(self, entry)
  local items = entry.items
  local from = entry.done + 1
  if from > #items then return end
  if entry.err then return batch_failed(self, entry, entry.err) end
  local res, err = entry.pending:result()
  if not res then
    -- 413: too large; 400: one item (e.g. an unknown metadata field) can make Elasticsearch
    -- refuse the whole request.  Neither gets better by retrying: halve the batch until the
    -- item at fault is alone, and drop only that one.
    if err.kind == "http" and (err.status == 413 or err.status == 400) then
      if from == #items then
        drop(self, items[from], err.status == 413 and "the server refused the item as too large (413)"
          or tostring(err))
        entry.done = from
      else
        split(self, entry)
      end
      return
    end
    -- A 2xx over the client's max_response_bytes (many results, or long error reasons): the
    -- batch was most likely applied, but not one result can be read.  Sent again whole, its
    -- answer would not fit again, and its items, in the index, would end up reported failed.
    -- Halve it until the answers fit; each item is marked, as after any unknown outcome (a 409
    -- for the re-send is this attempt's own write).  One item alone whose answer still does
    -- not fit is retried as an unknown outcome (batch_failed), and so is a refusal (429, 5xx)
    -- with a body that big: after its back-off, not at once.
    if err.kind == "decode" and from < #items and (err.status or 200) < 300 and
        type(err.message) == "string" and err.message:find("max_response_bytes", 1, true) then
      for i = from, #items do items[i].maybe_applied = true end
      split(self, entry)
      return
    end
    -- Another refusal of the request itself (401, 403, a 404 from a proxy), or a redirect (a
    -- 3xx from a proxy: the indexer follows none): retrying cannot change it, and would only
    -- wait out the back-off max_retries times per batch.
    if (err.kind == "http" or err.kind == "not_found") and err.status >= 300 and
        err.status < 500 and err.status ~= 408 and err.status ~= 429 then
      local reason = tostring(err)
      for i = from, #items do
        drop(self, items[i], reason)
        entry.done = i
      end
      return
    end
    batch_failed(self, entry, err)
    return
  end
  local doc = core.json_decode(res.body)
  if type(doc) ~= "table" or type(doc.items) ~= "table" or #doc.items ~= #items then
    return outcome_unknown(self, entry, "bulk response does not list one result per item")
  end
  -- Results come in request order, each under its operation's action and with its _id: one
  -- that is not (a proxy or a broken server that reordered or mixed them) would credit an
  -- item with another's outcome -- a failed document counted as indexed, the wrong one
  -- reported.  Then no result can be trusted: the outcome of every item is unknown.
  for i, it in ipairs(items) do
    local entry_i = doc.items[i]
    local action, r
    if type(entry_i) == "table" then action, r = next(entry_i) end
    local id = it.meta._id
    if type(action) == "string" and (action ~= result_action(it) or type(id) == "string" and
        type(r) == "table" and type(r._id) == "string" and r._id ~= id) then
      return outcome_unknown(self, entry, "bulk response results are not in request order (item " ..
        i .. " is the result of another operation)")
    end
  end
  local due = entry.due
  for i = from, #items do
    local it = items[i]
    local entry_i = doc.items[i]
    local r = type(entry_i) == "table" and select(2, next(entry_i)) or nil
    local status = type(r) == "table" and r.status
    if type(status) ~= "number" or status < 100 or status > 599 then
      -- the outcome is unknown: retried as for a response that does not list every item
      it.maybe_applied = true
      retry_later(self, it, "bulk response item " .. i .. " has no valid status", due)
    elseif status >= 200 and status < 300 or
           -- a delete of a document that is not there: done (Elasticsearch answers 404 with
           -- result "not_found" and no error, and does not count it in "errors")
           status == 404 and it.action == "delete" and r.result == "not_found" and r.error == nil or
           -- a create of a document that exists after an attempt whose outcome was unknown:
           -- that attempt created it, as the collector reads it.  Only a create: a 409 for an
           -- index, update or delete (if_seq_no, a version, an update's concurrent change) is a
           -- conflict that the earlier attempt may or may not explain -- counted as indexed, a
           -- write another writer's change refused would be lost without a word
           status == 409 and it.maybe_applied and result_action(it) == "create" then
      self.counters.indexed = self.counters.indexed + 1
    else
      local e = type(r) == "table" and r.error
      local reason = type(e) == "table" and (tostring(e.type) .. ": " .. tostring(e.reason))
        or ("status " .. tostring(status))
      if status == 409 and it.maybe_applied then
        reason = reason .. " (after an attempt whose outcome was unknown, which may have applied it)"
      end
      if retryable(status) then
        retry_later(self, it, reason, due)
      else
        drop(self, it, reason)
      end
    end
    entry.done = i
  end
end

-- Settles the entry, listed in flight, and takes it off the list: taken off before, a raise
-- while settling (Lua out of memory) lost every item of it not counted yet -- close()'s added
-- == indexed + failed broke.  Left listed, it is settled again, from where it stopped, by the
-- next call that settles (and by close()).  Nothing here yields.
local function settle_entry(self, entry)
  settle(self, entry)
  for i, e in ipairs(self.inflight) do
    if e == entry then
      remove(self.inflight, i)
      break
    end
  end
end

-- True once the entry's outcome can be read without waiting.
local function answered(entry)
  return entry.err ~= nil or entry.pending:ready()
end

local arm -- (below) in nginx, a timer for the work that only time brings: answers, due retries

-- Waits for the oldest batch in flight and settles it.  The batch stays listed while it is
-- waited for and while it is settled, and nothing in settling it yields: in nginx, other
-- light threads sharing the indexer count it against `concurrency`, and their close() waits
-- for it, whichever thread sees it done first settles it.
-- deadline (a close()'s timeout, in now() ms; nil: none) bounds the wait: -> false when it
-- passed with the batch still running (left in flight), true otherwise.
local function settle_oldest(self, deadline)
  local entry = self.inflight[1]
  if not entry then return true end
  local p = entry.pending
  if answered(entry) then
    p = nil
  elseif can_yield() then
    require("esx.nginx").wait(p, deadline and deadline - now())
    -- the waiter failed (its socket unreachable, as under a burst of waits): the batch is
    -- still running and its outcome is needed.  Poll for it, yielding between looks, rather
    -- than block the worker and every request on it for as long as the batch takes.
    local nap = 1
    while not p:ready() and not (deadline and now() >= deadline) do
      rawget(_G, "ngx").sleep(nap / 1000)
      if nap < 64 then nap = nap * 2 end
    end
  end
  -- outside nginx, or in a phase that cannot yield: block for it (the client's own timeouts
  -- bound the wait)
  if p and not p:ready() then
    if not deadline then
      p:wait()
    elseif not p:wait(deadline - now()) then
      return false
    end
  end
  for _, e in ipairs(self.inflight) do
    if e == entry then -- (not settled by another light thread meanwhile)
      settle_entry(self, entry)
      break
    end
  end
  notify(self)
  arm(self)
  return true
end

-- Sends one batch: a slot is free.  -> its entry, listed in flight: the batch is then no longer
-- the caller's to list (before, Lua out of memory raises with nothing listed).  The entry of a
-- batch that cannot be sent holds the error (entry.err): its caller settles it at once, once
-- the batch is off the buffer, and calls on_drop (notify) after: on_drop may yield, and another
-- light thread would meanwhile send the batch again from there.
local function send_now(self, items)
  local lines = {}
  for _, it in ipairs(items) do
    lines[#lines + 1] = it.line
  end
  local body = concat(lines)
  self.counters.batches = self.counters.batches + 1
  -- the indexer retries items itself, so the transport does not repeat whole batches; it asks
  -- for the result fields settle reads, as the collector does: the whole results (_index,
  -- _version, _shards, _seq_no, ...) are ~3x as big, and a response over the client's
  -- max_response_bytes fails the batch, applied, as a decode error (then sent again, split)
  local p, err = self.client:send("POST", BULK_PATH, body,
    { content_type = "application/x-ndjson", retries = 0 })
  local entry = { pending = p, err = not p and err or nil, items = items, done = 0, due = {} }
  self.inflight[#self.inflight + 1] = entry
  if p then
    for _, it in ipairs(items) do it.attempts = it.attempts + 1 end -- sends, for on_drop
  end
  return entry
end

-- The next batch at the front of the buffer (a copy: the buffer is not touched): it closes at
-- the operation that reaches flush_count or flush_bytes.  Returns it and its bytes.
local function next_batch(self)
  local buf, count, max_bytes = self.buf, self.o.flush_count, self.o.flush_bytes
  local batch, bytes, n = {}, 0, #buf
  repeat
    local it = buf[#batch + 1]
    batch[#batch + 1] = it
    bytes = bytes + #it.line
  until #batch == n or #batch >= count or bytes >= max_bytes
  return batch, bytes
end

-- Takes k operations (of bytes) off the front of the buffer, in place: nothing is allocated,
-- so this cannot fail once their batch is in flight.
local function drop_front(self, k, bytes)
  local buf = self.buf
  local n = #buf
  for i = 1, n - k do buf[i] = buf[i + k] end
  for i = n, n - k + 1, -1 do buf[i] = nil end
  self.buf_bytes = self.buf_bytes - bytes
end

-- Sends the halves of refused batches, then (unless splits_only) the buffer, a batch per free
-- slot.  Items stay listed (splits, buf) until the slot for them is free: the wait for it may
-- yield to another light thread, which may send them or close the indexer meanwhile.
-- deadline: a close()'s timeout (see settle_oldest); once it passed nothing more is sent.
local function pump(self, splits_only, deadline)
  while self.splits[1] or (not splits_only and self.buf[1]) do
    if deadline and now() >= deadline then break end
    local slot = true
    while #self.inflight >= self.o.concurrency do
      if not settle_oldest(self, deadline) then slot = false break end
    end
    if not slot then break end
    -- Lua out of memory (building the batch or its body, in client:send) raises: the batch
    -- must then still be listed (buf, splits), or close() would never account for its items
    -- (added ~= indexed + failed).  A batch from the buffer leaves it only once sent, without
    -- allocating; a split is put back (its list exists: the put-back does not grow a table
    -- beyond what it held).
    local batch, entry = self.splits[1], nil
    if batch then
      remove(self.splits, 1)
      local ok, res = pcall(send_now, self, batch)
      if not ok then
        insert(self.splits, 1, batch)
        error(res, 0)
      end
      entry = res
    else
      if splits_only or not self.buf[1] then break end
      local bytes
      batch, bytes = next_batch(self)
      entry = send_now(self, batch)
      drop_front(self, #batch, bytes)
    end
    if entry.err then settle_entry(self, entry) end
    notify(self)
  end
  arm(self)
end

-- Moves the retries that are due (all: every one) to the buffer -> how many it moved.  Once
-- the client is closed every one is due: no back-off can make it sendable, and sent, each is
-- dropped at once ("closed"), as the items of a request that failed because it was closed --
-- rather than close(), or an add() held by the retries, sleeping out their back-off (up to
-- backoff_max, or a Retry-After's 30 s) to drop them then.
local function take_due(self, all)
  if #self.delayed == 0 then return 0 end
  all = all or client_closed(self)
  local t, keep, n = now(), {}, #self.delayed
  for _, d in ipairs(self.delayed) do -- one pass: removing in place is quadratic
    if all or d.due <= t then
      self.buf[#self.buf + 1] = d.item
      self.buf_bytes = self.buf_bytes + #d.item.line
      self.delayed_bytes = self.delayed_bytes - #d.item.line
    else
      keep[#keep + 1] = d
    end
  end
  self.delayed = keep
  return n - #keep
end

-- When the oldest buffered operation is flush_interval old (nil: nothing buffered, or no
-- flush_interval).  buf[1] is the oldest: the buffer goes out from the front.
local function buffer_due_at(self)
  local first, fi = self.buf[1], self.o.flush_interval
  if not first or fi == 0 then return nil end
  return first.queued + fi
end

local function buffer_stale(self)
  local at = buffer_due_at(self)
  return at ~= nil and now() >= at
end

local function soonest_due(self)
  local soonest = self.delayed[1].due
  for _, d in ipairs(self.delayed) do if d.due < soonest then soonest = d.due end end
  return soonest
end

-- When retries (and a buffer flush_interval old) go out.  A retry falls due, and a buffer
-- ages, while nobody calls the indexer: in plain Lua (no timers) they wait for the next call
-- that sends -- an add() that fills a batch, finds the buffer flush_interval old or holds the
-- producer, flush(), close().  In nginx a timer (ngx.timer.at) does that work instead: it
-- waits for the batches in flight (their answers make the retries), then, when the soonest
-- retry falls due or the oldest buffered operation is flush_interval old, sends as flush()
-- does, until nothing is in flight, waiting or buffered.  One timer per indexer at a time
-- (timer_due: when the pending one fires; timer_running: one is at work, and arms the next
-- itself).  Where no timer can be made (init_by_lua, too many pending timers), it is all left
-- to the next call as in plain Lua.
local function timer_at()
  local ngx = rawget(_G, "ngx")
  local t = ngx and ngx.timer
  return t and t.at
end

-- How long the timer a worker's graceful exit fires early spends sending what the indexer
-- holds (as the 5 s flush of a collector collected without close()).
local EXIT_FLUSH_MS = 5000

local function on_timer(premature, self, due)
  if self.timer_due == due then self.timer_due = nil end
  if self.closed or self.timer_running then return end
  self.timer_running = true
  local ok, err = pcall(function()
    if premature then
      -- The worker exits (a graceful stop, a reload) and fires its timers early.  Left to
      -- close(), what the indexer holds was lost with the worker whenever exit_worker_by_lua
      -- did not close it (only the collected-without-close() line said so): it goes out now,
      -- every retry with it (no back-off can be waited out), and the answers are read, for
      -- up to EXIT_FLUSH_MS.  What is still without an outcome then (retries those answers
      -- made, batches still running) is close()'s, or the collected-without-close() line's.
      local deadline = now() + EXIT_FLUSH_MS
      self.exiting = true -- (no timer after this one: an exiting worker fires it at once)
      take_due(self, true)
      pump(self, false, deadline)
      while self.inflight[1] and settle_oldest(self, deadline) do end
      return
    end
    while self.inflight[1] do settle_oldest(self) end
    -- due retries go out as flush() sends them (with what is buffered), and so does a buffer
    -- whose oldest operation is flush_interval old; without either, only the halves of
    -- refused batches: a load's batch being filled is not cut short
    local stale = buffer_stale(self)
    pump(self, take_due(self, false) == 0 and not stale)
  end)
  self.timer_running = false
  if not ok then error(err, 0) end -- (nginx logs it; the items stay listed for close())
  arm(self)
end

arm = function(self)
  local at = timer_at()
  if not at or self.closed or self.timer_running or self.exiting then return end
  local due
  if self.inflight[1] or self.splits[1] then
    due = now()
  else
    if self.delayed[1] then due = soonest_due(self) end
    local stale_at = buffer_due_at(self)
    if stale_at and (not due or stale_at < due) then due = stale_at end
    if not due then return end
  end
  if self.timer_due and self.timer_due <= due then return end
  local delay = due - now()
  local made, handle = pcall(at, delay > 0 and delay / 1000 or 0, on_timer, self, due)
  if made and handle then self.timer_due = due end
end

--- bi:flush() -- sends what is buffered (and retries that are due) now, in batches that keep
-- to flush_count and flush_bytes (retries that fell due together would otherwise make one
-- batch as big as everything that failed).
function Indexer:flush()
  if self.closed then return nil, core.error("closed", "the bulk indexer is closed") end
  take_due(self, false)
  pump(self)
  return true
end

--- bi:add(action, meta, doc?) -> true | nil, err (kind "closed"; "internal" when memory runs
-- out encoding it) -- buffers one operation;
-- may send a batch (and wait for a slot when `concurrency` batches are in flight).  Raises
-- on a malformed operation.
function Indexer:add(action, meta, doc)
  if self.closed then return nil, core.error("closed", "the bulk indexer is closed") end
  if not actions[action] then error("bad argument #1 to 'add' (unknown action " .. tostring(action) .. ")", 2) end
  if type(meta) ~= "table" then error("bad argument #2 to 'add' (metadata table expected)", 2) end
  if meta._index then require("esx.client").check_index(meta._index, 2, "add") end
  local head, err, why = json_encode({ [action] = meta })
  if not head and why == "nomem" then return nil, core.error("internal", "out of memory encoding the operation") end
  if not head then error("bad argument #2 to 'add' (metadata cannot be encoded as JSON: " .. tostring(err) .. ")", 2) end
  local line
  if action == "delete" then
    if doc ~= nil then error("bad argument #3 to 'add' (delete takes no document)", 2) end
    line = head .. "\n"
  else
    if doc == nil then error("bad argument #3 to 'add' (" .. action .. " needs a document)", 2) end
    if type(doc) ~= "table" and type(doc) ~= "string" then
      error("bad argument #3 to 'add' (document table or JSON string expected, got " .. type(doc) .. ")", 2)
    end
    local body
    if type(doc) == "string" then body = doc else body, err, why = json_encode(doc) end
    if not body and why == "nomem" then return nil, core.error("internal", "out of memory encoding the operation") end
    if not body then error("bad argument #3 to 'add' (document cannot be encoded as JSON: " .. tostring(err) .. ")", 2) end
    if body:find("\n", 1, true) then error("bad argument #3 to 'add' (document contains a newline)", 2) end
    line = head .. "\n" .. body .. "\n"
  end
  -- the item keeps its own copy of meta: a caller that reuses one table for every add (meta._id
  -- = row.id; bi:add("index", meta, row)) must not see its drops reported under the last _id
  local m = {}
  for k, v in pairs(meta) do m[k] = v end
  -- counted once buffered: Lua out of memory building or storing the item raises with
  -- nothing counted, so that close()'s added == indexed + failed still holds
  -- (queued: when it was buffered, for flush_interval)
  self.buf[#self.buf + 1] = { action = action, meta = m, line = line, attempts = 0, retries = 0,
                              queued = now() }
  self.counters.added = self.counters.added + 1
  self.buf_bytes = self.buf_bytes + #line
  -- A batch goes out when it is full -- or when its oldest operation is flush_interval old: an
  -- indexer fed now and then held a user's last operations until close().  In plain Lua (no
  -- timers) this is the only place the age is looked at; in nginx the indexer's timer also
  -- sends the buffer then, with no call (arm).
  if #self.buf >= self.o.flush_count or self.buf_bytes >= self.o.flush_bytes or buffer_stale(self) then
    self:flush()
  end
  -- settle finished batches without waiting, so retries flow back early
  while self.inflight[1] and answered(self.inflight[1]) do settle_oldest(self) end
  -- Items waiting out a back-off (a cluster answering 429: slow down) hold the producer once
  -- they are worth `concurrency` full batches: it waits for the soonest retry and sends it,
  -- rather than piling up every document it is given in memory.
  while #self.delayed > 0 and (#self.delayed >= self.o.concurrency * self.o.flush_count or
        self.delayed_bytes >= self.o.concurrency * self.o.flush_bytes) do
    if not client_closed(self) then sleep(soonest_due(self) - now()) end
    self:flush()
    while self.inflight[1] and answered(self.inflight[1]) do settle_oldest(self) end
    if #self.inflight >= self.o.concurrency then settle_oldest(self) end
  end
  pump(self, true) -- the halves of a batch refused as a whole (settled above)
  return true
end

-- bi:close's argument: nil, a timeout in ms, or {timeout = ms} -> the timeout (nil: none).
-- Raises as a client call's options do: a misspelt name would otherwise leave close unbounded.
local CLOSE_TIMEOUT = { type = "integer", min = 0, max = options.MAX_SAFE_INTEGER }
local function close_timeout(opts)
  if opts == nil then return nil end
  if type(opts) == "table" then
    -- of several bad options the first in string order is named, the same in every run
    local bad, bad_why
    for k, v in pairs(opts) do
      local why = k ~= "timeout" and "unknown option" or options.violation(CLOSE_TIMEOUT, v)
      if why and (bad == nil or tostring(k) < bad) then bad, bad_why = tostring(k), why end
    end
    if bad then error("bad option '" .. bad .. "' to 'close' (" .. bad_why .. ")", 3) end
    return opts.timeout
  end
  if type(opts) ~= "number" then
    error("bad argument #1 to 'close' (options table or timeout in ms expected, got " .. type(opts) .. ")", 3)
  end
  local why = options.violation(CLOSE_TIMEOUT, opts)
  if why then error("bad argument #1 to 'close' (timeout: " .. why .. ")", 3) end
  return opts
end

-- True while some operation has no outcome yet: buffered, halves of a refused batch, in
-- flight, or waiting out a back-off.
local function open_work(self)
  return #self.inflight > 0 or #self.delayed > 0 or #self.buf > 0 or #self.splits > 0
end

-- Gives up on list's operations (item_of(element) is one) from the first, each with what,
-- and takes those it counted off the list, in place (nothing allocated, as drop_front):
-- Lua out of memory in give raises with the list holding exactly the operations not counted
-- yet.  Before, the lists were emptied only once all were given up on, so the operations
-- counted before the failure stayed listed, and the next close() counted them again.
-- -> the bytes of the operations taken off.
local function give_list(list, give, what, item_of)
  local k, bytes = 0, 0
  local ok, err = pcall(function()
    for j = 1, #list do
      local it = item_of(list[j])
      give(it, what)
      k, bytes = j, bytes + #it.line
    end
  end)
  local n = #list
  for j = 1, n - k do list[j] = list[j + k] end
  for j = n, n - k + 1, -1 do list[j] = nil end
  if not ok then error(err, 0) end
  return bytes
end

local function itself(it) return it end
local function delayed_item(d) return d.item end

-- close()'s timeout passed: every operation still without an outcome is dropped with the
-- reason, none left uncounted -> how many.  Batches already answered are read first (their
-- items get their outcome); a batch still running is left to the client (its answer is never
-- read: it may have been applied) and its items are reported with an unknown outcome.  Nothing
-- here yields: another light thread finds the lists empty, not half dealt with.  Lua out of
-- memory raises with every operation either counted and off its list, or listed and not
-- counted (a batch in flight keeps its cursor, entry.done): close() again goes on from there.
local function give_up(self, timeout)
  local i = 1
  while self.inflight[i] do
    local e = self.inflight[i]
    if answered(e) then
      settle_entry(self, e)
    else
      i = i + 1
    end
  end
  local why = string.format("request_timeout: bi:close() gave up after %d ms ", timeout)
  self.timed_out = self.timed_out or 0 -- (kept: a close() that raised has counted some)
  local function give(it, what)
    drop(self, it, why .. what .. (it.last_reason and (" (retried after: " .. it.last_reason .. ")") or ""))
    self.timed_out = self.timed_out + 1
  end
  local inflight = self.inflight
  for _, e in ipairs(inflight) do
    for k = e.done + 1, #e.items do
      give(e.items[k], "with the operation's batch in flight: its outcome is unknown")
      e.done = k
    end
  end
  for j = #inflight, 1, -1 do inflight[j] = nil end
  local splits = self.splits
  while splits[1] do
    give_list(splits[1], give, "before sending the operation", itself)
    remove(splits, 1)
  end
  self.buf_bytes = self.buf_bytes - give_list(self.buf, give, "before sending the operation", itself)
  self.delayed_bytes = self.delayed_bytes -
    give_list(self.delayed, give, "while the operation waited to be retried", delayed_item)
  return self.timed_out
end

--- bi:close([timeout_ms | {timeout = ms}]) -> summary: flushes, waits out retries and returns
-- {added, indexed, failed, retried, batches, split, timed_out, dropped = {{action, meta, reason}...}}.
-- added == indexed + failed once close returns: with a timeout, what has no outcome when it
-- passes is dropped (timed_out counts it).  Calling it again returns the same summary.
function Indexer:close(opts)
  local timeout = close_timeout(opts)
  if self.summary then return self.summary end
  local deadline = timeout and now() + timeout
  local function send()
    if self.closed then return end -- (another light thread's close() finished meanwhile)
    take_due(self, false)
    pump(self, false, deadline)
  end
  send()
  while open_work(self) and not (deadline and now() >= deadline) do
    while #self.inflight > 0 and settle_oldest(self, deadline) do end
    if #self.delayed > 0 and not client_closed(self) then
      local wake = soonest_due(self)
      if deadline and deadline < wake then wake = deadline end
      sleep(wake - now())
    end
    send()
  end
  -- another light thread's close() may have finished first while this one waited (in nginx,
  -- for the same batch): the one summary is the answer to both
  if self.summary then return self.summary end
  local timed_out = open_work(self) and give_up(self, timeout) or self.timed_out or 0
  local s = self:stats()
  s.dropped = self.dropped
  s.timed_out = timed_out
  self.closed, self.summary = true, s
  registry.remove(self)
  -- on_drop for the operations given up on (it may yield: the indexer is closed meanwhile)
  notify(self)
  s.on_drop_errors = self.counters.on_drop_errors
  s.on_drop_error = self.on_drop_error
  return s
end

--- bi:stats() -> counters so far | nil, err (kind "closed": bi:close() returned them)
function Indexer:stats()
  if self.closed then return nil, core.error("closed", "the bulk indexer is closed") end
  local s = {}
  for k, v in pairs(self.counters) do s[k] = v end
  s.buffered = #self.buf
  for _, b in ipairs(self.splits) do s.buffered = s.buffered + #b end
  s.in_flight = #self.inflight
  s.delayed = #self.delayed
  return s
end

-- bi.add(...) with '.' raises "bad self to 'add' (...)" (see options.lua)
options.guard_methods(Indexer, "esx bulk indexer", "bi")

return _M
