/*
 * proc.c -- the cached process id (see proc.h).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "proc.h"

static atomic_int cached; /* 0 until first use, and again in a new child */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void forget(void)
{
    atomic_store(&cached, 0);
}

static void install(void)
{
    pthread_atfork(NULL, NULL, forget);
}

pid_t esx_pid(void)
{
    int pid = atomic_load(&cached);
    if (pid != 0)
        return (pid_t)pid;
    pthread_once(&once, install);
    pid = (int)getpid();
    atomic_store(&cached, pid);
    return (pid_t)pid;
}
