/*
 * spool_claim_race.c -- two processes claiming one dead process's segment on a file system
 * without RENAME_NOREPLACE, run by spec/collector_spec.lua.  The claim falls back to
 * link(2) then unlink(2) of the old name; a second claimer that links the old name between
 * the two must not replay the segment too: only the one whose unlink removed the old name
 * has it.  The second claimer is run from inside the first one's link (here: a second
 * spool, as another process, with a pid of its own).  (That second claimer looks at the
 * old name before the first one's link: after it, the name has two links and is not
 * claimed.)  Prints "ok <name>" per check; exits
 * 1 on a failure.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"
#include "spool_two.h"

static esx_spool *second; /* claims from inside the first claimer's link, once */
static int second_claimed;

/* The first claimer's link runs the second claimer, which has already looked at the old
 * name (one link: an orphan) when its own link comes: the first one's link is made then,
 * just before.  Order: second's lstat, first's link, second's link and unlink, first's
 * unlink (which finds the old name gone). */
static const char *first_from, *first_to;
static int first_rc = -1;

int link(const char *from, const char *to)
{
    if (second) {
        esx_spool *sp = second;
        second = NULL;
        first_from = from;
        first_to = to;
        second_claimed = esx_spool_claim_orphans(sp);
        if (first_from) { /* the second claimer made no link: make the first one's now */
            first_rc = linkat(AT_FDCWD, from, AT_FDCWD, to, 0);
            first_from = NULL;
        }
        return first_rc;
    }
    if (first_from) {
        first_rc = linkat(AT_FDCWD, first_from, AT_FDCWD, first_to, 0);
        first_from = NULL;
    }
    return linkat(AT_FDCWD, from, AT_FDCWD, to, 0);
}

static int in_backlog(const esx_spool *sp)
{
    return esx_spool_has_backlog(sp);
}

int main(void)
{
    char dir[] = "/tmp/esx-claim-XXXXXX";
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
    check(second == NULL, "the second claimer ran between the first one's link and unlink");
    check(first_rc == 0, "the first claimer's link was made");
    check(a_claimed + second_claimed == 1, "one of the two claimed the segment, not both");
    check(in_backlog(a) + in_backlog(b) == 1, "one backlog holds it");
    check(count_segments(dir) == 1, "one name is left for it");
    esx_spool_close(a);
    esx_spool_close(b);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
