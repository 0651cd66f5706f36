/*
 * json.h -- a strict, non-allocating JSON scanner for untrusted bytes (RFC 8259), shared by
 * the event parser (event.c) and the _bulk response reader (bulk_response.c).
 *
 * esx_json_scan checks one value without building anything: the grammar exactly (numbers
 * included: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), UTF-8 (no overlongs, no
 * surrogates encoded in UTF-8, nothing above U+10FFFF), escapes (\u surrogates must pair) and
 * nesting depth.  It is iterative (no recursion), so hostile nesting cannot exhaust the C
 * stack; ESX_JSON_HARD_DEPTH bounds it.
 *
 * Defects that leave the framing intact -- bad UTF-8, a bad escape, a raw control character
 * inside a string -- are reported in esx_json_val.flaw instead of failing the scan, so that
 * one bad event in an array can be rejected on its own.  Strict callers treat flaw != 0 as
 * invalid JSON.
 *
 * Values are spans into the caller's bytes; nothing is copied and nothing is allocated,
 * except by esx_json_duplicate (a scratch buffer, freed before it returns).
 */
#ifndef ESX_JSON_H
#define ESX_JSON_H

#include <stddef.h>

#include "buf.h"

#define ESX_JSON_HARD_DEPTH 512

enum {
    ESX_JSON_NULL = 1,
    ESX_JSON_FALSE,
    ESX_JSON_TRUE,
    ESX_JSON_NUMBER,
    ESX_JSON_STRING,
    ESX_JSON_ARRAY,
    ESX_JSON_OBJECT,
};

/* Flaws: the value is framed correctly but is not valid JSON. */
enum {
    ESX_JSON_F_UTF8 = 1,    /* invalid UTF-8 inside a string */
    ESX_JSON_F_ESCAPE = 2,  /* unknown escape, bad \u hex, unpaired \u surrogate */
    ESX_JSON_F_CONTROL = 3, /* raw byte < 0x20 inside a string */
};

typedef struct esx_json_val {
    const char *p; /* first byte of the value */
    size_t len;    /* its length, without surrounding whitespace */
    int type;      /* ESX_JSON_* */
    int depth;     /* nesting: 0 for a scalar, 1 for [] / {} / [1], 2 for [[]] ... */
    int flaw;      /* 0 or the first ESX_JSON_F_* found */
} esx_json_val;

/* Scans one value in s[*pos..len), skipping whitespace before it (not after it).  Returns 0
 * and fills v (*pos moves past the value), or -1 when the bytes are not a JSON value (bad
 * grammar, unterminated, deeper than ESX_JSON_HARD_DEPTH); then why (whylen bytes, may be
 * NULL) says what and where, and *pos is unchanged.  Never allocates. */
int esx_json_scan(const char *s, size_t len, size_t *pos, esx_json_val *v, char *why,
                  size_t whylen);

/* Index of the first byte at or after pos that is not JSON whitespace (len if none). */
size_t esx_json_skip_ws(const char *s, size_t len, size_t pos);

/* A short, stable description of a flaw ("invalid UTF-8", ...); "" for 0. */
const char *esx_json_flaw_str(int flaw);

/* Walks the members of an object or the elements of an array that esx_json_scan accepted
 * (calling it on anything else is undefined, but stays within the container's bytes).
 * esx_json_iter_init does not check the members again (the container's scan did): their
 * `flaw` is 0 -- the container's flaw covers them.  esx_json_iter_init_checked scans each
 * member in full, for callers that need every member's own flaw. */
typedef struct esx_json_iter {
    const char *s;
    size_t len, pos;
    int object;
    int checked;
} esx_json_iter;

void esx_json_iter_init(esx_json_iter *it, const esx_json_val *container);
void esx_json_iter_init_checked(esx_json_iter *it, const esx_json_val *container);

/* Returns 1 with the next member (key is NULL-safe: for arrays it is left untouched) or 0
 * at the end. */
int esx_json_iter_next(esx_json_iter *it, esx_json_val *key, esx_json_val *val);

/* Decodes a string value (a flawless one; flawed strings decode to something bounded but
 * unspecified) into out, writing at most cap bytes and no NUL.  Returns the full decoded
 * length, which may be more than cap (then out holds the first cap bytes, possibly cut
 * inside a UTF-8 sequence). */
size_t esx_json_str_decode(const esx_json_val *str, char *out, size_t cap);

/* 1 when the decoded string equals the n bytes of lit. */
int esx_json_str_eq(const esx_json_val *str, const char *lit, size_t n);

/* Appends the value to out with every whitespace byte outside strings removed; numbers,
 * strings and escapes stay byte-exact.  Returns ESX_BUF_OK, ESX_BUF_TOOBIG or ESX_BUF_NOMEM
 * (then out->len is as it was). */
int esx_json_write_min(const esx_json_val *v, esx_buf *out);

/* Looks for two members of one object (at any depth inside v) whose names decode to the same
 * bytes.  Returns 1 when there are some, 0 when not, -1 when out of memory. */
int esx_json_duplicate(const esx_json_val *v);

/* 1 when two member names (strings) decode to the same bytes, 0 when not, -1 when out of
 * memory (names longer than 64 bytes with escapes). */
int esx_json_same_name(const esx_json_val *a, const esx_json_val *b);

/* Appends s (n bytes, copied as they are: callers that need valid UTF-8 check it) as a JSON
 * string with quotes, escaping '"', '\\' and control bytes (\b \f \n \r \t short, the others
 * as \u00XX).  Returns as esx_buf_append (out->len unchanged on failure). */
int esx_json_write_str(esx_buf *out, const char *s, size_t n);

/* Length of the valid UTF-8 prefix of s[0..n): n when all of it is valid. */
size_t esx_utf8_valid_prefix(const unsigned char *s, size_t n);

#endif
