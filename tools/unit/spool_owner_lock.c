/*
 * spool_owner_lock.c -- a process's spool segments are a dead process's when its lock file
 * (lock-<pid>) can be locked, not when kill(pid, 0) fails, run by spec/collector_spec.lua.
 * kill(2) is replaced here, so that it says what a check needs: a pid gone while its process
 * still writes (a live owner must keep its segments), or a process there while the one
 * that wrote them is gone (closed, or its pid another's).  The owners are real processes:
 * children that open their own spool.  Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"
#include "spool_dead.h"

static int says_gone = -1; /* kill(pid, 0): 1 "no such process", 0 "there", -1 the truth */

int kill(pid_t pid, int sig)
{
    if (sig == 0 && says_gone == 1) {
        errno = ESRCH;
        return -1;
    }
    if (sig == 0 && says_gone == 0)
        return 0;
    return (int)syscall(SYS_kill, pid, sig);
}

/* A child that writes one record to a spool of its own on dir, then waits for a byte on
 * `go` before each step: close its spool (its segment kept), then exit.  It says "w", then
 * "c" on `said` when each is done.  With fork_first, it forks a grandchild (which inherits
 * the spool's descriptors, and lives on) and dies at once without closing. */
static pid_t owner(const char *dir, int go, int said, int fork_first, pid_t *grandchild)
{
    int gp[2];
    if (pipe(gp) != 0)
        return -1;
    pid_t pid = fork();
    if (pid != 0) {
        close(gp[1]);
        if (pid > 0 && fork_first && read(gp[0], grandchild, sizeof *grandchild) != sizeof *grandchild)
            *grandchild = -1;
        close(gp[0]);
        return pid;
    }
    char why[256], c;
    esx_segment *seg;
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    static const char rec[] = "{\"create\":{}}\n{}\n";
    if (sp == NULL || esx_spool_append(sp, rec, sizeof rec - 1, 0, &seg, why) != 0)
        _exit(1);
    seg->pending = 1; /* (an event not yet acknowledged: the segment stays at close) */
    if (fork_first) {
        /* the grandchild says its pid once fork has returned in it: its fork handler has
         * closed its copy of the lock's descriptor by then (before, the copy still held the
         * lock, and a claim right after its parent's death found it taken) */
        pid_t g = fork();
        if (g == 0) {
            pid_t self = getpid();
            if (write(gp[1], &self, sizeof self) != sizeof self)
                _exit(1);
            pause(); /* killed by the test */
            _exit(0);
        }
        if (g < 0)
            _exit(1);
        _exit(0); /* dies with its spool open: its lock is the kernel's to let go of */
    }
    if (write(said, "w", 1) != 1 || read(go, &c, 1) != 1)
        _exit(1);
    esx_spool_close(sp);
    if (write(said, "c", 1) != 1 || read(go, &c, 1) != 1)
        _exit(1);
    _exit(0);
}

static int lock_file_there(const char *dir, pid_t pid)
{
    char path[600];
    snprintf(path, sizeof path, "%s/lock-%d", dir, (int)pid);
    return access(path, F_OK) == 0;
}

int main(void)
{
    char dir[] = "/tmp/esx-owner-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char why[256], c;
    int go[2], said[2];
    if (pipe(go) != 0 || pipe(said) != 0)
        return 1;
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;

    /* a live owner: its segment is its own, whatever kill(2) says of its pid */
    pid_t live = owner(dir, go[0], said[1], 0, NULL);
    if (live < 0 || read(said[0], &c, 1) != 1 || c != 'w')
        return 1;
    check(lock_file_there(dir, live), "a process that writes segments has a lock file there");
    says_gone = 1;
    check(esx_spool_claim_orphans(sp) == 0 && count_segments(dir) == 1,
          "a live owner's segment is not claimed, though kill(2) says its pid is gone");

    /* it closes its spool, its event not acknowledged, and lives on */
    if (write(go[1], "x", 1) != 1 || read(said[0], &c, 1) != 1 || c != 'c')
        return 1;
    says_gone = 0;
    check(lock_file_there(dir, live),
          "a process that closes its spool with segments left keeps its lock file, unlocked");
    check(esx_spool_claim_orphans(sp) == 1,
          "its segment is claimed while a process has its pid (kill(2) says it is there)");
    check(!lock_file_there(dir, live), "its lock file goes with its last segment");
    if (write(go[1], "x", 1) != 1)
        return 1;
    waitpid(live, NULL, 0);

    /* an owner that forked a child, then died: the child does not hold the lock for it */
    pid_t grandchild = -1;
    pid_t dead = owner(dir, go[0], said[1], 1, &grandchild);
    if (dead < 0 || grandchild < 0)
        return 1;
    waitpid(dead, NULL, 0);
    says_gone = 0;
    check(esx_spool_claim_orphans(sp) == 1,
          "a dead owner's segment is claimed while a child it forked lives on");
    syscall(SYS_kill, grandchild, SIGKILL);

    /* a segment without a lock file (an older esx's): kill(2) decides, as before */
    char path[600];
    pid_t old = dead_pid();
    snprintf(path, sizeof path, "%s/seg-%d-1.log", dir, (int)old);
    if (leave(path) != 0)
        return 1;
    says_gone = 0;
    check(esx_spool_claim_orphans(sp) == 0, "without a lock file, a pid that is there keeps it");
    says_gone = 1;
    check(esx_spool_claim_orphans(sp) == 1, "without a lock file, a pid gone gives it up");

    /* a dead process's lock file without segments (it died with all acknowledged) goes */
    snprintf(path, sizeof path, "%s/lock-%d", dir, (int)old);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return 1;
    close(fd);
    says_gone = -1;
    check(esx_spool_claim_orphans(sp) == 0 && !lock_file_there(dir, old),
          "a dead process's lock file without segments is removed");
    check(lock_file_there(dir, getpid()), "this process's own stays while its spool is open");
    esx_spool_close(sp); /* (what it claimed stays, not replayed: removed here) */
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -f %s/seg-*", dir);
    if (system(cmd) != 0 || (sp = esx_spool_open(dir, 1 << 20, why)) == NULL)
        return 1;
    /* its lock file taken away (by hand, a /tmp cleaner): made and locked again before the
     * next segment -- claimers went by the pid meanwhile, this live one's */
    snprintf(path, sizeof path, "%s/lock-%d", dir, (int)getpid());
    esx_segment *seg;
    static const char rec[] = "{\"create\":{}}\n{}\n";
    unlink(path);
    if (esx_spool_append(sp, rec, sizeof rec - 1, 0, &seg, why) != 0)
        return 1;
    fd = open(path, O_RDONLY);
    check(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK,
          "a lock file taken away is made and locked again before the next segment");
    if (fd >= 0)
        close(fd);
    esx_spool_close(sp); /* (its segment, all acknowledged, goes) */
    check(!lock_file_there(dir, getpid()), "closed with no segment of its own left, its lock file goes");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
