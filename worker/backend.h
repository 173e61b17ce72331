/* The engine's backend: one thin adapter over the forward contract (model/fwd.h), the same for
 * every device. The forward (found by device name in the registry this binary links) owns the
 * model's runtime: n_slots sequence slots, the paged KV cache and its block pool (kv), the
 * workspaces of a step, and a sampler per slot; the adapter turns the engine's items into the
 * forward's rows. Everything is allocated at creation; nothing per step or per token.
 *
 * The scheduler (engine.c) calls, from its one engine thread only:
 *   worker_backend_seq_start(slot, sampling)  a new sequence in this slot: state forgotten,
 *                                             sampler seeded, its KV blocks back to the pool;
 *   worker_backend_seq_end(slot)              it has ended: its KV blocks back to the pool;
 *   worker_backend_seq_resume(slot, s, x)     a new sequence continuing a cached prefix x;
 *   worker_backend_snap_save(slot, snap)      the slot's recurrent state kept in a snapshot;
 *   worker_backend_step(items, n)             one engine step: item i feeds tokens[0..n_tokens)
 *                                             to its slot at the slot's next positions and, if
 *                                             sample, samples the next token from the logits
 *                                             after the last fed token (penalties see every
 *                                             token fed to the slot since seq_start).
 * Items of one step have distinct slots. The forward batches them: decode items (one token)
 * share one pass that reads every weight once; prompt chunks are runs of rows. Results do not
 * depend on which other items share the step (tests check this). An item longer than the
 * forward's max_rows goes over several forward steps. */
#ifndef DS_WORKER_BACKEND_H
#define DS_WORKER_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sampling.h"
#include "common/status.h"
#include "model/fwd.h"
#include "model/kv_pool.h"
#include "model/qwen35.h"

typedef struct worker_batch_item {
    /* in */
    int slot;
    const int32_t *tokens; /* borrowed, [n_tokens] */
    int n_tokens;          /* >= 1 */
    bool prompt;           /* the tokens are prompt tokens (else the last generated token) */
    bool sample;
    float *logits;         /* NULL, or [n_tokens][vocab] out: the logits after each token
                              (eval and tests; not the serving path) */
    float *hidden;         /* NULL, or [n_tokens][H] out: each token's final-norm output (the
                              MTP head's input; fwd_row.hidden) */
    bool verify;           /* speculative decoding: the tokens are a verify run (fwd.h: the last
                              token, then the drafts; at most fwd.verify_rows), every one
                              sampled into outs; worker_backend_rollback may follow */
    sample_result *outs;   /* verify: [n_tokens] out, the token chosen after each */
    /* out, when sample: the token, with its logprobs when the sequence asked for them */
    sample_result out;
} worker_batch_item;

typedef struct worker_backend_opts {
    int n_slots;   /* sequences alive at once (>= 1; 0: sized by the device from memory, a
                      quarter of the context each: at most 256 on cuda, 8 on the CPU) */
    int n_ctx;     /* positions per sequence (prompt + generated) */
    bool ctx_fit;  /* n_ctx is the model's: the forward may shrink it to what fits in memory
                      (fwd_opts.ctx_fit) */
    int64_t mem_budget; /* bytes for the slots' state and the KV pool (fwd_opts.mem_budget);
                           0: chosen by the device */
    int n_threads; /* CPU threads; 0 = default */
    int tp;        /* tensor-parallel ranks (0 or 1: one): the CPU simulates them in one process
                      (model/forward_cpu.h); cuda runs one rank per GPU over NCCL */
    int max_prefill_tokens; /* most tokens of one prefill chunk (the engine's step budget): the
                               forward's steps take n_slots + this many rows */
    int kv_blocks;          /* > 0: blocks of the KV pool; 0: sized by the forward */
    int kv_block_tokens;    /* cpu: positions per KV block (0: the forward's 64); cuda: 64 */
    bool batch_invariant;   /* cuda: every step through the batched kernels, so a sequence's
                               tokens do not depend on the others in its step (slower alone) */
    int dense_rows;         /* cuda: passes of this many rows or more multiply the quantised
                               matrices through cuBLAS (fwd_opts.dense_rows); 0: never,
                               < 0: chosen by the forward */
    bool dense_per_pass;    /* cuda: dequantise for the dense path every pass, never keep the
                               F16 copies resident */
    bool exact_dot;         /* cpu: quantised weights dotted in float with the F32 activations
                               (reference comparisons), not with Q8 ones */
    int64_t snap_budget;    /* bytes of recurrent-state snapshots for prefix reuse
                               (fwd_opts.snap_budget): 0 none, < 0 chosen by the forward */
    int verify_rows;        /* most rows of a verify run (fwd_opts.verify_rows: speculative
                               k + 1); 0: none */
    int verify_runs;        /* most verify runs a step (fwd_opts.verify_runs; 0: the forward's) */
    fwd_state_dtype state_dtype; /* the DeltaNet S's storage (fwd_opts.state_dtype) */
} worker_backend_opts;

typedef struct worker_backend {
    fwd *f;                    /* owned */
    const qwen35_model *model; /* borrowed */
    int n_slots, n_ctx, vocab;
    uint64_t state_bytes; /* per slot, for logs */
    int prompt_rows_while_decoding; /* most prompt tokens of one request in a step that also
                                       decodes (0: no limit): a forward whose prompt tokens run
                                       one row at a time (fwd.pass_rows 0) keeps running streams
                                       from waiting */
    char device[128];     /* the forward's: "cpu (16 threads)", "cuda:0 NVIDIA H200", ... */
    kv_pool *kv;          /* the forward's KV blocks: the scheduler reads the free ones and grows
                             each running sequence's table before a step */
    fwd_row *rows;        /* owned, [f->max_rows] */
    sample_result **row_out; /* owned, [f->max_rows]: where a sampled row's result goes */
} worker_backend;

/* The forward for a device name: "cpu"; "cuda" (devices 0 .. tp-1), "cuda:N" (N .. N+tp-1) or
 * "cuda:A,B,..." (one per rank). A cuda name falls back to the CPU, saying "no GPU, using CPU"
 * in one log line, when this binary's registry has no "cuda" or the forward says
 * STATUS_UNAVAILABLE (no driver, no GPU); other failures (a model the GPU cannot run, too little
 * device memory) are returned. STATUS_INVALID for an unknown or malformed name. The devices
 * come from the name (o's devices are not read). */
int worker_fwd_create(const char *device, const qwen35_model *m, const fwd_opts *o, fwd **out,
                      status *st);

/* The forward of worker_fwd_create(device) for these options, behind the adapter. */
int worker_backend_create(const char *device, const qwen35_model *m, const worker_backend_opts *o,
                          worker_backend **out, status *st);
/* The adapter over a forward the caller made (ownership passes to the backend, also on error). */
int worker_backend_wrap(fwd *f, worker_backend **out, status *st);
void worker_backend_destroy(worker_backend *b);

/* Whether --tp can run on device, before any model is loaded: tp 0 or 1 always, tp > 1 on
 * "cpu" (the simulated ranks; whether the model's heads split is checked at create). On
 * "cuda" / "cuda:N" / "cuda:A,B,...": STATUS_UNSUPPORTED "--tp N needs N GPUs, this host has
 * M" when fewer GPUs are visible (the registry's device_count; 0 without a cuda entry) or a
 * listed one is not there, STATUS_INVALID when a list's length is not tp. STATUS_INVALID for
 * tp < 0 or > 64. worker_backend_create makes the same check. */
int worker_backend_check_tp(const char *device, int tp, status *st);

/* s: validated and resolved (worker/request.c), seed picked. */
int worker_backend_seq_start(worker_backend *b, int slot, const sampling_params *s, status *st);
void worker_backend_seq_end(worker_backend *b, int slot);
/* A new sequence continuing a cached prefix (fwd_seq_resume, model/fwd.h); errors leave the slot
 * empty. */
int worker_backend_seq_resume(worker_backend *b, int slot, const sampling_params *s,
                              const fwd_prefix *x, status *st);
/* The slot's recurrent state into snapshot snap (fwd_snap_save): no host sync. */
int worker_backend_snap_save(worker_backend *b, int slot, int snap, status *st);
/* STATUS_RANGE / STATUS_INVALID: a bad item (a caller bug: requests are validated);
 * STATUS_EXHAUSTED: the KV pool has too few free blocks for the items (nothing run);
 * STATUS_INTERNAL: a sampled row found no finite logit; STATUS_DEVICE: the device failed (sticky:
 * the worker should exit). */
int worker_backend_step(worker_backend *b, worker_batch_item *items, int n, status *st);
/* After a verify item of slot: the slot continues at n_past (fwd_rollback). */
int worker_backend_rollback(worker_backend *b, int slot, int n_past, status *st);
void worker_backend_get_stats(const worker_backend *b, fwd_stats *s);

#endif
