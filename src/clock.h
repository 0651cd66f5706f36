/* clock.h -- monotonic milliseconds, the one time base of every deadline in esx. */
#ifndef ESX_CLOCK_H
#define ESX_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t esx_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wall-clock milliseconds since the epoch (for received_at stamps and log lines). */
static inline int64_t esx_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
