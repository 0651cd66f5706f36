/*
 * engine_curl.c -- the engine's libcurl transfers (https:// nodes, nodes by name, and every
 * node under ESX_TRANSPORT=curl): the easy handle's options and callbacks, and what a
 * finished transfer means for its call.  I/O thread only (engine_int.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "engine_int.h"
#include "h1.h"
#include "tcpinfo.h"
#include "version.h"

/* ---------------------------------------------------------------- curl callbacks */

/* NULL when status line buf (with its line end) reads as h1.c reads one, else what is wrong:
 * libcurl 7.88 took "HTTP/2 200" on an HTTP/1.1 connection, and a 101 that esx never asks for
 * as the final answer, with the other protocol's bytes as its body (kind http, the node not
 * marked) */
static const char *bad_status_line(const char *buf, size_t len)
{
    if (len < 9 || memcmp(buf, "HTTP/1.", 7) != 0 || buf[7] < '0' || buf[7] > '9' ||
        buf[8] != ' ')
        return "bad HTTP response: not an HTTP/1.x response";
    if (len >= 13 && memcmp(buf + 9, "101", 3) == 0 &&
        (buf[12] == ' ' || buf[12] == '\r' || buf[12] == '\n'))
        return "bad HTTP response: unexpected 101 Switching Protocols";
    return NULL;
}

static size_t on_header(char *buf, size_t size, size_t n, void *ud)
{
    esx_request *req = ud;
    const char *bad;
    if (size * n >= 5 && memcmp(buf, "HTTP/", 5) == 0 && req->head_done != 1 &&
        (bad = bad_status_line(buf, size * n)) != NULL) {
        req->abort_kind = ESX_ERESET; /* a bad reply (esx_eng_on_transfer_done) */
        snprintf(req->abort_msg, sizeof req->abort_msg, "%s", bad);
        return 0;
    }
    return esx_eng_record_header(ud, buf, size * n) ? size * n : 0;
}

static size_t on_body(char *buf, size_t size, size_t n, void *ud)
{
    return esx_eng_record_body(ud, buf, size * n) ? size * n : 0;
}

/* The port of a socket address, 0 when it has none. */
static int port_of(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)ss)->sin_port);
    if (ss->ss_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
    return 0;
}

/* Looks up s's ports once (a socket not connected yet has none, and is looked at again next
 * time). */
static void note_ports(esx_sock *s)
{
    if (s->lport != 0)
        return;
    struct sockaddr_storage a, b;
    socklen_t alen = sizeof a, blen = sizeof b;
    if (getsockname(s->fd, (struct sockaddr *)&a, &alen) == 0 &&
        getpeername(s->fd, (struct sockaddr *)&b, &blen) == 0) {
        s->lport = port_of(&a);
        s->rport = port_of(&b);
    }
}

/* The engine's sockets connected from local port lport to remote port rport: up to max of
 * them in fds, and how many there are.  Usually one; but Linux gives one local port to
 * connections to different addresses, so two nodes on one port can share a pair. */
static int sockets_on_ports(esx_engine *e, int lport, int rport, int *fds, int max)
{
    int n = 0;
    for (int i = 0; i < e->nsockets; i++) {
        esx_sock *s = &e->sockets[i];
        note_ports(s);
        if (s->lport != 0 && s->lport == lport && s->rport == rport) {
            if (n < max)
                fds[n] = s->fd;
            n++;
        }
    }
    return n;
}

/* 1 when fd is connected from address local to address remote (as libcurl writes them). */
static int socket_on_addresses(int fd, const char *local, const char *remote)
{
    struct sockaddr_storage a[2];
    socklen_t len[2] = {sizeof a[0], sizeof a[1]};
    if (getsockname(fd, (struct sockaddr *)&a[0], &len[0]) != 0 ||
        getpeername(fd, (struct sockaddr *)&a[1], &len[1]) != 0)
        return 0;
    for (int k = 0; k < 2; k++) {
        char text[INET6_ADDRSTRLEN];
        const void *addr = a[k].ss_family == AF_INET
                               ? (const void *)&((struct sockaddr_in *)&a[k])->sin_addr
                               : (const void *)&((struct sockaddr_in6 *)&a[k])->sin6_addr;
        if (inet_ntop(a[k].ss_family, addr, text, sizeof text) == NULL ||
            strcmp(text, k == 0 ? local : remote) != 0)
            return 0;
    }
    return 1;
}

/* 1 when the peer of TCP socket fd has closed its side (FIN received: CLOSE_WAIT). */
static int peer_closed(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    return getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
           len >= offsetof(struct tcp_info, tcpi_state) + sizeof ti.tcpi_state &&
           ti.tcpi_state == TCP_CLOSE_WAIT;
}

/* 1 when libcurl reused an idle connection that the server wrote to while it was idle:
 * whatever a server sends there (a 408 before it closed, the rest of a faulty answer) answers
 * nothing esx asked, but libcurl 7.88 takes such a connection as alive and would read those
 * bytes as this request's answer (esx's own HTTP/1.1 drops the connection as soon as they
 * come).  Over plain HTTP any byte waiting tells it.  Over TLS bytes waiting are no sign: a
 * TLS 1.3 server may send its session tickets after its first answers (Netty, on which
 * Elasticsearch's HTTP layer runs, does) and a key update at any time, and at the socket they
 * look like an answer -- dropping such connections would make every https request a new
 * handshake.  There a server that wrote and then closed (a 408 with Connection: close, the
 * common case) is told by its FIN; one that writes a stray answer and keeps the connection
 * open cannot be told from a ticket (docs/client.md).  libcurl gives no socket before the
 * request is sent (CURLINFO_ACTIVESOCKET), so it is found by its ports (and, when another
 * socket has the same, its addresses). */
static int reused_with_bytes_waiting(esx_request *req, int fd)
{
    long made = 1;
    if (curl_easy_getinfo(req->easy, CURLINFO_NUM_CONNECTS, &made) != CURLE_OK || made != 0)
        return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (fd < 0 || poll(&p, 1, 0) <= 0)
        return 0;
    return strncmp(esx_request_node(req), "https://", 8) != 0 || peer_closed(fd);
}

/* The socket of the connection from lip:lport to rip:rport, -1 when none is known.
 * libcurl gives no socket before the request is sent (CURLINFO_ACTIVESOCKET), so it is found
 * by its ports (and, when another socket has the same, its addresses). */
static int socket_of(esx_engine *e, const char *lip, int lport, const char *rip, int rport)
{
    int fds[8];
    int n = sockets_on_ports(e, lport, rport, fds, 8);
    int fd = n > 0 ? fds[0] : -1;
    for (int i = 0; n > 1 && i < n && i < 8; i++) {
        if (socket_on_addresses(fds[i], lip, rip)) {
            fd = fds[i];
            break;
        }
    }
    return fd;
}

/* libcurl has a connection for the transfer (new, or reused): socket silence counts from now. */
static int on_prereq(void *ud, char *conn_primary_ip, char *conn_local_ip, int conn_primary_port,
                     int conn_local_port)
{
    esx_request *req = ud;
    esx_engine *e = req->eng;
    /* every connection is up by now: its ports are looked up while getpeername still answers.
     * A peer that resets an idle connection leaves it unconnected (TCP_CLOSE) and without a
     * peer name, and one never looked up before would be taken for a socket still
     * connecting, counted open and idle until libcurl's next look (closed_by_peer) */
    for (int i = 0; i < e->nsockets; i++)
        note_ports(&e->sockets[i]);
    req->curl_fd = socket_of(e, conn_local_ip, conn_local_port, conn_primary_ip,
                             conn_primary_port);
    req->curl_gap_from = -1;
    req->passed_on = 0;
    unsigned long long base;
    req->curl_base = req->curl_fd >= 0 && esx_tcp_consumed(req->curl_fd, &base) == 0 ?
                         (long long)base : -1;
    req->curl_gap_at = 0; /* looked at from the first progress call on */
    if (req->curl_fd >= 0 && reused_with_bytes_waiting(req, req->curl_fd)) {
        req->curl_stale = 1; /* libcurl closes the connection; esx_eng_on_transfer_done restarts */
        return CURL_PREREQFUNC_ABORT;
    }
    req->curl_connecting = 0;
    req->curl_lport = (unsigned short)conn_local_port;
    req->curl_rport = (unsigned short)conn_primary_port;
    req->last_activity = esx_now_ms();
    return CURL_PREREQFUNC_OK;
}

/* 1 (MAX_GAP) or 2 (framing) when libcurl has read more of req's connection than it passes on (response lines, body
 * bytes): MAX_GAP bytes since it last passed any, or more than h1.c allows chunked framing
 * (ESX_H1_FRAMING_RATIO times the bytes passed on, plus the slack) in all.  What it may hold
 * back is bounded -- a header line (100 KB, its own limit), a chunk's size line, a TLS
 * record -- but not what it skips: the rest of a chunk size line ("1;" and then bytes for
 * ever) was read without end, each byte activity for socket_timeout, and one body byte a
 * chunk behind a long extension took ~1,000 bytes a byte to reach max_response_bytes.
 * Looked at every GAP_CHECK_MS at most: two system calls. */
#define MAX_GAP (256 * 1024)
#define GAP_CHECK_MS 20
static int read_without_passing_on(esx_request *req)
{
    int64_t now = esx_now_ms();
    if (req->curl_fd < 0 || now - req->curl_gap_at < GAP_CHECK_MS)
        return 0;
    unsigned long long read;
    if (esx_tcp_consumed(req->curl_fd, &read) != 0)
        return 0;
    req->curl_gap_at = now;
    unsigned long long passed = (unsigned long long)req->head_in + req->wire_in;
    if (req->curl_base >= 0 && read > (unsigned long long)req->curl_base &&
        read - (unsigned long long)req->curl_base >
            ESX_H1_FRAMING_SLACK + ESX_H1_FRAMING_RATIO * passed + MAX_GAP)
        return 2;
    if (req->passed_on || req->curl_gap_from < 0) {
        req->passed_on = 0;
        req->curl_gap_from = (long long)read;
        return 0;
    }
    return read > (unsigned long long)req->curl_gap_from + MAX_GAP;
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
    int over = req->curl_connecting ? 0 : read_without_passing_on(req);
    if (over) {
        req->abort_kind = ESX_ERESET; /* esx_eng_on_transfer_done */
        if (over == 1)
            snprintf(req->abort_msg, sizeof req->abort_msg,
                     "bad HTTP response: %d KiB without response bytes", MAX_GAP / 1024);
        else
            snprintf(req->abort_msg, sizeof req->abort_msg,
                     "bad HTTP response: chunk framing outweighs the data it carries");
        return 1;
    }
    return 0;
}

/* A socket for req's transfer.  One that cannot be opened for want of descriptors or memory
 * is noted in req->local_errno: libcurl reports only CURLE_COULDNT_CONNECT, which would mark
 * the node dead (esx_eng_on_transfer_done). */
static curl_socket_t on_open_socket(void *ud, curlsocktype purpose, struct curl_sockaddr *addr)
{
    esx_request *req = ud;
    esx_engine *e = req->eng;
    (void)purpose;
    if (e->nsockets >= MAX_SOCKETS)
        esx_eng_sock_prune(e); /* stale entries (engine.c) must not refuse a socket */
    if (e->nsockets >= MAX_SOCKETS) {
        req->local_errno = ESX_ESOCKTABLE;
        return CURL_SOCKET_BAD;
    }
    int fd = socket(addr->family, addr->socktype | SOCK_CLOEXEC, addr->protocol);
    if (fd < 0) {
        if (esx_eng_local_errno(errno))
            req->local_errno = errno;
        return CURL_SOCKET_BAD;
    }
    esx_eng_sock_register(e, fd);
    if (e->curl_watch) {
        /* its peer's close, once (edge-triggered: the bytes of an answer, or a TLS server's
         * session tickets on an idle connection, do not wake the thread).  Unwatched (ENOMEM),
         * such a close is counted at the next count. */
        struct epoll_event ev = {.events = EPOLLRDHUP | EPOLLET, .data.fd = fd};
        epoll_ctl(e->epfd, EPOLL_CTL_ADD, fd, &ev);
    }
    return fd;
}

static int on_close_socket(void *ud, curl_socket_t fd)
{
    esx_eng_sock_forget(ud, fd);
    return close(fd);
}

/* 1 when the connection of socket s was closed by its peer: a FIN (CLOSE_WAIT, or LAST_ACK
 * once closed on this side too), or a reset after it was connected (CLOSE: an unconnected
 * socket is CLOSE too, hence the ports, which only a connected one has). */
static int closed_by_peer(esx_sock *s)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    if (getsockopt(s->fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_state) + sizeof ti.tcpi_state)
        return 0;
    /* its ports tell a running transfer's socket (esx_eng_curl_recount); looked up while
     * they can be, for a reset later, when getpeername no longer answers */
    note_ports(s);
    return ti.tcpi_state == TCP_CLOSE_WAIT || ti.tcpi_state == TCP_LAST_ACK ||
           (ti.tcpi_state == TCP_CLOSE && s->lport != 0);
}

void esx_eng_curl_recount(esx_engine *e)
{
    e->curl_recount = 0;
    e->curl_dead_busy = 0;
    int ndead = 0;
    for (int i = 0; i < e->nsockets; i++) {
        esx_sock *s = &e->sockets[i];
        if (!s->dead && closed_by_peer(s)) {
            /* the connection of a running transfer is not idle: libcurl reads the close
             * (and the transfer's end) itself.  One that is still connecting has no ports
             * on its request yet; closed by its peer, it fails at once. */
            int busy = 0;
            for (esx_request *r = e->active; r && !busy; r = r->next)
                busy = r->easy && !r->curl_connecting && r->curl_lport == s->lport &&
                       r->curl_rport == s->rport;
            if (busy)
                e->curl_dead_busy = 1;
            else
                s->dead = 1;
        }
        ndead += s->dead;
    }
    e->ndead = ndead;
    atomic_store(&e->nopen, e->nsockets - e->ndead);
}

void esx_eng_curl_events(esx_engine *e)
{
    struct epoll_event ev[64];
    int n;
    do {
        n = epoll_wait(e->epfd, ev, (int)(sizeof ev / sizeof ev[0]), 0);
    } while (n == (int)(sizeof ev / sizeof ev[0]));
    esx_eng_curl_recount(e);
}

/* Bytes that reached the transfer's socket are activity even when libcurl holds them: it
 * passes the headers on line by line, so a header line arriving byte by byte would look like
 * silence.  The kernel knows when the connection last received data (TCP_INFO, in ms).
 * libcurl 7.88 gives no socket during a transfer (CURLINFO_ACTIVESOCKET), so it is found by
 * the ports on_prereq noted; when other sockets have the same (sockets_on_ports), the one
 * that heard least recently speaks for them all: another connection's bytes never keep a
 * silent transfer alive. */
void esx_eng_curl_heard(esx_request *req, int64_t now)
{
    if (req->easy == NULL || req->curl_connecting || req->curl_lport == 0)
        return;
    int fds[8];
    int n = sockets_on_ports(req->eng, req->curl_lport, req->curl_rport, fds, 8);
    if (n < 1 || n > 8)
        return;
    int64_t at = now;
    for (int i = 0; i < n; i++) {
        struct tcp_info ti;
        socklen_t len = sizeof ti;
        if (getsockopt(fds[i], IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
            len < offsetof(struct tcp_info, tcpi_last_data_recv) + sizeof ti.tcpi_last_data_recv)
            return;
        if (now - (int64_t)ti.tcpi_last_data_recv < at)
            at = now - (int64_t)ti.tcpi_last_data_recv;
    }
    if (at > req->last_activity)
        req->last_activity = at;
}

/* ---------------------------------------------------------------- transfers */

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
    /* the path as given, as esx's own HTTP/1.1 sends it: libcurl would otherwise remove dot
     * segments ("/docs/_doc/../" -- another resource than the one asked for) */
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
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
    /* a caller's "Connection: close" is honoured as h1conn.c does: libcurl sends it but kept
     * the connection for the next request, while the server had not closed it yet */
    if (esx_h1_asks_close(req->headers))
        curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
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
    req->eng = e;
    req->local_errno = 0;
    req->curl_lport = req->curl_rport = 0;
    req->curl_fd = -1;
    req->curl_gap_from = -1;
    req->curl_base = -1;
    req->passed_on = 0;
    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, req);
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
int esx_eng_curl_start(esx_engine *e, esx_request *req, const esx_node *node, int64_t now)
{
    req->easy = e->nspare ? e->spare[--e->nspare] : curl_easy_init();
    if (req->easy == NULL) {
        esx_eng_finish(e, req, ESX_EINTERNAL, "out of memory creating a transfer");
        return -1;
    }
    curl_easy_reset(req->easy);
    if (setup_easy(e, req, node, now) != 0) {
        curl_easy_cleanup(req->easy);
        req->easy = NULL;
        esx_eng_finish(e, req, ESX_EINTERNAL, "out of memory preparing a transfer");
        return -1;
    }
    req->curl_connecting = 1;
    CURLMcode mc = curl_multi_add_handle(e->multi, req->easy);
    if (mc != CURLM_OK) {
        curl_easy_cleanup(req->easy);
        req->easy = NULL;
        esx_eng_finish(e, req, ESX_EINTERNAL, "cannot start a transfer: %s",
                       curl_multi_strerror(mc));
        return -1;
    }
    return 0;
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
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_INVALIDCERTSTATUS:
    case CURLE_SSL_CLIENTCERT:
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
    case CURLE_UNSUPPORTED_PROTOCOL: /* node URLs are http(s): this is a reply that is not
                                      * HTTP/1.x ("HTTP/0.9 when not allowed") */
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

/* A transfer ended (CURLMSG_DONE): finish the call or schedule its next attempt. */
void esx_eng_on_transfer_done(esx_engine *e, esx_request *req, CURLcode rc, int64_t now)
{
    CURL *h = req->easy;
    int node_index = req->node;
    esx_eng_list_remove(&e->active, req);
    if (rc == CURLE_ABORTED_BY_CALLBACK && req->curl_stale) {
        /* nothing was sent: the same attempt goes on, in its slot, on another connection (each
         * such stop closes one idle connection, so this ends) -- as h1 does on a stale one */
        req->curl_stale = 0;
        req->curl_connecting = 1;
        curl_multi_remove_handle(e->multi, h);
        CURLMcode mc = curl_multi_add_handle(e->multi, h);
        if (mc == CURLM_OK) {
            req->next = e->active;
            e->active = req;
            return;
        }
        esx_eng_release_attempt(e, req);
        esx_eng_finish(e, req, ESX_EINTERNAL, "cannot restart a transfer: %s",
                       curl_multi_strerror(mc));
        return;
    }
    if (rc == CURLE_OK) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &req->status);
        int truncated = req->resp_gzip && req->wire_in > 0 && !req->inflater.finished;
        esx_eng_release_attempt(e, req);
        esx_eng_on_response(e, req, node_index, truncated, now);
        return;
    }
    if ((rc == CURLE_WRITE_ERROR || rc == CURLE_ABORTED_BY_CALLBACK) && req->abort_kind &&
        strcmp(req->abort_kind, ESX_ERESET) == 0) {
        /* framing esx refuses (esx_eng_record_header): a bad reply, as h1 treats it -- the
         * node is suspect, the call retried */
        char msg[256];
        snprintf(msg, sizeof msg, "%.60s (%.180s)", req->abort_msg, esx_request_node(req));
        esx_eng_release_attempt(e, req);
        esx_eng_on_failure(e, req, node_index, ESX_ERESET, 1, 1, msg, now);
        return;
    }
    if (rc == CURLE_BAD_FUNCTION_ARGUMENT && req->head_done == 1) {
        /* after the head, only a trailer goes to libcurl's headers API, which refuses one
         * without a colon with this code (not esx's bad argument: it was kind internal).  A
         * bad reply, as h1.c says -- it comes too of a bad chunk size line that libcurl
         * read as a last chunk ("0x2") */
        char msg[256];
        snprintf(msg, sizeof msg, "bad HTTP response: malformed trailer line (%.180s)",
                 esx_request_node(req));
        esx_eng_release_attempt(e, req);
        esx_eng_on_failure(e, req, node_index, ESX_ERESET, 1, 1, msg, now);
        return;
    }
    if (rc == CURLE_WRITE_ERROR && req->abort_kind) {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &req->status); /* err.status */
        esx_eng_release_attempt(e, req);
        esx_eng_finish(e, req, req->abort_kind, "%s", req->abort_msg);
        return;
    }
    /* This process could not open a socket (or, for a resolve, found none to open: libcurl
     * gives no cause, so look): not the node's failure (esx_eng_on_local_failure). */
    int local = 0;
    if (rc == CURLE_COULDNT_CONNECT && req->local_errno)
        local = req->local_errno;
    else if (rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY)
        local = esx_eng_probe_local(0);
    if (local) {
        esx_eng_release_attempt(e, req);
        esx_eng_on_local_failure(e, req, node_index, local,
                                 rc == CURLE_COULDNT_CONNECT ? "cannot open a socket"
                                                             : "cannot resolve the host name",
                                 now);
        return;
    }
    int node_dead, retryable;
    const char *kind = transport_kind(rc, h, &node_dead, &retryable);
    char msg[256];
    if (rc == CURLE_OUT_OF_MEMORY && req->head_in > 0 && req->wire_in == 0) {
        /* after the status line, before the body: libcurl's own bound on one header line
         * (100 KB), reported as out of memory -- past esx's 64 KiB, as h1.c says */
        kind = ESX_EDECODE;
        node_dead = retryable = 0;
        snprintf(msg, sizeof msg, "response headers exceed 64 KiB");
    } else if (rc == CURLE_BAD_CONTENT_ENCODING) {
        /* a transfer coding other than chunked (esx asks libcurl to decode none): the node
         * answered, the bytes cannot be read -- as h1.c says */
        kind = ESX_EDECODE;
        node_dead = retryable = 0;
        snprintf(msg, sizeof msg, "response uses a transfer coding esx does not decode (%.180s)",
                 esx_request_node(req));
    } else if (rc == CURLE_SSL_CACERT_BADFILE) {
        /* this process's ca_file, not the node: every node would fail alike */
        node_dead = retryable = 0;
        snprintf(msg, sizeof msg, "cannot use ca_file: %.60s (the node was not marked) (%.140s)",
                 curl_easy_strerror(rc), esx_request_node(req));
    } else {
        snprintf(msg, sizeof msg, "%.60s (%.180s)", curl_easy_strerror(rc), esx_request_node(req));
    }
    esx_eng_release_attempt(e, req);
    esx_eng_on_failure(e, req, node_index, kind, node_dead, retryable, msg, now);
}
