/*
 * spool_dead.h -- what the unit programs about a dead process's spool segments share
 * (spool_claim_look.c, spool_claim_race.c, spool_claim_crashed.c, spool_claim_sync.c,
 * spool_claim_nolink.c, spool_refused_once.c, spool_scan_many.c, spool_scan_linked.c): the
 * pid of a process that no longer exists, a segment file of one record left as such a
 * process would leave it, and the number of segment names in a directory.  They link
 * src/spool.c, hence zlib (-lz).  (inline: a program that uses some of them only builds
 * under -Wall -Werror.)
 */
#ifndef ESX_UNIT_SPOOL_DEAD_H
#define ESX_UNIT_SPOOL_DEAD_H

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

/* The pid of a process that no longer exists: a child that exits at once, reaped. */
static inline pid_t dead_pid(void)
{
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

/* A segment of one record at path (made anew), its header as esx_spool_append writes it
 * (the length, the CRC-32): a record that replays.  0, or -1. */
static inline int leave(const char *path)
{
    static const char rec[] = "{\"create\":{}}\n{}\n";
    uint32_t n = sizeof rec - 1, crc = (uint32_t)crc32(0L, (const Bytef *)rec, n);
    unsigned char head[8];
    memcpy(head, &n, 4);
    memcpy(head + 4, &crc, 4);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return -1;
    int rc = write(fd, head, 8) == 8 && write(fd, rec, n) == (ssize_t)n;
    close(fd);
    return rc ? 0 : -1;
}

/* The number of segment names ("seg-...") in dir. */
static inline int count_segments(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL)
        n += strncmp(de->d_name, "seg-", 4) == 0;
    if (d)
        closedir(d);
    return n;
}

#endif
