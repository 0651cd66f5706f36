/*
 * levent.h -- Lua binding of the collector's untrusted-input layer: event parsing
 * (event.h), _bulk response items (bulk_response.h) and HyperLogLog sketches (hll.h, the
 * userdata "esx.hll").
 */
#ifndef ESX_LEVENT_H
#define ESX_LEVENT_H

#include "compat.h"

/* Adds events_parse, event_from_query, bulk_response_parse, hll_new and hll_deserialize to
 * the table on top of the stack (esx.core) and registers the "esx.hll" metatable.  Raises
 * only Lua's own memory error. */
void esx_levent_open(lua_State *L);

#endif
