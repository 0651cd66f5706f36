/*
 * buf.c -- bounded growable byte buffer (see buf.h).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"

void esx_buf_init(esx_buf *b, size_t max)
{
    b->data = NULL;
    b->len = b->cap = 0;
    b->max = max;
}

int esx_buf_reserve(esx_buf *b, size_t n)
{
    /* len + n + 1 (the NUL) must fit in size_t as well as under max */
    if (n > b->max || b->len > b->max - n || n >= SIZE_MAX - b->len)
        return ESX_BUF_TOOBIG;
    size_t need = b->len + n + 1;
    if (need <= b->cap)
        return ESX_BUF_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > (size_t)-1 / 2 ? need : cap * 2;
    if (cap > b->max + 1)
        cap = b->max + 1 > need ? b->max + 1 : need;
    char *p = realloc(b->data, cap);
    if (p == NULL)
        return ESX_BUF_NOMEM;
    b->data = p;
    b->cap = cap;
    return ESX_BUF_OK;
}

int esx_buf_append(esx_buf *b, const void *p, size_t n)
{
    int rc = esx_buf_reserve(b, n);
    if (rc != ESX_BUF_OK)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return ESX_BUF_OK;
}

int esx_buf_appends(esx_buf *b, const char *s)
{
    return esx_buf_append(b, s, strlen(s));
}

void esx_buf_reset(esx_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

void esx_buf_free(esx_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

char *esx_buf_take(esx_buf *b, size_t *len)
{
    char *p = b->data;
    *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

size_t esx_format_i64(char *out, long long v)
{
    char tmp[20];
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    size_t n = 0, o = 0;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        out[o++] = '-';
    while (n)
        out[o++] = tmp[--n];
    return o;
}
