/*
 * spool_claim_nolink.c -- claims on a file system with neither RENAME_NOREPLACE nor hard
 * links (vfat, a FUSE or SMB mount), run by spec/collector_spec.lua.  renameat2 fails with
 * EINVAL (spool_two.h), link(2) with EPERM: the claim fell back to link, failed, took it for
 * another process's claim and went on -- dead processes' segments stayed on disk for ever,
 * their acknowledged events never replayed, nothing counted or said.  Now a plain rename
 * onto a name that is not there: every dead segment is claimed and replayed, and one of an
 * earlier process with this pid (a name this process's sequence numbers will meet) is never
 * replaced.  A claim that fails for another reason (here rename(2) fails with EROFS) keeps
 * the file and counts it in claims_failing while it fails -- not in segments_refused, the
 * count of files that are not this user's: that counted it for good, so a claim that worked
 * at a later scan stayed counted as refused, and operators could not tell the two apart.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"
#include "spool_two.h"

/* no hard links */
int link(const char *from, const char *to)
{
    (void)from, (void)to;
    errno = EPERM;
    return -1;
}

static int read_only; /* rename(2) fails as on a file system mounted read-only */

int rename(const char *from, const char *to)
{
    if (read_only) {
        errno = EROFS;
        return -1;
    }
    return renameat(AT_FDCWD, from, AT_FDCWD, to);
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

int main(void)
{
    char dir[] = "/tmp/esx-nolink-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char why[256], path[600];
    /* a dead process's segment, and four of an earlier process with this pid: the names
     * this process's first claims would take */
    snprintf(path, sizeof path, "%s/seg-%d-1.log", dir, (int)dead_pid());
    if (leave(path) != 0)
        return 1;
    for (int i = 1; i <= 4; i++) {
        snprintf(path, sizeof path, "%s/seg-%d-%d.log", dir, (int)getpid(), i);
        if (leave(path) != 0)
            return 1;
    }
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;
    check(esx_spool_claim_orphans(sp) == 5 && sp->segments_refused == 0,
          "without RENAME_NOREPLACE and hard links every dead segment is claimed");
    check(count_segments(dir) == 5, "none replaced another: five names are left");
    check(esx_spool_load(sp, SIZE_MAX, take, NULL, NULL) == 5 && n_taken == 5,
          "and their events are replayed, all five");
    for (int i = 0; i < n_taken; i++)
        esx_spool_release(sp, taken[i], 1);
    check(count_segments(dir) == 0, "once acknowledged they are deleted");

    /* a claim that cannot be made at all: counted once, kept */
    snprintf(path, sizeof path, "%s/seg-%d-2.log", dir, (int)dead_pid());
    if (leave(path) != 0)
        return 1;
    read_only = 1;
    int claimed = esx_spool_claim_orphans(sp);
    claimed += esx_spool_claim_orphans(sp);
    check(claimed == 0 && sp->claims_failing == 1 && access(path, F_OK) == 0,
          "a segment whose claim fails is counted in claims_failing once and kept");
    check(sp->segments_refused == 0, "not in segments_refused: the file is this user's own");
    read_only = 0;
    check(esx_spool_claim_orphans(sp) == 1 && sp->claims_failing == 0 && sp->segments_refused == 0,
          "and claimed once the claim can be made: no longer counted as failing");
    /* a file whose claim fails, then is gone (another process claimed it, a hand removed it) */
    snprintf(path, sizeof path, "%s/seg-%d-3.log", dir, (int)dead_pid());
    if (leave(path) != 0)
        return 1;
    read_only = 1;
    check(esx_spool_claim_orphans(sp) == 0 && sp->claims_failing == 1, "a second one fails");
    unlink(path);
    check(esx_spool_claim_orphans(sp) == 0 && sp->claims_failing == 0,
          "and is no longer counted once its file is gone");
    read_only = 0;
    esx_spool_close(sp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
