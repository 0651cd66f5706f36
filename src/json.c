/*
 * json.c -- strict JSON scanning over untrusted bytes (see json.h).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "hex.h"
#include "json.h"
#include "json_special.h"

static int is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

size_t esx_json_skip_ws(const char *s, size_t len, size_t pos)
{
    while (pos < len && is_ws((unsigned char)s[pos]))
        pos++;
    return pos;
}

const char *esx_json_flaw_str(int flaw)
{
    switch (flaw) {
    case ESX_JSON_F_UTF8: return "invalid UTF-8";
    case ESX_JSON_F_ESCAPE: return "invalid escape";
    case ESX_JSON_F_CONTROL: return "control character in string";
    default: return "";
    }
}

/* Length of the well-formed UTF-8 sequence at s (Unicode table 3-7), or 0 when there is
 * none.  s[0] >= 0x80; n bytes are readable. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    unsigned char lo = 0x80, hi = 0xBF;
    size_t need;
    if (c >= 0xC2 && c <= 0xDF)
        need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F; /* no UTF-16 surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F; /* nothing above U+10FFFF */
    } else
        return 0;
    if (n < need)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < need; i++)
        if (s[i] < 0x80 || s[i] > 0xBF)
            return 0;
    return need;
}

size_t esx_utf8_valid_prefix(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(s + i, n - i);
        if (k == 0)
            return i;
        i += k;
    }
    return n;
}

/* The 4 hex digits at s[i..i+4) as a code unit, or -1. */
static long hex4(const unsigned char *s, size_t len, size_t i)
{
    if (i > len || len - i < 4)
        return -1;
    long v = 0;
    for (int k = 0; k < 4; k++) {
        int h = esx_hex_digit(s[i + (size_t)k]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

static void set_why(char *why, size_t whylen, const char *msg, size_t at)
{
    if (why && whylen)
        snprintf(why, whylen, "invalid JSON at byte %zu: %s", at, msg);
}

/* Nonzero when some byte of w equals c (exact as a yes/no answer). */
static inline uint64_t has_byte(uint64_t w, unsigned char c)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t x = w ^ (ones * c);
    return (x - ones) & ~x & highs;
}

/* Offset within its word of the first byte flagged in m, a mask from has_byte or
 * string_special (their lowest flagged byte is exact), so that a scan steps straight to it.
 * 0 where the build cannot tell: the byte loops after the word loops find it then. */
static inline size_t first_flagged(uint64_t m)
{
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return (size_t)__builtin_ctzll(m) >> 3;
#else
    (void)m;
    return 0;
#endif
}

/* Nonzero when w holds a byte that ends the plain run of a string: a control character, a
 * quote, a backslash or a non-ASCII byte (exact as a yes/no answer). */
static inline uint64_t string_special(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    return ((w - ones * 0x20) & ~w & highs) | (w & highs) | has_byte(w, '"') | has_byte(w, '\\');
}

/* Scans a string whose opening quote is at s[*pos].  Returns 0 (pos past the closing quote)
 * or -1 when unterminated.  Flaws go to *flaw (first one wins). */
static int scan_string(const unsigned char *s, size_t len, size_t *pos, int *flaw)
{
    size_t i = *pos + 1;
    for (;;) {
        /* fast path over plain bytes, eight at a time */
        while (len - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            uint64_t m = string_special(w);
            if (m) {
                i += first_flagged(m);
                break;
            }
            i += 8;
        }
        while (i < len && s[i] >= 0x20 && s[i] < 0x80 && s[i] != '"' && s[i] != '\\')
            i++;
        if (i >= len)
            return -1;
        unsigned char c = s[i];
        if (c == '"') {
            *pos = i + 1;
            return 0;
        }
        if (c == '\\') {
            i++;
            if (i >= len)
                return -1;
            c = s[i];
            if (c == 'u') {
                long u = hex4(s, len, i + 1);
                if (u < 0) {
                    if (!*flaw)
                        *flaw = ESX_JSON_F_ESCAPE;
                    i++; /* the following bytes are scanned as ordinary ones */
                    continue;
                }
                i += 5;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    long lo = (i + 1 < len && s[i] == '\\' && s[i + 1] == 'u') ? hex4(s, len, i + 2) : -1;
                    if (lo >= 0xDC00 && lo <= 0xDFFF)
                        i += 6;
                    else if (!*flaw)
                        *flaw = ESX_JSON_F_ESCAPE;
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    if (!*flaw)
                        *flaw = ESX_JSON_F_ESCAPE;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", c) || c == 0) {
                if (!*flaw)
                    *flaw = ESX_JSON_F_ESCAPE;
                if (c >= 0x80)
                    continue; /* let the UTF-8 check see the sequence */
            }
            i++;
            continue;
        }
        if (c < 0x20) {
            if (!*flaw)
                *flaw = ESX_JSON_F_CONTROL;
            i++;
            continue;
        }
        /* c >= 0x80 */
        size_t k = utf8_seq(s + i, len - i);
        if (k == 0) {
            if (!*flaw)
                *flaw = ESX_JSON_F_UTF8;
            i++;
        } else
            i += k;
    }
}

/* Scans a number at s[*pos]; -1 on bad grammar (*pos then at the offending byte). */
static int scan_number(const unsigned char *s, size_t len, size_t *pos)
{
    size_t i = *pos;
    if (i < len && s[i] == '-')
        i++;
    if (i >= len)
        goto bad;
    if (s[i] == '0')
        i++;
    else if (s[i] >= '1' && s[i] <= '9') {
        while (i < len && s[i] >= '0' && s[i] <= '9')
            i++;
    } else
        goto bad;
    if (i < len && s[i] == '.') {
        i++;
        if (i >= len || s[i] < '0' || s[i] > '9')
            goto bad;
        while (i < len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= len || s[i] < '0' || s[i] > '9')
            goto bad;
        while (i < len && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    *pos = i;
    return 0;
bad:
    *pos = i;
    return -1;
}

int esx_json_scan(const char *str, size_t len, size_t *posp, esx_json_val *v, char *why,
                  size_t whylen)
{
    const unsigned char *s = (const unsigned char *)str;
    uint64_t stack[ESX_JSON_HARD_DEPTH / 64]; /* bit set: that level is an object */
    int depth = 0, maxdepth = 0, flaw = 0, type = 0;
    size_t i = esx_json_skip_ws(str, len, *posp);
    size_t start = i;
    const char *msg = "unexpected character";

value:
    i = esx_json_skip_ws(str, len, i);
    if (i >= len) {
        msg = "unexpected end";
        goto fail;
    }
    {
        unsigned char c = s[i];
        int t;
        switch (c) {
        case '{':
        case '[':
            if (depth >= ESX_JSON_HARD_DEPTH) {
                msg = "nesting too deep";
                goto fail;
            }
            if (c == '{')
                stack[depth / 64] |= (uint64_t)1 << (depth % 64);
            else
                stack[depth / 64] &= ~((uint64_t)1 << (depth % 64));
            depth++;
            if (depth > maxdepth)
                maxdepth = depth;
            if (!type)
                type = c == '{' ? ESX_JSON_OBJECT : ESX_JSON_ARRAY;
            i = esx_json_skip_ws(str, len, i + 1);
            if (i < len && s[i] == (c == '{' ? '}' : ']')) {
                i++;
                depth--;
                goto after;
            }
            if (c == '{')
                goto key;
            goto value;
        case '"':
            if (scan_string(s, len, &i, &flaw) < 0) {
                msg = "unterminated string";
                i = len;
                goto fail;
            }
            t = ESX_JSON_STRING;
            break;
        case 't':
        case 'f':
        case 'n': {
            const char *lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
            size_t n = strlen(lit);
            if (len - i < n || memcmp(s + i, lit, n) != 0) {
                msg = "invalid literal";
                goto fail;
            }
            i += n;
            t = c == 't' ? ESX_JSON_TRUE : c == 'f' ? ESX_JSON_FALSE : ESX_JSON_NULL;
            break;
        }
        default:
            if (c == '-' || (c >= '0' && c <= '9')) {
                if (scan_number(s, len, &i) < 0) {
                    msg = i >= len ? "unexpected end" : "invalid number";
                    goto fail;
                }
                t = ESX_JSON_NUMBER;
                break;
            }
            goto fail;
        }
        if (!type)
            type = t;
    }

after:
    if (depth == 0)
        goto done;
    i = esx_json_skip_ws(str, len, i);
    if (i >= len) {
        msg = "unexpected end";
        goto fail;
    }
    {
        int obj = (int)((stack[(depth - 1) / 64] >> ((depth - 1) % 64)) & 1);
        if (s[i] == ',') {
            i = esx_json_skip_ws(str, len, i + 1);
            if (obj)
                goto key;
            goto value;
        }
        if (s[i] == (obj ? '}' : ']')) {
            i++;
            depth--;
            goto after;
        }
        msg = obj ? "expected ',' or '}'" : "expected ',' or ']'";
        goto fail;
    }

key:
    if (i >= len) {
        msg = "unexpected end";
        goto fail;
    }
    if (s[i] != '"') {
        msg = "expected a member name";
        goto fail;
    }
    if (scan_string(s, len, &i, &flaw) < 0) {
        msg = "unterminated string";
        i = len;
        goto fail;
    }
    i = esx_json_skip_ws(str, len, i);
    if (i >= len || s[i] != ':') {
        msg = i >= len ? "unexpected end" : "expected ':'";
        goto fail;
    }
    i++;
    goto value;

done:
    v->p = str + start;
    v->len = i - start;
    v->type = type;
    v->depth = maxdepth;
    v->flaw = flaw;
    *posp = i;
    return 0;

fail:
    set_why(why, whylen, msg, i);
    return -1;
}

void esx_json_iter_init(esx_json_iter *it, const esx_json_val *c)
{
    it->s = c->p;
    it->len = c->len - 1; /* stop before the closing bracket */
    it->pos = 1;
    it->object = c->type == ESX_JSON_OBJECT;
    it->checked = 0;
}

void esx_json_iter_init_checked(esx_json_iter *it, const esx_json_val *c)
{
    esx_json_iter_init(it, c);
    it->checked = 1;
}

/* Past the end of the string whose opening quote is at s[i] (len if unterminated).  Eight
 * bytes at a time up to the first quote or backslash. */
static size_t skip_string(const char *s, size_t len, size_t i)
{
    for (i++; i < len; i += 2) { /* past a backslash and the byte it escapes */
        while (len - i >= 8) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            uint64_t m = has_byte(w, '"') | has_byte(w, '\\');
            if (m) {
                i += first_flagged(m);
                break;
            }
            i += 8;
        }
        while (i < len && s[i] != '"' && s[i] != '\\')
            i++;
        if (i >= len)
            break;
        if (s[i] == '"')
            return i + 1;
    }
    return len;
}

/* Past the bytes of a container that cannot change the nesting: none of " { } [ ]. */
static size_t skip_plain(const char *s, size_t len, size_t i)
{
    while (len - i >= 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        uint64_t m = has_byte(w, '"') | has_byte(w, '{') | has_byte(w, '}') | has_byte(w, '[') |
                     has_byte(w, ']');
        if (m)
            return i + first_flagged(m);
        i += 8;
    }
    return i;
}

/* Finds the extent, type and depth of the value at s[*pos] without checking it again: the
 * container it is in was accepted by esx_json_scan.  Bounded by len whatever the bytes. */
static int skip_value(const char *s, size_t len, size_t *pos, esx_json_val *v)
{
    size_t i = *pos, start = i;
    if (i >= len)
        return -1;
    unsigned char c = (unsigned char)s[i];
    int type, depth = 0;
    if (c == '"') {
        type = ESX_JSON_STRING;
        i = skip_string(s, len, i);
    } else if (c == '{' || c == '[') {
        type = c == '{' ? ESX_JSON_OBJECT : ESX_JSON_ARRAY;
        int d = 0;
        while (i < len) {
            i = skip_plain(s, len, i);
            if (i >= len)
                break;
            c = (unsigned char)s[i];
            if (c == '"') {
                i = skip_string(s, len, i);
                continue;
            }
            i++;
            if (c == '{' || c == '[') {
                if (++d > depth)
                    depth = d;
            } else if ((c == '}' || c == ']') && --d == 0) {
                break;
            }
        }
    } else {
        type = c == 't' ? ESX_JSON_TRUE : c == 'f' ? ESX_JSON_FALSE : c == 'n' ? ESX_JSON_NULL
                                                                               : ESX_JSON_NUMBER;
        while (i < len && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ':' &&
               !is_ws((unsigned char)s[i]))
            i++;
    }
    v->p = s + start;
    v->len = i - start;
    v->type = type;
    v->depth = depth;
    v->flaw = 0;
    *pos = i;
    return 0;
}

static int iter_value(esx_json_iter *it, size_t *i, esx_json_val *v)
{
    if (it->checked)
        return esx_json_scan(it->s, it->len, i, v, NULL, 0);
    return skip_value(it->s, it->len, i, v);
}

int esx_json_iter_next(esx_json_iter *it, esx_json_val *key, esx_json_val *val)
{
    size_t i = esx_json_skip_ws(it->s, it->len, it->pos);
    if (i >= it->len)
        return 0;
    if (it->object) {
        esx_json_val k;
        if (iter_value(it, &i, &k) < 0)
            return 0;
        if (key)
            *key = k;
        i = esx_json_skip_ws(it->s, it->len, i);
        i++; /* ':' */
        i = esx_json_skip_ws(it->s, it->len, i);
    }
    if (iter_value(it, &i, val) < 0)
        return 0;
    i = esx_json_skip_ws(it->s, it->len, i);
    if (i < it->len && it->s[i] == ',')
        i++;
    it->pos = i;
    return 1;
}

static size_t put_utf8(unsigned char *o, unsigned long cp)
{
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes the next unit of a string body s[*i..end) into u (1-4 bytes).  Returns its length
 * (0 at the end).  A raw multibyte sequence is one unit, as is an escape (its UTF-8). */
static size_t next_unit(const unsigned char *s, size_t end, size_t *ip, unsigned char u[4])
{
    size_t i = *ip;
    if (i >= end)
        return 0;
    unsigned char c = s[i];
    if (c != '\\') {
        size_t k = c < 0x80 ? 1 : utf8_seq(s + i, end - i);
        if (k == 0)
            k = 1;
        memcpy(u, s + i, k);
        *ip = i + k;
        return k;
    }
    if (i + 1 >= end) {
        *ip = end;
        u[0] = '\\';
        return 1;
    }
    c = s[i + 1];
    *ip = i + 2;
    switch (c) {
    case 'b': u[0] = '\b'; return 1;
    case 'f': u[0] = '\f'; return 1;
    case 'n': u[0] = '\n'; return 1;
    case 'r': u[0] = '\r'; return 1;
    case 't': u[0] = '\t'; return 1;
    case 'u': {
        long cp = hex4(s, end, i + 2);
        if (cp < 0) {
            u[0] = 'u';
            return 1;
        }
        *ip = i + 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            long lo = (i + 7 < end && s[i + 6] == '\\' && s[i + 7] == 'u') ? hex4(s, end, i + 8) : -1;
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                *ip = i + 12;
                return put_utf8(u, 0x10000 + (((unsigned long)cp - 0xD800) << 10) +
                                       ((unsigned long)lo - 0xDC00));
            }
            cp = 0xFFFD;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF)
            cp = 0xFFFD;
        return put_utf8(u, (unsigned long)cp);
    }
    default: u[0] = c; return 1;
    }
}

size_t esx_json_str_decode(const esx_json_val *str, char *out, size_t cap)
{
    const unsigned char *s = (const unsigned char *)str->p;
    size_t end = str->len ? str->len - 1 : 0, i = 1, n = 0, k;
    if (end > 1 && memchr(s + 1, '\\', end - 1) == NULL) {
        /* no escape: the decoded bytes are the bytes between the quotes */
        memcpy(out, s + 1, end - 1 < cap ? end - 1 : cap);
        return end - 1;
    }
    unsigned char u[4];
    while ((k = next_unit(s, end, &i, u)) != 0) {
        for (size_t j = 0; j < k; j++, n++)
            if (n < cap)
                out[n] = (char)u[j];
    }
    return n;
}

int esx_json_str_eq(const esx_json_val *str, const char *lit, size_t n)
{
    if (str->type != ESX_JSON_STRING)
        return 0;
    const unsigned char *s = (const unsigned char *)str->p;
    size_t end = str->len - 1, i = 1, at = 0, k;
    if (memchr(str->p, '\\', str->len) == NULL)
        return str->len - 2 == n && memcmp(str->p + 1, lit, n) == 0;
    unsigned char u[4];
    while ((k = next_unit(s, end, &i, u)) != 0) {
        if (k > n - at || memcmp(u, lit + at, k) != 0)
            return 0;
        at += k;
    }
    return at == n;
}

int esx_json_write_min(const esx_json_val *v, esx_buf *out)
{
    size_t save = out->len;
    const char *s = v->p;
    size_t n = v->len, i = 0, run = 0;
    int rc = ESX_BUF_OK;
    if (v->depth == 0)
        return esx_buf_append(out, s, n);
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') {
            /* copy the whole string as is */
            i++;
            while (i < n && s[i] != '"') {
                if (s[i] == '\\' && i + 1 < n)
                    i++;
                i++;
            }
            i++;
            continue;
        }
        if (is_ws(c)) {
            if (i > run && (rc = esx_buf_append(out, s + run, i - run)) != ESX_BUF_OK)
                goto fail;
            while (i < n && is_ws((unsigned char)s[i]))
                i++;
            run = i;
            continue;
        }
        i++;
    }
    if (n > run && (rc = esx_buf_append(out, s + run, n - run)) != ESX_BUF_OK)
        goto fail;
    return ESX_BUF_OK;
fail:
    out->len = save;
    if (out->data)
        out->data[save] = '\0';
    return rc;
}

/* 0: the byte stands for itself; 'u': \u00XX; otherwise the letter after the backslash. */
static const char escape_of[256] = {
    ['\b'] = 'b', ['\f'] = 'f', ['\n'] = 'n', ['\r'] = 'r', ['\t'] = 't',
    [0x00] = 'u', [0x01] = 'u', [0x02] = 'u', [0x03] = 'u', [0x04] = 'u', [0x05] = 'u',
    [0x06] = 'u', [0x07] = 'u', [0x0b] = 'u', [0x0e] = 'u', [0x0f] = 'u', [0x10] = 'u',
    [0x11] = 'u', [0x12] = 'u', [0x13] = 'u', [0x14] = 'u', [0x15] = 'u', [0x16] = 'u',
    [0x17] = 'u', [0x18] = 'u', [0x19] = 'u', [0x1a] = 'u', [0x1b] = 'u', [0x1c] = 'u',
    [0x1d] = 'u', [0x1e] = 'u', [0x1f] = 'u', ['"'] = '"', ['\\'] = '\\',
};

int esx_json_write_str(esx_buf *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t save = out->len, run = 0; /* run: start of the bytes not written yet */
    int rc;
    /* room for the text without escapes, written in place; an escape makes room again */
    if (n > SIZE_MAX - 2 || (rc = esx_buf_reserve(out, n + 2)) != ESX_BUF_OK)
        return n > SIZE_MAX - 2 ? ESX_BUF_TOOBIG : rc;
    out->data[out->len++] = '"';
    for (size_t i = 0; i < n; i++) {
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        while (n - i >= 8) { /* plain text eight bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            uint64_t m = esx_json_special_bytes(w);
            if (m) {
                i += (size_t)__builtin_ctzll(m) >> 3;
                break;
            }
            i += 8;
        }
        if (i >= n)
            break;
#endif
        char x = escape_of[(unsigned char)s[i]];
        if (x == 0)
            continue;
        unsigned char c = (unsigned char)s[i];
        char esc[6] = {'\\', x, '0', '0', hex[c >> 4], hex[c & 15]};
        if ((rc = esx_buf_append(out, s + run, i - run)) != ESX_BUF_OK ||
            (rc = esx_buf_append(out, esc, x == 'u' ? 6 : 2)) != ESX_BUF_OK ||
            (rc = esx_buf_reserve(out, n - i + 1)) != ESX_BUF_OK) {
            out->len = save;
            out->data[save] = '\0';
            return rc;
        }
        run = i + 1;
    }
    memcpy(out->data + out->len, s + run, n - run);
    out->len += n - run;
    out->data[out->len++] = '"';
    out->data[out->len] = '\0';
    return ESX_BUF_OK;
}

/* ---- duplicate member names ---- */

typedef struct keyent {
    uint64_t h;
    size_t off, len;
} keyent;

static int keyent_cmp(const void *a, const void *b)
{
    const keyent *x = a, *y = b;
    return x->h < y->h ? -1 : x->h > y->h;
}

static uint64_t dup_seed(void)
{
    static _Atomic uint64_t seed;
    uint64_t s = atomic_load_explicit(&seed, memory_order_relaxed);
    if (s == 0) {
        s = esx_random_seed() | 1;
        atomic_store_explicit(&seed, s, memory_order_relaxed);
    }
    return s;
}

int esx_json_same_name(const esx_json_val *a, const esx_json_val *b)
{
    if (!memchr(a->p, '\\', a->len) && !memchr(b->p, '\\', b->len))
        return a->len == b->len && memcmp(a->p, b->p, a->len) == 0; /* no escapes: the bytes */
    char x[64], y[64];
    size_t la = esx_json_str_decode(a, x, sizeof x);
    size_t lb = esx_json_str_decode(b, y, sizeof y);
    if (la != lb)
        return 0;
    if (la <= sizeof x)
        return memcmp(x, y, la) == 0;
    /* long names: decode both in full */
    char *ba = malloc(la), *bb = malloc(lb);
    int same = -1;
    if (ba && bb) {
        esx_json_str_decode(a, ba, la);
        esx_json_str_decode(b, bb, lb);
        same = memcmp(ba, bb, la) == 0;
    }
    free(ba);
    free(bb);
    return same;
}

/* Many members: decode every name into one scratch buffer (decoded names are never longer
 * than the object's bytes), sort by a seeded hash, compare equal hashes. */
static int many_dup(const esx_json_val *obj)
{
    /* every member takes at least 4 bytes ("":0 plus a separator) */
    size_t cap = obj->len / 4 + 1;
    char *scratch = malloc(obj->len ? obj->len : 1);
    keyent *ents = cap <= SIZE_MAX / sizeof *ents ? malloc(cap * sizeof *ents) : NULL;
    int rc = 0;
    if (!scratch || !ents) {
        rc = -1;
        goto out;
    }
    uint64_t seed = dup_seed();
    size_t used = 0, m = 0;
    esx_json_iter it;
    esx_json_val key, val;
    esx_json_iter_init(&it, obj);
    while (m < cap && esx_json_iter_next(&it, &key, &val)) {
        size_t l = esx_json_str_decode(&key, scratch + used, obj->len - used);
        if (l > obj->len - used) { /* cannot happen for a scanned object */
            rc = -1;
            goto out;
        }
        ents[m].off = used;
        ents[m].len = l;
        ents[m].h = esx_hash64(scratch + used, l, seed);
        used += l;
        m++;
    }
    qsort(ents, m, sizeof *ents, keyent_cmp);
    for (size_t x = 0; x < m && !rc; x++)
        for (size_t y = x + 1; y < m && ents[y].h == ents[x].h; y++)
            if (ents[x].len == ents[y].len &&
                memcmp(scratch + ents[x].off, scratch + ents[y].off, ents[x].len) == 0) {
                rc = 1;
                break;
            }
out:
    free(scratch);
    free(ents);
    return rc;
}

/* One pass over the members: the first 8 names are kept for a pairwise check, members that
 * may hold objects are checked in turn; objects with more members go to many_dup. */
int esx_json_duplicate(const esx_json_val *v)
{
    if (v->depth == 0 || (v->depth == 1 && v->type == ESX_JSON_ARRAY))
        return 0;
    int obj = v->type == ESX_JSON_OBJECT;
    esx_json_val k[8], key, val;
    size_t n = 0;
    esx_json_iter it;
    esx_json_iter_init(&it, v);
    while (esx_json_iter_next(&it, &key, &val)) {
        if (obj) {
            if (n < 8)
                k[n] = key;
            n++;
        }
        /* no '{' at all (a '{' in a string only costs a useless visit): no object inside */
        if (val.depth == 0 || !memchr(val.p, '{', val.len))
            continue;
        int rc = esx_json_duplicate(&val);
        if (rc)
            return rc;
    }
    if (!obj || n < 2)
        return 0;
    if (n > 8)
        return many_dup(v);
    for (size_t x = 0; x < n; x++)
        for (size_t y = x + 1; y < n; y++) {
            int rc = esx_json_same_name(&k[x], &k[y]);
            if (rc)
                return rc;
        }
    return 0;
}
