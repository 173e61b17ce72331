#include "tests/model/ref_cases.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testutil/testutil.h"

static int cmp_case(const void *a, const void *b)
{
    return strcmp(((const ref_case *)a)->name, ((const ref_case *)b)->name);
}

/* Appends the cases of dir to out[*n..cap); returns the number added. */
static int scan(const char *dir, ref_case *out, int *n, int cap)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int first = *n;
    struct dirent *e;
    while ((e = readdir(d)) && *n < cap) {
        size_t len = strlen(e->d_name);
        if (len <= 5 || strcmp(e->d_name + len - 5, ".gguf") || len - 5 >= sizeof out->name) continue;
        ref_case c;
        memcpy(c.name, e->d_name, len - 5);
        c.name[len - 5] = 0;
        snprintf(c.dir, sizeof c.dir, "%s", dir);
        char json[4300];
        ref_case_path(&c, ".json", json, sizeof json);
        if (access(json, R_OK)) continue; /* a .gguf without a reference (e.g. a scratch copy) */
        out[(*n)++] = c;
    }
    closedir(d);
    qsort(out + first, (size_t)(*n - first), sizeof *out, cmp_case);
    return *n - first;
}

int ref_cases_list(ref_case *out, int cap)
{
    char dirs[2][4096], real[2][PATH_MAX];
    testutil_reference_dir(dirs[0], sizeof dirs[0]);
    const char *e = getenv("DS_REPO_REFERENCE_DIR");
    snprintf(dirs[1], sizeof dirs[1], "%s", e && *e ? e : "tests/reference");
    int n = 0;
    real[0][0] = 0;
    for (int i = 0; i < 2; i++) {
        if (!realpath(dirs[i], real[i])) continue; /* absent */
        if (i == 1 && !strcmp(real[0], real[1])) continue;
        scan(dirs[i], out, &n, cap);
    }
    return n;
}

void ref_case_path(const ref_case *c, const char *suffix, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s%s", c->dir, c->name, suffix);
}

int ref_cases_find(const ref_case *cs, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(cs[i].name, name)) return i;
    return -1;
}

/* Fills *out with name in dir when dir holds NAME.gguf and NAME.json. */
static int probe(const char *dir, const char *name, ref_case *out)
{
    if (strlen(name) >= sizeof out->name) return -1;
    ref_case c;
    snprintf(c.name, sizeof c.name, "%s", name);
    snprintf(c.dir, sizeof c.dir, "%s", dir);
    char p[4300];
    ref_case_path(&c, ".gguf", p, sizeof p);
    if (access(p, R_OK)) return -1;
    ref_case_path(&c, ".json", p, sizeof p);
    if (access(p, R_OK)) return -1;
    *out = c;
    return 0;
}

int ref_case_resolve(const char *shared_name, ref_case *out)
{
    char dir[4096];
    testutil_reference_dir(dir, sizeof dir);
    if (!probe(dir, shared_name, out)) return 0;
    const char *e = getenv("DS_REPO_REFERENCE_DIR");
    snprintf(dir, sizeof dir, "%s", e && *e ? e : "tests/reference");
    char own[128];
    if (!strncmp(shared_name, "tiny-", 5)) snprintf(own, sizeof own, "own-%s", shared_name + 5);
    else snprintf(own, sizeof own, "%s", shared_name);
    if (!probe(dir, own, out)) return 0;
    fprintf(stderr, "reference case %s: not in the shared folder, and %s not in %s\n", shared_name, own, dir);
    return -1;
}

int ref_case_resolve_path(const char *shared_name, const char *suffix, char *out, size_t cap)
{
    ref_case c;
    if (ref_case_resolve(shared_name, &c)) {
        if (cap) out[0] = 0;
        return -1;
    }
    ref_case_path(&c, suffix, out, cap);
    return 0;
}
