/*
 * fuzz_event.c -- libFuzzer target: esx_events_parse (first byte even) and
 * esx_event_from_query (first byte odd) on arbitrary bytes.  Besides memory safety it checks
 * what event.h promises: every document is one flawless JSON object on one line with
 * "received_at" and "event_id", no member name twice; rejects carry in-range indexes and
 * printable reasons; on failure nothing is left in the output.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "event.h"
#include "json.h"

#define MAXEV 100

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#include "check.h"

static void check_reason(const char *r, size_t cap)
{
    size_t n = strnlen(r, cap);
    check(n > 0 && n < cap);
    for (size_t i = 0; i < n; i++)
        check((unsigned char)r[i] >= 0x20 && (unsigned char)r[i] < 0x7F);
}

static int has_member(const esx_json_val *obj, const char *name)
{
    esx_json_iter it;
    esx_json_val k, v;
    int n = 0;
    esx_json_iter_init(&it, obj);
    while (esx_json_iter_next(&it, &k, &v))
        n += esx_json_str_eq(&k, name, strlen(name));
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static esx_idgen ids;
    static int init;
    if (!init) {
        esx_idgen_init(&ids);
        init = 1;
    }
    if (size == 0)
        return 0;
    int query = data[0] & 1;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    static esx_event ev[MAXEV];
    static esx_event_reject rj[MAXEV];
    int ne = -1, nr = -1;
    char why[128];
    esx_buf out;
    esx_buf_init(&out, 8 * len + MAXEV * 128 + 2048);
    int rc = query ? esx_event_from_query(body, len, 1700000000123LL, &ids, &out, ev, &ne, rj,
                                          &nr, why)
                   : esx_events_parse(body, len, 1700000000123LL, &ids, &out, ev, &ne, rj, &nr,
                                      MAXEV, why);
    if (rc != ESX_EV_OK) {
        check(rc == ESX_EV_NOT_JSON || rc == ESX_EV_TOO_MANY);
        check(out.len == 0 && ne == 0 && nr == 0);
        check(strnlen(why, sizeof why) < sizeof why && why[0]);
        esx_buf_free(&out);
        return 0;
    }
    check(ne >= 0 && nr >= 0 && ne + nr <= (query ? 1 : MAXEV));
    size_t end = 0;
    for (int i = 0; i < ne; i++) {
        const esx_event *e = &ev[i];
        check(e->doc_off == end && e->doc_off + e->doc_len < out.len + 0);
        check(out.data[e->doc_off + e->doc_len] == '\n');
        end = e->doc_off + e->doc_len + 1;
        const char *doc = out.data + e->doc_off;
        check(memchr(doc, '\n', e->doc_len) == NULL && memchr(doc, '\r', e->doc_len) == NULL);
        size_t pos = 0;
        esx_json_val v;
        check(esx_json_scan(doc, e->doc_len, &pos, &v, NULL, 0) == 0);
        check(pos == e->doc_len && v.type == ESX_JSON_OBJECT && v.flaw == 0);
        check(v.depth <= ESX_EVENT_MAX_DEPTH);
        check(esx_json_duplicate(&v) == 0);
        check(has_member(&v, "received_at") == 1 && has_member(&v, "event_id") == 1);
        check(has_member(&v, "site_id") == 1 && has_member(&v, "type") == 1);
        /* minified: no whitespace outside strings */
        esx_buf again;
        esx_buf_init(&again, e->doc_len);
        check(esx_json_write_min(&v, &again) == ESX_BUF_OK && again.len == e->doc_len &&
              memcmp(again.data, doc, e->doc_len) == 0);
        esx_buf_free(&again);
        size_t l = strnlen(e->event_id, sizeof e->event_id);
        check(l >= 1 && l <= 64);
        l = strnlen(e->site_id, sizeof e->site_id);
        check(l >= 1 && l <= 64);
        l = strnlen(e->type, sizeof e->type);
        check(l >= 1 && l <= 32);
        check(strnlen(e->user_id, sizeof e->user_id) < sizeof e->user_id);
    }
    check(end == out.len);
    for (int i = 0; i < nr; i++) {
        check(rj[i].index >= 0 && rj[i].index < ne + nr);
        if (i)
            check(rj[i].index > rj[i - 1].index);
        check_reason(rj[i].reason, sizeof rj[i].reason);
    }
    esx_buf_free(&out);
    return 0;
}
