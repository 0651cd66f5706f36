/*
 * rollups_fork.c -- col:rollups() in a forked child, run by spec/collector_spec.lua.
 *
 * The rows are "the open window's rows of this process".  A child forked from a process that
 * had counted events read the parent's table (its rows, its counts) through the parent's copy
 * of the collector's lock -- which a thread that does not exist in the child (the parent's
 * shipper) may have held at the fork: then the child hung for ever.  It must adopt the
 * collector first, as col:stats() does: no rows until it counts its own.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "clock.h"
#include "collector.h"
#include "test_client.h"

static esx_collector *make(esx_client *client)
{
    esx_collector_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.index_fmt, sizeof cfg.index_fmt, "events-%%Y");
    cfg.max_body = 65536;
    cfg.max_events = 100;
    cfg.queue_max_bytes = 1 << 20;
    cfg.batch_max_bytes = 1 << 20;
    cfg.batch_max_events = 100;
    cfg.flush_interval = 1000;
    cfg.bulk_concurrency = 1;
    cfg.backoff_min = cfg.backoff_max = 1000;
    snprintf(cfg.dead_letter_path, sizeof cfg.dead_letter_path, "/dev/null");
    cfg.rollup_window = 60000;
    snprintf(cfg.rollup_index_fmt, sizeof cfg.rollup_index_fmt, "rollups-%%Y");
    cfg.rollup_interval = 10000;
    cfg.rollup_max_rows = 100;
    snprintf(cfg.instance, sizeof cfg.instance, "fork");
    cfg.max_sites = 100;
    char why[256];
    esx_collector *col = esx_collector_new(&cfg, client, why);
    if (col == NULL)
        fprintf(stderr, "collector: %s\n", why);
    return col;
}

int main(void)
{
    esx_client *client = test_client();
    esx_collector *col = client ? make(client) : NULL;
    if (col == NULL) {
        check(0, "a collector is made");
        return 1;
    }
    static const char body[] = "{\"site_id\":\"s1\",\"type\":\"view\"}";
    esx_intake out;
    int64_t now = esx_wall_ms();
    esx_collector_ingest(col, body, sizeof body - 1, 0, now, &out);
    esx_rollup_view *rows;
    size_t n;
    check(out.accepted == 1 && esx_collector_rollups(col, now, &rows, &n) == 0 && n == 1 &&
              rows[0].count == 1,
          "the parent counted its event");
    free(rows);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        /* (a watchdog: a child stuck on the parent's lock fails the check below) */
        alarm(10);
        int rc = esx_collector_rollups(col, now, &rows, &n);
        int own = rc == 0 && n == 0;
        free(rows);
        esx_collector_ingest(col, body, sizeof body - 1, 0, now, &out);
        rc = esx_collector_rollups(col, now, &rows, &n);
        own = own && rc == 0 && n == 1 && rows[0].count == 1;
        free(rows);
        _exit(own ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a forked child's rollups are its own: none, then its one event");
    check(esx_collector_rollups(col, now, &rows, &n) == 0 && n == 1 && rows[0].count == 1,
          "the parent's row is unchanged");
    free(rows);
    esx_collector_close(col, 0);
    esx_collector_free(col);
    esx_client_close(client);
    esx_client_unref(client);
    return fails ? 1 : 0;
}
