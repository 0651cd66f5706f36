/* ljson.h -- core.json_decode: a strict single-pass JSON decoder into Lua values; and
 * core.json_encode (ljson_encode.c): Lua values to JSON text, as lua-cjson 2.1.0 encodes
 * them but with exact integers and round-trip doubles:
 *   strings, booleans, numbers (NaN and infinities refused), nil and cjson.null as null;
 *   a table whose keys are all positive integers is an array up to its highest index (holes
 *   as null; "excessively sparse" -- highest index over twice the items and over 10 -- is
 *   refused), any other table an object (number keys written as strings; other key types
 *   refused), an empty table {}; at most 1000 levels; other types refused.  Plus empty
 *   arrays: a table with esx.array_mt (core.array_mt) is always an array ([] when empty; a
 *   key that is not a positive integer refused), esx.empty_array (core.empty_array, a light
 *   userdata) is [], and so are OpenResty lua-cjson's cjson.array_mt, cjson.empty_array and
 *   (when empty) cjson.empty_array_mt tables, found in package.loaded's cjson or cjson.safe. */
#ifndef ESX_LJSON_H
#define ESX_LJSON_H

#include "compat.h"

/* Adds json_decode to the table on top of the stack. */
void esx_ljson_open(lua_State *L);

/* Adds json_encode(v) -> text | nil, message [, "nomem"] to the table on top of the stack
 * ("nomem" when memory ran out: esx's failure, not the value's).  Raises only on Lua memory
 * errors. */
void esx_ljson_encode_open(lua_State *L);

/* The markers of an empty JSON array, shared by json_encode and the cache's page encoder
 * (lcache_page.c): esx.array_mt and esx.empty_array, and OpenResty lua-cjson's array_mt,
 * empty_array_mt and empty_array when package.loaded's cjson or cjson.safe has them. */
enum { ESX_JSON_AS_PLAIN,        /* no marker (or another metatable): the encoder's own rule */
       ESX_JSON_AS_ARRAY,        /* esx.array_mt: always an array */
       ESX_JSON_AS_CJSON_ARRAY,  /* cjson.array_mt: the same */
       ESX_JSON_AS_EMPTY_ARRAY }; /* cjson.empty_array_mt: [] when empty, else the own rule */

/* Where the marker test finds esx.array_mt, package.loaded and the names of cjson's markers
 * (stack indices: absolute, or json_encode's upvalues). */
typedef struct {
    const void *array_mt;
    int loaded, names;
} esx_json_marks;

/* Pushes package.loaded and the names of cjson's markers (two slots, left for the caller to
 * pop once done with m) and fills m.  Raises only Lua's memory error. */
void esx_json_marks_push(lua_State *L, esx_json_marks *m);

/* The ESX_JSON_AS_* kind the metatable of the table at idx (absolute) asks for.  Raw reads only:
 * no Lua code runs, no memory is allocated.  Uses three stack slots. */
int esx_json_table_kind(lua_State *L, int idx, const esx_json_marks *m);

/* Whether the light userdata at idx (absolute) is esx.empty_array or cjson.empty_array (from
 * a loaded cjson).  As above; uses two stack slots. */
int esx_json_is_empty_array(lua_State *L, int idx, const esx_json_marks *m);

/* Pushes esx.empty_array. */
void esx_json_push_empty_array(lua_State *L);

/* Writes the finite number v to out (room for 32 bytes, no NUL needed) as json_encode does:
 * an integral value exactly as an integer, any other in the fewest of 15, 16 or 17
 * significant digits that read back as v.  Returns the length, or 0 for NaN and infinities
 * (nothing written). */
size_t esx_json_number_text(double v, char *out);

/* Decodes len bytes of JSON onto L's stack (an empty array a table with esx.array_mt):
 * returns 1 with the value pushed, or 2 with nil
 * and an error (kind "decode") pushed.  Raises only on Lua memory errors. */
int esx_ljson_decode(lua_State *L, const char *s, size_t len);

#endif
