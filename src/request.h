/*
 * request.h -- one Elasticsearch call as the engine sees it: what to send, how long it may
 * take, and (once done) what came back or why it failed.
 *
 * A request is reference counted: the caller (a Lua pending object, the collector's shipper)
 * holds one reference and the engine another while it works on it, so either side may give
 * up first.  Everything the caller sets is immutable after esx_engine_submit.
 */
#ifndef ESX_REQUEST_H
#define ESX_REQUEST_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <curl/curl.h>

#include "buf.h"
#include "gzip.h"

typedef struct esx_request esx_request;

/* Called once, on the engine's I/O thread, when the request is done (success or failure).
 * It must not block; it may take its own reference to keep the request. */
typedef void (*esx_done_fn)(esx_request *req, void *ud);

/* Failure kinds (err_kind); NULL means the call produced an HTTP response. */
#define ESX_EPOOL_TIMEOUT "pool_timeout"
#define ESX_ECONNECT_TIMEOUT "connect_timeout"
#define ESX_ECONNECT "connect"
#define ESX_ERESET "reset"
#define ESX_ESOCKET_TIMEOUT "socket_timeout"
#define ESX_EREQUEST_TIMEOUT "request_timeout"
#define ESX_EDECODE "decode"
#define ESX_ENO_NODES "no_nodes"
#define ESX_ECLOSED "closed"
#define ESX_EINTERNAL "internal"

enum esx_req_state { ESX_REQ_NEW, ESX_REQ_QUEUED, ESX_REQ_ACTIVE, ESX_REQ_BACKOFF, ESX_REQ_DONE };

struct esx_request {
    /* --- set by the caller before submit --- */
    char method[16];
    char *target;               /* "/path?query", owned */
    char *body;                 /* bytes as sent on the wire (gzip when body_gzip), owned */
    size_t body_len;
    size_t body_raw_len;        /* before compression */
    int body_gzip;
    unsigned short curl_lport, curl_rport; /* engine-private (here: in the padding before
                                            * headers): the libcurl attempt's connection's
                                            * local and remote ports, 0 before it has one */
    struct curl_slist *headers; /* per-request headers, owned */
    int max_retries;            /* attempts after the first */
    int64_t timeout_ms;         /* whole call, retries included; 0 = none */
    esx_done_fn on_done;
    void *on_done_ud;

    /* --- engine-private --- */
    uint64_t id;
    enum esx_req_state state;
    esx_request *next;          /* in the engine's queue or active list */
    int attempt;                /* 0 for the first try; > max_retries only for a request
                                 * salvaged off the wire with no retry left (engine.c) */
    int n429;                   /* 429 answers so far (back-off exponent) */
    uint64_t tried;             /* bit i: node i was tried in this call */
    int node;                   /* node index of the running attempt, -1 none */
    int local_errno;            /* libcurl attempt: errno of a socket this process could not
                                 * open (EMFILE, ...; engine_curl.c), 0 when none */
    int64_t submitted_at, deadline, pool_deadline, retry_at, last_activity;
    unsigned sent_marks;        /* its node's `marks` when the current attempt started */
    int nlocal;                 /* attempts that found no socket here (back-off exponent) */
    void *eng;                  /* the engine of the libcurl attempt (its socket callback) */
    CURL *easy;                 /* the attempt's libcurl transfer, or NULL */
    void *h1;                   /* the attempt's plain HTTP/1.1 connection (h1conn.h), or NULL */
    /* flags, 0 or 1 (chars: the struct must stay small, see esx_request_new) */
    unsigned char slot;            /* the attempt holds a connection slot */
    unsigned char probe;           /* the attempt is its dead node's probe (node.h `probing`) */
    unsigned char h1_redone;       /* the attempt moved once to a fresh connection (stale reuse) */
    unsigned char curl_connecting; /* the libcurl attempt's connection is not up (or reused) yet */
    unsigned char curl_stale;      /* the libcurl attempt stopped before sending: the idle
                                    * connection it was given had bytes waiting (engine_curl.c) */
    unsigned char head_done;       /* response header lines (engine.c): 0 in a final head,
                                    * 2 in an interim (1xx) one, 1 after the final head's end:
                                    * what libcurl passes on then is a trailer */
    unsigned char resp_gzip;       /* the response is gzip (Content-Encoding); 2: gzip twice */
    unsigned char resp_coded;      /* its Content-Encoding names a coding other than gzip and
                                    * identity: its body cannot be read (engine.c) */
    esx_inflater inflater;
    const char *abort_kind;     /* set by a callback that stopped the transfer */
    char abort_msg[128];        /* (every message fits: engine.c makes them in 128 bytes) */
    size_t wire_in;             /* response body bytes received on the wire */
    int curl_fd;                /* the libcurl attempt's socket once it has a connection,
                                 * else -1 (engine_curl.c) */
    unsigned char passed_on;    /* a response line or body bytes came since the last look
                                 * (here: in the padding after curl_fd) */
    int64_t curl_gap_at;        /* when curl_gap_from was last looked at */
    long long curl_gap_from;    /* bytes read from curl_fd when libcurl last passed on some
                                 * of them, -1 before the first look (engine_curl.c) */
    long long curl_base;        /* bytes read from curl_fd before this attempt's response, -1
                                 * when the kernel does not tell (engine_curl.c) */
    long long ul_seen;          /* request body bytes the attempt wrote: as of libcurl's
                                 * last progress call (then its total, when the attempt
                                 * ends), or as h1conn.c wrote them; stats().bytes counts them */
    uint64_t gen;               /* generation of the engine it was submitted to */
    int *watchers;                  /* nginx waiter connections to poke when done, oldest */
    int nwatchers, watchers_cap;    /* first (the engine's; any number of coroutines may
                                     * wait on one request) */

    /* --- result, valid once done --- */
    long status;
    esx_buf resp_headers;       /* "name: value\n" lines, names lowercased */
    esx_buf resp_body;          /* inflated body */
    const char *err_kind;       /* NULL on an HTTP response */
    char err_msg[256];
    char *node_url;             /* node of the last attempt (owned), NULL if none or out of
                                 * memory: read it with esx_request_node() */
    int retries;                /* attempts after the first that were made */
    unsigned head_in;           /* engine-private (here: in the padding before mu): the
                                 * attempt's response head and trailer bytes, every line
                                 * counted, kept or not, and bounded as h1.c bounds them */

    /* --- completion --- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_int done;
    atomic_int refs;
};

/* Allocates a request with one reference held by the caller.  Returns NULL when out of
 * memory.  max_response bounds the inflated response body.  (The struct stays under 1 KiB:
 * glibc serves larger blocks by first consolidating every small free block of the arena,
 * which the calling Lua thread's garbage fills, at a cost of several µs per call.) */
esx_request *esx_request_new(size_t max_response);

/* The URL of the node of the last attempt, "" if none. */
static inline const char *esx_request_node(const esx_request *req)
{
    return req->node_url ? req->node_url : "";
}

/* Records node_url (copied) as the node of the running attempt.  Out of memory, the node is
 * left unknown (""). */
void esx_request_set_node(esx_request *req, const char *node_url);

/* Takes another reference. */
void esx_request_ref(esx_request *req);

/* Drops a reference; the last one frees the request and everything it owns. */
void esx_request_unref(esx_request *req);

/* Waits until the request is done or timeout_ms passes (timeout_ms < 0: no limit).
 * Returns 1 when done, 0 on timeout. */
int esx_request_wait(esx_request *req, int64_t timeout_ms);

/* In a forked child, for a request inherited from the parent: makes its lock and condition
 * anew (the parent's I/O thread may have held the lock at the fork, and no thread of this
 * process will release it).  Only while no other thread of this process can use req. */
void esx_request_reset_locks(esx_request *req);

/* Marks the request done and wakes its waiters; called by the engine exactly once. */
void esx_request_complete(esx_request *req);

/* The value of response header `name` (lowercase) copied into out (NUL-terminated, truncated
 * to outlen), or NULL when absent. */
const char *esx_request_header(const esx_request *req, const char *name, char *out, size_t outlen);

/* The value of the first response header `name` (lowercase) as it is stored (leading spaces
 * skipped, not NUL-terminated; *len bytes), pointing into req's headers and valid until they
 * change; NULL when absent.  Nothing is copied, so a value of any length is seen whole. */
const char *esx_request_header_ref(const esx_request *req, const char *name, size_t *len);

#endif
