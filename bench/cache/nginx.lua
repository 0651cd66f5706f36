--- bench/cache/nginx.lua -- esx.cache behind nginx, measured with wrk: an /articles endpoint
-- serving JSON pages with read flags (read_articles + cjson) against the same endpoint
-- returning a fixed, pre-encoded JSON page.  Runs under lua5.4 with luasocket (it starts nginx
-- through spec/support/nginx.lua); prints markdown table rows.
--
--   lua5.4 bench/cache/nginx.lua [seconds]
package.path = "./lua/?.lua;./lua/?/init.lua;./?.lua;" .. package.path
local nginx = require "spec.support.nginx"

local seconds = tonumber(arg and arg[1]) or 5

local HTTP = [[
  init_by_lua_block {
    local PAGE_SIZE, ID_SPACE, READERS = 20, 1000000, 100000
    local function page(p)
      local out = {}
      for i = 1, PAGE_SIZE do
        local a = (p - 1) * PAGE_SIZE + i
        out[i] = { id = a, title = "Article number " .. a, author = "member" .. (a % 97),
                   created_at = 1700000000000 + a }
      end
      return out
    end
    CACHE = require("esx").cache{
      shared = true, page_ttl = 5000, readers_ttl = 600000,
      load_page = page,
      load_readers = function(a)
        -- 100,000 readers among 1,000,000 ids, deterministic per article
        local ids, step, x = {}, ID_SPACE / READERS, a
        for i = 1, READERS do
          x = (x * 1103515245 + 12345) % 2147483648
          ids[i] = math.floor((i - 1) * step + x % step)
        end
        return ids
      end,
    }
    local fixed = page(1)
    for i, a in ipairs(fixed) do a.read = i % 3 == 0 end
    FIXED = require("cjson").encode(fixed)
  }
]]

local SERVER = [[
  location = /articles {
    content_by_lua_block {
      local list, err = CACHE:read_articles(tonumber(ngx.var.arg_u), tonumber(ngx.var.arg_p))
      if not list then ngx.status = 500 ngx.say(tostring(err)) return end
      ngx.header.content_type = "application/json"
      ngx.print(require("cjson").encode(list))
    }
  }
  location = /articles_json {
    content_by_lua_block {
      local json, err = CACHE:read_articles_json(tonumber(ngx.var.arg_u), tonumber(ngx.var.arg_p))
      if not json then ngx.status = 500 ngx.say(tostring(err)) return end
      ngx.header.content_type = "application/json"
      ngx.print(json)
    }
  }
  location = /fixed {
    content_by_lua_block {
      ngx.header.content_type = "application/json"
      ngx.print(FIXED)
    }
  }
]]

local WRK_SCRIPT = [[
local path = os.getenv("BENCH_PATH")
request = function()
  return wrk.format("GET", path .. "?u=" .. math.random(0, 999999) .. "&p=" .. math.random(1, 5))
end
]]

local function sh(cmd)
  local f = assert(io.popen(cmd))
  local out = f:read("*a")
  f:close()
  return out
end

local script = os.tmpname()
local f = assert(io.open(script, "w"))
f:write(WRK_SCRIPT)
f:close()

-- wrk talks to a reuseport listener, so that its connections are spread over both workers
local socket = require "socket"
local probe = assert(socket.bind("127.0.0.1", 0))
local _, port2 = probe:getsockname()
probe:close()
local srv = nginx.start{ workers = 2, http = HTTP,
                         server = "listen 127.0.0.1:" .. port2 .. " reuseport;\n" .. SERVER }
local url = "http://127.0.0.1:" .. port2
local ok, err = pcall(function()
  -- warm every worker's tiers (pages 1..5, 100 reader sets)
  for _ = 1, 40 do
    for p = 1, 5 do
      local status, body = srv:get("/articles?u=1&p=" .. p)
      assert(status == 200, body)
    end
  end
  local function run(path)
    local out = sh(string.format("BENCH_PATH=%s wrk -t2 -c32 -d%ds -s %s %s 2>&1", path,
      seconds, script, url))
    local rps = tonumber(out:match("Requests/sec:%s*([%d%.]+)"))
    local non2xx = out:match("Non%-2xx or 3xx responses:%s*(%d+)")
    assert(rps, out)
    assert(not non2xx, "errors: " .. out)
    return rps, out:match("Latency%s+(%S+)")
  end
  for p = 1, 5 do assert(srv:get("/articles_json?u=1&p=" .. p) == 200) end
  local fixed, fixed_lat = run("/fixed")
  local json, json_lat = run("/articles_json")
  local articles, articles_lat = run("/articles")
  print(string.format("| nginx (2 workers, shared = true) | wrk /articles with read_articles_json (reference column: the same location printing a fixed JSON page) | %.0f req/s (avg latency %s) | %.0f req/s (avg latency %s) | %.2fx |",
    json, json_lat, fixed, fixed_lat, json / fixed))
  print(string.format("| nginx (2 workers, shared = true) | wrk /articles with read_articles + cjson.encode (reference column: fixed JSON page) | %.0f req/s (avg latency %s) | %.0f req/s (avg latency %s) | %.2fx |",
    articles, articles_lat, fixed, fixed_lat, articles / fixed))
end)
srv:stop()
os.remove(script)
if not ok then error(err) end
