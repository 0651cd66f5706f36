/*
 * collector_queue.c -- the collector's queued items: the ready queue, in arrival order, and
 * the runs of items waiting out a retry's back-off, by due time (see collector_int.h).
 */
#include <stdint.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "collector_int.h"

static size_t item_cost(const item *it)
{
    return it->len + ITEM_OVERHEAD;
}

item *esx_col_item_new(const char *data, size_t len, int64_t now, esx_segment *seg)
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

void esx_col_ready_prepend(esx_collector *col, item *it)
{
    it->next = col->ready_head;
    col->ready_head = it;
    if (!col->ready_tail)
        col->ready_tail = it;
    col->ready_bytes += it->len;
    col->ready_count++;
}

void esx_col_enqueue(esx_collector *col, item *it)
{
    ready_append(col, it);
    col->queue_bytes += item_cost(it);
    col->queue_events++;
}

void esx_col_item_done(esx_collector *col, item *it)
{
    col->queue_bytes -= item_cost(it);
    col->queue_events--;
    if (it->rollup)
        col->queue_rollups--;
    if (it->seg && col->spool)
        esx_spool_release(col->spool, it->seg, 1);
    free(it);
}

int64_t esx_col_backoff(esx_collector *col, int attempts)
{
    int64_t base = col->cfg.backoff_min;
    for (int i = 1; i < attempts && base < col->cfg.backoff_max; i++)
        base *= 2;
    if (base > col->cfg.backoff_max)
        base = col->cfg.backoff_max;
    col->rng = col->rng * 1103515245u + 12345u;
    return base / 2 + (int64_t)((col->rng >> 8) % (unsigned)(base / 2 + 1));
}

void esx_col_retry_later(esx_collector *col, run *r, item *it)
{
    if (it->attempts < INT_MAX - 1) /* items retry without limit: weeks against a dead sink */
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

void esx_col_ready_prepend_run(esx_collector *col, const run *r)
{
    r->tail->next = col->ready_head;
    col->ready_head = r->head;
    if (!col->ready_tail)
        col->ready_tail = r->tail;
    col->ready_bytes += r->bytes;
    col->ready_count += r->count;
}

void esx_col_delay_run(esx_collector *col, const run *r)
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
            esx_col_ready_prepend_run(col, r);
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

void esx_col_free_list(item *it)
{
    while (it) {
        item *next = it->next;
        free(it);
        it = next;
    }
}

void esx_col_free_runs(run *r)
{
    while (r) {
        run *next = r->next;
        esx_col_free_list(r->head);
        free(r);
        r = next;
    }
}
