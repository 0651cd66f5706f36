/*
 * cache_rset.h -- a set of reader ids below 2^53 (esx.cache tier 2), built on CRoaring.
 *
 * CRoaring 0.2.66 has no 64-bit bitmap, so an id is split into its high 21 bits (id >> 32)
 * and its low 32 bits; each distinct high key owns one roaring_bitmap_t of low halves.  Most
 * sets have exactly one part (ids < 2^32: the fast path, kept inline without a lookup).
 * Parts are kept sorted by high key and found by binary search.
 *
 * Memory is measured, not estimated from the serialised size, from the containers' headers:
 * each container's struct and allocated payload (capacity, not cardinality: slack from
 * mark_read counts), the roaring array's key/type/pointer vectors and our own part table.
 * No value is ever visited to measure.  The total is kept up to date by esx_rset_add from
 * the one container it touched (O(log containers) per mark_read), and recounted over the
 * containers after bulk changes (build, optimise, conversions).  Each allocation counts as
 * the block glibc's malloc takes for it (size word and rounding included): for sparse sets
 * that is most of their memory.
 *
 * No function here touches a Lua state.  Nothing aborts on allocation failure (CRoaring's
 * own container growth is outside our control; see docs/cache.md).
 */
#ifndef ESX_CACHE_RSET_H
#define ESX_CACHE_RSET_H

#include <stddef.h>
#include <stdint.h>

#define ESX_RSET_MAX_ID 9007199254740991ULL /* 2^53 - 1 */

typedef struct esx_rset esx_rset;

/* A new empty set, or NULL when out of memory.  The caller owns it (esx_rset_free). */
esx_rset *esx_rset_new(void);

/* Frees s and every bitmap it owns; NULL is allowed. */
void esx_rset_free(esx_rset *s);

/* Adds id (must be <= ESX_RSET_MAX_ID).  Returns 1 if it was added, 0 if it was already
 * there, -1 when out of memory (the set is unchanged). */
int esx_rset_add(esx_rset *s, uint64_t id);

/* Adds n ids of the low part (high key 0) at once: the bulk-load fast path for ids < 2^32.
 * Returns 0, or -1 when out of memory (the set may hold a prefix of the ids). */
int esx_rset_add_many32(esx_rset *s, const uint32_t *ids, size_t n);

/* 1 if id is in s, else 0.  Never fails. */
int esx_rset_contains(const esx_rset *s, uint64_t id);

/* Number of ids in s. */
uint64_t esx_rset_cardinality(const esx_rset *s);

/* Writes the ids of s into out (esx_rset_cardinality(s) of them), in ascending order. */
void esx_rset_ids(const esx_rset *s, uint64_t *out);

/* Bytes of memory s holds, measured as described above: O(1) after esx_rset_add, one pass
 * over the containers (never the values) after a bulk change.  Never fails. */
size_t esx_rset_bytes(esx_rset *s);

/* Run-optimises every part when that saves memory and shrinks buffers to fit. */
void esx_rset_optimize(esx_rset *s);

/* Serialised size in bytes (portable Roaring format per part, with a small header). */
size_t esx_rset_serialized_size(const esx_rset *s);

/* Writes the serialisation into buf (cap bytes).  Returns the bytes written, or 0 when cap is
 * too small (nothing useful is written then). */
size_t esx_rset_serialize(const esx_rset *s, char *buf, size_t cap);

/* Rebuilds a set from len bytes written by esx_rset_serialize, checking every bound.
 * Returns a new set owned by the caller, or NULL on malformed input or out of memory. */
esx_rset *esx_rset_deserialize(const char *buf, size_t len);

#endif
