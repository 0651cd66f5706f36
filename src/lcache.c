/*
 * lcache.c -- the "esx.cache" userdata: a thin binding of the C core (cache.h).
 *
 * The userdata holds a pointer to the core and a registry reference to the Lua table of
 * cached pages (page_no -> list of articles); after every operation the pages the core
 * dropped are removed from that table, so the Lua data never outlives its budget.
 *
 * Page size, used for max_bytes, is measured deterministically when a page is stored, and
 * the page is rendered once to JSON then (lcache_page.c).
 *
 * Caller mistakes (wrong types) raise; lua/esx/cache.lua checks the public arguments first,
 * so these checks only guard against misuse of esx.core directly.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "lcache.h"
#include "lcache_page.h"
#include "lclass.h"
#include "lerror.h"

#define CACHE_MT "esx.cache"

typedef struct {
    esx_cache *core;
    int pages_ref;
    int shared;
    uint64_t max_pages;
    size_t max_bytes;
    char *scratch; /* read_json's output and flags, reused; grows to the largest page */
    size_t scratch_cap;
    int busy;          /* calls using the core across Lua allocations (see busy_end) */
    int close_pending; /* closed meanwhile: busy_end frees the core */
    int json_busy;     /* read_json is answering from scratch (see l_read_json) */
} lcache;

static lcache *check_open(lua_State *L)
{
    lcache *lc = luaL_checkudata(L, 1, CACHE_MT);
    if (lc->core == NULL || lc->close_pending)
        luaL_error(L, "esx.cache: the cache is closed");
    return lc;
}

static void release(lua_State *L, lcache *lc);

/* read_flags, read_json, poll, page_put, readers_put and apply use the core (read_json holds
 * a pointer into it) between
 * Lua allocations, which may run finalizers: one that closes this cache only asks while they
 * are busy (a count: a finalizer may call them too), and the core is freed here, when the
 * last one is done.  They run protected (busy_call), so that one that raises midway (out of
 * memory) still ends its busy span: a count left set made every later close() wait for the
 * userdata's __gc, and read_json answer in Lua for ever. */
static void busy_end(lua_State *L, lcache *lc)
{
    if (--lc->busy == 0 && lc->close_pending) {
        lc->close_pending = 0;
        release(L, lc);
    }
}

static uint64_t check_id(lua_State *L, int i)
{
    if (!esx_isinteger(L, i))
        luaL_argerror(L, i, "integer expected");
    long long v = esx_tointeger(L, i);
    if (v < 0 || v > ESX_MAX_SAFE_INTEGER)
        luaL_argerror(L, i, "must be an integer in [0, 2^53)");
    return (uint64_t)v;
}

/* Removes from the pages table the pages the core dropped. */
static void drain(lua_State *L, lcache *lc)
{
    uint64_t pages[64];
    size_t n;
    int got_table = 0;
    while (lc->core != NULL && (n = esx_cache_removed_pages(lc->core, pages, 64)) > 0) {
        if (!got_table) {
            lua_rawgeti(L, LUA_REGISTRYINDEX, lc->pages_ref);
            got_table = 1;
        }
        for (size_t i = 0; i < n; i++) {
            lua_pushnil(L);
            lua_rawseti(L, -2, (int)pages[i]);
        }
    }
    if (got_table)
        lua_pop(L, 1);
}

/* ---- methods ---------------------------------------------------------------------------- */

/* ud:sync(now) -- applies other processes' changes. */
static int l_sync(lua_State *L)
{
    lcache *lc = check_open(L);
    double now = luaL_checknumber(L, 2);
    esx_cache_sync(lc->core, now);
    drain(L, lc);
    return 0;
}

/* ud:seq() -> the change sequence to record before a load. */
static int l_seq(lua_State *L)
{
    lcache *lc = check_open(L);
    esx_pushinteger(L, (long long)esx_cache_seq(lc->core));
    return 1;
}

/* ud:changed(kind, key, start_seq) -> whether key was invalidated since start_seq. */
static int l_changed(lua_State *L)
{
    lcache *lc = check_open(L);
    int kind = (int)luaL_checkinteger(L, 2);
    uint64_t key = check_id(L, 3);
    uint64_t start_seq = (uint64_t)esx_checkcount(L, 4);
    lua_pushboolean(L, esx_cache_changed(lc->core, kind, key, start_seq));
    return 1;
}

/* ud:page_get(page_no, now [, counted]) -> page list, or nil on a miss.  With counted (the
 * caller already counted this lookup), neither a hit nor a miss is counted. */
static int l_page_get(lua_State *L)
{
    lcache *lc = check_open(L);
    uint64_t page_no = check_id(L, 2);
    double now = luaL_checknumber(L, 3);
    int hit = esx_cache_page_get(lc->core, page_no, now, !lua_toboolean(L, 4));
    drain(L, lc);
    if (!hit)
        return 0;
    lua_rawgeti(L, LUA_REGISTRYINDEX, lc->pages_ref);
    lua_rawgeti(L, -1, (int)page_no);
    return 1;
}

/* Stores a validated page list at idx: returns 1 if cached. */
static int put_page(lua_State *L, lcache *lc, uint64_t page_no, int idx, double now,
                    double age, uint64_t start_seq)
{
    if (page_no < 1 || page_no > lc->max_pages)
        return 0;
    size_t bytes = esx_lpage_measure(L, idx, lc->max_bytes), blob_len = 0;
    if (bytes == ESX_LPAGE_UNMEASURED) /* larger than max_bytes, or holds what cannot be measured */
        return 0;
    void *blob = esx_lpage_blob(L, idx, lc->max_bytes, &blob_len);
    int rc = esx_cache_page_put(lc->core, page_no, bytes, now, age, start_seq, blob, blob ? blob_len : 0);
    if (rc != 1)
        free(blob);
    drain(L, lc);
    if (rc == 1) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, lc->pages_ref);
        lua_pushvalue(L, idx);
        lua_rawseti(L, -2, (int)page_no);
        lua_pop(L, 1);
    }
    return rc == 1;
}

/* ud:page_put(page_no, list, now, start_seq [, ticket]) -> cached, or nil, message when the
 * list is not a page.  With a ticket (shared mode) the lock is released and the page
 * published to waiting processes. */
static int page_put_core(lua_State *L, lcache *lc)
{
    uint64_t page_no = check_id(L, 2);
    double now = luaL_checknumber(L, 4);
    uint64_t start_seq = (uint64_t)esx_checkcount(L, 5);
    int has_ticket = !lua_isnoneornil(L, 6);
    uint64_t ticket = has_ticket ? (uint64_t)esx_checkcount(L, 6) : 0;
    char msg[128];
    const char *bad = esx_lpage_check(L, 3, msg, sizeof msg);
    if (has_ticket) {
        esx_sbuf *b = esx_sbuf_push(L, ESX_CACHE_SLOT_BYTES);
        if (bad == NULL)
            esx_lpage_walk(L, 3, b, 0);
        else
            b->failed = 1;
        int ok = bad == NULL && !b->failed;
        /* a page that cannot be handed off (too large for the slot, unserialisable): its
         * waiters load by themselves; bad data is a failed load, which one of them retries */
        esx_cache_unlock(lc->core, ESX_CACHE_PAGE, page_no, ticket, ok ? b->out.data : NULL,
                         ok ? b->out.len : 0, start_seq, now, bad == NULL);
        esx_buf_free(&b->out);
        lua_pop(L, 1);
    }
    if (bad != NULL) {
        lua_pushnil(L);
        lua_pushstring(L, bad);
        return 2;
    }
    lua_pushboolean(L, put_page(L, lc, page_no, 3, now, 0, start_seq));
    return 1;
}

/* page_put and readers_put's arguments, checked before busy_call (a raise there names the
 * method; the core functions read them again, valid by then). */
static void check_put_args(lua_State *L)
{
    check_id(L, 2);
    luaL_checknumber(L, 4);
    esx_checkcount(L, 5);
    if (!lua_isnoneornil(L, 6))
        esx_checkcount(L, 6);
}

/* A call that uses the core between Lua allocations (measuring and encoding the page, the
 * esx_sbuf, a batch's userdata), whose finalizers may close this cache: busy while it runs.
 * Its arguments are checked before; fn runs under lua_pcall, so that a raise inside (Lua out
 * of memory) ends the busy span too, and is raised again after it. */
typedef struct {
    int (*fn)(lua_State *, lcache *);
} busy_fn;

static int busy_tramp(lua_State *L)
{
    int top = lua_gettop(L);
    busy_fn *f = lua_touserdata(L, top - 1);
    lcache *lc = lua_touserdata(L, top);
    lua_settop(L, top - 2);
    return f->fn(L, lc);
}

static char busy_tramp_key; /* busy_tramp in the registry: LuaJIT would allocate a closure
                             * for it on every call */

static int busy_call(lua_State *L, busy_fn *f)
{
    lcache *lc = check_open(L);
    int nargs = lua_gettop(L);
    lua_pushlightuserdata(L, &busy_tramp_key);
    lua_rawget(L, LUA_REGISTRYINDEX);
    lua_insert(L, 1);
    lua_pushlightuserdata(L, f);
    lua_pushlightuserdata(L, lc);
    lc->busy++;
    int rc = lua_pcall(L, nargs + 2, LUA_MULTRET, 0);
    busy_end(L, lc);
    if (rc != 0)
        return lua_error(L);
    return lua_gettop(L);
}

static busy_fn page_put_fn = {page_put_core};

static int l_page_put(lua_State *L)
{
    check_open(L);
    check_put_args(L);
    return busy_call(L, &page_put_fn);
}

/* Builds a reader set from the list at idx.  Returns the set (owned by the caller), or NULL:
 * with a message in msg when the list is bad data, or with *oom set when memory ran out (the
 * list is checked to its end all the same: out of memory, good data is only not cached). */
static esx_rset *build_set(lua_State *L, int idx, char *msg, size_t msglen, int *oom)
{
    *oom = 0;
    if (!lua_istable(L, idx)) {
        snprintf(msg, msglen, "load_readers did not return a table");
        return NULL;
    }
    size_t n = lua_rawlen(L, idx);
    esx_rset *s = esx_rset_new();
    uint32_t chunk[1024];
    size_t k = 0;
    for (size_t i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, (int)i);
        int ok = esx_isinteger(L, -1);
        long long v = ok ? esx_tointeger(L, -1) : -1;
        lua_pop(L, 1);
        if (!ok || v < 0 || v > ESX_MAX_SAFE_INTEGER) {
            snprintf(msg, msglen, "reader %zu is not an integer in [0, 2^53)", i);
            esx_rset_free(s);
            return NULL;
        }
        if (s == NULL) /* out of memory: only checked from here */
            continue;
        int rc = 0;
        if ((uint64_t)v <= UINT32_MAX) { /* the dense 32-bit fast path, in chunks */
            chunk[k++] = (uint32_t)v;
            if (k == sizeof chunk / sizeof chunk[0]) {
                rc = esx_rset_add_many32(s, chunk, k);
                k = 0;
            }
        } else {
            rc = esx_rset_add(s, (uint64_t)v) < 0;
        }
        if (rc != 0) {
            esx_rset_free(s);
            s = NULL;
        }
    }
    if (s != NULL && esx_rset_add_many32(s, chunk, k) != 0) {
        esx_rset_free(s);
        s = NULL;
    }
    if (esx_lpage_list_hole(L, idx, n, msg, msglen) != NULL) {
        esx_rset_free(s);
        return NULL;
    }
    *oom = s == NULL;
    return s;
}

/* ud:readers_put(article, list, now, start_seq [, ticket]) -> cached, or nil, message when
 * the list is not a reader set.  Out of memory it is not cached (false), as when the core
 * cannot insert it: the caller answers from the list, which is good data. */
static int readers_put_core(lua_State *L, lcache *lc)
{
    uint64_t article = check_id(L, 2);
    double now = luaL_checknumber(L, 4);
    uint64_t start_seq = (uint64_t)esx_checkcount(L, 5);
    int has_ticket = !lua_isnoneornil(L, 6);
    uint64_t ticket = has_ticket ? (uint64_t)esx_checkcount(L, 6) : 0;
    char msg[128];
    int oom;
    esx_rset *s = build_set(L, 3, msg, sizeof msg, &oom);
    uint64_t upto = start_seq;
    int rc = s == NULL ? 0 : esx_cache_readers_put(lc->core, article, s, now, 0, start_seq, &upto);
    if (has_ticket) {
        /* Published only when cached here: a set that this process cannot cache (larger
         * than max_bytes, invalidated since the load began, or no memory) no other process
         * can either, and every miss of it would copy it out of the slot for nothing. */
        char *buf = NULL;
        size_t len = 0;
        if (rc == 1) {
            size_t need = esx_rset_serialized_size(s);
            if (need <= ESX_CACHE_SLOT_BYTES && (buf = malloc(need)) != NULL)
                len = esx_rset_serialize(s, buf, need);
        }
        /* published with the sequence the set was brought up to (its marks replayed), not
         * the load's start: a taker replays only what came after, and the set stays
         * takeable until the log has moved a whole ring past that, not past the start */
        esx_cache_unlock(lc->core, ESX_CACHE_READERS, article, ticket, len ? buf : NULL, len,
                         rc == 1 ? upto : start_seq, now, s != NULL || oom); /* (else bad data: a failed load) */
        free(buf);
    }
    if (s == NULL && !oom) {
        lua_pushnil(L);
        lua_pushstring(L, msg);
        return 2;
    }
    if (rc != 1)
        esx_rset_free(s);
    drain(L, lc);
    lua_pushboolean(L, rc == 1);
    return 1;
}

static busy_fn readers_put_fn = {readers_put_core};

static int l_readers_put(lua_State *L)
{
    check_open(L);
    check_put_args(L);
    return busy_call(L, &readers_put_fn);
}

/* ud:has_read(article, user, now [, peek]) -> true|false, or nil when the set is not cached.
 * With peek, the lookup counts neither a hit nor a miss. */
static int l_has_read(lua_State *L)
{
    lcache *lc = check_open(L);
    uint64_t article = check_id(L, 2);
    uint64_t user = check_id(L, 3);
    double now = luaL_checknumber(L, 4);
    const esx_rset *s = lua_toboolean(L, 5) ? esx_cache_readers_peek(lc->core, article, now)
                                            : esx_cache_readers_get(lc->core, article, now);
    drain(L, lc);
    if (s == NULL)
        return 0;
    lua_pushboolean(L, esx_rset_contains(s, user));
    return 1;
}

/* ud:read_flags(list, user, now [, counted]) -> copies, missing
 * copies: a copy of every article of list with read = true|false for user; missing: nil, or
 * the list of positions whose reader set is not cached (their read is false for now).  With
 * counted (the caller already counted these lookups), the lookups count neither hits nor
 * misses and leave the LRU order alone. */
static int read_flags_core(lua_State *L, lcache *lc)
{
    uint64_t user = check_id(L, 3);
    double now = luaL_checknumber(L, 4);
    int count = !lua_toboolean(L, 5);
    int n = (int)lua_rawlen(L, 2);
    lua_settop(L, 4);
    lua_createtable(L, n, 0); /* 5: copies */
    lua_pushnil(L);           /* 6: missing positions, created on the first miss */
    int nmissing = 0;
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 2, i);     /* 7: article */
        lua_createtable(L, 0, 8); /* 8: copy */
        if (lua_istable(L, 7)) {
            lua_pushnil(L);
            while (lua_next(L, 7) != 0) {
                lua_pushvalue(L, -2);
                lua_insert(L, -2);
                lua_rawset(L, 8);
            }
            lua_pushliteral(L, "id");
            lua_rawget(L, 7);
        } else {
            lua_pushnil(L);
        }
        const esx_rset *s = NULL;
        if (esx_isinteger(L, -1)) {
            long long id = esx_tointeger(L, -1);
            if (id >= 0 && id <= ESX_MAX_SAFE_INTEGER)
                s = count ? esx_cache_readers_get(lc->core, (uint64_t)id, now)
                          : esx_cache_readers_peek(lc->core, (uint64_t)id, now);
        }
        lua_pop(L, 1);
        int read = 0;
        if (s != NULL) {
            read = esx_rset_contains(s, user);
        } else {
            if (nmissing == 0) {
                lua_createtable(L, 4, 0);
                lua_replace(L, 6);
            }
            lua_pushinteger(L, i);
            lua_rawseti(L, 6, ++nmissing);
        }
        lua_pushboolean(L, read);
        lua_setfield(L, 8, "read");
        lua_rawseti(L, 5, i); /* pops the copy */
        lua_pop(L, 1);        /* the article */
    }
    drain(L, lc);
    return 2;
}

static busy_fn read_flags_fn = {read_flags_core};

static int l_read_flags(lua_State *L)
{
    check_open(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    check_id(L, 3);
    luaL_checknumber(L, 4);
    return busy_call(L, &read_flags_fn);
}

/* ud:read_json(page_no, user, now [, page_counted [, readers_counted]]) -> json
 *   | false            the page is not cached (a miss is counted)
 *   | nil, missing     the ids of the page's articles whose reader set is not cached
 *   | nil              the page is cached without its JSON rendering (out of memory then,
 *                      or the text did not fit in max_bytes with the page), or there is no
 *                      memory for the answer, or a finalizer calls it while it answers
 * A retry after loads passes page_counted / readers_counted so that lookups already counted
 * count neither hits nor misses again.
 * json is the page's articles as a JSON array, each object with "read":true|false added. */
static int read_json_core(lua_State *L, lcache *lc)
{
    uint64_t page_no = check_id(L, 2);
    uint64_t user = check_id(L, 3);
    double now = luaL_checknumber(L, 4);
    int count_page = !lua_toboolean(L, 5), count = !lua_toboolean(L, 6);
    size_t len;
    const char *blob = esx_cache_page_blob(lc->core, page_no, now, &len, count_page);
    drain(L, lc);
    if (blob == NULL) {
        if (len == 0)
            lua_pushboolean(L, 0);
        else
            lua_pushnil(L);
        return 1;
    }
    uint32_t n;
    memcpy(&n, blob, 4);
    const char *ids = blob + 4;
    const char *offs = ids + (size_t)n * 8;
    const char *frags = offs + ((size_t)n + 1) * 4;
    uint32_t total;
    memcpy(&total, offs + (size_t)n * 4, 4);
    size_t need = (size_t)n * 16 + 2 + total; /* flags, [ ], fragments, commas, reads */
    if (need > lc->scratch_cap) {
        char *ns = realloc(lc->scratch, need);
        if (ns == NULL) {
            lua_pushnil(L); /* as a page without its text: the caller renders it itself */
            return 1;
        }
        lc->scratch = ns;
        lc->scratch_cap = need;
    }
    /* No Lua allocation from here until the blob is no longer read: an allocation may run
     * finalizers, and one that changes this cache (invalidate_pages, a page_put that evicts)
     * frees the blob.  Missing ids are copied into scratch (8 bytes each, within need). */
    unsigned char *flags = (unsigned char *)lc->scratch;
    char *miss = lc->scratch + n;
    size_t nmissing = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id;
        memcpy(&id, ids + (size_t)i * 8, 8);
        const esx_rset *set = count ? esx_cache_readers_get(lc->core, id, now)
                                    : esx_cache_readers_peek(lc->core, id, now);
        if (set == NULL) {
            memcpy(miss + nmissing++ * 8, &id, 8);
            continue;
        }
        flags[i] = (unsigned char)esx_rset_contains(set, user);
    }
    drain(L, lc);
    lc->json_busy = 1; /* Lua allocates below: a nested read_json must leave scratch alone */
    if (nmissing > 0) {
        lua_pushnil(L);
        lua_createtable(L, (int)nmissing, 0);
        for (size_t k = 0; k < nmissing; k++) {
            uint64_t id;
            memcpy(&id, miss + k * 8, 8);
            esx_pushinteger(L, (long long)id);
            lua_rawseti(L, -2, (int)k + 1);
        }
        lc->json_busy = 0;
        return 2;
    }
    char *out = lc->scratch + n, *p = out;
    *p++ = '[';
    for (uint32_t i = 0; i < n; i++) {
        uint32_t a, b;
        memcpy(&a, offs + (size_t)i * 4, 4);
        memcpy(&b, offs + (size_t)i * 4 + 4, 4);
        if (i > 0)
            *p++ = ',';
        memcpy(p, frags + a, b - a);
        p += b - a;
        if (b - a > 1)
            *p++ = ',';
        if (flags[i]) {
            memcpy(p, "\"read\":true}", 12);
            p += 12;
        } else {
            memcpy(p, "\"read\":false}", 13);
            p += 13;
        }
    }
    *p++ = ']';
    lua_pushlstring(L, out, (size_t)(p - out)); /* (LuaJIT may collect before it copies) */
    lc->json_busy = 0;
    return 1;
}

static busy_fn read_json_fn = {read_json_core};

static int l_read_json(lua_State *L)
{
    lcache *lc = check_open(L);
    check_id(L, 2);
    check_id(L, 3);
    luaL_checknumber(L, 4);
    if (lc->json_busy && lc->busy > 0) {
        lua_pushnil(L); /* called by a finalizer while read_json answers: render in Lua */
        return 1;
    }
    lc->json_busy = 0; /* (left set by a call that raised when out of memory) */
    return busy_call(L, &read_json_fn);
}

/* core.cache_json(value) -> JSON text of value (the encoding of read_json), or nil, message
 * when value contains a cycle (a table inside itself) or its text would pass 1 GiB, or nil,
 * "out of memory", "nomem" when it cannot be allocated (esx's failure, not the value's). */
static int l_json(lua_State *L)
{
    luaL_checkany(L, 1);
    lua_settop(L, 1);
    esx_sbuf *b = esx_sbuf_push(L, (size_t)1 << 30);
    esx_lpage_json(L, 1, b);
    if (b->failed) {
        esx_buf_free(&b->out);
        lua_pushnil(L);
        if (b->nomem) {
            lua_pushliteral(L, "out of memory");
            lua_pushliteral(L, "nomem");
            return 3;
        }
        lua_pushstring(L, b->cycle ? "a table contains itself (a cycle cannot be JSON)"
                                   : "the JSON text is larger than 1 GiB");
        return 2;
    }
    lua_pushlstring(L, b->out.data ? b->out.data : "", b->out.len);
    esx_buf_free(&b->out);
    return 1;
}

/* ud:lock(kind, key, timeout_ms, now) -> "acquired"|"busy"|"none", ticket */
static int l_lock(lua_State *L)
{
    lcache *lc = check_open(L);
    int kind = (int)luaL_checkinteger(L, 2);
    uint64_t key = check_id(L, 3);
    double timeout = luaL_checknumber(L, 4);
    double now = luaL_checknumber(L, 5);
    uint64_t ticket = 0;
    int rc = esx_cache_lock(lc->core, kind, key, timeout, now, &ticket);
    lua_pushstring(L, rc == ESX_LOCK_ACQUIRED ? "acquired" : rc == ESX_LOCK_BUSY ? "busy" : "none");
    esx_pushinteger(L, (long long)ticket);
    return 2;
}

/* ud:slot_home(kind, key) -> the first shared lock slot the key may take (for tests). */
static int l_slot_home(lua_State *L)
{
    lcache *lc = check_open(L);
    int kind = (int)luaL_checkinteger(L, 2);
    uint64_t key = check_id(L, 3);
    esx_pushinteger(L, (long long)esx_cache_slot_home(lc->core, kind, key));
    return 1;
}

/* ud:unlock(kind, key, ticket) -- releases without publishing (the load failed). */
static int l_unlock(lua_State *L)
{
    lcache *lc = check_open(L);
    int kind = (int)luaL_checkinteger(L, 2);
    uint64_t key = check_id(L, 3);
    uint64_t ticket = (uint64_t)esx_checkcount(L, 4);
    esx_cache_unlock(lc->core, kind, key, ticket, NULL, 0, 0, 0, 0);
    return 0;
}

/* ud:poll(kind, key, ticket, now) -> "busy" | "gone" | "alone" | "done", value
 * "alone": the holder loaded a result it could not hand off: load without the lock.
 * On "done" the published result is installed locally: value is the page list (pages) or
 * whether the set could be cached (readers) -- or, for a set that answers this waiter but
 * cannot be stored (it expired while the waiter waited), its ids as a list, the marks logged
 * since its load replayed.  "gone": the holder failed, died or was
 * overtaken by an invalidation, or its result cannot be taken here -- then it is withdrawn
 * from the slot, so that the next lock is acquired rather than offered it again. */
static int poll_core(lua_State *L, lcache *lc);

static busy_fn poll_fn = {poll_core};

static int l_poll(lua_State *L)
{
    check_open(L); /* busy: unwalk builds the page's tables between the core's calls */
    luaL_checkinteger(L, 2);
    check_id(L, 3);
    esx_checkcount(L, 4);
    luaL_checknumber(L, 5);
    return busy_call(L, &poll_fn);
}

static int poll_core(lua_State *L, lcache *lc)
{
    int kind = (int)luaL_checkinteger(L, 2);
    uint64_t key = check_id(L, 3);
    uint64_t ticket = (uint64_t)esx_checkcount(L, 4);
    double now = luaL_checknumber(L, 5);
    /* the result's copy is held by a box: rebuilding the page allocates (and may raise) */
    void **box = esx_lbox_push(L);
    size_t len = 0;
    uint64_t start_seq = 0;
    double age = 0;
    int rc = esx_cache_lock_poll(lc->core, kind, key, ticket, now, box, &len, &start_seq, &age);
    void *data = *box;
    /* The TTL runs from when the result was loaded (age ms ago); everything else -- the
     * changes other processes logged meanwhile, which the put applies first -- is at now:
     * applied at now - age, a mark of a set that had expired grew it instead of dropping it. */
    if (rc == ESX_LOCK_BUSY || rc == ESX_LOCK_ALONE) {
        lua_pushstring(L, rc == ESX_LOCK_BUSY ? "busy" : "alone");
        return 1;
    }
    if (rc != ESX_LOCK_DONE) {
        lua_pushliteral(L, "gone");
        return 1;
    }
    if (kind == ESX_CACHE_PAGE) {
        const char *p = data;
        int top = lua_gettop(L);
        char msg[128];
        int bad = esx_lpage_unwalk(L, &p, p + len, 0) != 0 || p != (const char *)data + len ||
                  !lua_istable(L, -1) || esx_lpage_check(L, -1, msg, sizeof msg) != NULL;
        free(data);
        *box = NULL;
        if (bad) { /* withdrawn, or every later lock would offer it again: a busy loop */
            lua_settop(L, top);
            esx_cache_lock_discard(lc->core, kind, key, ticket);
            lua_pushliteral(L, "gone");
            return 1;
        }
        put_page(L, lc, key, lua_gettop(L), now, age, start_seq);
        lua_pushliteral(L, "done");
        lua_insert(L, -2);
        return 2;
    }
    esx_rset *s = esx_rset_deserialize(data, len);
    free(data);
    *box = NULL;
    if (s == NULL) { /* malformed, or out of memory: withdrawn, as a page above */
        esx_cache_lock_discard(lc->core, kind, key, ticket);
        lua_pushliteral(L, "gone");
        return 1;
    }
    int put = esx_cache_readers_put(lc->core, key, s, now, age, start_seq, NULL);
    if (put == 0 && esx_cache_readers_catch_up(lc->core, key, s, now, start_seq) == 0) {
        /* Not stored (it expired while this waiter waited), but up to date and not
         * invalidated: the waiter answers from it, as from a page hand-off, rather than
         * loading it again -- its ids as a list, as load_readers would give them.  (The ids
         * are kept in the box while the list is built: Lua may raise out of memory.) */
        uint64_t n = esx_rset_cardinality(s);
        uint64_t *ids = n <= (uint64_t)INT_MAX ? malloc(n ? n * sizeof *ids : 1) : NULL;
        if (ids != NULL) {
            esx_rset_ids(s, ids);
            esx_rset_free(s);
            *box = ids;
            drain(L, lc);
            lua_pushliteral(L, "done");
            lua_createtable(L, (int)n, 0);
            for (uint64_t i = 0; i < n; i++) {
                esx_pushinteger(L, (long long)ids[i]);
                lua_rawseti(L, -2, (int)i + 1);
            }
            free(ids);
            *box = NULL;
            return 2;
        }
    }
    if (put != 1)
        esx_rset_free(s);
    drain(L, lc);
    lua_pushliteral(L, "done");
    lua_pushboolean(L, put == 1);
    return 2;
}

/* ud:apply({op1, a1, b1, op2, a2, b2, ...}, now [, since]) -- logs and applies a batch of
 * changes (a mark of a set expired at now drops it).
 * since (a transaction's): op number -> the sequence at which that mark was recorded; a mark
 * whose article was invalidated after it is applied as an invalidation, and its op in the
 * table is rewritten so (esx_cache_apply). */
static void check_batch(lua_State *L);

static int apply_core(lua_State *L, lcache *lc)
{
    luaL_checktype(L, 2, LUA_TTABLE);
    double now = luaL_checknumber(L, 3);
    int has_since = lua_istable(L, 4);
    size_t n = lua_rawlen(L, 2) / 3;
    esx_cache_op one[8];
    esx_cache_op *ops = one;
    if (n > 8) {
        ops = lua_newuserdata(L, n * sizeof *ops); /* raises on out of memory */
        check_batch(L); /* again: a finalizer run by that allocation may have changed it */
    }
    for (size_t i = 0; i < n; i++) {
        lua_rawgeti(L, 2, (int)(3 * i + 1));
        lua_rawgeti(L, 2, (int)(3 * i + 2));
        lua_rawgeti(L, 2, (int)(3 * i + 3));
        ops[i].op = (uint32_t)esx_tointeger(L, -3); /* (checked by check_batch) */
        ops[i].a = (uint64_t)esx_tointeger(L, -2);
        ops[i].b = (uint64_t)esx_tointeger(L, -1);
        lua_pop(L, 3);
        ops[i].deferred = 0;
        ops[i].since = 0;
        if (has_since) {
            lua_rawgeti(L, 4, (int)i + 1);
            if (lua_type(L, -1) == LUA_TNUMBER) {
                ops[i].deferred = 1;
                ops[i].since = (uint64_t)esx_tointeger(L, -1);
            }
            lua_pop(L, 1);
        }
    }
    esx_cache_apply(lc->core, ops, n, now);
    for (size_t i = 0; i < n; i++) {
        if (ops[i].op == ESX_CACHE_OP_INV_ARTICLE && ops[i].deferred) {
            lua_pushinteger(L, ESX_CACHE_OP_INV_ARTICLE);
            lua_rawseti(L, 2, (int)(3 * i + 1)); /* an existing slot: no allocation */
        }
    }
    drain(L, lc);
    return 0;
}

static busy_fn apply_fn = {apply_core};

/* Whether the value at the top of the stack is an integer in [lo, hi]. */
static int top_in(lua_State *L, long long lo, long long hi)
{
    if (!esx_isinteger(L, -1))
        return 0;
    long long v = esx_tointeger(L, -1);
    return v >= lo && v <= hi;
}

/* apply's batch and since, checked before busy_call (a raise there names the method): every
 * op one of the three, every id and sequence an integer in [0, 2^53).  Cast unchecked, a
 * NaN, a negative, a fraction or a number past 2^64 was undefined behaviour (only
 * lua/esx/cache.lua checked them, and esx.core is reachable from Lua directly). */
static void check_batch(lua_State *L)
{
    size_t len = lua_rawlen(L, 2);
    if (len % 3 != 0)
        luaL_argerror(L, 2, "a batch of {op, a, b} triples expected");
    int has_since = lua_istable(L, 4);
    for (size_t i = 0; i < len / 3; i++) {
        for (int k = 0; k < 3; k++) {
            lua_rawgeti(L, 2, (int)(3 * i) + k + 1);
            int ok = k == 0 ? top_in(L, ESX_CACHE_OP_MARK, ESX_CACHE_OP_INV_PAGES)
                            : top_in(L, 0, ESX_MAX_SAFE_INTEGER);
            lua_pop(L, 1);
            if (!ok)
                luaL_argerror(L, 2, lua_pushfstring(L, "entry %d must be %s", (int)(3 * i) + k + 1,
                                                    k == 0 ? "an op (1, 2 or 3)"
                                                           : "an integer in [0, 2^53)"));
        }
        if (has_since) {
            lua_rawgeti(L, 4, (int)i + 1);
            int ok = lua_type(L, -1) != LUA_TNUMBER || top_in(L, 0, ESX_MAX_SAFE_INTEGER);
            lua_pop(L, 1);
            if (!ok)
                luaL_argerror(L, 4, lua_pushfstring(L, "entry %d must be a sequence in [0, 2^53)",
                                                    (int)i + 1));
        }
    }
}

static int l_apply(lua_State *L)
{
    check_open(L);
    luaL_checktype(L, 2, LUA_TTABLE);
    luaL_checknumber(L, 3);
    check_batch(L);
    return busy_call(L, &apply_fn);
}

static void set_counter(lua_State *L, const char *name, uint64_t v)
{
    esx_pushinteger(L, (long long)v);
    lua_setfield(L, -2, name);
}

static void push_tier(lua_State *L, const esx_cache_tier_stats *t)
{
    lua_createtable(L, 0, 8);
    set_counter(L, "hits", t->hits);
    set_counter(L, "misses", t->misses);
    set_counter(L, "entries", t->entries);
    set_counter(L, "bytes", t->bytes);
    set_counter(L, "evictions", t->evictions);
    set_counter(L, "expirations", t->expirations);
}

/* ud:stats() -> {pages = {...}, readers = {...}, bytes, evictions, seq, applied, resets} */
static int l_stats(lua_State *L)
{
    lcache *lc = check_open(L);
    esx_cache_stats st;
    esx_cache_get_stats(lc->core, &st);
    lua_createtable(L, 0, 8);
    push_tier(L, &st.pages);
    lua_setfield(L, -2, "pages");
    push_tier(L, &st.readers);
    lua_setfield(L, -2, "readers");
    set_counter(L, "bytes", st.bytes);
    set_counter(L, "evictions", st.evictions);
    set_counter(L, "seq", st.seq);
    set_counter(L, "applied", st.applied);
    set_counter(L, "resets", st.resets);
    set_counter(L, "log_bytes", st.log_bytes);
    return 1;
}

static void release(lua_State *L, lcache *lc)
{
    if (lc->core != NULL) {
        esx_cache_free(lc->core);
        lc->core = NULL;
    }
    if (lc->pages_ref != LUA_NOREF) {
        luaL_unref(L, LUA_REGISTRYINDEX, lc->pages_ref);
        lc->pages_ref = LUA_NOREF;
    }
    free(lc->scratch);
    lc->scratch = NULL;
    lc->scratch_cap = 0;
}

/* ud:close() -- frees the core now; idempotent. */
static int l_close(lua_State *L)
{
    lcache *lc = luaL_checkudata(L, 1, CACHE_MT);
    if (lc->busy)
        lc->close_pending = 1; /* from a finalizer inside read_flags / read_json */
    else
        release(L, lc);
    return 0;
}

static int l_gc(lua_State *L)
{
    lcache *lc = luaL_checkudata(L, 1, CACHE_MT);
    release(L, lc);
    return 0;
}

static int l_tostring(lua_State *L)
{
    lcache *lc = luaL_checkudata(L, 1, CACHE_MT);
    lua_pushfstring(L, "esx.cache: %p%s", (void *)lc, lc->core ? "" : " (closed)");
    return 1;
}

static int getnum(lua_State *L, int t, const char *name, lua_Number *out)
{
    lua_getfield(L, t, name);
    int ok = lua_type(L, -1) == LUA_TNUMBER;
    if (ok)
        *out = lua_tonumber(L, -1);
    lua_pop(L, 1);
    return ok;
}

/* core.cache_new(cfg, pages) -> ud | nil, err (kind "internal") when the core cannot be
 * created (no memory, no shared mapping or mutex): a run-time failure, not the caller's.
 * cfg = {max_bytes=, page_ttl=, readers_ttl=, max_pages=, shared=}, already validated by
 * lua/esx/cache.lua; pages is the Lua table that will hold cached pages. */
static int l_new(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_Number max_bytes = 0, page_ttl = 0, readers_ttl = 0, max_pages = 0;
    if (!getnum(L, 1, "max_bytes", &max_bytes) || !getnum(L, 1, "page_ttl", &page_ttl) ||
        !getnum(L, 1, "readers_ttl", &readers_ttl) || !getnum(L, 1, "max_pages", &max_pages))
        luaL_argerror(L, 1, "max_bytes, page_ttl, readers_ttl and max_pages are required");
    /* (negated: a NaN fails every comparison, and cast to an integer type, as a number past
     * its range, is undefined behaviour) */
    if (!(max_bytes >= 0 && max_bytes < 18446744073709551616.0) || /* 2^64 */
        !(max_pages >= 0 && max_pages <= 1e6) ||
        !(page_ttl >= 0) || !(readers_ttl >= 0))
        luaL_argerror(L, 1, "out of range");
    lua_getfield(L, 1, "shared");
    int shared = lua_toboolean(L, -1);
    lua_pop(L, 1);
    esx_cache_config cfg = {(size_t)max_bytes, (double)page_ttl, (double)readers_ttl,
                            (uint64_t)max_pages, shared};
    lcache *lc = lua_newuserdata(L, sizeof *lc);
    lc->core = NULL;
    lc->pages_ref = LUA_NOREF;
    lc->shared = shared;
    lc->max_pages = cfg.max_pages;
    lc->max_bytes = cfg.max_bytes;
    lc->scratch = NULL;
    lc->scratch_cap = 0;
    lc->busy = lc->close_pending = lc->json_busy = 0;
    char err[160];
    lc->core = esx_cache_new(&cfg, err, sizeof err);
    if (lc->core == NULL)
        return esx_lerror_fail(L, "internal", "cannot create the cache: %s", err);
    /* __gc only once the core exists, and before luaL_ref, which raises when out of memory:
     * the collector then frees the core (release skips a pages_ref still LUA_NOREF) */
    luaL_setmetatable(L, CACHE_MT);
    lua_pushvalue(L, 2);
    lc->pages_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return 1;
}

/* core.cache_clock() -> CLOCK_MONOTONIC in milliseconds. */
static int l_clock(lua_State *L)
{
    lua_pushnumber(L, (lua_Number)esx_cache_now_ms());
    return 1;
}

static const luaL_Reg methods[] = {
    {"sync", l_sync},           {"seq", l_seq},         {"changed", l_changed},         {"page_get", l_page_get},
    {"page_put", l_page_put},   {"readers_put", l_readers_put},
    {"has_read", l_has_read},   {"read_flags", l_read_flags}, {"read_json", l_read_json},
    {"lock", l_lock},           {"unlock", l_unlock},   {"slot_home", l_slot_home},   {"poll", l_poll},
    {"apply", l_apply},         {"stats", l_stats},     {"close", l_close},
    {NULL, NULL},
};

void esx_lcache_open(lua_State *L)
{
    lua_pushlightuserdata(L, &busy_tramp_key);
    lua_pushcfunction(L, busy_tramp);
    lua_rawset(L, LUA_REGISTRYINDEX);
    esx_lclass(L, CACHE_MT, methods, l_gc, l_tostring);
    esx_lclass(L, ESX_SBUF_MT, NULL, esx_sbuf_gc, NULL);
    lua_pushcfunction(L, l_new);
    lua_setfield(L, -2, "cache_new");
    lua_pushcfunction(L, l_clock);
    lua_setfield(L, -2, "cache_clock");
    lua_pushcfunction(L, l_json);
    lua_setfield(L, -2, "cache_json");
}
