/*
 * spool_scan.h -- what the unit programs that time a spool's scan for orphans share
 * (spool_scan_many.c, spool_scan_linked.c): the process's CPU time.  (The segments they leave
 * as a dead process would: spool_dead.h.)
 */
#ifndef ESX_UNIT_SPOOL_SCAN_H
#define ESX_UNIT_SPOOL_SCAN_H

#include <time.h>

/* CPU time, not the wall clock's: a process preempted on a busy machine is not slow */
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

#endif
