/*
 * lcollector.c -- Lua binding of the collector core (see lcollector.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "clock.h"
#include "collector.h"
#include "hll.h"
#include "lclass.h"
#include "lclient.h"
#include "lcollector.h"
#include "lerror.h"
#include "lopts.h"
#include "rollup.h"

#define COLLECTOR_MT "esx.collector.core"

typedef struct lcollector {
    esx_collector *col;
    atomic_int in_progress;
    int counted; /* open, for esx_lthreaded_collect (lclass.h) */
} lcollector;

static lcollector *check_col(lua_State *L, int idx)
{
    lcollector *u = luaL_checkudata(L, idx, COLLECTOR_MT);
    return u;
}

static esx_collector *live_col(lua_State *L, int idx)
{
    lcollector *u = check_col(L, idx);
    if (u->col == NULL)
        luaL_error(L, "esx.collector: the collector was freed");
    return u->col;
}

/* core.collector_new(client, opts) -> collector | nil, err.  opts is validated by Lua. */
static int collector_new(lua_State *L)
{
    esx_client *client = esx_lclient_check(L, 1);
    luaL_checktype(L, 2, LUA_TTABLE);
    /* a collector on a closed client would answer 2xx for events it can never ship */
    if (client == NULL || esx_client_closed(client))
        return esx_lerror_fail(L, "closed", "the sink client is closed");
    esx_collector_config cfg;
    memset(&cfg, 0, sizeof cfg);
    esx_lopt_str(L, 2, "esx.collector", "index", cfg.index_fmt, sizeof cfg.index_fmt);
    cfg.max_body = (size_t)esx_lopt_int(L, 2, "esx.collector", "max_body", 65536);
    cfg.max_events = (int)esx_lopt_int(L, 2, "esx.collector", "max_events", 100);
    cfg.queue_max_bytes = (size_t)esx_lopt_int(L, 2, "esx.collector", "queue_max_bytes", 64 << 20);
    cfg.batch_max_bytes = (size_t)esx_lopt_int(L, 2, "esx.collector", "batch_max_bytes", 1 << 20);
    cfg.batch_max_events = (int)esx_lopt_int(L, 2, "esx.collector", "batch_max_events", 5000);
    cfg.flush_interval = esx_lopt_int(L, 2, "esx.collector", "flush_interval", 1000);
    cfg.bulk_concurrency = (int)esx_lopt_int(L, 2, "esx.collector", "bulk_concurrency", 2);
    cfg.backoff_min = esx_lopt_int(L, 2, "esx.collector", "retry_backoff_min", 100);
    cfg.backoff_max = esx_lopt_int(L, 2, "esx.collector", "retry_backoff_max", 30000);
    esx_lopt_str(L, 2, "esx.collector", "spool_dir", cfg.spool_dir, sizeof cfg.spool_dir);
    cfg.spool_sync_interval = esx_lopt_int(L, 2, "esx.collector", "spool_sync_interval", 1000);
    cfg.spool_segment_bytes = (size_t)esx_lopt_int(L, 2, "esx.collector", "spool_segment_bytes", 4 << 20);
    cfg.spool_max_bytes = (size_t)esx_lopt_int(L, 2, "esx.collector", "spool_max_bytes", (int64_t)1 << 30);
    esx_lopt_str(L, 2, "esx.collector", "dead_letter", cfg.dead_letter_path, sizeof cfg.dead_letter_path);
    cfg.dead_letter_max_bytes = esx_lopt_int(L, 2, "esx.collector", "dead_letter_max_bytes", (int64_t)1 << 30);
    cfg.rollup_window = esx_lopt_int(L, 2, "esx.collector", "rollup_window", 60000);
    esx_lopt_str(L, 2, "esx.collector", "rollup_index", cfg.rollup_index_fmt, sizeof cfg.rollup_index_fmt);
    cfg.rollup_interval = esx_lopt_int(L, 2, "esx.collector", "rollup_interval", 10000);
    cfg.rollup_max_rows = (size_t)esx_lopt_int(L, 2, "esx.collector", "rollup_max_rows", 100000);
    esx_lopt_str(L, 2, "esx.collector", "instance", cfg.instance, sizeof cfg.instance);
    cfg.site_rate = esx_lopt_num(L, 2, "esx.collector", "site_rate", 0);
    cfg.site_burst = esx_lopt_num(L, 2, "esx.collector", "site_burst", 0);
    cfg.max_sites = (size_t)esx_lopt_int(L, 2, "esx.collector", "max_sites", 100000);
    cfg.create_index = esx_lopt_bool(L, 2, "esx.collector", "create_index", 0);
    cfg.create_rollup_index = esx_lopt_bool(L, 2, "esx.collector", "create_rollup_index", 0);
    esx_lthreaded_collect(L); /* dropped collectors' shippers: see lclass.h */
    lcollector *u = lua_newuserdata(L, sizeof *u);
    u->col = NULL;
    u->counted = 0;
    atomic_init(&u->in_progress, 0);
    char why[256];
    u->col = esx_collector_new(&cfg, client, why);
    if (u->col == NULL)
        return esx_lerror_fail(L, "internal", "cannot create the collector: %s", why);
    luaL_setmetatable(L, COLLECTOR_MT);
    esx_lthreaded_add(&u->counted);
    return 1;
}

/* A collector collected without close() (forgotten, or the Lua state closing at exit)
 * still ships what it acknowledged: it flushes for up to GC_FLUSH_MS as close() would, and
 * says on stderr (nginx: the error log) how many events it could not deliver.  With a spool
 * they stay on disk for the next process.  With its sink client closed nothing can be
 * acknowledged: as close() does, it does not wait (a worker whose exit_worker_by_lua closed
 * the client waited 5 s per such collector while its Lua state closed).
 *
 * The bound is for the collectors collected together, not for each: finalizers run one
 * after the other (a GC cycle, the state closing), and N collectors whose sink is away held
 * that thread -- an nginx worker's exit -- for 5 N s.  A flush that starts within
 * GC_BURST_GAP_MS of the end of the previous one of the same sink client shares what is
 * left of that sink's 5 s.  Only a flush that runs out of its time spends it: one that
 * delivered everything sooner gives its time back (counted from the first flush,
 * collectors collected one after the other in cycles of their own, each delivering in 2 s,
 * left the third 1 s and lost its events to a sink that was taking them).  Per sink: a
 * sink away says nothing of another, and sharing one 5 s among all left a collector whose
 * sink worked 0 ms once one whose sink was away had waited them out -- its events lost. */
#define GC_FLUSH_MS 5000
#define GC_BURST_GAP_MS 100
#define GC_SINKS 16 /* sinks with a burst going on; past that the oldest burst is forgotten */

static pthread_mutex_t gc_mu = PTHREAD_MUTEX_INITIALIZER;
static struct gc_burst {
    const void *sink; /* NULL: a free entry */
    int64_t left;     /* ms of the burst's wait not spent yet */
    int64_t last_end; /* monotonic ms */
} gc_bursts[GC_SINKS];

/* sink's burst (one made for it, in place of the oldest, when it has none).  Under gc_mu. */
static struct gc_burst *gc_burst_of(const void *sink, int create)
{
    struct gc_burst *oldest = &gc_bursts[0];
    for (int i = 0; i < GC_SINKS; i++) {
        if (gc_bursts[i].sink == sink)
            return &gc_bursts[i];
        if (gc_bursts[i].sink == NULL || (oldest->sink && gc_bursts[i].last_end < oldest->last_end))
            oldest = &gc_bursts[i];
    }
    if (!create)
        return NULL;
    *oldest = (struct gc_burst){.sink = sink};
    return oldest;
}

/* The ms a collector of sink being collected may wait: what is left of its sink's burst;
 * *start: now. */
static int64_t gc_flush_budget(const void *sink, int64_t *start)
{
    int64_t now = esx_now_ms();
    pthread_mutex_lock(&gc_mu);
    struct gc_burst *b = gc_burst_of(sink, 1);
    if (b->last_end == 0 || now - b->last_end > GC_BURST_GAP_MS)
        b->left = GC_FLUSH_MS;
    int64_t left = b->left;
    b->last_end = now; /* (a flush running counts as the burst going on) */
    pthread_mutex_unlock(&gc_mu);
    *start = now;
    return left > 0 ? left : 0;
}

/* A flush given budget ms at start has ended: it spent its sink's time if it ran out. */
static void gc_flush_done(const void *sink, int64_t start, int64_t budget)
{
    int64_t now = esx_now_ms();
    pthread_mutex_lock(&gc_mu);
    struct gc_burst *b = gc_burst_of(sink, 0);
    if (b) {
        b->last_end = now;
        if (now - start >= budget)
            b->left = b->left > budget ? b->left - budget : 0;
    }
    pthread_mutex_unlock(&gc_mu);
}

static int col_gc(lua_State *L)
{
    lcollector *u = check_col(L, 1);
    esx_lthreaded_remove(&u->counted);
    if (u->col) {
        int sink_closed = esx_collector_sink_closed(u->col);
        int64_t start = 0;
        const void *sink = esx_collector_sink(u->col);
        int64_t budget = sink_closed ? 0 : gc_flush_budget(sink, &start);
        int64_t left = esx_collector_close(u->col, budget);
        if (!sink_closed)
            gc_flush_done(sink, start, budget);
        if (left > 0 && !esx_collector_has_spool(u->col) && sink_closed)
            fprintf(stderr, "esx.collector: collected without close(): %lld accepted events "
                            "were not delivered (its sink client is closed)\n", (long long)left);
        else if (left > 0 && !esx_collector_has_spool(u->col))
            fprintf(stderr, "esx.collector: collected without close(): %lld accepted events "
                            "were not delivered within %lld ms\n", (long long)left,
                    (long long)budget);
        esx_collector_free(u->col);
        u->col = NULL;
    }
    return 0;
}

static int col_tostring(lua_State *L)
{
    lcollector *u = check_col(L, 1);
    lua_pushfstring(L, "esx.collector: %p", (void *)u->col);
    return 1;
}

/* col:ingest(body, from_query, received_at_ms) -> status, accepted, rejects, retry_after_ms,
 * message[, detail] -- or only 204, accepted when every event was accepted (the common answer
 * makes no table and no string).  message is for the client; detail, given only for a
 * failure of ours (the spool), is for the operator's log. */
static int col_ingest(lua_State *L)
{
    esx_collector *col = live_col(L, 1);
    size_t len;
    const char *body = luaL_checklstring(L, 2, &len);
    int from_query = lua_toboolean(L, 3);
    int64_t received_at = lua_isnoneornil(L, 4) ? esx_wall_ms() : esx_checkcount(L, 4);
    esx_intake out;
    esx_collector_ingest(col, body, len, from_query, received_at, &out);
    lua_pushinteger(L, out.status);
    lua_pushinteger(L, out.accepted);
    if (out.status == 204 && out.n_rejects == 0)
        return 2;
    lua_createtable(L, out.n_rejects, 0);
    for (int i = 0; i < out.n_rejects; i++) {
        lua_createtable(L, 0, 2);
        lua_pushinteger(L, out.rejects[i].index);
        lua_setfield(L, -2, "index");
        lua_pushstring(L, out.rejects[i].reason);
        lua_setfield(L, -2, "error");
        lua_rawseti(L, -2, i + 1);
    }
    esx_pushinteger(L, out.retry_after_ms);
    lua_pushstring(L, out.message);
    if (out.detail[0] == '\0')
        return 5;
    lua_pushstring(L, out.detail);
    return 6;
}

/* col:enter(max) -> true when under max requests in progress (and counts this one) */
static int col_enter(lua_State *L)
{
    lcollector *u = check_col(L, 1);
    int max = (int)luaL_checkinteger(L, 2);
    int now = atomic_fetch_add(&u->in_progress, 1);
    if (now >= max) {
        atomic_fetch_sub(&u->in_progress, 1);
        lua_pushboolean(L, 0);
    } else {
        lua_pushboolean(L, 1);
    }
    return 1;
}

/* col:leave() -> true when it ended a request in progress; false (nothing counted) when none
 * was: a leave without its enter must not take the count below 0, where it would let that many
 * requests past max_concurrent */
static int col_leave(lua_State *L)
{
    lcollector *u = check_col(L, 1);
    int n = atomic_load(&u->in_progress);
    do {
        if (n <= 0) {
            lua_pushboolean(L, 0);
            return 1;
        }
    } while (!atomic_compare_exchange_weak(&u->in_progress, &n, n - 1));
    lua_pushboolean(L, 1);
    return 1;
}

/* A timeout in ms for the core: < 0 (and nil, NaN, infinity) means no limit.  Beyond 2^53
 * the conversion to int64_t would be undefined; no one waits that long anyway. */
static int64_t timeout_ms(lua_Number t)
{
    return t >= 0 && t < 9007199254740992.0 ? (int64_t)t : -1;
}

static int col_flush(lua_State *L)
{
    esx_collector *col = live_col(L, 1);
    char why[256];
    int rc = esx_collector_flush(col, timeout_ms(luaL_optnumber(L, 2, -1)), why);
    if (rc < 0)
        return esx_lerror_fail(L, "internal", "the collector cannot ship: %s", why);
    lua_pushboolean(L, rc);
    return 1;
}

static void push_row(lua_State *L, const esx_rollup_view *row)
{
    lua_createtable(L, 0, 7);
    esx_pushinteger(L, row->window_start);
    lua_setfield(L, -2, "window_start");
    lua_pushstring(L, row->site_id);
    lua_setfield(L, -2, "site_id");
    lua_pushstring(L, row->block_id);
    lua_setfield(L, -2, "block_id");
    lua_pushstring(L, row->variant);
    lua_setfield(L, -2, "variant");
    lua_pushstring(L, row->type);
    lua_setfield(L, -2, "type");
    esx_pushinteger(L, (long long)row->count);
    lua_setfield(L, -2, "count");
    esx_pushinteger(L, (long long)row->uniques);
    lua_setfield(L, -2, "uniques");
}

/* build_rows(rows, n) -> list: in a protected call, so that rows is freed if it raises */
static int build_rows(lua_State *L)
{
    const esx_rollup_view *rows = lua_touserdata(L, 1);
    size_t n = (size_t)lua_tointeger(L, 2);
    lua_createtable(L, (int)n, 0);
    for (size_t i = 0; i < n; i++) {
        push_row(L, &rows[i]);
        lua_rawseti(L, -2, (int)i + 1);
    }
    return 1;
}

/* The rows are copied under the collector's lock and the tables built without it: a table's
 * allocation may run a finalizer that calls this collector (or raise, out of memory). */
static int col_rollups(lua_State *L)
{
    esx_collector *col = live_col(L, 1);
    int64_t now = lua_isnoneornil(L, 2) ? esx_wall_ms() : esx_checkcount(L, 2);
    /* before the copy: under LuaJIT pushing a C function allocates (and may raise) */
    lua_pushcfunction(L, build_rows);
    esx_rollup_view *rows;
    size_t n;
    if (esx_collector_rollups(col, now, &rows, &n) != 0)
        return esx_lerror_fail(L, ESX_EINTERNAL, "out of memory copying the rollup rows");
    lua_pushlightuserdata(L, rows);
    lua_pushinteger(L, (lua_Integer)n);
    int rc = lua_pcall(L, 2, 1, 0);
    free(rows);
    if (rc != 0)
        return lua_error(L);
    return 1;
}

static void set_int(lua_State *L, const char *name, long long v)
{
    esx_pushinteger(L, v);
    lua_setfield(L, -2, name);
}

static int col_stats(lua_State *L)
{
    lcollector *u = check_col(L, 1);
    esx_collector *col = live_col(L, 1);
    esx_collector_counters s;
    esx_collector_stats(col, &s);
    lua_createtable(L, 0, 24);
    set_int(L, "requests", (long long)s.requests);
    set_int(L, "accepted", (long long)s.accepted);
    lua_createtable(L, 0, ESX_RJ_COUNT);
    for (int i = 0; i < ESX_RJ_COUNT; i++)
        set_int(L, esx_reject_names[i], (long long)s.rejected[i]);
    lua_setfield(L, -2, "rejected");
    set_int(L, "queued_events", (long long)s.queued_events);
    set_int(L, "queued_bytes", (long long)s.queued_bytes);
    set_int(L, "in_flight", (long long)s.in_flight);
    set_int(L, "delayed", (long long)s.delayed);
    set_int(L, "shipped", (long long)s.shipped);
    set_int(L, "retried", (long long)s.retried);
    set_int(L, "dead_lettered", (long long)s.dead_lettered);
    set_int(L, "dead_letter_failed", (long long)s.dead_letter_failed);
    set_int(L, "spooled", (long long)s.spooled);
    set_int(L, "replayed", (long long)s.replayed);
    set_int(L, "spilled", (long long)s.spilled);
    set_int(L, "spool_bytes", (long long)s.spool_bytes);
    set_int(L, "spool_skipped_bytes", (long long)s.spool_skipped_bytes);
    set_int(L, "spool_segments_gone", (long long)s.spool_segments_gone);
    set_int(L, "spool_segments_refused", (long long)s.spool_segments_refused);
    set_int(L, "spool_claims_failing", (long long)s.spool_claims_failing);
    set_int(L, "spool_segments_pid_reused", (long long)s.spool_segments_pid_reused);
    set_int(L, "spool_sync_failed", (long long)s.spool_sync_failed);
    set_int(L, "bulk_requests", (long long)s.bulk_requests);
    set_int(L, "bulk_failures", (long long)s.bulk_failures);
    set_int(L, "indices_created", (long long)s.indices_created);
    set_int(L, "index_create_failed", (long long)s.index_create_failed);
    set_int(L, "rollup_rows", (long long)s.rollup_rows);
    set_int(L, "rollup_bytes", (long long)s.rollup_bytes);
    set_int(L, "rollup_dropped", (long long)s.rollup_dropped);
    set_int(L, "rollup_written", (long long)s.rollup_written);
    set_int(L, "rollup_lost", (long long)s.rollup_lost);
    set_int(L, "rate_unlimited", (long long)s.rate_unlimited);
    set_int(L, "lag_ms", (long long)s.oldest_queued_ms);
    set_int(L, "in_progress", atomic_load(&u->in_progress));
    return 1;
}

static int col_close(lua_State *L)
{
    esx_collector *col = live_col(L, 1);
    esx_lthreaded_remove(&check_col(L, 1)->counted);
    esx_pushinteger(L, (long long)esx_collector_close(col, timeout_ms(luaL_optnumber(L, 2, 10000))));
    return 1;
}

/* core.hll_union(list of base64 sketches[, sketch]) -> estimate of the union[, the union as
 * a base64 sketch when sketch is true] | nil, err
 * (merges per-instance rollup rows: counts add, registers take maxima; totals folds the rows
 * of each search into one sketch per group, so that it never holds more than a search's rows).
 * Entries that are
 * empty strings or neither strings nor numbers are skipped; a number is never a sketch
 * (its text is digits, a sketch's base64 starts "RUgB") and fails as one that does not
 * decode.  Nothing in the loop may raise: acc is C memory only this frame points to. */
/* push_sketch(b64) -> the string: in a protected call, so that b64 is freed if it raises */
static int push_sketch(lua_State *L)
{
    lua_pushstring(L, lua_touserdata(L, 1));
    return 1;
}

static int hll_union(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    int want = lua_toboolean(L, 2);
    int n = (int)lua_rawlen(L, 1);
    /* before the sketch: under LuaJIT pushing a C function allocates (and may raise) */
    if (want)
        lua_pushcfunction(L, push_sketch);
    esx_hll *acc = esx_hll_new();
    if (acc == NULL)
        return esx_lerror_fail(L, "internal", "out of memory");
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, 1, i);
        int type = lua_type(L, -1);
        size_t len = 0;
        /* strings only: converting a number would allocate, and raise when out of memory */
        const char *s = type == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
        if (type == LUA_TNUMBER) {
            lua_pop(L, 1);
            esx_hll_free(acc);
            return esx_lerror_fail(L, "decode", "sketch %d is not a valid HyperLogLog", i);
        }
        if (s == NULL || len == 0) {
            lua_pop(L, 1);
            continue;
        }
        unsigned char *raw = malloc(len / 4 * 3 + 3);
        size_t rlen = raw ? esx_base64_decode(s, len, raw) : (size_t)-1;
        int nomem = 0;
        esx_hll *h = rlen == (size_t)-1 ? NULL : esx_hll_deserialize(raw, rlen, &nomem);
        /* out of memory: no buffer, no sketch, or a merge failed (it fails for nothing else) */
        nomem = raw == NULL || nomem || (h != NULL && esx_hll_merge(acc, h) != 0);
        free(raw);
        lua_pop(L, 1);
        if (h == NULL || nomem) {
            esx_hll_free(h);
            esx_hll_free(acc);
            if (nomem)
                return esx_lerror_fail(L, "internal", "out of memory merging sketches");
            return esx_lerror_fail(L, "decode", "sketch %d is not a valid HyperLogLog", i);
        }
        esx_hll_free(h);
    }
    double est = esx_hll_estimate(acc);
    if (!want) {
        esx_hll_free(acc);
        lua_pushnumber(L, est);
        return 1;
    }
    size_t rawlen = esx_hll_serialize(acc, NULL, 0);
    unsigned char *raw = malloc(rawlen);
    char *b64 = raw ? malloc(esx_base64_len(rawlen)) : NULL;
    if (b64 == NULL) {
        free(raw);
        esx_hll_free(acc);
        return esx_lerror_fail(L, "internal", "out of memory merging sketches");
    }
    esx_hll_serialize(acc, raw, rawlen);
    esx_hll_free(acc);
    esx_base64_encode(raw, rawlen, b64);
    free(raw);
    /* the string is made in a protected call, so that b64 is freed if it raises */
    lua_pushlightuserdata(L, b64);
    int rc = lua_pcall(L, 1, 1, 0);
    free(b64);
    if (rc != 0)
        return lua_error(L);
    lua_pushnumber(L, est);
    lua_insert(L, -2);
    return 2;
}

static const luaL_Reg methods[] = {
    {"ingest", col_ingest}, {"enter", col_enter}, {"leave", col_leave},
    {"flush", col_flush},   {"rollups", col_rollups}, {"stats", col_stats},
    {"close", col_close},   {NULL, NULL},
};

void esx_lcollector_open(lua_State *L)
{
    esx_lclass(L, COLLECTOR_MT, methods, col_gc, col_tostring);
    lua_pushcfunction(L, collector_new);
    lua_setfield(L, -2, "collector_new");
    lua_pushcfunction(L, hll_union);
    lua_setfield(L, -2, "hll_union");
}
