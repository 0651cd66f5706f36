/*
 * ljson.c -- core.json_decode(s): Elasticsearch responses straight into Lua tables.
 *
 * One recursive-descent pass over the bytes, building values as it goes: no separate scan,
 * strings without escapes pushed in place, integers of up to 15 digits converted without
 * strtod.  Strict grammar (RFC 8259), a depth limit, no trailing garbage; null is the same
 * light userdata as lua-cjson's cjson.null, so code may compare with either; an empty array
 * is a table with esx.array_mt, so that json_encode writes it back as [] (not {}).  Decoding the
 * responses is most of a search's CPU on the client side (bench/results/client.md).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compat.h"
#include "hex.h"
#include "json_special.h"
#include "lerror.h"
#include "ljson.h"

#define MAX_DEPTH 512
#define HINT_DEPTHS 16
#define HINT_MAX 16

/* hint[d]: the size of the last container closed at depth d, which the next one there is
 * created with (up to HINT_MAX) -- the hits of a response are alike, and a table sized
 * right is not rehashed as it fills. */
typedef struct dec {
    lua_State *L;
    const char *p, *end;
    const char *err;
    int depth;
    unsigned char hint[2][HINT_DEPTHS]; /* [0] arrays, [1] objects */
} dec;

static int size_hint(const dec *d, int object)
{
    return d->depth < HINT_DEPTHS ? d->hint[object][d->depth] : 4;
}

static void learn_size(dec *d, int object, int n)
{
    if (d->depth < HINT_DEPTHS)
        d->hint[object][d->depth] = (unsigned char)(n < 1 ? 1 : n > HINT_MAX ? HINT_MAX : n);
}

static int value(dec *d);

static void skip_ws(dec *d)
{
    while (d->p < d->end && (*d->p == ' ' || *d->p == '\n' || *d->p == '\r' || *d->p == '\t'))
        d->p++;
}

static int fail(dec *d, const char *why)
{
    if (!d->err)
        d->err = why;
    return -1;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int d = esx_hex_digit((unsigned char)p[i]);
        if (d < 0)
            return -1;
        v = v << 4 | (unsigned)d;
    }
    *out = v;
    return 0;
}

/* Writes code point cp as UTF-8 at out; returns the bytes written (1-4). */
static size_t put_utf8(char *out, unsigned cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Unescapes the body of a string (between the quotes, raw bytes s[0..n)) into out, which
 * has room for n bytes: an escape never decodes to more bytes than it takes.  Returns the
 * decoded length, or (size_t)-1 with d->err set. */
static size_t unescape(dec *d, const char *s, size_t n, char *out)
{
    size_t o = 0;
    const char *p = s, *end = s + n;
    while (p < end) {
        if (*p != '\\') {
            out[o++] = *p++;
            continue;
        }
        char e = p[1]; /* the scan guaranteed a byte after each backslash */
        p += 2;
        switch (e) {
        case '"': out[o++] = '"'; break;
        case '\\': out[o++] = '\\'; break;
        case '/': out[o++] = '/'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (end - p < 4 || hex4(p, &cp) != 0) {
                fail(d, "bad \\u escape");
                return (size_t)-1;
            }
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) != 0 ||
                    lo < 0xDC00 || lo > 0xDFFF) {
                    fail(d, "unpaired surrogate in a \\u escape");
                    return (size_t)-1;
                }
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(d, "unpaired surrogate in a \\u escape");
                return (size_t)-1;
            }
            o += put_utf8(out + o, cp); /* \uXXXX is 6 bytes, UTF-8 at most 3 (4 for 12) */
            break;
        }
        default:
            fail(d, "bad escape");
            return (size_t)-1;
        }
    }
    return o;
}

static int special(unsigned char c)
{
    return c == '"' || c == '\\' || c < 0x20;
}

/* A string at d->p (the opening quote): pushes it. */
static int string(dec *d)
{
    const char *s = ++d->p;
    int escaped = 0;
    for (;;) {
        /* plain text 8 bytes at a time (most of a response's bytes are inside strings),
         * stepping straight to the first byte that may end it */
#if defined(__GNUC__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        while (d->end - d->p >= 8) {
            uint64_t w;
            memcpy(&w, d->p, 8);
            uint64_t m = esx_json_special_bytes(w);
            if (m) {
                d->p += __builtin_ctzll(m) >> 3;
                break;
            }
            d->p += 8;
        }
#endif
        while (d->p < d->end && !special((unsigned char)*d->p))
            d->p++;
        if (d->p >= d->end)
            return fail(d, "unterminated string");
        unsigned char c = (unsigned char)*d->p;
        if (c == '"')
            break;
        if (c < 0x20)
            return fail(d, "control character in a string");
        escaped = 1; /* a backslash */
        if (d->end - d->p < 2)
            return fail(d, "unterminated string");
        d->p++;
        if ((unsigned char)*d->p < 0x20)
            return fail(d, "control character in a string");
        d->p++;
    }
    size_t n = (size_t)(d->p - s);
    d->p++; /* the closing quote */
    if (!escaped) { /* the common case: pushed in place */
        lua_pushlstring(d->L, s, n);
        return 0;
    }
    char small[256] = {0}; /* initialised only to quiet -Wmaybe-uninitialized */
    char *out = small;
    if (n > sizeof small) {
        /* Lua memory, not malloc: lua_pushlstring below raises when out of memory, and a
         * malloc'ed buffer would be lost; this one is collected */
        if (!lua_checkstack(d->L, 2))
            return fail(d, "out of memory");
        out = lua_newuserdata(d->L, n);
    }
    size_t len = unescape(d, s, n, out);
    if (len != (size_t)-1)
        lua_pushlstring(d->L, out, len);
    if (out != small)
        lua_remove(d->L, len != (size_t)-1 ? -2 : -1);
    return len == (size_t)-1 ? -1 : 0;
}

/* Clinger's fast path: a decimal whose digits fit 2^53 and whose power of ten is at most 22
 * is one exact integer times or divided by one exact power of ten, which IEEE arithmetic
 * rounds correctly -- the same double strtod returns.  s..end is a valid JSON number without
 * its sign.  Returns 0 (use strtod) for anything else. */
static int fast_decimal(const char *s, const char *end, double *out)
{
    static const double pow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                   1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                   1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    uint64_t mant = 0;
    int ndig = 0, fracdig = 0, after_point = 0;
    const char *p = s;
    for (; p < end && *p != 'e' && *p != 'E'; p++) {
        if (*p == '.') {
            after_point = 1;
            continue;
        }
        if (mant == 0 && *p == '0') {
            fracdig += after_point; /* leading zeros: no digit budget, only the scale */
            continue;
        }
        if (++ndig > 15)
            return 0;
        mant = mant * 10 + (uint64_t)(*p - '0');
        fracdig += after_point;
    }
    int exp10 = 0;
    if (p < end) { /* the exponent */
        p++;
        int eneg = 0;
        if (*p == '+' || *p == '-')
            eneg = *p++ == '-';
        if (end - p > 3)
            return 0;
        for (; p < end; p++)
            exp10 = exp10 * 10 + (*p - '0');
        if (eneg)
            exp10 = -exp10;
    }
    exp10 -= fracdig;
    if (exp10 < -22 || exp10 > 22)
        return 0;
    double v = (double)mant; /* exact: mant < 10^15 < 2^53 */
    *out = exp10 < 0 ? v / pow10[-exp10] : v * pow10[exp10];
    return 1;
}

static int number(dec *d)
{
    const char *s = d->p;
    int neg = 0, frac = 0;
    if (*d->p == '-') {
        neg = 1;
        d->p++;
    }
    const char *digits = d->p;
    if (d->p >= d->end || *d->p < '0' || *d->p > '9')
        return fail(d, "bad number");
    if (*d->p == '0')
        d->p++;
    else
        while (d->p < d->end && *d->p >= '0' && *d->p <= '9')
            d->p++;
    size_t ndigits = (size_t)(d->p - digits);
    if (d->p < d->end && *d->p == '.') {
        frac = 1;
        d->p++;
        if (d->p >= d->end || *d->p < '0' || *d->p > '9')
            return fail(d, "bad number");
        while (d->p < d->end && *d->p >= '0' && *d->p <= '9')
            d->p++;
    }
    if (d->p < d->end && (*d->p == 'e' || *d->p == 'E')) {
        frac = 1;
        d->p++;
        if (d->p < d->end && (*d->p == '+' || *d->p == '-'))
            d->p++;
        if (d->p >= d->end || *d->p < '0' || *d->p > '9')
            return fail(d, "bad number");
        while (d->p < d->end && *d->p >= '0' && *d->p <= '9')
            d->p++;
    }
    if (!frac && ndigits <= 15) {
        long long v = 0;
        for (const char *q = digits; q < d->p; q++)
            v = v * 10 + (*q - '0');
        if (neg && v == 0) /* "-0": the double -0.0, as strtod (and lua-cjson) read it */
            lua_pushnumber(d->L, -0.0);
        else
            esx_pushinteger(d->L, neg ? -v : v);
        return 0;
    }
    if (frac) {
        double v;
        if (fast_decimal(digits, d->p, &v)) {
            lua_pushnumber(d->L, neg ? -v : v);
            return 0;
        }
    }
    char tmp[64];
    size_t n = (size_t)(d->p - s);
    char *buf = n < sizeof tmp ? tmp : malloc(n + 1);
    if (buf == NULL)
        return fail(d, "out of memory");
    memcpy(buf, s, n);
    buf[n] = '\0';
    double v = strtod(buf, NULL);
    if (buf != tmp)
        free(buf);
#if !ESX_LUA51
    if (!frac) {
        /* a long integer: exact in Lua 5.4 when it fits 64 bits */
        errno = 0;
        long long iv = strtoll(s, NULL, 10);
        if (errno == 0) {
            lua_pushinteger(d->L, (lua_Integer)iv);
            return 0;
        }
    }
#endif
    lua_pushnumber(d->L, v);
    return 0;
}

static int literal(dec *d, const char *word, size_t n)
{
    if ((size_t)(d->end - d->p) < n || memcmp(d->p, word, n) != 0)
        return fail(d, "unexpected character");
    d->p += n;
    return 0;
}

/* An empty array gets esx.array_mt (kept in the registry by ljson_encode.c), so that it is
 * encoded back as [] and not as {}: a _source read and sent back (a re-index, an update) keeps
 * its "tags": [].  Only the empty case pays for the look-up.  Uses one stack slot (value()
 * checked three for the container, a key and a value; none is in use here). */
static void mark_empty_array(lua_State *L)
{
    lua_getfield(L, LUA_REGISTRYINDEX, "esx.array_mt");
    if (lua_istable(L, -1))
        lua_setmetatable(L, -2);
    else
        lua_pop(L, 1);
}

static int array(dec *d)
{
    lua_State *L = d->L;
    d->p++;
    lua_createtable(L, size_hint(d, 0), 0);
    skip_ws(d);
    if (d->p < d->end && *d->p == ']') {
        d->p++;
        mark_empty_array(L);
        return 0;
    }
    for (int i = 1;; i++) {
        if (value(d) != 0)
            return -1;
        lua_rawseti(L, -2, i);
        skip_ws(d);
        if (d->p >= d->end)
            return fail(d, "unterminated array");
        if (*d->p == ']') {
            d->p++;
            learn_size(d, 0, i);
            return 0;
        }
        if (*d->p != ',')
            return fail(d, "expected ',' or ']'");
        d->p++;
    }
}

static int object(dec *d)
{
    lua_State *L = d->L;
    d->p++;
    lua_createtable(L, 0, size_hint(d, 1));
    skip_ws(d);
    if (d->p < d->end && *d->p == '}') {
        d->p++;
        return 0;
    }
    for (int n = 1;; n++) {
        skip_ws(d);
        if (d->p >= d->end || *d->p != '"')
            return fail(d, "expected a member name");
        if (string(d) != 0)
            return -1;
        skip_ws(d);
        if (d->p >= d->end || *d->p != ':')
            return fail(d, "expected ':'");
        d->p++;
        if (value(d) != 0)
            return -1;
        lua_rawset(L, -3);
        skip_ws(d);
        if (d->p >= d->end)
            return fail(d, "unterminated object");
        if (*d->p == '}') {
            d->p++;
            learn_size(d, 1, n);
            return 0;
        }
        if (*d->p != ',')
            return fail(d, "expected ',' or '}'");
        d->p++;
    }
}

static int value(dec *d)
{
    skip_ws(d);
    if (d->p >= d->end)
        return fail(d, "unexpected end");
    switch (*d->p) {
    case '{':
    case '[': {
        if (++d->depth > MAX_DEPTH)
            return fail(d, "nested too deep");
        /* the container, a member's key and its value (scalars need no check of their own:
         * the top level has LUA_MINSTACK slots, a member the ones checked here) */
        if (!lua_checkstack(d->L, 3))
            return fail(d, "too deep");
        int rc = *d->p == '{' ? object(d) : array(d);
        d->depth--;
        return rc;
    }
    case '"':
        return string(d);
    case 't':
        if (literal(d, "true", 4) != 0)
            return -1;
        lua_pushboolean(d->L, 1);
        return 0;
    case 'f':
        if (literal(d, "false", 5) != 0)
            return -1;
        lua_pushboolean(d->L, 0);
        return 0;
    case 'n':
        if (literal(d, "null", 4) != 0)
            return -1;
        lua_pushlightuserdata(d->L, NULL); /* == cjson.null */
        return 0;
    default:
        if (*d->p == '-' || (*d->p >= '0' && *d->p <= '9'))
            return number(d);
        return fail(d, "unexpected character");
    }
}

int esx_ljson_decode(lua_State *L, const char *s, size_t len)
{
    dec d = {L, s, s + len, NULL, 0, {{0}}};
    memset(d.hint, 4, sizeof d.hint);
    int top = lua_gettop(L);
    if (value(&d) == 0) {
        skip_ws(&d);
        if (d.p == d.end)
            return 1;
        d.err = "trailing characters after the value";
    }
    lua_settop(L, top);
    return esx_lerror_fail(L, "decode", "invalid JSON at byte %ld: %s", (long)(d.p - s), d.err);
}

/* core.json_decode(s) -> value | nil, err (kind "decode") */
static int json_decode(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    return esx_ljson_decode(L, s, len);
}

void esx_ljson_open(lua_State *L)
{
    lua_pushcfunction(L, json_decode);
    lua_setfield(L, -2, "json_decode");
}
