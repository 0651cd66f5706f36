/*
 * fuzz_rset.c -- libFuzzer target: esx_rset_deserialize (esx.cache's reader sets, handed
 * between nginx workers through shared memory) on arbitrary bytes.  An accepted set answers
 * membership without reading out of bounds, measures its memory, grows, and serialises to
 * bytes that deserialise to a set of the same cardinality.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_rset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    esx_rset *s = esx_rset_deserialize((const char *)data, size);
    if (s == NULL)
        return 0;
    uint64_t card = esx_rset_cardinality(s);
    check(esx_rset_bytes(s) > 0);
    for (size_t i = 0; i + 8 <= size && i < 256; i += 8) { /* the input's words as ids */
        uint64_t id;
        memcpy(&id, data + i, 8);
        id &= ESX_RSET_MAX_ID;
        int had = esx_rset_contains(s, id);
        int added = esx_rset_add(s, id);
        check(added == !had);
        card += (uint64_t)added;
        check(esx_rset_contains(s, id));
    }
    check(esx_rset_cardinality(s) == card);
    esx_rset_optimize(s);
    size_t need = esx_rset_serialized_size(s);
    char *buf = malloc(need ? need : 1);
    check(buf != NULL);
    size_t n = esx_rset_serialize(s, buf, need);
    check(n == need);
    esx_rset *t = esx_rset_deserialize(buf, n);
    check(t != NULL && esx_rset_cardinality(t) == card);
    esx_rset_free(t);
    free(buf);
    esx_rset_free(s);
    return 0;
}
