--- examples/articles.lua -- the article data model shared by the examples: an article list and
-- per-article reader sets, both stored in Elasticsearch, and the two esx.cache loaders that
-- read them back.
--
--   index "articles": {id = <int>, title = "...", published_at = <ms>}   one doc per article
--   index "readers":  {article_id = <int>, user_ids = {...}}, _id "<article>"  the bulk-loaded
--                     reader set of each article (one GET loads it)
--   index "reads":    {article_id = <int>, user_id = <int>}, _id "<article>-<user>"  reads
--                     recorded since (mark-read handlers write here)
--
-- `call(method, path, body) -> decoded response | nil, err` is passed in so that the same
-- loaders run in plain Lua (client:request) and in nginx (client:send + esx.nginx.wait).

local _M = {}

_M.PAGE_SIZE = 20
_M.MAX_READS = 10000 -- reads since the bulk load, per article, that one search returns

local WORDS = { "lua", "nginx", "elasticsearch", "cache", "bitmap", "beacon", "spike", "pool",
  "rollup", "timeout", "gzip", "bulk", "shard", "worker", "queue", "latency" }

--- The deterministic title of article `id` (so that searches have something to match).
function _M.title(id)
  local a, b = WORDS[id % #WORDS + 1], WORDS[(id * 7 + 3) % #WORDS + 1]
  return ("Article %d: %s and %s"):format(id, a, b)
end

--- load_page for esx.cache: page_no -> list of {id, title}, newest first.
function _M.page_loader(call)
  return function(page_no)
    local res, err = call("POST", "/articles/_search", {
      from = (page_no - 1) * _M.PAGE_SIZE, size = _M.PAGE_SIZE,
      sort = { { id = "desc" } }, _source = { "id", "title" },
    })
    if not res then error(tostring(err)) end
    local list = {}
    for i, hit in ipairs(res.hits.hits) do
      list[i] = { id = hit._source.id, title = hit._source.title }
    end
    return list
  end
end

--- load_readers for esx.cache: article_id -> list of user ids who read it.
function _M.readers_loader(call)
  return function(article_id)
    local doc, err = call("GET", "/readers/_doc/" .. article_id)
    if not doc and err.kind ~= "not_found" then error(tostring(err)) end
    local ids = {}
    for i, id in ipairs(doc and doc._source.user_ids or {}) do ids[i] = id end
    local res, serr = call("POST", "/reads/_search", {
      size = _M.MAX_READS, query = { term = { article_id = article_id } }, _source = { "user_id" },
    })
    if not res then error(tostring(serr)) end
    for _, hit in ipairs(res.hits.hits) do ids[#ids + 1] = hit._source.user_id end
    return ids
  end
end

--- The document that records "user read article" (written by mark-read handlers).
function _M.read_doc(article_id, user_id)
  return ("%d-%d"):format(article_id, user_id), { article_id = article_id, user_id = user_id }
end

return _M
