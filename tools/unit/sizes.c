/*
 * sizes.c -- size arithmetic near SIZE_MAX in the bounded buffer and gzip paths, run by
 * spec/security_spec.lua: every request that would overflow must fail cleanly, never wrap.
 * Prints "ok <name>" per check; exits 1 on the first failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "check.h"
#include "gzip.h"

int main(void)
{
    esx_buf b;
    esx_buf_init(&b, SIZE_MAX);
    check(esx_buf_reserve(&b, SIZE_MAX) == ESX_BUF_TOOBIG, "reserve SIZE_MAX with max SIZE_MAX");
    check(esx_buf_append(&b, "x", 1) == ESX_BUF_OK, "append after a refused reserve");
    check(esx_buf_reserve(&b, SIZE_MAX - 1) == ESX_BUF_TOOBIG || esx_buf_reserve(&b, SIZE_MAX - 1) == ESX_BUF_NOMEM,
          "reserve SIZE_MAX-1 with one byte in");
    check(b.len == 1 && b.data[0] == 'x' && b.data[1] == '\0', "buffer intact after refusals");
    esx_buf_free(&b);

    esx_buf_init(&b, 10);
    check(esx_buf_append(&b, "0123456789", 10) == ESX_BUF_OK, "fill to max");
    check(esx_buf_append(&b, "a", 1) == ESX_BUF_TOOBIG, "one byte past max");
    check(esx_buf_reserve(&b, SIZE_MAX - 5) == ESX_BUF_TOOBIG, "len + n wraps");
    esx_buf_free(&b);

    /* a gzip bomb: 8 MiB of zeros inflating into a 64 KiB cap */
    size_t n = 8u << 20;
    char *zeros = calloc(1, n);
    esx_buf z, out;
    esx_buf_init(&z, SIZE_MAX / 4);
    check(zeros && esx_gzip_compress(zeros, n, 9, &z) == ESX_GZIP_OK, "compress a bomb");
    esx_buf_init(&out, 65536);
    check(esx_gunzip(z.data, z.len, &out) == ESX_GZIP_TOOBIG, "bomb stops at the cap");
    check(out.len <= 65536 && out.cap <= 65536 + 1 + 16384, "memory stays within the cap");
    esx_buf_free(&out);
    esx_buf_init(&out, n);
    check(esx_gunzip(z.data, z.len - 1, &out) == ESX_GZIP_CORRUPT, "truncated trailer is corrupt");
    esx_buf_free(&out);
    esx_buf_free(&z);
    free(zeros);
    return fails ? 1 : 0;
}
