/*
 * spool_seal_sync.c -- many segments sealed between two syncs (a small spool_segment_bytes,
 * a busy collector), run by spec/collector_spec.lua.  esx_spool_append runs under the
 * collector's lock, on a request's way to its answer: it must never wait for the disk.  With
 * 8 sealed segments already waiting, seal() ran fdatasync inline.  The shipper's sync --
 * esx_spool_sync_begin and _end, again while sealed segments wait -- must still sync every
 * sealed segment, through descriptors closed on exec.  fdatasync is replaced here: it counts
 * the calls.  Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"

static int syncs, file_syncs;

int fdatasync(int fd)
{
    struct stat st;
    syncs++;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
        file_syncs++;
    return (int)syscall(SYS_fdatasync, fd);
}

int main(void)
{
    char dir[] = "/tmp/esx-sealsync-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char why[256];
    esx_spool *sp = esx_spool_open(dir, 16, why); /* every record fills its segment */
    if (sp == NULL)
        return 1;
    static const char rec[] = "{\"create\":{}}\n{}\n";
    esx_segment *segs[40];
    for (int i = 0; i < 40; i++)
        if (esx_spool_append(sp, rec, sizeof rec - 1, 0, &segs[i], why) != 0)
            return 1;
    check(syncs == 0, "no append waits for the disk (40 segments, 39 sealed)");
    check(esx_spool_sync_wanted(sp), "the spool asks for a sync before its interval");
    int rounds = 0, inherited = 0;
    do {
        int fds[ESX_SPOOL_SYNC_FDS];
        int n = esx_spool_sync_begin(sp, fds);
        for (int i = 0; i < n; i++)
            inherited += !(fcntl(fds[i], F_GETFD) & FD_CLOEXEC);
        if (esx_spool_sync_end(fds, n) != 0)
            return 1;
        rounds++;
    } while (sp->n_unsynced > 0 && rounds < 100);
    /* (a program another thread starts meanwhile -- io.popen -- kept a copy of a segment,
     * its disk space held after the unlink for as long as that program ran) */
    check(inherited == 0, "the descriptors a sync takes are closed on exec");
    check(file_syncs == 40, "the sync passes sync the 39 sealed segments and the current one");
    check(sp->n_unsynced == 0 && !esx_spool_sync_wanted(sp), "then nothing waits");
    esx_spool_close(sp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
