/*
 * ratelimit_purge.c -- a request whose second site fills the table, run by
 * spec/collector_spec.lua.  The purge that makes room drops the buckets that have refilled,
 * but not those of the request's own sites: every site found is charged, and one left
 * without a bucket is counted as unlimited.  Prints "ok <name>"
 * per check; exits 1 on a failure.
 */
#include <stdio.h>

#include "check.h"
#include "ratelimit.h"

int main(void)
{
    /* 1 event/s, bursts of 2, room for 2 sites */
    esx_ratelimit *rl = esx_ratelimit_new(1.0, 2.0, 2);
    if (rl == NULL)
        return 1;
    const char *a[] = {"a"}, *b[] = {"b"}, *ac[] = {"a", "c"};
    int one[] = {1}, two[] = {2}, one_one[] = {1, 1};
    check(esx_ratelimit_take(rl, a, one, 1, 0) == 0, "a takes 1 of 2");
    check(esx_ratelimit_take(rl, b, two, 1, 0) == 0, "b takes 2 of 2: the table is full");
    /* 3 s later both buckets are full again; c needs a slot: the purge drops a and b */
    check(esx_ratelimit_take(rl, ac, one_one, 2, 3000) == 0, "a and c take 1 each");
    check(esx_ratelimit_take(rl, a, two, 1, 3000) > 0, "a has 1 token left, not 2");
    check(esx_ratelimit_take(rl, a, one, 1, 3000) == 0, "a takes its last token");
    check(esx_ratelimit_unlimited(rl) == 0, "no request went unlimited");
    esx_ratelimit_free(rl);

    /* The purge frees only a's slot (b is still below full), and c, later in the request,
     * needs one: a's bucket is kept for a, c goes unlimited. */
    rl = esx_ratelimit_new(1.0, 2.0, 2);
    if (rl == NULL)
        return 1;
    check(esx_ratelimit_take(rl, a, one, 1, 0) == 0, "a takes 1 of 2 again");
    check(esx_ratelimit_take(rl, b, two, 1, 0) == 0, "b takes 2 of 2 again");
    check(esx_ratelimit_take(rl, ac, one_one, 2, 1500) == 0, "a and c at 1.5 s");
    check(esx_ratelimit_unlimited(rl) == 1, "c went unlimited (no room), and is counted");
    check(esx_ratelimit_take(rl, a, two, 1, 1500) > 0, "a was charged: 1 token left");
    esx_ratelimit_free(rl);
    return fails ? 1 : 0;
}
