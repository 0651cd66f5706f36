/* base64.c -- RFC 4648 base64 (see base64.h). */
#include "base64.h"

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t esx_base64_len(size_t n)
{
    return (n + 2) / 3 * 4 + 1;
}

size_t esx_base64_encode(const unsigned char *in, size_t n, char *out)
{
    size_t o = 0, i = 0;
    for (; i + 2 < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = alphabet[(v >> 6) & 63];
        out[o++] = alphabet[v & 63];
    }
    if (i < n) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0);
        out[o++] = alphabet[v >> 18];
        out[o++] = alphabet[(v >> 12) & 63];
        out[o++] = i + 1 < n ? alphabet[(v >> 6) & 63] : '=';
        out[o++] = '=';
    }
    out[o] = '\0';
    return o;
}

static int value(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

size_t esx_base64_decode(const char *in, size_t len, unsigned char *out)
{
    if (len % 4)
        return (size_t)-1;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 4) {
        int a = value(in[i]), b = value(in[i + 1]);
        int last = i + 4 == len;
        int c = (last && in[i + 2] == '=') ? -2 : value(in[i + 2]);
        int d = (last && in[i + 3] == '=') ? -2 : value(in[i + 3]);
        if (a < 0 || b < 0 || c == -1 || d == -1 || (c == -2 && d != -2))
            return (size_t)-1;
        out[o++] = (unsigned char)(a << 2 | b >> 4);
        if (c >= 0)
            out[o++] = (unsigned char)((b & 15) << 4 | c >> 2);
        if (d >= 0)
            out[o++] = (unsigned char)((c & 3) << 6 | d);
    }
    return o;
}
