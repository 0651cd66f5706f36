/*
 * collector.c -- intake, admission, the queue and the shipper (see collector.h).
 *
 * Locks: `mu` guards the queue, the counters, the rollups, the rate limiter and the spool;
 * it is held for short, non-blocking work only (the spool's append is a write(2) to the page
 * cache).  `intake_mu` serialises the parse scratch buffers.  Batches in flight hold a
 * reference to the collector, so results arriving after close() find it alive.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bulk_response.h"
#include "clock.h"
#include "collector.h"
#include "deadletter.h"
#include "private.h"
#include "proc.h"
#include "ratelimit.h"
#include "rollup.h"
#include "spool.h"

const char *const esx_reject_names[ESX_RJ_COUNT] = {
    "invalid", "not_json", "too_large", "too_many", "queue_full",
    "rate_limited", "spool", "closed", "nomem",
};

#define ITEM_OVERHEAD 64     /* bytes charged per queued event beyond its text */
/* Bytes esx adds to an event's document beyond the body's own bytes (documents are the
 * body's, minified): ',"received_at":<ms>,"event_id":"<20>"}' and the '\n' (event.c's tail,
 * at most 96). */
#define DOC_ADDED 128
#define BULK_TARGET "/_bulk?filter_path=errors,items.*.status,items.*.error"
#define ORPHAN_SCAN_MS 2000
#define LOAD_PER_PASS ((size_t)1 << 20) /* bytes of spool records loaded per shipper pass */

typedef struct item {
    struct item *next;
    size_t len;
    int attempts;
    int64_t queued_at;       /* monotonic ms */
    esx_segment *seg;
    int rollup;              /* a rollup row, not an event */
    char data[];             /* action line + document line, '\n'-terminated */
} item;

/* Items waiting for a retry.  Those that failed together share one due time (see batch_due)
 * and wait as one run, so they come back as one batch -- per-item jitter would split a failed
 * bulk of N events into up to N tiny bulks against a sink that is down -- and the shipper's
 * wake-ups and stats() look at runs, not at every delayed event (a long outage can delay
 * hundreds of thousands). */
typedef struct run {
    struct run *next;        /* the next run, due later */
    int64_t due;             /* monotonic ms when the items may go again */
    int64_t oldest;          /* earliest queued_at of its items */
    item *head, *tail;
    size_t bytes;            /* sum of the items' len */
    int count;
} run;

typedef struct batch {
    esx_collector *col;
    struct batch *next_sent; /* the collector's list of batches in flight */
    int64_t oldest;          /* earliest queued_at of its items */
    int n;
    size_t bytes;
    item *items[];
} batch;

struct esx_collector {
    esx_collector_config cfg;
    esx_client *client;
    atomic_int refs;
    pthread_mutex_t mu, intake_mu;
    pthread_cond_t wake, idle;
    pid_t pid;
    pthread_t thread;
    int running, stop, closed, flush_requested, emit_now, auto_instance;

    item *ready_head, *ready_tail;
    size_t ready_bytes;
    int ready_count;
    run *delayed;            /* sorted by due */
    batch *sent;             /* in flight (at most bulk_concurrency) */
    int64_t delayed_count;
    int64_t paused_until;    /* monotonic ms: no bulk goes before (the sink failed a whole bulk) */
    int inflight;
    size_t queue_bytes;
    int64_t queue_events;    /* items queued, rollup rows included */
    int64_t queue_rollups;   /* of which rollup rows */
    size_t batch_cap;

    esx_idgen ids;
    esx_rollups *rollups;
    int64_t last_rollup_emit;
    int64_t rollup_window_seen; /* start of the window the table was last checked in */
    esx_spool *spool;
    int64_t last_sync, last_orphan_scan;
    esx_ratelimit *rl;
    esx_dead_letters dl;
    esx_dead_letter *letters, *letters_tail; /* filed, not written yet (write_letters) */
    unsigned rng;
    esx_collector_counters st;

    /* intake scratch, under intake_mu */
    char action[300];        /* {"create":{"_index":"<index of action_secs>","_id":" */
    size_t action_len;       /* 0: not made yet */
    time_t action_secs;
    esx_event *events;
    esx_event_reject *rejects;
    size_t *offs;
    const char **sites;
    int *counts;
    esx_buf docs, lines;
};

/* ---------------------------------------------------------------- items and queue */

static size_t item_cost(const item *it)
{
    return it->len + ITEM_OVERHEAD;
}

static item *item_new(const char *data, size_t len, int64_t now, esx_segment *seg)
{
    if (len > SIZE_MAX - sizeof(item))
        return NULL;
    item *it = malloc(sizeof *it + len); /* one allocation per queued event */
    if (it == NULL)
        return NULL;
    memcpy(it->data, data, len);
    it->len = len;
    it->attempts = 0;
    it->queued_at = now;
    it->seg = seg;
    it->rollup = 0;
    it->next = NULL;
    return it;
}

static void ready_append(esx_collector *col, item *it)
{
    it->next = NULL;
    if (col->ready_tail)
        col->ready_tail->next = it;
    else
        col->ready_head = it;
    col->ready_tail = it;
    col->ready_bytes += it->len;
    col->ready_count++;
}

static void ready_prepend(esx_collector *col, item *it)
{
    it->next = col->ready_head;
    col->ready_head = it;
    if (!col->ready_tail)
        col->ready_tail = it;
    col->ready_bytes += it->len;
    col->ready_count++;
}

/* Queues a new item (already counted by the caller in queue_bytes/queue_events). */
static void enqueue(esx_collector *col, item *it)
{
    ready_append(col, it);
    col->queue_bytes += item_cost(it);
    col->queue_events++;
}

/* An item leaves the queue for good (acknowledged or dead-lettered). */
static void item_done(esx_collector *col, item *it)
{
    col->queue_bytes -= item_cost(it);
    col->queue_events--;
    if (it->rollup)
        col->queue_rollups--;
    if (it->seg && col->spool)
        esx_spool_release(col->spool, it->seg, 1);
    free(it);
}

static int64_t backoff(esx_collector *col, int attempts)
{
    int64_t base = col->cfg.backoff_min;
    for (int i = 1; i < attempts && base < col->cfg.backoff_max; i++)
        base *= 2;
    if (base > col->cfg.backoff_max)
        base = col->cfg.backoff_max;
    col->rng = col->rng * 1103515245u + 12345u;
    return base / 2 + (int64_t)((col->rng >> 8) % (unsigned)(base / 2 + 1));
}

/* Adds it to r, a run being filled on the caller's stack (see delay_run). */
static void retry_later(esx_collector *col, run *r, item *it)
{
    it->attempts++;
    it->next = NULL;
    if (r->tail)
        r->tail->next = it;
    else
        r->head = it;
    r->tail = it;
    r->bytes += it->len;
    r->count++;
    if (r->count == 1 || it->queued_at < r->oldest)
        r->oldest = it->queued_at;
    if (!it->rollup)
        col->st.retried++;
}

/* Puts the items back at the front of the ready queue, in their order. */
static void ready_prepend_run(esx_collector *col, const run *r)
{
    r->tail->next = col->ready_head;
    col->ready_head = r->head;
    if (!col->ready_tail)
        col->ready_tail = r->tail;
    col->ready_bytes += r->bytes;
    col->ready_count += r->count;
}

/* Files the stack run r (filled by retry_later) among the delayed runs, by due time.  Without
 * memory for its header the items join the latest run, or go back to the ready queue. */
static void delay_run(esx_collector *col, const run *r)
{
    if (r->count == 0)
        return;
    col->delayed_count += r->count;
    run *copy = malloc(sizeof *copy);
    if (copy == NULL) {
        run *last = col->delayed;
        while (last && last->next)
            last = last->next;
        if (last == NULL) {
            col->delayed_count -= r->count;
            ready_prepend_run(col, r);
            return;
        }
        last->tail->next = r->head;
        last->tail = r->tail;
        last->bytes += r->bytes;
        last->count += r->count;
        if (r->oldest < last->oldest)
            last->oldest = r->oldest;
        return;
    }
    *copy = *r;
    run **p = &col->delayed;
    while (*p && (*p)->due <= copy->due)
        p = &(*p)->next;
    copy->next = *p;
    *p = copy;
}

static void free_list(item *it)
{
    while (it) {
        item *next = it->next;
        free(it);
        it = next;
    }
}

static void free_runs(run *r)
{
    while (r) {
        run *next = r->next;
        free_list(r->head);
        free(r);
        r = next;
    }
}

/* ---------------------------------------------------------------- dead letters */

/* Files a dead letter for it (rejected for good with status, type, reason): the line is made
 * now and written by the shipper without the lock (write_letters); the item stays queued --
 * counted against queue_max_bytes, its spool segment kept -- until its line is in the file.
 * Called under mu. */
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
        item_done(col, it);
        return;
    }
    l->ud = it;
    if (col->letters_tail)
        col->letters_tail->next = l;
    else
        col->letters = l;
    col->letters_tail = l;
}

/* Writes the dead letters filed so far, letting go of mu meanwhile (file I/O: a hung
 * filesystem, or another process holding the file's lock, must not stall the intake), then
 * lets their items go.  Called with mu held. */
static void write_letters(esx_collector *col)
{
    esx_dead_letter *list = col->letters;
    col->letters = col->letters_tail = NULL;
    if (list == NULL)
        return;
    pthread_mutex_unlock(&col->mu);
    int failed = 0;
    for (esx_dead_letter *l = list; l; l = l->next)
        if (esx_dead_letter_write(&col->dl, l) != 0)
            failed++;
    pthread_mutex_lock(&col->mu);
    col->st.dead_letter_failed += (uint64_t)failed;
    while (list) {
        esx_dead_letter *next = list->next;
        item_done(col, list->ud);
        free(list);
        list = next;
    }
    pthread_cond_broadcast(&col->idle);
}

/* ---------------------------------------------------------------- results */

static void col_unref(esx_collector *col);

/* One back-off for the items of a batch that failed: by the most-tried item's count. */
static int64_t batch_due(esx_collector *col, batch *b, int64_t now)
{
    int attempts = 0;
    for (int i = 0; i < b->n; i++)
        if (b->items[i]->attempts > attempts)
            attempts = b->items[i]->attempts;
    return now + backoff(col, attempts + 1);
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
    if (status == 413 && b->n > 1 && b->bytes > 2048) {
        /* the server refused the size: halve batches (never back up: two bulks refused at
         * once both lower it) and send these again */
        size_t half = b->bytes / 2 > 1024 ? b->bytes / 2 : 1024;
        if (half < col->batch_cap)
            col->batch_cap = half;
        for (int i = b->n - 1; i >= 0; i--)
            ready_prepend(col, b->items[i]);
    } else if (!parsed) {
        /* (a 413 for a bulk of at most 2 KiB -- the floor -- is a failure like any other:
         * resending it at once would loop as fast as the server answers) */
        col->st.bulk_failures++;
        run r = { .due = batch_due(col, b, now) };
        if (status != 413 || b->n > 1)
            pause_sink(col, r.due);
        for (int i = 0; i < b->n; i++) {
            if (status == 413 && b->n == 1) {
                dead_letter(col, b->items[i], 413, "request_too_large",
                            "the server refused a single event as too large");
            } else {
                retry_later(col, &r, b->items[i]);
            }
        }
        delay_run(col, &r);
    } else {
        col->paused_until = 0; /* the sink answers: new batches may go at once */
        run r = { .due = batch_due(col, b, now) };
        for (int i = 0; i < b->n; i++) {
            int s = results[i].status;
            if ((s >= 200 && s < 300) || s == 409) { /* 409: created by an earlier attempt */
                if (!b->items[i]->rollup)
                    col->st.shipped++;
                item_done(col, b->items[i]);
            } else if (s == 429 || s >= 500 || s < 100) {
                /* s < 100: no readable status (a proxy's or a broken sink's answer): the
                 * outcome is unknown, so the item is tried again, never dead-lettered */
                retry_later(col, &r, b->items[i]);
            } else {
                dead_letter(col, b->items[i], s, results[i].error_type, results[i].reason);
            }
        }
        delay_run(col, &r);
    }
    col->inflight--;
    if (col->letters && (!col->running || col->stop))
        write_letters(col); /* the shipper is gone, or leaving (it writes what it sees first) */
    pthread_cond_broadcast(&col->wake);
    pthread_cond_broadcast(&col->idle);
    pthread_mutex_unlock(&col->mu);
    free(results);
    free(b);
    col_unref(col);
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

/* Sends a batch (called without the lock).  On failure the items go back, delayed. */
static void send_batch(esx_collector *col, batch *b)
{
    char why[256];
    char *body = malloc(b->bytes + 1);
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
    col->st.bulk_failures++;
    run r = { .due = batch_due(col, b, now) };
    pause_sink(col, r.due);
    for (int i = 0; i < b->n; i++)
        retry_later(col, &r, b->items[i]);
    delay_run(col, &r);
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
    item *it = item_new(line, len, esx_now_ms(), NULL);
    if (it == NULL)
        return -1;
    it->rollup = 1;
    enqueue(col, it);
    col->queue_rollups++;
    col->st.rollup_written++;
    return 0;
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
        item *it = item_new(data + pos, end - pos, now, seg);
        if (it == NULL) {
            free_list(head);
            return -1;
        }
        *tail = it;
        tail = &it->next;
        n++;
        pos = end;
    }
    while (head) {
        item *it = head;
        head = it->next;
        enqueue(col, it);
    }
    col->st.replayed += (uint64_t)n;
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
        ready_prepend_run(col, r);
        free(r);
    }
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
            }
        }
    }
    if (col->emit_now) {
        col->emit_now = 0;
        pthread_cond_broadcast(&col->idle); /* flush() waits for the rows to be queued */
    }
    if (col->spool) {
        if (now - col->last_orphan_scan >= ORPHAN_SCAN_MS) {
            esx_spool_claim_orphans(col->spool);
            col->last_orphan_scan = now;
        }
        /* load what waits on disk into the room memory has: at most LOAD_PER_PASS a pass,
         * since the intake waits for the lock meanwhile (the next pass is 20 ms away) */
        if (esx_spool_has_backlog(col->spool) && col->queue_bytes < col->cfg.queue_max_bytes) {
            size_t room = (col->cfg.queue_max_bytes - col->queue_bytes) / 2 + 1;
            esx_spool_load(col->spool, room < LOAD_PER_PASS ? room : LOAD_PER_PASS, replay_record, col);
        }
        if (now - col->last_sync >= col->cfg.spool_sync_interval) {
            /* the disk write without the lock: in nginx the intake runs on the worker's
             * event loop, which would wait out every fdatasync */
            int fds[ESX_SPOOL_SYNC_FDS];
            int n = esx_spool_sync_begin(col->spool, fds);
            col->last_sync = now;
            if (n > 0) {
                pthread_mutex_unlock(&col->mu);
                esx_spool_sync_end(fds, n);
                pthread_mutex_lock(&col->mu);
            }
        }
    }
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
    if (col->rollups && col->last_rollup_emit + col->cfg.rollup_interval < t)
        t = col->last_rollup_emit + col->cfg.rollup_interval;
    if (col->spool && col->last_sync + col->cfg.spool_sync_interval < t)
        t = col->last_sync + col->cfg.spool_sync_interval;
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

static void *shipper_main(void *arg)
{
    esx_collector *col = arg;
    pthread_mutex_lock(&col->mu);
    while (!col->stop) {
        if (col->letters) {
            write_letters(col);
            continue;
        }
        int64_t now = esx_now_ms();
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

/* ---------------------------------------------------------------- lifecycle */

static int init_locks(esx_collector *col)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int rc = pthread_mutex_init(&col->mu, NULL) || pthread_mutex_init(&col->intake_mu, NULL) ||
             pthread_cond_init(&col->wake, &ca) || pthread_cond_init(&col->idle, &ca);
    pthread_condattr_destroy(&ca);
    return rc ? -1 : 0;
}

static int open_dead_letter(esx_collector *col)
{
    if (!col->cfg.dead_letter_path[0])
        return 0;
    return esx_dead_letters_open(&col->dl, col->cfg.dead_letter_path);
}

/* Frees what a collector owns besides its queue, locks and client (NULL-safe parts). */
static void free_parts(esx_collector *col)
{
    esx_rollups_free(col->rollups);
    esx_ratelimit_free(col->rl);
    esx_buf_free(&col->docs);
    esx_buf_free(&col->lines);
    free(col->events);
    free(col->rejects);
    free(col->offs);
    free(col->sites);
    free(col->counts);
}

esx_collector *esx_collector_new(const esx_collector_config *cfg, esx_client *client, char *why)
{
    esx_collector *col = calloc(1, sizeof *col);
    if (col == NULL) {
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    col->cfg = *cfg;
    col->auto_instance = cfg->instance[0] == '\0';
    atomic_init(&col->refs, 1);
    col->batch_cap = cfg->batch_max_bytes;
    size_t m = (size_t)cfg->max_events;
    col->events = calloc(m, sizeof *col->events);
    col->rejects = calloc(m, sizeof *col->rejects);
    col->offs = calloc(m + 1, sizeof *col->offs);
    col->sites = calloc(m, sizeof *col->sites);
    col->counts = calloc(m, sizeof *col->counts);
    if (!col->events || !col->rejects || !col->offs || !col->sites || !col->counts ||
        init_locks(col) != 0 || esx_dead_letters_init(&col->dl) != 0) {
        free_parts(col);
        free(col);
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    /* The scratch holds one request's output, whatever the queue's bound: its documents
     * (at most max_body bytes of the body plus DOC_ADDED per event) and its bulk lines (those
     * plus an action line of at most sizeof action + 80 bytes per event).  A request larger
     * than the queue is the admission's to judge (on disk with a spool, 413 without). */
    size_t docs_max = cfg->max_body + m * DOC_ADDED;
    esx_buf_init(&col->docs, docs_max);
    esx_buf_init(&col->lines, docs_max + m * (sizeof col->action + 80));
    if (cfg->rollup_window > 0 &&
        (col->rollups = esx_rollups_new(cfg->rollup_window, cfg->rollup_max_rows)) == NULL) {
        snprintf(why, 256, "out of memory");
        goto fail;
    }
    if (cfg->site_rate > 0 &&
        (col->rl = esx_ratelimit_new(cfg->site_rate, cfg->site_burst, cfg->max_sites)) == NULL) {
        snprintf(why, 256, "out of memory");
        goto fail;
    }
    /* the spool directory (home of the default dead-letter file) exists from the start */
    if (cfg->spool_dir[0] && esx_private_dir(cfg->spool_dir) != 0) {
        snprintf(why, 256, "cannot use spool_dir %.150s: %.60s", cfg->spool_dir,
                 errno == EPERM ? "not a directory of this user only (owner, no write for others)"
                                : strerror(errno));
        goto fail;
    }
    if (open_dead_letter(col) != 0) {
        snprintf(why, 256, "cannot open dead_letter file %.150s: %.60s", cfg->dead_letter_path,
                 errno == EPERM ? "not a regular file of this user only (a link, or another's)"
                                : strerror(errno));
        goto fail;
    }
    esx_idgen_init(&col->ids);
    col->rng = (unsigned)esx_now_ms() ^ (unsigned)esx_pid();
    esx_client_ref(client);
    col->client = client;
    col->pid = esx_pid();
    return col;
fail:
    esx_dead_letters_free(&col->dl);
    free_parts(col);
    free(col);
    return NULL;
}

/* First use in this process: adopt a collector inherited through fork, open the spool and
 * start the shipper.  Called by the intake's thread.  Returns 0 or -1 (why, 256 bytes). */
static int ensure_running(esx_collector *col, char *why)
{
    if (col->pid != esx_pid()) {
        /* A forked child: the parent's thread, requests and spool files are the parent's.
         * The memory is our copy: drop its queue (in-flight batches belong to the parent's
         * engine and are left alone), re-create the locks, and re-seed the id generator so
         * parent and child never mint the same event_id. */
        init_locks(col);
        free_list(col->ready_head);
        free_runs(col->delayed);
        col->ready_head = col->ready_tail = NULL;
        col->sent = NULL;
        col->delayed = NULL;
        col->delayed_count = 0;
        col->paused_until = 0;
        col->ready_bytes = 0;
        col->ready_count = 0;
        col->inflight = 0;
        col->queue_bytes = 0;
        col->queue_events = 0;
        col->queue_rollups = 0;
        if (col->spool) {
            esx_spool_forget(col->spool);
            col->spool = NULL;
        }
        if (col->rollups) {
            int64_t w = esx_rollups_window(col->rollups);
            esx_rollups_free(col->rollups);
            col->rollups = esx_rollups_new(w, col->cfg.rollup_max_rows);
        }
        /* the parent's filed letters are the parent's to write: drop our copies */
        while (col->letters) {
            esx_dead_letter *next = col->letters->next;
            free(col->letters->ud);
            free(col->letters);
            col->letters = next;
        }
        col->letters_tail = NULL;
        esx_dead_letters_close(&col->dl);
        esx_dead_letters_init(&col->dl);
        open_dead_letter(col);
        esx_idgen_init(&col->ids);
        col->running = 0;
        col->pid = esx_pid();
    }
    if (col->running || col->closed)
        return 0;
    if (col->auto_instance) {
        /* each process (nginx worker) is its own instance: its rollup rows have their own
         * _ids and add up with the others' */
        char host[64] = "host";
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        for (char *p = host; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.'))
                *p = '-';
        snprintf(col->cfg.instance, sizeof col->cfg.instance, "%s-%d", host, (int)esx_pid());
    }
    pthread_mutex_lock(&col->mu);
    if (col->cfg.spool_dir[0] && col->spool == NULL) {
        col->spool = esx_spool_open(col->cfg.spool_dir, col->cfg.spool_segment_bytes, why);
        if (col->spool == NULL) {
            pthread_mutex_unlock(&col->mu);
            return -1;
        }
        col->last_orphan_scan = 0; /* replay what dead processes left, at once */
    }
    col->last_rollup_emit = esx_now_ms();
    col->stop = 0;
    int rc = pthread_create(&col->thread, NULL, shipper_main, col);
    if (rc == 0)
        col->running = 1;
    else
        snprintf(why, 256, "cannot start the shipper thread");
    pthread_mutex_unlock(&col->mu);
    return rc == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------- intake */

static void refuse(esx_intake *out, int status, enum esx_reject_reason why_code,
                   esx_collector *col, int events, const char *msg)
{
    out->status = status;
    snprintf(out->message, sizeof out->message, "%.150s", msg);
    pthread_mutex_lock(&col->mu);
    col->st.rejected[why_code] += (uint64_t)(events > 0 ? events : 1);
    pthread_mutex_unlock(&col->mu);
}

/* The intake proper; called with intake_mu held. */
static void ingest(esx_collector *col, const char *body, size_t len, int from_query,
                   int64_t received_at, esx_intake *out)
{
    char why[256];
    esx_buf_reset(&col->docs);
    esx_buf_reset(&col->lines);
    int n = 0, nr = 0, rc;
    if (from_query)
        rc = esx_event_from_query(body, len, received_at, &col->ids, &col->docs, col->events, &n,
                                  col->rejects, &nr, why);
    else
        rc = esx_events_parse(body, len, received_at, &col->ids, &col->docs, col->events, &n,
                              col->rejects, &nr, col->cfg.max_events, why);
    out->rejects = col->rejects;
    out->n_rejects = nr;
    if (rc != ESX_EV_OK) { /* it reached parsing (counted below for the others) */
        pthread_mutex_lock(&col->mu);
        col->st.requests++;
        pthread_mutex_unlock(&col->mu);
    }
    if (rc == ESX_EV_NOT_JSON) {
        refuse(out, 400, ESX_RJ_NOT_JSON, col, 0, why);
        return;
    }
    if (rc == ESX_EV_TOO_MANY) {
        char msg[96];
        snprintf(msg, sizeof msg, "more than %d events in one request", col->cfg.max_events);
        refuse(out, 413, ESX_RJ_TOO_MANY, col, 0, msg);
        return;
    }
    if (rc == ESX_EV_TOOBIG) {
        /* only a GET's query string (not bounded by max_body before parsing) gets here */
        refuse(out, 413, ESX_RJ_TOO_LARGE, col, 0, "request larger than max_body once parsed");
        return;
    }
    if (rc != ESX_EV_OK) {
        refuse(out, 503, ESX_RJ_NOMEM, col, 0, "out of memory parsing the request");
        out->retry_after_ms = 1000;
        return;
    }
    pthread_mutex_lock(&col->mu);
    col->st.requests++;
    col->st.rejected[ESX_RJ_INVALID] += (uint64_t)nr;
    pthread_mutex_unlock(&col->mu);
    if (n == 0) {
        out->status = 400;
        snprintf(out->message, sizeof out->message, "no valid event");
        return;
    }

    /* bulk lines: create with _id = event_id into the index of received_at's date (the
     * action line's start is made once per second of received_at, under intake_mu) */
    time_t secs = (time_t)(received_at / 1000);
    if (!col->action_len || secs != col->action_secs) {
        char index[256];
        struct tm tm;
        gmtime_r(&secs, &tm);
        if (strftime(index, sizeof index, col->cfg.index_fmt, &tm) == 0)
            snprintf(index, sizeof index, "events");
        int al = snprintf(col->action, sizeof col->action, "{\"create\":{\"_index\":\"%s\",\"_id\":\"",
                          index); /* 21 + 255 + 9 bytes at most: fits */
        col->action_len = al > 0 && (size_t)al < sizeof col->action ? (size_t)al : 0;
        col->action_secs = secs;
    }
    size_t *offs = col->offs;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        offs[i] = col->lines.len;
        char head[sizeof col->action + 80];
        size_t idl = strnlen(col->events[i].event_id, 64), hl = col->action_len;
        memcpy(head, col->action, hl);
        memcpy(head + hl, col->events[i].event_id, idl);
        hl += idl;
        memcpy(head + hl, "\"}}\n", 4);
        hl += 4;
        int brc;
        if ((brc = esx_buf_append(&col->lines, head, hl)) != ESX_BUF_OK ||
            (brc = esx_buf_append(&col->lines, col->docs.data + col->events[i].doc_off,
                                  col->events[i].doc_len)) != ESX_BUF_OK ||
            (brc = esx_buf_append(&col->lines, "\n", 1)) != ESX_BUF_OK) {
            if (brc == ESX_BUF_TOOBIG) { /* cannot happen: the bound is the documents' + actions' */
                refuse(out, 413, ESX_RJ_TOO_LARGE, col, n, "request larger than max_body once parsed");
                return;
            }
            refuse(out, 503, ESX_RJ_NOMEM, col, n, "out of memory");
            out->retry_after_ms = 1000;
            return;
        }
    }
    offs[n] = col->lines.len;
    total = col->lines.len + (size_t)n * ITEM_OVERHEAD;
    /* A request that could never be taken, however empty the queue: without a spool, events
     * larger than queue_max_bytes; with one, a record larger than spool_max_bytes.  503 and
     * Retry-After would have the tag resend it for ever: 413, counted as queue_full. */
    if (col->cfg.spool_dir[0] ? col->lines.len + 8 > col->cfg.spool_max_bytes ||
                                    col->lines.len > ESX_SPOOL_MAX_RECORD
                              : total > col->cfg.queue_max_bytes) {
        refuse(out, 413, ESX_RJ_QUEUE_FULL, col, n,
               col->cfg.spool_dir[0] ? "the request's events are larger than spool_max_bytes"
                                     : "the request's events are larger than queue_max_bytes");
        return;
    }

    /* per-site counts for the rate limiter */
    const char **sites = col->sites;
    int *counts = col->counts;
    int k = 0;
    if (col->rl) {
        for (int i = 0; i < n; i++) {
            int j = 0;
            while (j < k && strcmp(sites[j], col->events[i].site_id) != 0)
                j++;
            if (j == k) {
                sites[k] = col->events[i].site_id;
                counts[k++] = 0;
            }
            counts[j]++;
        }
    }

    int64_t now = esx_now_ms();
    pthread_mutex_lock(&col->mu);
    /* Memory is full (or disk already holds older events, which go first): with a spool the
     * events wait on disk.  With a spool every accepted request is written to it -- ahead of
     * memory, or instead of it -- and its files stay within spool_max_bytes either way (a
     * few events that wait for a retry keep a whole write-ahead segment on disk). */
    int overflow = col->queue_bytes + total > col->cfg.queue_max_bytes ||
                   (col->spool && esx_spool_has_backlog(col->spool));
    if ((overflow && !col->spool) ||
        (col->spool && col->spool->bytes_on_disk + col->lines.len + 8 > col->cfg.spool_max_bytes)) {
        col->st.rejected[ESX_RJ_QUEUE_FULL] += (uint64_t)n;
        pthread_mutex_unlock(&col->mu);
        out->status = 503;
        out->retry_after_ms = 1000;
        snprintf(out->message, sizeof out->message, "the queue is full");
        return;
    }
    if (col->rl) {
        int64_t wait = esx_ratelimit_take(col->rl, sites, counts, k, now);
        if (wait > 0) {
            col->st.rejected[ESX_RJ_RATE] += (uint64_t)n;
            pthread_mutex_unlock(&col->mu);
            out->status = 429;
            out->retry_after_ms = wait;
            snprintf(out->message, sizeof out->message, "a site is over its event rate");
            return;
        }
    }
    esx_segment *seg = NULL;
    if (col->spool) {
        if (esx_spool_append(col->spool, col->lines.data, col->lines.len, overflow, &seg, why) != 0) {
            col->st.rejected[ESX_RJ_SPOOL] += (uint64_t)n;
            pthread_mutex_unlock(&col->mu);
            out->status = 503;
            out->retry_after_ms = 1000;
            snprintf(out->message, sizeof out->message, "%.150s", why);
            return;
        }
        col->st.spooled += (uint64_t)n;
    }
    if (overflow) {
        for (int i = 0; i < n; i++)
            if (col->rollups && esx_rollups_add(col->rollups, received_at, &col->events[i]) != 0)
                col->st.rollup_dropped = esx_rollups_dropped(col->rollups);
        col->st.spilled += (uint64_t)n;
        col->st.accepted += (uint64_t)n;
        pthread_cond_signal(&col->wake);
        pthread_mutex_unlock(&col->mu);
        out->accepted = n;
        out->status = out->n_rejects ? 200 : 204;
        return;
    }
    int queued = 0, was_empty = col->ready_head == NULL;
    for (int i = 0; i < n; i++) {
        item *it = item_new(col->lines.data + offs[i], offs[i + 1] - offs[i], now, seg);
        if (it == NULL)
            break;
        enqueue(col, it);
        if (seg)
            seg->pending++;
        if (col->rollups && esx_rollups_add(col->rollups, received_at, &col->events[i]) != 0)
            col->st.rollup_dropped = esx_rollups_dropped(col->rollups);
        queued++;
    }
    if (queued < n) {
        /* out of memory midway: with a spool the record holds every event, and the segment
         * stays on disk (pending never reaches 0) for the next process that opens the
         * spool_dir to replay; without a spool, report them as refused */
        if (!seg) {
            col->st.rejected[ESX_RJ_NOMEM] += (uint64_t)(n - queued);
            for (int i = queued; i < n && out->n_rejects < col->cfg.max_events; i++) {
                esx_event_reject *r = &col->rejects[out->n_rejects++];
                r->index = -1;
                snprintf(r->reason, sizeof r->reason, "out of memory");
            }
        } else {
            seg->pending += n - queued;
        }
    }
    col->st.accepted += (uint64_t)queued;
    /* A wake-up only when a bulk slot is free (otherwise batch_done wakes the shipper when
     * one frees: a signal per request cost 20% of a worker's CPU with a stalled sink), and
     * only for a full batch or for the first event of an empty queue: the shipper, asleep
     * with nothing queued, would otherwise wake on its idle timer (up to 1 s) instead of
     * once that event is flush_interval old -- one signal per bulk, none per request. */
    if (((was_empty && queued > 0) || col->ready_bytes >= col->batch_cap ||
         col->ready_count >= col->cfg.batch_max_events) &&
        col->inflight < col->cfg.bulk_concurrency && now >= col->paused_until)
        pthread_cond_signal(&col->wake);
    pthread_mutex_unlock(&col->mu);
    out->accepted = queued;
    out->status = out->n_rejects ? 200 : 204;
}

void esx_collector_ingest(esx_collector *col, const char *body, size_t len, int from_query,
                          int64_t received_at, esx_intake *out)
{
    memset(out, 0, sizeof *out);
    char why[256];
    if (col->closed || esx_client_closed(col->client)) {
        /* a closed sink can never ship what would be accepted now */
        refuse(out, 503, ESX_RJ_CLOSED, col, 0,
               col->closed ? "the collector is closed" : "the collector's sink client is closed");
        out->retry_after_ms = 1000;
        return;
    }
    if (ensure_running(col, why) != 0) {
        refuse(out, 503, ESX_RJ_SPOOL, col, 0, why);
        out->retry_after_ms = 1000;
        return;
    }
    pthread_mutex_lock(&col->intake_mu);
    ingest(col, body, len, from_query, received_at, out);
    pthread_mutex_unlock(&col->intake_mu);
}

/* ---------------------------------------------------------------- flush, stats, close */

static int wait_empty(esx_collector *col, int64_t timeout_ms)
{
    struct timespec until = esx_mono_after(timeout_ms);
    while ((col->queue_events > 0 || (col->spool && esx_spool_has_backlog(col->spool))) &&
           col->running) {
        col->flush_requested = 1;
        pthread_cond_signal(&col->wake);
        int rc = timeout_ms < 0 ? pthread_cond_wait(&col->idle, &col->mu)
                                : pthread_cond_timedwait(&col->idle, &col->mu, &until);
        if (rc != 0)
            break;
    }
    col->flush_requested = 0;
    return col->queue_events == 0 && !(col->spool && esx_spool_has_backlog(col->spool));
}

/* Has the shipper queue every rollup row (emit_now), then waits until the queue is empty,
 * both within timeout_ms (< 0: no limit).  Without the first wait an empty queue would look
 * done before the rows are in it.  Called with mu held; returns wait_empty's answer. */
static int emit_and_wait(esx_collector *col, int64_t timeout_ms)
{
    col->emit_now = 1;
    col->flush_requested = 1;
    pthread_cond_signal(&col->wake);
    int64_t start = esx_now_ms();
    while (col->emit_now && col->running &&
           (timeout_ms < 0 || esx_now_ms() - start < timeout_ms)) {
        struct timespec ts = esx_mono_after(5);
        pthread_cond_timedwait(&col->idle, &col->mu, &ts);
    }
    int64_t left = timeout_ms < 0 ? -1 : timeout_ms - (esx_now_ms() - start);
    return wait_empty(col, left < 0 && timeout_ms >= 0 ? 0 : left);
}

int esx_collector_flush(esx_collector *col, int64_t timeout_ms)
{
    char why[256];
    if (ensure_running(col, why) != 0)
        return 0;
    pthread_mutex_lock(&col->mu);
    int empty = emit_and_wait(col, timeout_ms);
    pthread_mutex_unlock(&col->mu);
    return empty;
}

typedef struct rows_copy {
    esx_rollup_view *v;
    size_t n, cap;
    int failed;
} rows_copy;

static void copy_row(const esx_rollup_row *row, void *ud)
{
    rows_copy *c = ud;
    if (c->failed)
        return;
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        esx_rollup_view *v = realloc(c->v, cap * sizeof *v);
        if (v == NULL) {
            c->failed = 1;
            return;
        }
        c->v = v;
        c->cap = cap;
    }
    esx_rollup_view *o = &c->v[c->n++];
    o->window_start = row->window_start;
    memcpy(o->site_id, row->site_id, sizeof o->site_id);
    memcpy(o->block_id, row->block_id, sizeof o->block_id);
    memcpy(o->variant, row->variant, sizeof o->variant);
    memcpy(o->type, row->type, sizeof o->type);
    o->count = row->count;
    o->uniques = row->hll ? (uint64_t)(esx_hll_estimate(row->hll) + 0.5) : 0;
}

int esx_collector_rollups(esx_collector *col, int64_t now_ms, esx_rollup_view **rows,
                          size_t *n)
{
    rows_copy c = {NULL, 0, 0, 0};
    if (col->rollups != NULL) {
        pthread_mutex_lock(&col->mu);
        esx_rollups_current(col->rollups, now_ms, copy_row, &c);
        pthread_mutex_unlock(&col->mu);
    }
    if (c.failed) {
        free(c.v);
        c.v = NULL;
        c.n = 0;
    }
    *rows = c.v;
    *n = c.n;
    return c.failed ? -1 : 0;
}

void esx_collector_stats(esx_collector *col, esx_collector_counters *out)
{
    if (col->pid != esx_pid()) {
        char why[256];
        ensure_running(col, why);
    }
    pthread_mutex_lock(&col->mu);
    *out = col->st;
    out->queued_events = (uint64_t)(col->queue_events - col->queue_rollups);
    out->queued_bytes = col->queue_bytes;
    out->in_flight = (uint64_t)col->inflight;
    out->delayed = (uint64_t)col->delayed_count;
    if (col->rollups) {
        out->rollup_rows = esx_rollups_rows(col->rollups);
        out->rollup_dropped = esx_rollups_dropped(col->rollups);
    }
    if (col->rl)
        out->rate_unlimited = esx_ratelimit_unlimited(col->rl);
    if (col->spool) {
        out->spool_bytes = col->spool->bytes_on_disk;
        out->spool_skipped_bytes = col->spool->bytes_skipped;
        out->spool_segments_gone = col->spool->segments_gone;
    }
    int64_t oldest = 0, now = esx_now_ms();
    if (col->ready_head)
        oldest = now - col->ready_head->queued_at;
    for (run *r = col->delayed; r; r = r->next)
        if (now - r->oldest > oldest)
            oldest = now - r->oldest;
    for (batch *b = col->sent; b; b = b->next_sent)
        if (now - b->oldest > oldest)
            oldest = now - b->oldest;
    if (col->spool && esx_spool_has_backlog(col->spool)) {
        int64_t since = esx_spool_backlog_since(col->spool);
        if (since > 0 && esx_wall_ms() - since > oldest)
            oldest = esx_wall_ms() - since;
    }
    out->oldest_queued_ms = oldest;
    pthread_mutex_unlock(&col->mu);
}

int64_t esx_collector_close(esx_collector *col, int64_t timeout_ms)
{
    if (col->closed)
        return 0;
    char why[256];
    if (col->pid != esx_pid())
        ensure_running(col, why);
    pthread_mutex_lock(&col->mu);
    col->closed = 1;
    int64_t left = 0;
    if (col->running) {
        /* the open window's rows are written even when the queue is already empty (the
         * shipper must have queued them before it is told to stop) */
        emit_and_wait(col, timeout_ms);
        col->stop = 1;
        pthread_cond_signal(&col->wake);
        pthread_mutex_unlock(&col->mu);
        pthread_join(col->thread, NULL);
        pthread_mutex_lock(&col->mu);
        col->running = 0;
    }
    left = col->queue_events - col->queue_rollups;
    if (col->inflight == 0 && col->spool) {
        /* nothing can acknowledge an item any more: acknowledged segments go now, the
         * rest stay on disk for the next process to replay */
        esx_spool_close(col->spool);
        col->spool = NULL;
    }
    pthread_mutex_unlock(&col->mu);
    return left;
}

int esx_collector_has_spool(const esx_collector *col)
{
    return col->cfg.spool_dir[0] != '\0';
}

static void col_unref(esx_collector *col)
{
    if (atomic_fetch_sub(&col->refs, 1) != 1)
        return;
    /* last reference: nothing can touch the queue any more */
    free_list(col->ready_head);
    free_runs(col->delayed);
    if (col->spool)
        esx_spool_close(col->spool); /* segments with pending events stay for replay */
    esx_dead_letters_free(&col->dl);
    free_parts(col);
    esx_client_unref(col->client);
    pthread_mutex_destroy(&col->mu);
    pthread_mutex_destroy(&col->intake_mu);
    pthread_cond_destroy(&col->wake);
    pthread_cond_destroy(&col->idle);
    free(col);
}

void esx_collector_free(esx_collector *col)
{
    if (col == NULL)
        return;
    esx_collector_close(col, 0);
    col_unref(col);
}
