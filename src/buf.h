/*
 * buf.h -- a growable byte buffer with a hard size limit (after curl's dynbuf).
 *
 * Every buffer esx fills from the network or from user input has a maximum; appending past it
 * fails instead of growing, and an allocation failure is an error, never an abort().
 */
#ifndef ESX_BUF_H
#define ESX_BUF_H

#include <stddef.h>

typedef struct esx_buf {
    char *data;    /* NUL-terminated when non-NULL, so text can be read in place */
    size_t len;
    size_t cap;
    size_t max;    /* hard limit on len */
} esx_buf;

enum { ESX_BUF_OK = 0, ESX_BUF_NOMEM = -1, ESX_BUF_TOOBIG = -2 };

/* Initialises an empty buffer that may hold at most max bytes.  Allocates nothing. */
void esx_buf_init(esx_buf *b, size_t max);

/* Appends n bytes.  Returns ESX_BUF_OK, ESX_BUF_TOOBIG (len would pass max; nothing appended)
 * or ESX_BUF_NOMEM (nothing appended).  The buffer stays valid either way. */
int esx_buf_append(esx_buf *b, const void *p, size_t n);

/* Appends a NUL-terminated string; as esx_buf_append. */
int esx_buf_appends(esx_buf *b, const char *s);

/* Makes room for n more bytes without changing len; as esx_buf_append. */
int esx_buf_reserve(esx_buf *b, size_t n);

/* Empties the buffer, keeping its memory. */
void esx_buf_reset(esx_buf *b);

/* Frees the memory; the buffer is empty and reusable afterwards. */
void esx_buf_free(esx_buf *b);

/* Hands the bytes to the caller (who frees them with free()); the buffer becomes empty.
 * *len receives the length.  Returns NULL for an empty buffer. */
char *esx_buf_take(esx_buf *b, size_t *len);

/* Writes v in decimal (no NUL) to out, which has room for 20 bytes.  Returns the length. */
size_t esx_format_i64(char *out, long long v);

#endif
