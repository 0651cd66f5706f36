/*
 * lerror.c -- the esx error object (see lerror.h).
 */
#include <stdarg.h>
#include <stdio.h>

#include "lerror.h"

#define ESX_ERROR_MT "esx.error"

static int error_tostring(lua_State *L)
{
    lua_getfield(L, 1, "kind");
    lua_getfield(L, 1, "message");
    const char *kind = lua_tostring(L, -2);
    const char *message = lua_tostring(L, -1);
    lua_pushfstring(L, "%s: %s", kind ? kind : "error", message ? message : "");
    return 1;
}

void esx_lerror_open(lua_State *L)
{
    if (luaL_newmetatable(L, ESX_ERROR_MT)) {
        lua_pushcfunction(L, error_tostring);
        lua_setfield(L, -2, "__tostring");
        lua_pushliteral(L, "esx.error");
        lua_setfield(L, -2, "__name");
    }
    lua_pop(L, 1);
}

static void push_message(lua_State *L, const char *kind, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap); /* truncates, never overflows */
    lua_createtable(L, 0, 4);
    lua_pushstring(L, kind);
    lua_setfield(L, -2, "kind");
    lua_pushstring(L, msg);
    lua_setfield(L, -2, "message");
    luaL_setmetatable(L, ESX_ERROR_MT);
}

void esx_lerror_push(lua_State *L, const char *kind, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    push_message(L, kind, fmt, ap);
    va_end(ap);
}

int esx_lerror_fail(lua_State *L, const char *kind, const char *fmt, ...)
{
    va_list ap;
    lua_pushnil(L);
    va_start(ap, fmt);
    push_message(L, kind, fmt, ap);
    va_end(ap);
    return 2;
}

int esx_lerror_new(lua_State *L)
{
    const char *kind = luaL_checkstring(L, 1);
    const char *message = luaL_optstring(L, 2, "");
    int has_fields = !lua_isnoneornil(L, 3);
    if (has_fields)
        luaL_checktype(L, 3, LUA_TTABLE);
    lua_createtable(L, 0, 6);
    if (has_fields) {
        lua_pushnil(L);
        while (lua_next(L, 3) != 0) {
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, -4);
        }
    }
    lua_pushstring(L, kind);
    lua_setfield(L, -2, "kind");
    lua_pushstring(L, message);
    lua_setfield(L, -2, "message");
    luaL_setmetatable(L, ESX_ERROR_MT);
    return 1;
}
