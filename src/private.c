/*
 * private.c -- paths only this user may touch (see private.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "private.h"

/* 1 when st is owned by this user -- or, for root, by any user: nginx's master creates the
 * collector as root for workers that run as another user, and the directory an operator
 * made for them is theirs -- and writable by neither its group nor others. */
static int ours(const struct stat *st)
{
    uid_t me = geteuid();
    return (st->st_uid == me || me == 0) && (st->st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

int esx_private_dir(const char *dir)
{
    char tmp[512];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
        return -1;
    struct stat st;
    if (lstat(tmp, &st) != 0)
        return -1;
    if (!S_ISDIR(st.st_mode) || !ours(&st)) {
        errno = EPERM;
        return -1;
    }
    return 0;
}

/* fd, or -1 (closed, errno EPERM) unless it is a regular file of this user's -- or, with
 * devices, a character device (/dev/null: only root makes those) */
static int checked(int fd, int devices)
{
    struct stat st;
    if (fd < 0) {
        if (errno == ELOOP) /* O_NOFOLLOW met a link */
            errno = EPERM;
        return -1;
    }
    /* (one link only: a hard link another user made to a file root may write is not ours) */
    if (fstat(fd, &st) != 0 ||
        !((S_ISREG(st.st_mode) && ours(&st) && st.st_nlink == 1) ||
          (devices && S_ISCHR(st.st_mode)))) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    return fd;
}

int esx_private_append(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == EACCES) /* a file this user may append to but not read */
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    return checked(fd, 1);
}

int esx_private_read(const char *path)
{
    return checked(open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), 0);
}
