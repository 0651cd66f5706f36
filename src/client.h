/*
 * client.h -- an Elasticsearch client: its settings and an engine that heals itself.
 *
 * The client owns its config and one engine.  Before each use it checks the engine: in a
 * process forked after the engine was made (nginx workers) it abandons the parent's engine
 * and builds its own; when the I/O thread has died it builds a new engine and moves the
 * unfinished requests onto it.  No state exists in which the caller must recreate a client.
 * Submitting is thread-safe (a Lua state and a collector's shipper thread share a client);
 * everything else is called from the owning Lua state's thread.
 */
#ifndef ESX_CLIENT_H
#define ESX_CLIENT_H

#include "config.h"
#include "engine.h"
#include "request.h"

typedef struct esx_client {
    esx_config cfg;
    esx_engine *engine;
    uint64_t fork_gen;   /* requests of older engine generations were the parent's */
    atomic_int closed;
    atomic_int refs;
    pthread_mutex_t mu;  /* guards engine replacement: Lua and a collector's shipper submit */
    atomic_int pid;      /* process that initialised mu (re-initialised after a fork, once:
                          * client.c's client_lock) */
} esx_client;

/* Creates a client from cfg, taking ownership of what cfg owns (header strings).  Returns
 * NULL with a reason in why (256 bytes); cfg's strings are freed in that case too. */
esx_client *esx_client_new(esx_config *cfg, char *why);

void esx_client_ref(esx_client *c);

/* Drops a reference; the last one closes the client and frees it. */
void esx_client_unref(esx_client *c);

/* Stops the engine (unfinished requests fail with "closed"); later submits fail. */
void esx_client_close(esx_client *c);

/* 1 once esx_client_close was called (from any thread). */
int esx_client_closed(esx_client *c);

/* Makes sure the engine is usable in this process (see above).  Returns 0, or -1 with a
 * reason in why (256 bytes) when a new engine cannot be built (the next call tries again). */
int esx_client_heal(esx_client *c, char *why);

/* Builds a request: copies method, target and body, compresses the body when the config
 * asks for it, and assembles the headers (config headers, auth, content type, gzip, extra
 * "Name: value" lines).  max_retries < 0 means the config's.  Returns NULL with a reason in
 * why (256 bytes) when out of memory. */
esx_request *esx_client_prepare(esx_client *c, const char *method, const char *target,
                                const char *body, size_t body_len, const char *content_type,
                                const char *const *extra, int n_extra, int max_retries,
                                int64_t timeout_ms, char *why);

/* Heals if needed and hands req to the engine.  Returns 0, or -1 with the error kind in
 * *kind and a reason in why (256 bytes). */
int esx_client_submit(esx_client *c, esx_request *req, const char **kind, char *why);

/* Waits for req up to timeout_ms (< 0: until done), healing the engine if it dies meanwhile.
 * Returns 1 when done, 0 on timeout. */
int esx_client_wait(esx_client *c, esx_request *req, int64_t timeout_ms);

/* Non-blocking: 1 when req is done.  Heals, and fails requests orphaned by a fork. */
int esx_client_poll(esx_client *c, esx_request *req);

/* Heals, then copies the engine's counters and nodes.  Returns 0; -1 when closed; -2 with a
 * reason in why (256 bytes) when a forked child could not build its own engine (the
 * parent's is not read: its state is the parent's, its lock maybe held at the fork). */
int esx_client_stats(esx_client *c, esx_stats *stats, esx_nodes *nodes, char *why);

/* The waiter socket path of the current engine (see esx_engine_waiter_path), or NULL with a
 * reason in why (256 bytes).  The path stays valid until the engine is replaced. */
const char *esx_client_waiter_path(esx_client *c, char *path_out, size_t outlen, char *why);

/* Test hook: kills the current engine's I/O thread. */
void esx_client_debug_kill(esx_client *c);

#endif
