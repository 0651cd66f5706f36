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
-- the last page a search can reach: from + size is at most index.max_result_window (10000 by
-- default); past it Elasticsearch refuses the search (400)
_M.MAX_PAGE = math.floor(10000 / _M.PAGE_SIZE)
_M.READS_PAGE = 10000 -- reads one search returns (index.max_result_window's default)
_M.MAX_READS = 1000000 -- reads since the bulk load one article may have: past it,
                       -- load_readers raises (bulk-load the reader sets again) rather than
                       -- building an ever larger list in memory

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

--- load_readers for esx.cache: article_id -> list of user ids who read it: the bulk-loaded
-- set plus every read recorded since, paged READS_PAGE at a time with search_after on
-- user_id (unique within an article, so no read is skipped or repeated between pages), and
-- an error past MAX_READS recorded reads.
function _M.readers_loader(call)
  return function(article_id)
    local doc, err = call("GET", "/readers/_doc/" .. article_id)
    if not doc and err.kind ~= "not_found" then error(tostring(err)) end
    local ids = {}
    for i, id in ipairs(doc and doc._source.user_ids or {}) do ids[i] = id end
    local reads, after = 0, nil
    repeat
      local res, serr = call("POST", "/reads/_search", {
        size = _M.READS_PAGE, query = { term = { article_id = article_id } }, _source = { "user_id" },
        sort = { { user_id = "asc" } }, search_after = after, track_total_hits = false,
      })
      if not res then error(tostring(serr)) end
      local hits = res.hits.hits
      reads = reads + #hits
      if reads > _M.MAX_READS then
        error(("article %d has more than %d reads since the bulk load (MAX_READS): load its reader set again")
          :format(article_id, _M.MAX_READS))
      end
      for _, hit in ipairs(hits) do ids[#ids + 1] = hit._source.user_id end
      after = hits[#hits] and hits[#hits].sort
    until #hits < _M.READS_PAGE
    return ids
  end
end

--- The document that records "user read article" (written by mark-read handlers).
function _M.read_doc(article_id, user_id)
  return ("%d-%d"):format(article_id, user_id), { article_id = article_id, user_id = user_id }
end

return _M
