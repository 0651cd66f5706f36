/*
 * rset_blob.c -- esx_rset_deserialize on blobs that esx_rset_serialize did not write as they
 * are (a reader set handed between nginx workers through shared memory), run by
 * spec/cache_spec.lua: every truncation is refused, and so is a blob with bytes past its
 * last part -- what a part count that lost a bit looks like -- instead of a set that has
 * silently lost the readers of its later parts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_rset.h"
#include "check.h"

int main(void)
{
    esx_rset *s = esx_rset_new();
    for (uint64_t i = 0; i < 5000; i++) /* three parts (high keys 0, 1, 2), bitmaps */
        esx_rset_add(s, ((i % 3) << 32) | (i * 7));
    esx_rset_optimize(s);
    size_t n = esx_rset_serialized_size(s);
    char *buf = malloc(n + 1);
    check(buf != NULL && esx_rset_serialize(s, buf, n) == n, "serialise three parts");
    esx_rset *t = esx_rset_deserialize(buf, n);
    check(t != NULL && esx_rset_cardinality(t) == 5000, "round trip");
    esx_rset_free(t);

    int refused = 1;
    for (size_t len = 0; len < n; len++) {
        t = esx_rset_deserialize(buf, len);
        if (t != NULL)
            refused = 0;
        esx_rset_free(t);
    }
    check(refused, "every truncation refused");

    buf[n] = 0;
    t = esx_rset_deserialize(buf, n + 1);
    check(t == NULL, "a byte past the last part refused");
    esx_rset_free(t);

    uint32_t parts = 2; /* the count 3 with its low bit lost */
    memcpy(buf, &parts, 4);
    t = esx_rset_deserialize(buf, n);
    check(t == NULL, "a part count lower than the parts refused");
    esx_rset_free(t);
    free(buf);
    esx_rset_free(s);
    return fails ? 1 : 0;
}
