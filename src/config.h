/*
 * config.h -- a client's validated settings (the Lua side checks names, types and ranges;
 * the binding copies them here).  Owned by the client; the engine only reads it.
 */
#ifndef ESX_CONFIG_H
#define ESX_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "node.h"

#define ESX_MAX_RETRY_STATUS 16
#define ESX_MAX_HEADERS 32
#define ESX_MAX_HEAD (1024 * 1024) /* bytes of a request head: request line and headers */

typedef struct esx_config {
    esx_nodes nodes;                 /* initial node list (all alive) */
    char username[256], password[256];
    char api_key[512];
    int64_t connect_timeout, socket_timeout, request_timeout; /* ms; 0 = none */
    int64_t pool_timeout;            /* ms to wait for a slot; 0 = only take a free one */
    int max_per_route, max_total;
    int compression, compression_level;
    size_t compression_min_bytes;
    size_t max_response_bytes;
    int max_retries;
    int retry_on_status[ESX_MAX_RETRY_STATUS];
    int n_retry_on_status;
    int64_t dead_backoff_min, dead_backoff_max;
    int resurrect;                   /* all nodes dead: try the one due soonest */
    int tls_verify;
    char ca_file[1024];
    char *headers[ESX_MAX_HEADERS];  /* "Name: value", owned (free with esx_config_free) */
    int n_headers;
} esx_config;

/* Frees what the config owns (header strings). */
void esx_config_free(esx_config *cfg);

#endif
