/*
 * spool_scan_many.c -- the scan for orphans in a spool of many segments (a small
 * spool_segment_bytes, a spool filled during an outage), run by spec/collector_spec.lua.  The
 * scan runs under the collector's lock every 2 s; each name of this process's was looked up by
 * walking every segment: 10000 segments took half a second of CPU, 20000 two, a stall of every
 * request.  It must stay fast, claim none of this spool's own segments, and still claim what
 * is not its own: a dead process's segment, and one an earlier process with this pid left (a
 * sequence number this process has not reached).  Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"
#include "spool_scan.h"

#define SEGMENTS 10000

int main(void)
{
    /* on tmpfs when there is one (10000 files on a disk take seconds to make) */
    char dir[64] = "/dev/shm/esx-scanmany-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        strcpy(dir, "/tmp/esx-scanmany-XXXXXX");
        if (mkdtemp(dir) == NULL)
            return 1;
    }
    char why[256];
    esx_spool *sp = esx_spool_open(dir, 16, why); /* a segment per record */
    if (sp == NULL)
        return 1;
    static const char rec[] = "{\"create\":{}}\n{}\n";
    for (int i = 0; i < SEGMENTS; i++) {
        esx_segment *seg;
        if (esx_spool_append(sp, rec, sizeof rec - 1, 1, &seg, why) != 0)
            return 1;
        if (sp->n_unsynced >= ESX_SPOOL_SYNC_SOON) { /* (the shipper's part) */
            int fds[ESX_SPOOL_SYNC_FDS];
            for (int j = 0, n = esx_spool_sync_begin(sp, fds); j < n; j++)
                close(fds[j]);
        }
    }
    double t0 = now();
    int claimed = esx_spool_claim_orphans(sp);
    double took = now() - t0;
    check(claimed == 0, "none of its own segments is claimed");
    check(took < 0.25, "the scan of 10000 segments of its own is fast"); /* (was 0.5 s) */
    if (took >= 0.25)
        printf("(it took %.2f s)\n", took);

    char path[600];
    snprintf(path, sizeof path, "%s/seg-%d-1.log", dir, (int)dead_pid());
    if (leave(path) != 0)
        return 1;
    snprintf(path, sizeof path, "%s/seg-%d-999999999.log", dir, (int)getpid());
    if (leave(path) != 0)
        return 1;
    check(esx_spool_claim_orphans(sp) == 2, "a dead process's segment and an earlier process's are claimed");
    check(esx_spool_claim_orphans(sp) == 0, "and not again");
    esx_spool_close(sp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
