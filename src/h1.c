/*
 * h1.c -- HTTP/1.1 request heads and an incremental response parser (see h1.h).
 *
 * Framing follows RFC 9112 section 6.3: no body for HEAD, 1xx, 204 and 304; chunked when the
 * last transfer coding is chunked (and then Content-Length is ignored and the connection is
 * not reused); otherwise Content-Length; otherwise the body runs to the close.  Interim 1xx
 * responses are skipped (101 is an error: esx never asks to switch protocols).
 */
#include <string.h>
#include <strings.h>

#include "h1.h"
#include "hex.h"

enum { S_HEAD, S_BODY, S_CHUNK_SIZE, S_CHUNK_DATA, S_CHUNK_END, S_TRAILER, S_CLOSE, S_DONE };

#define MAX_CHUNK_LINE 1024
#define MAX_LENGTH ESX_H1_MAX_LENGTH

void esx_h1_parser_init(esx_h1_parser *p, int head_request, esx_h1_header_fn on_header,
                        esx_h1_body_fn on_body, void *ud)
{
    esx_buf partial = p->partial;
    memset(p, 0, sizeof *p);
    p->partial = partial; /* keeps its memory across responses on one connection */
    if (p->partial.max == 0)
        esx_buf_init(&p->partial, ESX_H1_MAX_HEAD);
    esx_buf_reset(&p->partial);
    p->state = S_HEAD;
    p->head_request = head_request;
    p->on_header = on_header;
    p->on_body = on_body;
    p->ud = ud;
}

void esx_h1_parser_free(esx_h1_parser *p)
{
    esx_buf_free(&p->partial);
}

static int fail(esx_h1_parser *p, const char *why)
{
    p->error = why;
    return ESX_H1_ERROR;
}

/* Takes the next line from data[*i..n).  Returns 1 with *line and *len set (line end and CR
 * removed), 0 when the input ended inside a line (kept in p->partial), -1 when the line
 * passes `max` bytes. */
static int take_line(esx_h1_parser *p, const char *data, size_t n, size_t *i, size_t max,
                     const char **line, size_t *len)
{
    if (p->partial_used) {
        esx_buf_reset(&p->partial);
        p->partial_used = 0;
    }
    const char *start = data + *i;
    size_t avail = n - *i;
    const char *nl = memchr(start, '\n', avail);
    size_t chunk = nl ? (size_t)(nl - start) + 1 : avail;
    if (p->partial.len + chunk > max)
        return -1;
    *i += chunk;
    if (p->partial.len == 0 && nl) {
        *line = start;
        *len = chunk - 1;
    } else {
        if (esx_buf_append(&p->partial, start, chunk) != ESX_BUF_OK)
            return -1;
        if (!nl)
            return 0;
        *line = p->partial.data;
        *len = p->partial.len - 1;
        p->partial_used = 1;
    }
    if (*len && (*line)[*len - 1] == '\r')
        (*len)--;
    return 1;
}

static const char *trim(const char *s, const char *end, size_t *len)
{
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    while (end > s && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    *len = (size_t)(end - s);
    return s;
}

/* 1 when the comma-separated list v contains token tok (case-insensitive). */
static int has_token(const char *v, size_t vlen, const char *tok)
{
    size_t tlen = strlen(tok);
    const char *end = v + vlen;
    while (v < end) {
        const char *comma = memchr(v, ',', (size_t)(end - v));
        const char *item_end = comma ? comma : end;
        size_t ilen;
        const char *item = trim(v, item_end, &ilen);
        if (ilen == tlen && strncasecmp(item, tok, tlen) == 0)
            return 1;
        v = comma ? comma + 1 : end;
    }
    return 0;
}

static int name_is(const char *name, size_t nlen, const char *want)
{
    return nlen == strlen(want) && strncasecmp(name, want, nlen) == 0;
}

static int status_line(esx_h1_parser *p, const char *s, size_t len)
{
    /* "HTTP/1.x SSS[ reason]" */
    if (len < 12 || memcmp(s, "HTTP/1.", 7) != 0 || s[7] < '0' || s[7] > '9' || s[8] != ' ')
        return fail(p, "not an HTTP/1.x response");
    for (int k = 9; k < 12; k++)
        if (s[k] < '0' || s[k] > '9')
            return fail(p, "malformed status line");
    if (len > 12 && s[12] != ' ')
        return fail(p, "malformed status line");
    p->minor = s[7] - '0';
    p->status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
    if (p->status < 100)
        return fail(p, "malformed status line");
    p->status_seen = 1;
    return ESX_H1_MORE;
}

static int header_line(esx_h1_parser *p, const char *s, size_t len)
{
    if (s[0] == ' ' || s[0] == '\t')
        return fail(p, "folded header line");
    const char *colon = memchr(s, ':', len);
    if (colon == NULL || colon == s)
        return fail(p, "malformed header line");
    size_t nlen = (size_t)(colon - s);
    for (size_t k = 0; k < nlen; k++)
        if (s[k] == ' ' || s[k] == '\t')
            return fail(p, "malformed header line");
    size_t vlen;
    const char *v = trim(colon + 1, s + len, &vlen);
    if (name_is(s, nlen, "content-length")) {
        int64_t x = 0;
        if (vlen == 0)
            return fail(p, "bad Content-Length");
        for (size_t k = 0; k < vlen; k++) {
            if (v[k] < '0' || v[k] > '9' || x > MAX_LENGTH / 10)
                return fail(p, "bad Content-Length");
            x = x * 10 + (v[k] - '0');
        }
        if (p->has_length && p->length != x)
            return fail(p, "conflicting Content-Length headers");
        p->has_length = 1;
        p->length = x;
    } else if (name_is(s, nlen, "transfer-encoding")) {
        /* chunked only counts as the last coding; esx asks for no other (it sends no TE
         * header, RFC 9110 10.1.4) and decodes none: their bytes are not the body */
        const char *last = v;
        for (const char *c = v, *from = v; c <= v + vlen; c++) {
            if (c < v + vlen && *c != ',')
                continue;
            size_t clen;
            const char *coding = trim(from, c, &clen);
            if (clen > 0 && !(clen == 7 && strncasecmp(coding, "chunked", 7) == 0) &&
                !(clen == 8 && strncasecmp(coding, "identity", 8) == 0))
                p->bad_coding = 1;
            if (c < v + vlen)
                last = from = c + 1;
        }
        size_t llen;
        last = trim(last, v + vlen, &llen);
        if (llen == 7 && strncasecmp(last, "chunked", 7) == 0) {
            p->chunked = 1;
            p->te_other = 0;
        } else {
            p->chunked = 0;
            p->te_other = 1;
        }
    } else if (name_is(s, nlen, "connection")) {
        if (has_token(v, vlen, "close"))
            p->close = 1;
        if (has_token(v, vlen, "keep-alive"))
            p->ka = 1;
    }
    return ESX_H1_MORE;
}

/* The blank line after the headers: picks how the body is delimited. */
static int end_of_head(esx_h1_parser *p)
{
    if (p->status < 200) {
        if (p->status == 101)
            return fail(p, "unexpected 101 Switching Protocols");
        /* an interim response: the real one follows */
        p->status_seen = 0;
        p->has_length = p->chunked = p->te_other = p->close = p->ka = p->bad_coding = 0;
        return ESX_H1_MORE;
    }
    if (p->bad_coding && !(p->head_request || p->status == 204 || p->status == 304))
        return fail(p, "response uses a transfer coding esx does not decode");
    p->keep_alive = p->minor >= 1 ? !p->close : (p->ka && !p->close);
    /* RFC 9112 6.1: Transfer-Encoding in an HTTP/1.0 message means faulty framing (the sender
     * may hold part of it): read this response, then close */
    if (p->minor == 0 && (p->chunked || p->te_other))
        p->keep_alive = 0;
    if (p->head_request || p->status == 204 || p->status == 304) {
        p->state = S_DONE;
    } else if (p->chunked) {
        p->keep_alive = p->keep_alive && !p->has_length; /* both: smuggling shape, do not reuse */
        p->state = S_CHUNK_SIZE;
    } else if (p->te_other || !p->has_length) {
        p->keep_alive = 0;
        p->state = S_CLOSE;
    } else if (p->length == 0) {
        p->state = S_DONE;
    } else {
        p->remaining = p->length;
        p->state = S_BODY;
    }
    return ESX_H1_MORE;
}

static int chunk_size(esx_h1_parser *p, const char *s, size_t len)
{
    int64_t x = 0;
    size_t k = 0;
    for (; k < len; k++) {
        char c = s[k];
        int d = esx_hex_digit((unsigned char)c);
        if (d < 0)
            break;
        if (x > MAX_LENGTH / 16)
            return fail(p, "chunk size too large");
        x = x * 16 + d;
    }
    if (k == 0)
        return fail(p, "bad chunk size");
    while (k < len && (s[k] == ' ' || s[k] == '\t'))
        k++;
    if (k < len && s[k] != ';')
        return fail(p, "bad chunk size");
    if (x == 0) {
        p->state = S_TRAILER;
    } else {
        p->remaining = x;
        p->state = S_CHUNK_DATA;
    }
    return ESX_H1_MORE;
}

int esx_h1_feed(esx_h1_parser *p, const char *data, size_t n, size_t *used)
{
    size_t i = 0;
    int rc = ESX_H1_MORE;
    while (rc == ESX_H1_MORE && p->state != S_DONE && i < n) {
        const char *line;
        size_t len, before = i;
        int got;
        switch (p->state) {
        case S_HEAD:
        case S_TRAILER: {
            /* the budget left for this line: what is already held in `partial` was counted */
            size_t held = p->partial_used ? 0 : p->partial.len;
            size_t left = ESX_H1_MAX_HEAD - p->head_bytes + held;
            got = take_line(p, data, n, &i, left, &line, &len);
            p->head_bytes += i - before;
            if (got < 0) {
                p->head_too_big = 1;
                rc = fail(p, "response headers exceed 64 KiB");
                break;
            }
            if (got == 0)
                break;
            if (p->state == S_TRAILER) {
                /* trailer fields are dropped, but a line that is no field is a bad reply (as
                 * libcurl 7.88 takes it: both transports alike) */
                if (len == 0)
                    p->state = S_DONE;
                else if (memchr(line, ':', len) == NULL)
                    rc = fail(p, "malformed trailer line");
                break;
            }
            if (!p->status_seen && len == 0)
                break; /* RFC 9112 2.2: empty lines before the status line are ignored */
            if (!p->status_seen) {
                rc = status_line(p, line, len);
            } else if (len == 0) {
                rc = end_of_head(p);
                break;
            } else {
                rc = header_line(p, line, len);
            }
            if (rc == ESX_H1_MORE && !p->on_header(p->ud, line, len))
                rc = ESX_H1_ABORT;
            break;
        }
        case S_BODY:
        case S_CHUNK_DATA: {
            size_t take = n - i;
            if ((int64_t)take > p->remaining)
                take = (size_t)p->remaining;
            if (!p->on_body(p->ud, data + i, take)) {
                rc = ESX_H1_ABORT;
                break;
            }
            i += take;
            p->remaining -= (int64_t)take;
            if (p->state == S_CHUNK_DATA)
                p->chunked_data += take;
            if (p->remaining == 0)
                p->state = p->state == S_BODY ? S_DONE : S_CHUNK_END;
            break;
        }
        case S_CHUNK_SIZE:
            got = take_line(p, data, n, &i, MAX_CHUNK_LINE, &line, &len);
            p->framing += i - before;
            if (got < 0)
                rc = fail(p, "chunk size line too long");
            else if (p->framing > ESX_H1_FRAMING_SLACK + ESX_H1_FRAMING_RATIO * p->chunked_data)
                rc = fail(p, "chunk framing outweighs the data it carries");
            else if (got > 0)
                rc = chunk_size(p, line, len);
            break;
        case S_CHUNK_END:
            got = take_line(p, data, n, &i, MAX_CHUNK_LINE, &line, &len);
            p->framing += i - before;
            if (got < 0 || (got > 0 && len != 0))
                rc = fail(p, "missing line end after a chunk");
            else if (got > 0)
                p->state = S_CHUNK_SIZE;
            break;
        case S_CLOSE:
            if (!p->on_body(p->ud, data + i, n - i)) {
                rc = ESX_H1_ABORT;
                break;
            }
            i = n;
            break;
        }
    }
    *used = i;
    if (rc != ESX_H1_MORE)
        return rc;
    return p->state == S_DONE ? ESX_H1_DONE : ESX_H1_MORE;
}

int esx_h1_eof(esx_h1_parser *p)
{
    if (p->state == S_DONE || p->state == S_CLOSE) {
        p->state = S_DONE;
        return ESX_H1_DONE;
    }
    if (p->state == S_HEAD && !p->status_seen && p->head_bytes == 0)
        return fail(p, "server returned nothing (no headers, no data)");
    return fail(p, "connection closed before the response ended");
}

/* ---------------------------------------------------------------- request head */

/* The name of a per-request header line ("Name: v", "Name:", "Name;"): its length, and in
 * *kind 0 = a value follows, 1 = "Name:" (remove the built-in), 2 = "Name;" (send empty). */
static size_t custom_name(const char *h, int *kind)
{
    size_t nlen = strcspn(h, ":;");
    const char *rest = h + nlen;
    *kind = 0;
    if (*rest == ':' || *rest == ';') {
        const char *v = rest + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        if (*v == '\0')
            *kind = *rest == ':' ? 1 : 2;
        else if (*rest == ';')
            nlen = strcspn(h, ":"); /* "A;b: c": the name runs to the colon */
    }
    return nlen;
}

static int overridden(const struct curl_slist *headers, const char *name)
{
    size_t want = strlen(name);
    for (const struct curl_slist *h = headers; h; h = h->next) {
        int kind;
        size_t nlen = custom_name(h->data, &kind);
        if (nlen == want && strncasecmp(h->data, name, want) == 0)
            return 1;
    }
    return 0;
}

#define PUT(s) (rc |= esx_buf_appends(out, (s)))
#define PUTN(s, n) (rc |= esx_buf_append(out, (s), (n)))

int esx_h1_request_head(esx_buf *out, const char *method, const char *prefix,
                        const char *target, const char *host, const char *user_agent,
                        int accept_gzip, const char *auth, const struct curl_slist *headers,
                        int has_body, size_t body_len)
{
    int rc = 0;
    esx_buf_reset(out);
    PUT(method);
    PUT(" ");
    PUT(prefix);
    PUT(target);
    PUT(" HTTP/1.1\r\n");
    if (!overridden(headers, "Host")) {
        PUT("Host: ");
        PUT(host);
        PUT("\r\n");
    }
    if (!overridden(headers, "User-Agent")) {
        PUT("User-Agent: ");
        PUT(user_agent);
        PUT("\r\n");
    }
    if (!overridden(headers, "Accept"))
        PUT("Accept: */*\r\n");
    if (accept_gzip && !overridden(headers, "Accept-Encoding"))
        PUT("Accept-Encoding: gzip\r\n");
    if (auth && !overridden(headers, "Authorization")) {
        PUT("Authorization: ");
        PUT(auth);
        PUT("\r\n");
    }
    for (const struct curl_slist *h = headers; h; h = h->next) {
        int kind;
        size_t nlen = custom_name(h->data, &kind);
        if (kind == 1)
            continue;
        /* the framing is ours alone (the Lua side refuses these; a C caller may not know) */
        if ((nlen == 14 && strncasecmp(h->data, "Content-Length", 14) == 0) ||
            (nlen == 17 && strncasecmp(h->data, "Transfer-Encoding", 17) == 0))
            continue;
        if (kind == 2) {
            PUTN(h->data, nlen);
            PUT(":\r\n");
        } else {
            PUT(h->data);
            PUT("\r\n");
        }
    }
    if (has_body || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) {
        char line[48];
        int k = 0;
        char digits[24];
        size_t v = has_body ? body_len : 0;
        do {
            digits[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        memcpy(line, "Content-Length: ", 16);
        int m = 16;
        while (k)
            line[m++] = digits[--k];
        PUTN(line, (size_t)m);
        PUT("\r\n");
    }
    PUT("\r\n");
    return rc ? -1 : 0;
}

int esx_h1_asks_close(const struct curl_slist *headers)
{
    for (const struct curl_slist *h = headers; h; h = h->next) {
        int kind;
        size_t nlen = custom_name(h->data, &kind);
        if (kind == 0 && nlen == 10 && h->data[10] == ':' &&
            strncasecmp(h->data, "Connection", 10) == 0) {
            const char *v = h->data + nlen + 1;
            if (has_token(v, strlen(v), "close"))
                return 1;
        }
    }
    return 0;
}
