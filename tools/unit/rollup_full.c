/*
 * rollup_full.c -- a rollup table at max_rows when a new window starts, run by
 * spec/collector_spec.lua.  Rows of an ended window that are already written are kept only
 * for late counts: a row the open window needs must take their place, not be refused.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rollup.h"
#include "rollup_emit.h"

int main(void)
{
    const long long t = 1700000000000LL;
    esx_rollups *r = esx_rollups_new(1000, 4);
    int added = 0;
    for (int i = 0; i < 4; i++) {
        char b[8];
        snprintf(b, sizeof b, "b%d", i);
        added += add(r, t + 10, b) == 0;
    }
    check(added == 4 && esx_rollups_rows(r) == 4, "four rows fill the table");
    check(add(r, t + 20, "b9") == 1 && esx_rollups_dropped(r) == 1,
          "a fifth is refused while the four are not written");
    check(emit(r, t + 1000) == 4, "the window ends: its four rows are written");
    check(add(r, t + 1001, "b0") == 0, "the next window's first row takes a written row's place");
    check(add(r, t + 1002, "b1") == 0 && add(r, t + 1003, "b2") == 0,
          "and so do the next ones");
    check(esx_rollups_dropped(r) == 1 && esx_rollups_rows(r) <= 4, "nothing more is refused");
    /* a late count for the ended window: its row was written and let go */
    check(add(r, t + 999, "b3") == 0, "a late count in the ended window is taken");
    check(emit(r, t + 1004) == 1 && strstr(last, "\"count\":1,") && strstr(last, "-g1\""),
          "and written under an _id of its own");
    esx_rollups_free(r);
    return fails ? 1 : 0;
}
