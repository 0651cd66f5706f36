-- esx.cache inside nginx with 2 workers and shared = true: a change made in one worker is
-- seen by the other before its next answer, and concurrent misses across workers load once.
local nginx = require "spec.support.nginx"
local socket = require "socket"

local HTTP = [[
  lua_shared_dict db 1m;
  init_by_lua_block {
    local db = ngx.shared.db
    db:set("page:1", "1,2,3")
    db:set("r:1", "7,8")
    db:set("r:2", "8")
    db:set("r:3", "")
    for a = 50, 60 do db:set("r:" .. a, "5") end
    local function ids(s)
      local out = {}
      for id in (s or ""):gmatch("%d+") do out[#out + 1] = tonumber(id) end
      return out
    end
    CACHE = require("esx").cache{
      shared = true, readers_ttl = 3600000, page_ttl = 3600000,
      load_page = function(p)
        db:incr("loads:page", 1, 0)
        local out = {}
        for _, id in ipairs(ids(db:get("page:" .. p))) do out[#out + 1] = { id = id, title = "t" .. id } end
        return out
      end,
      load_readers = function(a)
        db:incr("loads:" .. a, 1, 0)
        if a >= 50 then ngx.sleep(0.5) end -- slow: concurrent misses must wait for it
        return ids(db:get("r:" .. a))
      end,
    }
  }
]]

local SERVER = [[
  location = /has {
    content_by_lua_block {
      local a, u = tonumber(ngx.var.arg_a), tonumber(ngx.var.arg_u)
      local v, err = CACHE:has_read(a, u)
      ngx.say(ngx.worker.pid(), " ", tostring(v), " ", ngx.shared.db:get("loads:" .. a) or 0)
    }
  }
  location = /read {
    content_by_lua_block {
      local list = assert(CACHE:read_articles(tonumber(ngx.var.arg_u), 1))
      local out = {}
      for _, a in ipairs(list) do out[#out + 1] = a.id .. "=" .. tostring(a.read) end
      ngx.say(ngx.worker.pid(), " ", table.concat(out, ","))
    }
  }
  location = /json {
    content_by_lua_block {
      local json = assert(CACHE:read_articles_json(tonumber(ngx.var.arg_u), 1))
      local out = {}
      for _, a in ipairs(require("cjson").decode(json)) do out[#out + 1] = a.id .. "=" .. tostring(a.read) end
      ngx.say(ngx.worker.pid(), " ", table.concat(out, ","))
    }
  }
  location = /threads {
    content_by_lua_block {
      local threads = {}
      for i = 1, 6 do
        threads[i] = ngx.thread.spawn(function() return CACHE:has_read(60, i % 2 == 0 and 5 or 6) end)
      end
      local out = {}
      for i = 1, 6 do
        local ok, v = ngx.thread.wait(threads[i])
        out[i] = tostring(v)
      end
      ngx.say(ngx.worker.pid(), " ", table.concat(out, ","), " ", ngx.shared.db:get("loads:60"))
    }
  }
  location = /mark {
    content_by_lua_block {
      local a, u = tonumber(ngx.var.arg_a), tonumber(ngx.var.arg_u)
      if ngx.var.arg_db then
        local db = ngx.shared.db
        db:set("r:" .. a, (db:get("r:" .. a) or "") .. "," .. u)
      end
      CACHE:mark_read(a, u)
      ngx.say(ngx.worker.pid(), " ok")
    }
  }
  location = /mark_many {
    content_by_lua_block {
      local tx = CACHE:transaction()
      for u = 1, tonumber(ngx.var.arg_n) do tx:mark_read(3, 100000 + u) end
      tx:commit()
      ngx.say(ngx.worker.pid(), " ok")
    }
  }
  location = /add_article {
    content_by_lua_block {
      local db = ngx.shared.db
      db:set("page:1", ngx.var.arg_a .. "," .. db:get("page:1"))
      db:set("r:" .. ngx.var.arg_a, "")
      CACHE:invalidate_pages()
      ngx.say(ngx.worker.pid(), " ok")
    }
  }
  location = /loads {
    content_by_lua_block { ngx.say(ngx.worker.pid(), " ", ngx.shared.db:get("loads:" .. ngx.var.arg_k) or 0) }
  }
  location = /create_in_worker {
    content_by_lua_block {
      local ok, err = pcall(require("esx").cache, { shared = tonumber(ngx.var.arg_shared) == 1,
        load_page = function() return {} end, load_readers = function() return {} end })
      if ok then err:close() end
      ngx.say(ngx.worker.pid(), " ", ok and "ok" or tostring(err))
    }
  }
  location = /stats {
    content_by_lua_block {
      local s = CACHE:stats()
      ngx.say(ngx.worker.pid(), " ", s.resets, " ", s.readers.entries, " ", tostring(s.shared))
    }
  }
]]

-- Sends GET path on n connections at once, then reads every answer -> the bodies.
local function parallel_get(srv, path, n)
  local conns = {}
  for i = 1, n do conns[i] = srv:start_get(path) end
  local bodies = {}
  for i, c in ipairs(conns) do bodies[i] = select(2, nginx.answer(c)) end
  return bodies
end

-- GETs path until both workers answered (at most 400 requests); returns the bodies by pid.
local function from_both(srv, path, min_each)
  local by_pid, count = {}, 0
  for _ = 1, 400 do
    local status, body = srv:get(path)
    assert.equal(200, status, body)
    local pid = body:match("^(%d+) ")
    by_pid[pid] = by_pid[pid] or {}
    table.insert(by_pid[pid], body:match("^%d+ (.-)\n$"))
    count = 0
    local enough = 0
    for _, list in pairs(by_pid) do
      count = count + 1
      if #list >= (min_each or 1) then enough = enough + 1 end
    end
    if enough >= 2 then break end
  end
  assert.equal(2, count, "both workers should have answered")
  return by_pid
end

describe("esx.cache with shared = true in nginx (2 workers)", function()
  local srv
  setup(function()
    -- a second listener with reuseport: the kernel spreads its connections over both workers
    -- (the first one, without reuseport, may hand long runs of connections to one worker)
    local probe = assert(socket.bind("127.0.0.1", 0))
    local _, port2 = probe:getsockname()
    probe:close()
    local main = nginx.start{ workers = 2, http = HTTP,
                              server = "listen 127.0.0.1:" .. port2 .. " reuseport;\n" .. SERVER }
    srv = setmetatable({ port = tonumber(port2), main = main }, { __index = main })
  end)
  teardown(function() if srv then srv.main:stop() end end)

  it("shows a mark_read made in one worker in every worker, without a reload", function()
    for _, answers in pairs(from_both(srv, "/has?a=1&u=10", 3)) do
      for _, a in ipairs(answers) do assert.equal("false", a:match("^(%S+)")) end
    end
    local _, body = srv:get("/has?a=1&u=10")
    local loads = tonumber(body:match("(%d+)\n$"))
    assert.equal(1, loads) -- the second worker took the first one's result
    -- only the cache learns of it (not the database): only the change log can carry it
    assert.equal(200, (srv:get("/mark?a=1&u=10")))
    for _, answers in pairs(from_both(srv, "/has?a=1&u=10", 5)) do
      for _, a in ipairs(answers) do assert.equal("true " .. loads, a) end
    end
  end)

  it("shows invalidate_pages in every worker", function()
    for _, answers in pairs(from_both(srv, "/read?u=7", 2)) do
      for _, a in ipairs(answers) do assert.equal("1=true,2=false,3=false", a) end
    end
    local function page_loads()
      local _, body = srv:get("/loads?k=page")
      return tonumber(body:match(" (%d+)"))
    end
    local before = page_loads()
    assert.equal(200, (srv:get("/add_article?a=9")))
    for _, answers in pairs(from_both(srv, "/read?u=7", 5)) do
      for _, a in ipairs(answers) do assert.equal("9=false,1=true,2=false,3=false", a) end
    end
    for _, answers in pairs(from_both(srv, "/json?u=7", 3)) do
      for _, a in ipairs(answers) do assert.equal("9=false,1=true,2=false,3=false", a) end
    end
    -- the second worker took the first one's result from shared memory: one load in all
    assert.equal(before + 1, page_loads())
  end)

  it("calls the loader once for concurrent misses in both workers", function()
    local pids = {}
    local bodies
    for a = 50, 59 do -- a fresh article each time, until the requests reached both workers
      pids = {}
      bodies = parallel_get(srv, "/has?a=" .. a .. "&u=5", 16)
      for _, b in ipairs(bodies) do pids[b:match("^(%d+)")] = true end
      local n = 0
      for _ in pairs(pids) do n = n + 1 end
      if n == 2 then break end
    end
    local n = 0
    for _ in pairs(pids) do n = n + 1 end
    assert.equal(2, n, "both workers should have answered")
    for _, b in ipairs(bodies) do assert.truthy(b:match("^%d+ true 1\n$"), b) end
  end)

  it("calls the loader once for light threads of one request", function()
    local status, body = srv:get("/threads")
    assert.equal(200, status)
    assert.equal("false,true,false,true,false,true 1", body:match("^%d+ (.-)\n$"))
  end)

  it("raises when a shared cache is created in a worker rather than in init_by_lua", function()
    local _, body = srv:get("/create_in_worker?shared=1")
    assert.matches("esx.cache: bad option 'shared' (a shared cache must be created in " ..
      "init_by_lua*, before nginx forks its workers; created in the content phase it would " ..
      "be one worker's)", body, 1, true)
    _, body = srv:get("/create_in_worker?shared=0") -- a worker's own cache is fine there
    assert.matches("^%d+ ok\n$", body)
  end)

  it("drops a worker's tiers when it has fallen behind the change log", function()
    from_both(srv, "/has?a=2&u=8", 2) -- both workers hold article 2
    assert.equal(200, (srv:get("/mark_many?n=5000")))
    local resets = {}
    for pid, answers in pairs(from_both(srv, "/stats", 1)) do
      resets[pid] = tonumber(answers[1]:match("^(%d+)"))
    end
    local dropped = 0
    for _, r in pairs(resets) do if r > 0 then dropped = dropped + 1 end end
    assert.truthy(dropped >= 1, "the worker that did not commit must have reset")
    for _, answers in pairs(from_both(srv, "/has?a=2&u=8", 2)) do
      for _, a in ipairs(answers) do assert.equal("true", a:match("^(%S+)")) end
    end
    assert.is_nil(srv:error_log():find("%[error%]"))
  end)
end)
