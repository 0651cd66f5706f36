/*
 * sanlua.c -- a minimal Lua 5.4 host for sanitizer runs: `sanlua script.lua args...`.
 *
 * Built with -fsanitize=address,undefined, it carries the sanitizer runtimes itself, so
 * the esx module built the same way can be tested without LD_PRELOAD -- which every child
 * process (servers, pgrep, gcc) would inherit, and some would deadlock under.  It sets
 * `arg` as the stock interpreter does and keeps C modules mapped at exit (a dlclose()d
 * module's leak stacks cannot be symbolised).
 *
 * It also lets specs run a call with Lua's memory running out at a chosen point
 * (require "sanlua" is only found in this host):
 *   sanlua.oom_pcall(n, f, ...) -> injected, ok, results or error
 * calls f(...) protected with the n-th growing allocation of the Lua state from the call on,
 * and every one after it, failing; injected is false when f needed fewer than n.  Sweeping n
 * from 1 until injected is false makes every Lua allocation of f the one that raises, and
 * LeakSanitizer then finds C memory that a raise left behind (spec/bindings_spec.lua).
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

static long fail_countdown; /* 0: off; else the growing allocation that starts failing */
static int fail_injected;

static void *alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    /* only growth may fail: Lua counts on a shrinking realloc to succeed (and when ptr is
     * NULL, osize is a type tag, not a size) */
    if (fail_countdown > 0 && (ptr == NULL || nsize > osize)) {
        if (fail_countdown == 1) {
            fail_injected = 1;
            return NULL;
        }
        fail_countdown--;
    }
    return realloc(ptr, nsize);
}

static int panic(lua_State *L)
{
    fprintf(stderr, "PANIC: unprotected error in call to Lua API (%s)\n", lua_tostring(L, -1));
    return 0;
}

static int oom_pcall(lua_State *L)
{
    lua_Integer n = luaL_checkinteger(L, 1);
    luaL_checktype(L, 2, LUA_TFUNCTION);
    luaL_argcheck(L, n > 0, 1, "n must be positive");
    int nargs = lua_gettop(L) - 2;
    fail_injected = 0;
    fail_countdown = (long)n;
    int status = lua_pcall(L, nargs, LUA_MULTRET, 0);
    fail_countdown = 0;
    lua_pushboolean(L, fail_injected);
    lua_replace(L, 1);
    lua_pushboolean(L, status == LUA_OK);
    lua_insert(L, 2);
    return lua_gettop(L);
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
    lua_State *L = lua_newstate(alloc, NULL);
    if (L == NULL)
        return 1;
    lua_atpanic(L, panic);
    luaL_openlibs(L);
    luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_LOADED_TABLE);
    lua_newtable(L);
    lua_pushcfunction(L, oom_pcall);
    lua_setfield(L, -2, "oom_pcall");
    lua_setfield(L, -2, "sanlua");
    lua_pop(L, 1);
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
