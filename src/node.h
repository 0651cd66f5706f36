/*
 * node.h -- the Elasticsearch nodes of one client: URLs, liveness and selection.
 *
 * Selection is round-robin over live nodes that have a free connection slot.  A node that
 * fails to connect, resets a connection, or answers a retryable 5xx (retry_on_status) is dead
 * for min * 2^(failures-1) ms (capped at max); once that time has passed it is tried again,
 * and a success makes it alive.  Failures of attempts that were in flight when the node was
 * marked dead are not counted again.  When every
 * node is dead, the one due soonest that has a free slot is tried rather than failing
 * outright.
 */
#ifndef ESX_NODE_H
#define ESX_NODE_H

#include <stdint.h>

#define ESX_MAX_NODES 64

typedef struct esx_node {
    char url[512];        /* scheme://host:port[/prefix], no credentials, no trailing slash */
    int in_flight;        /* transfers running on this node (connection slots taken) */
    int probing;          /* a dead node's retry, once due, is in flight: the one request it
                           * gets until it answers (esx_nodes_pick) */
    int alive;
    int failures;         /* consecutive failures */
    int64_t dead_until;   /* monotonic ms; meaningful when !alive */
    unsigned marks;       /* failures counted so far (attempts remember it when sent) */
    uint64_t requests;    /* attempts sent to this node */
    int host_len;         /* the host's bytes after "scheme://" in url (brackets included) */
    int port;             /* the port, given or the scheme's default */
} esx_node;

typedef struct esx_nodes {
    esx_node v[ESX_MAX_NODES];
    int n;
    int next;             /* round-robin cursor */
} esx_nodes;

/* Parses one node URL ("http[s]://[user:pass@]host[:port][/prefix]") into node->url (the
 * credentials stripped) and returns 0; the credentials, if any, are copied to user/pass
 * (each at least 256 bytes, "" when absent), %XX escapes decoded.  Returns -1 with a reason
 * in why (256 bytes, never the URL or its credentials) when the URL is not an http(s) URL,
 * is too long, has an '@' after its host (credentials with an unencoded '/'), an IPv6 address
 * without its closing bracket, or a port outside 1-65535. */
int esx_node_parse(esx_node *node, const char *url, char *user, char *pass, char *why);

/* The most nodes that share one host and port (1 for distinct nodes; more when nodes differ
 * only in their path prefix, or a URL is listed twice). */
int esx_nodes_max_per_host(const esx_nodes *nodes);

enum { ESX_PICK_OK = 0, ESX_PICK_BUSY = 1, ESX_PICK_NONE = 2 };

/* Picks a node for an attempt.  Nodes whose index is set in `tried` are avoided when another
 * eligible node has a free slot.  A dead node due for a retry gets one request (its probe,
 * `probing`, which the caller sets and clears) until it answers; meanwhile it is skipped like a
 * dead one that is not due.  Returns ESX_PICK_OK with *out set; ESX_PICK_BUSY when the
 * eligible nodes have no free slot, or the only due node's probe is in flight (wait);
 * ESX_PICK_NONE when every node is dead, none is due and resurrect is 0. */
int esx_nodes_pick(esx_nodes *nodes, int64_t now, int max_per_route, uint64_t tried,
                   int resurrect, esx_node **out);

/* Records a failure that makes the node dead (connect errors, resets, retryable 5xx) of an
 * attempt sent when the node's `marks` was sent_marks.  An attempt that was already in flight
 * when the node was marked dead adds no failure: concurrent requests failing together are one
 * outage, not n. */
void esx_node_failed(esx_node *node, int64_t now, unsigned sent_marks, int64_t backoff_min,
                     int64_t backoff_max);

/* Records a success: the node is alive again. */
void esx_node_succeeded(esx_node *node);

#endif
