/*
 * proc.h -- this process's id without a system call per use.
 *
 * Every esx object checks on each call whether it runs in the process that created it
 * (nginx forks workers after init_by_lua).  glibc's getpid() is a system call; esx_pid()
 * caches the id and refreshes it in a pthread_atfork child handler, so the check is a load.
 */
#ifndef ESX_PROC_H
#define ESX_PROC_H

#include <sys/types.h>

/* The current process id (never fails). */
pid_t esx_pid(void);

#endif
