/*
 * lclient.h -- Lua binding of the client core: userdata "esx.client" (a client) and
 * "esx.pending" (one request in flight).  The public API is lua/esx/client.lua.
 */
#ifndef ESX_LCLIENT_H
#define ESX_LCLIENT_H

#include "compat.h"
#include "client.h"

/* Registers the metatables and adds client_new / check_node_url to the table on top. */
void esx_lclient_open(lua_State *L);

/* The client in userdata at idx (raises if it is not one). */
esx_client *esx_lclient_check(lua_State *L, int idx);

#endif
