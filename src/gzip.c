/*
 * gzip.c -- gzip compression and bounded streaming inflation (see gzip.h).
 */
#include <string.h>

#include "gzip.h"

#define CHUNK 16384

int esx_gzip_compress(const void *in, size_t n, int level, esx_buf *out)
{
    z_stream zs;
    memset(&zs, 0, sizeof zs);
    if (level < 1 || level > 9)
        level = Z_DEFAULT_COMPRESSION;
    /* windowBits 15 + 16: write a gzip header and trailer. */
    if (deflateInit2(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return ESX_GZIP_NOMEM;
    size_t bound = deflateBound(&zs, (uLong)n);
    int rc = esx_buf_reserve(out, bound);
    if (rc != ESX_BUF_OK) {
        deflateEnd(&zs);
        return rc == ESX_BUF_TOOBIG ? ESX_GZIP_TOOBIG : ESX_GZIP_NOMEM;
    }
    const unsigned char *src = in;
    size_t left = n;
    int zrc;
    do {
        /* zlib counts in uInt; feed huge inputs in slices. */
        uInt slice = left > (1u << 30) ? (1u << 30) : (uInt)left;
        zs.next_in = (Bytef *)src;
        zs.avail_in = slice;
        if (slice) /* an empty body may come as NULL: no arithmetic on it */
            src += slice;
        left -= slice;
        zs.next_out = (Bytef *)out->data + out->len;
        zs.avail_out = (uInt)(out->cap - 1 - out->len);
        zrc = deflate(&zs, left ? Z_NO_FLUSH : Z_FINISH);
        out->len = out->cap - 1 - zs.avail_out;
    } while (left && zrc == Z_OK);
    deflateEnd(&zs);
    out->data[out->len] = '\0';
    return zrc == Z_STREAM_END ? ESX_GZIP_OK : ESX_GZIP_NOMEM;
}

int esx_inflate_init(esx_inflater *inf)
{
    memset(inf, 0, sizeof *inf);
    /* 15 + 16: gzip only (no zlib or raw deflate), as Content-Encoding: gzip promises. */
    if (inflateInit2(&inf->zs, 15 + 16) != Z_OK)
        return ESX_GZIP_NOMEM;
    inf->started = 1;
    return ESX_GZIP_OK;
}

/* Bytes after a member's trailer: another member (RFC 1952 2.2, what `cat a.gz b.gz` and
 * some streaming compressors write), inflated into the same output and cap; anything else
 * fails as not gzip. */
static int next_member(esx_inflater *inf)
{
    if (inflateReset(&inf->zs) != Z_OK)
        return ESX_GZIP_CORRUPT;
    inf->finished = 0;
    return ESX_GZIP_OK;
}

int esx_inflate_feed(esx_inflater *inf, const void *in, size_t n, esx_buf *out)
{
    if (n == 0)
        return inf->finished ? ESX_GZIP_OK : ESX_GZIP_MORE;
    if (inf->finished && next_member(inf) != ESX_GZIP_OK)
        return ESX_GZIP_CORRUPT;
    inf->zs.next_in = (Bytef *)in;
    inf->zs.avail_in = n > (1u << 30) ? (1u << 30) : (uInt)n;
    size_t rest = n - inf->zs.avail_in;
    for (;;) {
        unsigned char chunk[CHUNK];
        inf->zs.next_out = chunk;
        inf->zs.avail_out = sizeof chunk;
        int zrc = inflate(&inf->zs, Z_NO_FLUSH);
        size_t got = sizeof chunk - inf->zs.avail_out;
        if (got) {
            int rc = esx_buf_append(out, chunk, got);
            if (rc != ESX_BUF_OK)
                return rc == ESX_BUF_TOOBIG ? ESX_GZIP_TOOBIG : ESX_GZIP_NOMEM;
        }
        if (zrc == Z_STREAM_END) {
            inf->finished = 1;
            if (inf->zs.avail_in == 0 && rest == 0)
                return ESX_GZIP_OK;
            if (next_member(inf) != ESX_GZIP_OK)
                return ESX_GZIP_CORRUPT;
            if (inf->zs.avail_in == 0) { /* the member ended where a 1 GiB slice did */
                size_t done = n - rest;
                inf->zs.next_in = (Bytef *)in + done;
                inf->zs.avail_in = rest > (1u << 30) ? (1u << 30) : (uInt)rest;
                rest -= inf->zs.avail_in;
            }
            continue;
        }
        if (zrc == Z_MEM_ERROR)
            return ESX_GZIP_NOMEM;
        if (zrc != Z_OK && zrc != Z_BUF_ERROR)
            return ESX_GZIP_CORRUPT;
        if (inf->zs.avail_in == 0) {
            if (rest == 0)
                return ESX_GZIP_MORE;
            size_t done = n - rest;
            inf->zs.next_in = (Bytef *)in + done;
            inf->zs.avail_in = rest > (1u << 30) ? (1u << 30) : (uInt)rest;
            rest -= inf->zs.avail_in;
        } else if (zrc == Z_BUF_ERROR && got == 0) {
            return ESX_GZIP_CORRUPT; /* no progress possible */
        }
    }
}

void esx_inflate_end(esx_inflater *inf)
{
    if (inf->started)
        inflateEnd(&inf->zs);
    inf->started = 0;
}

int esx_gunzip(const void *in, size_t n, esx_buf *out)
{
    esx_inflater inf;
    int rc = esx_inflate_init(&inf);
    if (rc != ESX_GZIP_OK)
        return rc;
    rc = esx_inflate_feed(&inf, in, n, out);
    esx_inflate_end(&inf);
    return rc == ESX_GZIP_MORE ? ESX_GZIP_CORRUPT : rc;
}
