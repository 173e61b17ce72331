/* Internals shared by forward*.c: the workspace struct and the per-layer mixers. */
#ifndef DS_MODEL_FORWARD_IMPL_H
#define DS_MODEL_FORWARD_IMPL_H

#include "kernels/cpu/cpu_pool.h"
#include "model/forward.h"

struct qwen35_ctx {
    const qwen35_model *m;
    cpu_pool *pool;        /* owned */
    int n_threads, max_batch, max_tokens;
    int max_rows;          /* max(max_batch, max_tokens): rows of every activation buffer */
    qwen35_gdn_mode gdn_mode;
    qwen35_dot_mode dot_mode;
    float *x;              /* owned, [max_rows][H] residual stream */
    float *xn;             /* owned, [max_rows][H] normed input of the current sub-block */
    float *out;            /* owned, [max_rows][H] sub-block output before the residual add */
    float *p1;             /* owned, [max_rows][n_p1] qkv (C) | q+gate (2 n_h d_h) | ffn gate (F) */
    float *p2;             /* owned, [max_rows][n_p2] z (D_v) | k (n_kv d_h) | ffn up (F) */
    float *p3;             /* owned, [max_rows][n_p3] conv output (C) | v (n_kv d_h) */
    float *mix;            /* owned, [max_rows][n_mix] mixer output: D_v | n_h d_h */
    float *b, *a;          /* owned, [max_rows][n_v] beta / alpha projections, then β / g */
    float *mm_scratch;     /* owned, ref_matmul scratch for n_in up to max(H, F, D_v, n_h d_h):
                              the dequantised row tiles, or the Q8-quantised inputs */
    float *gdn_scratch;    /* owned, [n_threads][ref_gdn_chunked_scratch_floats(d_k, d_v)] */
    float *attn_scratch;   /* owned, [n_threads][REF_ATTN_BLOCK] */
    long n_p1, n_p2, n_p3, n_mix, gdn_scratch_n;
    /* the current step: row r is a token of row_state[r] at position row_pos[r] */
    int n_rows;
    bool prefill;          /* rows are consecutive tokens of one sequence (row_state[0]) */
    qwen35_state **row_state; /* owned array, [max_rows] (states borrowed) */
    int *row_pos;          /* owned, [max_rows] */
};

/* y[r] = W · x[r] for the current rows (x: [n_rows][W.n_in], y: [n_rows][W.n_out]). */
void fwd_matmul(qwen35_ctx *ctx, const qwen35_mat *w, const float *x, float *y);

/* Mixers: read ctx->xn (normed input), write ctx->out [n_rows][H]; update the rows' states. */
void fwd_gdn_layer(qwen35_ctx *ctx, int il);
void fwd_attn_layer(qwen35_ctx *ctx, int il);

#endif
