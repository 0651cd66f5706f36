/*
 * cache.c -- the C core of esx.cache (see cache.h for the design).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"

#define REGION_MAGIC 0x6573786361636865ULL /* "esxcache" */

struct entry {
    uint64_t key;
    struct entry *prev, *next; /* LRU list: head is the most recently used */
    struct entry *hnext;       /* hash chain */
    esx_rset *set;             /* readers only */
    void *blob;                /* pages only: the binding's rendering, or NULL */
    size_t blob_len;
    double expires;
    size_t bytes;              /* everything this entry holds, overhead included */
    int kind;
};

/* What an entry costs besides its payload: the struct and its share of the bucket array. */
#define ENTRY_OVERHEAD (sizeof(struct entry) + 2 * sizeof(void *))

struct logent {
    uint64_t seq, a, b;
    uint32_t op, pad;
};

#define SLOT_FREE 0
#define SLOT_BUSY 1
#define SLOT_DONE 2

struct slot {
    uint32_t state, kind;
    uint64_t key, ticket, start_seq, len;
    double deadline;  /* CLOCK_MONOTONIC ms */
    double published; /* the cache's clock (ms) when DONE */
    pid_t pid;
    uint32_t alone;   /* FREE: given back with a result that could not be handed off */
};

#define INV_SLOTS 1024

struct region {
    uint64_t magic;
    /* Seeds the homes of keys in the tables below that are indexed by article id or page
     * number (lock slots, last invalidations): made with the region, before the fork, so
     * every process finds a key in the same place, and an outsider choosing ids cannot
     * crowd them into one home (PITFALLS: hash flooding). */
    uint64_t seed;
    pthread_mutex_t mu;   /* shared mode: guards ring, slots and tickets */
    _Atomic uint64_t head; /* last sequence written; published after its entries */
    uint64_t tickets;
    /* Sequences of the last invalidations, which outlive the ring: the last INV_PAGES, and
     * per hash slot of article ids the last INV_ARTICLE (slots shared by several articles
     * answer for all of them).  Marks fill the ring fast and never change a loaded value's
     * validity, so a load that the ring no longer reaches is judged by these. */
    uint64_t inv_pages_seq;
    uint64_t inv_article_seq[INV_SLOTS];
    struct logent ring[ESX_CACHE_LOG];
    struct slot slots[ESX_CACHE_SLOTS];
};

struct esx_cache {
    esx_cache_config cfg;
    struct region *rg;
    size_t rg_size;
    char *slot_data; /* shared mode: ESX_CACHE_SLOTS * ESX_CACHE_SLOT_BYTES */
    uint64_t applied;
    struct entry **buckets;
    size_t nbuckets, count;
    uint64_t seed;
    struct entry *lru_head, *lru_tail;
    size_t bytes;
    esx_cache_tier_stats st[3]; /* indexed by kind */
    uint64_t evictions, resets;
    uint64_t *removed;
    size_t nremoved, removed_cap;
    int mu_ready; /* shared mode: the region's mutex was made (esx_cache_free may lock it) */
};

double esx_cache_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static size_t bucket_of(const esx_cache *c, int kind, uint64_t key)
{
    return (size_t)(mix64(key ^ c->seed ^ ((uint64_t)kind << 60)) & (c->nbuckets - 1));
}

/* The slot of inv_article_seq that answers for article (seeded: see struct region). */
static size_t inv_slot(const esx_cache *c, uint64_t article)
{
    return (size_t)(mix64(article ^ c->rg->seed) % INV_SLOTS);
}

/* ---- region lock ---------------------------------------------------------------------- */

static void rg_lock(esx_cache *c)
{
    if (!c->cfg.shared)
        return;
    int rc = pthread_mutex_lock(&c->rg->mu);
    if (rc == EOWNERDEAD) /* a process died holding it: the head was not advanced, so the */
        pthread_mutex_consistent(&c->rg->mu); /* ring is as consistent as before it started */
}

static void rg_unlock(esx_cache *c)
{
    if (c->cfg.shared)
        pthread_mutex_unlock(&c->rg->mu);
}

/* ---- entries ---------------------------------------------------------------------------- */

static struct entry *find(const esx_cache *c, int kind, uint64_t key)
{
    for (struct entry *e = c->buckets[bucket_of(c, kind, key)]; e != NULL; e = e->hnext)
        if (e->key == key && e->kind == kind)
            return e;
    return NULL;
}

static void lru_unlink(esx_cache *c, struct entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->lru_head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->lru_tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_head(esx_cache *c, struct entry *e)
{
    e->prev = NULL;
    e->next = c->lru_head;
    if (c->lru_head)
        c->lru_head->prev = e;
    c->lru_head = e;
    if (c->lru_tail == NULL)
        c->lru_tail = e;
}

static void touch(esx_cache *c, struct entry *e)
{
    if (c->lru_head != e) {
        lru_unlink(c, e);
        lru_push_head(c, e);
    }
}

static void queue_removed_page(esx_cache *c, uint64_t page_no)
{
    if (c->nremoved < c->removed_cap)
        c->removed[c->nremoved++] = page_no;
}

static void remove_entry(esx_cache *c, struct entry *e)
{
    struct entry **pp = &c->buckets[bucket_of(c, e->kind, e->key)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(c, e);
    c->count--;
    c->bytes -= e->bytes;
    c->st[e->kind].entries--;
    c->st[e->kind].bytes -= e->bytes;
    if (e->kind == ESX_CACHE_PAGE)
        queue_removed_page(c, e->key);
    esx_rset_free(e->set);
    free(e->blob);
    free(e);
}

static void grow_buckets(esx_cache *c)
{
    size_t n = c->nbuckets * 2;
    struct entry **nb = calloc(n, sizeof *nb);
    if (nb == NULL)
        return; /* keep the old table: longer chains, still correct */
    struct entry **old = c->buckets;
    size_t oldn = c->nbuckets;
    c->buckets = nb;
    c->nbuckets = n;
    for (size_t i = 0; i < oldn; i++) {
        struct entry *e = old[i];
        while (e) {
            struct entry *next = e->hnext;
            size_t b = bucket_of(c, e->kind, e->key);
            e->hnext = nb[b];
            nb[b] = e;
            e = next;
        }
    }
    free(old);
}

/* Evicts least recently used entries until the budget holds, never evicting keep (unless
 * it is alone over budget, in which case it goes too). */
static void evict_to_fit(esx_cache *c, struct entry *keep)
{
    while (c->bytes > c->cfg.max_bytes && c->lru_tail != NULL) {
        struct entry *victim = c->lru_tail;
        if (victim == keep) {
            victim = keep->prev;
            if (victim == NULL)
                victim = keep;
        }
        c->st[victim->kind].evictions++;
        c->evictions++;
        remove_entry(c, victim);
    }
}

static void set_bytes(esx_cache *c, struct entry *e, size_t bytes)
{
    c->bytes = c->bytes - e->bytes + bytes;
    c->st[e->kind].bytes = c->st[e->kind].bytes - e->bytes + bytes;
    e->bytes = bytes;
}

/* Inserts a new entry (or reuses the existing one of that key) at the LRU head. */
static struct entry *insert(esx_cache *c, int kind, uint64_t key, size_t bytes, double expires,
                            esx_rset *set, void *blob, size_t blob_len)
{
    struct entry *e = find(c, kind, key);
    if (e != NULL) {
        esx_rset_free(e->set);
        free(e->blob);
        e->set = set;
        e->blob = blob;
        e->blob_len = blob_len;
        e->expires = expires;
        set_bytes(c, e, bytes);
        touch(c, e);
        evict_to_fit(c, e);
        return e;
    }
    e = calloc(1, sizeof *e);
    if (e == NULL)
        return NULL;
    if (c->count >= c->nbuckets)
        grow_buckets(c);
    e->key = key;
    e->kind = kind;
    e->set = set;
    e->blob = blob;
    e->blob_len = blob_len;
    e->expires = expires;
    e->bytes = bytes;
    size_t b = bucket_of(c, kind, key);
    e->hnext = c->buckets[b];
    c->buckets[b] = e;
    lru_push_head(c, e);
    c->count++;
    c->bytes += bytes;
    c->st[kind].entries++;
    c->st[kind].bytes += bytes;
    evict_to_fit(c, e);
    return e;
}

static void drop_pages(esx_cache *c)
{
    if (c->st[ESX_CACHE_PAGE].entries == 0)
        return;
    if (c->cfg.max_pages <= c->count) { /* look the few possible pages up */
        for (uint64_t p = 1; p <= c->cfg.max_pages; p++) {
            struct entry *e = find(c, ESX_CACHE_PAGE, p);
            if (e)
                remove_entry(c, e);
        }
        return;
    }
    struct entry *e = c->lru_head; /* fewer entries than possible pages: walk them */
    while (e) {
        struct entry *next = e->next;
        if (e->kind == ESX_CACHE_PAGE)
            remove_entry(c, e);
        e = next;
    }
}

static void drop_all(esx_cache *c)
{
    while (c->lru_head)
        remove_entry(c, c->lru_head);
}

/* ---- the change log ------------------------------------------------------------------- */

/* Applies one change to the local tiers.  Returns -1 when a set could not grow (dropped).
 * A mark of a set expired at now drops it: it would never be served again, and growing it
 * could evict live entries. */
static int apply_local(esx_cache *c, uint32_t op, uint64_t a, uint64_t b, double now)
{
    struct entry *e;
    switch (op) {
    case ESX_CACHE_OP_MARK:
        e = find(c, ESX_CACHE_READERS, a);
        if (e != NULL && now >= e->expires) {
            c->st[ESX_CACHE_READERS].expirations++;
            remove_entry(c, e);
        } else if (e != NULL) {
            int r = esx_rset_add(e->set, b);
            if (r < 0) {
                remove_entry(c, e);
                return -1;
            }
            if (r > 0) {
                set_bytes(c, e, esx_rset_bytes(e->set) + ENTRY_OVERHEAD);
                if (e->bytes > c->cfg.max_bytes) {
                    c->st[ESX_CACHE_READERS].evictions++;
                    c->evictions++;
                    remove_entry(c, e);
                } else {
                    evict_to_fit(c, NULL);
                }
            }
        }
        break;
    case ESX_CACHE_OP_INV_ARTICLE:
        e = find(c, ESX_CACHE_READERS, a);
        if (e != NULL)
            remove_entry(c, e);
        break;
    case ESX_CACHE_OP_INV_PAGES:
        drop_pages(c);
        break;
    default:
        break;
    }
    return 0;
}

/* Brings the local tiers up to the head; the caller holds the region lock. */
static void sync_locked(esx_cache *c, double now)
{
    uint64_t h = atomic_load(&c->rg->head);
    if (h == c->applied)
        return;
    if (h - c->applied > ESX_CACHE_LOG) {
        /* fallen behind the ring: cannot prove anything cached is current */
        drop_all(c);
        c->resets++;
    } else {
        for (uint64_t s = c->applied + 1; s <= h; s++) {
            const struct logent *le = &c->rg->ring[s % ESX_CACHE_LOG];
            apply_local(c, le->op, le->a, le->b, now);
        }
    }
    c->applied = h;
}

void esx_cache_sync(esx_cache *c, double now)
{
    if (!c->cfg.shared || atomic_load(&c->rg->head) == c->applied)
        return;
    rg_lock(c);
    sync_locked(c, now);
    rg_unlock(c);
}

uint64_t esx_cache_seq(esx_cache *c)
{
    return atomic_load(&c->rg->head);
}

static int changed_since(esx_cache *c, int kind, uint64_t key, uint64_t start_seq,
                         esx_rset *set);

int esx_cache_apply(esx_cache *c, esx_cache_op *ops, size_t n, double now)
{
    int rc = 0;
    rg_lock(c);
    sync_locked(c, now);
    uint64_t h = atomic_load(&c->rg->head);
    for (size_t i = 0; i < n; i++) {
        /* a deferred mark overtaken by an invalidation of its article: drop the set instead
         * (the slot's last invalidation answers at once for almost every article) */
        if (ops[i].op == ESX_CACHE_OP_MARK && ops[i].deferred &&
            c->rg->inv_article_seq[inv_slot(c, ops[i].a)] > ops[i].since &&
            changed_since(c, ESX_CACHE_READERS, ops[i].a, ops[i].since, NULL) != 0)
            ops[i].op = ESX_CACHE_OP_INV_ARTICLE;
    }
    for (size_t i = 0; i < n; i++) {
        struct logent *le = &c->rg->ring[(h + 1 + i) % ESX_CACHE_LOG];
        le->seq = h + 1 + i;
        le->op = ops[i].op;
        le->a = ops[i].a;
        le->b = ops[i].b;
        if (le->op == ESX_CACHE_OP_INV_PAGES)
            c->rg->inv_pages_seq = le->seq;
        else if (le->op == ESX_CACHE_OP_INV_ARTICLE)
            c->rg->inv_article_seq[inv_slot(c, le->a)] = le->seq;
    }
    atomic_store(&c->rg->head, h + n); /* publish the whole batch at once */
    rg_unlock(c);
    for (size_t i = 0; i < n; i++)
        if (apply_local(c, ops[i].op, ops[i].a, ops[i].b, now) != 0)
            rc = -1;
    c->applied = h + n;
    return rc;
}

/* Checks the log since start_seq for changes to a loaded value: returns 0 when it may be
 * cached (replaying marks onto set when given), 1 when it must not be, -1 when out of
 * memory.  Past the ring's reach, a reader set that needs the marks made meanwhile cannot be
 * brought up to date (1); otherwise only invalidations matter, and their last sequences are
 * kept apart from the ring (a burst of mark_read must not make every load look stale: loads
 * would stop being shared).  The caller holds the region lock. */
static int changed_since(esx_cache *c, int kind, uint64_t key, uint64_t start_seq,
                         esx_rset *set)
{
    uint64_t h = atomic_load(&c->rg->head);
    if (start_seq > h)
        return 1;
    if (h - start_seq > ESX_CACHE_LOG) {
        if (set != NULL)
            return 1;
        if (kind == ESX_CACHE_PAGE)
            return c->rg->inv_pages_seq > start_seq;
        return c->rg->inv_article_seq[inv_slot(c, key)] > start_seq;
    }
    for (uint64_t s = start_seq + 1; s <= h; s++) {
        const struct logent *le = &c->rg->ring[s % ESX_CACHE_LOG];
        if (kind == ESX_CACHE_PAGE) {
            if (le->op == ESX_CACHE_OP_INV_PAGES)
                return 1;
        } else if (le->a == key) {
            if (le->op == ESX_CACHE_OP_INV_ARTICLE)
                return 1;
            if (le->op == ESX_CACHE_OP_MARK && set != NULL && esx_rset_add(set, le->b) < 0)
                return -1;
        }
    }
    return 0;
}

int esx_cache_changed(esx_cache *c, int kind, uint64_t key, uint64_t start_seq)
{
    rg_lock(c);
    int changed = changed_since(c, kind, key, start_seq, NULL) != 0;
    rg_unlock(c);
    return changed;
}

/* ---- tiers ------------------------------------------------------------------------------ */

static struct entry *fresh_page(esx_cache *c, uint64_t page_no, double now, int count)
{
    struct entry *e = find(c, ESX_CACHE_PAGE, page_no);
    if (e != NULL && now >= e->expires) {
        c->st[ESX_CACHE_PAGE].expirations++;
        remove_entry(c, e);
        e = NULL;
    }
    if (e == NULL) {
        if (count)
            c->st[ESX_CACHE_PAGE].misses++;
        return NULL;
    }
    if (count)
        c->st[ESX_CACHE_PAGE].hits++;
    touch(c, e);
    return e;
}

const void *esx_cache_page_blob(esx_cache *c, uint64_t page_no, double now, size_t *len,
                                int count)
{
    struct entry *e = fresh_page(c, page_no, now, count);
    *len = e == NULL ? 0 : e->blob == NULL ? 1 : e->blob_len; /* see cache.h */
    return e ? e->blob : NULL;
}

int esx_cache_page_get(esx_cache *c, uint64_t page_no, double now, int count)
{
    return fresh_page(c, page_no, now, count) != NULL;
}

int esx_cache_page_put(esx_cache *c, uint64_t page_no, size_t bytes, double now, double age,
                       uint64_t start_seq, void *blob, size_t blob_len)
{
    if (page_no < 1 || page_no > c->cfg.max_pages)
        return 0;
    double expires = (now - age) + c->cfg.page_ttl;
    if (!(expires > now))
        return 0; /* expired as it is stored (a ttl of 0, or too small to move now, or a
                   * hand-off older than the ttl): it would only push live entries out */
    bytes += ENTRY_OVERHEAD;
    if (bytes > c->cfg.max_bytes)
        return 0;
    /* a page whose blob would not fit with it is cached without the blob (docs/cache.md) */
    int keep_blob = blob != NULL && blob_len <= c->cfg.max_bytes - bytes;
    if (keep_blob)
        bytes += blob_len;
    rg_lock(c);
    sync_locked(c, now);
    int changed = changed_since(c, ESX_CACHE_PAGE, page_no, start_seq, NULL);
    rg_unlock(c);
    if (changed != 0)
        return 0;
    if (insert(c, ESX_CACHE_PAGE, page_no, bytes, expires, NULL,
               keep_blob ? blob : NULL, keep_blob ? blob_len : 0) == NULL)
        return -1;
    if (!keep_blob)
        free(blob); /* owned by the cache on success: dropped */
    return 1;
}

static struct entry *fresh_readers(esx_cache *c, uint64_t article, double now, int count)
{
    struct entry *e = find(c, ESX_CACHE_READERS, article);
    if (e != NULL && now >= e->expires) {
        c->st[ESX_CACHE_READERS].expirations++;
        remove_entry(c, e);
        e = NULL;
    }
    if (count) {
        if (e == NULL) {
            c->st[ESX_CACHE_READERS].misses++;
        } else {
            c->st[ESX_CACHE_READERS].hits++;
            touch(c, e);
        }
    }
    return e;
}

const esx_rset *esx_cache_readers_get(esx_cache *c, uint64_t article, double now)
{
    struct entry *e = fresh_readers(c, article, now, 1);
    return e ? e->set : NULL;
}

const esx_rset *esx_cache_readers_peek(esx_cache *c, uint64_t article, double now)
{
    struct entry *e = fresh_readers(c, article, now, 0);
    return e ? e->set : NULL;
}

int esx_cache_readers_put(esx_cache *c, uint64_t article, esx_rset *set, double now,
                          double age, uint64_t start_seq, uint64_t *upto)
{
    double expires = (now - age) + c->cfg.readers_ttl;
    if (!(expires > now))
        return 0; /* expired as it is stored (a ttl of 0, or too small to move now, or a
                   * hand-off older than the ttl): it would only push live entries out */
    rg_lock(c);
    sync_locked(c, now);
    int changed = changed_since(c, ESX_CACHE_READERS, article, start_seq, set);
    if (upto != NULL)
        *upto = atomic_load(&c->rg->head); /* the set holds every mark logged up to here */
    rg_unlock(c);
    if (changed != 0)
        return changed > 0 ? 0 : -1;
    esx_rset_optimize(set);
    size_t bytes = esx_rset_bytes(set) + ENTRY_OVERHEAD;
    if (bytes > c->cfg.max_bytes)
        return 0;
    return insert(c, ESX_CACHE_READERS, article, bytes, expires, set, NULL, 0) ? 1 : -1;
}

int esx_cache_readers_catch_up(esx_cache *c, uint64_t article, esx_rset *set, double now,
                               uint64_t start_seq)
{
    rg_lock(c);
    sync_locked(c, now);
    int changed = changed_since(c, ESX_CACHE_READERS, article, start_seq, set);
    rg_unlock(c);
    return changed;
}

size_t esx_cache_removed_pages(esx_cache *c, uint64_t *out, size_t max)
{
    size_t n = c->nremoved < max ? c->nremoved : max;
    memcpy(out, c->removed, n * sizeof *out);
    memmove(c->removed, c->removed + n, (c->nremoved - n) * sizeof *out);
    c->nremoved -= n;
    return n;
}

void esx_cache_get_stats(esx_cache *c, esx_cache_stats *out)
{
    out->pages = c->st[ESX_CACHE_PAGE];
    out->readers = c->st[ESX_CACHE_READERS];
    out->bytes = c->bytes;
    out->evictions = c->evictions;
    out->seq = atomic_load(&c->rg->head);
    out->applied = c->applied;
    out->resets = c->resets;
    out->log_bytes = c->rg_size;
}

/* ---- shared single-flight locks ------------------------------------------------------- */

static int holder_alive(const struct slot *s, double now)
{
    if (s->deadline <= now)
        return 0;
    if (s->pid != getpid() && kill(s->pid, 0) != 0 && errno == ESRCH)
        return 0;
    return 1;
}

/* A key may use any of SLOT_PROBES slots from its home slot on, so that a key whose home
 * serves another key's load right now is still coordinated across processes; at most one
 * slot that is not free holds a given key. */
#define SLOT_PROBES 4

static size_t slot_home(const esx_cache *c, int kind, uint64_t key)
{
    return (size_t)(mix64(key ^ c->rg->seed ^ ((uint64_t)kind << 60)) % ESX_CACHE_SLOTS);
}

size_t esx_cache_slot_home(esx_cache *c, int kind, uint64_t key)
{
    return slot_home(c, kind, key);
}

/* The slot among key's probes that holds ticket for (kind, key), or NULL; *data is its
 * hand-off buffer.  The caller holds the region lock. */
static struct slot *slot_of_ticket(esx_cache *c, int kind, uint64_t key, uint64_t ticket,
                                   char **data)
{
    size_t home = slot_home(c, kind, key);
    for (size_t k = 0; k < SLOT_PROBES; k++) {
        size_t i = (home + k) % ESX_CACHE_SLOTS;
        struct slot *s = &c->rg->slots[i];
        if (s->ticket == ticket && s->kind == (uint32_t)kind && s->key == key) {
            *data = c->slot_data + i * ESX_CACHE_SLOT_BYTES;
            return s;
        }
    }
    return NULL;
}

/* Whether a published result loaded from start_seq can still be cached by the process that
 * takes it: a reader set needs the marks logged since then replayed onto it, which the ring
 * must still hold (esx_cache_readers_put refuses it otherwise, and the taker loads by itself:
 * offering it would only make every worker load alone).  The caller holds the region lock. */
static int takeable(esx_cache *c, int kind, uint64_t start_seq)
{
    return kind != ESX_CACHE_READERS ||
           atomic_load(&c->rg->head) - start_seq <= ESX_CACHE_LOG;
}

int esx_cache_lock(esx_cache *c, int kind, uint64_t key, double timeout_ms, double clock_now,
                   uint64_t *ticket)
{
    if (!c->cfg.shared)
        return ESX_LOCK_NONE;
    size_t home = slot_home(c, kind, key);
    double now = esx_cache_now_ms();
    int rc;
    rg_lock(c);
    /* the slot of this key if one holds it, else the best one to take: a free slot, then
     * one whose holder is gone, then another key's published result */
    struct slot *s = NULL, *spare = NULL;
    int spare_rank = 0;
    for (size_t k = 0; k < SLOT_PROBES; k++) {
        struct slot *p = &c->rg->slots[(home + k) % ESX_CACHE_SLOTS];
        if (p->state != SLOT_FREE && p->kind == (uint32_t)kind && p->key == key) {
            s = p;
            break;
        }
        int rank = p->state == SLOT_FREE ? 3 : p->state == SLOT_DONE ? 1
                 : holder_alive(p, now) ? 0 : 2;
        if (rank > spare_rank) {
            spare = p;
            spare_rank = rank;
        }
    }
    double ttl = kind == ESX_CACHE_PAGE ? c->cfg.page_ttl : c->cfg.readers_ttl;
    if (s != NULL && s->state == SLOT_BUSY && holder_alive(s, now) &&
        changed_since(c, kind, key, s->start_seq, NULL) == 0) {
        /* (a load that began before an invalidation of its key is taken over below) */
        *ticket = s->ticket;
        rc = ESX_LOCK_BUSY;
    } else if (s != NULL && s->state == SLOT_DONE && clock_now < s->published + ttl &&
               (kind != ESX_CACHE_PAGE || key <= c->cfg.max_pages) && /* else never cached */
               takeable(c, kind, s->start_seq) &&
               changed_since(c, kind, key, s->start_seq, NULL) == 0) {
        /* another process loaded this key within its TTL and nothing invalidated it since:
         * take its result (the first poll returns it) instead of loading again */
        *ticket = s->ticket;
        rc = ESX_LOCK_BUSY;
    } else if (s == NULL && spare == NULL) {
        rc = ESX_LOCK_NONE; /* every slot of the key serves another key's load right now */
    } else {
        if (s == NULL)
            s = spare;
        s->state = SLOT_BUSY;
        s->kind = (uint32_t)kind;
        s->key = key;
        s->ticket = ++c->rg->tickets;
        s->pid = getpid();
        s->deadline = now + timeout_ms;
        s->start_seq = atomic_load(&c->rg->head); /* the holder's load starts no earlier */
        s->len = 0;
        s->alone = 0;
        *ticket = s->ticket;
        rc = ESX_LOCK_ACQUIRED;
    }
    rg_unlock(c);
    return rc;
}

int esx_cache_unlock(esx_cache *c, int kind, uint64_t key, uint64_t ticket, const void *data,
                     size_t len, uint64_t start_seq, double clock_now, int unpublishable)
{
    if (!c->cfg.shared)
        return 0;
    char *buf;
    int published = 0;
    rg_lock(c);
    struct slot *s = slot_of_ticket(c, kind, key, ticket, &buf);
    /* only the process that took the lock gives it back: a forked child inherits its
     * parent's tickets (the Lua object's held locks, a loader's coroutine), and releasing or
     * publishing under them would end the parent's load for every waiter while it runs */
    if (s != NULL && s->state == SLOT_BUSY && s->pid == getpid()) {
        if (data != NULL && len <= ESX_CACHE_SLOT_BYTES) {
            memcpy(buf, data, len);
            s->len = len;
            s->start_seq = start_seq;
            s->published = clock_now;
            s->state = SLOT_DONE;
            published = 1;
        } else {
            s->state = SLOT_FREE;
            s->alone = unpublishable || data != NULL;
        }
    }
    rg_unlock(c);
    return published;
}

int esx_cache_lock_poll(esx_cache *c, int kind, uint64_t key, uint64_t ticket, double clock_now,
                        void **data, size_t *len, uint64_t *start_seq, double *age_ms)
{
    if (!c->cfg.shared)
        return ESX_LOCK_GONE;
    char *buf;
    int rc = ESX_LOCK_GONE;
    rg_lock(c);
    struct slot *s = slot_of_ticket(c, kind, key, ticket, &buf);
    if (s != NULL) {
        if (s->state == SLOT_FREE) {
            /* given back under this ticket: with a result that could not be handed off, or
             * without one (a failed load, a close: GONE, one waiter loads again for all) */
            rc = s->alone ? ESX_LOCK_ALONE : ESX_LOCK_GONE;
        } else if (s->state == SLOT_BUSY) {
            rc = holder_alive(s, esx_cache_now_ms()) ? ESX_LOCK_BUSY : ESX_LOCK_GONE;
        } else if (s->state == SLOT_DONE && (!takeable(c, kind, s->start_seq) ||
                                             changed_since(c, kind, key, s->start_seq, NULL) != 0)) {
            rc = ESX_LOCK_GONE; /* invalidated since the holder's load began: stale; or a set
                                 * the log no longer reaches: the next lock takes it over */
        } else if (s->state == SLOT_DONE) {
            void *copy = malloc(s->len ? s->len : 1);
            if (copy != NULL) {
                memcpy(copy, buf, s->len);
                *data = copy;
                *len = s->len;
                *start_seq = s->start_seq;
                *age_ms = clock_now - s->published;
                if (*age_ms < 0)
                    *age_ms = 0;
                rc = ESX_LOCK_DONE;
            }
        }
    }
    rg_unlock(c);
    return rc;
}

void esx_cache_lock_discard(esx_cache *c, int kind, uint64_t key, uint64_t ticket)
{
    if (!c->cfg.shared)
        return;
    char *buf;
    rg_lock(c);
    struct slot *s = slot_of_ticket(c, kind, key, ticket, &buf);
    if (s != NULL && s->state == SLOT_DONE) {
        s->state = SLOT_FREE;
        s->alone = 0;
    }
    rg_unlock(c);
}

/* ---- life cycle ------------------------------------------------------------------------- */

esx_cache *esx_cache_new(const esx_cache_config *cfg, char *err, size_t errlen)
{
    esx_cache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->nbuckets = 64;
    c->buckets = calloc(c->nbuckets, sizeof *c->buckets);
    c->removed_cap = (size_t)cfg->max_pages + 1;
    c->removed = calloc(c->removed_cap, sizeof *c->removed);
    if (c->buckets == NULL || c->removed == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    if (getrandom(&c->seed, sizeof c->seed, GRND_NONBLOCK) != (ssize_t)sizeof c->seed)
        c->seed = mix64((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)c);

    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t head = (sizeof(struct region) + page - 1) / page * page;
    c->rg_size = head + (cfg->shared ? (size_t)ESX_CACHE_SLOTS * ESX_CACHE_SLOT_BYTES : 0);
    void *m = mmap(NULL, c->rg_size, PROT_READ | PROT_WRITE,
                   (cfg->shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
        snprintf(err, errlen, "cannot map %zu bytes: %s", c->rg_size, strerror(errno));
        c->rg = NULL;
        goto fail;
    }
    c->rg = m; /* zero-filled */
    c->rg->magic = REGION_MAGIC;
    c->rg->seed = mix64(c->seed ^ REGION_MAGIC); /* (not the buckets' seed itself) */
    if (cfg->shared) {
        c->slot_data = (char *)m + head;
        pthread_mutexattr_t attr;
        int rc = pthread_mutexattr_init(&attr);
        if (rc == 0)
            rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
        if (rc == 0)
            rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
        if (rc == 0)
            rc = pthread_mutex_init(&c->rg->mu, &attr);
        pthread_mutexattr_destroy(&attr);
        c->mu_ready = rc == 0;
        if (rc != 0) {
            snprintf(err, errlen, "cannot create the shared mutex: %s", strerror(rc));
            goto fail;
        }
    }
    atomic_store(&c->rg->head, 0);
    return c;
fail:
    esx_cache_free(c);
    return NULL;
}

/* Gives back the shared locks this process holds in c's region -- the loads it can no longer
 * finish once c is freed -- as esx_cache_unlock does without a result: one waiter takes each
 * over at once, rather than every other process waiting until lock_timeout.  A cache freed by
 * the garbage collector without close() (its loader's coroutine dropped with it: a light
 * thread killed while its loader yielded) kept them.  Locks of another process (a parent's,
 * inherited through fork) are left alone.  One region per cache in a process: every busy
 * slot of this pid is one of c's loads. */
static void release_own_locks(esx_cache *c)
{
    pid_t me = getpid();
    rg_lock(c);
    for (size_t i = 0; i < ESX_CACHE_SLOTS; i++) {
        struct slot *s = &c->rg->slots[i];
        if (s->state == SLOT_BUSY && s->pid == me) {
            s->state = SLOT_FREE;
            s->alone = 0;
        }
    }
    rg_unlock(c);
}

void esx_cache_free(esx_cache *c)
{
    if (c == NULL)
        return;
    if (c->rg != NULL && c->cfg.shared && c->mu_ready)
        release_own_locks(c);
    if (c->buckets)
        drop_all(c);
    free(c->buckets);
    free(c->removed);
    if (c->rg)
        munmap(c->rg, c->rg_size); /* this process's view only; others keep theirs */
    free(c);
}
