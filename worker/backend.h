/* The engine's backend interface: a vtable the scheduler drives, one implementation per device:
 * backend_cpu.c (model/forward.h + model/sampler.h) and backend_cuda.c (model/forward_cuda.h,
 * linked from //worker:cuda_worker). A backend owns the model's runtime: n_slots sequence slots
 * (recurrent state + KV for n_ctx positions each), the workspaces for up to n_slots sequences
 * per step, and a sampler per slot. Everything is allocated at creation; nothing per step or
 * per token.
 *
 * The scheduler (engine.c) calls, from its one engine thread only:
 *   seq_start(slot, sampling)  - a new sequence in this slot: state forgotten, sampler seeded;
 *   seq_end(slot)              - (optional) it has ended: its KV blocks back to the pool;
 *   step(items, n)             - one engine step: item i feeds tokens[0..n_tokens) to its slot at
 *                                the slot's next positions and, if sample, samples the next
 *                                token from the logits after the last fed token (penalties see
 *                                every token fed to the slot since seq_start).
 * Items of one step have distinct slots. Decode items (one token) should run as one batch
 * (every weight read once for all of them); prefill chunks may run one by one. Results must
 * not depend on which other items share the step (tests check this). */
#ifndef DS_WORKER_BACKEND_H
#define DS_WORKER_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sampling.h"
#include "common/status.h"
#include "model/qwen35.h"

#define WORKER_MAX_LOGPROBS SAMPLING_MAX_LOGPROBS

typedef struct worker_logprob {
    int32_t id;
    float logprob;
} worker_logprob;

typedef struct worker_batch_item {
    /* in */
    int slot;
    const int32_t *tokens; /* borrowed, [n_tokens] */
    int n_tokens;          /* >= 1 */
    bool prompt;           /* the tokens are prompt tokens (else the last generated token) */
    bool sample;
    float *logits;         /* NULL, or [n_tokens][vocab] out: the logits after each token
                              (eval and tests; not the serving path) */
    /* out, when sample */
    int32_t token;
    float logprob;                           /* of token, when n_logprobs > 0 */
    worker_logprob top[WORKER_MAX_LOGPROBS]; /* [n_top], most likely first */
    int n_top;
} worker_batch_item;

typedef struct worker_backend_opts {
    int n_slots;   /* sequences alive at once (>= 1; 0: the CUDA backend sizes it from free
                      device memory, the CPU backend takes 8) */
    int n_ctx;     /* positions per sequence (prompt + generated) */
    int n_threads; /* CPU threads; 0 = default */
    int tp;        /* tensor-parallel ranks (0 or 1: none): the CPU backend simulates them in one
                      process (model/forward_tp.h); cuda runs one rank per GPU over NCCL
                      (model/forward_cuda_tp.h) */
    int max_prefill_tokens; /* most tokens of one prefill chunk (the engine's step budget) */
    int device;             /* CUDA device index (cuda backends); with tp > 1 the first of
                               tp consecutive ones, unless tp_devices lists them */
    int n_tp_devices;       /* cuda, tp > 1: tp_devices[0 .. tp) the ranks' devices (0: from
                               device) */
    int tp_devices[64];
    bool batch_invariant;   /* cuda: every step through the batched kernels, so a sequence's
                               tokens do not depend on the others in its step (slower alone) */
    int dense_rows;         /* cuda: passes of this many rows or more multiply the quantised
                               matrices through cuBLAS (qwen35_cuda_opts.dense_rows); 0: never,
                               < 0: chosen by the forward */
    bool dense_per_pass;    /* cuda: dequantise for the dense path every pass, never keep the
                               F16 copies resident (qwen35_cuda_opts.dense_per_pass) */
    bool exact_dot;         /* cpu: quantised weights dotted in float with the F32 activations
                               (QWEN35_DOT_EXACT: reference comparisons), not with Q8 ones */
} worker_backend_opts;

/* Device counters (benchmarks and tests); backends without them leave the hook NULL. */
typedef struct worker_backend_stats {
    uint64_t tokens;            /* rows (tokens) run */
    uint64_t steps;             /* device steps (one host sync each) */
    uint64_t graph_launches;
    uint64_t kernels_per_token; /* kernel nodes of one token's graph */
    uint64_t d2h_bytes, h2d_bytes; /* copied by steps */
    uint64_t weight_bytes;      /* device bytes of weights */
    uint64_t bytes_per_token;   /* weights + state read/written + KV read at n_ctx (estimate) */
} worker_backend_stats;

typedef struct worker_backend worker_backend;

typedef struct worker_backend_vt {
    /* s: validated and resolved (worker/request.c), seed picked. */
    int (*seq_start)(worker_backend *b, int slot, const sampling_params *s, status *st);
    /* STATUS_RANGE / STATUS_INVALID: a bad item (a caller bug: requests are validated);
     * STATUS_DEVICE: the device failed (sticky: the worker should exit). */
    int (*step)(worker_backend *b, worker_batch_item *items, int n, status *st);
    void (*destroy)(worker_backend *b);
    /* Benchmarks only: the slot continues at position n_past as if that context had been
     * consumed (its KV rows hold a constant finite pattern, the recurrent state is kept).
     * STATUS_RANGE for a bad slot or position. */
    int (*fill)(worker_backend *b, int slot, int n_past, status *st);
    /* Optional (NULL: no device counters). */
    void (*get_stats)(const worker_backend *b, worker_backend_stats *s);
    /* Optional: the sequence in slot has ended (finished, cancelled or failed after seq_start):
     * its KV blocks go back to the pool. A paged backend needs it. */
    void (*seq_end)(worker_backend *b, int slot);
} worker_backend_vt;

struct worker_backend {
    const worker_backend_vt *vt;
    const qwen35_model *model; /* borrowed */
    int n_slots, n_ctx, vocab;
    uint64_t state_bytes; /* per slot, for logs */
    int prompt_rows_while_decoding; /* most prompt tokens of one request in a step that also
                                       decodes (0: no limit): a backend whose prompt tokens run
                                       one row at a time keeps running streams from waiting */
    char device[128];     /* "cpu (16 threads)", "cuda:0 NVIDIA H200", ... */
    /* Paged KV (0 / 0: none, each slot holds its whole context): a pool of kv_blocks_total
     * blocks of kv_block_tokens positions shared by the slots. A sequence takes blocks as it
     * grows (step) and returns them at seq_end / seq_start; the caller must never have more
     * positions in flight than the pool holds (the engine reserves each request's worst case at
     * admission), or step fails with STATUS_EXHAUSTED. */
    int kv_block_tokens;
    uint32_t kv_blocks_total;
};

/* The CPU backend (model/forward.h + model/sampler.h). */
int worker_backend_cpu_create(const qwen35_model *m, const worker_backend_opts *o,
                              worker_backend **out, status *st);

/* Picks a backend by device name: "cpu", or "cuda" (falls back to the CPU, saying "no GPU, using
 * CPU" in one log line, when this build has no CUDA backend or the machine no GPU; other CUDA
 * failures, e.g. an unsupported weight type or too little device memory, are returned).
 * STATUS_INVALID for an unknown device name. The CUDA backend is the one of
 * worker/cuda_backend_worker.c (//worker:cuda_worker): a binary gets it by linking that library
 * (alwayslink; backend.c references it weakly), so CPU-only builds stay free of CUDA. */
int worker_backend_create(const char *device, const qwen35_model *m, const worker_backend_opts *o,
                          worker_backend **out, status *st);

/* Whether --tp can run on device, before any model is loaded: tp 0 or 1 always, tp > 1 on
 * "cpu" (the simulated ranks; whether the model's heads split is checked at create). On
 * "cuda" / "cuda:N" / "cuda:A,B,...": STATUS_UNSUPPORTED "--tp N needs N GPUs, this host has
 * M" when fewer GPUs are visible (or a listed one is not there), STATUS_INVALID when a list's
 * length is not tp. STATUS_INVALID for tp < 0 or > 64. worker_backend_create makes the same
 * check. */
int worker_backend_check_tp(const char *device, int tp, status *st);

/* true when this binary links the CUDA backend (//worker:cuda_worker) */
bool worker_backend_have_cuda(void);

static inline void worker_backend_destroy(worker_backend *b)
{
    if (b) b->vt->destroy(b);
}

#endif
