#include "router/router_stop.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"

int router_stop_init(router_stop *s, const char *const *stops, int n, status *st)
{
    memset(s, 0, sizeof *s);
    s->matched = -1;
    if (n < 0 || n > ROUTER_STOP_MAX)
        return status_fail(st, STATUS_INVALID, "stop: %d stop strings, at most %d allowed", n,
                           ROUTER_STOP_MAX);
    size_t longest = 0;
    for (int i = 0; i < n; i++) {
        size_t l = strlen(stops[i]);
        if (l == 0) return status_fail(st, STATUS_INVALID, "stop[%d]: empty stop string", i);
        if (l > ROUTER_STOP_MAX_BYTES)
            return status_fail(st, STATUS_INVALID, "stop[%d]: %zu bytes, at most %d allowed", i,
                               l, ROUTER_STOP_MAX_BYTES);
        if (!utf8_valid(stops[i], l))
            return status_fail(st, STATUS_INVALID, "stop[%d]: not valid UTF-8", i);
        s->stops[i] = stops[i];
        s->stop_len[i] = l;
        if (l > longest) longest = l;
    }
    s->n_stops = n;
    s->cap = 2 * longest + 256;
    s->buf = malloc(s->cap);
    if (!s->buf) return status_fail(st, STATUS_NOMEM, "stop: out of memory");
    return 0;
}

void router_stop_free(router_stop *s)
{
    free(s->buf);
    s->buf = NULL;
}

/* Earliest full occurrence of a stop string in buf[0, len): its start and index, or -1. */
static int find_match(const router_stop *s, size_t *at)
{
    int best = -1;
    size_t best_at = SIZE_MAX;
    for (int i = 0; i < s->n_stops; i++) {
        size_t l = s->stop_len[i];
        if (l > s->len) continue;
        const char *hit = memmem(s->buf, s->len, s->stops[i], l);
        if (hit && (size_t)(hit - s->buf) < best_at) {
            best_at = (size_t)(hit - s->buf);
            best = i;
        }
    }
    *at = best_at;
    return best;
}

/* Start of the longest suffix of buf[0, len) that is a proper prefix of some stop string. */
static size_t hold_from(const router_stop *s)
{
    size_t from = s->len;
    for (int i = 0; i < s->n_stops; i++) {
        size_t l = s->stop_len[i];
        size_t max_k = l - 1 < s->len ? l - 1 : s->len; /* suffix length to try */
        for (size_t k = max_k; k > 0; k--) {
            if (s->len - k >= from) break; /* not longer than what we already hold */
            if (!memcmp(s->buf + s->len - k, s->stops[i], k)) {
                from = s->len - k;
                break;
            }
        }
    }
    return from;
}

int router_stop_push(router_stop *s, const char *piece, size_t n, const char **out, size_t *n_out,
                     status *st)
{
    *out = s->buf;
    *n_out = 0;
    if (s->matched >= 0) return s->matched;
    /* drop what the last push released */
    memmove(s->buf, s->buf + s->released, s->len - s->released);
    s->len -= s->released;
    s->released = 0;
    if (s->len + n > s->cap) {
        size_t cap = 2 * (s->len + n);
        char *b = realloc(s->buf, cap);
        if (!b) return status_fail(st, STATUS_NOMEM, "stop: out of memory"), -2;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, piece, n);
    s->len += n;
    *out = s->buf;
    if (s->n_stops == 0) {
        s->released = s->len;
        *n_out = s->len;
        return -1;
    }
    size_t at;
    int m = find_match(s, &at);
    if (m >= 0) {
        s->matched = m;
        *n_out = at;
        s->len = 0;
        return m;
    }
    s->released = hold_from(s);
    *n_out = s->released;
    return -1;
}

void router_stop_flush(router_stop *s, const char **out, size_t *n_out)
{
    *out = s->buf;
    *n_out = 0;
    if (s->matched >= 0 || !s->buf) return;
    memmove(s->buf, s->buf + s->released, s->len - s->released);
    s->len -= s->released;
    s->released = s->len;
    *n_out = s->len;
}
