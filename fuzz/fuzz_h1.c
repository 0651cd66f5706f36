/*
 * fuzz_h1.c -- libFuzzer target: the HTTP/1.1 response parser (src/h1.c) on arbitrary bytes.
 *
 * The first input byte picks the options (HEAD request or not) and a split point; the rest is
 * the response.  The parser must never crash or over-read, must keep the head within
 * ESX_H1_MAX_HEAD, and must give the same outcome -- result code, status, body bytes and
 * header lines -- whether the bytes come at once, in two pieces, or one at a time.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "h1.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

typedef struct outcome {
    int rc;
    long status;
    int keep_alive;
    size_t used_total;
    esx_buf body, headers;
} outcome;

static int on_header(void *ud, const char *line, size_t len)
{
    outcome *o = ud;
    check(len <= ESX_H1_MAX_HEAD);
    check(memchr(line, '\n', len) == NULL);
    esx_buf_append(&o->headers, line, len);
    esx_buf_append(&o->headers, "\n", 1);
    return 1;
}

static int on_body(void *ud, const char *data, size_t len)
{
    outcome *o = ud;
    esx_buf_append(&o->body, data, len);
    return 1;
}

/* Feeds data in pieces of `step` bytes (0: all at once, else split after `first`). */
static void run(const char *data, size_t size, int head, size_t first, size_t step, outcome *o)
{
    esx_h1_parser p = {0};
    memset(o, 0, sizeof *o);
    esx_buf_init(&o->body, (size_t)1 << 30);
    esx_buf_init(&o->headers, (size_t)1 << 30);
    esx_h1_parser_init(&p, head, on_header, on_body, o);
    size_t off = 0;
    int rc = ESX_H1_MORE;
    while (off < size && rc == ESX_H1_MORE) {
        size_t n = size - off;
        if (step == 0 && off == 0 && first > 0 && first < size)
            n = first;
        else if (step > 0 && n > step)
            n = step;
        size_t used = 0;
        rc = esx_h1_feed(&p, data + off, n, &used);
        check(used <= n);
        if (rc == ESX_H1_MORE)
            check(used == n);
        off += used;
    }
    if (rc == ESX_H1_MORE)
        rc = esx_h1_eof(&p);
    if (rc == ESX_H1_ERROR)
        check(p.error != NULL);
    check(p.head_bytes <= ESX_H1_MAX_HEAD);
    o->rc = rc;
    o->status = p.status;
    o->keep_alive = p.keep_alive;
    o->used_total = off;
    if (rc == ESX_H1_DONE)
        check(p.status >= 200 && p.status <= 999);
    esx_h1_parser_free(&p);
}

static void same(const outcome *a, const outcome *b)
{
    check(a->rc == b->rc);
    if (a->rc != ESX_H1_DONE)
        return; /* where an error is found may differ by chunking; that it is found may not */
    check(a->status == b->status);
    check(a->keep_alive == b->keep_alive);
    check(a->used_total == b->used_total);
    check(a->body.len == b->body.len && memcmp(a->body.data ? a->body.data : "",
                                               b->body.data ? b->body.data : "", a->body.len) == 0);
    check(a->headers.len == b->headers.len &&
          memcmp(a->headers.data ? a->headers.data : "", b->headers.data ? b->headers.data : "",
                 a->headers.len) == 0);
}

static void done(outcome *o)
{
    esx_buf_free(&o->body);
    esx_buf_free(&o->headers);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int head = data[0] & 1;
    const char *msg = (const char *)data + 1;
    size_t n = size - 1;
    size_t split = n ? (data[0] >> 1) % (n + 1) : 0;
    /* a copy of exactly n bytes, so ASan sees any read past the end */
    char *copy = malloc(n ? n : 1);
    if (copy == NULL)
        return 0;
    memcpy(copy, msg, n);
    outcome whole, two, bytes;
    run(copy, n, head, n, 0, &whole);
    run(copy, n, head, split, 0, &two);
    same(&whole, &two);
    if (n <= 4096) {
        run(copy, n, head, 0, 1, &bytes);
        same(&whole, &bytes);
        done(&bytes);
    }
    done(&whole);
    done(&two);
    free(copy);
    return 0;
}
