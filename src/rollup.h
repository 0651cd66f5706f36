/*
 * rollup.h -- per-window aggregates of accepted events: a count and a HyperLogLog of
 * distinct user_ids for each (window, site_id, block_id, variant, type).
 *
 * This replaces the seed's periodic log-aggregator job: every instance keeps its own rows
 * and writes them to the rollup index under a deterministic _id per instance, table (a
 * random run id), window and key, so re-writing a row overwrites it and rows of many
 * instances -- and of tables that one instance name had before -- add up (counts sum, HLL
 * registers merge).  The table is keyed by user input: its hash is seeded and its size
 * is bounded (rows beyond max_rows are not created and are counted).
 */
#ifndef ESX_ROLLUP_H
#define ESX_ROLLUP_H

#include <stddef.h>
#include <stdint.h>

#include "event.h"
#include "hll.h"

typedef struct esx_rollup_row {
    int64_t window_start;           /* ms since the epoch, a multiple of the window */
    char site_id[65], block_id[65], variant[65], type[33];
    uint64_t count;
    esx_hll *hll;                   /* NULL until the row sees a user_id */
    int dirty;                      /* changed since last written */
    uint64_t gen;                   /* > 0: made after rows of its window were forgotten */
    uint64_t hash;
    struct esx_rollup_row *next;
} esx_rollup_row;

typedef struct esx_rollups esx_rollups;

/* A table for windows of window_ms holding at most max_rows rows.  NULL when out of memory. */
esx_rollups *esx_rollups_new(int64_t window_ms, size_t max_rows);
void esx_rollups_free(esx_rollups *r);

/* Counts ev (accepted at received_at ms).  At max_rows, rows of earlier windows that are
 * already written make room, and so do written rows of windows after the next one (made
 * while the wall clock was ahead).  Returns 0; 1 when the row could not be created (table full of
 * rows not yet written or of this window, or out of memory), or its sketch could not take the
 * event's user_id (out of memory): the event is then not counted at all -- neither in the
 * row's count nor in its uniques -- but in dropped; never fails otherwise. */
int esx_rollups_add(esx_rollups *r, int64_t received_at, const esx_event *ev);

/* Calls fn for every row of the window containing now_ms (for col:rollups()). */
void esx_rollups_current(esx_rollups *r, int64_t now_ms,
                         void (*fn)(const esx_rollup_row *row, void *ud), void *ud);

/* Writes each dirty row as one bulk "index" operation (action line + document line) through
 * emit, marks it clean, and forgets rows of windows that ended over 10 s before now_ms once
 * written (a count that arrives late in that time goes on in the same row, written again;
 * one that arrives later -- the wall clock stepped back -- makes a row with an _id of its
 * own, which adds to the one written before).
 * With all = 0 only rows of ended windows are written.  instance and index_fmt (strftime,
 * UTC of the window start) name the writer and the target index.  emit returns 0 when it
 * took the line, > 0 to stop without it (no room), < 0 on failure; rows not taken stay
 * dirty.  Returns the number of rows written, or -1 when emit failed. */
int esx_rollups_emit(esx_rollups *r, int64_t now_ms, int all, const char *instance,
                     const char *index_fmt,
                     int (*emit)(void *ud, const char *line, size_t len), void *ud);

/* Rows held, events not counted since creation (their row could not be made), bytes of
 * memory held. */
size_t esx_rollups_rows(const esx_rollups *r);
/* Rows changed since last written (those an emit that failed left behind). */
size_t esx_rollups_dirty(const esx_rollups *r);
uint64_t esx_rollups_dropped(const esx_rollups *r);
size_t esx_rollups_memory(const esx_rollups *r);

/* The window length in ms. */
int64_t esx_rollups_window(const esx_rollups *r);

#endif
