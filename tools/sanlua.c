/*
 * sanlua.c -- a minimal Lua 5.4 host for sanitizer runs: `sanlua script.lua args...`.
 *
 * Built with -fsanitize=address,undefined, it carries the sanitizer runtimes itself, so
 * the esx module built the same way can be tested without LD_PRELOAD -- which every child
 * process (servers, pgrep, gcc) would inherit, and some would deadlock under.  It sets
 * `arg` as the stock interpreter does and keeps C modules mapped at exit (a dlclose()d
 * module's leak stacks cannot be symbolised).
 */
#include <stdio.h>
#include <stdlib.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

int dlclose(void *handle);
int dlclose(void *handle)
{
    (void)handle;
    return 0;
}

static int traceback(lua_State *L)
{
    const char *msg = lua_tostring(L, 1);
    luaL_traceback(L, L, msg ? msg : "(error object is not a string)", 1);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: sanlua script.lua [args...]\n");
        return 2;
    }
    lua_State *L = luaL_newstate();
    if (L == NULL)
        return 1;
    luaL_openlibs(L);
    lua_createtable(L, argc - 2, 2);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - 1);
    }
    lua_setglobal(L, "arg");
    lua_pushcfunction(L, traceback);
    int status = luaL_loadfile(L, argv[1]);
    if (status == LUA_OK) {
        for (int i = 2; i < argc; i++)
            lua_pushstring(L, argv[i]);
        status = lua_pcall(L, argc - 2, 0, 1);
    }
    if (status != LUA_OK)
        fprintf(stderr, "%s\n", lua_tostring(L, -1));
    lua_close(L);
    return status == LUA_OK ? 0 : 1;
}
