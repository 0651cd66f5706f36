/*
 * cache_rset.c -- reader-id sets below 2^53 as Roaring bitmaps keyed by the high bits
 * (see cache_rset.h).
 */
#include <stdlib.h>
#include <string.h>

#include <roaring/roaring.h>

#include "cache_rset.h"

struct esx_rset_part {
    uint32_t high;
    roaring_bitmap_t *bm;
};

/* A set is either a list of Roaring parts, or -- when that is smaller, typically for a few
 * readers scattered over many high keys -- a sorted array of 64-bit ids (arr != NULL). */
struct esx_rset {
    uint32_t n;                  /* parts in use */
    uint32_t cap;                /* capacity of parts (1 = the inline part) */
    struct esx_rset_part *parts; /* == &one when cap == 1 */
    struct esx_rset_part one;
    uint64_t *arr;               /* array form: sorted ids, or NULL */
    uint32_t alen, acap;
    size_t bytes;                /* esx_rset_bytes, valid unless dirty */
    int dirty;                   /* a bulk change: recount on the next esx_rset_bytes */
};

/* Bytes glibc's malloc takes for a request of n bytes: a block of n plus its 8-byte size
 * word, rounded up to 16, at least 32.  A small block costs twice its request or more (two
 * ids of a container take 32 bytes), which for sparse sets is most of their memory.  Worked
 * out from the request, not asked of the allocator (malloc_usable_size), so that a set's size
 * does not depend on what was allocated before it. */
static size_t block(size_t n)
{
    size_t b = (n + sizeof(size_t) + 15) & ~(size_t)15;
    return b < 32 ? 32 : b;
}

/* The array form is kept up to this many ids; beyond, the set goes back to Roaring parts. */
#define ARRAY_MAX 4096

static int to_parts(esx_rset *s);
static long arr_find(const esx_rset *s, uint64_t id);

esx_rset *esx_rset_new(void)
{
    esx_rset *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->cap = 1;
    s->parts = &s->one;
    s->dirty = 1;
    return s;
}

void esx_rset_free(esx_rset *s)
{
    if (s == NULL)
        return;
    free(s->arr);
    for (uint32_t i = 0; i < s->n; i++)
        roaring_bitmap_free(s->parts[i].bm);
    if (s->parts != &s->one)
        free(s->parts);
    free(s);
}

/* Index of the part with high key h, or -(insertion point) - 1. */
static long find_part(const esx_rset *s, uint32_t h)
{
    if (s->n == 1)
        return s->parts[0].high == h ? 0 : (s->parts[0].high < h ? -2 : -1);
    long lo = 0, hi = (long)s->n - 1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        uint32_t k = s->parts[mid].high;
        if (k == h)
            return mid;
        if (k < h)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -lo - 1;
}

/* Inserts bm as the part of high key h at position at; 0, or -1 when out of memory. */
static int insert_part(esx_rset *s, size_t at, uint32_t h, roaring_bitmap_t *bm)
{
    if (s->n == s->cap) {
        uint32_t ncap = s->cap * 2;
        struct esx_rset_part *np = malloc(ncap * sizeof *np);
        if (np == NULL)
            return -1;
        memcpy(np, s->parts, s->n * sizeof *np);
        if (s->parts != &s->one)
            free(s->parts);
        s->parts = np;
        s->cap = ncap;
    }
    memmove(&s->parts[at + 1], &s->parts[at], (s->n - at) * sizeof *s->parts);
    s->parts[at].high = h;
    s->parts[at].bm = bm;
    s->n++;
    return 0;
}

/* The bitmap of high key h, created when missing; NULL when out of memory. */
static roaring_bitmap_t *part_for(esx_rset *s, uint32_t h)
{
    long i = find_part(s, h);
    if (i >= 0)
        return s->parts[i].bm;
    roaring_bitmap_t *bm = roaring_bitmap_create();
    if (bm == NULL)
        return NULL;
    if (insert_part(s, (size_t)(-i - 1), h, bm) != 0) {
        roaring_bitmap_free(bm);
        return NULL;
    }
    return bm;
}

/* Array form: index of id, or -(insertion point) - 1. */
static long arr_find(const esx_rset *s, uint64_t id)
{
    long lo = 0, hi = (long)s->alen - 1;
    while (lo <= hi) {
        long mid = (lo + hi) / 2;
        uint64_t v = s->arr[mid];
        if (v == id)
            return mid;
        if (v < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -lo - 1;
}

static int arr_add(esx_rset *s, uint64_t id)
{
    long i = arr_find(s, id);
    if (i >= 0)
        return 0;
    if (s->alen >= ARRAY_MAX) {
        if (to_parts(s) != 0)
            return -1;
        return esx_rset_add(s, id);
    }
    size_t at = (size_t)(-i - 1);
    if (s->alen == s->acap) {
        uint32_t ncap = s->acap + s->acap / 2 + 4;
        uint64_t *na = realloc(s->arr, ncap * sizeof *na);
        if (na == NULL)
            return -1;
        s->arr = na;
        s->acap = ncap;
    }
    memmove(&s->arr[at + 1], &s->arr[at], (s->alen - at) * sizeof *s->arr);
    s->arr[at] = id;
    s->alen++;
    s->dirty = 1; /* recounting the array form is O(1) */
    return 1;
}

static size_t bitmap_bytes(const roaring_bitmap_t *bm);
static size_t container_bytes(const roaring_array_t *ra, int32_t i);
static size_t vectors_bytes(const roaring_array_t *ra);

/* The bytes of bm that adding a value with low 16 bits key can change: the array vectors and
 * the container of key (O(log containers): a binary search over the sorted keys). */
static size_t key_bytes(const roaring_bitmap_t *bm, uint16_t key)
{
    const roaring_array_t *ra = &bm->high_low_container;
    size_t bytes = vectors_bytes(ra);
    int32_t lo = 0, hi = ra->size - 1;
    while (lo <= hi) {
        int32_t mid = (lo + hi) / 2;
        if (ra->keys[mid] == key)
            return bytes + container_bytes(ra, mid);
        if (ra->keys[mid] < key)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return bytes;
}

static size_t parts_table_bytes(const esx_rset *s)
{
    return s->parts != &s->one ? block((size_t)s->cap * sizeof *s->parts) : 0;
}

int esx_rset_add(esx_rset *s, uint64_t id)
{
    if (s->arr != NULL)
        return arr_add(s, id);
    uint32_t h = (uint32_t)(id >> 32);
    uint16_t key = (uint16_t)((uint32_t)id >> 16);
    size_t table0 = parts_table_bytes(s);
    long i = find_part(s, h);
    roaring_bitmap_t *bm;
    size_t before;
    if (i >= 0) {
        bm = s->parts[i].bm;
        before = key_bytes(bm, key);
    } else {
        bm = part_for(s, h);
        if (bm == NULL)
            return -1;
        before = 0; /* a new part: all of it is new */
    }
    int added = roaring_bitmap_add_checked(bm, (uint32_t)id) ? 1 : 0;
    if (!s->dirty) {
        size_t after = i >= 0 ? key_bytes(bm, key) : bitmap_bytes(bm);
        s->bytes = s->bytes - before + after - table0 + parts_table_bytes(s);
    }
    return added;
}

int esx_rset_add_many32(esx_rset *s, const uint32_t *ids, size_t n)
{
    if (n == 0)
        return 0;
    if (s->arr != NULL && to_parts(s) != 0)
        return -1;
    roaring_bitmap_t *bm = part_for(s, 0);
    if (bm == NULL)
        return -1;
    roaring_bitmap_add_many(bm, n, ids);
    s->dirty = 1;
    return 0;
}

int esx_rset_contains(const esx_rset *s, uint64_t id)
{
    if (s->arr != NULL)
        return arr_find(s, id) >= 0;
    uint32_t h = (uint32_t)(id >> 32);
    if (s->n == 1) /* the common case: one part, no search */
        return s->parts[0].high == h && roaring_bitmap_contains(s->parts[0].bm, (uint32_t)id);
    long i = find_part(s, h);
    return i >= 0 && roaring_bitmap_contains(s->parts[i].bm, (uint32_t)id);
}

uint64_t esx_rset_cardinality(const esx_rset *s)
{
    if (s->arr != NULL)
        return s->alen;
    uint64_t n = 0;
    for (uint32_t i = 0; i < s->n; i++)
        n += roaring_bitmap_get_cardinality(s->parts[i].bm);
    return n;
}

struct ids_fill {
    uint64_t *out, high;
    size_t n;
};

static bool ids_fill_one(uint32_t low, void *arg)
{
    struct ids_fill *f = arg;
    f->out[f->n++] = f->high | low;
    return true;
}

void esx_rset_ids(const esx_rset *s, uint64_t *out)
{
    if (s->arr != NULL) {
        if (s->alen > 0)
            memcpy(out, s->arr, (size_t)s->alen * sizeof *out);
        return;
    }
    struct ids_fill f = {out, 0, 0};
    for (uint32_t i = 0; i < s->n; i++) { /* (parts sorted by high key) */
        f.high = (uint64_t)s->parts[i].high << 32;
        roaring_iterate(s->parts[i].bm, ids_fill_one, &f);
    }
}

/* Memory of container i of ra, from its header only: its struct plus its allocated payload
 * (an array's capacity, a run container's capacity plus its serialised run count, a bitset's
 * 8 KiB).  Never visits values: roaring_bitmap_statistics, used before, also sums every value
 * in CRoaring 0.2.x, which made every mark_read cost O(readers) -- under the shared lock in
 * shared mode. */
static size_t container_bytes(const roaring_array_t *ra, int32_t i)
{
    const void *c = ra->containers[i];
    switch (ra->typecodes[i]) {
    case ARRAY_CONTAINER_TYPE_CODE: {
        const array_container_t *a = c;
        return block(sizeof *a) + (a->capacity > 0 ? block((size_t)a->capacity * sizeof(uint16_t)) : 0);
    }
    case RUN_CONTAINER_TYPE_CODE: {
        const run_container_t *r = c;
        return block(sizeof *r) + (r->capacity > 0 ? block((size_t)r->capacity * sizeof(rle16_t)) : 0);
    }
    default: /* bitset (esx never makes shared copy-on-write containers); its words come from
              * posix_memalign, whose slack is given back */
        return block(sizeof(bitset_container_t)) +
               block(BITSET_CONTAINER_SIZE_IN_WORDS * sizeof(uint64_t));
    }
}

/* The roaring array's pointer/key/type vectors: one block when they lie one after the other
 * (CRoaring's single allocation), else three. */
static size_t vectors_bytes(const roaring_array_t *ra)
{
    size_t n = (size_t)ra->allocation_size;
    if (ra->containers == NULL || n == 0)
        return 0;
    if ((const void *)ra->keys == (const void *)(ra->containers + n))
        return block(n * (sizeof(void *) + sizeof(uint16_t) + sizeof(uint8_t)));
    return block(n * sizeof(void *)) + block(n * sizeof(uint16_t)) + block(n);
}

/* Memory of one bitmap: its struct, its vectors and every container (O(containers)). */
static size_t bitmap_bytes(const roaring_bitmap_t *bm)
{
    const roaring_array_t *ra = &bm->high_low_container;
    size_t bytes = block(sizeof *bm) + vectors_bytes(ra);
    for (int32_t i = 0; i < ra->size; i++)
        bytes += container_bytes(ra, i);
    return bytes;
}

static size_t recount(const esx_rset *s)
{
    size_t bytes = block(sizeof *s);
    if (s->arr != NULL)
        return bytes + block((size_t)s->acap * sizeof *s->arr);
    bytes += parts_table_bytes(s);
    for (uint32_t i = 0; i < s->n; i++)
        bytes += bitmap_bytes(s->parts[i].bm);
    return bytes;
}

size_t esx_rset_bytes(esx_rset *s)
{
    if (s->dirty) {
        s->bytes = recount(s);
        s->dirty = 0;
    }
    return s->bytes;
}

/* Converts the array form back to Roaring parts; 0, or -1 when out of memory (unchanged). */
static int to_parts(esx_rset *s)
{
    esx_rset tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.cap = 1;
    tmp.parts = &tmp.one;
    for (uint32_t i = 0; i < s->alen; i++) {
        roaring_bitmap_t *bm = part_for(&tmp, (uint32_t)(s->arr[i] >> 32));
        if (bm == NULL) {
            for (uint32_t k = 0; k < tmp.n; k++)
                roaring_bitmap_free(tmp.parts[k].bm);
            if (tmp.parts != &tmp.one)
                free(tmp.parts);
            return -1;
        }
        roaring_bitmap_add(bm, (uint32_t)s->arr[i]);
    }
    free(s->arr);
    s->arr = NULL;
    s->alen = s->acap = 0;
    s->dirty = 1;
    s->n = tmp.n;
    s->cap = tmp.cap;
    if (tmp.parts == &tmp.one) {
        s->one = tmp.one;
        s->parts = &s->one;
    } else {
        s->parts = tmp.parts;
    }
    return 0;
}

/* Converts Roaring parts to the array form when that is smaller (few ids, many high keys). */
static void maybe_to_array(esx_rset *s)
{
    uint64_t card = esx_rset_cardinality(s);
    if (card > ARRAY_MAX || block(sizeof *s) + block((card ? card : 1) * sizeof(uint64_t)) >= esx_rset_bytes(s))
        return;
    uint64_t *arr = malloc((card ? card : 1) * sizeof *arr);
    if (arr == NULL)
        return; /* stay as we are */
    size_t k = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        uint64_t high = (uint64_t)s->parts[i].high << 32;
        roaring_uint32_iterator_t *it = roaring_create_iterator(s->parts[i].bm);
        if (it == NULL) {
            free(arr);
            return;
        }
        while (it->has_value) { /* parts are sorted by high key: arr comes out sorted */
            arr[k++] = high | it->current_value;
            roaring_advance_uint32_iterator(it);
        }
        roaring_free_uint32_iterator(it);
    }
    for (uint32_t i = 0; i < s->n; i++)
        roaring_bitmap_free(s->parts[i].bm);
    if (s->parts != &s->one)
        free(s->parts);
    s->parts = &s->one;
    s->n = 0;
    s->cap = 1;
    s->arr = arr;
    s->alen = s->acap = (uint32_t)card;
    s->dirty = 1;
}

void esx_rset_optimize(esx_rset *s)
{
    s->dirty = 1;
    if (s->arr != NULL) {
        if (s->acap > s->alen) {
            uint64_t *na = realloc(s->arr, (s->alen ? s->alen : 1) * sizeof *na);
            if (na != NULL) {
                s->arr = na;
                s->acap = s->alen ? s->alen : 1;
            }
        }
        return;
    }
    for (uint32_t i = 0; i < s->n; i++) {
        roaring_bitmap_run_optimize(s->parts[i].bm); /* converts only where runs are smaller */
        roaring_bitmap_shrink_to_fit(s->parts[i].bm);
    }
    maybe_to_array(s);
}

/* Layout: u32 nparts, then per part: u32 high, u32 len, len bytes (portable format). */
#define ARRAY_MARK 0xFFFFFFFFu /* instead of nparts: u32 count, then count u64 ids */

size_t esx_rset_serialized_size(const esx_rset *s)
{
    if (s->arr != NULL)
        return 8 + (size_t)s->alen * 8;
    size_t n = 4;
    for (uint32_t i = 0; i < s->n; i++)
        n += 8 + roaring_bitmap_portable_size_in_bytes(s->parts[i].bm);
    return n;
}

size_t esx_rset_serialize(const esx_rset *s, char *buf, size_t cap)
{
    if (esx_rset_serialized_size(s) > cap)
        return 0;
    if (s->arr != NULL) {
        uint32_t mark = ARRAY_MARK, count = s->alen;
        memcpy(buf, &mark, 4);
        memcpy(buf + 4, &count, 4);
        memcpy(buf + 8, s->arr, (size_t)count * 8);
        return 8 + (size_t)count * 8;
    }
    size_t off = 0;
    uint32_t n = s->n;
    memcpy(buf + off, &n, 4);
    off += 4;
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t len = (uint32_t)roaring_bitmap_portable_size_in_bytes(s->parts[i].bm);
        memcpy(buf + off, &s->parts[i].high, 4);
        memcpy(buf + off + 4, &len, 4);
        off += 8;
        off += roaring_bitmap_portable_serialize(s->parts[i].bm, buf + off);
    }
    return off;
}

/* Whether bm, fresh from roaring_bitmap_portable_deserialize_safe, is well formed.  CRoaring
 * 0.2.66 checks there that lengths stay within the buffer, not what they hold: it accepts a
 * run container without runs (its iterator then reads runs[0] of a NULL array), unsorted keys
 * or values (binary searches go astray) and a bitset whose cardinality is not its popcount.
 * O(values), like the deserialisation itself. */
static int bitmap_valid(const roaring_bitmap_t *bm)
{
    const roaring_array_t *ra = &bm->high_low_container;
    for (int32_t i = 0; i < ra->size; i++) {
        const void *c = ra->containers[i];
        if (c == NULL || (i > 0 && ra->keys[i] <= ra->keys[i - 1]))
            return 0;
        switch (ra->typecodes[i]) {
        case ARRAY_CONTAINER_TYPE_CODE: {
            const array_container_t *a = c;
            if (a->cardinality < 1)
                return 0;
            for (int32_t k = 1; k < a->cardinality; k++)
                if (a->array[k] <= a->array[k - 1])
                    return 0;
            break;
        }
        case RUN_CONTAINER_TYPE_CODE: {
            const run_container_t *r = c;
            if (r->n_runs < 1)
                return 0;
            uint32_t next = 0; /* the smallest value the next run may start at */
            for (int32_t k = 0; k < r->n_runs; k++) {
                uint32_t start = r->runs[k].value, end = start + r->runs[k].length;
                if (start < next || end > UINT16_MAX)
                    return 0;
                next = end + 1;
            }
            break;
        }
        case BITSET_CONTAINER_TYPE_CODE: {
            const bitset_container_t *b = c;
            int32_t card = 0;
            for (size_t k = 0; k < BITSET_CONTAINER_SIZE_IN_WORDS; k++)
                card += __builtin_popcountll(b->array[k]);
            if (card < 1 || card != b->cardinality)
                return 0;
            break;
        }
        default: /* a shared (copy-on-write) container: never serialised by esx */
            return 0;
        }
    }
    return 1;
}

esx_rset *esx_rset_deserialize(const char *buf, size_t len)
{
    if (len < 4)
        return NULL;
    uint32_t n;
    memcpy(&n, buf, 4);
    size_t off = 4;
    esx_rset *s = esx_rset_new();
    if (s == NULL)
        return NULL;
    if (n == ARRAY_MARK) {
        uint32_t count;
        if (len < 8)
            goto bad;
        memcpy(&count, buf + 4, 4);
        if (count > ARRAY_MAX || (len - 8) / 8 != count || (len - 8) % 8 != 0)
            goto bad;
        s->arr = malloc((count ? count : 1) * sizeof *s->arr);
        if (s->arr == NULL)
            goto bad;
        memcpy(s->arr, buf + 8, (size_t)count * 8);
        s->alen = count;
        s->acap = count ? count : 1;
        for (uint32_t i = 0; i < count; i++)
            if (s->arr[i] > ESX_RSET_MAX_ID || (i > 0 && s->arr[i] <= s->arr[i - 1]))
                goto bad;
        return s;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t high, plen;
        if (len - off < 8)
            goto bad;
        memcpy(&high, buf + off, 4);
        memcpy(&plen, buf + off + 4, 4);
        off += 8;
        /* (an empty part: the measure below says 0 bytes, as it is, and the deserialiser
         * then writes a line to stderr; a bitmap serialises to 8 bytes at least) */
        if (plen == 0 || plen > len - off || high > (uint32_t)(ESX_RSET_MAX_ID >> 32))
            goto bad;
        if (s->n > 0 && s->parts[s->n - 1].high >= high)
            goto bad; /* parts are written in increasing order */
        /* measured first: CRoaring's deserialiser writes a line to stderr for each flaw it
         * finds, this one finds the same flaws silently */
        if (roaring_bitmap_portable_deserialize_size(buf + off, plen) != plen)
            goto bad;
        roaring_bitmap_t *bm = roaring_bitmap_portable_deserialize_safe(buf + off, plen);
        if (bm == NULL)
            goto bad;
        if (!bitmap_valid(bm)) {
            roaring_bitmap_free(bm);
            goto bad;
        }
        if (insert_part(s, s->n, high, bm) != 0) {
            roaring_bitmap_free(bm);
            goto bad;
        }
        off += plen;
    }
    if (off != len)
        goto bad; /* bytes past the last part: the part count is not what was written */
    esx_rset_optimize(s);
    return s;
bad:
    esx_rset_free(s);
    return NULL;
}
