/*
 * ratelimit.c -- per-site token buckets in a bounded, seeded hash table (see ratelimit.h).
 */
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "ratelimit.h"

typedef struct bucket {
    char site[65];      /* "" = empty slot */
    double tokens;
    int64_t at;         /* ms of the last refill */
} bucket;

struct esx_ratelimit {
    double rate, burst;
    size_t cap, used, max;
    int64_t next_purge;  /* ms: no purge before (one frees nothing until buckets refill) */
    uint64_t seed;
    uint64_t unlimited;
    bucket *slots;
};

esx_ratelimit *esx_ratelimit_new(double rate, double burst, size_t max_sites)
{
    esx_ratelimit *rl = calloc(1, sizeof *rl);
    if (rl == NULL)
        return NULL;
    rl->rate = rate;
    rl->burst = burst;
    rl->max = max_sites;
    rl->cap = 16;
    while (rl->cap < max_sites * 2)
        rl->cap *= 2;
    rl->slots = calloc(rl->cap, sizeof *rl->slots);
    if (rl->slots == NULL) {
        free(rl);
        return NULL;
    }
    rl->seed = esx_random_seed();
    return rl;
}

void esx_ratelimit_free(esx_ratelimit *rl)
{
    if (rl) {
        free(rl->slots);
        free(rl);
    }
}

static void refill(const esx_ratelimit *rl, bucket *b, int64_t now)
{
    if (now > b->at) {
        b->tokens += (double)(now - b->at) * rl->rate / 1000.0;
        if (b->tokens > rl->burst)
            b->tokens = rl->burst;
        b->at = now;
    }
}

/* 1 when site is one of the request's sites[0..k) */
static int in_request(const char *site, const char *const *sites, int k)
{
    for (int i = 0; i < k; i++)
        if (strncmp(site, sites[i], sizeof(((bucket *)0)->site) - 1) == 0)
            return 1;
    return 0;
}

/* Drops every bucket that is full again, except those of the request's own sites (it is
 * about to charge them, and the room freed goes to its later sites); rebuilds the table.
 * Returns slots freed. */
static size_t purge(esx_ratelimit *rl, int64_t now, const char *const *sites, int k)
{
    bucket *old = rl->slots;
    bucket *fresh = calloc(rl->cap, sizeof *fresh);
    if (fresh == NULL)
        return 0;
    size_t kept = 0;
    for (size_t i = 0; i < rl->cap; i++) {
        if (!old[i].site[0])
            continue;
        refill(rl, &old[i], now);
        if (old[i].tokens >= rl->burst && !in_request(old[i].site, sites, k))
            continue;
        size_t j = esx_hash64(old[i].site, strlen(old[i].site), rl->seed) & (rl->cap - 1);
        while (fresh[j].site[0])
            j = (j + 1) & (rl->cap - 1);
        fresh[j] = old[i];
        kept++;
    }
    free(old);
    rl->slots = fresh;
    size_t freed = rl->used - kept;
    rl->used = kept;
    return freed;
}

/* The bucket for site, created full when new; NULL when the table is full.  A purge to make
 * room keeps the buckets of sites[0..k), the request's sites. */
static bucket *find(esx_ratelimit *rl, const char *site, int64_t now, int create,
                    const char *const *sites, int k)
{
    size_t len = strlen(site);
    if (len >= sizeof(((bucket *)0)->site))
        len = sizeof(((bucket *)0)->site) - 1;
    size_t i = esx_hash64(site, len, rl->seed) & (rl->cap - 1);
    while (rl->slots[i].site[0]) {
        if (strncmp(rl->slots[i].site, site, len) == 0 && rl->slots[i].site[len] == '\0')
            return &rl->slots[i];
        i = (i + 1) & (rl->cap - 1);
    }
    if (!create)
        return NULL;
    if (rl->used >= rl->max) {
        /* A purge rebuilds the whole table (O(max_sites)) under the collector's lock: at most
         * once per refill time (burst / rate, within 100 ms .. 60 s), or a stream of new site ids
         * against a table of active ones would pay it on every request. */
        if (now < rl->next_purge)
            return NULL;
        double refill_ms = rl->burst / rl->rate * 1000.0;
        rl->next_purge = now + (refill_ms < 100.0 ? 100 : refill_ms > 60000.0 ? 60000 : (int64_t)refill_ms);
        if (purge(rl, now, sites, k) == 0)
            return NULL;
        return find(rl, site, now, 1, sites, k);
    }
    bucket *b = &rl->slots[i];
    memcpy(b->site, site, len);
    b->site[len] = '\0';
    b->tokens = rl->burst;
    b->at = now;
    rl->used++;
    return b;
}

int64_t esx_ratelimit_check(esx_ratelimit *rl, const char *const *sites, const int *counts,
                            int k, int64_t now_ms)
{
    int64_t wait = 0;
    for (int i = 0; i < k; i++) {
        bucket *b = find(rl, sites[i], now_ms, 1, sites, k);
        if (b == NULL)
            continue;
        refill(rl, b, now_ms);
        /* A request with more of a site's events than its bucket holds goes when the bucket is
         * full, leaving it in debt (the site's next requests wait the debt off); waiting for
         * more tokens than the bucket holds would refuse it for ever. */
        double need = counts[i] > rl->burst ? rl->burst : counts[i];
        /* a billionth of an event of slack: the refill after a wait of exactly the ms said
         * below may round to a hair under `need`, which would refuse the client that waited */
        if (b->tokens < need - 1e-9) {
            /* rounded up to a whole ms, and no further: esx.collector rounds it up to
             * seconds for Retry-After, and 1 ms more made a wait of exactly 1 s one of 2 */
            double exact = (need - b->tokens) * 1000.0 / rl->rate;
            int64_t ms = (int64_t)exact;
            if ((double)ms < exact)
                ms++;
            if (ms > wait)
                wait = ms;
        }
    }
    return wait;
}

void esx_ratelimit_commit(esx_ratelimit *rl, const char *const *sites, const int *counts, int k)
{
    int unlimited = 0; /* a site of the request has no bucket (the table is full) */
    /* Found again, not kept from the check: a later site's find may have purged the table,
     * which moves buckets (it keeps the request's own: each found then is found now) */
    for (int i = 0; i < k; i++) {
        bucket *b = find(rl, sites[i], 0, 0, sites, k);
        if (b)
            b->tokens -= counts[i];
        else
            unlimited = 1;
    }
    rl->unlimited += (uint64_t)unlimited; /* requests, as stats().rate_unlimited says */
}

int64_t esx_ratelimit_take(esx_ratelimit *rl, const char *const *sites, const int *counts,
                           int k, int64_t now_ms)
{
    int64_t wait = esx_ratelimit_check(rl, sites, counts, k, now_ms);
    if (wait == 0)
        esx_ratelimit_commit(rl, sites, counts, k);
    return wait;
}

uint64_t esx_ratelimit_unlimited(const esx_ratelimit *rl)
{
    return rl->unlimited;
}
