/*
 * spool_refused_once.c -- a dead process's segment refused at a scan (a second link: a backup
 * tool's), then claimed once the link is gone, then refused again at its replay (the backup
 * tool linked it again), run by spec/collector_spec.lua.  spool_segments_refused counts a file
 * once, however many times it is refused: the replay's refusal counted it a second time.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"

static int64_t take(void *ud, esx_segment *seg, const char *data, size_t len)
{
    (void)ud, (void)seg, (void)data, (void)len;
    return 1;
}

int main(void)
{
    char dir[] = "/tmp/esx-refused-XXXXXX", bak[] = "/tmp/esx-refbak-XXXXXX";
    if (mkdtemp(dir) == NULL || mkdtemp(bak) == NULL)
        return 1;
    char path[600], copy[600];
    snprintf(path, sizeof path, "%s/seg-%d-1.log", dir, (int)dead_pid());
    snprintf(copy, sizeof copy, "%s/copy", bak);
    if (leave(path) != 0)
        return 1;

    char why[256];
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;
    if (link(path, copy) != 0)
        return 1;
    check(esx_spool_claim_orphans(sp) == 0 && sp->segments_refused == 1,
          "a segment with a second link is refused at the scan, and counted");
    unlink(copy);
    check(esx_spool_claim_orphans(sp) == 1 && esx_spool_has_backlog(sp),
          "claimed once the second link is gone");
    if (sp->backlog_head == NULL || link(sp->backlog_head->path, copy) != 0)
        return 1;
    check(esx_spool_load(sp, SIZE_MAX, take, NULL, NULL) == 0 && !esx_spool_has_backlog(sp),
          "refused at its replay (linked again), and passed over");
    check(sp->segments_refused == 1, "the file is counted once");
    esx_spool_close(sp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s", dir, bak);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
