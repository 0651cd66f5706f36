--- esx.cache: the two-tier article cache (seed 002).
--
-- Tier 1 holds the first `max_pages` pages of the article list (global data, one copy for all
-- users); tier 2 holds, per article, the set of ids of the users who read it as a Roaring
-- bitmap in C.  `read_articles(user_id, page_no)` composes them: the page's articles, each a
-- copy with `read` set, all flags computed in one call into C.
--
-- The C core (src/cache.c, bound by src/lcache.c) owns the byte budget, the LRU order, TTLs,
-- the change log and the shared-memory state.  This file owns the control flow that calls the
-- loaders: it must be Lua, because loaders may yield (cosockets, esx.nginx.wait) and LuaJIT
-- cannot yield across a C function.
--
-- Single flight.  Concurrent misses for one key call the loader once:
--   * in one Lua state, the first caller registers an in-flight record and loads; later
--     callers wait on the record -- in nginx on an ngx.semaphore the loader posts when done,
--     elsewhere with `opts.wait` (default: coroutine.yield() in a plain-Lua coroutine) --
--     then share its result.  A caller that cannot wait (the main thread of plain Lua, a non-yieldable nginx
--     phase) or that waited `lock_timeout` ms loads by itself.
--   * with shared = true, the first caller of a process also takes a lock slot in shared
--     memory; other processes wait for it and receive the result through the slot's hand-off
--     buffer.  A lock held past `lock_timeout`, or by a dead process, is taken over.

local core = require "esx.core"
local options = require "esx.options"
local registry = require "esx.registry"

local type, pcall, error, setmetatable, tostring, ipairs =
  type, pcall, error, setmetatable, tostring, ipairs
local floor, min, huge = math.floor, math.min, math.huge
local co_yield, co_isyieldable = coroutine.yield, coroutine.isyieldable
local make_error, core_clock, json_encode = core.error, core.cache_clock, core.cache_json

local ngx = rawget(_G, "ngx")
local semaphore -- in nginx: waiters of one worker sleep on a semaphore the loader posts
if ngx then
  local ok, m = pcall(require, "ngx.semaphore")
  if ok then semaphore = m end
end

local PAGE, READERS = 1, 2
local OP_MARK, OP_INV_ARTICLE, OP_INV_PAGES = 1, 2, 3
local MAX_SAFE = 9007199254740991
local MAX_FLIGHT_MARKS = 4096 -- marks recorded on one reader-set load in flight (note_mark)

local _M = {}

local Cache = {}
Cache.__index = Cache

local Tx = {}
Tx.__index = Tx

-- shared = true in nginx maps its region for the processes forked after it: created in a
-- worker (init_worker, a request, a timer) it would be that worker's alone, and the others'
-- caches, made the same way, would never see its changes.
local function check_shared(v)
  if v and ngx and ngx.get_phase then
    local phase = ngx.get_phase()
    if phase ~= "init" and ngx.worker and ngx.worker.count and ngx.worker.count() > 1 then
      return nil, "a shared cache must be created in init_by_lua*, before nginx forks its " ..
        "workers; created in the " .. tostring(phase) .. " phase it would be one worker's"
    end
  end
  return v
end

local schema = {
  load_page = { type = "function", required = true },
  load_readers = { type = "function", required = true },
  page_ttl = { type = "number", default = 5000, min = 0 },
  max_pages = { type = "integer", default = 10, min = 0, max = 100000 },
  readers_ttl = { type = "number", default = 600000, min = 0 },
  max_bytes = { type = "integer", default = 67108864, min = 0 },
  shared = { type = "boolean", default = false, check = check_shared },
  -- at most what nginx's semaphore wait takes (whole ms in a C int)
  lock_timeout = { type = "number", default = 5000, min = 0, max = 2147483647 },
  clock = { type = "function" },
  wait = { type = "function" },
  name = { type = "string", nonempty = true, check = options.utf8_text },
}

-- ---- private helpers ----------------------------------------------------------------------

local function is_id(v)
  return type(v) == "number" and v >= 0 and v <= MAX_SAFE and v == floor(v)
end

local function check_id(v, n, fname, what)
  if not is_id(v) then
    local got = type(v) == "number" and "number out of range or not an integer" or type(v)
    error("bad argument #" .. n .. " to '" .. fname .. "' (" .. what ..
      " must be an integer in [0, 2^53), got " .. got .. ")", 3)
  end
end

local function check_page_no(v, fname)
  if type(v) ~= "number" or v < 1 or v > MAX_SAFE or v ~= floor(v) then
    error("bad argument #2 to '" .. fname .. "' (page_no must be an integer in [1, 2^53), got " ..
      (type(v) == "number" and tostring(v) or type(v)) .. ")", 3)
  end
end

local function closed_error()
  return nil, make_error("closed", "the cache is closed")
end

-- CLOCK_MONOTONIC, in nginx too: ngx.now() is the wall clock, and a step of it back (NTP, an
-- operator) kept every entry for the size of the step past its ttl.  Every process of the
-- machine reads the same monotonic clock, as a shared cache needs.
local function default_clock()
  return core_clock
end

-- The caller's clock, its readings checked: a value that is not a finite number raises naming
-- the option (it raised as a bad argument of an internal method, or -- NaN, an infinity --
-- gave an entry stored then an expiry that never comes: served for ever, whatever the ttl).
local function checked_clock(clock)
  return function()
    local t = clock()
    if type(t) ~= "number" or t ~= t or t == huge or t == -huge then
      error("esx.cache: bad option 'clock' (returned " ..
        (type(t) == "number" and tostring(t) or type(t)) ..
        ", expected a finite number of milliseconds)", 0)
    end
    return t
  end
end

-- wait(attempt) pauses the current light thread / coroutine; false when it cannot.
local function default_wait()
  if ngx and ngx.sleep then
    return function(attempt)
      return (pcall(ngx.sleep, min(0.001 * 2 ^ attempt, 0.01)))
    end
  end
  return function()
    if co_isyieldable() then
      co_yield()
      return true
    end
    return false
  end
end

-- The loaded id list with the marks made while it loaded (a fresh table: the loader's own
-- list is not modified).
local function with_marks(list, marks)
  local out, n = {}, #list
  for i = 1, n do out[i] = list[i] end
  for i = 1, #marks do out[n + i] = marks[i] end
  return out
end

-- Drops from flights (kind's) the records past their deadline, with the shared lock tickets
-- of their loads, every so many registrations (twice the records left by the last sweep, at
-- least 64: amortised O(1)).  Such a record is joined by no one (see single_flight); the
-- record of a load whose coroutine is never resumed (a killed light thread) stayed under its
-- key until the key was missed again: one per abandoned page number or article id, for ever.
-- (A load past its deadline that does end clears nothing of a newer load of its key.)
local function sweep_flights(self, kind, flights)
  local sw = self._sweeps[kind]
  sw.regs = sw.regs + 1
  if sw.regs < sw.limit then return end
  local now, left, held = core_clock(), 0, self._held[kind]
  for key, rec in pairs(flights) do
    if now > rec.deadline then
      flights[key] = nil -- (assigning nil to a field while traversing is allowed)
      held[key] = nil
    else
      left = left + 1
    end
  end
  sw.regs, sw.limit = 0, 2 * left > 64 and 2 * left or 64
end

-- Runs load(self, key) once for concurrent callers of one key in this Lua state; returns the
-- in-flight record {value=, err=} every caller shares.  Marks made in this state while a
-- reader-set load is in flight are recorded on its record (rec.marks, by note_mark) and
-- added to the list it hands out: a caller that marked a read and then joined the load must
-- see its mark even when the set cannot be cached (larger than max_bytes, or the marks
-- overran the change log) and it is answered from the list.  A caller never joins a load that
-- began before an invalidation of its key (in this process or, shared, in any): that load's
-- result is older than the invalidation the caller may have seen, so it loads by itself.
-- A record's deadline is its load's start + lock_timeout, whenever a waiter arrived: a load
-- that outlives it (stuck, or its coroutine abandoned: a killed light thread) is no longer
-- joined, and its waiters give up then, look at the cache again (another caller may have
-- loaded meanwhile: recheck(self, key) -> value or nil), join a newer load of the key if
-- there is one, and only then load by themselves.
local function single_flight(self, flights, kind, key, load, recheck)
  local cc = self._cc
  local rec = flights[key]
  local counted = false -- in waits: once per caller, and only if it did pause
  while rec do
    if (cc and cc:changed(kind, key, rec.start)) or core_clock() > rec.deadline then break end
    local paused = false
    if rec.sema then -- woken as soon as the load ends (raises where nginx cannot wait)
      rec.waiters = rec.waiters + 1
      paused = pcall(rec.sema.wait, rec.sema, (rec.deadline - core_clock()) / 1000)
    end
    local attempt = 0
    while not rec.done do
      if core_clock() > rec.deadline or not self._wait(attempt) then break end
      paused = true
      attempt = attempt + 1
    end
    if paused and not counted then
      counted = true
      self._counters.waits = self._counters.waits + 1
    end
    if rec.done then return rec end
    if core_clock() <= rec.deadline then break end -- cannot wait: load by ourselves
    if self._cc == nil then break end -- closed meanwhile: the load reports it
    local value = recheck(self, key)
    if value ~= nil then return { done = true, value = value } end
    local newer = flights[key]
    if newer == rec then break end
    rec = newer
  end
  cc = self._cc -- nil when closed while this caller waited: the load reports it
  rec = { done = false, start = cc and cc:seq() or 0, deadline = core_clock() + self._lock_timeout }
  if self._use_sema then
    local ok, sema = pcall(semaphore.new, 0)
    if ok then rec.sema, rec.waiters = sema, 0 end
  end
  flights[key] = rec
  sweep_flights(self, kind, flights)
  local ok, value, err = pcall(load, self, key)
  if flights[key] == rec then flights[key] = nil end
  if not ok then
    if self._cc == nil then -- closed by another coroutine while this one loaded
      value, err = closed_error()
    else
      value, err = nil, make_error("load", "loader failed: " .. tostring(value))
    end
  end
  if rec.marks and type(value) == "table" then value = with_marks(value, rec.marks) end
  rec.value, rec.err, rec.done = value, err, true
  if rec.sema and rec.waiters > 0 then rec.sema:post(rec.waiters) end
  return rec
end

-- Waits for another process loading (kind, key) in shared mode.  Returns
--   "acquired", ticket   -- we load and must publish or release
--   "done", value        -- another process's result, installed locally
--   "none"               -- load without coordination
-- Every path back to cc:lock passes the deadline check, and a lock that offers again the
-- ticket that just went "gone" is waited on: the core withdraws a result that cannot be
-- taken, but nothing here may turn into a busy loop if one were offered again.
local function shared_lock(self, kind, key)
  local cc = self._cc
  local deadline = core_clock() + self._lock_timeout
  local attempt, gone = 0, nil
  while true do
    local st, ticket = cc:lock(kind, key, self._lock_timeout, self._clock())
    if st ~= "busy" then return st, ticket end
    if ticket == gone then -- offered the same result again: pause before polling it
      if core_clock() > deadline or not self._wait(attempt) then return "none" end
      attempt = attempt + 1
    end
    while true do
      local s, value = cc:poll(kind, key, ticket, self._clock())
      if s == "done" then return "done", value end
      -- "alone": the holder loaded a result it could not hand off (too large for the slot,
      -- a reader set it could not cache): every waiter loads by itself.  Locking again, the
      -- waiters waited one after another for each other's loads, which could not be handed
      -- off either.
      if s == "alone" then return "none" end
      if core_clock() > deadline then return "none" end
      -- "gone": the holder failed or died, or its result cannot be taken: take the lock
      if s == "gone" then gone = ticket break end
      if not self._wait(attempt) then return "none" end
      attempt = attempt + 1
    end
  end
end

-- Records mark_read(article, user) on the reader-set load of article in flight here, if any.
-- A load that outlived its deadline (abandoned: its coroutine killed, or stuck), or that
-- holds MAX_FLIGHT_MARKS marks, is unregistered instead: no caller joins it any more (the
-- next miss loads again, and finds the read in the database), so the marks of callers that
-- joined it were recorded before, and nothing grows with the marks of an article whose load
-- never ends and that nobody reads.
local function note_mark(self, article, user)
  local flights = self._readers_flights
  local rec = flights[article]
  if rec then
    local marks = rec.marks
    if not marks then marks = {} rec.marks = marks end
    if #marks >= MAX_FLIGHT_MARKS or core_clock() > rec.deadline then
      flights[article] = nil
      return
    end
    marks[#marks + 1] = user
  end
end

local function call_loader(fn, arg)
  local ok, value, err = pcall(fn, arg)
  if not ok then
    return nil, make_error("load", "loader failed: " .. tostring(value))
  end
  if value == nil or value == false then
    return nil, make_error("load", "loader returned no data" ..
      (err ~= nil and (": " .. tostring(err)) or ""))
  end
  return value
end

-- What load() needs of each kind: the user's loader, its counter, the core's put method.
local LOADS = {
  [PAGE] = { fn = "_load_page", counter = "page_loads", put = "page_put", name = "load_page" },
  [READERS] = { fn = "_load_readers", counter = "readers_loads", put = "readers_put",
                name = "load_readers" },
}

-- Loads (kind, key) with the user's loader and caches it; in shared mode under the shared
-- lock, or takes another process's result.  Returns the loaded value, or (another process's
-- result, now cached here) its page list / true for a reader set -- a reader set that expired
-- while this caller waited for it answers uncached, as its id list; or nil, err.  With
-- `alone`, no shared lock: the user's loader always runs, and a reader set comes back as
-- its id list.
-- The lock's ticket is recorded while the loader runs -- it may yield, and close() gives back
-- the locks of the loads it cuts short, so that other processes take the key over at once
-- rather than after lock_timeout.
local function put_loaded(self, cc, put, key, list, start, ticket)
  return cc[put](cc, key, list, self._clock(), start, ticket)
end

local function load(self, kind, key, alone)
  local how = LOADS[kind]
  local cc, ticket = self._cc, nil
  if self._shared and not alone then
    local st, v = shared_lock(self, kind, key)
    if st == "done" and v then return v end
    if st == "acquired" then ticket = v end
  end
  local start = cc:seq()
  local counters = self._counters
  counters[how.counter] = counters[how.counter] + 1
  local held = self._held[kind]
  if ticket then held[key] = ticket end
  local list, err = call_loader(self[how.fn], key)
  if ticket and held[key] == ticket then held[key] = nil end -- (not a newer load's)
  if not list then
    counters.load_errors = counters.load_errors + 1
    if ticket then cc:unlock(kind, key, ticket) end
    return nil, err
  end
  if self._cc == nil then return list end -- closed while loading
  -- (protected: a put that raises -- a clock that returned no number, Lua out of memory --
  -- gives the shared lock back before the error goes on, or other workers waited for it
  -- until lock_timeout)
  local ok, cached, why = pcall(put_loaded, self, cc, how.put, key, list, start, ticket)
  if not ok then
    if ticket and self._cc then cc:unlock(kind, key, ticket) end
    error(cached, 0)
  end
  if cached == nil then
    counters.load_errors = counters.load_errors + 1
    return nil, make_error("load", "bad data from " .. how.name .. ": " .. why)
  end
  return list
end

local function load_page(self, page_no) return load(self, PAGE, page_no) end
local function load_readers(self, article) return load(self, READERS, article) end

-- The reader set's id list, loaded by this caller alone (no single flight, no shared lock);
-- errors as single_flight reports them.
local function load_readers_alone(self, article)
  local ok, list, err = pcall(load, self, READERS, article, true)
  if ok then return list, err end
  if self._cc == nil then return closed_error() end
  return nil, make_error("load", "loader failed: " .. tostring(list))
end

-- What another caller may have cached while this one waited (single_flight's recheck); the
-- caller counted its lookup before it waited, so these count nothing.
local function cached_page(self, page_no)
  return self._cc:page_get(page_no, self._clock(), true)
end

local function cached_readers(self, article)
  if self._cc:has_read(article, 0, self._clock(), true) ~= nil then return true end
end

-- `counted`: the caller already counted this lookup (a hit or a miss).
local function get_page(self, page_no, counted)
  local page = self._cc:page_get(page_no, self._clock(), counted)
  if page then return page end
  local rec = single_flight(self, self._page_flights, PAGE, page_no, load_page, cached_page)
  if rec.err then return nil, rec.err end
  return rec.value
end

-- The read flag of (article, user), loading the reader set when needed.
-- `counted`: the caller already counted this lookup's miss.  `lists` (optional): article ->
-- id list loaded earlier in this call and not cacheable; used instead of loading again, and
-- filled with what this call loads.
local function read_flag(self, article, user, counted, lists)
  local cc = self._cc
  local v = cc:has_read(article, user, self._clock(), counted)
  if v ~= nil then return v end
  local list = lists and lists[article]
  if list == nil then
    local rec = single_flight(self, self._readers_flights, READERS, article, load_readers, cached_readers)
    if rec.err then return nil, rec.err end
    if self._cc == nil then return closed_error() end
    v = cc:has_read(article, user, self._clock(), true)
    if v ~= nil then return v end
    list = rec.value
    if type(list) ~= "table" then
      -- The load was another process's result (`true`), installed here, and it is gone again
      -- (a load that finished meanwhile evicted it), or it could not be cached here
      -- (`false`).  Load the list by ourselves, without the shared lock -- which could hand
      -- out the same result again -- and answer from it.
      local err
      list, err = load_readers_alone(self, article)
      if not list then return nil, err end
      if self._cc == nil then return closed_error() end
      v = cc:has_read(article, user, self._clock(), true)
      if v ~= nil then return v end
    end
    if lists then lists[article] = list end
  end
  for _, id in ipairs(list) do -- not cacheable (larger than max_bytes): answer from the list
    if id == user then return true end
  end
  return false
end

-- ---- the public API ---------------------------------------------------------------------

--- esx.cache(opts) -> cache | nil, err (kind "internal": the core cannot be created, e.g.
-- out of memory).  Raises on a bad option.
function _M.new(opts)
  local o = options.check("esx.cache", schema, opts, 3)
  local pages = {}
  local cc, err = core.cache_new({
    max_bytes = o.max_bytes, page_ttl = o.page_ttl, readers_ttl = o.readers_ttl,
    max_pages = o.max_pages, shared = o.shared,
  }, pages)
  if not cc then return nil, err end
  local self = setmetatable({
    _cc = cc,
    _pages = pages, -- page_no -> list; entries dropped by the core are removed from C
    _load_page = o.load_page,
    _load_readers = o.load_readers,
    _shared = o.shared,
    _lock_timeout = o.lock_timeout,
    _clock = o.clock and checked_clock(o.clock) or default_clock(),
    _wait = o.wait or default_wait(),
    _use_sema = semaphore ~= nil and o.wait == nil,
    _page_flights = {},
    _readers_flights = {},
    _held = { [PAGE] = {}, [READERS] = {} }, -- kind -> key -> ticket of the shared locks held
    _sweeps = { [PAGE] = { regs = 0, limit = 64 }, [READERS] = { regs = 0, limit = 64 } },
    _counters = { page_loads = 0, readers_loads = 0, load_errors = 0, waits = 0 },
  }, Cache)
  -- The stats function must not hold the cache strongly: LuaJIT's weak-keyed tables are not
  -- ephemerons, so a closure over self would keep an unclosed cache alive for ever.
  local weak = setmetatable({ self }, { __mode = "v" })
  self.name = registry.add(self, "cache", o.name, function()
    local cache = weak[1]
    if cache then return cache:stats() end
  end)
  return self
end

-- The page's articles as copies with `read` for user_id (one C call, then loads for the
-- articles whose reader set is not cached).  `counted`: the caller already counted the
-- lookups of the page's reader sets.
local function compose(self, page, user_id, lists, counted)
  local res, missing = self._cc:read_flags(page, user_id, self._clock(), counted)
  if missing then
    for _, i in ipairs(missing) do
      local flag, err = read_flag(self, page[i].id, user_id, true, lists)
      if flag == nil then return nil, err end
      res[i].read = flag
    end
  end
  return res
end

--- cache:read_articles(user_id, page_no) -> list of article copies with `read`, or nil, err
function Cache:read_articles(user_id, page_no)
  check_id(user_id, 1, "read_articles", "user_id")
  check_page_no(page_no, "read_articles")
  local cc = self._cc
  if not cc then return closed_error() end
  if self._shared then cc:sync(self._clock()) end
  local page, err = get_page(self, page_no)
  if not page then return nil, err end
  if not self._cc then return closed_error() end
  return compose(self, page, user_id)
end

--- cache:read_articles_json(user_id, page_no) -> the same list as JSON text, or nil, err.
-- Cached pages keep their articles pre-encoded, so this is one C call on a hit: no copies,
-- no encoder.  See docs/cache.md for the encoding.
function Cache:read_articles_json(user_id, page_no)
  check_id(user_id, 1, "read_articles_json", "user_id")
  check_page_no(page_no, "read_articles_json")
  local cc = self._cc
  if not cc then return closed_error() end
  if self._shared then cc:sync(self._clock()) end
  local page -- the loaded list, when this call loaded it
  local lists = {} -- article -> reader ids this call loaded (used when they cannot be cached)
  local readers_counted = false
  for attempt = 1, 3 do
    local json, missing = cc:read_json(page_no, user_id, self._clock(), attempt > 1, readers_counted)
    if json then return json end
    if missing then readers_counted = true end
    if json == false then
      if page then break end -- loaded but not cacheable (beyond max_pages, too large)
      local rec = single_flight(self, self._page_flights, PAGE, page_no, load_page, cached_page)
      if rec.err then return nil, rec.err end
      page = rec.value
    elseif missing then
      local all_listed = true
      for _, article in ipairs(missing) do
        -- (an article can appear twice on a page, or its set was loaded by an earlier attempt
        -- and could not be cached (larger than max_bytes, readers_ttl = 0): load it once)
        if lists[article] == nil then
          all_listed = false
          if cc:has_read(article, 0, self._clock(), true) == nil then
            local rec = single_flight(self, self._readers_flights, READERS, article, load_readers, cached_readers)
            if rec.err then return nil, rec.err end
            if not self._cc then return closed_error() end
            if type(rec.value) == "table" then lists[article] = rec.value end
          end
        end
      end
      if all_listed then break end -- loaded here but not cacheable: compose from the lists
    else
      break -- cached without its JSON (out of memory, or no room for it): use the tables
    end
    if not self._cc then return closed_error() end
  end
  if not page then -- (the first read_json counted this page's hit: not again)
    local err
    page, err = get_page(self, page_no, true)
    if not page then return nil, err end
  end
  if not self._cc then return closed_error() end
  local res, err = compose(self, page, user_id, lists, readers_counted)
  if not res then return nil, err end
  if res[1] == nil then return "[]" end -- (the encoder writes an empty table as {})
  local json, why, nomem = json_encode(res)
  if not json and nomem then -- esx's failure, not the page's
    return nil, make_error("internal", "out of memory encoding the page as JSON")
  end
  if not json then -- a cycle in the page (read_articles serves it; JSON cannot)
    self._counters.load_errors = self._counters.load_errors + 1 -- bad data, as every load error
    return nil, make_error("load", "cannot encode the page from load_page as JSON: " .. why)
  end
  return json
end

--- cache:has_read(article_id, user_id) -> boolean, or nil, err
function Cache:has_read(article_id, user_id)
  check_id(article_id, 1, "has_read", "article_id")
  check_id(user_id, 2, "has_read", "user_id")
  local cc = self._cc
  if not cc then return closed_error() end
  if self._shared then cc:sync(self._clock()) end
  return read_flag(self, article_id, user_id)
end

--- cache:mark_read(article_id, user_id) -> true: adds the user to a cached set in place.
function Cache:mark_read(article_id, user_id)
  check_id(article_id, 1, "mark_read", "article_id")
  check_id(user_id, 2, "mark_read", "user_id")
  local cc = self._cc
  if not cc then return closed_error() end
  cc:apply({ OP_MARK, article_id, user_id }, self._clock())
  note_mark(self, article_id, user_id)
  return true
end

--- cache:invalidate_article(article_id) -> true: drops the article's reader set.
function Cache:invalidate_article(article_id)
  check_id(article_id, 1, "invalidate_article", "article_id")
  local cc = self._cc
  if not cc then return closed_error() end
  cc:apply({ OP_INV_ARTICLE, article_id, 0 }, self._clock())
  return true
end

--- cache:invalidate_pages() -> true: drops tier 1 (an article was added or removed).
function Cache:invalidate_pages()
  local cc = self._cc
  if not cc then return closed_error() end
  cc:apply({ OP_INV_PAGES, 0, 0 }, self._clock())
  return true
end

--- cache:transaction() -> tx collecting mark_read / invalidate_* until commit or rollback.
function Cache:transaction()
  if not self._cc then return closed_error() end
  return setmetatable({ _cache = self, _ops = {}, _since = {}, _done = false }, Tx)
end

--- cache:stats() -> counters table, or nil, err when closed.
function Cache:stats()
  local cc = self._cc
  if not cc then return closed_error() end
  if self._shared then cc:sync(self._clock()) end
  local s = cc:stats()
  local c = self._counters
  s.pages.loads = c.page_loads
  s.readers.loads = c.readers_loads
  s.load_errors = c.load_errors
  s.waits = c.waits
  s.shared = self._shared
  return s
end

--- cache:close() -> true; frees everything.  Later calls return nil, {kind="closed"}.
function Cache:close()
  local cc = self._cc
  if cc then
    for kind, held in pairs(self._held) do
      for key, ticket in pairs(held) do cc:unlock(kind, key, ticket) end
      self._held[kind] = {}
    end
    self._cc = nil
    cc:close()
    registry.remove(self)
  end
  return true
end

function Cache:__tostring()
  return "esx.cache: " .. tostring(self.name) .. (self._cc and "" or " (closed)")
end

-- ---- transactions -------------------------------------------------------------------------

-- Raises when tx was committed or rolled back, at the line that called the method: called by
-- the method itself, or by tx_add, which the methods tail-call (their frame is tx_add's).
local function check_live(tx, fname)
  if tx._done then
    error("bad call to '" .. fname .. "' (the transaction is already " .. tx._done .. ")", 3)
  end
end

local function tx_add(tx, fname, op, a, b)
  check_live(tx, fname)
  local ops = tx._ops
  local n = #ops
  ops[n + 1], ops[n + 2], ops[n + 3] = op, a, b
  if op == OP_MARK then
    -- the sequence the mark is recorded at: an invalidation of the article logged after it
    -- turns the mark into an invalidation on commit (see tx:commit)
    local cc = tx._cache._cc
    tx._since[n / 3 + 1] = cc and cc:seq() or 0
  end
  return true
end

function Tx:mark_read(article_id, user_id)
  check_id(article_id, 1, "mark_read", "article_id")
  check_id(user_id, 2, "mark_read", "user_id")
  return tx_add(self, "mark_read", OP_MARK, article_id, user_id)
end

function Tx:invalidate_article(article_id)
  check_id(article_id, 1, "invalidate_article", "article_id")
  return tx_add(self, "invalidate_article", OP_INV_ARTICLE, article_id, 0)
end

function Tx:invalidate_pages()
  return tx_add(self, "invalidate_pages", OP_INV_PAGES, 0, 0)
end

--- tx:commit() -> true: applies the collected changes in order, as one batch.
-- A mark whose article was invalidated after the mark was recorded is applied as an
-- invalidation of the article: the invalidation may stand for a rewrite of the article's
-- readers in the database that came after the mark's write (the cache cannot tell which came
-- last), and adding the mark to a set loaded since would put back a read the database no
-- longer holds.  Dropping the set is right either way: the next read loads it.
function Tx:commit()
  check_live(self, "commit")
  local cc = self._cache._cc
  if not cc then return closed_error() end -- nothing committed: rollback() is still allowed
  self._done = "committed"
  local ops = self._ops
  if #ops > 0 then cc:apply(ops, self._cache._clock(), self._since) end -- (rewrites the marks it invalidates)
  for i = 1, #ops, 3 do
    if ops[i] == OP_MARK then note_mark(self._cache, ops[i + 1], ops[i + 2]) end
  end
  self._ops, self._since = nil, nil
  return true
end

--- tx:rollback() -> true: drops the collected changes.
function Tx:rollback()
  check_live(self, "rollback")
  self._done = "rolled back"
  self._ops, self._since = nil, nil
  return true
end

setmetatable(_M, { __call = function(_, opts) return _M.new(opts) end })

_M.Cache = Cache
_M.schema = schema -- the options (docs/cache.md is checked against it by spec/docs_spec.lua)

-- cache.stats() / tx.commit() with '.' raise "bad self to 'stats' (...)" (see options.lua)
options.guard_methods(Cache, "esx.cache", "cache")
options.guard_methods(Tx, "esx.cache transaction", "tx")

return _M
