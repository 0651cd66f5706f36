/*
 * compat.h -- every difference between Lua 5.4 and LuaJIT 2.1 (Lua 5.1 API) lives here.
 *
 * The C files of esx are written against the Lua 5.2+ auxiliary API; on 5.1 / LuaJIT this
 * header supplies the few functions that are missing.  Nothing here creates globals.
 */
#ifndef ESX_COMPAT_H
#define ESX_COMPAT_H

#include <stdint.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>

#if LUA_VERSION_NUM < 502
#define ESX_LUA51 1

#ifndef luaL_newlibtable
#define luaL_newlibtable(L, l) lua_createtable(L, 0, (int)(sizeof(l) / sizeof((l)[0]) - 1))
#endif
#define luaL_newlib(L, l) (luaL_newlibtable(L, l), luaL_setfuncs(L, l, 0))
#define lua_rawlen(L, i) lua_objlen(L, (i))
#define lua_absindex(L, i) \
    (((i) > 0 || (i) <= LUA_REGISTRYINDEX) ? (i) : lua_gettop(L) + (i) + 1)

/* LuaJIT 2.1 (OpenResty branch) already has luaL_setfuncs, luaL_testudata and
 * luaL_setmetatable; plain 5.1 does not.  Both are handled by the names below. */
static inline void esx_compat_setfuncs(lua_State *L, const luaL_Reg *l, int nup)
{
    luaL_checkstack(L, nup, "too many upvalues");
    for (; l->name != NULL; l++) {
        for (int i = 0; i < nup; i++)
            lua_pushvalue(L, -nup);
        lua_pushcclosure(L, l->func, nup);
        lua_setfield(L, -(nup + 2), l->name);
    }
    lua_pop(L, nup);
}
#undef luaL_setfuncs
#define luaL_setfuncs esx_compat_setfuncs

static inline void *esx_compat_testudata(lua_State *L, int ud, const char *tname)
{
    void *p = lua_touserdata(L, ud);
    if (p == NULL || !lua_getmetatable(L, ud))
        return NULL;
    luaL_getmetatable(L, tname);
    int same = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    return same ? p : NULL;
}
#undef luaL_testudata
#define luaL_testudata esx_compat_testudata

static inline void esx_compat_setmetatable(lua_State *L, const char *tname)
{
    luaL_getmetatable(L, tname);
    lua_setmetatable(L, -2);
}
#undef luaL_setmetatable
#define luaL_setmetatable esx_compat_setmetatable

/* An integer-valued number: 5.1 has no integer subtype, so test the value. */
static inline int esx_isinteger(lua_State *L, int i)
{
    if (lua_type(L, i) != LUA_TNUMBER)
        return 0;
    lua_Number n = lua_tonumber(L, i);
    /* range first: converting a double outside long long's range (or NaN) is undefined */
    return n >= -9007199254740992.0 && n <= 9007199254740992.0 && n == (lua_Number)(long long)n;
}

#else
#define ESX_LUA51 0
static inline int esx_isinteger(lua_State *L, int i)
{
    if (lua_isinteger(L, i))
        return 1;
    if (lua_type(L, i) != LUA_TNUMBER)
        return 0;
    lua_Number n = lua_tonumber(L, i);
    /* range first: converting a double outside long long's range (or NaN) is undefined */
    return n >= -9007199254740992.0 && n <= 9007199254740992.0 && n == (lua_Number)(long long)n;
}
#endif

/* Largest integer both flavours represent exactly (doubles on LuaJIT). */
#define ESX_MAX_SAFE_INTEGER 9007199254740991LL

/* The value at i as a 64-bit integer; the caller has checked esx_isinteger. */
static inline long long esx_tointeger(lua_State *L, int i)
{
#if ESX_LUA51
    return (long long)lua_tonumber(L, i);
#else
    return lua_isinteger(L, i) ? (long long)lua_tointeger(L, i) : (long long)lua_tonumber(L, i);
#endif
}

/* Argument i as a whole number of ms or a sequence number: raises (luaL_argerror) unless it
 * is a number in [0, 2^53] -- a NaN or out-of-range double cast to an integer type is
 * undefined behaviour. */
static inline int64_t esx_checkcount(lua_State *L, int i)
{
    lua_Number v = luaL_checknumber(L, i);
    if (!(v >= 0 && v <= 9007199254740992.0))
        luaL_argerror(L, i, "a number in [0, 2^53] expected");
    return (int64_t)v;
}

static inline void esx_pushinteger(lua_State *L, long long v)
{
#if ESX_LUA51
    lua_pushnumber(L, (lua_Number)v);
#else
    lua_pushinteger(L, (lua_Integer)v);
#endif
}

#endif
