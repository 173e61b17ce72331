/* Gated full-attention layer of the CPU forward pass (docs/QWEN35.md §2.2, §2.3):
 *   [q_h | gate_h] = (W_q h) viewed [n_h][2][d_h];  k = W_k h, v = W_v h
 *   q_h, k_j ← RMSNorm · q_norm / k_norm (per head), then partial NEOX RoPE at the position
 *   K, V into the paged cache (the position's row of its block, forward.h "KV layout");
 *   o_h = causal softmax(q_h·K/sqrt(d_h)) V  (GQA h / (n_h/n_kv)), each cached row read where
 *   its block lies
 *   out = W_o (o ⊙ sigmoid(gate)) */
#include <string.h>

#include "kernels/cpu/act.h"
#include "kernels/cpu/attn.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "model/forward_impl.h"

typedef struct attn_job {
    qwen35_ctx *ctx;
    int slot;
} attn_job;

/* task = row * n_h + head */
static void attn_head_task(void *arg, int task)
{
    const attn_job *j = arg;
    qwen35_ctx *ctx = j->ctx;
    const qwen35_config *c = &ctx->m->cfg;
    int r = task / c->n_h, h = task % c->n_h, d = c->d_h;
    int kvh = h / (c->n_h / c->n_kv);
    const qwen35_state *s = ctx->row_state[r];
    const long ld = (long)c->n_kv * d;
    /* layer j->slot's first block, head kvh: the table picks the block of each position */
    const uint64_t base = (uint64_t)j->slot * s->kv_blocks * s->block_tokens * ld + (uint64_t)kvh * d;
    const float *qg = ctx->p1 + (long)r * 2 * c->n_h * d + (long)h * 2 * d; /* [q_h | gate_h] */
    float *o = ctx->mix + (long)r * c->n_h * d + (long)h * d;
    float *scores = ctx->attn_scratch + (long)cpu_pool_thread_index() * REF_ATTN_BLOCK;
    ref_attn_head_paged(qg, s->k_cache + base, s->v_cache + base, s->block_table, s->block_tokens,
                        (long)s->block_tokens * ld, ld, ctx->row_pos[r] + 1, d,
                        1.0f / sqrtf((float)d), scores, o);
    ref_sigmoid_gate(o, qg + d, d);
}

void cpu_fwd_attn_layer(qwen35_ctx *ctx, int il)
{
    cpu_fwd_attn_rows(ctx, &ctx->m->layers[il], ctx->m->cfg.slot[il]);
}

void cpu_fwd_attn_rows(qwen35_ctx *ctx, const qwen35_layer *ly, int slot)
{
    const qwen35_config *c = &ctx->m->cfg;
    int n = ctx->n_rows, d = c->d_h;
    long qgd = 2L * c->n_h * d, kvd = (long)c->n_kv * d;
    attn_job j = {.ctx = ctx, .slot = slot};
    cpu_fwd_matmul(ctx, &ly->q, ctx->xn, ctx->p1); /* [n][n_h][2][d_h] */
    cpu_fwd_matmul(ctx, &ly->k, ctx->xn, ctx->p2); /* [n][n_kv][d_h] */
    cpu_fwd_matmul(ctx, &ly->v, ctx->xn, ctx->p3); /* [n][n_kv][d_h] */
    for (int r = 0; r < n; r++) {
        int pos = ctx->row_pos[r];
        float *qg = ctx->p1 + r * qgd, *k = ctx->p2 + r * kvd;
        for (int h = 0; h < c->n_h; h++) {
            ref_rmsnorm(qg + (long)h * 2 * d, ly->q_norm, d, c->eps, qg + (long)h * 2 * d);
            ref_rope(qg + (long)h * 2 * d, 1, d, c->n_rot, pos, c->rope_base);
        }
        ref_rmsnorm_heads(k, ly->k_norm, c->n_kv, d, c->eps);
        ref_rope(k, c->n_kv, d, c->n_rot, pos, c->rope_base);
        qwen35_state *s = ctx->row_state[r];
        const uint64_t off = qwen35_kv_offset(s, j.slot, pos);
        memcpy(s->k_cache + off, k, (size_t)kvd * sizeof(float));
        memcpy(s->v_cache + off, ctx->p3 + r * kvd, (size_t)kvd * sizeof(float));
    }
    cpu_pool_run(ctx->pool, attn_head_task, &j, n * c->n_h);
    cpu_fwd_matmul(ctx, &ly->o, ctx->mix, ctx->out);
}
