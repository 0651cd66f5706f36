/*
 * spool_owner.h -- which process's spool segments are a dead process's (see spool.h).
 *
 * A segment's name carries its writer's pid, seg-<pid>-<seq>.log, and a pid says little
 * about a process once it is dead: a restart in a container, or a busy machine, gives it to
 * another process -- pid 1 of a restarted container is pid 1 again.  "kill(pid, 0) fails"
 * left such segments, their events each answered 2xx, on disk unclaimed and unreplayed for as
 * long as the unrelated process lived.  So each process that writes segments in a spool
 * directory holds an exclusive flock(2) on a file of its own there, lock-<pid>, from before
 * its first segment until its last spool on the directory is closed (or it dies: the kernel
 * lets go of the lock), and a claimer takes a process for dead when it can take that lock
 * itself (LOCK_NB).  kill(pid, 0) decides only when there is no lock file (segments of an
 * esx that made none) or flock does not work there -- and where flock works, a live pid
 * whose process started after the segment's last write is not its writer's
 * (esx_owner_reused).
 *
 * Every function here runs under the caller's lock (spool.c's held_mu), which a fork takes
 * too: the child handler calls esx_owner_forked.
 */
#ifndef ESX_SPOOL_OWNER_H
#define ESX_SPOOL_OWNER_H

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

typedef struct esx_spool_owner esx_spool_owner;

/* This process's lock in directory dir (dev, ino: its identity): taken (its file created
 * when missing, mode 0600), or shared with the other spools of the process on the directory.
 * While another process holds it (a claimer taking the segments an earlier process with this
 * pid left), a byte is written to the file -- the claimer lets go at its next claim
 * (esx_owner_still) -- and the lock is taken once it is free (the byte cleared): waits up to
 * ESX_OWNER_WAIT_MS for that (a holder that does not let go is no claimer).  Where flock does not
 * work, nothing is held (said once on stderr): claimers go by the pid then.  Returns NULL
 * with a reason in why (256 bytes) when it cannot be taken. */
#define ESX_OWNER_WAIT_MS 1000
esx_spool_owner *esx_owner_take(const char *dir, dev_t dev, ino_t ino, char *why);

/* Before a new segment: the lock is still held on the file that bears its name in dir --
 * taken again when the file, or the whole directory, was removed meanwhile (by hand, a /tmp
 * cleaner).  0, or -1 with a reason in why. */
int esx_owner_check(esx_spool_owner *o, const char *dir, char *why);

/* A spool lets go of it: the last one of the process unlocks it, and removes the file when
 * no segment of the process's pid is left in the directory (those left behind mark their
 * owner dead to the claimers: the file unlocked).  A forked child's copy is only freed. */
void esx_owner_drop(esx_spool_owner *o);

/* In a forked child: the parent's locks are the parent's (the child's descriptors are
 * closed: a child that outlives its parent must not keep the parent's segments unclaimed). */
void esx_owner_forked(void);

/* 1 when this process holds a real lock on its lock file in the directory (flock works
 * there), 0 when it holds nothing. */
int esx_owner_locks(const esx_spool_owner *o);

/* A scan's verdicts, one per pid met (esx_spool_claim_orphans).  by_start (set by the caller
 * when flock works in the directory: a local file system, whose times are this machine's
 * clock): a pid without a lock file whose process is alive is asked when it started
 * (esx_owner_reused). */
typedef struct {
    struct esx_owner_seen *v;
    size_t n, cap;
    int by_start;
    int64_t checked_ms; /* (esx_owner_yield) */
} esx_owner_scan;

/* 1 when the process of pid (not this one) is dead to this scan: its lock file could be
 * locked -- and stays locked by this process until esx_owner_scan_end (or until a new
 * process with that pid takes it: esx_owner_still), so that no new process with that pid
 * writes segments meanwhile --, or, without a usable lock file, no
 * process has that pid.  0 when it is alive, or cannot be told now (no descriptor or memory
 * left: the next scan asks again). */
int esx_owner_dead(esx_owner_scan *s, const char *dir, int pid);

/* Slack of esx_owner_reused: a file's times lag the clock by a tick, and /proc gives a
 * process's start in ticks. */
#define ESX_OWNER_START_SLACK_MS 1000

/* 1 when pid -- alive, no lock file: an esx from before lock files wrote the segment, or its
 * process is gone and another has its pid -- is another process's than the writer of the
 * segment st describes: the process with that pid started more than ESX_OWNER_START_SLACK_MS
 * after the file was last written (st_mtim; a claim sets it to the claim's time).  Only with
 * by_start, and after esx_owner_dead said 0 for pid; 0 when it cannot be told (no /proc). */
int esx_owner_reused(esx_owner_scan *s, int pid, const struct stat *st);

/* Right before the claim of a segment of pid (dead to the scan): 1 to go on, 0 when a new
 * process with that pid waits for its lock -- it wrote a byte to the file (esx_owner_take),
 * or the file lost its name: the scan lets go of the lock now (if not yet), and claims
 * none of pid's segments more (they may be the new process's; it claims the rest of the
 * dead one's itself, as segments of its pid that it does not own). */
int esx_owner_still(esx_owner_scan *s, const char *dir, int pid);

/* Between names: lets go of every lock the scan holds that a process waits for (as
 * esx_owner_still), at most every ESX_OWNER_YIELD_MS -- a process waiting for one waits no
 * longer than that while the scan is busy with other pids' segments. */
#define ESX_OWNER_YIELD_MS 2
void esx_owner_yield(esx_owner_scan *s, const char *dir);

/* Segments of pid the scan met and left on disk (refused, passed over, failing), and that it
 * claimed. */
void esx_owner_count(esx_owner_scan *s, int pid, int left, int claimed);

/* The scan is over: the locks it took are let go of, and the lock files of processes none
 * of whose segments are left removed (complete: the scan looked at every name).  A claim
 * from a pid that a process has (another one, or the owner itself after closing its
 * collector) is said on stderr. */
void esx_owner_scan_end(esx_owner_scan *s, const char *dir, int complete);

/* 1 when name is a lock file's, lock-<pid>: *pid from it. */
int esx_owner_name(const char *name, int *pid);

#endif
