/*
 * lcache_page.h -- a page (a Lua list of article tables) as esx.cache's binding stores it:
 * measured against max_bytes, serialised for a hand-off to other nginx workers and read
 * back, and rendered once to the JSON blob read_articles_json answers from.
 */
#ifndef ESX_LCACHE_PAGE_H
#define ESX_LCACHE_PAGE_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "compat.h"

/* Accounting of a page's size (see docs/cache.md): each table costs TABLE_BYTES plus
 * SLOT_BYTES per key, each string its length plus STRING_BYTES; numbers and booleans live in
 * their slots. */
#define TABLE_BYTES 56
#define SLOT_BYTES 40
#define STRING_BYTES 24
#define MAX_DEPTH 16

/* What esx_lpage_measure returns for a page it cannot measure or that is over its limit. */
#define ESX_LPAGE_UNMEASURED SIZE_MAX

#define ESX_SBUF_MT "esx.cache.sbuf"

/* A bounded output that keeps its first failure, so that a walk can write without checking
 * each call and stop at its next check. */
typedef struct {
    esx_buf out; /* out.max: the limit */
    int failed;  /* over the limit, unsupported value, or out of memory */
    int cycle;   /* JSON: failed because a table contains itself */
    int nomem;   /* failed because memory ran out (esx's failure, not the data's) */
} esx_sbuf;

/* Pushes a new, empty buffer of at most limit bytes, owned by a userdata of metatable
 * ESX_SBUF_MT whose __gc (esx_sbuf_gc) frees its output.  Raises only Lua's memory error. */
esx_sbuf *esx_sbuf_push(lua_State *L, size_t limit);
int esx_sbuf_gc(lua_State *L);

/* The bytes of the page at idx by the accounting above, or ESX_LPAGE_UNMEASURED (over limit,
 * or it holds what cannot be measured).  Raises only when Lua is out of memory. */
size_t esx_lpage_measure(lua_State *L, int idx, size_t limit);

/* Serialises the value at idx into b (metatables left behind, but for the empty-array
 * markers of ljson.h, read back as esx.array_mt and esx.empty_array); on failure
 * (unsupported value, too deep, over the limit) b->failed is set. */
void esx_lpage_walk(lua_State *L, int idx, esx_sbuf *b, int depth);

/* Pushes the value serialised at *p (end e), advancing *p; returns 0, or -1 on malformed
 * input (what it pushed is then on the stack, for the caller to drop). */
int esx_lpage_unwalk(lua_State *L, const char **p, const char *e, int depth);

/* Renders the value at idx as JSON into b (b->failed on failure, b->cycle for a cycle). */
void esx_lpage_json(lua_State *L, int idx, esx_sbuf *b);

/* The JSON blob of the page at idx (checked by esx_lpage_check), malloc'ed, the caller's;
 * NULL when out of memory or over limit. */
void *esx_lpage_blob(lua_State *L, int idx, size_t limit, size_t *blob_len);

/* NULL when the table at idx, whose length is n, has no integer key past n nor below 1; else
 * a message naming the hole (or the key below 1), written into msg: the entries after a hole,
 * or of a list counted from 0, would be left out without a word (and where the length stops
 * depends on the table's layout).  Keys that are not integers are not looked at.  Pushes
 * nothing. */
const char *esx_lpage_list_hole(lua_State *L, int idx, size_t n, char *msg, size_t msglen);

/* NULL when the value at idx is a list of article tables with integer ids in [0, 2^53),
 * without a hole, else a message (static, or written into msg).  Pushes nothing. */
const char *esx_lpage_check(lua_State *L, int idx, char *msg, size_t msglen);

#endif
