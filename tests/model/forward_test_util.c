#include "forward_test_util.h"

#include <ctype.h>
#include <stdbool.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil/testutil.h"

/* ---- a minimal JSON scanner: enough to walk objects/arrays and skip what we do not need ---- */

static const char *ws(const char *p)
{
    while (*p && isspace((unsigned char)*p)) p++;
    return p;
}

static const char *skip_string(const char *p) /* p at '"' */
{
    for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && p[1]) p++;
    return *p ? p + 1 : NULL;
}

static const char *skip_value(const char *p)
{
    p = ws(p);
    if (*p == '"') return skip_string(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (close == '}') {
                if (*p != '"' || !(p = skip_string(p))) return NULL;
                p = ws(p);
                if (*p++ != ':') return NULL;
            }
            if (!(p = skip_value(p))) return NULL;
            p = ws(p);
            if (*p == ',') {
                p = ws(p + 1);
                continue;
            }
            return *p == close ? p + 1 : NULL;
        }
    }
    while (*p && (isalnum((unsigned char)*p) || strchr("+-.", *p))) p++;
    return p;
}

/* Parses an array of integers at p into a malloc'ed array. */
static const char *int_array(const char *p, int32_t **out, int *n)
{
    p = ws(p);
    if (*p != '[') return NULL;
    const char *end = skip_value(p);
    if (!end) return NULL;
    int cap = 16, cnt = 0;
    int32_t *a = malloc(sizeof *a * cap);
    p = ws(p + 1);
    while (*p != ']') {
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p) {
            free(a);
            return NULL;
        }
        if (cnt == cap) a = realloc(a, sizeof *a * (cap *= 2));
        a[cnt++] = (int32_t)v;
        p = ws(e);
        if (*p == ',') p = ws(p + 1);
    }
    *out = a;
    *n = cnt;
    return end;
}

static bool key_is(const char *p, const char *key) /* p at '"' */
{
    size_t n = strlen(key);
    return !strncmp(p + 1, key, n) && p[1 + n] == '"';
}

static int parse_prompt(const char *p, ref_prompt *r)
{
    memset(r, 0, sizeof *r);
    r->logits_offset = -1;
    p = ws(p);
    if (*p != '{') return -1;
    p = ws(p + 1);
    while (*p == '"') {
        const char *k = p;
        p = ws(skip_string(p));
        if (*p++ != ':') return -1;
        p = ws(p);
        int32_t *shape = NULL;
        int n_shape = 0;
        if (key_is(k, "ids")) p = int_array(p, &r->ids, &r->n_ids);
        else if (key_is(k, "greedy")) p = int_array(p, &r->greedy, &r->n_greedy);
        else if (key_is(k, "logits_offset_floats")) r->logits_offset = strtol(p, NULL, 10), p = skip_value(p);
        else if (key_is(k, "logits_shape")) {
            p = int_array(p, &shape, &n_shape);
            if (p && n_shape == 2) r->rows = shape[0], r->V = shape[1];
            free(shape);
        } else p = skip_value(p);
        if (!p) return -1;
        p = ws(p);
        if (*p == ',') p = ws(p + 1);
    }
    if (*p != '}' || !r->ids || !r->greedy || r->logits_offset < 0 || r->V <= 0 ||
        r->rows != r->n_ids + r->n_greedy)
        return -1;
    return 0;
}

int forward_test_read_prompts_in(const char *dir, const char *name, ref_prompt **out)
{
    char path[PATH_MAX + 256];
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    size_t n;
    char *js = testutil_read_file(path, &n);
    if (!js) {
        fprintf(stderr, "cannot read %s\n", path);
        return -1;
    }
    const char *p = strstr(js, "\"prompts\"");
    int cnt = 0;
    ref_prompt *arr = NULL;
    if (p && (p = strchr(p, ':')) && *(p = ws(p + 1)) == '[') {
        p = ws(p + 1);
        while (*p == '{') {
            arr = realloc(arr, sizeof *arr * (cnt + 1));
            if (parse_prompt(p, &arr[cnt])) {
                cnt = -1;
                break;
            }
            cnt++;
            p = ws(skip_value(p));
            if (*p == ',') p = ws(p + 1);
        }
    }
    free(js);
    if (cnt <= 0) {
        fprintf(stderr, "%s: no readable prompts\n", path);
        free(arr);
        return -1;
    }
    snprintf(path, sizeof path, "%s/%s.logits.f32", dir, name);
    char *lg = testutil_read_file(path, &n);
    for (int i = 0; i < cnt; i++) {
        long need = arr[i].logits_offset + (long)arr[i].rows * arr[i].V;
        if (!lg || need * 4 > (long)n) {
            fprintf(stderr, "%s: prompt %d logits out of range\n", path, i);
            free(lg);
            forward_test_free_prompts(arr, cnt);
            return -1;
        }
        arr[i].logits = malloc(sizeof(float) * arr[i].rows * arr[i].V);
        memcpy(arr[i].logits, lg + arr[i].logits_offset * 4, sizeof(float) * arr[i].rows * arr[i].V);
    }
    free(lg);
    *out = arr;
    return cnt;
}

void forward_test_free_prompts(ref_prompt *p, int n)
{
    for (int i = 0; i < n && p; i++) free(p[i].ids), free(p[i].greedy), free(p[i].logits);
    free(p);
}

int32_t *forward_test_full_ids(const ref_prompt *p)
{
    int32_t *a = malloc(sizeof *a * p->rows);
    memcpy(a, p->ids, sizeof *a * p->n_ids);
    memcpy(a + p->n_ids, p->greedy, sizeof *a * p->n_greedy);
    return a;
}

double forward_test_rows_rel(const float *got, const float *ref, int rows, int V)
{
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        double md = 0, mr = 0;
        for (int v = 0; v < V; v++) {
            double d = fabs((double)got[(long)r * V + v] - ref[(long)r * V + v]);
            if (!(d <= md)) md = d;
            mr = fmax(mr, fabs(ref[(long)r * V + v]));
        }
        double rel = md / (mr > 0 ? mr : 1);
        if (!(rel <= worst)) worst = rel;
    }
    return worst;
}

int forward_test_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}
