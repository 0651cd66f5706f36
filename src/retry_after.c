/*
 * retry_after.c -- Retry-After parsing (see retry_after.h).  No locale, no libc date
 * parsing: the bytes come from a server and must not be able to surprise us.
 */
#include <string.h>

#include "retry_after.h"

#define MAX_DELAY_S 315360000LL /* ten years: anything longer is treated as that */

static int month_index(const char *p)
{
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    for (int i = 0; i < 12; i++)
        if (memcmp(p, months + 3 * i, 3) == 0)
            return i;
    return -1;
}

/* Days from 1970-01-01 to y-m-d (proleptic Gregorian), m 1..12. */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int digits(const char *p, const char *end, int n, int *out)
{
    if (end - p < n)
        return -1;
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    *out = v;
    return 0;
}

/* "HH:MM:SS" */
static int parse_time(const char *p, const char *end, int *h, int *mi, int *s)
{
    if (end - p < 8 || p[2] != ':' || p[5] != ':')
        return -1;
    if (digits(p, end, 2, h) || digits(p + 3, end, 2, mi) || digits(p + 6, end, 2, s))
        return -1;
    return (*h > 23 || *mi > 59 || *s > 60) ? -1 : 0;
}

static int64_t parse_date(const char *p, const char *end)
{
    int day, year, h, mi, s, mon;
    const char *comma = memchr(p, ',', (size_t)(end - p));
    if (comma && comma - p == 3) {
        /* IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT" */
        const char *q = comma + 1;
        if (end - q != 25 || q[0] != ' ' || q[3] != ' ' || q[7] != ' ' || q[12] != ' ' ||
            q[21] != ' ' || memcmp(q + 22, "GMT", 3) != 0)
            return -1;
        if (digits(q + 1, end, 2, &day) || (mon = month_index(q + 4)) < 0 ||
            digits(q + 8, end, 4, &year) || parse_time(q + 13, end, &h, &mi, &s))
            return -1;
    } else if (comma) {
        /* RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT" */
        const char *q = comma + 1;
        if (end - q != 23 || q[0] != ' ' || q[3] != '-' || q[7] != '-' || q[10] != ' ' ||
            q[19] != ' ' || memcmp(q + 20, "GMT", 3) != 0)
            return -1;
        if (digits(q + 1, end, 2, &day) || (mon = month_index(q + 4)) < 0 ||
            digits(q + 8, end, 2, &year) || parse_time(q + 11, end, &h, &mi, &s))
            return -1;
        year += year < 70 ? 2000 : 1900;
    } else {
        /* asctime: "Sun Nov  6 08:49:37 1994" */
        if (end - p != 24 || p[3] != ' ' || p[7] != ' ' || p[10] != ' ' || p[19] != ' ')
            return -1;
        if ((mon = month_index(p + 4)) < 0 || parse_time(p + 11, end, &h, &mi, &s) ||
            digits(p + 20, end, 4, &year))
            return -1;
        if (p[8] == ' ') {
            if (digits(p + 9, end, 1, &day))
                return -1;
        } else if (digits(p + 8, end, 2, &day)) {
            return -1;
        }
    }
    if (day < 1 || day > 31)
        return -1;
    return (days_from_civil(year, mon + 1, day) * 86400 + h * 3600 + mi * 60 + s) * 1000;
}

int64_t esx_retry_after_ms(const char *value, size_t len, int64_t now_wall_ms)
{
    const char *p = value, *end = value + len;
    while (p < end && (*p == ' ' || *p == '\t'))
        p++;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    if (p == end)
        return -1;
    if (*p >= '0' && *p <= '9') {
        int64_t secs = 0;
        for (; p < end; p++) {
            if (*p < '0' || *p > '9')
                return -1;
            if (secs < MAX_DELAY_S)
                secs = secs * 10 + (*p - '0');
        }
        return (secs > MAX_DELAY_S ? MAX_DELAY_S : secs) * 1000;
    }
    int64_t at = parse_date(p, end);
    if (at < 0 && at != -1)
        return 0; /* a date before 1970 is in the past */
    if (at == -1)
        return -1;
    if (at <= now_wall_ms)
        return 0;
    /* as for delta-seconds: a date further than ten years ahead asks for ten years */
    return at - now_wall_ms > MAX_DELAY_S * 1000 ? MAX_DELAY_S * 1000 : at - now_wall_ms;
}
