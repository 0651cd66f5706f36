/*
 * fork_adopt.c -- a client's first use in a forked child by two threads at once, run by
 * spec/collector_spec.lua.
 *
 * In an nginx worker the Lua thread and a collector's shipper thread share the client made in
 * the master.  Its lock is made anew on the first use in the child (the parent's copy may be
 * held by a thread that does not exist there); done by each thread that saw the parent's pid,
 * a second thread re-initialised the lock the first one held, both went in, and both built an
 * engine for the child: one was lost, its I/O thread running for ever.  Each trial forks a
 * child whose two threads use the client at once; it must end with one I/O thread.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "client.h"
#include "test_client.h"

#define TRIALS 200

static esx_client *client;
static atomic_int ready;

static void *use(void *arg)
{
    char why[256];
    atomic_fetch_add(&ready, 1);
    while (atomic_load(&ready) < 2)
        ; /* both threads spin: they start within nanoseconds of each other */
    esx_client_heal(client, why);
    return arg;
}

static int threads(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    if (d == NULL)
        return -1;
    for (struct dirent *de; (de = readdir(d)) != NULL;)
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The child: two threads adopt the client at once; exits 0 when it then has one engine. */
static void child(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, use, NULL) != 0)
        _exit(2);
    use(NULL);
    pthread_join(t, NULL);
    /* this thread and the one engine's I/O thread (a lost engine's would be a third, for
     * ever).  The joined thread may still be listed for a moment after pthread_join (the
     * kernel clears its tid before it releases the task): look again for up to 500 ms. */
    int n = threads();
    for (int i = 0; i < 50 && n != 2; i++) {
        usleep(10000);
        n = threads();
    }
    _exit(n == 2 && esx_engine_healthy(client->engine) ? 0 : 1);
}

int main(void)
{
    client = test_client();
    check(client != NULL, "a client");
    if (client == NULL)
        return 1;
    int bad = 0, broken = 0;
    for (int i = 0; i < TRIALS; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0)
            child();
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
            broken++;
        else if (WEXITSTATUS(status) != 0)
            bad++;
    }
    check(broken == 0, "every child ran");
    if (bad)
        printf("# %d of %d children built two engines\n", bad, TRIALS);
    check(bad == 0, "each child built one engine, whichever thread came first");
    esx_client_unref(client);
    return fails ? 1 : 0;
}
