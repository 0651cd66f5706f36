/*
 * ratelimit.h -- per-site token buckets, so one customer's spike cannot starve the others.
 *
 * Keyed by site_id (user input: the table's hash is seeded).  The table is bounded: when it
 * is full, buckets that have refilled completely (indistinguishable from new ones) are
 * dropped; if none can be, the request is admitted and counted as unlimited.
 */
#ifndef ESX_RATELIMIT_H
#define ESX_RATELIMIT_H

#include <stddef.h>
#include <stdint.h>

typedef struct esx_ratelimit esx_ratelimit;

/* A limiter allowing `rate` events per second with bursts of `burst`, tracking at most
 * max_sites sites.  Returns NULL when out of memory. */
esx_ratelimit *esx_ratelimit_new(double rate, double burst, size_t max_sites);
void esx_ratelimit_free(esx_ratelimit *rl);

/* Takes n tokens from each site in sites[0..k-1] (counts[i] tokens for sites[i]) if every
 * one of them has enough; otherwise takes none.  Returns 0 when admitted, or the ms until
 * the fullest-lacking bucket has enough (for Retry-After). */
int64_t esx_ratelimit_take(esx_ratelimit *rl, const char *const *sites, const int *counts,
                           int k, int64_t now_ms);

/* esx_ratelimit_take in two steps, for a caller that may still refuse the request after the
 * limiter admitted it (a failed write): check returns what take returns but takes nothing
 * (it makes the buckets of new sites); commit, called next with the same sites and no other
 * call in between, takes the tokens of a request check returned 0 for. */
int64_t esx_ratelimit_check(esx_ratelimit *rl, const char *const *sites, const int *counts,
                            int k, int64_t now_ms);
void esx_ratelimit_commit(esx_ratelimit *rl, const char *const *sites, const int *counts, int k);

/* Requests admitted without a bucket because the table was full. */
uint64_t esx_ratelimit_unlimited(const esx_ratelimit *rl);

#endif
