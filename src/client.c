/*
 * client.c -- settings, request preparation and self-healing (see client.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "client.h"
#include "clock.h"
#include "proc.h"

#define WAIT_SLICE_MS 100

/* Serialises the re-initialisation below: in a child, the Lua thread and a collector's
 * shipper (started there) may both make the first use.  Taken around fork() so that the
 * child never inherits it held. */
static pthread_mutex_t adopt_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t adopt_once = PTHREAD_ONCE_INIT;

static void adopt_prepare(void)
{
    pthread_mutex_lock(&adopt_mu);
}

static void adopt_release(void)
{
    pthread_mutex_unlock(&adopt_mu);
}

static void adopt_install(void)
{
    pthread_atfork(adopt_prepare, adopt_release, adopt_release);
}

/* Takes the client lock.  In a forked child the lock may have been held by a thread of the
 * parent that does not exist here: the first use in the child re-initialises it, once -- a
 * second thread that also saw the parent's pid re-initialised the lock the first one held,
 * and both built an engine.  c->pid is stored after the lock is made (release), so a thread
 * that reads this process's pid (acquire) finds the lock ready. */
static void client_lock(esx_client *c)
{
    if (atomic_load(&c->pid) != esx_pid()) {
        pthread_mutex_lock(&adopt_mu);
        if (atomic_load(&c->pid) != esx_pid()) {
            pthread_mutex_init(&c->mu, NULL);
            atomic_store(&c->pid, esx_pid());
        }
        pthread_mutex_unlock(&adopt_mu);
    }
    pthread_mutex_lock(&c->mu);
}

static void curl_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* libcurl's global set-up, once per process, finished before any client goes on (a flag
 * alone let a second thread go on while the first was still in curl_global_init). */
static void global_init(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, curl_init);
}

esx_client *esx_client_new(esx_config *cfg, char *why)
{
    global_init();
    esx_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        esx_config_free(cfg);
        snprintf(why, 256, "out of memory");
        return NULL;
    }
    c->cfg = *cfg;
    c->engine = esx_engine_new(&c->cfg, NULL, why);
    if (c->engine == NULL) {
        esx_config_free(&c->cfg);
        free(c);
        return NULL;
    }
    c->fork_gen = esx_engine_generation(c->engine);
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->mu, NULL);
    pthread_once(&adopt_once, adopt_install);
    atomic_init(&c->pid, esx_pid());
    return c;
}

void esx_client_ref(esx_client *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void esx_client_close(esx_client *c)
{
    client_lock(c);
    esx_engine *e = c->closed ? NULL : c->engine;
    c->closed = 1;
    c->engine = NULL;
    if (e != NULL && !esx_engine_ours(e))
        /* a forked child closing before its first call: the parent's requests it holds
         * will never finish here, so fail_orphan must take them for orphans */
        c->fork_gen = esx_engine_generation(e) + 1;
    pthread_mutex_unlock(&c->mu);
    if (e == NULL)
        return;
    if (esx_engine_ours(e))
        esx_engine_free(e);
    else
        esx_engine_abandon(e); /* the parent's: never join or free it here */
}

int esx_client_closed(esx_client *c)
{
    return atomic_load(&c->closed);
}

void esx_client_unref(esx_client *c)
{
    if (c == NULL || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    esx_client_close(c);
    esx_config_free(&c->cfg);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int heal_locked(esx_client *c, char *why)
{
    esx_engine *old = c->engine;
    if (c->closed || old == NULL || esx_engine_healthy(old))
        return 0;
    esx_engine *e = esx_engine_new(&c->cfg, old, why);
    if (e == NULL)
        return -1;
    if (!esx_engine_ours(old)) {
        /* forked: the parent's requests stay the parent's */
        esx_engine_abandon(old);
        c->fork_gen = esx_engine_generation(e);
    } else {
        esx_engine_salvage(old, e);
    }
    c->engine = e;
    return 0;
}

int esx_client_heal(esx_client *c, char *why)
{
    client_lock(c);
    int rc = heal_locked(c, why);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int append_header(struct curl_slist **list, const char *line)
{
    struct curl_slist *l = curl_slist_append(*list, line);
    if (l == NULL)
        return -1;
    *list = l;
    return 0;
}

/* 1 when one of the n header lines ("Name: value") is named name (any case) */
static int names_header(const char *const *lines, int n, const char *name)
{
    size_t len = strlen(name);
    for (int i = 0; i < n; i++)
        if (strncasecmp(lines[i], name, len) == 0 && lines[i][len] == ':')
            return 1;
    return 0;
}

/* dst = a followed by b, cut to cap - 1 bytes and NUL-terminated (what snprintf "%s%s" would
 * give, for a tenth of its instructions: this runs for every request). */
static void join(char *dst, size_t cap, const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > cap - 1)
        la = cap - 1;
    if (lb > cap - 1 - la)
        lb = cap - 1 - la;
    memcpy(dst, a, la);
    memcpy(dst + la, b, lb);
    dst[la + lb] = '\0';
}

/* A copy of target with every byte that is not ASCII percent-encoded (a request target is
 * ASCII, RFC 9112 3.2): libcurl did so in the path only, h1.c nowhere, and Elasticsearch reads
 * a raw byte as one char (?q=café searched "cafÃ©").  NULL when out of memory. */
static char *encode_target(const char *target)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t len = strlen(target), high = 0;
    for (size_t i = 0; i < len; i++)
        high += (unsigned char)target[i] >= 0x80;
    char *out = malloc(len + 2 * high + 1);
    if (out == NULL)
        return NULL;
    char *o = out;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)target[i];
        if (ch >= 0x80) {
            *o++ = '%';
            *o++ = hex[ch >> 4];
            *o++ = hex[ch & 15];
        } else {
            *o++ = (char)ch;
        }
    }
    *o = '\0';
    return out;
}

esx_request *esx_client_prepare(esx_client *c, const char *method, const char *target,
                                const char *body, size_t body_len, const char *content_type,
                                const char *const *extra, int n_extra, int max_retries,
                                int64_t timeout_ms, char *why)
{
    const esx_config *cfg = &c->cfg;
    esx_request *req = esx_request_new(cfg->max_response_bytes);
    if (req == NULL)
        goto nomem;
    join(req->method, sizeof req->method, "", method);
    req->target = encode_target(target);
    if (req->target == NULL)
        goto nomem;
    req->max_retries = max_retries < 0 ? cfg->max_retries : max_retries;
    req->timeout_ms = timeout_ms > 0 ? timeout_ms : cfg->request_timeout;
    if (body) {
        req->body_raw_len = body_len;
        if (cfg->compression && body_len > 0 && body_len >= cfg->compression_min_bytes) {
            esx_buf out;
            esx_buf_init(&out, (size_t)-1 / 4);
            if (esx_gzip_compress(body, body_len, cfg->compression_level, &out) != ESX_GZIP_OK) {
                esx_buf_free(&out);
                goto nomem;
            }
            req->body = esx_buf_take(&out, &req->body_len);
            req->body_gzip = 1;
        } else {
            req->body = malloc(body_len + 1);
            if (req->body == NULL)
                goto nomem;
            memcpy(req->body, body, body_len);
            req->body[body_len] = '\0';
            req->body_len = body_len;
        }
    }
    char line[640];
    /* No "Expect: 100-continue" round trip: curl adds it only to bigger bodies. */
    if (req->body_len > 1024 && append_header(&req->headers, "Expect:"))
        goto nomem;
    for (int i = 0; i < cfg->n_headers; i++) {
        /* a header this call sets replaces the client's of that name: both were sent, and
         * Elasticsearch refuses two values of a single-valued header (X-Opaque-Id) with 400 */
        const char *colon = strchr(cfg->headers[i], ':');
        char name[256];
        size_t nlen = colon ? (size_t)(colon - cfg->headers[i]) : 0;
        if (nlen > 0 && nlen < sizeof name) {
            memcpy(name, cfg->headers[i], nlen);
            name[nlen] = '\0';
            if (names_header(extra, n_extra, name))
                continue;
        }
        if (append_header(&req->headers, cfg->headers[i]))
            goto nomem;
    }
    /* an Authorization header of the caller's (the client's or this call's) replaces the
     * api key, as it replaces username/password (h1.c, libcurl): two made servers answer 400 */
    if (cfg->api_key[0] &&
        !names_header((const char *const *)cfg->headers, cfg->n_headers, "Authorization") &&
        !names_header(extra, n_extra, "Authorization")) {
        join(line, sizeof line, "Authorization: ApiKey ", cfg->api_key);
        if (append_header(&req->headers, line))
            goto nomem;
    }
    if (body && content_type) {
        join(line, sizeof line, "Content-Type: ", content_type);
        if (append_header(&req->headers, line))
            goto nomem;
    } else if (!body && (strcmp(req->method, "POST") == 0 || strcmp(req->method, "PUT") == 0) &&
               append_header(&req->headers, "Content-Type:")) {
        /* libcurl would send "application/x-www-form-urlencoded" with the empty body it posts
         * (engine_curl.c); "Content-Type:" removes it, and h1.c skips such a line */
        goto nomem;
    }
    if (req->body_gzip && append_header(&req->headers, "Content-Encoding: gzip"))
        goto nomem;
    for (int i = 0; i < n_extra; i++)
        if (append_header(&req->headers, extra[i]))
            goto nomem;
    return req;
nomem:
    esx_request_unref(req);
    snprintf(why, 256, "out of memory preparing the request");
    return NULL;
}

int esx_client_submit(esx_client *c, esx_request *req, const char **kind, char *why)
{
    client_lock(c);
    int rc = 0;
    if (c->closed || c->engine == NULL) {
        *kind = ESX_ECLOSED;
        snprintf(why, 256, "the client is closed");
        rc = -1;
    } else if (heal_locked(c, why) != 0) {
        *kind = ESX_EINTERNAL;
        rc = -1;
    } else if (esx_engine_submit(c->engine, req) != 0) {
        *kind = ESX_ECLOSED;
        snprintf(why, 256, "the client is closed");
        rc = -1;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* A request submitted before a fork never completes in the child: fail it here. */
static void fail_orphan(esx_client *c, esx_request *req)
{
    if (atomic_load(&req->done) || req->gen >= c->fork_gen)
        return;
    req->err_kind = ESX_ECLOSED;
    snprintf(req->err_msg, sizeof req->err_msg,
             "the request was in flight when the process forked; it belongs to the parent");
    esx_request_reset_locks(req);
    esx_request_complete(req);
}

int esx_client_poll(esx_client *c, esx_request *req)
{
    if (atomic_load(&req->done))
        return 1;
    char why[256];
    esx_client_heal(c, why);
    fail_orphan(c, req);
    return atomic_load(&req->done);
}

int esx_client_wait(esx_client *c, esx_request *req, int64_t timeout_ms)
{
    int64_t until = timeout_ms >= 0 ? esx_now_ms() + timeout_ms : -1;
    for (;;) {
        int64_t slice = WAIT_SLICE_MS;
        if (until >= 0) {
            int64_t left = until - esx_now_ms();
            if (left < slice)
                slice = left < 0 ? 0 : left;
        }
        /* poll first: in a forked child, a request of the parent's is failed before its
         * lock (which the parent's I/O thread may have held at the fork) is touched */
        if (esx_client_poll(c, req))
            return 1;
        if (esx_request_wait(req, slice))
            return 1;
        if (until >= 0 && esx_now_ms() >= until)
            return 0;
    }
}

int esx_client_stats(esx_client *c, esx_stats *stats, esx_nodes *nodes, char *why)
{
    client_lock(c);
    int rc = -1;
    if (!c->closed && c->engine) {
        if (heal_locked(c, why) != 0 && !esx_engine_ours(c->engine)) {
            rc = -2;
        } else {
            esx_engine_stats(c->engine, stats, nodes);
            rc = 0;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

const char *esx_client_waiter_path(esx_client *c, char *path_out, size_t outlen, char *why)
{
    client_lock(c);
    const char *path = NULL;
    if (c->closed || c->engine == NULL)
        snprintf(why, 256, "the client is closed");
    else if (heal_locked(c, why) == 0)
        path = esx_engine_waiter_path(c->engine, why);
    if (path) {
        snprintf(path_out, outlen, "%s", path);
        path = path_out;
    }
    pthread_mutex_unlock(&c->mu);
    return path;
}

void esx_client_debug_kill(esx_client *c)
{
    client_lock(c);
    if (!c->closed && c->engine)
        esx_engine_debug_kill(c->engine);
    pthread_mutex_unlock(&c->mu);
}
