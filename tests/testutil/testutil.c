/* Shared test helpers without CUnit (tools/fuzz links this file into gguf_fuzz_seeds). */
#include "tests/testutil/testutil.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void testutil_reference_dir(char *out, size_t cap)
{
    const char *e = getenv("DS_REFERENCE_DIR");
    if (e && *e) {
        snprintf(out, cap, "%s", e);
        return;
    }
    e = getenv("DS_REPO_ROOT");
    if (e && *e) {
        snprintf(out, cap, "%s/../shared/reference", e);
        return;
    }
    /* Under bazel the working directory is the runfiles tree, where sources are symlinks into
     * the repository; run by hand from the repository root the path is the file itself. */
    static const char rel[] = "tests/testutil/testutil.c";
    char real[PATH_MAX];
    if (realpath(rel, real)) {
        size_t n = strlen(real), r = strlen(rel);
        if (n > r && !strcmp(real + n - r, rel)) {
            real[n - r - 1] = 0;
            snprintf(out, cap, "%s/../shared/reference", real);
            return;
        }
    }
    snprintf(out, cap, "/work/shared/reference");
}

const char *testutil_tmp_dir(void)
{
    const char *t = getenv("TEST_TMPDIR");
    return t && *t ? t : "/tmp";
}

char *testutil_read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL; /* owned, [cap], len bytes read + NUL */
    size_t cap = 0, len = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = 2 * cap + 65536 + 1;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = p;
        }
        size_t r = fread(buf + len, 1, 65536, f);
        len += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return NULL;
    }
    buf[len] = 0;
    if (n) *n = len;
    return buf;
}

uint64_t testutil_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float testutil_rng_uniform(uint64_t *s)
{
    return (float)((testutil_rng_next(s) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

float testutil_rng_gauss(uint64_t *s)
{
    double u = ((testutil_rng_next(s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double v = (testutil_rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
