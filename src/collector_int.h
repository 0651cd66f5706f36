/*
 * collector_int.h -- what the collector's parts share (not part of the API: collector.h is).
 *
 *   collector.c         lifecycle (new, first use after a fork, close, free), flush, stats
 *   collector_intake.c  a request's events: parse, admit or refuse, spool, queue
 *   collector_queue.c   queued items: the ready queue and the runs delayed for a retry
 *   collector_ship.c    the shipper thread: batches, bulk results, dead letters, rollup rows,
 *                       the spool's housekeeping
 *
 * Locks: `mu` guards the queue, the counters, the rollups, the rate limiter and the spool;
 * it is held for short, non-blocking work only (the spool's append is a write(2) to the page
 * cache; dead letters and syncs are written without it).  `intake_mu` serialises the parse
 * scratch buffers.  Batches in flight hold a reference to the collector, so results arriving
 * after close() find it alive.  Every function below that takes a collector is called with
 * mu held unless it says otherwise.
 */
#ifndef ESX_COLLECTOR_INT_H
#define ESX_COLLECTOR_INT_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "collector.h"
#include "deadletter.h"
#include "ratelimit.h"
#include "rollup.h"
#include "spool.h"

#define ITEM_OVERHEAD 64     /* bytes charged per queued event beyond its text */
/* Bytes esx adds to an event's document beyond the body's own bytes (documents are the
 * body's, minified): ',"received_at":<ms>,"event_id":"<20>"}' and the '\n' (event.c's tail,
 * at most 96), and the two quotes around an integer user_id. */
#define DOC_ADDED 128

#define ESX_COL_ENSURED 8     /* indices remembered as made sure of (a day's two, and more) */
#define ESX_COL_INDEX_MAX 256 /* bytes of an index name, its NUL included (Elasticsearch: 255) */

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
    /* the indices this process created or found (create_index), most recent first: the
     * shipper thread's alone */
    char ensured[ESX_COL_ENSURED][ESX_COL_INDEX_MAX];

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
    int64_t letters_due;     /* monotonic ms: the letters wait for another process's flock */
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

/* ---------------------------------------------------------------- the queue (collector_queue.c) */

/* A new item holding a copy of data (an action line and a document line), not queued yet.
 * Returns NULL when out of memory; the caller owns it until it queues it. */
item *esx_col_item_new(const char *data, size_t len, int64_t now, esx_segment *seg);

/* Queues a new item at the end, counting it in queue_bytes and queue_events; col owns it. */
void esx_col_enqueue(esx_collector *col, item *it);

/* Puts an item taken from the queue back at its front (it is still counted). */
void esx_col_ready_prepend(esx_collector *col, item *it);

/* Puts a run's items back at the front of the ready queue, in their order. */
void esx_col_ready_prepend_run(esx_collector *col, const run *r);

/* An item leaves the queue for good (acknowledged or dead-lettered): uncounted, its spool
 * record released, freed. */
void esx_col_item_done(esx_collector *col, item *it);

/* The jittered exponential back-off (ms) before attempt number `attempts` + 1. */
int64_t esx_col_backoff(esx_collector *col, int attempts);

/* Adds it to r, a run being filled on the caller's stack (see esx_col_delay_run). */
void esx_col_retry_later(esx_collector *col, run *r, item *it);

/* Files the stack run r (filled by esx_col_retry_later) among the delayed runs, by due time.
 * Without memory for its header the items join the latest run, or go back to the ready
 * queue: none is lost. */
void esx_col_delay_run(esx_collector *col, const run *r);

/* Free a list of items / of runs and their items (no counting: for a queue being dropped). */
void esx_col_free_list(item *it);
void esx_col_free_runs(run *r);

/* ---------------------------------------------------------------- the rest */

/* The shipper thread's body (collector_ship.c); arg is the collector.  Called without mu. */
void *esx_col_shipper_main(void *arg);

/* Queues every dirty rollup row at once, room in the queue or not (close(), once the
 * shipper is gone: the rows it did not queue in time go to the spool with the others).
 * Returns 0, or -1 when memory ran out (the rows not queued stay dirty). */
int esx_col_queue_rollups(esx_collector *col);

/* First use in this process: adopts a collector inherited through fork, opens the spool and
 * starts the shipper (collector.c).  Called by the intake's thread without mu.  Returns 0, or
 * with a message in why (256 bytes) -1 when the spool cannot be opened, -2 when memory or a
 * thread could not be had. */
int esx_col_ensure_running(esx_collector *col, char *why);

/* Drops a reference (a batch in flight holds one); the last frees the collector.  Called
 * without mu. */
void esx_col_unref(esx_collector *col);

#endif
