/*
 * gzip.h -- gzip compression of request bodies and bounded, streaming inflation of
 * responses and beacon bodies.
 *
 * Inflation never trusts the gzip trailer's size: the output is capped while inflating, so a
 * gzip bomb costs at most `max_out` bytes of memory and is reported as ESX_GZIP_TOOBIG.
 */
#ifndef ESX_GZIP_H
#define ESX_GZIP_H

#include <stddef.h>
#include <zlib.h>

#include "buf.h"

enum {
    ESX_GZIP_OK = 0,        /* stream complete (inflate) or done (compress) */
    ESX_GZIP_MORE = 1,      /* inflate: input consumed, stream not finished yet */
    ESX_GZIP_CORRUPT = -1,  /* not gzip, bad data, bad checksum, bytes after a member that are not one */
    ESX_GZIP_TOOBIG = -2,   /* output would pass its limit */
    ESX_GZIP_NOMEM = -3,
};

/* Compresses n bytes at level (1-9) as one gzip member appended to out (whose max bounds
 * it).  Returns ESX_GZIP_OK, ESX_GZIP_TOOBIG or ESX_GZIP_NOMEM. */
int esx_gzip_compress(const void *in, size_t n, int level, esx_buf *out);

typedef struct esx_inflater {
    z_stream zs;
    int started;
    int finished;
} esx_inflater;

/* Prepares an inflater for a gzip stream: one member, or several one after another.
 * Returns ESX_GZIP_OK or ESX_GZIP_NOMEM. */
int esx_inflate_init(esx_inflater *inf);

/* Feeds n compressed bytes, appending the inflated bytes to out (bounded by out->max).
 * Returns ESX_GZIP_MORE, ESX_GZIP_OK (a member complete: further input must be another),
 * ESX_GZIP_CORRUPT, ESX_GZIP_TOOBIG or ESX_GZIP_NOMEM.  After an error, only
 * esx_inflate_end may be called. */
int esx_inflate_feed(esx_inflater *inf, const void *in, size_t n, esx_buf *out);

/* Releases the inflater's memory. */
void esx_inflate_end(esx_inflater *inf);

/* One-shot: inflates a whole gzip body into out.  An incomplete stream is CORRUPT. */
int esx_gunzip(const void *in, size_t n, esx_buf *out);

#endif
