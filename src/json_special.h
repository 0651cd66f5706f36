/*
 * json_special.h -- the bytes that end a run of plain JSON string text, eight at a time.
 */
#ifndef ESX_JSON_SPECIAL_H
#define ESX_JSON_SPECIAL_H

#include <stdint.h>

/* The bytes of w (little-endian load) that are a quote, a backslash or a control character,
 * as the high bit of each byte.  The lowest bit set is exact (a borrow can only mark bytes
 * above a real match): __builtin_ctzll(m) >> 3 is the offset of the first such byte. */
static inline uint64_t esx_json_special_bytes(uint64_t w)
{
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t ctl = (w - 0x20 * ones) & ~w & highs;
    uint64_t q = w ^ (0x22 * ones), b = w ^ (0x5c * ones);
    q = (q - ones) & ~q & highs;
    b = (b - ones) & ~b & highs;
    return ctl | q | b;
}

#endif
