/*
 * spool_claim_look.c -- a scan that meets a dead process's segment while another process
 * claims it on a file system without RENAME_NOREPLACE, run by spec/collector_spec.lua.  The
 * claim falls back to link(2), then unlink(2) of the old name: between the two, the old name
 * has two links.  A scan of another process that looks then must pass it over as being
 * claimed, not refuse it as not private (spool_segments_refused, and a line on stderr, for a
 * file that is replayed).  The other process's scan is run from inside the claimer's link,
 * once the link is made (here: a second spool, as another process, with a pid of its own).
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"
#include "spool_two.h"

static esx_spool *second; /* scans from inside the first claimer's link, once */
static int second_claimed = -1;

int link(const char *from, const char *to)
{
    int rc = linkat(AT_FDCWD, from, AT_FDCWD, to, 0);
    if (rc == 0 && second) {
        esx_spool *sp = second;
        second = NULL;
        second_claimed = esx_spool_claim_orphans(sp);
    }
    return rc;
}

int main(void)
{
    char dir[] = "/tmp/esx-look-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char path[600];
    snprintf(path, sizeof path, "%s/seg-%d-1.log", dir, (int)dead_pid());
    if (leave(path) != 0)
        return 1;

    esx_spool *a, *b; /* b: the other process */
    if (open_two(dir, &a, &b) != 0)
        return 1;
    second = b;
    int a_claimed = esx_spool_claim_orphans(a);
    check(second == NULL && second_claimed == 0,
          "the other process scanned between the claimer's link and unlink, claiming nothing");
    check(a_claimed == 1 && esx_spool_has_backlog(a), "the claimer has the segment");
    check(b->segments_refused == 0, "the other process does not count it as refused");
    esx_spool_close(a);
    esx_spool_close(b);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
