/*
 * private.c -- paths only this user may touch (see private.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "private.h"

/* stat of the directory that holds path: 0, or -1. */
static int dir_of(const char *path, struct stat *st)
{
    char dir[512];
    size_t n = strlen(path);
    if (n >= sizeof dir)
        return -1;
    memcpy(dir, path, n + 1);
    while (n > 1 && dir[n - 1] == '/')
        dir[--n] = '\0';
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else
        slash[slash == dir ? 1 : 0] = '\0';
    return stat(dir, st) == 0 && S_ISDIR(st->st_mode) ? 0 : -1;
}

/* 1 when the directory that holds path may be written by nobody but root and owner: then
 * whatever of owner's is in it was put there by root or by owner, not by a third user. */
static int placed_by(const char *path, uid_t owner)
{
    struct stat st;
    return dir_of(path, &st) == 0 && (st.st_uid == 0 || st.st_uid == owner) &&
           (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

/* 1 when st (of path) is owned by this user and writable by neither its group nor others.
 * Root also takes another user's, when that user's own directory or one of root's holds it:
 * nginx's master creates the collector as root for workers that run as another user, and the
 * directory an operator made for them is theirs.  Not in a directory others may write to
 * (/tmp, the default dead-letter file's): anyone could have made it there, to read what root
 * writes to it or to swap it. */
static int ours(const struct stat *st, const char *path)
{
    uid_t me = geteuid();
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) != 0)
        return 0;
    return st->st_uid == me || (me == 0 && placed_by(path, st->st_uid));
}

/* 1 when st, a directory (or a link) above a private directory owned by owner, cannot be
 * changed by a third user: owned by root, this user or owner, and writable by no one else --
 * or sticky (/tmp), where others cannot rename what is not theirs. */
static int safe_above(const struct stat *st, uid_t owner)
{
    if (st->st_uid != 0 && st->st_uid != geteuid() && st->st_uid != owner)
        return 0;
    if (S_ISLNK(st->st_mode))
        return 1;
    return S_ISDIR(st->st_mode) &&
           ((st->st_mode & (S_IWGRP | S_IWOTH)) == 0 || (st->st_mode & S_ISVTX) != 0);
}

/* 1 when every directory above path (absolute), as written and once links are resolved,
 * is safe_above: else a third user could rename path away and put a link or a directory of
 * theirs in its place -- the spool's segments are opened, claimed and removed by path. */
static int safe_ancestors(const char *path, uid_t owner)
{
    char *real = realpath(path, NULL);
    if (real == NULL)
        return 0;
    int ok = 1;
    for (int pass = 0; pass < 2 && ok; pass++) {
        const char *p = pass == 0 ? path : real;
        char prefix[PATH_MAX];
        size_t n = strlen(p);
        if (n >= sizeof prefix) {
            ok = 0;
            break;
        }
        struct stat st;
        /* "/", then each prefix that ends before a '/' (the last component is path itself) */
        ok = lstat("/", &st) == 0 && safe_above(&st, owner);
        for (size_t i = 1; i < n && ok; i++) {
            if (p[i] != '/' || p[i - 1] == '/')
                continue;
            memcpy(prefix, p, i);
            prefix[i] = '\0';
            ok = lstat(prefix, &st) == 0 && safe_above(&st, owner);
        }
    }
    free(real);
    return ok;
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
    if (!S_ISDIR(st.st_mode) || !ours(&st, tmp)) {
        errno = EPERM;
        return -1;
    }
    /* and the directories above it (a relative dir: from the working directory up) */
    char abs[PATH_MAX + sizeof tmp + 1];
    if (tmp[0] == '/') {
        snprintf(abs, sizeof abs, "%s", tmp);
    } else {
        char cwd[PATH_MAX];
        if (getcwd(cwd, sizeof cwd) == NULL)
            return -1;
        snprintf(abs, sizeof abs, "%s/%s", cwd, tmp);
    }
    if (!safe_ancestors(abs, st.st_uid)) {
        errno = EPERM;
        return -1;
    }
    return 0;
}

/* fd (of path), or -1 (closed, errno EPERM) unless it is a regular file of this user's -- or, with
 * devices, a character device (/dev/null: only root makes those) */
static int checked(int fd, const char *path, int devices)
{
    struct stat st;
    if (fd < 0) {
        /* O_NOFOLLOW met a link; O_NONBLOCK met a FIFO without a reader */
        if (errno == ELOOP || errno == ENXIO)
            errno = EPERM;
        return -1;
    }
    /* (one link only: a hard link another user made to a file root may write is not ours) */
    if (fstat(fd, &st) != 0 ||
        !((S_ISREG(st.st_mode) && ours(&st, path) && st.st_nlink == 1) ||
          (devices && S_ISCHR(st.st_mode)))) {
        close(fd);
        errno = EPERM;
        return -1;
    }
    /* (opened with O_NONBLOCK, so that a FIFO put there fails now instead of hanging the
     * open until a reader comes; what is kept is a file or a device: blocking I/O) */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int esx_private_append(const char *path)
{
    int flags = O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
    int fd = open(path, O_RDWR | O_EXCL | flags, 0600);
    struct stat dir;
    if (fd >= 0 && geteuid() == 0 && dir_of(path, &dir) == 0 && dir.st_uid != 0 &&
        (dir.st_mode & (S_IWGRP | S_IWOTH)) == 0) {
        /* Made by root in another user's own directory: nginx's master creating the
         * collector for workers of that user (a spool_dir given to them holds the default
         * dead-letter file).  Root's file there was one the workers could not open, and
         * every dead letter was lost (dead_letter_failed); the directory's owner gets it. */
        if (fchown(fd, dir.st_uid, dir.st_gid) != 0) {
            close(fd);
            return -1;
        }
    }
    if (fd < 0 && errno == EEXIST)
        fd = open(path, O_RDWR | flags, 0600);
    if (fd < 0 && errno == EACCES) /* a file this user may append to but not read */
        fd = open(path, O_WRONLY | flags, 0600);
    return checked(fd, path, 1);
}

int esx_private_read(const char *path)
{
    return checked(open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), path, 0);
}
