/*
 * fuzz_json.c -- libFuzzer target: the JSON scanner itself (json.h).  For any accepted value:
 * the minified form scans to the same type, depth and flaw, minifies to itself, and holds no
 * whitespace outside strings; every string of a flawless value decodes to valid UTF-8 no
 * longer than its source; iteration visits members that each scan on their own.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#include "check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_string(const esx_json_val *s, int flawless)
{
    check(s->type == ESX_JSON_STRING && s->len >= 2 && s->p[0] == '"' && s->p[s->len - 1] == '"');
    char *out = malloc(s->len);
    check(out != NULL);
    size_t n = esx_json_str_decode(s, out, s->len);
    check(n <= s->len);
    if (flawless)
        check(esx_utf8_valid_prefix((unsigned char *)out, n) == n);
    check(esx_json_str_eq(s, out, n));
    free(out);
}

static void walk(const esx_json_val *v, int flawless, int level)
{
    if (v->type == ESX_JSON_STRING) {
        check_string(v, flawless);
        return;
    }
    if (v->type != ESX_JSON_ARRAY && v->type != ESX_JSON_OBJECT)
        return;
    if (level > 40)
        return;
    esx_json_iter it, ci;
    esx_json_val k, m, ck, cm;
    esx_json_iter_init(&it, v);
    esx_json_iter_init_checked(&ci, v);
    while (esx_json_iter_next(&it, &k, &m)) {
        /* the iterator's quick walk finds what a full scan of each member finds */
        check(esx_json_iter_next(&ci, &ck, &cm));
        check(m.p == cm.p && m.len == cm.len && m.type == cm.type && m.depth == cm.depth);
        if (v->type == ESX_JSON_OBJECT)
            check(k.p == ck.p && k.len == ck.len && k.type == ck.type);
        check(m.depth < v->depth);
        if (v->type == ESX_JSON_OBJECT)
            check_string(&k, flawless);
        walk(&m, flawless, level + 1);
    }
    check(!esx_json_iter_next(&ci, &ck, &cm));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    size_t pos = 0;
    esx_json_val v;
    char why[128];
    if (esx_json_scan(s, size, &pos, &v, why, sizeof why) != 0) {
        check(why[0] && strnlen(why, sizeof why) < sizeof why);
        return 0;
    }
    check(pos <= size && v.p >= s && v.p + v.len == s + pos && v.len > 0);
    check(v.depth >= 0 && v.depth <= ESX_JSON_HARD_DEPTH);
    esx_buf m1, m2;
    esx_buf_init(&m1, v.len);
    esx_buf_init(&m2, v.len);
    check(esx_json_write_min(&v, &m1) == ESX_BUF_OK);
    size_t p2 = 0;
    esx_json_val w;
    check(esx_json_scan(m1.data, m1.len, &p2, &w, NULL, 0) == 0 && p2 == m1.len);
    check(w.type == v.type && w.depth == v.depth && w.flaw == v.flaw);
    check(esx_json_write_min(&w, &m2) == ESX_BUF_OK && m2.len == m1.len &&
          memcmp(m1.data, m2.data, m1.len) == 0);
    /* no whitespace outside strings */
    int in = 0;
    for (size_t i = 0; i < m1.len; i++) {
        char c = m1.data[i];
        if (in) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in = 0;
        } else if (c == '"')
            in = 1;
        else
            check(c != ' ' && c != '\t' && c != '\n' && c != '\r');
    }
    walk(&v, v.flaw == 0, 0);
    if (v.depth <= 64)
        check(esx_json_duplicate(&v) >= 0);
    esx_buf_free(&m1);
    esx_buf_free(&m2);
    return 0;
}
