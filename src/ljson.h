/* ljson.h -- core.json_decode: a strict single-pass JSON decoder into Lua values. */
#ifndef ESX_LJSON_H
#define ESX_LJSON_H

#include "compat.h"

/* Adds json_decode to the table on top of the stack. */
void esx_ljson_open(lua_State *L);

/* Decodes len bytes of JSON onto L's stack: returns 1 with the value pushed, or 2 with nil
 * and an error (kind "decode") pushed.  Raises only on Lua memory errors. */
int esx_ljson_decode(lua_State *L, const char *s, size_t len);

#endif
