/* hex.h -- one hexadecimal digit, for the parsers that read them (JSON \u escapes, chunk
 * sizes, %XX in URLs). */
#ifndef ESX_HEX_H
#define ESX_HEX_H

/* The value 0..15 of the hex digit c, or -1 when c is not one. */
static inline int esx_hex_digit(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
