/*
 * engine.c -- the I/O thread, libcurl multi, connection slots and deadlines (see engine.h).
 *
 * Threading: `mu` guards the submission queue, the counters and the node states (which the
 * Lua side reads for stats).  Everything else -- the multi handle, the easy handles, the
 * waiting/active/back-off lists, the socket table and the waiter connections -- belongs to
 * the I/O thread alone; other threads read only the counts it keeps (nwaiting, nopen).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base64.h"
#include "clock.h"
#include "engine.h"
#include "h1conn.h"
#include "proc.h"
#include "retry_after.h"
#include "version.h"

const char *const esx_failure_kinds[ESX_NKINDS] = {
    ESX_EPOOL_TIMEOUT, ESX_ECONNECT_TIMEOUT, ESX_ECONNECT,  ESX_ERESET,  ESX_ESOCKET_TIMEOUT,
    ESX_EREQUEST_TIMEOUT, ESX_EDECODE,      ESX_ENO_NODES, ESX_ECLOSED, ESX_EINTERNAL,
};

#define MAX_SOCKETS 1024
#define MAX_SPARE_EASY 32
#define MAX_WAITER_CONNS 4096
#define MAX_POLL_MS 1000
#define RETRY_AFTER_CAP_MS 30000
#define BACKOFF_BASE_MS 100
#define BACKOFF_CAP_MS 10000

typedef struct waiter_conn {
    int fd;
    int len;
    char buf[32];
} waiter_conn;

/* How the engine reaches a node over plain HTTP/1.1 (h1.h); fast = 0: through libcurl. */
typedef struct h1_node {
    int fast;
    struct sockaddr_storage sa;
    socklen_t salen;
    struct sockaddr_in6 alt; /* "localhost": [::1], tried when 127.0.0.1 refuses */
    int has_alt, use_alt;    /* use_alt: the last connect that worked went to alt */
    char host[300];   /* the Host header: the URL's authority */
    char prefix[512]; /* the URL's path prefix ("" or "/prefix") */
} h1_node;

struct esx_engine {
    const esx_config *cfg;      /* &own_cfg */
    esx_config own_cfg;         /* a copy: the client may be freed before its engine (below) */
    pthread_mutex_t mu;
    pthread_t thread;
    int thread_started;
    int free_on_exit;           /* I/O thread only: esx_engine_free was called on this thread
                                 * (a completion callback dropped the client's last
                                 * reference); the thread frees the engine when its loop ends */
    atomic_int alive;
    atomic_int stop;
    atomic_int kill;
    atomic_int wake_pending;    /* the I/O thread is awake, or a wakeup is on its way:
                                 * submitters need not send another */
    pid_t pid;
    uint64_t generation;
    CURLM *multi;

    /* under mu */
    esx_request *sub_head, *sub_tail;
    int nsub;                   /* requests on the submission queue */
    esx_nodes nodes;
    esx_stats stats;

    /* I/O thread only */
    esx_request *wait_head, *wait_tail; /* FIFO waiting for a slot */
    int64_t wait_due;           /* no waiting request is due (deadline, pool_deadline) before
                                 * this; 0 when none waits.  A lower bound: a request leaving
                                 * for a connection does not raise it, the next walk of the
                                 * list in expire() recomputes it.  So neither expire() nor
                                 * next_wakeup() walks a long queue on every loop. */
    esx_request *active;
    esx_request *backoff;
    int in_use;
    int sockets[MAX_SOCKETS];
    int nsockets;

    /* kept by the I/O thread for esx_engine_stats, which must never walk its lists */
    atomic_int nwaiting;        /* requests on the wait list (added under mu when taken from
                                 * the submission queue, so a request is always counted once) */
    atomic_int nopen;           /* = nsockets */
    CURL *spare[MAX_SPARE_EASY];
    int nspare;
    waiter_conn *conns;
    int nconns, capconns;
    unsigned int rng;
    h1_node h1n[ESX_MAX_NODES];
    esx_h1_conn **h1c;       /* every plain HTTP/1.1 connection, busy or idle */
    int nh1, caph1;
    int h1_kick;             /* a connection has work to do before the next poll */
    char auth[700];          /* "Basic ..." for h1 connections, "" without credentials */
    struct curl_waitfd *pfd; /* poll set beyond libcurl's own sockets */
    int cappfd;
    char rbuf[64 * 1024];    /* read scratch for h1 connections */

    /* set by any thread once, read by the I/O thread */
    atomic_int listen_fd;
    char listen_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

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

static void list_remove(esx_request **head, esx_request *req)
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

/* Appends a request taken from the submission queue (take_submissions counted it). */
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

/* Wakes one waiter connection (it reads the byte and checks the request) and closes it. */
static void poke_fd(int fd)
{
    ssize_t w = write(fd, "1", 1);
    (void)w; /* a waiter that went away needs no wake-up */
    close(fd);
}

/* Wakes every waiter of a finished request. */
static void poke_watchers(esx_request *req)
{
    for (int i = 0; i < req->nwatchers; i++)
        poke_fd(req->watchers[i]);
    req->nwatchers = 0;
}

/* Adds waiter connection fd to unfinished req.  Waiters that went away (a timed-out await:
 * the peer closed, so the fd polls readable) are dropped first.  Every live waiter is kept:
 * waking one early would have it register again and wake the next, in a loop that lasts as
 * long as the request (the process's descriptor limit bounds them).  Without memory for one
 * more, the new waiter is woken at once (it finds the request unfinished and comes back). */
static void add_watcher(esx_request *req, int fd)
{
    int n = req->nwatchers;
    struct pollfd small[16];
    struct pollfd *pfd = n <= 16 ? small : malloc((size_t)n * sizeof *pfd);
    if (n > 0 && pfd != NULL) {
        for (int i = 0; i < n; i++)
            pfd[i] = (struct pollfd){.fd = req->watchers[i], .events = POLLIN};
        if (poll(pfd, (nfds_t)n, 0) > 0) {
            int kept = 0;
            for (int i = 0; i < n; i++) {
                if (pfd[i].revents)
                    close(req->watchers[i]); /* a waiter sends nothing more: this is its end */
                else
                    req->watchers[kept++] = req->watchers[i];
            }
            req->nwatchers = kept;
        }
    }
    if (pfd != small)
        free(pfd);
    if (req->nwatchers == req->watchers_cap) {
        int cap = req->watchers_cap ? req->watchers_cap * 2 : 4;
        int *w = realloc(req->watchers, (size_t)cap * sizeof *w);
        if (w == NULL) {
            poke_fd(fd);
            return;
        }
        req->watchers = w;
        req->watchers_cap = cap;
    }
    req->watchers[req->nwatchers++] = fd;
}

/* Ends a request: records the outcome, wakes its waiters, drops the engine's reference.
 * kind NULL means the request ends with the HTTP response it holds. */
static void finish(esx_engine *e, esx_request *req, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void finish(esx_engine *e, esx_request *req, const char *kind, const char *fmt, ...)
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
    poke_watchers(req);
    esx_request_unref(req);
}

/* ---------------------------------------------------------------- curl callbacks */

static void abort_with(esx_request *req, const char *kind, const char *msg)
{
    req->abort_kind = kind;
    snprintf(req->abort_msg, sizeof req->abort_msg, "%s", msg);
}

/* One response header line (with or without its line end); the status line starts a new
 * response.  Returns 0 when the request was aborted (headers too big). */
static int record_header(esx_request *req, const char *buf, size_t len)
{
    req->last_activity = esx_now_ms();
    if (len >= 5 && memcmp(buf, "HTTP/", 5) == 0) {
        /* a new response (after 1xx): forget the previous headers */
        esx_buf_reset(&req->resp_headers);
        req->resp_gzip = 0;
        return 1;
    }
    size_t end = len;
    while (end && (buf[end - 1] == '\r' || buf[end - 1] == '\n'))
        end--;
    const char *colon = memchr(buf, ':', end);
    if (end == 0 || colon == NULL)
        return len;
    size_t nlen = (size_t)(colon - buf);
    const char *v = colon + 1;
    while (v < buf + end && (*v == ' ' || *v == '\t'))
        v++;
    size_t vlen = (size_t)(buf + end - v);
    char name[64];
    if (nlen == 0 || nlen >= sizeof name)
        return 1; /* no header esx reads has a name this long; skip it */
    for (size_t i = 0; i < nlen; i++) {
        char c = buf[i];
        name[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    name[nlen] = '\0';
    if (strcmp(name, "content-encoding") == 0 && vlen >= 4 && strncasecmp(v, "gzip", 4) == 0)
        req->resp_gzip = 1;
    size_t at = req->resp_headers.len;
    if (esx_buf_append(&req->resp_headers, name, nlen) != ESX_BUF_OK ||
        esx_buf_append(&req->resp_headers, ": ", 2) != ESX_BUF_OK ||
        esx_buf_append(&req->resp_headers, v, vlen) != ESX_BUF_OK ||
        esx_buf_append(&req->resp_headers, "\n", 1) != ESX_BUF_OK) {
        abort_with(req, ESX_EDECODE, "response headers exceed 64 KiB");
        return 0;
    }
    /* RFC 9110 5.5: a NUL in a field is replaced by SP (it would end the list here) */
    for (size_t i = at; i < req->resp_headers.len; i++)
        if (req->resp_headers.data[i] == '\0')
            req->resp_headers.data[i] = ' ';
    return 1;
}

static size_t on_header(char *buf, size_t size, size_t n, void *ud)
{
    return record_header(ud, buf, size * n) ? size * n : 0;
}

/* Response body bytes as they came on the wire.  Returns 0 when the request was aborted
 * (too big, corrupt gzip, out of memory). */
static int record_body(esx_request *req, const char *buf, size_t len)
{
    req->last_activity = esx_now_ms();
    req->wire_in += len;
    int rc;
    if (req->resp_gzip) {
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

static size_t on_body(char *buf, size_t size, size_t n, void *ud)
{
    return record_body(ud, buf, size * n) ? size * n : 0;
}

/* libcurl has a connection for the transfer (new, or reused): socket silence counts from now. */
static int on_prereq(void *ud, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port,
                     int conn_local_port)
{
    esx_request *req = ud;
    (void)conn_primary_ip, (void)conn_local_ip, (void)conn_primary_port, (void)conn_local_port;
    req->curl_connecting = 0;
    req->last_activity = esx_now_ms();
    return CURL_PREREQFUNC_OK;
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    esx_request *req = ud;
    /* upload progress counts as activity for the silence watchdog */
    if ((long long)ulnow != req->ul_seen) {
        req->ul_seen = (long long)ulnow;
        req->last_activity = esx_now_ms();
    }
    return 0;
}

/* The engine's table of open sockets (libcurl's and its own), for stats and fork. */
static int sock_register(esx_engine *e, int fd)
{
    if (e->nsockets >= MAX_SOCKETS)
        return -1;
    e->sockets[e->nsockets++] = fd;
    atomic_store(&e->nopen, e->nsockets);
    return 0;
}

static void sock_forget(esx_engine *e, int fd)
{
    for (int i = 0; i < e->nsockets; i++) {
        if (e->sockets[i] == fd) {
            e->sockets[i] = e->sockets[--e->nsockets];
            atomic_store(&e->nopen, e->nsockets);
            break;
        }
    }
}

static curl_socket_t on_open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *addr)
{
    esx_engine *e = ud;
    if (e->nsockets >= MAX_SOCKETS)
        return CURL_SOCKET_BAD;
    int fd = socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
    if (fd < 0)
        return CURL_SOCKET_BAD;
    sock_register(e, fd);
    return fd;
}

static int on_close_socket(void *ud, curl_socket_t fd)
{
    sock_forget(ud, fd);
    return close(fd);
}

/* ---------------------------------------------------------------- attempts */

static void h1_drop(esx_engine *e, esx_h1_conn *c);

/* Ends the running attempt's use of its transfer and connection slot.  A plain HTTP/1.1
 * connection still attached is mid-request and is closed. */
static void release_attempt(esx_engine *e, esx_request *req)
{
    if (req->easy) {
        curl_multi_remove_handle(e->multi, req->easy);
        if (e->nspare < MAX_SPARE_EASY)
            e->spare[e->nspare++] = req->easy;
        else
            curl_easy_cleanup(req->easy);
        req->easy = NULL;
    }
    if (req->h1) {
        h1_drop(e, req->h1);
        req->h1 = NULL;
    }
    if (req->slot) {
        req->slot = 0;
        e->in_use--;
        if (req->node >= 0) {
            pthread_mutex_lock(&e->mu);
            e->nodes.v[req->node].in_flight--;
            e->stats.received_wire += req->wire_in;
            e->stats.received_raw += req->resp_body.len;
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
    req->resp_gzip = 0;
    req->wire_in = 0;
    req->ul_seen = 0;
    req->status = 0;
    req->abort_kind = NULL;
}

static int setup_easy(esx_engine *e, esx_request *req, const esx_node *node, int64_t now)
{
    const esx_config *cfg = e->cfg;
    CURL *h = req->easy;
    size_t ulen = strlen(node->url), tlen = strlen(req->target);
    char *url = malloc(ulen + tlen + 1);
    if (url == NULL)
        return -1;
    memcpy(url, node->url, ulen);
    memcpy(url + ulen, req->target, tlen + 1);
    CURLcode rc = curl_easy_setopt(h, CURLOPT_URL, url);
    free(url);
    if (rc != CURLE_OK)
        return -1;
    curl_easy_setopt(h, CURLOPT_PRIVATE, req);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    if (strcmp(req->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (req->body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, req->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
        if (strcmp(req->method, "POST") != 0)
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
    } else if (strcmp(req->method, "GET") != 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req->method);
        if (strcmp(req->method, "POST") == 0 || strcmp(req->method, "PUT") == 0) {
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
        }
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, req->headers);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, req);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, req);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, req);
    curl_easy_setopt(h, CURLOPT_PREREQFUNCTION, on_prereq);
    curl_easy_setopt(h, CURLOPT_PREREQDATA, req);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, on_open_socket);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, e);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETFUNCTION, on_close_socket);
    curl_easy_setopt(h, CURLOPT_CLOSESOCKETDATA, e);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    /* Nodes are given explicitly: no proxy from the environment (and no getenv per call). */
    curl_easy_setopt(h, CURLOPT_PROXY, "");
    curl_easy_setopt(h, CURLOPT_USERAGENT, "esx/" ESX_VERSION);
    if (cfg->compression) {
        /* ask for gzip, but inflate ourselves: bounded, and counted on both sides */
        curl_easy_setopt(h, CURLOPT_ACCEPT_ENCODING, "gzip");
        curl_easy_setopt(h, CURLOPT_HTTP_CONTENT_DECODING, 0L);
    }
    if (cfg->connect_timeout > 0)
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)cfg->connect_timeout);
    /* The loop enforces every deadline itself; this is only a backstop. */
    if (req->deadline > 0)
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(req->deadline - now + 250));
    if (cfg->username[0]) {
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
        curl_easy_setopt(h, CURLOPT_USERNAME, cfg->username);
        curl_easy_setopt(h, CURLOPT_PASSWORD, cfg->password);
    }
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, cfg->tls_verify ? 1L : 0L);
    curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, cfg->tls_verify ? 2L : 0L);
    if (cfg->ca_file[0])
        curl_easy_setopt(h, CURLOPT_CAINFO, cfg->ca_file);
    return 0;
}

/* Prepares a libcurl transfer for req on node.  Returns 0, or -1 with req finished. */
static int curl_start(esx_engine *e, esx_request *req, const esx_node *node, int64_t now)
{
    req->easy = e->nspare ? e->spare[--e->nspare] : curl_easy_init();
    if (req->easy == NULL) {
        finish(e, req, ESX_EINTERNAL, "out of memory creating a transfer");
        return -1;
    }
    curl_easy_reset(req->easy);
    if (setup_easy(e, req, node, now) != 0) {
        curl_easy_cleanup(req->easy);
        req->easy = NULL;
        finish(e, req, ESX_EINTERNAL, "out of memory preparing a transfer");
        return -1;
    }
    req->curl_connecting = 1;
    CURLMcode mc = curl_multi_add_handle(e->multi, req->easy);
    if (mc != CURLM_OK) {
        curl_easy_cleanup(req->easy);
        req->easy = NULL;
        finish(e, req, ESX_EINTERNAL, "cannot start a transfer: %s", curl_multi_strerror(mc));
        return -1;
    }
    return 0;
}

static int h1_start(esx_engine *e, esx_request *req, int node_index, int64_t now);

/* Starts req on node, over plain HTTP/1.1 or libcurl; on failure the request is finished
 * with "internal". */
static void start_attempt(esx_engine *e, esx_request *req, int node_index, int64_t now)
{
    esx_node *node = &e->nodes.v[node_index];
    reset_response(req);
    req->h1_redone = 0;
    int rc = e->h1n[node_index].fast ? h1_start(e, req, node_index, now)
                                     : curl_start(e, req, node, now);
    if (rc != 0)
        return;
    e->in_use++;
    req->slot = 1;
    req->node = node_index;
    req->tried |= 1ULL << node_index;
    req->state = ESX_REQ_ACTIVE;
    req->last_activity = now;
    esx_request_set_node(req, node->url);
    pthread_mutex_lock(&e->mu);
    node->in_flight++;
    node->requests++;
    e->stats.sent_raw += req->body_raw_len;
    e->stats.sent_wire += req->body_len;
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

static void mark_node(esx_engine *e, int node_index, int ok, int64_t now)
{
    if (node_index < 0)
        return;
    pthread_mutex_lock(&e->mu);
    esx_node *node = &e->nodes.v[node_index];
    if (ok)
        esx_node_succeeded(node);
    else
        esx_node_failed(node, now, e->cfg->dead_backoff_min, e->cfg->dead_backoff_max);
    pthread_mutex_unlock(&e->mu);
}

static int64_t backoff_429(esx_engine *e, esx_request *req)
{
    char value[128];
    if (esx_request_header(req, "retry-after", value, sizeof value)) {
        int64_t ms = esx_retry_after_ms(value, strlen(value), esx_wall_ms());
        if (ms >= 0)
            return ms;
    }
    int64_t base = BACKOFF_BASE_MS;
    for (int i = 1; i < req->n429 && base < BACKOFF_CAP_MS; i++)
        base *= 2;
    if (base > BACKOFF_CAP_MS)
        base = BACKOFF_CAP_MS;
    /* "equal jitter": half fixed, half random, so retries of many callers spread out */
    e->rng = e->rng * 1103515245u + 12345u;
    return base / 2 + (int64_t)((e->rng >> 8) % (unsigned)(base / 2 + 1));
}

static const char *transport_kind(CURLcode rc, CURL *h, int *node_dead, int *retryable)
{
    curl_off_t connect_time = 0;
    curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &connect_time);
    *node_dead = 1;
    *retryable = 1;
    switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
        return ESX_ECONNECT;
    case CURLE_OPERATION_TIMEDOUT:
        if (connect_time == 0)
            return ESX_ECONNECT_TIMEOUT;
        *node_dead = *retryable = 0;
        return ESX_EREQUEST_TIMEOUT;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
        return ESX_ERESET;
    case CURLE_OUT_OF_MEMORY:
        *node_dead = *retryable = 0;
        return ESX_EINTERNAL;
    default:
        *node_dead = 0;
        *retryable = 0;
        return ESX_EINTERNAL;
    }
}

/* An attempt ended with an HTTP response (its slot released): finish or retry the call.
 * truncated: a gzip body ended early. */
static void on_response(esx_engine *e, esx_request *req, int node_index, int truncated,
                        int64_t now)
{
    if (truncated) {
        finish(e, req, ESX_EDECODE, "truncated gzip response body");
        return;
    }
    if (is_retry_status(e->cfg, req->status)) {
        mark_node(e, node_index, 0, now);
        if (!schedule_retry(e, req, now, 0))
            finish(e, req, NULL, NULL);
        return;
    }
    if (req->status == 429) {
        req->n429++;
        int64_t delay = backoff_429(e, req);
        if (delay > RETRY_AFTER_CAP_MS || !schedule_retry(e, req, now, delay))
            finish(e, req, NULL, NULL);
        return;
    }
    mark_node(e, node_index, 1, now);
    finish(e, req, NULL, NULL);
}

/* An attempt failed in transport (its slot released): retry the call or finish it. */
static void on_failure(esx_engine *e, esx_request *req, int node_index, const char *kind,
                       int node_dead, int retryable, const char *msg, int64_t now)
{
    if (node_dead)
        mark_node(e, node_index, 0, now);
    if (retryable && schedule_retry(e, req, now, 0))
        return;
    finish(e, req, kind, "%s", msg);
}

/* A transfer ended (CURLMSG_DONE): finish the call or schedule its next attempt. */
static void on_transfer_done(esx_engine *e, esx_request *req, CURLcode rc, int64_t now)
{
    CURL *h = req->easy;
    int node_index = req->node;
    list_remove(&e->active, req);
    if (rc == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &req->status);
        int truncated = req->resp_gzip && req->wire_in > 0 && !req->inflater.finished;
        release_attempt(e, req);
        on_response(e, req, node_index, truncated, now);
        return;
    }
    if (rc == CURLE_WRITE_ERROR && req->abort_kind) {
        release_attempt(e, req);
        finish(e, req, req->abort_kind, "%s", req->abort_msg);
        return;
    }
    int node_dead, retryable;
    const char *kind = transport_kind(rc, h, &node_dead, &retryable);
    char msg[256];
    snprintf(msg, sizeof msg, "%.60s (%.180s)", curl_easy_strerror(rc), esx_request_node(req));
    release_attempt(e, req);
    on_failure(e, req, node_index, kind, node_dead, retryable, msg, now);
}

/* ---------------------------------------------------------------- plain HTTP/1.1 */

/* Fills hn from a node URL: fast when it is http:// with an IP address or "localhost" (no
 * name to resolve, which would block this thread; libcurl resolves asynchronously). */
static void h1_node_setup(h1_node *hn, const char *url)
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
        strcpy(host, "127.0.0.1");
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
    strcpy(hn->prefix, prefix);
    hn->fast = 1;
}

static int h1_on_header(void *ud, const char *line, size_t len)
{
    return record_header(ud, line, len);
}

static int h1_on_body(void *ud, const char *data, size_t len)
{
    return record_body(ud, data, len);
}

/* Closes c and forgets it. */
static void h1_remove(esx_engine *e, esx_h1_conn *c)
{
    if (c->fd >= 0)
        sock_forget(e, c->fd);
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
static void h1_drop(esx_engine *e, esx_h1_conn *c)
{
    c->req = NULL;
    h1_remove(e, c);
}

/* A new connection to node, connecting.  A connect that failed at once is kept in
 * c->error and reported by h1_service.  Returns NULL when out of memory. */
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
    c->pidx = -1;
    esx_buf_init(&c->head, 1024 * 1024);
    c->alt = hn->has_alt && hn->use_alt;
    const struct sockaddr *sa = c->alt ? (const struct sockaddr *)&hn->alt
                                       : (const struct sockaddr *)&hn->sa;
    socklen_t salen = c->alt ? (socklen_t)sizeof hn->alt : hn->salen;
    if (e->nsockets >= MAX_SOCKETS)
        c->error = EMFILE;
    else if (esx_h1_conn_open(c, node, sa, salen) < 0)
        c->error = errno;
    else
        sock_register(e, c->fd);
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
    c->reusable = 0;
    esx_h1_parser_init(&c->parser, strcmp(req->method, "HEAD") == 0, h1_on_header, h1_on_body,
                       req);
    c->req = req;
    req->h1 = c;
    if (c->state == ESX_H1C_IDLE)
        c->state = ESX_H1C_SENDING;
    e->h1_kick = 1; /* sent by h1_service before the next poll */
    return 0;
}

static int h1_start(esx_engine *e, esx_request *req, int node_index, int64_t now)
{
    esx_h1_conn *c = NULL;
    for (int i = e->nh1 - 1; i >= 0 && c == NULL; i--)
        if (e->h1c[i]->state == ESX_H1C_IDLE && e->h1c[i]->node == node_index)
            c = e->h1c[i];
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
        finish(e, req, ESX_EINTERNAL, "cannot prepare the request (head over 1 MiB, or out of memory)");
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
    list_remove(&e->active, req);
    release_attempt(e, req); /* closes c */
    on_failure(e, req, node, kind, node_dead, 1, msg, now);
}

/* A connect that did not finish within connect_timeout (c's request is off the active list). */
static void h1_fail_detached(esx_engine *e, esx_h1_conn *c, const char *kind, int64_t now)
{
    esx_request *req = c->req;
    int node = c->node;
    char msg[256];
    snprintf(msg, sizeof msg, "connection timed out after %lld ms (%.180s)",
             (long long)e->cfg->connect_timeout, esx_request_node(req));
    release_attempt(e, req);
    on_failure(e, req, node, kind, 1, 1, msg, now);
}

/* Moves c's request, within the same attempt and slot, to a fresh connection to the same
 * node; c is closed.  Returns the new connection, or NULL with the request finished
 * ("internal": out of memory). */
static esx_h1_conn *h1_reopen(esx_engine *e, esx_h1_conn *c, int64_t now)
{
    esx_request *req = c->req;
    int node = c->node;
    h1_drop(e, c);
    req->h1 = NULL;
    esx_h1_conn *n = h1_open(e, node, now);
    if (n && h1_attach(e, n, req) == 0)
        return n;
    if (n)
        h1_remove(e, n);
    list_remove(&e->active, req);
    release_attempt(e, req);
    finish(e, req, ESX_EINTERNAL, "out of memory reconnecting");
    return NULL;
}

static void h1_connect_failed(esx_engine *e, esx_h1_conn *c, int err, int64_t now)
{
    if (c->req == NULL) {
        h1_remove(e, c);
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
        list_remove(&e->active, req);
        release_attempt(e, req);
        on_response(e, req, node, truncated, now);
        return 0;
    }
    if (rc == ESX_H1_ERROR && !c->parser.head_too_big) {
        char text[128];
        snprintf(text, sizeof text, "bad HTTP response: %s", c->parser.error);
        h1_fail(e, c, ESX_ERESET, 1, text, now);
        return 0;
    }
    /* a callback stopped (body too big, bad gzip) or the headers are too big */
    const char *kind = rc == ESX_H1_ABORT ? req->abort_kind : ESX_EDECODE;
    char msg[160];
    snprintf(msg, sizeof msg, "%s", rc == ESX_H1_ABORT ? req->abort_msg : c->parser.error);
    list_remove(&e->active, req);
    release_attempt(e, req);
    finish(e, req, kind, "%s", msg);
    return 0;
}

/* Work that needs no wait: connects that failed at once, and requests given to connected
 * connections.  Iterates downwards: removing swaps the last connection in, adding appends. */
static void h1_service(esx_engine *e, int64_t now)
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

/* Adds the connections to the poll set (from index *n, at most cap entries). */
static void h1_poll_set(esx_engine *e, struct curl_waitfd *set, unsigned int *n, unsigned int cap)
{
    for (int i = 0; i < e->nh1; i++) {
        esx_h1_conn *c = e->h1c[i];
        c->pidx = -1;
        if (c->fd < 0 || *n >= cap)
            continue;
        short ev = CURL_WAIT_POLLIN;
        if (c->state == ESX_H1C_CONNECTING)
            ev = CURL_WAIT_POLLOUT;
        else if (c->state == ESX_H1C_SENDING)
            ev = CURL_WAIT_POLLIN | CURL_WAIT_POLLOUT;
        c->pidx = (int)*n;
        set[(*n)++] = (struct curl_waitfd){.fd = c->fd, .events = ev};
    }
}

/* Handles what the poll reported for each connection. */
static void h1_events(esx_engine *e, const struct curl_waitfd *set, int64_t now)
{
    for (int i = e->nh1 - 1; i >= 0; i--) {
        if (i >= e->nh1)
            continue;
        esx_h1_conn *c = e->h1c[i];
        if (c->pidx < 0)
            continue;
        short rev = set[c->pidx].revents;
        c->pidx = -1;
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
            if ((rev & CURL_WAIT_POLLIN) && !h1_recv(e, c, now))
                break; /* an early answer (or a close) ended the attempt */
            if ((rev & CURL_WAIT_POLLOUT) && c->state == ESX_H1C_SENDING)
                h1_send(e, c, now);
            break;
        default:
            h1_recv(e, c, now);
            break;
        }
    }
}

/* ---------------------------------------------------------------- the loop */

static void take_submissions(esx_engine *e, int64_t now)
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
            finish(e, req, ESX_EINTERNAL, "the I/O thread failed with the request in flight");
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
        if (req->submitted_at == 0) {
            req->submitted_at = now;
            if (req->timeout_ms > 0)
                req->deadline = now + req->timeout_ms;
        }
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
        if (pick == ESX_PICK_NONE)
            finish(e, req, ESX_ENO_NODES, "every node is dead and none is due for a retry");
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
                finish(e, req, ESX_EREQUEST_TIMEOUT, "no answer within %lld ms",
                       (long long)req->timeout_ms);
            } else if (now >= req->pool_deadline) {
                wait_remove(e, req, prev);
                finish(e, req, ESX_EPOOL_TIMEOUT,
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
            finish(e, req, ESX_EREQUEST_TIMEOUT, "no answer within %lld ms",
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
            h1_fail_detached(e, c, ESX_ECONNECT_TIMEOUT, now);
            continue;
        }
        int timed_out = req->deadline > 0 && now >= req->deadline;
        int silent = silence_watched(e, req) && now - req->last_activity >= cfg->socket_timeout;
        if (timed_out || silent) {
            *p = req->next;
            req->next = NULL;
            release_attempt(e, req);
            if (timed_out)
                finish(e, req, ESX_EREQUEST_TIMEOUT, "no answer within %lld ms (%.180s)",
                       (long long)req->timeout_ms, esx_request_node(req));
            else
                finish(e, req, ESX_ESOCKET_TIMEOUT, "no data for %lld ms (%.180s)",
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

/* ---------------------------------------------------------------- nginx waiters */

static esx_request *find_live(esx_engine *e, uint64_t id)
{
    for (esx_request *r = e->wait_head; r; r = r->next)
        if (r->id == id)
            return r;
    for (esx_request *r = e->active; r; r = r->next)
        if (r->id == id)
            return r;
    for (esx_request *r = e->backoff; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

static void accept_waiters(esx_engine *e)
{
    int lfd = atomic_load(&e->listen_fd);
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        if (e->nconns == e->capconns) {
            int cap = e->capconns ? e->capconns * 2 : 16;
            waiter_conn *c = cap <= MAX_WAITER_CONNS ? realloc(e->conns, (size_t)cap * sizeof *c)
                                                     : NULL;
            if (c == NULL) {
                /* cannot track it: wake it at once, the waiter re-checks and retries */
                ssize_t w = write(fd, "1", 1);
                (void)w;
                close(fd);
                continue;
            }
            e->conns = c;
            e->capconns = cap;
        }
        e->conns[e->nconns++] = (waiter_conn){.fd = fd, .len = 0};
    }
}

static void read_waiter(esx_engine *e, int i)
{
    waiter_conn *c = &e->conns[i];
    ssize_t n = read(c->fd, c->buf + c->len, sizeof c->buf - 1 - (size_t)c->len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    int drop = n <= 0;
    if (n > 0) {
        c->len += (int)n;
        c->buf[c->len] = '\0';
        char *nl = strchr(c->buf, '\n');
        if (nl) {
            uint64_t id = strtoull(c->buf, NULL, 10);
            esx_request *req = find_live(e, id);
            if (req == NULL) {
                /* a waiter often registers before the loop has taken its request in */
                take_submissions(e, esx_now_ms());
                req = find_live(e, id);
            }
            if (req) {
                add_watcher(req, c->fd);
            } else {
                ssize_t w = write(c->fd, "1", 1); /* done already (or unknown) */
                (void)w;
                close(c->fd);
            }
            c->fd = -1;
        } else if (c->len >= (int)sizeof c->buf - 1) {
            drop = 1;
        }
    }
    if (drop && c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    if (c->fd < 0)
        e->conns[i] = e->conns[--e->nconns];
}

/* ---------------------------------------------------------------- thread */

static void fail_all(esx_engine *e, const char *kind, const char *msg)
{
    esx_request *req;
    while ((req = e->active) != NULL) {
        e->active = req->next;
        release_attempt(e, req);
        finish(e, req, kind, "%s", msg);
    }
    while ((req = e->wait_head) != NULL) {
        e->wait_head = req->next;
        atomic_fetch_sub(&e->nwaiting, 1);
        finish(e, req, kind, "%s", msg);
    }
    e->wait_tail = NULL;
    while ((req = e->backoff) != NULL) {
        e->backoff = req->next;
        finish(e, req, kind, "%s", msg);
    }
    pthread_mutex_lock(&e->mu);
    req = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    e->nsub = 0;
    pthread_mutex_unlock(&e->mu);
    while (req) {
        esx_request *next = req->next;
        finish(e, req, kind, "%s", msg);
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
        if (atomic_load(&e->kill))
            pthread_exit(NULL); /* test hook: die with everything in flight */
        int64_t now = esx_now_ms();
        take_submissions(e, now);
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
            on_transfer_done(e, req, rc, now);
        }
        h1_service(e, now);
        expire(e, now);
        start_waiting(e, now); /* freed slots and due retries go to waiting requests at once */
        h1_service(e, now);    /* ... and their requests are written before the poll */

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

        /* the poll set beyond libcurl's sockets: waiter socket, waiters, h1 connections */
        int want = 1 + (e->nconns < 64 ? e->nconns : 64) + e->nh1;
        if (want > e->cappfd) {
            struct curl_waitfd *v = realloc(e->pfd, (size_t)want * sizeof *v);
            if (v) {
                e->pfd = v;
                e->cappfd = want;
            }
        }
        struct curl_waitfd *extra = e->pfd;
        unsigned int nextra = 0, cap = extra ? (unsigned int)e->cappfd : 0;
        int lfd = atomic_load(&e->listen_fd);
        int lidx = -1;
        if (lfd >= 0 && nextra < cap) {
            lidx = (int)nextra;
            extra[nextra++] = (struct curl_waitfd){.fd = lfd, .events = CURL_WAIT_POLLIN};
        }
        for (int i = 0; i < e->nconns && i < 64 && nextra < cap; i++)
            extra[nextra++] = (struct curl_waitfd){.fd = e->conns[i].fd, .events = CURL_WAIT_POLLIN};
        h1_poll_set(e, extra, &nextra, cap);
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
            accept_waiters(e);
        for (int i = e->nconns - 1; i >= 0; i--)
            read_waiter(e, i);
        h1_events(e, extra, esx_now_ms());
    }
    if (atomic_load(&e->stop))
        fail_all(e, ESX_ECLOSED, "the client was closed");
    pthread_cleanup_pop(1);
    if (e->free_on_exit)
        free_rest(e); /* nobody else holds e: its client is gone and the thread detached */
    return NULL;
}

/* ---------------------------------------------------------------- public */

esx_engine *esx_engine_new(const esx_config *cfg, const esx_engine *prev, char *why)
{
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
            e->nodes.v[i].in_flight = 0;
    } else {
        e->nodes = cfg->nodes;
    }
    /* ESX_TRANSPORT=curl: every node through libcurl (diagnostics, and the specs of that path) */
    const char *transport = getenv("ESX_TRANSPORT");
    int curl_only = transport && strcmp(transport, "curl") == 0;
    for (int i = 0; i < e->nodes.n && !curl_only; i++)
        h1_node_setup(&e->h1n[i], e->nodes.v[i].url);
    if (cfg->username[0]) {
        char cred[sizeof cfg->username + sizeof cfg->password + 1];
        int n = snprintf(cred, sizeof cred, "%s:%s", cfg->username, cfg->password);
        memcpy(e->auth, "Basic ", 6);
        esx_base64_encode((const unsigned char *)cred, (size_t)n, e->auth + 6);
        explicit_bzero(cred, sizeof cred);
    }
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        free(e);
        snprintf(why, 256, "cannot create a mutex");
        return NULL;
    }
    e->multi = curl_multi_init();
    if (e->multi == NULL) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        snprintf(why, 256, "cannot create a curl multi handle");
        return NULL;
    }
    curl_multi_setopt(e->multi, CURLMOPT_MAX_HOST_CONNECTIONS, (long)cfg->max_per_route);
    curl_multi_setopt(e->multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)cfg->max_total);
    curl_multi_setopt(e->multi, CURLMOPT_MAXCONNECTS, (long)cfg->max_total);
    atomic_store(&e->alive, 1);
    if (pthread_create(&e->thread, NULL, io_main, e) != 0) {
        curl_multi_cleanup(e->multi);
        pthread_mutex_destroy(&e->mu);
        free(e);
        snprintf(why, 256, "cannot start the I/O thread");
        return NULL;
    }
    e->thread_started = 1;
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
    explicit_bzero(e->auth, sizeof e->auth);
    for (int i = 0; i < e->nspare; i++)
        curl_easy_cleanup(e->spare[i]);
    curl_multi_cleanup(e->multi);
    for (int i = 0; i < e->nconns; i++)
        close(e->conns[i].fd);
    free(e->conns);
    int lfd = atomic_load(&e->listen_fd);
    if (lfd >= 0) {
        close(lfd);
        unlink(e->listen_path);
    }
    pthread_mutex_destroy(&e->mu);
    explicit_bzero(&e->own_cfg, sizeof e->own_cfg);
    free(e);
}

void esx_engine_free(esx_engine *e)
{
    if (e == NULL)
        return;
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
    pthread_join(e->thread, NULL);
    esx_request *lists[4];
    pthread_mutex_lock(&e->mu);
    lists[0] = e->sub_head;
    e->sub_head = e->sub_tail = NULL;
    e->nsub = 0;
    pthread_mutex_unlock(&e->mu);
    atomic_store(&e->nwaiting, 0);
    lists[1] = e->wait_head;
    lists[2] = e->active;
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
            esx_inflate_end(&req->inflater);
            memset(&req->inflater, 0, sizeof req->inflater);
            req->node = -1;
            if (l == 2) {
                /* it may have reached its node: sending it again is a retry, when one is left;
                 * without, attempt passes max_retries and `to` fails it (take_submissions) */
                if (req->attempt < req->max_retries) {
                    req->retries++;
                    pthread_mutex_lock(&to->mu);
                    to->stats.retries++;
                    pthread_mutex_unlock(&to->mu);
                }
                req->attempt++;
            }
            if (esx_engine_submit(to, req) != 0) {
                finish(e, req, ESX_ECLOSED, "the client was closed");
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
    for (int i = 0; i < e->nsockets; i++)
        close(e->sockets[i]);
    for (int i = 0; i < e->nconns; i++)
        close(e->conns[i].fd);
    int lfd = atomic_load(&e->listen_fd);
    if (lfd >= 0)
        close(lfd); /* the path belongs to the parent: leave it */
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

const char *esx_engine_waiter_path(esx_engine *e, char *why)
{
    if (atomic_load(&e->listen_fd) >= 0)
        return e->listen_path; /* written before listen_fd was published */
    /* Under the lock: two threads creating it at once would each unlink the other's socket
     * file, and the one that won could be listening on a path that no longer exists. */
    pthread_mutex_lock(&e->mu);
    if (atomic_load(&e->listen_fd) >= 0) {
        pthread_mutex_unlock(&e->mu);
        return e->listen_path;
    }
    const char *dir = getenv("TMPDIR");
    if (dir == NULL || strlen(dir) > 60)
        dir = "/tmp";
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int n = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/esx-%d-%llu.sock", dir,
                     (int)esx_pid(), (unsigned long long)e->generation);
    int fd = -1;
    if (n < 0 || (size_t)n >= sizeof addr.sun_path) {
        snprintf(why, 256, "waiter socket path too long");
        goto fail;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, 256, "cannot create the waiter socket: %s", strerror(errno));
        goto fail;
    }
    unlink(addr.sun_path);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 512) != 0) {
        snprintf(why, 256, "cannot listen on %s: %s", addr.sun_path, strerror(errno));
        close(fd);
        goto fail;
    }
    memcpy(e->listen_path, addr.sun_path, sizeof e->listen_path);
    atomic_store(&e->listen_fd, fd);
    pthread_mutex_unlock(&e->mu);
    curl_multi_wakeup(e->multi);
    return e->listen_path;
fail:
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

void esx_engine_debug_kill(esx_engine *e)
{
    atomic_store(&e->kill, 1);
    curl_multi_wakeup(e->multi);
}
