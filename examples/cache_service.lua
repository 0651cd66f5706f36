#!/usr/bin/env lua5.4
--- examples/cache_service.lua -- a plain-Lua HTTP service (luasocket, one thread) that serves
-- the example article list with per-user read flags from esx.cache.  The loaders read
-- Elasticsearch through esx.client (data from examples/bulk_load.lua).
--
--   lua5.4 examples/cache_service.lua [--es http://127.0.0.1:9200] [--port 8081] [--requests N]
--
--   GET  /articles?user=U&page=P   the page's articles, each with "read": true|false for U
--   POST /read?article=A&user=U    records the read in Elasticsearch, then cache:mark_read
--   GET  /stats                    cache:stats() as JSON
-- With --requests N it exits after N requests and prints the cache's hit ratios and memory.

local here = (arg and arg[0] or ""):match("^(.*)/[^/]*$") or "."
package.path = here .. "/?.lua;" .. here .. "/../lua/?.lua;" .. here .. "/../lua/?/init.lua;" .. package.path
package.cpath = here .. "/../build/" .. (jit and "luajit" or "lua5.4") .. "/?.so;" .. package.cpath

local socket = require "socket"
local cjson = require "cjson.safe"
local esx = require "esx"
local articles = require "articles"

local o = require("args").parse(arg, { es = "http://127.0.0.1:9200", port = 8081, requests = 0 },
  "usage: cache_service.lua [--es URL] [--port P] [--requests N]")

local client = assert(esx.client{ hosts = { o.es }, request_timeout = 10000 })
local function call(method, path, body)
  local res, err = client:request(method, path, body)
  if not res then return nil, err end
  return cjson.decode(res.body)
end
local cache = esx.cache{ load_page = articles.page_loader(call),
  load_readers = articles.readers_loader(call), page_ttl = 5000, max_bytes = 32 * 1024 * 1024 }

local function answer(status, body)
  return status, body and cjson.encode(body) or ""
end

-- An id esx.cache takes (an integer in [0, 2^53)), or nil: anything else (1.5, -1, 1e300)
-- is the client's mistake, answered 400, where the cache would raise (a 500).
local function id(v)
  v = tonumber(v)
  if v and v >= 0 and v < 2 ^ 53 and v == math.floor(v) then return v end
end

local function handle(method, path, q)
  local user, page, article = id(q.user), id(q.page), id(q.article)
  if method == "GET" and path == "/articles" then
    if not user or not page or page < 1 then return answer(400, { error = "user and page expected" }) end
    -- (a page past MAX_PAGE is the client's mistake: Elasticsearch refuses the search)
    if page > articles.MAX_PAGE then
      return answer(400, { error = "page must be 1-" .. articles.MAX_PAGE })
    end
    local json, err = cache:read_articles_json(user, page)
    if not json then return answer(502, { error = tostring(err) }) end
    return 200, json
  elseif method == "POST" and path == "/read" then
    if not user or not article then return answer(400, { error = "article and user expected" }) end
    local id, doc = articles.read_doc(article, user)
    -- refresh=wait_for: when the article's reader set is not cached, mark_read has nothing to
    -- update and the next load searches "reads", where the read must be visible by then
    local ok, err = client:request("PUT", "/reads/_doc/" .. id .. "?refresh=wait_for", doc)
    if not ok then return answer(502, { error = tostring(err) }) end
    cache:mark_read(article, user)
    return 204, ""
  elseif method == "GET" and path == "/stats" then
    return answer(200, cache:stats())
  end
  return answer(404, { error = "not found" })
end

local REASON = { [200] = "OK", [204] = "No Content", [400] = "Bad Request", [404] = "Not Found", [502] = "Bad Gateway" }

local function serve(conn)
  conn:settimeout(5)
  local line = conn:receive("*l")
  if not line then return false end -- connected and left without a request
  local method, target = line:match("^(%u+) (%S+) HTTP/1%.%d$")
  repeat local h = conn:receive("*l") until not h or h == ""
  local path, query = (target or ""):match("^([^?]*)%??(.*)$")
  local q = {}
  for k, v in (query or ""):gmatch("([^&=]+)=([^&]*)") do q[k] = v end
  local ok, status, body = pcall(handle, method, path, q)
  if not ok then status, body = answer(500, { error = tostring(status) }) end
  conn:send(("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s")
    :format(status, REASON[status] or "Error", #body, body))
  return true
end

local server = assert(socket.bind("127.0.0.1", o.port))
print(("listening on http://127.0.0.1:%d (Elasticsearch %s)"):format(o.port, o.es))
io.stdout:flush()
local served = 0
while o.requests == 0 or served < o.requests do
  local conn = server:accept()
  if conn then
    if serve(conn) then served = served + 1 end
    conn:close()
  end
end
server:close()

local s = cache:stats()
local function ratio(t) local n = t.hits + t.misses return n > 0 and 100 * t.hits / n or 0 end
print(("served %d requests; pages hit %.0f%% (%d loads), reader sets hit %.0f%% (%d loads), %d sets in %d bytes"):format(
  served, ratio(s.pages), s.pages.loads, ratio(s.readers), s.readers.loads, s.readers.entries, s.readers.bytes))
cache:close()
client:close()
