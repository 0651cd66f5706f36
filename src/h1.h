/*
 * h1.h -- HTTP/1.1 on a plain keep-alive connection: the request head, and an incremental
 * response parser.
 *
 * The engine talks HTTP/1.1 itself to http:// nodes whose host is an IP address or
 * "localhost" (no TLS, no name to resolve): on loopback, libcurl's per-transfer work (URL
 * parsing, option processing, request printf, header scans) cost more CPU than the rest of a
 * search put together.  Everything else -- TLS, host names -- goes through libcurl.
 *
 * The parser owns no socket and calls back with what it finds, so it can be fuzzed alone.
 * Every length it reads from the peer is bounded: the head (status line, headers, and chunk
 * trailers) by ESX_H1_MAX_HEAD bytes, numbers by overflow checks; the body's size is the
 * callback's business.
 */
#ifndef ESX_H1_H
#define ESX_H1_H

#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "buf.h"

#define ESX_H1_MAX_HEAD (64 * 1024)
/* The largest Content-Length or chunk size esx reads (2^60): a longer one is a bad response. */
#define ESX_H1_MAX_LENGTH ((int64_t)1 << 60)
/* Chunked framing (size lines, extensions, line ends) may pass the data it carries by this
 * factor, plus the slack below; more is a bad response.  Each line is bounded, but without
 * this a server sending one byte a chunk behind a 1 KiB extension made esx read ~1,000 bytes
 * a body byte before max_response_bytes was reached.  One-byte chunks with no extension
 * ("1\r\nx\r\n") are 5 bytes of framing a byte: well within. */
#define ESX_H1_FRAMING_RATIO 16
#define ESX_H1_FRAMING_SLACK (64 * 1024)

/* A header line of the response (the status line first, starting "HTTP/"), without its line
 * end.  Returns 0 to stop parsing (the feed then returns ESX_H1_ABORT). */
typedef int (*esx_h1_header_fn)(void *ud, const char *line, size_t len);

/* Body bytes, de-chunked.  Returns 0 to stop parsing (ESX_H1_ABORT). */
typedef int (*esx_h1_body_fn)(void *ud, const char *data, size_t len);

enum { ESX_H1_MORE = 0, ESX_H1_DONE = 1, ESX_H1_ERROR = -1, ESX_H1_ABORT = -2 };

typedef struct esx_h1_parser {
    int state;
    int head_request;   /* the request was HEAD: no body whatever the headers say */
    int status_seen;    /* the status line of the current response was read */
    long status;
    int minor;          /* HTTP/1.<minor> */
    int keep_alive;     /* the connection may carry another request after this response */
    int chunked;
    int has_length;
    int64_t length;     /* Content-Length */
    int64_t remaining;  /* body or chunk bytes still to come */
    uint64_t framing;   /* chunked: size line, extension and line end bytes so far */
    uint64_t chunked_data; /* chunked: data bytes so far */
    int close;          /* "Connection: close" */
    int ka;             /* "Connection: keep-alive" (HTTP/1.0) */
    int te_other;       /* a transfer coding other than chunked: the body ends at the close */
    size_t head_bytes;  /* head and trailer bytes so far (bounded by ESX_H1_MAX_HEAD) */
    esx_buf partial;    /* a line split across reads, assembled (bounded) */
    int partial_used;   /* partial held the last line returned: empty it before the next */
    const char *error;  /* why ESX_H1_ERROR, static text */
    int head_too_big;   /* the error is ESX_H1_MAX_HEAD being passed */
    int bad_coding;     /* a transfer coding other than chunked or identity was named (the
                         * error, when the response has a body: esx cannot decode it) */
    esx_h1_header_fn on_header;
    esx_h1_body_fn on_body;
    void *ud;
} esx_h1_parser;

/* Prepares p for one response.  head_request: the request was HEAD.  Allocates nothing. */
void esx_h1_parser_init(esx_h1_parser *p, int head_request, esx_h1_header_fn on_header,
                        esx_h1_body_fn on_body, void *ud);

/* Frees what the parser holds (a long line); it must be initialised again before reuse. */
void esx_h1_parser_free(esx_h1_parser *p);

/* Feeds n bytes.  Returns ESX_H1_MORE (all consumed, the response goes on), ESX_H1_DONE (the
 * response ended; *used bytes were consumed, the rest belongs to no response), ESX_H1_ERROR
 * (not HTTP/1.x, or a framing error; p->error says why) or ESX_H1_ABORT (a callback said
 * stop).  *used is always set. */
int esx_h1_feed(esx_h1_parser *p, const char *data, size_t n, size_t *used);

/* The peer closed the connection.  Returns ESX_H1_DONE when that ends the response (a body
 * delimited by the close), else ESX_H1_ERROR with p->error set. */
int esx_h1_eof(esx_h1_parser *p);

/* Writes the request head into out (emptied first): request line, Host, User-Agent,
 * Accept, Accept-Encoding (when accept_gzip), `auth` ("Basic ..." or NULL), the per-request
 * headers, and Content-Length when has_body (or the method is POST/PUT).  Per-request
 * headers follow libcurl's conventions: "Name:" removes the built-in header of that name,
 * "Name;" sends it empty, and a custom header replaces the built-in one of the same name.
 * Returns 0, or -1 when out cannot hold it. */
int esx_h1_request_head(esx_buf *out, const char *method, const char *prefix,
                        const char *target, const char *host, const char *user_agent,
                        int accept_gzip, const char *auth, const struct curl_slist *headers,
                        int has_body, size_t body_len);

/* 1 when the per-request headers carry "Connection: close" (the connection is not reused). */
int esx_h1_asks_close(const struct curl_slist *headers);

#endif
