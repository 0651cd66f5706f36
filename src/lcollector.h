/*
 * lcollector.h -- Lua binding of the collector core: userdata "esx.collector.core".
 * The public API (HTTP handling, CORS, options) is lua/esx/collector.lua.
 */
#ifndef ESX_LCOLLECTOR_H
#define ESX_LCOLLECTOR_H

#include "compat.h"

/* Registers the metatable and adds collector_new to the table on top of the stack. */
void esx_lcollector_open(lua_State *L);

#endif
