/*
 * bulk_response.h -- reads the per-item results of an Elasticsearch _bulk response
 * (untrusted bytes from the network or a proxy; parsed with the strict JSON parser).
 *
 * Response shape: {"took":N,"errors":bool,"items":[{"<action>":{"_index":..,"_id":..,
 * "status":N,"error":{"type":..,"reason":..}}}, ...]} -- items in request order.
 */
#ifndef ESX_BULK_RESPONSE_H
#define ESX_BULK_RESPONSE_H

#include <stddef.h>

typedef struct esx_bulk_item {
    int status;          /* HTTP status of the item; 0 when missing */
    char error_type[64]; /* "" on success */
    char reason[160];    /* "" on success; truncated */
} esx_bulk_item;

/* Parses body into items[0..n-1] where n must equal the number of items in the response.
 * Returns 0, or -1 with a reason in why (128 bytes) when the body is not a bulk response,
 * is not valid JSON, or lists a different number of items than n. */
int esx_bulk_response_parse(const char *body, size_t len, esx_bulk_item *items, int n,
                            char *why);

#endif
