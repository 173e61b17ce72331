#include "tests/worker/worker_test_util.h"

#include "tests/model/ref_cases.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void wt_reference_path(char *out, int cap, const char *name, const char *suffix)
{
    /* the shared case when present, else the repository's own equivalent (ref_cases.h) */
    ref_case_resolve_path(name, suffix, out, (size_t)cap);
}

/* Parses the int array after `key` at or after p; returns the position after it, or NULL. */
static const char *int_array(const char *p, const char *key, int32_t *out, int *n, int max)
{
    p = strstr(p, key);
    if (!p) return NULL;
    p = strchr(p, '[');
    if (!p) return NULL;
    p++;
    *n = 0;
    while (*p && *p != ']') {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) {
            p++;
            continue;
        }
        if (*n < max) out[(*n)++] = (int32_t)v;
        p = end;
    }
    return *p ? p + 1 : NULL;
}

int wt_load_prompts(const char *name, wt_prompt *out, int max)
{
    char path[PATH_MAX];
    wt_reference_path(path, sizeof path, name, ".json");
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)size + 1);
    size_t got = fread(buf, 1, (size_t)size, f);
    fclose(f);
    buf[got] = '\0';
    int n = 0;
    const char *p = strstr(buf, "\"prompts\"");
    while (p && n < max) {
        wt_prompt *w = &out[n];
        const char *q = int_array(p, "\"ids\"", w->ids, &w->n_ids, WT_MAX_IDS);
        if (!q) break;
        q = int_array(q, "\"greedy\"", w->greedy, &w->n_greedy, WT_MAX_IDS);
        if (!q) break;
        n++;
        p = q;
    }
    free(buf);
    return n;
}
