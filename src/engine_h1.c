/*
 * engine_h1.c -- the engine's own plain HTTP/1.1 connections (http:// nodes given by address,
 * h1conn.h): which connection serves a request, connect failures and timeouts, a kept-alive
 * connection the server closed, and the epoll instance that watches them.  The I/O thread's
 * (esx_eng_h1_node_setup: before it starts; engine_int.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>

#include "engine_int.h"
#include "version.h"

/* Fills hn from a node URL: fast when it is http:// with an IP address or "localhost" (no
 * name to resolve, which would block this thread; libcurl resolves asynchronously). */
void esx_eng_h1_node_setup(h1_node *hn, const char *url)
{
    memset(hn, 0, sizeof *hn);
    if (strncmp(url, "http://", 7) != 0)
        return;
    const char *authority = url + 7;
    size_t alen = strcspn(authority, "/");
    const char *prefix = authority + alen;
    if (alen == 0 || alen >= sizeof hn->host || strlen(prefix) >= sizeof hn->prefix)
        return;
    char host[sizeof hn->host];
    const char *port = NULL, *end = authority + alen;
    size_t hlen;
    if (authority[0] == '[') {
        const char *close = memchr(authority, ']', alen);
        if (close == NULL)
            return;
        hlen = (size_t)(close - authority - 1);
        memcpy(host, authority + 1, hlen);
        if (close + 1 < end) {
            if (close[1] != ':')
                return;
            port = close + 2;
        }
    } else {
        const char *colon = memchr(authority, ':', alen);
        hlen = colon ? (size_t)(colon - authority) : alen;
        memcpy(host, authority, hlen);
        if (colon)
            port = colon + 1;
    }
    host[hlen] = '\0';
    long portnum = 80;
    if (port) {
        if (port == end || end - port > 5)
            return;
        portnum = 0;
        for (const char *q = port; q < end; q++) {
            if (*q < '0' || *q > '9')
                return;
            portnum = portnum * 10 + (*q - '0');
        }
        if (portnum < 1 || portnum > 65535)
            return;
    }
    if (strcasecmp(host, "localhost") == 0) {
        /* 127.0.0.1 first, then ::1 (a server may listen on either), as libcurl would */
        memcpy(host, "127.0.0.1", sizeof "127.0.0.1"); /* host holds "localhost": as long */
        hn->alt.sin6_family = AF_INET6;
        hn->alt.sin6_port = htons((uint16_t)portnum);
        hn->alt.sin6_addr = in6addr_loopback;
        hn->has_alt = 1;
    }
    struct sockaddr_in *v4 = (struct sockaddr_in *)&hn->sa;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&hn->sa;
    if (inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)portnum);
        hn->salen = sizeof *v4;
    } else if (inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)portnum);
        hn->salen = sizeof *v6;
    } else {
        return;
    }
    memcpy(hn->host, authority, alen);
    hn->host[alen] = '\0';
    memcpy(hn->prefix, prefix, strlen(prefix) + 1); /* shorter than prefix[]: checked above */
    hn->fast = 1;
}

static int h1_on_header(void *ud, const char *line, size_t len)
{
    return esx_eng_record_header(ud, line, len);
}

static int h1_on_body(void *ud, const char *data, size_t len)
{
    return esx_eng_record_body(ud, data, len);
}

/* Closes c and forgets it. */
static void h1_remove(esx_engine *e, esx_h1_conn *c)
{
    if (c->fd >= 0) {
        if (c->watched)
            epoll_ctl(e->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        esx_eng_sock_forget(e, c->fd);
    }
    esx_h1_conn_close(c);
    for (int i = 0; i < e->nh1; i++) {
        if (e->h1c[i] == c) {
            e->h1c[i] = e->h1c[--e->nh1];
            break;
        }
    }
    free(c);
}

/* A connection dropped with its request unfinished (timeouts, failures, shutdown). */
void esx_eng_h1_drop(esx_engine *e, esx_h1_conn *c)
{
    c->req = NULL;
    h1_remove(e, c);
}

/* A new connection to node, connecting.  A socket that could not be opened or a connect
 * that failed at once is kept in c->error (an errno, or ESX_ESOCKTABLE) and reported by
 * esx_eng_h1_service.  Returns NULL when out of memory. */
static esx_h1_conn *h1_open(esx_engine *e, int node, int64_t now)
{
    const h1_node *hn = &e->h1n[node];
    if (e->nh1 == e->caph1) {
        int cap = e->caph1 ? e->caph1 * 2 : 16;
        esx_h1_conn **v = realloc(e->h1c, (size_t)cap * sizeof *v);
        if (v == NULL)
            return NULL;
        e->h1c = v;
        e->caph1 = cap;
    }
    esx_h1_conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->fd = -1;
    esx_buf_init(&c->head, ESX_MAX_HEAD);
    c->alt = hn->has_alt && hn->use_alt;
    const struct sockaddr *sa = c->alt ? (const struct sockaddr *)&hn->alt
                                       : (const struct sockaddr *)&hn->sa;
    socklen_t salen = c->alt ? (socklen_t)sizeof hn->alt : hn->salen;
    if (e->nsockets >= MAX_SOCKETS)
        esx_eng_sock_prune(e); /* stale entries (engine.c) must not refuse a socket */
    if (e->nsockets >= MAX_SOCKETS)
        c->error = ESX_ESOCKTABLE;
    else if (esx_h1_conn_open(c, node, sa, salen) < 0)
        c->error = errno;
    else
        esx_eng_sock_register(e, c->fd);
    c->node = node;
    c->state = ESX_H1C_CONNECTING;
    c->connect_deadline = e->cfg->connect_timeout > 0 ? now + e->cfg->connect_timeout : 0;
    if (c->error)
        e->h1_kick = 1;
    e->h1c[e->nh1++] = c;
    return c;
}

/* Gives req to connection c (idle or connecting).  Returns 0, or -1 when out of memory. */
static int h1_attach(esx_engine *e, esx_h1_conn *c, esx_request *req)
{
    const h1_node *hn = &e->h1n[c->node];
    if (esx_h1_request_head(&c->head, req->method, hn->prefix, req->target, hn->host,
                            "esx/" ESX_VERSION, e->cfg->compression, e->auth[0] ? e->auth : NULL,
                            req->headers, req->body != NULL, req->body_len) != 0)
        return -1;
    c->body = req->body;
    c->body_len = req->body ? req->body_len : 0;
    c->sent = c->got = 0;
    req->ul_seen = 0; /* counted per connection: a reopened one sends the body again */
    c->reusable = 0;
    esx_h1_parser_init(&c->parser, strcmp(req->method, "HEAD") == 0, h1_on_header, h1_on_body,
                       req);
    c->req = req;
    req->h1 = c;
    if (c->state == ESX_H1C_IDLE)
        c->state = ESX_H1C_SENDING;
    e->h1_kick = 1; /* sent by esx_eng_h1_service before the next poll */
    return 0;
}

int esx_eng_h1_start(esx_engine *e, esx_request *req, int node_index, int64_t now)
{
    esx_h1_conn *c = NULL;
    for (int i = e->nh1 - 1; i >= 0 && c == NULL; i--) {
        esx_h1_conn *k = e->h1c[i];
        if (k->state != ESX_H1C_IDLE || k->node != node_index)
            continue;
        /* Bytes that came since the last poll (the rest of a faulty answer, written just after
         * it) would be read as this request's answer: look at the socket once more (a recv of
         * ~0.5 us, against the 30-50 us of CPU a search costs).  Bytes still in flight when
         * the request leaves are HTTP/1.1's own race. */
        if (esx_h1_conn_stale(k))
            h1_remove(e, k); /* (swaps in the last one, already looked at) */
        else
            c = k;
    }
    if (c == NULL) {
        /* max_total bounds open connections: make room by closing an idle one elsewhere */
        for (int i = 0; i < e->nh1 && e->nsockets >= e->cfg->max_total; i++) {
            if (e->h1c[i]->state == ESX_H1C_IDLE) {
                h1_remove(e, e->h1c[i]);
                break;
            }
        }
        c = h1_open(e, node_index, now);
        if (c && h1_attach(e, c, req) != 0) {
            h1_remove(e, c);
            c = NULL;
        }
    } else if (h1_attach(e, c, req) != 0) {
        c = NULL;
    }
    if (c == NULL) {
        esx_eng_finish(e, req, ESX_EINTERNAL,
                       "cannot prepare the request (head over 1 MiB, or out of memory)");
        return -1;
    }
    return 0;
}

/* Ends the attempt on c's request with a transport failure. */
static void h1_fail(esx_engine *e, esx_h1_conn *c, const char *kind, int node_dead,
                    const char *why, int64_t now)
{
    esx_request *req = c->req;
    int node = c->node;
    char msg[256];
    snprintf(msg, sizeof msg, "%.60s (%.180s)", why, esx_request_node(req));
    esx_eng_list_remove(&e->active, req);
    esx_eng_release_attempt(e, req); /* closes c */
    esx_eng_on_failure(e, req, node, kind, node_dead, 1, msg, now);
}

/* A connect that did not finish within connect_timeout (c's request is off the active list). */
void esx_eng_h1_fail_detached(esx_engine *e, esx_h1_conn *c, const char *kind, int64_t now)
{
    esx_request *req = c->req;
    int node = c->node;
    char msg[256];
    snprintf(msg, sizeof msg, "connection timed out after %lld ms (%.180s)",
             (long long)e->cfg->connect_timeout, esx_request_node(req));
    esx_eng_release_attempt(e, req);
    esx_eng_on_failure(e, req, node, kind, 1, 1, msg, now);
}

/* Moves c's request, within the same attempt and slot, to a fresh connection to the same
 * node; c is closed.  Returns the new connection, or NULL with the request finished
 * ("internal": out of memory). */
static esx_h1_conn *h1_reopen(esx_engine *e, esx_h1_conn *c, int64_t now)
{
    esx_request *req = c->req;
    int node = c->node;
    esx_eng_h1_drop(e, c);
    req->h1 = NULL;
    esx_h1_conn *n = h1_open(e, node, now);
    if (n && h1_attach(e, n, req) == 0)
        return n;
    if (n)
        h1_remove(e, n);
    esx_eng_list_remove(&e->active, req);
    esx_eng_release_attempt(e, req);
    esx_eng_finish(e, req, ESX_EINTERNAL, "out of memory reconnecting");
    return NULL;
}

static void h1_connect_failed(esx_engine *e, esx_h1_conn *c, int err, int64_t now)
{
    esx_request *req = c->req;
    if (req == NULL) {
        h1_remove(e, c);
        return;
    }
    if (esx_eng_local_errno(err)) {
        /* no socket here (out of descriptors or memory): not the node's failure, and the
         * node's other address would fail the same way */
        int node = c->node;
        esx_eng_list_remove(&e->active, req);
        esx_eng_release_attempt(e, req); /* closes c */
        esx_eng_on_local_failure(e, req, node, err, "cannot open a socket", now);
        return;
    }
    h1_node *hn = &e->h1n[c->node];
    if (hn->has_alt && !c->tried_other) {
        /* "localhost" refused on one loopback address: the same attempt tries the other */
        hn->use_alt = !c->alt;
        esx_h1_conn *n = h1_reopen(e, c, now);
        if (n)
            n->tried_other = 1;
        return;
    }
    char why[96];
    snprintf(why, sizeof why, "cannot connect: %s", strerror(err));
    h1_fail(e, c, ESX_ECONNECT, 1, why, now);
}

/* The connection broke (reset, closed early, write error). */
static void h1_broken(esx_engine *e, esx_h1_conn *c, const char *why, int64_t now)
{
    esx_request *req = c->req;
    if (req == NULL) {
        h1_remove(e, c);
        return;
    }
    if (c->served > 0 && c->got == 0 && !req->h1_redone) {
        /* A kept-alive connection the server had closed: the request goes once more, on a
         * fresh connection, without counting as a retry (as libcurl does). */
        req->h1_redone = 1;
        h1_reopen(e, c, now);
        return;
    }
    char text[128];
    snprintf(text, sizeof text, "connection broken: %s", why ? why : "closed");
    h1_fail(e, c, ESX_ERESET, 1, text, now);
}

static int h1_recv(esx_engine *e, esx_h1_conn *c, int64_t now);

static void h1_send(esx_engine *e, esx_h1_conn *c, int64_t now)
{
    esx_request *req = c->req;
    size_t before = c->sent;
    int rc = esx_h1_conn_send(c);
    if (c->sent > c->head.len)
        req->ul_seen = (long long)(c->sent - c->head.len); /* body bytes out: stats().bytes */
    if (rc < 0) {
        if (errno == EPIPE || errno == ECONNRESET) {
            /* the server may have answered early and closed (a 413 to a big bulk): read it */
            c->state = ESX_H1C_READING;
            h1_recv(e, c, now);
            return;
        }
        h1_broken(e, c, strerror(errno), now);
        return;
    }
    if (c->sent != before)
        req->last_activity = now; /* upload progress counts for the silence watchdog */
    if (rc > 0)
        c->state = ESX_H1C_READING;
}

/* Reads what c has.  Returns 1 when c is still waiting for more, 0 when the attempt on it
 * ended (c may be freed). */
static int h1_recv(esx_engine *e, esx_h1_conn *c, int64_t now)
{
    const char *why = NULL;
    size_t got = c->got;
    int rc = esx_h1_conn_recv(c, e->rbuf, sizeof e->rbuf, &why);
    esx_request *req = c->req;
    if (rc == ESX_H1_MORE) {
        if (c->got != got)
            req->last_activity = now; /* bytes, even of a line not whole yet, end a silence */
        return 1;
    }
    if (rc == ESX_H1C_BROKEN) {
        h1_broken(e, c, why, now);
        return 0;
    }
    int node = c->node;
    if (rc == ESX_H1_DONE) {
        int truncated = req->resp_gzip && req->wire_in > 0 && !req->inflater.finished;
        int keep = c->reusable && c->sent == c->head.len + c->body_len &&
                   !esx_h1_asks_close(req->headers);
        req->status = c->parser.status;
        c->served++;
        c->req = NULL;
        c->body = NULL;
        req->h1 = NULL;
        if (keep)
            c->state = ESX_H1C_IDLE;
        else
            h1_remove(e, c);
        esx_eng_list_remove(&e->active, req);
        esx_eng_release_attempt(e, req);
        esx_eng_on_response(e, req, node, truncated, now);
        return 0;
    }
    if (rc == ESX_H1_ERROR && !c->parser.head_too_big && !c->parser.bad_coding) {
        char text[128];
        snprintf(text, sizeof text, "bad HTTP response: %s", c->parser.error);
        h1_fail(e, c, ESX_ERESET, 1, text, now);
        return 0;
    }
    if (rc == ESX_H1_ABORT && req->abort_kind && strcmp(req->abort_kind, ESX_ERESET) == 0) {
        /* framing the header callback refused (esx_eng_record_header): a bad reply, as h1.c's
         * own refusals above and as engine_curl.c treats it -- retried, the node marked */
        h1_fail(e, c, ESX_ERESET, 1, req->abort_msg, now);
        return 0;
    }
    /* a callback stopped (body too big, bad gzip), the headers are too big, or a transfer
     * coding esx does not decode: the node answered, the bytes cannot be read */
    const char *kind = rc == ESX_H1_ABORT ? req->abort_kind : ESX_EDECODE;
    req->status = c->parser.status; /* (0 before the status line) err.status */
    char msg[160];
    snprintf(msg, sizeof msg, "%s", rc == ESX_H1_ABORT ? req->abort_msg : c->parser.error);
    esx_eng_list_remove(&e->active, req);
    esx_eng_release_attempt(e, req);
    esx_eng_finish(e, req, kind, "%s", msg);
    return 0;
}

/* Work that needs no wait: connects that failed at once, and requests given to connected
 * connections.  Iterates downwards: removing swaps the last connection in, adding appends. */
void esx_eng_h1_service(esx_engine *e, int64_t now)
{
    if (!e->h1_kick)
        return;
    e->h1_kick = 0;
    for (int i = e->nh1 - 1; i >= 0; i--) {
        if (i >= e->nh1)
            continue;
        esx_h1_conn *c = e->h1c[i];
        if (c->error)
            h1_connect_failed(e, c, c->error, now);
        else if (c->state == ESX_H1C_SENDING && c->req && c->sent == 0)
            h1_send(e, c, now);
    }
}

/* The events c's state needs watched. */
static unsigned h1_wants(const esx_h1_conn *c)
{
    if (c->state == ESX_H1C_CONNECTING)
        return EPOLLOUT;
    if (c->state == ESX_H1C_SENDING)
        return EPOLLIN | EPOLLOUT;
    return EPOLLIN; /* reading, or idle: a close or stray bytes end an idle connection */
}

int esx_eng_h1_watch(esx_engine *e)
{
    int ended = 0;
    for (int i = e->nh1 - 1; i >= 0; i--) {
        if (i >= e->nh1)
            continue;
        esx_h1_conn *c = e->h1c[i];
        unsigned want = h1_wants(c);
        if (c->fd < 0 || want == c->watched)
            continue;
        struct epoll_event ev = {.events = want, .data.ptr = c};
        if (epoll_ctl(e->epfd, c->watched ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, c->fd, &ev) == 0) {
            c->watched = want;
            continue;
        }
        /* (ENOMEM, or ENOSPC past fs.epoll.max_user_watches) a connection nobody watches
         * would sit until connect_timeout or socket_timeout, blamed on its node */
        int err = errno;
        esx_request *req = c->req;
        ended++;
        if (req == NULL) {
            h1_remove(e, c);
            continue;
        }
        esx_eng_list_remove(&e->active, req);
        esx_eng_release_attempt(e, req); /* closes c */
        esx_eng_finish(e, req, ESX_EINTERNAL, "cannot watch the connection: %s (%.180s)",
                       strerror(err), esx_request_node(req));
    }
    return ended;
}

void esx_eng_h1_events(esx_engine *e, int64_t now)
{
    /* Every ready connection is marked before any is handled, 64 at a time: one left for the
     * next pass could see its request expire with the answer waiting.  (Level-triggered, a
     * batch may repeat one: the walk stops after as many events as connections.) */
    struct epoll_event ev[64];
    int n, seen = 0;
    do {
        n = epoll_wait(e->epfd, ev, (int)(sizeof ev / sizeof ev[0]), 0);
        for (int i = 0; i < n; i++) {
            esx_h1_conn *c = ev[i].data.ptr;
            /* an error or hang-up is read (or, connecting, looked up) as the recv or the
             * getsockopt that follows tells it */
            c->ready = ev[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP) ? EPOLLIN : 0;
            c->ready |= ev[i].events & (EPOLLOUT | EPOLLERR) ? EPOLLOUT : 0;
        }
        seen += n > 0 ? n : 0;
    } while (n == (int)(sizeof ev / sizeof ev[0]) && seen < e->nh1);
    if (seen == 0)
        return;
    /* handled in a walk of the connections, not of ev: handling one may free another */
    for (int i = e->nh1 - 1; i >= 0; i--) {
        if (i >= e->nh1)
            continue;
        esx_h1_conn *c = e->h1c[i];
        unsigned rev = c->ready;
        c->ready = 0;
        if (!rev)
            continue;
        switch (c->state) {
        case ESX_H1C_CONNECTING: {
            int err = esx_h1_conn_connected(c);
            if (err) {
                h1_connect_failed(e, c, err, now);
            } else if (c->req) {
                ((esx_request *)c->req)->last_activity = now; /* silence counts from here */
                c->state = ESX_H1C_SENDING;
                h1_send(e, c, now);
            } else {
                c->state = ESX_H1C_IDLE;
            }
            break;
        }
        case ESX_H1C_IDLE:
            h1_remove(e, c); /* the server closed it, or sent what nobody asked for */
            break;
        case ESX_H1C_SENDING:
            if ((rev & EPOLLIN) && !h1_recv(e, c, now))
                break; /* an early answer (or a close) ended the attempt */
            if ((rev & EPOLLOUT) && c->state == ESX_H1C_SENDING)
                h1_send(e, c, now);
            break;
        default:
            h1_recv(e, c, now);
            break;
        }
    }
}
