/*
 * rollup_emit.h -- what the rollup unit programs share: emit() writes a table's due rows
 * (instance "i1", index "rollups-%Y") and counts them, keeping the last line in `last`.
 */
#ifndef ESX_UNIT_ROLLUP_EMIT_H
#define ESX_UNIT_ROLLUP_EMIT_H

#include <string.h>

#include "rollup.h"

static char last[4096];

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
