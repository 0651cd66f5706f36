/*
 * spool_scan.h -- what the unit programs that time a spool's scan for orphans share
 * (spool_scan_many.c, spool_scan_linked.c): the process's CPU time, and a segment file of
 * one record left as a dead process would leave it.
 */
#ifndef ESX_UNIT_SPOOL_SCAN_H
#define ESX_UNIT_SPOOL_SCAN_H

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

/* CPU time, not the wall clock's: a process preempted on a busy machine is not slow */
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* A segment of one record at path (made anew).  0, or -1. */
static int leave(const char *path)
{
    static const char rec[] = "{\"create\":{}}\n{}\n";
    unsigned char head[8] = {(unsigned char)(sizeof rec - 1)};
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return -1;
    int rc = write(fd, head, 8) == 8 && write(fd, rec, sizeof rec - 1) == (ssize_t)sizeof rec - 1;
    close(fd);
    return rc ? 0 : -1;
}

#endif
