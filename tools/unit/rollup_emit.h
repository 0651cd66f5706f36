/*
 * rollup_emit.h -- what the rollup unit programs share: view() makes a "view" event of site
 * "s1", add() counts one in a table; emit() writes a table's due rows (instance "i1", index
 * "rollups-%Y") and counts them, keeping the last line in `last`.
 */
#ifndef ESX_UNIT_ROLLUP_EMIT_H
#define ESX_UNIT_ROLLUP_EMIT_H

#include <stdio.h>
#include <string.h>

#include "rollup.h"

static char last[4096];

/* A "view" event of site s1 in block, by user. */
static esx_event view(const char *block, const char *user)
{
    esx_event ev;
    memset(&ev, 0, sizeof ev);
    snprintf(ev.site_id, sizeof ev.site_id, "s1");
    snprintf(ev.type, sizeof ev.type, "view");
    snprintf(ev.block_id, sizeof ev.block_id, "%s", block);
    snprintf(ev.user_id, sizeof ev.user_id, "%s", user);
    return ev;
}

/* Counts a view of block (no user) at `at` in r: esx_rollups_add's answer.  (inline: not
 * every program that includes this uses it) */
static inline int add(esx_rollups *r, long long at, const char *block)
{
    esx_event ev = view(block, "");
    return esx_rollups_add(r, at, &ev);
}

static int keep_last(void *ud, const char *line, size_t len)
{
    int *n = ud;
    (*n)++;
    if (len >= sizeof last)
        len = sizeof last - 1;
    memcpy(last, line, len);
    last[len] = '\0';
    return 0;
}

/* The number of rows esx_rollups_emit wrote at `now` (not every row: all = 0). */
static int emit(esx_rollups *r, long long now)
{
    int n = 0;
    esx_rollups_emit(r, now, 0, "i1", "rollups-%Y", keep_last, &n);
    return n;
}

#endif
