/*
 * ratelimit_wait.c -- the wait a refused request is told (Retry-After), run by
 * spec/collector_spec.lua.  It is the time until the bucket holds what the request needs,
 * rounded up to a whole ms, never a ms more: esx.collector rounds it up to seconds, and a
 * wait of exactly 1000 ms made 1001, a Retry-After of 2 s for 1.  Prints "ok <name>" per
 * check; exits 1 on a failure.
 */
#include <stdio.h>

#include "check.h"
#include "ratelimit.h"

int main(void)
{
    const char *a[] = {"a"};
    int one[] = {1}, two[] = {2};
    /* 1 event/s, bursts of 1 */
    esx_ratelimit *rl = esx_ratelimit_new(1.0, 1.0, 16);
    if (rl == NULL)
        return 1;
    check(esx_ratelimit_take(rl, a, one, 1, 0) == 0, "a takes its token");
    check(esx_ratelimit_take(rl, a, one, 1, 0) == 1000, "the next one waits 1000 ms");
    check(esx_ratelimit_take(rl, a, one, 1, 250) == 750, "250 ms later, 750 ms");
    check(esx_ratelimit_take(rl, a, one, 1, 1000) == 0, "after 1000 ms it goes");
    esx_ratelimit_free(rl);

    /* a request that waited exactly what it was told goes, even where the refill's floating
     * point lands a hair short: 2 events leave a debt of 1; at 72 ms the wait is 1928 ms, and
     * -1 + 0.072 + 1.928 is 0.9999999999999999 in doubles */
    rl = esx_ratelimit_new(1.0, 1.0, 16);
    if (rl == NULL)
        return 1;
    check(esx_ratelimit_take(rl, a, two, 1, 0) == 0, "2 events go at once, leaving a debt");
    check(esx_ratelimit_take(rl, a, one, 1, 72) == 1928, "72 ms later, 1928 ms");
    check(esx_ratelimit_take(rl, a, one, 1, 2000) == 0, "having waited them, it goes");
    esx_ratelimit_free(rl);

    /* 3 events/s, bursts of 2: a fractional wait rounds up to the next ms */
    rl = esx_ratelimit_new(3.0, 2.0, 16);
    if (rl == NULL)
        return 1;
    check(esx_ratelimit_take(rl, a, two, 1, 0) == 0, "a takes its 2 tokens");
    check(esx_ratelimit_take(rl, a, one, 1, 0) == 334, "1 token at 3/s: 333.3 ms, told 334");
    check(esx_ratelimit_take(rl, a, one, 1, 334) == 0, "and at 334 ms it goes");
    esx_ratelimit_free(rl);
    return fails ? 1 : 0;
}
