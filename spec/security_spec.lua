-- Security checks: credentials never shown, CR/LF and bad index names refused before anything
-- is sent, request-smuggling shapes against the collector in nginx, size arithmetic near
-- SIZE_MAX.  (TLS verification by default is in client_spec.lua's "TLS" block.)
local esx = require "esx"
local ds = require "spec.support.devserver"
local nginx = require "spec.support.nginx"
local socket = require "socket"
local shell_ok = require("spec.support.shell").ok

local SECRET = "pa55-Wd-s3cret"

describe("credentials", function()
  local srv
  setup(function() srv = ds.start{ user = "elastic", password = SECRET } end)
  teardown(function() srv:stop() end)

  it("never appear in errors, stats or metrics, whichever way they are given", function()
    local clients = {
      esx.client{ hosts = { srv.url }, username = "elastic", password = SECRET, max_retries = 0 },
      esx.client{ hosts = { (srv.url:gsub("//", "//elastic:" .. SECRET .. "@")) }, max_retries = 0 },
      esx.client{ hosts = { srv.url }, api_key = SECRET, max_retries = 0 },
      esx.client{ hosts = { "http://elastic:" .. SECRET .. "@127.0.0.1:1" }, max_retries = 0 },
    }
    local texts = {}
    for _, c in ipairs(clients) do
      local _, err = c:get("nope", "1")
      local _, err2 = c:request("GET", "/_cluster/health", nil, { timeout = 200 })
      for _, e in ipairs({ err, err2 }) do
        if e then
          texts[#texts + 1] = tostring(e)
          texts[#texts + 1] = tostring(e.node)
          texts[#texts + 1] = tostring(e.body)
        end
      end
      local s = c:stats()
      for _, n in ipairs(s.nodes) do texts[#texts + 1] = n.url end
    end
    texts[#texts + 1] = esx.metrics()
    for _, c in ipairs(clients) do c:close() end
    for _, t in ipairs(texts) do
      assert.falsy(t:find(SECRET, 1, true), "credential shown in: " .. t)
    end
  end)
end)

describe("credentials in nginx #nginx", function()
  it("never reach nginx's error log, through failed calls logged as users log them", function()
    local srv = ds.start{ user = "elastic", password = SECRET }
    local web
    finally(function()
      if web then web:stop() end
      srv:stop()
    end)
    web = nginx.start{
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.clients = {
            esx.client{ hosts = { "%s" }, username = "elastic", password = "wrong-%s" },
            esx.client{ hosts = { "http://elastic:%s@127.0.0.1:1" }, max_retries = 0 },
            esx.client{ hosts = { "%s" }, api_key = "%s" },
          }
        }
      ]]):format(srv.url, SECRET, SECRET, srv.url, SECRET),
      server = [[
        location = /t {
          content_by_lua_block {
            for _, c in ipairs(package.loaded.clients) do
              local _, err = c:info()
              ngx.log(ngx.ERR, "search failed: ", tostring(err), " node ", tostring(err and err.node))
            end
            ngx.say("done")
          }
        }
      ]],
    }
    local status = web:get("/t")
    local log = web:error_log()
    assert.equal(200, status)
    assert.truthy(log:find("search failed: http: GET /: HTTP 401", 1, true), log)
    assert.falsy(log:find(SECRET, 1, true), "credential in the error log")
  end)
end)

describe("spool and dead-letter files another user made", function()
  local function sh(cmd) assert(shell_ok(cmd), cmd) end

  it("are refused by root in a directory others may write to (/tmp), taken where that user's own", function()
    if io.popen("id -u"):read("*l") ~= "0" then return pending("needs root, to make another user's files") end
    local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
    local shared = os.tmpname()
    os.remove(shared)
    finally(function()
      c:close()
      os.execute("rm -rf " .. shared)
    end)
    -- a sticky directory anyone may write to, as /tmp (the default dead-letter file's)
    sh("mkdir -m 1777 " .. shared)
    -- another user's file there, readable by all: dead letters written to it are theirs to read
    local planted = shared .. "/esx-dead-letter.ndjson"
    sh("touch " .. planted .. " && chown nobody " .. planted .. " && chmod 0644 " .. planted)
    local col, err = esx.collector{ sink = c, dead_letter = planted }
    assert.is_nil(col)
    assert.equal("internal", err.kind)
    assert.truthy(err.message:find("not a regular file of this user only", 1, true), err.message)
    -- another user's directory there: they may swap or read what is put in it
    local spool = shared .. "/spool"
    sh("mkdir -m 0700 " .. spool .. " && chown nobody " .. spool)
    col, err = esx.collector{ sink = c, spool_dir = spool, dead_letter = "/dev/null" }
    assert.is_nil(col)
    assert.truthy(err.message:find("not a directory of this user only", 1, true), err.message)
    -- a directory root made for the workers' user, and that user's file in it: taken
    local private = shared .. "/root-only"
    sh("mkdir -m 0755 " .. private .. " && mkdir -m 0700 " .. private .. "/workers && chown nobody " ..
       private .. "/workers")
    sh("touch " .. private .. "/workers/dl.ndjson && chown nobody " .. private .. "/workers/dl.ndjson && chmod 0600 " ..
       private .. "/workers/dl.ndjson")
    assert(esx.collector{ sink = c, spool_dir = private .. "/workers",
                          dead_letter = private .. "/workers/dl.ndjson" }):close(0)
  end)

  it("refuse a spool_dir under a directory a third user may write to, whoever made the spool_dir", function()
    local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
    local base = os.tmpname()
    os.remove(base)
    finally(function()
      c:close()
      os.execute("rm -rf " .. base .. " ./build/.spool-test")
    end)
    sh("mkdir -m 0755 " .. base)
    -- its owner (or, not sticky, anyone) can rename "spool" away and put a link or a
    -- directory of theirs in its place: segments are opened, claimed and removed by path
    local cases = { { "0777", nil }, { "0777", "a/b" }, { "0775", nil } }
    if io.popen("id -u"):read("*l") == "0" then cases[#cases + 1] = { "0755", nil, "nobody" } end
    for i, case in ipairs(cases) do
      local open = base .. "/open" .. i
      sh("mkdir -m " .. case[1] .. " " .. open)
      if case[3] then sh("chown " .. case[3] .. " " .. open) end
      local spool = open .. "/" .. (case[2] and (case[2] .. "/") or "") .. "spool"
      local col, err = esx.collector{ sink = c, spool_dir = spool, dead_letter = "/dev/null" }
      assert.is_nil(col, "case " .. i)
      assert.truthy(err.message:find("not a directory of this user only", 1, true), err.message)
    end
    -- sticky, as /tmp: others cannot rename what is not theirs
    sh("mkdir -m 1777 " .. base .. "/sticky")
    assert(esx.collector{ sink = c, spool_dir = base .. "/sticky/spool", dead_letter = "/dev/null" }):close(0)
    -- a relative spool_dir is checked from the working directory up
    assert(esx.collector{ sink = c, spool_dir = "./build/.spool-test", dead_letter = "/dev/null" }):close(0)
  end)
end)

describe("a dead-letter path another user made a FIFO", function()
  it("returns nil, err at once instead of hanging the constructor", function()
    if io.popen("id -u"):read("*l") ~= "0" then return pending("needs root, to run as nobody") end
    local dir = os.tmpname()
    os.remove(dir)
    finally(function() os.execute("rm -rf " .. dir) end)
    assert(shell_ok("mkdir -m 1777 " .. dir))
    -- writable by anyone, readable by no one: opened for writing, it waits for a reader
    local fifo = dir .. "/esx-dead-letter.ndjson"
    assert(shell_ok("mkfifo -m 0222 " .. fifo))
    local run, script = require("spec.support.child").script(([[
      local esx = require "esx"
      local c = esx.client{ hosts = { "http://127.0.0.1:1" } }
      local col, err = esx.collector{ sink = c, dead_letter = "%s" }
      print(col == nil, err and err.kind, err and err.message)
    ]]):format(fifo), dir .. "/child.lua")
    assert(shell_ok("chmod 0755 " .. dir .. " && chmod 0644 " .. script))
    local p = io.popen("timeout 10 setpriv --reuid=nobody --regid=nogroup --clear-groups " .. run ..
                       " 2>&1; echo rc=$?")
    local out = p:read("*a")
    p:close()
    assert.truthy(out:find("^true\tinternal\t.-cannot open dead_letter file .-not a regular file of this user only"), out)
    assert.truthy(out:find("rc=0", 1, true), out)
  end)
end)

describe("refused before anything is sent", function()
  local srv, c
  setup(function()
    srv = ds.start{}
    c = esx.client{ hosts = { srv.url } }
  end)
  teardown(function()
    c:close()
    srv:stop()
  end)
  before_each(function() srv:reset() end)

  it("CR, LF and spaces in paths; CR/LF in header values and content types", function()
    local bad = {
      function() c:request("GET", "/x\r\nHost: evil") end,
      function() c:request("GET", "/x y") end,
      function() c:request("GET", "/x\0y") end,
      function() c:request("GET", "/", nil, { headers = { ["X-A"] = "v\r\nX-B: w" } }) end,
      function() c:request("GET", "/", nil, { headers = { ["X-A"] = "v\nw" } }) end,
      function() c:request("POST", "/", "{}", { content_type = "application/json\r\nX: y" }) end,
      function() esx.client{ headers = { ["X-A"] = "a\rb" } } end,
      function() esx.client{ headers = { ["Bad Name"] = "a" } } end,
      function() esx.client{ username = "u\r\n", password = "p" } end,
      function() esx.client{ api_key = "k\nX-Evil: 1" } end,
      -- credentials the client would not use: the first URL's would go to every node
      function() esx.client{ hosts = { "http://a:pw1@127.0.0.1:1", "http://b:pw2@127.0.0.2:1" } } end,
      function() esx.client{ hosts = { "http://a:pw1@127.0.0.1:1" }, username = "b", password = "pw2" } end,
      function() esx.client{ hosts = { "http://:pw1@127.0.0.1:1" } } end, -- the password would be dropped
    }
    for i, f in ipairs(bad) do assert.has_error(f, nil, "case " .. i) end
    assert.same({}, srv:requests().requests)
  end)

  it("index names that Elasticsearch would refuse", function()
    local invalid = { "Upper", "a b", "a/b", "a\\b", "a*b", "a?b", 'a"b', "a<b", "a>b", "a|b",
                      "a,b", "a#b", "-a", "_a", "+a", ".", "..", "", string.rep("a", 256), "a\r\nb" }
    for _, name in ipairs(invalid) do
      assert.has_error(function() c:index(name, { x = 1 }) end, nil, name)
      assert.has_error(function() c:get(name, "1") end, nil, name)
    end
    for _, name in ipairs({ "events-2026.11.30", "a_b", "a.b", "a+b", ".hidden", string.rep("a", 255) }) do
      assert(c:index(name, { x = 1 }, "1"), name)
    end
    assert.equal(6, #srv:requests().requests)
  end)

  it("ids and index names that are dot segments cannot reach another path (the whole index)", function()
    -- a path ending in "/.." is "/docs/" to libcurl and to a proxy that normalizes paths:
    -- DELETE /docs/_doc/.. would delete the index docs
    assert(c:index("docs", { x = 1 }, "1"))
    for _, id in ipairs({ "..", "." }) do
      local _, err = c:delete("docs", id)
      assert.equal("not_found", err and err.kind, id)
      local _, gerr = c:get("docs", id)
      assert.equal("not_found", gerr and gerr.kind, id)
    end
    assert(c:get("docs", "1"), "the index is gone")
    local paths = {}
    for _, r in ipairs(srv:requests().requests) do paths[#paths + 1] = r.method .. " " .. r.path end
    assert.same({ "PUT /docs/_doc/1", "DELETE /docs/_doc/%2E%2E", "GET /docs/_doc/%2E%2E",
                  "DELETE /docs/_doc/%2E", "GET /docs/_doc/%2E", "GET /docs/_doc/1" }, paths)
    -- "/../_search" is "/_search" there: every index
    for _, name in ipairs({ "..", ".", { "a", ".." } }) do
      assert.has_error(function() c:search(name, {}) end, nil, tostring(name))
      assert.has_error(function() c:count(name, {}) end, nil, tostring(name))
      assert.has_error(function() c:refresh(name) end, nil, tostring(name))
    end
    assert.equal(6, #srv:requests().requests)
  end)

  it("document ids cannot change the path", function()
    assert(c:index("docs", { x = 1 }, "../../_all?x=1#y"))
    local seen = srv:requests().requests[1]
    assert.equal("/docs/_doc/..%2F..%2F_all%3Fx%3D1%23y", seen.path)
  end)
end)

describe("request smuggling shapes against the collector in nginx #nginx", function()
  local es, web
  setup(function()
    es = ds.start{}
    web = nginx.start{
      http = ([[
        init_by_lua_block {
          local esx = require "esx"
          package.loaded.col = esx.collector{ sink = esx.client{ hosts = { "%s" } } }
        }
      ]]):format(es.url),
      server = [[
        location = /collect { content_by_lua_block { require("esx.nginx").collect(package.loaded.col) } }
      ]],
    }
  end)
  teardown(function()
    web:stop()
    es:stop()
  end)

  local function raw(text)
    local s = assert(socket.connect("127.0.0.1", web.port))
    s:settimeout(5)
    assert(s:send(text))
    local out = s:receive("*a")
    s:close()
    local statuses = {}
    for st in out:gmatch("HTTP/1%.%d (%d%d%d)") do statuses[#statuses + 1] = tonumber(st) end
    return statuses, out
  end

  it("refuses Content-Length together with Transfer-Encoding", function()
    local body = '{"site_id":"s","type":"view"}'
    local statuses = raw("POST /collect HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" ..
      "Content-Length: " .. #body .. "\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" ..
      string.format("%x\r\n%s\r\n0\r\n\r\n", #body, body))
    assert.same({ 400 }, statuses)
  end)

  it("treats a GET with a body as a pixel beacon and never reads the body as events", function()
    local body = '{"site_id":"s","type":"smuggled"}'
    local statuses = raw("GET /collect?site_id=s&type=view HTTP/1.1\r\nHost: x\r\nContent-Length: " ..
      #body .. "\r\nConnection: close\r\n\r\n" .. body)
    assert.same({ 200 }, statuses)
  end)

  it("answers HEAD with 405 and no body confusion on a kept-alive connection", function()
    local statuses = raw("HEAD /collect HTTP/1.1\r\nHost: x\r\n\r\n" ..
      "GET /collect?site_id=s&type=view HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert.same({ 405, 200 }, statuses)
  end)
end)

describe("size arithmetic near SIZE_MAX", function()
  it("refuses every size that would wrap, and caps a gzip bomb (tools/unit)", function()
    require("spec.support.unit").run("sizes", "src/buf.c src/gzip.c -lz", 11)
  end)
end)
