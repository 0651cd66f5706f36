/*
 * spool.c -- write-ahead segments and replay (see spool.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include "clock.h"
#include "private.h"
#include "proc.h"
#include "spool.h"
#include "spool_owner.h"

#define MAX_RECORD ESX_SPOOL_MAX_RECORD

/* Sequence numbers of segment names, shared by every spool of the process: a name is never
 * used twice by one process.  A per-spool counter let a collector closed with a bulk in
 * flight (its spool kept until the bulk answers) and a new collector on the same directory
 * both own "seg-<pid>-<n>.log" -- the new one's live segment, and the name the closed one
 * still had for a segment the new one had claimed (renamed) -- so the late acknowledgement
 * unlinked the new collector's write-ahead segment. */
static atomic_ullong segment_seq;

static unsigned long long next_seq(void)
{
    return atomic_fetch_add(&segment_seq, 1) + 1;
}

/* The directories held by live spools of the process (entries a forked child inherited carry
 * the parent's pid: not this process's, ignored until esx_spool_forget drops them).  A second
 * live spool on one directory took the first one's segments -- not its own, of this pid --
 * for a closed collector's orphans: it claimed (renamed) and replayed events the first was
 * still shipping, and the first then read and deleted by names that were gone. */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static esx_spool *held_head;
static pthread_once_t held_once = PTHREAD_ONCE_INIT;

static void held_lock(void) { pthread_mutex_lock(&held_mu); }
static void held_unlock(void) { pthread_mutex_unlock(&held_mu); }
/* (in a forked child: the parent's lock files are the parent's, see spool_owner.h) */
static void held_child(void)
{
    esx_owner_forked();
    held_unlock();
}
static void held_install(void) { pthread_atfork(held_lock, held_unlock, held_child); }

/* Under held_mu: this process's spool holding the directory, or NULL.  Also the one whose
 * directory was removed and is now, under its path, this one (made again by another
 * collector's constructor before the holder's next segment made it again itself). */
static esx_spool *holder(dev_t dev, ino_t ino)
{
    struct stat st;
    for (esx_spool *h = held_head; h; h = h->held_next)
        if (h->pid == esx_pid() &&
            ((h->dir_dev == dev && h->dir_ino == ino) ||
             (stat(h->dir, &st) == 0 && st.st_dev == dev && st.st_ino == ino)))
            return h;
    return NULL;
}

int esx_spool_dir_held(const char *dir)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return 0;
    pthread_once(&held_once, held_install);
    held_lock();
    int held = holder(st.st_dev, st.st_ino) != NULL;
    held_unlock();
    return held;
}

void esx_spool_unhold(esx_spool *sp)
{
    if (sp == NULL || !sp->held)
        return;
    held_lock();
    for (esx_spool **p = &held_head; *p; p = &(*p)->held_next) {
        if (*p == sp) {
            *p = sp->held_next;
            break;
        }
    }
    sp->held = 0;
    sp->held_next = NULL;
    held_unlock();
}

esx_spool *esx_spool_open(const char *dir, size_t max_segment_bytes, char *why)
{
    if (strlen(dir) >= sizeof(((esx_spool *)0)->dir) - 64) {
        snprintf(why, 256, "spool_dir is too long");
        return NULL;
    }
    if (esx_private_dir(dir) != 0) {
        snprintf(why, 256, "cannot use spool_dir %.150s: %.80s", dir,
                 errno == EPERM ? "not a directory of this user only (owner, no write for others)"
                                : strerror(errno));
        return NULL;
    }
    esx_spool *sp = calloc(1, sizeof *sp);
    if (sp == NULL) {
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    snprintf(sp->dir, sizeof sp->dir, "%s", dir);
    sp->pid = esx_pid();
    sp->max_segment_bytes = max_segment_bytes;
    struct stat st;
    if (stat(dir, &st) != 0) {
        snprintf(why, 256, "cannot use spool_dir %.150s: %.80s", dir, strerror(errno));
        free(sp);
        return NULL;
    }
    sp->dir_dev = st.st_dev;
    sp->dir_ino = st.st_ino;
    pthread_once(&held_once, held_install);
    held_lock();
    if (holder(st.st_dev, st.st_ino) != NULL) {
        held_unlock();
        snprintf(why, 256, "cannot use spool_dir %.150s: another collector of this process uses it", dir);
        free(sp);
        return NULL;
    }
    /* the mark that this process is alive, held before its first segment (spool_owner.h) */
    if ((sp->owner = esx_owner_take(dir, st.st_dev, st.st_ino, why)) == NULL) {
        held_unlock();
        free(sp);
        return NULL;
    }
    sp->held = 1;
    sp->held_next = held_head;
    held_head = sp;
    held_unlock();
    return sp;
}

static void backlog_remove(esx_spool *sp, esx_segment *seg)
{
    if (!seg->in_backlog)
        return;
    esx_segment *prev = NULL;
    for (esx_segment *b = sp->backlog_head; b; prev = b, b = b->bnext) {
        if (b == seg) {
            if (prev)
                prev->bnext = b->bnext;
            else
                sp->backlog_head = b->bnext;
            if (sp->backlog_tail == b)
                sp->backlog_tail = prev;
            break;
        }
    }
    seg->in_backlog = 0;
    seg->bnext = NULL;
}

static void backlog_append(esx_spool *sp, esx_segment *seg)
{
    if (seg->in_backlog)
        return;
    seg->in_backlog = 1;
    seg->bnext = NULL;
    if (sp->backlog_tail)
        sp->backlog_tail->bnext = seg;
    else
        sp->backlog_head = seg;
    sp->backlog_tail = seg;
}

static void unlink_segment(esx_spool *sp, esx_segment *seg)
{
    for (esx_segment **p = &sp->segments; *p; p = &(*p)->next) {
        if (*p == seg) {
            *p = seg->next;
            break;
        }
    }
    backlog_remove(sp, seg);
    if (seg->claim_unsynced)
        sp->n_claim_unsynced--; /* (every event in it acknowledged: nothing to keep) */
    if (seg->rfd >= 0)
        close(seg->rfd);
    if (sp->overflow == seg)
        sp->overflow = NULL;
    if (seg->fd >= 0)
        close(seg->fd);
    if (sp->bytes_on_disk >= seg->bytes)
        sp->bytes_on_disk -= seg->bytes;
    unlink(seg->path);
    if (sp->current == seg)
        sp->current = NULL;
    free(seg);
}

/* A segment can go once every record is read (loaded or acknowledged) and nothing loaded
 * from it waits for an acknowledgement. */
static void maybe_delete(esx_spool *sp, esx_segment *seg)
{
    if (seg->pending == 0 && seg->read_off >= seg->bytes)
        unlink_segment(sp, seg);
}

/* n fdatasync calls failed, the last with err: counted and said.  After a failed sync the
 * kernel may have dropped the pages it could not write (marked clean), and a later sync of the
 * same file succeeds without them ("fsyncgate"): retrying is no proof of anything, so the
 * callers never write to that file again. */
static void sync_failed(esx_spool *sp, int n, int err)
{
    sp->sync_failed += (uint64_t)n;
    fprintf(stderr, "esx.collector: fdatasync of spool segments failed (%s): the events they "
                    "hold may not survive a power loss (no later event is written to them)\n",
            strerror(err));
}

static void seal(esx_spool *sp, esx_segment *seg)
{
    struct stat st;
    if (seg->fd >= 0 && seg->in_backlog && seg->rfd < 0 && fstat(seg->fd, &st) == 0 &&
        st.st_nlink == 0) {
        /* records still to be read, and the name gone (removed by hand, a /tmp cleaner):
         * the last way to them is this descriptor -- keep a copy for the replay */
        seg->rfd = fcntl(seg->fd, F_DUPFD_CLOEXEC, 0);
    }
    if (seg->fd >= 0) {
        /* synced by the next esx_spool_sync, outside the caller's lock: a request that
         * rotates the segment does not wait for the disk -- however many rotations come
         * between two syncs (with 8 waiting, the 9th request to rotate synced inline, under
         * the collector's lock: with a small spool_segment_bytes, every request of a busy
         * second waited for the disk).  esx_spool_sync_wanted asks for an early sync then.
         * Here only when there is no memory to remember the descriptor, or when
         * ESX_SPOOL_MAX_UNSYNCED wait already: the shipper has not come to sync them (held
         * up by a hung disk), and every descriptor more is one
         * the process's sockets lack (EMFILE) -- the requests wait for the disk then. */
        if (sp->n_unsynced == sp->cap_unsynced && sp->cap_unsynced < ESX_SPOOL_MAX_UNSYNCED) {
            int cap = sp->cap_unsynced ? sp->cap_unsynced * 2 : ESX_SPOOL_SYNC_SOON;
            int *u = realloc(sp->unsynced, (size_t)cap * sizeof *u);
            if (u != NULL) {
                sp->unsynced = u;
                sp->cap_unsynced = cap;
            }
        }
        if (sp->n_unsynced < sp->cap_unsynced) {
            sp->unsynced[sp->n_unsynced++] = seg->fd;
        } else {
            if (fdatasync(seg->fd) != 0)
                sync_failed(sp, 1, errno);
            close(seg->fd);
        }
        seg->fd = -1;
    }
    seg->sealed = 1;
    if (sp->current == seg)
        sp->current = NULL;
    if (sp->overflow == seg)
        sp->overflow = NULL;
    maybe_delete(sp, seg);
}

/* The spool directory was removed while in use (a /tmp cleaner took it while it was idle, or
 * a hand did): made again, private as at the start, and held under its new identity.
 * Without it every segment this spool tried to create failed with ENOENT, and every request
 * got 503 until the process restarted.  Returns 0, or -1 with errno. */
static int remake_dir(esx_spool *sp)
{
    struct stat st;
    if (esx_private_dir(sp->dir) != 0 || stat(sp->dir, &st) != 0)
        return -1;
    held_lock();
    sp->dir_dev = st.st_dev;
    sp->dir_ino = st.st_ino;
    held_unlock();
    /* its entry in its parent, and the segment's in it, must outlive a power loss */
    char parent[sizeof sp->dir + 4];
    snprintf(parent, sizeof parent, "%s/..", sp->dir);
    int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd >= 0) {
        fdatasync(pfd);
        close(pfd);
    }
    return 0;
}

/* Before a segment is made: this process's lock file is still there, and locked (taken
 * again when it, or the directory, was removed).  0, or -1 with a reason in why. */
static int owner_held(esx_spool *sp, char *why)
{
    held_lock();
    int rc = esx_owner_check(sp->owner, sp->dir, why);
    held_unlock();
    return rc;
}

static esx_segment *new_segment(esx_spool *sp, char *why)
{
    int remade = 0;
    if (owner_held(sp, why) != 0) {
        /* (the directory itself gone: made again first, as for the segment below) */
        struct stat st;
        if (stat(sp->dir, &st) == 0 || errno != ENOENT)
            return NULL;
        remade = 1;
        if (remake_dir(sp) != 0) {
            snprintf(why, 256, "cannot make %.150s again: %.80s", sp->dir, strerror(errno));
            return NULL;
        }
        if (owner_held(sp, why) != 0)
            return NULL;
    }
    esx_segment *seg = calloc(1, sizeof *seg);
    if (seg == NULL) {
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    seg->rfd = -1;
    seg->since_ms = esx_wall_ms();
    /* O_EXCL: a segment of an earlier process that had this pid (a restart in a container
     * reuses pids) is never appended to -- it is that process's, to be claimed and replayed */
    for (int tries = 0; tries < 1000; tries++) {
        seg->seq = next_seq();
        snprintf(seg->path, sizeof seg->path, "%s/seg-%d-%llu.log", sp->dir, (int)sp->pid,
                 seg->seq);
        /* (readable too: a replay reads through a copy of it, see read_record_at) */
        seg->fd = open(seg->path, O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
        if (seg->fd < 0 && errno == ENOENT && !remade) {
            remade = 1;
            if (remake_dir(sp) == 0) {
                if (owner_held(sp, why) != 0) {
                    free(seg);
                    return NULL;
                }
                continue;
            }
            errno = ENOENT;
        }
        if (seg->fd >= 0 || errno != EEXIST)
            break;
    }
    if (seg->fd < 0) {
        snprintf(why, 256, "cannot create %.150s: %.80s", seg->path, strerror(errno));
        free(seg);
        return NULL;
    }
    seg->next = sp->segments;
    sp->segments = seg;
    sp->dir_dirty = 1;
    return seg;
}

/* Writes every byte of the iovecs (consumed as it goes).  Returns 0 or -1 with errno. */
static int writev_all(int fd, struct iovec *iov, int cnt)
{
    while (cnt > 0) {
        ssize_t w = writev(fd, iov, cnt);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        while (cnt > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            cnt--;
        }
        if (cnt > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

int esx_spool_append(esx_spool *sp, const char *data, size_t len, int overflow,
                     esx_segment **out, char *why)
{
    if (len == 0 || len > MAX_RECORD) {
        snprintf(why, 256, "spool record of %zu bytes", len);
        return -1;
    }
    esx_segment **slot = overflow ? &sp->overflow : &sp->current;
    if (*slot && (*slot)->bytes >= sp->max_segment_bytes)
        seal(sp, *slot);
    if (*slot == NULL && (*slot = new_segment(sp, why)) == NULL)
        return -1;
    esx_segment *seg = *slot;
    unsigned char head[8];
    uint32_t n = (uint32_t)len;
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)data, (uInt)len);
    memcpy(head, &n, 4);
    memcpy(head + 4, &crc, 4);
    /* header and payload in one writev, without copying the payload; a cut-short write
     * is a torn record */
    struct iovec iov[2] = {{head, 8}, {(void *)data, len}};
    if (writev_all(seg->fd, iov, 2) != 0) {
        snprintf(why, 256, "cannot write the spool: %s", strerror(errno));
        /* the segment may now end in a torn record: start a new one */
        seal(sp, seg);
        return -1;
    }
    seg->bytes += len + 8;
    if (overflow)
        backlog_append(sp, seg);
    else
        seg->read_off = seg->bytes; /* its events are in memory */
    sp->bytes_on_disk += len + 8;
    sp->dirty = 1;
    sp->records_written++;
    if (out)
        *out = seg;
    return 0;
}

int esx_spool_has_backlog(const esx_spool *sp)
{
    return sp->backlog_head != NULL;
}

int64_t esx_spool_backlog_since(const esx_spool *sp)
{
    int64_t since = 0;
    for (const esx_segment *b = sp->backlog_head; b; b = b->bnext)
        if (since == 0 || b->since_ms < since)
            since = b->since_ms;
    return since;
}

enum { REC_NONE, REC_OK, REC_BAD, REC_RETRY, REC_GONE, REC_REFUSED };

/* Opens seg's read descriptor if it is not open yet (under the caller's lock: seg->fd may be
 * sealed and closed by an append meanwhile).  Returns REC_OK, or REC_RETRY when it cannot be
 * opened for now (no descriptor or memory left): nothing about the record is known then,
 * REC_GONE when the file is no longer there to read (removed by hand or by a /tmp cleaner:
 * ENOENT), or REC_REFUSED when it is there but cannot be opened as this user's private file
 * (a second link -- a backup tool's --, mode 0000 for a user other than root, EACCES...):
 * errno says why.  Waiting on either would hold every segment behind it for ever. */
static int open_for_read(esx_segment *seg)
{
    if (seg->rfd >= 0)
        return REC_OK;
    /* (a segment is replayed into _bulk as it is: only a file of this user's is read)
     * through the descriptor still open for appending, when there is one: the same file
     * even if its name was removed meanwhile (the events in it were acknowledged) */
    seg->rfd = seg->fd >= 0 ? fcntl(seg->fd, F_DUPFD_CLOEXEC, 0) : esx_private_read(seg->path);
    if (seg->rfd < 0)
        return errno == EMFILE || errno == ENFILE || errno == ENOMEM ? REC_RETRY
               : errno == ENOENT                                 ? REC_GONE
                                                                 : REC_REFUSED;
    return REC_OK;
}

/* Reads the record at offset off of the segment open as rfd, whose first end bytes are
 * written, into *buf, its length into *len.  Returns REC_OK, REC_NONE when no record header
 * is written there yet, REC_BAD for a record that is torn or fails its checks (a length in
 * bounds, a CRC-32 that matches, and the shape of bulk lines: it starts with '{' and ends
 * with '\n'), or REC_RETRY when it could not be read for now (no memory).  It touches no
 * spool state: esx_spool_load runs it without the caller's lock. */
static int read_record_at(int rfd, uint64_t off, uint64_t end, char **buf, size_t *cap, size_t *len)
{
    if (off + 8 > end)
        return REC_NONE;
    unsigned char head[8];
    if (pread(rfd, head, 8, (off_t)off) != 8)
        return REC_BAD;
    uint32_t n, crc;
    memcpy(&n, head, 4);
    memcpy(&crc, head + 4, 4);
    if (n == 0 || n > MAX_RECORD || off + 8 + n > end)
        return REC_BAD;
    if (n > *cap) {
        char *b = realloc(*buf, n);
        if (b == NULL)
            return REC_RETRY;
        *buf = b;
        *cap = n;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t k = pread(rfd, *buf + got, n - got, (off_t)(off + 8 + got));
        if (k <= 0)
            return REC_BAD;
        got += (size_t)k;
    }
    if ((*buf)[0] != '{' || (*buf)[n - 1] != '\n' ||
        (uint32_t)crc32(0L, (const Bytef *)*buf, (uInt)n) != crc)
        return REC_BAD;
    *len = n;
    return REC_OK;
}

/* After a record at read_off that failed its checks: the offset of the next record that
 * passes them, end when none does (a torn tail), or (uint64_t)-1 when the scan must be
 * tried again later (no memory).  Candidates are the offsets 8 bytes before a '{'; a false
 * match needs a length in bounds, a payload ending in '\n' and a CRC-32 match, about 1 in
 * 2^32 of the candidates that get that far.  Like read_record_at, no spool state. */
static uint64_t resync(int rfd, uint64_t read_off, uint64_t end, char **buf, size_t *cap)
{
    char chunk[16384];
    uint64_t from = read_off + 9; /* the '{' of a record that starts one byte later */
    while (from < end) {
        size_t want = end - from < sizeof chunk ? (size_t)(end - from) : sizeof chunk;
        ssize_t got = pread(rfd, chunk, want, (off_t)from);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            /* a block that cannot be read (EIO: a bad sector) is not the segment's end: the
             * records after it were acknowledged too.  Read up to the next 4 KiB boundary
             * alone, and step over it when that fails as well (ending the scan here lost
             * every record behind a damaged one). */
            size_t block = 4096 - (size_t)(from % 4096);
            if (block < want && (got = pread(rfd, chunk, block, (off_t)from)) < 0) {
                from += block;
                continue;
            }
            if (got < 0) {
                from += want;
                continue;
            }
        }
        if (got == 0)
            break;
        for (const char *q = chunk; (q = memchr(q, '{', (size_t)(chunk + got - q))) != NULL; q++) {
            uint64_t at = from + (uint64_t)(q - chunk) - 8;
            size_t n;
            int rc = read_record_at(rfd, at, end, buf, cap, &n);
            if (rc == REC_OK)
                return at;
            if (rc == REC_RETRY)
                return (uint64_t)-1;
        }
        from += (uint64_t)got;
    }
    return end;
}

/* 1 when the file st describes was refused at a scan already (counted and said then). */
static int refused_before(const esx_spool *sp, const struct stat *st)
{
    for (size_t i = 0; i < sp->n_refused; i++)
        if (sp->refused[i].dev == st->st_dev && sp->refused[i].ino == st->st_ino)
            return 1;
    return 0;
}

int esx_spool_load(esx_spool *sp, size_t max_bytes,
                   int64_t (*fn)(void *ud, esx_segment *seg, const char *data, size_t len),
                   void *ud, pthread_mutex_t *mu)
{
    char *buf = NULL;
    size_t cap = 0, given = 0;
    int records = 0;
    while (sp->backlog_head && given < max_bytes) {
        esx_segment *seg = sp->backlog_head;
        size_t n = 0;
        /* the bytes written so far (appends go on meanwhile, past them) */
        uint64_t off = seg->read_off, end = seg->bytes, next = 0;
        int rc = off + 8 > end ? REC_NONE : open_for_read(seg);
        if (rc == REC_OK) {
            /* The disk reads without the caller's lock (mu), which the intake takes for
             * every request: a slow or failing disk must not hold the answers.  seg stays
             * the backlog's head meanwhile, with its read descriptor: only this thread
             * reads the backlog, and a segment with unread records is never deleted (an
             * append may seal it: its read descriptor is another one). */
            int rfd = seg->rfd;
            if (mu)
                pthread_mutex_unlock(mu);
            rc = read_record_at(rfd, off, end, &buf, &cap, &n);
            if (rc == REC_BAD)
                next = resync(rfd, off, end, &buf, &cap);
            if (mu)
                pthread_mutex_lock(mu);
        }
        if (rc == REC_RETRY)
            break; /* no descriptor or memory left: try again on the next pass */
        if (rc == REC_GONE) {
            /* its unread records cannot be had: counted as skipped, and the rest goes on */
            sp->bytes_skipped += seg->bytes - seg->read_off;
            sp->segments_gone++;
            seg->read_off = seg->bytes;
            backlog_remove(sp, seg);
            maybe_delete(sp, seg);
            continue;
        }
        if (rc == REC_REFUSED) {
            /* There, but not to be read as ours: its events are not lost -- the file stays
             * (in the segment list, never deleted: this process does not claim it again), for
             * its owner to look at, and for the next process once it is ours again.  Any
             * error but ENOENT counted as gone and unlinked it, and the events with it.
             * Counted and said once per file: not again when a scan refused it before it
             * was claimed (a backup tool's second link, gone at the claim, made again). */
            int err = errno;
            struct stat st;
            if (stat(seg->path, &st) != 0 || !refused_before(sp, &st)) {
                fprintf(stderr, "esx.collector: spool segment %s cannot be read (%s): left on disk, "
                                "not replayed\n", seg->path,
                        err == EPERM ? "not this user's private file: its owner, mode or links"
                                     : strerror(err));
                sp->segments_refused++;
            }
            backlog_remove(sp, seg);
            continue;
        }
        if (rc == REC_BAD) {
            /* A torn tail (a write cut short by a kill: never acknowledged) or a damaged
             * record: the records after it, if any, are acknowledged events -- go on from
             * the next one that passes every check (resync's answer, above). */
            if (next == (uint64_t)-1)
                break;
            sp->bytes_skipped += next - seg->read_off;
            seg->read_off = next;
            continue;
        }
        if (rc == REC_NONE) {
            if (seg == sp->overflow) {
                /* still being written: more may come -- after the segments behind it (a
                 * dead process's, claimed meanwhile), which are older: stopping here held
                 * them until every event loaded from this one was acknowledged, and while
                 * requests kept coming (they go to it as long as there is a backlog) until
                 * it was full */
                if (sp->backlog_tail == seg)
                    break;
                backlog_remove(sp, seg);
                backlog_append(sp, seg);
                continue;
            }
            /* fewer than 8 bytes left: a torn tail cut short inside its header */
            sp->bytes_skipped += seg->bytes - seg->read_off;
            seg->read_off = seg->bytes;
            backlog_remove(sp, seg);
            if (seg->rfd >= 0) {
                close(seg->rfd);
                seg->rfd = -1;
            }
            maybe_delete(sp, seg);
            continue;
        }
        int64_t queued = fn(ud, seg, buf, n);
        if (queued < 0)
            break; /* no memory for its events: the record stays unread */
        seg->read_off += 8 + n;
        seg->pending += queued;
        given += n;
        records++;
        sp->records_replayed++;
        maybe_delete(sp, seg);
    }
    free(buf);
    return records;
}

/* The name of seg is gone (its directory removed by hand while it held unacknowledged
 * events): appends would go on into a file no later process can find, and the events
 * acknowledged meanwhile would die with this one.  Sealed, so that the next append makes a
 * new segment (and the directory again). */
static void seal_if_unnamed(esx_spool *sp, esx_segment *seg)
{
    struct stat st;
    if (seg != NULL && seg->fd >= 0 && fstat(seg->fd, &st) == 0 && st.st_nlink == 0)
        seal(sp, seg);
}

int esx_spool_sync_begin(esx_spool *sp, int fds[ESX_SPOOL_SYNC_FDS])
{
    seal_if_unnamed(sp, sp->current);
    seal_if_unnamed(sp, sp->overflow);
    int n = 0;
    /* the oldest sealed segments, as many as leave room for the three below */
    while (n < sp->n_unsynced && n < ESX_SPOOL_SYNC_FDS - 3) {
        fds[n] = sp->unsynced[n];
        n++;
    }
    sp->n_unsynced -= n;
    if (n > 0 && sp->n_unsynced > 0) /* (unsynced is NULL before the first seal) */
        memmove(sp->unsynced, sp->unsynced + n, (size_t)sp->n_unsynced * sizeof *sp->unsynced);
    if (sp->dirty) {
        /* (closed on exec: a program another thread starts meanwhile must not keep a copy,
         * holding the segment's disk space after its unlink for as long as it runs) */
        if (sp->current && sp->current->fd >= 0 &&
            (fds[n] = fcntl(sp->current->fd, F_DUPFD_CLOEXEC, 0)) >= 0)
            n++;
        if (sp->overflow && sp->overflow->fd >= 0 &&
            (fds[n] = fcntl(sp->overflow->fd, F_DUPFD_CLOEXEC, 0)) >= 0)
            n++;
    }
    sp->dirty = 0;
    /* segments claimed since: the dead process acknowledged the records of its last sync
     * interval before their fdatasync (it died inside it), and nothing else syncs them --
     * a power loss long after the claim lost them.  (By name, without its lock: the file is
     * this process's now.) */
    for (esx_segment *seg = sp->segments; seg && sp->n_claim_unsynced > 0 &&
                                          n < ESX_SPOOL_SYNC_FDS - 1; seg = seg->next) {
        if (!seg->claim_unsynced)
            continue;
        int fd = seg->rfd >= 0 ? fcntl(seg->rfd, F_DUPFD_CLOEXEC, 0)
                               : open(seg->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOMEM))
            break; /* tried again at the next sync */
        seg->claim_unsynced = 0; /* (or its file is gone or refused: the replay says so) */
        sp->n_claim_unsynced--;
        if (fd >= 0)
            fds[n++] = fd;
    }
    if (sp->dir_dirty && (fds[n] = open(sp->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        n++;
        sp->dir_dirty = 0;
    }
    return n;
}

int esx_spool_sync_wanted(const esx_spool *sp)
{
    return sp->n_unsynced >= ESX_SPOOL_SYNC_SOON || sp->n_claim_unsynced > 0;
}

int esx_spool_sync_end(int fds[ESX_SPOOL_SYNC_FDS], int n)
{
    int failed = 0, err = 0;
    for (int i = 0; i < n; i++) {
        if (fdatasync(fds[i]) != 0) {
            failed++;
            err = errno;
        }
        close(fds[i]);
    }
    errno = err;
    return failed;
}

void esx_spool_sync_failed(esx_spool *sp, int n, int err)
{
    if (n <= 0)
        return;
    sync_failed(sp, n, err);
    /* which of the files failed is not known (the descriptors were copies): the segments
     * being written are sealed, and the next events go to new files */
    if (sp->current)
        seal(sp, sp->current);
    if (sp->overflow)
        seal(sp, sp->overflow);
}

void esx_spool_release(esx_spool *sp, esx_segment *seg, int64_t n)
{
    seg->pending -= n;
    if (seg->pending <= 0) {
        /* Everything loaded from it is acknowledged: once it is fully read it goes, the
         * current one included (the next append starts a new segment), so a replay never
         * re-sends acknowledged events. */
        seg->pending = 0;
        maybe_delete(sp, seg);
    }
}

static int owned(const esx_spool *sp, const char *path)
{
    for (const esx_segment *seg = sp->segments; seg; seg = seg->next)
        if (strcmp(seg->path, path) == 0)
            return 1;
    return 0;
}

static int by_seq(const void *a, const void *b)
{
    unsigned long long x = (*(esx_segment *const *)a)->seq, y = (*(esx_segment *const *)b)->seq;
    return x < y ? -1 : x > y;
}

/* The spool's segments by sequence number, for owned_by_seq: made at a scan's first name of
 * this pid.  owned() for each name walked every segment: with a small spool_segment_bytes and
 * a full spool (16384 segments of 64 KiB in 1 GiB) a scan took seconds under the collector's
 * lock, every 2 s -- every request waited.  NULL when memory ran out: owned() then. */
static esx_segment **segments_by_seq(const esx_spool *sp, size_t *n)
{
    size_t count = 0;
    for (const esx_segment *seg = sp->segments; seg; seg = seg->next)
        count++;
    esx_segment **v = malloc((count ? count : 1) * sizeof *v);
    if (v == NULL)
        return NULL;
    count = 0;
    for (esx_segment *seg = sp->segments; seg; seg = seg->next)
        v[count++] = seg;
    qsort(v, count, sizeof *v, by_seq);
    *n = count;
    return v;
}

/* owned() among the first n segments of the list: those claimed since (each goes first). */
static int owned_first(const esx_spool *sp, int n, const char *path)
{
    for (const esx_segment *seg = sp->segments; seg && n-- > 0; seg = seg->next)
        if (strcmp(seg->path, path) == 0)
            return 1;
    return 0;
}

/* owned() through segments_by_seq's array v of n segments. */
static int owned_by_seq(esx_segment **v, size_t n, unsigned long long seq, const char *path)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (v[mid]->seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < n && v[lo]->seq == seq; lo++)
        if (strcmp(v[lo]->path, path) == 0)
            return 1;
    return 0;
}

/* A segment file claim_orphans will not take (not this user's private file): counted and
 * said once per file, however many scans meet it.  Any number of them at every scan (2 s)
 * said nothing: the acknowledged events in it were waiting for ever, unseen. */
static void refuse_orphan(esx_spool *sp, const char *path, const struct stat *st)
{
    if (refused_before(sp, st))
        return;
    if (sp->n_refused >= ESX_SPOOL_MAX_REFUSED)
        return;
    if (sp->n_refused == sp->cap_refused) {
        size_t cap = sp->cap_refused ? sp->cap_refused * 2 : 8;
        void *r = realloc(sp->refused, cap * sizeof *sp->refused);
        if (r == NULL)
            return; /* counted at a later scan */
        sp->refused = r;
        sp->cap_refused = cap;
    }
    sp->refused[sp->n_refused].dev = st->st_dev;
    sp->refused[sp->n_refused].ino = st->st_ino;
    sp->n_refused++;
    sp->segments_refused++;
    fprintf(stderr, "esx.collector: spool segment %s is not this user's private file (its "
                    "owner, mode or links): left on disk, not replayed\n", path);
}

static int by_file(const void *a, const void *b)
{
    const struct esx_spool_file *x = a, *y = b;
    if (x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* The files whose claim failed at the scan under way (claim_orphans), to be the spool's
 * `failing` list (sorted, for bsearch) when it ends. */
typedef struct {
    struct esx_spool_file *v;
    size_t n, cap;
    uint64_t extra; /* failed, not remembered (past ESX_SPOOL_MAX_REFUSED, or no memory) */
} failing_scan;

static int failing_add(failing_scan *fs, struct esx_spool_file f)
{
    if (fs->n == fs->cap) {
        size_t cap = fs->cap ? fs->cap * 2 : 8;
        void *v = realloc(fs->v, cap * sizeof *fs->v);
        if (v == NULL)
            return -1;
        fs->v = v;
        fs->cap = cap;
    }
    fs->v[fs->n++] = f;
    return 0;
}

/* A dead process's segment whose claim (the rename) failed (a read-only file system, a
 * directory this user may no longer write, EIO): left on disk, tried again at every scan.
 * Counted in claims_failing as long as it fails -- not in segments_refused, which counted it
 * for good, with the files that are not this user's: a claim that worked at a later scan
 * stayed counted as refused, and an operator could not tell a failing disk from a foreign
 * file.  Said on stderr when it starts failing (not at every scan). */
static void claim_failed(esx_spool *sp, failing_scan *fs, const char *path,
                         const struct stat *st, int err)
{
    struct esx_spool_file f = {.dev = st->st_dev, .ino = st->st_ino};
    if (st->st_nlink > 1) {
        /* (a dead claimer's half-done claim, met by each of its names: one file) */
        for (size_t i = 0; i < fs->n; i++)
            if (by_file(&fs->v[i], &f) == 0)
                return;
    }
    int known = sp->n_failing > 0 &&
                bsearch(&f, sp->failing, sp->n_failing, sizeof f, by_file) != NULL;
    if (fs->n >= ESX_SPOOL_MAX_REFUSED || failing_add(fs, f) != 0) {
        fs->extra++; /* not remembered: said only if it was not before */
        return;
    }
    if (!known)
        fprintf(stderr, "esx.collector: spool segment %s of a dead process cannot be claimed "
                        "(%s): left on disk, not replayed (tried again at every scan)\n", path,
                strerror(err));
}

/* The scan is over: what failed in it is what fails now.  A scan cut short (complete = 0: no
 * memory) did not look at every file: the ones that failed before still count. */
static void claims_scanned(esx_spool *sp, failing_scan *fs, int complete)
{
    if (fs->n > 1)
        qsort(fs->v, fs->n, sizeof *fs->v, by_file);
    if (!complete) {
        size_t n = fs->n;
        for (size_t i = 0; i < sp->n_failing; i++)
            if ((n == 0 || bsearch(&sp->failing[i], fs->v, n, sizeof *fs->v, by_file) == NULL) &&
                failing_add(fs, sp->failing[i]) != 0)
                fs->extra++;
        if (fs->n > 1)
            qsort(fs->v, fs->n, sizeof *fs->v, by_file);
    }
    free(sp->failing);
    sp->failing = fs->v;
    sp->n_failing = fs->n;
    sp->cap_failing = fs->cap;
    sp->claims_failing = fs->n + fs->extra;
}

/* 1 when the segment name `name` (of pid, at path) is a dead process's: one whose lock the
 * scan os could take (or, without a lock file, a pid that does not exist), or this process's
 * own pid on a name it does not own (an earlier process's). */
static int dead_name(const esx_spool *sp, esx_owner_scan *os, int pid, const char *path)
{
    return pid == (int)sp->pid ? !owned(sp, path) : esx_owner_dead(os, sp->dir, pid);
}

/* 1 when the segment at path, of pid (alive, without a lock file), is the writing of an
 * earlier process with that pid (esx_owner_reused). */
static int reused_pid(esx_owner_scan *os, int pid, const char *path)
{
    struct stat st;
    return os->by_start && lstat(path, &st) == 0 && esx_owner_reused(os, pid, &st);
}

/* 1 when name is a segment's, seg-<pid>-<seq>.log: *pid and *seq from it, and path (600
 * bytes) its path in the spool directory. */
static int segment_name(const esx_spool *sp, const char *name, int *pid,
                        unsigned long long *seq, char *path)
{
    char tail[8];
    if (sscanf(name, "seg-%d-%llu%7s", pid, seq, tail) != 3 || strcmp(tail, ".log") != 0)
        return 0;
    snprintf(path, 600, "%.500s/%.90s", sp->dir, name);
    return 1;
}

/* The segment names in the spool directory whose file has more than one link, by inode:
 * made once per scan (index_links), when the scan first meets such an orphan.  Each of them
 * looked at every name in the directory again (other_names): N segments with a second link
 * -- a backup tool's hard-link snapshot of the spool (rsnapshot, cp -al) -- made N^2 lstat
 * calls under the collector's lock, which every request takes: 4000 took a minute. */
typedef struct {
    dev_t dev;
    ino_t ino;
    int pid;
    char name[91]; /* (as much of it as a path takes: "%.90s") */
} seg_link;

#define LINK_INDEX_MAX 65536 /* names: past it, each such orphan walks the directory */

typedef struct {
    int built;          /* 0: not yet; 1: v holds the names; -1: could not be made */
    struct timespec at; /* when its walk began */
    seg_link *v;
    size_t n;
} link_index;

static int by_inode(const void *a, const void *b)
{
    const seg_link *x = a, *y = b;
    if (x->dev != y->dev)
        return x->dev < y->dev ? -1 : 1;
    return x->ino < y->ino ? -1 : x->ino > y->ino;
}

static void index_links(const esx_spool *sp, link_index *ix)
{
    ix->built = -1;
    clock_gettime(CLOCK_REALTIME, &ix->at);
    DIR *d = opendir(sp->dir);
    if (d == NULL)
        return;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int pid;
        unsigned long long seq;
        char path[600];
        struct stat st;
        if (!segment_name(sp, de->d_name, &pid, &seq, path) || lstat(path, &st) != 0 ||
            !S_ISREG(st.st_mode) || st.st_nlink < 2)
            continue;
        if (ix->n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            seg_link *v = ncap <= LINK_INDEX_MAX ? realloc(ix->v, ncap * sizeof *v) : NULL;
            if (v == NULL) { /* (no memory, or too many: each looks for itself) */
                closedir(d);
                free(ix->v);
                ix->v = NULL;
                ix->n = 0;
                return;
            }
            ix->v = v;
            cap = ncap;
        }
        seg_link *l = &ix->v[ix->n++];
        l->dev = st.st_dev;
        l->ino = st.st_ino;
        l->pid = pid;
        snprintf(l->name, sizeof l->name, "%.90s", de->d_name);
    }
    closedir(d);
    if (ix->n > 0)
        qsort(ix->v, ix->n, sizeof *ix->v, by_inode);
    ix->built = 1;
}

/* 1 when the links of the file st describes have not changed since `at`: a link, an unlink
 * or a rename of it sets its ctime (100 ms of slack: a file system's clock may lag the
 * wall clock by a tick). */
static int links_unchanged_since(const struct stat *st, const struct timespec *at)
{
    int64_t c = (int64_t)st->st_ctim.tv_sec * 1000 + st->st_ctim.tv_nsec / 1000000;
    int64_t a = (int64_t)at->tv_sec * 1000 + at->tv_nsec / 1000000;
    return c < a - 100;
}

/* other_names' look at one name `other` (of pid) of the file: counted, a live process's
 * sets *live, a dead one's may become `canon`. */
static void look_at_name(const esx_spool *sp, esx_owner_scan *os, int pid, const char *other,
                         const char *from, char *canon, nlink_t *names, int *live)
{
    (*names)++;
    if (strcmp(other, from) == 0)
        return;
    if (!dead_name(sp, os, pid, other))
        *live = 1;
    else if (strcmp(other, canon) < 0)
        snprintf(canon, 600, "%s", other);
}

/* What the other names of the file st describes (an orphan's, with more than one link) say.
 * Returns 1 to pass it over: a second name is a segment of a live process -- that process
 * is claiming it where RENAME_NOREPLACE is missing (between its link and its unlink), or has
 * just claimed it: the next scan finds the old name gone.  (Refused, it was counted in
 * spool_segments_refused and said on stderr, and then never counted again when it was in
 * fact refused.)  Returns 2 when every link of the file is a dead process's segment name in
 * this directory: a claimer died between its link and its unlink, and the claim is to be
 * completed (refused, the file was refused by every later process for good, its events
 * never replayed) -- `canon` (600 bytes) gets the name to claim, the first of them by
 * strcmp: processes completing it at once all try that one, and one rename wins.  Returns 0
 * to refuse it (a link elsewhere: a backup tool's).  The names are those of the scan's
 * index (ix, made at the first call) while the file's links are as they were then, else
 * those of a walk of the directory now. */
static int other_names(const esx_spool *sp, esx_owner_scan *os, const char *from,
                       const struct stat *st, char *canon, link_index *ix)
{
    struct stat now;
    if (lstat(from, &now) != 0 || now.st_dev != st->st_dev || now.st_ino != st->st_ino ||
        now.st_nlink == 1)
        return 1; /* gone, or one name again: the next scan decides */
    if (ix->built == 0)
        index_links(sp, ix);
    int live = 0;
    nlink_t names = 0;
    snprintf(canon, 600, "%s", from);
    if (ix->built == 1 && links_unchanged_since(&now, &ix->at)) {
        size_t lo = 0, hi = ix->n;
        seg_link key = {.dev = now.st_dev, .ino = now.st_ino};
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (by_inode(&ix->v[mid], &key) < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (; !live && lo < ix->n && by_inode(&ix->v[lo], &key) == 0; lo++) {
            char other[600];
            snprintf(other, sizeof other, "%.500s/%s", sp->dir, ix->v[lo].name);
            look_at_name(sp, os, ix->v[lo].pid, other, from, canon, &names, &live);
        }
    } else {
        DIR *d = opendir(sp->dir);
        if (d == NULL)
            return 0;
        struct dirent *de;
        while (!live && (de = readdir(d)) != NULL) {
            int pid;
            unsigned long long seq;
            char other[600];
            if (segment_name(sp, de->d_name, &pid, &seq, other) && lstat(other, &now) == 0 &&
                now.st_dev == st->st_dev && now.st_ino == st->st_ino)
                look_at_name(sp, os, pid, other, from, canon, &names, &live);
        }
        closedir(d);
    }
    if (live)
        return 1;
    return lstat(from, &now) == 0 && now.st_ino == st->st_ino && now.st_nlink == names ? 2 : 0;
}

/* After the completion of a dead claimer's claim (other_names): removes the file's names
 * left in the directory but `keep` (this process's), each a dead process's segment name. */
static void unlink_dead_names(const esx_spool *sp, esx_owner_scan *os, const char *keep,
                              dev_t dev, ino_t ino)
{
    DIR *d = opendir(sp->dir);
    if (d == NULL)
        return;
    struct dirent *de;
    struct stat now;
    while ((de = readdir(d)) != NULL) {
        int pid;
        unsigned long long seq;
        char other[600];
        if (segment_name(sp, de->d_name, &pid, &seq, other) && strcmp(other, keep) != 0 &&
            lstat(other, &now) == 0 && now.st_dev == dev && now.st_ino == ino &&
            dead_name(sp, os, pid, other))
            unlink(other);
    }
    closedir(d);
}

int esx_spool_claim_orphans(esx_spool *sp)
{
    DIR *d = opendir(sp->dir);
    if (d == NULL)
        return 0;
    int claimed = 0, sorted = 0;
    esx_segment **by = NULL; /* the segments by seq, once a name of this pid is met */
    size_t n_by = 0;
    unsigned long long mark = 0;
    struct dirent *de;
    link_index links = {0}; /* the names of files with more than one, once one is met */
    failing_scan failing = {0};
    esx_owner_scan owners = {0}; /* the verdicts on other pids, their locks held till the end */
    held_lock();
    owners.by_start = esx_owner_locks(sp->owner);
    held_unlock();
    int complete = 1;
    while ((de = readdir(d)) != NULL) {
        int pid;
        unsigned long long seq;
        char from[600];
        esx_owner_yield(&owners, sp->dir); /* (a process waiting for a lock held here) */
        if (esx_owner_name(de->d_name, &pid)) {
            /* a process's lock file: a dead one's goes at the end, when none of its segments
             * is left (one that died with none: all acknowledged) */
            if (pid != (int)sp->pid && pid != (int)esx_pid())
                esx_owner_dead(&owners, sp->dir, pid);
            continue;
        }
        if (!segment_name(sp, de->d_name, &pid, &seq, from))
            continue;
        if (pid == (int)sp->pid && !sorted) {
            /* (names from mark on are newer than the array: made by the claims below) */
            mark = (unsigned long long)atomic_load(&segment_seq) + 1;
            by = segments_by_seq(sp, &n_by);
            sorted = 1;
        }
        int reused = 0; /* (alive by its pid, but not the writer: esx_owner_reused) */
        if (pid == (int)sp->pid
                ? (by == NULL   ? owned(sp, from)
                   : seq < mark ? owned_by_seq(by, n_by, seq, from)
                                : owned_first(sp, claimed, from))
                : !esx_owner_dead(&owners, sp->dir, pid) &&
                      !(reused = reused_pid(&owners, pid, from)))
            continue;
        /* (left, until it is claimed or gone: its owner's lock file stays then) */
        esx_owner_count(&owners, pid, 1, 0);
        struct stat st; /* a regular file of this user's: nothing else is replayed */
        if (lstat(from, &st) != 0) {
            esx_owner_count(&owners, pid, -1, 0);
            continue; /* gone meanwhile */
        }
        int names = 0;
        char canon[600];
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
            (st.st_mode & (S_IWGRP | S_IWOTH)) != 0 || st.st_nlink != 1) {
            /* (as esx_private_read would refuse it: never claimed, never stuck) */
            if (S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                (st.st_mode & (S_IWGRP | S_IWOTH)) == 0 && sp->n_refused < ESX_SPOOL_MAX_REFUSED &&
                !refused_before(sp, &st))
                names = other_names(sp, &owners, from, &st, canon, &links);
            if (names == 1)
                continue;
            if (names == 0) {
                refuse_orphan(sp, from, &st);
                continue;
            }
            /* the dead claimer's claim completed: the name all completing it take */
            memcpy(from, canon, sizeof from);
            if (lstat(from, &st) != 0)
                continue;
        }
        /* a new process with the pid may have taken its lock meanwhile: from then on its
         * names are that process's */
        if (pid != (int)sp->pid && !reused && !esx_owner_still(&owners, sp->dir, pid))
            continue;
        esx_segment *seg = calloc(1, sizeof *seg);
        if (seg == NULL) {
            complete = 0;
            break;
        }
        /* renamed without replacing: a name taken (by a segment of an earlier process with
         * this pid) moves on to the next sequence number */
        int rc = -1;
        for (int tries = 0; tries < 1000; tries++) {
            seg->seq = next_seq();
            snprintf(seg->path, sizeof seg->path, "%s/seg-%d-%llu.log", sp->dir, (int)sp->pid,
                     seg->seq);
            rc = renameat2(AT_FDCWD, from, AT_FDCWD, seg->path, RENAME_NOREPLACE);
            if (rc != 0 && (errno == EINVAL || errno == ENOSYS) &&
                (rc = link(from, seg->path)) == 0 && unlink(from) != 0) {
                /* a file system (or a kernel) without RENAME_NOREPLACE: link, then unlink
                 * the old name -- which another process removed first (it linked it too,
                 * between our look and our link): the segment is its, and our name only a
                 * second link to it, to be given back (or both replayed it) */
                unlink(seg->path);
                rc = -1;
                errno = ENOENT;
            } else if (rc != 0 && (errno == EPERM || errno == EOPNOTSUPP || errno == ENOSYS)) {
                /* nor hard links (vfat, a FUSE or SMB mount): a plain rename, onto a name
                 * that is not there.  Only this process makes names of its pid (next_seq),
                 * so none appears between the look and the rename: what it could replace is
                 * an earlier process's with this pid, there already.  (Without it no claim
                 * was ever made there, and dead processes' segments stayed for ever,
                 * unsaid.)  Two claimers racing: one rename takes the old name, the other's
                 * fails with ENOENT, as with RENAME_NOREPLACE. */
                struct stat taken;
                if (lstat(seg->path, &taken) == 0) {
                    rc = -1;
                    errno = EEXIST;
                } else if (errno == ENOENT) {
                    rc = rename(from, seg->path);
                }
            }
            if (rc == 0 || errno != EEXIST)
                break;
        }
        if (rc != 0) {
            /* ENOENT: another process claimed it first.  Anything else (a read-only file
             * system, a directory this user may not write, EIO) leaves it on disk,
             * unclaimed: counted while it fails, tried again at every scan */
            if (errno != ENOENT && errno != EEXIST)
                claim_failed(sp, &failing, from, &st, errno);
            else if (errno == ENOENT)
                esx_owner_count(&owners, pid, -1, 0);
            free(seg);
            continue;
        }
        esx_owner_count(&owners, pid, -1, 1);
        if (reused)
            sp->segments_pid_reused++;
        /* its last write is now the claim: a live holder's segments are never older than its
         * process (esx_owner_reused), even where no lock file says it is alive */
        struct timespec touch[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
        utimensat(AT_FDCWD, seg->path, touch, AT_SYMLINK_NOFOLLOW);
        if (names == 2)
            unlink_dead_names(sp, &owners, seg->path, st.st_dev, st.st_ino);
        sp->dir_dirty = 1; /* its new name */
        seg->claim_unsynced = 1; /* its data: the next sync (esx_spool_sync_wanted) */
        sp->n_claim_unsynced++;
        seg->fd = seg->rfd = -1;
        seg->sealed = 1;
        seg->bytes = (size_t)st.st_size;
        seg->since_ms = (int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000;
        seg->next = sp->segments;
        sp->segments = seg;
        sp->bytes_on_disk += seg->bytes;
        sp->segments_claimed++;
        backlog_append(sp, seg);
        claimed++;
    }
    closedir(d);
    esx_owner_scan_end(&owners, sp->dir, complete);
    claims_scanned(sp, &failing, complete);
    free(by);
    free(links.v);
    return claimed;
}

void esx_spool_close(esx_spool *sp)
{
    if (sp == NULL)
        return;
    esx_spool_unhold(sp);
    int dfd = sp->dir_dirty ? open(sp->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    int failed = 0, err = 0;
    if (dfd >= 0) {
        if (fdatasync(dfd) != 0)
            failed++, err = errno;
        close(dfd);
    }
    for (int i = 0; i < sp->n_unsynced; i++) {
        if (fdatasync(sp->unsynced[i]) != 0)
            failed++, err = errno;
        close(sp->unsynced[i]);
    }
    esx_segment *seg = sp->segments;
    while (seg) {
        esx_segment *next = seg->next;
        if (seg->fd >= 0) {
            if (fdatasync(seg->fd) != 0)
                failed++, err = errno;
            close(seg->fd);
        }
        int keep = !(seg->pending == 0 && seg->read_off >= seg->bytes);
        if (keep && seg->claim_unsynced) {
            /* claimed, left to the next process: synced as a sync pass would have */
            int fd = open(seg->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
            if (fd >= 0) {
                if (fdatasync(fd) != 0)
                    failed++, err = errno;
                close(fd);
            }
        }
        if (seg->rfd >= 0)
            close(seg->rfd);
        if (!keep)
            unlink(seg->path);
        free(seg);
        seg = next;
    }
    if (failed > 0)
        sync_failed(sp, failed, err);
    /* (after its segments: the lock file goes with the last of them) */
    held_lock();
    esx_owner_drop(sp->owner);
    held_unlock();
    free(sp->unsynced);
    free(sp->refused);
    free(sp->failing);
    free(sp);
}

void esx_spool_forget(esx_spool *sp)
{
    if (sp == NULL)
        return;
    esx_spool_unhold(sp); /* (the parent's entry, in our copy of the list) */
    /* our copies of the parent's descriptors and memory: close and free, never unlink */
    for (int i = 0; i < sp->n_unsynced; i++)
        close(sp->unsynced[i]);
    esx_segment *seg = sp->segments;
    while (seg) {
        esx_segment *next = seg->next;
        if (seg->fd >= 0)
            close(seg->fd);
        if (seg->rfd >= 0)
            close(seg->rfd);
        free(seg);
        seg = next;
    }
    held_lock();
    esx_owner_drop(sp->owner); /* (the parent's: only our copy is freed) */
    held_unlock();
    free(sp->unsynced);
    free(sp->refused);
    free(sp->failing);
    free(sp);
}
