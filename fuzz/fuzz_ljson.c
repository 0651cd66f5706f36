/*
 * fuzz_ljson.c -- libFuzzer target: core.json_decode (src/ljson.c, the decoder of every
 * Elasticsearch response) on arbitrary bytes.  It must return a value or nil + a "decode"
 * error, never crash, and agree with the strict scanner (src/json.c) on what is JSON.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "compat.h"
#include "json.h"
#include "ljson.h"
#include "lerror.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

static lua_State *L;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (L == NULL) {
        L = luaL_newstate();
        check(L != NULL);
        esx_lerror_open(L);
        lua_newtable(L);
        esx_ljson_open(L);
        lua_getfield(L, -1, "json_decode");
        lua_setglobal(L, "decode");
        lua_pop(L, 1);
    }
    int top = lua_gettop(L);
    lua_getglobal(L, "decode");
    lua_pushlstring(L, (const char *)data, size);
    check(lua_pcall(L, 1, 2, 0) == LUA_OK);
    int decoded = !lua_isnil(L, -2);
    if (!decoded) {
        check(lua_istable(L, -1));
        lua_getfield(L, -1, "kind");
        check(lua_isstring(L, -1));
        lua_pop(L, 1);
    }
    lua_settop(L, top);
    (void)top;

    /* The strict scanner accepts a flawless value followed only by whitespace exactly when
     * the decoder does (the decoder does not check UTF-8, so flawed strings are skipped). */
    size_t pos = 0;
    esx_json_val v;
    int scanned = esx_json_scan((const char *)data, size, &pos, &v, NULL, 0) == 0 &&
                  esx_json_skip_ws((const char *)data, size, pos) == size;
    if (scanned && v.flaw == 0 && v.depth <= 512)
        check(decoded);
    if (decoded && !(scanned && v.flaw == 0))
        check(!scanned ? 0 : v.flaw == ESX_JSON_F_UTF8);
    /* a fresh state per input: every input is judged on its own */
    lua_close(L);
    L = NULL;
    return 0;
}
