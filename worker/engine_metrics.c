#include "worker/engine_metrics.h"

#include <stdio.h>

void engine_metrics_init(engine_metrics *em, metrics *m, int n_slots, uint32_t kv_blocks)
{
    *em = (engine_metrics){0};
    if (!m) return;
    em->on = true;
    for (int i = 0; i < 4; i++) {
        char label[64];
        snprintf(label, sizeof label, "finished_reason=\"%s\"", finish_reason_name(FINISH_STOP + i));
        em->finished[i] = metrics_counter(m, "deltaserve:request_success_total", label,
                                          "Requests finished, by reason.");
    }
    em->rejected_full = metrics_counter(m, "deltaserve:request_rejected_total", "reason=\"queue_full\"",
                                        "Requests refused at admission.");
    em->rejected_draining = metrics_counter(m, "deltaserve:request_rejected_total",
                                            "reason=\"draining\"", "Requests refused at admission.");
    em->prompt_tokens = metrics_counter(m, "deltaserve:prompt_tokens_total", NULL,
                                        "Prompt tokens of admitted requests.");
    em->generation_tokens = metrics_counter(m, "deltaserve:generation_tokens_total", NULL,
                                            "Tokens generated.");
    em->ttft = metrics_histogram(m, "deltaserve:time_to_first_token_seconds", NULL,
                                 "From arrival to the first generated token.",
                                 metrics_latency_buckets, metrics_n_latency_buckets);
    em->itl = metrics_histogram(m, "deltaserve:inter_token_latency_seconds", NULL,
                                "Between consecutive generated tokens of a request.",
                                metrics_latency_buckets, metrics_n_latency_buckets);
    em->e2e = metrics_histogram(m, "deltaserve:e2e_request_latency_seconds", NULL,
                                "From arrival to the end of the request.",
                                metrics_latency_buckets, metrics_n_latency_buckets);
    em->queue_time = metrics_histogram(m, "deltaserve:request_queue_time_seconds", NULL,
                                       "From arrival to a sequence slot.",
                                       metrics_latency_buckets, metrics_n_latency_buckets);
    em->running = metrics_gauge(m, "deltaserve:num_requests_running", NULL,
                                "Requests holding a sequence slot.");
    em->waiting = metrics_gauge(m, "deltaserve:num_requests_waiting", NULL,
                                "Requests in the admission queue.");
    em->free_slots = metrics_gauge(m, "deltaserve:num_free_slots", NULL, "Sequence slots free.");
    em->total_slots = metrics_gauge(m, "deltaserve:num_total_slots", NULL, "Sequence slots.");
    em->preemptions = metrics_counter(m, "deltaserve:num_preemptions_total", NULL,
                                      "Running requests preempted (KV blocks back, recomputed later).");
    em->free_kv_blocks = metrics_gauge(m, "deltaserve:num_free_kv_blocks", NULL,
                                       "KV cache blocks no sequence holds.");
    em->total_kv_blocks = metrics_gauge(m, "deltaserve:num_total_kv_blocks", NULL,
                                        "KV cache blocks (0: no paged KV cache).");
    metrics_set(em->total_slots, n_slots);
    metrics_set(em->free_slots, n_slots);
    metrics_set(em->total_kv_blocks, kv_blocks);
    metrics_set(em->free_kv_blocks, kv_blocks);
}

void engine_metrics_prefix_init(engine_metrics *em, metrics *m)
{
    if (!em->on) return;
    em->px_queries = metrics_counter(m, "deltaserve:prefix_cache_queries_total", NULL,
                                     "Sequences that looked up their prompt in the prefix cache.");
    em->px_hits = metrics_counter(m, "deltaserve:prefix_cache_hits_total", NULL,
                                  "Lookups that found a cached prefix to resume from.");
    em->px_queried_tokens = metrics_counter(m, "deltaserve:prefix_cache_queried_tokens_total", NULL,
                                            "Prompt tokens looked up in the prefix cache.");
    em->px_cached_tokens = metrics_counter(m, "deltaserve:prefix_cache_cached_tokens_total", NULL,
                                           "Prompt tokens served from the prefix cache, not computed.");
    em->px_evictions = metrics_counter(m, "deltaserve:prefix_cache_evictions_total", NULL,
                                       "Snapshots and blocks the prefix cache let go for room.");
    em->px_snapshots = metrics_gauge(m, "deltaserve:prefix_cache_snapshots", NULL,
                                     "Recurrent-state snapshots the prefix cache holds.");
    em->px_snapshot_bytes = metrics_gauge(m, "deltaserve:prefix_cache_snapshot_bytes", NULL,
                                          "Bytes of the snapshots the prefix cache holds.");
    em->px_blocks = metrics_gauge(m, "deltaserve:prefix_cache_blocks", NULL,
                                  "KV cache blocks the prefix cache holds a reference on.");
}

void engine_metrics_prefix(engine_metrics *em, const engine_load *l)
{
    if (!em->on || !em->px_queries) return;
    engine_load *o = &em->px_last;
    metrics_inc(em->px_queries, (double)(l->prefix_queries - o->prefix_queries));
    metrics_inc(em->px_hits, (double)(l->prefix_hits - o->prefix_hits));
    metrics_inc(em->px_queried_tokens, (double)(l->prefix_queried_tokens - o->prefix_queried_tokens));
    metrics_inc(em->px_cached_tokens, (double)(l->prefix_cached_tokens - o->prefix_cached_tokens));
    metrics_inc(em->px_evictions, (double)(l->prefix_evictions - o->prefix_evictions));
    metrics_set(em->px_snapshots, l->prefix_snapshots);
    metrics_set(em->px_snapshot_bytes, (double)l->prefix_snapshot_bytes);
    metrics_set(em->px_blocks, l->prefix_blocks);
    *o = *l;
}

void engine_metrics_spec_init(engine_metrics *em, metrics *m)
{
    if (!em->on) return;
    em->spec_steps = metrics_counter(m, "deltaserve:spec_verify_steps_total", NULL,
                                     "Speculative verify runs (the last token and its drafts in "
                                     "one step).");
    em->spec_drafted = metrics_counter(m, "deltaserve:spec_draft_tokens_total", NULL,
                                       "Tokens the MTP head drafted and the model verified.");
    em->spec_accepted = metrics_counter(m, "deltaserve:spec_accepted_tokens_total", NULL,
                                        "Drafted tokens the model accepted (acceptance rate: "
                                        "accepted / drafted; tokens per verify run: 1 + "
                                        "accepted / steps).");
    em->spec_switched_off = metrics_counter(m, "deltaserve:spec_switched_off_total", NULL,
                                            "Requests that stopped speculating for good: "
                                            "rolling draft acceptance below "
                                            "--spec-min-acceptance, or more than "
                                            "--spec-max-batch sequences decoding for 32 steps.");
}

void engine_metrics_spec(engine_metrics *em, int k, int a)
{
    if (!em->on || !em->spec_steps) return;
    metrics_inc(em->spec_steps, 1);
    metrics_inc(em->spec_drafted, k);
    metrics_inc(em->spec_accepted, a);
}

void engine_metrics_spec_switched_off(engine_metrics *em)
{
    if (em->on && em->spec_switched_off) metrics_inc(em->spec_switched_off, 1);
}

void engine_metrics_preempted(engine_metrics *em)
{
    if (em->on) metrics_inc(em->preemptions, 1);
}

void engine_metrics_kv(engine_metrics *em, uint32_t free_blocks)
{
    if (em->on) metrics_set(em->free_kv_blocks, free_blocks);
}

void engine_metrics_rejected(engine_metrics *em, bool draining)
{
    if (em->on) metrics_inc(draining ? em->rejected_draining : em->rejected_full, 1);
}

void engine_metrics_accepted(engine_metrics *em, int n_prompt)
{
    if (em->on) metrics_inc(em->prompt_tokens, n_prompt);
}

void engine_metrics_occupancy(engine_metrics *em, int running, int waiting, int n_slots)
{
    if (!em->on) return;
    metrics_set(em->running, running);
    metrics_set(em->waiting, waiting);
    metrics_set(em->free_slots, n_slots - running);
}

void engine_metrics_token(engine_metrics *em, const engine_request *r, int64_t now)
{
    if (!em->on) return;
    if (r->n_generated == 1) metrics_observe(em->ttft, (double)(now - r->t_arrival) / 1e6);
    else metrics_observe(em->itl, (double)(now - r->t_last) / 1e6);
}

void engine_metrics_step(engine_metrics *em, int generated)
{
    if (em->on && generated) metrics_inc(em->generation_tokens, (double)generated);
}

void engine_metrics_finished(engine_metrics *em, const engine_request *r)
{
    if (!em->on) return;
    const int f = (int)r->finish;
    metrics_inc(em->finished[(f >= FINISH_STOP && f <= FINISH_ERROR ? f : FINISH_ERROR) - FINISH_STOP], 1);
    metrics_observe(em->e2e, (double)(r->t_end - r->t_arrival) / 1e6);
    if (r->t_admit) metrics_observe(em->queue_time, (double)(r->t_admit - r->t_arrival) / 1e6);
}
