/*
 * exit_rebuild.c -- a client used while the process exits, run by spec/collector_spec.lua.
 *
 * exit() runs esx's handler (engine_exit.c: every I/O thread is stopped, so that none is
 * inside OpenSSL when OpenSSL's own handler frees its state), then the handlers registered
 * before it -- OpenSSL's among them.  A collector's shipper thread is not stopped: it goes on
 * submitting, and a submit that found the stopped engine used to rebuild it, starting a new
 * I/O thread (TLS connects included) under OpenSSL's cleanup.  This program's handler runs
 * after esx's, as the shipper would: no engine may be built any more.
 * Prints "ok <name>" per check; exits 1 on a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "client.h"
#include "test_client.h"

static esx_client *client;

static void after_esx(void)
{
    char why[256] = "";
    esx_engine *before = client->engine;
    check(!esx_engine_healthy(before), "the engine was stopped by esx's exit handler");
    check(esx_client_heal(client, why) != 0, "heal builds no new engine once the process exits");
    check(client->engine == before, "the client keeps its stopped engine");
    check(strstr(why, "exiting") != NULL, "the reason says the process is exiting");
    esx_request *req = esx_client_prepare(client, "GET", "/", NULL, 0, NULL, NULL, 0, 0, 0, why);
    const char *kind = NULL;
    check(req != NULL && esx_client_submit(client, req, &kind, why) != 0,
          "a submit fails once the process exits");
    check(client->engine == before, "the submit built no engine either");
    esx_request_unref(req);
    fflush(stdout);
    _exit(fails ? 1 : 0);
}

int main(void)
{
    /* registered first, so it runs after esx's handler (which the first engine registers) */
    atexit(after_esx);
    client = test_client();
    check(client != NULL, "a client");
    if (client == NULL)
        return 1;
    check(esx_engine_healthy(client->engine), "its engine runs");
    exit(0);
}
