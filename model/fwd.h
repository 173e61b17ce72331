/* The forward contract: one shape for every device. A forward holds a Qwen3.5 model's runtime
 * on one device kind (a group of N >= 1 tensor-parallel ranks: N = 1 is the plain forward):
 * n_slots sequence slots (recurrent state and a sampler each), a paged KV cache whose blocks the
 * pool (model/kv_pool.h) hands out, and the workspaces of a step. Implementations:
 * fwd_backend_cpu (model/forward_cpu.c: the CPU forward, the specification) and
 * fwd_backend_cuda (model/forward_cuda_fwd.c: the CUDA forward, one GPU per rank).
 *
 * A step takes rows: a token fed to a slot at a position, and whether to sample the slot's next
 * token from that row's logits. It returns, for every sampled row, the sampled id with its
 * logprobs (sample_result, common/sampling.h), on the CPU as on the GPU: the sampler lives
 * behind the forward. Nothing is allocated per step; a step costs one host sync on a device.
 *
 *   fwd *f;
 *   fwd_create("cuda", model, &(fwd_opts){.n_ctx = 4096, .n_slots = 8}, &f, &st);
 *   fwd_seq_start(f, slot, &params, &st);
 *   rows[0] = (fwd_row){.token = t, .slot = slot, .pos = n_past, .sample = true};
 *   fwd_step(f, rows, 1, &st);                 rows[0].out.token: the next token
 *   fwd_seq_end(f, slot);                      its KV blocks back to the pool
 *   fwd_destroy(f);
 *
 * Which devices a binary has is a registry Bazel builds (fwd_backends below): a binary links
 * one of //model:backends_cpu or //model:backends_all, nothing is found through weak symbols.
 *
 * Speculative decoding (worker/spec.h) verifies k drafts of a slot in one step: a verify run,
 * k+1 consecutive rows of the slot with .verify set (the last token, then the drafts), each
 * sampled and, with .hidden, returning its final-norm output (the MTP head's input). A verify
 * run computes what k+1 one-row steps would (CPU: bit for bit) and keeps the slot's recurrent
 * state after each of its rows, so that fwd_rollback can take the slot back to just after any
 * of them without a replay; the KV rows past that position are rewritten by later rows:
 *
 *   rows[i] = (fwd_row){.token = i ? d[i-1] : last, .slot = s, .pos = p + i, .sample = true,
 *                       .verify = true, .hidden = h + i*H};        i = 0 .. k
 *   fwd_step(f, rows, k + 1, &st);        rows[i].out.token: the model's choice after row i
 *   fwd_rollback(f, s, p + a + 1, &st);   keep rows 0 .. a (a: drafts accepted)
 *
 * Threading: one caller thread at a time (the engine thread). */
#ifndef DS_MODEL_FWD_H
#define DS_MODEL_FWD_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sampling.h"
#include "common/status.h"
#include "model/kv_pool.h"
#include "model/qwen35.h"

#define FWD_MAX_RANKS 64

/* How the DeltaNet recurrent state S ([n_v][d_v][d_k] per layer and slot) is stored; the
 * arithmetic, the decay and the gates are F32 either way, and the conv windows stay F32. */
typedef enum fwd_state_dtype {
    FWD_STATE_F32 = 0,
    FWD_STATE_BF16, /* S loaded bf16 -> F32, updated, stored rounded to nearest even: cuda holds
                       it in bf16 (half the bytes: about twice the slots and snapshots in the
                       same memory); cpu keeps the same values in F32 floats */
    FWD_STATE_AUTO, /* the device's choice, resolved by fwd_create: bf16 on cuda (its drift on
                       held-out text: docs/BENCH.md), f32 on the CPU */
} fwd_state_dtype;

/* "f32", "bf16" or "auto" into *out; STATUS_INVALID naming the text otherwise. */
int fwd_state_dtype_parse(const char *text, fwd_state_dtype *out, status *st);
const char *fwd_state_dtype_name(fwd_state_dtype t);

typedef struct fwd_opts {
    int n_slots;       /* sequences alive at once (>= 1; 0: sized by the device from memory,
                          a quarter of the context each: at most 256 on cuda, 8 on the CPU) */
    int n_ctx;         /* positions per sequence (prompt + generated) */
    bool ctx_fit;      /* n_ctx is the model's, not asked for: the forward shrinks it to what
                          fits in memory (fwd_plan.h), and says so in fwd.plan */
    int64_t mem_budget; /* > 0: bytes the slots' state and the KV pool (and, on cuda, the
                           snapshots and the context-sized attention partials) may take at
                           most; 0: chosen by the device (cpu: FWD_CPU_MEM_PERCENT of the
                           available RAM, within a cgroup limit; cuda: the free device memory
                           after the weights, the activations and a reserve) */
    int max_rows;      /* most rows of one step (0: n_slots + 256) */
    int ranks;         /* tensor-parallel ranks (0 or 1: one) */
    int devices[FWD_MAX_RANKS]; /* cuda: the ranks' device indices */
    int n_devices;     /* 0: devices 0 .. ranks-1 */
    int kv_blocks;     /* > 0: blocks in the KV pool; 0: sized by the forward */
    int kv_block_tokens; /* cpu: positions per KV block (0: 64); cuda: 64 (the kernels') */
    int n_threads;     /* cpu: threads (0: all online CPUs) */
    bool exact_dot;    /* cpu: quantised weights dotted in float with the F32 activations
                          (reference comparisons), not with Q8 ones */
    bool batch_invariant; /* cuda: every step through the batched kernels, so a sequence's tokens
                             do not depend on the others in its step (slower alone) */
    int dense_rows;       /* cuda: passes of this many rows or more multiply the quantised
                             matrices as F16 through cuBLAS; 0: never; < 0: chosen */
    bool dense_per_pass;  /* cuda: dequantise for the dense path every pass */
    int64_t snap_budget;  /* bytes for recurrent-state snapshots (prefix reuse), every rank
                             together: 0 none; < 0 chosen by the forward (cuda: a share of the
                             free device memory; cpu: FWD_CPU_SNAPS_PER_SLOT per slot) */
    int verify_rows;      /* most rows of a verify run (speculative k + 1, at most
                             FWD_MAX_VERIFY_ROWS); 0: no verify runs. The CPU keeps this many
                             recurrent states per slot for fwd_rollback */
    int verify_runs;      /* cuda: most verify runs in one step (0: FWD_VERIFY_RUNS); it keeps
                             verify_runs x (verify_rows - 1) recurrent states for fwd_rollback,
                             each a slot's worth of memory */
    fwd_state_dtype state_dtype; /* the DeltaNet S's storage (above) */
} fwd_opts;

#define FWD_MAX_VERIFY_ROWS 8
#define FWD_VERIFY_RUNS 8

#define FWD_CPU_SNAPS_PER_SLOT 4
#define FWD_CPU_MEM_PERCENT 50 /* of MemAvailable (/proc/meminfo): the CPU forward's budget for
                                  slots and KV when fwd_opts.mem_budget is 0 */

/* A cached prefix a new sequence continues from (seq_resume): the recurrent state after n_pos
 * tokens, saved in snapshot snap (snap_save), and the KV blocks that hold positions [0, n_pos).
 * The full blocks are shared (the sequence takes a reference on each, kv_pool_adopt); a partial
 * last block (n_pos not a multiple of the block's positions) is copied into a fresh block of the
 * sequence's own, whose rows past n_pos the sequence then writes. */
typedef struct fwd_prefix {
    int snap;              /* in [0, n_snaps) */
    int n_pos;             /* in [1, n_ctx) */
    const int32_t *blocks; /* [kv_pool_blocks_for(kv, n_pos)] held blocks (count >= 1) */
    const int32_t *tokens; /* [n_pos]: the prefix's tokens; the sampler counts them as prompt
                              tokens, as if they had been fed */
} fwd_prefix;

/* One row of a step: a token fed to a slot. A slot's rows are consecutive within a step and in
 * position order (a prompt chunk is a run of rows). */
typedef struct fwd_row {
    /* in */
    int32_t token;  /* in [0, V) */
    int slot;       /* in [0, n_slots) */
    int pos;        /* the slot's next position (fwd_n_past), +1 per earlier row of the slot */
    bool prompt;    /* a prompt token (counts for penalties when the params say so) */
    bool sample;    /* sample the slot's next token from this row's logits */
    float *logits;  /* NULL, or host [V]: this row's logits copied out (eval and tests) */
    bool verify;    /* a row of a verify run (see above): every row of the slot's run in this
                       step says so, at most fwd.verify_rows of them */
    float *hidden;  /* NULL, or host [H]: this row's final-norm output RMSNorm(x)·output_norm
                       copied out (the MTP head's input; a device with verify runs) */
    /* out, when sample */
    sample_result out;
} fwd_row;

/* Device counters (benchmarks and tests). */
typedef struct fwd_stats {
    uint64_t tokens;            /* rows run */
    uint64_t steps;             /* steps (one host sync each on a device) */
    uint64_t graph_launches;
    uint64_t kernels_per_token; /* kernel nodes of one token's graph */
    uint64_t d2h_bytes, h2d_bytes; /* copied by steps */
    uint64_t weight_bytes;      /* device bytes of weights */
    uint64_t state_bytes;       /* recurrent state + KV cache, all slots */
    uint64_t bytes_per_token;   /* weights + state read/written + KV read at n_ctx (estimate) */
} fwd_stats;

typedef struct fwd fwd;

typedef struct fwd_vt {
    /* A new sequence in slot: position 0, recurrent state zeroed, its KV blocks released, the
     * sampler reset with p (valid and resolved, common/sampling.h). */
    int (*seq_start)(fwd *f, int slot, const sampling_params *p, status *st);
    /* The sequence in slot has ended: its KV blocks go back to the pool. */
    void (*seq_end)(fwd *f, int slot);
    /* Runs rows[0 .. n) (1 <= n <= max_rows) in order; the KV blocks their positions need are
     * taken from the pool (kv_pool_ensure) unless the caller took them before. Errors, no row
     * run: STATUS_RANGE for a bad token id, slot, position or a full context, STATUS_EXHAUSTED
     * when the pool has too few free blocks; STATUS_INTERNAL when a sampled row found no token
     * (NaN or inf logits: broken weights); STATUS_DEVICE when the device failed (sticky). */
    int (*step)(fwd *f, fwd_row *rows, int n, status *st);
    /* Benchmarks only: the slot continues at position n_past as if that context had been
     * consumed (its KV rows hold a constant finite pattern, the recurrent state is kept). */
    int (*fill)(fwd *f, int slot, int n_past, status *st);
    /* Copies slot's recurrent state at its position (every DeltaNet layer's S and conv window,
     * every rank) into snapshot snap, ordered after the slot's last step and before anything
     * later: on a device an asynchronous device-to-device copy, no host sync, no allocation.
     * STATUS_RANGE for a bad slot or snapshot. */
    int (*snap_save)(fwd *f, int slot, int snap, status *st);
    /* seq_start, then the slot continues prefix x: its recurrent state copied from x->snap, its
     * table x->blocks' full blocks (shared) and a copy of the partial last one, position
     * x->n_pos, the sampler having counted x->tokens as prompt tokens. A step after it computes
     * what a step after feeding the n_pos tokens would (CPU: bit for bit). Errors, the slot
     * then empty (as after seq_end): STATUS_RANGE for a bad slot, snapshot or n_pos,
     * STATUS_INVALID for a block not held, STATUS_EXHAUSTED when no block is free for the
     * copy. */
    int (*seq_resume)(fwd *f, int slot, const sampling_params *p, const fwd_prefix *x,
                      status *st);
    /* After a verify run of slot (its last step): the slot continues at n_past, first + 1 <=
     * n_past <= first + rows (first: the run's first position) as if only the run's rows up to
     * position n_past - 1 had been fed: the recurrent state kept after that row, the sampler's
     * accepted tokens and RNG counter as they were after it. cuda: only before the forward's
     * next step (the kept states are the next step's to reuse), and the sampler counts no
     * verify row (its sequences are greedy). NULL on a device without verify runs.
     * STATUS_RANGE for a bad slot, or an n_past outside the last verify run (nothing
     * changed). */
    int (*rollback)(fwd *f, int slot, int n_past, status *st);
    /* The MTP head on the forward's device (speculative decoding's draft model, model/mtp.h),
     * where fwd.mtp says so (cpu: never, the caller runs model/mtp.h itself; cuda: not for a
     * model without a head, without verify runs, or tensor parallel; then STATUS_UNSUPPORTED,
     * or NULL). The head's KV rows lie in the slot's
     * KV blocks, one attention layer more, at the main model's positions; the caller keeps the
     * head's position (the rows it fed: pos), as qwen35_mtp_state's n_past.
     * mtp_feed: rows pos .. pos+T-1 pair hidden[r] (host [T][H]: the main model's final-norm
     * outputs, fwd_row.hidden) with tokens[r] (qwen35_mtp_step without outputs); asynchronous,
     * no host sync, nothing allocated. The slot must hold those positions' blocks (pos + T <=
     * fwd_n_past(slot)).
     * mtp_draft: k greedy drafts (1 <= k < FWD_MAX_VERIFY_ROWS) from the row (h, token) at pos,
     * chained through each row's head-norm output (qwen35_mtp_draft); the KV blocks of
     * positions up to pos + k are taken (the verify run after it needs them); one host sync.
     * Rows pos .. pos+k-1 are scratch: the next feed rewrites them.
     * Errors, nothing run: STATUS_RANGE for a bad slot, position or token id, STATUS_EXHAUSTED
     * when no KV block is free for a draft row; STATUS_DEVICE when the device failed. */
    int (*mtp_feed)(fwd *f, int slot, int pos, const float *hidden, const int32_t *tokens,
                    int T, status *st);
    int (*mtp_draft)(fwd *f, int slot, int pos, const float *h, int32_t token, int k,
                     int32_t *drafts, status *st);
    void (*get_stats)(const fwd *f, fwd_stats *s);
    void (*destroy)(fwd *f);
} fwd_vt;

/* The fields every forward fills at create; read-only to callers. */
struct fwd {
    const fwd_vt *vt;
    const qwen35_model *model; /* borrowed */
    int n_slots, n_ctx, vocab, ranks;
    int max_rows;   /* most rows of one step */
    int pass_rows;  /* rows of the largest batched pass: 0 when every row of a step runs alone
                       (a prompt then goes token by token: the scheduler keeps it to one row a
                       step beside decoding streams) */
    kv_pool *kv;    /* owned: the KV blocks, one table per slot */
    int *n_past;    /* owned, [n_slots]: each slot's next position */
    uint64_t state_bytes; /* per slot, for logs */
    fwd_state_dtype state_dtype; /* fwd_opts.state_dtype */
    int n_snaps;          /* snapshot buffers (0: no prefix reuse) */
    uint64_t snap_bytes;  /* bytes of one snapshot, every rank together */
    uint64_t kv_block_bytes; /* bytes of one KV block: every attention layer, K and V, every
                                rank */
    int verify_rows;      /* most rows of a verify run (fwd_opts.verify_rows); 0: none (rows
                             with .verify or .hidden are refused) */
    bool mtp;             /* the model's MTP head runs on the device (vt.mtp_feed, mtp_draft) */
    bool verify_sampled;  /* verify runs of sampled sequences without penalties (each row draws
                             as a one-row step would); false (cuda on the host sampler): of
                             greedy sequences only, STATUS_UNSUPPORTED for others */
    char device[128];     /* "cpu (16 threads)", "cuda:0 NVIDIA H200", ... */
    char plan[320];       /* how n_slots, n_ctx and the KV pool were sized, and from what
                             memory (fwd_plan.why): one line for the start-up log */
};

/* A device kind a binary can run on: an entry of the registry. */
typedef struct fwd_backend {
    const char *name; /* "cpu", "cuda" */
    /* STATUS_UNAVAILABLE when the device is absent (no driver, no GPU): callers may fall back
     * to another kind; STATUS_UNSUPPORTED for a model or shape the device cannot run (named). */
    int (*create)(const qwen35_model *m, const fwd_opts *o, fwd **out, status *st);
    /* devices of this kind on the host (NULL: not counted, e.g. the CPU) */
    int (*device_count)(void);
} fwd_backend;

/* The registry: the device kinds this binary links, NULL-terminated. Defined by the registry
 * library the binary depends on (model/BUILD, made by tools/registry.bzl's fwd_registry). */
extern const fwd_backend *const fwd_backends[];

/* The registry's entry named name ("cpu", "cuda"), or NULL. */
const fwd_backend *fwd_backend_find(const char *name);

/* Creates a forward on device kind name ("cpu", "cuda"); STATUS_INVALID naming the kind when
 * this binary has none of that name. */
int fwd_create(const char *name, const qwen35_model *m, const fwd_opts *o, fwd **out, status *st);

/* For implementations: STATUS_UNSUPPORTED for verify rows or hidden outputs on a device without
 * verify runs, STATUS_RANGE for a verify run longer than fwd.verify_rows or one whose rows do not
 * all say verify. */
int fwd_check_verify(const fwd *f, const fwd_row *rows, int n, status *st);

/* For implementations: the KV blocks the runs of rows[0 .. n) need for their positions, taken
 * from f->kv all or none (none to take when the caller took them). STATUS_EXHAUSTED, nothing
 * taken, when too few are free. */
int fwd_take_blocks(fwd *f, const fwd_row *rows, int n, status *st);

static inline int fwd_seq_start(fwd *f, int slot, const sampling_params *p, status *st)
{
    return f->vt->seq_start(f, slot, p, st);
}
static inline void fwd_seq_end(fwd *f, int slot) { f->vt->seq_end(f, slot); }
static inline int fwd_step(fwd *f, fwd_row *rows, int n, status *st)
{
    return f->vt->step(f, rows, n, st);
}
static inline int fwd_fill(fwd *f, int slot, int n_past, status *st)
{
    return f->vt->fill(f, slot, n_past, st);
}
static inline int fwd_snap_save(fwd *f, int slot, int snap, status *st)
{
    return f->vt->snap_save(f, slot, snap, st);
}
static inline int fwd_seq_resume(fwd *f, int slot, const sampling_params *p, const fwd_prefix *x,
                                 status *st)
{
    return f->vt->seq_resume(f, slot, p, x, st);
}
static inline int fwd_rollback(fwd *f, int slot, int n_past, status *st)
{
    if (!f->vt->rollback)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: no verify runs to roll back", f->device);
    return f->vt->rollback(f, slot, n_past, st);
}
/* Whether the MTP head drafts on the forward's device (fwd.mtp). */
static inline bool fwd_has_mtp(const fwd *f) { return f->mtp; }
static inline int fwd_mtp_feed(fwd *f, int slot, int pos, const float *hidden,
                               const int32_t *tokens, int T, status *st)
{
    if (!f->vt->mtp_feed)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: no MTP head on the device", f->device);
    return f->vt->mtp_feed(f, slot, pos, hidden, tokens, T, st);
}
static inline int fwd_mtp_draft(fwd *f, int slot, int pos, const float *h, int32_t token, int k,
                                int32_t *drafts, status *st)
{
    if (!f->vt->mtp_draft)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: no MTP head on the device", f->device);
    return f->vt->mtp_draft(f, slot, pos, h, token, k, drafts, st);
}
static inline void fwd_get_stats(const fwd *f, fwd_stats *s) { f->vt->get_stats(f, s); }
static inline void fwd_destroy(fwd *f)
{
    if (f) f->vt->destroy(f);
}
static inline int fwd_n_past(const fwd *f, int slot) { return f->n_past[slot]; }

#endif
