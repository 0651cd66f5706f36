/* base64.h -- standard base64 (RFC 4648, with padding) for HLL registers in rollup docs. */
#ifndef ESX_BASE64_H
#define ESX_BASE64_H

#include <stddef.h>

/* Bytes needed to encode n bytes, including the NUL. */
size_t esx_base64_len(size_t n);

/* Encodes n bytes into out (esx_base64_len(n) bytes); returns the length without the NUL. */
size_t esx_base64_encode(const unsigned char *in, size_t n, char *out);

/* Decodes len chars into out (at least len/4*3 bytes).  Returns the decoded length, or
 * (size_t)-1 when the input is not valid padded base64. */
size_t esx_base64_decode(const char *in, size_t len, unsigned char *out);

#endif
