/* ljson.h -- core.json_decode: a strict single-pass JSON decoder into Lua values; and
 * core.json_encode (ljson_encode.c): Lua values to JSON text, as lua-cjson 2.1.0 encodes
 * them but with exact integers and round-trip doubles:
 *   strings, booleans, numbers (NaN and infinities refused), nil and cjson.null as null;
 *   a table whose keys are all positive integers is an array up to its highest index (holes
 *   as null; "excessively sparse" -- highest index over twice the items and over 10 -- is
 *   refused), any other table an object (number keys written as strings; other key types
 *   refused), an empty table {}; at most 1000 levels; other types refused. */
#ifndef ESX_LJSON_H
#define ESX_LJSON_H

#include "compat.h"

/* Adds json_decode to the table on top of the stack. */
void esx_ljson_open(lua_State *L);

/* Adds json_encode(v) -> text | nil, message to the table on top of the stack.  Raises only
 * on Lua memory errors. */
void esx_ljson_encode_open(lua_State *L);

/* Decodes len bytes of JSON onto L's stack: returns 1 with the value pushed, or 2 with nil
 * and an error (kind "decode") pushed.  Raises only on Lua memory errors. */
int esx_ljson_decode(lua_State *L, const char *s, size_t len);

#endif
