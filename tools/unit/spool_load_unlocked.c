/*
 * spool_load_unlocked.c -- the intake answers while the shipper reads the spool from a slow
 * disk, run by spec/collector_spec.lua.  A dead process's segment waits in the spool
 * directory; the collector's shipper claims it and loads its records, and pread(2) (replaced
 * here) takes 1.5 s for the first read of it.  The shipper held the collector's lock across
 * those reads, and every request waited for the disk meanwhile (the intake takes the same
 * lock): "answer at once" depended on the disk.  Prints "ok <name>" per check; exits 1 on a
 * failure.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "collector.h"
#include "spool.h"
#include "test_client.h"

static atomic_int slow;          /* the next pread sleeps SLOW_MS */
static atomic_int read_started;  /* a slow pread is under way */
#define SLOW_MS 1500

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
    int expected = 1;
    if (atomic_compare_exchange_strong(&slow, &expected, 0)) {
        atomic_store(&read_started, 1);
        struct timespec ts = {SLOW_MS / 1000, (SLOW_MS % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    return syscall(SYS_pread64, fd, buf, n, off);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const char EVENT[] = "{\"site_id\":\"s1\",\"type\":\"view\"}";

int main(void)
{
    char dir[] = "/tmp/esx-loadunlocked-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    /* a dead process's segment: two overflow records, left on disk by a child that exits
     * without closing its spool */
    pid_t pid = fork();
    if (pid == 0) {
        char why[256];
        esx_spool *sp = esx_spool_open(dir, 1 << 20, why);
        if (sp == NULL)
            _exit(1);
        for (int i = 1; i <= 2; i++) {
            char rec[128];
            int n = snprintf(rec, sizeof rec,
                             "{\"create\":{\"_index\":\"events\",\"_id\":\"r%d\"}}\n"
                             "{\"site_id\":\"s1\",\"type\":\"view\"}\n", i);
            esx_segment *seg = NULL;
            if (esx_spool_append(sp, rec, (size_t)n, 1, &seg, why) != 0)
                _exit(1);
        }
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        return 1;

    esx_client *client = test_client();
    if (client == NULL)
        return 1;
    esx_collector_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.index_fmt, sizeof cfg.index_fmt, "events");
    cfg.max_body = 65536;
    cfg.max_events = 100;
    cfg.queue_max_bytes = 1 << 20;
    cfg.batch_max_bytes = 1 << 20;
    cfg.batch_max_events = 5000;
    cfg.flush_interval = 1000;
    cfg.bulk_concurrency = 1;
    cfg.backoff_min = 100;
    cfg.backoff_max = 30000;
    snprintf(cfg.spool_dir, sizeof cfg.spool_dir, "%s", dir);
    cfg.spool_sync_interval = 1000;
    cfg.spool_segment_bytes = 1 << 20;
    cfg.spool_max_bytes = 1 << 30;
    snprintf(cfg.dead_letter_path, sizeof cfg.dead_letter_path, "%s/dead-letter.ndjson", dir);
    cfg.dead_letter_max_bytes = 1 << 30;
    snprintf(cfg.instance, sizeof cfg.instance, "unit");
    cfg.max_sites = 1000;
    char why[256];
    esx_collector *col = esx_collector_new(&cfg, client, why);
    if (col == NULL) {
        fprintf(stderr, "%s\n", why);
        return 1;
    }

    /* the first request starts the shipper, which claims the segment and reads it */
    atomic_store(&slow, 1);
    esx_intake out;
    esx_collector_ingest(col, EVENT, sizeof EVENT - 1, 0, 1700000000000, &out);
    check(out.status == 204, "the first request is accepted");
    for (int i = 0; i < 500 && !atomic_load(&read_started); i++)
        sleep_ms(10);
    check(atomic_load(&read_started), "the shipper reads the dead process's segment");

    int64_t t0 = now_ms();
    esx_collector_ingest(col, EVENT, sizeof EVENT - 1, 0, 1700000000000, &out);
    int64_t took = now_ms() - t0;
    check(out.status == 204, "a request during the slow read is accepted");
    if (took >= 500)
        fprintf(stderr, "the request waited %lld ms for the shipper's read\n", (long long)took);
    check(took < 500, "a request does not wait for the shipper's read of the spool");

    esx_collector_counters st;
    int64_t deadline = now_ms() + 10000;
    do {
        sleep_ms(10);
        esx_collector_stats(col, &st);
    } while (st.replayed < 2 + st.spilled && now_ms() < deadline);
    /* the dead process's two events, and those of the requests that were written to the
     * spool's overflow behind them (older events wait on disk, which go first) */
    if (st.replayed != 2 + st.spilled)
        fprintf(stderr, "replayed %llu, spilled %llu\n", (unsigned long long)st.replayed,
                (unsigned long long)st.spilled);
    check(st.replayed == 2 + st.spilled, "the records are loaded once the read ends");

    esx_collector_close(col, 0);
    esx_collector_free(col);
    esx_client_unref(client);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return fails ? 1 : 0;
}
