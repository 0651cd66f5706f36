/*
 * levent.c -- Lua binding of event.h, bulk_response.h and hll.h (see levent.h).
 *
 * core.events_parse(body, received_at_ms [, max_events = 100])
 *     -> docs, rejects | nil, err (err.kind "not_json", "too_many", "too_big", "nomem")
 *   docs: list of {doc=<minified JSON object>, event_id=, site_id=, type=, block_id=,
 *         variant=, user_id=} (absent optional fields are nil; an integer user_id is its
 *         decimal text); rejects: list of {index=<0-based position in the body>, error=<reason>}
 *         -- 0-based like the collector's HTTP answer {"index":i}.
 * core.event_from_query(query, received_at_ms) -> the same, for a pixel beacon's query.
 * core.bulk_response_parse(body, n) -> list of n {status=, type=, reason=} (type and reason
 *     nil for a successful item) | nil, err (kind "decode").
 * core.hll_new() -> esx.hll;  h:add(str) -> true | nil, err("nomem");  h:merge(other) ->
 *     true | nil, err;  h:estimate() -> integer;  h:memory() -> bytes;  h:serialize() ->
 *     binary string;  core.hll_deserialize(s) -> esx.hll | nil, err (kind "decode", or
 *     "nomem" when memory runs out).
 * Values are hashed with XXH64 and seed 0 (as rollup.c does), so sketches built anywhere merge.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bulk_response.h"
#include "event.h"
#include "hash.h"
#include "hll.h"
#include "lclass.h"
#include "lerror.h"
#include "levent.h"

#define HLL_MT "esx.hll"
#define HLL_SEED 0 /* fixed, and the one rollup.c uses: sketches built anywhere merge */
#define MAX_EVENTS_LIMIT 100000

static int64_t check_ms(lua_State *L, int i)
{
    if (!esx_isinteger(L, i))
        luaL_argerror(L, i, "integer milliseconds expected");
    return (int64_t)esx_tointeger(L, i);
}

static void set_str(lua_State *L, const char *k, const char *v)
{
    if (v[0]) {
        lua_pushstring(L, v);
        lua_setfield(L, -2, k);
    }
}

/* Pushes docs and rejects from one parse; out is already a Lua string at index outi. */
static int push_results(lua_State *L, int outi, const esx_event *ev, int ne,
                        const esx_event_reject *rj, int nr)
{
    const char *out = lua_tostring(L, outi);
    lua_createtable(L, ne, 0);
    for (int i = 0; i < ne; i++) {
        lua_createtable(L, 0, 7);
        lua_pushlstring(L, out + ev[i].doc_off, ev[i].doc_len);
        lua_setfield(L, -2, "doc");
        set_str(L, "event_id", ev[i].event_id);
        set_str(L, "site_id", ev[i].site_id);
        set_str(L, "type", ev[i].type);
        set_str(L, "block_id", ev[i].block_id);
        set_str(L, "variant", ev[i].variant);
        set_str(L, "user_id", ev[i].user_id);
        lua_rawseti(L, -2, i + 1);
    }
    lua_createtable(L, nr, 0);
    for (int i = 0; i < nr; i++) {
        lua_createtable(L, 0, 2);
        esx_pushinteger(L, rj[i].index);
        lua_setfield(L, -2, "index");
        lua_pushstring(L, rj[i].reason);
        lua_setfield(L, -2, "error");
        lua_rawseti(L, -2, i + 1);
    }
    return 2;
}

static int fail_ev(lua_State *L, int rc, const char *why)
{
    const char *kind = rc == ESX_EV_NOT_JSON ? "not_json"
                       : rc == ESX_EV_TOO_MANY ? "too_many"
                       : rc == ESX_EV_TOOBIG ? "too_big"
                                              : "nomem";
    return esx_lerror_fail(L, kind, "%s", why[0] ? why : kind);
}

/* The results of a parse into out (freed here): docs, rejects; or nil, err. */
static int parsed(lua_State *L, int rc, const char *why, esx_buf *out, const esx_event *ev,
                  int ne, const esx_event_reject *rj, int nr)
{
    if (rc != ESX_EV_OK) {
        esx_buf_free(out);
        return fail_ev(L, rc, why);
    }
    lua_pushlstring(L, out->data ? out->data : "", out->len);
    esx_buf_free(out);
    return push_results(L, lua_gettop(L), ev, ne, rj, nr);
}

static int l_events_parse(lua_State *L)
{
    size_t len;
    const char *body = luaL_checklstring(L, 1, &len);
    int64_t now = check_ms(L, 2);
    lua_Integer max = 100;
    if (!lua_isnoneornil(L, 3)) {
        if (!esx_isinteger(L, 3) || esx_tointeger(L, 3) < 1 ||
            esx_tointeger(L, 3) > MAX_EVENTS_LIMIT)
            return luaL_argerror(L, 3, "max_events must be an integer from 1 to 100000");
        max = (lua_Integer)esx_tointeger(L, 3);
    }
    esx_idgen *ids = lua_touserdata(L, lua_upvalueindex(1));
    /* both arrays as Lua memory: a raise while building the results leaks nothing */
    esx_event *ev = lua_newuserdata(L, (size_t)max * sizeof *ev);
    esx_event_reject *rj = lua_newuserdata(L, (size_t)max * sizeof *rj);
    /* output: the body minified plus per event received_at, event_id and separators */
    size_t extra = (size_t)max * 128 + 1024;
    /* output owned by a userdata: a raise while results are built frees it */
    esx_buf *out = esx_lbuf_push(L, len > SIZE_MAX - extra - 1 ? SIZE_MAX - 1 : len + extra);
    int ne = 0, nr = 0;
    char why[128];
    int rc = esx_events_parse(body, len, now, ids, out, ev, &ne, rj, &nr, (int)max, why);
    return parsed(L, rc, why, out, ev, ne, rj, nr);
}

static int l_event_from_query(lua_State *L)
{
    size_t len;
    const char *q = luaL_checklstring(L, 1, &len);
    int64_t now = check_ms(L, 2);
    esx_idgen *ids = lua_touserdata(L, lua_upvalueindex(1));
    esx_event *ev = lua_newuserdata(L, sizeof *ev);
    esx_event_reject *rj = lua_newuserdata(L, sizeof *rj);
    /* output owned by a userdata: a raise while results are built frees it */
    esx_buf *out = esx_lbuf_push(L, len > (SIZE_MAX - 2048) / 8 ? SIZE_MAX - 1 : 8 * len + 2048);
    int ne = 0, nr = 0;
    char why[128];
    int rc = esx_event_from_query(q, len, now, ids, out, ev, &ne, rj, &nr, why);
    return parsed(L, rc, why, out, ev, ne, rj, nr);
}

static int l_bulk_response_parse(lua_State *L)
{
    size_t len;
    const char *body = luaL_checklstring(L, 1, &len);
    if (!esx_isinteger(L, 2) || esx_tointeger(L, 2) < 0 || esx_tointeger(L, 2) > 10000000)
        return luaL_argerror(L, 2, "n must be an integer from 0 to 10000000");
    int n = (int)esx_tointeger(L, 2);
    esx_bulk_item *items = lua_newuserdata(L, (n ? (size_t)n : 1) * sizeof *items);
    char why[128];
    if (esx_bulk_response_parse(body, len, items, n, why) != 0)
        return esx_lerror_fail(L, "decode", "%s", why);
    lua_createtable(L, n, 0);
    for (int i = 0; i < n; i++) {
        lua_createtable(L, 0, 3);
        esx_pushinteger(L, items[i].status);
        lua_setfield(L, -2, "status");
        set_str(L, "type", items[i].error_type);
        set_str(L, "reason", items[i].reason);
        lua_rawseti(L, -2, i + 1);
    }
    return 1;
}

/* ---- esx.hll ---- */

static esx_hll **hll_push(lua_State *L)
{
    esx_hll **ud = lua_newuserdata(L, sizeof *ud);
    *ud = NULL;
    luaL_setmetatable(L, HLL_MT);
    return ud;
}

static esx_hll *hll_check(lua_State *L, int i)
{
    esx_hll **ud = luaL_checkudata(L, i, HLL_MT);
    if (*ud == NULL)
        luaL_argerror(L, i, "esx.hll without a sketch");
    return *ud;
}

static int l_hll_new(lua_State *L)
{
    esx_hll **ud = hll_push(L);
    *ud = esx_hll_new();
    if (*ud == NULL)
        return esx_lerror_fail(L, "nomem", "out of memory");
    return 1;
}

static int l_hll_deserialize(lua_State *L)
{
    size_t len;
    const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &len);
    esx_hll **ud = hll_push(L);
    int nomem;
    *ud = esx_hll_deserialize(s, len, &nomem);
    if (*ud == NULL && nomem)
        return esx_lerror_fail(L, "nomem", "out of memory");
    if (*ud == NULL)
        return esx_lerror_fail(L, "decode", "not a serialised esx.hll sketch");
    return 1;
}

static int l_hll_add(lua_State *L)
{
    esx_hll *h = hll_check(L, 1);
    size_t len;
    const char *s = luaL_checklstring(L, 2, &len);
    if (esx_hll_add_hash(h, esx_hash64(s, len, HLL_SEED)) != 0)
        return esx_lerror_fail(L, "nomem", "out of memory");
    lua_pushboolean(L, 1);
    return 1;
}

static int l_hll_merge(lua_State *L)
{
    esx_hll *h = hll_check(L, 1);
    esx_hll *o = hll_check(L, 2);
    if (esx_hll_merge(h, o) != 0)
        return esx_lerror_fail(L, "nomem", "out of memory");
    lua_pushboolean(L, 1);
    return 1;
}

static int l_hll_estimate(lua_State *L)
{
    esx_pushinteger(L, (long long)llround(esx_hll_estimate(hll_check(L, 1))));
    return 1;
}

static int l_hll_memory(lua_State *L)
{
    esx_pushinteger(L, (long long)esx_hll_memory(hll_check(L, 1)));
    return 1;
}

static int l_hll_serialize(lua_State *L)
{
    esx_hll *h = hll_check(L, 1);
    size_t n = esx_hll_serialize(h, NULL, 0);
    unsigned char *buf = lua_newuserdata(L, n);
    esx_hll_serialize(h, buf, n);
    lua_pushlstring(L, (const char *)buf, n);
    return 1;
}

static int l_hll_gc(lua_State *L)
{
    esx_hll **ud = luaL_checkudata(L, 1, HLL_MT);
    esx_hll_free(*ud);
    *ud = NULL;
    return 0;
}

static int l_hll_tostring(lua_State *L)
{
    esx_hll **ud = luaL_checkudata(L, 1, HLL_MT);
    lua_pushfstring(L, HLL_MT ": %p", (void *)*ud);
    return 1;
}

static const luaL_Reg hll_methods[] = {
    {"add", l_hll_add},           {"merge", l_hll_merge},   {"estimate", l_hll_estimate},
    {"memory", l_hll_memory},     {"serialize", l_hll_serialize},
    {NULL, NULL},
};

void esx_levent_open(lua_State *L)
{
    esx_lclass(L, HLL_MT, hll_methods, l_hll_gc, l_hll_tostring);

    /* one id generator per Lua state, shared by both parsers as an upvalue */
    esx_idgen *ids = lua_newuserdata(L, sizeof *ids);
    esx_idgen_init(ids);
    lua_pushvalue(L, -1);
    lua_pushcclosure(L, l_events_parse, 1);
    lua_setfield(L, -3, "events_parse");
    lua_pushcclosure(L, l_event_from_query, 1);
    lua_setfield(L, -2, "event_from_query");

    lua_pushcfunction(L, l_bulk_response_parse);
    lua_setfield(L, -2, "bulk_response_parse");
    lua_pushcfunction(L, l_hll_new);
    lua_setfield(L, -2, "hll_new");
    lua_pushcfunction(L, l_hll_deserialize);
    lua_setfield(L, -2, "hll_deserialize");
}
