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

/* The CLOCK_MONOTONIC instant ms milliseconds from now, for pthread_cond_timedwait on a
 * condition variable created with pthread_condattr_setclock(CLOCK_MONOTONIC). */
static inline struct timespec esx_mono_after(int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (ms < 0)
        ms = 0;
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    return ts;
}

/* Wall-clock milliseconds since the epoch (for received_at stamps and log lines). */
static inline int64_t esx_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
