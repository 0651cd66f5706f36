/*
 * collector.h -- the beacon collector's core: intake, admission, the bounded queue, the
 * shipper, rollups and the spool.  No Lua state inside.
 *
 * Intake runs on the caller's thread (an nginx worker's handler): it parses and validates
 * the events (event.h), admits or refuses the request at once (queue bytes, per-site rate),
 * writes the events ahead to the spool when there is one, and queues them.  A 2xx is only
 * returned for events that are in the queue (and in the spool when configured).  With a
 * spool, events that do not fit in memory are written to disk only (up to spool_max_bytes)
 * and loaded back as the queue drains.
 *
 * A shipper thread the core owns batches queued events into _bulk requests (create with
 * _id = event_id, so retries cannot duplicate) and submits them to the client's engine;
 * results are read on the engine's I/O thread: acknowledged items are freed, items failed
 * with 429/5xx and batches that failed in transport are retried with jittered exponential
 * back-off, items rejected for good go to the dead-letter file.  Retries stay in the queue
 * and count against its bound and against bulk_concurrency.
 */
#ifndef ESX_COLLECTOR_H
#define ESX_COLLECTOR_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"
#include "event.h"

typedef struct esx_collector_config {
    char index_fmt[128];         /* strftime pattern (UTC of received_at) */
    size_t max_body;             /* largest request body (after inflation): sizes the parse
                                    scratch, which no longer depends on queue_max_bytes */
    int max_events;
    size_t queue_max_bytes;
    size_t batch_max_bytes;
    int batch_max_events;
    int64_t flush_interval;
    int bulk_concurrency;
    int64_t backoff_min, backoff_max;
    char spool_dir[400];         /* "" = no spool */
    int64_t spool_sync_interval;
    size_t spool_segment_bytes;
    size_t spool_max_bytes;      /* disk bound: events beyond memory go here up to it */
    char dead_letter_path[512];
    int64_t dead_letter_max_bytes; /* the dead-letter file's bound (0: none) */
    int64_t rollup_window;       /* 0 = no rollups */
    char rollup_index_fmt[128];
    int64_t rollup_interval;     /* how often dirty rows of the open window are written */
    size_t rollup_max_rows;
    char instance[128];
    double site_rate, site_burst; /* 0 = no per-site limit */
    size_t max_sites;
    int create_index, create_rollup_index; /* create each new index with esx's mappings */
} esx_collector_config;

enum esx_reject_reason {
    ESX_RJ_INVALID, ESX_RJ_NOT_JSON, ESX_RJ_TOO_LARGE, ESX_RJ_TOO_MANY, ESX_RJ_QUEUE_FULL,
    ESX_RJ_RATE, ESX_RJ_SPOOL, ESX_RJ_CLOSED, ESX_RJ_NOMEM, ESX_RJ_COUNT
};
extern const char *const esx_reject_names[ESX_RJ_COUNT];

typedef struct esx_collector_counters {
    uint64_t requests, accepted, rejected[ESX_RJ_COUNT];
    uint64_t queued_events, queued_bytes, in_flight, delayed;
    uint64_t shipped, retried, dead_lettered, spooled, replayed, spilled, spool_bytes;
    uint64_t spool_skipped_bytes, spool_segments_gone, spool_segments_refused, spool_claims_failing,
             spool_segments_pid_reused,
             spool_sync_failed,
             dead_letter_failed;
    uint64_t bulk_requests, bulk_failures, indices_created, index_create_failed;
    uint64_t rollup_rows, rollup_bytes, rollup_dropped, rollup_written, rollup_lost, rate_unlimited;
    int64_t oldest_queued_ms;    /* age of the oldest unacknowledged event (shipping lag) */
} esx_collector_counters;

typedef struct esx_collector esx_collector;

/* Creates a collector shipping through client (which it references).  The shipper thread
 * starts on first use in each process (so a collector made in nginx's master works in every
 * worker).  Returns NULL with a reason in why (256 bytes). */
esx_collector *esx_collector_new(const esx_collector_config *cfg, esx_client *client,
                                 char *why);

/* Outcome of one intake. */
typedef struct esx_intake {
    int status;                  /* 204, 200 (partial), 400, 413, 429, 503 */
    int accepted;
    int n_rejects;
    esx_event_reject *rejects;   /* owned by the collector; valid until the next intake */
    int64_t retry_after_ms;      /* for 429/503 */
    char message[160];           /* for 4xx/5xx: sent to the client */
    char detail[256];            /* for the operator only (a failure of ours: paths, errno), or "" */
} esx_intake;

/* Parses body (from_query: a pixel beacon's query string) received at received_at (ms since
 * the epoch), admits and queues the valid events.  One caller at a time (a collector belongs
 * to one Lua state; its first call in a process starts the shipper, unlocked); the shipper
 * thread runs beside it.  Never fails other than through out->status. */
void esx_collector_ingest(esx_collector *col, const char *body, size_t len, int from_query,
                          int64_t received_at, esx_intake *out);

/* Asks the shipper to send everything now and waits until every event accepted so far is
 * acknowledged or timeout_ms passes (< 0: no limit).  Returns 1 when empty, 0 on timeout, -1
 * with a reason in why (256 bytes) when the shipper cannot run in this process (its spool
 * cannot be opened, no thread). */
int esx_collector_flush(esx_collector *col, int64_t timeout_ms, char *why);

/* A copy of one rollup row of the current window. */
typedef struct esx_rollup_view {
    int64_t window_start;
    char site_id[65], block_id[65], variant[65], type[33];
    uint64_t count, uniques;
} esx_rollup_view;

/* Copies the rows of now_ms's rollup window, taken under the collector's lock so that the
 * caller builds its answer (Lua tables, whose allocations may run finalizers that call the
 * collector) without it.  *rows is malloc'ed (the caller frees it; NULL when there is none)
 * and *n their number.  Returns 0, or -1 when out of memory (*rows NULL). */
int esx_collector_rollups(esx_collector *col, int64_t now_ms, esx_rollup_view **rows,
                          size_t *n);

void esx_collector_stats(esx_collector *col, esx_collector_counters *out);

/* Stops intake, flushes for up to timeout_ms, stops the shipper.  Events still queued stay
 * in the spool (when there is one) for replay; without a spool they are counted in the
 * return value as not delivered.  Returns the number of events not acknowledged. */
int64_t esx_collector_close(esx_collector *col, int64_t timeout_ms);

/* 1 when the collector has a spool directory (events left at close stay there). */
int esx_collector_has_spool(const esx_collector *col);

/* 1 once the collector's sink client was closed: nothing queued can be acknowledged. */
int esx_collector_sink_closed(const esx_collector *col);

/* The collector's sink client, as an identity only (collectors that share one compare equal). */
const void *esx_collector_sink(const esx_collector *col);

/* Frees a closed collector. */
void esx_collector_free(esx_collector *col);

#endif
