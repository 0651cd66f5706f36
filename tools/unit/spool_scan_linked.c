/*
 * spool_scan_linked.c -- the scan for orphans in a spool whose dead segments all have a
 * second link (a backup tool's hard-link snapshot: rsnapshot, `cp -al`), run by
 * spec/collector_spec.lua.  For each such segment the scan looked at the directory's other
 * names (is the second link a claimer's, half way through a claim without RENAME_NOREPLACE?)
 * by reading the whole directory again and lstat-ing every segment name in it: N segments,
 * N^2 lstat calls, under the collector's lock that every request takes -- 4000 segments took a
 * minute of CPU.  It must stay fast, and still refuse each of them once (a backup's link is no
 * claim), and claim a dead claimer's segment left with two dead names.  Prints "ok <name>"
 * per check; exits 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"
#include "spool_scan.h"

#define SEGMENTS 2000

int main(void)
{
    /* on tmpfs when there is one (thousands of files on a disk take seconds to make) */
    char top[64] = "/dev/shm/esx-scanlinked-XXXXXX";
    if (mkdtemp(top) == NULL) {
        strcpy(top, "/tmp/esx-scanlinked-XXXXXX");
        if (mkdtemp(top) == NULL)
            return 1;
    }
    char dir[128], backup[128];
    snprintf(dir, sizeof dir, "%s/spool", top);
    snprintf(backup, sizeof backup, "%s/backup", top);
    if (mkdir(dir, 0700) != 0 || mkdir(backup, 0700) != 0)
        return 1;
    pid_t dead = dead_pid();
    for (int i = 1; i <= SEGMENTS; i++) {
        char path[600], copy[600];
        snprintf(path, sizeof path, "%s/seg-%d-%d.log", dir, (int)dead, i);
        snprintf(copy, sizeof copy, "%s/seg-%d-%d.log", backup, (int)dead, i);
        if (leave(path) != 0 || link(path, copy) != 0)
            return 1;
    }
    /* a claimer (without RENAME_NOREPLACE) killed between its link and its unlink: two
     * names of dead processes in the spool directory, the claim to be completed */
    pid_t claimer = dead_pid();
    char old_name[600], new_name[600];
    snprintf(old_name, sizeof old_name, "%s/seg-%d-%d.log", dir, (int)dead, SEGMENTS + 1);
    snprintf(new_name, sizeof new_name, "%s/seg-%d-1.log", dir, (int)claimer);
    if (leave(old_name) != 0 || link(old_name, new_name) != 0)
        return 1;

    /* (the snapshot was taken a while ago: not the claim of a process at work now) */
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    char why[256];
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;
    double t0 = now();
    int claimed = esx_spool_claim_orphans(sp);
    double took = now() - t0;
    check(claimed == 1 && sp->segments_refused == SEGMENTS,
          "each backed-up segment is refused, the half-claimed one claimed");
    check(took < 0.5, "the scan of 2000 segments with a second link is fast");
    if (took >= 0.5)
        printf("(it took %.2f s)\n", took);
    t0 = now();
    claimed = esx_spool_claim_orphans(sp);
    took = now() - t0;
    check(claimed == 0 && sp->segments_refused == SEGMENTS, "and nothing again at the next scan");
    check(took < 0.5, "which is fast too");
    esx_spool_close(sp);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", top);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
