/*
 * event.c -- beacon events from untrusted bodies to bulk documents (see event.h).
 *
 * A body is scanned once as a whole (json.c, no allocation); its events are then walked in
 * place.  Every check that can reject an event runs before anything of it is written, so a
 * reject leaves no partial document behind.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "event.h"
#include "hash.h"
#include "proc.h"
#include "json.h"

/* ---- ids: xorshift128+ seeded by splitmix64 from the kernel ---- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void esx_idgen_init(esx_idgen *g)
{
    uint64_t x = esx_random_seed() ^ ((uint64_t)esx_pid() << 40);
    g->s[0] = splitmix64(&x);
    g->s[1] = splitmix64(&x);
    if ((g->s[0] | g->s[1]) == 0)
        g->s[1] = 1;
    g->pid = (long)esx_pid();
}

static uint64_t xorshift128p(esx_idgen *g)
{
    uint64_t s1 = g->s[0];
    const uint64_t s0 = g->s[1];
    g->s[0] = s0;
    s1 ^= s1 << 23;
    g->s[1] = s1 ^ s0 ^ (s1 >> 17) ^ (s0 >> 26);
    return g->s[1] + s0;
}

void esx_idgen_next(esx_idgen *g, char *out)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    if (g->pid != (long)esx_pid())
        esx_idgen_init(g);
    uint64_t a = xorshift128p(g), b = xorshift128p(g);
    for (int i = 0; i < 10; i++) {
        out[i] = alphabet[a & 63];
        out[10 + i] = alphabet[b & 63];
        a >>= 6;
        b >>= 6;
    }
    out[20] = '\0';
}

/* ---- one event ---- */

typedef struct ctx {
    char tail[48];  /* "\"received_at\":<ms>", the same for every event of the body */
    size_t tail_len;
    esx_idgen *ids;
    esx_buf *out;
} ctx;

static void ctx_init(ctx *c, int64_t received_at, esx_idgen *ids, esx_buf *out)
{
    c->ids = ids;
    c->out = out;
    c->tail_len = sizeof "\"received_at\":" - 1;
    memcpy(c->tail, "\"received_at\":", c->tail_len);
    c->tail_len += esx_format_i64(c->tail + c->tail_len, received_at);
}

static int ident_char(unsigned char ch, int colon)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '.' || ch == '-' || (colon && ch == ':');
}

/* A string field of identifier characters, 1..max bytes, copied NUL-terminated to dst. */
static int check_ident(const esx_json_val *v, const char *name, size_t max, int colon,
                       char *dst, char *reason)
{
    char tmp[129];
    if (v->type != ESX_JSON_STRING) {
        snprintf(reason, 96, "%s: not a string", name);
        return 0;
    }
    size_t l = esx_json_str_decode(v, tmp, max);
    if (l == 0 || l > max) {
        snprintf(reason, 96, "%s: invalid length", name);
        return 0;
    }
    for (size_t i = 0; i < l; i++)
        if (!ident_char((unsigned char)tmp[i], colon)) {
            snprintf(reason, 96, "%s: invalid characters", name);
            return 0;
        }
    memcpy(dst, tmp, l);
    dst[l] = '\0';
    return 1;
}

static int check_user_id(const esx_json_val *v, char *dst, char *reason)
{
    if (v->type == ESX_JSON_STRING) {
        size_t l = esx_json_str_decode(v, dst, 128);
        if (l == 0 || l > 128) {
            snprintf(reason, 96, "user_id: invalid length");
            return 0;
        }
        if (memchr(dst, '\0', l)) {
            snprintf(reason, 96, "user_id: invalid characters");
            return 0;
        }
        dst[l] = '\0';
        return 1;
    }
    if (v->type == ESX_JSON_NUMBER && !memchr(v->p, '.', v->len) && !memchr(v->p, 'e', v->len) &&
        !memchr(v->p, 'E', v->len)) {
        if (v->len > 128) {
            snprintf(reason, 96, "user_id: invalid length");
            return 0;
        }
        memcpy(dst, v->p, v->len);
        dst[v->len] = '\0';
        return 1;
    }
    snprintf(reason, 96, "user_id: not a string or integer");
    return 0;
}

/* "reserved field <name>" with the name cut to 64 bytes and anything but printable ASCII
 * (and '"', '\\') shown as '?', so that reasons are safe in any answer or log line. */
static void reserved_reason(const esx_json_val *key, char *reason)
{
    char name[65];
    size_t l = esx_json_str_decode(key, name, 64);
    size_t k = l > 64 ? 64 : l;
    for (size_t i = 0; i < k; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch < 0x20 || ch > 0x7E || ch == '"' || ch == '\\')
            name[i] = '?';
    }
    name[k] = '\0';
    snprintf(reason, 96, "reserved field %s%s", name, l > 64 ? "..." : "");
}

/* Length of the character at p (n >= 1 bytes left) when Java's Character.isWhitespace takes
 * it -- what String.isBlank, with which Elasticsearch checks field names, skips: ASCII
 * blanks, U+001C-U+001F and the Unicode space, line and paragraph separators but the
 * no-break ones (U+00A0, U+2007, U+202F) -- else 0. */
static size_t java_space(const unsigned char *p, size_t n)
{
    if (*p == ' ' || (*p >= '\t' && *p <= '\r') || (*p >= 0x1C && *p <= 0x1F))
        return 1;
    if (n < 3)
        return 0;
    if ((p[0] == 0xE1 && p[1] == 0x9A && p[2] == 0x80) ||                    /* U+1680 */
        (p[0] == 0xE2 && p[1] == 0x80 &&
         ((p[2] >= 0x80 && p[2] <= 0x8A && p[2] != 0x87) || p[2] == 0xA8 || p[2] == 0xA9)) ||
        (p[0] == 0xE2 && p[1] == 0x81 && p[2] == 0x9F) ||                      /* U+205F */
        (p[0] == 0xE3 && p[1] == 0x80 && p[2] == 0x80))                        /* U+3000 */
        return 3;
    return 0;
}

/* Why Elasticsearch refuses a document with this member name (its decoded bytes d[0..n)) for
 * good, at any level, or NULL.  Its document parser splits a name at dots into object levels
 * (as Java's split: trailing empty parts dropped, so "a." is "a") and refuses "", a name of
 * dots only, an empty part (".a", "a..b") and a part of whitespace only (String.isBlank):
 * accepted here, such an event would get its 2xx and then only reach the dead letters. */
enum { F_OTHER, F_SITE, F_TYPE, F_BLOCK, F_VARIANT, F_USER, F_EVENT, F_TS, F_RECEIVED };

static int field_of_plain(const char *p, size_t n);

static const char *name_refused(const unsigned char *d, size_t n, int top, int *parts)
{
    *parts = 1;
    if (n == 0)
        return "empty member name";
    size_t m = n;
    while (m > 0 && d[m - 1] == '.')
        m--;
    if (m == 0)
        return "member name of dots only";
    for (size_t start = 0, i = 0; i <= m; i++) {
        if (i < m && d[i] != '.')
            continue;
        if (i == start)
            return "member name with an empty part (a leading dot or two dots in a row)";
        size_t k = start, w;
        while (k < i && (w = java_space(d + k, i - k)) > 0)
            k += w;
        if (k >= i)
            return "member name (or a part of it between dots) of whitespace only";
        /* a dotted top-level name under a field of esx's mappings ("ts.x", "site_id.a",
         * "ts."): that field is a date or a keyword, and cannot hold an object or a second
         * value of another type -- or, without create_index, it would be made an object */
        if (top && start == 0 && i < n && field_of_plain((const char *)d, i) != F_OTHER)
            return "member name with a dot after a field of the schema (site_id, ts, ...)";
        if (i < m)
            ++*parts;
        start = i + 1;
    }
    return NULL;
}

/* Checks a member name as name_refused does, decoding escapes first; *parts gets the object
 * levels it stands for.  Returns 1, 0 (reason filled) or ESX_EV_NOMEM (a long name with
 * escapes, and no memory to decode it). */
static int check_name(const esx_json_val *key, int top, int *parts, char *reason)
{
    if (!memchr(key->p, '\\', key->len)) {
        const char *why = name_refused((const unsigned char *)key->p + 1, key->len - 2, top, parts);
        if (why)
            snprintf(reason, 96, "%s", why);
        return why == NULL;
    }
    char small[256], *d = small;
    size_t n = esx_json_str_decode(key, small, sizeof small);
    if (n > sizeof small) { /* decoded, a name is no longer than its text */
        if ((d = malloc(n)) == NULL)
            return ESX_EV_NOMEM;
        esx_json_str_decode(key, d, n);
    }
    const char *why = name_refused((const unsigned char *)d, n, top, parts);
    if (d != small)
        free(d);
    if (why)
        snprintf(reason, 96, "%s", why);
    return why == NULL;
}

/* Elasticsearch's default index.mapping.depth.limit: the event is level 1, each object one
 * more (arrays add none), and a dotted name one per part but its last ("a.b": {} is at 3). */
#define ESX_EVENT_MAX_OBJECT_DEPTH 20

static int too_deep(char *reason)
{
    snprintf(reason, 96, "objects nested deeper than %d (Elasticsearch's index.mapping.depth.limit)",
             ESX_EVENT_MAX_OBJECT_DEPTH);
    return 0;
}

/* Checks the member names of every object inside v (a member's value: an object or an array,
 * flawless, at most ESX_EVENT_MAX_DEPTH deep, which bounds the recursion) and the depth of
 * its objects, v being at `depth` if it is one.  Returns as check_name. */
static int check_names_in(const esx_json_val *v, int depth, char *reason)
{
    esx_json_iter it;
    esx_json_val key, val;
    int obj = v->type == ESX_JSON_OBJECT, rc, parts = 0;
    if (obj && depth > ESX_EVENT_MAX_OBJECT_DEPTH)
        return too_deep(reason);
    esx_json_iter_init(&it, v);
    while (esx_json_iter_next(&it, obj ? &key : NULL, &val)) {
        if (obj) {
            if ((rc = check_name(&key, 0, &parts, reason)) != 1)
                return rc;
            if (depth + parts - 1 > ESX_EVENT_MAX_OBJECT_DEPTH)
                return too_deep(reason); /* the objects of a dotted name's parts */
        }
        if (val.depth > 0 && memchr(val.p, '{', val.len) &&
            (rc = check_names_in(&val, depth + parts, reason)) != 1)
            return rc;
    }
    return 1;
}


/* A name without escapes is its bytes: matched by length, then bytes. */
static int field_of_plain(const char *p, size_t n)
{
    switch (n) {
    case 2: return memcmp(p, "ts", 2) == 0 ? F_TS : F_OTHER;
    case 4: return memcmp(p, "type", 4) == 0 ? F_TYPE : F_OTHER;
    case 7:
        return memcmp(p, "site_id", 7) == 0   ? F_SITE
               : memcmp(p, "variant", 7) == 0 ? F_VARIANT
               : memcmp(p, "user_id", 7) == 0 ? F_USER
                                              : F_OTHER;
    case 8:
        return memcmp(p, "block_id", 8) == 0   ? F_BLOCK
               : memcmp(p, "event_id", 8) == 0 ? F_EVENT
                                               : F_OTHER;
    case 11: return memcmp(p, "received_at", 11) == 0 ? F_RECEIVED : F_OTHER;
    default: return F_OTHER;
    }
}

static int field_of(const esx_json_val *key)
{
    static const struct {
        const char *name;
        int f;
    } names[] = {
        {"site_id", F_SITE}, {"type", F_TYPE},       {"block_id", F_BLOCK},
        {"variant", F_VARIANT}, {"user_id", F_USER}, {"event_id", F_EVENT},
        {"ts", F_TS},        {"received_at", F_RECEIVED},
    };
    if (key->len > 2 + 16 && !memchr(key->p, '\\', key->len))
        return F_OTHER; /* longer than any schema name */
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (esx_json_str_eq(key, names[i].name, strlen(names[i].name)))
            return names[i].f;
    return F_OTHER;
}

/* ts is mapped as a date of format epoch_millis (create_index): a number Elasticsearch's
 * epoch_millis parser refuses would get its 2xx here and then be dead-lettered -- accepted,
 * never indexed.  That parser (EpochTime.MILLIS_FORMATTER) reads 1-19 digits within
 * Long.MAX_VALUE and an optional fraction of at most 6 digits (nanoseconds of the
 * millisecond), from the number's text: an exponent form (1.7e12) fails (ES #48472: not
 * supported since 7.0), and a negative one fails on 8.0-8.1 (negative epochs came back in
 * 8.2, ES #80208; the docs of 7.x-8.4 say "must be non-negative"), so both are refused here,
 * with the event alone, as other schema errors are.  Returns 1, or 0 with reason filled. */
static int check_ts(const esx_json_val *v, char *reason)
{
    static const char long_max[] = "9223372036854775807";
    if (v->type != ESX_JSON_NUMBER) {
        snprintf(reason, 96, "ts: not a number");
        return 0;
    }
    const char *p = v->p, *end = v->p + v->len;
    if (memchr(p, 'e', v->len) || memchr(p, 'E', v->len)) {
        snprintf(reason, 96, "ts: exponent form (Elasticsearch's epoch_millis takes digits only)");
        return 0;
    }
    if (*p == '-') {
        snprintf(reason, 96, "ts: negative (before 1970)");
        return 0;
    }
    const char *dot = memchr(p, '.', v->len);
    size_t int_len = (size_t)((dot ? dot : end) - p);
    if (int_len > sizeof long_max - 1 ||
        (int_len == sizeof long_max - 1 && memcmp(p, long_max, int_len) > 0)) {
        snprintf(reason, 96, "ts: out of range (more than 2^63-1 ms)");
        return 0;
    }
    if (dot && end - dot - 1 > 6) {
        snprintf(reason, 96, "ts: more than 6 decimal places");
        return 0;
    }
    return 1;
}

static int put(esx_buf *out, const char *s, size_t n)
{
    int rc = esx_buf_append(out, s, n);
    return rc == ESX_BUF_OK ? 0 : rc == ESX_BUF_TOOBIG ? ESX_EV_TOOBIG : ESX_EV_NOMEM;
}

/* Returns 1 (accepted, ev filled, document appended), 0 (rejected, reason filled, out
 * restored) or a negative ESX_EV_* (out restored). */
static int one_event(ctx *c, const esx_json_val *obj, esx_event *ev, char *reason)
{
    if (obj->type != ESX_JSON_OBJECT) {
        snprintf(reason, 96, "not an object");
        return 0;
    }
    if (obj->flaw) {
        snprintf(reason, 96, "%s", esx_json_flaw_str(obj->flaw));
        return 0;
    }
    if (obj->depth > ESX_EVENT_MAX_DEPTH) {
        snprintf(reason, 96, "nesting deeper than %d", ESX_EVENT_MAX_DEPTH);
        return 0;
    }
    memset(ev, 0, sizeof *ev);
    /* One pass: each member is checked, then written; a reject rolls the output back.  The
     * duplicate-name check rides along (names kept, nested objects checked as met) and is
     * decided first, as if it had run before the pass: a member rejected for another reason
     * sends the object to the full check before that reason is given. */
    esx_buf *out = c->out;
    size_t save = out->len;
    int rc, seen_site = 0, seen_type = 0, seen_event = 0;
    esx_json_iter it;
    esx_json_val key, val, names[8];
    int names_esc[8];
    size_t n_names = 0;
    if ((rc = put(out, "{", 1)) != 0)
        goto fail;
    esx_json_iter_init(&it, obj);
    while (esx_json_iter_next(&it, &key, &val)) {
        int esc = memchr(key.p, '\\', key.len) != NULL;
        if (n_names < 8) {
            names[n_names] = key;
            names_esc[n_names] = esc;
        }
        n_names++;
        if (val.depth > 0 && memchr(val.p, '{', val.len)) {
            int dup = esx_json_duplicate(&val);
            if (dup < 0) {
                rc = ESX_EV_NOMEM;
                goto fail;
            }
            if (dup) {
                snprintf(reason, 96, "duplicate member name");
                goto reject;
            }
        }
        char first = 0;
        size_t kl = esc ? esx_json_str_decode(&key, &first, 1) : key.len - 2;
        if (!esc && kl)
            first = key.p[1];
        if (kl == 0) {
            snprintf(reason, 96, "empty member name");
            goto reject;
        }
        if (first == '_') {
            reserved_reason(&key, reason);
            goto reject;
        }
        /* names Elasticsearch refuses, this one's and those of the objects inside its value,
         * and objects deeper than its mappings may go */
        int parts;
        if ((rc = check_name(&key, 1, &parts, reason)) == 1) {
            if (1 + parts - 1 > ESX_EVENT_MAX_OBJECT_DEPTH)
                rc = too_deep(reason);
            else if (val.depth > 0 && memchr(val.p, '{', val.len))
                rc = check_names_in(&val, 1 + parts, reason);
        }
        if (rc < 0)
            goto fail;
        if (rc == 0)
            goto reject;
        int ok = 1, f = esc ? field_of(&key) : field_of_plain(key.p + 1, kl);
        switch (f) {
        case F_SITE:
            ok = check_ident(&val, "site_id", 64, 0, ev->site_id, reason);
            seen_site = 1;
            break;
        case F_TYPE:
            ok = check_ident(&val, "type", 32, 0, ev->type, reason);
            seen_type = 1;
            break;
        case F_BLOCK:
            ok = check_ident(&val, "block_id", 64, 0, ev->block_id, reason);
            break;
        case F_VARIANT:
            ok = check_ident(&val, "variant", 64, 0, ev->variant, reason);
            break;
        case F_EVENT:
            ok = check_ident(&val, "event_id", 64, 1, ev->event_id, reason);
            seen_event = 1;
            break;
        case F_USER:
            ok = check_user_id(&val, ev->user_id, reason);
            break;
        case F_TS:
            ok = check_ts(&val, reason);
            break;
        default:
            break;
        }
        if (!ok)
            goto reject;
        if (f == F_RECEIVED)
            continue;
        if (val.depth == 0) {
            /* a scalar: name, ':', value and ',' are copied as they are, in one go -- but an
             * integer user_id as a string of its digits: as a number it would have the day's
             * index map user_id as long, refusing every string user_id after it */
            int quote = f == F_USER && val.type == ESX_JSON_NUMBER;
            size_t need = key.len + val.len + 2 + (quote ? 2 : 0);
            if ((rc = esx_buf_reserve(out, need)) != ESX_BUF_OK) {
                rc = rc == ESX_BUF_TOOBIG ? ESX_EV_TOOBIG : ESX_EV_NOMEM;
                goto fail;
            }
            char *o = out->data + out->len;
            memcpy(o, key.p, key.len);
            o[key.len] = ':';
            if (quote)
                o[key.len + 1] = o[need - 2] = '"';
            memcpy(o + key.len + 1 + quote, val.p, val.len);
            o[need - 1] = ',';
            out->len += need;
            out->data[out->len] = '\0';
            continue;
        }
        if ((rc = esx_json_write_min(&key, out)) != ESX_BUF_OK ||
            (rc = esx_buf_append(out, ":", 1)) != ESX_BUF_OK ||
            (rc = esx_json_write_min(&val, out)) != ESX_BUF_OK ||
            (rc = esx_buf_append(out, ",", 1)) != ESX_BUF_OK) {
            rc = rc == ESX_BUF_TOOBIG ? ESX_EV_TOOBIG : ESX_EV_NOMEM;
            goto fail;
        }
    }
    {
        int dup = 0;
        if (n_names > 8)
            dup = esx_json_duplicate(obj);
        else
            for (size_t x = 0; x < n_names && !dup; x++)
                for (size_t y = x + 1; y < n_names && !dup; y++)
                    dup = names_esc[x] || names_esc[y]
                              ? esx_json_same_name(&names[x], &names[y])
                              : names[x].len == names[y].len &&
                                    memcmp(names[x].p, names[y].p, names[x].len) == 0;
        if (dup < 0) {
            rc = ESX_EV_NOMEM;
            goto fail;
        }
        if (dup) {
            snprintf(reason, 96, "duplicate member name");
            goto reject;
        }
    }
    if (!seen_site) {
        snprintf(reason, 96, "missing site_id");
        goto reject;
    }
    if (!seen_type) {
        snprintf(reason, 96, "missing type");
        goto reject;
    }
    char tail[96];
    size_t tl = c->tail_len;
    memcpy(tail, c->tail, tl);
    if (!seen_event) {
        esx_idgen_next(c->ids, ev->event_id);
        memcpy(tail + tl, ",\"event_id\":\"", 13);
        memcpy(tail + tl + 13, ev->event_id, 20);
        tl += 33;
        tail[tl++] = '"';
    }
    tail[tl++] = '}';
    tail[tl++] = '\n';
    if ((rc = put(out, tail, tl)) != 0)
        goto fail;
    ev->doc_off = save;
    ev->doc_len = out->len - save - 1;
    return 1;
reject:
    rc = 0;
    if (n_names > 0 && strcmp(reason, "duplicate member name") != 0) {
        /* rejected for another reason before every name was seen: a duplicate anywhere in
         * the object is still what the client is told */
        int dup = esx_json_duplicate(obj);
        if (dup < 0)
            rc = ESX_EV_NOMEM;
        else if (dup)
            snprintf(reason, 96, "duplicate member name");
    }
fail:
    out->len = save;
    if (out->data)
        out->data[save] = '\0';
    return rc;
}

/* ---- bodies ---- */

typedef struct results {
    esx_event *events;
    int *n_events;
    esx_event_reject *rejects;
    int *n_rejects;
} results;

static int add(ctx *c, results *r, const esx_json_val *v, int index)
{
    esx_event_reject *rj = &r->rejects[*r->n_rejects];
    int rc = one_event(c, v, &r->events[*r->n_events], rj->reason);
    if (rc == 1)
        (*r->n_events)++;
    else if (rc == 0) {
        rj->index = index;
        (*r->n_rejects)++;
    }
    return rc < 0 ? rc : 0;
}

static void set(char *why, const char *msg)
{
    if (why)
        snprintf(why, 128, "%s", msg);
}

static int parse_ndjson(ctx *c, results *r, const char *body, size_t len, size_t start,
                        int max_events, char *why)
{
    /* count the events first, so that a flood is refused before any work */
    int count = 0;
    for (size_t i = start; i < len;) {
        const char *nl = memchr(body + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - body) : len;
        if (esx_json_skip_ws(body, end, i) < end && ++count > max_events)
            return ESX_EV_TOO_MANY;
        i = end + 1;
    }
    int index = 0, any = 0;
    for (size_t i = start; i < len;) {
        const char *nl = memchr(body + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - body) : len;
        size_t b = esx_json_skip_ws(body, end, i);
        if (b < end) {
            size_t pos = b;
            esx_json_val v;
            if (esx_json_scan(body, end, &pos, &v, NULL, 0) == 0 &&
                esx_json_skip_ws(body, end, pos) == end) {
                any = 1;
                int rc = add(c, r, &v, index);
                if (rc < 0)
                    return rc;
            } else {
                esx_event_reject *rj = &r->rejects[(*r->n_rejects)++];
                rj->index = index;
                snprintf(rj->reason, sizeof rj->reason, "invalid JSON");
            }
            index++;
        }
        i = end + 1;
    }
    (void)why;
    return any ? ESX_EV_OK : ESX_EV_NOT_JSON;
}

/* The end of the line starting at i (its '\n', or len), and whether a line that is not
 * blank follows it. */
static size_t line_end(const char *body, size_t len, size_t i, int *more)
{
    const char *nl = memchr(body + i, '\n', len - i);
    size_t end = nl ? (size_t)(nl - body) : len;
    *more = end < len && esx_json_skip_ws(body, len, end + 1) < len;
    return end;
}

/* The body from byte start on (past a byte-order mark: see esx_events_parse). */
static int parse_body(ctx *c, results *r, const char *body, size_t len, size_t start,
                      int max_events, char *why)
{
    size_t i = esx_json_skip_ws(body, len, start);
    if (i >= len) {
        set(why, "empty body");
        return ESX_EV_NOT_JSON;
    }
    int more;
    size_t first_end = line_end(body, len, i, &more);
    if (body[i] != '{' && body[i] != '[') {
        /* NDJSON whose first line is not an object (a scalar, garbage): its lines are read as
         * those of NDJSON starting with one, rather than all refused for that line */
        int rc = more ? parse_ndjson(c, r, body, len, start, max_events, why) : ESX_EV_NOT_JSON;
        if (rc == ESX_EV_NOT_JSON)
            set(why, "not a JSON object, array or NDJSON");
        return rc;
    }
    size_t pos = i;
    esx_json_val v;
    char scanwhy[128];
    int scanned = esx_json_scan(body, len, &pos, &v, scanwhy, sizeof scanwhy) == 0;
    if (scanned && esx_json_skip_ws(body, len, pos) == len) {
        if (v.type == ESX_JSON_OBJECT) {
            if (max_events < 1)
                return ESX_EV_TOO_MANY;
            return add(c, r, &v, 0);
        }
        /* an array of events */
        if (v.flaw) {
            /* a flaw inside the array but outside any element cannot happen: every string
             * is inside an element; elements report their own flaws */
        }
        /* counted while processing: the caller drops everything on ESX_EV_TOO_MANY */
        esx_json_iter it;
        esx_json_val el;
        int index = 0;
        /* each element's own flaw rejects it alone: with a flaw somewhere, scan them in full */
        if (v.flaw)
            esx_json_iter_init_checked(&it, &v);
        else
            esx_json_iter_init(&it, &v);
        while (esx_json_iter_next(&it, NULL, &el)) {
            if (index >= max_events)
                return ESX_EV_TOO_MANY;
            int rc = add(c, r, &el, index++);
            if (rc < 0)
                return rc;
        }
        return ESX_EV_OK;
    }
    if (body[i] == '[') {
        /* NDJSON whose first line is an array: that line is one JSON value, other lines follow */
        if (scanned && more && esx_json_skip_ws(body, first_end, pos) == first_end)
            return parse_ndjson(c, r, body, len, start, max_events, why);
        set(why, scanned ? "trailing bytes after the JSON array" : scanwhy);
        return ESX_EV_NOT_JSON;
    }
    int rc = parse_ndjson(c, r, body, len, start, max_events, why);
    if (rc == ESX_EV_NOT_JSON)
        set(why, scanned ? "trailing bytes after the JSON object" : scanwhy);
    return rc;
}

int esx_events_parse(const char *body, size_t len, int64_t received_at, esx_idgen *ids,
                     esx_buf *out, esx_event *events, int *n_events, esx_event_reject *rejects,
                     int *n_rejects, int max_events, char *why)
{
    ctx c;
    ctx_init(&c, received_at, ids, out);
    results r = {events, n_events, rejects, n_rejects};
    size_t save = out->len;
    *n_events = *n_rejects = 0;
    if (why)
        why[0] = '\0';
    /* A UTF-8 byte-order mark before the JSON text is skipped (RFC 8259 8.1: a parser MAY
     * ignore it; some beacon libraries and proxies add one): refused, a whole request
     * was lost for three bytes that say nothing.  Byte offsets in reasons still count it. */
    size_t start = len >= 3 && memcmp(body, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
    int rc = parse_body(&c, &r, body, len, start, max_events, why);
    if (rc != ESX_EV_OK) {
        out->len = save;
        if (out->data)
            out->data[save] = '\0';
        *n_events = *n_rejects = 0;
        if (rc == ESX_EV_TOO_MANY)
            set(why, "too many events");
        else if (rc == ESX_EV_NOMEM)
            set(why, "out of memory");
        else if (rc == ESX_EV_TOOBIG)
            set(why, "output too large");
    }
    return rc;
}

/* ---- query strings ---- */

static int pct_decode(const char *s, size_t n, char *dst, size_t *dlen)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '+')
            ch = ' ';
        else if (ch == '%') {
            if (n - i < 3)
                return -1;
            int a = s[i + 1], b = s[i + 2];
            int va = (a >= '0' && a <= '9') ? a - '0' : (a >= 'a' && a <= 'f') ? a - 'a' + 10
                   : (a >= 'A' && a <= 'F') ? a - 'A' + 10 : -1;
            int vb = (b >= '0' && b <= '9') ? b - '0' : (b >= 'a' && b <= 'f') ? b - 'a' + 10
                   : (b >= 'A' && b <= 'F') ? b - 'A' + 10 : -1;
            if (va < 0 || vb < 0)
                return -1;
            ch = (char)(va * 16 + vb);
            i += 2;
        }
        dst[k++] = ch;
    }
    *dlen = k;
    return 0;
}

static int is_integer_text(const char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i >= n)
        return 0;
    if (s[i] == '0')
        return i + 1 == n;
    for (; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

int esx_event_from_query(const char *query, size_t len, int64_t received_at, esx_idgen *ids,
                         esx_buf *out, esx_event *event, int *n_events, esx_event_reject *reject,
                         int *n_rejects, char *why)
{
    *n_events = *n_rejects = 0;
    if (why)
        why[0] = '\0';
    /* the JSON text: each byte becomes at most 6 ("\u00XX"), plus quotes, ':' and ','. */
    if (len > (SIZE_MAX - 64) / 8) {
        set(why, "output too large");
        return ESX_EV_TOOBIG;
    }
    esx_buf json, dec;
    esx_buf_init(&json, 8 * len + 64);
    esx_buf_init(&dec, len + 1);
    const char *bad = NULL;
    int rc = ESX_EV_OK;
    if (esx_buf_reserve(&dec, len + 1) != ESX_BUF_OK || esx_buf_append(&json, "{", 1) != ESX_BUF_OK) {
        rc = ESX_EV_NOMEM;
        goto done;
    }
    int first = 1;
    for (size_t i = 0; i < len && !bad;) {
        const char *amp = memchr(query + i, '&', len - i);
        size_t end = amp ? (size_t)(amp - query) : len;
        if (end > i) {
            const char *eq = memchr(query + i, '=', end - i);
            size_t ne = eq ? (size_t)(eq - query) : end;
            size_t vs = eq ? ne + 1 : end;
            size_t nl, vl;
            char *d = dec.data;
            if (pct_decode(query + i, ne - i, d, &nl) < 0 ||
                pct_decode(query + vs, end - vs, d + nl, &vl) < 0) {
                bad = "invalid percent-encoding";
                break;
            }
            if (esx_utf8_valid_prefix((unsigned char *)d, nl + vl) != nl + vl) {
                bad = "invalid UTF-8";
                break;
            }
            if (nl == 1 && d[0] == '_') { /* the cache-buster pixel tags append (`_=<time>`,
                                           * jQuery's cache: false): not a field, dropped */
                i = end + 1;
                continue;
            }
            int is_ts = nl == 2 && memcmp(d, "ts", 2) == 0;
            if (is_ts && !is_integer_text(d + nl, vl)) {
                bad = "ts: not an integer";
                break;
            }
            if ((!first && esx_buf_append(&json, ",", 1) != ESX_BUF_OK) ||
                esx_json_write_str(&json, d, nl) != ESX_BUF_OK ||
                esx_buf_append(&json, ":", 1) != ESX_BUF_OK ||
                (is_ts ? esx_buf_append(&json, d + nl, vl)
                       : esx_json_write_str(&json, d + nl, vl)) != ESX_BUF_OK) {
                rc = ESX_EV_NOMEM;
                goto done;
            }
            first = 0;
        }
        i = end + 1;
    }
    if (bad) {
        reject->index = 0;
        snprintf(reject->reason, sizeof reject->reason, "%s", bad);
        *n_rejects = 1;
        goto done;
    }
    if (esx_buf_append(&json, "}", 1) != ESX_BUF_OK) {
        rc = ESX_EV_NOMEM;
        goto done;
    }
    {
        size_t pos = 0;
        esx_json_val v;
        if (esx_json_scan(json.data, json.len, &pos, &v, why, 128) != 0) {
            rc = ESX_EV_NOT_JSON; /* cannot happen: we wrote it */
            goto done;
        }
        ctx c;
        ctx_init(&c, received_at, ids, out);
        results r = {event, n_events, reject, n_rejects};
        rc = add(&c, &r, &v, 0);
        if (rc < 0)
            set(why, rc == ESX_EV_TOOBIG ? "output too large" : "out of memory");
    }
done:
    if (rc == ESX_EV_NOMEM)
        set(why, "out of memory");
    esx_buf_free(&json);
    esx_buf_free(&dec);
    return rc;
}
