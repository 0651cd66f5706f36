-- esx: luarocks builds the C core with the project's Makefile (target `rock-so`) for the
-- Lua it runs under, then installs the core and the Lua modules into the tree.
rockspec_format = "3.0"
package = "esx"
version = "scm-1"
source = { url = "git+file://." }
description = {
  summary = "Elasticsearch client pool, beacon collector and two-tier article cache for Lua",
  detailed = [[
A C module for Lua 5.4, LuaJIT 2.1 and nginx/OpenResty: a libcurl-based Elasticsearch client
pool that bounds every wait, compresses and heals itself; an event collector handler that
absorbs spikes and never loses an accepted event; and a two-tier cache with Roaring-bitmap
reader sets.]],
  license = "MIT",
}
dependencies = { "lua >= 5.1", "lua-cjson" }
external_dependencies = {
  CURL = { library = "curl" },
  ZLIB = { library = "z" },
  ROARING = { library = "roaring" },
}
build = {
  type = "make",
  build_target = "rock-so",
  build_variables = {
    CFLAGS = "$(CFLAGS)",
    LUA_INCDIR = "$(LUA_INCDIR)",
  },
  install_target = "rock-install",
  install_variables = {
    INST_LIBDIR = "$(LIBDIR)",
    INST_LUADIR = "$(LUADIR)",
    LUA_INCDIR = "$(LUA_INCDIR)", -- which build to install (one per Lua's headers)
  },
}
