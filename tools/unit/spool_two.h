/*
 * spool_two.h -- what the unit programs of two processes on one spool directory, on a file
 * system without RENAME_NOREPLACE, share (spool_claim_look.c, spool_claim_race.c; and
 * spool_claim_nolink.c, which uses its renameat2 only): renameat2
 * that fails with EINVAL (so that a claim falls back to link(2), then unlink(2) of the old
 * name), and the two spools.  A program that includes it replaces renameat2 for all it links.
 */
#ifndef ESX_UNIT_SPOOL_TWO_H
#define ESX_UNIT_SPOOL_TWO_H

#include <errno.h>
#include <stdio.h>

#include "spool.h"

/* a file system without RENAME_NOREPLACE */
int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
              unsigned int flags)
{
    (void)olddirfd, (void)oldpath, (void)newdirfd, (void)newpath, (void)flags;
    errno = EINVAL;
    return -1;
}

/* Opens two spools on dir: *a this process's, *b another process's, with a pid of its own
 * that is alive (1), so that neither takes the other's segments for orphans.  0, or -1. */
static inline int open_two(const char *dir, esx_spool **a, esx_spool **b)
{
    char why[256];
    *b = esx_spool_open(dir, 1 << 20, why);
    if (*b == NULL)
        return -1;
    (*b)->pid = 1;
    *a = esx_spool_open(dir, 1 << 20, why);
    return *a ? 0 : -1;
}

#endif
