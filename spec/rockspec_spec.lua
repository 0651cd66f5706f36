-- The rockspec: `luarocks make` builds and installs esx into a local tree, offline.
describe("luarocks make esx-scm-1.rockspec", function()
  it("installs a module that loads from the tree", function()
    if jit then return end -- luarocks here targets Lua 5.4; the LuaJIT build is `make`'s
    local tree = os.tmpname()
    os.remove(tree)
    finally(function() os.execute("rm -rf " .. tree) end) -- (a failed make leaves half a tree)
    -- (MAKEFLAGS: the rockspec's make builds the C files two at a time, one per core)
    local ok = os.execute("MAKEFLAGS=-j2 luarocks --lua-version=5.4 --tree=" .. tree ..
      " make --deps-mode=none esx-scm-1.rockspec >/dev/null 2>&1")
    assert.truthy(ok == true or ok == 0, "luarocks make failed")
    local p = io.popen("LUA_PATH='" .. tree .. "/share/lua/5.4/?.lua;" .. tree ..
      "/share/lua/5.4/?/init.lua' LUA_CPATH='" .. tree .. "/lib/lua/5.4/?.so' " ..
      "lua5.4 -e 'local e = require \"esx\"; io.write(e.version, \" \", " ..
      "package.searchpath(\"esx.core\", package.cpath))'")
    local out = p:read("*a")
    p:close()
    assert.equal(require("esx").version .. " " .. tree .. "/lib/lua/5.4/esx/core.so", out)
    -- the objects just compiled against Lua 5.4's headers are not up to date for another
    -- Lua's: a `luarocks make` for Lua 5.1 (luarocks' default on Debian 12) compiles its own
    -- (make -n: what it would run, without running it)
    p = io.popen("make -n rock-so LUA_INCDIR=/usr/include/lua5.1 2>&1")
    out = p:read("*a")
    p:close()
    assert.matches("-I/usr/include/lua5.1 -c src/client.c", out, 1, true)
  end)
end)
