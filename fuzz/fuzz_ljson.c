/*
 * fuzz_ljson.c -- libFuzzer target: core.json_decode (src/ljson.c, the decoder of every
 * Elasticsearch response) on arbitrary bytes.  It must return a value or nil + a "decode"
 * error, never crash, and agree with the strict scanner (src/json.c) on what is JSON.  What
 * it decodes, core.json_encode (src/ljson_encode.c) must encode to text that decodes to the
 * same value -- or refuse it only for a number JSON cannot hold (1e400 decodes to infinity).
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

/* roundtrip(v) -> true when encode(v) decodes back to v, or when encode refused an infinity */
static const char ROUNDTRIP[] =
    "local decode, encode = ...\n"
    "local function same(a, b)\n"
    "  if type(a) ~= type(b) then return false end\n"
    "  if type(a) ~= 'table' then return a == b end\n"
    "  for k, v in pairs(a) do if not same(v, b[k]) then return false end end\n"
    "  for k in pairs(b) do if a[k] == nil then return false end end\n"
    "  return true\n"
    "end\n"
    "return function(v)\n"
    "  local s, err = encode(v)\n"
    "  if not s then return err == 'cannot encode NaN or infinity' end\n"
    "  local w = decode(s)\n"
    "  return w ~= nil and same(v, w)\n"
    "end\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (L == NULL) {
        L = luaL_newstate();
        check(L != NULL);
        luaL_openlibs(L); /* type and pairs, for roundtrip */
        esx_lerror_open(L);
        lua_newtable(L);
        esx_ljson_open(L);
        esx_ljson_encode_open(L);
        lua_getfield(L, -1, "json_decode");
        lua_setglobal(L, "decode");
        check(luaL_loadstring(L, ROUNDTRIP) == LUA_OK);
        lua_getfield(L, -2, "json_decode");
        lua_getfield(L, -3, "json_encode");
        check(lua_pcall(L, 2, 1, 0) == LUA_OK);
        lua_setglobal(L, "roundtrip");
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
    } else {
        lua_getglobal(L, "roundtrip");
        lua_pushvalue(L, -3);
        if (lua_pcall(L, 1, 1, 0) != LUA_OK)
            fprintf(stderr, "roundtrip raised: %s\n", lua_tostring(L, -1));
        check(lua_toboolean(L, -1));
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
