/*
 * event.h -- parsing and validating beacon events from untrusted request bodies, and
 * writing each valid event as one Elasticsearch bulk document.
 *
 * Our own strict JSON parser (json.h, not lua-cjson): RFC 8259 grammar, UTF-8 checked (no
 * overlongs, no surrogates in raw UTF-8, nothing above U+10FFFF; \u escapes must pair), a
 * nesting-depth limit, numbers kept exactly as sent.  Output documents are minified (no
 * whitespace outside strings; JSON strings cannot hold a raw newline) so no byte of an event
 * can break the NDJSON framing of a bulk request.
 *
 * Body forms:
 *   - one JSON object: event 0;
 *   - a JSON array: element i is event i (elements that are not objects are rejected);
 *   - NDJSON: a body starting with '{' that is not one object, or a body of more than one
 *     line that is not one JSON value and whose first line is not the start of a broken
 *     array (it starts with neither '{' nor '[', or is one array); each line that is not
 *     blank (JSON whitespace only) is the next event; a line that is not one JSON value is
 *     rejected ("invalid JSON"), one that is not an object "not an object", the others are
 *     still read -- the first line as any other.
 *   A UTF-8 byte-order mark (EF BB BF) at the very start of the body is skipped (RFC 8259
 *   8.1 lets a parser ignore it); one anywhere else is not JSON whitespace.
 *   Anything else -- empty, a scalar, a broken array, NDJSON none of whose lines is JSON --
 *   is ESX_EV_NOT_JSON, with a reason such as "invalid JSON at byte 7: expected ':'".
 *   Events are counted before any is processed: more than max_events (valid or not) is
 *   ESX_EV_TOO_MANY.  A body nested deeper than ESX_JSON_HARD_DEPTH (512) is not JSON.
 *
 * Schema: site_id (1-64 of [A-Za-z0-9_.-]) and type (1-32 of the same) are required strings;
 * block_id and variant optional strings (1-64, same set); user_id an optional string (1-128
 * bytes, no NUL) or integer (kept as its text, shipped as a string); event_id optional (1-64 of [A-Za-z0-9_.:-]),
 * becomes the document _id and is generated when missing; ts an optional number; any other
 * member is kept.  A client-sent received_at is dropped (esx sets it).  Names are compared
 * after decoding escapes ("site\u005fid" is site_id).  Nesting: the event object is level
 * 1; at most ESX_EVENT_MAX_DEPTH levels.
 *
 * Output: for each valid event, its members in the original order, minified, numbers and
 * string escapes byte-exact (an integer user_id becomes a string of the same digits, as a
 * query string's user_id is: one JSON type for the field, or Elasticsearch's dynamic
 * mapping of the day's index takes the first one seen and refuses the other), then "received_at":<ms> and, when the client sent none,
 * "event_id":"<20 chars>"; each document is followed by '\n' (not counted in doc_len), so
 * out holds NDJSON of the documents.
 *
 * Reject reasons (stable; printable ASCII only, at most 95 bytes):
 *   "not an object"                 an array element or NDJSON line that is not an object
 *   "invalid JSON"                  an NDJSON line that is not one JSON value
 *   "invalid UTF-8"                 in any string or name
 *   "invalid escape"                unknown escape, bad \u hex, unpaired \u surrogate
 *   "control character in string"   a raw byte < 0x20 inside a string
 *   "nesting deeper than 32"
 *   "duplicate member name"         two names of one object (any level) decode alike
 *   "empty member name"             a "" (at any level, as the three below: names
 *                                   Elasticsearch's document parser refuses for good)
 *   "member name of dots only"      ".."
 *   "member name with an empty part (a leading dot or two dots in a row)"   ".a", "a..b"
 *   "member name (or a part of it between dots) of whitespace only"   " ", "a. .b"
 *   "member name with a dot after a field of the schema (site_id, ts, ...)"   a top-level
 *                                   "ts.x", "site_id.a", "ts." (a date or keyword there)
 *   "objects nested deeper than 20 (Elasticsearch's index.mapping.depth.limit)"
 *                                   the event is level 1, each object one more (arrays
 *                                   none), a dotted name one per part but its last
 *   "reserved field <name>"         a top-level name starting with '_' (Elasticsearch
 *                                   metadata): the event is rejected, not silently cut;
 *                                   <name> cut to 64 bytes + "...", non-printables as '?'
 *   "missing site_id", "missing type"
 *   "<field>: not a string"          site_id, type, block_id, variant, event_id
 *   "<field>: invalid length"        those and user_id
 *   "<field>: invalid characters"    those and user_id (a NUL)
 *   "user_id: not a string or integer"
 *   "ts: not a number"
 *   and from query strings: "invalid percent-encoding", "ts: not an integer".
 *   The first problem found wins, in this order: form, flaws, depth, duplicates, then the
 *   members in order, then the missing fields.
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

/* Writes a new 20-character id and a NUL into out (at least 21 bytes).  Never fails. */
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
 * and rejects[] must each have room for max_events entries (rejects[] in increasing index
 * order).  why (128 bytes, may be NULL) receives a reason for every error.  On any error
 * out is left as it was and *n_events = *n_rejects = 0.  The caller owns every buffer;
 * nothing is kept after the call (ids advances). */
int esx_events_parse(const char *body, size_t len, int64_t received_at, esx_idgen *ids,
                     esx_buf *out, esx_event *events, int *n_events, esx_event_reject *rejects,
                     int *n_rejects, int max_events, char *why);

/* Builds one event from a URL query string ("site_id=a&type=view&..."; percent- and
 * '+'-decoded; every value becomes a JSON string except ts, which must be an integer; a
 * name without '=' gets ""; empty pairs are skipped; decoded bytes must be UTF-8).
 * Same output and results as esx_events_parse with one event at index 0; event and reject
 * each point to one entry.  Fails only with ESX_EV_NOMEM or ESX_EV_TOOBIG. */
int esx_event_from_query(const char *query, size_t len, int64_t received_at, esx_idgen *ids,
                         esx_buf *out, esx_event *event, int *n_events, esx_event_reject *reject,
                         int *n_rejects, char *why);

#endif
