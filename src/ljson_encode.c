/*
 * ljson_encode.c -- core.json_encode(v): Lua values to JSON text, for request bodies.
 *
 * The tables lua-cjson 2.1.0 accepts, encoded the way it encodes them (see ljson.h), with two
 * differences that matter to Elasticsearch documents: integers are written exactly (cjson
 * formats every number with "%.14g", so 281474976710655 became 2.8147497671066e+14), and other
 * numbers with the fewest digits that read back as the same double (0.1 + 0.2 stays
 * 0.30000000000000004 instead of becoming 0.3).  '/' is not escaped.
 *
 * And one addition, for what a Lua table cannot say by itself: an empty JSON array.  A table
 * carrying esx.array_mt is always an array ([] when empty), and esx.empty_array is []; so are
 * the same markers of OpenResty's lua-cjson fork (cjson.array_mt, cjson.empty_array_mt,
 * cjson.empty_array) when a loaded cjson module has them.  The cost on the common path is one
 * lua_getmetatable per table (and a pointer compare when it has one); cjson's markers are
 * looked up only for a metatable or a light userdata that is not esx's own.  The marker test
 * (esx_json_table_kind, esx_json_is_empty_array) is shared with the cache's page encoder
 * (lcache_page.c).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "json.h"
#include "lclass.h"
#include "ljson.h"

#define MAX_DEPTH 1000            /* cjson's encode_max_depth */
/* Stack slots: a table level holds at most 2 while it encodes a member (its key and value),
 * and needs at most 4 more of its own meanwhile (its metatable and cjson's markers, or
 * array_length's key and value; a light userdata's look-up).  json_encode reserves enough
 * for the first SHALLOW levels at once; deeper levels check for themselves. */
#define SLOTS_PER_LEVEL 2
#define SLOTS_OWN 4
#define SHALLOW 16
#define SHALLOW_SLOTS (SLOTS_PER_LEVEL * SHALLOW + SLOTS_OWN)
#define MAX_TEXT (1024u << 20)    /* 1 GiB: past it the value is refused, not truncated */
#define KEEP_BYTES 65536          /* a buffer up to this size is kept for the next call */

/* json_encode's upvalues: its output buffer, esx.array_mt, package.loaded (the registry's
 * _LOADED) and the names of cjson's markers (NAMES), so that looking them up allocates no
 * Lua memory -- a raise inside the encoder would lose the grown buffer. */
#define UV_BUF lua_upvalueindex(1)
#define UV_ARRAY_MT lua_upvalueindex(2)
#define UV_LOADED lua_upvalueindex(3)
#define UV_NAMES lua_upvalueindex(4)
static const char *const NAMES[] = {"cjson", "cjson.safe", "array_mt", "empty_array_mt",
                                    "empty_array"};
enum { N_CJSON = 1, N_CJSON_SAFE, N_ARRAY_MT, N_EMPTY_ARRAY_MT, N_EMPTY_ARRAY };

/* esx.empty_array: a light userdata of its own (masked to 47 bits, as OpenResty's lua-cjson
 * masks its markers: some LuaJIT builds refuse a light userdata past that). */
static const char empty_array_tag;
#define EMPTY_ARRAY ((void *)((uintptr_t)&empty_array_tag & (((uintptr_t)1 << 47) - 1)))

/* How a table's metatable asks for it to be encoded (ljson.h's ESX_JSON_AS_*). */
#define AS_TABLE ESX_JSON_AS_PLAIN
#define AS_ARRAY ESX_JSON_AS_ARRAY
#define AS_CJSON_ARRAY ESX_JSON_AS_CJSON_ARRAY
#define AS_EMPTY_ARRAY ESX_JSON_AS_EMPTY_ARRAY

typedef struct enc {
    lua_State *L;
    esx_json_marks marks; /* esx.array_mt; package.loaded and NAMES as upvalues */
    esx_buf out;
    char err[128];
    int nomem;  /* the failure is out of memory: esx's, not the value's */
} enc;

static int fail(enc *e, const char *why)
{
    if (!e->err[0])
        snprintf(e->err, sizeof e->err, "%s", why);
    return -1;
}

/* A write to e->out that returned rc: 0 when it went through, else the failure recorded (past
 * MAX_TEXT: the value's; otherwise out of memory: esx's) and -1. */
static int written(enc *e, int rc)
{
    if (rc == ESX_BUF_OK)
        return 0;
    if (rc != ESX_BUF_TOOBIG && !e->err[0])
        e->nomem = 1;
    return fail(e, rc == ESX_BUF_TOOBIG ? "the JSON text would pass 1 GiB" : "out of memory");
}

/* Makes room for n more bytes (and the NUL esx_buf keeps after them). */
static int grow(enc *e, size_t n)
{
    return written(e, esx_buf_reserve(&e->out, n));
}

static inline int room(enc *e, size_t n)
{
    return e->out.cap - e->out.len > n ? 0 : grow(e, n);
}

/* Appends without the NUL: the text is read by its length only. */
static inline int put(enc *e, const char *s, size_t n)
{
    if (room(e, n) != 0)
        return -1;
    memcpy(e->out.data + e->out.len, s, n);
    e->out.len += n;
    return 0;
}

static inline int put1(enc *e, char c)
{
    if (room(e, 1) != 0)
        return -1;
    e->out.data[e->out.len++] = c;
    return 0;
}

/* Bytes are copied as they are (like cjson, UTF-8 is not checked: Elasticsearch does). */
static int string(enc *e, const char *s, size_t n)
{
    return written(e, esx_json_write_str(&e->out, s, n));
}

size_t esx_json_number_text(double v, char *out)
{
    if (!isfinite(v))
        return 0;
    if (v == 0 && signbit(v)) { /* "0" would read back as +0.0, another double */
        memcpy(out, "-0.0", 4);
        return 4;
    }
    if (v == floor(v) && fabs(v) < 9.2e18) /* integral: exact, as an integer */
        return esx_format_i64(out, (long long)v);
    int len = 0;
    for (int digits = 15; digits <= 17; digits++) {
        len = snprintf(out, 32, "%.*g", digits, v);
        if (digits == 17 || strtod(out, NULL) == v)
            break;
    }
    return (size_t)len;
}

/* The number at idx as JSON (see esx_json_number_text). */
static int number(enc *e, int idx)
{
    char tmp[32];
    size_t n;
#if !ESX_LUA51
    if (lua_isinteger(e->L, idx)) {
        n = esx_format_i64(tmp, (long long)lua_tointeger(e->L, idx));
        return put(e, tmp, n);
    }
#endif
    n = esx_json_number_text((double)lua_tonumber(e->L, idx), tmp);
    if (n == 0)
        return fail(e, "cannot encode NaN or infinity");
    return put(e, tmp, n);
}

/* The length of the table at idx as a JSON array, or -1 when it is an object (some key is not
 * a positive integer; an empty table is an object, as in cjson), or -2 when it is an
 * excessively sparse array (cjson's default rule: highest index over twice the number of
 * items, and over 10).  Uses two stack slots. */
static long long array_length(lua_State *L, int idx)
{
    double max = 0, items = 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        lua_pop(L, 1);
        if (lua_type(L, -1) == LUA_TNUMBER) {
            double k = (double)lua_tonumber(L, -1);
            if (k >= 1 && k == floor(k)) {
                if (k > max)
                    max = k;
                items++;
                continue;
            }
        }
        lua_pop(L, 1);
        return -1;
    }
    if (max > items * 2 && max > 10)
        return -2;
    return (long long)max;
}

/* Whether the value at idx (absolute) is the marker NAMES[field] of a loaded cjson or
 * cjson.safe module (OpenResty's fork has them, lua-cjson 2.1.0 not).  Raw reads only: no Lua
 * code runs, no memory is allocated.  Uses two stack slots. */
static int cjson_marker(lua_State *L, int idx, const esx_json_marks *marks, int field)
{
    int found = 0;
    for (int m = N_CJSON; m <= N_CJSON_SAFE && !found; m++) {
        lua_rawgeti(L, marks->names, m);
        lua_rawget(L, marks->loaded);
        if (lua_type(L, -1) == LUA_TTABLE) {
            lua_rawgeti(L, marks->names, field);
            lua_rawget(L, -2);
            found = !lua_isnil(L, -1) && lua_rawequal(L, -1, idx);
            lua_pop(L, 1);
        }
        lua_pop(L, 1);
    }
    return found;
}

/* The kind (AS_*) a metatable other than esx.array_mt, on top of the stack, asks for: one of
 * cjson's, or none.  Out of line: the common path never comes here.  Uses two stack slots. */
__attribute__((noinline, cold)) static int foreign_kind(lua_State *L, const esx_json_marks *m)
{
    int mt = lua_gettop(L);
    return cjson_marker(L, mt, m, N_ARRAY_MT) ? AS_CJSON_ARRAY
           : cjson_marker(L, mt, m, N_EMPTY_ARRAY_MT) ? AS_EMPTY_ARRAY
           : AS_TABLE;
}

int esx_json_table_kind(lua_State *L, int idx, const esx_json_marks *m)
{
    int kind = AS_TABLE; /* what the metatable asks for: one check per table, no more */
    if (lua_getmetatable(L, idx)) {
        kind = lua_topointer(L, -1) == m->array_mt ? AS_ARRAY : foreign_kind(L, m);
        lua_pop(L, 1);
    }
    return kind;
}

int esx_json_is_empty_array(lua_State *L, int idx, const esx_json_marks *m)
{
    return lua_touserdata(L, idx) == EMPTY_ARRAY || cjson_marker(L, idx, m, N_EMPTY_ARRAY);
}

void esx_json_push_empty_array(lua_State *L)
{
    lua_pushlightuserdata(L, EMPTY_ARRAY);
}

/* Pushes the table of NAMES, kept in the registry: json_encode's upvalue, and what
 * esx_json_marks_push hands to the cache's encoder. */
static void push_names(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, "esx.json_names");
    if (lua_istable(L, -1))
        return;
    lua_pop(L, 1);
    int n = (int)(sizeof NAMES / sizeof NAMES[0]);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_pushstring(L, NAMES[i]);
        lua_rawseti(L, -2, i + 1);
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, LUA_REGISTRYINDEX, "esx.json_names");
}

/* Pushes package.loaded (the registry's _LOADED; an empty table if there is none). */
static void push_loaded(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED"); /* package.loaded, in 5.1 and 5.4 */
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
    }
}

void esx_json_marks_push(lua_State *L, esx_json_marks *m)
{
    lua_getfield(L, LUA_REGISTRYINDEX, "esx.array_mt");
    m->array_mt = lua_istable(L, -1) ? lua_topointer(L, -1) : NULL; /* the registry keeps it */
    lua_pop(L, 1);
    push_loaded(L);
    m->loaded = lua_gettop(L);
    push_names(L);
    m->names = lua_gettop(L);
}

static int value(enc *e, int idx, int depth);

static int table(enc *e, int idx, int depth)
{
    lua_State *L = e->L;
    if (depth > MAX_DEPTH)
        return fail(e, "nested too deep (over 1000 levels, or a cycle)");
    if (depth > SHALLOW && !lua_checkstack(L, SLOTS_PER_LEVEL + SLOTS_OWN))
        return fail(e, "nested too deep for the Lua stack");
    int kind = esx_json_table_kind(L, idx, &e->marks);
    long long len = array_length(L, idx);
    if (len == -2)
        return fail(e, "cannot encode an excessively sparse array");
    if (len == -1 && (kind == AS_ARRAY || kind == AS_CJSON_ARRAY))
        return fail(e, kind == AS_ARRAY
                           ? "cannot encode a table with esx.array_mt that has a key other than a "
                             "positive integer"
                           : "cannot encode a table with cjson.array_mt that has a key other than "
                             "a positive integer");
    if (len > 0 || (len == 0 && kind != AS_TABLE)) {
        if (put1(e, '[') != 0)
            return -1;
        for (long long i = 1; i <= len; i++) {
            if (i > 1 && put1(e, ',') != 0)
                return -1;
            lua_rawgeti(L, idx, (lua_Integer)i);
            int rc = value(e, lua_gettop(L), depth + 1);
            lua_pop(L, 1);
            if (rc != 0)
                return -1;
        }
        return put1(e, ']');
    }
    if (put1(e, '{') != 0)
        return -1;
    int first = 1;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        int key = lua_gettop(L) - 1;
        if (!first && put1(e, ',') != 0)
            return -1;
        first = 0;
        int rc;
        if (lua_type(L, key) == LUA_TSTRING) {
            size_t klen;
            const char *k = lua_tolstring(L, key, &klen);
            rc = string(e, k, klen);
        } else if (lua_type(L, key) == LUA_TNUMBER) { /* written as a string, as cjson does */
            rc = put1(e, '"');
            if (rc == 0)
                rc = number(e, key);
            if (rc == 0)
                rc = put1(e, '"');
        } else {
            rc = fail(e, "cannot encode a table key that is not a string or a number");
        }
        if (rc == 0)
            rc = put1(e, ':');
        if (rc == 0)
            rc = value(e, key + 1, depth + 1);
        lua_pop(L, 1); /* the value; the key stays for lua_next */
        if (rc != 0) {
            lua_pop(L, 1);
            return -1;
        }
    }
    return put1(e, '}');
}

static int value(enc *e, int idx, int depth)
{
    lua_State *L = e->L;
    switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        return string(e, s, n);
    }
    case LUA_TNUMBER:
        return number(e, idx);
    case LUA_TBOOLEAN:
        return lua_toboolean(L, idx) ? put(e, "true", 4) : put(e, "false", 5);
    case LUA_TTABLE:
        return table(e, idx, depth);
    case LUA_TNIL:
        return put(e, "null", 4);
    case LUA_TLIGHTUSERDATA: {
        void *p = lua_touserdata(L, idx);
        if (p == NULL) /* cjson.null */
            return put(e, "null", 4);
        if (p == EMPTY_ARRAY || cjson_marker(L, idx, &e->marks, N_EMPTY_ARRAY))
            return put(e, "[]", 2);
    }
        /* fall through */
    default: {
        char why[64];
        snprintf(why, sizeof why, "cannot encode a %s", lua_typename(L, lua_type(L, idx)));
        return fail(e, why);
    }
    }
}

/* core.json_encode(v) -> text | nil, message, "nomem" when memory ran out (esx's failure, not
 * the value's: the caller reports it as one of its own, not as a bad argument) */
static int json_encode(lua_State *L)
{
    luaL_checkany(L, 1);
    lua_settop(L, 1);
    esx_buf *b = lua_touserdata(L, UV_BUF);
    enc e = {.L = L,
             .marks = {.array_mt = lua_topointer(L, UV_ARRAY_MT), .loaded = UV_LOADED,
                       .names = UV_NAMES},
             .out = *b,
             .nomem = 0};
    e.out.len = 0;
    int rc = lua_checkstack(L, SHALLOW_SLOTS) ? value(&e, 1, 1)
                                              : fail(&e, "nested too deep for the Lua stack");
    *b = e.out; /* the memory, grown or not, is the state's again */
    if (rc != 0) {
        lua_pushnil(L);
        lua_pushstring(L, e.err);
        if (e.nomem)
            lua_pushliteral(L, "nomem");
    } else {
        lua_pushlstring(L, b->data ? b->data : "", b->len);
    }
    if (b->cap > KEEP_BYTES)
        esx_buf_free(b);
    else
        esx_buf_reset(b);
    return rc != 0 ? (e.nomem ? 3 : 2) : 1;
}

void esx_ljson_encode_open(lua_State *L)
{
    /* esx.array_mt: one table per Lua state, kept in the registry, so that the core loaded
     * again (package.loaded cleared) hands out the same one and still honours it. */
    lua_getfield(L, LUA_REGISTRYINDEX, "esx.array_mt");
    if (!lua_istable(L, -1)) {
        lua_pop(L, 1);
        lua_newtable(L);
        lua_pushvalue(L, -1);
        lua_setfield(L, LUA_REGISTRYINDEX, "esx.array_mt");
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "array_mt");
    lua_pushlightuserdata(L, EMPTY_ARRAY);
    lua_setfield(L, -3, "empty_array");

    /* The output buffer of a Lua state: an upvalue of json_encode (a raise cannot leak it,
     * and small bodies reuse its memory).  json_encode calls no Lua code, so it is never
     * re-entered. */
    esx_lbuf_push(L, MAX_TEXT);
    lua_insert(L, -2); /* buffer, array_mt */
    push_loaded(L);
    push_names(L);
    lua_pushcclosure(L, json_encode, 4);
    lua_setfield(L, -2, "json_encode");
}
