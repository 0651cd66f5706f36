/*
 * proc.c -- the cached process id (see proc.h).
 */
#include <pthread.h>
#include <signal.h>
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

int esx_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg)
{
    sigset_t all, old;
    sigfillset(&all);
    /* (faults stay deliverable: blocked, they would kill the process without its handler) */
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    sigdelset(&all, SIGABRT);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(thread, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}
