/*
 * rollup_grace.c -- a count that reaches a rollup row after its window ended, run by
 * spec/hll_spec.lua.  The row must go on from its real count (written again, a higher
 * version), not start again at 1 under the same _id.  Prints "ok <name>" per check; exits 1
 * on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rollup.h"
#include "rollup_emit.h"

int main(void)
{
    esx_rollups *r = esx_rollups_new(1000, 100);
    esx_event ev = view("", "u1");
    check(esx_rollups_add(r, 1700000000999LL, &ev) == 0, "a count in window ...000");
    check(emit(r, 1700000001000LL) == 1, "the window ended: its row is written");
    /* a request received at ...999, counted after the row was written */
    strcpy(ev.user_id, "u2");
    check(esx_rollups_add(r, 1700000000999LL, &ev) == 0, "a late count in the ended window");
    check(emit(r, 1700000001005LL) == 1, "the row is written again");
    check(strstr(last, "\"count\":2,") != NULL, "with the count of both events");
    check(strstr(last, "\"version\":2,") != NULL,
          "and a higher version, so that it replaces the first write");
    check(esx_rollups_rows(r) == 1, "the row is kept for a while");
    check(emit(r, 1700000001000LL + 10001) == 0 && esx_rollups_rows(r) == 0,
          "and forgotten 10 s after its window ended");
    esx_rollups_free(r);
    return fails ? 1 : 0;
}
