/*
 * retry_after.h -- parses an HTTP Retry-After value (RFC 9110 10.2.3): delta-seconds or an
 * HTTP-date (IMF-fixdate, and the obsolete RFC 850 and asctime forms).
 */
#ifndef ESX_RETRY_AFTER_H
#define ESX_RETRY_AFTER_H

#include <stddef.h>
#include <stdint.h>

/* The delay in ms that value asks for, measured from now_wall_ms (ms since the epoch);
 * a date in the past gives 0.  Returns -1 when value is not a valid Retry-After. */
int64_t esx_retry_after_ms(const char *value, size_t len, int64_t now_wall_ms);

#endif
