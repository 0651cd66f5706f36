/*
 * lcache_page.c -- a page as esx.cache's binding stores it (see lcache_page.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "lcache_page.h"
#include "ljson.h"

/* ---- measuring and (shared mode) serialisation ----------------------------------------- */

static void sb_init(esx_sbuf *b, size_t limit)
{
    esx_buf_init(&b->out, limit);
    b->failed = b->cycle = b->nomem = 0;
}

int esx_sbuf_gc(lua_State *L)
{
    esx_buf_free(&((esx_sbuf *)luaL_checkudata(L, 1, ESX_SBUF_MT))->out);
    return 0;
}

/* Pushes a new, empty buffer owned by a userdata whose __gc frees its output: the walks that
 * fill it call Lua (LuaJIT's lua_checkstack, and lua_pushlstring after them, raise when out
 * of memory), and a raise must not leak what it holds.  Raises only Lua's memory error,
 * before anything is allocated. */
esx_sbuf *esx_sbuf_push(lua_State *L, size_t limit)
{
    esx_sbuf *b = lua_newuserdata(L, sizeof *b);
    sb_init(b, limit);
    luaL_setmetatable(L, ESX_SBUF_MT);
    return b;
}

/* Records a write's result: the first failure stops the walk. */
static void sb_result(esx_sbuf *b, int rc)
{
    if (rc != ESX_BUF_OK) {
        b->failed = 1;
        b->nomem = rc == ESX_BUF_NOMEM;
    }
}

static void sb_put(esx_sbuf *b, const void *p, size_t n)
{
    if (!b->failed)
        sb_result(b, esx_buf_append(&b->out, p, n));
}

static void sb_tag(esx_sbuf *b, char t)
{
    sb_put(b, &t, 1);
}

/* What esx_lpage_measure() returns for a page it cannot measure, or that is larger than its limit. */
/* Bytes of one key or value inside a table, tables aside (they are measured on their own):
 * a string its length plus STRING_BYTES; numbers, booleans and light userdata (cjson.null)
 * live in their slot.  Functions, full userdata and threads hold memory that cannot be
 * measured from here: ESX_LPAGE_UNMEASURED. */
static size_t scalar_bytes(lua_State *L, int idx)
{
    switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
        size_t len;
        lua_tolstring(L, idx, &len);
        return len + STRING_BYTES;
    }
    case LUA_TNUMBER:
    case LUA_TBOOLEAN:
    case LUA_TLIGHTUSERDATA:
    case LUA_TTABLE:
        return 0;
    default:
        return ESX_LPAGE_UNMEASURED;
    }
}

/* Measures the page at idx: each table reachable from it once (TABLE_BYTES plus SLOT_BYTES
 * per key), whatever its depth and however many times it is referenced -- shared and cyclic
 * tables included -- plus every string key and value where it occurs.  Iterative (a work list
 * and a seen set, both Lua tables), so its cost is linear in the distinct tables and slots,
 * and it stops as soon as the total passes limit.  Returns the bytes, or ESX_LPAGE_UNMEASURED when the
 * page holds a function, full userdata or thread, or is larger than limit.  Metatables are
 * not followed (shared by design; not counted).  Raises only when Lua is out of memory. */
size_t esx_lpage_measure(lua_State *L, int idx, size_t limit)
{
    idx = lua_absindex(L, idx);
    if (lua_type(L, idx) != LUA_TTABLE)
        return scalar_bytes(L, idx);
    luaL_checkstack(L, 8, "esx.cache: measuring a page");
    int top = lua_gettop(L);
    lua_newtable(L); /* top + 1: seen set */
    lua_newtable(L); /* top + 2: tables still to visit */
    int seen = top + 1, todo = top + 2;
    lua_Integer n = 0;
    size_t bytes = 0;
    lua_pushvalue(L, idx);
    lua_pushboolean(L, 1);
    lua_rawset(L, seen);
    lua_pushvalue(L, idx);
    lua_rawseti(L, todo, ++n);
    while (n > 0) {
        lua_rawgeti(L, todo, n); /* top + 3: the table */
        lua_pushnil(L);
        lua_rawseti(L, todo, n--);
        bytes += TABLE_BYTES;
        lua_pushnil(L);
        while (lua_next(L, top + 3) != 0) {
            bytes += SLOT_BYTES;
            for (int i = -2; i <= -1; i++) {
                size_t v = scalar_bytes(L, i);
                if (v == ESX_LPAGE_UNMEASURED || v > limit) {
                    lua_settop(L, top);
                    return ESX_LPAGE_UNMEASURED;
                }
                bytes += v;
                if (lua_type(L, i) == LUA_TTABLE) {
                    lua_pushvalue(L, i);
                    lua_rawget(L, seen);
                    int was = lua_toboolean(L, -1);
                    lua_pop(L, 1);
                    if (!was) {
                        lua_pushvalue(L, i);
                        lua_pushboolean(L, 1);
                        lua_rawset(L, seen);
                        lua_pushvalue(L, i);
                        lua_rawseti(L, todo, ++n);
                    }
                }
            }
            lua_pop(L, 1);
            if (bytes > limit) {
                lua_settop(L, top);
                return ESX_LPAGE_UNMEASURED;
            }
        }
        lua_pop(L, 1);
    }
    lua_settop(L, top);
    return bytes;
}

/* Serialises the value at idx into b (shared mode's hand-off).  Fails (b->failed) on
 * functions, threads, userdata other than the NULL light userdata (cjson.null) and
 * esx.empty_array (or cjson's), on tables nested deeper than MAX_DEPTH -- so a cycle fails --
 * and past the buffer's limit; it stops at the first failure, so its cost is bounded by that
 * limit.  A table referenced twice is written twice.  Metatables do not travel, but the
 * empty-array markers the JSON encoders honour (ljson.h) do: esx.empty_array (and cjson's) as
 * 'e', a table that is an array by its metatable (esx.array_mt, cjson.array_mt; an empty one
 * with cjson.empty_array_mt) as 'A', read back as esx.empty_array and a table with
 * esx.array_mt -- which both encoders write as the original. */
static void walk(lua_State *L, int idx, esx_sbuf *b, int depth, const esx_json_marks *m);

void esx_lpage_walk(lua_State *L, int idx, esx_sbuf *b, int depth)
{
    esx_json_marks marks;
    idx = lua_absindex(L, idx);
    if (!lua_checkstack(L, 2)) {
        b->failed = 1;
        return;
    }
    esx_json_marks_push(L, &marks);
    walk(L, idx, b, depth, &marks);
    lua_pop(L, 2);
}

static void walk(lua_State *L, int idx, esx_sbuf *b, int depth, const esx_json_marks *m)
{
    if (b->failed)
        return;
    idx = lua_absindex(L, idx);
    switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, idx, &len);
        uint32_t n = (uint32_t)len;
        if (len > UINT32_MAX) {
            b->failed = 1;
            return;
        }
        sb_tag(b, 's');
        sb_put(b, &n, 4);
        sb_put(b, s, len);
        return;
    }
    case LUA_TNUMBER:
        /* Lua 5.4: the subtype, so that 1.0 stays a float (and 1 an integer) on the other
         * side; LuaJIT has no subtype, and an integral double goes as 'i' to come back the
         * same double. */
#if ESX_LUA51
        if (esx_isinteger(L, idx)) {
#else
        if (lua_isinteger(L, idx)) {
#endif
            long long v = esx_tointeger(L, idx);
            sb_tag(b, 'i');
            sb_put(b, &v, 8);
        } else {
            double d = (double)lua_tonumber(L, idx);
            sb_tag(b, 'd');
            sb_put(b, &d, 8);
        }
        return;
    case LUA_TBOOLEAN:
        sb_tag(b, lua_toboolean(L, idx) ? 'T' : 'F');
        return;
    case LUA_TTABLE: {
        /* a key and a value, and a light userdata's marker test (2); after the members, the
         * table's marker test (3) */
        if (depth >= MAX_DEPTH || !lua_checkstack(L, 4)) {
            b->failed = 1;
            return;
        }
        uint32_t count = 0;
        size_t tag_at = b->out.len;
        sb_tag(b, 't');
        size_t count_at = b->out.len;
        sb_put(b, &count, 4);
        lua_pushnil(L);
        while (lua_next(L, idx) != 0) {
            walk(L, lua_gettop(L) - 1, b, depth + 1, m);
            walk(L, lua_gettop(L), b, depth + 1, m);
            count++;
            lua_pop(L, 1);
            if (b->failed) {
                lua_pop(L, 1);
                return;
            }
        }
        if (b->failed) /* the count itself did not fit: nothing at count_at to patch */
            return;
        memcpy(b->out.data + count_at, &count, 4);
        int kind = esx_json_table_kind(L, idx, m);
        if (kind == ESX_JSON_AS_ARRAY || kind == ESX_JSON_AS_CJSON_ARRAY ||
            (kind == ESX_JSON_AS_EMPTY_ARRAY && count == 0))
            b->out.data[tag_at] = 'A';
        return;
    }
    case LUA_TLIGHTUSERDATA:
        /* the NULL light userdata is cjson.null (and esx's JSON null): the only light
         * userdata that means the same in every process, with esx.empty_array (the address
         * differs, the meaning not: 'e' is read back as the reader's) */
        if (lua_touserdata(L, idx) == NULL) {
            sb_tag(b, 'n');
            return;
        }
        if (esx_json_is_empty_array(L, idx, m)) {
            sb_tag(b, 'e');
            return;
        }
        b->failed = 1;
        return;
    default: /* functions, full userdata, threads: not serialisable */
        b->failed = 1;
        return;
    }
}

/* Pushes the value serialised at *p (end e); returns 0, or -1 on malformed input. */
int esx_lpage_unwalk(lua_State *L, const char **p, const char *e, int depth)
{
    if (*p >= e || depth > MAX_DEPTH || !lua_checkstack(L, 4))
        return -1;
    char t = *(*p)++;
    switch (t) {
    case 's': {
        uint32_t n;
        if (e - *p < 4)
            return -1;
        memcpy(&n, *p, 4);
        *p += 4;
        if ((size_t)(e - *p) < n)
            return -1;
        lua_pushlstring(L, *p, n);
        *p += n;
        return 0;
    }
    case 'i': {
        long long v;
        if (e - *p < 8)
            return -1;
        memcpy(&v, *p, 8);
        *p += 8;
        esx_pushinteger(L, v);
        return 0;
    }
    case 'd': {
        double d;
        if (e - *p < 8)
            return -1;
        memcpy(&d, *p, 8);
        *p += 8;
        lua_pushnumber(L, (lua_Number)d);
        return 0;
    }
    case 'T':
    case 'F':
        lua_pushboolean(L, t == 'T');
        return 0;
    case 'n':
        lua_pushlightuserdata(L, NULL);
        return 0;
    case 'e':
        esx_json_push_empty_array(L);
        return 0;
    case 'A':
    case 't': {
        uint32_t n;
        if (e - *p < 4)
            return -1;
        memcpy(&n, *p, 4);
        *p += 4;
        if (n > (size_t)(e - *p))
            return -1; /* each pair takes at least two bytes */
        lua_createtable(L, 0, 0);
        for (uint32_t i = 0; i < n; i++) {
            if (esx_lpage_unwalk(L, p, e, depth + 1) != 0 || esx_lpage_unwalk(L, p, e, depth + 1) != 0)
                return -1;
            if (lua_isnil(L, -2) || (lua_type(L, -2) == LUA_TNUMBER &&
                                     lua_tonumber(L, -2) != lua_tonumber(L, -2)))
                return -1;
            lua_rawset(L, -3);
        }
        if (t == 'A') { /* an array by its metatable: esx.array_mt, which encodes the same */
            lua_getfield(L, LUA_REGISTRYINDEX, "esx.array_mt");
            if (lua_istable(L, -1))
                lua_setmetatable(L, -2);
            else
                lua_pop(L, 1);
        }
        return 0;
    }
    default:
        return -1;
    }
}

/* ---- JSON ------------------------------------------------------------------------------
 * A page's articles are encoded once, when the page is stored, into a blob the core keeps
 * with the page:  u32 n | u64 ids[n] | u32 off[n + 1] | fragments.  Fragment i is article
 * i as a JSON object without its closing brace and without any "read" key, so that
 * read_json() answers with memcpy and one membership test per article.
 * Encoding: strings by esx_json_write_str (json.h: bytes as they are, with ", \ and control
 * characters escaped); integers exactly; other finite numbers as core.json_encode writes them
 * (ljson.h); NaN, infinities, functions, userdata (e.g. cjson.null) and tables nested deeper
 * than MAX_DEPTH as null, but esx.empty_array (and cjson's) as []; a table whose keys are
 * exactly 1..n (n > 0) as an array, any other as an object (number keys as strings, other key
 * types skipped; {} when empty), but as json_encode writes a table carrying one of its array
 * markers: [] when empty, and an array with null in its holes when its keys are all positive
 * integers and not excessively sparse (the marker test is ljson.h's, shared with
 * json_encode). */

static void json_string(esx_sbuf *b, const char *s, size_t len)
{
    if (!b->failed)
        sb_result(b, esx_json_write_str(&b->out, s, len));
}

/* The text of the number at idx in num (40 bytes); its length, or 0 for NaN and infinities. */
static size_t number_text(lua_State *L, int idx, char *num)
{
    if (esx_isinteger(L, idx))
        return esx_format_i64(num, esx_tointeger(L, idx));
    return esx_json_number_text((double)lua_tonumber(L, idx), num);
}

static void json_number(lua_State *L, int idx, esx_sbuf *b)
{
    char num[40];
    size_t n = number_text(L, idx, num);
    if (n == 0)
        sb_put(b, "null", 4);
    else
        sb_put(b, num, n);
}

/* The tables being encoded, outermost first: path[d] is the table at depth d. */
typedef const void *json_path[MAX_DEPTH + 1];

static void json_value(lua_State *L, int idx, esx_sbuf *b, int depth, json_path path,
                       const esx_json_marks *m);

/* Encodes the table at idx; skip_read leaves out a "read" key; open leaves the object open
 * (no closing brace) and returns whether anything was written after the opening brace.
 * A table that contains itself (one of its ancestors in path) cannot be JSON: b fails with
 * b->cycle set.  Stops at the first failure, so its cost is bounded by the buffer's limit. */
static int json_table(lua_State *L, int idx, esx_sbuf *b, int depth, int skip_read, int open,
                      json_path path, const esx_json_marks *m)
{
    const void *self = lua_topointer(L, idx);
    for (int d = 0; d < depth; d++) {
        if (path[d] == self) {
            b->failed = b->cycle = 1;
            return 0;
        }
    }
    path[depth] = self;
    /* an array when its keys are exactly 1..n: every key a positive integer, the largest
     * one the number of keys (lua_rawlen alone is any border: {nil, 2, 3, x = 1} has 3 under
     * LuaJIT, and the table as many keys) */
    size_t n = 0, count = 0;
    int array = !open;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        count++;
        lua_pop(L, 1);
        if (array && esx_isinteger(L, -1) && esx_tointeger(L, -1) >= 1) {
            if ((size_t)esx_tointeger(L, -1) > n)
                n = (size_t)esx_tointeger(L, -1);
        } else {
            array = 0;
        }
    }
    if (count == 0) {
        /* an empty table that a marker says is an array (esx.array_mt, esx's decoder gives one
         * to every empty JSON array; cjson's array_mt and empty_array_mt): [], as json_encode
         * writes it */
        array = !open && esx_json_table_kind(L, idx, m) != ESX_JSON_AS_PLAIN;
    } else if (array && count != n) {
        /* keys all positive integers, with holes: an array (holes as null) when a marker says
         * it is one (esx.array_mt, cjson.array_mt), as json_encode writes it -- unless
         * excessively sparse (json_encode's rule: the largest key over twice the keys, and over
         * 10), which json_encode refuses and this encoder cannot: an object then */
        int kind = esx_json_table_kind(L, idx, m);
        array = (kind == ESX_JSON_AS_ARRAY || kind == ESX_JSON_AS_CJSON_ARRAY) &&
                !(n > count * 2 && n > 10);
    }
    if (array) {
        sb_put(b, "[", 1);
        for (size_t i = 1; i <= n; i++) {
            if (i > 1)
                sb_put(b, ",", 1);
            lua_rawgeti(L, idx, (int)i);
            json_value(L, -1, b, depth + 1, path, m);
            lua_pop(L, 1);
            if (b->failed)
                return 1;
        }
        sb_put(b, "]", 1);
        return 1;
    }
    sb_put(b, "{", 1);
    int first = 1;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        int kt = lua_type(L, -2);
        size_t klen = 0;
        const char *k = NULL;
        char num[40];
        if (kt == LUA_TSTRING) {
            k = lua_tolstring(L, -2, &klen);
            if (skip_read && klen == 4 && memcmp(k, "read", 4) == 0)
                k = NULL;
        } else if (kt == LUA_TNUMBER) {
            klen = number_text(L, -2, num);
            if (klen == 0) {
                memcpy(num, "null", 4);
                klen = 4;
            }
            k = num;
        }
        if (k != NULL) {
            if (!first)
                sb_put(b, ",", 1);
            first = 0;
            json_string(b, k, klen);
            sb_put(b, ":", 1);
            json_value(L, -1, b, depth + 1, path, m);
        }
        lua_pop(L, 1);
        if (b->failed) {
            lua_pop(L, 1);
            return !first;
        }
    }
    if (!open)
        sb_put(b, "}", 1);
    return !first;
}

static void json_value(lua_State *L, int idx, esx_sbuf *b, int depth, json_path path,
                       const esx_json_marks *m)
{
    idx = lua_absindex(L, idx);
    switch (lua_type(L, idx)) {
    case LUA_TSTRING: {
        size_t len;
        const char *s = lua_tolstring(L, idx, &len);
        json_string(b, s, len);
        return;
    }
    case LUA_TNUMBER:
        json_number(L, idx, b);
        return;
    case LUA_TBOOLEAN:
        if (lua_toboolean(L, idx))
            sb_put(b, "true", 4);
        else
            sb_put(b, "false", 5);
        return;
    case LUA_TTABLE:
        if (depth < MAX_DEPTH && lua_checkstack(L, 4)) {
            json_table(L, idx, b, depth, 0, 0, path, m);
            return;
        }
        sb_put(b, "null", 4);
        return;
    case LUA_TLIGHTUSERDATA: /* esx.empty_array (or cjson's) is [], any other null */
        if (esx_json_is_empty_array(L, idx, m))
            sb_put(b, "[]", 2);
        else
            sb_put(b, "null", 4);
        return;
    default:
        sb_put(b, "null", 4);
        return;
    }
}

/* Builds the blob of the page list at idx (an absolute index, already checked by
 * check_page).  Returns a malloc'ed blob, which the caller owns, and its length, or NULL
 * when out of memory or larger than limit (or the stack cannot hold the walk's eight slots). */
void *esx_lpage_blob(lua_State *L, int idx, size_t limit, size_t *blob_len)
{
    uint32_t n = (uint32_t)lua_rawlen(L, idx);
    size_t head = 4 + (size_t)n * 8 + ((size_t)n + 1) * 4;
    if (head > limit || !lua_checkstack(L, 8))
        return NULL;
    esx_sbuf *b = esx_sbuf_push(L, limit);
    esx_json_marks marks;
    esx_json_marks_push(L, &marks);
    sb_put(b, &n, 4);
    for (uint32_t i = 0; i < n; i++) { /* ids; offsets are filled in below */
        lua_rawgeti(L, idx, (int)i + 1);
        lua_pushliteral(L, "id");
        lua_rawget(L, -2);
        uint64_t id = (uint64_t)esx_tointeger(L, -1);
        lua_pop(L, 2);
        sb_put(b, &id, 8);
    }
    size_t offs_at = b->out.len;
    for (uint32_t i = 0; i <= n; i++) {
        uint32_t zero = 0;
        sb_put(b, &zero, 4);
    }
    size_t frags_at = b->out.len;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t off = (uint32_t)(b->out.len - frags_at);
        if (!b->failed)
            memcpy(b->out.data + offs_at + (size_t)i * 4, &off, 4);
        lua_rawgeti(L, idx, (int)i + 1);
        json_path path = {NULL};
        json_table(L, lua_gettop(L), b, 1, 1, 1, path, &marks);
        lua_pop(L, 1);
        if (b->failed)
            break;
    }
    uint32_t end = (uint32_t)(b->out.len - frags_at);
    if (!b->failed)
        memcpy(b->out.data + offs_at + (size_t)n * 4, &end, 4);
    void *blob = NULL;
    if (!b->failed && b->out.len <= UINT32_MAX)
        blob = esx_buf_take(&b->out, blob_len); /* the caller's from here */
    lua_pop(L, 3); /* the marks, and the esx_sbuf: its __gc frees what was not taken */
    return blob;
}

const char *esx_lpage_list_hole(lua_State *L, int idx, size_t n, char *msg, size_t msglen)
{
    long long first = 0; /* the smallest position past n that holds a value */
    long long before = 1; /* the smallest integer key below 1 (a list counted from 0) */
    idx = lua_absindex(L, idx);
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        lua_pop(L, 1); /* the value; the key stays for lua_next */
        if (esx_isinteger(L, -1)) {
            long long k = esx_tointeger(L, -1);
            if (k > (long long)n && (first == 0 || k < first))
                first = k;
            if (k < before)
                before = k;
        }
    }
    if (before < 1) { /* left out by the length and every loop from 1, as after a hole */
        snprintf(msg, msglen, "not a list: entry %lld is not nil (a list starts at 1)", before);
        return msg;
    }
    if (first == 0)
        return NULL;
    snprintf(msg, msglen, "not a list: entry %zu is nil, entry %lld is not", n + 1, first);
    return msg;
}

/* Checks that the value at idx is a list of article tables with integer ids (raw fields:
 * metatables are not consulted, as nothing else here follows them -- a page handed to
 * another worker travels without them, but for the empty-array markers); pushes nothing.  Returns NULL or a message naming
 * what is wrong (static, or written into msg). */
const char *esx_lpage_check(lua_State *L, int idx, char *msg, size_t msglen)
{
    if (!lua_istable(L, idx))
        return "load_page did not return a table";
    size_t n = lua_rawlen(L, idx);
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, (int)i);
        if (!lua_istable(L, -1)) {
            snprintf(msg, msglen, "article %zu is a %s, not a table", i, luaL_typename(L, -1));
            lua_pop(L, 1);
            return msg;
        }
        lua_pushliteral(L, "id"); /* raw, as esx_lpage_walk() and esx_lpage_measure() see it: not via __index */
        lua_rawget(L, -2);
        int ok = esx_isinteger(L, -1) && esx_tointeger(L, -1) >= 0 &&
                 esx_tointeger(L, -1) <= ESX_MAX_SAFE_INTEGER;
        lua_pop(L, 2);
        if (!ok) {
            snprintf(msg, msglen, "article %zu has no integer id in [0, 2^53)", i);
            return msg;
        }
    }
    return esx_lpage_list_hole(L, idx, n, msg, msglen);
}

void esx_lpage_json(lua_State *L, int idx, esx_sbuf *b)
{
    json_path path = {NULL};
    esx_json_marks marks;
    idx = lua_absindex(L, idx);
    esx_json_marks_push(L, &marks);
    json_value(L, idx, b, 0, path, &marks);
    lua_pop(L, 2);
}
