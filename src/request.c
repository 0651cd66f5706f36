/*
 * request.c -- request lifetime and completion (see request.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "request.h"

#define MAX_RESPONSE_HEADERS (64 * 1024)

esx_request *esx_request_new(size_t max_response)
{
    _Static_assert(sizeof(esx_request) <= 1000, "esx_request must stay a small block (request.h)");
    esx_request *req = malloc(sizeof *req);
    if (req == NULL)
        return NULL;
    memset(req, 0, sizeof *req);
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0) {
        free(req);
        return NULL;
    }
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (pthread_mutex_init(&req->mu, NULL) != 0) {
        pthread_condattr_destroy(&ca);
        free(req);
        return NULL;
    }
    if (pthread_cond_init(&req->cv, &ca) != 0) {
        pthread_condattr_destroy(&ca);
        pthread_mutex_destroy(&req->mu);
        free(req);
        return NULL;
    }
    pthread_condattr_destroy(&ca);
    esx_buf_init(&req->resp_headers, MAX_RESPONSE_HEADERS);
    esx_buf_init(&req->resp_body, max_response);
    req->node = -1;
    atomic_init(&req->done, 0);
    atomic_init(&req->refs, 1);
    return req;
}

void esx_request_set_node(esx_request *req, const char *node_url)
{
    if (req->node_url && strcmp(req->node_url, node_url) == 0)
        return; /* a retry on the same node */
    free(req->node_url);
    req->node_url = strdup(node_url);
}

void esx_request_ref(esx_request *req)
{
    atomic_fetch_add(&req->refs, 1);
}

void esx_request_unref(esx_request *req)
{
    if (req == NULL || atomic_fetch_sub(&req->refs, 1) != 1)
        return;
    free(req->target);
    free(req->body);
    free(req->watchers);
    free(req->node_url);
    curl_slist_free_all(req->headers);
    esx_buf_free(&req->resp_headers);
    esx_buf_free(&req->resp_body);
    esx_inflate_end(&req->inflater);
    pthread_cond_destroy(&req->cv);
    pthread_mutex_destroy(&req->mu);
    free(req);
}

int esx_request_wait(esx_request *req, int64_t timeout_ms)
{
    if (atomic_load(&req->done))
        return 1;
    struct timespec until = esx_mono_after(timeout_ms);
    pthread_mutex_lock(&req->mu);
    while (!atomic_load(&req->done)) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&req->cv, &req->mu);
        } else if (pthread_cond_timedwait(&req->cv, &req->mu, &until) == ETIMEDOUT) {
            break;
        }
    }
    int done = atomic_load(&req->done);
    pthread_mutex_unlock(&req->mu);
    return done;
}

void esx_request_reset_locks(esx_request *req)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&req->mu, NULL);
    pthread_cond_init(&req->cv, &ca);
    pthread_condattr_destroy(&ca);
}

void esx_request_complete(esx_request *req)
{
    pthread_mutex_lock(&req->mu);
    atomic_store(&req->done, 1);
    pthread_cond_broadcast(&req->cv);
    pthread_mutex_unlock(&req->mu);
}

const char *esx_request_header_ref(const esx_request *req, const char *name, size_t *len)
{
    if (req->resp_headers.data == NULL)
        return NULL;
    size_t nlen = strlen(name);
    const char *p = req->resp_headers.data;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t line = eol ? (size_t)(eol - p) : strlen(p);
        if (line > nlen + 1 && memcmp(p, name, nlen) == 0 && p[nlen] == ':') {
            const char *v = p + nlen + 1;
            while (*v == ' ')
                v++;
            *len = (size_t)(p + line - v);
            return v;
        }
        if (!eol)
            break;
        p = eol + 1;
    }
    return NULL;
}

const char *esx_request_header(const esx_request *req, const char *name, char *out, size_t outlen)
{
    size_t vlen;
    const char *v = outlen ? esx_request_header_ref(req, name, &vlen) : NULL;
    if (v == NULL)
        return NULL;
    if (vlen >= outlen)
        vlen = outlen - 1;
    memcpy(out, v, vlen);
    out[vlen] = '\0';
    return out;
}
