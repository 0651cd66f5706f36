-- esxd.inspect: the request log behind GET /_esx/requests: per-path counts of every
-- non-control request, and the last 1000 requests with headers, sizes and status.
local json = require "esxd.json"

local _M = {}
local MAX = 1000
local ring, first, count = {}, 1, 0
local counts = {}

function _M.reset() ring, first, count, counts = {}, 1, 0, {} end

-- Record a request; returns the entry (callers fill in sizes and status later).
function _M.record(method, path, query, headers)
  local h = {}
  for k, v in pairs(headers) do
    h[k:lower()] = type(v) == "table" and table.concat(v, ", ") or v
  end
  local e = { method = method, path = path, query = query, headers = h, body_wire_bytes = 0, body_bytes = 0, status = 0 }
  counts[path] = (counts[path] or 0) + 1
  local slot = (first + count - 1) % MAX + 1
  if count < MAX then count = count + 1 else first = first % MAX + 1 end
  ring[slot] = e
  return e
end

function _M.report(filter)
  local out = json.array()
  for i = 0, count - 1 do
    local e = ring[(first + i - 1) % MAX + 1]
    if not filter or e.path == filter then
      out[#out + 1] = json.obj("method", e.method, "path", e.path, "query", e.query, "headers", e.headers,
        "body_wire_bytes", e.body_wire_bytes, "body_bytes", e.body_bytes, "status", e.status)
    end
  end
  local c = {}
  for p, n in pairs(counts) do if not filter or p == filter then c[p] = n end end
  return json.obj("counts", c, "requests", out)
end

return _M
