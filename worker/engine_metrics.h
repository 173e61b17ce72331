/* The engine's Prometheus series (common/metrics.h), vLLM-style names: registered once at
 * engine creation, observed by the scheduler (engine.c) at a few points through the functions
 * below. With no registry (engine_opts.metrics NULL) every call is a no-op. The series are
 * atomics: any thread may observe. */
#ifndef DS_WORKER_ENGINE_METRICS_H
#define DS_WORKER_ENGINE_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/metrics.h"
#include "worker/engine.h"

typedef struct engine_metrics {
    bool on;                     /* a registry was given */
    metrics_series *finished[4]; /* request_success_total, by FINISH_STOP .. FINISH_ERROR */
    metrics_series *rejected_full, *rejected_draining;
    metrics_series *prompt_tokens, *generation_tokens;
    metrics_series *ttft, *itl, *e2e, *queue_time;
    metrics_series *running, *waiting, *free_slots, *total_slots;
    metrics_series *preemptions, *free_kv_blocks, *total_kv_blocks;
    /* the prefix cache's (registered by engine_metrics_prefix_init) */
    metrics_series *px_queries, *px_hits, *px_queried_tokens, *px_cached_tokens, *px_evictions;
    metrics_series *px_snapshots, *px_snapshot_bytes, *px_blocks;
    engine_load px_last; /* the counters as last observed (engine thread) */
    /* speculative decoding's (registered by engine_metrics_spec_init) */
    metrics_series *spec_steps, *spec_drafted, *spec_accepted, *spec_switched_off;
} engine_metrics;

/* Registers the series on m (NULL: off) for an engine of n_slots slots over a KV pool of
 * kv_blocks blocks (0: none; the KV gauges then stay 0). */
void engine_metrics_init(engine_metrics *em, metrics *m, int n_slots, uint32_t kv_blocks);

/* The prefix cache's series (an engine with a cache): deltaserve:prefix_cache_*. */
void engine_metrics_prefix_init(engine_metrics *em, metrics *m);
/* The cache's figures now (engine_get_load's prefix_*): counters move by what changed since the
 * last call. Engine thread. */
void engine_metrics_prefix(engine_metrics *em, const engine_load *l);

/* Speculative decoding's series (an engine with a draft head): deltaserve:spec_verify_steps_total,
 * deltaserve:spec_draft_tokens_total, deltaserve:spec_accepted_tokens_total,
 * deltaserve:spec_switched_off_total. */
void engine_metrics_spec_init(engine_metrics *em, metrics *m);
/* A verify run of k drafts accepted a of them. */
void engine_metrics_spec(engine_metrics *em, int k, int a);
/* A request stopped speculating: its rolling acceptance fell below spec_min_accept. */
void engine_metrics_spec_switched_off(engine_metrics *em);

/* Admission: a request refused (draining, else queue full), or accepted with its prompt. */
void engine_metrics_rejected(engine_metrics *em, bool draining);
void engine_metrics_accepted(engine_metrics *em, int n_prompt);

/* Slot and queue occupancy (the caller holds the engine lock, so the three agree). */
void engine_metrics_occupancy(engine_metrics *em, int running, int waiting, int n_slots);

/* A token generated for r at now (µs): time to first token when r->n_generated is 1, else the
 * inter-token latency since r->t_last (call before t_last moves to now). */
void engine_metrics_token(engine_metrics *em, const engine_request *r, int64_t now);

/* A running request was preempted (its KV blocks back, to be recomputed). */
void engine_metrics_preempted(engine_metrics *em);

/* The KV pool's free blocks (kv_pool_free_blocks). */
void engine_metrics_kv(engine_metrics *em, uint32_t free_blocks);

/* A step generated this many tokens. */
void engine_metrics_step(engine_metrics *em, int generated);

/* r ended: its finish reason, end-to-end latency and queue time. */
void engine_metrics_finished(engine_metrics *em, const engine_request *r);

#endif
