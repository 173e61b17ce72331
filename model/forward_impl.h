/* Internals shared by forward*.c (forward_cpu.c among them): the workspace struct, the group
 * step and the per-layer mixers. */
#ifndef DS_MODEL_FORWARD_IMPL_H
#define DS_MODEL_FORWARD_IMPL_H

#include "kernels/cpu/cpu_pool.h"
#include "kernels/cpu/matmul.h"
#include "model/forward.h"

struct qwen35_ctx {
    const qwen35_model *m;
    cpu_pool *pool;        /* owned unless borrowed_pool (the ranks of a group share one) */
    bool borrowed_pool;
    int n_threads, max_batch, max_tokens;
    int max_rows;          /* max(max_batch, max_tokens): rows of every activation buffer */
    qwen35_gdn_mode gdn_mode;
    qwen35_dot_mode dot_mode;
    bool bf16_state;       /* qwen35_ctx_opts.bf16_state */
    float *x;              /* owned, [max_rows][H] residual stream */
    float *xn;             /* owned, [max_rows][H] normed input of the current sub-block */
    float *out;            /* owned, [max_rows][H] sub-block output before the residual add */
    float *p1;             /* owned, [max_rows][n_p1] qkv (C) | q+gate (2 n_h d_h) | ffn gate (F)
                              | the MTP's [e ; h] (2H, when the model has an MTP head) */
    float *p2;             /* owned, [max_rows][n_p2] z (D_v) | k (n_kv d_h) | ffn up (F) */
    float *p3;             /* owned, [max_rows][n_p3] conv output (C) | v (n_kv d_h) */
    float *mix;            /* owned, [max_rows][n_mix] mixer output: D_v | n_h d_h */
    float *b, *a;          /* owned, [max_rows][n_v] beta / alpha projections, then β / g */
    float *mm_scratch;     /* owned, cpu_matmul scratch for n_in up to max(H, F, D_v, n_h d_h):
                              the dequantised row tiles, or the Q8-quantised inputs */
    float *gdn_scratch;    /* owned, [n_threads][ref_gdn_chunked_scratch_floats(d_k, d_v)] */
    float *attn_scratch;   /* owned, [n_threads][REF_ATTN_BLOCK] */
    long n_p1, n_p2, n_p3, n_mix, gdn_scratch_n;
    /* the current step: row r is a token of row_state[r] at position row_pos[r] */
    int n_rows;
    bool prefill;          /* rows are consecutive tokens of one sequence (row_state[0]) */
    qwen35_state **row_state; /* owned array, [max_rows] (states borrowed) */
    int *row_pos;          /* owned, [max_rows] */
    /* a verify run (prefill rows only): NULL, or where the recurrent state after each row goes,
     * row r at keep + r * keep_stride in qwen35_state_save_recurrent's layout (the DeltaNet
     * layers then run the conv and the rule one row at a time: cpu_fwd_rows_keep) */
    float *keep;
    uint64_t keep_stride;
};

/* qwen35_ctx_create with the thread pool given (borrowed: used by one ctx at a time, outlives
 * ctx) or, pool NULL, one of opts->n_threads created and owned. */
int cpu_fwd_ctx_create(const qwen35_model *m, const qwen35_ctx_opts *opts, cpu_pool *pool,
                       qwen35_ctx **out, status *st);

/* The rows of the next step: n consecutive tokens of s from s->n_past (prefill), or one token of
 * each of the B states (decode). */
void cpu_fwd_rows_prefill(qwen35_ctx *ctx, qwen35_state *s, int n);
void cpu_fwd_rows_decode(qwen35_ctx *ctx, qwen35_state *const *states, int B);
/* After cpu_fwd_rows_prefill: the recurrent state after each row kept at keep + r * stride
 * (floats; qwen35_state_save_recurrent's layout) by the next cpu_fwd_run; NULL: none. */
void cpu_fwd_rows_keep(qwen35_ctx *ctx, float *keep, uint64_t stride);

/* A tensor-parallel group of n_ranks >= 1 ranks (model/tp_shard.h), each a ctx over its shard
 * with its rows set up alike (cpu_fwd_rows_*): the one way a step runs, one rank or several.
 * cpu_fwd_run: every layer on the rows (forward.c: embedding, then per layer the mixer and the
 * FFN, each added to the residual stream); after each mixer and FFN the ranks' partial outputs
 * [rows][H] are summed in rank order 0, 1, .., N-1 (the in-memory all-reduce: every rank gets
 * the same bits; nothing to do for one rank) before the residual add.
 * cpu_fwd_run_head: logits of rows [first, first + n) into logits (row stride ld), each rank
 * writing its vocabulary slice at vocab_begin[r] (the gather; NULL: one rank, all of V). */
void cpu_fwd_run(qwen35_ctx *const *ranks, int n_ranks, const int32_t *tokens);
void cpu_fwd_run_head(qwen35_ctx *const *ranks, const int64_t *vocab_begin, int n_ranks,
                      int first, int n, float *logits, long ld);

/* y[r] = W · x[r] for the current rows (x: [n_rows][W.n_in], y: [n_rows][W.n_out]). */
static inline void cpu_fwd_matmul(qwen35_ctx *ctx, const qwen35_mat *w, const float *x, float *y)
{
    cpu_matmul(ctx->pool, w->data, w->type, w->row_bytes, w->n_in, w->n_out, x, w->n_in,
               ctx->n_rows, y, w->n_out, ctx->mm_scratch, (cpu_matmul_dot)ctx->dot_mode);
}

/* Mixers: read ctx->xn (normed input), write ctx->out [n_rows][H]; update the rows' states.
 * cpu_fwd_attn_rows: the gated attention of layer ly with the KV of attention slot `slot` of
 * the rows' states (cpu_fwd_attn_layer: model layer il, slot cfg.slot[il]). */
void cpu_fwd_gdn_layer(qwen35_ctx *ctx, int il);
void cpu_fwd_attn_layer(qwen35_ctx *ctx, int il);
void cpu_fwd_attn_rows(qwen35_ctx *ctx, const qwen35_layer *ly, int slot);

/* One full-attention decoder block on the rows of a group of one: x += Attn(RMSNorm(x)·
 * attn_norm) (KV slot `slot`), x += FFN(RMSNorm(x)·post_norm). The MTP layer (model/mtp.c). */
void cpu_fwd_attn_block(qwen35_ctx *ctx, const qwen35_layer *ly, int slot);

#endif
