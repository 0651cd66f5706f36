/*
 * collector_ship.c -- the shipper thread: it batches queued items into _bulk requests on the
 * client's engine, reads their results (on the engine's I/O thread), retries, files and
 * writes dead letters, queues rollup rows, and keeps the spool (loads its backlog, syncs it,
 * claims dead processes' segments).  See collector_int.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bulk_response.h"
#include "clock.h"
#include "collector_int.h"

#define BULK_TARGET "/_bulk?filter_path=errors,items.*.status,items.*.error"
#define ORPHAN_SCAN_MS 2000
#define BATCH_FLOOR ((size_t)1024) /* batch_cap never goes below it on a 413 */
#define LOAD_PER_PASS ((size_t)1 << 20) /* bytes of spool records loaded per shipper pass */
#define LETTER_RETRY_MS 100 /* dead letters wait this long for another process's flock */

/* ---------------------------------------------------------------- dead letters */

/* Bytes a filed letter holds, charged to queue_bytes (queue_max_bytes) from its filing until
 * it is written: while another process holds the file's lock the letters wait in memory, as
 * long as it holds it, and each holds a copy of its event and the error besides -- uncharged,
 * they took memory past the bound the user set (several times their events' own charge for
 * small events with a long reason). */
static size_t letter_cost(const esx_dead_letter *l)
{
    return sizeof *l + l->len + 1;
}

/* Files a dead letter for it (rejected for good with status, type, reason): the line is made
 * now and written by the shipper without the lock (write_letters); the item stays queued --
 * counted against queue_max_bytes, its spool segment kept -- until its line is in the file,
 * and the line is counted there too.  Never refused for room (that would lose the event
 * Elasticsearch refused): the queue may pass queue_max_bytes by the letters of the bulks in
 * flight, and the intake spills or answers 503 until they are written.  Called under mu. */
static void dead_letter(esx_collector *col, item *it, int status, const char *type,
                        const char *reason)
{
    if (!it->rollup)
        col->st.dead_lettered++;
    esx_dead_letter *l = NULL;
    if (col->dl.fd >= 0)
        l = esx_dead_letter_new(esx_wall_ms(), status, type, reason, it->data, it->len);
    if (l == NULL) {
        /* the file could not be opened, or no memory for the line: the event is not in it */
        if (col->cfg.dead_letter_path[0])
            col->st.dead_letter_failed++;
        esx_col_item_done(col, it);
        return;
    }
    l->ud = it;
    col->queue_bytes += letter_cost(l);
    if (col->letters_tail)
        col->letters_tail->next = l;
    else
        col->letters = l;
    col->letters_tail = l;
}

/* Writes the dead letters filed so far, letting go of mu meanwhile (file I/O: a hung
 * filesystem must not stall the intake), then lets their items go.  While another process
 * holds the file's lock the letters not written yet are kept, in their order, and tried
 * again LETTER_RETRY_MS later: waiting for the lock here held up the shipping, the spool's
 * syncs (the power-loss bound) and the replay for as long as that process held it.  The
 * kept letters and their items stay queued, counted against queue_max_bytes: the intake
 * spills or refuses when they fill it.  Called with mu held. */
static void write_letters(esx_collector *col)
{
    esx_dead_letter *list = col->letters, *kept = NULL;
    col->letters = col->letters_tail = NULL;
    if (list == NULL)
        return;
    pthread_mutex_unlock(&col->mu);
    int failed = 0;
    for (esx_dead_letter *l = list; l; l = l->next) {
        int rc = esx_dead_letter_write(&col->dl, l);
        if (rc > 0) { /* another process holds the lock: l and the rest wait */
            kept = l;
            break;
        }
        if (rc != 0)
            failed++;
    }
    pthread_mutex_lock(&col->mu);
    col->st.dead_letter_failed += (uint64_t)failed;
    while (list != kept) {
        esx_dead_letter *next = list->next;
        esx_col_item_done(col, list->ud);
        col->queue_bytes -= letter_cost(list);
        free(list);
        list = next;
    }
    if (kept) {
        /* before those filed meanwhile */
        esx_dead_letter *tail = kept;
        while (tail->next)
            tail = tail->next;
        tail->next = col->letters;
        col->letters = kept;
        if (col->letters_tail == NULL)
            col->letters_tail = tail;
        col->letters_due = esx_now_ms() + LETTER_RETRY_MS;
    }
    pthread_cond_broadcast(&col->idle);
}

/* ---------------------------------------------------------------- results */

/* One back-off for the items of a batch that failed: by the most-tried item's count. */
static int64_t batch_due(esx_collector *col, batch *b, int64_t now)
{
    int attempts = 0;
    for (int i = 0; i < b->n; i++)
        if (b->items[i]->attempts > attempts)
            attempts = b->items[i]->attempts;
    return now + esx_col_backoff(col, attempts + 1);
}

/* Takes b off the list of batches in flight.  Called under mu. */
static void sent_remove(esx_collector *col, batch *b)
{
    for (batch **p = &col->sent; *p; p = &(*p)->next_sent) {
        if (*p == b) {
            *p = b->next_sent;
            return;
        }
    }
}

/* A bulk failed as a whole (the sink is down, refuses or answers garbage): no bulk goes until
 * that bulk's own retry is due, so the failed batch is the probe.  New events wait behind it
 * in the queue -- sending each new batch would fail the same way, after compressing it, at the
 * rate batches fill.  Called under mu. */
static void pause_sink(esx_collector *col, int64_t due)
{
    if (due > col->paused_until)
        col->paused_until = due;
}

static void batch_done(esx_request *req, void *ud)
{
    batch *b = ud;
    esx_collector *col = b->col;
    int status = req->err_kind ? 0 : (int)req->status;
    esx_bulk_item *results = NULL;
    int parsed = 0;
    char why[128];
    if (status == 200) {
        results = calloc((size_t)b->n, sizeof *results);
        parsed = results && esx_bulk_response_parse(req->resp_body.data, req->resp_body.len,
                                                    results, b->n, why) == 0;
    }
    int64_t now = esx_now_ms();
    pthread_mutex_lock(&col->mu);
    sent_remove(col, b);
    col->st.bulk_requests++;
    if (status == 413 && b->n > 1 && b->bytes > BATCH_FLOOR) {
        /* the server refused the size: halve batches (never back up: two bulks refused at
         * once both lower it) and send these again.  The new cap, at least the floor, is
         * below this bulk's size: its items go again in smaller bulks, down to one event,
         * which is dead-lettered if refused too (with 2 KiB here, a bulk of 1-2 KiB was
         * retried whole for ever, pausing every other bulk, when the sink took less). */
        size_t half = b->bytes / 2 > BATCH_FLOOR ? b->bytes / 2 : BATCH_FLOOR;
        if (half < col->batch_cap)
            col->batch_cap = half;
        for (int i = b->n - 1; i >= 0; i--)
            esx_col_ready_prepend(col, b->items[i]);
    } else if (!parsed) {
        /* (a 413 for a bulk of several events within the floor is a failure like any
         * other: halving cannot make it smaller, so resending it at once would loop as fast
         * as the server answers) */
        col->st.bulk_failures++;
        run r = { .due = batch_due(col, b, now) };
        if (status != 413 || b->n > 1)
            pause_sink(col, r.due);
        for (int i = 0; i < b->n; i++) {
            if (status == 413 && b->n == 1) {
                dead_letter(col, b->items[i], 413, "request_too_large",
                            "the server refused a single event as too large");
            } else {
                esx_col_retry_later(col, &r, b->items[i]);
            }
        }
        esx_col_delay_run(col, &r);
    } else {
        col->paused_until = 0; /* the sink answers: new batches may go at once */
        run r = { .due = batch_due(col, b, now) };
        for (int i = 0; i < b->n; i++) {
            int s = results[i].status;
            if ((s >= 200 && s < 300) || s == 409) { /* 409: created by an earlier attempt */
                if (!b->items[i]->rollup)
                    col->st.shipped++;
                esx_col_item_done(col, b->items[i]);
            } else if (s == 429 || s >= 500 || s < 100) {
                /* s < 100: no readable status (a proxy's or a broken sink's answer): the
                 * outcome is unknown, so the item is tried again, never dead-lettered */
                esx_col_retry_later(col, &r, b->items[i]);
            } else {
                dead_letter(col, b->items[i], s, results[i].error_type, results[i].reason);
            }
        }
        esx_col_delay_run(col, &r);
    }
    if (col->letters && (!col->running || col->stop))
        write_letters(col); /* the shipper is gone, or leaving (it writes what it sees first) */
    /* in flight until its dead letters are written: close() keeps the spool open meanwhile,
     * so their events' segments are released (a closed spool would leave them for a replay,
     * and the replay would dead-letter them twice) */
    col->inflight--;
    pthread_cond_broadcast(&col->wake);
    pthread_cond_broadcast(&col->idle);
    pthread_mutex_unlock(&col->mu);
    free(results);
    free(b);
    esx_col_unref(col);
}

/* ---------------------------------------------------------------- shipper */

static batch *take_batch(esx_collector *col)
{
    int max = col->cfg.batch_max_events;
    size_t cap = col->batch_cap;
    int n = 0;
    size_t bytes = 0;
    for (item *it = col->ready_head; it && n < max; it = it->next) {
        if (n > 0 && bytes + it->len > cap)
            break;
        bytes += it->len;
        n++;
    }
    batch *b = malloc(sizeof *b + (size_t)n * sizeof(item *));
    if (b == NULL)
        return NULL;
    b->col = col;
    b->n = n;
    b->bytes = bytes;
    b->oldest = col->ready_head ? col->ready_head->queued_at : 0;
    for (int i = 0; i < n; i++) {
        item *it = col->ready_head;
        col->ready_head = it->next;
        col->ready_bytes -= it->len;
        col->ready_count--;
        it->next = NULL;
        b->items[i] = it;
        if (it->queued_at < b->oldest)
            b->oldest = it->queued_at;
    }
    if (!col->ready_head)
        col->ready_tail = NULL;
    b->next_sent = col->sent;
    col->sent = b;
    return b;
}

/* ---------------------------------------------------------------- the spool's syncs */

/* Syncs the spool's segments when spool_sync_interval is up (or sealed segments pile up),
 * letting go of mu while the disk writes.  Called with mu held, by the shipper thread: on
 * each pass, and while it waits for an index's creation (the power-loss bound must not wait
 * on the sink). */
static void sync_spool(esx_collector *col, int64_t now)
{
    if (col->spool == NULL)
        return;
    if (now - col->last_sync >= col->cfg.spool_sync_interval ||
        esx_spool_sync_wanted(col->spool)) {
        /* the disk write without the lock: in nginx the intake runs on the worker's
         * event loop, which would wait out every fdatasync.  Every segment sealed
         * until now is synced: a pass takes a few, so passes follow while they wait
         * (as many as they need, not those sealed meanwhile: for the next sync) --
         * and every segment claimed from a dead process (a few a pass too) */
        int rounds = (col->spool->n_unsynced + col->spool->n_claim_unsynced) /
                         (ESX_SPOOL_SYNC_FDS - 3) + 1;
        col->last_sync = now;
        while (rounds-- > 0) {
            int fds[ESX_SPOOL_SYNC_FDS];
            int n = esx_spool_sync_begin(col->spool, fds);
            if (n > 0) {
                pthread_mutex_unlock(&col->mu);
                int failed = esx_spool_sync_end(fds, n), err = errno;
                pthread_mutex_lock(&col->mu);
                /* (the spool is still there: close() joins this thread before closing it) */
                esx_spool_sync_failed(col->spool, failed, err);
            }
            if (col->spool->n_unsynced == 0 && col->spool->n_claim_unsynced == 0)
                break;
        }
    }
}

/* ---------------------------------------------------------------- index creation */

/* What create_index creates each new index with.  Under dynamic mapping the first document
 * of the day types its fields: one event whose site_id looks like a date ("2024-01-01")
 * would make site_id a date field, and every other site's events of that day would be
 * refused (dead letters).  So the fields every event or rollup row has are mapped here --
 * identifiers as keywords, times as dates -- and date_detection is off for the rest. */
static const char EVENT_MAPPINGS[] =
    "{\"mappings\":{\"date_detection\":false,\"properties\":{"
    "\"site_id\":{\"type\":\"keyword\"},\"type\":{\"type\":\"keyword\"},"
    "\"block_id\":{\"type\":\"keyword\"},\"variant\":{\"type\":\"keyword\"},"
    "\"user_id\":{\"type\":\"keyword\"},\"event_id\":{\"type\":\"keyword\"},"
    "\"ts\":{\"type\":\"date\",\"format\":\"epoch_millis\"},"
    "\"received_at\":{\"type\":\"date\",\"format\":\"epoch_millis\"}}}}";
static const char ROLLUP_MAPPINGS[] =
    "{\"mappings\":{\"date_detection\":false,\"properties\":{"
    "\"instance\":{\"type\":\"keyword\"},\"window_start\":{\"type\":\"long\"},"
    "\"window\":{\"type\":\"long\"},\"@timestamp\":{\"type\":\"date\"},"
    "\"site_id\":{\"type\":\"keyword\"},\"block_id\":{\"type\":\"keyword\"},"
    "\"variant\":{\"type\":\"keyword\"},\"type\":{\"type\":\"keyword\"},"
    "\"count\":{\"type\":\"long\"},\"uniques\":{\"type\":\"long\"},"
    "\"hll\":{\"type\":\"binary\"}}}}";

#define CREATE_TIMEOUT_MS 10000 /* the shipper waits this long at most for a creation */

/* The index named in an item's action line ({"create":{"_index":"NAME",...), into out
 * (ESX_COL_INDEX_MAX bytes).  Returns 0, or -1 when the line names none. */
static int item_index(const item *it, char *out)
{
    static const char key[] = "\"_index\":\"";
    const char *nl = memchr(it->data, '\n', it->len);
    size_t n = nl ? (size_t)(nl - it->data) : it->len;
    const char *p = memmem(it->data, n, key, sizeof key - 1);
    if (p == NULL)
        return -1;
    p += sizeof key - 1;
    const char *q = memchr(p, '"', n - (size_t)(p - it->data));
    if (q == NULL || q - p >= ESX_COL_INDEX_MAX)
        return -1;
    memcpy(out, p, (size_t)(q - p));
    out[q - p] = '\0';
    return 0;
}

/* Makes sure index name exists, with esx's mappings, before this process's first bulk to it
 * (create_index): creates it, or finds it there.  Returns 0 when bulks to it may go --
 * created, already there, or refused for good (403 without the privilege, 400 a name
 * taken by a data stream, ...: counted in index_create_failed, and Elasticsearch's
 * auto-creation decides, as without create_index) -- or -1 when the sink did not answer
 * (down, 429, 5xx: the batch fails as a bulk that could not be sent, and tries again).
 * The shipper thread's, called without mu: it waits up to CREATE_TIMEOUT_MS, once a day
 * per index and process, syncing the spool meanwhile. */
static int ensure_index(esx_collector *col, const char *name, int rollup)
{
    for (int i = 0; i < ESX_COL_ENSURED; i++)
        if (strcmp(col->ensured[i], name) == 0)
            return 0;
    /* the name is valid (checked with the pattern at creation) and has no byte a path must
     * escape but these */
    char target[1 + 3 * ESX_COL_INDEX_MAX], why[256];
    size_t o = 0;
    target[o++] = '/';
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
            *p == '.' || *p == '+') {
            target[o++] = (char)*p;
        } else {
            snprintf(target + o, 4, "%%%02X", *p);
            o += 3;
        }
    }
    target[o] = '\0';
    const char *body = rollup ? ROLLUP_MAPPINGS : EVENT_MAPPINGS;
    esx_request *req = esx_client_prepare(col->client, "PUT", target, body, strlen(body),
                                          "application/json", NULL, 0, -1, CREATE_TIMEOUT_MS, why);
    if (req == NULL)
        return -1;
    int rc = -1, created = 0, refused = 0, done = 0;
    const char *kind = NULL;
    if (esx_client_submit(col->client, req, &kind, why) == 0) {
        /* in slices: close() stops the wait (the batch then fails, and is kept) */
        while (!(done = esx_client_wait(col->client, req, 100))) {
            pthread_mutex_lock(&col->mu);
            int stop = col->stop;
            /* the spool's syncs keep their interval meanwhile: the power-loss bound
             * (spool_sync_interval) must not wait on the sink */
            if (!stop)
                sync_spool(col, esx_now_ms());
            pthread_mutex_unlock(&col->mu);
            if (stop)
                break;
        }
    }
    if (done && req->err_kind == NULL) {
        long st = req->status;
        if (st >= 200 && st < 300) {
            rc = 0;
            created = 1;
        } else if (st == 400 && req->resp_body.data &&
                   (memmem(req->resp_body.data, req->resp_body.len,
                           "resource_already_exists_exception", 33) ||
                    memmem(req->resp_body.data, req->resp_body.len,
                           "index_already_exists_exception", 30))) {
            rc = 0;
        } else if (st >= 400 && st < 500 && st != 408 && st != 429) {
            rc = 0;
            refused = 1;
        }
    }
    esx_request_unref(req);
    if (rc != 0)
        return -1;
    memmove(col->ensured[1], col->ensured[0], (ESX_COL_ENSURED - 1) * sizeof col->ensured[0]);
    snprintf(col->ensured[0], sizeof col->ensured[0], "%s", name);
    pthread_mutex_lock(&col->mu);
    col->st.indices_created += (uint64_t)created;
    col->st.index_create_failed += (uint64_t)refused;
    pthread_mutex_unlock(&col->mu);
    return 0;
}

/* ensure_index for the indices of a batch's items, as create_index and
 * create_rollup_index ask.  Returns 0, or -1 when one could not be made sure of. */
static int ensure_indices(esx_collector *col, const batch *b)
{
    char name[ESX_COL_INDEX_MAX], last[ESX_COL_INDEX_MAX] = "";
    for (int i = 0; i < b->n; i++) {
        const item *it = b->items[i];
        if (!(it->rollup ? col->cfg.create_rollup_index : col->cfg.create_index))
            continue;
        if (item_index(it, name) != 0 || strcmp(name, last) == 0)
            continue;
        if (ensure_index(col, name, it->rollup) != 0)
            return -1;
        memcpy(last, name, sizeof last);
    }
    return 0;
}

/* ---------------------------------------------------------------- sending */

/* Sends a batch (called without the lock).  On failure the items go back, delayed. */
static void send_batch(esx_collector *col, batch *b)
{
    char why[256];
    char *body = ensure_indices(col, b) == 0 ? malloc(b->bytes + 1) : NULL;
    esx_request *req = NULL;
    if (body) {
        size_t o = 0;
        for (int i = 0; i < b->n; i++) {
            memcpy(body + o, b->items[i]->data, b->items[i]->len);
            o += b->items[i]->len;
        }
        /* only what batch_done reads comes back: an item's status and error (a quarter of
         * the bytes to receive and parse; the action's _index, _id, _version, result, _shards,
         * _seq_no are dropped by Elasticsearch) */
        req = esx_client_prepare(col->client, "POST", BULK_TARGET, body, o, "application/x-ndjson",
                                 NULL, 0, 0, 0, why);
        free(body);
    }
    const char *kind = NULL;
    if (req) {
        req->on_done = batch_done;
        req->on_done_ud = b;
        atomic_fetch_add(&col->refs, 1);
        if (esx_client_submit(col->client, req, &kind, why) == 0) {
            esx_request_unref(req); /* the engine holds it now */
            return;
        }
        atomic_fetch_sub(&col->refs, 1);
        esx_request_unref(req);
    }
    int64_t now = esx_now_ms();
    pthread_mutex_lock(&col->mu);
    sent_remove(col, b);
    col->st.bulk_requests++; /* a bulk made, that failed as a whole: bulk_failures <= it */
    col->st.bulk_failures++;
    run r = { .due = batch_due(col, b, now) };
    pause_sink(col, r.due);
    for (int i = 0; i < b->n; i++)
        esx_col_retry_later(col, &r, b->items[i]);
    esx_col_delay_run(col, &r);
    col->inflight--;
    pthread_cond_broadcast(&col->idle);
    pthread_mutex_unlock(&col->mu);
    free(b);
}

/* Queues a rollup row while the queue has room (a flush or close takes every row: the
 * table is bounded by rollup.max_rows); returns 1 to stop when it has none. */
static int emit_rollup_line(void *ud, const char *line, size_t len)
{
    esx_collector *col = ud;
    if (!col->emit_now && col->queue_bytes >= col->cfg.queue_max_bytes)
        return 1;
    item *it = esx_col_item_new(line, len, esx_now_ms(), NULL);
    if (it == NULL)
        return -1;
    it->rollup = 1;
    esx_col_enqueue(col, it);
    col->queue_rollups++;
    col->st.rollup_written++;
    return 0;
}

int esx_col_queue_rollups(esx_collector *col)
{
    if (col->rollups == NULL)
        return 0;
    int was = col->emit_now;
    col->emit_now = 1; /* every dirty row, whatever the queue holds */
    int rc = esx_rollups_emit(col->rollups, esx_wall_ms(), 1, col->cfg.instance,
                              col->cfg.rollup_index_fmt, emit_rollup_line, col);
    col->emit_now = was;
    return rc < 0 ? -1 : 0;
}

/* Splits a replayed spool record into items (pairs of lines), all or none: returns the
 * number queued, or -1 with nothing queued when memory ran out (the spool reads the record
 * again later).  Called under mu. */
static int64_t replay_record(void *ud, esx_segment *seg, const char *data, size_t len)
{
    esx_collector *col = ud;
    int64_t now = esx_now_ms(), n = 0;
    item *head = NULL, **tail = &head;
    size_t pos = 0;
    while (pos < len) {
        const char *a = memchr(data + pos, '\n', len - pos);
        if (a == NULL)
            break;
        const char *d = memchr(a + 1, '\n', len - (size_t)(a + 1 - data));
        if (d == NULL)
            break;
        size_t end = (size_t)(d - data) + 1;
        item *it = esx_col_item_new(data + pos, end - pos, now, seg);
        if (it == NULL) {
            esx_col_free_list(head);
            return -1;
        }
        /* rollup rows a closing process spooled (an index operation; events are creates) */
        it->rollup = it->len > 8 && memcmp(it->data, "{\"index\"", 8) == 0;
        *tail = it;
        tail = &it->next;
        n++;
        pos = end;
    }
    while (head) {
        item *it = head;
        head = it->next;
        esx_col_enqueue(col, it);
        if (it->rollup) {
            col->queue_rollups++;
        } else {
            col->st.replayed++;
        }
    }
    return n;
}

/* Called with mu held; lets go of it while the spool syncs to disk. */
static void housekeeping(esx_collector *col, int64_t now)
{
    /* delayed retries that are due go back to the front */
    while (col->delayed && col->delayed->due <= now) {
        run *r = col->delayed;
        col->delayed = r->next;
        col->delayed_count -= r->count;
        esx_col_ready_prepend_run(col, r);
        free(r);
    }
    int emit_failed = 0;
    if (col->rollups) {
        /* The table is walked only when there is something to write: every rollup.interval
         * (dirty rows of the open window), or once a window has ended -- not on every wake. */
        int64_t wall = esx_wall_ms();
        int64_t window = esx_rollups_window(col->rollups);
        int64_t current = wall - wall % window;
        int all = col->emit_now || now - col->last_rollup_emit >= col->cfg.rollup_interval;
        if ((all || current != col->rollup_window_seen) &&
            col->queue_bytes >= col->cfg.queue_max_bytes && !col->emit_now) {
            /* No room (the sink is away): the rows stay dirty in the table, bounded by
             * rollup.max_rows, and are written once the queue drains -- a copy per interval
             * of every dirty row would grow the queue past its bound for the whole outage. */
            col->last_rollup_emit = now;
        } else if (all || current != col->rollup_window_seen) {
            if (esx_rollups_emit(col->rollups, wall, all, col->cfg.instance,
                                 col->cfg.rollup_index_fmt, emit_rollup_line, col) >= 0) {
                col->rollup_window_seen = current;
                if (all)
                    col->last_rollup_emit = now;
            } else {
                emit_failed = 1; /* out of memory: the rows not queued stay dirty */
            }
        }
    }
    /* flush() and close() wait until every row is queued: after a failure emit_now stays set,
     * and the next pass (their wait keeps waking this thread) tries again */
    if (col->emit_now && !emit_failed) {
        col->emit_now = 0;
        pthread_cond_broadcast(&col->idle); /* flush() waits for the rows to be queued */
    }
    if (col->spool) {
        if (now - col->last_orphan_scan >= ORPHAN_SCAN_MS) {
            esx_spool_claim_orphans(col->spool);
            col->last_orphan_scan = now;
        }
        /* load what waits on disk into the room memory has: at most LOAD_PER_PASS a pass
         * (the next pass is 20 ms away), the records read from disk without the lock, so
         * that the intake never waits for the disk (a slow or failing one held every
         * request for as long as the reads took) */
        if (esx_spool_has_backlog(col->spool) && col->queue_bytes < col->cfg.queue_max_bytes) {
            size_t room = (col->cfg.queue_max_bytes - col->queue_bytes) / 2 + 1;
            esx_spool_load(col->spool, room < LOAD_PER_PASS ? room : LOAD_PER_PASS, replay_record, col,
                           &col->mu);
        }
    }
    sync_spool(col, now);
}

static int64_t next_deadline(esx_collector *col, int64_t now)
{
    int64_t t = now + 1000;
    /* With every bulk slot busy, a due flush waits for batch_done's wake-up, not a timer
     * (a deadline already past would make the wait return at once: a busy loop); while the
     * sink is paused, for the end of the pause. */
    if (col->ready_head && now < col->paused_until) {
        if (col->paused_until < t)
            t = col->paused_until;
    } else if (col->ready_head && col->inflight < col->cfg.bulk_concurrency &&
               col->ready_head->queued_at + col->cfg.flush_interval < t) {
        t = col->ready_head->queued_at + col->cfg.flush_interval;
    }
    if (col->delayed && col->delayed->due < t)
        t = col->delayed->due;
    if (col->letters && col->letters_due < t)
        t = col->letters_due; /* dead letters wait for another process's flock */
    if (col->rollups && col->last_rollup_emit + col->cfg.rollup_interval < t)
        t = col->last_rollup_emit + col->cfg.rollup_interval;
    /* (spool_sync_interval 0 syncs on every pass, whatever woke it: a deadline of
     * last_sync + 0 would always be due, and the shipper would spin) */
    if (col->spool && col->cfg.spool_sync_interval > 0 &&
        col->last_sync + col->cfg.spool_sync_interval < t)
        t = col->last_sync + col->cfg.spool_sync_interval;
    if (col->spool && esx_spool_sync_wanted(col->spool))
        t = now; /* sealed segments pile up: sync them now */
    if (col->spool && esx_spool_has_backlog(col->spool) && col->queue_bytes < col->cfg.queue_max_bytes / 2 &&
        now + 20 < t)
        t = now + 20; /* room for the backlog: load more soon */
    return t < now ? now : t;
}

static int should_send(esx_collector *col, int64_t now)
{
    if (col->inflight >= col->cfg.bulk_concurrency || col->ready_count == 0 ||
        now < col->paused_until)
        return 0;
    return col->ready_bytes >= col->batch_cap || col->ready_count >= col->cfg.batch_max_events ||
           col->flush_requested || col->stop ||
           now - col->ready_head->queued_at >= col->cfg.flush_interval;
}

void *esx_col_shipper_main(void *arg)
{
    esx_collector *col = arg;
    pthread_mutex_lock(&col->mu);
    while (!col->stop) {
        int64_t now = esx_now_ms();
        if (col->letters && now >= col->letters_due) {
            write_letters(col);
            continue;
        }
        housekeeping(col, now);
        if (should_send(col, now)) {
            batch *b = take_batch(col);
            if (b) {
                col->inflight++;
                pthread_mutex_unlock(&col->mu);
                send_batch(col, b);
                pthread_mutex_lock(&col->mu);
                continue;
            }
        }
        struct timespec ts = esx_mono_after(next_deadline(col, now) - now);
        pthread_cond_timedwait(&col->wake, &col->mu, &ts);
    }
    write_letters(col); /* filed before stop: batch_done writes those filed after */
    pthread_mutex_unlock(&col->mu);
    return NULL;
}
