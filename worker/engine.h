/* The engine: one thread running a continuous-batching scheduler over the backend adapter
 * (worker/backend.h).
 *
 * Requests come in from any thread (engine_submit: the gRPC CQ thread); a bounded admission
 * queue holds them until they can run (FIFO). Every step the engine
 *   1. ends cancelled requests (client gone / deadline via the sink, Worker/Abort) and frees
 *      their slots; admits waiting requests into free slots;
 *   2. builds one batch: a decode token for every running sequence past its prompt, plus
 *      prefill chunks of the sequences still in their prompt, in admission order, bounded by
 *      the token budget (step_tokens less the decode rows, but never below
 *      prefill_min_tokens: waiting prompts progress however many sequences decode);
 *   3. takes from the backend's KV pool the blocks the batch's positions need, preempting
 *      when the pool runs dry (below);
 *   4. runs worker_backend_step, then for every sampled token checks the stop conditions and
 *      hands the token to the request's sink; finished requests free their slot at once.
 * Results of a sequence do not depend on what else is in the batch, nor on preemption (but for
 * the RNG of a seeded sampled request: see below).
 *
 * KV blocks (a backend with a pool, worker_backend.kv): the pool (model/kv_pool.h) is the one
 * bookkeeper; nothing is reserved for a request's worst case, the engine over-commits.
 *   - Admission: the head of the queue is admitted when a slot is free and the pool's free
 *     blocks, less those promised to requests admitted earlier and not yet taken, cover its
 *     known tokens + 1 (the prompt, any tokens generated before a preemption, and the next
 *     one) plus a watermark of 1% of the pool (at least one block), so that running sequences
 *     grow a while before anyone is preempted. With nothing running the watermark is waived:
 *     a request that fits the pool alone always runs. A request whose prompt + max_new_tokens
 *     could never fit (the pool, or one sequence's table) is refused at submit (STATUS_RANGE).
 *   - Before each step every item's block table grows to cover the positions after the item
 *     (kv_pool_ensure), oldest admission first. When the pool cannot grow one, the running
 *     request admitted last is preempted (LIFO, as vLLM; a re-admitted request keeps its first
 *     admission's place, so the oldest request always makes progress): its sequence ends in the
 *     backend (seq_end: its blocks back) and it returns to the head of the waiting queue. When
 *     re-admitted it prefills its prompt and the tokens it had generated, then continues; the
 *     tokens already streamed are not sent again, its timings are kept, and the preemption is
 *     counted (engine_load.preemptions, deltaserve:num_preemptions_total). A request the pool
 *     cannot grow even when it runs alone fails (FINISH_ERROR, STATUS_EXHAUSTED).
 *   - Recompute, not swap: a Qwen3.5 sequence is its recurrent (DeltaNet) state and its KV
 *     blocks, so a swap would copy both out to host memory and back; recomputing re-runs a
 *     prefill, which costs far less per token than decoding (every weight read once for a whole
 *     chunk: compute-bound on the GPU), needs no host memory and no copy path in the forward.
 *   - The re-fed tokens keep what they were: prompt chunks and generated chunks never share an
 *     item, and generated ones are fed with prompt = false, so penalties see the sequence as
 *     before. The backend's sampler restarts its RNG counter at seq_start, so after a
 *     preemption a seeded sampled request draws from step 0 again (greedy decoding and
 *     penalties reproduce exactly; seeded draws do not).
 *
 * Sinks are called on the engine thread and must not block (the gRPC sink stores each token
 * and hands a step's tokens to the streams' writers at on_step_end). After on_finish the sink
 * never hears of the request again.
 *
 * Memory: the request pool (n_slots + queue entries) is allocated at creation; each request
 * has one allocation, made at submit and freed at finish, for its prompt and every token it may
 * generate (kept for a recompute); nothing per token. */
#ifndef DS_WORKER_ENGINE_H
#define DS_WORKER_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "common/clock.h"
#include "common/finish.h"
#include "common/metrics.h"
#include "worker/backend.h"

#define ENGINE_REQUEST_ID_MAX 128
#define ENGINE_MAX_STOP_IDS 16
#define ENGINE_MAX_EOS_IDS 8

/* A validated request (worker/request.c builds it from the proto). */
typedef struct engine_params {
    char id[ENGINE_REQUEST_ID_MAX + 1];
    const int32_t *prompt; /* borrowed until engine_submit returns (it copies) */
    int n_prompt;
    sampling_params sampling; /* validated and resolved, seed picked */
    int max_new_tokens; /* >= 1, n_prompt + max_new_tokens <= n_ctx */
    int32_t stop_ids[ENGINE_MAX_STOP_IDS];
    int n_stop_ids;
    bool ignore_eos;
    bool no_speculation; /* never speculate for this request (GenerateRequest.no_speculation) */
} engine_params;

/* Times in microseconds on clock_now_us (common/clock.h); t_admit is the first admission. */
typedef struct engine_request {
    engine_params p;        /* p.prompt points to tokens */
    int32_t *tokens;        /* owned, [n_prompt + max_new_tokens]: the prompt, then the
                               n_generated tokens generated */
    int slot;               /* -1 while waiting */
    int n_fed;              /* tokens[0 .. n_fed) fed to the slot since its seq_start */
    int n_generated;
    finish_reason finish;   /* common/finish.h: FINISH_NONE while it runs */
    int32_t stop_token;     /* the matched stop/eos id, or -1 */
    status result;          /* OK, or why it failed/was cancelled */
    bool aborted;           /* Worker/Abort or drain (under the engine lock) */
    status abort_result;    /* the result an abort ends it with (OK for Worker/Abort) */
    bool started;           /* backend seq_start done, seq_end not yet (engine thread only) */
    int n_preempted;        /* times it was preempted */
    int n_cached;           /* prompt tokens its sequence took from the prefix cache instead of
                               computing them (its last admission; usage.cached_tokens) */
    /* the prefix cache (engine thread only) */
    int snap_at;            /* a snapshot is due when n_fed reaches this (0: none): where its
                               prompt leaves the cached KV, or where a waiting one's does */
    int snap_last;          /* n_fed at its last snapshot (or where it started) */
    uint64_t leader_seq;    /* not started: waits for the request of this admit_seq to snapshot
                               at leader_pos, the prefix the two prompts share (0: none) */
    int leader_slot, leader_pos;
    uint32_t kv_promise;    /* KV blocks its admission counted and it has not taken yet (under
                               the engine lock) */
    /* speculative decoding (engine thread): the request speculates (the engine has a draft head,
       the request allows it, no sampling penalty, its sequence started cold, its acceptance
       held up); verify steps run, drafts proposed and accepted */
    bool spec;
    int spec_steps, spec_drafted, spec_accepted;
    double spec_accept;     /* rolling acceptance of its verify runs (spec_accept_mean) */
    bool spec_switched_off; /* its rolling acceptance fell below spec_min_accept: it never
                               speculates again (kept through preemption) */
    uint64_t admit_seq;     /* first admission order (1, 2, ...; kept through preemption): prefill
                               priority, and who is preempted first (the highest) */
    int64_t t_arrival, t_admit, t_first, t_last, t_end;
    const struct engine_sink *sink;
    void *sink_arg;
    struct engine_request *next; /* free list / waiting FIFO */
} engine_request;

typedef struct engine_sink {
    /* true when the request's client is gone (cancel, disconnect, deadline). */
    bool (*cancelled)(void *arg);
    /* a generated token; item holds the logprobs when asked. */
    void (*on_token)(void *arg, const engine_request *r, const worker_batch_item *item);
    /* the end: r->finish, r->stop_token, r->result, timings. Last call for r. r is a copy
     * (r->p.prompt is NULL): the request's slot is already free and counted so in GetLoad, so
     * whoever sees the stream end sees the slot free. */
    void (*on_finish)(void *arg, const engine_request *r);
    /* optional: after the on_token calls of a step, once per step for each sink that had one
     * (with step_arg): where a sink hands the step's tokens on in one go (the gRPC sink: one
     * lock per step for all its streams). A sink with it still sees each token through
     * on_token first, and on_finish of a request may come without a step end after its last
     * tokens (cancel, failure): it then hands them on itself. */
    void (*on_step_end)(void *step_arg);
    void *step_arg;
} engine_sink;

#define ENGINE_PREFILL_MIN_TOKENS_DEFAULT 16

typedef struct engine_opts {
    int queue;        /* admission queue capacity (waiting requests); < 0 -> 64 */
    int step_tokens;  /* token budget per step (decode tokens + prefill chunk); 0 -> 256 */
    int prefill_min_tokens; /* prompt tokens every step may run however many rows decode
                               (at most step_tokens); 0 -> 16 */
    int32_t eos_ids[ENGINE_MAX_EOS_IDS]; /* end-of-generation ids (unless ignore_eos) */
    int n_eos_ids;
    metrics *metrics; /* optional: series are registered on it */
    /* the prefix cache is on when the backend's forward has snapshots (fwd.n_snaps) */
    int prefix_snap_every; /* a prompt prefill keeps a snapshot at the end of a step when this
                              many tokens were computed since its last one (0: never) */
    /* speculative decoding with the model's MTP head (worker/spec.h), on when spec_k >= 1, the
       model has the head and the forward runs verify runs of spec_k + 1 rows */
    int spec_k;         /* drafts per verify run (0: off; 1..SPEC_MAX_K) */
    int spec_max_batch; /* speculate only while at most this many sequences decode (0: 8) */
    int spec_threads;   /* the draft head's CPU threads (0: all online CPUs) */
    bool spec_gate;     /* speculate at a number of decoding sequences only while measured
                           faster there than plain steps (worker/spec.h spec_gate) */
    float spec_min_accept; /* 0..1: a request whose rolling acceptance (worker/spec.h
                              spec_accept_mean) is below this after at least
                              SPEC_ACCEPT_MIN_RUNS verify runs stops speculating (0: never) */
    /* optional: called once (engine thread) when the backend fails for good (STATUS_DEVICE) */
    void (*on_fatal)(void *arg);
    void *fatal_arg;
} engine_opts;

typedef struct engine engine;

typedef struct engine_load {
    int running, waiting, free_slots, total_slots, queue_capacity;
    uint32_t free_kv_blocks, total_kv_blocks; /* the backend's KV pool: blocks no sequence
                                                 holds, and all; 0 / 0 without one */
    uint64_t preemptions; /* requests preempted so far */
    /* the prefix cache (model/prefix_cache.h; all 0 without one) */
    bool prefix_cache;
    uint64_t prefix_queries, prefix_hits, prefix_queried_tokens, prefix_cached_tokens;
    uint64_t prefix_evictions;
    uint32_t prefix_snapshots, prefix_blocks;
    uint64_t prefix_snapshot_bytes;
    uint64_t outstanding_tokens;
    /* speculative decoding: on (a draft head), verify runs, drafts proposed, drafts accepted,
       requests switched off by their rolling acceptance (spec_min_accept) */
    bool speculative;
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_switched_off;
    double tokens_per_second;
    bool draining;
    uint64_t steps, tokens_generated, requests_finished;
} engine_load;

/* Starts the engine thread over b (borrowed; must outlive the engine). */
int engine_create(worker_backend *b, const engine_opts *o, engine **out, status *st);

/* Queues a request. STATUS_EXHAUSTED when the queue is full, STATUS_UNAVAILABLE while draining,
 * STATUS_RANGE when its prompt + max_new_tokens could never fit the KV pool, STATUS_NOMEM. On
 * success the sink will get on_finish exactly once. Thread-safe, never blocks on the engine's
 * work (a short lock). */
int engine_submit(engine *e, const engine_params *p, const engine_sink *sink, void *sink_arg,
                  status *st);

/* Ends the running or waiting request with this id (the first one found) at the next step with
 * FINISH_CANCELLED and an OK result. Returns true if one was found. */
bool engine_abort(engine *e, const char *request_id);

void engine_get_load(engine *e, engine_load *out);

/* Hashes of the first n_tokens prompt tokens (splitmix64_tokens, common/splitmix64.h) of up to
 * max prefixes the prefix cache holds, most recently used first (the router's prefix
 * affinity); 0 without a cache. Thread-safe. */
int engine_prefix_heads(engine *e, int n_tokens, uint64_t *out, int max);

/* Stops admitting (submit -> UNAVAILABLE), waits up to grace_ms for running and waiting
 * requests to finish, then cancels the rest (result UNAVAILABLE "draining") and waits for
 * them to end. Returns the number of requests cancelled. */
int engine_drain(engine *e, int64_t grace_ms);

/* true once the backend failed (STATUS_DEVICE): every request then fails; the worker should
 * exit with a distinct code. */
bool engine_failed(engine *e);

/* Waits until no request is running or waiting (tests). Returns false after timeout_ms. */
bool engine_wait_idle(engine *e, int64_t timeout_ms);

/* Stops the thread (requests still in flight are cancelled first) and frees the engine. */
void engine_destroy(engine *e);


#endif
