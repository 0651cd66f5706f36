/*
 * collector_intake.c -- a request's events, on the caller's thread (an nginx worker's
 * handler): parse and validate (event.h), admit or refuse at once (queue bytes, per-site
 * rate), write ahead to the spool, queue.  See collector_int.h.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "collector_int.h"

static void refuse(esx_intake *out, int status, enum esx_reject_reason why_code,
                   esx_collector *col, int events, const char *msg)
{
    out->status = status;
    snprintf(out->message, sizeof out->message, "%.150s", msg);
    pthread_mutex_lock(&col->mu);
    col->st.rejected[why_code] += (uint64_t)(events > 0 ? events : 1);
    pthread_mutex_unlock(&col->mu);
}

/* A failure of ours (the spool, the shipper thread): why names paths and system errors, for
 * the operator (out->detail), not for the client, who gets a message of its own. */
static void unusable(esx_intake *out, const char *why)
{
    snprintf(out->message, sizeof out->message, "the collector cannot store events now");
    snprintf(out->detail, sizeof out->detail, "%s", why);
}

/* The distinct sites of events[0..n) into col->sites, with their event counts in
 * col->counts; returns how many. */
static int count_sites(esx_collector *col, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        int j = 0;
        while (j < k && strcmp(col->sites[j], col->events[i].site_id) != 0)
            j++;
        if (j == k) {
            col->sites[k] = col->events[i].site_id;
            col->counts[k++] = 0;
        }
        col->counts[j]++;
    }
    return k;
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
    /* an empty array holds no event to count as invalid: refused as an empty body is, once
     * under not_json -- else its 400 was counted under no reason (rejected.total missed it) */
    if (n == 0 && nr == 0)
        col->st.rejected[ESX_RJ_NOT_JSON]++;
    pthread_mutex_unlock(&col->mu);
    if (n == 0) {
        out->status = 400;
        snprintf(out->message, sizeof out->message, nr ? "no valid event" : "no event in the request");
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
    int k = col->rl ? count_sites(col, n) : 0;

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
    /* the sites' tokens are taken once the events are (below): a request refused after
     * this check (the spool write, memory) took none of its events, so none of the rate */
    if (col->rl) {
        int64_t wait = esx_ratelimit_check(col->rl, sites, counts, k, now);
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
            unusable(out, why);
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
        if (col->rl)
            esx_ratelimit_commit(col->rl, sites, counts, k);
        pthread_cond_signal(&col->wake);
        pthread_mutex_unlock(&col->mu);
        out->accepted = n;
        out->status = out->n_rejects ? 200 : 204;
        return;
    }
    int queued = 0, was_empty = col->ready_head == NULL;
    for (int i = 0; i < n; i++) {
        item *it = esx_col_item_new(col->lines.data + offs[i], offs[i + 1] - offs[i], now, seg);
        if (it == NULL)
            break;
        esx_col_enqueue(col, it);
        if (seg)
            seg->pending++;
        if (col->rollups && esx_rollups_add(col->rollups, received_at, &col->events[i]) != 0)
            col->st.rollup_dropped = esx_rollups_dropped(col->rollups);
        queued++;
    }
    int accepted = queued;
    if (queued < n) {
        /* out of memory midway: with a spool the record holds every event (accepted, see
         * below); without a spool, report the others as refused */
        if (!seg && queued == 0) {
            /* none taken: a 200 that accepted nothing would have the tag drop events that
             * a retry could deliver -- 503, as for memory that ran out parsing */
            col->st.rejected[ESX_RJ_NOMEM] += (uint64_t)n;
            pthread_mutex_unlock(&col->mu);
            out->status = 503;
            out->retry_after_ms = 1000;
            snprintf(out->message, sizeof out->message, "out of memory");
            return;
        }
        if (!seg) {
            col->st.rejected[ESX_RJ_NOMEM] += (uint64_t)(n - queued);
            /* each at its position in the body, among the parse's rejects in increasing
             * order: the body's events are the valid ones and the rejected ones, both in
             * body order; walked from the end, so that moving a parse reject up to its
             * place (w >= j) never overwrites one not moved yet (room: n + nr <= m) */
            int j = out->n_rejects - 1, w = out->n_rejects + (n - queued) - 1, i = n - 1;
            out->n_rejects = w + 1;
            for (int pos = n + nr - 1; pos >= 0 && w >= 0; pos--) {
                if (j >= 0 && col->rejects[j].index == pos) {
                    col->rejects[w--] = col->rejects[j--];
                } else {
                    if (i >= queued) {
                        esx_event_reject *r = &col->rejects[w--];
                        r->index = pos;
                        snprintf(r->reason, sizeof r->reason, "out of memory");
                    }
                    i--;
                }
            }
        } else {
            /* the write-ahead record holds them all: they are accepted (the answer says so).
             * The rest join the backlog as an overflow record of their own, loaded back by
             * this process as memory allows; if that write fails they stay counted in the
             * write-ahead segment, kept on disk (its pending never reaches 0) for the next
             * process that opens the spool_dir to replay.  (A replay of both records is
             * harmless: each event is a create with its own _id.) */
            esx_segment *oseg = NULL;
            size_t rest = offs[n] - offs[queued];
            if (col->spool->bytes_on_disk + rest + 8 <= col->cfg.spool_max_bytes &&
                esx_spool_append(col->spool, col->lines.data + offs[queued], rest, 1, &oseg,
                                 why) == 0) {
                col->st.spilled += (uint64_t)(n - queued);
                pthread_cond_signal(&col->wake);
            } else {
                seg->pending += n - queued;
            }
            for (int i = queued; i < n; i++)
                if (col->rollups && esx_rollups_add(col->rollups, received_at, &col->events[i]) != 0)
                    col->st.rollup_dropped = esx_rollups_dropped(col->rollups);
            accepted = n;
        }
    }
    col->st.accepted += (uint64_t)accepted;
    if (col->rl) {
        if (accepted < n) /* only the events taken count against their sites' rate */
            k = count_sites(col, accepted);
        esx_ratelimit_commit(col->rl, sites, counts, k);
    }
    /* A wake-up only when a bulk slot is free (otherwise batch_done wakes the shipper when
     * one frees: a signal per request cost 20% of a worker's CPU with a stalled sink), and
     * only for a full batch or for the first event of an empty queue: the shipper, asleep
     * with nothing queued, would otherwise wake on its idle timer (up to 1 s) instead of
     * once that event is flush_interval old -- one signal per bulk, none per request. */
    if (((was_empty && queued > 0) || col->ready_bytes >= col->batch_cap ||
         col->ready_count >= col->cfg.batch_max_events) &&
        col->inflight < col->cfg.bulk_concurrency && now >= col->paused_until)
        pthread_cond_signal(&col->wake);
    else if (seg && (col->cfg.spool_sync_interval == 0 || esx_spool_sync_wanted(col->spool)))
        pthread_cond_signal(&col->wake); /* 0: the record is synced on the next pass, now;
                                          * sealed segments piling up: synced now too */
    pthread_mutex_unlock(&col->mu);
    out->accepted = accepted;
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
    int erc = esx_col_ensure_running(col, why);
    if (erc != 0) {
        refuse(out, 503, erc == -2 ? ESX_RJ_NOMEM : ESX_RJ_SPOOL, col, 0, "");
        unusable(out, why);
        out->retry_after_ms = 1000;
        return;
    }
    pthread_mutex_lock(&col->intake_mu);
    ingest(col, body, len, from_query, received_at, out);
    pthread_mutex_unlock(&col->intake_mu);
}
