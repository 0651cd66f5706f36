/*
 * failsync.c -- a disk that loses writes, preloaded (LD_PRELOAD) into lua5.4 or luajit by
 * spec/collector_spec.lua: fdatasync and fsync of a regular file fail with EIO (the error a
 * failing disk, or a thin pool out of space, reports; the kernel may have dropped the dirty
 * pages by then).  Directories sync as usual.  Build:
 *   cc -shared -fPIC tools/failsync.c -o failsync.so
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int fail(int fd)
{
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

int fdatasync(int fd)
{
    if (fail(fd)) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fdatasync, fd);
}

int fsync(int fd)
{
    if (fail(fd)) {
        errno = EIO;
        return -1;
    }
    return (int)syscall(SYS_fsync, fd);
}
