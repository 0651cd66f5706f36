/*
 * fuzz_hll.c -- libFuzzer target: esx_hll_deserialize on arbitrary bytes.  An accepted
 * sketch serialises back to exactly the same bytes, estimates a finite non-negative number,
 * merges with itself without change.  The bytes are also read as 64-bit hashes: adding them
 * all to one sketch, or half to each of two sketches then merging, gives the same estimate.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hll.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    esx_hll *h = esx_hll_deserialize(data, size, NULL);
    if (h) {
        size_t n = esx_hll_serialize(h, NULL, 0);
        check(n == size);
        unsigned char *buf = malloc(n);
        check(buf != NULL);
        check(esx_hll_serialize(h, buf, n) == n && memcmp(buf, data, n) == 0);
        free(buf);
        double e = esx_hll_estimate(h);
        check(isfinite(e) && e >= 0);
        check(esx_hll_memory(h) > 0);
        check(esx_hll_merge(h, h) == 0 && esx_hll_estimate(h) == e);
        esx_hll_free(h);
    }
    esx_hll *all = esx_hll_new(), *a = esx_hll_new(), *b = esx_hll_new();
    check(all && a && b);
    size_t words = (size > 1024 ? 1024 : size) / 8; /* bounded: keeps executions fast */
    for (size_t i = 0; i < words; i++) {
        uint64_t x;
        memcpy(&x, data + 8 * i, 8);
        /* spread few bytes over many registers too */
        for (int r = 0; r < 8; r++) {
            uint64_t y = x * 0x9E3779B97F4A7C15ULL + (uint64_t)r * 0xD6E8FEB86659FD93ULL;
            check(esx_hll_add_hash(all, y) == 0);
            check(esx_hll_add_hash(i % 2 ? a : b, y) == 0);
        }
    }
    check(esx_hll_merge(a, b) == 0);
    check(esx_hll_estimate(a) == esx_hll_estimate(all));
    esx_hll_free(all);
    esx_hll_free(a);
    esx_hll_free(b);
    return 0;
}
