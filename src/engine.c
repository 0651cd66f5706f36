/*
 * engine.c -- the I/O thread's loop (see engine.h): the submission queue, the wait list,
 * connection slots, deadlines, retries and back-off, node states, and the public
 * esx_engine_* calls.  A request's transfer runs through libcurl (engine_curl.c) or esx's own
 * HTTP/1.1 (engine_h1.c); nginx waiters are engine_waiters.c's.  Threading: engine_int.h.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base64.h"
#include "clock.h"
#include "engine_int.h"
#include "proc.h"
#include "retry_after.h"

const char *const esx_failure_kinds[ESX_NKINDS] = {
    ESX_EPOOL_TIMEOUT, ESX_ECONNECT_TIMEOUT, ESX_ECONNECT,  ESX_ERESET,  ESX_ESOCKET_TIMEOUT,
    ESX_EREQUEST_TIMEOUT, ESX_EDECODE,      ESX_ENO_NODES, ESX_ECLOSED, ESX_EINTERNAL,
};

#define MAX_POLL_MS 1000
#define RETRY_AFTER_CAP_MS 30000
#define BACKOFF_BASE_MS 100
#define BACKOFF_CAP_MS 10000
#define LOCAL_BACKOFF_BASE_MS 100 /* after a socket this process could not open */
#define LOCAL_BACKOFF_CAP_MS 1000

static atomic_uint_fast64_t next_generation = 1;
static atomic_uint_fast64_t next_request_id = 1;

static int kind_index(const char *kind)
{
    for (int i = 0; i < ESX_NKINDS; i++)
        if (strcmp(esx_failure_kinds[i], kind) == 0)
            return i;
    return ESX_NKINDS - 1;
}

/* ---------------------------------------------------------------- lists (I/O thread) */

static void list_push(esx_request **head, esx_request *req)
{
    req->next = *head;
    *head = req;
}

void esx_eng_list_remove(esx_request **head, esx_request *req)
{
    for (esx_request **p = head; *p; p = &(*p)->next) {
        if (*p == req) {
            *p = req->next;
            req->next = NULL;
            return;
        }
    }
}

static int64_t min_pos(int64_t a, int64_t b)
{
    if (a <= 0)
        return b;
    if (b <= 0)
        return a;
    return a < b ? a : b;
}

static void wait_due_add(esx_engine *e, const esx_request *req)
{
    e->wait_due = min_pos(e->wait_due, min_pos(req->deadline, req->pool_deadline));
}

/* Appends a request taken from the submission queue (esx_eng_take_submissions counted it). */
static void wait_append(esx_engine *e, esx_request *req)
{
    wait_due_add(e, req);
    req->next = NULL;
    if (e->wait_tail)
        e->wait_tail->next = req;
    else
        e->wait_head = req;
    e->wait_tail = req;
}

static void wait_prepend(esx_engine *e, esx_request *req)
{
    wait_due_add(e, req);
    atomic_fetch_add(&e->nwaiting, 1);
    req->next = e->wait_head;
    e->wait_head = req;
    if (!e->wait_tail)
        e->wait_tail = req;
}

static void wait_remove(esx_engine *e, esx_request *req, esx_request *prev)
{
    atomic_fetch_sub(&e->nwaiting, 1);
    if (prev)
        prev->next = req->next;
    else
        e->wait_head = req->next;
    if (e->wait_tail == req)
        e->wait_tail = prev;
    req->next = NULL;
}

/* ---------------------------------------------------------------- completion */

/* Ends a request: records the outcome, wakes its waiters, drops the engine's reference.
 * kind NULL means the request ends with the HTTP response it holds. */
void esx_eng_finish(esx_engine *e, esx_request *req, const char *kind, const char *fmt, ...)
{
    req->state = ESX_REQ_DONE;
    req->err_kind = kind;
    if (kind) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(req->err_msg, sizeof req->err_msg, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_lock(&e->mu);
    if (kind) {
        e->stats.failures[kind_index(kind)]++;
        if (strcmp(kind, ESX_EPOOL_TIMEOUT) == 0)
            e->stats.pool_timeouts++;
    } else {
        e->stats.responses++;
    }
    pthread_mutex_unlock(&e->mu);
    if (req->on_done)
        req->on_done(req, req->on_done_ud);
    esx_request_complete(req);
    esx_eng_poke_watchers(req);
    esx_request_unref(req);
}

/* ---------------------------------------------------------------- responses (both transports) */

static void abort_with(esx_request *req, const char *kind, const char *msg)
{
    req->abort_kind = kind;
    snprintf(req->abort_msg, sizeof req->abort_msg, "%s", msg);
}

/* Notes the content codings of a Content-Encoding value (a list, applied in order; RFC 9110
 * 8.4): gzip (x-gzip is the same, 8.4.1.3) in resp_gzip, any coding but gzip and identity in
 * resp_coded.  Only "gzip" as the value's first word counted: "identity, gzip" and "x-gzip"
 * came back still compressed, as if they were the body, and "deflate" or "br" (which esx
 * does not ask for) as well. */
static void note_codings(esx_request *req, const char *v, size_t vlen)
{
    const char *end = v + vlen;
    while (v < end) {
        const char *comma = memchr(v, ',', (size_t)(end - v));
        const char *te = comma ? comma : end;
        while (v < te && (*v == ' ' || *v == '\t'))
            v++;
        size_t n = (size_t)(te - v);
        while (n && (v[n - 1] == ' ' || v[n - 1] == '\t'))
            n--;
        if ((n == 4 && strncasecmp(v, "gzip", 4) == 0) ||
            (n == 6 && strncasecmp(v, "x-gzip", 6) == 0))
            req->resp_gzip = req->resp_gzip ? 2 : 1;
        else if (n != 0 && !(n == 8 && strncasecmp(v, "identity", 8) == 0))
            req->resp_coded = 1;
        v = comma ? comma + 1 : end;
    }
}

/* The number a Content-Length value of vlen bytes holds, or -1 when it is not 1*DIGIT or
 * passes ESX_H1_MAX_LENGTH (as h1.c refuses it: libcurl 7.88 ignored a number too large to
 * hold and read to the close, so a response cut short there was taken as whole). */
static int64_t content_length(const char *v, size_t vlen)
{
    int64_t x = 0;
    if (vlen == 0)
        return -1;
    for (size_t k = 0; k < vlen; k++) {
        if (v[k] < '0' || v[k] > '9' || x > ESX_H1_MAX_LENGTH / 10)
            return -1;
        x = x * 10 + (v[k] - '0');
    }
    return x;
}

/* One response header line (with or without its line end); the status line starts a new
 * response.  Returns 0 when the request was aborted (headers too big). */
int esx_eng_record_header(esx_request *req, const char *buf, size_t len)
{
    req->last_activity = esx_now_ms();
    req->passed_on = 1;
    /* every line counts, also those not kept below (long names, no colon): libcurl lets
     * 300 KiB of them in, then fails the transfer as a receive error -- a "reset", retried */
    if (len > ESX_H1_MAX_HEAD || (req->head_in += (unsigned)len) > ESX_H1_MAX_HEAD) {
        abort_with(req, ESX_EDECODE, "response headers exceed 64 KiB");
        return 0;
    }
    if (req->head_done == 1)
        return 1; /* a trailer (RFC 9110 6.5.1: not a header), dropped as h1.c drops it */
    if (len >= 5 && memcmp(buf, "HTTP/", 5) == 0) {
        /* a new response (after 1xx): forget the previous headers */
        esx_buf_reset(&req->resp_headers);
        req->resp_gzip = req->resp_coded = 0;
        req->head_done = len > 9 && buf[9] == '1' ? 2 : 0;
        return 1;
    }
    size_t end = len;
    while (end && (buf[end - 1] == '\r' || buf[end - 1] == '\n'))
        end--;
    const char *colon = memchr(buf, ':', end);
    if (end == 0) {
        if (req->head_done == 0)
            req->head_done = 1; /* (h1.c passes neither this line nor trailers) */
        return 1;
    }
    /* framing h1.c refuses before this is called (libcurl 7.88 takes it and reads on): a
     * folded line, a line without a name, a name with a space, a Content-Length that is not
     * digits or differs from an earlier one.  Trailers (after body bytes) are not framing. */
    const char *bad = NULL;
    if (req->wire_in == 0) {
        if (buf[0] == ' ' || buf[0] == '\t')
            bad = "folded header line";
        else if (colon == NULL || colon == buf || memchr(buf, ' ', (size_t)(colon - buf)) ||
                 memchr(buf, '\t', (size_t)(colon - buf)))
            bad = "malformed header line";
    }
    if (colon == NULL && bad == NULL)
        return 1;
    size_t nlen = bad ? 0 : (size_t)(colon - buf);
    const char *v = bad ? buf : colon + 1;
    while (v < buf + end && (*v == ' ' || *v == '\t'))
        v++;
    size_t vlen = (size_t)(buf + end - v);
    while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
        vlen--; /* the whitespace around a value is not part of it (RFC 9110 5.5) */
    if (!bad && req->wire_in == 0 && nlen == 14 && strncasecmp(buf, "content-length", 14) == 0) {
        /* 1*DIGIT (RFC 9110 8.6): leading zeros are part of the syntax, and repeated fields
         * agree when they carry the same number -- "2" and "02" do, as h1.c reads them (the
         * text compared, a response with both was a reset over libcurl, and over esx's own
         * HTTP/1.1 one that was neither retried nor held against the node) */
        int64_t x = content_length(v, vlen);
        size_t flen;
        const char *first = x < 0 ? NULL : esx_request_header_ref(req, "content-length", &flen);
        if (x < 0)
            bad = "bad Content-Length";
        else if (first && content_length(first, flen) != x)
            bad = "conflicting Content-Length headers";
    }
    if (bad) {
        char msg[64];
        snprintf(msg, sizeof msg, "bad HTTP response: %s", bad);
        abort_with(req, ESX_ERESET, msg);
        return 0;
    }
    char name[64];
    if (nlen == 0 || nlen >= sizeof name)
        return 1; /* no header esx reads has a name this long; skip it */
    for (size_t i = 0; i < nlen; i++) {
        char c = buf[i];
        name[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    name[nlen] = '\0';
    if (strcmp(name, "content-encoding") == 0)
        note_codings(req, v, vlen);
    size_t at = req->resp_headers.len;
    int brc;
    if ((brc = esx_buf_append(&req->resp_headers, name, nlen)) != ESX_BUF_OK ||
        (brc = esx_buf_append(&req->resp_headers, ": ", 2)) != ESX_BUF_OK ||
        (brc = esx_buf_append(&req->resp_headers, v, vlen)) != ESX_BUF_OK ||
        (brc = esx_buf_append(&req->resp_headers, "\n", 1)) != ESX_BUF_OK) {
        if (brc == ESX_BUF_TOOBIG)
            abort_with(req, ESX_EDECODE, "response headers exceed 64 KiB");
        else /* esx's failure, not the response's */
            abort_with(req, ESX_EINTERNAL, "out of memory reading the response headers");
        return 0;
    }
    /* RFC 9110 5.5: a NUL in a field is replaced by SP (it would end the list here) */
    for (size_t i = at; i < req->resp_headers.len; i++)
        if (req->resp_headers.data[i] == '\0')
            req->resp_headers.data[i] = ' ';
    return 1;
}

/* Response body bytes as they came on the wire.  Returns 0 when the request was aborted
 * (too big, corrupt gzip, out of memory). */
int esx_eng_record_body(esx_request *req, const char *buf, size_t len)
{
    req->last_activity = esx_now_ms();
    req->passed_on = 1;
    req->wire_in += len;
    int rc;
    if (req->resp_coded || req->resp_gzip > 1) {
        /* its bytes are not the body: esx inflates gzip once, and asks for nothing else */
        abort_with(req, ESX_EDECODE, "response uses a content coding esx does not decode");
        return 0;
    }
    if (req->resp_gzip) {
        /* the wire bytes too: a body that inflates to little (empty deflate blocks) would
         * otherwise be read for ever, each byte activity for socket_timeout.  The slack is
         * gzip's worst growth of incompressible bytes (zlib's deflateBound) */
        size_t max = req->resp_body.max, wire_max = max + (max >> 11) + 1024;
        if (wire_max >= max && req->wire_in > wire_max) { /* (wrapped: no bound) */
            char msg[128];
            snprintf(msg, sizeof msg, "gzip response passes max_response_bytes (%zu) on the wire",
                     max);
            abort_with(req, ESX_EDECODE, msg);
            return 0;
        }
        if (!req->inflater.started && esx_inflate_init(&req->inflater) != ESX_GZIP_OK) {
            abort_with(req, ESX_EINTERNAL, "out of memory starting gzip inflation");
            return 0;
        }
        rc = esx_inflate_feed(&req->inflater, buf, len, &req->resp_body);
        if (rc == ESX_GZIP_OK || rc == ESX_GZIP_MORE)
            return 1;
        if (rc == ESX_GZIP_TOOBIG) {
            char msg[128];
            snprintf(msg, sizeof msg, "gzip response inflates past max_response_bytes (%zu)",
                     req->resp_body.max);
            abort_with(req, ESX_EDECODE, msg);
        } else if (rc == ESX_GZIP_CORRUPT) {
            abort_with(req, ESX_EDECODE, "corrupt gzip response body");
        } else {
            abort_with(req, ESX_EINTERNAL, "out of memory inflating the response");
        }
        return 0;
    }
    rc = esx_buf_append(&req->resp_body, buf, len);
    if (rc == ESX_BUF_OK)
        return 1;
    if (rc == ESX_BUF_TOOBIG) {
        char msg[128];
        snprintf(msg, sizeof msg, "response body exceeds max_response_bytes (%zu)",
                 req->resp_body.max);
        abort_with(req, ESX_EDECODE, msg);
    } else {
        abort_with(req, ESX_EINTERNAL, "out of memory reading the response");
    }
    return 0;
}

/* ---------------------------------------------------------------- open sockets */

/* The engine's table of open sockets (libcurl's and its own), for stats and fork.  Each
 * entry keeps its socket's inode, which no other open file shares: libcurl 7.88 closes a
 * socket whose connect failed without calling the close callback (fixed in 8.2), and such a
 * stale entry -- its number perhaps reused by another file -- is found and dropped by
 * esx_eng_sock_prune, never counted for ever nor closed after a fork. */

/* 1 when s->fd is still open as the socket s recorded (same device and inode). */
static int still_open(const esx_sock *s)
{
    struct stat st;
    return fstat(s->fd, &st) == 0 && st.st_dev == s->dev && st.st_ino == s->ino;
}

static void drop_entry(esx_engine *e, int i)
{
    e->ndead -= e->sockets[i].dead;
    e->sockets[i] = e->sockets[--e->nsockets];
    atomic_store(&e->nopen, e->nsockets - e->ndead);
}

int esx_eng_sock_register(esx_engine *e, int fd)
{
    if (e->nsockets >= MAX_SOCKETS)
        esx_eng_sock_prune(e);
    if (e->nsockets >= MAX_SOCKETS)
        return -1;
    struct stat st;
    esx_sock *s = &e->sockets[e->nsockets++];
    s->fd = fd;
    s->lport = s->rport = 0;
    s->dead = 0;
    if (fstat(fd, &st) == 0) {
        s->dev = st.st_dev;
        s->ino = st.st_ino;
    } else { /* not open: the next prune drops it */
        s->dev = 0;
        s->ino = 0;
    }
    atomic_store(&e->nopen, e->nsockets - e->ndead);
    return 0;
}

void esx_eng_sock_forget(esx_engine *e, int fd)
{
    for (int i = 0; i < e->nsockets; i++) {
        if (e->sockets[i].fd == fd) {
            drop_entry(e, i);
            break;
        }
    }
}

void esx_eng_sock_prune(esx_engine *e)
{
    for (int i = e->nsockets - 1; i >= 0; i--) {
        if (!still_open(&e->sockets[i]))
            drop_entry(e, i);
    }
}

/* ---------------------------------------------------------------- attempts */

/* Ends the running attempt's use of its transfer and connection slot.  A plain HTTP/1.1
 * connection still attached is mid-request and is closed. */
void esx_eng_release_attempt(esx_engine *e, esx_request *req)
{
    if (req->easy) {
        curl_off_t up = 0;
        if (curl_easy_getinfo(req->easy, CURLINFO_SIZE_UPLOAD_T, &up) == CURLE_OK && up > 0)
            req->ul_seen = (long long)up;
        curl_multi_remove_handle(e->multi, req->easy);
        if (e->nspare < MAX_SPARE_EASY)
            e->spare[e->nspare++] = req->easy;
        else
            curl_easy_cleanup(req->easy);
        req->easy = NULL;
        if (req->curl_connecting)
            esx_eng_sock_prune(e); /* its socket may be gone without the close callback */
        /* a connection its peer closed while this transfer ran may be idle now, in
         * libcurl's cache */
        e->curl_recount |= e->curl_dead_busy;
    }
    if (req->h1) {
        esx_eng_h1_drop(e, req->h1);
        req->h1 = NULL;
    }
    if (req->slot) {
        req->slot = 0;
        e->in_use--;
        if (req->node >= 0) {
            pthread_mutex_lock(&e->mu);
            e->nodes.v[req->node].in_flight--;
            if (req->probe)
                e->nodes.v[req->node].probing = 0; /* marked by its outcome, or due again */
            req->probe = 0;
            e->stats.received_wire += req->wire_in;
            e->stats.received_raw += req->resp_body.len;
            /* the body bytes that left, not the attempt's whole body: an attempt whose
             * connection was refused sent nothing; one cut short, its part (raw: prorated) */
            size_t out = req->ul_seen <= 0 ? 0
                         : (unsigned long long)req->ul_seen < req->body_len ? (size_t)req->ul_seen
                                                                            : req->body_len;
            if (out > 0) {
                e->stats.sent_wire += out;
                e->stats.sent_raw += out == req->body_len
                                         ? req->body_raw_len
                                         : (uint64_t)((double)req->body_raw_len * (double)out /
                                                      (double)req->body_len);
            }
            pthread_mutex_unlock(&e->mu);
        }
    }
    esx_inflate_end(&req->inflater);
}

/* Clears the response of a failed attempt before the next one. */
static void reset_response(esx_request *req)
{
    esx_buf_reset(&req->resp_headers);
    esx_buf_reset(&req->resp_body);
    esx_inflate_end(&req->inflater);
    memset(&req->inflater, 0, sizeof req->inflater);
    req->resp_gzip = req->resp_coded = 0;
    req->wire_in = 0;
    req->head_in = 0;
    req->head_done = 0;
    req->curl_stale = 0;
    req->ul_seen = 0;
    req->status = 0;
    req->abort_kind = NULL;
}

/* Starts req on node, over plain HTTP/1.1 or libcurl; on failure the request is finished
 * with "internal". */
static void start_attempt(esx_engine *e, esx_request *req, int node_index, int64_t now)
{
    esx_node *node = &e->nodes.v[node_index];
    reset_response(req);
    req->h1_redone = 0;
    int rc = e->h1n[node_index].fast ? esx_eng_h1_start(e, req, node_index, now)
                                     : esx_eng_curl_start(e, req, node, now);
    if (rc != 0)
        return;
    e->in_use++;
    req->slot = 1;
    req->node = node_index;
    req->tried |= 1ULL << node_index;
    req->state = ESX_REQ_ACTIVE;
    req->last_activity = now;
    req->sent_marks = node->marks;
    esx_request_set_node(req, node->url);
    pthread_mutex_lock(&e->mu);
    /* the retry of a dead node that is due: the one request it gets until it answers */
    req->probe = !node->alive && node->dead_until <= now && !node->probing;
    node->probing |= req->probe;
    node->in_flight++;
    node->requests++;
    pthread_mutex_unlock(&e->mu);
    list_push(&e->active, req);
}

static int is_retry_status(const esx_config *cfg, long status)
{
    for (int i = 0; i < cfg->n_retry_on_status; i++)
        if (cfg->retry_on_status[i] == status)
            return 1;
    return 0;
}

/* Queues another attempt after delay ms, or returns 0 when the call may not retry (out of
 * attempts, past its deadline, or the engine is stopping). */
static int schedule_retry(esx_engine *e, esx_request *req, int64_t now, int64_t delay)
{
    if (req->attempt >= req->max_retries || atomic_load(&e->stop))
        return 0;
    if (req->deadline > 0 && now + delay >= req->deadline)
        return 0;
    req->attempt++;
    req->retries++;
    req->node = -1;
    req->retry_at = now + delay;
    req->pool_deadline = req->retry_at + e->cfg->pool_timeout;
    pthread_mutex_lock(&e->mu);
    e->stats.retries++;
    pthread_mutex_unlock(&e->mu);
    if (delay > 0) {
        req->state = ESX_REQ_BACKOFF;
        list_push(&e->backoff, req);
    } else {
        req->state = ESX_REQ_QUEUED;
        wait_prepend(e, req); /* it has waited its turn already */
        e->h1_kick = 1;       /* ... and starts on the next pass, without waiting for a poll */
    }
    return 1;
}

/* Records the outcome of req's attempt on node_index (-1: none). */
static void mark_node(esx_engine *e, int node_index, const esx_request *req, int ok, int64_t now)
{
    if (node_index < 0)
        return;
    pthread_mutex_lock(&e->mu);
    esx_node *node = &e->nodes.v[node_index];
    if (ok)
        esx_node_succeeded(node);
    else
        esx_node_failed(node, now, req->sent_marks, e->cfg->dead_backoff_min, e->cfg->dead_backoff_max);
    pthread_mutex_unlock(&e->mu);
}

/* The n-th (from 1) exponential back-off from base ms, doubling, capped at cap, with "equal
 * jitter": half fixed, half random, so retries of many callers spread out. */
static int64_t jittered_backoff(esx_engine *e, int n, int64_t base, int64_t cap)
{
    for (int i = 1; i < n && base < cap; i++)
        base *= 2;
    if (base > cap)
        base = cap;
    e->rng = e->rng * 1103515245u + 12345u;
    return base / 2 + (int64_t)((e->rng >> 8) % (unsigned)(base / 2 + 1));
}

static int64_t backoff_429(esx_engine *e, esx_request *req)
{
    char value[128];
    if (esx_request_header(req, "retry-after", value, sizeof value)) {
        int64_t ms = esx_retry_after_ms(value, strlen(value), esx_wall_ms());
        if (ms >= 0)
            return ms;
    }
    return jittered_backoff(e, req->n429, BACKOFF_BASE_MS, BACKOFF_CAP_MS);
}

/* An attempt ended with an HTTP response (its slot released): finish or retry the call.
 * truncated: a gzip body ended early. */
void esx_eng_on_response(esx_engine *e, esx_request *req, int node_index, int truncated,
                         int64_t now)
{
    if (truncated) {
        esx_eng_finish(e, req, ESX_EDECODE, "truncated gzip response body");
        return;
    }
    /* 429 first, whatever retry_on_status lists: a node that is shedding load is alive (a dead
     * node's retry answered 429 brings it back) */
    if (req->status == 429) {
        mark_node(e, node_index, req, 1, now);
        req->n429++;
        int64_t delay = backoff_429(e, req);
        if (delay > RETRY_AFTER_CAP_MS || !schedule_retry(e, req, now, delay))
            esx_eng_finish(e, req, NULL, NULL);
        return;
    }
    if (is_retry_status(e->cfg, req->status)) {
        mark_node(e, node_index, req, 0, now);
        if (!schedule_retry(e, req, now, 0))
            esx_eng_finish(e, req, NULL, NULL);
        return;
    }
    mark_node(e, node_index, req, 1, now);
    esx_eng_finish(e, req, NULL, NULL);
}

/* An attempt failed in transport (its slot released): retry the call or finish it. */
void esx_eng_on_failure(esx_engine *e, esx_request *req, int node_index, const char *kind,
                        int node_dead, int retryable, const char *msg, int64_t now)
{
    if (node_dead)
        mark_node(e, node_index, req, 0, now);
    if (retryable && schedule_retry(e, req, now, 0))
        return;
    esx_eng_finish(e, req, kind, "%s", msg);
}

/* ---------------------------------------------------------------- local shortages */

int esx_eng_local_errno(int err)
{
    return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM ||
           err == ESX_ESOCKTABLE;
}

int esx_eng_probe_local(int pair)
{
    int sv[2] = {-1, -1};
    if (pair) {
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
            return esx_eng_local_errno(errno) ? errno : 0;
    } else if ((sv[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
        return esx_eng_local_errno(errno) ? errno : 0;
    }
    close(sv[0]);
    if (sv[1] >= 0)
        close(sv[1]);
    return 0;
}

/* A socket this process cannot open says nothing about the node: marking it dead would, under
 * descriptor pressure, leave every node dead for dead_backoff_min though none failed.  Nor is
 * another node worth trying at once -- it would fail the same way.  Descriptors come back as
 * other connections and files close, so the call waits a short back-off (50-100 ms, doubling
 * up to 1 s, within max_retries and its deadline) and tries again; when it may not, it fails
 * with "connect" (the request never left) and says why. */
void esx_eng_on_local_failure(esx_engine *e, esx_request *req, int node_index, int err,
                              const char *what, int64_t now)
{
    if (node_index >= 0)
        req->tried &= ~(1ULL << node_index); /* not reached: it may be picked again */
    req->nlocal++;
    if (schedule_retry(e, req, now,
                       jittered_backoff(e, req->nlocal, LOCAL_BACKOFF_BASE_MS,
                                        LOCAL_BACKOFF_CAP_MS)))
        return;
    const char *where = err == EMFILE          ? "this process's limit"
                        : err == ENFILE        ? "the system's limit"
                        : err == ESX_ESOCKTABLE ? "the engine's table of open sockets"
                                               : "short of memory here";
    esx_eng_finish(e, req, ESX_ECONNECT, "%s: %s (%s; the node was not marked) (%.180s)", what,
                   err == ESX_ESOCKTABLE ? "too many open sockets" : strerror(err), where,
                   esx_request_node(req));
}

/* ---------------------------------------------------------------- the loop */

void esx_eng_take_submissions(esx_engine *e, int64_t now)
{
    pthread_mutex_lock(&e->mu);
    esx_request *req = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    atomic_fetch_add(&e->nwaiting, e->nsub); /* moved to the wait list just below */
    e->nsub = 0;
    pthread_mutex_unlock(&e->mu);
    while (req) {
        esx_request *next = req->next;
        if (req->attempt > req->max_retries) {
            /* salvaged from a dead engine that had it on the wire, with no retry left */
            atomic_fetch_sub(&e->nwaiting, 1);
            esx_eng_finish(e, req, ESX_EINTERNAL,
                           "the I/O thread failed with the request in flight");
            req = next;
            continue;
        }
        if (req->retry_at > now) {
            /* salvaged from a dead engine in its back-off: the rest of it is kept (a 429's
             * Retry-After included); schedule_retry set its pool_deadline */
            atomic_fetch_sub(&e->nwaiting, 1);
            req->state = ESX_REQ_BACKOFF;
            list_push(&e->backoff, req);
            req = next;
            continue;
        }
        req->state = ESX_REQ_QUEUED;
        int fresh = req->submitted_at == 0;
        if (fresh) {
            req->submitted_at = now;
            if (req->timeout_ms > 0)
                req->deadline = now + req->timeout_ms;
        }
        /* salvaged from a dead engine while waiting for a slot: the wait goes on, not anew
         * (one that was on the wire comes back as a retry, with pool_deadline 0: anew) */
        if (fresh || req->pool_deadline == 0)
            req->pool_deadline = now + e->cfg->pool_timeout;
        wait_append(e, req);
        req = next;
    }
}

static void start_waiting(esx_engine *e, int64_t now)
{
    esx_request *prev = NULL, *req = e->wait_head;
    while (req && e->in_use < e->cfg->max_total) {
        esx_request *next = req->next;
        esx_node *node = NULL;
        pthread_mutex_lock(&e->mu);
        int pick = esx_nodes_pick(&e->nodes, now, e->cfg->max_per_route, req->tried,
                                  e->cfg->resurrect, &node);
        pthread_mutex_unlock(&e->mu);
        if (pick == ESX_PICK_BUSY)
            break; /* every eligible node is full: FIFO order is kept */
        wait_remove(e, req, prev);
        if (pick == ESX_PICK_NONE && req->status != 0)
            esx_eng_finish(e, req, NULL, NULL); /* a retry with no node left: the last answer */
        else if (pick == ESX_PICK_NONE)
            esx_eng_finish(e, req, ESX_ENO_NODES, "every node is dead and none is due for a retry");
        else
            start_attempt(e, req, (int)(node - e->nodes.v), now);
        req = next;
    }
}

/* 1 when req's socket silence is watched: its connection is up, or connect_timeout is off
 * (then socket_timeout bounds the connect too).  A connect belongs to connect_timeout, which
 * fails as "connect_timeout": retried, and the node marked dead. */
static int silence_watched(const esx_engine *e, const esx_request *req)
{
    if (e->cfg->socket_timeout <= 0)
        return 0;
    if (e->cfg->connect_timeout <= 0)
        return 1;
    const esx_h1_conn *c = req->h1;
    if (c)
        return c->state != ESX_H1C_CONNECTING;
    return !(req->easy && req->curl_connecting);
}

static void expire(esx_engine *e, int64_t now)
{
    const esx_config *cfg = e->cfg;
    esx_request *prev = NULL, *req = NULL;
    if (e->wait_head && e->wait_due > 0 && now >= e->wait_due) {
        e->wait_due = 0; /* recomputed below (and by any append meanwhile) */
        req = e->wait_head;
        while (req) {
            esx_request *next = req->next;
            if (req->deadline > 0 && now >= req->deadline) {
                wait_remove(e, req, prev);
                esx_eng_finish(e, req, ESX_EREQUEST_TIMEOUT, "no answer within %lld ms",
                               (long long)req->timeout_ms);
            } else if (now >= req->pool_deadline) {
                wait_remove(e, req, prev);
                esx_eng_finish(e, req, ESX_EPOOL_TIMEOUT,
                               "no free connection within pool_timeout (%lld ms); %d in use",
                               (long long)cfg->pool_timeout, e->in_use);
            } else {
                wait_due_add(e, req);
                prev = req;
            }
            req = next;
        }
    } else if (e->wait_head == NULL) {
        e->wait_due = 0;
    }
    for (esx_request **p = &e->backoff; *p;) {
        req = *p;
        if (req->deadline > 0 && now >= req->deadline) {
            *p = req->next;
            esx_eng_finish(e, req, ESX_EREQUEST_TIMEOUT, "no answer within %lld ms",
                           (long long)req->timeout_ms);
        } else if (now >= req->retry_at) {
            *p = req->next;
            req->state = ESX_REQ_QUEUED;
            wait_prepend(e, req);
        } else {
            p = &req->next;
        }
    }
    for (esx_request **p = &e->active; *p;) {
        req = *p;
        esx_h1_conn *c = req->h1;
        if (c && c->state == ESX_H1C_CONNECTING && !c->error && c->connect_deadline > 0 &&
            now >= c->connect_deadline && (req->deadline <= 0 || now < req->deadline)) {
            *p = req->next;
            req->next = NULL;
            esx_eng_h1_fail_detached(e, c, ESX_ECONNECT_TIMEOUT, now);
            continue;
        }
        int timed_out = req->deadline > 0 && now >= req->deadline;
        int silent = silence_watched(e, req) && now - req->last_activity >= cfg->socket_timeout;
        if (silent && req->easy) {
            esx_eng_curl_heard(req, now); /* bytes libcurl holds back (part of a line) */
            silent = now - req->last_activity >= cfg->socket_timeout;
        }
        if (timed_out || silent) {
            *p = req->next;
            req->next = NULL;
            esx_eng_release_attempt(e, req);
            if (timed_out)
                esx_eng_finish(e, req, ESX_EREQUEST_TIMEOUT, "no answer within %lld ms (%.180s)",
                               (long long)req->timeout_ms, esx_request_node(req));
            else
                esx_eng_finish(e, req, ESX_ESOCKET_TIMEOUT, "no data for %lld ms (%.180s)",
                               (long long)cfg->socket_timeout, esx_request_node(req));
        } else {
            p = &req->next;
        }
    }
}

static int64_t next_wakeup(esx_engine *e, int64_t now)
{
    int64_t t = e->wait_head ? e->wait_due : 0;
    for (esx_request *r = e->backoff; r; r = r->next)
        t = min_pos(t, min_pos(r->deadline, r->retry_at));
    for (esx_request *r = e->active; r; r = r->next) {
        t = min_pos(t, r->deadline);
        esx_h1_conn *c = r->h1;
        if (c && c->state == ESX_H1C_CONNECTING)
            t = min_pos(t, c->connect_deadline);
        if (silence_watched(e, r))
            t = min_pos(t, r->last_activity + e->cfg->socket_timeout);
    }
    /* A dead node becoming due can unblock waiting requests.  One due already stays marked
     * dead until it answers: it changes nothing until then, and counting it would make the
     * poll timeout 0 (a spinning thread) for as long as a request waits. */
    if (e->wait_head) {
        pthread_mutex_lock(&e->mu);
        for (int i = 0; i < e->nodes.n; i++)
            if (!e->nodes.v[i].alive && e->nodes.v[i].dead_until > now)
                t = min_pos(t, e->nodes.v[i].dead_until);
        pthread_mutex_unlock(&e->mu);
    }
    return t;
}

/* ---------------------------------------------------------------- thread */

static void fail_all(esx_engine *e, const char *kind, const char *msg)
{
    esx_request *req;
    while ((req = e->active) != NULL) {
        e->active = req->next;
        esx_eng_release_attempt(e, req);
        esx_eng_finish(e, req, kind, "%s", msg);
    }
    while ((req = e->wait_head) != NULL) {
        e->wait_head = req->next;
        atomic_fetch_sub(&e->nwaiting, 1);
        esx_eng_finish(e, req, kind, "%s", msg);
    }
    e->wait_tail = NULL;
    while ((req = e->backoff) != NULL) {
        e->backoff = req->next;
        esx_eng_finish(e, req, kind, "%s", msg);
    }
    pthread_mutex_lock(&e->mu);
    req = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    e->nsub = 0;
    pthread_mutex_unlock(&e->mu);
    while (req) {
        esx_request *next = req->next;
        esx_eng_finish(e, req, kind, "%s", msg);
        req = next;
    }
}

static void mark_dead(void *arg)
{
    esx_engine *e = arg;
    atomic_store(&e->alive, 0);
}

static void free_rest(esx_engine *e);

static void *io_main(void *arg)
{
    esx_engine *e = arg;
    pthread_cleanup_push(mark_dead, e);
    while (!atomic_load(&e->stop)) {
        if (atomic_load(&e->kill)) {
            esx_eng_thread_gone();
            pthread_exit(NULL); /* test hook: die with everything in flight */
        }
        int stale = atomic_exchange(&e->stale_listen_fd, -1);
        if (stale >= 0)
            close(stale); /* a waiter socket whose file went away: out of the poll set now */
        if (atomic_load(&e->sweep_due))
            esx_eng_sweep_waiters(e); /* once per process: here, not in the caller's thread */
        int64_t now = esx_now_ms();
        esx_eng_take_submissions(e, now);
        start_waiting(e, now); /* before expiring: pool_timeout 0 means "only if a slot is free" */
        expire(e, now);        /* also moves due back-offs to the waiting list ... */
        start_waiting(e, now); /* ... which start now, not at the next wake-up */
        int running = 0;
        CURLMcode mc = curl_multi_perform(e->multi, &running);
        if (mc != CURLM_OK) {
            fail_all(e, ESX_EINTERNAL, curl_multi_strerror(mc));
            break; /* the next call rebuilds the engine */
        }
        CURLMsg *msg;
        int left;
        now = esx_now_ms();
        while ((msg = curl_multi_info_read(e->multi, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            esx_request *req = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&req);
            CURLcode rc = msg->data.result;
            esx_eng_on_transfer_done(e, req, rc, now);
        }
        esx_eng_h1_service(e, now);
        /* freed slots go to waiting requests at once, retries first (as at the top of the
         * loop, before expiring: a retry under pool_timeout 0 takes a free slot) ... */
        start_waiting(e, now);
        expire(e, now);
        start_waiting(e, now);
        esx_eng_h1_service(e, now); /* ... and their requests are written before the poll */

        long curl_ms = -1;
        curl_multi_timeout(e->multi, &curl_ms);
        int64_t wake = next_wakeup(e, now);
        int64_t timeout = MAX_POLL_MS;
        if (wake > 0)
            timeout = wake - now < timeout ? (wake - now < 0 ? 0 : wake - now) : timeout;
        if (curl_ms >= 0 && curl_ms < timeout)
            timeout = curl_ms;
        if (e->h1_kick)
            timeout = 0;

        /* the poll set beyond libcurl's sockets: the waiter socket, the epoll instance that
         * watches the h1 connections, the waiters (room for the first two is always there) */
        int want = 2 + e->nconns; /* nconns <= MAX_WAITER_CONNS */
        if (want > e->cappfd) {
            struct curl_waitfd *v = realloc(e->pfd, (size_t)want * sizeof *v);
            if (v) { /* (else the next pass tries again) */
                e->pfd = v;
                e->cappfd = want;
            }
        }
        struct curl_waitfd *extra = e->pfd;
        unsigned int nextra = 0, cap = (unsigned int)e->cappfd;
        int lfd = atomic_load(&e->listen_fd);
        int lidx = -1;
        if (lfd >= 0 && now >= e->accept_paused_until) {
            lidx = (int)nextra;
            extra[nextra++] = (struct curl_waitfd){.fd = lfd, .events = CURL_WAIT_POLLIN};
        } else if (lfd >= 0 && now < e->accept_paused_until &&
                   e->accept_paused_until - now < timeout) {
            timeout = e->accept_paused_until - now; /* accepting again then */
        }
        if (e->curl_recount)
            esx_eng_curl_recount(e);
        int eidx = -1;
        if (e->epfd >= 0) {
            if (esx_eng_h1_watch(e) > 0)
                timeout = 0; /* freed slots go to waiting requests */
            eidx = (int)nextra;
            extra[nextra++] = (struct curl_waitfd){.fd = e->epfd, .events = CURL_WAIT_POLLIN};
        }
        /* waiters in the room left: one left out is still read after every poll (it only
         * cannot wake this one) */
        for (int i = 0; i < e->nconns && nextra < cap; i++)
            extra[nextra++] = (struct curl_waitfd){.fd = e->conns[i].fd, .events = CURL_WAIT_POLLIN};
        /* Asleep from here: a request queued after the check below sends a wakeup.  While the
         * thread works, submitters send none (one system call saved per request under load). */
        atomic_store(&e->wake_pending, 0);
        pthread_mutex_lock(&e->mu);
        if (e->sub_head)
            timeout = 0;
        pthread_mutex_unlock(&e->mu);
        mc = curl_multi_poll(e->multi, extra, nextra, (int)timeout, NULL);
        atomic_store(&e->wake_pending, 1);
        if (mc != CURLM_OK && mc != CURLM_UNRECOVERABLE_POLL) {
            fail_all(e, ESX_EINTERNAL, curl_multi_strerror(mc));
            break;
        }
        if (lidx >= 0 && extra[lidx].revents)
            esx_eng_accept_waiters(e);
        for (int i = e->nconns - 1; i >= 0; i--)
            esx_eng_read_waiter(e, i);
        if (eidx >= 0 && extra[eidx].revents && e->curl_watch)
            esx_eng_curl_events(e);
        else if (eidx >= 0 && extra[eidx].revents)
            esx_eng_h1_events(e, esx_now_ms());
    }
    if (atomic_load(&e->stop))
        fail_all(e, ESX_ECLOSED, "the client was closed");
    pthread_cleanup_pop(1);
    if (e->free_on_exit)
        free_rest(e); /* nobody else holds e: its client is gone and the thread detached */
    esx_eng_thread_gone();
    return NULL;
}

/* ---------------------------------------------------------------- public */

/* Frees an engine whose I/O thread never started, from esx_engine_new. */
static void free_early(esx_engine *e)
{
    if (e->epfd >= 0)
        close(e->epfd);
    free(e->pfd);
    explicit_bzero(e->auth, sizeof e->auth);
    explicit_bzero(&e->own_cfg, sizeof e->own_cfg);
    free(e);
}

esx_engine *esx_engine_new(const esx_config *cfg, const esx_engine *prev, char *why)
{
    if (esx_eng_exiting()) {
        /* exit() has stopped the I/O threads before OpenSSL's handler frees its state: a
         * new one (a collector's shipper healing its client) would run under that cleanup */
        snprintf(why, 256, "the process is exiting");
        return NULL;
    }
    esx_engine *e = calloc(1, sizeof *e);
    if (e == NULL) {
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    e->own_cfg = *cfg;
    e->own_cfg.n_headers = 0; /* the client's strings: requests carry their headers */
    memset(e->own_cfg.headers, 0, sizeof e->own_cfg.headers);
    e->cfg = &e->own_cfg;
    e->pid = esx_pid();
    e->generation = atomic_fetch_add(&next_generation, 1);
    e->rng = (unsigned)e->generation * 2654435761u ^ (unsigned)e->pid;
    atomic_init(&e->listen_fd, -1);
    atomic_init(&e->stale_listen_fd, -1);
    atomic_init(&e->sweep_due, 0);
    atomic_init(&e->alive, 0);
    atomic_init(&e->stop, 0);
    atomic_init(&e->kill, 0);
    atomic_init(&e->wake_pending, 1); /* awake until its first poll */
    atomic_init(&e->nwaiting, 0);
    atomic_init(&e->nopen, 0);
    if (prev) {
        e->nodes = prev->nodes;
        e->stats = prev->stats;
        e->stats.rebuilds++;
        for (int i = 0; i < e->nodes.n; i++)
            e->nodes.v[i].in_flight = e->nodes.v[i].probing = 0;
    } else {
        e->nodes = cfg->nodes;
    }
    /* ESX_TRANSPORT=curl: every node through libcurl (diagnostics, and the specs of that path) */
    const char *transport = getenv("ESX_TRANSPORT");
    int curl_only = transport && strcmp(transport, "curl") == 0;
    /* One transport per client: with some nodes through libcurl, all are.  Each transport
     * can close only its own idle connections, so two of them could not keep max_total. */
    int all_fast = !curl_only;
    for (int i = 0; i < e->nodes.n && all_fast; i++) {
        esx_eng_h1_node_setup(&e->h1n[i], e->nodes.v[i].url);
        all_fast = e->h1n[i].fast;
    }
    for (int i = 0; i < e->nodes.n && !all_fast; i++)
        e->h1n[i].fast = 0;
    if (cfg->username[0]) {
        char cred[sizeof cfg->username + sizeof cfg->password + 1];
        int n = snprintf(cred, sizeof cred, "%s:%s", cfg->username, cfg->password);
        memcpy(e->auth, "Basic ", 6);
        esx_base64_encode((const unsigned char *)cred, (size_t)n, e->auth + 6);
        explicit_bzero(cred, sizeof cred);
    }
    e->epfd = -1;
    e->cappfd = 8;
    e->pfd = malloc((size_t)e->cappfd * sizeof *e->pfd);
    if (e->pfd == NULL || pthread_mutex_init(&e->mu, NULL) != 0) {
        snprintf(why, 256, e->pfd ? "cannot create a mutex" : "out of memory");
        free_early(e);
        return NULL;
    }
    e->multi = curl_multi_init();
    if (e->multi == NULL) {
        pthread_mutex_destroy(&e->mu);
        free_early(e);
        snprintf(why, 256, "cannot create a curl multi handle");
        return NULL;
    }
    /* libcurl makes its wake-up socket pair here and carries on without one when the process
     * is out of descriptors: every submission would then wait out a whole poll (1 s), for
     * the engine's life.  Fail now instead (the byte written is read by the first poll); the
     * client is made, or rebuilt, by a later call. */
    if (curl_multi_wakeup(e->multi) != CURLM_OK) {
        int err = esx_eng_probe_local(1);
        curl_multi_cleanup(e->multi);
        pthread_mutex_destroy(&e->mu);
        free_early(e);
        snprintf(why, 256, "cannot create the I/O thread's wake-up socket pair: %s",
                 err ? strerror(err) : "unknown error");
        return NULL;
    }
    /* the h1 connections; with libcurl, its sockets for their peer's close (curl_watch) */
    e->curl_watch = !all_fast;
    if ((e->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0) {
        snprintf(why, 256, "cannot create the I/O thread's epoll instance: %s", strerror(errno));
        curl_multi_cleanup(e->multi);
        pthread_mutex_destroy(&e->mu);
        free_early(e);
        return NULL;
    }
    /* libcurl's limit is per host and port, esx's per node: nodes that share a host (path
     * prefixes behind one proxy) share libcurl's limit, which must never hold back a transfer
     * esx has given a slot -- it would wait in libcurl's queue, outside pool_timeout */
    curl_multi_setopt(e->multi, CURLMOPT_MAX_HOST_CONNECTIONS,
                      (long)cfg->max_per_route * esx_nodes_max_per_host(&e->nodes));
    curl_multi_setopt(e->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)cfg->max_total);
    curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS, (long)cfg->max_total);
    atomic_store(&e->alive, 1);
    esx_eng_thread_starting();
    if (esx_thread_start(&e->thread, io_main, e) != 0) {
        esx_eng_thread_gone();
        curl_multi_cleanup(e->multi);
        pthread_mutex_destroy(&e->mu);
        free_early(e);
        snprintf(why, 256, "cannot start the I/O thread");
        return NULL;
    }
    e->thread_started = 1;
    esx_eng_live_add(e);
    return e;
}

int esx_engine_submit(esx_engine *e, esx_request *req)
{
    if (atomic_load(&e->stop))
        return -1;
    esx_request_ref(req);
    int first = req->id == 0; /* not a request salvaged from a dead engine, counted there */
    if (first)
        req->id = atomic_fetch_add(&next_request_id, 1);
    req->gen = e->generation;
    req->next = NULL;
    req->state = ESX_REQ_NEW;
    pthread_mutex_lock(&e->mu);
    if (e->sub_tail)
        e->sub_tail->next = req;
    else
        e->sub_head = req;
    e->sub_tail = req;
    e->nsub++;
    e->stats.requests += first;
    pthread_mutex_unlock(&e->mu);
    if (!atomic_exchange(&e->wake_pending, 1))
        curl_multi_wakeup(e->multi); /* one system call per burst of submissions */
    return 0;
}

int esx_engine_healthy(const esx_engine *e)
{
    return atomic_load(&e->alive) && e->pid == esx_pid();
}

int esx_engine_ours(const esx_engine *e)
{
    return e->pid == esx_pid();
}

uint64_t esx_engine_generation(const esx_engine *e)
{
    return e->generation;
}

static void free_rest(esx_engine *e)
{
    for (int i = 0; i < e->nh1; i++) {
        esx_h1_conn_close(e->h1c[i]);
        free(e->h1c[i]);
    }
    free(e->h1c);
    free(e->pfd);
    if (e->epfd >= 0)
        close(e->epfd); /* (with what it watched) */
    explicit_bzero(e->auth, sizeof e->auth);
    for (int i = 0; i < e->nspare; i++)
        curl_easy_cleanup(e->spare[i]);
    curl_multi_cleanup(e->multi);
    for (int i = 0; i < e->nconns; i++)
        close(e->conns[i].fd);
    free(e->conns);
    int stale = atomic_load(&e->stale_listen_fd);
    if (stale >= 0)
        close(stale);
    int lfd = atomic_load(&e->listen_fd);
    if (lfd >= 0) {
        close(lfd);
        unlink(e->listen_path);
        char *slash = strrchr(e->listen_path, '/'); /* and its directory (mkdtemp's) */
        if (slash) {
            *slash = '\0';
            rmdir(e->listen_path);
        }
    }
    pthread_mutex_destroy(&e->mu);
    explicit_bzero(&e->own_cfg, sizeof e->own_cfg);
    free(e);
}

void esx_engine_free(esx_engine *e)
{
    if (e == NULL)
        return;
    esx_eng_live_remove(e);
    atomic_store(&e->stop, 1);
    if (pthread_equal(pthread_self(), e->thread)) {
        /* Called from a completion callback on the I/O thread itself: joining would fail
         * (EDEADLK) and freeing here would pull the loop's state from under it.  The loop
         * sees `stop` when the callback returns, fails what is left with "closed" and frees
         * the engine on its way out. */
        e->free_on_exit = 1;
        pthread_detach(e->thread);
        curl_multi_wakeup(e->multi);
        return;
    }
    curl_multi_wakeup(e->multi);
    pthread_join(e->thread, NULL);
    /* a thread that died early (internal failure) left work behind */
    fail_all(e, ESX_ECLOSED, "the client was closed");
    free_rest(e);
}

void esx_engine_salvage(esx_engine *e, esx_engine *to)
{
    esx_eng_live_remove(e);
    pthread_join(e->thread, NULL);
    esx_request *lists[4];
    pthread_mutex_lock(&e->mu);
    /* in the new engine's queue: the requests that were on the wire first (retries go to the
     * front), then those waiting for a slot, then those not yet taken */
    lists[2] = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    e->nsub = 0;
    pthread_mutex_unlock(&e->mu);
    atomic_store(&e->nwaiting, 0);
    lists[1] = e->wait_head;
    lists[0] = e->active;
    lists[3] = e->backoff;
    e->wait_head = e->wait_tail = e->active = e->backoff = NULL;
    for (int l = 0; l < 4; l++) {
        esx_request *req = lists[l];
        while (req) {
            esx_request *next = req->next;
            if (req->easy) {
                curl_multi_remove_handle(e->multi, req->easy);
                curl_easy_cleanup(req->easy);
                req->easy = NULL;
            }
            req->h1 = NULL; /* its connection is closed with the rest below */
            req->slot = 0;
            req->probe = 0; /* `to` starts with no probe out (esx_engine_new) */
            esx_inflate_end(&req->inflater);
            memset(&req->inflater, 0, sizeof req->inflater);
            req->node = -1;
            if (l == 0) {
                req->status = 0; /* a reply cut short by the thread's death is no answer */
                /* it may have reached its node: sending it again is a retry, when one is left;
                 * without, attempt passes max_retries and `to` fails it
                 * (esx_eng_take_submissions) */
                req->pool_deadline = 0; /* a retry waits for a slot anew */
                if (req->attempt < req->max_retries) {
                    req->retries++;
                    pthread_mutex_lock(&to->mu);
                    to->stats.retries++;
                    pthread_mutex_unlock(&to->mu);
                }
                req->attempt++;
            }
            if (esx_engine_submit(to, req) != 0) {
                esx_eng_finish(e, req, ESX_ECLOSED, "the client was closed");
            } else {
                esx_request_unref(req); /* `to` holds its own reference now */
            }
            req = next;
        }
    }
    free_rest(e);
}

void esx_engine_abandon(esx_engine *e)
{
    esx_eng_sock_prune(e); /* a stale entry's number may be another file's now */
    for (int i = 0; i < e->nsockets; i++)
        close(e->sockets[i].fd);
    /* The waiter socket only if its number is still that socket: a child that closed what it
     * inherited may have opened a file of its own under it (the path is the parent's: left).
     * The epoll instance is left open, as libcurl's wake-up pair is: an epoll descriptor
     * cannot be told from another one (they share one anonymous inode), and the parent's
     * watches are its own (no epoll_ctl on it here).  So are the waiter connections still
     * registering at the fork (accepted, their request id not read yet: a moment long),
     * whose identity is not kept. */
    int lfd = atomic_load(&e->listen_fd);
    struct stat st;
    if (lfd >= 0 && fstat(lfd, &st) == 0 && st.st_dev == e->listen_dev &&
        st.st_ino == e->listen_ino)
        close(lfd);
}

void esx_engine_stats(esx_engine *e, esx_stats *stats, esx_nodes *nodes)
{
    pthread_mutex_lock(&e->mu);
    *stats = e->stats;
    if (nodes)
        *nodes = e->nodes;
    int in_use = 0;
    for (int i = 0; i < e->nodes.n; i++)
        in_use += e->nodes.v[i].in_flight;
    /* counts only: the I/O thread's lists are its own (a request finished meanwhile is
     * freed under a walker's feet) */
    int waiting = e->nsub + atomic_load(&e->nwaiting);
    pthread_mutex_unlock(&e->mu);
    int open = atomic_load(&e->nopen);
    stats->in_use = in_use;
    stats->waiting = waiting;
    stats->open = open;
    stats->idle = open > in_use ? open - in_use : 0;
}

void esx_engine_debug_kill(esx_engine *e)
{
    atomic_store(&e->kill, 1);
    curl_multi_wakeup(e->multi);
}
