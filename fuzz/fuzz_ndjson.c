/*
 * fuzz_ndjson.c -- libFuzzer target for the NDJSON round-trip property.  The input is split
 * at 0xFF bytes into up to 100 pieces (newlines turned into spaces); the same pieces are
 * sent as a JSON array and as NDJSON, from the same id generator state:
 *   - when the array parses, n docs + n rejects == n pieces, and the NDJSON form (its first
 *     line an object, or more than one line) gives exactly the same documents and rejects;
 *   - a bulk body built from the docs (action line + doc per event) has exactly 2 lines per
 *     accepted event, and every line is flawless JSON.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "event.h"
#include "json.h"

#define MAXEV 100

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

static esx_event ev1[MAXEV], ev2[MAXEV];
static esx_event_reject rj1[MAXEV], rj2[MAXEV];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    esx_idgen ids0, ids;
    esx_idgen_init(&ids0);
    esx_buf arr, nd, out1, out2, bulk;
    esx_buf_init(&arr, 2 * size + 16);
    esx_buf_init(&nd, 2 * size + 16);
    esx_buf_init(&out1, 2 * size + MAXEV * 128 + 1024);
    esx_buf_init(&out2, 2 * size + MAXEV * 128 + 1024);
    esx_buf_init(&bulk, 8 * size + MAXEV * 256 + 1024);
    int pieces = 0, aligned = 1;
    esx_buf_append(&arr, "[", 1);
    for (size_t i = 0; i <= size && pieces < MAXEV;) {
        const uint8_t *ff = memchr(data + i, 0xFF, size - i);
        size_t end = ff ? (size_t)(ff - data) : size;
        if (pieces)
            esx_buf_append(&arr, ",", 1);
        for (size_t k = i; k < end; k++) {
            char ch = data[k] == '\n' ? ' ' : (char)data[k];

            esx_buf_append(&arr, &ch, 1);
            esx_buf_append(&nd, &ch, 1);
        }
        /* aligned: every piece is exactly one JSON value, so the array's elements are the
         * pieces (a 0xFF inside a string would otherwise swallow a separator) */
        {
            size_t from = nd.len - (end - i), pos = from;
            esx_json_val pv;
            if (esx_json_scan(nd.data ? nd.data : "", nd.len, &pos, &pv, NULL, 0) != 0 ||
                esx_json_skip_ws(nd.data, nd.len, pos) != nd.len)
                aligned = 0;
        }
        esx_buf_append(&nd, "\n", 1);
        pieces++;
        i = end + 1;
        if (!ff)
            break;
    }
    esx_buf_append(&arr, "]", 1);

    int ne1 = 0, nr1 = 0, ne2 = 0, nr2 = 0;
    char why[128];
    ids = ids0;
    int rc1 = esx_events_parse(arr.data, arr.len, 42, &ids, &out1, ev1, &ne1, rj1, &nr1, MAXEV,
                               why);
    if (rc1 == ESX_EV_OK) {
        size_t pos = 0;
        int count = 0;
        esx_json_val av, el;
        esx_json_iter it;
        check(esx_json_scan(arr.data, arr.len, &pos, &av, NULL, 0) == 0);
        esx_json_iter_init(&it, &av);
        while (esx_json_iter_next(&it, NULL, &el))
            count++;
        check(ne1 + nr1 == count);
        check(!aligned || count == pieces);
        size_t first = esx_json_skip_ws(nd.data, nd.len, 0);
        /* NDJSON: lines starting with an object, or more than one line (each one value) */
        if (aligned && first < nd.len && (nd.data[first] == '{' || pieces > 1)) {
            ids = ids0;
            int rc2 = esx_events_parse(nd.data, nd.len, 42, &ids, &out2, ev2, &ne2, rj2, &nr2,
                                       MAXEV, why);
            check(rc2 == ESX_EV_OK);
            check(ne1 == ne2 && nr1 == nr2);
            check(out1.len == out2.len && (out1.len == 0 || memcmp(out1.data, out2.data, out1.len) == 0));
            for (int i = 0; i < nr1; i++)
                check(rj1[i].index == rj2[i].index && strcmp(rj1[i].reason, rj2[i].reason) == 0);
        }
        /* the bulk body */
        for (int i = 0; i < ne1; i++) {
            esx_buf_appends(&bulk, "{\"index\":{\"_id\":\"");
            esx_buf_appends(&bulk, ev1[i].event_id);
            esx_buf_appends(&bulk, "\"}}\n");
            esx_buf_append(&bulk, out1.data + ev1[i].doc_off, ev1[i].doc_len);
            esx_buf_append(&bulk, "\n", 1);
        }
        int lines = 0;
        for (size_t i = 0; i < bulk.len;) {
            const char *nl = memchr(bulk.data + i, '\n', bulk.len - i);
            check(nl != NULL);
            size_t end = (size_t)(nl - bulk.data), lp = i;
            esx_json_val v;
            check(esx_json_scan(bulk.data, end, &lp, &v, NULL, 0) == 0 && lp == end &&
                  v.flaw == 0 && v.type == ESX_JSON_OBJECT);
            lines++;
            i = end + 1;
        }
        check(lines == 2 * ne1);
    }
    esx_buf_free(&arr);
    esx_buf_free(&nd);
    esx_buf_free(&out1);
    esx_buf_free(&out2);
    esx_buf_free(&bulk);
    return 0;
}
