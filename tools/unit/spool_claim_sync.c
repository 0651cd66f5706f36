/*
 * spool_claim_sync.c -- a dead process's segment claimed by this one is synced by this
 * one's next sync, run by spec/collector_spec.lua.  The dead process acknowledged the
 * events of its last spool_sync_interval before their fdatasync (it was killed inside its
 * interval): they are in the kernel's cache only.  The claimer synced the directory (the
 * claim's rename) but never the claimed file, so a power loss at any time after the claim
 * -- however long after -- could lose events acknowledged more than spool_sync_interval
 * before it.  fdatasync is replaced here: it records the inodes of the files it syncs.  The
 * sync runs in the shipper's sync passes (esx_spool_sync_begin, _end: never under the
 * caller's lock), asked for at once (esx_spool_sync_wanted), and a claimed segment acknowledged
 * and deleted before a sync needs none.  Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"

static ino_t synced[64];
static int n_synced, syncs_outside;

int fdatasync(int fd)
{
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && n_synced < 64)
        synced[n_synced++] = st.st_ino;
    return (int)syscall(SYS_fdatasync, fd);
}

static int was_synced(ino_t ino)
{
    for (int i = 0; i < n_synced; i++)
        if (synced[i] == ino)
            return 1;
    return 0;
}

static void sync_all(esx_spool *sp)
{
    int rounds = 0;
    do {
        int fds[ESX_SPOOL_SYNC_FDS];
        int n = esx_spool_sync_begin(sp, fds);
        esx_spool_sync_end(fds, n);
    } while (esx_spool_sync_wanted(sp) && ++rounds < 100);
}

static esx_segment *taken[16];
static int n_taken;

static int64_t take(void *ud, esx_segment *seg, const char *data, size_t len)
{
    (void)ud, (void)data, (void)len;
    if (n_taken < 16)
        taken[n_taken++] = seg;
    return 1;
}

/* acknowledges every event loaded (one a segment): each segment goes */
static void release_taken(esx_spool *sp)
{
    for (int i = 0; i < n_taken; i++)
        esx_spool_release(sp, taken[i], 1);
    n_taken = 0;
}

int main(void)
{
    char dir[] = "/tmp/esx-claimsync-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char why[256], path[600];
    pid_t dead = dead_pid();
    struct stat st[12];
    for (int i = 0; i < 12; i++) {
        snprintf(path, sizeof path, "%s/seg-%d-%d.log", dir, (int)dead, i + 1);
        if (leave(path) != 0 || stat(path, &st[i]) != 0)
            return 1;
    }
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;
    check(esx_spool_claim_orphans(sp) == 12, "the dead process's 12 segments are claimed");
    syncs_outside = n_synced;
    check(syncs_outside == 0, "the claim (under the collector's lock) waits for no disk");
    check(esx_spool_sync_wanted(sp), "the spool asks for a sync at once, not at its interval");
    sync_all(sp);
    int all = 1;
    for (int i = 0; i < 12; i++)
        all &= was_synced(st[i].st_ino);
    check(all, "the sync passes fdatasync every claimed segment (more than one pass holds)");
    check(!esx_spool_sync_wanted(sp), "then nothing waits");

    /* one claimed and acknowledged before any sync: nothing to sync, no descriptor kept */
    snprintf(path, sizeof path, "%s/seg-%d-20.log", dir, (int)dead);
    struct stat one;
    if (leave(path) != 0 || stat(path, &one) != 0)
        return 1;
    n_synced = 0;
    if (esx_spool_load(sp, SIZE_MAX, take, NULL, NULL) != 12)
        return 1;
    release_taken(sp);
    check(esx_spool_claim_orphans(sp) == 1 && esx_spool_load(sp, SIZE_MAX, take, NULL, NULL) == 1,
          "a later one is claimed and replayed");
    release_taken(sp);
    check(count_segments(dir) == 0 && !esx_spool_sync_wanted(sp),
          "once acknowledged it is deleted, and no sync waits for it");
    sync_all(sp);
    esx_spool_close(sp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
