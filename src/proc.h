/*
 * proc.h -- this process's id without a system call per use.
 *
 * Every esx object checks on each call whether it runs in the process that created it
 * (nginx forks workers after init_by_lua).  glibc's getpid() is a system call; esx_pid()
 * caches the id and refreshes it in a pthread_atfork child handler, so the check is a load.
 */
#ifndef ESX_PROC_H
#define ESX_PROC_H

#include <pthread.h>
#include <sys/types.h>

/* The current process id (never fails). */
pid_t esx_pid(void);

/* pthread_create for esx's own threads (the I/O thread, a collector's shipper): they start
 * with every asynchronous signal blocked, so that a signal sent to the process is handled by
 * one of the host's threads.  nginx's master blocks its signals except in sigsuspend(): a
 * thread that took them (made in init_by_lua with `daemon off`) ran nginx's handler without
 * waking the master, which then missed a worker's death (never respawned it), a reload or a
 * quit until another signal came.  Returns pthread_create's answer. */
int esx_thread_start(pthread_t *thread, void *(*fn)(void *), void *arg);

#endif
