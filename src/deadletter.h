/*
 * deadletter.h -- the dead-letter file: one JSON line per event Elasticsearch rejected for
 * good, with the status, the error and the operation.  Lines are made under the collector's
 * lock (memory only) and written without it, by the shipper: a slow or hung filesystem, or
 * another process holding the file's lock, delays the writer, never the intake.
 */
#ifndef ESX_DEADLETTER_H
#define ESX_DEADLETTER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct esx_dead_letters {
    int fd;                  /* -1: none (no path, or it could not be opened) */
    int torn;                /* fd is write-only: this process's last line was cut short */
    int64_t max_bytes;       /* a regular file grows to this size at most (0: no bound) */
    char path[512];          /* what was opened, to open again once it is removed */
    pthread_mutex_t mu;      /* one writer at a time in this process (flock is per file) */
    atomic_int no_wait;      /* set by esx_dead_letters_stop_waiting */
} esx_dead_letters;

/* One line waiting to be written; `ud` is the caller's (the queued event it stands for). */
typedef struct esx_dead_letter {
    struct esx_dead_letter *next;
    void *ud;
    size_t len;              /* of the line, which starts at line + 1 */
    char line[];             /* '\n' (to end a fragment the file may end in), then the line */
} esx_dead_letter;

/* Makes dl a writer with no file (also in a forked child, over the parent's copy: its lock
 * is made anew -- close the inherited file first).  Returns 0, or -1 when the lock cannot be
 * made. */
int esx_dead_letters_init(esx_dead_letters *dl);

/* Opens path with esx_private_append's checks.  Returns 0, or -1 with errno set (dl has no
 * file then: every write fails).  A file removed later (a /tmp cleaner, a hand making room)
 * is made again by the next write: lines written into a removed file are lost to everyone. */
int esx_dead_letters_open(esx_dead_letters *dl, const char *path);

/* Closes the file, if any (the lock stays, for a later open). */
void esx_dead_letters_close(esx_dead_letters *dl);

/* Closes the file and destroys the lock. */
void esx_dead_letters_free(esx_dead_letters *dl);

/* Calls off the lock for every later write while another process holds it: they write
 * without it (O_APPEND keeps each line whole; only the mending of another writer's fragment
 * may then race).  For the collector's close: a process that holds the lock and never lets
 * go (hung, or stopped) must not hold the close up.  Never fails. */
void esx_dead_letters_stop_waiting(esx_dead_letters *dl);

/* The line for one bulk item `op` ("<action>\n<document>\n", as queued) rejected with status,
 * error type and reason (escaped here; NUL-terminated).  Returns a malloc'd letter the caller
 * owns (free()), or NULL when out of memory. */
esx_dead_letter *esx_dead_letter_new(int64_t failed_at_ms, int status, const char *type,
                                     const char *reason, const char *op, size_t op_len);

/* Appends the letter's line, as one write, under the file's flock (so that the look at the
 * file's end -- a fragment another writer's short write left is ended first -- and the write
 * are one step for every esx process).  May block on the file's I/O (never on the lock: it
 * is not waited for): call it without locks others wait on.  Returns 0 when the whole line
 * is in the file, 1 when another process holds the file's lock (nothing written: try again
 * later; after esx_dead_letters_stop_waiting the line is written without the lock instead),
 * -1 when it is not (no file, the file at max_bytes, disk full, I/O error). */
int esx_dead_letter_write(esx_dead_letters *dl, const esx_dead_letter *l);

#endif
