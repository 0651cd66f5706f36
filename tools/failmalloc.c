/*
 * failmalloc.c -- an allocation fault injector, preloaded (LD_PRELOAD) into lua5.4 or luajit
 * by the allocation-failure sweeps (tools/oom/, spec/oom_spec.lua).
 *
 * malloc, calloc, realloc, posix_memalign, aligned_alloc, memalign and valloc are wrapped:
 * once armed, the n-th of them to be counted fails (NULL and ENOMEM, or ENOMEM for
 * posix_memalign), and so do the `count` - 1 counted after it (count 0: every one after it).
 * A realloc that does not grow its block beyond the block's usable size is never failed:
 * Lua counts on a shrinking realloc to succeed.  free is glibc's own.  epoll_ctl's
 * EPOLL_CTL_ADD, which allocates in the kernel, is counted with them and fails with ENOMEM.
 *
 * Arming:
 *   - from the environment at start: ESX_FAILMALLOC="n[,count[,scope]]";
 *   - from Lua: the same file is a Lua module (`require "failmalloc"`, with its directory on
 *     package.cpath; dlopen finds the preloaded copy, so both share one state):
 *       fm.arm(n [, count [, scope]])   counting starts now
 *       fm.disarm() -> injected, counted    failures injected and calls counted since arm
 *       fm.injected() -> injected           without disarming
 *       fm.inuse() -> bytes                 the heap's bytes in use (mallinfo2), for leaks
 *     It is compiled against Lua 5.4's headers and links no Lua: it uses only functions
 *     LuaJIT's API has with the same ABI (lua_createtable, lua_setfield, lua_pushcclosure,
 *     lua_pushinteger, luaL_checkinteger, luaL_optinteger, lua_tolstring).
 *   scope is a string of flags: "esx" counts only calls made directly by esx's core.so (its
 *   mapped text, found when arming), "thread" only calls from the thread that armed it;
 *   "" or absent: every call of every thread (Lua 5.4's own allocator included: Lua turns
 *   the failure into a "not enough memory" error after an emergency collection).
 *
 * Build: cc -shared -fPIC -O1 -I/usr/include/lua5.4 tools/failmalloc.c -o build/failmalloc.so
 */
#include <errno.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *ptr, size_t size);
extern void *__libc_memalign(size_t align, size_t size);

static atomic_long countdown;    /* 0: disarmed; else counted calls left before failing */
static atomic_long fail_left;    /* failures still to inject once countdown reached 0 */
static atomic_int fail_forever;  /* count 0: every counted call after the n-th fails */
static atomic_long injected, counted;
static int scope_esx, scope_thread;
static pthread_t armed_by;
static uintptr_t esx_lo, esx_hi;

static int find_esx(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    (void)data;
    if (info->dlpi_name == NULL || strstr(info->dlpi_name, "esx/core.so") == NULL)
        return 0;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr;
        if (a < lo)
            lo = a;
        if (a + ph->p_memsz > hi)
            hi = a + ph->p_memsz;
    }
    esx_lo = lo;
    esx_hi = hi;
    return 1;
}

/* 1: this call fails */
static int should_fail(void *caller)
{
    if (atomic_load_explicit(&countdown, memory_order_relaxed) == 0 &&
        atomic_load_explicit(&fail_left, memory_order_relaxed) == 0 &&
        !atomic_load_explicit(&fail_forever, memory_order_relaxed))
        return 0;
    if (scope_esx && ((uintptr_t)caller < esx_lo || (uintptr_t)caller >= esx_hi))
        return 0;
    if (scope_thread && !pthread_equal(pthread_self(), armed_by))
        return 0;
    atomic_fetch_add(&counted, 1);
    long c = atomic_load(&countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&countdown, &c, c - 1)) {
            if (c > 1)
                return 0;
            goto fail; /* this is the n-th */
        }
    }
    if (atomic_load(&fail_forever))
        goto fail;
    long f = atomic_load(&fail_left);
    while (f > 0)
        if (atomic_compare_exchange_weak(&fail_left, &f, f - 1))
            goto fail;
    return 0;
fail:
    atomic_fetch_add(&injected, 1);
    return 1;
}

static void arm(long n, long count, const char *scope)
{
    atomic_store(&countdown, 0);
    atomic_store(&fail_forever, 0);
    atomic_store(&fail_left, 0);
    scope_esx = scope && strstr(scope, "esx") != NULL;
    scope_thread = scope && strstr(scope, "thread") != NULL;
    armed_by = pthread_self();
    if (scope_esx && esx_hi == 0)
        dl_iterate_phdr(find_esx, NULL);
    atomic_store(&injected, 0);
    atomic_store(&counted, 0);
    if (n <= 0)
        return;
    if (count <= 0)
        atomic_store(&fail_forever, 1);
    else
        atomic_store(&fail_left, count - 1);
    atomic_store(&countdown, n);
}

static void disarm(void)
{
    atomic_store(&countdown, 0);
    atomic_store(&fail_forever, 0);
    atomic_store(&fail_left, 0);
}

__attribute__((constructor)) static void from_env(void)
{
    const char *e = getenv("ESX_FAILMALLOC");
    if (e == NULL || *e == '\0')
        return;
    char *end;
    long n = strtol(e, &end, 10), count = 1;
    const char *scope = NULL;
    if (*end == ',') {
        count = strtol(end + 1, &end, 10);
        if (*end == ',')
            scope = end + 1;
    }
    arm(n, count, scope);
}

int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
    if (op == EPOLL_CTL_ADD && should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return -1;
    }
    return (int)syscall(SYS_epoll_ctl, epfd, op, fd, ev);
}

void *malloc(size_t size)
{
    if (should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
    if (should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_calloc(n, size);
}

void *realloc(void *ptr, size_t size)
{
    if ((ptr == NULL || size > malloc_usable_size(ptr)) && should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(ptr, size);
}

int posix_memalign(void **out, size_t align, size_t size)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return EINVAL;
    if (should_fail(__builtin_return_address(0)))
        return ENOMEM;
    void *p = __libc_memalign(align, size);
    if (p == NULL)
        return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t size)
{
    if (should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_memalign(align, size);
}

void *memalign(size_t align, size_t size)
{
    if (should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_memalign(align, size);
}

void *valloc(size_t size)
{
    if (should_fail(__builtin_return_address(0))) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_memalign(4096, size);
}

/* ---------------------------------------------------------------- the Lua side */

static int l_arm(lua_State *L)
{
    long n = (long)luaL_checkinteger(L, 1);
    long count = (long)luaL_optinteger(L, 2, 1);
    const char *scope = lua_tolstring(L, 3, NULL);
    arm(n, count, scope);
    return 0;
}

static int l_disarm(lua_State *L)
{
    disarm();
    lua_pushinteger(L, (lua_Integer)atomic_load(&injected));
    lua_pushinteger(L, (lua_Integer)atomic_load(&counted));
    return 2;
}

static int l_inuse(lua_State *L)
{
    struct mallinfo2 mi = mallinfo2();
    lua_pushinteger(L, (lua_Integer)mi.uordblks);
    return 1;
}

static int l_injected(lua_State *L)
{
    lua_pushinteger(L, (lua_Integer)atomic_load(&injected));
    return 1;
}

int luaopen_failmalloc(lua_State *L);

int luaopen_failmalloc(lua_State *L)
{
    lua_createtable(L, 0, 4);
    lua_pushcclosure(L, l_arm, 0);
    lua_setfield(L, -2, "arm");
    lua_pushcclosure(L, l_disarm, 0);
    lua_setfield(L, -2, "disarm");
    lua_pushcclosure(L, l_injected, 0);
    lua_setfield(L, -2, "injected");
    lua_pushcclosure(L, l_inuse, 0);
    lua_setfield(L, -2, "inuse");
    return 1;
}
