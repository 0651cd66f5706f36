/* ljson.h -- core.json_decode: a strict single-pass JSON decoder into Lua values. */
#ifndef ESX_LJSON_H
#define ESX_LJSON_H

#include "compat.h"

/* Adds json_decode to the table on top of the stack. */
void esx_ljson_open(lua_State *L);

#endif
