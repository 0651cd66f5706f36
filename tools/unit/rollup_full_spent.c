/*
 * rollup_full_spent.c -- a rollup table at max_rows whose rows were all written while their
 * window was still open, run by spec/collector_spec.lua.  A new key late in that window finds
 * no room (the rows are of the open window); once the window has ended, the next window's
 * rows must still take the written rows' places, not be refused until they are forgotten.
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
    int added = 0, n = 0;
    for (int i = 0; i < 4; i++) {
        char b[8];
        snprintf(b, sizeof b, "b%d", i);
        added += add(r, t + 10, b) == 0;
    }
    check(added == 4, "four rows fill the table");
    esx_rollups_emit(r, t + 500, 1, "i1", "rollups-%Y", keep_last, &n);
    check(n == 4, "an interval writes the open window's four rows");
    check(add(r, t + 600, "b9") == 1, "a fifth key of the open window is refused");
    check(emit(r, t + 1000) == 0, "the window ends: nothing is left to write");
    check(add(r, t + 1001, "b0") == 0, "the next window's first row takes a written row's place");
    check(add(r, t + 1002, "b1") == 0, "and so does the next one");
    check(esx_rollups_dropped(r) == 1 && esx_rollups_rows(r) <= 4, "nothing more is refused");
    esx_rollups_free(r);
    return fails ? 1 : 0;
}
