/* Prometheus metrics: counters, gauges and fixed-bucket histograms, updated lock-free from any
 * thread (atomics), rendered in the text exposition format (version 0.0.4). The HTTP endpoint
 * that serves it is rpc/metrics_http.h; this registry has no I/O, so any layer (the engine
 * included) can own series. Names are vLLM-style: "deltaserve:request_success_total" with
 * labels such as finished_reason="stop".
 *
 *   metrics *m; metrics_create(64, &m, &st);
 *   metrics_series *ok = metrics_counter(m, "deltaserve:request_success_total",
 *                                        "finished_reason=\"stop\"", "Finished requests.");
 *   metrics_series *ttft = metrics_histogram(m, "deltaserve:time_to_first_token_seconds", NULL,
 *                                            "Time to first token.", bounds, n_bounds);
 *   metrics_inc(ok, 1); metrics_observe(ttft, 0.02);   (any thread)
 *   metrics_http_start(m, "0.0.0.0:9090", &http, &st);  (rpc/metrics_http.h)
 *
 * Registration happens at start-up (it allocates; not thread-safe with itself); series of one
 * name are printed under one HELP/TYPE header whatever their registration order. */
#ifndef DS_COMMON_METRICS_H
#define DS_COMMON_METRICS_H

#include <stddef.h>

#include "common/status.h"

typedef struct metrics metrics;
typedef struct metrics_series metrics_series;

typedef enum metrics_kind { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM } metrics_kind;

#define METRICS_MAX_BUCKETS 32

/* Room for max_series series (counters, gauges, histograms together). */
int metrics_create(int max_series, metrics **out, status *st);
/* Frees everything. An HTTP endpoint serving m must be stopped first. */
void metrics_destroy(metrics *m);

/* Registers a series. labels: NULL or the inside of {...}, e.g. `finished_reason="stop"`.
 * Aborts (DS_ASSERT) past max_series or on a name/labels clash: both are caller bugs. */
metrics_series *metrics_counter(metrics *m, const char *name, const char *labels, const char *help);
metrics_series *metrics_gauge(metrics *m, const char *name, const char *labels, const char *help);
/* bounds: n_bounds (<= METRICS_MAX_BUCKETS) increasing upper bounds; +Inf is implicit. */
metrics_series *metrics_histogram(metrics *m, const char *name, const char *labels,
                                  const char *help, const double *bounds, int n_bounds);

/* Thread-safe updates. */
void metrics_inc(metrics_series *s, double v); /* counter (v >= 0) or gauge */
void metrics_set(metrics_series *s, double v); /* gauge */
void metrics_observe(metrics_series *s, double v); /* histogram */
double metrics_value(const metrics_series *s); /* counter/gauge value; histogram: sample count */

/* Called before each exposition (metrics_render, e.g. on the HTTP thread), e.g. to set gauges
 * from a snapshot. */
void metrics_set_collect(metrics *m, void (*collect)(void *arg), void *arg);

/* Writes the exposition text into buf (NUL-terminated, truncated to cap). Returns the length
 * the whole text needs (excluding the NUL), like snprintf. */
size_t metrics_format(metrics *m, char *buf, size_t cap);

/* One exposition, as the endpoint serves it: runs the collect hook, then formats, one caller
 * at a time. Returns the text (malloc'd, NUL-terminated; the caller frees it) and its length
 * in *len, or NULL when out of memory. */
char *metrics_render(metrics *m, size_t *len);

/* Bucket bounds in seconds commonly used for latencies (vLLM-like), for the callers' tables. */
extern const double metrics_latency_buckets[];
extern const int metrics_n_latency_buckets;

#endif
