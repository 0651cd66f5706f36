/*
 * lcache.h -- Lua binding of the esx.cache C core (cache.h): the userdata "esx.cache" that
 * lua/esx/cache.lua drives.  Loaders are never called from here (they may yield).
 */
#ifndef ESX_LCACHE_H
#define ESX_LCACHE_H

#include "compat.h"

/* Adds cache_new and cache_clock to the table on top of the stack (esx.core) and registers
 * the "esx.cache" metatable.  Raises only Lua's own memory error. */
void esx_lcache_open(lua_State *L);

#endif
