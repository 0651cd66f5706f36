/*
 * hash.c -- XXH64, written from the published algorithm description (Yann Collet's
 * "xxHash fast digest algorithm" specification, XXH64 section), and a kernel-random seed.
 */
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "hash.h"

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static uint64_t rotl(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

/* Little-endian loads whatever the host order. */
static uint64_t rd64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t rd32(const unsigned char *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

static uint64_t round64(uint64_t acc, uint64_t lane)
{
    acc += lane * P2;
    acc = rotl(acc, 31);
    return acc * P1;
}

static uint64_t merge64(uint64_t acc, uint64_t v)
{
    acc ^= round64(0, v);
    return acc * P1 + P4;
}

uint64_t esx_hash64(const void *data, size_t n, uint64_t seed)
{
    const unsigned char *p = data;
    size_t left = n;
    uint64_t h;
    if (left >= 32) {
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
        do {
            v1 = round64(v1, rd64(p));
            v2 = round64(v2, rd64(p + 8));
            v3 = round64(v3, rd64(p + 16));
            v4 = round64(v4, rd64(p + 24));
            p += 32;
            left -= 32;
        } while (left >= 32);
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = merge64(h, v1);
        h = merge64(h, v2);
        h = merge64(h, v3);
        h = merge64(h, v4);
    } else {
        h = seed + P5;
    }
    h += (uint64_t)n;
    while (left >= 8) {
        h ^= round64(0, rd64(p));
        h = rotl(h, 27) * P1 + P4;
        p += 8;
        left -= 8;
    }
    if (left >= 4) {
        h ^= rd32(p) * P1;
        h = rotl(h, 23) * P2 + P3;
        p += 4;
        left -= 4;
    }
    while (left > 0) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl(h, 11) * P1;
        p++;
        left--;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
    h ^= h >> 32;
    return h;
}

uint64_t esx_random_seed(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) == (ssize_t)sizeof s && s != 0)
        return s;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000007ULL ^ (uint64_t)ts.tv_nsec ^
                 ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&s;
    /* splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
