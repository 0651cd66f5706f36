/*
 * test_client.h -- a client of one node that nothing listens on (127.0.0.1:9), with short
 * timeouts, for the unit programs that need an engine but no server (exit_rebuild.c,
 * fork_adopt.c).  Returns it, or NULL.
 */
#ifndef ESX_TEST_CLIENT_H
#define ESX_TEST_CLIENT_H

#include <string.h>

#include "client.h"

static esx_client *test_client(void)
{
    esx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    char user[256], pass[256], why[256];
    if (esx_node_parse(&cfg.nodes.v[0], "http://127.0.0.1:9", user, pass, why) != 0)
        return NULL;
    cfg.nodes.n = 1;
    cfg.connect_timeout = cfg.socket_timeout = cfg.pool_timeout = 1000;
    cfg.max_per_route = cfg.max_total = 2;
    cfg.max_response_bytes = 1 << 20;
    cfg.dead_backoff_min = cfg.dead_backoff_max = 1000;
    return esx_client_new(&cfg, why);
}

#endif
