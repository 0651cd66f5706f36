/*
 * spool_read_error.c -- a spool segment with a block that cannot be read (EIO: a bad sector)
 * inside its second record, run by spec/collector_spec.lua.  The replay must skip that
 * record and go on with the third: a read error is not the end of the segment.  pread(2) is
 * replaced here: it fails with EIO for any read that touches the bad block.  Prints
 * "ok <name>" per check; exits 1 on a failure.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "spool.h"

static off_t bad_lo = -1, bad_hi = -1; /* the unreadable bytes */
static int failed_reads;

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    if (n > 0 && off < bad_hi && off + (off_t)n > bad_lo) {
        failed_reads++;
        errno = EIO;
        return -1;
    }
    return syscall(SYS_pread64, fd, buf, n, off);
}

static char loaded[8][16];
static int n_loaded;

static int64_t take(void *ud, esx_segment *seg, const char *data, size_t len)
{
    (void)ud, (void)seg;
    const char *id = memmem(data, len, "\"_id\":\"", 7);
    if (n_loaded < 8 && id)
        snprintf(loaded[n_loaded++], sizeof loaded[0], "%.2s", id + 7);
    return 1;
}

int main(void)
{
    char dir[] = "/tmp/esx-readerr-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char why[256];
    esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
    if (sp == NULL)
        return 1;
    /* three records of 9000 bytes: at 0, 9008 and 18016 (8 bytes of header each) */
    static char rec[9000];
    for (int i = 1; i <= 3; i++) {
        int h = snprintf(rec, sizeof rec, "{\"create\":{\"_id\":\"r%d\"}}\n{\"pad\":\"", i);
        memset(rec + h, 'x', sizeof rec - (size_t)h - 3);
        memcpy(rec + sizeof rec - 3, "\"}\n", 3);
        esx_segment *seg = NULL;
        if (esx_spool_append(sp, rec, sizeof rec, 1, &seg, why) != 0)
            return 1;
    }
    /* a 4 KiB block inside the second record's payload cannot be read */
    bad_lo = 12288;
    bad_hi = 16384;
    esx_spool_load(sp, SIZE_MAX, take, NULL, NULL);
    check(failed_reads > 0, "the bad block was read");
    check(n_loaded == 2 && strcmp(loaded[0], "r1") == 0 && strcmp(loaded[1], "r3") == 0,
          "the records before and after the unreadable one are replayed");
    check(sp->bytes_skipped == 9008, "the unreadable record is counted as skipped");
    esx_spool_close(sp);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
