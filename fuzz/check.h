/*
 * check.h -- the assertion every fuzz target uses: a broken promise aborts, so libFuzzer
 * keeps the input as a crasher (and the replay driver fails on it).
 */
#ifndef ESX_FUZZ_CHECK_H
#define ESX_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define check(ok) \
    do { \
        if (!(ok)) { \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #ok); \
            abort(); \
        } \
    } while (0)

#endif
