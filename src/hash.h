/*
 * hash.h -- a seeded 64-bit hash of bytes, for hash tables keyed by user input (seeded per
 * process so that nobody can precompute collisions) and for HyperLogLog.
 */
#ifndef ESX_HASH_H
#define ESX_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Hashes n bytes with seed.  Never fails. */
uint64_t esx_hash64(const void *p, size_t n, uint64_t seed);

/* A random 64-bit seed from the kernel (getrandom), falling back to time and pid. */
uint64_t esx_random_seed(void);

#endif
