/*
 * seeded_tables.c -- the collector's hash tables keyed by what beacons send (the rate
 * limiter's per-site buckets, the rollup rows) are seeded per table, so that keys chosen to
 * collide cannot be precomputed (PITFALLS.md: hash flooding).  Run by spec/collector_spec.lua.
 *
 * An attacker who knew one table's seed (or a fixed one) picks keys that all land in one
 * slot: table A, whose seed the program reads, takes them all in one probe run / one chain.
 * The same keys in table B, made the same way, must spread as random keys do.
 *
 * Built with the two sources included (their types and static helpers are private), so the
 * spec passes neither src/ratelimit.c nor src/rollup.c on the command line.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ratelimit.c"
#include "rollup.c"

#define KEYS 200

/* The longest run of occupied consecutive slots of a rate limiter (linear probing: a lookup
 * of a key in the run walks up to its length). */
static size_t longest_run(const esx_ratelimit *rl)
{
    size_t best = 0, run = 0;
    for (size_t i = 0; i < 2 * rl->cap; i++) { /* twice round: a run may wrap */
        if (rl->slots[i & (rl->cap - 1)].site[0]) {
            if (++run > best)
                best = run;
        } else {
            run = 0;
        }
    }
    return best > rl->cap ? rl->cap : best;
}

/* The longest chain of a rollup table's buckets. */
static size_t longest_chain(const esx_rollups *r)
{
    size_t best = 0;
    for (size_t i = 0; i < r->nbuckets; i++) {
        size_t n = 0;
        for (const esx_rollup_row *row = r->buckets[i]; row; row = row->next)
            n++;
        if (n > best)
            best = n;
    }
    return best;
}

static void ratelimit_checks(void)
{
    esx_ratelimit *a = esx_ratelimit_new(1000, 1000, 1000); /* 2048 slots */
    esx_ratelimit *b = esx_ratelimit_new(1000, 1000, 1000);
    static char sites[KEYS][65];
    int found = 0;
    for (long i = 0; found < KEYS && i < 100000000; i++) {
        char s[65];
        int len = snprintf(s, sizeof s, "site-%ld", i);
        if ((esx_hash64(s, (size_t)len, a->seed) & (a->cap - 1)) == 0)
            memcpy(sites[found++], s, (size_t)len + 1);
    }
    check(found == KEYS, "ratelimit: found keys colliding under table A's seed");
    for (int i = 0; i < found; i++) {
        const char *site = sites[i];
        int one = 1;
        esx_ratelimit_take(a, &site, &one, 1, 0);
        esx_ratelimit_take(b, &site, &one, 1, 0);
    }
    check(longest_run(a) >= KEYS, "ratelimit: they make one probe run in table A");
    size_t run = longest_run(b);
    check(run <= 16, "ratelimit: table B, seeded apart, spreads them");
    if (run > 16)
        printf("  (longest run in B: %zu)\n", run);
    esx_ratelimit_free(a);
    esx_ratelimit_free(b);
}

static void rollup_checks(void)
{
    const int64_t t = 1700000000000LL;
    esx_rollups *a = esx_rollups_new(60000, 1000); /* 1024 buckets */
    esx_rollups *b = esx_rollups_new(60000, 1000);
    static esx_event evs[KEYS];
    int64_t w = window_of(a, t);
    int found = 0;
    for (long i = 0; found < KEYS && i < 100000000; i++) {
        esx_event ev;
        memset(&ev, 0, sizeof ev);
        snprintf(ev.site_id, sizeof ev.site_id, "s1");
        snprintf(ev.type, sizeof ev.type, "view");
        snprintf(ev.block_id, sizeof ev.block_id, "b%ld", i);
        char key[256];
        size_t klen = key_bytes(key, w, ev.site_id, ev.block_id, ev.variant, ev.type);
        if ((esx_hash64(key, klen, a->seed) & (a->nbuckets - 1)) == 0)
            evs[found++] = ev;
    }
    check(found == KEYS, "rollups: found keys colliding under table A's seed");
    for (int i = 0; i < found; i++) {
        esx_rollups_add(a, t, &evs[i]);
        esx_rollups_add(b, t, &evs[i]);
    }
    check(longest_chain(a) == KEYS, "rollups: they make one chain in table A");
    size_t chain = longest_chain(b);
    check(chain <= 8, "rollups: table B, seeded apart, spreads them");
    if (chain > 8)
        printf("  (longest chain in B: %zu)\n", chain);
    esx_rollups_free(a);
    esx_rollups_free(b);
}

int main(void)
{
    ratelimit_checks();
    rollup_checks();
    return fails;
}
