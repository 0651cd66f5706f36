-- client:bulk_indexer: batching by count and bytes, bounded concurrency, per-item retries,
-- 413 splitting, and every dropped item reported.
local esx = require "esx"
local ds = require "spec.support.devserver"

local srv, c

setup(function() srv = ds.start{} end)
teardown(function() srv:stop() end)
before_each(function()
  srv:reset()
  c = assert(esx.client{ hosts = { srv.url } })
end)
after_each(function() c:close() end)

-- Adds n "index" operations to bi: documents { n = i } with _id i (1 to n) in index "p".
local function add_docs(bi, n)
  for i = 1, n do assert(bi:add("index", { _index = "p", _id = tostring(i) }, { n = i })) end
end

local function count(index)
  assert(c:refresh(index))
  return (c:count(index, { query = { match_all = {} } }))
end

describe("client:bulk_indexer", function()
  it("raises naming an unknown option", function()
    assert.has_error(function() c:bulk_indexer{ flush_cnt = 5 } end,
      "bulk_indexer: bad option 'flush_cnt' (unknown option)")
  end)

  it("raises on backoff_max below backoff_min", function()
    -- before, it was accepted and every retry waited at most 100 ms: backoff_min was ignored
    assert.has_error(function() c:bulk_indexer{ backoff_min = 5000, backoff_max = 100 } end,
      "bulk_indexer: bad option 'backoff_max' (must be >= backoff_min)")
    assert.has_no_error(function() c:bulk_indexer{ backoff_min = 100, backoff_max = 100 }:close() end)
  end)

  it("raises at the caller's line on a bad option, and when called with '.'", function()
    local ok, err = pcall(function() local bi = c:bulk_indexer{ flush_cnt = 5 } return bi end)
    assert.is_false(ok)
    assert.truthy(err:find("^[^:]*bulk_spec%.lua:%d+: bulk_indexer: bad option 'flush_cnt' %(unknown option%)$"), err)
    -- c.bulk_indexer{...} made an indexer without a client, which failed at its first send
    ok, err = pcall(function() local bi = c.bulk_indexer{ flush_count = 5 } return bi end)
    assert.is_false(ok)
    assert.truthy(err:find("^[^:]*bulk_spec%.lua:%d+: bad self to 'bulk_indexer' %(esx%.client expected, " ..
      "got table; call it as c:bulk_indexer%(%.%.%.%)%)$"), err)
    ok, err = pcall(function() local bi = require("esx.bulk").new({}, { flush_count = 5 }) return bi end)
    assert.is_false(ok)
    assert.truthy(err:find("^[^:]*bulk_spec%.lua:%d+: bad argument #1 to 'esx%.bulk%.new' %(esx%.client expected, " ..
      "got table%)$"), err)
  end)

  it("returns nil, closed for a closed client", function()
    c:close()
    local bi, err = c:bulk_indexer{ flush_count = 5 }
    assert.is_nil(bi)
    assert.equal("closed", err.kind)
    assert.equal("closed: the client is closed", tostring(err))
  end)

  it("flushes by count and indexes everything", function()
    local bi = c:bulk_indexer{ flush_count = 100, concurrency = 2 }
    add_docs(bi, 250)
    local s = bi:close()
    assert.equal(250, s.added)
    assert.equal(250, s.indexed)
    assert.equal(0, s.failed)
    assert.equal(3, s.batches)
    assert.equal(250, count("p"))
  end)

  it("flushes by bytes", function()
    local bi = c:bulk_indexer{ flush_bytes = 2000, flush_count = 100000 }
    for i = 1, 40 do bi:add("index", { _index = "p", _id = tostring(i) }, { pad = string.rep("x", 180) }) end
    local s = bi:close()
    assert.equal(40, s.indexed)
    assert.is_true(s.batches >= 4, "batches: " .. s.batches)
  end)

  it("retries items rejected with 429 and loses none", function()
    srv:fault{ path = "/_bulk", item_status = 429, item_count = 5, count = 1 }
    local bi = c:bulk_indexer{ flush_count = 50, backoff_min = 10, backoff_max = 50 }
    add_docs(bi, 50)
    local s = bi:close()
    assert.equal(50, s.indexed)
    assert.equal(5, s.retried)
    assert.equal(0, s.failed)
    assert.equal(50, count("p"))
  end)

  it("drops items rejected for good, reporting each with its reason", function()
    srv:fault{ path = "/_bulk", item_status = 400, item_count = 3, count = 1 }
    local seen = {}
    local bi = c:bulk_indexer{ flush_count = 10, on_drop = function(item, reason)
      seen[#seen + 1] = item.meta._id .. " " .. reason
    end }
    add_docs(bi, 10)
    local s = bi:close()
    assert.equal(7, s.indexed)
    assert.equal(3, s.failed)
    assert.equal(s.added, s.indexed + s.failed)
    assert.equal(3, #s.dropped)
    assert.equal("1", s.dropped[1].meta._id)
    assert.truthy(s.dropped[1].reason:find("mapper_parsing_exception", 1, true), s.dropped[1].reason)
    assert.equal(3, #seen)
  end)

  it("counts a delete of a document that is not there as done, not as dropped", function()
    -- Elasticsearch answers it 404 "not_found" without an error ("errors": false); a delete
    -- in an index that does not exist is an error (index_not_found_exception) and is dropped
    local bi = c:bulk_indexer{}
    bi:add("index", { _index = "p", _id = "1" }, { n = 1 })
    bi:add("delete", { _index = "p", _id = "missing" })
    bi:add("delete", { _index = "p", _id = "1" })
    bi:add("delete", { _index = "nosuchindex", _id = "1" })
    local s = bi:close()
    assert.equal(3, s.indexed)
    assert.equal(1, s.failed)
    assert.equal(1, #s.dropped)
    assert.equal("nosuchindex", s.dropped[1].meta._index)
    assert.truthy(s.dropped[1].reason:find("index_not_found_exception", 1, true), s.dropped[1].reason)
  end)

  it("reports a dropped item under its own metadata when the caller reuses one meta table", function()
    -- before, the item kept the caller's table: every drop was reported with the last _id
    -- given, and the results were taken as out of request order (all retried, then dropped)
    srv:fault{ path = "/_bulk", item_status = 400, item_count = 1, count = 1 }
    local seen = {}
    local bi = c:bulk_indexer{ on_drop = function(item) seen[#seen + 1] = item.meta._id end }
    local meta = { _index = "p" }
    for i = 1, 3 do
      meta._id = tostring(i)
      bi:add("index", meta, { n = i })
    end
    local s = bi:close()
    assert.equal(2, s.indexed)
    assert.equal(0, s.retried)
    assert.equal(1, s.failed)
    assert.equal("1", s.dropped[1].meta._id)
    assert.same({ "1" }, seen)
  end)

  it("gives up on an item after max_retries and says why", function()
    srv:fault{ path = "/_bulk", item_status = 429, count = -1 }
    local bi = c:bulk_indexer{ max_retries = 2, backoff_min = 1, backoff_max = 5 }
    bi:add("index", { _index = "p", _id = "1" }, { n = 1 })
    local s = bi:close()
    assert.equal(1, s.failed)
    assert.truthy(s.dropped[1].reason:find("(after 2 retries)", 1, true), s.dropped[1].reason)
    srv:clear_faults()
  end)

  it("gives on_drop the number of times the item was sent as item.attempts", function()
    -- before, an item dropped at an answer it could not retry (a 400) did not count the send
    -- that got that answer: attempts = 0 for an item sent once, while one dropped after
    -- max_retries = 2 (sent three times) said 3
    srv:fault{ path = "/_bulk", item_status = 400, item_count = 1, count = 1 }
    local got = {}
    local bi = c:bulk_indexer{ on_drop = function(item) got[#got + 1] = item.attempts end }
    bi:add("index", { _index = "p", _id = "1" }, { n = 1 })
    bi:close()
    srv:fault{ path = "/_bulk", item_status = 429, count = -1 }
    bi = c:bulk_indexer{ max_retries = 2, backoff_min = 1, backoff_max = 5,
                         on_drop = function(item) got[#got + 1] = item.attempts end }
    bi:add("index", { _index = "p", _id = "2" }, { n = 2 })
    bi:close()
    srv:clear_faults()
    assert.same({ 1, 3 }, got)
    assert.equal(1 + 3, srv:requests("/_bulk").counts["/_bulk"])
  end)

  it("counts in item.attempts the sends of the batches split around it, and keeps max_retries for retries", function()
    -- before, an item refused as too large in its batch and then alone had been sent twice
    -- and on_drop said attempts = 1 (after a split of 8 items, four times)
    srv:fault{ path = "/_bulk", status = 413, count = 2 }
    local got = {}
    local bi = c:bulk_indexer{ flush_count = 2, concurrency = 1, max_retries = 0,
                               on_drop = function(item) got[#got + 1] = item.meta._id .. ":" .. item.attempts end }
    add_docs(bi, 2)
    local s = bi:close()
    -- the 413s go to the batch of 2, then to item 1 alone
    assert.same({ "1:2" }, got)
    assert.equal(1, s.indexed)
    assert.equal(0, s.retried)
    assert.equal(1, s.split)
    -- sends are not retries: an item answered 429 after splits is still retried max_retries times
    srv:reset()
    srv:fault{ path = "/_bulk", status = 413, count = 1 }
    srv:fault{ path = "/_bulk", item_status = 429, count = 1 }
    bi = c:bulk_indexer{ flush_count = 2, concurrency = 1, max_retries = 1, backoff_min = 1, backoff_max = 1 }
    add_docs(bi, 2)
    s = bi:close()
    assert.equal(2, s.indexed)
    assert.equal(1, s.retried)
    assert.equal(0, s.failed)
  end)

  it("holds the producer while retries worth concurrency batches wait out a 429 back-off", function()
    -- before, add() only waited for a free batch slot: under a sustained 429 every document
    -- given went on the retry list (60,000 of them, 126 MB, in the review's run)
    srv:fault{ path = "/_bulk", item_status = 429, count = -1 }
    local bi = c:bulk_indexer{ flush_count = 10, concurrency = 2, max_retries = 2,
                               backoff_min = 20, backoff_max = 20 }
    local most = 0
    for i = 1, 300 do
      bi:add("index", { _index = "p", _id = tostring(i) }, { n = i })
      most = math.max(most, bi:stats().delayed)
    end
    local s = bi:close()
    srv:clear_faults()
    assert.is_true(most < 2 * 10 + 10, "up to " .. most .. " items waited for a retry")
    assert.equal(300, s.added)
    assert.equal(300, s.failed) -- each given up after its retries, with the reason
    assert.equal(0, s.indexed)
  end)

  it("asks only for the result fields it reads, so that a batch's answer stays within max_response_bytes", function()
    -- before, each item's whole result (_index, _version, _shards, _seq_no, ...) came back:
    -- 10 items passed max_response_bytes = 1024, and the batch, indexed, was sent again and
    -- reported failed ("decode: response body exceeds max_response_bytes") -- as a batch near
    -- flush_count's top does with the default 100 MiB
    local c2 = assert(esx.client{ hosts = { srv.url }, max_response_bytes = 1024 })
    local bi = c2:bulk_indexer{ max_retries = 1, backoff_min = 1, backoff_max = 1 }
    for i = 1, 10 do bi:add("index", { _index = "p", _id = tostring(i) }, { n = i }) end
    bi:add("delete", { _index = "p", _id = "missing" })
    local s = bi:close()
    c2:close()
    assert.equal(11, s.indexed)
    assert.equal(0, s.failed)
    assert.equal(0, s.retried)
    assert.equal(1, srv:requests("/_bulk").counts["/_bulk"])
    assert.equal(10, count("p"))
  end)

  it("splits a batch whose answer passes max_response_bytes until the answers fit, and reports none of its items failed", function()
    -- before, the answer to 40 operations (~2.2 KB) failed the batch with decode: its items,
    -- all applied, were sent again whole (the answer too big again) max_retries times and then
    -- reported failed -- 40 failed, 40 in the index.  A create sent again meets its own write
    -- (409): done -- but its result carries the conflict's reason, so halves of 20 and
    -- quarters of 10 still pass 1024 bytes; eighths of 5 fit (1 + 2 + 4 + 8 requests).
    local c2 = assert(esx.client{ hosts = { srv.url }, max_response_bytes = 1024 })
    local dropped = {}
    local bi = c2:bulk_indexer{ max_retries = 1, backoff_min = 1, backoff_max = 1,
                                on_drop = function(item, reason) dropped[#dropped + 1] = reason end }
    for i = 1, 40 do
      assert(bi:add(i % 2 == 0 and "create" or "index", { _index = "p", _id = tostring(i) }, { n = i }))
    end
    local s = bi:close()
    assert.same({}, dropped)
    assert.equal(40, s.indexed)
    assert.equal(0, s.failed)
    assert.equal(0, s.retried)
    assert.equal(7, s.split)
    assert.equal(15, s.batches)
    assert.equal(15, srv:requests("/_bulk").counts["/_bulk"])
    assert.equal(40, count("p"))
    -- operations without an _id are sent again too (their outcome is unknown, as after a
    -- timeout): they are indexed, none reported failed -- and may be indexed more than once
    bi = c2:bulk_indexer{ max_retries = 1, backoff_min = 1, backoff_max = 1 }
    for i = 1, 40 do assert(bi:add("index", { _index = "q" }, { n = i })) end
    s = bi:close()
    c2:close()
    assert.equal(40, s.indexed)
    assert.equal(0, s.failed)
    assert.is_true(count("q") >= 40)
  end)

  it("retries a batch refused with 429 whose answer passes max_response_bytes after its back-off, not split at once", function()
    -- a refusal is not an answer to halve: its items were not applied, and splitting sent
    -- the halves at once to a cluster that had just said it was overloaded
    local c2 = assert(esx.client{ hosts = { srv.url }, max_response_bytes = 1024 })
    srv:fault{ path = "/_bulk", status = 429, body = ("x"):rep(4096), count = 1 }
    local bi = c2:bulk_indexer{ flush_count = 10, backoff_min = 1, backoff_max = 1 }
    for i = 1, 10 do bi:add("index", { _index = "p", _id = tostring(i) }, { n = i }) end
    local s = bi:close()
    c2:close()
    assert.equal(10, s.indexed)
    assert.equal(0, s.split)
    assert.equal(10, s.retried)
    assert.equal(2, srv:requests("/_bulk").counts["/_bulk"])
  end)

  it("retries the items of one batch together, in one batch, not each at its own jittered time", function()
    -- before, each item drew its own jitter: the retries of a batch of 200 refused with 429
    -- fell due one by one over 200-400 ms and went out as dozens of small bulks, multiplying
    -- the requests sent to a cluster that had just said it was overloaded
    for _, f in ipairs{ { path = "/_bulk", status = 429, count = 1 },
                        { path = "/_bulk", item_status = 429, count = 1 } } do
      srv:reset()
      srv:fault(f)
      local bi = c:bulk_indexer{ flush_count = 200, backoff_min = 400, backoff_max = 400 }
      for i = 1, 200 do bi:add("index", { _index = "p", _id = tostring(i) }, { n = i }) end
      local s = bi:close()
      assert.equal(200, s.indexed)
      assert.equal(200, s.retried)
      assert.equal(2, s.batches)
      assert.equal(2, srv:requests("/_bulk").counts["/_bulk"])
    end
  end)

  it("draws its back-off jitter from the kernel, not from math.random: indexers in processes with one math.random state do not retry in step", function()
    -- before, the jitter came from math.random, whose state is the same in every LuaJIT
    -- process (it is not seeded at start: every luajit prints the same first math.random())
    -- and in every nginx worker (forked from the master): indexers of several workers or load
    -- jobs answered 429 together drew the same back-offs and came back together, in step.
    -- Here two indexers start from one math.random state, as those processes do, and must draw
    -- different back-offs.  The indexer's clock is virtual (core.now/core.sleep stubbed), so
    -- close() records its back-off sleeps without waiting them out.
    local core = require "esx.core"
    local real_now, real_sleep = core.now, core.sleep
    local offset, slept = 0, {}
    core.now = function() return real_now() + offset end
    core.sleep = function(ms) slept[#slept + 1] = ms; offset = offset + ms end
    finally(function() core.now, core.sleep = real_now, real_sleep end)
    local function draws()
      srv:reset()
      srv:fault{ path = "/_bulk", status = 503, count = 3 }
      slept = {}
      math.randomseed(7)
      local bi = c:bulk_indexer{ flush_count = 1, backoff_min = 1000000, backoff_max = 1000000 }
      assert(bi:add("index", { _index = "p", _id = "1" }, { n = 1 }))
      local s = bi:close()
      assert.equal(1, s.indexed)
      assert.equal(3, s.retried)
      assert.equal(3, #slept)
      for _, ms in ipairs(slept) do assert.is_true(ms > 499000 and ms <= 1000000, tostring(ms)) end
      return slept
    end
    local a, b = draws(), draws()
    -- each draw is uniform over 500 s: three pairs within 1 s of each other by chance is a
    -- one in 10^7 event, and the same draws differ only by the ms the steps take
    local apart = 0
    for i = 1, 3 do if math.abs(a[i] - b[i]) > 1000 then apart = apart + 1 end end
    assert.is_true(apart > 0, ("the same back-offs: %s / %s"):format(table.concat(a, " "), table.concat(b, " ")))
  end)

  it("splits a batch the server refuses as too large (413)", function()
    srv:fault{ path = "/_bulk", status = 413, count = 1 }
    local bi = c:bulk_indexer{ flush_count = 8 }
    add_docs(bi, 8)
    local s = bi:close()
    assert.equal(8, s.indexed)
    assert.equal(1, s.split)
    assert.equal(3, s.batches)
  end)

  it("retries a whole batch after a transport failure", function()
    srv:fault{ path = "/_bulk", status = 503, count = 1 }
    local bi = c:bulk_indexer{ backoff_min = 1, backoff_max = 5 }
    add_docs(bi, 5)
    local s = bi:close()
    assert.equal(5, s.indexed)
    assert.equal(5, s.retried)
  end)

  it("drops the items at once, with the reason, when the server refuses the request (301, 401, 403, 404)", function()
    -- (before, a 3xx -- a proxy's redirect -- was retried as if temporary, max_retries times
    -- per batch, each after its back-off)
    for _, status in ipairs({ 301, 401, 403, 404 }) do
      srv:fault{ path = "/_bulk", status = status, count = -1 }
      local bi = c:bulk_indexer{ flush_count = 2 }
      add_docs(bi, 3)
      local s = bi:close()
      assert.equal(3, s.failed)
      assert.equal(0, s.retried)
      assert.equal(2, srv:requests("/_bulk").counts["/_bulk"])
      assert.equal(3, #s.dropped)
      assert.matches(status == 404 and "^not_found: " or "^http: ", s.dropped[1].reason)
      assert.equal(status, tonumber(s.dropped[1].reason:match("(%d%d%d)")))
      srv:reset()
    end
  end)

  it("counts a create answered 409 after an attempt whose outcome was unknown as indexed", function()
    -- the first attempt is applied but answered after socket_timeout; the retry meets the
    -- documents it wrote.  Before, all 10 were reported failed (version_conflict_engine_exception)
    -- while all 10 were in the index.  A conflict without such an attempt is still a failure.
    local c2 = assert(esx.client{ hosts = { srv.url }, socket_timeout = 200 })
    assert(c2:index("p", { n = 0 }, "taken"))
    srv:fault{ path = "/_bulk", stall_ms = 500, count = 1 }
    local bi = c2:bulk_indexer{ backoff_min = 1, backoff_max = 5 }
    for i = 1, 10 do bi:add("create", { _index = "p", _id = tostring(i) }, { n = i }) end
    local s = bi:close()
    assert.equal(10, s.indexed)
    assert.equal(0, s.failed)
    assert.equal(10, s.retried)
    bi = c2:bulk_indexer{}
    bi:add("create", { _index = "p", _id = "taken" }, { n = 1 })
    s = bi:close()
    assert.equal(1, s.failed)
    assert.truthy(s.dropped[1].reason:find("version_conflict_engine_exception", 1, true), s.dropped[1].reason)
    c2:close()
    assert.equal(11, count("p"))
  end)

  it("drops an index, update or delete answered 409 after an attempt whose outcome was unknown, naming that attempt", function()
    -- Another writer changed each document after the load read its _seq_no; the load's first
    -- attempt is answered 503 (not applied), its retry meets the other writer's change: a real
    -- conflict.  Before, a 409 after any unknown outcome was counted as indexed -- only a
    -- create's is the earlier attempt's own write -- and the three writes were lost unreported.
    for _, id in ipairs{ "i", "u", "d" } do
      local r = assert(c:index("p", { n = 0 }, id))
      assert(c:index("p", { n = 1, by = "other" }, id))
      srv:fault{ path = "/_bulk", status = 503, count = 1 }
      local bi = c:bulk_indexer{ backoff_min = 1, backoff_max = 5 }
      local meta = { _index = "p", _id = id, if_seq_no = r._seq_no, if_primary_term = r._primary_term }
      if id == "i" then bi:add("index", meta, { n = 2 })
      elseif id == "u" then bi:add("update", meta, { doc = { n = 2 } })
      else bi:add("delete", meta) end
      local s = bi:close()
      assert.equal(0, s.indexed)
      assert.equal(1, s.failed)
      assert.equal(1, s.retried)
      assert.equal(1, #s.dropped)
      assert.matches("^version_conflict_engine_exception: .* %(after an attempt whose outcome was unknown, " ..
        "which may have applied it%)$", s.dropped[1].reason)
      assert.equal("other", assert(c:get("p", id))._source.by)
    end
  end)

  it("reads the result of an index with op_type create under create, as Elasticsearch lists it", function()
    -- before, the results (under "create") were taken as out of request order: every batch was
    -- sent max_retries + 1 times and its items, all in the index, reported failed
    local c2 = assert(esx.client{ hosts = { srv.url }, socket_timeout = 200 })
    srv:fault{ path = "/_bulk", stall_ms = 500, count = 1 }
    local bi = c2:bulk_indexer{ backoff_min = 1, backoff_max = 5 }
    for i = 1, 3 do bi:add("index", { _index = "p", _id = tostring(i), op_type = "create" }, { n = i }) end
    local s = bi:close()
    -- the first attempt was applied, answered after socket_timeout: its retry's 409s are its writes
    assert.equal(3, s.indexed)
    assert.equal(0, s.failed)
    assert.equal(3, s.retried)
    assert.equal(2, s.batches)
    bi = c2:bulk_indexer{}
    bi:add("index", { _index = "p", _id = "1", op_type = "create" }, { n = 1 })
    bi:add("index", { _index = "p", _id = "4", op_type = "create" }, { n = 4 })
    s = bi:close()
    assert.equal(1, s.indexed)
    assert.equal(1, s.failed)
    assert.equal(0, s.retried)
    assert.matches("^version_conflict_engine_exception: ", s.dropped[1].reason)
    c2:close()
    assert.equal(4, count("p"))
  end)

  it("raises on a malformed operation, and returns nil, err with kind 'closed' once closed", function()
    local bi = c:bulk_indexer()
    assert.has_error(function() bi:add("upsert", { _index = "p" }, {}) end,
      "bad argument #1 to 'add' (unknown action upsert)")
    assert.has_error(function() bi:add("index", { _index = "p" }) end,
      "bad argument #3 to 'add' (index needs a document)")
    assert.has_error(function() bi:add("delete", { _index = "p", _id = "1" }, {}) end,
      "bad argument #3 to 'add' (delete takes no document)")
    bi:close()
    local ok, err = bi:add("index", { _index = "p" }, {})
    assert.is_nil(ok)
    assert.equal("closed", err.kind)
  end)
end)

describe("bi:add", function()
  it("raises on a document that is neither a table nor a JSON string, and on metadata that cannot be encoded", function()
    local bi = c:bulk_indexer()
    assert.has_error(function() bi:add("index", { _index = "p", _id = "1" }, 42) end,
      "bad argument #3 to 'add' (document table or JSON string expected, got number)")
    assert.has_error(function() bi:add("delete", { _index = "p", _id = print }) end,
      "bad argument #2 to 'add' (metadata cannot be encoded as JSON: cannot encode a function)")
    assert.equal(0, bi:stats().added)
    assert.equal(0, bi:close().failed)
  end)
end)

describe("bi:add (empty JSON arrays)", function()
  -- the _source of a document as the server keeps it: the bytes the indexer sent
  local function raw_source(id)
    local res = assert(c:request("GET", "/p/_doc/" .. id))
    return (assert(res.body:match('"_source":(.*)}$')))
  end

  it("sends esx.empty_array and esx.array_mt tables in documents as [], nested at any depth", function()
    local bi = c:bulk_indexer{ flush_count = 2 }
    assert(bi:add("index", { _index = "p", _id = "1" }, { tags = esx.empty_array }))
    assert(bi:add("create", { _index = "p", _id = "2" }, { tags = setmetatable({}, esx.array_mt) }))
    assert(bi:add("index", { _index = "p", _id = "3" }, { a = { b = setmetatable({ 1, nil, 3 }, esx.array_mt) } }))
    assert(bi:add("index", { _index = "p", _id = "4" },
      { m = setmetatable({ { e = esx.empty_array }, { d = { deep = setmetatable({}, esx.array_mt) } } }, esx.array_mt) }))
    local s = bi:close()
    assert.equal(4, s.indexed)
    assert.equal(0, s.failed)
    assert.equal('{"tags":[]}', raw_source("1"))
    assert.equal('{"tags":[]}', raw_source("2"))
    assert.equal('{"a":{"b":[1,null,3]}}', raw_source("3"))
    assert.equal('{"m":[{"e":[]},{"d":{"deep":[]}}]}', raw_source("4"))
  end)

  it("sends OpenResty lua-cjson's empty_array, array_mt and empty_array_mt as [] when the loaded cjson has them", function()
    local fork = require "spec.support.cjson_fork"
    local cj, restore = fork.install("cjson.safe")
    local bi = c:bulk_indexer{ flush_count = 1 }
    finally(function() restore(); bi:close() end)
    local doc, text = fork.document(esx, cj)
    assert(bi:add("index", { _index = "p", _id = "1" }, doc))
    assert.equal(1, bi:close().indexed)
    assert.equal(text, raw_source("1"))
  end)

  it("raises on a table with esx.array_mt that has a key other than a positive integer, and buffers nothing", function()
    local bi = c:bulk_indexer()
    assert.has_error(function()
      bi:add("index", { _index = "p", _id = "1" }, { q = setmetatable({ a = 1 }, esx.array_mt) })
    end, "bad argument #3 to 'add' (document cannot be encoded as JSON: cannot encode a table with " ..
      "esx.array_mt that has a key other than a positive integer)")
    assert.has_error(function()
      bi:add("index", { _index = "p", _id = "1" }, setmetatable({ "x", y = 1 }, esx.array_mt))
    end, "bad argument #3 to 'add' (document cannot be encoded as JSON: cannot encode a table with " ..
      "esx.array_mt that has a key other than a positive integer)")
    assert.equal(0, bi:stats().added)
    assert.equal(0, bi:close().failed)
  end)
end)

describe("bi:flush and bi:stats", function()
  it("return nil, err with kind 'closed' once closed; close() again returns the same summary", function()
    local bi = c:bulk_indexer()
    assert.is_true(bi:flush()) -- nothing to send
    bi:add("index", { _index = "p", _id = "1" }, { n = 1 })
    assert.is_true(bi:flush())
    assert.equal(1, bi:stats().added)
    local summary = bi:close()
    assert.equal(1, summary.indexed)
    for _, method in ipairs{ "flush", "stats" } do
      local ok, err = bi[method](bi)
      assert.is_nil(ok)
      assert.equal("closed", err.kind)
    end
    assert.equal(summary, bi:close())
  end)

  it("exports an open indexer's counters in esx.metrics(), and no more once it is closed", function()
    local bi = c:bulk_indexer{ name = "loader", flush_count = 2 }
    add_docs(bi, 3)
    local text = esx.metrics()
    assert.truthy(text:find('# TYPE esx_bulk_added_total counter\nesx_bulk_added_total{name="loader"} 3\n',
      1, true), text)
    assert.truthy(text:find('# TYPE esx_bulk_buffered gauge\nesx_bulk_buffered{name="loader"} 1\n', 1, true))
    assert.truthy(text:find('esx_bulk_failed_total{name="loader"} 0\n', 1, true))
    assert.equal(3, bi:close().indexed)
    assert.falsy(esx.metrics():find('name="loader"', 1, true))
    assert.has_error(function() c:bulk_indexer{ name = "bad\255" } end,
      "bulk_indexer: bad option 'name' (must be UTF-8 text)")
  end)
end)

describe("bi:close", function()
  it("reports every item of a batch even when on_drop raises", function()
    srv:fault{ path = "/_bulk", item_status = 400, item_count = 2, count = 1 }
    local calls = 0
    local bi = c:bulk_indexer{ flush_count = 10, on_drop = function()
      calls = calls + 1
      error("on_drop failed")
    end }
    add_docs(bi, 10)
    local s = bi:close()
    assert.equal(8, s.indexed)
    assert.equal(2, s.failed)
    assert.equal(2, #s.dropped)
    assert.equal(2, calls)
    assert.equal(2, s.on_drop_errors)
    assert.truthy(s.on_drop_error:find("on_drop failed", 1, true), s.on_drop_error)
  end)

  it("retries the items of a response whose results are malformed, and loses none", function()
    srv:fault{ path = "/_bulk", status = 200, count = 1, body =
      '{"took":1,"errors":true,"items":[1,{"index":{"status":"201"}},{"index":null},{}]}' }
    local bi = c:bulk_indexer{ backoff_min = 1, backoff_max = 5 }
    add_docs(bi, 4)
    local s = bi:close()
    assert.equal(4, s.indexed)
    assert.equal(0, s.failed)
    assert.equal(4, s.retried)
    assert.equal(4, count("p"))
  end)

  it("retries every item of a response whose results are not in request order, and loses none", function()
    -- before, result i was taken as item i's whatever it named: item 1 (index of "1") was
    -- counted indexed on the strength of a delete's result, and "2" reported with "1"'s error
    srv:fault{ path = "/_bulk", status = 200, count = 1, body = '{"took":1,"errors":true,"items":['
      .. '{"delete":{"_id":"3","status":200}},'
      .. '{"index":{"_id":"1","status":400,"error":{"type":"mapper_parsing_exception","reason":"x"}}},'
      .. '{"index":{"_id":"2","status":201}}]}' }
    local bi = c:bulk_indexer{ backoff_min = 1, backoff_max = 5 }
    bi:add("index", { _index = "p", _id = "1" }, { n = 1 })
    bi:add("index", { _index = "p", _id = "2" }, { n = 2 })
    bi:add("delete", { _index = "p", _id = "3" })
    local s = bi:close()
    assert.equal(3, s.indexed) -- the delete of a missing document is done
    assert.equal(0, s.failed)
    assert.equal(3, s.retried)
    assert.equal(2, count("p"))
  end)

  it("isolates an item that makes the server refuse the whole batch (400) and indexes the rest", function()
    local seen = {}
    local bi = c:bulk_indexer{ flush_count = 8, backoff_min = 0, backoff_max = 0,
      on_drop = function(item) seen[#seen + 1] = item.meta._id end }
    for i = 1, 8 do
      bi:add("index", { _index = "p", _id = tostring(i), bogus = (i == 3) or nil }, { n = i })
    end
    local s = bi:close()
    assert.equal(7, s.indexed)
    assert.equal(1, s.failed)
    assert.equal(0, s.retried)
    assert.same({ "3" }, seen)
    assert.equal("3", s.dropped[1].meta._id)
    assert.truthy(s.dropped[1].reason:find("unknown parameter [bogus]", 1, true), s.dropped[1].reason)
    assert.equal(7, count("p"))
  end)
end)

describe("bi:close (timeout)", function()
  local core = require "esx.core"

  it("returns within its timeout from a hanging sink, reporting every operation without an outcome dropped", function()
    -- before, close() had no bound: it waited for the batch in flight (up to socket_timeout,
    -- 30 s by default) and then for each batch left, each retried max_retries times
    srv:fault{ path = "/_bulk", stall_ms = 1000, count = -1 }
    local seen = {}
    local bi = c:bulk_indexer{ flush_count = 2, concurrency = 1,
                               on_drop = function(item, reason) seen[item.meta._id] = reason end }
    add_docs(bi, 3) -- 1 and 2 in flight, 3 buffered
    local t0 = core.now()
    local s = bi:close{ timeout = 150 }
    local ms = core.now() - t0
    assert.is_true(ms >= 140 and ms < 650, "close took " .. ms .. " ms")
    assert.equal(3, s.added)
    assert.equal(0, s.indexed)
    assert.equal(3, s.failed)
    assert.equal(3, s.timed_out)
    assert.equal(1, s.batches)
    local unknown = "request_timeout: bi:close() gave up after 150 ms with the operation's batch in " ..
                    "flight: its outcome is unknown"
    local unsent = "request_timeout: bi:close() gave up after 150 ms before sending the operation"
    assert.same({ { "1", unknown }, { "2", unknown }, { "3", unsent } },
      { { s.dropped[1].meta._id, s.dropped[1].reason }, { s.dropped[2].meta._id, s.dropped[2].reason },
        { s.dropped[3].meta._id, s.dropped[3].reason } })
    assert.same({ ["1"] = unknown, ["2"] = unknown, ["3"] = unsent }, seen)
    assert.equal(s, bi:close())
  end)

  it("drops the retries still waiting out their back-off when the timeout passes, with their last reason", function()
    srv:fault{ path = "/_bulk", item_status = 429, item_count = 1, count = 1 }
    local bi = c:bulk_indexer{ backoff_min = 10000, backoff_max = 10000 }
    add_docs(bi, 2)
    local t0 = core.now()
    local s = bi:close(200) -- (a number, as col:close(timeout_ms))
    local ms = core.now() - t0
    assert.is_true(ms >= 190 and ms < 700, "close took " .. ms .. " ms")
    assert.equal(1, s.indexed)
    assert.equal(1, s.retried)
    assert.equal(1, s.failed)
    assert.equal(1, s.timed_out)
    assert.equal("1", s.dropped[1].meta._id)
    assert.matches("^request_timeout: bi:close%(%) gave up after 200 ms while the operation waited to be " ..
      "retried %(retried after: es_rejected_execution_exception: .*%)$", s.dropped[1].reason)
  end)

  it("sends nothing more and drops what is left at once with a timeout of 0; without one, waits for everything", function()
    local bi = c:bulk_indexer{}
    add_docs(bi, 2)
    local s = bi:close{ timeout = 0 }
    assert.equal(0, s.batches)
    assert.equal(2, s.failed)
    assert.equal(2, s.timed_out)
    assert.equal(0, srv:requests("/_bulk").counts["/_bulk"] or 0)
    bi = c:bulk_indexer{}
    add_docs(bi, 2)
    s = bi:close{ timeout = 5000 }
    assert.equal(2, s.indexed)
    assert.equal(0, s.timed_out)
    assert.equal(0, #s.dropped)
  end)

  it("polls for a batch in nginx no longer than its timeout when the nginx waiter fails", function()
    srv:fault{ path = "/_bulk", stall_ms = 1000, count = -1 }
    local fake = require "spec.support.ngx"
    finally(fake.install({ get_phase = function() return "content" end,
                           sleep = function(sec) core.sleep(sec * 1000) end },
                         { wait = function() return nil, core.error("internal", "cannot reach the esx waiter socket") end }))
    local bi = c:bulk_indexer{}
    add_docs(bi, 2)
    assert(bi:flush())
    local t0 = core.now()
    local s = bi:close{ timeout = 150 }
    local ms = core.now() - t0
    assert.is_true(ms >= 140 and ms < 650, "close took " .. ms .. " ms")
    assert.equal(2, s.timed_out)
    assert.equal(2, s.failed)
  end)

  it("counts every operation once when Lua runs out of memory while it gives up on them, and close() is called again", function()
    -- give_up emptied the buffer, the retry list and the halves of refused batches only once
    -- all of them were counted: memory that ran out part-way left the ones counted listed,
    -- and the next close() counted them again (failed > added)
    local bi = c:bulk_indexer{ backoff_min = 10000, backoff_max = 10000 }
    add_docs(bi, 4)
    -- the 3rd operation's record of its drop cannot be stored, once, as when memory runs out
    local failed_once = false
    bi.dropped = setmetatable({}, { __newindex = function(t, k, v)
      if k == 3 and not failed_once then
        failed_once = true
        error("not enough memory", 0)
      end
      rawset(t, k, v)
    end })
    local ok, err = pcall(bi.close, bi, 0)
    assert.is_false(ok)
    assert.equal("not enough memory", err)
    local s = bi:close(0)
    assert.equal(4, s.added)
    assert.equal(4, s.failed)
    assert.equal(4, s.timed_out)
    assert.equal(4, #s.dropped)
    local ids = {}
    for i, d in ipairs(s.dropped) do ids[i] = d.meta._id end
    assert.same({ "1", "2", "3", "4" }, ids)
  end)

  it("raises on an unknown option and on a timeout that is not an integer number of ms >= 0", function()
    local bi = c:bulk_indexer{}
    assert.has_error(function() bi:close{ timout = 100 } end, "bad option 'timout' to 'close' (unknown option)")
    assert.has_error(function() bi:close{ timeout = -1 } end, "bad option 'timeout' to 'close' (must be >= 0)")
    assert.has_error(function() bi:close{ timeout = 1.5 } end,
      "bad option 'timeout' to 'close' (integer expected, got non-integer number)")
    assert.has_error(function() bi:close(-1) end, "bad argument #1 to 'close' (timeout: must be >= 0)")
    assert.has_error(function() bi:close("100") end,
      "bad argument #1 to 'close' (options table or timeout in ms expected, got string)")
    local ok, err = pcall(function() local s = bi:close{ timout = 100 } return s end)
    assert.is_false(ok)
    assert.truthy(err:find("^[^:]*bulk_spec%.lua:%d+: bad option 'timout' to 'close'"), err)
    assert.equal(0, bi:close().added)
  end)
end)

describe("bi:close (whole-batch 429)", function()
  -- Retry-After in seconds, and as an HTTP-date two seconds ahead (whole seconds: at least 1 s)
  for _, form in ipairs{ "seconds", "date" } do
  it("waits out the Retry-After (" .. form .. ") of a batch refused with 429 before retrying it", function()
    local value = form == "seconds" and "1" or os.date("!%a, %d %b %Y %H:%M:%S GMT", os.time() + 2)
    srv:fault{ path = "/_bulk", status = 429, headers = { ["Retry-After"] = value }, count = 1 }
    local bi = c:bulk_indexer{ backoff_min = 1, backoff_max = 5 }
    bi:add("index", { _index = "p", _id = "1" }, { n = 1 })
    local t0 = require("esx.core").now()
    local s = bi:close()
    local ms = require("esx.core").now() - t0
    assert.equal(1, s.indexed)
    assert.equal(1, s.retried)
    assert.is_true(ms >= 950, "retried after " .. ms .. " ms")
  end)
  end
end)

describe("bi:close (client closed)", function()
  it("drops the items at once, with the reason, when the client is closed", function()
    local bi = c:bulk_indexer{ flush_count = 2 }
    c:close()
    add_docs(bi, 3)
    local t0 = require("esx.core").now()
    local s = bi:close()
    assert.is_true(require("esx.core").now() - t0 < 500, "close took " .. (require("esx.core").now() - t0) .. " ms")
    assert.equal(3, s.failed)
    assert.equal(0, s.retried)
    assert.equal(3, #s.dropped)
    assert.equal("closed: the client is closed", s.dropped[3].reason)
  end)

  -- An indexer whose batch of items 1 and 2 was answered 503 -- read by the indexer at its next
  -- call, when the back-off (10-20 s) of their retries is drawn -- and then its client closed.
  local function answered_503_then_client_closed()
    -- (answered late: the add() that sends the batch must not read the answer, and be held by
    -- the retries while the client is still open)
    srv:fault{ path = "/_bulk", status = 503, stall_ms = 200, count = 1 }
    -- retries worth concurrency (1) batches of flush_count (2) hold the producer
    local bi = c:bulk_indexer{ flush_count = 2, concurrency = 1, backoff_min = 20000, backoff_max = 20000 }
    add_docs(bi, 2)                                               -- sent
    -- the answer reaches the client (a request done before close() keeps it): the server has
    -- the request, then the client's slot is free again
    local socket = require "socket"
    local deadline = socket.gettime() + 5
    while (srv:requests("/_bulk").counts["/_bulk"] or 0) < 1 and socket.gettime() < deadline do
      socket.sleep(0.01)
    end
    while c:stats().pool.in_use > 0 and socket.gettime() < deadline do socket.sleep(0.01) end
    socket.sleep(0.05)
    c:close()
    return bi
  end

  it("does not wait out the back-off of retries that the closed client can never send", function()
    -- before, close() slept until the retries of items 1 and 2 were due (10-20 s here; up to
    -- backoff_max, or a Retry-After's 30 s), only to drop them then with "closed": a shutdown
    -- that closes the client first blocked for nothing
    local bi = answered_503_then_client_closed()
    local core = require "esx.core"
    local t0 = core.now()
    local s = bi:close()
    assert.is_true(core.now() - t0 < 2000, "close took " .. (core.now() - t0) .. " ms")
    assert.equal(2, s.added)
    assert.equal(2, s.failed)
    assert.equal(2, s.retried) -- (the 503 was read: they waited out a back-off)
    assert.equal(2, #s.dropped)
    for _, d in ipairs(s.dropped) do assert.equal("closed: the client is closed", d.reason) end
  end)

  it("does not hold the producer for the back-off of retries that the closed client can never send", function()
    -- before, the add() that read the 503 and found retries worth a batch waiting slept 10-20 s
    local bi = answered_503_then_client_closed()
    local core = require "esx.core"
    local t0 = core.now()
    assert(bi:add("index", { _index = "p", _id = "3" }, { n = 3 }))
    assert.is_true(core.now() - t0 < 2000, "add took " .. (core.now() - t0) .. " ms")
    local st = bi:stats()
    assert.equal(2, st.retried)
    assert.equal(0, st.delayed)
    local s = bi:close()
    assert.equal(3, s.failed)
    assert.equal(0, s.indexed)
  end)
end)

describe("bi:close (never called)", function()
  -- Runs a Lua process that adds n operations to an indexer (flush_count 3: some are sent,
  -- and answered only after 1.5 s) and drops it without closing it, or closes it first;
  -- returns what it wrote on stderr.
  local function forgetful(n, close)
    srv:fault{ path = "/_bulk", stall_ms = 1500, count = 2 }
    local err, _, ok = require("spec.support.child").run_script(([[
      local esx = require "esx"
      local c = assert(esx.client{ hosts = { "%s" } })
      local bi = assert(c:bulk_indexer{ flush_count = 3, concurrency = 4, name = "nightly" })
      for i = 1, %d do assert(bi:add("index", { _index = "gone", _id = tostring(i) }, { n = i })) end
      if %s then bi:close() end
      bi = nil
      collectgarbage()
      collectgarbage()
      c:close()
    ]]):format(srv.url, n, tostring(close)))
    assert.is_true(ok, "the process failed: " .. err)
    return err
  end

  it("says on stderr how many operations an indexer dropped without close() left without an outcome", function()
    -- 7 added: two batches of 3 sent (their outcome never read), 1 never sent
    assert.equal("esx bulk indexer nightly: collected without close(): 7 of 7 added operations have " ..
                 "no outcome (1 waiting to be sent)\n", forgetful(7, false))
    assert.equal("", forgetful(7, true))
  end)
end)

describe("bi:close (in nginx)", function()
  local core = require "esx.core"
  local fake = require "spec.support.ngx"
  local failing_waiter = { wait = function()
    return nil, core.error("internal", "cannot reach the esx waiter socket")
  end }

  it("waits for a batch the nginx waiter failed to wait for, and loses none", function()
    srv:fault{ path = "/_bulk", stall_ms = 200 }
    finally(fake.install({ get_phase = function() return "content" end,
                           sleep = function(s) core.sleep(s * 1000) end }, failing_waiter))
    local bi = c:bulk_indexer()
    add_docs(bi, 3)
    local s = bi:close()
    assert.equal(3, s.indexed)
    assert.equal(0, s.failed)
    assert.equal(0, s.retried)
  end)

  it("polls with ngx.sleep, without blocking the worker, for a batch the nginx waiter failed to wait for", function()
    -- before, it fell back to pending:wait(), which blocks the nginx worker (and every request
    -- on it) for as long as the batch takes: here 300 ms, up to socket_timeout in general
    srv:fault{ path = "/_bulk", stall_ms = 300 }
    local naps = 0
    finally(fake.install({ get_phase = function() return "timer" end,
                           sleep = function(s) naps = naps + 1; core.sleep(s * 1000) end },
                         failing_waiter))
    local bi = c:bulk_indexer()
    add_docs(bi, 3)
    local s = bi:close()
    assert.equal(3, s.indexed)
    assert.equal(0, s.retried)
    assert.is_true(naps > 1, "ngx.sleep called " .. naps .. " times")
  end)

  it("sleeps out a back-off without ngx.sleep in a phase that cannot yield", function()
    srv:fault{ path = "/_bulk", item_status = 429, count = 1 }
    finally(fake.install({ get_phase = function() return "log" end,
                           sleep = function() error("API disabled in the context of log_by_lua*") end }))
    local bi = c:bulk_indexer{ backoff_min = 200, backoff_max = 200 }
    bi:add("index", { _index = "p", _id = "1" }, { n = 1 })
    local s = bi:close()
    assert.equal(1, s.indexed)
    assert.equal(1, s.retried)
  end)
end)

describe("bi retries (in nginx, with timers)", function()
  local core = require "esx.core"
  local fake = require "spec.support.ngx"
  -- ngx.timer.at in plain Lua: timers are kept, and run() runs them in order of due time (the
  -- stand-in esx.nginx.wait blocks, as a timer's light thread would yield)
  local function timers()
    local list, clock = {}, 0
    local t = {}
    function t.at(delay, fn, ...)
      list[#list + 1] = { at = clock + delay, fn = fn, args = { ... } }
      return true
    end
    function t.run(max)
      local n = 0
      while list[1] do
        table.sort(list, function(a, b) return a.at < b.at end)
        local tm = table.remove(list, 1)
        if tm.at > clock then core.sleep((tm.at - clock) * 1000) clock = tm.at end
        tm.fn(false, (table.unpack or unpack)(tm.args))
        n = n + 1
        assert(n <= max, "more than " .. max .. " timers")
      end
      return n
    end
    return t
  end

  it("sends retries that fall due, and reads their answers, with no call to the indexer", function()
    -- before, items answered 429 waited for the next add() that filled a batch, flush() or
    -- close(): a worker's indexer fed now and then held them for as long as nobody called it
    srv:fault{ path = "/_bulk", item_status = 429, count = 1 }
    local t = timers()
    finally(fake.install({ get_phase = function() return "content" end, timer = t,
                           sleep = function(sec) core.sleep(sec * 1000) end },
                         { wait = function(p) p:wait() return p:result() end }))
    local bi = c:bulk_indexer{ backoff_min = 100, backoff_max = 100 }
    add_docs(bi, 3)
    assert(bi:flush())
    assert.is_true(t.run(10) >= 3) -- the answer, the due retry, the retry's answer
    local s = bi:stats()
    assert.same({ 3, 3, 0, 0, 0, 0, 2 }, { s.indexed, s.retried, s.failed, s.delayed, s.in_flight,
                                          s.buffered, s.batches })
    assert.equal(2, #srv:requests("/_bulk").requests)
    s = bi:close()
    assert.equal(3, s.indexed)
  end)

  it("sends what it holds, retries too, and reads the answers when a worker's exit fires its timer early", function()
    -- before, the early timer did nothing: an indexer that exit_worker_by_lua did not close
    -- lost its buffer, its batch in flight and its retries with the worker
    srv:fault{ path = "/_bulk", item_status = 429, item_count = 1, count = 1 }
    -- (the second batch answered late: still in flight when the timer fires, however fast the
    -- machine -- read at once, it made 3 indexed and none in flight, 1 run in 200)
    srv:fault{ path = "/_bulk", stall_ms = 300, count = 1 }
    local made = {}
    local t = { at = function(...) made[#made + 1] = { ... } return true end }
    finally(fake.install({ get_phase = function() return "timer" end, timer = t,
                           sleep = function() error("no sleep expected") end },
                         { wait = function(p) p:wait() return p:result() end }))
    local bi = c:bulk_indexer{ flush_count = 2, concurrency = 1, flush_interval = 60000,
                               backoff_min = 60000, backoff_max = 60000 }
    -- 1 and 2 sent; 4 fills the next batch: the answer read (1 to retry in 60 s), 3 and 4 sent
    add_docs(bi, 5)
    local s = bi:stats()
    assert.same({ 1, 1, 1, 1 }, { s.indexed, s.delayed, s.in_flight, s.buffered })
    local tm = made[#made]
    tm[2](true, tm[3], tm[4]) -- (delay, on_timer, indexer, due)
    s = bi:stats()
    assert.same({ 5, 0, 0, 0, 0 }, { s.indexed, s.failed, s.delayed, s.in_flight, s.buffered })
    assert.equal(5, bi:close().indexed)
  end)

  it("leaves a load's partly filled batch to the load while no retry is due", function()
    local t = timers()
    finally(fake.install({ get_phase = function() return "content" end, timer = t,
                           sleep = function(sec) core.sleep(sec * 1000) end },
                         { wait = function(p) p:wait() return p:result() end }))
    -- (flush_interval off: these timers sleep for real; "bi flush_interval" has its own)
    local bi = c:bulk_indexer{ flush_count = 10, flush_interval = 0 }
    add_docs(bi, 15) -- a batch of 10 sent, 5 buffered
    t.run(10)
    local s = bi:stats()
    assert.same({ 10, 5, 1 }, { s.indexed, s.buffered, s.batches })
    assert.equal(15, bi:close().indexed)
  end)
end)

describe("bi:add and bi:close (light threads sharing an indexer in nginx)", function()
  local core = require "esx.core"
  local fake = require "spec.support.ngx"
  local restore
  -- nginx's light threads, in plain Lua: esx.nginx.wait and ngx.sleep yield the coroutine, and
  -- run() resumes every live one in turn until all are done
  before_each(function()
    restore = fake.install({ get_phase = function() return "timer" end, sleep = function(s)
      local t = core.now() + s * 1000
      repeat coroutine.yield() until core.now() >= t
    end }, { wait = function(p)
      while not p:ready() do coroutine.yield() end
      return p:result()
    end })
  end)
  after_each(function()
    restore()
    srv:clear_faults()
  end)
  local function run(...)
    local threads = {}
    for i, f in ipairs{ ... } do threads[i] = coroutine.create(f) end
    local alive
    repeat
      alive = 0
      for _, co in ipairs(threads) do
        if coroutine.status(co) ~= "dead" then
          assert(coroutine.resume(co))
          if coroutine.status(co) ~= "dead" then alive = alive + 1 end
        end
      end
      core.sleep(1)
    until alive == 0
  end

  it("keeps to concurrency when another thread waits for the batch in flight", function()
    -- before, the batch waited for was off the list: the other thread saw a free slot and sent
    srv:fault{ path = "/_bulk", stall_ms = 100, count = -1 }
    local sent, most = {}, 0
    local send = c.send
    c.send = function(self, ...)
      local p, err = send(self, ...)
      local n = 1
      for _, q in ipairs(sent) do if not q:ready() then n = n + 1 end end
      most = math.max(most, n)
      sent[#sent + 1] = p
      return p, err
    end
    local bi = c:bulk_indexer{ concurrency = 1, flush_count = 1 }
    local s
    run(function() for i = 1, 3 do bi:add("index", { _index = "p", _id = "a" .. i }, { n = i }) end end,
        function()
          for i = 1, 3 do bi:add("index", { _index = "p", _id = "b" .. i }, { n = i }) end
          s = bi:close()
        end)
    assert.equal(1, most)
    assert.equal(6, s.indexed)
  end)

  it("close() waits for a batch another thread is waiting for", function()
    -- before, close() returned {added = 4, indexed = 0} while the other thread still waited
    srv:fault{ path = "/_bulk", stall_ms = 100, count = -1 }
    local bi = c:bulk_indexer{ concurrency = 1, flush_count = 2 }
    local s
    run(function() add_docs(bi, 4) end,
        function() s = bi:close() end)
    assert.equal(4, s.added)
    assert.equal(4, s.indexed)
  end)

  it("close() in two threads at once returns the one summary to both", function()
    -- before, the close() that finished its wait second found the indexer closed by the other
    -- one and raised "attempt to index a nil value" (its stats() answered nil, closed)
    srv:fault{ path = "/_bulk", stall_ms = 100, count = -1 }
    local bi = c:bulk_indexer{ concurrency = 1, flush_count = 2 }
    local a, b
    run(function() add_docs(bi, 4) a = bi:close() end,
        function() b = bi:close() end)
    assert.equal(4, a.added)
    assert.equal(4, a.indexed)
    assert.equal(a, b)
  end)

  it("close() counts every item of a batch whose on_drop yields", function()
    -- before, on_drop ran in the middle of the batch: while it yielded the rest of the batch
    -- was nowhere, and close() in the other thread returned without it
    srv:fault{ path = "/_bulk", item_status = 400, item_count = 2, stall_ms = 100, count = 1 }
    local calls = 0
    local bi = c:bulk_indexer{ concurrency = 1, flush_count = 4, on_drop = function()
      calls = calls + 1
      ngx.sleep(0.05)
    end }
    local s
    run(function() add_docs(bi, 8) end,
        function()
          while bi:stats().added < 8 do ngx.sleep(0.001) end
          s = bi:close()
        end)
    assert.equal(8, s.added)
    assert.equal(6, s.indexed)
    assert.equal(2, s.failed)
    assert.equal(2, calls)
  end)

  it("reports every item once when on_drop yields after a batch could not be sent (client closed)", function()
    -- before, the batch was still at the front of the buffer while on_drop yielded: the other
    -- thread sent (and dropped) it again, then each took a batch off the buffer -- a1, a2
    -- reported twice, b1, b2 never, and close() said added == indexed + failed
    local c2 = assert(esx.client{ hosts = { srv.url } })
    local seen = {}
    local bi = c2:bulk_indexer{ flush_count = 2, on_drop = function(item)
      seen[#seen + 1] = item.meta._id
      ngx.sleep(0.01)
    end }
    c2:close()
    local s
    run(function()
          bi:add("index", { _index = "p", _id = "a1" }, { n = 1 })
          bi:add("index", { _index = "p", _id = "a2" }, { n = 2 })
        end,
        function()
          bi:add("index", { _index = "p", _id = "b1" }, { n = 3 })
          bi:add("index", { _index = "p", _id = "b2" }, { n = 4 })
          s = bi:close()
        end)
    table.sort(seen)
    assert.same({ "a1", "a2", "b1", "b2" }, seen)
    assert.equal(4, s.added)
    assert.equal(4, s.failed)
    local ids = {}
    for i, d in ipairs(s.dropped) do ids[i] = d.meta._id end
    table.sort(ids)
    assert.same({ "a1", "a2", "b1", "b2" }, ids)
  end)
end)

describe("bi flush_interval", function()
  local core = require "esx.core"
  local fake = require "spec.support.ngx"
  -- A fake clock for esx.bulk (it reads core.now at each call; the client's own clock is C's):
  -- returns a function that moves it on by ms, one that reads it, and one that puts the real
  -- clock back.  (Not given to finally() here: busted keeps one finally per test, the last,
  -- and a test that gave another lost this one -- the clock stayed fake for the specs after.)
  local function fake_clock()
    local clock, real = 1000000, core.now
    core.now = function() return clock end
    return function(ms) clock = clock + ms return clock end, function() return clock end,
      function() core.now = real end
  end

  it("raises on a flush_interval that is not an integer number of ms from 0 to 3600000", function()
    for v, why in pairs{ [-1] = "must be >= 0", [3600001] = "must be <= 3600000",
                         [0.5] = "integer expected, got non-integer number",
                         ["1s"] = "integer expected, got string", [true] = "integer expected, got boolean" } do
      assert.has_error(function() c:bulk_indexer{ flush_interval = v } end,
        "bulk_indexer: bad option 'flush_interval' (" .. why .. ")")
    end
    assert.has_no_error(function() c:bulk_indexer{ flush_interval = 0 }:close() end)
  end)

  it("sends a partly filled buffer at the first add() once its oldest operation is flush_interval old (plain Lua)", function()
    -- before, an indexer fed now and then held its operations until a batch filled, flush()
    -- or close(): a user's last documents were not sent until close()
    local tick, _, real_clock = fake_clock()
    finally(real_clock)
    local bi = c:bulk_indexer{ flush_count = 100, flush_interval = 1000 }
    local function st() local s = bi:stats() return { s.buffered, s.batches } end
    bi:add("index", { _index = "p", _id = "1" }, { n = 1 })
    tick(400)
    bi:add("index", { _index = "p", _id = "2" }, { n = 2 })
    tick(599) -- the oldest is 999 ms old
    bi:add("index", { _index = "p", _id = "3" }, { n = 3 })
    assert.same({ 3, 0 }, st())
    tick(1) -- 1000 ms: the operation added goes out with the rest
    bi:add("index", { _index = "p", _id = "4" }, { n = 4 })
    assert.same({ 0, 1 }, st())
    -- the next buffer's age counts from its own oldest operation
    tick(999)
    bi:add("index", { _index = "p", _id = "5" }, { n = 5 })
    tick(999)
    bi:add("index", { _index = "p", _id = "6" }, { n = 6 })
    assert.same({ 2, 1 }, st())
    tick(1)
    bi:add("index", { _index = "p", _id = "7" }, { n = 7 })
    assert.same({ 0, 2 }, st())
    local s = bi:close()
    assert.same({ 7, 7, 2 }, { s.added, s.indexed, s.batches })
    assert.equal(2, #srv:requests("/_bulk").requests)
    -- 0: off -- an hour-old buffer waits for a full batch, flush() or close()
    bi = c:bulk_indexer{ flush_count = 100, flush_interval = 0 }
    bi:add("index", { _index = "p", _id = "8" }, { n = 8 })
    tick(3600000)
    bi:add("index", { _index = "p", _id = "9" }, { n = 9 })
    assert.same({ 2, 0 }, st())
    assert.equal(2, bi:close().indexed)
  end)

  it("sends a buffer whose oldest operation is flush_interval old from the indexer's timer, with no call (nginx)", function()
    -- before, the timer ran only for answers and due retries: the 2 operations after a full
    -- batch waited in the buffer for as long as nobody called the indexer
    local tick, clock, real_clock = fake_clock()
    -- ngx.timer.at on the fake clock: step() runs the soonest timer (the clock moved on to
    -- its due time, without sleeping) and returns that time
    local list = {}
    local t = { at = function(delay, fn, ...)
      list[#list + 1] = { at = clock() + delay * 1000, fn = fn, args = { ... } }
      return true
    end }
    local function step()
      table.sort(list, function(x, y) return x.at < y.at end)
      local tm = assert(table.remove(list, 1), "no timer pending")
      if tm.at > clock() then tick(tm.at - clock()) end
      tm.fn(false, (table.unpack or unpack)(tm.args))
      return tm.at
    end
    local real_ngx = fake.install({ get_phase = function() return "content" end, timer = t,
                                    sleep = function() error("no sleep expected") end },
                                  { wait = function(p) p:wait() return p:result() end })
    finally(function() real_ngx() real_clock() end)
    local t0 = clock()
    local bi = c:bulk_indexer{ flush_count = 10, flush_interval = 1000 }
    local function st() local s = bi:stats() return { s.indexed, s.buffered, s.batches } end
    add_docs(bi, 10) -- a full batch sent
    tick(300)
    bi:add("index", { _index = "p", _id = "11" }, { n = 11 })
    tick(300)
    bi:add("index", { _index = "p", _id = "12" }, { n = 12 })
    -- the timer armed for the batch's answer (fired late: the clock is at 600 ms) reads it,
    -- and leaves the buffer, 300 ms old, alone
    assert.equal(t0, step())
    assert.same({ 10, 2, 1 }, st())
    -- the timer armed for operation 1 (which went out in the full batch) finds the buffer
    -- 700 ms old: nothing sent
    assert.equal(t0 + 1000, step())
    assert.same({ 10, 2, 1 }, st())
    -- sent once its oldest is 1000 ms old, then its answer read
    assert.equal(t0 + 1300, step())
    assert.same({ 10, 0, 2 }, st())
    step()
    assert.same({ 12, 0, 2 }, st())
    assert.same({}, list) -- nothing left to do: no timer
    assert.equal(2, #srv:requests("/_bulk").requests)
    assert.equal(12, bi:close().indexed)
  end)
end)

describe("bi:flush", function()
  it("sends retries in batches no bigger than flush_count", function()
    srv:fault{ path = "/_bulk", item_status = 429, count = 2 }
    local bi = c:bulk_indexer{ flush_count = 10, backoff_min = 0, backoff_max = 0 }
    add_docs(bi, 20)
    local s = bi:close()
    assert.equal(20, s.indexed)
    assert.equal(20, s.retried)
    assert.equal(4, s.batches)
  end)

  it("sends retries in batches no bigger than flush_bytes", function()
    srv:fault{ path = "/_bulk", item_status = 429, count = 2 }
    local doc = { pad = string.rep("x", 180) }
    local bi = c:bulk_indexer{ flush_bytes = 2000, flush_count = 100000, backoff_min = 0, backoff_max = 0 }
    for i = 1, 20 do bi:add("index", { _index = "p", _id = string.format("%02d", i) }, doc) end
    local s = bi:close()
    assert.equal(20, s.indexed)
    assert.equal(18, s.retried) -- batches of 9 lines (9 x 229 bytes >= 2000): two were refused
    for _, r in ipairs(srv:requests("/_bulk").requests) do
      assert.is_true(r.body_bytes < 2000 + 300, "a bulk of " .. r.body_bytes .. " bytes")
    end
  end)
end)
