/*
 * spool.h -- the collector's write-ahead log on disk.
 *
 * Each accepted request's events are appended to the current segment file (one record:
 * length, CRC-32, the request's bulk lines) before the request is answered, so a process
 * killed with SIGKILL loses nothing it acknowledged; fdatasync runs on an interval (for
 * power loss).  Segments are named seg-<pid>-<seq>.log, seq counting over all the spools of
 * the process (a name is never used twice while the process lives); a segment is deleted
 * once every event in it is acknowledged by Elasticsearch.  On start, and periodically, a process
 * claims the segments of processes that no longer exist (atomic rename) and replays them:
 * each process holds a flock on its lock-<pid> file in the directory while it may write
 * segments there, and one whose lock can be taken is dead (spool_owner.h).
 * A torn record at a segment's end (a write cut short) ends that segment's replay.
 *
 * Events that do not fit in memory are written to overflow segments only, and form the
 * backlog together with claimed segments: the collector loads backlog records into memory,
 * oldest first, as room frees up.  So memory stays bounded by queue_max_bytes while disk
 * (bounded by spool_max_bytes) absorbs the rest.  A segment is deleted once it is fully
 * read and every event loaded from it is acknowledged.
 */
#ifndef ESX_SPOOL_H
#define ESX_SPOOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct esx_segment {
    char path[600];
    unsigned long long seq;  /* of its name, seg-<pid>-<seq>.log */
    int fd;                  /* open for appending while current, else -1 */
    int rfd;                 /* open for reading while in the backlog, else -1 */
    size_t bytes;            /* bytes in the file */
    size_t read_off;         /* records before this offset are in memory or acknowledged */
    int64_t pending;         /* events loaded from this segment, not yet acknowledged */
    int64_t since_ms;        /* wall ms no later than its oldest record was written: when it
                                was created (for a claimed segment: the file's last write,
                                or claim by another process, esx_owner_reused) */
    int sealed;              /* no more appends */
    int claim_unsynced;      /* claimed from a dead process, not yet synced by this one */
    int in_backlog;
    struct esx_segment *next;   /* all live segments */
    struct esx_segment *bnext;  /* backlog order */
} esx_segment;

typedef struct esx_spool {
    char dir[512];
    pid_t pid;
    size_t max_segment_bytes;
    esx_segment *current;    /* write-ahead of events that are in memory */
    esx_segment *overflow;   /* events that are only on disk */
    esx_segment *segments;   /* every live segment */
    esx_segment *backlog_head, *backlog_tail; /* segments with records not yet loaded */
    int dirty;               /* written since the last fdatasync */
    int dir_dirty;           /* a segment was created or claimed (renamed) since: the
                              * directory is synced too, or its entry could vanish */
    int *unsynced;           /* descriptors of sealed segments, for the next esx_spool_sync */
    int n_claim_unsynced;    /* segments claimed since the last sync (claim_unsynced): the
                              * dead process may have died inside its sync interval, its
                              * last records in the kernel's cache only */
    int n_unsynced, cap_unsynced;
    uint64_t records_written, records_replayed, segments_claimed, bytes_on_disk;
    uint64_t bytes_skipped; /* of records that failed their checks on replay (torn or damaged),
                             * or whose file was gone (segments_gone) */
    uint64_t sync_failed;   /* fdatasync calls of its files that failed (EIO) */
    uint64_t segments_gone; /* backlog segments whose file was gone (ENOENT) */
    uint64_t segments_pid_reused; /* dead processes' segments without a lock file claimed
                                   * while a process that started after their last write has
                                   * their pid (esx_owner_reused) */
    uint64_t segments_refused; /* backlog segments whose file is there but could not be read
                                * as this user's private file: left on disk, not replayed */
    struct esx_spool_file { dev_t dev; ino_t ino; } *refused; /* the files of other processes
                             * claim_orphans left as not private, counted and logged once each
                             * (ESX_SPOOL_MAX_REFUSED of them at most) */
    size_t n_refused, cap_refused;
    struct esx_spool_file *failing; /* dead processes' segments whose claim (the rename) failed
                             * at the last scan: left on disk, tried again at every scan, said
                             * on stderr when one first fails (ESX_SPOOL_MAX_REFUSED at most) */
    size_t n_failing, cap_failing;
    uint64_t claims_failing; /* of them, as the last scan found (a gauge: a claim that works
                              * later, or a file claimed or removed by another, leaves it) */
    dev_t dir_dev;          /* the directory, as one live spool of the process holds it */
    ino_t dir_ino;
    int held;               /* in the process's list of held directories */
    struct esx_spool *held_next;
    struct esx_spool_owner *owner; /* this process's lock file in the directory, lock-<pid>:
                             * its mark of life to claimers (spool_owner.h) */
} esx_spool;

/* Files of other processes refused at claim that a spool remembers (not to count them
 * again at every scan). */
#define ESX_SPOOL_MAX_REFUSED 4096

/* The largest record esx_spool_append takes (bytes of bulk lines). */
#define ESX_SPOOL_MAX_RECORD ((size_t)64 << 20)

/* Opens (creating if needed, mode 0700) the spool directory for this process; it must be a
 * directory of this user's that no one else may write to (private.h), and one that no other
 * spool of this process holds (the same directory under any name): two live spools of one
 * process on one directory would each claim and replay the other's segments as orphans.
 * The spool holds the directory until esx_spool_unhold or esx_spool_close.  Returns NULL
 * with a reason in why (256 bytes). */
esx_spool *esx_spool_open(const char *dir, size_t max_segment_bytes, char *why);

/* 1 when a spool of this process holds dir (the same directory under any name), else 0. */
int esx_spool_dir_held(const char *dir);

/* Lets another spool of this process open the directory (a closed collector whose spool
 * stays open for the acknowledgements of bulks in flight: its segments are left to the
 * next one, to be claimed and replayed). */
void esx_spool_unhold(esx_spool *sp);

/* Appends one record.  With overflow = 0 the events are also in memory: *seg receives the
 * segment (the caller adds the events it queues to seg->pending).  With overflow = 1 the
 * record joins the backlog, to be loaded later by esx_spool_load.  Returns 0, or -1 with a
 * reason in why (256 bytes) when the write failed (the caller must not acknowledge then). */
int esx_spool_append(esx_spool *sp, const char *data, size_t len, int overflow,
                     esx_segment **seg, char *why);

/* 1 when backlog records wait to be loaded. */
int esx_spool_has_backlog(const esx_spool *sp);

/* Wall-clock ms no later than the oldest record waiting in the backlog was written (the
 * earliest since_ms of the backlog's segments), or 0 without a backlog. */
int64_t esx_spool_backlog_since(const esx_spool *sp);

/* Loads backlog records, oldest first, calling fn with each record's bytes (valid during
 * the call) until fn has been given at least max_bytes or the backlog is empty.  fn returns
 * the number of events it queued (added to the segment's pending), or -1 when it queued
 * nothing for want of memory: the record is read again on a later call.  A record that fails
 * its checks is skipped (counted in bytes_skipped) and loading goes on from the next good
 * one; a segment that cannot be opened for now stops the call and is tried again later; one
 * whose file is gone is given up (segments_gone); one whose file is there but refused (not
 * this user's private file, EACCES) is left on disk, not replayed (segments_refused, and a
 * line on stderr).
 * mu, when not NULL, is the lock the caller holds over sp (and that fn expects held): it is
 * let go of while the records are read from disk (pread), so that the intake does not wait
 * for the disk; only one thread may load a spool's backlog.
 * Returns records loaded. */
int esx_spool_load(esx_spool *sp, size_t max_bytes,
                   int64_t (*fn)(void *ud, esx_segment *seg, const char *data, size_t len),
                   void *ud, pthread_mutex_t *mu);

/* fdatasync of what was written since the last sync (the segments being written and those
 * sealed since, and the directory when a segment was created or claimed), in two steps so that the caller's lock is not held across the disk write:
 * _begin (under the lock that guards sp) fills fds (ESX_SPOOL_SYNC_FDS of them at most:
 * duplicates of the open segments' descriptors, and the sealed segments' own) and returns
 * how many; _end (without the lock) syncs and closes them, and returns how many syncs failed
 * (errno: the last failure's).  A failed dup leaves that segment to be synced when it is
 * sealed or closed.  With failures, esx_spool_sync_failed (under the lock again) counts them
 * in sync_failed, says so on stderr and seals the segments being written: after a failed
 * fdatasync the kernel may have dropped the pages it could not write, and a later sync of that
 * file succeeds without them -- no later event is written to it. */
#define ESX_SPOOL_SYNC_FDS 11
int esx_spool_sync_begin(esx_spool *sp, int fds[ESX_SPOOL_SYNC_FDS]);
/* A sealed segment is synced by the next sync (not by the append that sealed it: that runs
 * under the caller's lock, on a request's way to its answer -- unless ESX_SPOOL_MAX_UNSYNCED
 * wait already, or there is no memory to remember one more).  Each _begin takes
 * ESX_SPOOL_SYNC_FDS - 3 of them at most, oldest first: while n_unsynced > 0, the caller
 * begins again.  esx_spool_sync_wanted: 1 when ESX_SPOOL_SYNC_SOON of them or more wait --
 * sync now, before the interval is up (their descriptors stay open until then) -- or when
 * segments claimed from dead processes wait for their first sync by this process (opened by
 * name at _begin, as many as there is room for after the sealed ones: the caller begins
 * again while esx_spool_sync_wanted). */
#define ESX_SPOOL_SYNC_SOON 8
#define ESX_SPOOL_MAX_UNSYNCED 64 /* sealed and waiting: past it, seal syncs itself */
int esx_spool_sync_wanted(const esx_spool *sp);
int esx_spool_sync_end(int fds[ESX_SPOOL_SYNC_FDS], int n);
void esx_spool_sync_failed(esx_spool *sp, int n, int err);

/* n events of seg were acknowledged; a segment with none left is deleted (the current one
 * too: the next append opens a new one). */
void esx_spool_release(esx_spool *sp, esx_segment *seg, int64_t n);

/* Claims (atomic rename) the segments left by processes that no longer exist -- whose lock
 * file it can lock (held until the scan ends, or until a new process with that pid takes
 * it: esx_owner_still), or without one, whose pid is gone -- and
 * those of this process that no live spool of it owns (a collector closed earlier), adding
 * them to the backlog; a dead process's lock file goes once none of its segments is left.  One that is not this user's private file (owner, group/other write, more
 * than one link) is left where it is, counted in segments_refused and said on stderr once
 * (for the first ESX_SPOOL_MAX_REFUSED such files: later ones are not counted) -- unless its
 * second link is a live process's segment name (a claim by link and unlink, half done).
 * Without RENAME_NOREPLACE nor hard links, a plain rename onto a name that is not there (only
 * this process makes names of its pid).  One whose claim fails otherwise (EROFS, EACCES, EIO)
 * is left where it is and tried again at every scan: claims_failing says how many failed at
 * the last scan (not segments_refused: the file is fine, the claim is not), and each is said
 * on stderr when it starts failing.
 * One spool_dir serves one live spool per process (esx_spool_open refuses a second).  Returns the number of segments claimed. */
int esx_spool_claim_orphans(esx_spool *sp);

/* Closes the files (segments with pending events stay on disk for replay) and frees. */
void esx_spool_close(esx_spool *sp);

/* In a forked child: forgets the parent's open files without touching them. */
void esx_spool_forget(esx_spool *sp);

#endif
