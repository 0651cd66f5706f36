-- Allocation failure: esx's parts driven under an allocation fault injector
-- (tools/failmalloc.c, preloaded into a child interpreter) for a sweep of n: the n-th
-- allocation of a call fails, for every n the call makes.  The scripts in tools/oom/ check
-- each answer against the contract and print "FAIL ..." per violation; a crash, an abort or
-- a hang (the child is killed after 120 s) fails the sweep.
local ds = require "spec.support.devserver"

local LUA = jit and "luajit" or "lua5.4"
local dir, srv

local function sh_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end

-- Runs tools/oom/<script>.lua with args under the injector; returns its output and whether
-- it exited 0.
local function sweep(script, ...)
  local args = {}
  for i, a in ipairs{ ... } do args[i] = sh_quote(a) end
  local cmd = "LUA_PATH='./lua/?.lua;./lua/?/init.lua;./?.lua;;' " ..
    "LUA_CPATH=" .. sh_quote(dir .. "/?.so;./build/" .. LUA .. "/?.so;;") ..
    " LD_PRELOAD=" .. sh_quote(dir .. "/failmalloc.so") ..
    " timeout 120 " .. LUA .. " tools/oom/" .. script .. ".lua " .. table.concat(args, " ") ..
    " 2>&1; echo \"exit $?\""
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  return out, out:match("exit (%d+)%s*$") == "0"
end

local function clean(out, ok)
  assert.is_true(ok, out)
  assert.is_nil(out:find("FAIL", 1, true), out)
  assert.truthy(out:find("%f[%w]done%s"), out)
end

describe("allocation failure", function()
  setup(function()
    dir = os.tmpname()
    os.remove(dir)
    assert(require("spec.support.shell").ok("mkdir -p " .. sh_quote(dir .. "/replay1") .. " " .. sh_quote(dir .. "/replay0")))
    local ok = os.execute("cc -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -shared -fPIC -O1 " ..
      "-I/usr/include/lua5.4 tools/failmalloc.c -o " .. sh_quote(dir .. "/failmalloc.so"))
    assert.truthy(ok == true or ok == 0, "cannot build tools/failmalloc.c")
    srv = ds.start()
  end)

  teardown(function()
    if srv then srv:stop() end
    if dir then os.execute("rm -rf " .. sh_quote(dir)) end
  end)

  describe("c:request", function()
    it("returns nil, err of kind internal when memory runs out reading response headers", function()
      clean(sweep("client", srv.url, "esx", 1))
    end)

    it("returns nil, err of kind internal when memory runs out encoding a body", function()
      clean(sweep("client", srv.url, "esx thread", 0))
    end)

    it("returns nil, err of kind internal, marking no node, when the I/O thread cannot watch a connection", function()
      -- (epoll_ctl failing with ENOMEM) a connection left
      -- unwatched would sit until connect_timeout (the node marked dead) or socket_timeout
      clean(sweep("concurrent", srv.url, "esx", 0, 1))
      clean(sweep("concurrent", srv.url, "esx", 0, 6))
      clean(sweep("concurrent", srv.url, "esx", 1, 6))
      srv:clear_faults()
    end)
  end)

  describe("bi:close", function()
    -- scope "thread": Lua 5.4's own allocations fail too (count 2: the n-th and the retry Lua
    -- makes after an emergency collection), so bi:add and bi:flush raise "not enough memory"
    it("accounts for every operation bi:add took when Lua ran out of memory in add or flush", function()
      clean(sweep("indexer", srv.url, "thread", 2))
    end)

    it("accounts for every operation of a batch once when Lua ran out of memory reading its answer", function()
      clean(sweep("indexer", srv.url, "thread", 2, "settle"))
    end)
  end)

  describe("esx.client, esx.collector, esx.cache", function()
    it("return an object or nil, err of kind internal when memory runs out", function()
      clean(sweep("new", srv.url, "esx", 1, dir .. "/new1"))
      clean(sweep("new", srv.url, "esx", 0, dir .. "/new0"))
    end)
  end)

  describe("col:handle in a forked child", function()
    -- (fork through LuaJIT's FFI)
    local luajit_it = jit and it or pending
    luajit_it("refuses, counted as nomem, until it has the rollup table memory denied it", function()
      clean(sweep("fork", srv.url))
    end)
  end)

  describe("col:flush", function()
    it("ships every accepted event exactly once, and returns true only once the rollup rows are written, when memory runs out while shipping", function()
      clean(sweep("ship", srv.url, "esx", 1))
    end)
  end)

  describe("esx.collector", function()
    it("replays a spool_dir's events exactly once when memory runs out replaying them", function()
      clean(sweep("replay", srv.url, "esx", 1, dir .. "/replay1"))
      clean(sweep("replay", srv.url, "esx", 0, dir .. "/replay0"))
    end)
  end)

  describe("cache:read_articles", function()
    -- esx's own allocations only: libroaring 0.2.66 does not check its own (see the report
    -- in tools/oom/cache.lua)
    it("answers right or returns nil, err when memory runs out in esx's cache core", function()
      clean(sweep("cache", "esx thread", 1))
      clean(sweep("cache", "esx thread", 0))
      clean(sweep("cache", "esx thread", 1, "shared"))
      clean(sweep("cache", "esx thread", 0, "shared"))
    end)
  end)

  describe("rollups", function()
    it("count an event in its row and its user_id in the row's uniques, or not at all and in rollup_dropped, when memory runs out making or growing a sketch", function()
      clean(sweep("rollups", srv.url, "esx thread", 1))
      clean(sweep("rollups", srv.url, "esx thread", 0))
    end)
  end)

  describe("esx.core", function()
    it("returns nil, err of kind nomem or internal, not decode, when memory runs out decoding a sketch", function()
      clean(sweep("core", "esx thread", 1))
      clean(sweep("core", "esx thread", 0))
    end)
  end)

  describe("col:handle", function()
    it("names the events it could not queue by their positions in the body", function()
      clean(sweep("collector", srv.url, "esx thread", 1))
    end)

    it("answers 503 when memory runs out before any event is queued, and a JSON body when it runs out encoding one", function()
      clean(sweep("collector", srv.url, "esx thread", 0))
    end)

    it("accepts and ships the events its spool holds when memory runs out queueing them", function()
      clean(sweep("collector", srv.url, "esx thread", 1, dir .. "/spool1"))
      clean(sweep("collector", srv.url, "esx thread", 0, dir .. "/spool0"))
    end)
  end)
end)
