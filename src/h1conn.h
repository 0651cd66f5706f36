/*
 * h1conn.h -- one plain HTTP/1.1 keep-alive connection to a node: non-blocking connect,
 * writing a request (head and body with writev), reading its response through the h1
 * parser.  Policy -- which request, what a failure means, retries -- is the engine's.
 * Used only on the engine's I/O thread.
 */
#ifndef ESX_H1CONN_H
#define ESX_H1CONN_H

#include <stdint.h>
#include <sys/socket.h>

#include "buf.h"
#include "h1.h"

enum { ESX_H1C_CONNECTING, ESX_H1C_IDLE, ESX_H1C_SENDING, ESX_H1C_READING };

typedef struct esx_h1_conn {
    int fd;
    int node;                /* index of the node it is connected to */
    int state;
    int served;              /* responses completed on it (0: fresh) */
    int64_t connect_deadline;
    esx_buf head;            /* the request head being sent */
    const char *body;        /* the request body (the request owns it) */
    size_t body_len;
    size_t sent;             /* bytes of head + body written */
    size_t got;              /* response bytes read for the current request */
    int reusable;            /* the finished response allows another request */
    int error;               /* errno of a connect that failed at once (the engine reports it) */
    unsigned watched;        /* events the engine's epoll watches on fd (0: not added) */
    unsigned ready;          /* events the engine's last epoll_wait reported */
    int alt;                 /* connected (or connecting) to the node's alternative address */
    int tried_other;         /* the request on it already tried the other address */
    void *req;               /* the request it serves, NULL when idle (the engine's) */
    esx_h1_parser parser;
} esx_h1_conn;

/* Result of esx_h1_conn_recv beyond the parser's ESX_H1_* codes. */
#define ESX_H1C_BROKEN (-3) /* read error or a close before the response ended */

/* Opens a non-blocking TCP socket (TCP_NODELAY, keep-alive) and starts connecting to sa.
 * Returns the descriptor (c->fd, state CONNECTING), or -1 with errno set; on -1 nothing
 * stays open.  A refused connect may also show up later, in esx_h1_conn_connected. */
int esx_h1_conn_open(esx_h1_conn *c, int node, const struct sockaddr *sa, socklen_t salen);

/* After the socket became writable while connecting: 0 when connected, else the errno of
 * the failed connect. */
int esx_h1_conn_connected(esx_h1_conn *c);

/* Writes what is left of the request.  Returns 1 when all is sent, 0 when the socket is
 * full (wait for POLLOUT), -1 with errno on failure. */
int esx_h1_conn_send(esx_h1_conn *c);

/* Reads what the socket has into buf (cap bytes of scratch) and feeds it to the parser.
 * Returns ESX_H1_MORE (wait for more), ESX_H1_DONE (c->reusable says whether the
 * connection may serve another request), ESX_H1_ERROR (c->parser.error), ESX_H1_ABORT (a
 * parser callback stopped), or ESX_H1C_BROKEN (*why set; errno-based or an early close). */
int esx_h1_conn_recv(esx_h1_conn *c, char *buf, size_t cap, const char **why);

/* 1 when an idle connection is not fit to carry a request: its peer closed it or sent
 * something (an answer nobody asked for), as far as the socket tells now (one recv). */
int esx_h1_conn_stale(const esx_h1_conn *c);

/* Closes the socket (if open) and frees the connection's buffers; c can be opened again. */
void esx_h1_conn_close(esx_h1_conn *c);

#endif
