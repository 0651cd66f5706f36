/*
 * fuzz_bulk_response.c -- libFuzzer target: esx_bulk_response_parse.  The first byte is the
 * expected item count (0-63).  Checks: items are filled only on success; statuses 0..999;
 * error texts NUL-terminated, without control characters; why set on failure.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bulk_response.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    int n = data[0] & 63;
    esx_bulk_item items[64];
    char why[128];
    int rc = esx_bulk_response_parse((const char *)data + 1, size - 1, items, n, why);
    if (rc != 0) {
        check(rc == -1 && why[0] && strnlen(why, sizeof why) < sizeof why);
        return 0;
    }
    for (int i = 0; i < n; i++) {
        check(items[i].status >= 0 && items[i].status <= 999);
        size_t l = strnlen(items[i].error_type, sizeof items[i].error_type);
        check(l < sizeof items[i].error_type);
        for (size_t k = 0; k < l; k++)
            check((unsigned char)items[i].error_type[k] >= 0x20);
        l = strnlen(items[i].reason, sizeof items[i].reason);
        check(l < sizeof items[i].reason);
        for (size_t k = 0; k < l; k++)
            check((unsigned char)items[i].reason[k] >= 0x20);
    }
    return 0;
}
