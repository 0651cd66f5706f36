/*
 * engine_exit.c -- the engines of this process, stopped before its exit handlers run.
 *
 * A script that calls os.exit(), or an nginx worker that exits, runs the C library's exit
 * handlers while I/O threads may still be inside libcurl and OpenSSL.  OpenSSL registers one
 * that frees its global state (OPENSSL_cleanup): a TLS request in flight then crashed the
 * process about one exit in four.  This file registers its own handler after libcurl's
 * global init (so after OpenSSL's: handlers run in reverse order), which asks every I/O
 * thread of the process to stop and waits, at most EXIT_WAIT_MS, until all have left.
 * Nothing is freed there: the process is ending.  Threads esx does not stop -- a collector's
 * shipper goes on submitting -- must not start an I/O thread after that: a client whose
 * engine the handler stopped would rebuild it (self-healing) under OpenSSL's cleanup, so
 * from then on no engine is made (esx_eng_exiting), and one that was being made while the
 * handler ran is stopped when it joins the list.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "engine_int.h"
#include "proc.h"

#define EXIT_WAIT_MS 1000

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static esx_engine *live_head;    /* under live_mu */
static atomic_int io_threads;    /* I/O threads of this process not yet returned */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_int exiting_pid;   /* the process whose exit handler ran (set under live_mu) */

static void stop_all(void)
{
    pid_t me = esx_pid();
    pthread_mutex_lock(&live_mu);
    atomic_store(&exiting_pid, (int)me);
    for (esx_engine *e = live_head; e; e = e->live_next) {
        if (e->pid == me) {
            atomic_store(&e->stop, 1);
            curl_multi_wakeup(e->multi);
        }
    }
    pthread_mutex_unlock(&live_mu);
    struct timespec ms = {0, 1000000};
    for (int i = 0; i < EXIT_WAIT_MS && atomic_load(&io_threads) > 0; i++)
        nanosleep(&ms, NULL);
}

/* A fork must not copy live_mu held by another thread; the child has no I/O threads (its
 * copies of the parent's engines are abandoned, see esx_engine_abandon). */
static void before_fork(void)
{
    pthread_mutex_lock(&live_mu);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&live_mu);
}

static void after_fork_child(void)
{
    pthread_mutex_unlock(&live_mu);
    atomic_store(&io_threads, 0);
}

static void install(void)
{
    atexit(stop_all);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

void esx_eng_live_add(esx_engine *e)
{
    pthread_once(&once, install);
    pthread_mutex_lock(&live_mu);
    if (atomic_load(&exiting_pid) == (int)e->pid) {
        /* made by a thread that passed esx_eng_exiting just before the handler ran */
        atomic_store(&e->stop, 1);
        curl_multi_wakeup(e->multi);
    }
    e->live_prev = NULL;
    e->live_next = live_head;
    if (live_head)
        live_head->live_prev = e;
    live_head = e;
    pthread_mutex_unlock(&live_mu);
}

void esx_eng_live_remove(esx_engine *e)
{
    pthread_mutex_lock(&live_mu);
    if (e->live_prev)
        e->live_prev->live_next = e->live_next;
    else if (live_head == e)
        live_head = e->live_next;
    if (e->live_next)
        e->live_next->live_prev = e->live_prev;
    e->live_prev = e->live_next = NULL;
    pthread_mutex_unlock(&live_mu);
}

int esx_eng_exiting(void)
{
    return atomic_load(&exiting_pid) == (int)esx_pid();
}

void esx_eng_thread_starting(void)
{
    atomic_fetch_add(&io_threads, 1);
}

void esx_eng_thread_gone(void)
{
    atomic_fetch_sub(&io_threads, 1);
}
