/*
 * rollup_forgotten.c -- a count for a window whose rows were already written and forgotten
 * (the wall clock stepped back), run by spec/collector_spec.lua.  The new row must be
 * written under an _id of its own, so that it adds to the row written before instead of
 * being refused (a lower version) or replacing it.  Prints "ok <name>" per check; exits 1
 * on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rollup.h"
#include "rollup_emit.h"

/* the _id of the last line written, or "" */
static void last_id(char *out, size_t cap)
{
    const char *p = strstr(last, "\"_id\":\"");
    const char *e = p ? strchr(p + 7, '"') : NULL;
    size_t n = e ? (size_t)(e - (p + 7)) : 0;
    if (n >= cap)
        n = 0;
    memcpy(out, p ? p + 7 : "", n);
    out[n] = '\0';
}

int main(void)
{
    const long long t = 1700000000500LL;
    char first[256], again[256], third[256];
    esx_rollups *r = esx_rollups_new(1000, 100);
    esx_event ev = view("", "u1");
    esx_rollups_add(r, t, &ev);
    esx_rollups_add(r, t, &ev);
    check(emit(r, t + 1000) == 1 && strstr(last, "\"count\":2,") != NULL,
          "the ended window's row is written with count 2");
    last_id(first, sizeof first);
    check(emit(r, t + 11000) == 0 && esx_rollups_rows(r) == 0, "and forgotten 10 s later");
    /* the wall clock steps back 11 s: a new event lands in the forgotten window */
    strcpy(ev.user_id, "u2");
    check(esx_rollups_add(r, t, &ev) == 0, "a count in the forgotten window");
    check(emit(r, t + 1000) == 1 && strstr(last, "\"count\":1,") != NULL,
          "its row is written with its own count");
    last_id(again, sizeof again);
    check(again[0] && strcmp(first, again) != 0, "under an _id of its own");
    check(esx_rollups_add(r, t, &ev) == 0 && emit(r, t + 1000) == 1 &&
              strstr(last, "\"count\":2,") != NULL,
          "that row goes on counting");
    last_id(third, sizeof third);
    check(strcmp(again, third) == 0, "under the same _id (rewritten)");
    /* a window never forgotten keeps the plain _id: instance-run-window-key */
    esx_rollups_add(r, t + 60000, &ev);
    check(emit(r, t + 61000) == 1, "a later window's row is written");
    last_id(third, sizeof third);
    check(strchr(third + strlen(third) - 17, '-') == third + strlen(third) - 17,
          "with the plain _id (16 hex digits after the last '-')");
    esx_rollups_free(r);
    return fails ? 1 : 0;
}
