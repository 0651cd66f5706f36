/*
 * collector.c -- a collector's life: made, adopted by a forked child on first use, flushed,
 * looked at (stats, rollups), closed and freed.  The parts it is made of are listed in
 * collector_int.h.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "collector_int.h"
#include "hash.h"
#include "private.h"
#include "proc.h"

const char *const esx_reject_names[ESX_RJ_COUNT] = {
    "invalid", "not_json", "too_large", "too_many", "queue_full",
    "rate_limited", "spool", "closed", "nomem",
};

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
    col->dl.max_bytes = col->cfg.dead_letter_max_bytes;
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
        snprintf(why, 256, "cannot use spool_dir %.150s: %.80s", cfg->spool_dir,
                 errno == EPERM ? "not a directory of this user only (owner, no write for others)"
                                : strerror(errno));
        goto fail;
    }
    /* one spool_dir serves one live collector per process: a second one would claim the
     * first one's segments as a closed collector's and replay events it is still shipping */
    if (cfg->spool_dir[0] && esx_spool_dir_held(cfg->spool_dir)) {
        snprintf(why, 256, "cannot use spool_dir %.150s: another collector of this process uses it "
                 "(close it first)", cfg->spool_dir);
        goto fail;
    }
    if (open_dead_letter(col) != 0) {
        snprintf(why, 256, "cannot open dead_letter file %.150s: %.60s", cfg->dead_letter_path,
                 errno == EPERM ? "not a regular file of this user only (a link, or another's)"
                                : strerror(errno));
        goto fail;
    }
    esx_idgen_init(&col->ids);
    col->rng = (unsigned)esx_random_seed();
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

/* A collector inherited through fork, in the child: the parent's thread, requests and spool
 * files are the parent's.  The memory is our copy: drop its queue (in-flight batches belong
 * to the parent's engine and are left alone), re-create the locks, and re-seed the id
 * generator so parent and child never mint the same event_id, and the retry jitter's so that
 * they do not retry in step.  Starts nothing. */
static void adopt(esx_collector *col)
{
    init_locks(col);
    esx_col_free_list(col->ready_head);
    esx_col_free_runs(col->delayed);
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
    /* the file is opened again: a description of its own, so that flock() excludes the
     * other processes that inherited the parent's -- but a worker of another user may not
     * be able to (root's master made it 0600 in root's directory, /tmp for the default):
     * then the inherited descriptor appends still (lines land whole, O_APPEND; only the
     * mending of another writer's fragment may race) */
    int inherited = col->dl.fd;
    col->dl.fd = -1;
    esx_dead_letters_init(&col->dl);
    if (open_dead_letter(col) != 0 && inherited >= 0) {
        col->dl.fd = inherited;
        inherited = -1;
    }
    if (inherited >= 0)
        close(inherited);
    esx_idgen_init(&col->ids);
    /* and the retry jitter's generator: a collector made in nginx's init_by_lua left every
     * worker the master's, and the workers' retries of a 429 fell due in step */
    col->rng = (unsigned)esx_random_seed();
    col->running = 0;
    col->pid = esx_pid();
}

/* The size at which the spool starts a new segment: spool_segment_bytes, but at most an
 * eighth of spool_max_bytes (not below SEGMENT_FLOOR).  A segment leaves the disk only once
 * every event in it is acknowledged, and the segment being written takes every request: one
 * as large as the spool (the default 4 MiB with a spool_max_bytes of 1 MiB) filled it under a
 * steady stream, with memory empty and the sink keeping up, and every request got 503
 * queue_full until the last event in it was acknowledged -- then again, a segment later. */
#define SEGMENT_FLOOR ((size_t)4096)
static size_t segment_bytes(const esx_collector_config *cfg)
{
    size_t cap = cfg->spool_max_bytes / 8;
    if (cap < SEGMENT_FLOOR)
        cap = SEGMENT_FLOOR;
    return cfg->spool_segment_bytes < cap ? cfg->spool_segment_bytes : cap;
}

/* First use in this process: adopt a collector inherited through fork, open the spool and
 * start the shipper.  Called by the intake's thread.  Returns 0 or -1 (why, 256 bytes). */
int esx_col_ensure_running(esx_collector *col, char *why)
{
    if (col->pid != esx_pid())
        adopt(col);
    if (col->cfg.rollup_window > 0 && col->rollups == NULL) {
        /* a forked child whose table could not be made above: no event may be accepted
         * uncounted for the rest of its life -- refused until the table is made */
        col->rollups = esx_rollups_new(col->cfg.rollup_window, col->cfg.rollup_max_rows);
        if (col->rollups == NULL) {
            snprintf(why, 256, "out of memory for the rollup table");
            return -2;
        }
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
        col->spool = esx_spool_open(col->cfg.spool_dir, segment_bytes(&col->cfg), why);
        if (col->spool == NULL) {
            pthread_mutex_unlock(&col->mu);
            return -1;
        }
        col->last_orphan_scan = 0; /* replay what dead processes left, at once */
    }
    col->last_rollup_emit = esx_now_ms();
    col->stop = 0;
    int rc = esx_thread_start(&col->thread, esx_col_shipper_main, col);
    if (rc == 0)
        col->running = 1;
    else
        snprintf(why, 256, "cannot start the shipper thread: %s", strerror(rc));
    pthread_mutex_unlock(&col->mu);
    return rc == 0 ? 0 : -2;
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
 * done before the rows are in it.  Called with mu held; returns wait_empty's answer, or 0
 * when the rows could not all be queued in time (memory ran out: the shipper keeps emit_now
 * set and tries again on each wake; given up here, the rows stay dirty for the next
 * rollup.interval). */
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
        if (col->emit_now)
            pthread_cond_signal(&col->wake); /* (a pass that ran out of memory: again) */
    }
    int emitted = !col->emit_now;
    col->emit_now = 0;
    int64_t left = timeout_ms < 0 ? -1 : timeout_ms - (esx_now_ms() - start);
    int empty = wait_empty(col, left < 0 && timeout_ms >= 0 ? 0 : left);
    return empty && emitted;
}

int esx_collector_flush(esx_collector *col, int64_t timeout_ms, char *why)
{
    if (esx_col_ensure_running(col, why) != 0)
        return -1;
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
    if (col->pid != esx_pid()) {
        /* a forked child: its own rows (none yet), not the parent's, read under a lock of its
         * own -- the parent's copy may be held by a thread the child does not have */
        char why[256];
        esx_col_ensure_running(col, why);
    }
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
        esx_col_ensure_running(col, why);
    }
    pthread_mutex_lock(&col->mu);
    *out = col->st;
    out->queued_events = (uint64_t)(col->queue_events - col->queue_rollups);
    out->queued_bytes = col->queue_bytes;
    out->in_flight = (uint64_t)col->inflight;
    out->delayed = (uint64_t)col->delayed_count;
    if (col->rollups) {
        out->rollup_rows = esx_rollups_rows(col->rollups);
        out->rollup_bytes = esx_rollups_memory(col->rollups);
        out->rollup_dropped = esx_rollups_dropped(col->rollups);
    }
    if (col->rl)
        out->rate_unlimited = esx_ratelimit_unlimited(col->rl);
    if (col->spool) {
        out->spool_bytes = col->spool->bytes_on_disk;
        out->spool_skipped_bytes = col->spool->bytes_skipped;
        out->spool_segments_gone = col->spool->segments_gone;
        out->spool_segments_refused = col->spool->segments_refused;
        out->spool_claims_failing = col->spool->claims_failing;
        out->spool_segments_pid_reused = col->spool->segments_pid_reused;
        out->spool_sync_failed = col->spool->sync_failed;
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

/* Writes one record of rollup rows to the spool, its segment kept for the replay (its
 * pending count is never given back: the items are freed with the collector).  0 or -1. */
static int spool_rows(esx_collector *col, esx_buf *b, int64_t rows, int64_t *spooled)
{
    char why[256];
    esx_segment *seg = NULL;
    if (b->len == 0)
        return 0;
    if (col->spool->bytes_on_disk + b->len + 8 > col->cfg.spool_max_bytes ||
        esx_spool_append(col->spool, b->data, b->len, 0, &seg, why) != 0)
        return -1;
    seg->pending += rows;
    *spooled += rows;
    esx_buf_reset(b);
    return 0;
}

/* Adds one rollup row to the record being built in b, writing b out first when it is full.
 * 0 or -1. */
static int spool_row(esx_collector *col, esx_buf *b, int64_t *rows, int64_t *spooled,
                     const item *it)
{
    int rc = esx_buf_append(b, it->data, it->len);
    if (rc == ESX_BUF_TOOBIG) {
        if (spool_rows(col, b, *rows, spooled) != 0)
            return -1;
        *rows = 0;
        rc = esx_buf_append(b, it->data, it->len);
    }
    if (rc != ESX_BUF_OK)
        return -1;
    (*rows)++;
    return 0;
}

/* The rollup rows still queued once the shipper has stopped (the sink away at a graceful
 * stop or an nginx reload) go to the spool, so that the process that replays this one's
 * segments writes them too: without it they were lost, while the events they count were
 * replayed.  So do the rows of bulks still in flight: should such a bulk fail, nothing
 * would ship or spool them any more (its events are on disk already), and the spool is
 * let go of below; should it succeed, the replayed copy is the same row at the same
 * version, written again.  Rows that could not be written (spool_max_bytes reached, a full
 * disk, no memory -- unqueued of them could not even be queued) are lost: counted in
 * rollup_lost and said on stderr, since stats cannot be read after close -- they vanished
 * without a trace.  Called with mu held, the shipper gone. */
static void spool_rollups(esx_collector *col, int64_t unqueued)
{
    esx_buf b;
    esx_buf_init(&b, ESX_SPOOL_MAX_RECORD);
    int64_t rows = 0, total = unqueued, spooled = 0;
    int failed = 0;
    run ready = {.head = col->ready_head};
    for (run *r = &ready; r; r = r == &ready ? col->delayed : r->next)
        for (item *it = r->head; it; it = it->next)
            if (it->rollup && (total++, !failed) && spool_row(col, &b, &rows, &spooled, it) != 0)
                failed = 1;
    for (batch *s = col->sent; s; s = s->next_sent)
        for (int i = 0; i < s->n; i++)
            if (s->items[i]->rollup && (total++, !failed) &&
                spool_row(col, &b, &rows, &spooled, s->items[i]) != 0)
                failed = 1;
    if (!failed)
        spool_rows(col, &b, rows, &spooled);
    esx_buf_free(&b);
    if (spooled < total) {
        col->st.rollup_lost += (uint64_t)(total - spooled);
        fprintf(stderr, "esx.collector: close: %lld rollup rows could not be written to the spool "
                        "(spool_max_bytes reached, or the write failed): they are lost\n",
                (long long)(total - spooled));
    }
}

/* Without a spool, the rollup rows still waiting in the queue at close (the sink away, or no
 * time given) -- and the open window's, queued here -- go nowhere: counted in rollup_lost
 * and said on stderr, as spool_rollups says those a full spool refuses.  (Rows of a bulk still
 * in flight may yet be acknowledged: not counted.) */
static void rollups_lost_at_close(esx_collector *col)
{
    int64_t lost = 0;
    if (esx_col_queue_rollups(col) != 0) /* out of memory: the rest stayed in the table */
        lost = (int64_t)esx_rollups_dirty(col->rollups);
    run ready = {.head = col->ready_head};
    for (run *r = &ready; r; r = r == &ready ? col->delayed : r->next)
        for (item *it = r->head; it; it = it->next)
            lost += it->rollup;
    if (lost > 0) {
        col->st.rollup_lost += (uint64_t)lost;
        fprintf(stderr, "esx.collector: close: %lld rollup rows were not delivered and there is "
                        "no spool to keep them: they are lost\n",
                (long long)lost);
    }
}

int64_t esx_collector_close(esx_collector *col, int64_t timeout_ms)
{
    if (col->closed)
        return 0;
    /* Inherited and never used here: this process accepted nothing, so there is nothing of
     * its own to ship, and nothing is started.  Starting the shipper (and so the spool) to
     * close it claimed the segments of dead processes -- in nginx's master, which frees the
     * previous configuration's collector at every reload, under the master's pid: no worker
     * replays a live process's segments, and the master never would. */
    if (col->pid != esx_pid())
        adopt(col);
    pthread_mutex_lock(&col->mu);
    col->closed = 1;
    int64_t left = 0;
    if (col->running) {
        /* the open window's rows are written even when the queue is already empty (the
         * shipper must have queued them before it is told to stop) */
        emit_and_wait(col, timeout_ms);
        col->stop = 1;
        /* a dead letter still waiting for the file's lock (held by a hung process) is
         * written without it: the join below must not wait on another process */
        esx_dead_letters_stop_waiting(&col->dl);
        pthread_cond_signal(&col->wake);
        pthread_mutex_unlock(&col->mu);
        pthread_join(col->thread, NULL);
        pthread_mutex_lock(&col->mu);
        col->running = 0;
    }
    left = col->queue_events - col->queue_rollups;
    /* rows the shipper did not queue within timeout_ms (close(0) gives it no time) are
     * queued here, to be spooled with the rest: the events they count are on disk */
    int64_t unqueued = 0;
    if (col->spool && esx_col_queue_rollups(col) != 0) /* out of memory: the rest stayed in */
        unqueued = (int64_t)esx_rollups_dirty(col->rollups); /* the table, to be counted lost */
    if (col->spool && (col->queue_rollups > 0 || unqueued > 0))
        spool_rollups(col, unqueued);
    else if (!col->spool && col->rollups)
        rollups_lost_at_close(col);
    /* the directory is free for a collector that replaces this one (which claims and
     * replays what this one left), even while a bulk in flight keeps the spool open --
     * once this one writes nothing more to it */
    esx_spool_unhold(col->spool);
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

int esx_collector_sink_closed(const esx_collector *col)
{
    return esx_client_closed(col->client);
}

const void *esx_collector_sink(const esx_collector *col)
{
    return col->client;
}

void esx_col_unref(esx_collector *col)
{
    if (atomic_fetch_sub(&col->refs, 1) != 1)
        return;
    /* last reference: nothing can touch the queue any more */
    esx_col_free_list(col->ready_head);
    esx_col_free_runs(col->delayed);
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
    esx_col_unref(col);
}
