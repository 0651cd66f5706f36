/*
 * fuzz_gzip.c -- libFuzzer target: bounded gzip inflation (gzip.h).  One-shot and streaming
 * (the input cut at a point chosen by its first byte) must agree; output never passes its
 * cap; what inflates completely re-compresses and inflates back to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gzip.h"

#define CAP (256 * 1024)
#define CHUNKMAX 16384 /* gzip.c's inflate chunk */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t cut = size > 1 ? (size_t)data[0] * (size - 1) / 255 : 0;
    data++;
    size--;
    esx_buf a, b;
    esx_buf_init(&a, CAP);
    esx_buf_init(&b, CAP);
    int rc1 = esx_gunzip(data, size, &a);
    check(a.len <= CAP);

    esx_inflater inf;
    int rc2 = esx_inflate_init(&inf);
    if (rc2 == ESX_GZIP_OK) {
        rc2 = esx_inflate_feed(&inf, data, cut, &b);
        if (rc2 == ESX_GZIP_MORE || (rc2 == ESX_GZIP_OK && cut == size))
            rc2 = esx_inflate_feed(&inf, data + cut, size - cut, &b);
        else if (rc2 == ESX_GZIP_OK)
            rc2 = esx_inflate_feed(&inf, data + cut, size - cut, &b); /* another member, or CORRUPT */
        if (rc2 == ESX_GZIP_MORE)
            rc2 = ESX_GZIP_CORRUPT;
        esx_inflate_end(&inf);
    }
    check(b.len <= CAP);
    /* Both succeed or both fail.  A corrupt stream whose output also passes the cap may be
     * reported as either, depending on where the cut falls relative to the corruption. */
    check((rc1 == ESX_GZIP_OK) == (rc2 == ESX_GZIP_OK));
    check(rc1 == ESX_GZIP_OK || rc1 == ESX_GZIP_CORRUPT || rc1 == ESX_GZIP_TOOBIG);
    check(rc2 == ESX_GZIP_OK || rc2 == ESX_GZIP_CORRUPT || rc2 == ESX_GZIP_TOOBIG);
    if (rc1 != rc2)
        check(a.len == CAP || b.len == CAP || a.len + CHUNKMAX > CAP || b.len + CHUNKMAX > CAP);
    if (rc1 == ESX_GZIP_OK) {
        check(a.len == b.len && (a.len == 0 || memcmp(a.data, b.data, a.len) == 0));
        esx_buf z, back;
        esx_buf_init(&z, a.len + a.len / 8 + 1024);
        esx_buf_init(&back, CAP);
        /* "" not a.data: gzip.c does pointer arithmetic on its input (UB on NULL) */
        check(esx_gzip_compress(a.data ? a.data : "", a.len, 6, &z) == ESX_GZIP_OK);
        check(esx_gunzip(z.data, z.len, &back) == ESX_GZIP_OK);
        check(back.len == a.len && (a.len == 0 || memcmp(back.data, a.data, a.len) == 0));
        esx_buf_free(&z);
        esx_buf_free(&back);
    }
    esx_buf_free(&a);
    esx_buf_free(&b);
    return 0;
}
