/*
 * node.c -- node URLs, liveness and selection (see node.h).
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "hex.h"
#include "node.h"

/* Copies n bytes of URL userinfo to out (at least n + 1 bytes), decoding %XX escapes (a '%'
 * not followed by two hex digits stays as it is).  Returns 0, or -1 for an escaped NUL. */
static int decode_userinfo(char *out, const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int hi, lo;
        if (s[i] == '%' && i + 2 < n && (hi = esx_hex_digit((unsigned char)s[i + 1])) >= 0 &&
            (lo = esx_hex_digit((unsigned char)s[i + 2])) >= 0) {
            if (hi == 0 && lo == 0)
                return -1;
            out[k++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[k++] = s[i];
        }
    }
    out[k] = '\0';
    return 0;
}

int esx_node_parse(esx_node *node, const char *url, char *user, char *pass, char *why)
{
    memset(node, 0, sizeof *node);
    node->alive = 1;
    user[0] = pass[0] = '\0';
    const char *rest;
    if (strncasecmp(url, "http://", 7) == 0)
        rest = url + 7;
    else if (strncasecmp(url, "https://", 8) == 0)
        rest = url + 8;
    else {
        snprintf(why, 256, "node URL must start with http:// or https://");
        return -1;
    }
    for (const char *p = url; *p; p++) {
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) {
            /* (URLs are ASCII: a raw byte above 0x7e would also reach the metrics' labels,
             * which must be UTF-8) */
            snprintf(why, 256, "node URL contains a space, a control character or a byte "
                               "that is not ASCII (percent-encode it)");
            return -1;
        }
    }
    size_t scheme_len = (size_t)(rest - url);
    const char *host_end = rest + strcspn(rest, "/?#");
    const char *at = NULL;
    for (const char *p = rest; p < host_end; p++)
        if (*p == '@')
            at = p;
    const char *host = rest;
    if (at) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        size_t ulen = (size_t)((colon ? colon : at) - rest);
        size_t plen = colon ? (size_t)(at - colon - 1) : 0;
        if (ulen >= 256 || plen >= 256) {
            snprintf(why, 256, "node URL credentials are too long");
            return -1;
        }
        if (decode_userinfo(user, rest, ulen) != 0 ||
            (colon && decode_userinfo(pass, colon + 1, plen) != 0)) {
            snprintf(why, 256, "node URL credentials contain an escaped NUL (%%00)");
            return -1;
        }
        host = at + 1;
    }
    if (host == host_end) {
        snprintf(why, 256, "node URL has no host");
        return -1;
    }
    if (strpbrk(host_end, "?#")) {
        /* after a path too: h1 sent it in the request line ("GET /p#f/_search", not HTTP),
         * libcurl cut the path there -- two transports, two paths */
        snprintf(why, 256, "node URL must not have a query or fragment");
        return -1;
    }
    if (strchr(host_end, '@')) {
        /* "user:pa/ss@host": the authority ended at the '/'; the rest of the password would
         * become the node's path, shown in stats and errors */
        snprintf(why, 256, "node URL has an '@' after its host: percent-encode a '/' in the "
                           "credentials as %%2F, or pass username and password");
        return -1;
    }
    /* host: a name, an IPv4 address or a bracketed IPv6 one; port: 1-65535 when given */
    const char *port_at = NULL, *name_end = host_end;
    if (*host == '[') {
        const char *close = memchr(host, ']', (size_t)(host_end - host));
        if (close == NULL || close == host + 1 || (close + 1 < host_end && close[1] != ':')) {
            snprintf(why, 256, "node URL has an invalid IPv6 address (\"[address]:port\")");
            return -1;
        }
        name_end = close + 1;
        port_at = close + 1 < host_end ? close + 2 : NULL;
    } else {
        const char *colon = memchr(host, ':', (size_t)(host_end - host));
        if (colon) {
            name_end = colon;
            port_at = colon + 1;
        }
    }
    long port = strncasecmp(url, "https", 5) == 0 ? 443 : 80;
    if (port_at) {
        size_t digits = (size_t)(host_end - port_at);
        port = 0;
        for (size_t i = 0; i < digits && port <= 65535; i++)
            port = port_at[i] >= '0' && port_at[i] <= '9' ? port * 10 + (port_at[i] - '0') : -1;
        if (digits == 0 || port < 1 || port > 65535) {
            snprintf(why, 256, "node URL has an invalid port (1-65535)");
            return -1;
        }
    }
    if (name_end == host) {
        snprintf(why, 256, "node URL has no host");
        return -1;
    }
    /* path prefix without trailing slashes */
    size_t path_len = strlen(host_end);
    while (path_len && host_end[path_len - 1] == '/')
        path_len--;
    size_t host_len = (size_t)(host_end - host);
    if (scheme_len + host_len + path_len + 1 > sizeof node->url) {
        snprintf(why, 256, "node URL is too long");
        return -1;
    }
    /* lowercase scheme, host as given */
    for (size_t i = 0; i < scheme_len; i++) {
        char c = url[i];
        node->url[i] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
    }
    node->host_len = (int)(name_end - host);
    node->port = (int)port;
    memcpy(node->url + scheme_len, host, host_len);
    memcpy(node->url + scheme_len + host_len, host_end, path_len);
    node->url[scheme_len + host_len + path_len] = '\0';
    return 0;
}

/* 1 when a and b are the same host and port (the unit of libcurl's per-host limit). */
static int same_host(const esx_node *a, const esx_node *b)
{
    const char *ha = strstr(a->url, "://") + 3, *hb = strstr(b->url, "://") + 3;
    return a->port == b->port && a->host_len == b->host_len &&
           strncasecmp(ha, hb, (size_t)a->host_len) == 0;
}

int esx_nodes_max_per_host(const esx_nodes *nodes)
{
    int most = 1;
    for (int i = 0; i < nodes->n; i++) {
        int k = 0;
        for (int j = 0; j < nodes->n; j++)
            k += same_host(&nodes->v[i], &nodes->v[j]);
        if (k > most)
            most = k;
    }
    return most;
}

static int eligible(const esx_node *n, int64_t now)
{
    return n->alive || (n->dead_until <= now && !n->probing);
}

int esx_nodes_pick(esx_nodes *nodes, int64_t now, int max_per_route, uint64_t tried,
                   int resurrect, esx_node **out)
{
    int any_eligible = 0, probing = 0;
    esx_node *fallback = NULL; /* eligible with a free slot, but already tried in this call */
    for (int k = 0; k < nodes->n; k++) {
        int i = (nodes->next + k) % nodes->n;
        esx_node *n = &nodes->v[i];
        if (!n->alive && n->dead_until <= now && n->probing)
            probing = 1; /* its answer may bring it back: worth waiting for */
        if (!eligible(n, now))
            continue;
        any_eligible = 1;
        if (n->in_flight >= max_per_route)
            continue;
        if (tried & (1ULL << i)) {
            if (!fallback)
                fallback = n;
            continue;
        }
        nodes->next = (i + 1) % nodes->n;
        *out = n;
        return ESX_PICK_OK;
    }
    if (fallback) {
        *out = fallback;
        return ESX_PICK_OK;
    }
    if (any_eligible)
        return ESX_PICK_BUSY;
    /* Every node is dead and none is due (or its probe is out): try the one due soonest among
     * those with a free slot -- the soonest one full, the request would wait for it (and fail
     * with pool_timeout) while another dead node, as likely to be back, had slots free. */
    if (!resurrect)
        return probing ? ESX_PICK_BUSY : ESX_PICK_NONE;
    esx_node *soonest = NULL;
    for (int i = 0; i < nodes->n; i++) {
        esx_node *n = &nodes->v[i];
        if (n->in_flight >= max_per_route)
            continue;
        if (!soonest || n->dead_until < soonest->dead_until)
            soonest = n;
    }
    if (!soonest)
        return ESX_PICK_BUSY;
    *out = soonest;
    return ESX_PICK_OK;
}

void esx_node_failed(esx_node *node, int64_t now, unsigned sent_marks, int64_t backoff_min,
                     int64_t backoff_max)
{
    if (!node->alive && sent_marks != node->marks)
        return; /* in flight when the node was marked dead: the same outage, counted once */
    node->marks++;
    if (node->failures < INT_MAX)
        node->failures++;
    int64_t delay = backoff_min;
    for (int i = 1; i < node->failures && delay > 0 && delay < backoff_max; i++)
        delay *= 2;
    if (delay > backoff_max)
        delay = backoff_max;
    node->alive = 0;
    node->dead_until = now + delay;
}

void esx_node_succeeded(esx_node *node)
{
    node->alive = 1;
    node->failures = 0;
    node->dead_until = 0;
}
