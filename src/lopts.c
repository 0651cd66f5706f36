/*
 * lopts.c -- readers for checked options tables (see lopts.h).
 */
#include <string.h>

#include "lopts.h"

int64_t esx_lopt_int(lua_State *L, int t, const char *ctor, const char *name, int64_t def)
{
    lua_getfield(L, t, name);
    int64_t v = def;
    if (!lua_isnil(L, -1)) {
        if (!esx_isinteger(L, -1))
            luaL_error(L, "%s: option '%s' must be an integer", ctor, name);
        v = esx_tointeger(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

double esx_lopt_num(lua_State *L, int t, const char *ctor, const char *name, double def)
{
    lua_getfield(L, t, name);
    double v = def;
    if (!lua_isnil(L, -1)) {
        if (lua_type(L, -1) != LUA_TNUMBER)
            luaL_error(L, "%s: option '%s' must be a number", ctor, name);
        v = lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    return v;
}

int esx_lopt_bool(lua_State *L, int t, const char *ctor, const char *name, int def)
{
    (void)ctor;
    lua_getfield(L, t, name);
    int v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
    lua_pop(L, 1);
    return v;
}

void esx_lopt_str(lua_State *L, int t, const char *ctor, const char *name, char *out,
                  size_t outlen)
{
    lua_getfield(L, t, name);
    out[0] = '\0';
    if (!lua_isnil(L, -1)) {
        size_t len;
        const char *s = lua_tolstring(L, -1, &len);
        if (s == NULL || lua_type(L, -1) != LUA_TSTRING)
            luaL_error(L, "%s: option '%s' must be a string", ctor, name);
        if (len >= outlen || strlen(s) != len)
            luaL_error(L, "%s: option '%s' is too long or contains NUL", ctor, name);
        memcpy(out, s, len + 1);
    }
    lua_pop(L, 1);
}
