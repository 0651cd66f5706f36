/*
 * event.h -- parsing and validating beacon events from untrusted request bodies, and
 * writing each valid event as one Elasticsearch bulk document.
 *
 * Our own strict JSON parser (not lua-cjson): RFC 8259 grammar, UTF-8 checked (no
 * overlongs, no surrogates in raw UTF-8; \u escapes must pair), a nesting-depth limit,
 * numbers kept exactly as sent.  Output documents are minified (no whitespace outside
 * strings) so no byte of an event can break the NDJSON framing of a bulk request.
 *
 * A body is one JSON object, a JSON array of objects, or NDJSON (objects separated by
 * newlines).  Schema: site_id (1-64 of [A-Za-z0-9_.-]) and type (1-32 of the same) are
 * required strings; block_id and variant optional strings (1-64, same set); user_id an
 * optional string (1-128 bytes) or integer; event_id optional (1-64 of [A-Za-z0-9_.:-]),
 * becomes the document _id and is generated when missing; ts an optional number; any other
 * member is kept, except top-level names starting with '_' (Elasticsearch metadata) and a
 * client-sent received_at, which esx sets.  Duplicate member names are rejected.
 */
#ifndef ESX_EVENT_H
#define ESX_EVENT_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

#define ESX_EVENT_MAX_DEPTH 32

/* One valid event.  doc_off/doc_len locate its document in the output buffer: a minified
 * JSON object holding every kept member plus "received_at" and "event_id". */
typedef struct esx_event {
    size_t doc_off, doc_len;
    char event_id[65];
    char site_id[65];
    char type[33];
    char block_id[65];   /* "" when absent */
    char variant[65];    /* "" when absent */
    char user_id[129];   /* "" when absent; an integer user_id in its decimal text */
} esx_event;

typedef struct esx_event_reject {
    int index;           /* 0-based position of the event in the body */
    char reason[96];     /* e.g. "missing site_id", "type: invalid characters" */
} esx_event_reject;

/* Generates event ids: 20 characters of [A-Za-z0-9_-] from a per-collector random state. */
typedef struct esx_idgen {
    uint64_t s[2];
    long pid; /* the process that seeded it: a forked child reseeds on its next id, so
               * nginx workers forked from one master never share an id sequence */
} esx_idgen;

/* Seeds an id generator from the kernel's randomness (time and pid when there is none).
 * Never fails. */
void esx_idgen_init(esx_idgen *g);

/* Writes a new 20-character id and a NUL into out (at least 21 bytes). */
void esx_idgen_next(esx_idgen *g, char *out);

enum {
    ESX_EV_OK = 0,         /* parsed; events[] and rejects[] filled (either may be empty) */
    ESX_EV_NOT_JSON = -1,  /* the body is not JSON (nor NDJSON) at all: reason in *why */
    ESX_EV_TOO_MANY = -2,  /* more than max_events events */
    ESX_EV_NOMEM = -3,
    ESX_EV_TOOBIG = -4,    /* the output would pass out->max */
};

/* Parses body and appends one document per valid event to out.  received_at (ms since the
 * epoch) is written into every document.  Up to max_events events are accepted; events[]
 * and rejects[] must each have room for max_events entries.  why receives a reason (128
 * bytes) for ESX_EV_NOT_JSON.  On any error out is left as it was. */
int esx_events_parse(const char *body, size_t len, int64_t received_at, esx_idgen *ids,
                     esx_buf *out, esx_event *events, int *n_events, esx_event_reject *rejects,
                     int *n_rejects, int max_events, char *why);

/* Builds one event from a URL query string ("site_id=a&type=view&..."; percent- and
 * '+'-decoded; every value becomes a JSON string except ts, which must be an integer).
 * Same output and results as esx_events_parse with one event at index 0. */
int esx_event_from_query(const char *query, size_t len, int64_t received_at, esx_idgen *ids,
                         esx_buf *out, esx_event *event, int *n_events, esx_event_reject *reject,
                         int *n_rejects, char *why);

#endif
