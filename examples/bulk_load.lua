#!/usr/bin/env lua5.4
--- examples/bulk_load.lua -- loads the example data set (articles and who read them, see
-- examples/articles.lua) into Elasticsearch with esx's bulk indexer, drawing a progress bar.
-- Progress counts reader ids (one document per article holds its whole reader set).
--
--   lua5.4 examples/bulk_load.lua [--es http://127.0.0.1:9200] [--articles 60] [--users 20000]
--                                 [--max-readers 4000] [--seed 1]
--
-- The bulk indexer keeps two _bulk requests in flight, gzips them, retries items Elasticsearch
-- answered 429 with back-off, and reports (never silently drops) items it gives up on.  Prints
-- one summary line: "loaded A articles and R reader ids in S s (N ids/s), failed F".

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. here .. "/../lua/?.lua;" .. here .. "/../lua/?/init.lua;" .. package.path
package.cpath = here .. "/../build/" .. (jit and "luajit" or "lua5.4") .. "/?.so;" .. package.cpath

local esx = require "esx"
local articles = require "articles"

local opts = require("args").parse(arg,
  { es = "http://127.0.0.1:9200", articles = 60, users = 20000, ["max-readers"] = 4000, seed = 1 },
  "usage: bulk_load.lua [--es URL] [--articles N] [--users N] [--max-readers N] [--seed N]")
local max_readers = math.min(opts["max-readers"], opts.users)

local client = assert(esx.client{ hosts = { opts.es }, compression = true,
                                  compression_min_bytes = 4096, request_timeout = 60000 })

-- Explicit mappings, so that a real Elasticsearch sorts and filters these fields as numbers.
local function create(index, properties)
  assert(client:request("PUT", "/" .. index, { mappings = { properties = properties } },
    { ok_status = { 400 } })) -- 400: resource_already_exists_exception (a second load)
end
create("articles", { id = { type = "long" }, title = { type = "text" }, published_at = { type = "date" } })
create("readers", { article_id = { type = "long" }, user_ids = { type = "long" } })
create("reads", { article_id = { type = "long" }, user_id = { type = "long" } })

-- A small deterministic generator (the same data in Lua 5.4 and LuaJIT).
local state = opts.seed
local function rand() -- [0, 1)
  state = (state * 1103515245 + 12345) % 2147483648
  return state / 2147483648
end

-- Reader sets: article a is read by about n_a users, n_a between 5% and 100% of max_readers.
-- prefix[k] = reader ids in the first k articles (the progress bar counts reader ids).
local sizes, prefix = {}, { [0] = 0 }
for a = 1, opts.articles do
  sizes[a] = math.floor(max_readers * (0.05 + 0.95 * rand()))
  prefix[a] = prefix[a - 1] + sizes[a]
end
local total = prefix[opts.articles]

local function is_tty()
  local ok = os.execute("test -t 1")
  return ok == true or ok == 0
end
local tty = is_tty()
local socket_ok, socket = pcall(require, "socket")
local function now() return socket_ok and socket.gettime() or os.time() end
local start, last_draw = now(), -1

local function draw(docs_done, final)
  local t = now()
  if not final and t - last_draw < (tty and 0.1 or 1) then return end
  last_draw = t
  local done = prefix[math.min(opts.articles, math.floor(docs_done / 2))] -- two documents per article
  local width = 30
  local filled = math.floor(width * done / math.max(total, 1))
  local line = ("[%s%s] %3d%%  %d/%d reader ids  %7.0f ids/s"):format(string.rep("#", filled),
    string.rep(".", width - filled), math.floor(100 * done / math.max(total, 1)), done, total,
    done / math.max(t - start, 1e-3))
  io.write(tty and ("\r" .. line) or (line .. "\n"))
  if final and tty then io.write("\n") end
  io.flush()
end

-- 64 KiB batches: a few dozen _bulk requests, so the bar moves.
local bi = client:bulk_indexer{ flush_bytes = 65536, concurrency = 2 }
local base = 1700000000000
for a = 1, opts.articles do
  bi:add("index", { _index = "articles", _id = tostring(a) },
    { id = a, title = articles.title(a), published_at = base + a * 60000 })
  -- choose sizes[a] of the users, each with the same probability (selection sampling)
  local ids, need, left = {}, sizes[a], opts.users
  for u = 1, opts.users do
    if rand() * left < need then
      ids[#ids + 1] = u
      need = need - 1
    end
    left = left - 1
  end
  bi:add("index", { _index = "readers", _id = tostring(a) }, { article_id = a, user_ids = ids })
  local st = bi:stats()
  draw(st.indexed + st.failed)
end
local summary = bi:close()
draw(summary.indexed + summary.failed, true)
assert(client:refresh("articles,readers,reads"))
for _, d in ipairs(summary.dropped) do
  io.stderr:write("dropped ", tostring(d.meta and d.meta._id), ": ", tostring(d.reason), "\n")
end
local secs = math.max(now() - start, 1e-3)
print(("loaded %d articles and %d reader ids in %.1f s (%.0f ids/s), failed %d"):format(
  opts.articles, total, secs, total / secs, summary.failed))
client:close()
os.exit(summary.failed == 0 and 0 or 1)
