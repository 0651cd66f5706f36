/*
 * lclass.c -- the metatable of a userdata class seen by Lua (see lclass.h).
 */
#include "lclass.h"

void esx_lclass(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc,
                lua_CFunction tostring)
{
    if (luaL_newmetatable(L, name)) {
        if (methods) {
            lua_newtable(L);
            luaL_setfuncs(L, methods, 0);
            lua_setfield(L, -2, "__index");
        }
        if (gc) {
            lua_pushcfunction(L, gc);
            lua_setfield(L, -2, "__gc");
        }
        if (tostring) {
            lua_pushcfunction(L, tostring);
            lua_setfield(L, -2, "__tostring");
        }
        lua_pushstring(L, name); /* LuaJIT's luaL_newmetatable does not set it */
        lua_setfield(L, -2, "__name");
    }
    lua_pop(L, 1);
}
