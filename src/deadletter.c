/*
 * deadletter.c -- the dead-letter file (see deadletter.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "deadletter.h"
#include "private.h"

int esx_dead_letters_init(esx_dead_letters *dl)
{
    dl->fd = -1;
    dl->torn = 0;
    dl->path[0] = '\0';
    atomic_store(&dl->no_wait, 0);
    return pthread_mutex_init(&dl->mu, NULL) == 0 ? 0 : -1;
}

int esx_dead_letters_open(esx_dead_letters *dl, const char *path)
{
    dl->torn = 0;
    snprintf(dl->path, sizeof dl->path, "%s", path);
    /* not a link, nor a file another user made: it would receive the events (or have them
     * read) -- /tmp is the default's directory */
    dl->fd = esx_private_append(path);
    return dl->fd >= 0 ? 0 : -1;
}

void esx_dead_letters_close(esx_dead_letters *dl)
{
    if (dl->fd >= 0)
        close(dl->fd);
    dl->fd = -1;
}

void esx_dead_letters_free(esx_dead_letters *dl)
{
    esx_dead_letters_close(dl);
    pthread_mutex_destroy(&dl->mu);
}

void esx_dead_letters_stop_waiting(esx_dead_letters *dl)
{
    atomic_store(&dl->no_wait, 1);
}

/* Takes the file's lock without waiting for it.  Returns 1 when it holds the lock, 0 when
 * the line is to be written without it (the wait was called off, or a file that cannot be
 * locked: a device), -1 when another process holds it: the caller tries again later (a
 * process that holds it for good -- hung, or stopped -- must not hold up the writer's
 * thread, and the shipping and spool syncs it also does). */
static int lock_file(esx_dead_letters *dl)
{
    for (;;) {
        if (flock(dl->fd, LOCK_EX | LOCK_NB) == 0)
            return 1;
        if (errno == EINTR)
            continue;
        if (errno != EWOULDBLOCK || atomic_load(&dl->no_wait))
            return 0;
        return -1;
    }
}

static size_t json_escape(char *out, size_t cap, const char *s)
{
    size_t o = 0;
    for (; *s && o + 7 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
        } else {
            out[o++] = (char)c;
        }
    }
    out[o] = '\0';
    return o;
}

esx_dead_letter *esx_dead_letter_new(int64_t failed_at_ms, int status, const char *type,
                                     const char *reason, const char *op, size_t op_len)
{
    char t[160], r[400];
    json_escape(t, sizeof t, type);
    json_escape(r, sizeof r, reason);
    /* op is "<action>\n<doc>\n": both lines are JSON already */
    const char *nl = memchr(op, '\n', op_len);
    size_t alen = nl ? (size_t)(nl - op) : op_len;
    size_t dlen = nl && op_len - alen >= 2 ? op_len - alen - 2 : 0;
    char head[800];
    int n = snprintf(head, sizeof head,
                     "{\"failed_at\":%lld,\"status\":%d,\"error\":{\"type\":\"%s\",\"reason\":\"%s\"},"
                     "\"operation\":",
                     (long long)failed_at_ms, status, t, r);
    size_t total = 1 + (size_t)n + alen + 12 + (dlen ? dlen : 4) + 2;
    esx_dead_letter *l = malloc(sizeof *l + total);
    if (l == NULL)
        return NULL;
    char *line = l->line;
    size_t o = 0;
    line[o++] = '\n'; /* written before the line only after a fragment (see the write) */
    memcpy(line + o, head, (size_t)n);
    o += (size_t)n;
    memcpy(line + o, op, alen);
    o += alen;
    memcpy(line + o, ",\"document\":", 12);
    o += 12;
    if (dlen) {
        memcpy(line + o, nl + 1, dlen);
        o += dlen;
    } else {
        memcpy(line + o, "null", 4);
        o += 4;
    }
    line[o++] = '}';
    line[o++] = '\n';
    l->next = NULL;
    l->ud = NULL;
    l->len = o - 1;
    return l;
}

/* 1 when the file ends in a fragment without its newline: a write the disk cut short, by
 * this process or by another one appending to the same file (nginx workers, a process that
 * died mid-write).  Read before every line, not remembered: the other writers' fragments are
 * not this process's to know of.  A file opened write-only (a mode that lets this user append
 * but not read) cannot be looked at: then only this process's own short writes are known. */
static int torn(esx_dead_letters *dl)
{
    struct stat st;
    char last;
    if ((fcntl(dl->fd, F_GETFL) & O_ACCMODE) != O_RDWR)
        return dl->torn;
    return fstat(dl->fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
           pread(dl->fd, &last, 1, st.st_size - 1) == 1 && last != '\n';
}

/* The file's name was removed (a /tmp cleaner took the default file, not written for days,
 * or a hand made room): a line written to it now is seen by no one, yet counted as written.
 * The path is opened again (made anew, with the same checks).  Returns 0 when dl->fd is a
 * file that has a name (or a device), -1 when it could not be opened again: the line
 * cannot be kept, and is counted as not written. */
static int reopen_removed(esx_dead_letters *dl)
{
    struct stat st;
    if (fstat(dl->fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink > 0)
        return 0;
    if (!dl->path[0])
        return -1;
    int fd = esx_private_append(dl->path);
    if (fd < 0)
        return -1;
    close(dl->fd);
    dl->fd = fd;
    dl->torn = 0;
    return 0;
}

int esx_dead_letter_write(esx_dead_letters *dl, const esx_dead_letter *l)
{
    pthread_mutex_lock(&dl->mu);
    if (dl->fd < 0 || reopen_removed(dl) != 0) {
        pthread_mutex_unlock(&dl->mu);
        return -1;
    }
    /* Other esx processes appending to the file take the same lock, so no fragment can appear
     * between the look and the write.  A file that cannot be locked (a device) is written
     * without, and so is every line once the wait is called off (close). */
    int locked = lock_file(dl);
    if (locked < 0) {
        pthread_mutex_unlock(&dl->mu);
        return 1;
    }
    /* after a fragment, the newline that ends it goes in the same write as the line */
    size_t skip = torn(dl) ? 0 : 1, len = l->len + 1 - skip;
    /* bounded: what Elasticsearch refuses is the client's to choose (a field typed one way,
     * then sent the other), and browsers could fill the disk at the intake's rate */
    struct stat st;
    ssize_t w = -1;
    if (dl->max_bytes <= 0 || fstat(dl->fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size + (int64_t)len <= dl->max_bytes)
        w = write(dl->fd, l->line + skip, len); /* O_APPEND: one line per write */
    if (locked)
        flock(dl->fd, LOCK_UN);
    if (w == (ssize_t)len)
        dl->torn = 0;
    else if (w > 0)
        dl->torn = 1; /* a fragment without its newline is in the file */
    pthread_mutex_unlock(&dl->mu);
    return w == (ssize_t)len ? 0 : -1;
}
