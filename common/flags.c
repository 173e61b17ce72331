#include "common/flags.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int set_value(const flag_spec *f, void *opts, const char *v, const char *from, status *st)
{
    char *end = NULL;
    char *p = (char *)opts + f->offset;
    errno = 0;
    switch (f->kind) {
    case FLAG_STR:
        *(const char **)p = v;
        return 0;
    case FLAG_INT: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < -2147483647L || x > 2147483647L)
            return status_fail(st, STATUS_INVALID, "%s --%s: '%s' is not an integer", from,
                               f->name, v);
        *(int *)p = (int)x;
        return 0;
    }
    case FLAG_I64: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end)
            return status_fail(st, STATUS_INVALID, "%s --%s: '%s' is not an integer", from,
                               f->name, v);
        *(int64_t *)p = (int64_t)x;
        return 0;
    }
    case FLAG_FLOAT: {
        float x = strtof(v, &end);
        if (errno || end == v || *end || isnan(x))
            return status_fail(st, STATUS_INVALID, "%s --%s: '%s' is not a number", from,
                               f->name, v);
        *(float *)p = x;
        return 0;
    }
    case FLAG_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes")) {
            *(int *)p = 1;
            return 0;
        }
        if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !*v) {
            *(int *)p = 0;
            return 0;
        }
        return status_fail(st, STATUS_INVALID, "%s --%s: '%s' is not a boolean", from, f->name,
                           v);
    }
    return status_fail(st, STATUS_INTERNAL, "flag --%s has an unknown kind", f->name);
}

static void flags_print_help(const flag_spec *specs, const char *usage)
{
    printf("usage: %s [flags]\n\nflags (environment fallback, default):\n", usage);
    for (const flag_spec *f = specs; f->name; f++) {
        char lhs[64];
        snprintf(lhs, sizeof lhs, "--%s%s", f->name, f->kind == FLAG_BOOL ? "" : " V");
        printf("  %-24s %s", lhs, f->help ? f->help : "");
        if (f->env || f->def) {
            printf(" (");
            if (f->env) printf("$%s", f->env);
            if (f->env && f->def) printf(", ");
            if (f->def) printf("default %s", f->def);
            printf(")");
        }
        printf("\n");
    }
    printf("  %-24s %s\n", "--help", "print this help");
}

int flags_parse_pos(const flag_spec *specs, void *opts, int argc, char **argv, const char *usage,
                    const char **pos, int max_pos, int *n_pos, status *st)
{
    int rc;
    if (n_pos) *n_pos = 0;
    /* defaults, then environment */
    for (const flag_spec *f = specs; f->name; f++) {
        if (f->def && (rc = set_value(f, opts, f->def, "default", st))) return rc;
        const char *e = f->env ? getenv(f->env) : NULL;
        if (e) {
            char from[80];
            snprintf(from, sizeof from, "$%s", f->env);
            if ((rc = set_value(f, opts, e, from, st))) return rc;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            flags_print_help(specs, usage);
            return status_fail(st, STATUS_CANCELLED, "help printed");
        }
        if (strncmp(a, "--", 2) != 0) {
            if (pos && n_pos && *n_pos < max_pos) {
                pos[(*n_pos)++] = a;
                continue;
            }
            return status_fail(st, STATUS_INVALID, "%s: unexpected argument '%s'", usage, a);
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const flag_spec *f = NULL;
        for (const flag_spec *g = specs; g->name; g++)
            if (strlen(g->name) == len && !strncmp(g->name, name, len)) f = g;
        if (!f)
            return status_fail(st, STATUS_INVALID, "%s: unknown flag '%s' (see --help)", usage,
                               a);
        const char *v;
        if (eq)
            v = eq + 1;
        else if (f->kind == FLAG_BOOL)
            v = "1";
        else if (i + 1 < argc)
            v = argv[++i];
        else
            return status_fail(st, STATUS_INVALID, "%s: flag --%s needs a value", usage, f->name);
        if ((rc = set_value(f, opts, v, "flag", st))) return rc;
    }
    return 0;
}

int flags_parse(const flag_spec *specs, void *opts, int argc, char **argv, const char *usage,
                status *st)
{
    return flags_parse_pos(specs, opts, argc, argv, usage, NULL, 0, NULL, st);
}

int flags_int_list(const char *s, int *out, int max, int lo, int hi)
{
    int n = 0;
    while (s && *s) {
        char *end = NULL;
        const long v = strtol(s, &end, 10);
        if (end == s || v < lo || v > hi || n == max) return 0;
        out[n++] = (int)v;
        if (*end == ',') end++;
        else if (*end) return 0;
        s = end;
    }
    return n;
}
