-- bench/client/wrk_search.lua -- wrk script: the same POST /goods/_search the clients send.
-- wrk neither encodes the query nor parses the response: it is the ceiling of what one
-- process can get from the canned endpoint.
wrk.method = "POST"
wrk.path = "/goods/_search"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"query":{"bool":{"must":[{"multi_match":{"query":"オーバーサイズ パーカー","fields":["name^2","brand.name"]}}],"filter":[{"term":{"gender":"men"}},{"range":{"price":{"lte":20000}}}]}},"_source":["goods_id","name","brand.name","price","sale_price","image"],"size":10}'

done = function(summary, latency, requests)
  local errors = summary.errors
  local e = errors.connect + errors.read + errors.write + errors.status + errors.timeout
  io.write(string.format("searches=%d seconds=%.3f rate=%.1f errors=%d\n", summary.requests,
    summary.duration / 1e6, summary.requests / (summary.duration / 1e6), e))
end
