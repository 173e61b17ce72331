/* Internals of the CUDA forward (model/forward_cuda.h), read one way down: each file calls only
 * the files below it (tests/model:forward_cuda_layers_test fails on a call cycle).
 *   forward_cuda_tp.c       tensor parallel: a thread per rank, each its own forward;
 *   forward_cuda.c          create / destroy, sizing, the one-row graphs' capture, the step;
 *   forward_cuda_batch.c    the batched step: plan, buckets, their graphs, passes;
 *   forward_cuda_record.c   the graphs' contents, one function per sublayer of run_step;
 *   forward_cuda_sample.c   the samplers, behind the graphs and after the sync;
 *   forward_cuda_dense.c    the batched step's dense F16 path (cuBLAS);
 *   forward_cuda_state.c    slots (recurrent state, position), the KV cache and its block
 *                           tables, the one-row step's activations;
 *   forward_cuda_weights.c  upload and packing of the weights into one arena;
 *   forward_cuda_host.c     plain C, tested on the CPU: a pass's staging, the tables' mirror.
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
#include "model/forward_cuda.h"
#include "model/forward_cuda_host.h"
#include "model/kv_pool.h"
#include "model/qwen35.h"
#include "model/sampler.h"

#define FC_MAX_GROUPS 4

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

/* One sequence slot: views into the state arena, its graphs and its sampler. */
typedef struct fc_slot {
    float *d_conv;          /* [n_gdn][C][K_conv-1] */
    float *d_S;             /* [n_gdn][n_v][d_v][d_k] */
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
} fc_slot;

/* The paged KV cache (kernels/cuda/attn.h "KV blocks"): one pool of blocks for every slot, a
 * block table row per slot (model/kv_pool.h); blocks taken as a sequence grows (the step),
 * returned when it ends. The host's bookkeeping is forward_cuda_state.c's alone (fc_kv_*), on
 * the engine thread (the forward's one caller); the graphs read the device fields. */
typedef struct fc_kv {
    void *d_k, *d_v;      /* pools [n_attn][n_blocks][ATTN_KV_BLOCK][n_kv][d_h] of kv_type */
    uint64_t layer_bytes; /* one layer's pool of K (or V) */
    int32_t *d_table;     /* [n_slots + 1][ld] block ids, device: the host tables' mirror (the
                             pad slot's row: one block) */
    int ld;               /* table entries per slot: n_ctx positions */
    int n_blocks;         /* blocks in the pool, the pad slot's one included */
    kv_pool *pool;        /* owned: the tables (sequence n_slots: the pad slot), in h_table */
    int32_t *h_table;     /* owned, pinned [n_slots + 1][ld] */
    fc_kv_mirror *mirror; /* owned [n_slots + 1]: what d_table holds of each table */
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
    uint64_t act_bytes;
} fc_batch;

struct qwen35_cuda {
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
    fc_slot *slots;   /* owned, [n_slots + 1]: the last is the pad slot of batched steps (state
                         only: no graphs, no sampler) */
    fc_kv kv;
    fc_batch b;
    bool batch_invariant; /* every step through the batched graphs (qwen35_cuda_opts) */
    int kv_blocks_opt;    /* qwen35_cuda_opts.kv_blocks */
    int dense_rows_opt;   /* qwen35_cuda_opts.dense_rows (0 with batch_invariant) */
    fc_dense dense;
    fc_act a;
    void *h_pinned;   /* owned: each slot's h_best, then h_stage (the one-row step's) */
    int32_t *h_stage;  /* pinned [1 + max_rows]: 0, then the step's forced tokens (one copy) */
    int32_t *h_ids;    /* owned, host [max_rows]: one slot's prompt tokens of a step */
    float *h_logits;   /* owned, [V] host: logits for the host fallback sampler */
    bool pdl;          /* the graphs use programmatic dependent launch */
    struct tp_comm *tp;   /* borrowed: tensor parallel (qwen35_cuda_opts), NULL: none */
    int tp_rank;
    int64_t vocab_begin;
    int tp_failed;        /* an all-reduce failed while recording (checked after capture) */
    char path[96];
    qwen35_cuda_stats stats;
};

/* tensor parallel: whether this rank samples (rank 0) */
static inline bool fc_samples(const qwen35_cuda *e) { return e->tp_rank == 0; }

/* ---- forward_cuda_batch.c ---- */
void fc_batch_plan(qwen35_cuda *e);                 /* rows and buckets, or why_not */
void fc_batch_layout(qwen35_cuda *e, fc_arena *a);  /* its activations */
int fc_batch_alloc_host(qwen35_cuda *e, status *st); /* its pinned staging and argmax keys */
int fc_batch_capture(qwen35_cuda *e, status *st);
void fc_batch_destroy(qwen35_cuda *e);
/* the rows of one step in passes through the bucket graphs, sampled rows read after the sync */
int fc_batch_step(qwen35_cuda *e, fwd_row *rows, int B, status *st);

/* ---- forward_cuda_record.c ----
 * One token of slot sl; forced: the token is the step's next forced token, else the slot's
 * previous argmax. */
void fc_record_token(qwen35_cuda *e, const fc_slot *sl, bool forced);
/* The batched step of a bucket of rows (their inputs: the bucket's staging view) up to the last
 * layer (prefill: with the kernels of long runs, fc_batch.chunked), and the lm_head of the
 * first s->nb rows of s->head_rows (bucket graphs). */
void fc_record_batch(qwen35_cuda *e, const fc_stage *s, bool prefill);
void fc_record_head(qwen35_cuda *e, const fc_stage *s);

/* ---- forward_cuda_sample.c ----
 * One GPU sampler per slot, or (where the device cannot run it) host samplers on e->h_logits,
 * said once in the log; their release. */
int fc_samplers_create(qwen35_cuda *e, status *st);
void fc_samplers_destroy(qwen35_cuda *e);
/* A new sequence's sampling parameters (valid; resolved here) and its sampler reset. */
int fc_sampler_start(qwen35_cuda *e, fc_slot *sl, const sampling_params *p, status *st);
/* Behind the graphs of rows [i, j) of one slot (a run): the tokens its sampler counts, then, when
 * the run's last row samples and its slot is not greedy, its sampler on d_logits (that row's
 * logits on the device): the GPU sampler enqueued, or the host sampler after a sync. */
int fc_sample_run(qwen35_cuda *e, fwd_row *rows, int i, int j, const float *d_logits,
                  status *st);
/* After the step's sync: the sampled row's token from what the step left: the argmax (greedy:
 * greedy_next), the GPU sampler's result, or the host sampler on e->h_logits. */
int fc_read_sample(qwen35_cuda *e, fwd_row *r, int32_t greedy_next, status *st);

/* ---- forward_cuda_dense.c ----
 * The resident F16 copies' bytes; whether they stay resident (wanted: the options ask for a
 * dense path; at most half of the free memory), before the state is sized; the first dense
 * bucket (after fc_batch_plan's rows); its scratch and cuBLAS workspace in the activations;
 * cuBLAS opened (none: no dense path, said in the log) and the resident copies uploaded, before
 * capture; the resident copy of m, or NULL (dequantise per pass). */
uint64_t fc_dense_bytes(const qwen35_cuda *e);
int fc_dense_decide(qwen35_cuda *e, bool wanted, status *st);
void fc_dense_plan(qwen35_cuda *e);
void fc_dense_layout(qwen35_cuda *e, fc_arena *a);
int fc_dense_open(qwen35_cuda *e, status *st);
const uint16_t *fc_dense_weights(const qwen35_cuda *e, const gemv_matrix *m);
void fc_dense_destroy(qwen35_cuda *e);

/* ---- forward_cuda_state.c ---- */
void fc_state_layout(qwen35_cuda *e, fc_arena *a);
void fc_act_layout(qwen35_cuda *e, fc_arena *a);
int fc_slot_clear(qwen35_cuda *e, int slot, status *st);
/* qwen35_cuda_fill's work (slot and n_past valid): blocks for positions 0 .. n_past holding a
 * constant finite pattern, the slot at position n_past. */
int fc_slot_fill(qwen35_cuda *e, int slot, int n_past, status *st);
/* KV blocks: the host's block tables for e->kv (ld, n_blocks) after the state's layout, every
 * block free but the pad slot's one, mirrored to d_table; their release; the pools' layer base;
 * blocks for positions up to `last` of the slot (STATUS_EXHAUSTED, nothing taken, when too few
 * are free; new table entries copied to the device on the stream); the slot's blocks back to
 * the pool. */
int fc_kv_alloc(qwen35_cuda *e, status *st);
void fc_kv_destroy(qwen35_cuda *e);
void *fc_kv_layer(const qwen35_cuda *e, void *pool, int kind_index);
int fc_kv_grow(qwen35_cuda *e, int slot, int last, status *st);
void fc_kv_release(qwen35_cuda *e, int slot);

/* ---- forward_cuda_weights.c ----
 * Allocates e->w.d_arena and uploads every weight into it. */
int fc_weights_upload(qwen35_cuda *e, status *st);

#endif
