/*
 * hll.c -- HyperLogLog (see hll.h), written from the papers:
 *   P. Flajolet, E. Fusy, O. Gandouet, F. Meunier, "HyperLogLog: the analysis of a
 *     near-optimal cardinality estimation algorithm", AofA 2007 (registers, ranks, merging);
 *   S. Heule, M. Nunkesser, A. Hall, "HyperLogLog in practice", EDBT 2013 (sparse form);
 *   O. Ertl, "New cardinality estimation algorithms for HyperLogLog sketches", 2017,
 *     arXiv:1702.01284 (the improved raw estimator, algorithm 6, with its sigma and tau
 *     series), which is unbiased from 0 to far beyond 10^9 without bias-correction tables.
 *
 * A 64-bit hash h gives the register index (its top P bits) and the rank: one plus the
 * number of leading zeros of the remaining 64-P bits, 1..Q+1 with Q = 64-P = 50 (P = 14).
 *
 * Sparse form: a sorted array of uint32 entries (index << 8 | rank), one per non-zero
 * register; it turns dense once it would need more than the dense form's M*6/8 bytes.
 * Dense form: M registers of 6 bits packed little-endian (register i at bits 6i..6i+5),
 * plus one padding byte so that every register can be read as a 16-bit window.
 *
 * Serialised form (all little-endian):
 *   "EH" version(1) p(14) form(0 sparse | 1 dense)
 *   sparse: count(u16) then count x (index u16, rank u8), indexes strictly increasing
 *   dense:  the M*6/8 packed register bytes
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hll.h"

#define Q (64 - ESX_HLL_P)
#define MAX_RANK (Q + 1)
#define HDR 5
#define DENSE_BYTES (ESX_HLL_M * 6 / 8)
#define SPARSE_MAX (DENSE_BYTES / 4) /* entries of 4 bytes */

struct esx_hll {
    unsigned char *regs; /* packed dense registers (DENSE_BYTES + 1), or NULL while sparse */
    uint32_t *sparse;    /* sorted (index << 8 | rank) */
    uint32_t n, cap;     /* sparse entries used / allocated */
};

esx_hll *esx_hll_new(void)
{
    esx_hll *h = calloc(1, sizeof *h);
    return h;
}

void esx_hll_free(esx_hll *h)
{
    if (!h)
        return;
    free(h->regs);
    free(h->sparse);
    free(h);
}

static unsigned get_reg(const unsigned char *r, uint32_t i)
{
    uint32_t bit = 6 * i;
    unsigned w = (unsigned)r[bit >> 3] | (unsigned)r[(bit >> 3) + 1] << 8;
    return (w >> (bit & 7)) & 63;
}

static void put_reg(unsigned char *r, uint32_t i, unsigned v)
{
    uint32_t bit = 6 * i, b = bit >> 3, sh = bit & 7;
    unsigned w = (unsigned)r[b] | (unsigned)r[b + 1] << 8;
    w = (w & ~(63u << sh)) | (v << sh);
    r[b] = (unsigned char)w;
    r[b + 1] = (unsigned char)(w >> 8);
}

static int to_dense(esx_hll *h)
{
    unsigned char *r = calloc(DENSE_BYTES + 1, 1);
    if (!r)
        return -1;
    for (uint32_t i = 0; i < h->n; i++)
        put_reg(r, h->sparse[i] >> 8, h->sparse[i] & 0xFF);
    free(h->sparse);
    h->sparse = NULL;
    h->n = h->cap = 0;
    h->regs = r;
    return 0;
}

/* Sets register idx to at least rank. */
static int set_reg(esx_hll *h, uint32_t idx, unsigned rank)
{
    if (h->regs) {
        if (get_reg(h->regs, idx) < rank)
            put_reg(h->regs, idx, rank);
        return 0;
    }
    /* binary search for idx */
    uint32_t lo = 0, hi = h->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((h->sparse[mid] >> 8) < idx)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < h->n && (h->sparse[lo] >> 8) == idx) {
        if ((h->sparse[lo] & 0xFF) < rank)
            h->sparse[lo] = idx << 8 | rank;
        return 0;
    }
    if (h->n >= SPARSE_MAX) {
        if (to_dense(h) < 0)
            return -1;
        put_reg(h->regs, idx, rank);
        return 0;
    }
    if (h->n == h->cap) {
        uint32_t cap = h->cap ? h->cap * 2 : 8;
        if (cap > SPARSE_MAX)
            cap = SPARSE_MAX;
        uint32_t *p = realloc(h->sparse, cap * sizeof *p);
        if (!p)
            return -1;
        h->sparse = p;
        h->cap = cap;
    }
    memmove(h->sparse + lo + 1, h->sparse + lo, (h->n - lo) * sizeof *h->sparse);
    h->sparse[lo] = idx << 8 | rank;
    h->n++;
    return 0;
}

int esx_hll_add_hash(esx_hll *h, uint64_t hash)
{
    uint32_t idx = (uint32_t)(hash >> Q);
    uint64_t w = hash << ESX_HLL_P;
    unsigned rank = w == 0 ? MAX_RANK : (unsigned)__builtin_clzll(w) + 1;
    return set_reg(h, idx, rank);
}

int esx_hll_merge(esx_hll *dst, const esx_hll *src)
{
    if (src->regs) {
        if (!dst->regs && to_dense(dst) < 0)
            return -1;
        for (uint32_t i = 0; i < ESX_HLL_M; i++) {
            unsigned v = get_reg(src->regs, i);
            if (get_reg(dst->regs, i) < v)
                put_reg(dst->regs, i, v);
        }
        return 0;
    }
    if (dst->regs) {
        for (uint32_t i = 0; i < src->n; i++)
            set_reg(dst, src->sparse[i] >> 8, src->sparse[i] & 0xFF);
        return 0;
    }
    /* both sparse: merge the sorted lists into a new one, or go dense when too long */
    uint32_t total = dst->n + src->n;
    if (total > SPARSE_MAX) {
        /* the union may still fit, but dense is at most as big: simpler and bounded */
        if (to_dense(dst) < 0)
            return -1;
        for (uint32_t i = 0; i < src->n; i++)
            set_reg(dst, src->sparse[i] >> 8, src->sparse[i] & 0xFF);
        return 0;
    }
    uint32_t *out = malloc((total ? total : 1) * sizeof *out);
    if (!out)
        return -1;
    uint32_t a = 0, b = 0, k = 0;
    while (a < dst->n || b < src->n) {
        uint32_t x = a < dst->n ? dst->sparse[a] : UINT32_MAX;
        uint32_t y = b < src->n ? src->sparse[b] : UINT32_MAX;
        if ((x >> 8) == (y >> 8)) {
            out[k++] = x > y ? x : y;
            a++;
            b++;
        } else if ((x >> 8) < (y >> 8)) {
            out[k++] = x;
            a++;
        } else {
            out[k++] = y;
            b++;
        }
    }
    free(dst->sparse);
    dst->sparse = out;
    dst->n = k;
    dst->cap = total ? total : 1;
    return 0;
}

/* Ertl 2017, algorithm 6 helpers. */
static double sigma(double x)
{
    if (x == 1.0)
        return INFINITY;
    double y = 1.0, z = x, zp;
    do {
        x *= x;
        zp = z;
        z += x * y;
        y += y;
    } while (z != zp);
    return z;
}

static double tau(double x)
{
    if (x == 0.0 || x == 1.0)
        return 0.0;
    double y = 1.0, z = 1.0 - x, zp;
    do {
        x = sqrt(x);
        zp = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
    } while (z != zp);
    return z / 3.0;
}

double esx_hll_estimate(const esx_hll *h)
{
    uint32_t c[MAX_RANK + 1] = {0};
    const double m = ESX_HLL_M;
    if (h->regs) {
        for (uint32_t i = 0; i < ESX_HLL_M; i++) {
            unsigned v = get_reg(h->regs, i);
            c[v <= MAX_RANK ? v : MAX_RANK]++;
        }
    } else {
        c[0] = ESX_HLL_M - h->n;
        for (uint32_t i = 0; i < h->n; i++)
            c[h->sparse[i] & 0xFF]++;
    }
    if (c[0] == ESX_HLL_M)
        return 0.0;
    double z = m * tau(1.0 - c[Q + 1] / m);
    for (int k = Q; k >= 1; k--)
        z = 0.5 * (z + c[k]);
    z += m * sigma(c[0] / m);
    return (0.5 / log(2.0)) * m * m / z;
}

size_t esx_hll_memory(const esx_hll *h)
{
    return sizeof *h + (h->regs ? DENSE_BYTES + 1 : (size_t)h->cap * sizeof *h->sparse);
}

size_t esx_hll_serialize(const esx_hll *h, unsigned char *out, size_t outlen)
{
    size_t need = HDR + (h->regs ? DENSE_BYTES : 2 + 3 * (size_t)h->n);
    if (!out || outlen < need)
        return need;
    out[0] = 'E';
    out[1] = 'H';
    out[2] = 1;
    out[3] = ESX_HLL_P;
    out[4] = h->regs ? 1 : 0;
    unsigned char *p = out + HDR;
    if (h->regs) {
        memcpy(p, h->regs, DENSE_BYTES);
    } else {
        *p++ = (unsigned char)h->n;
        *p++ = (unsigned char)(h->n >> 8);
        for (uint32_t i = 0; i < h->n; i++) {
            uint32_t idx = h->sparse[i] >> 8;
            *p++ = (unsigned char)idx;
            *p++ = (unsigned char)(idx >> 8);
            *p++ = (unsigned char)(h->sparse[i] & 0xFF);
        }
    }
    return need;
}

esx_hll *esx_hll_deserialize(const unsigned char *in, size_t len, int *nomem)
{
    int dummy;
    if (!nomem)
        nomem = &dummy;
    *nomem = 0;
    if (!in || len < HDR || in[0] != 'E' || in[1] != 'H' || in[2] != 1 || in[3] != ESX_HLL_P ||
        in[4] > 1)
        return NULL;
    const unsigned char *p = in + HDR;
    size_t rest = len - HDR;
    esx_hll *h = esx_hll_new();
    if (!h) {
        *nomem = 1;
        return NULL;
    }
    if (in[4] == 1) {
        if (rest != DENSE_BYTES)
            goto bad;
        h->regs = calloc(DENSE_BYTES + 1, 1);
        if (!h->regs) {
            *nomem = 1;
            goto bad;
        }
        memcpy(h->regs, p, DENSE_BYTES);
        for (uint32_t i = 0; i < ESX_HLL_M; i++)
            if (get_reg(h->regs, i) > MAX_RANK)
                goto bad;
        return h;
    }
    if (rest < 2)
        goto bad;
    uint32_t n = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    p += 2;
    rest -= 2;
    if (n > SPARSE_MAX || rest != 3 * (size_t)n)
        goto bad;
    if (n) {
        h->sparse = malloc(n * sizeof *h->sparse);
        if (!h->sparse) {
            *nomem = 1;
            goto bad;
        }
        h->cap = n;
    }
    for (uint32_t i = 0; i < n; i++, p += 3) {
        uint32_t idx = (uint32_t)p[0] | (uint32_t)p[1] << 8;
        unsigned r = p[2];
        if (idx >= ESX_HLL_M || r < 1 || r > MAX_RANK)
            goto bad;
        if (i && idx <= (h->sparse[i - 1] >> 8))
            goto bad;
        h->sparse[i] = idx << 8 | r;
        h->n = i + 1;
    }
    return h;
bad:
    esx_hll_free(h);
    return NULL;
}
