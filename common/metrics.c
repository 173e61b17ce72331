#include "common/metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_NAME_MAX 128
#define METRICS_LABELS_MAX 192
#define METRICS_HELP_MAX 256

struct metrics_series {
    metrics_kind kind;
    char name[METRICS_NAME_MAX];
    char labels[METRICS_LABELS_MAX];
    char help[METRICS_HELP_MAX];
    _Atomic uint64_t value_bits; /* double bits: counter/gauge value, histogram sum */
    double bounds[METRICS_MAX_BUCKETS];
    int n_bounds;
    _Atomic uint64_t buckets[METRICS_MAX_BUCKETS + 1]; /* per bucket (not cumulative); last +Inf */
    _Atomic uint64_t count;                            /* histogram samples */
};

struct metrics {
    metrics_series *series; /* owned, [max_series] */
    int n_series, max_series;
    void (*collect)(void *arg);
    void *collect_arg;
    pthread_mutex_t format_mu; /* one exposition at a time (collect + format) */
};

const double metrics_latency_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25,
                                          0.5,   0.75,  1.0,  2.5,  5.0,  7.5,  10.0, 20.0, 40.0,
                                          80.0};
const int metrics_n_latency_buckets = sizeof metrics_latency_buckets / sizeof(double);

static double bits_to_double(uint64_t b)
{
    double d;
    memcpy(&d, &b, sizeof d);
    return d;
}

static uint64_t double_to_bits(double d)
{
    uint64_t b;
    memcpy(&b, &d, sizeof b);
    return b;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
    uint64_t old = atomic_load(p);
    while (!atomic_compare_exchange_weak(p, &old, double_to_bits(bits_to_double(old) + v))) {
    }
}

int metrics_create(int max_series, metrics **out, status *st)
{
    *out = NULL;
    metrics *m = calloc(1, sizeof *m);
    if (!m) return status_fail(st, STATUS_NOMEM, "metrics: out of memory");
    m->series = calloc((size_t)max_series, sizeof *m->series);
    if (!m->series) {
        free(m);
        return status_fail(st, STATUS_NOMEM, "metrics: out of memory for %d series", max_series);
    }
    m->max_series = max_series;
    pthread_mutex_init(&m->format_mu, NULL);
    *out = m;
    return STATUS_OK;
}

void metrics_destroy(metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->format_mu);
    free(m->series);
    free(m);
}

static metrics_series *add(metrics *m, metrics_kind kind, const char *name, const char *labels,
                           const char *help)
{
    DS_ASSERT(m->n_series < m->max_series);
    DS_ASSERT(strlen(name) < METRICS_NAME_MAX);
    DS_ASSERT(!labels || strlen(labels) < METRICS_LABELS_MAX);
    for (int i = 0; i < m->n_series; i++) {
        const metrics_series *o = &m->series[i];
        if (strcmp(o->name, name) == 0) {
            DS_ASSERT(o->kind == kind);                              /* one type per name */
            DS_ASSERT(strcmp(o->labels, labels ? labels : "") != 0); /* unique label set */
        }
    }
    metrics_series *s = &m->series[m->n_series++];
    s->kind = kind;
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->labels, sizeof s->labels, "%s", labels ? labels : "");
    snprintf(s->help, sizeof s->help, "%s", help ? help : "");
    atomic_store(&s->value_bits, double_to_bits(0.0));
    return s;
}

metrics_series *metrics_counter(metrics *m, const char *name, const char *labels, const char *help)
{
    return add(m, METRICS_COUNTER, name, labels, help);
}

metrics_series *metrics_gauge(metrics *m, const char *name, const char *labels, const char *help)
{
    return add(m, METRICS_GAUGE, name, labels, help);
}

metrics_series *metrics_histogram(metrics *m, const char *name, const char *labels,
                                  const char *help, const double *bounds, int n_bounds)
{
    DS_ASSERT(n_bounds >= 1 && n_bounds <= METRICS_MAX_BUCKETS);
    for (int i = 1; i < n_bounds; i++) DS_ASSERT(bounds[i] > bounds[i - 1]);
    metrics_series *s = add(m, METRICS_HISTOGRAM, name, labels, help);
    memcpy(s->bounds, bounds, (size_t)n_bounds * sizeof *bounds);
    s->n_bounds = n_bounds;
    return s;
}

void metrics_inc(metrics_series *s, double v)
{
    DS_ASSERT(s->kind != METRICS_HISTOGRAM);
    DS_ASSERT(s->kind == METRICS_GAUGE || v >= 0);
    atomic_add_double(&s->value_bits, v);
}

void metrics_set(metrics_series *s, double v)
{
    DS_ASSERT(s->kind == METRICS_GAUGE);
    atomic_store(&s->value_bits, double_to_bits(v));
}

void metrics_observe(metrics_series *s, double v)
{
    DS_ASSERT(s->kind == METRICS_HISTOGRAM);
    int b = 0;
    while (b < s->n_bounds && v > s->bounds[b]) b++; /* le: v <= bound */
    atomic_fetch_add(&s->buckets[b], 1);
    atomic_fetch_add(&s->count, 1);
    atomic_add_double(&s->value_bits, v);
}

double metrics_value(const metrics_series *s)
{
    if (s->kind == METRICS_HISTOGRAM) return (double)atomic_load(&s->count);
    return bits_to_double(atomic_load(&s->value_bits));
}

void metrics_set_collect(metrics *m, void (*collect)(void *arg), void *arg)
{
    m->collect = collect;
    m->collect_arg = arg;
}

/* ---- exposition ---- */

typedef struct outbuf {
    char *buf;
    size_t cap, len; /* len counts what would have been written */
} outbuf;

__attribute__((format(printf, 2, 3))) static void out(outbuf *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(room ? o->buf + o->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) o->len += (size_t)n;
}

static void out_number(outbuf *o, double v)
{
    if (isinf(v)) out(o, v > 0 ? "+Inf" : "-Inf");
    else if (isnan(v)) out(o, "NaN");
    else if (v == floor(v) && fabs(v) < 1e15) out(o, "%.0f", v);
    else out(o, "%.9g", v);
}

/* name{labels[,extra]} */
static void out_name(outbuf *o, const metrics_series *s, const char *suffix, const char *extra)
{
    out(o, "%s%s", s->name, suffix);
    bool l = s->labels[0], e = extra && extra[0];
    if (l || e) out(o, "{%s%s%s}", s->labels, l && e ? "," : "", e ? extra : "");
    out(o, " ");
}

static void out_series(outbuf *o, const metrics_series *s)
{
    if (s->kind != METRICS_HISTOGRAM) {
        out_name(o, s, "", NULL);
        out_number(o, bits_to_double(atomic_load(&s->value_bits)));
        out(o, "\n");
        return;
    }
    /* read buckets first; count is derived from them so the exposition is self-consistent */
    uint64_t cum = 0;
    char le[64];
    for (int b = 0; b <= s->n_bounds; b++) {
        cum += atomic_load(&s->buckets[b]);
        if (b < s->n_bounds) snprintf(le, sizeof le, "le=\"%.9g\"", s->bounds[b]);
        else snprintf(le, sizeof le, "le=\"+Inf\"");
        out_name(o, s, "_bucket", le);
        out(o, "%llu\n", (unsigned long long)cum);
    }
    out_name(o, s, "_sum", NULL);
    out_number(o, bits_to_double(atomic_load(&s->value_bits)));
    out(o, "\n");
    out_name(o, s, "_count", NULL);
    out(o, "%llu\n", (unsigned long long)cum);
}

size_t metrics_format(metrics *m, char *buf, size_t cap)
{
    static const char *types[] = {"counter", "gauge", "histogram"};
    outbuf o = {buf, cap, 0};
    if (cap) buf[0] = '\0';
    for (int i = 0; i < m->n_series; i++) {
        const metrics_series *s = &m->series[i];
        bool first = true;
        for (int j = 0; j < i && first; j++) first = strcmp(m->series[j].name, s->name) != 0;
        if (!first) continue; /* printed with the first series of its name */
        out(&o, "# HELP %s %s\n# TYPE %s %s\n", s->name, s->help, s->name, types[s->kind]);
        for (int j = i; j < m->n_series; j++)
            if (strcmp(m->series[j].name, s->name) == 0) out_series(&o, &m->series[j]);
    }
    if (cap && o.len >= cap) buf[cap - 1] = '\0';
    return o.len;
}

char *metrics_render(metrics *m, size_t *len)
{
    pthread_mutex_lock(&m->format_mu);
    if (m->collect) m->collect(m->collect_arg);
    size_t need = metrics_format(m, NULL, 0);
    char *buf = malloc(need + 1);
    if (buf) metrics_format(m, buf, need + 1);
    pthread_mutex_unlock(&m->format_mu);
    *len = buf ? need : 0;
    return buf;
}
