/*
 * engine_waiters.c -- the unix socket nginx waiters wait on (esx.nginx.wait): its path, the
 * connections on it, each naming a request by id, and waking them when that request ends.
 * esx_engine_waiter_path runs on any thread; the rest on the I/O thread, or after it was
 * joined (engine_int.h).  And the removal of the waiter directories killed processes left.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "clock.h"
#include "engine_int.h"
#include "proc.h"

#define MAX_WAITER_CONNS 4096

/* Wakes one waiter connection (it reads the byte and checks the request) and closes it. */
static void poke_fd(int fd)
{
    ssize_t w = write(fd, "1", 1);
    (void)w; /* a waiter that went away needs no wake-up */
    close(fd);
}

/* Wakes every waiter of a finished request. */
void esx_eng_poke_watchers(esx_request *req)
{
    for (int i = 0; i < req->nwatchers; i++)
        poke_fd(req->watchers[i]);
    req->nwatchers = 0;
}

/* Adds waiter connection fd to unfinished req.  Waiters that went away (a timed-out await:
 * the peer closed, so the fd polls readable) are dropped first.  Every live waiter is kept:
 * waking one early would have it register again and wake the next, in a loop that lasts as
 * long as the request (the process's descriptor limit bounds them).  Without memory for one
 * more, the new waiter is woken at once (it finds the request unfinished and comes back). */
static void add_watcher(esx_request *req, int fd)
{
    int n = req->nwatchers;
    struct pollfd small[16];
    struct pollfd *pfd = n <= 16 ? small : malloc((size_t)n * sizeof *pfd);
    if (n > 0 && pfd != NULL) {
        for (int i = 0; i < n; i++)
            pfd[i] = (struct pollfd){.fd = req->watchers[i], .events = POLLIN};
        if (poll(pfd, (nfds_t)n, 0) > 0) {
            int kept = 0;
            for (int i = 0; i < n; i++) {
                if (pfd[i].revents)
                    close(req->watchers[i]); /* a waiter sends nothing more: this is its end */
                else
                    req->watchers[kept++] = req->watchers[i];
            }
            req->nwatchers = kept;
        }
    }
    if (pfd != small)
        free(pfd);
    if (req->nwatchers == req->watchers_cap) {
        int cap = req->watchers_cap ? req->watchers_cap * 2 : 4;
        int *w = realloc(req->watchers, (size_t)cap * sizeof *w);
        if (w == NULL) {
            poke_fd(fd);
            return;
        }
        req->watchers = w;
        req->watchers_cap = cap;
    }
    req->watchers[req->nwatchers++] = fd;
}

static esx_request *find_live(esx_engine *e, uint64_t id)
{
    for (esx_request *r = e->wait_head; r; r = r->next)
        if (r->id == id)
            return r;
    for (esx_request *r = e->active; r; r = r->next)
        if (r->id == id)
            return r;
    for (esx_request *r = e->backoff; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

void esx_eng_accept_waiters(esx_engine *e)
{
    int lfd = atomic_load(&e->listen_fd);
    for (;;) {
        int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                /* out of descriptors or memory: the connection stays in the backlog and the
                 * socket stays readable -- polled at once, it would spin the thread; the
                 * waiter retries its connect meanwhile (esx.nginx) */
                e->accept_paused_until = esx_now_ms() + ACCEPT_PAUSE_MS;
            return;
        }
        if (e->nconns == e->capconns) {
            int cap = e->capconns ? e->capconns * 2 : 16;
            waiter_conn *c = cap <= MAX_WAITER_CONNS ? realloc(e->conns, (size_t)cap * sizeof *c)
                                                     : NULL;
            if (c == NULL) {
                /* cannot track it: wake it at once, the waiter re-checks and retries */
                ssize_t w = write(fd, "1", 1);
                (void)w;
                close(fd);
                continue;
            }
            e->conns = c;
            e->capconns = cap;
        }
        e->conns[e->nconns++] = (waiter_conn){.fd = fd, .len = 0};
    }
}

void esx_eng_read_waiter(esx_engine *e, int i)
{
    waiter_conn *c = &e->conns[i];
    ssize_t n = read(c->fd, c->buf + c->len, sizeof c->buf - 1 - (size_t)c->len);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    int drop = n <= 0;
    if (n > 0) {
        c->len += (int)n;
        c->buf[c->len] = '\0';
        char *nl = strchr(c->buf, '\n');
        if (nl) {
            uint64_t id = strtoull(c->buf, NULL, 10);
            esx_request *req = find_live(e, id);
            if (req == NULL) {
                /* a waiter often registers before the loop has taken its request in */
                esx_eng_take_submissions(e, esx_now_ms());
                req = find_live(e, id);
            }
            if (req) {
                add_watcher(req, c->fd);
            } else {
                ssize_t w = write(c->fd, "1", 1); /* done already (or unknown) */
                (void)w;
                close(c->fd);
            }
            c->fd = -1;
        } else if (c->len >= (int)sizeof c->buf - 1) {
            drop = 1;
        }
    }
    if (drop && c->fd >= 0) {
        close(c->fd);
        c->fd = -1;
    }
    if (c->fd < 0)
        e->conns[i] = e->conns[--e->nconns];
}

/* ---- the directories of dead processes ---------------------------------------------
 * A process killed by SIGKILL (an nginx worker killed by the OOM killer, or by hand) cannot
 * remove its waiter socket's directory: without this, every such death left one more in
 * TMPDIR for good.  A directory is taken for a dead process's only when the kernel says so:
 * its WAITER_SOCKET refuses a connection -- no socket listens on that file any more, and
 * none ever will again (a closed listening socket does not come back, and esx names its
 * socket WAITER_SOCKET only once it listens: never in the moment between bind and listen).
 * A socket that still listens (its process alive, or a forked child that inherited it and
 * has not let it go yet) accepts or, its backlog full, says EAGAIN: left.  Only directories
 * named as mkdtemp names them, owned by this user, that hold that socket and nothing else. */

static atomic_int swept_for; /* the process (pid) whose waiter directories were swept */

/* 1 when name is one that esx_engine_waiter_path's mkdtemp makes: "esx-" and six letters or
 * digits. */
static int waiter_dir_name(const char *name)
{
    if (strncmp(name, "esx-", 4) != 0 || strlen(name) != 10)
        return 0;
    for (int i = 4; i < 10; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return 0;
    }
    return 1;
}

/* 1 when the directory open at dfd holds WAITER_SOCKET, a socket of uid, and nothing else. */
static int only_socket(int dfd, uid_t uid)
{
    struct stat st;
    if (fstatat(dfd, WAITER_SOCKET, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISSOCK(st.st_mode) ||
        st.st_uid != uid)
        return 0;
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    int only = 1;
    struct dirent *de;
    while (only && (de = readdir(d)) != NULL)
        only = strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
               strcmp(de->d_name, WAITER_SOCKET) == 0;
    closedir(d);
    return only;
}

/* 1 when a connection to the unix socket at path is refused: no socket listens there. */
static int refused(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    size_t len = strlen(path);
    if (len >= sizeof addr.sun_path)
        return 0;
    memcpy(addr.sun_path, path, len + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int rc = connect(fd, (struct sockaddr *)&addr, sizeof addr);
    int err = errno;
    close(fd); /* (a live one's I/O thread reads the end of it, and drops it) */
    return rc != 0 && err == ECONNREFUSED;
}

void esx_eng_sweep_waiters(esx_engine *e)
{
    char tmp[sizeof e->sweep_dir];
    pthread_mutex_lock(&e->mu);
    memcpy(tmp, e->sweep_dir, sizeof tmp);
    atomic_store(&e->sweep_due, 0);
    pthread_mutex_unlock(&e->mu);
    DIR *d = opendir(tmp);
    if (d == NULL)
        return;
    uid_t uid = geteuid();
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!waiter_dir_name(de->d_name))
            continue;
        int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0)
            continue;
        struct stat st;
        char path[sizeof tmp + 32];
        int n = snprintf(path, sizeof path, "%s/%s/%s", tmp, de->d_name, WAITER_SOCKET);
        if (n > 0 && (size_t)n < sizeof path && fstat(sub, &st) == 0 && st.st_uid == uid && only_socket(sub, uid) && refused(path) &&
            unlinkat(sub, WAITER_SOCKET, 0) == 0)
            unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR);
        close(sub);
    }
    closedir(d);
}

/* Whether the socket file at e->listen_path is still the one e listens on.  Something may
 * have removed it -- a /tmp cleaner, an `rm -rf` of /tmp, its directory made unreadable -- and
 * no waiter could connect again for the life of the engine: each wait failed with
 * `internal` after a second of retries. */
static int path_is_ours(const esx_engine *e)
{
    struct stat st;
    return stat(e->listen_path, &st) == 0 && st.st_dev == e->path_dev &&
           st.st_ino == e->path_ino;
}

/* Called by the owner's threads one at a time (esx_client_waiter_path holds the client's
 * lock), so listen_path is not rewritten while another caller reads it. */
const char *esx_engine_waiter_path(esx_engine *e, char *why)
{
    if (atomic_load(&e->listen_fd) >= 0 && path_is_ours(e))
        return e->listen_path; /* written before listen_fd was published */
    /* Under the lock: two threads creating it at once would each unlink the other's socket
     * file, and the one that won could be listening on a path that no longer exists. */
    pthread_mutex_lock(&e->mu);
    int old = atomic_load(&e->listen_fd);
    if (old >= 0 && (path_is_ours(e) || atomic_load(&e->stale_listen_fd) >= 0)) {
        /* (a socket replaced a moment ago whose old one the I/O thread has not closed yet:
         * the next call replaces it if it is gone too) */
        pthread_mutex_unlock(&e->mu);
        return e->listen_path;
    }
    /* In a directory of its own (mkdtemp: mode 0700, a name no one can guess or take
     * first): only this user can connect, and another user cannot block the path. */
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0' || strlen(tmp) > 60) /* ("TMPDIR=": /esx-XXXXXX) */
        tmp = "/tmp";
    char dir[80];
    snprintf(dir, sizeof dir, "%s/esx-XXXXXX", tmp);
    if (mkdtemp(dir) == NULL) {
        snprintf(why, 256, "cannot create the waiter socket's directory: %s", strerror(errno));
        goto fail;
    }
    /* bound as WAITER_SOCKET_NEW, and named WAITER_SOCKET only once it listens: a
     * WAITER_SOCKET that refuses a connection is a dead socket's (esx_eng_sweep_waiters) */
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%s", dir, WAITER_SOCKET_NEW); /* fits */
    char path[sizeof addr.sun_path];
    snprintf(path, sizeof path, "%s/%s", dir, WAITER_SOCKET);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, 256, "cannot create the waiter socket: %s", strerror(errno));
        rmdir(dir);
        goto fail;
    }
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 512) != 0 ||
        rename(addr.sun_path, path) != 0) {
        snprintf(why, 256, "cannot listen on %s: %s", path, strerror(errno));
        close(fd);
        unlink(addr.sun_path);
        rmdir(dir);
        goto fail;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(why, 256, "cannot stat %s: %s", path, strerror(errno));
        close(fd);
        unlink(path);
        rmdir(dir);
        goto fail;
    }
    e->path_dev = st.st_dev;
    e->path_ino = st.st_ino;
    if (old >= 0) {
        /* the old file is gone (or is not ours: left alone): the I/O thread, which polls
         * the old socket, closes it; its directory is removed if it is there and empty */
        char *slash = strrchr(e->listen_path, '/');
        if (slash) {
            *slash = '\0';
            rmdir(e->listen_path);
        }
        atomic_store(&e->stale_listen_fd, old);
    }
    memcpy(e->listen_path, path, sizeof e->listen_path);
    if (fstat(fd, &st) == 0) { /* (else an abandon in a forked child leaves it open) */
        e->listen_dev = st.st_dev;
        e->listen_ino = st.st_ino;
    }
    atomic_store(&e->listen_fd, fd);
    /* the first waiter socket of this process: the directories that killed processes left
     * beside it are removed, on the I/O thread (the caller may be an nginx worker's event
     * loop); a worker that replaces a killed one removes that one's */
    int pid = (int)esx_pid();
    if (atomic_exchange(&swept_for, pid) != pid) {
        snprintf(e->sweep_dir, sizeof e->sweep_dir, "%s", tmp);
        atomic_store(&e->sweep_due, 1);
    }
    pthread_mutex_unlock(&e->mu);
    curl_multi_wakeup(e->multi);
    return e->listen_path;
fail:
    pthread_mutex_unlock(&e->mu);
    return NULL;
}
