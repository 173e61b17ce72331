/* Test helpers: a minimal JSON reader (objects, arrays, strings with \u escapes and surrogate
 * pairs, numbers, literals) that keeps only what the tokenizer cases need. */
#include "tests/model/tokenizer_test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil/testutil.h"

/* ---- minimal JSON ---- */

typedef struct jp {
    const char *p, *end;
    int err;
} jp;

static void ws(jp *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t'))
        j->p++;
}

static int hex4(jp *j, unsigned *v)
{
    if (j->end - j->p < 4) return -1;
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *j->p++;
        *v <<= 4;
        if (c >= '0' && c <= '9') *v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') *v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') *v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12);
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18);
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parses a string at j->p (at the opening quote). out may be NULL to skip. */
static int jstring(jp *j, char **out, size_t *len)
{
    if (j->p >= j->end || *j->p != '"') return -1;
    j->p++;
    char *o = out ? malloc((size_t)(j->end - j->p) + 1) : NULL;
    size_t n = 0;
    if (out && !o) return -1;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c != '\\') {
            if (o) o[n] = c;
            n++;
            continue;
        }
        if (j->p >= j->end) goto bad;
        c = *j->p++;
        unsigned cp;
        char tmp[4];
        size_t k = 1;
        switch (c) {
        case 'n': tmp[0] = '\n'; break;
        case 't': tmp[0] = '\t'; break;
        case 'r': tmp[0] = '\r'; break;
        case 'b': tmp[0] = '\b'; break;
        case 'f': tmp[0] = '\f'; break;
        case '/': case '\\': case '"': tmp[0] = c; break;
        case 'u':
            if (hex4(j, &cp)) goto bad;
            if (cp >= 0xD800 && cp < 0xDC00 && j->end - j->p >= 6 && j->p[0] == '\\' &&
                j->p[1] == 'u') {
                unsigned lo;
                j->p += 2;
                if (hex4(j, &lo) || lo < 0xDC00 || lo > 0xDFFF) goto bad;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            k = put_utf8(tmp, cp);
            break;
        default: goto bad;
        }
        if (o) memcpy(o + n, tmp, k);
        n += k;
    }
    if (j->p >= j->end) goto bad;
    j->p++;
    if (o) {
        o[n] = 0;
        *out = o;
        *len = n;
    }
    return 0;
bad:
    free(o);
    return -1;
}

static int jskip(jp *j);

static int jskip_seq(jp *j, char close, int obj)
{
    j->p++;
    ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        ws(j);
        if (obj) {
            if (jstring(j, NULL, NULL)) return -1;
            ws(j);
            if (j->p >= j->end || *j->p++ != ':') return -1;
        }
        if (jskip(j)) return -1;
        ws(j);
        if (j->p >= j->end) return -1;
        char c = *j->p++;
        if (c == close) return 0;
        if (c != ',') return -1;
    }
}

static int jskip(jp *j)
{
    ws(j);
    if (j->p >= j->end) return -1;
    char c = *j->p;
    if (c == '"') return jstring(j, NULL, NULL);
    if (c == '{') return jskip_seq(j, '}', 1);
    if (c == '[') return jskip_seq(j, ']', 0);
    const char *s = j->p;
    while (j->p < j->end && strchr("+-.0123456789eEtruefalsn", *j->p)) j->p++;
    return j->p > s ? 0 : -1;
}

/* Positions j at the value of key in the object at j->p. */
static int jfind(jp *j, const char *key)
{
    ws(j);
    if (j->p >= j->end || *j->p != '{') return -1;
    j->p++;
    for (;;) {
        ws(j);
        char *k;
        size_t kl;
        if (jstring(j, &k, &kl)) return -1;
        ws(j);
        if (j->p >= j->end || *j->p++ != ':') {
            free(k);
            return -1;
        }
        int hit = !strcmp(k, key);
        free(k);
        ws(j);
        if (hit) return 0;
        if (jskip(j)) return -1;
        ws(j);
        if (j->p >= j->end || *j->p++ != ',') return -1;
    }
}

static int jcase(jp *j, tokenizer_test_case *c)
{
    const char *obj = j->p;
    jp k = *j;
    if (jfind(&k, "text") || jstring(&k, &c->text, &c->text_len)) return -1;
    k = *j;
    if (jfind(&k, "decoded") || jstring(&k, &c->decoded, &c->decoded_len)) return -1;
    k = *j;
    if (jfind(&k, "ids") || *k.p != '[') return -1;
    size_t cap = 16;
    c->ids = malloc(cap * sizeof *c->ids);
    k.p++;
    for (;;) {
        ws(&k);
        if (k.p < k.end && *k.p == ']') break;
        char *e;
        long v = strtol(k.p, &e, 10);
        if (e == k.p) return -1;
        k.p = e;
        if (c->n_ids == cap) c->ids = realloc(c->ids, (cap *= 2) * sizeof *c->ids);
        c->ids[c->n_ids++] = (int32_t)v;
        ws(&k);
        if (k.p < k.end && *k.p == ',') k.p++;
    }
    j->p = obj;
    return jskip(j);
}

int tokenizer_test_read_cases(const char *json_path, tokenizer_test_case **cases)
{
    size_t n;
    char *buf = testutil_read_file(json_path, &n);
    *cases = NULL;
    if (!buf) {
        fprintf(stderr, "cannot read %s\n", json_path);
        return -1;
    }
    jp j = {buf, buf + n, 0};
    int count = 0, cap = 0;
    tokenizer_test_case *cs = NULL;
    if (jfind(&j, "tokenizer") || *j.p != '[') goto bad;
    j.p++;
    for (;;) {
        ws(&j);
        if (j.p < j.end && *j.p == ']') break;
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            cs = realloc(cs, (size_t)cap * sizeof *cs);
        }
        memset(&cs[count], 0, sizeof cs[count]);
        if (jcase(&j, &cs[count++])) goto bad;
        ws(&j);
        if (j.p < j.end && *j.p == ',') j.p++;
    }
    free(buf);
    *cases = cs;
    return count;
bad:
    fprintf(stderr, "%s: cannot parse the tokenizer cases near byte %ld\n", json_path,
            (long)(j.p - buf));
    tokenizer_test_free_cases(cs, count);
    free(buf);
    return -1;
}

void tokenizer_test_free_cases(tokenizer_test_case *cases, int n)
{
    for (int i = 0; i < n; i++) {
        free(cases[i].text);
        free(cases[i].ids);
        free(cases[i].decoded);
    }
    free(cases);
}
