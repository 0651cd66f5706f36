/*
 * fuzz_retry_after.c -- libFuzzer target: esx_retry_after_ms on arbitrary bytes (not
 * NUL-terminated: an over-read is caught by ASan).  The answer is -1 or a delay >= 0, and
 * does not depend on bytes past len.  (Delta-seconds are capped at ten years; an HTTP-date
 * is not -- "Fri, 31 Dec 9999 23:59:59 GMT" asks for ~8000 years: the caller must cap.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "retry_after.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const int64_t now = 1700000000000LL;
    int64_t ms = esx_retry_after_ms((const char *)data, size, now);
    check(ms >= -1);
    if (size && data[0] >= '0' && data[0] <= '9')
        check(ms <= 315360000LL * 1000);
    /* the same bytes followed by a digit must not change a date's meaning silently */
    char *copy = malloc(size + 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    copy[size] = '7';
    check(esx_retry_after_ms(copy, size, now) == ms);
    free(copy);
    return 0;
}
