/*
 * h1conn.c -- one plain HTTP/1.1 connection (see h1conn.h).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "h1conn.h"

int esx_h1_conn_open(esx_h1_conn *c, int node, const struct sockaddr *sa, socklen_t salen)
{
    int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    if (connect(fd, sa, salen) != 0 && errno != EINPROGRESS) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    c->fd = fd;
    c->node = node;
    c->state = ESX_H1C_CONNECTING;
    c->served = 0;
    c->reusable = 0;
    return fd;
}

int esx_h1_conn_connected(esx_h1_conn *c)
{
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return errno;
    return err;
}

int esx_h1_conn_send(esx_h1_conn *c)
{
    for (;;) {
        struct iovec iov[2];
        int n = 0;
        size_t total = c->head.len + c->body_len;
        if (c->sent >= total)
            return 1;
        if (c->sent < c->head.len) {
            iov[n].iov_base = c->head.data + c->sent;
            iov[n++].iov_len = c->head.len - c->sent;
            if (c->body_len) {
                iov[n].iov_base = (void *)c->body;
                iov[n++].iov_len = c->body_len;
            }
        } else {
            size_t off = c->sent - c->head.len;
            iov[n].iov_base = (void *)(c->body + off);
            iov[n++].iov_len = c->body_len - off;
        }
        /* sendmsg rather than writev: MSG_NOSIGNAL, a peer that closed must not raise SIGPIPE */
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->sent += (size_t)w;
    }
}

int esx_h1_conn_recv(esx_h1_conn *c, char *buf, size_t cap, const char **why)
{
    for (;;) {
        ssize_t r = read(c->fd, buf, cap);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return ESX_H1_MORE;
            *why = strerror(errno);
            return ESX_H1C_BROKEN;
        }
        if (r == 0) {
            int rc = esx_h1_eof(&c->parser);
            if (rc == ESX_H1_DONE) {
                c->reusable = 0;
                return rc;
            }
            *why = c->parser.error;
            return ESX_H1C_BROKEN;
        }
        c->got += (size_t)r;
        size_t used;
        int rc = esx_h1_feed(&c->parser, buf, (size_t)r, &used);
        if (rc == ESX_H1_DONE) {
            /* bytes past the response belong to no request: do not reuse the connection */
            c->reusable = c->parser.keep_alive && used == (size_t)r;
            return rc;
        }
        if (rc != ESX_H1_MORE)
            return rc;
        if ((size_t)r < cap)
            return ESX_H1_MORE; /* the socket is drained for now */
    }
}

int esx_h1_conn_stale(const esx_h1_conn *c)
{
    char b;
    ssize_t r;
    while ((r = recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT)) < 0 && errno == EINTR)
        ;
    return r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
}

void esx_h1_conn_close(esx_h1_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    esx_buf_free(&c->head);
    esx_h1_parser_free(&c->parser);
}
