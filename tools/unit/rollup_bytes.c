/*
 * rollup_bytes.c -- the bytes a rollup table says it holds (col:stats().rollup_bytes), run by
 * spec/collector_spec.lua: kept as rows and sketches come and go, they must be exactly what
 * the rows and their sketches hold (sizeof a row plus esx_hll_memory), back to the empty
 * table's once the rows are forgotten.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "rollup.h"
#include "rollup_emit.h"

static void sum_row(const esx_rollup_row *row, void *ud)
{
    *(size_t *)ud += sizeof *row + (row->hll ? esx_hll_memory(row->hll) : 0);
}

/* The bytes of the rows of the window at `at`, walked. */
static size_t walked(esx_rollups *r, long long at)
{
    size_t n = 0;
    esx_rollups_current(r, at, sum_row, &n);
    return n;
}

int main(void)
{
    const long long t = 1700000000000LL;
    esx_rollups *empty = esx_rollups_new(1000, 100);
    esx_rollups *r = esx_rollups_new(1000, 100);
    size_t base = esx_rollups_memory(empty);
    check(esx_rollups_memory(r) == base && base > 0, "an empty table holds its buckets");
    for (int i = 0; i < 3; i++) {
        char b[8];
        snprintf(b, sizeof b, "b%d", i);
        esx_event ev = view(b, "");
        esx_rollups_add(r, t + 10, &ev);
    }
    check(esx_rollups_memory(r) == base + walked(r, t + 10), "rows without users: the rows");
    size_t sparse = 0, peak = 0;
    for (int i = 0; i < 5000; i++) {
        char u[16];
        snprintf(u, sizeof u, "u%d", i);
        esx_event ev = view("users", u);
        esx_rollups_add(r, t + 20, &ev);
        size_t m = esx_rollups_memory(r) - base;
        if (i == 10)
            sparse = m;
        if (m != walked(r, t + 20))
            peak = (size_t)-1;
    }
    check(peak == 0, "each user added: the rows and their sketches, exactly");
    check(sparse < 4096, "a sketch of a few users is small (sparse)");
    check(esx_rollups_memory(r) - base >= 3 * sizeof(esx_rollup_row) + 12288,
          "a sketch of 5000 users is dense: 12 KiB more");
    printf("# a row with a dense sketch: %zu bytes\n", walked(r, t + 20) - 3 * sizeof(esx_rollup_row));
    check(emit(r, t + 1000 + 10000) == 4 && esx_rollups_rows(r) == 0 &&
              esx_rollups_memory(r) == base,
          "rows written and forgotten: back to the empty table's bytes");
    esx_rollups_free(r);
    esx_rollups_free(empty);
    return fails ? 1 : 0;
}
