/*
 * spool.c -- write-ahead segments and replay (see spool.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "spool.h"

#define MAX_RECORD (64u << 20)

static int mkdirs(const char *dir)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", dir);
    for (char *p = tmp + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            if (mkdir(tmp, 0700) != 0 && errno != EEXIST)
                return -1;
            *p = '/';
        }
    }
    return (mkdir(tmp, 0700) != 0 && errno != EEXIST) ? -1 : 0;
}

esx_spool *esx_spool_open(const char *dir, size_t max_segment_bytes, char *why)
{
    if (strlen(dir) >= sizeof(((esx_spool *)0)->dir) - 64) {
        snprintf(why, 256, "spool_dir is too long");
        return NULL;
    }
    if (mkdirs(dir) != 0) {
        snprintf(why, 256, "cannot create spool_dir %.150s: %.60s", dir, strerror(errno));
        return NULL;
    }
    esx_spool *sp = calloc(1, sizeof *sp);
    if (sp == NULL) {
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    snprintf(sp->dir, sizeof sp->dir, "%s", dir);
    sp->pid = getpid();
    sp->max_segment_bytes = max_segment_bytes;
    return sp;
}

static void unlink_segment(esx_spool *sp, esx_segment *seg)
{
    for (esx_segment **p = &sp->segments; *p; p = &(*p)->next) {
        if (*p == seg) {
            *p = seg->next;
            break;
        }
    }
    if (seg->fd >= 0)
        close(seg->fd);
    if (sp->bytes_on_disk >= seg->bytes)
        sp->bytes_on_disk -= seg->bytes;
    unlink(seg->path);
    if (sp->current == seg)
        sp->current = NULL;
    free(seg);
}

static void seal(esx_spool *sp, esx_segment *seg)
{
    if (seg->fd >= 0) {
        fdatasync(seg->fd);
        close(seg->fd);
        seg->fd = -1;
    }
    seg->sealed = 1;
    if (sp->current == seg)
        sp->current = NULL;
    if (seg->pending == 0)
        unlink_segment(sp, seg);
}

static esx_segment *new_segment(esx_spool *sp, char *why)
{
    esx_segment *seg = calloc(1, sizeof *seg);
    if (seg == NULL) {
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    snprintf(seg->path, sizeof seg->path, "%s/seg-%d-%llu.log", sp->dir, (int)sp->pid,
             (unsigned long long)++sp->seq);
    seg->fd = open(seg->path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (seg->fd < 0) {
        snprintf(why, 256, "cannot create %.150s: %.80s", seg->path, strerror(errno));
        free(seg);
        return NULL;
    }
    seg->next = sp->segments;
    sp->segments = seg;
    return seg;
}

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int esx_spool_append(esx_spool *sp, const char *data, size_t len, esx_segment **out, char *why)
{
    if (len == 0 || len > MAX_RECORD) {
        snprintf(why, 256, "spool record of %zu bytes", len);
        return -1;
    }
    if (sp->current && sp->current->bytes >= sp->max_segment_bytes)
        seal(sp, sp->current);
    if (sp->current == NULL && (sp->current = new_segment(sp, why)) == NULL)
        return -1;
    esx_segment *seg = sp->current;
    unsigned char head[8];
    uint32_t n = (uint32_t)len;
    uint32_t crc = (uint32_t)crc32(0L, (const Bytef *)data, (uInt)len);
    memcpy(head, &n, 4);
    memcpy(head + 4, &crc, 4);
    /* one writev-sized record: header then payload; a cut-short write is a torn record */
    char *rec = malloc(len + 8);
    if (rec == NULL) {
        snprintf(why, 256, "out of memory");
        return -1;
    }
    memcpy(rec, head, 8);
    memcpy(rec + 8, data, len);
    int rc = write_all(seg->fd, rec, len + 8);
    free(rec);
    if (rc != 0) {
        snprintf(why, 256, "cannot write the spool: %s", strerror(errno));
        /* the segment may now end in a torn record: start a new one */
        seal(sp, seg);
        return -1;
    }
    seg->bytes += len + 8;
    sp->bytes_on_disk += len + 8;
    sp->dirty = 1;
    sp->records_written++;
    *out = seg;
    return 0;
}

void esx_spool_sync(esx_spool *sp)
{
    if (sp->dirty && sp->current && sp->current->fd >= 0)
        fdatasync(sp->current->fd);
    sp->dirty = 0;
}

void esx_spool_release(esx_spool *sp, esx_segment *seg, int64_t n)
{
    seg->pending -= n;
    if (seg->pending <= 0) {
        /* Everything in it is acknowledged: delete it, the current one included (the next
         * append starts a new segment), so a replay never re-sends acknowledged events. */
        seg->pending = 0;
        unlink_segment(sp, seg);
    }
}

static int pid_alive(pid_t pid)
{
    return kill(pid, 0) == 0 || errno == EPERM;
}

/* Replays one claimed segment file.  Returns records replayed, or -1 when fn stopped. */
static int replay(esx_spool *sp, esx_segment *seg,
                  int64_t (*fn)(void *, esx_segment *, const char *, size_t), void *ud)
{
    int fd = open(seg->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    int records = 0;
    char *buf = NULL;
    for (;;) {
        unsigned char head[8];
        ssize_t r = read(fd, head, 8);
        if (r != 8)
            break;
        uint32_t n, crc;
        memcpy(&n, head, 4);
        memcpy(&crc, head + 4, 4);
        if (n == 0 || n > MAX_RECORD)
            break;
        char *b = realloc(buf, n);
        if (b == NULL)
            break;
        buf = b;
        size_t got = 0;
        while (got < n) {
            ssize_t k = read(fd, buf + got, n - got);
            if (k <= 0)
                break;
            got += (size_t)k;
        }
        if (got != n || (uint32_t)crc32(0L, (const Bytef *)buf, (uInt)n) != crc)
            break; /* torn or corrupt: the rest was never acknowledged */
        int64_t taken = fn(ud, seg, buf, n);
        if (taken < 0) {
            records = -1;
            break;
        }
        seg->pending += taken;
        seg->bytes += n + 8;
        records++;
    }
    free(buf);
    close(fd);
    return records;
}

int esx_spool_claim_orphans(esx_spool *sp,
                            int64_t (*fn)(void *ud, esx_segment *seg, const char *data,
                                          size_t len),
                            void *ud)
{
    DIR *d = opendir(sp->dir);
    if (d == NULL)
        return 0;
    int total = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int pid;
        unsigned long long seq;
        char tail[8];
        if (sscanf(de->d_name, "seg-%d-%llu%7s", &pid, &seq, tail) != 3 || strcmp(tail, ".log"))
            continue;
        if (pid == (int)sp->pid || pid_alive((pid_t)pid))
            continue;
        esx_segment *seg = calloc(1, sizeof *seg);
        if (seg == NULL)
            break;
        char from[600];
        snprintf(from, sizeof from, "%.500s/%.90s", sp->dir, de->d_name);
        snprintf(seg->path, sizeof seg->path, "%s/seg-%d-%llu.log", sp->dir, (int)sp->pid,
                 (unsigned long long)++sp->seq);
        if (rename(from, seg->path) != 0) { /* another process claimed it first */
            free(seg);
            continue;
        }
        seg->fd = -1;
        seg->sealed = 1;
        seg->next = sp->segments;
        sp->segments = seg;
        int n = replay(sp, seg, fn, ud);
        sp->bytes_on_disk += seg->bytes;
        if (n < 0)
            break; /* the caller is full: the segment stays ours, pending what was taken */
        total += n;
        sp->records_replayed += (uint64_t)n;
        if (seg->pending == 0)
            unlink_segment(sp, seg);
    }
    closedir(d);
    return total;
}

void esx_spool_close(esx_spool *sp)
{
    if (sp == NULL)
        return;
    esx_segment *seg = sp->segments;
    while (seg) {
        esx_segment *next = seg->next;
        if (seg->fd >= 0) {
            fdatasync(seg->fd);
            close(seg->fd);
        }
        if (seg->pending == 0)
            unlink(seg->path);
        free(seg);
        seg = next;
    }
    free(sp);
}

void esx_spool_forget(esx_spool *sp)
{
    if (sp == NULL)
        return;
    /* our copies of the parent's descriptors and memory: close and free, never unlink */
    esx_segment *seg = sp->segments;
    while (seg) {
        esx_segment *next = seg->next;
        if (seg->fd >= 0)
            close(seg->fd);
        free(seg);
        seg = next;
    }
    free(sp);
}
