/*
 * engine_int.h -- the engine's private parts, shared by its files and by nothing else:
 *   engine.c          the loop, slots, deadlines, retries; the public calls (engine.h)
 *   engine_curl.c     libcurl transfers
 *   engine_h1.c       esx's own plain HTTP/1.1 connections
 *   engine_waiters.c  the unix socket nginx waiters wait on
 *   engine_exit.c     the process's engines, stopped before its exit handlers run
 *
 * Threading: `mu` guards the submission queue, the counters and the node states (which the
 * Lua side reads for stats).  Everything else -- the multi handle, the easy handles, the
 * waiting/active/back-off lists, the socket table and the waiter connections -- belongs to
 * the I/O thread alone; other threads read only the counts it keeps (nwaiting, nopen).
 * The functions below run on the I/O thread, or while none runs (before it starts, after
 * it was joined).
 */
#ifndef ESX_ENGINE_INT_H
#define ESX_ENGINE_INT_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include <curl/curl.h>

#include "engine.h"
#include "h1conn.h"

#define MAX_SOCKETS 1024
#define MAX_SPARE_EASY 32
#define ACCEPT_PAUSE_MS 20
#define WAITER_SOCKET "waiter.sock" /* in a directory of its own (esx_engine_waiter_path) */
#define WAITER_SOCKET_NEW "waiter.new" /* its name until it listens: then renamed */
#define ESX_ESOCKTABLE (-1) /* as an errno: the engine's table of MAX_SOCKETS sockets is full */

typedef struct waiter_conn {
    int fd;
    int len;
    char buf[32];
} waiter_conn;

/* An open socket of the engine: its number and its file's identity, device and inode (see
 * esx_eng_sock_prune). */
typedef struct esx_sock {
    int fd;
    int lport, rport; /* its local and remote ports once connected, 0 until looked up
                       * (engine_curl.c finds a reused connection's socket by them) */
    int dead;         /* libcurl's, idle, and closed by its peer: not counted as open
                       * (libcurl closes it at its next look for a connection) */
    dev_t dev;
    ino_t ino;
} esx_sock;

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
    esx_engine *live_prev, *live_next; /* engine_exit.c's list, under its lock */

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
    esx_sock sockets[MAX_SOCKETS];
    int nsockets;

    /* kept by the I/O thread for esx_engine_stats, which must never walk its lists */
    atomic_int nwaiting;        /* requests on the wait list (added under mu when taken from
                                 * the submission queue, so a request is always counted once) */
    atomic_int nopen;           /* = nsockets - ndead */
    int ndead;                  /* entries of sockets[] marked dead */
    int curl_watch;             /* libcurl's transport: its sockets are in epfd, for the
                                 * close of an idle one by its peer (esx_eng_curl_recount) */
    int curl_recount;           /* recount before the next poll */
    int curl_dead_busy;         /* the last count saw a socket closed by its peer while its
                                 * transfer ran: counted again once a transfer ends */
    CURL *spare[MAX_SPARE_EASY];
    int nspare;
    int64_t accept_paused_until; /* the waiter socket is left out of the poll set until then
                                  * (accept failed for want of descriptors or memory) */
    waiter_conn *conns;
    int nconns, capconns;
    unsigned int rng;
    h1_node h1n[ESX_MAX_NODES];
    esx_h1_conn **h1c;       /* every plain HTTP/1.1 connection, busy or idle */
    int nh1, caph1;
    int h1_kick;             /* a connection has work to do before the next poll */
    char auth[700];          /* "Basic ..." for h1 connections, "" without credentials */
    int epfd;                /* epoll instance watching the h1 connections, polled as one
                              * descriptor (a poll of every connection cost more than the
                              * rest of the loop under load) */
    struct curl_waitfd *pfd; /* poll set beyond libcurl's own sockets (room for 2 at least) */
    int cappfd;
    char rbuf[64 * 1024];    /* read scratch for h1 connections */

    /* set by any thread once, read by the I/O thread */
    atomic_int listen_fd;
    char listen_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    dev_t listen_dev;        /* the waiter socket's identity, for a forked child's abandon */
    ino_t listen_ino;
    dev_t path_dev;          /* its file's identity: a file removed (a /tmp cleaner) or replaced */
    ino_t path_ino;          /* is a new socket (esx_engine_waiter_path) */
    atomic_int stale_listen_fd; /* the waiter socket it replaced: the I/O thread closes it */
    atomic_int sweep_due;    /* the I/O thread removes dead processes' waiter directories */
    char sweep_dir[64];      /* from this one (TMPDIR; under mu) */
};

/* ---------------------------------------------------------------- engine.c */

/* Unlinks req from the list at *head; nothing happens when it is not on it. */
void esx_eng_list_remove(esx_request **head, esx_request *req);

/* Ends req (outcome, waiters woken, the engine's reference dropped; kind NULL: its HTTP
 * response).  Cannot fail; req may be freed on return. */
void esx_eng_finish(esx_engine *e, esx_request *req, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records one response header line into req.  Returns 0 when req was aborted (abort_kind,
 * abort_msg set: headers too big), nonzero to go on. */
int esx_eng_record_header(esx_request *req, const char *buf, size_t len);

/* Records response body bytes into req (inflating gzip).  Returns 0 when req was aborted
 * (abort_kind, abort_msg set: too big, corrupt gzip, out of memory), 1 to go on. */
int esx_eng_record_body(esx_request *req, const char *buf, size_t len);

/* Adds fd to the engine's table of open sockets.  Returns 0, or -1 when the table is full
 * (fd not added; the caller still owns and closes it). */
int esx_eng_sock_register(esx_engine *e, int fd);

/* Drops fd from the table of open sockets; it does not close it. */
void esx_eng_sock_forget(esx_engine *e, int fd);

/* Drops the entries whose socket is no longer open (a closed number, or one reused by another
 * file): libcurl 7.88 closes a socket whose connect failed without its close callback. */
void esx_eng_sock_prune(esx_engine *e);

/* Releases req's transfer, connection slot and any h1 connection still attached (closed). */
void esx_eng_release_attempt(esx_engine *e, esx_request *req);

/* After an attempt ended with an HTTP response (slot released): retries or finishes req. */
void esx_eng_on_response(esx_engine *e, esx_request *req, int node_index, int truncated,
                         int64_t now);

/* After an attempt failed in transport (slot released): retries req, or finishes it with
 * kind and msg. */
void esx_eng_on_failure(esx_engine *e, esx_request *req, int node_index, const char *kind,
                        int node_dead, int retryable, const char *msg, int64_t now);

/* 1 when err (an errno, or ESX_ESOCKTABLE) says that this process or system is short of
 * descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM): a failure of ours, not the
 * node's. */
int esx_eng_local_errno(int err);

/* Tries to open (and closes) a TCP socket, or with pair a unix socket pair.  Returns the
 * errno when that fails for want of local resources (esx_eng_local_errno), else 0.  For
 * failures whose cause libcurl does not report (a resolve that could not open /etc/hosts or
 * a socket, a multi handle without its wake-up pair). */
int esx_eng_probe_local(int pair);

/* After an attempt on node_index failed because this process could not open what it needed
 * (err: its errno, or ESX_ESOCKTABLE; what: "cannot open a socket", ...), its slot released:
 * the node is not marked and keeps its failures.  Retries req after a short back-off, or
 * finishes it with "connect" and a message that says the shortage is local. */
void esx_eng_on_local_failure(esx_engine *e, esx_request *req, int node_index, int err,
                              const char *what, int64_t now);

/* Takes every request off the submission queue onto the wait list (or the back-off list,
 * or finished: salvaged ones).  Cannot fail. */
void esx_eng_take_submissions(esx_engine *e, int64_t now);

/* ---------------------------------------------------------------- engine_curl.c */

/* Starts a libcurl transfer for req on node.  Returns 0, or -1 with req finished
 * ("internal"). */
int esx_eng_curl_start(esx_engine *e, esx_request *req, const esx_node *node, int64_t now);

/* A libcurl transfer ended (CURLMSG_DONE with rc): finishes req or schedules its retry. */
void esx_eng_on_transfer_done(esx_engine *e, esx_request *req, CURLcode rc, int64_t now);

/* Marks the engine's idle libcurl sockets that their peer closed (a server's keep-alive
 * timeout, a restart) as dead, so that stats count them neither open nor idle: libcurl keeps
 * them in its cache until its next look for a connection.  Recomputes ndead and nopen. */
void esx_eng_curl_recount(esx_engine *e);

/* Reads what e->epfd reports (a libcurl socket's peer closed it) and counts again. */
void esx_eng_curl_events(esx_engine *e);

/* Moves req->last_activity forward to the last time its connection received bytes that
 * libcurl has not passed on yet (part of a header line: libcurl gives whole lines only). */
void esx_eng_curl_heard(esx_request *req, int64_t now);

/* ---------------------------------------------------------------- engine_h1.c */

/* Fills hn from a node URL; hn->fast stays 0 (use libcurl) when the URL does not suit. */
void esx_eng_h1_node_setup(h1_node *hn, const char *url);

/* Closes and frees connection c, whose request is unfinished (the request is not ended). */
void esx_eng_h1_drop(esx_engine *e, esx_h1_conn *c);

/* Starts req on node_index over a plain HTTP/1.1 connection (an idle one, else a new one).
 * Returns 0, or -1 with req finished ("internal"). */
int esx_eng_h1_start(esx_engine *e, esx_request *req, int node_index, int64_t now);

/* Fails c's request (already off the active list) with kind: connect_timeout passed. */
void esx_eng_h1_fail_detached(esx_engine *e, esx_h1_conn *c, const char *kind, int64_t now);

/* Does the h1 work that needs no poll (failed connects, requests to send); no-op unless
 * h1_kick is set. */
void esx_eng_h1_service(esx_engine *e, int64_t now);

/* Brings what e->epfd watches on each connection up to date with its state.  A connection
 * that cannot be watched ends its attempt with "internal", or is closed when idle.  Returns
 * how many connections it closed so (their slots are free for waiting requests). */
int esx_eng_h1_watch(esx_engine *e);

/* Reads what e->epfd reports ready and handles it (call when the poll found it readable). */
void esx_eng_h1_events(esx_engine *e, int64_t now);

/* ---------------------------------------------------------------- engine_waiters.c */

/* Wakes (and closes) every waiter connection of the finished req. */
void esx_eng_poke_watchers(esx_request *req);

/* Accepts the waiter connections pending on the listen socket; one it cannot keep is
 * woken at once. */
void esx_eng_accept_waiters(esx_engine *e);

/* Reads waiter connection i; once it named a request (or broke) it leaves e->conns, the
 * last one taking index i. */
void esx_eng_read_waiter(esx_engine *e, int i);

/* Removes from e->sweep_dir the waiter directories of processes that are gone (see
 * engine_waiters.c); called by the I/O thread once e->sweep_due is set.  Cannot fail: a
 * directory it cannot prove dead, or cannot remove, is left. */
void esx_eng_sweep_waiters(esx_engine *e);

/* engine_exit.c.  live_add: e (its thread started) is stopped by exit(); live_remove: before
 * e is joined or freed.  thread_starting: before pthread_create (and thread_gone if it
 * fails); thread_gone: the last thing an I/O thread does.  exiting: 1 once this process's
 * exit handler has stopped its engines (no engine may be made then).  None fails. */
int esx_eng_exiting(void);
void esx_eng_live_add(esx_engine *e);
void esx_eng_live_remove(esx_engine *e);
void esx_eng_thread_starting(void);
void esx_eng_thread_gone(void);

#endif
