/*
 * lclass.c -- userdata classes, and boxes that own C memory during a call (see lclass.h).
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "lclass.h"

void esx_lclass(lua_State *L, const char *name, const luaL_Reg *methods, lua_CFunction gc,
                lua_CFunction tostring)
{
    if (luaL_newmetatable(L, name)) {
        if (methods) {
            lua_newtable(L);
            luaL_setfuncs(L, methods, 0);
            lua_setfield(L, -2, "__index");
        }
        if (gc) {
            lua_pushcfunction(L, gc);
            lua_setfield(L, -2, "__gc");
        }
        if (tostring) {
            lua_pushcfunction(L, tostring);
            lua_setfield(L, -2, "__tostring");
        }
        lua_pushstring(L, name); /* LuaJIT's luaL_newmetatable does not set it */
        lua_setfield(L, -2, "__name");
    }
    lua_pop(L, 1);
}

#define LBOX_MT "esx.box"
#define LBUF_MT "esx.buf"

static int lbox_gc(lua_State *L)
{
    void **box = luaL_checkudata(L, 1, LBOX_MT);
    free(*box);
    *box = NULL;
    return 0;
}

static int lbuf_gc(lua_State *L)
{
    esx_buf_free(luaL_checkudata(L, 1, LBUF_MT));
    return 0;
}

/* The metatables are made on first use in each Lua state (not by the module's luaopen): a
 * box must own its memory whoever opened the binding that pushes it -- a test harness or a
 * fuzzer that opens one binding alone, too. */
void **esx_lbox_push(lua_State *L)
{
    esx_lclass(L, LBOX_MT, NULL, lbox_gc, NULL);
    void **box = lua_newuserdata(L, sizeof *box);
    *box = NULL;
    luaL_setmetatable(L, LBOX_MT);
    return box;
}

esx_buf *esx_lbuf_push(lua_State *L, size_t max)
{
    esx_lclass(L, LBUF_MT, NULL, lbuf_gc, NULL);
    esx_buf *b = lua_newuserdata(L, sizeof *b);
    esx_buf_init(b, max);
    luaL_setmetatable(L, LBUF_MT);
    return b;
}

#define THREADED_MIN 32
static atomic_int threaded_open; /* in this process: made, neither closed nor collected */
static atomic_int threaded_gc_at = THREADED_MIN;

void esx_lthreaded_collect(lua_State *L)
{
    if (atomic_load(&threaded_open) < atomic_load(&threaded_gc_at))
        return;
    lua_gc(L, LUA_GCCOLLECT, 0); /* the dropped objects' __gc join their threads */
    int open = atomic_load(&threaded_open);
    atomic_store(&threaded_gc_at, 2 * open > THREADED_MIN ? 2 * open : THREADED_MIN);
}

void esx_lthreaded_add(int *counted)
{
    if (!*counted) {
        *counted = 1;
        atomic_fetch_add(&threaded_open, 1);
    }
}

void esx_lthreaded_remove(int *counted)
{
    if (*counted) {
        *counted = 0;
        atomic_fetch_sub(&threaded_open, 1);
    }
}
