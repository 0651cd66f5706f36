/*
 * esx.c -- luaopen_esx_core: the C half of `require "esx"`.
 *
 * esx.core holds the bindings of each part (one l*.c file per wrapped type); the public
 * module `esx` (lua/esx/init.lua) is Lua and builds on it.  Nothing here keeps global
 * state: everything lives in userdata, the registry, or the C core objects they point to.
 */
#include <stdint.h>
#include <time.h>

#include "clock.h"
#include "compat.h"
#include "gzip.h"
#include "hash.h"
#include "lclass.h"
#include "lcache.h"
#include "lclient.h"
#include "lcollector.h"
#include "lerror.h"
#include "ljson.h"
#include "levent.h"
#include "retry_after.h"
#include "version.h"

__attribute__((visibility("default"))) int luaopen_esx_core(lua_State *L);

/* core.sleep(ms): blocks the calling thread (plain Lua only; nginx code uses ngx.sleep). */
static int core_sleep(lua_State *L)
{
    lua_Number ms = luaL_checknumber(L, 1);
    if (ms > 0) {
        struct timespec ts = {.tv_sec = (time_t)(ms / 1000),
                              .tv_nsec = (long)((ms - (lua_Number)((time_t)(ms / 1000)) * 1000) * 1e6)};
        while (nanosleep(&ts, &ts) != 0)
            ;
    }
    return 0;
}

/* core.now() -> monotonic milliseconds (the clock every esx deadline uses). */
static int core_now(lua_State *L)
{
    lua_pushnumber(L, (lua_Number)esx_now_ms());
    return 1;
}

/* core.gunzip(data, max) -> string | nil, "too_large" | "corrupt" | "nomem"
 * Inflates a gzip body (one member or several), never producing more than max bytes (a
 * negative or NaN max: 0; one past 2^63: no bound).  The output lives in a Lua-owned buffer:
 * taking it as a string may raise (out of memory), and the buffer's __gc then frees it. */
static int core_gunzip(lua_State *L)
{
    size_t len;
    const char *in = luaL_checklstring(L, 1, &len);
    lua_Number max = luaL_checknumber(L, 2);
    esx_buf *out = esx_lbuf_push(L, max > 0 ? (max < 9.2e18 ? (size_t)max : SIZE_MAX - 1) : 0);
    int rc = esx_gunzip(in, len, out);
    if (rc == ESX_GZIP_OK) {
        lua_pushlstring(L, out->data ? out->data : "", out->len);
        esx_buf_free(out);
        return 1;
    }
    esx_buf_free(out);
    lua_pushnil(L);
    lua_pushstring(L, rc == ESX_GZIP_TOOBIG ? "too_large" : rc == ESX_GZIP_CORRUPT ? "corrupt" : "nomem");
    return 2;
}

/* core.retry_after_ms(value) -> the delay an HTTP Retry-After value asks for, in ms
 * (delta-seconds or an HTTP-date; a past date: 0) | nil when it is not a valid one. */
static int core_retry_after_ms(lua_State *L)
{
    size_t len;
    const char *v = luaL_checklstring(L, 1, &len);
    int64_t ms = esx_retry_after_ms(v, len, esx_wall_ms());
    if (ms < 0)
        return 0;
    esx_pushinteger(L, (long long)ms);
    return 1;
}

/* core.random() -> a number in [0, 1) from the kernel (getrandom), for back-off jitter.
 * Not math.random: its state is the same in every LuaJIT process (never seeded at start) and
 * in every nginx worker (forked from the master), so jitter drawn from it put the processes
 * in step.  Keeps no state, so a fork needs nothing; a system call per draw (one per
 * back-off). */
static int core_random(lua_State *L)
{
    lua_pushnumber(L, (lua_Number)(esx_random_seed() >> 11) * 0x1.0p-53);
    return 1;
}

static const luaL_Reg core_functions[] = {
    {"gunzip", core_gunzip},
    {"error", esx_lerror_new},
    {"sleep", core_sleep},
    {"now", core_now},
    {"random", core_random},
    {"retry_after_ms", core_retry_after_ms},
    {NULL, NULL},
};

int luaopen_esx_core(lua_State *L)
{
    esx_lerror_open(L);
    luaL_newlib(L, core_functions);
    esx_lclient_open(L);
    esx_lcollector_open(L);
    esx_ljson_open(L);
    esx_ljson_encode_open(L);
    esx_lcache_open(L);
    esx_levent_open(L);
    lua_pushliteral(L, ESX_VERSION);
    lua_setfield(L, -2, "version");
#if ESX_LUA51
    lua_pushliteral(L, "luajit");
#else
    lua_pushliteral(L, "lua5.4");
#endif
    lua_setfield(L, -2, "flavour");
    return 1;
}
