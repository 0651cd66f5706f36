/*
 * engine.h -- the I/O engine of one client: a libcurl multi handle driven by a thread the
 * core owns.  No Lua state is ever touched here.
 *
 * Callers hand requests in through a mutex-protected queue and wake the thread with
 * curl_multi_wakeup; only the I/O thread touches the multi and easy handles.  The engine
 * counts connection slots itself (per node and in total) and starts a transfer only when a
 * slot is free, so libcurl never queues a transfer silently; a request that waits longer
 * than pool_timeout fails with "pool_timeout".  Socket silence, connect and whole-call
 * deadlines are checked in milliseconds by the loop.
 */
#ifndef ESX_ENGINE_H
#define ESX_ENGINE_H

#include <stdint.h>
#include <sys/types.h>

#include "config.h"
#include "node.h"
#include "request.h"

#define ESX_NKINDS 10
extern const char *const esx_failure_kinds[ESX_NKINDS];

typedef struct esx_stats {
    uint64_t requests;             /* calls submitted */
    uint64_t responses;            /* calls that ended with an HTTP response */
    uint64_t retries;              /* attempts after a call's first */
    uint64_t rebuilds;             /* engines rebuilt after a fork or an internal failure */
    uint64_t pool_timeouts;
    uint64_t failures[ESX_NKINDS]; /* calls that ended with each transport failure kind */
    uint64_t sent_raw, sent_wire, received_wire, received_raw; /* body bytes */
    int in_use, idle, waiting, open;
} esx_stats;

typedef struct esx_engine esx_engine;

/* Creates an engine with a copy of cfg (without its header strings, which stay the
 * caller's) and starts its I/O thread.  Node states
 * and counters are carried over from `prev` when given (a rebuild).  Returns NULL with a
 * reason in why (256 bytes) on failure. */
esx_engine *esx_engine_new(const esx_config *cfg, const esx_engine *prev, char *why);

/* Queues req (the engine takes its own reference).  Returns 0, or -1 when the engine is
 * stopping (req untouched). */
int esx_engine_submit(esx_engine *e, esx_request *req);

/* 1 when the engine's thread runs and belongs to this process. */
int esx_engine_healthy(const esx_engine *e);

/* 1 when the engine was created by this process (not inherited through fork). */
int esx_engine_ours(const esx_engine *e);

/* Stops the thread, fails unfinished requests with "closed" and frees everything.
 * Must be called in the process that created the engine.  Called on the engine's own I/O
 * thread (from a request's on_done), it only tells the thread to stop: the thread frees the
 * engine when its loop ends, after this call has returned.  Either way e is the engine's no
 * more once this returns. */
void esx_engine_free(esx_engine *e);

/* In a process whose I/O thread died (same process), joins the dead thread, hands every
 * unfinished request to `to`, and frees e.  A request that was on the wire goes again as a
 * retry when it has one left, else `to` fails it with "internal"; queued ones keep their
 * place in the count. */
void esx_engine_salvage(esx_engine *e, esx_engine *to);

/* In a forked child: closes the sockets the parent's engine had open (the parent keeps
 * using them) and forgets e without touching its locks or thread.  Requests that were in
 * flight at the fork belong to the parent; in the child they fail with "closed". */
void esx_engine_abandon(esx_engine *e);

/* Copies the counters and node states under the engine's lock. */
void esx_engine_stats(esx_engine *e, esx_stats *stats, esx_nodes *nodes);

/* The unix socket path nginx waiters connect to (created on first use), or NULL with a
 * reason in why (256 bytes). */
const char *esx_engine_waiter_path(esx_engine *e, char *why);

/* Test hook: makes the I/O thread exit at once, as if it had died. */
void esx_engine_debug_kill(esx_engine *e);

/* The engine generation a request was last submitted to (0 = none). */
uint64_t esx_engine_generation(const esx_engine *e);

#endif
