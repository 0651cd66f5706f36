/*
 * lclass.h -- the metatable of a userdata class seen by Lua.
 */
#ifndef ESX_LCLASS_H
#define ESX_LCLASS_H

#include "compat.h"

/* Registers the metatable `name` (once per Lua state): methods (may be NULL) as __index,
 * gc and tostring (each may be NULL) as __gc and __tostring, name as __name.  Leaves the
 * stack as it was; fails only by raising Lua's own memory error. */
void esx_lclass(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc,
                lua_CFunction tostring);

#endif
