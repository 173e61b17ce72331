/* The MTP head on the CPU (mtp.h; docs/QWEN35.md §2.8):
 *   u = eh_proj · [RMSNorm(embd[x])·enorm ; RMSNorm(h)·hnorm]     (embedding half first)
 *   u += Attn(RMSNorm(u)·attn_norm) at the row's position, KV in the state's own cache
 *   u += FFN(RMSNorm(u)·post_norm)
 *   g = RMSNorm(u)·head_norm;  logits = head · g
 * The rows run through the forward's own block code (cpu_fwd_attn_block) on the ctx's buffers. */
#include "model/mtp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/dequant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "model/forward_impl.h"

int qwen35_mtp_state_create(const qwen35_model *m, int n_ctx, qwen35_mtp_state **out,
                            status *st)
{
    *out = NULL;
    const qwen35_config *c = &m->cfg;
    if (!m->mtp.present)
        return status_fail(st, STATUS_UNSUPPORTED, "qwen35_mtp: the model has no MTP head (nextn_predict_layers 0)");
    if (n_ctx < 1) return status_fail(st, STATUS_INVALID, "qwen35_mtp: context of %d tokens", n_ctx);
    const int bt = QWEN35_KV_BLOCK_TOKENS, nb = (n_ctx + bt - 1) / bt;
    const size_t kv = (size_t)nb * bt * (size_t)c->n_kv * (size_t)c->d_h; /* one layer */
    qwen35_mtp_state *ms = calloc(1, sizeof *ms);
    float *k = malloc(kv * sizeof(float)), *v = malloc(kv * sizeof(float));
    int32_t *table = malloc((size_t)nb * sizeof *table);
    float *lg = malloc((size_t)c->V * sizeof(float)), *g = malloc(2 * (size_t)c->H * sizeof(float));
    if (!ms || !k || !v || !table || !lg || !g) {
        free(ms), free(k), free(v), free(table), free(lg), free(g);
        return status_fail(st, STATUS_NOMEM, "qwen35_mtp: out of memory for %d positions", n_ctx);
    }
    for (int i = 0; i < nb; i++) table[i] = i;
    ms->kv = (qwen35_state){.model = m, .n_ctx = n_ctx, .k_cache = k, .v_cache = v,
                            .kv_blocks = nb, .block_tokens = bt, .block_table = table};
    ms->logits = lg;
    ms->g = g;
    *out = ms;
    return STATUS_OK;
}

void qwen35_mtp_state_destroy(qwen35_mtp_state *ms)
{
    if (!ms) return;
    free(ms->kv.k_cache);
    free(ms->kv.v_cache);
    free((int32_t *)ms->kv.block_table);
    free(ms->logits);
    free(ms->g);
    free(ms);
}

void qwen35_mtp_state_reset(qwen35_mtp_state *ms) { ms->n_past = 0; }

void qwen35_mtp_truncate(qwen35_mtp_state *ms, int n_past)
{
    DS_ASSERT(n_past >= 0 && n_past <= ms->n_past);
    ms->n_past = n_past;
}

static int check_rows(const qwen35_ctx *ctx, const qwen35_mtp_state *ms, const int32_t *tokens,
                      int T, status *st)
{
    const qwen35_model *m = ctx->m;
    if (!m->mtp.present)
        return status_fail(st, STATUS_UNSUPPORTED, "qwen35_mtp: the model has no MTP head");
    DS_ASSERT(ms->kv.model == m);
    if (T < 1) return status_fail(st, STATUS_INVALID, "qwen35_mtp: %d rows", T);
    for (int i = 0; tokens && i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= m->cfg.V)
            return status_fail(st, STATUS_RANGE, "qwen35_mtp: token %d at index %d is outside the vocabulary [0, %d)",
                               tokens[i], i, m->cfg.V);
    if ((long)ms->n_past + T > ms->kv.n_ctx)
        return status_fail(st, STATUS_RANGE, "qwen35_mtp: %d rows after %d do not fit the context of %d",
                           T, ms->n_past, ms->kv.n_ctx);
    return STATUS_OK;
}

/* n <= max_tokens rows, checked. */
static void run_rows(qwen35_ctx *ctx, qwen35_mtp_state *ms, const float *hidden,
                     const int32_t *tokens, int n, float *logits, float *g)
{
    const qwen35_model *m = ctx->m;
    const qwen35_mtp *mt = &m->mtp;
    const qwen35_config *c = &m->cfg;
    const long H = c->H;
    ms->kv.n_past = ms->n_past;
    cpu_fwd_rows_prefill(ctx, &ms->kv, n);
    for (int r = 0; r < n; r++) {
        float *e = ctx->out + r * H, *eh = ctx->p1 + r * 2 * H;
        ref_dequant_row(mt->embd.type, (const uint8_t *)mt->embd.data + (uint64_t)tokens[r] * mt->embd.row_bytes,
                        e, H);
        ref_rmsnorm(e, mt->enorm, (int)H, c->eps, eh);
        ref_rmsnorm(hidden + r * H, mt->hnorm, (int)H, c->eps, eh + H);
    }
    cpu_fwd_matmul(ctx, &mt->eh_proj, ctx->p1, ctx->x);
    cpu_fwd_attn_block(ctx, &mt->layer, 0);
    for (int r = 0; r < n; r++) {
        ref_rmsnorm(ctx->x + r * H, mt->head_norm, (int)H, c->eps, ctx->xn + r * H);
        if (g) memcpy(g + r * H, ctx->xn + r * H, (size_t)H * sizeof(float));
    }
    if (logits)
        cpu_matmul(ctx->pool, mt->head.data, mt->head.type, mt->head.row_bytes, mt->head.n_in,
                   mt->head.n_out, ctx->xn, H, n, logits, c->V, ctx->mm_scratch,
                   (cpu_matmul_dot)ctx->dot_mode);
    ms->n_past += n;
}

int qwen35_mtp_step(qwen35_ctx *ctx, qwen35_mtp_state *ms, const float *hidden,
                    const int32_t *tokens, int T, float *logits, float *g, status *st)
{
    int rc = check_rows(ctx, ms, tokens, T, st);
    if (rc) return rc;
    const long H = ctx->m->cfg.H, V = ctx->m->cfg.V;
    for (int t0 = 0; t0 < T; t0 += ctx->max_tokens) {
        int n = T - t0 < ctx->max_tokens ? T - t0 : ctx->max_tokens;
        run_rows(ctx, ms, hidden + t0 * H, tokens + t0, n, logits ? logits + t0 * V : NULL,
                 g ? g + t0 * H : NULL);
    }
    return STATUS_OK;
}

/* The lowest id of the maximum (NaNs never win), as the sampler's greedy. */
static int32_t argmax(const float *x, int n)
{
    int32_t best = 0;
    float bv = -INFINITY;
    for (int i = 0; i < n; i++)
        if (x[i] > bv) bv = x[i], best = i;
    return best;
}

int qwen35_mtp_draft(qwen35_ctx *ctx, qwen35_mtp_state *ms, const float *h, int32_t token,
                     int k, int32_t *drafts, status *st)
{
    int rc = check_rows(ctx, ms, &token, 1, st);
    if (rc) return rc;
    if (k < 1) return status_fail(st, STATUS_INVALID, "qwen35_mtp: %d drafts", k);
    if ((rc = check_rows(ctx, ms, NULL, k, st))) return rc;
    const long H = ctx->m->cfg.H;
    const float *hin = h;
    int32_t tok = token;
    for (int i = 0; i < k; i++) {
        float *g = ms->g + (i & 1) * H; /* the other half holds this row's input */
        run_rows(ctx, ms, hin, &tok, 1, ms->logits, g);
        drafts[i] = tok = argmax(ms->logits, ctx->m->cfg.V);
        hin = g;
    }
    return STATUS_OK;
}
