/* Gated DeltaNet layer of the CPU forward pass (docs/QWEN35.md §2.4, §2.5, §3):
 *   mixed = W_qkv h, z = W_gate h, b = W_beta h, a = W_alpha h      (token-parallel matmuls)
 *   y = silu(causal conv over [conv state | mixed]);  q, k L2-normed, q /= sqrt(d_k)
 *   β = sigmoid(b), g = ssm_a · softplus(a + dt_bias)
 *   o_hv = delta rule over tokens (value head hv reads key head hv % n_k)
 *   o_hv = RMSNorm(o_hv) · ssm_norm · silu(z_hv);   out = W_ssm_out o
 * Prefill (rows = T tokens of one sequence) runs the rule chunked (or token by token when
 * ctx->gdn_mode says so), one task per value head; decode runs one step per (sequence, head).
 * ctx->bf16_state: S rounded to bf16 values where the GPU stores it (kernels/cpu/gdn.h). */
#include <string.h>

#include "kernels/cpu/gdn.h"
#include "kernels/cpu/norm.h"
#include "model/forward_impl.h"

typedef struct gdn_job {
    qwen35_ctx *ctx;
    const qwen35_layer *ly;
    int slot;
    bool chunked;
} gdn_job;

static float *ssm_of(const qwen35_config *c, qwen35_state *s, int slot)
{
    return s->ssm + (uint64_t)slot * c->n_v * c->d_v * c->d_k;
}

static float *conv_of(const qwen35_config *c, qwen35_state *s, int slot)
{
    return s->conv + (uint64_t)slot * c->C * (c->K_conv - 1);
}

/* Prefill: value head `task` over all T rows. */
static void gdn_prefill_head(void *arg, int hv)
{
    const gdn_job *j = arg;
    qwen35_ctx *ctx = j->ctx;
    const qwen35_config *c = &ctx->m->cfg;
    long C = c->C, Dk = (long)c->n_k * c->d_k, Dv = (long)c->n_v * c->d_v;
    int kh = hv % c->n_k, T = ctx->n_rows;
    const float *y = ctx->p3; /* [T][C] conv output: q | k | v */
    float *S = ssm_of(c, ctx->row_state[0], j->slot) + (long)hv * c->d_v * c->d_k;
    float *o = ctx->mix + (long)hv * c->d_v; /* row stride Dv */
    const float *q = y + (long)kh * c->d_k, *k = y + Dk + (long)kh * c->d_k;
    const float *v = y + 2 * Dk + (long)hv * c->d_v;
    if (ctx->keep) { /* a verify run: the state after each row kept */
        const uint64_t head = (uint64_t)c->d_v * c->d_k;
        float *kept = ctx->keep + (uint64_t)c->n_gdn_layers * C * (c->K_conv - 1) +
                      ((uint64_t)j->slot * c->n_v + (uint64_t)hv) * head;
        for (int t = 0; t < T; t++) {
            ref_gdn_step(q + t * C, k + t * C, v + t * C, ctx->b[(long)t * c->n_v + hv],
                         ctx->a[(long)t * c->n_v + hv], c->d_k, c->d_v, S, o + t * Dv);
            if (ctx->bf16_state) ref_gdn_round_bf16(S, (long)head);
            memcpy(kept + (uint64_t)t * ctx->keep_stride, S, head * sizeof(float));
        }
    } else if (j->chunked) {
        float *scratch = ctx->gdn_scratch + (long)cpu_pool_thread_index() * ctx->gdn_scratch_n;
        ref_gdn_chunked(T, q, k, C, v, C, ctx->b + hv, ctx->a + hv, c->n_v, c->d_k, c->d_v, S,
                        ctx->bf16_state, o, Dv, scratch);
    } else {
        ref_gdn_recurrent(T, q, k, C, v, C, ctx->b + hv, ctx->a + hv, c->n_v, c->d_k, c->d_v, S,
                          ctx->bf16_state, o, Dv);
    }
    const float *z = ctx->p2 + (long)hv * c->d_v;
    for (int t = 0; t < T; t++)
        ref_rmsnorm_gated(o + t * Dv, z + t * Dv, j->ly->ssm_norm, c->d_v, c->eps);
}

/* Decode: task = row * n_v + value head. */
static void gdn_decode_head(void *arg, int task)
{
    const gdn_job *j = arg;
    qwen35_ctx *ctx = j->ctx;
    const qwen35_config *c = &ctx->m->cfg;
    int r = task / c->n_v, hv = task % c->n_v, kh = hv % c->n_k;
    long C = c->C, Dk = (long)c->n_k * c->d_k, Dv = (long)c->n_v * c->d_v;
    const float *y = ctx->p3 + r * C;
    float *S = ssm_of(c, ctx->row_state[r], j->slot) + (long)hv * c->d_v * c->d_k;
    float *o = ctx->mix + r * Dv + (long)hv * c->d_v;
    ref_gdn_step(y + (long)kh * c->d_k, y + Dk + (long)kh * c->d_k, y + 2 * Dk + (long)hv * c->d_v,
                 ctx->b[(long)r * c->n_v + hv], ctx->a[(long)r * c->n_v + hv], c->d_k, c->d_v, S, o);
    if (ctx->bf16_state) ref_gdn_round_bf16(S, (long)c->d_v * c->d_k);
    ref_rmsnorm_gated(o, ctx->p2 + r * Dv + (long)hv * c->d_v, j->ly->ssm_norm, c->d_v, c->eps);
}

void cpu_fwd_gdn_layer(qwen35_ctx *ctx, int il)
{
    const qwen35_config *c = &ctx->m->cfg;
    const qwen35_layer *ly = &ctx->m->layers[il];
    int n = ctx->n_rows;
    long C = c->C;
    gdn_job j = {.ctx = ctx, .ly = ly, .slot = c->slot[il]};
    cpu_fwd_matmul(ctx, &ly->qkv, ctx->xn, ctx->p1);    /* mixed [n][C] */
    cpu_fwd_matmul(ctx, &ly->gate, ctx->xn, ctx->p2);   /* z [n][D_v] */
    cpu_fwd_matmul(ctx, &ly->beta, ctx->xn, ctx->b);    /* b [n][n_v] */
    cpu_fwd_matmul(ctx, &ly->alpha, ctx->xn, ctx->a);   /* a [n][n_v] */
    if (ctx->keep) { /* a verify run: row by row, the window after each row kept */
        const uint64_t w = (uint64_t)C * (c->K_conv - 1);
        float *state = conv_of(c, ctx->row_state[0], j.slot);
        for (int r = 0; r < n; r++) {
            ref_gdn_conv(ctx->p1 + r * C, C, 1, c->C, c->K_conv, ly->conv1d, state, ctx->p3 + r * C);
            memcpy(ctx->keep + (uint64_t)r * ctx->keep_stride + (uint64_t)j.slot * w, state,
                   w * sizeof(float));
        }
    } else if (ctx->prefill) {
        ref_gdn_conv(ctx->p1, C, n, c->C, c->K_conv, ly->conv1d,
                     conv_of(c, ctx->row_state[0], j.slot), ctx->p3);
    } else {
        for (int r = 0; r < n; r++)
            ref_gdn_conv(ctx->p1 + r * C, C, 1, c->C, c->K_conv, ly->conv1d,
                         conv_of(c, ctx->row_state[r], j.slot), ctx->p3 + r * C);
    }
    for (int r = 0; r < n; r++) {
        ref_gdn_qk_norm(ctx->p3 + r * C, c->n_k, c->d_k, c->eps);
        float *b = ctx->b + (long)r * c->n_v, *a = ctx->a + (long)r * c->n_v;
        ref_gdn_gates(b, a, ly->dt_bias, ly->ssm_a, c->n_v, b, a); /* in place: b -> β, a -> g */
    }
    if (ctx->prefill) {
        j.chunked = n > 1 && ctx->gdn_mode == QWEN35_GDN_CHUNKED;
        cpu_pool_run(ctx->pool, gdn_prefill_head, &j, c->n_v);
    } else {
        cpu_pool_run(ctx->pool, gdn_decode_head, &j, n * c->n_v);
    }
    cpu_fwd_matmul(ctx, &ly->ssm_out, ctx->mix, ctx->out);
}
