/*
 * rollup.c -- the per-window aggregate table (see rollup.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base64.h"
#include "buf.h"
#include "hash.h"
#include "rollup.h"

#define ID_SEED 0x65737852756c6c75ULL /* fixed: a row's _id must not change with the table's seed */
/* How long a row outlives its window.  An event is counted under its received_at, stamped
 * when its request arrived, some milliseconds before the count (parsing, the lock): a row
 * forgotten the moment its window ended would come back from such a late count starting at
 * 1 again, and its write (same _id, a lower or equal version) would replace or lose the
 * row's real totals. */
#define ROW_GRACE_MS 10000

struct esx_rollups {
    int64_t window;
    size_t max_rows, rows, nbuckets;
    uint64_t seed, dropped;
    /* Random per table, in every _id: another table writing under the same instance name
     * (the process restarted with the same pid, as in a container; two processes given one
     * name; a collector made again) starts again from count 1, and under the same _ids its
     * rows would be refused (version = count) or would replace the first table's. */
    uint64_t run;
    /* The latest window whose rows were forgotten (INT64_MIN: none), and the rows made
     * since for a window up to it: such a row may have been written and forgotten before
     * (the wall clock stepped back), so it gets an _id of its own (gen) -- under the old
     * one, at count 1, it would be refused or would replace the row written before. */
    int64_t forgotten;
    uint64_t gens;
    int reclaimable; /* rows were written since the table was last walked for room */
    /* The window the last walk made room for: rows of windows before it were all walked.
     * A later window may free rows that walk had to keep (they were of its own window,
     * written while it was open), even when no row was written since. */
    int64_t reclaimed_for;
    /* The bytes the table holds, as esx_rollups_memory counts them: kept as rows and sketches
     * change, so that col:stats() does not walk 100,000 rows under the collector's lock. */
    size_t bytes;
    esx_rollup_row **buckets;
};

esx_rollups *esx_rollups_new(int64_t window_ms, size_t max_rows)
{
    esx_rollups *r = calloc(1, sizeof *r);
    if (r == NULL)
        return NULL;
    r->window = window_ms;
    r->max_rows = max_rows;
    r->nbuckets = 64;
    while (r->nbuckets < max_rows && r->nbuckets < (1u << 20))
        r->nbuckets *= 2;
    r->buckets = calloc(r->nbuckets, sizeof *r->buckets);
    if (r->buckets == NULL) {
        free(r);
        return NULL;
    }
    r->seed = esx_random_seed();
    r->run = esx_random_seed();
    r->forgotten = INT64_MIN;
    r->reclaimed_for = INT64_MIN;
    r->bytes = sizeof *r + r->nbuckets * sizeof *r->buckets;
    return r;
}

/* Bytes a row holds: itself and its sketch. */
static size_t row_bytes(const esx_rollup_row *row)
{
    return sizeof *row + (row->hll ? esx_hll_memory(row->hll) : 0);
}

static void free_row(esx_rollup_row *row)
{
    esx_hll_free(row->hll);
    free(row);
}

void esx_rollups_free(esx_rollups *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->nbuckets; i++) {
        esx_rollup_row *row = r->buckets[i];
        while (row) {
            esx_rollup_row *next = row->next;
            free_row(row);
            row = next;
        }
    }
    free(r->buckets);
    free(r);
}

/* The key bytes: window and the four dimensions, NUL-separated. */
static size_t key_part(char *out, size_t o, const char *s, size_t max)
{
    size_t n = strnlen(s, max);
    out[o++] = '\0';
    memcpy(out + o, s, n);
    return o + n;
}

/* (window 20 bytes at most, 4 separators, the event's fields of 64, 64, 64 and 32 bytes:
 * 248 bytes; out has 256) */
static size_t key_bytes(char *out, int64_t w, const char *s, const char *b, const char *v,
                        const char *t)
{
    size_t o = esx_format_i64(out, (long long)w);
    o = key_part(out, o, s, 64);
    o = key_part(out, o, b, 64);
    o = key_part(out, o, v, 64);
    return key_part(out, o, t, 32);
}

static int64_t window_of(const esx_rollups *r, int64_t at)
{
    int64_t w = at - at % r->window;
    return at < 0 && at % r->window ? w - r->window : w;
}

/* Unlinks *p (a written row) and frees it, noting its window as forgotten. */
static void forget_row(esx_rollups *r, esx_rollup_row **p)
{
    esx_rollup_row *row = *p;
    if (row->window_start > r->forgotten)
        r->forgotten = row->window_start;
    *p = row->next;
    r->bytes -= row_bytes(row);
    free_row(row);
    r->rows--;
}

/* At max_rows: frees the written rows of windows before w (kept only for late counts, which
 * would now make a row with an _id of its own) to make room for a row of window w, and those
 * of windows after the one after w: made while the wall clock was ahead (a forward step, put
 * right), they were kept until real time reached their window -- an hour's step held their
 * places for an hour, refusing the current window's rows -- and a row made again for their
 * window gets an _id of its own too.  (The window after w is kept: a late count, of the
 * window before the current one, must not free the current window's rows.)  Walks the table
 * at most once per esx_rollups_emit that wrote rows, once per later window, and once per
 * step of the clock back past the window before the last walk's.
 * Returns 1 when it made room. */
static int reclaim(esx_rollups *r, int64_t w)
{
    int back = r->reclaimed_for != INT64_MIN && w < r->reclaimed_for - r->window;
    if (!r->reclaimable && w <= r->reclaimed_for && !back)
        return 0;
    r->reclaimable = 0;
    if (w > r->reclaimed_for || back)
        r->reclaimed_for = w;
    for (size_t i = 0; i < r->nbuckets; i++) {
        esx_rollup_row **p = &r->buckets[i];
        while (*p) {
            if (!(*p)->dirty && ((*p)->window_start < w || (*p)->window_start > w + r->window))
                forget_row(r, p);
            else
                p = &(*p)->next;
        }
    }
    return r->rows < r->max_rows;
}

int esx_rollups_add(esx_rollups *r, int64_t received_at, const esx_event *ev)
{
    int64_t w = window_of(r, received_at);
    char key[256];
    size_t klen = key_bytes(key, w, ev->site_id, ev->block_id, ev->variant, ev->type);
    uint64_t h = esx_hash64(key, klen, r->seed);
    esx_rollup_row **slot = &r->buckets[h & (r->nbuckets - 1)];
    esx_rollup_row *row = *slot;
    while (row && !(row->hash == h && row->window_start == w &&
                    strcmp(row->site_id, ev->site_id) == 0 &&
                    strcmp(row->block_id, ev->block_id) == 0 &&
                    strcmp(row->variant, ev->variant) == 0 && strcmp(row->type, ev->type) == 0))
        row = row->next;
    int made = row == NULL;
    if (made) {
        if ((r->rows >= r->max_rows && !reclaim(r, w)) ||
            (row = calloc(1, sizeof *row)) == NULL) {
            r->dropped++;
            return 1;
        }
        /* (after reclaim, which may forget rows of this window's predecessors) */
        row->window_start = w;
        row->hash = h;
        snprintf(row->site_id, sizeof row->site_id, "%s", ev->site_id);
        snprintf(row->block_id, sizeof row->block_id, "%s", ev->block_id);
        snprintf(row->variant, sizeof row->variant, "%s", ev->variant);
        snprintf(row->type, sizeof row->type, "%s", ev->type);
    }
    size_t before = made ? 0 : row_bytes(row);
    if (ev->user_id[0]) {
        /* the sketch first: an event whose user_id it cannot take (no memory) is not counted
         * at all -- counted, the row's uniques would fall short of it unseen -- but in
         * dropped, as one whose row could not be made */
        esx_hll *fresh = row->hll == NULL ? esx_hll_new() : NULL;
        esx_hll *hll = row->hll ? row->hll : fresh;
        /* the HLL hash is unseeded: sketches of different processes must merge */
        if (hll == NULL ||
            esx_hll_add_hash(hll, esx_hash64(ev->user_id, strlen(ev->user_id), 0)) != 0) {
            esx_hll_free(fresh);
            if (made)
                free(row);
            r->dropped++;
            return 1;
        }
        row->hll = hll;
    }
    if (made) {
        if (w <= r->forgotten)
            row->gen = ++r->gens;
        row->next = *slot;
        *slot = row;
        r->rows++;
    }
    r->bytes += row_bytes(row) - before; /* (a sketch only grows) */
    row->count++;
    row->dirty = 1;
    return 0;
}

void esx_rollups_current(esx_rollups *r, int64_t now_ms,
                         void (*fn)(const esx_rollup_row *row, void *ud), void *ud)
{
    int64_t w = window_of(r, now_ms);
    for (size_t i = 0; i < r->nbuckets; i++)
        for (esx_rollup_row *row = r->buckets[i]; row; row = row->next)
            if (row->window_start == w)
                fn(row, ud);
}

static int write_row(esx_rollups *r, const esx_rollup_row *row, const char *instance,
                     const char *index_fmt, int (*emit)(void *, const char *, size_t), void *ud)
{
    char index[256], stamp[32], key[256];
    time_t secs = (time_t)(row->window_start / 1000);
    struct tm tm;
    gmtime_r(&secs, &tm);
    if (strftime(index, sizeof index, index_fmt, &tm) == 0)
        return -1;
    /* the window's milliseconds too: a window need not be a whole number of seconds */
    size_t sl = strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(stamp + sl, sizeof stamp - sl, ".%03dZ", (int)(row->window_start % 1000));
    size_t klen = key_bytes(key, row->window_start, row->site_id, row->block_id, row->variant,
                            row->type);
    uint64_t id = esx_hash64(key, klen, ID_SEED);
    char gen[24] = "";
    if (row->gen)
        snprintf(gen, sizeof gen, "-g%llu", (unsigned long long)row->gen);

    unsigned char *raw = NULL;
    char *b64 = NULL;
    size_t rawlen = 0;
    double uniques = 0;
    if (row->hll) {
        rawlen = esx_hll_serialize(row->hll, NULL, 0);
        raw = malloc(rawlen);
        b64 = raw ? malloc(esx_base64_len(rawlen)) : NULL;
        if (b64 == NULL) {
            free(raw);
            return -1;
        }
        esx_hll_serialize(row->hll, raw, rawlen);
        esx_base64_encode(raw, rawlen, b64);
        uniques = esx_hll_estimate(row->hll);
    }
    size_t cap = 2048 + (b64 ? strlen(b64) : 0);
    char *line = malloc(cap);
    int rc = -1;
    if (line) {
        int n = snprintf(line, cap,
                         "{\"index\":{\"_index\":\"%s\",\"_id\":\"%s-%016llx-%lld-%016llx%s\","
                         "\"version\":%llu,\"version_type\":\"external_gte\"}}\n"
                         "{\"instance\":\"%s\",\"window_start\":%lld,\"window\":%lld,"
                         "\"@timestamp\":\"%s\",\"site_id\":\"%s\",\"block_id\":\"%s\","
                         "\"variant\":\"%s\",\"type\":\"%s\",\"count\":%llu,"
                         "\"uniques\":%.0f,\"hll\":\"%s\"}\n",
                         index, instance, (unsigned long long)r->run,
                         (long long)row->window_start, (unsigned long long)id, gen,
                         (unsigned long long)row->count, instance, (long long)row->window_start,
                         (long long)r->window, stamp,
                         row->site_id, row->block_id, row->variant, row->type,
                         (unsigned long long)row->count, uniques, b64 ? b64 : "");
        if (n > 0 && (size_t)n < cap)
            rc = emit(ud, line, (size_t)n);
    }
    free(line);
    free(raw);
    free(b64);
    return rc;
}

int esx_rollups_emit(esx_rollups *r, int64_t now_ms, int all, const char *instance,
                     const char *index_fmt,
                     int (*emit)(void *ud, const char *line, size_t len), void *ud)
{
    int64_t current = window_of(r, now_ms);
    int written = 0;
    for (size_t i = 0; i < r->nbuckets; i++) {
        esx_rollup_row **p = &r->buckets[i];
        while (*p) {
            esx_rollup_row *row = *p;
            int ended = row->window_start < current;
            if (row->dirty && (all || ended)) {
                int rc = write_row(r, row, instance, index_fmt, emit, ud);
                if (rc < 0)
                    return -1;
                if (rc > 0)
                    return written; /* no room: the rest stays dirty for the next call */
                row->dirty = 0;
                r->reclaimable = 1;
                written++;
            }
            if (ended && !row->dirty && row->window_start + r->window + ROW_GRACE_MS <= now_ms) {
                forget_row(r, p);
            } else {
                p = &row->next;
            }
        }
    }
    return written;
}

size_t esx_rollups_rows(const esx_rollups *r)
{
    return r->rows;
}

size_t esx_rollups_dirty(const esx_rollups *r)
{
    size_t n = 0;
    for (size_t i = 0; i < r->nbuckets; i++)
        for (const esx_rollup_row *row = r->buckets[i]; row; row = row->next)
            n += row->dirty != 0;
    return n;
}

uint64_t esx_rollups_dropped(const esx_rollups *r)
{
    return r->dropped;
}

size_t esx_rollups_memory(const esx_rollups *r)
{
    return r->bytes;
}

int64_t esx_rollups_window(const esx_rollups *r)
{
    return r->window;
}
