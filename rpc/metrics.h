/* Prometheus metrics: counters, gauges and fixed-bucket histograms, updated lock-free from any
 * thread (atomics), exposed in the text exposition format (version 0.0.4) over a tiny HTTP
 * endpoint (libmicrohttpd, its own thread) at GET /metrics. Names are vLLM-style:
 * "deltaserve:request_success_total" with labels such as finished_reason="stop".
 *
 *   metrics *m; metrics_create(64, &m, &st);
 *   metrics_series *ok = metrics_counter(m, "deltaserve:request_success_total",
 *                                        "finished_reason=\"stop\"", "Finished requests.");
 *   metrics_series *ttft = metrics_histogram(m, "deltaserve:time_to_first_token_seconds", NULL,
 *                                            "Time to first token.", bounds, n_bounds);
 *   metrics_serve(m, "0.0.0.0:9090", &st);  ...  metrics_inc(ok, 1); metrics_observe(ttft, 0.02);
 *
 * Registration happens at start-up (it allocates; not thread-safe with itself); series of one
 * name are printed under one HELP/TYPE header whatever their registration order. */
#ifndef DS_RPC_METRICS_H
#define DS_RPC_METRICS_H

#include <stddef.h>

#include "common/status.h"

typedef struct metrics metrics;
typedef struct metrics_series metrics_series;

typedef enum metrics_kind { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM } metrics_kind;

#define METRICS_MAX_BUCKETS 32

/* Room for max_series series (counters, gauges, histograms together). */
int metrics_create(int max_series, metrics **out, status *st);
/* Stops the HTTP endpoint if running and frees everything. */
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

/* Called before each exposition (on the HTTP thread), e.g. to set gauges from a snapshot. */
void metrics_set_collect(metrics *m, void (*collect)(void *arg), void *arg);

/* Writes the exposition text into buf (NUL-terminated, truncated to cap). Returns the length
 * the whole text needs (excluding the NUL), like snprintf. */
size_t metrics_format(metrics *m, char *buf, size_t cap);

/* Starts the HTTP endpoint on "HOST:PORT" (port 0 picks one: metrics_port). STATUS_IO naming
 * the address if it cannot listen. */
int metrics_serve(metrics *m, const char *listen, status *st);
int metrics_port(const metrics *m);
void metrics_stop(metrics *m);

/* Bucket bounds in seconds commonly used for latencies (vLLM-like), for the callers' tables. */
extern const double metrics_latency_buckets[];
extern const int metrics_n_latency_buckets;

#endif
