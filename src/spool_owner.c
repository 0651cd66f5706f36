/*
 * spool_owner.c -- the spool's lock files, lock-<pid> (see spool_owner.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"
#include "spool_owner.h"

struct esx_spool_owner {
    pid_t pid;               /* the process that took it (in a forked child: the parent) */
    dev_t dev;               /* the directory */
    ino_t ino;
    dev_t fdev;              /* the lock file held */
    ino_t fino;
    int fd;                  /* -1: nothing held (no flock there, or a child's copy) */
    int no_flock;            /* flock does not work there: claimers go by the pid */
    int refs;                /* spools of the process that hold it */
    char dir[512];
    char path[600];
    struct esx_spool_owner *next;
};

static esx_spool_owner *owners; /* under the caller's lock */

static int pid_alive(pid_t pid)
{
    return kill(pid, 0) == 0 || errno == EPERM;
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/* 1 when the descriptor fd is still the file named path (not removed, not replaced). */
static int still_named(int fd, const char *path)
{
    struct stat fst, pst;
    return fstat(fd, &fst) == 0 && fst.st_nlink > 0 && stat(path, &pst) == 0 &&
           same_file(&fst, &pst);
}

static int no_flock(int err)
{
    return err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL;
}

/* Waits until the lock of fd, held by another process, can be taken (and takes it), up to
 * ESX_OWNER_WAIT_MS after start, with a byte in the file while it waits: a claimer that
 * holds it lets go at its next claim (esx_owner_still; one that takes it next clears the
 * file, and sees the byte again).  0, or -1 with errno (EWOULDBLOCK: still held). */
static int wait_free(int fd, const struct timespec *start)
{
    for (;;) {
        struct stat st;
        if (fstat(fd, &st) == 0 && st.st_size == 0 && pwrite(fd, "w", 1, 0) != 1)
            return -1; /* (errno: EIO, ENOSPC...) */
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        struct timespec now, nap = {0, 1000000};
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - start->tv_sec) * 1000 + (now.tv_nsec - start->tv_nsec) / 1000000 >=
            ESX_OWNER_WAIT_MS) {
            errno = EWOULDBLOCK;
            return -1;
        }
        nanosleep(&nap, NULL);
    }
}

/* Takes the lock on path.  Returns 0 (o->fd, o->fdev, o->fino set), 1 when flock does not
 * work on that file system (nothing held, the file removed), or -1 with a reason in why. */
static int lock_file(esx_spool_owner *o, char *why)
{
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        int fd = open(o->path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
        struct stat fst;
        if (fd < 0) {
            snprintf(why, 256, "cannot open its lock file: %.80s", strerror(errno));
            return -1;
        }
        if (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode)) {
            close(fd);
            snprintf(why, 256, "its lock file is not a regular file");
            return -1;
        }
        int rc;
        do
            rc = flock(fd, LOCK_EX | LOCK_NB);
        while (rc != 0 && errno == EINTR);
        if (rc != 0 && errno == EWOULDBLOCK) {
            /* Held: by a claimer taking the segments an earlier process with this pid left
             * (or by a process with this pid in another pid namespace).  Waiting for the end
             * of its scan held the caller's locks (held_mu, the collector's) for as long as
             * the scan took, and past ESX_OWNER_WAIT_MS the spool was refused: 503.  A byte
             * written to the file tells the claimer that a process with the pid is here: it
             * lets go before its next claim (esx_owner_still). */
            rc = wait_free(fd, &start);
        }
        if (rc != 0) {
            int err = errno;
            if (no_flock(err)) {
                /* Nothing can be held here: the file goes (when it is still the one opened),
                 * so that claimers go by the pid -- a file that can be locked later (lockd
                 * back on NFS) would have them take this live process for a dead one */
                struct stat pst;
                if (stat(o->path, &pst) == 0 && same_file(&pst, &fst))
                    unlink(o->path);
                close(fd);
                snprintf(why, 256, "%.80s", strerror(err));
                return 1;
            }
            close(fd);
            snprintf(why, 256, "its lock file is locked by another process (%.80s)",
                     err == EWOULDBLOCK ? "for longer than a claim takes: a process with this "
                                          "pid in another pid namespace?"
                                        : strerror(err));
            return -1;
        }
        if (still_named(fd, o->path)) {
            /* (the byte of a process with this pid that waited for it: cleared) */
            struct stat now;
            if (fstat(fd, &now) == 0 && now.st_size > 0 && ftruncate(fd, 0) != 0)
                fst.st_size = 0; /* (a claimer clears it when it takes the lock) */
            o->fd = fd;
            o->fdev = fst.st_dev;
            o->fino = fst.st_ino;
            return 0;
        }
        /* removed by the claimer that held it (it took the last segments of an earlier
         * process with this pid): made anew */
        close(fd);
    }
}

/* Says that flock does not work where a spool takes its lock. */
static void say_no_flock(const esx_spool_owner *o, const char *why)
{
    fprintf(stderr, "esx.collector: spool_dir %s: cannot lock %s (%s): the segments of a dead "
                    "process are claimed by its pid only, not while another process has that "
                    "pid\n", o->dir, o->path, why);
}

/* Takes the lock for o (o->dir, o->path set): shared with another of this process's
 * entries whose locked file bears that name now (a second open of it could not lock it: the
 * process holds it already), else locked (lock_file).  o->dev and o->ino become the
 * directory's identity as it is now.  Returns lock_file's answer. */
static int acquire(esx_spool_owner *o, char *why)
{
    struct stat ds, st;
    if (stat(o->dir, &ds) == 0) {
        o->dev = ds.st_dev;
        o->ino = ds.st_ino;
    }
    if (stat(o->path, &st) == 0) {
        for (esx_spool_owner *h = owners; h; h = h->next) {
            if (h != o && h->pid == o->pid && h->fd >= 0 && h->fdev == st.st_dev &&
                h->fino == st.st_ino) {
                /* (a copy of its descriptor: one open file, one lock, held while either is) */
                int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
                if (fd < 0) {
                    snprintf(why, 256, "cannot use its lock file: %.80s", strerror(errno));
                    return -1;
                }
                o->fd = fd;
                o->fdev = h->fdev;
                o->fino = h->fino;
                return 0;
            }
        }
    }
    return lock_file(o, why);
}

esx_spool_owner *esx_owner_take(const char *dir, dev_t dev, ino_t ino, char *why)
{
    pid_t me = esx_pid();
    for (esx_spool_owner *o = owners; o; o = o->next) {
        if (o->pid == me && o->dev == dev && o->ino == ino) {
            o->refs++;
            return o;
        }
    }
    esx_spool_owner *o = calloc(1, sizeof *o);
    if (o == NULL) {
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    o->pid = me;
    o->dev = dev;
    o->ino = ino;
    o->fd = -1;
    o->refs = 1;
    snprintf(o->dir, sizeof o->dir, "%s", dir);
    snprintf(o->path, sizeof o->path, "%.500s/lock-%d", dir, (int)me);
    char err[256];
    int rc = acquire(o, err);
    if (rc < 0) {
        snprintf(why, 256, "cannot use spool_dir %.100s: %.120s", dir, err);
        free(o);
        return NULL;
    }
    if (rc == 1) {
        o->no_flock = 1;
        say_no_flock(o, err);
    }
    o->next = owners;
    owners = o;
    return o;
}

int esx_owner_check(esx_spool_owner *o, const char *dir, char *why)
{
    if (o->no_flock)
        return 0; /* (nothing held, nothing to check) */
    struct stat st;
    if (o->fd >= 0 && stat(o->path, &st) == 0 && st.st_dev == o->fdev && st.st_ino == o->fino)
        return 0;
    /* the file, or the whole directory, was removed meanwhile: taken again where the next
     * segment goes, for every spool of the process that shares it (until then, claimers
     * found no lock file and went by the pid: this one's, alive) */
    esx_spool_owner again = *o;
    again.fd = -1;
    snprintf(again.dir, sizeof again.dir, "%s", dir);
    snprintf(again.path, sizeof again.path, "%.500s/lock-%d", dir, (int)o->pid);
    char err[256];
    int rc = acquire(&again, err);
    if (rc < 0) {
        snprintf(why, 256, "cannot use spool_dir %.100s: %.120s", dir, err);
        return -1;
    }
    if (rc == 1) {
        again.no_flock = 1;
        say_no_flock(&again, err);
    }
    if (o->fd >= 0)
        close(o->fd);
    *o = again;
    return 0;
}

/* 1 when a segment name of pid is in dir (or it cannot be told). */
static int segments_left(const char *dir, int pid)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 1;
    char prefix[32];
    int n = snprintf(prefix, sizeof prefix, "seg-%d-", pid), found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d)) != NULL)
        found = strncmp(de->d_name, prefix, (size_t)n) == 0;
    closedir(d);
    return found;
}

void esx_owner_drop(esx_spool_owner *o)
{
    if (o == NULL || --o->refs > 0)
        return;
    for (esx_spool_owner **p = &owners; *p; p = &(*p)->next) {
        if (*p == o) {
            *p = o->next;
            break;
        }
    }
    if (o->fd >= 0) {
        /* (held: no claimer is at it -- the file goes only when nothing of ours is left to
         * claim, or claimers would go by the pid again, this live process's) */
        int shared = 0; /* (another entry of ours holds it too: see acquire) */
        for (esx_spool_owner *h = owners; h; h = h->next)
            shared |= h->pid == o->pid && h->fd >= 0 && h->fdev == o->fdev && h->fino == o->fino;
        if (o->pid == esx_pid() && !shared && !segments_left(o->dir, (int)o->pid) &&
            still_named(o->fd, o->path))
            unlink(o->path);
        close(o->fd);
    }
    free(o);
}

void esx_owner_forked(void)
{
    for (esx_spool_owner *o = owners; o; o = o->next) {
        if (o->fd >= 0) {
            close(o->fd); /* (the parent's descriptor keeps the lock) */
            o->fd = -1;
        }
    }
}

/* ---------------------------------------------------------------- a claimer's scan */

struct esx_owner_seen {
    int pid;
    int fd;      /* its lock file, locked by this scan; -1 when none is */
    int dead;
    int alive;   /* dead by its lock, yet a process has the pid */
    int left, claimed;
    int yielded; /* its lock let go of during the scan: a process with the pid took it */
    int deaf;    /* its file could not be cleared: its size says nothing (let_go_if_wanted) */
    int64_t started_ms; /* no lock file, the pid alive (by_start): wall ms when the process
                         * with that pid started; 0 when unknown */
};

/* Wall-clock ms at which process pid started (field 22 of /proc/<pid>/stat: clock ticks
 * after boot, CLOCK_BOOTTIME), or 0 when it cannot be told. */
static int64_t proc_start_ms(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* after the command's ")" (the last one: a command may hold any byte), field 3 on */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return 0;
    p++;
    for (int field = 3; field <= 22; field++) {
        while (*p == ' ')
            p++;
        if (field == 22)
            break;
        while (*p && *p != ' ')
            p++;
    }
    char *end;
    unsigned long long ticks = strtoull(p, &end, 10);
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec wall, boot;
    if (end == p || hz <= 0 || clock_gettime(CLOCK_REALTIME, &wall) != 0 ||
        clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
        return 0;
    int64_t booted = ((int64_t)wall.tv_sec - boot.tv_sec) * 1000 +
                     ((int64_t)wall.tv_nsec - boot.tv_nsec) / 1000000;
    int64_t ms = booted + (int64_t)(ticks / (unsigned long long)hz) * 1000 +
                 (int64_t)(ticks % (unsigned long long)hz) * 1000 / hz;
    return ms > 0 ? ms : 0;
}

int esx_owner_locks(const esx_spool_owner *o)
{
    return o != NULL && !o->no_flock && o->fd >= 0;
}

static struct esx_owner_seen *seen(esx_owner_scan *s, int pid, size_t *at)
{
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->v[mid].pid < pid)
            lo = mid + 1;
        else
            hi = mid;
    }
    *at = lo;
    return lo < s->n && s->v[lo].pid == pid ? &s->v[lo] : NULL;
}

int esx_owner_dead(esx_owner_scan *s, const char *dir, int pid)
{
    size_t at;
    struct esx_owner_seen *v = seen(s, pid, &at);
    if (v)
        return v->dead;
    if (pid <= 0)
        return 0; /* (not a process's: kill(0 or -n) would ask about groups) */
    char path[600];
    snprintf(path, sizeof path, "%.500s/lock-%d", dir, pid);
    struct esx_owner_seen e = {.pid = pid, .fd = -1};
    /* (for writing too: a waiting process's byte in it is cleared when it is taken) */
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == EACCES)
        fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0) {
        /* no lock file: segments of an esx that made none, or of a file system without
         * flock -- the pid decides.  No descriptor or memory left: the next scan. */
        if (errno == EMFILE || errno == ENFILE || errno == ENOMEM)
            return 0;
        int gone = errno == ENOENT;
        e.dead = !pid_alive((pid_t)pid);
        if (!e.dead && gone && s->by_start)
            e.started_ms = proc_start_ms(pid); /* (esx_owner_reused) */
    } else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        e.dead = !pid_alive((pid_t)pid);
    } else if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        /* the owner is gone -- unless the file was removed meanwhile, by the claimer that
         * held it before us: a new process with the pid may own a new one (the next scan) */
        if (still_named(fd, path)) {
            /* a byte left by a process with the pid that waited for it (gone, or given the
             * lock since): cleared, so that one written from now on says one waits */
            if (st.st_size > 0 && ftruncate(fd, 0) != 0)
                e.deaf = 1;
            e.dead = 1;
            e.alive = pid_alive((pid_t)pid);
            e.fd = fd;
            fd = -1;
        }
    } else if (errno != EWOULDBLOCK && errno != EINTR && no_flock(errno)) {
        e.dead = !pid_alive((pid_t)pid);
    } /* else held: alive (or claimed by another process right now) */
    if (fd >= 0)
        close(fd);
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        void *nv = realloc(s->v, cap * sizeof *s->v);
        if (nv == NULL) {
            if (e.fd >= 0)
                close(e.fd);
            return 0; /* (undecided: the next scan) */
        }
        s->v = nv;
        s->cap = cap;
    }
    memmove(s->v + at + 1, s->v + at, (s->n - at) * sizeof *s->v);
    s->v[at] = e;
    s->n++;
    return e.dead;
}

/* Lets go of v's lock when a process with that pid waits for it (a byte in the file: see
 * wait_free), or when the file no longer bears its name (a new one could be locked by such
 * a process meanwhile).  1 when it did. */
static int let_go_if_wanted(const char *dir, struct esx_owner_seen *v)
{
    char path[600];
    struct stat st;
    snprintf(path, sizeof path, "%.500s/lock-%d", dir, v->pid);
    if (v->fd < 0 ||
        ((v->deaf || (fstat(v->fd, &st) == 0 && st.st_size == 0)) && still_named(v->fd, path)))
        return 0;
    close(v->fd);
    v->fd = -1;
    v->dead = 0; /* (none of its segments more: they may be the new process's) */
    v->yielded = 1;
    return 1;
}

int esx_owner_still(esx_owner_scan *s, const char *dir, int pid)
{
    size_t at;
    struct esx_owner_seen *v = seen(s, pid, &at);
    if (v == NULL)
        return 1;
    if (v->yielded)
        return 0;
    return !let_go_if_wanted(dir, v);
}

void esx_owner_yield(esx_owner_scan *s, const char *dir)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    int64_t ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    if (ms - s->checked_ms < ESX_OWNER_YIELD_MS)
        return;
    s->checked_ms = ms;
    for (size_t i = 0; i < s->n; i++)
        let_go_if_wanted(dir, &s->v[i]);
}

int esx_owner_reused(esx_owner_scan *s, int pid, const struct stat *st)
{
    size_t at;
    struct esx_owner_seen *v = seen(s, pid, &at);
    if (v == NULL || v->dead || v->started_ms == 0)
        return 0;
    int64_t written = (int64_t)st->st_mtim.tv_sec * 1000 + st->st_mtim.tv_nsec / 1000000;
    return v->started_ms > written + ESX_OWNER_START_SLACK_MS;
}

void esx_owner_count(esx_owner_scan *s, int pid, int left, int claimed)
{
    size_t at;
    struct esx_owner_seen *v = seen(s, pid, &at);
    if (v) {
        v->left += left;
        v->claimed += claimed;
    }
}

void esx_owner_scan_end(esx_owner_scan *s, const char *dir, int complete)
{
    for (size_t i = 0; i < s->n; i++) {
        struct esx_owner_seen *v = &s->v[i];
        if (v->yielded && v->claimed > 0)
            fprintf(stderr, "esx.collector: claimed %d spool segment(s) of process %d in %s: it no "
                            "longer held its lock there; a new process with that pid took it "
                            "meanwhile, and claims the rest\n", v->claimed, v->pid, dir);
        if (v->fd < 0 && v->started_ms > 0 && v->claimed > 0)
            fprintf(stderr, "esx.collector: claimed %d spool segment(s) of process %d in %s "
                            "without a lock file: the process that has that pid now started "
                            "after they were last written\n", v->claimed, v->pid, dir);
        if (v->fd < 0)
            continue;
        char path[600];
        snprintf(path, sizeof path, "%.500s/lock-%d", dir, v->pid);
        if (v->claimed > 0 && v->alive)
            fprintf(stderr, "esx.collector: claimed %d spool segment(s) of process %d in %s: it no "
                            "longer holds its lock there (a process with that pid is not the "
                            "one that wrote them, or closed its collector)\n",
                    v->claimed, v->pid, dir);
        /* nothing of it left: its file goes (while locked: no process with the pid can
         * have taken it, and one waiting for it makes a new one) */
        if (complete && v->left == 0 && still_named(v->fd, path))
            unlink(path);
        close(v->fd);
    }
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

int esx_owner_name(const char *name, int *pid)
{
    char tail[2];
    return sscanf(name, "lock-%d%1s", pid, tail) == 1 && *pid > 0;
}
