/*
 * config.c -- freeing what a client config owns (see config.h).
 */
#include <stdlib.h>

#include "config.h"

void esx_config_free(esx_config *cfg)
{
    for (int i = 0; i < cfg->n_headers; i++)
        free(cfg->headers[i]);
    cfg->n_headers = 0;
}
