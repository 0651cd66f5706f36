#!/usr/bin/env lua5.4
--- examples/search.lua -- searches the example articles (loaded by examples/bulk_load.lua) with
-- esx.client: a match query on the title, the hit count, and the most-read articles from a
-- terms aggregation over the reads recorded by mark-read calls.
--
--   lua5.4 examples/search.lua [--es http://127.0.0.1:9200] [--size 5] words...
--
-- Shows the client's error convention: a failed call returns nil, err with err.kind
-- ("connect", "http", "socket_timeout", ...), and tostring(err) is "<kind>: <message>".

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/../lua/?.lua;" .. here .. "/../lua/?/init.lua;" .. package.path
package.cpath = here .. "/../build/" .. (jit and "luajit" or "lua5.4") .. "/?.so;" .. package.cpath

local esx = require "esx"

local es, size, words = "http://127.0.0.1:9200", 5, {}
local i = 1
while arg[i] do
  if arg[i] == "--es" and arg[i + 1] then es = arg[i + 1]; i = i + 1
  elseif arg[i] == "--size" and tonumber(arg[i + 1] or "") then size = tonumber(arg[i + 1]); i = i + 1
  else words[#words + 1] = arg[i] end
  i = i + 1
end
if #words == 0 then words = { "cache" } end
local text = table.concat(words, " ")

local client = assert(esx.client{ hosts = { es }, request_timeout = 10000 })

local function check(v, err)
  if v == nil then
    io.stderr:write("search.lua: ", tostring(err), "\n")
    os.exit(1)
  end
  return v
end

local res = check(client:search("articles", {
  query = { match = { title = text } }, size = size, sort = { { id = "desc" } },
  track_total_hits = true,
}))
print(("%d articles match %q (took %d ms); newest %d:"):format(res.hits.total.value, text,
  res.took or 0, #res.hits.hits))
for _, hit in ipairs(res.hits.hits) do
  print(("  #%-4d %s"):format(hit._source.id, hit._source.title))
end

local total = check(client:count("reads", { query = { match_all = {} } }))
local top = check(client:search("reads", { size = 0,
  aggs = { top = { terms = { field = "article_id", size = size } } } }))
print(("%d reads recorded since the load; most read:"):format(total))
for _, b in ipairs(top.aggregations.top.buckets) do
  print(("  #%-4d %d reads"):format(b.key, b.doc_count))
end

local s = client:stats()
print(("client: %d requests, %d retries, pool idle %d"):format(s.requests, s.retries, s.pool.idle or 0))
client:close()
