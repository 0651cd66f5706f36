/*
 * rollup_ahead.c -- rows made while the wall clock was ahead (a forward step, corrected),
 * run by spec/collector_spec.lua.  Once written they are kept until real time reaches their
 * window and 10 s more: at max_rows they must give their place to the current window's rows,
 * which were refused until then (an hour's step: an hour of rollups lost).  A row made again
 * for such a window when real time reaches it is written under an _id of its own.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rollup.h"
#include "rollup_emit.h"

/* The number of rows written at `now`, the open window's too (rollup.interval's writes). */
static int emit_all(esx_rollups *r, long long now)
{
    int n = 0;
    esx_rollups_emit(r, now, 1, "i1", "rollups-%Y", keep_last, &n);
    return n;
}

int main(void)
{
    const long long t = 1700000000000LL, ahead = t + 3600000;
    esx_rollups *r = esx_rollups_new(1000, 4);
    int added = 0;
    for (int i = 0; i < 4; i++) {
        char b[8];
        snprintf(b, sizeof b, "b%d", i);
        added += add(r, ahead + 10, b) == 0;
    }
    check(added == 4 && emit_all(r, ahead + 500) == 4,
          "an hour ahead: four rows fill the table, written by the interval");
    check(add(r, ahead + 600, "b9") == 1, "a fifth of that window is refused (the walk for room found none)");
    /* the clock is put right: the current window's rows must be taken */
    check(add(r, t + 10, "c0") == 0, "back in real time: a current row takes a row made ahead's place");
    check(add(r, t + 20, "c1") == 0 && add(r, t + 30, "c2") == 0 && add(r, t + 40, "c3") == 0,
          "and so do the next ones");
    check(esx_rollups_dropped(r) == 1 && esx_rollups_rows(r) == 4, "nothing more is refused");
    /* a late count for the window before the current one never frees the current rows */
    check(emit_all(r, t + 100) == 4 && add(r, t - 5, "late") == 1 && esx_rollups_rows(r) == 4,
          "a late count of the window before does not take a current row's place");
    /* real time reaches the window of the rows made ahead: a row of it is made again */
    check(emit(r, ahead + 5) == 0 && add(r, ahead + 10, "b0") == 0,
          "real time reaches the window the rows were made ahead in: b0 is counted again");
    check(emit_all(r, ahead + 20) == 1 && strstr(last, "\"count\":1,") && strstr(last, "-g"),
          "and written under an _id of its own (adds to the row written ahead)");
    esx_rollups_free(r);
    return fails ? 1 : 0;
}
