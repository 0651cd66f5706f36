/*
 * lclient.c -- Lua binding of the client core (see lclient.h).
 *
 * The userdata hold only pointers: a pending request keeps its own reference to the C
 * client, so a request can finish (and the client be freed) in whichever order Lua's
 * collector gets to them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "lclass.h"
#include "lclient.h"
#include "lerror.h"
#include "ljson.h"
#include "lopts.h"

#define CLIENT_MT "esx.client"
#define PENDING_MT "esx.pending"

typedef struct lclient {
    esx_client *c;
    int counted; /* open, for esx_lthreaded_collect (lclass.h) */
} lclient;

typedef struct lpending {
    esx_client *c;
    esx_request *req;
} lpending;

/* ---------------------------------------------------------------- config */

static int has_crlf(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
            return 1;
    return 0;
}

/* 1 when name[0..len) is a header name curl and servers take as one: non-empty, no ':',
 * no space, no control character (the Lua layer asks for an HTTP token; this keeps a direct
 * caller of core.client_new from splitting a request's head). */
static int valid_header_name(const char *name, size_t len)
{
    if (len == 0)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch <= 0x20 || ch == 0x7f || ch == ':')
            return 0;
    }
    return 1;
}

/* Reads the validated options table at t into cfg.  Raises on anything malformed; a raise
 * leaves nothing allocated (every check comes before the header lines are built, and a
 * malloc failure frees the lines built so far).  On return cfg owns the header lines (free
 * them with esx_config_free, or hand cfg to esx_client_new, which takes them). */
static void read_config(lua_State *L, int t, esx_config *cfg)
{
    char user[256], pass[256], why[256];
    memset(cfg, 0, sizeof *cfg);
    lua_getfield(L, t, "hosts");
    luaL_checktype(L, -1, LUA_TTABLE);
    int n = (int)lua_rawlen(L, -1);
    if (n < 1 || n > ESX_MAX_NODES)
        luaL_error(L, "esx.client: option 'hosts' must list 1 to %d nodes", ESX_MAX_NODES);
    for (int i = 1; i <= n; i++) {
        lua_rawgeti(L, -1, i);
        const char *url = luaL_checkstring(L, -1);
        if (esx_node_parse(&cfg->nodes.v[i - 1], url, user, pass, why) != 0)
            luaL_error(L, "esx.client: bad option 'hosts' (%s)", why);
        if (user[0] && !cfg->username[0]) {
            memcpy(cfg->username, user, sizeof user);
            memcpy(cfg->password, pass, sizeof pass);
        }
        lua_pop(L, 1);
    }
    cfg->nodes.n = n;
    lua_pop(L, 1);
    if (!cfg->username[0]) {
        esx_lopt_str(L, t, "esx.client", "username", cfg->username, sizeof cfg->username);
        esx_lopt_str(L, t, "esx.client", "password", cfg->password, sizeof cfg->password);
    }
    esx_lopt_str(L, t, "esx.client", "api_key", cfg->api_key, sizeof cfg->api_key);
    if (has_crlf(cfg->api_key, strlen(cfg->api_key)))
        luaL_error(L, "esx.client: bad option 'api_key' (contains CR or LF)");
    esx_lopt_str(L, t, "esx.client", "ca_file", cfg->ca_file, sizeof cfg->ca_file);
    cfg->connect_timeout = esx_lopt_int(L, t, "esx.client", "connect_timeout", 1000);
    cfg->socket_timeout = esx_lopt_int(L, t, "esx.client", "socket_timeout", 30000);
    cfg->pool_timeout = esx_lopt_int(L, t, "esx.client", "pool_timeout", 1000);
    cfg->request_timeout = esx_lopt_int(L, t, "esx.client", "request_timeout", 0);
    cfg->max_per_route = (int)esx_lopt_int(L, t, "esx.client", "max_per_route", 10);
    cfg->max_total = (int)esx_lopt_int(L, t, "esx.client", "max_total", 30);
    cfg->compression = esx_lopt_bool(L, t, "esx.client", "compression", 0);
    cfg->compression_level = (int)esx_lopt_int(L, t, "esx.client", "compression_level", 1);
    cfg->compression_min_bytes = (size_t)esx_lopt_int(L, t, "esx.client", "compression_min_bytes", 0);
    cfg->max_response_bytes = (size_t)esx_lopt_int(L, t, "esx.client", "max_response_bytes", 100 << 20);
    cfg->max_retries = (int)esx_lopt_int(L, t, "esx.client", "max_retries", 3);
    cfg->dead_backoff_min = esx_lopt_int(L, t, "esx.client", "dead_backoff_min", 60000);
    cfg->dead_backoff_max = esx_lopt_int(L, t, "esx.client", "dead_backoff_max", 1800000);
    cfg->resurrect = esx_lopt_bool(L, t, "esx.client", "resurrect", 1);
    cfg->tls_verify = esx_lopt_bool(L, t, "esx.client", "tls_verify", 1);
    lua_getfield(L, t, "retry_on_status");
    if (lua_istable(L, -1)) {
        int k = (int)lua_rawlen(L, -1);
        if (k > ESX_MAX_RETRY_STATUS)
            luaL_error(L, "esx.client: option 'retry_on_status' lists more than %d statuses",
                       ESX_MAX_RETRY_STATUS);
        for (int i = 1; i <= k; i++) {
            lua_rawgeti(L, -1, i);
            cfg->retry_on_status[i - 1] = (int)luaL_checkinteger(L, -1);
            lua_pop(L, 1);
        }
        cfg->n_retry_on_status = k;
    }
    lua_pop(L, 1);
    lua_getfield(L, t, "headers");
    if (lua_istable(L, -1)) {
        /* every check before the first malloc: a raise after it would leak the lines */
        int n_headers = 0;
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            /* type checks, not lua_tolstring's conversion: it would change a number key in
             * place and break lua_next */
            if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TSTRING)
                luaL_error(L, "esx.client: bad option 'headers' (names and values must be strings)");
            size_t nl, vl;
            const char *name = lua_tolstring(L, -2, &nl);
            const char *value = lua_tolstring(L, -1, &vl);
            if (!valid_header_name(name, nl) || has_crlf(value, vl))
                luaL_error(L, "esx.client: bad option 'headers' (names must be non-empty tokens "
                              "without ':', spaces or control characters; values without CR, "
                              "LF or NUL)");
            if (++n_headers > ESX_MAX_HEADERS)
                luaL_error(L, "esx.client: option 'headers' has more than %d entries",
                           ESX_MAX_HEADERS);
            lua_pop(L, 1);
        }
        /* then the lines: nothing below raises but running out of memory, after a free */
        lua_pushnil(L);
        while (lua_next(L, -2) != 0) {
            size_t nl, vl;
            const char *name = lua_tolstring(L, -2, &nl);
            const char *value = lua_tolstring(L, -1, &vl);
            char *line = malloc(nl + vl + 3);
            if (line == NULL) {
                esx_config_free(cfg);
                luaL_error(L, "esx.client: out of memory building the header lines");
            }
            memcpy(line, name, nl);
            memcpy(line + nl, ": ", 2);
            memcpy(line + nl + 2, value, vl + 1);
            cfg->headers[cfg->n_headers++] = line;
            lua_pop(L, 1);
        }
    }
    lua_pop(L, 1);
}

/* ---------------------------------------------------------------- client */

static lclient *check_client(lua_State *L, int idx)
{
    return luaL_checkudata(L, idx, CLIENT_MT);
}

esx_client *esx_lclient_check(lua_State *L, int idx)
{
    return check_client(L, idx)->c;
}

/* core.client_new(opts) -> client userdata | nil, err */
static int client_new(lua_State *L)
{
    luaL_checktype(L, 1, LUA_TTABLE);
    esx_lthreaded_collect(L); /* dropped clients' threads and descriptors: see lclass.h */
    lclient *u = lua_newuserdata(L, sizeof *u);
    u->c = NULL;
    u->counted = 0;
    esx_config cfg;
    read_config(L, 1, &cfg); /* may raise, with nothing allocated: see read_config */
    char why[256];
    u->c = esx_client_new(&cfg, why);
    if (u->c == NULL)
        return esx_lerror_fail(L, "internal", "cannot create the client: %s", why);
    luaL_setmetatable(L, CLIENT_MT); /* __gc only once the C object exists */
    esx_lthreaded_add(&u->counted);
    return 1;
}

/* core.check_node_url(url) -> true | nil, reason */
static int check_node_url(lua_State *L)
{
    esx_node node;
    char user[256], pass[256], why[256];
    if (esx_node_parse(&node, luaL_checkstring(L, 1), user, pass, why) != 0) {
        lua_pushnil(L);
        lua_pushstring(L, why);
        return 2;
    }
    lua_pushboolean(L, 1);
    return 1;
}

static int client_gc(lua_State *L)
{
    lclient *u = check_client(L, 1);
    esx_lthreaded_remove(&u->counted);
    if (u->c) {
        esx_client_unref(u->c);
        u->c = NULL;
    }
    return 0;
}

static int client_close(lua_State *L)
{
    lclient *u = check_client(L, 1);
    esx_lthreaded_remove(&u->counted);
    if (u->c)
        esx_client_close(u->c);
    return 0;
}

static int client_tostring(lua_State *L)
{
    lclient *u = check_client(L, 1);
    lua_pushfstring(L, "esx.client: %p", (void *)u->c);
    return 1;
}

static int valid_method(const char *m)
{
    size_t n = strlen(m);
    if (n == 0 || n > 15)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (m[i] < 'A' || m[i] > 'Z')
            return 0;
    return 1;
}

static int valid_target(const char *t, size_t len)
{
    if (len == 0 || t[0] != '/' || strlen(t) != len)
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)t[i];
        if (ch <= 0x20 || ch == 0x7f || ch == '#') /* '#': libcurl cuts a fragment off */
            return 0;
    }
    return 1;
}

/* client:send(method, target, body?, content_type?, headers?, max_retries?, timeout?)
 *   -> pending | nil, err.  Caller mistakes (bad method, control characters in the target
 *   or a header) raise. */
static int client_send(lua_State *L)
{
    lclient *u = check_client(L, 1);
    const char *method = luaL_checkstring(L, 2);
    size_t tlen, blen = 0;
    const char *target = luaL_checklstring(L, 3, &tlen);
    const char *body = luaL_optlstring(L, 4, NULL, &blen);
    const char *ctype = luaL_optstring(L, 5, "application/json");
    int max_retries = (int)luaL_optinteger(L, 7, -1);
    int64_t timeout = lua_isnoneornil(L, 8) ? 0 : esx_checkcount(L, 8);
    if (!valid_method(method))
        return luaL_argerror(L, 2, "method must be 1-15 uppercase letters");
    if (!valid_target(target, tlen))
        return luaL_argerror(L, 3, "path must start with '/' and contain no spaces, control "
                                 "characters or '#' (percent-encode it as %23)");
    if (has_crlf(ctype, strlen(ctype)))
        return luaL_argerror(L, 5, "content type contains CR or LF");
    const char *extra[ESX_MAX_HEADERS];
    int n_extra = 0;
    if (!lua_isnoneornil(L, 6)) {
        luaL_checktype(L, 6, LUA_TTABLE);
        int n = (int)lua_rawlen(L, 6);
        if (n > ESX_MAX_HEADERS)
            return luaL_argerror(L, 6, "too many headers");
        for (int i = 1; i <= n; i++) {
            lua_rawgeti(L, 6, i);
            size_t hl;
            const char *h = lua_tolstring(L, -1, &hl);
            if (h == NULL || has_crlf(h, hl) || strchr(h, ':') == NULL)
                return luaL_argerror(L, 6, "headers must be 'Name: value' strings without CR or LF");
            extra[n_extra++] = h; /* kept alive by the table at 6 until prepare copies it */
            lua_pop(L, 1);
        }
    }
    if (u->c == NULL || u->c->closed)
        return esx_lerror_fail(L, ESX_ECLOSED, "the client is closed");
    /* the userdata first: lua_newuserdata raises when out of memory, and a prepared
     * request would then be lost */
    lpending *p = lua_newuserdata(L, sizeof *p);
    p->c = NULL;
    p->req = NULL;
    char why[256];
    esx_request *req = esx_client_prepare(u->c, method, target, body, blen, ctype, extra, n_extra,
                                          max_retries, timeout, why);
    if (req == NULL)
        return esx_lerror_fail(L, ESX_EINTERNAL, "%s", why);
    const char *kind;
    if (esx_client_submit(u->c, req, &kind, why) != 0) {
        esx_request_unref(req);
        return esx_lerror_fail(L, kind, "%s", why);
    }
    esx_client_ref(u->c);
    p->c = u->c;
    p->req = req;
    luaL_setmetatable(L, PENDING_MT);
    return 1;
}

static void push_counter(lua_State *L, const char *name, uint64_t v)
{
    esx_pushinteger(L, (long long)v);
    lua_setfield(L, -2, name);
}

/* client:stats() -> table of counters, pool state, bytes and nodes */
static int client_stats(lua_State *L)
{
    lclient *u = check_client(L, 1);
    esx_stats s;
    esx_nodes nodes;
    char why[256];
    int rc = u->c == NULL ? -1 : esx_client_stats(u->c, &s, &nodes, why);
    if (rc == -2)
        return esx_lerror_fail(L, ESX_EINTERNAL, "%s", why);
    if (rc != 0)
        return esx_lerror_fail(L, ESX_ECLOSED, "the client is closed");
    lua_createtable(L, 0, 8);
    push_counter(L, "requests", s.requests);
    push_counter(L, "responses", s.responses);
    push_counter(L, "retries", s.retries);
    push_counter(L, "rebuilds", s.rebuilds);
    lua_createtable(L, 0, ESX_NKINDS);
    for (int i = 0; i < ESX_NKINDS; i++)
        push_counter(L, esx_failure_kinds[i], s.failures[i]);
    lua_setfield(L, -2, "failures");
    lua_createtable(L, 0, 5);
    push_counter(L, "in_use", (uint64_t)s.in_use);
    push_counter(L, "idle", (uint64_t)s.idle);
    push_counter(L, "open", (uint64_t)s.open);
    push_counter(L, "waiting", (uint64_t)s.waiting);
    push_counter(L, "pool_timeouts", s.pool_timeouts);
    lua_setfield(L, -2, "pool");
    lua_createtable(L, 0, 4);
    push_counter(L, "sent_raw", s.sent_raw);
    push_counter(L, "sent_wire", s.sent_wire);
    push_counter(L, "received_wire", s.received_wire);
    push_counter(L, "received_raw", s.received_raw);
    lua_setfield(L, -2, "bytes");
    int64_t mono = esx_now_ms(), wall = esx_wall_ms();
    lua_createtable(L, nodes.n, 0);
    for (int i = 0; i < nodes.n; i++) {
        const esx_node *n = &nodes.v[i];
        lua_createtable(L, 0, 6);
        lua_pushstring(L, n->url);
        lua_setfield(L, -2, "url");
        lua_pushboolean(L, n->alive);
        lua_setfield(L, -2, "alive");
        push_counter(L, "failures", (uint64_t)n->failures);
        push_counter(L, "requests", n->requests);
        push_counter(L, "in_flight", (uint64_t)n->in_flight);
        esx_pushinteger(L, n->alive ? 0 : (long long)(wall + (n->dead_until - mono)));
        lua_setfield(L, -2, "dead_until");
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "nodes");
    return 1;
}

/* Pushes the path of c's waiter socket -> 1, or nil, err -> 2. */
static int push_waiter_path(lua_State *L, esx_client *c)
{
    char why[256], path[128];
    if (esx_client_waiter_path(c, path, sizeof path, why) == NULL)
        return esx_lerror_fail(L, c->closed ? ESX_ECLOSED : ESX_EINTERNAL, "%s", why);
    lua_pushstring(L, path);
    return 1;
}

/* client:waiter_path() -> path of the unix socket nginx waiters connect to | nil, err */
static int client_waiter_path(lua_State *L)
{
    lclient *u = check_client(L, 1);
    if (u->c == NULL)
        return esx_lerror_fail(L, ESX_ECLOSED, "the client is closed");
    return push_waiter_path(L, u->c);
}

/* client:debug_kill_io_thread() -- test hook: the I/O thread exits as if it had crashed */
static int client_debug_kill(lua_State *L)
{
    lclient *u = check_client(L, 1);
    if (u->c)
        esx_client_debug_kill(u->c);
    return 0;
}

/* ---------------------------------------------------------------- pending */

static lpending *check_pending(lua_State *L, int idx)
{
    lpending *p = luaL_checkudata(L, idx, PENDING_MT);
    if (p->req == NULL)
        luaL_argerror(L, idx, "pending request already released");
    return p;
}

static int pending_gc(lua_State *L)
{
    lpending *p = luaL_checkudata(L, 1, PENDING_MT);
    if (p->req) {
        esx_request_unref(p->req);
        p->req = NULL;
    }
    if (p->c) {
        esx_client_unref(p->c);
        p->c = NULL;
    }
    return 0;
}

static int pending_tostring(lua_State *L)
{
    lpending *p = luaL_checkudata(L, 1, PENDING_MT);
    lua_pushfstring(L, "esx.pending: %p", (void *)p->req);
    return 1;
}

static int pending_ready(lua_State *L)
{
    lpending *p = check_pending(L, 1);
    lua_pushboolean(L, esx_client_poll(p->c, p->req));
    return 1;
}

/* pending:wait([timeout_ms]) -> true when done, false on timeout (blocks the thread).
 * Without a timeout: until done.  A timeout <= 0 has passed already: a poll, never a wait. */
static int pending_wait(lua_State *L)
{
    lpending *p = check_pending(L, 1);
    int64_t ms = -1;
    if (!lua_isnoneornil(L, 2)) {
        lua_Number t = luaL_checknumber(L, 2);
        if (t != t)
            return luaL_argerror(L, 2, "timeout is NaN");
        if (t <= 0)
            ms = 0;
        else if (t < 9007199254740992.0) /* larger (inf too): no bound; no overflowing cast */
            ms = (int64_t)t;
    }
    lua_pushboolean(L, esx_client_wait(p->c, p->req, ms));
    return 1;
}

static int pending_id(lua_State *L)
{
    lpending *p = check_pending(L, 1);
    esx_pushinteger(L, (long long)p->req->id);
    return 1;
}

/* pending:waiter_path() -> the unix socket that pokes nginx waiters of this request */
static int pending_waiter_path(lua_State *L)
{
    return push_waiter_path(L, check_pending(L, 1)->c);
}

/* Joins the values of the repeated headers, which push_headers gathered in lists (the table
 * is at the top of the stack). */
static void join_repeated(lua_State *L)
{
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        if (lua_istable(L, -1)) {
            luaL_Buffer b;
            size_t n = lua_rawlen(L, -1);
            lua_pushvalue(L, -2); /* the name, for the assignment below */
            lua_insert(L, -2);    /* name, name, list */
            int list = lua_gettop(L);
            luaL_buffinit(L, &b);
            for (size_t i = 1; i <= n; i++) {
                if (i > 1)
                    luaL_addlstring(&b, ", ", 2);
                lua_rawgeti(L, list, (int)i);
                luaL_addvalue(&b);
            }
            luaL_pushresult(&b); /* name, name, list, joined */
            lua_remove(L, list);
            lua_rawset(L, -4); /* an existing key: allowed during the traversal */
        } else {
            lua_pop(L, 1);
        }
    }
}

/* The response headers as a table, names lower-case; a repeated header's values joined with
 * ", " as HTTP allows (in one pass over each, not one copy per repeat). */
static void push_headers(lua_State *L, const esx_request *req)
{
    int repeated = 0;
    lua_createtable(L, 0, 8);
    const char *p = req->resp_headers.data;
    while (p && *p) {
        const char *eol = strchr(p, '\n');
        const char *colon = strchr(p, ':');
        if (!eol || !colon || colon > eol)
            break;
        const char *v = colon + 2 <= eol ? colon + 2 : eol;
        lua_pushlstring(L, p, (size_t)(colon - p));
        lua_pushvalue(L, -1);
        lua_rawget(L, -3); /* t, name, old */
        if (lua_isnil(L, -1)) {
            lua_pop(L, 1);
            lua_pushlstring(L, v, (size_t)(eol - v));
            lua_rawset(L, -3);
        } else {
            if (!lua_istable(L, -1)) { /* a second value: the header becomes a list */
                lua_createtable(L, 4, 0);
                lua_insert(L, -2);
                lua_rawseti(L, -2, 1); /* t, name, list */
                lua_pushvalue(L, -2);
                lua_pushvalue(L, -2);
                lua_rawset(L, -5);
                repeated = 1;
            }
            lua_pushlstring(L, v, (size_t)(eol - v));
            lua_rawseti(L, -2, (int)lua_rawlen(L, -2) + 1);
            lua_pop(L, 2);
        }
        p = eol + 1;
    }
    if (repeated)
        join_repeated(L);
}

/* pending:result() -> {status=, headers=, body=, node=, retries=} | nil, err | nil (not done) */
static int pending_result(lua_State *L)
{
    lpending *p = check_pending(L, 1);
    esx_request *req = p->req;
    if (!esx_client_poll(p->c, req))
        return 0;
    if (req->err_kind) {
        esx_lerror_fail(L, req->err_kind, "%s", req->err_msg);
        if (req->node_url) {
            lua_pushstring(L, req->node_url);
            lua_setfield(L, -2, "node");
        }
        lua_pushinteger(L, req->retries);
        lua_setfield(L, -2, "retries");
        if (req->status > 0 && strcmp(req->err_kind, ESX_EDECODE) == 0) {
            /* the node answered (a 2xx may have been applied); its bytes could not be read */
            lua_pushinteger(L, (lua_Integer)req->status);
            lua_setfield(L, -2, "status");
        }
        return 2;
    }
    lua_createtable(L, 0, 5);
    lua_pushinteger(L, (lua_Integer)req->status);
    lua_setfield(L, -2, "status");
    push_headers(L, req);
    lua_setfield(L, -2, "headers");
    lua_pushlstring(L, req->resp_body.data ? req->resp_body.data : "", req->resp_body.len);
    lua_setfield(L, -2, "body");
    lua_pushstring(L, esx_request_node(req));
    lua_setfield(L, -2, "node");
    lua_pushinteger(L, req->retries);
    lua_setfield(L, -2, "retries");
    return 1;
}

/* pending:json_body() -> the 2xx response body decoded (an empty body: {}) | false (not a
 * 2xx answer, or not JSON: the caller takes the result() path for its error) | nothing (not
 * done).  Decodes straight from the response buffer: no body string, no headers table. */
static int pending_json_body(lua_State *L)
{
    lpending *p = check_pending(L, 1);
    esx_request *req = p->req;
    if (!esx_client_poll(p->c, req))
        return 0;
    if (req->err_kind || req->status < 200 || req->status > 299) {
        lua_pushboolean(L, 0);
        return 1;
    }
    if (req->resp_body.len == 0) {
        lua_newtable(L);
        return 1;
    }
    if (esx_ljson_decode(L, req->resp_body.data, req->resp_body.len) != 1) {
        lua_pop(L, 2);
        lua_pushboolean(L, 0);
    }
    return 1;
}

static const luaL_Reg client_methods[] = {
    {"send", client_send},
    {"stats", client_stats},
    {"close", client_close},
    {"waiter_path", client_waiter_path},
    {"debug_kill_io_thread", client_debug_kill},
    {NULL, NULL},
};

static const luaL_Reg pending_methods[] = {
    {"ready", pending_ready},
    {"wait", pending_wait},
    {"result", pending_result},
    {"json_body", pending_json_body},
    {"id", pending_id},
    {"waiter_path", pending_waiter_path},
    {NULL, NULL},
};

void esx_lclient_open(lua_State *L)
{
    esx_lclass(L, CLIENT_MT, client_methods, client_gc, client_tostring);
    esx_lclass(L, PENDING_MT, pending_methods, pending_gc, pending_tostring);
    lua_pushcfunction(L, client_new);
    lua_setfield(L, -2, "client_new");
    lua_pushcfunction(L, check_node_url);
    lua_setfield(L, -2, "check_node_url");
}
