#include "cli/cli_ids.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

int cli_ids_parse(const char *s, int32_t **out, int *n, status *st)
{
    *out = NULL;
    *n = 0;
    if (!s) return status_fail(st, STATUS_INVALID, "--ids: no token ids given");
    int cap = 0, cnt = 0;
    int32_t *ids = NULL;
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    bool bracket = *p == '[';
    if (bracket) p++;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        if (!*p || (bracket && *p == ']')) break;
        errno = 0;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            free(ids);
            return status_fail(st, STATUS_INVALID, "--ids: entry %d ('%.12s') is not a token id", cnt, p);
        }
        if (cnt == cap) {
            cap = cap ? 2 * cap : 64;
            int32_t *g = realloc(ids, (size_t)cap * sizeof *g);
            if (!g) {
                free(ids);
                return status_fail(st, STATUS_NOMEM, "--ids: out of memory");
            }
            ids = g;
        }
        ids[cnt++] = (int32_t)v;
        p = end;
        while (isspace((unsigned char)*p)) p++;
        if (*p == ',') p++;
        else if (*p && !(bracket && *p == ']')) {
            free(ids);
            return status_fail(st, STATUS_INVALID, "--ids: unexpected '%c' after entry %d", *p, cnt - 1);
        }
    }
    if (cnt == 0) {
        free(ids);
        return status_fail(st, STATUS_INVALID, "--ids: empty list");
    }
    *out = ids;
    *n = cnt;
    return STATUS_OK;
}
