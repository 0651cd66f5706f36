/*
 * slowsync.c -- a slow disk, preloaded (LD_PRELOAD) into lua5.4 or luajit by
 * spec/collector_spec.lua: fdatasync and fsync of a regular file take 500 ms more (what a
 * busy or network disk can take).  Directories sync as usual.  Build:
 *   cc -shared -fPIC tools/slowsync.c -o slowsync.so
 */
#define _GNU_SOURCE
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void slow(int fd)
{
    struct stat st;
    struct timespec ts = {0, 500 * 1000 * 1000};
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        nanosleep(&ts, NULL);
}

int fdatasync(int fd)
{
    slow(fd);
    return (int)syscall(SYS_fdatasync, fd);
}

int fsync(int fd)
{
    slow(fd);
    return (int)syscall(SYS_fsync, fd);
}
