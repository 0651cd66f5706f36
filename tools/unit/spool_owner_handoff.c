/*
 * spool_owner_handoff.c -- a process given the pid of a dead one (a restarted container)
 * opens its spool at once while another process claims the dead one's segments, run by
 * spec/collector_spec.lua.  The claimer holds the dead process's lock file (lock-<pid>) for
 * its scan; the newcomer waited for it -- under its collector's lock, up to a second, then
 * answered 503 -- for as long as the scan took.  Here the claimer's renames are slowed
 * (5 ms each, 100 segments: half a second of scan), and the newcomer is a child whose pid
 * the dead process's segments and lock file are given before it starts.  It must open its
 * spool within a few renames (it writes a byte to the lock file, which the claimer looks at
 * before each claim); the claimer must stop claiming that pid's segments then (never the
 * newcomer's own), and the newcomer claims the rest: each exactly once.  Prints
 * "ok <name>" per check; exits 1 on a failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"

#define DEAD_SEGMENTS 100

static int slow_renames;  /* in the claimer: each rename takes 5 ms */
static int started = -1;  /* written to when the claimer's first rename comes */

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath,
              unsigned int flags)
{
    if (slow_renames) {
        if (started >= 0) {
            if (write(started, "r", 1) != 1)
                _exit(1);
            started = -1;
        }
        struct timespec nap = {0, 5 * 1000000};
        nanosleep(&nap, NULL);
    }
    return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* What the newcomer says after opening its spool and writing one event. */
struct report {
    int opened;
    int64_t took_ms;
    char live[600]; /* its own segment, its event not acknowledged */
};

static void newcomer(const char *dir, int go, int said)
{
    char c, why[256];
    struct report r = {0};
    if (read(go, &c, 1) != 1)
        _exit(1);
    int64_t t0 = now_ms();
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    r.took_ms = now_ms() - t0;
    esx_segment *seg;
    static const char rec[] = "{\"create\":{}}\n{}\n";
    if (sp != NULL && esx_spool_append(sp, rec, sizeof rec - 1, 0, &seg, why) == 0) {
        seg->pending = 1;
        r.opened = 1;
        snprintf(r.live, sizeof r.live, "%s", seg->path);
    } else {
        fprintf(stderr, "newcomer: %s\n", why);
    }
    if (write(said, &r, sizeof r) != sizeof r || read(go, &c, 1) != 1)
        _exit(1);
    /* its own scan: what the claimer left of the dead process's (its pid's, not its own) */
    int claimed = sp ? esx_spool_claim_orphans(sp) : 0;
    if (write(said, &claimed, sizeof claimed) != sizeof claimed || read(go, &c, 1) != 1)
        _exit(1);
    _exit(0); /* (its spool as a killed process leaves it) */
}

int main(void)
{
    char dir[] = "/tmp/esx-handoff-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char why[256], path[600];
    int go[2], said[2];
    if (pipe(go) != 0 || pipe(said) != 0)
        return 1;
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        return 1;
    if (child == 0) {
        newcomer(dir, go[0], said[1]);
        _exit(1);
    }
    /* what an earlier process with the newcomer's pid left: its lock file (unlocked: it is
     * dead) and its segments */
    snprintf(path, sizeof path, "%s/lock-%d", dir, (int)child);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return 1;
    close(fd);
    for (int i = 1; i <= DEAD_SEGMENTS; i++) {
        snprintf(path, sizeof path, "%s/seg-%d-%d.log", dir, (int)child, i);
        if (leave(path) != 0)
            return 1;
    }
    started = go[1]; /* the newcomer starts with the claimer's first rename */
    slow_renames = 1;
    int by_claimer = esx_spool_claim_orphans(sp);
    slow_renames = 0;
    struct report r;
    if (read(said[0], &r, sizeof r) != sizeof r)
        return 1;
    check(r.opened, "a newcomer opens its spool while a claimer takes the segments its pid's "
                    "earlier process left");
    check(r.took_ms < 150, "it does not wait for the claimer's scan to end");
    if (r.took_ms >= 150)
        printf("# it waited %lld ms\n", (long long)r.took_ms);
    check(r.opened && access(r.live, F_OK) == 0, "the claimer leaves the newcomer's own segment");
    snprintf(path, sizeof path, "%s/lock-%d", dir, (int)child);
    struct stat st;
    fd = open(path, O_RDONLY);
    check(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 &&
              errno == EWOULDBLOCK,
          "the newcomer holds its pid's lock file, cleared of the byte it waited with");
    if (fd >= 0)
        close(fd);
    int by_newcomer = 0;
    if (write(go[1], "x", 1) != 1 || read(said[0], &by_newcomer, sizeof by_newcomer) != sizeof by_newcomer)
        return 1;
    check(by_claimer > 0 && by_claimer < DEAD_SEGMENTS && by_claimer + by_newcomer == DEAD_SEGMENTS,
          "the claimer stops, and the newcomer claims the rest: each segment once");
    if (by_claimer + by_newcomer != DEAD_SEGMENTS)
        printf("# claimer %d, newcomer %d\n", by_claimer, by_newcomer);
    if (write(go[1], "x", 1) != 1)
        return 1;
    waitpid(child, NULL, 0);
    esx_spool_close(sp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
