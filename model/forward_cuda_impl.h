/* Internals of the CUDA forward (model/forward_cuda.h), read one way down: each file calls only
 * the files below it (tests/model:model_layers_test fails on a call cycle).
 *   forward_cuda_fwd.c      the forward contract (fwd.h): the group of N >= 1 ranks; rows
 *                           checked and their KV blocks taken in the one pool, then each rank;
 *                           snapshots saved and prefixes resumed (blocks adopted) on every rank;
 *   forward_cuda_tp.c       the rank threads of a group of several ranks;
 *   forward_cuda_mtp.c      the MTP head's feeds and drafts (fwd.h mtp_feed / mtp_draft);
 *   forward_cuda.c          one rank: create / destroy, sizing, the one-row graphs' capture, the
 *                           step;
 *   forward_cuda_batch.c    the batched step: plan, buckets, their graphs, passes;
 *   forward_cuda_record.c   the graphs' contents, one function per sublayer of cpu_fwd_run;
 *   forward_cuda_sample.c   the samplers, behind the graphs and after the sync, and the rows'
 *                           hidden outputs read back the same way;
 *   forward_cuda_dense.c    the batched step's dense F16 path (cuBLAS);
 *   forward_cuda_state.c    slots (recurrent state, position), the KV cache and the device
 *                           mirror of its block tables, the one-row step's activations, the
 *                           snapshots' copies (docs/GPU.md "Snapshots");
 *   forward_cuda_weights.c  upload and packing of the weights into one arena;
 *   forward_cuda_host.c     plain C, tested on the CPU: a pass's staging, the tables' mirror,
 *                           the snapshots' count.
 * Three structs as the CPU forward (llama2.c's config / weights / run state), plus the slot. */
#ifndef DS_MODEL_FORWARD_CUDA_IMPL_H
#define DS_MODEL_FORWARD_CUDA_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sampling.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/sample.h"
#include "model/forward_cuda_host.h"
#include "model/fwd.h"
#include "model/kv_pool.h"
#include "model/qwen35.h"
#include "model/sampler.h"

#define FC_MAX_GROUPS 4

typedef struct fc_rank fc_rank; /* one rank's forward on one GPU (below) */

/* How a rank is made (forward_cuda_fwd.c fills it from fwd_opts). */
typedef struct fc_rank_opts {
    int n_ctx;    /* KV positions per slot (prompt + generated); 0 -> 4096; with ctx_fit the
                     most, the rank's n_ctx what fits */
    int n_slots;  /* sequences with resident state; 0 -> as many as fit in free device memory
                     (at most 256, leaving a reserve; the log says the bytes per slot), the KV
                     pool sized for a quarter of n_ctx per slot on average; given: a pool with
                     every slot's whole context */
    int max_rows; /* most rows of one step; 0 -> n_slots + 256 */
    int device;   /* CUDA device index */
    bool batch_invariant; /* every step through the batched kernels, one row too: a sequence's
                             logits then do not depend on the rows beside it, at the price of the
                             batch-1 GEMV's speed (docs/GPU.md "Batch invariance") */
    int dense_rows;       /* passes of this many rows or more multiply the quantised matrices as
                             F16 through cuBLAS (kernels/cuda/gemm.h "Dense path"); 0: never;
                             < 0: 64 when the F16 copies are resident, 128 when each pass
                             dequantises. Not with batch_invariant (cuBLAS's sums depend on the
                             rows) */
    bool dense_per_pass;  /* the dense path dequantises each matrix every pass; by default the F16
                             copies stay resident when they take at most half of the free
                             device memory (2 bytes a weight), else per pass */
    int kv_blocks;        /* > 0: the KV pool's blocks; 0: sized with the slots */
    bool ctx_fit;         /* n_ctx is the model's: shrunk to the longest that fits one slot with
                             its whole KV and the attention partials (size_state) */
    int64_t mem_budget;   /* > 0: this rank's bytes for the slots, the KV pool, the snapshots and
                             the attention partials at most; 0: the free device memory */
    int64_t snap_budget;  /* this rank's bytes for recurrent-state snapshots (prefix reuse):
                             0 none; > 0 as many snapshots as fit; < 0 chosen from the free
                             device memory (size_state, docs/GPU.md "Snapshots") */
    bool state_bf16;      /* the DeltaNet S stored as bf16 (fwd_opts.state_dtype): half its
                             bytes in the slots and the snapshots, so about twice the slots */
    int verify_rows;      /* most rows of a verify run (fwd_opts.verify_rows); 0: none */
    int verify_runs;      /* most verify runs a step (fwd_opts.verify_runs; 0: FWD_VERIFY_RUNS) */
    /* Tensor parallel (the model is then the rank's shard): this rank's communicator (NULL:
     * none), its rank (rank 0 samples, reports and owns the KV pool; every rank sums the
     * row-parallel outputs and gathers the vocabulary-split logits in its graphs) and its first
     * lm_head row in the vocabulary. */
    struct tp_comm *tp;
    int tp_rank;
    int64_t vocab_begin;
} fc_rank_opts;

/* 256-byte aligned bump allocation inside one device allocation; base NULL = sizing pass. */
typedef struct fc_arena {
    uint8_t *base;
    uint64_t used, cap;
} fc_arena;

void *fc_arena_take(fc_arena *a, uint64_t bytes);

static inline int fc_pow2_ceil(int n)
{
    int p = 1;
    while (p < n) p *= 2;
    return p;
}

/* Matrices of one layer that read the same input, packed row after row when of one type. */
typedef struct fc_group {
    gemv_matrix m;  /* d_w into the weight arena */
    int64_t y_off;  /* first output row in the projection buffer */
} fc_group;

typedef struct fc_layer {
    bool gdn;
    int kind_index; /* index among the layers of its kind (DeltaNet or attention) */
    const float *d_attn_norm, *d_post_norm; /* [H] */
    fc_group in[FC_MAX_GROUPS]; /* DeltaNet: qkv|z|beta|alpha; attention: q|k|v */
    int n_in;
    bool in_pair;     /* the two in-projection groups run as one gemv_pair launch */
    gemv_matrix out;  /* ssm_out or attn_output */
    gemv_matrix gate, up, down;
    const float *d_conv_w;   /* DeltaNet [C][K_conv] */
    const float *d_dt_bias;  /* [n_v] */
    const float *d_ssm_a;    /* [n_v] */
    const float *d_ssm_norm; /* [d_v] */
    const float *d_q_norm, *d_k_norm; /* attention [d_h] */
} fc_layer;

/* The weights on the device: one arena, views into it. */
typedef struct fc_weights {
    void *d_arena; /* owned, device, bytes */
    uint64_t bytes;
    fc_layer layers[QWEN35_MAX_LAYERS];
    gemv_matrix embd, head; /* head.d_w == embd.d_w when tied */
    const float *d_out_norm; /* [H] */
} fc_weights;

/* The MTP head on the device (forward_cuda_mtp.c, fwd.h mtp_feed / mtp_draft): its decoder
 * layer (an attention layer whose KV is the pool's layer n_attn_layers, under the slots' tables),
 * the projection of [embedding ; hidden] and the norms. A feed's rows run in batched passes (on
 * the batched step's activations), a draft's rows one by one (on the one-row step's), launched
 * directly (no graph). The rows' inputs (hidden rows, staging) go through pinned rings, reused
 * once a sync has drained their copies. */
typedef struct fc_mtp {
    bool on;
    fc_layer layer;                  /* kind_index n_attn_layers */
    gemv_matrix eh_proj, embd, head; /* embd, head: the main model's when the file shares them */
    const float *d_enorm, *d_hnorm, *d_head_norm; /* [H] */
    int pass_rows;                /* rows of a feed's pass: the largest bucket below the dense
                                     path's (whose resident copies are the main model's) */
    float *d_cat;                 /* [pass_rows][2H]: [RMSNorm(e)·enorm ; RMSNorm(h)·hnorm] */
    void *d_catq;                 /* gemv_xq_bytes(2H): a draft row's Q8 form of it */
    float *d_hin;                 /* [pass_rows][H]: the rows' hidden inputs */
    float *d_g;                   /* [H]: a draft row's head-norm output, the next row's input */
    int32_t *d_in;                /* [5]: a draft's position pair, token cursor, token out and
                                     first token (gemv_embed_step) */
    unsigned long long *d_best;   /* [1]: a draft row's argmax key */
    float *h_ring;                /* owned, pinned [ring_rows][H] */
    int32_t *h_iring;             /* pinned [iring_cap]: after h_ring in the same allocation; a
                                     pass's staging (fc_stage_pass), a draft's d_in */
    fwd_row *rows;                /* owned [pass_rows]: a pass's rows for fc_stage_pass */
    int *heads;                   /* owned [pass_rows]: its lm_head rows (unused) */
    unsigned long long *h_best;   /* pinned [FWD_MAX_VERIFY_ROWS]: a draft's argmax keys */
    int ring_rows, iring_cap, ring_used, iring_used;
    uint64_t ring_steps;          /* stats.steps when the rings were last drained */
} fc_mtp;

/* One sequence slot: views into the state arena, its graphs and its sampler. */
typedef struct fc_slot {
    float *d_conv;          /* [n_gdn][C][K_conv-1] */
    void *d_S;              /* [n_gdn][n_v][d_v][d_k] F32, or bf16 (fc_rank.S_bf16); from d_conv
                               to d_pos: a snapshot */
    int32_t *d_pos;         /* [2]: position of the current token, next position */
    unsigned long long *d_best; /* [1]: the step's argmax key (gemv_argmax) */
    unsigned long long *h_best; /* pinned view: the argmax key read back by the graph */
    cuda_graph_exec g_forced;  /* owned: token = the step's next forced token */
    cuda_graph_exec g_chained; /* owned: token = this slot's previous argmax (greedy decode) */
    sample_slot *sampler;      /* owned, GPU sampler; NULL on the host fallback */
    sampler *host_sampler;     /* owned, host fallback only */
    sampling_params params;    /* resolved, of the running sequence */
    bool greedy;               /* params pick the argmax the graph computes */
    bool chain_ok;             /* d_best holds the argmax of this slot's last step */
    int32_t last_next;         /* the token that argmax was */
    int n_past;
    /* the slot's last verify run (docs/GPU.md "Verify runs"): its first position and rows
     * (0: none), the keep slot of its first row (row j's state after it: keep slot v_keep + j,
     * the last row's in the slot itself), the step it ran in (fc_rank.stats.steps after it) and,
     * sampled, the GPU sampler's RNG step before it (row j drew at v_sstep + j) */
    int v_first, v_len, v_keep;
    uint64_t v_step, v_sstep;
} fc_slot;

/* a row of the slot's verify run: its index in the run (its sampler result and RNG step) */
static inline int fc_verify_row(const fc_slot *sl, const fwd_row *r) { return r->pos - sl->v_first; }

/* The paged KV cache (kernels/cuda/attn.h "KV blocks"): one pool of blocks for every slot, a
 * block table row per slot. The tables are model/kv_pool.h's, one pool for the group (fwd.kv):
 * rank 0 owns it (its tables in rank 0's pinned h_table), the other ranks borrow it; the group
 * takes and returns blocks (forward_cuda_fwd.c), each rank copies the tables' changes to its
 * own d_table before its graphs read them (fc_kv_sync). The device pools hold one block more
 * than the kv_pool, the last: the pad slot's (its rows all sit at position 0). */
typedef struct fc_kv {
    void *d_k, *d_v;      /* pools [n_attn][n_blocks][ATTN_KV_BLOCK][n_kv][d_h] of kv_type */
    uint64_t layer_bytes; /* one layer's pool of K (or V) */
    int32_t *d_table;     /* [n_slots + 1][ld] block ids, device: the pool's tables' mirror, then
                             the pad slot's row (block n_blocks - 1) */
    int ld;               /* table entries per slot: n_ctx positions */
    int n_blocks;         /* blocks of the device pools: the kv_pool's, then the pad slot's */
    kv_pool *pool;        /* the tables (sequence i: slot i): owned by rank 0, else rank 0's
                             (fc_kv_borrow) */
    bool own_pool;
    int32_t *h_table;     /* rank 0, owned, pinned [n_slots][ld]: the pool's tables */
    fc_kv_mirror *mirror; /* owned [n_slots]: what d_table holds of each table */
} fc_kv;

/* Activations of one row, shared by every slot (rows run one after another). */
typedef struct fc_act {
    float *d_x;      /* [H] residual stream */
    float *d_h;      /* [H] normed input of a sublayer */
    void *d_hq;      /* gemv_xq_bytes(H): its Q8 form */
    float *d_proj;   /* [max(C + D_v + 2 n_v, 2 n_h d_h + 2 n_kv d_h)] in-projections */
    float *d_o;      /* [D_v] delta-rule output */
    float *d_y;      /* [max(D_v, n_h d_h)] mixer output */
    void *d_yq;      /* its Q8 form */
    float *d_ffn;    /* [F] */
    void *d_ffnq;    /* its Q8 form */
    float *d_q;      /* [n_h d_h] roped, normed queries */
    float *d_part;   /* attn_partial_floats(n_h, d_h, n_ctx) */
    float *d_logits; /* [V] */
    int32_t *d_cursor; /* [1 + max_rows]: the index of the next forced token to take (advanced
                          by gemv_embed_step), then the step's forced tokens (d_tokens) */
    int32_t *d_tokens; /* = d_cursor + 1 */
    int32_t *d_tok_out; /* [1] the token of the current row */
} fc_act;

/* The batched step (forward_cuda_batch.c): rows in runs of one slot (decode tokens, prompt
 * chunks) through one graph per bucket of rows (1, 2, 4, ... rows, the rows padded with the pad
 * slot), every weight read once per pass by the batched GEMM (kernels/cuda/gemm.h). Activations
 * [rows][ld]. */
#define FC_MAX_BUCKETS 10
#define FC_BLAS_WS (32u << 20) /* cuBLAS workspace bytes (dense path) */

/* The batched step's dense path (forward_cuda_dense.c; kernels/cuda/gemm.h "Dense path"):
 * buckets of `from` rows or more multiply the quantised matrices as F16 through cuBLAS. */
typedef struct fc_dense {
    int from;               /* the first bucket on the dense path; 0: none */
    bool resident;          /* the F16 copies resident (decided before the state is sized, taken
                               when the plan has a dense path), else dequantised every pass */
    struct blas *blas;      /* owned: cuBLAS, when `from` */
    void *d_blas_ws;        /* cuBLAS's workspace (FC_BLAS_WS bytes, in the activations) */
    uint16_t *d_w16;        /* per pass: the F16 copy of one matrix at a time */
    int n;                  /* resident: the matrices' F16 copies */
    const gemv_matrix **m;  /* owned [n] */
    uint16_t **w;           /* owned [n]: m[i]'s copy */
    void *d_alloc;          /* owned, device: the copies, or (resident copies that did not fit
                               at upload) the per-pass d_w16 */
    int failed;             /* a dense GEMM could not be recorded (checked after capture) */
} fc_dense;

/* A batched pass's activations on the device, [rows][ld] (rows: the largest bucket's). */
typedef struct fc_batch_act {
    float *d_x, *d_h, *d_proj, *d_o, *d_y, *d_gu, *d_ffn, *d_q, *d_part, *d_logits;
    float *d_work;              /* the batched GEMM's split-K partials (gemm_work_floats) */
    uint16_t *d_xh;             /* [rows][max(H, F, ld_y)]: the GEMM input's F16 rows
                                   (gemm_x_half), read by the quantised matrices */
    void *d_xq;                 /* fc_batch.cols: the Q8 forms of a short pass's input rows
                                   (gemv_quantize_rows, GEMV_MAX_COLS rows at most); an mma
                                   pass's Q8_K rows (gemv_mma_quantize) */
    void *d_xqk;                /* a short mma pass's Q8_K rows (its d_xq holds the Q8 rows of
                                   gemv_cols) */
    unsigned long long *d_best; /* [rows] argmax keys of the lm_head's rows */
    float *d_gdn_scratch;       /* gdn_chunk_runs' scratch (chunked) */
} fc_batch_act;

/* The graphs of each bucket of rows (bucket[k]: index k). */
typedef struct fc_batch_graphs {
    cuda_graph_exec body[FC_MAX_BUCKETS];    /* owned: passes of decode rows (runs of one row) */
    cuda_graph_exec prefill[FC_MAX_BUCKETS]; /* owned, when chunked: passes with prompt chunks */
    cuda_graph_exec head[FC_MAX_BUCKETS];    /* owned: the lm_head of a bucket of rows */
} fc_batch_graphs;

typedef struct fc_batch {
    /* the plan (fc_batch_plan) */
    int rows;                   /* rows of the largest bucket; 0: no batched path */
    int n_buckets;
    int bucket[FC_MAX_BUCKETS]; /* ascending powers of two, the last = rows */
    bool chunked;               /* runs of two or more rows (prompt chunks) by the chunked delta
                                   rule (not batch invariant) */
    bool attn_tiles;            /* and their attention by attn_prefill_runs (F16 cache) */
    bool half_x;                /* some matrix reads act.d_xh (gemm_reads_half) */
    bool cols;                  /* passes of at most GEMV_MAX_COLS rows multiply by gemv_cols
                                   (not batch invariant: another rounding than longer passes) */
    int mma_from;               /* passes of mma_from .. GEMV_MMA_ROWS rows multiply their
                                   Q4_K / Q5_K / Q6_K matrices by gemv_mma (Q8 rows; not
                                   batch invariant); 0: none */
    int64_t ld_proj, ld_y;
    int64_t slot_stride;        /* bytes from one slot's state to the next */
    int max_passes;             /* passes of a step of max_rows rows */
    char why_not[128];          /* why there is no batched path */
    fc_batch_act act;
    fc_stage stage[FC_MAX_BUCKETS]; /* device: each bucket's view of the one staging buffer the
                                       graphs read (forward_cuda_host.h) */
    fc_batch_graphs g;
    void *h_pinned;             /* owned: h_best, then h_stage */
    unsigned long long *h_best; /* pinned [max_rows]: the step's argmax keys */
    int32_t *h_stage;           /* pinned [max_passes][FC_STAGE_INTS(rows)]: each pass's staging */
    int32_t *h_keep;            /* owned [max_rows]: each row's keep slot (-1: none) */
    uint64_t act_bytes;
} fc_batch;

/* One rank's forward: the whole model, or its shard under tensor parallelism, on one GPU. */
struct fc_rank {
    const qwen35_model *model; /* borrowed */
    qwen35_config cfg;
    int n_ctx, n_slots, max_rows;
    int device;         /* CUDA device index */
    attn_kv_type kv_type; /* KV cache element: F32 when q/k/v weights are all F32, else F16 */
    int kv_elem_bytes;    /* 4 or 2 */
    cuda_device_props props;
    cuda_launch launch; /* the stream, and PDL while capturing */
    fc_weights w;
    void *d_state;    /* owned, device: every slot's state */
    void *d_act;      /* owned, device: activations */
    uint64_t state_bytes, act_bytes;
    fc_slot *slots;   /* owned, [n_slots + 1 + n_keep]: then the pad slot of batched steps and
                         the keep slots of verify runs (state only: no graphs, no sampler) */
    int n_keep;       /* keep slots: verify_runs x (verify_rows - 1), or 0 */
    int verify_rows, verify_runs; /* fc_rank_opts' (verify_rows 0 without a batched path) */
    fc_kv kv;
    int n_kv_layers;    /* layers of the KV pool: the attention layers, and the MTP head's */
    fc_mtp mtp;
    fc_batch b;
    bool batch_invariant; /* every step through the batched graphs (fc_rank_opts) */
    bool S_bf16;          /* fc_rank_opts.state_bf16 */
    int S_elem_bytes;     /* 2 (bf16) or 4 (F32) */
    int kv_blocks_opt;    /* fc_rank_opts.kv_blocks */
    bool ctx_fit;         /* fc_rank_opts.ctx_fit */
    int64_t mem_budget;   /* fc_rank_opts.mem_budget */
    char plan[320];       /* size_state's sizing, one line (fwd.plan) */
    int64_t snap_budget;  /* fc_rank_opts.snap_budget */
    int n_snaps;          /* snapshot buffers in d_snaps (0: none) */
    uint64_t snap_bytes;  /* one snapshot on this rank: a slot's conv windows and S, as they lie
                             from d_conv to d_pos (fc_snap_bytes) */
    void *d_snaps;        /* owned, device: [n_snaps][snap_bytes] */
    int dense_rows_opt;   /* fc_rank_opts.dense_rows (0 with batch_invariant) */
    fc_dense dense;
    fc_act a;
    void *h_pinned;   /* owned: each slot's h_best, then h_stage (the one-row step's), then
                         h_rpos */
    int32_t *h_rpos;  /* pinned [n_slots][2]: a rolled back slot's device position */
    float *h_hidden;  /* owned, pinned [max_rows][H] when verify_rows: a step's hidden outputs,
                         copied into the rows' own buffers after the sync (fc_hidden_*) */
    int32_t *h_stage;  /* pinned [1 + max_rows]: 0, then the step's forced tokens (one copy) */
    int32_t *h_ids;    /* owned, host [max_rows]: one slot's prompt tokens of a step */
    float *h_logits;   /* owned, [V] host: logits for the host fallback sampler */
    bool pdl;          /* the graphs use programmatic dependent launch */
    struct tp_comm *tp;   /* borrowed: tensor parallel (fc_rank_opts), NULL: none */
    int tp_rank;
    int64_t vocab_begin;
    int tp_failed;        /* an all-reduce failed while recording (checked after capture) */
    char path[96];
    fwd_stats stats;
};

/* tensor parallel: whether this rank samples (rank 0) */
static inline bool fc_samples(const fc_rank *e) { return e->tp_rank == 0; }

/* ---- forward_cuda_tp.c ----
 * A host thread per rank of a group of several (CUDA's current device is per thread, NCCL's
 * collectives one thread per GPU): fc_ranks_run runs fn(arg, r) on rank r's thread for every
 * rank at once and returns when all have returned. */
typedef struct fc_ranks fc_ranks;
int fc_ranks_start(int n, fc_ranks **out, status *st);
void fc_ranks_run(fc_ranks *t, void (*fn)(void *arg, int r), void *arg);
void fc_ranks_stop(fc_ranks *t); /* joins the threads; NULL: nothing */

/* ---- forward_cuda.c: one rank ----
 * Create: uploads the model (or shard), sizes the slots and the KV cache, captures the step
 * graphs; rank 0 (o->tp_rank) creates the group's KV pool (e->kv.pool), the other ranks take it
 * afterwards (fc_kv_borrow). STATUS_UNAVAILABLE without a GPU, STATUS_UNSUPPORTED for a shape
 * or weight type the kernels do not handle (named), STATUS_NOMEM / STATUS_DEVICE from the
 * device. */
int fc_rank_create(const qwen35_model *m, const fc_rank_opts *o, fc_rank **out, status *st);
void fc_rank_destroy(fc_rank *e);
/* A new sequence in a slot (in range): position 0, state zeroed, sampler reset with p (valid and
 * resolved: common/sampling.h); its KV blocks are the group's to release. */
int fc_rank_seq_start(fc_rank *e, int slot, const sampling_params *p, status *st);
/* A new sequence continuing a cached prefix (checked by the group, which took the slot's blocks:
 * the prefix's full ones adopted, then dst_block for the partial last one, -1 when n_pos is a
 * multiple of ATTN_KV_BLOCK): seq_start, then the slot's state from snapshot snap, the first
 * n_pos % ATTN_KV_BLOCK rows of block src_block copied into dst_block (every attention layer, K
 * and V), position n_pos, the sampler having counted tokens[0 .. n_pos) as prompt tokens. The
 * copies are asynchronous on the stream, ordered before the next step. */
typedef struct fc_resume {
    int snap, n_pos;
    int32_t src_block, dst_block;
    const int32_t *tokens;
} fc_resume;
int fc_rank_seq_resume(fc_rank *e, int slot, const sampling_params *p, const fc_resume *r,
                       status *st);
/* Runs rows[0 .. B) (checked by the group: ids, slots, positions in order, 1 <= B <= max_rows;
 * every run's blocks in the pool) in order; one host sync. Each sampled row's out is filled on
 * rank 0 (the argmax only on the others). STATUS_INTERNAL when a sampled row found no token
 * (NaN or inf logits: broken weights); STATUS_DEVICE when the device failed. */
int fc_rank_step(fc_rank *e, fwd_row *rows, int B, status *st);
/* After slot's verify run in the last step (checked by the group): the slot continues at n_past
 * (v_first + 1 ..= v_first + v_len): the state kept after that row copied into the slot (none
 * when it is the run's last), the device position set; asynchronous on the stream. The run's
 * record then ends at that row (a second rollback goes further back or nowhere). */
void fc_rank_rollback(fc_rank *e, int slot, int n_past);

/* ---- forward_cuda_batch.c ---- */
void fc_batch_plan(fc_rank *e);                 /* rows and buckets, or why_not */
void fc_batch_layout(fc_rank *e, fc_arena *a);  /* its activations */
int fc_batch_alloc_host(fc_rank *e, status *st); /* its pinned staging and argmax keys */
int fc_batch_capture(fc_rank *e, status *st);
void fc_batch_destroy(fc_rank *e);
/* the rows of one step in passes through the bucket graphs, sampled rows read after the sync */
int fc_batch_step(fc_rank *e, fwd_row *rows, int B, status *st);

/* ---- forward_cuda_record.c ----
 * One token of slot sl; forced: the token is the step's next forced token, else the slot's
 * previous argmax. */
void fc_record_token(fc_rank *e, const fc_slot *sl, bool forced);
/* The batched step of a bucket of rows (their inputs: the bucket's staging view) up to the last
 * layer (prefill: with the kernels of long runs, fc_batch.chunked), and the lm_head of the
 * first s->nb rows of s->head_rows (bucket graphs). */
void fc_record_batch(fc_rank *e, const fc_stage *s, bool prefill);
void fc_record_head(fc_rank *e, const fc_stage *s);
/* One row of the MTP head for slot (model/mtp.c run_rows): its token the next staged one
 * (forced: mtp.d_in's) or the last draft row's argmax, its hidden input d_hin [H], at the
 * position after mtp.d_in's pair; with head, g into mtp.d_g and the argmax of head·g into
 * mtp.d_best. */
void fc_record_mtp_row(fc_rank *e, int slot, const float *d_hin, bool forced, bool head);
/* A pass of rows of the MTP head (staged as a batched pass's: tokens, slots, positions), their
 * hidden inputs d_hin [nb][H], through the head's layer: its KV rows written. */
void fc_record_mtp_rows(fc_rank *e, const fc_stage *s, const float *d_hin);

/* ---- forward_cuda_sample.c ----
 * One GPU sampler per slot, or (where the device cannot run it) host samplers on e->h_logits,
 * said once in the log; their release. */
int fc_samplers_create(fc_rank *e, status *st);
void fc_samplers_destroy(fc_rank *e);
/* A new sequence's sampling parameters (valid; resolved here) and its sampler reset. */
int fc_sampler_start(fc_rank *e, fc_slot *sl, const sampling_params *p, status *st);
/* ids[0 .. n) counted by the slot's sampler as prompt tokens (penalties), in one call: a resumed
 * prefix's tokens, or a run's prompt rows. */
void fc_sampler_prompt(fc_rank *e, fc_slot *sl, const int32_t *ids, int n);
/* Behind the graphs of rows [i, j) of one slot (a run): the tokens its sampler counts, then, when
 * the run's last row samples and its slot is not greedy, its sampler on d_logits (that row's
 * logits on the device): the GPU sampler enqueued, or the host sampler after a sync. */
int fc_sample_run(fc_rank *e, fwd_row *rows, int i, int j, const float *d_logits,
                  status *st);
/* After the step's sync: the sampled row's token from what the step left: the argmax (greedy:
 * greedy_next), the GPU sampler's result, or the host sampler on e->h_logits. */
int fc_read_sample(fc_rank *e, fwd_row *r, int32_t greedy_next, status *st);
/* Row i of a step asks for its final-norm output (fwd_row.hidden, rank 0): enqueue the copy of
 * d_h ([H] on the device) into the pinned h_hidden row i (no host sync); after the step's sync,
 * fc_hidden_out hands each such row's copy to its buffer. */
void fc_hidden_copy(fc_rank *e, int i, const float *d_h);
void fc_hidden_out(fc_rank *e, fwd_row *rows, int B);

/* ---- forward_cuda_mtp.c (fwd.h mtp_feed / mtp_draft; the group checked slot, positions and
 * tokens, and took the draft rows' blocks) ----
 * Its activations (after the one-row step's), its pinned rings; T rows of the head from
 * position pos, asynchronous; k drafts from the row (h, token) at pos, one sync. */
void fc_mtp_layout(fc_rank *e, fc_arena *a);
int fc_mtp_alloc_host(fc_rank *e, status *st);
void fc_mtp_destroy(fc_rank *e);
int fc_rank_mtp_feed(fc_rank *e, int slot, int pos, const float *hidden, const int32_t *tokens,
                     int T, status *st);
int fc_rank_mtp_draft(fc_rank *e, int slot, int pos, const float *h, int32_t token, int k,
                      int32_t *drafts, status *st);

/* ---- forward_cuda_dense.c ----
 * The resident F16 copies' bytes; whether they stay resident (wanted: the options ask for a
 * dense path; at most half of the free memory), before the state is sized; the first dense
 * bucket (after fc_batch_plan's rows); its scratch and cuBLAS workspace in the activations;
 * cuBLAS opened (none: no dense path, said in the log) and the resident copies uploaded, before
 * capture; the resident copy of m, or NULL (dequantise per pass). */
uint64_t fc_dense_bytes(const fc_rank *e);
int fc_dense_decide(fc_rank *e, bool wanted, status *st);
void fc_dense_plan(fc_rank *e);
void fc_dense_layout(fc_rank *e, fc_arena *a);
int fc_dense_open(fc_rank *e, status *st);
const uint16_t *fc_dense_weights(const fc_rank *e, const gemv_matrix *m);
void fc_dense_destroy(fc_rank *e);

/* ---- forward_cuda_state.c ---- */
void fc_state_layout(fc_rank *e, fc_arena *a);
void fc_act_layout(fc_rank *e, fc_arena *a);
/* Position 0, state zeroed: the state's memset on the stream, behind any snapshot copy still
 * reading it; returns when it is done. */
int fc_slot_clear(fc_rank *e, int slot, status *st);
/* ---- snapshots (docs/GPU.md "Snapshots") ----
 * The bytes of one snapshot on this rank (a slot's d_conv and d_S as laid out, padding
 * included); the slot's state copied into snapshot snap, and back, device to device on the
 * stream (no sync, nothing allocated); the slot resumed at position n_pos: the device position
 * set and the first n_pos % ATTN_KV_BLOCK rows of src_block copied into dst_block, every
 * attention layer's K and V (fc_resume). */
uint64_t fc_snap_bytes(const fc_rank *e);
void fc_snap_save(fc_rank *e, int slot, int snap);
int fc_slot_resume(fc_rank *e, int slot, const fc_resume *r, status *st);
/* fwd_fill's work on this rank (slot and n_past valid; the group took the slot's blocks for
 * positions 0 .. n_past): those blocks hold a constant finite pattern, the slot is at position
 * n_past. */
int fc_slot_fill(fc_rank *e, int slot, int n_past, status *st);
/* KV blocks, after the state's layout: d_table's rows set (the slots' empty, the pad slot's its
 * block) and, on rank 0, the pool created (every block free) with its tables in pinned memory;
 * their release; another rank's pool taken as this rank's tables (rank 0's, after every rank's
 * create); the pools' layer base; the slot's table entries that d_table lacks copied to the
 * device on the stream (the pool covers position `last`). */
int fc_kv_alloc(fc_rank *e, status *st);
void fc_kv_destroy(fc_rank *e);
void fc_kv_borrow(fc_rank *e, kv_pool *pool);
void *fc_kv_layer(const fc_rank *e, void *pool, int kind_index);
void fc_kv_sync(fc_rank *e, int slot, int last);

/* ---- forward_cuda_weights.c ----
 * Allocates e->w.d_arena and uploads every weight into it. */
int fc_weights_upload(fc_rank *e, status *st);

#endif
