/*
 * rset_bytes.c -- esx_rset_bytes against what the allocator really holds (glibc's mallinfo2,
 * with its per-thread caches and fast bins off so that a freed block is not counted as in
 * use), run by spec/cache_spec.lua.  The cache's max_bytes bound rests on this figure: for
 * sparse sets -- a few readers under each of thousands of 16-bit keys -- malloc's minimum
 * block and size word are most of the memory, and counting requested sizes alone missed
 * half of it (5,000 ids one per key: 159 KB counted, 389 KB held).
 */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cache_rset.h"
#include "check.h"

static size_t in_use(void)
{
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd; /* heap blocks in use, and blocks of their own mapping */
}

static uint64_t state = 88172645463325252ULL;

static uint64_t next(void) /* xorshift64: the same ids every run */
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

/* Builds a set of one shape, optionally optimised; checks that esx_rset_bytes is within 5%
 * (and 64 bytes: a block realloc shrank in place can keep up to 16 bytes more) of the
 * allocator's growth. */
static void shape(const char *name, int kind, int optimize)
{
    static uint32_t ids[20000];
    size_t before = in_use();
    esx_rset *s = esx_rset_new();
    switch (kind) {
    case 0: /* dense: bitset containers, or one run once optimised */
        for (uint64_t i = 0; i < 100000; i++)
            esx_rset_add(s, i);
        break;
    case 1: /* one id under each of 5,000 16-bit keys: 5,000 one-element array containers */
        for (uint64_t i = 0; i < 5000; i++)
            esx_rset_add(s, i << 16);
        break;
    case 2: /* 256 parts (ids past 2^32) */
        for (uint64_t i = 0; i < 6000; i++)
            esx_rset_add(s, ((i % 256) << 32) | (i * 7919));
        break;
    case 3: /* random 32-bit ids: ~34,000 small containers, vectors in a mapping of their own */
        for (int i = 0; i < 50000; i++)
            esx_rset_add(s, next() & 0xffffffffu);
        break;
    case 4: /* a few ids anywhere below 2^53: the array form once optimised */
        for (int i = 0; i < 1000; i++)
            esx_rset_add(s, next() & ((1ULL << 53) - 1));
        break;
    default: /* the bulk load */
        for (int i = 0; i < 20000; i++)
            ids[i] = (uint32_t)(next() % 3000000);
        esx_rset_add_many32(s, ids, 20000);
        break;
    }
    if (optimize)
        esx_rset_optimize(s);
    double real = (double)(in_use() - before), counted = (double)esx_rset_bytes(s);
    char what[128];
    snprintf(what, sizeof what, "%s%s: counted %.0f of %.0f bytes held", name,
             optimize ? ", optimised" : "", counted, real);
    check(counted >= real * 0.95 - 64 && counted <= real * 1.05 + 64, what);
    esx_rset_free(s);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (getenv("GLIBC_TUNABLES") == NULL) { /* read at start: run again with them */
        setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0", 1);
        execv("/proc/self/exe", argv);
        check(0, "run again with GLIBC_TUNABLES");
        return 1;
    }
    const char *names[] = {"dense", "one id per 16-bit key", "256 parts", "random 32-bit",
                           "1,000 ids below 2^53", "bulk load"};
    for (int k = 0; k < 6; k++)
        for (int o = 0; o < 2; o++)
            shape(names[k], k, o);
    return fails;
}
