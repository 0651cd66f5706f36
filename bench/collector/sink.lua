-- bench/collector/sink.lua -- the bulk sink of the throughput part (content handler of
-- sink.conf.template): a stand-in for an Elasticsearch cluster running on other machines.
--
-- It does what the collectors' shipping needs to be exercised honestly -- reads the whole
-- request, inflates a gzip body, reads every action line of the NDJSON and answers a correct
-- per-item _bulk response (one item per action, in order, with the action's _index and _id,
-- "result":"created", status 201; a malformed action or a missing document line gets a 400
-- item, as Elasticsearch answers) -- and counts the items it acknowledged, so the benchmark
-- can check acknowledged = accepted.  It does not store or index the documents: the dev
-- server's indexing in Lua (74-87 us of CPU per beacon request) on the same 2 cores as the
-- collectors measured the harness, not the collector.  The spike test keeps the dev server.
--
-- /_bulk                     the bulk API (POST, body in memory or in a temp file); honours
--                            filter_path as Elasticsearch does for the paths a bulk client
--                            asks for ("took", "errors", "items", "items.*.<field>")
-- GET /_sink/stats           {"bulks":n,"items":n,"events":n,"other":n,"failed":n}
--                            (events: create items into events-*; other: any other item)
-- DELETE /_sink/stats        zero the counters
-- POST /_sink/stall?ms=N     hold every /_bulk that arrives in the next N ms until the N ms
--                            are over (the intake-only rows); DELETE /_sink/stall ends it
local cjson = require "cjson.safe"
local gzip = require "esxd.gzip"

local ngx = ngx
local find, sub, rep, concat = string.find, string.sub, string.rep, table.concat
local dict = ngx.shared.sink

local _M = {}

local function body_of()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if body then return body end
  local path = ngx.req.get_body_file()
  if not path then return "" end
  local f = assert(io.open(path, "rb"))
  body = f:read("*a")
  f:close()
  return body
end

local function json_str(s) return cjson.encode(s) end

-- ?filter_path=: which top-level members to keep, and which members of each item's action
-- object (nil: all of them).  Returns keep_top, keep_item_fields.
local function filters(fp)
  if not fp or fp == "" then return nil, nil end
  local top, fields, whole = {}, {}, false
  for path in fp:gmatch("[^,]+") do
    local a, b, c = path:match("^([^.]+)%.?([^.]*)%.?([^.]*)$")
    if a then
      top[a] = true
      if a == "items" then
        if b == "" or (b == "*" and c == "") then whole = true else fields[c] = true end
      end
    end
  end
  return top, not whole and fields or nil
end

function _M.bulk()
  local stall = dict:get("stall_until")
  if stall then
    local left = stall - ngx.now()
    if left > 0 then ngx.sleep(left) end
  end
  local body = body_of()
  local coding = ngx.var.http_content_encoding
  if coding and coding:lower() == "gzip" then
    local plain, kind, msg = gzip.inflate(body, 512 * 1024 * 1024)
    if not plain then
      ngx.status = 400
      ngx.header["Content-Type"] = "application/json"
      ngx.print(cjson.encode{ error = { type = "parse_exception", reason = kind .. ": " .. msg }, status = 400 })
      return
    end
    body = plain
  end
  local keep, fields = filters(ngx.var.arg_filter_path)
  local full = not fields -- items with every member, or only the listed ones
  local keep_status = full or fields.status
  local items, n, events, other, failed = {}, 0, 0, 0, 0
  local pos, len = 1, #body
  -- the collectors' event actions with only status/error asked back: matched without captures,
  -- and answered with one shared item string (string.rep below when every item is one)
  local fast = not full
  local fast_item = keep_status and '{"create":{"status":201}}' or '{"create":{}}'
  local n_fast = 0
  while pos <= len do
    local _, e = nil, nil
    if fast then _, e = find(body, '^{"create":{"_index":"events%-[^"\\]*","_id":"[^"\\]*"}}\n', pos) end
    local doc_end = e and find(body, "\n", e + 1, true)
    if doc_end and doc_end > e + 1 then
      n = n + 1
      n_fast = n_fast + 1
      items[n] = fast_item
      events = events + 1
      pos = doc_end + 1
      goto continue
    end
    local nl = find(body, "\n", pos, true) or (len + 1)
    if nl > pos then
      -- the action line: the shape both collectors write is matched directly (no escapes in
      -- its strings, so they can be echoed as they are); anything else is decoded by cjson
      local op, index, id, quoted
      local _, e, o, i, d = find(body, '^{"(%l+)":{"_index":"([^"\\]*)","_id":"([^"\\]*)"}}', pos)
      if e == nl - 1 then
        op, index, id = o, i, d
      else
        local action = cjson.decode(sub(body, pos, nl - 1))
        local meta
        if type(action) == "table" then op, meta = next(action) end
        if type(meta) == "table" and type(meta._index) == "string" and type(meta._id) == "string" then
          index, id, quoted = json_str(meta._index), json_str(meta._id), true
        end
      end
      local doc_end = find(body, "\n", nl + 1, true) or (len + 1)
      n = n + 1
      if (op == "create" or op == "index") and index and doc_end > nl + 1 then
        if not full then
          items[n] = keep_status and '{"' .. op .. '":{"status":201}}' or '{"' .. op .. '":{}}'
        elseif quoted then
          items[n] = '{"' .. op .. '":{"_index":' .. index .. ',"_id":' .. id
            .. ',"_version":1,"result":"created","status":201}}'
        else
          items[n] = '{"' .. op .. '":{"_index":"' .. index .. '","_id":"' .. id
            .. '","_version":1,"result":"created","status":201}}'
        end
        if op == "create" and find(index, '^"?events%-') then events = events + 1 else other = other + 1 end
        pos = doc_end + 1
      else
        failed = failed + 1
        local parts = {}
        if keep_status then parts[#parts + 1] = '"status":400' end
        if full or fields.error then
          parts[#parts + 1] = '"error":{"type":"illegal_argument_exception","reason":"malformed action/metadata line or missing source"}'
        end
        items[n] = '{"' .. (type(op) == "string" and op or "index") .. '":{' .. concat(parts, ",") .. "}}"
        pos = nl + 1
      end
    else
      pos = nl + 1
    end
    ::continue::
  end
  dict:incr("bulks", 1, 0)
  dict:incr("items", n - failed, 0)
  dict:incr("events", events, 0)
  dict:incr("other", other, 0)
  dict:incr("failed", failed, 0)
  ngx.header["Content-Type"] = "application/json"
  ngx.header["X-Elastic-Product"] = "Elasticsearch"
  local out = {}
  if not keep or keep.took then out[#out + 1] = '"took":1' end
  if not keep or keep.errors then out[#out + 1] = '"errors":' .. (failed > 0 and "true" or "false") end
  if not keep or keep.items then
    out[#out + 1] = '"items":[' .. (n_fast == n and rep(fast_item, n, ",") or concat(items, ",")) .. "]"
  end
  ngx.print("{", concat(out, ","), "}")
end

function _M.stats()
  local m = ngx.req.get_method()
  if m == "DELETE" then
    for _, k in ipairs{ "bulks", "items", "events", "other", "failed" } do dict:set(k, 0) end
  end
  ngx.header["Content-Type"] = "application/json"
  ngx.print(cjson.encode{ bulks = dict:get("bulks") or 0, items = dict:get("items") or 0,
    events = dict:get("events") or 0, other = dict:get("other") or 0, failed = dict:get("failed") or 0 })
end

function _M.stall()
  if ngx.req.get_method() == "DELETE" then
    dict:delete("stall_until")
  else
    dict:set("stall_until", ngx.now() + (tonumber(ngx.var.arg_ms) or 0) / 1000)
  end
  ngx.header["Content-Type"] = "application/json"
  ngx.print('{"ok":true}')
end

return _M
