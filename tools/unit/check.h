/*
 * check.h -- the one assertion of the tools/unit programs: prints "ok <name>" or
 * "FAIL <name>" (the specs that run them count the lines) and counts the failures in
 * `fails`, which main returns as its exit status.
 */
#ifndef ESX_UNIT_CHECK_H
#define ESX_UNIT_CHECK_H

#include <stdio.h>

static int fails;

static void check(int cond, const char *name)
{
    printf("%s %s\n", cond ? "ok" : "FAIL", name);
    if (!cond)
        fails++;
}

#endif
