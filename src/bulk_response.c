/*
 * bulk_response.c -- per-item results of an Elasticsearch _bulk response (see
 * bulk_response.h).  The whole body is checked by the strict scanner first (a flaw anywhere
 * makes it invalid); then only "items" is walked.  Error texts are decoded, cut to fit at a
 * UTF-8 boundary, and control characters become spaces so that a reason is one log line.
 */
#include <stdio.h>
#include <string.h>

#include "bulk_response.h"
#include "json.h"

static void copy_text(const esx_json_val *v, char *dst, size_t cap)
{
    size_t l = esx_json_str_decode(v, dst, cap - 1);
    if (l > cap - 1) {
        l = cap - 1;
        /* do not end inside a UTF-8 sequence */
        size_t k = l;
        while (k > 0 && ((unsigned char)dst[k - 1] & 0xC0) == 0x80)
            k--;
        if (k > 0 && (unsigned char)dst[k - 1] >= 0xC0) {
            unsigned char lead = (unsigned char)dst[k - 1];
            size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
            if (l - (k - 1) < want)
                l = k - 1;
        }
    }
    for (size_t i = 0; i < l; i++)
        if ((unsigned char)dst[i] < 0x20 || dst[i] == 0x7F)
            dst[i] = ' ';
    dst[l] = '\0';
}

/* status: an integer 0..999, else 0 */
static int status_of(const esx_json_val *v)
{
    if (v->type != ESX_JSON_NUMBER || v->len > 3)
        return 0;
    int s = 0;
    for (size_t i = 0; i < v->len; i++) {
        if (v->p[i] < '0' || v->p[i] > '9')
            return 0;
        s = s * 10 + (v->p[i] - '0');
    }
    return s;
}

static void read_error(const esx_json_val *e, esx_bulk_item *it)
{
    if (e->type == ESX_JSON_STRING) {
        snprintf(it->error_type, sizeof it->error_type, "error");
        copy_text(e, it->reason, sizeof it->reason);
        return;
    }
    if (e->type != ESX_JSON_OBJECT)
        return;
    esx_json_iter in;
    esx_json_val k, v;
    esx_json_iter_init(&in, e);
    while (esx_json_iter_next(&in, &k, &v)) {
        if (v.type != ESX_JSON_STRING)
            continue;
        if (esx_json_str_eq(&k, "type", 4))
            copy_text(&v, it->error_type, sizeof it->error_type);
        else if (esx_json_str_eq(&k, "reason", 6))
            copy_text(&v, it->reason, sizeof it->reason);
    }
    if (!it->error_type[0])
        snprintf(it->error_type, sizeof it->error_type, "error");
}

int esx_bulk_response_parse(const char *body, size_t len, esx_bulk_item *items, int n,
                            char *why)
{
    size_t pos = 0;
    esx_json_val top, k, v, items_v = {0};
    char w[128];
    if (why)
        why[0] = '\0';
    if (esx_json_scan(body, len, &pos, &top, w, sizeof w) != 0) {
        if (why)
            snprintf(why, 128, "%s", w);
        return -1;
    }
    if ((pos = esx_json_skip_ws(body, len, pos)) != len) {
        if (why)
            snprintf(why, 128, "invalid JSON at byte %zu: trailing bytes", pos);
        return -1;
    }
    if (top.flaw) {
        if (why)
            snprintf(why, 128, "invalid JSON: %s", esx_json_flaw_str(top.flaw));
        return -1;
    }
    if (top.type != ESX_JSON_OBJECT) {
        if (why)
            snprintf(why, 128, "not a bulk response: not an object");
        return -1;
    }
    esx_json_iter it;
    esx_json_iter_init(&it, &top);
    int found = 0;
    while (esx_json_iter_next(&it, &k, &v))
        if (esx_json_str_eq(&k, "items", 5)) {
            if (found) {
                if (why)
                    snprintf(why, 128, "not a bulk response: two \"items\"");
                return -1;
            }
            items_v = v;
            found = 1;
        }
    if (!found || items_v.type != ESX_JSON_ARRAY) {
        if (why)
            snprintf(why, 128, "not a bulk response: no \"items\" array");
        return -1;
    }
    /* one walk: items are read as they come and counted to the end; a wrong count is
     * reported before a malformed item, as when they were two walks */
    int count = 0, bad = -1;
    esx_json_iter_init(&it, &items_v);
    while (esx_json_iter_next(&it, NULL, &v)) {
        if (count++ >= n || bad >= 0)
            continue;
        esx_bulk_item *item = &items[count - 1];
        memset(item, 0, sizeof *item);
        /* {"<action>": {...}} */
        esx_json_iter ai;
        esx_json_val ak, av = {0}, extra;
        int one = 0;
        if (v.type == ESX_JSON_OBJECT) {
            esx_json_iter_init(&ai, &v);
            one = esx_json_iter_next(&ai, &ak, &av) && !esx_json_iter_next(&ai, &ak, &extra);
        }
        if (!one || av.type != ESX_JSON_OBJECT) {
            bad = count - 1;
            continue;
        }
        esx_json_iter fi;
        esx_json_val fk, fv;
        esx_json_iter_init(&fi, &av);
        while (esx_json_iter_next(&fi, &fk, &fv)) {
            if (esx_json_str_eq(&fk, "status", 6))
                item->status = status_of(&fv);
            else if (esx_json_str_eq(&fk, "error", 5))
                read_error(&fv, item);
        }
    }
    if (count != n || n < 0) {
        if (why)
            snprintf(why, 128, "bulk response lists %d items, expected %d", count, n);
        return -1;
    }
    if (bad >= 0) {
        if (why)
            snprintf(why, 128, "not a bulk response: item %d is not {\"<action>\":{...}}", bad);
        return -1;
    }
    return 0;
}
