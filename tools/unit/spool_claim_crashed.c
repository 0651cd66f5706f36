/*
 * spool_claim_crashed.c -- a dead process's segment left with two names by a claimer that
 * died between its link and its unlink (a file system without RENAME_NOREPLACE), run by
 * spec/collector_spec.lua.  Both names are segment names of dead processes in the spool
 * directory: the claim is completed -- the file is claimed, its other name removed, its
 * events replayed -- not refused for good by every later process (spool_segments_refused,
 * its events never replayed).  A file with a name of a live process's (a claim under way)
 * is passed over, and one with a name outside the directory (a backup tool's) is still
 * refused.  Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"

static esx_segment *taken;

static int64_t take(void *ud, esx_segment *seg, const char *data, size_t len)
{
    (void)data, (void)len;
    ++*(int *)ud;
    taken = seg;
    return 1;
}

int main(void)
{
    char dir[] = "/tmp/esx-crashed-XXXXXX", bak[] = "/tmp/esx-crbak-XXXXXX";
    if (mkdtemp(dir) == NULL || mkdtemp(bak) == NULL)
        return 1;
    char why[256], path[600], second[600], copy[600];

    /* the original owner and the claimer that died between its link and its unlink */
    pid_t owner = dead_pid(), claimer = dead_pid();
    snprintf(path, sizeof path, "%s/seg-%d-1.log", dir, (int)owner);
    snprintf(second, sizeof second, "%s/seg-%d-7.log", dir, (int)claimer);
    if (leave(path) != 0 || link(path, second) != 0)
        return 1;
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;
    int replayed = 0;
    check(esx_spool_claim_orphans(sp) == 1 && sp->segments_refused == 0,
          "a segment whose two names are dead processes' is claimed, not refused");
    check(count_segments(dir) == 1 && access(path, F_OK) != 0 && access(second, F_OK) != 0,
          "its dead names are gone: one name is left, this process's");
    check(esx_spool_load(sp, SIZE_MAX, take, &replayed, NULL) == 1 && replayed == 1 &&
              sp->segments_refused == 0,
          "its events are replayed");
    if (taken)
        esx_spool_release(sp, taken, 1); /* acknowledged: the segment goes */
    esx_spool_close(sp);

    /* a second name of a live process's (pid 1): a claim under way, passed over */
    snprintf(path, sizeof path, "%s/seg-%d-2.log", dir, (int)owner);
    snprintf(second, sizeof second, "%s/seg-1-9.log", dir);
    if (leave(path) != 0 || link(path, second) != 0)
        return 1;
    sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;
    check(esx_spool_claim_orphans(sp) == 0 && sp->segments_refused == 0 &&
              access(path, F_OK) == 0 && access(second, F_OK) == 0,
          "a segment with a live process's second name is passed over");
    unlink(second);
    unlink(path);

    /* a name outside the directory (a backup tool's link): refused, as before */
    snprintf(path, sizeof path, "%s/seg-%d-3.log", dir, (int)owner);
    snprintf(second, sizeof second, "%s/seg-%d-8.log", dir, (int)claimer);
    snprintf(copy, sizeof copy, "%s/copy", bak);
    if (leave(path) != 0 || link(path, second) != 0 || link(path, copy) != 0)
        return 1;
    check(esx_spool_claim_orphans(sp) == 0 && sp->segments_refused == 1 &&
              access(path, F_OK) == 0 && access(second, F_OK) == 0,
          "a segment with a link outside the directory is refused, its names kept");
    esx_spool_close(sp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, bak);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
