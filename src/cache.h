/*
 * cache.h -- the C core of esx.cache: entries, LRU, byte accounting, TTLs, the change log
 * and (with shared = true) the cross-process state.  No Lua state inside.
 *
 * Two kinds of entry share one LRU list and one byte budget (max_bytes):
 *   - ESX_CACHE_PAGE: a tier 1 page.  The page's data (a Lua table) lives in the binding;
 *     the core holds its key, its measured size, its expiry and its LRU position.  Pages that
 *     the core drops (eviction, expiry, invalidation) are queued so the binding can release
 *     the Lua data (esx_cache_removed_pages).
 *   - ESX_CACHE_READERS: a tier 2 reader set (esx_rset), owned by the core.
 *
 * Every change (mark_read, invalidate_article, invalidate_pages) is appended to a change log:
 * a ring of ESX_CACHE_LOG entries numbered by a sequence.  A load records the sequence when
 * it starts; its result is inserted only if the ring still covers that sequence and no
 * invalidation of the same key happened since (marks since then are replayed onto it).  So a
 * slow load, or a commit, can never put back data older than an invalidation.
 *
 * With shared = true the ring, the sequence and a table of single-flight lock slots (each
 * with a hand-off buffer for the loaded result) live in one MAP_SHARED anonymous mapping made
 * before fork (nginx: init_by_lua).  Each process keeps its own tiers and the sequence it has
 * applied; esx_cache_sync() applies what other processes logged, or drops the local tiers
 * when the process has fallen more than the ring behind.  A process-shared robust mutex
 * guards the ring and the slots; the head sequence is published last, so a reader sees a
 * batch (a transaction commit) entirely or not at all.
 *
 * Times passed in (`now`) are the cache's clock in milliseconds (injectable in Lua); lock
 * deadlines use CLOCK_MONOTONIC, which all processes share.
 */
#ifndef ESX_CACHE_H
#define ESX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cache_rset.h"

#define ESX_CACHE_PAGE 1
#define ESX_CACHE_READERS 2

#define ESX_CACHE_LOG 4096             /* change-log ring entries */
#define ESX_CACHE_SLOTS 64             /* shared single-flight lock slots */
#define ESX_CACHE_SLOT_BYTES (512 * 1024) /* hand-off buffer per slot */

/* Change-log operations. */
#define ESX_CACHE_OP_MARK 1            /* a = article, b = user */
#define ESX_CACHE_OP_INV_ARTICLE 2     /* a = article */
#define ESX_CACHE_OP_INV_PAGES 3

typedef struct {
    uint32_t op;
    uint32_t deferred; /* a mark recorded by a transaction at sequence `since` */
    uint64_t a, b;
    uint64_t since;
} esx_cache_op;

typedef struct {
    size_t max_bytes;
    double page_ttl, readers_ttl; /* ms */
    uint64_t max_pages;           /* pages 1..max_pages are cached */
    int shared;
} esx_cache_config;

typedef struct {
    uint64_t hits, misses, entries, bytes, evictions, expirations;
} esx_cache_tier_stats;

typedef struct {
    esx_cache_tier_stats pages, readers;
    uint64_t bytes, evictions, seq, applied, resets, log_bytes;
} esx_cache_stats;

typedef struct esx_cache esx_cache;

/* Creates a cache.  Returns NULL on failure with a message in err (errlen bytes, always
 * NUL-terminated).  The caller owns the cache (esx_cache_free). */
esx_cache *esx_cache_new(const esx_cache_config *cfg, char *err, size_t errlen);

/* Frees every entry, gives back the shared locks this process holds (its loads in flight:
 * one waiter of each takes it over at once) and unmaps this process's view of the shared
 * region.  NULL is allowed. */
void esx_cache_free(esx_cache *c);

/* Applies changes other processes logged (shared mode; a no-op otherwise).  Drops the local
 * tiers when this process has fallen behind the ring.  A mark of a set expired at now drops
 * the set instead of growing it (see esx_cache_apply).  Never fails. */
void esx_cache_sync(esx_cache *c, double now);

/* The current change sequence: record it before calling a loader. */
uint64_t esx_cache_seq(esx_cache *c);

/* Whether (kind, key) was invalidated since start_seq: returns 1 if it was, or if the log no
 * longer reaches back to start_seq (nothing can be proved), else 0 (marks do not count).
 * Takes the region lock in shared mode; never fails. */
int esx_cache_changed(esx_cache *c, int kind, uint64_t key, uint64_t start_seq);

/* 1 if page_no is cached and fresh at now (and marks it recently used; counts a hit), else 0
 * (counts a miss; an expired page is dropped).  With count = 0 neither is counted (the
 * caller counted this lookup already). */
int esx_cache_page_get(esx_cache *c, uint64_t page_no, double now, int count);

/* Records page_no as cached with the given measured size, if page_no <= max_pages, its expiry
 * (now - age + page_ttl: age is how long ago the page was loaded, 0 for the caller's own load,
 * a hand-off's age from esx_cache_lock_poll) is past now, the page fits in max_bytes and no
 * invalidate_pages happened since start_seq.  Changes other processes logged are applied at
 * now first (a mark of a set expired at now drops it), never at the load's time.  blob (blob_len bytes,
 * malloc'ed, may be NULL) is an opaque rendering of the page kept with it (the binding keeps
 * the ids and pre-encoded JSON of the articles there); its length counts towards the budget,
 * and a page that fits only without its blob is cached without it (the blob is freed).
 * Evicts LRU entries to make room.  Returns 1 if cached (the cache then owns blob), 0 if not,
 * -1 when out of memory (not cached); in both of those cases the caller still owns blob. */
int esx_cache_page_put(esx_cache *c, uint64_t page_no, size_t bytes, double now, double age,
                       uint64_t start_seq, void *blob, size_t blob_len);

/* Like esx_cache_page_get, but returns the page's blob (and *len) on a hit, NULL on a miss.
 * A hit on a page stored without a blob returns NULL too, with *len = 1: callers can tell the
 * two apart.  With count = 0 neither a hit nor a miss is counted (a retry after a load).  The
 * blob stays owned by the cache, valid until the next modifying call. */
const void *esx_cache_page_blob(esx_cache *c, uint64_t page_no, double now, size_t *len,
                                int count);

/* The reader set of article if cached and fresh at now (marked recently used; a hit), else
 * NULL (a miss).  The set stays owned by the cache and is valid until the next call that
 * modifies it. */
const esx_rset *esx_cache_readers_get(esx_cache *c, uint64_t article, double now);

/* Like readers_get but counts nothing and does not touch the LRU order. */
const esx_rset *esx_cache_readers_peek(esx_cache *c, uint64_t article, double now);

/* Inserts the loaded set of article, replaying marks logged since start_seq onto it; it
 * expires at now - age + readers_ttl (age: how long ago it was loaded, as for page_put, whose
 * note on the changes applied at now holds here too).
 * Returns 1 when the cache took ownership of set; 0 when it did not cache it (expired as it
 * is stored: readers_ttl is 0, too small to move now, or shorter than age; too large,
 * invalidated since start_seq, or the log no longer covers start_seq) and -1 when out of
 * memory -- in both of those cases the caller still owns set.  When cached, *upto (if not
 * NULL) is the sequence the set was brought up to: it holds every mark logged until then,
 * and a copy handed to other processes is published with it (not start_seq), so that they
 * replay only what was logged after it, and take it until the log has moved ESX_CACHE_LOG
 * entries past it rather than past the load's start. */
int esx_cache_readers_put(esx_cache *c, uint64_t article, esx_rset *set, double now,
                          double age, uint64_t start_seq, uint64_t *upto);

/* Brings a set handed off by another process (loaded from start_seq) up to date without
 * caching it -- for a waiter of its load that answers from it although it cannot store it (it
 * expired while the waiter waited): applies the changes other processes logged (at now) and
 * replays the marks logged since start_seq onto set.  Returns 0 when set may answer, 1 when
 * its article was invalidated since start_seq or the log no longer reaches back to it, -1
 * when out of memory. */
int esx_cache_readers_catch_up(esx_cache *c, uint64_t article, esx_rset *set, double now,
                               uint64_t start_seq);

/* Logs the n operations as one batch (visible to other processes at once) and applies them
 * to the local tiers in order.  A deferred mark (a transaction's, recorded at `since`) whose
 * article was invalidated after it was recorded is logged and applied as an invalidation of
 * the article instead, and its op is rewritten so: the mark may be older than what the
 * invalidation stands for (a rewrite of the article's readers in the database), and adding
 * it to a set loaded since would put back a read the database no longer holds.  A mark of a
 * set that has expired at now drops the set (an expiration) instead of growing it: the set
 * would never be served again, and growing it could evict live entries.  Returns 0, or -1
 * when a set could not grow for lack of memory (that set is dropped instead, so nothing
 * stale is served). */
int esx_cache_apply(esx_cache *c, esx_cache_op *ops, size_t n, double now);

/* Copies up to max page numbers dropped since the last call into out; returns how many.
 * The binding calls it after every operation (at most max_pages can be pending). */
size_t esx_cache_removed_pages(esx_cache *c, uint64_t *out, size_t max);

/* Fills *out.  Never fails. */
void esx_cache_get_stats(esx_cache *c, esx_cache_stats *out);

/* Shared single-flight locks (shared mode only; otherwise ESX_LOCK_NONE).
 * esx_cache_lock: ESX_LOCK_ACQUIRED (the caller loads and must call esx_cache_unlock with
 * *ticket), ESX_LOCK_BUSY (another process loads, or published a result for this key within
 * its TTL that nothing has invalidated since; poll with *ticket), ESX_LOCK_NONE (no slot: load
 * without coordination).  A lock held past timeout_ms, or by a dead process, is taken over,
 * and so is one whose load started before an invalidation of its key: its result would be
 * older than the invalidation the caller may have seen.
 * clock_now is the cache's clock (TTLs); lock deadlines use CLOCK_MONOTONIC. */
#define ESX_LOCK_NONE 0
#define ESX_LOCK_ACQUIRED 1
#define ESX_LOCK_BUSY 2
#define ESX_LOCK_DONE 3 /* poll: the holder published a result */
#define ESX_LOCK_GONE 4 /* poll: the holder died or overran its lock, its result cannot be
                         * taken, or the slot moved on: lock again */
#define ESX_LOCK_ALONE 5 /* poll: the holder loaded a result it could not hand off: load
                          * without the lock */
int esx_cache_lock(esx_cache *c, int kind, uint64_t key, double timeout_ms, double clock_now,
                   uint64_t *ticket);

/* Releases the lock; publishes data (len bytes, may be NULL) as the result with the load's
 * start_seq, stamped with clock_now (the cache's clock, which all processes must share: it
 * is CLOCK_MONOTONIC by default), when it fits the hand-off buffer.  Returns 1 if published,
 * else 0.  Not published, the lock's waiters load by themselves (ESX_LOCK_ALONE) when data
 * was given (too large) or unpublishable is set (a result the holder loaded but cannot hand
 * off), else (no result: the load failed) one of them loads again under the lock.  Only the
 * process that took the lock releases it: a forked child's call with an inherited ticket is a
 * no-op. */
int esx_cache_unlock(esx_cache *c, int kind, uint64_t key, uint64_t ticket, const void *data,
                     size_t len, uint64_t start_seq, double clock_now, int unpublishable);

/* Polls a lock seen busy.  ESX_LOCK_ALONE when its holder gave the lock back with a result it
 * could not hand off (esx_cache_unlock's unpublishable): every waiter loads by itself --
 * locking again, each would wait in turn for another waiter's load, which could not be
 * handed off either.  A lock given back without a result (a failed load) is ESX_LOCK_GONE:
 * one waiter locks again and loads, the others wait for its result.  A result whose key was invalidated since its load started is not
 * handed out (ESX_LOCK_GONE: the caller locks again and loads).  One older than its TTL is
 * (a caller that waited for that load may answer from it), but *age_ms tells the put that it
 * has expired: it is not stored.  On ESX_LOCK_DONE, *data is a malloc'ed copy of the result that
 * the caller frees, *len its size, *start_seq the holder's load start and *age_ms how long
 * ago it was published (the caller's TTL counts from then).  If the copy cannot be
 * allocated, returns ESX_LOCK_GONE. */
int esx_cache_lock_poll(esx_cache *c, int kind, uint64_t key, uint64_t ticket, double clock_now,
                        void **data, size_t *len, uint64_t *start_seq, double *age_ms);

/* Withdraws a result published under ticket that the caller got from esx_cache_lock_poll
 * but could not take (it did not decode, or is not a valid page), so that esx_cache_lock
 * never offers it again: the next caller takes the lock and loads.  A no-op when the slot
 * has moved on (another ticket, or no longer published).  Never fails. */
void esx_cache_lock_discard(esx_cache *c, int kind, uint64_t key, uint64_t ticket);

/* The first lock slot (of ESX_CACHE_SLOTS) that (kind, key) may take: a hash seeded per
 * cache (shared by the processes forked after it was made).  For tests. */
size_t esx_cache_slot_home(esx_cache *c, int kind, uint64_t key);

/* Milliseconds of CLOCK_MONOTONIC: the default clock. */
double esx_cache_now_ms(void);

#endif
