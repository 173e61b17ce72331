/* CPU reference forward pass of Qwen3.5, top level (docs/QWEN35.md §2.0, §2.6):
 *   x = token_embd[token]
 *   per layer: x += Mixer(RMSNorm(x)·attn_norm);  x += W_down(silu(W_gate h2) ⊙ W_up h2),
 *              h2 = RMSNorm(x)·post_attention_norm;   Mixer = Gated DeltaNet or gated attention
 *   logits = W_out · RMSNorm(x)·output_norm
 * The same code runs decode (rows = B sequences, one token each) and prefill (rows = T
 * consecutive tokens of one sequence); only the mixers care which. A step is cpu_fwd_run over a
 * tensor-parallel group of ranks (forward_impl.h); the calls here are a group of one. */
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "kernels/cpu/act.h"
#include "kernels/cpu/attn.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/norm.h"
#include "model/forward_impl.h"

#define MAXL(a, b) ((a) > (b) ? (a) : (b))

_Static_assert((int)QWEN35_DOT_DEFAULT == (int)CPU_MATMUL_DOT_DEFAULT &&
                   (int)QWEN35_DOT_Q8 == (int)CPU_MATMUL_DOT_Q8 &&
                   (int)QWEN35_DOT_EXACT == (int)CPU_MATMUL_DOT_EXACT,
               "qwen35_dot_mode mirrors cpu_matmul_dot");

/* ---- workspace ---- */

static float *alloc_f(long n, bool *ok)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    if (!p) *ok = false;
    return p;
}

int qwen35_ctx_create(const qwen35_model *m, const qwen35_ctx_opts *opts, qwen35_ctx **out,
                      status *st)
{
    return cpu_fwd_ctx_create(m, opts, NULL, out, st);
}

int cpu_fwd_ctx_create(const qwen35_model *m, const qwen35_ctx_opts *opts, cpu_pool *pool,
                       qwen35_ctx **out, status *st)
{
    *out = NULL;
    qwen35_ctx_opts o = opts ? *opts : (qwen35_ctx_opts){0};
    if (o.max_batch < 0 || o.max_tokens < 0 || o.max_batch > 65536 || o.max_tokens > 65536)
        return status_fail(st, STATUS_INVALID, "qwen35_ctx: max_batch %d / max_tokens %d out of range",
                           o.max_batch, o.max_tokens);
    if ((int)o.dot_mode < 0 || (int)o.dot_mode > (int)QWEN35_DOT_EXACT)
        return status_fail(st, STATUS_INVALID, "qwen35_ctx: dot_mode %d out of range", (int)o.dot_mode);
    if (o.max_batch == 0) o.max_batch = 1;
    if (o.max_tokens == 0) o.max_tokens = 512;
    qwen35_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return status_fail(st, STATUS_NOMEM, "qwen35_ctx: out of memory");
    if (pool) {
        ctx->pool = pool;
        ctx->borrowed_pool = true;
    } else {
        int rc = cpu_pool_create(&ctx->pool, o.n_threads, st);
        if (rc) {
            free(ctx);
            return rc;
        }
    }
    const qwen35_config *c = &m->cfg;
    ctx->m = m;
    ctx->n_threads = cpu_pool_n_threads(ctx->pool);
    ctx->max_batch = o.max_batch;
    ctx->max_tokens = o.max_tokens;
    ctx->max_rows = MAXL(o.max_batch, o.max_tokens);
    ctx->gdn_mode = o.gdn_mode;
    ctx->dot_mode = o.dot_mode;
    ctx->bf16_state = o.bf16_state;
    long R = ctx->max_rows, H = c->H, Dv = (long)c->n_v * c->d_v, qd = (long)c->n_h * c->d_h;
    long kvd = (long)c->n_kv * c->d_h;
    ctx->n_p1 = MAXL(MAXL(c->C, 2 * qd), c->F);
    ctx->n_p2 = MAXL(MAXL(Dv, kvd), c->F);
    ctx->n_p3 = MAXL(c->C, kvd);
    ctx->n_mix = MAXL(Dv, qd);
    ctx->gdn_scratch_n = ref_gdn_chunked_scratch_floats(c->d_k, c->d_v);
    long n_in_max = MAXL(MAXL(H, c->F), MAXL(Dv, qd));
    if (m->mtp.present) { /* the MTP's eh_proj reads [e ; h] rows of 2H (model/mtp.c) */
        ctx->n_p1 = MAXL(ctx->n_p1, 2 * H);
        n_in_max = MAXL(n_in_max, 2 * H);
    }
    bool ok = true;
    ctx->x = alloc_f(R * H, &ok);
    ctx->xn = alloc_f(R * H, &ok);
    ctx->out = alloc_f(R * H, &ok);
    ctx->p1 = alloc_f(R * ctx->n_p1, &ok);
    ctx->p2 = alloc_f(R * ctx->n_p2, &ok);
    ctx->p3 = alloc_f(R * ctx->n_p3, &ok);
    ctx->mix = alloc_f(R * ctx->n_mix, &ok);
    ctx->b = alloc_f(R * c->n_v, &ok);
    ctx->a = alloc_f(R * c->n_v, &ok);
    ctx->mm_scratch = alloc_f((long)cpu_matmul_scratch_floats(n_in_max, ctx->n_threads), &ok);
    ctx->gdn_scratch = alloc_f(ctx->n_threads * ctx->gdn_scratch_n, &ok);
    ctx->attn_scratch = alloc_f((long)ctx->n_threads * REF_ATTN_BLOCK, &ok);
    ctx->row_state = calloc((size_t)R, sizeof *ctx->row_state);
    ctx->row_pos = calloc((size_t)R, sizeof *ctx->row_pos);
    if (!ok || !ctx->row_state || !ctx->row_pos) {
        qwen35_ctx_destroy(ctx);
        return status_fail(st, STATUS_NOMEM, "qwen35_ctx: out of memory for %ld rows", R);
    }
    *out = ctx;
    return STATUS_OK;
}

void qwen35_ctx_destroy(qwen35_ctx *ctx)
{
    if (!ctx) return;
    if (!ctx->borrowed_pool) cpu_pool_destroy(ctx->pool);
    float *bufs[] = {ctx->x, ctx->xn, ctx->out, ctx->p1, ctx->p2, ctx->p3, ctx->mix,
                     ctx->b, ctx->a, ctx->mm_scratch, ctx->gdn_scratch, ctx->attn_scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(ctx->row_state);
    free(ctx->row_pos);
    free(ctx);
}

void qwen35_ctx_set_gdn_mode(qwen35_ctx *ctx, qwen35_gdn_mode mode) { ctx->gdn_mode = mode; }

/* ---- one step over ctx->n_rows rows ---- */

static void embed(qwen35_ctx *ctx, const int32_t *tokens)
{
    const qwen35_mat *e = &ctx->m->tok_embd;
    for (int r = 0; r < ctx->n_rows; r++)
        ref_dequant_row(e->type, (const uint8_t *)e->data + (uint64_t)tokens[r] * e->row_bytes,
                        ctx->x + (long)r * e->n_in, e->n_in);
}

static void norm_rows(qwen35_ctx *ctx, const float *w)
{
    const qwen35_config *c = &ctx->m->cfg;
    for (int r = 0; r < ctx->n_rows; r++)
        ref_rmsnorm(ctx->x + (long)r * c->H, w, c->H, c->eps, ctx->xn + (long)r * c->H);
}

static void residual(qwen35_ctx *ctx)
{
    long n = (long)ctx->n_rows * ctx->m->cfg.H;
    ref_add(ctx->x, ctx->out, (int)n);
}

static void mixer(qwen35_ctx *ctx, int il)
{
    norm_rows(ctx, ctx->m->layers[il].attn_norm);
    if (ctx->m->cfg.recurrent[il])
        cpu_fwd_gdn_layer(ctx, il);
    else
        cpu_fwd_attn_layer(ctx, il);
}

static void ffn_rows(qwen35_ctx *ctx, const qwen35_layer *ly)
{
    norm_rows(ctx, ly->post_norm);
    cpu_fwd_matmul(ctx, &ly->ffn_gate, ctx->xn, ctx->p1);
    cpu_fwd_matmul(ctx, &ly->ffn_up, ctx->xn, ctx->p2);
    ref_swiglu(ctx->p1, ctx->p2, ctx->n_rows * ctx->m->cfg.F, ctx->p1);
    cpu_fwd_matmul(ctx, &ly->ffn_down, ctx->p1, ctx->out);
}

static void ffn(qwen35_ctx *ctx, int il) { ffn_rows(ctx, &ctx->m->layers[il]); }

void cpu_fwd_attn_block(qwen35_ctx *ctx, const qwen35_layer *ly, int slot)
{
    norm_rows(ctx, ly->attn_norm);
    cpu_fwd_attn_rows(ctx, ly, slot);
    residual(ctx);
    ffn_rows(ctx, ly);
    residual(ctx);
}

static void head(qwen35_ctx *ctx, int first, int n, float *logits, long ld)
{
    const qwen35_model *m = ctx->m;
    const qwen35_config *c = &m->cfg;
    const qwen35_mat *w = &m->output;
    DS_ASSERT(first >= 0 && n >= 1 && first + n <= ctx->n_rows);
    for (int r = 0; r < n; r++)
        ref_rmsnorm(ctx->x + (long)(first + r) * c->H, m->output_norm, c->H, c->eps,
                    ctx->xn + (long)r * c->H);
    cpu_matmul(ctx->pool, w->data, w->type, w->row_bytes, w->n_in, w->n_out, ctx->xn, w->n_in, n,
               logits, ld, ctx->mm_scratch, (cpu_matmul_dot)ctx->dot_mode);
}

/* The in-memory all-reduce of the ranks' partial outputs [n_rows][H]: rank 0's buffer
 * accumulates ranks 1..N-1 in order, then every rank gets a copy of the sum. */
static void all_reduce(qwen35_ctx *const *ranks, int N)
{
    const long n = (long)ranks[0]->n_rows * ranks[0]->m->cfg.H;
    float *sum = ranks[0]->out;
    for (int r = 1; r < N; r++) ref_add(sum, ranks[r]->out, (int)n);
    for (int r = 1; r < N; r++) memcpy(ranks[r]->out, sum, (size_t)n * sizeof(float));
}

void cpu_fwd_run(qwen35_ctx *const *ranks, int N, const int32_t *tokens)
{
    for (int r = 0; r < N; r++) embed(ranks[r], tokens);
    for (int il = 0; il < ranks[0]->m->cfg.n_layer; il++) {
        for (int r = 0; r < N; r++) mixer(ranks[r], il);
        all_reduce(ranks, N);
        for (int r = 0; r < N; r++) residual(ranks[r]);
        for (int r = 0; r < N; r++) ffn(ranks[r], il);
        all_reduce(ranks, N);
        for (int r = 0; r < N; r++) residual(ranks[r]);
    }
}

void cpu_fwd_run_head(qwen35_ctx *const *ranks, const int64_t *vocab_begin, int N, int first,
                      int n, float *logits, long ld)
{
    for (int r = 0; r < N; r++)
        head(ranks[r], first, n, logits + (vocab_begin ? vocab_begin[r] : 0), ld);
}

static int check_tokens(const qwen35_ctx *ctx, const int32_t *tokens, int n, status *st)
{
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= ctx->m->cfg.V)
            return status_fail(st, STATUS_RANGE, "token %d at index %d is outside the vocabulary [0, %d)",
                               tokens[i], i, ctx->m->cfg.V);
    return STATUS_OK;
}

static int check_prefill(const qwen35_ctx *ctx, const qwen35_state *s, const int32_t *tokens, int T,
                         status *st)
{
    DS_ASSERT(s->model == ctx->m);
    if (T < 1) return status_fail(st, STATUS_INVALID, "prefill of %d tokens", T);
    int rc = check_tokens(ctx, tokens, T, st);
    if (rc) return rc;
    if ((long)s->n_past + T > s->n_ctx)
        return status_fail(st, STATUS_RANGE, "%d tokens after %d do not fit the context of %d",
                           T, s->n_past, s->n_ctx);
    return STATUS_OK;
}

static int check_decode(const qwen35_ctx *ctx, qwen35_state *const *states, const int32_t *tokens,
                        int B, status *st)
{
    if (B < 1 || B > ctx->max_batch)
        return status_fail(st, STATUS_INVALID, "decode batch of %d sequences (max %d)", B, ctx->max_batch);
    int rc = check_tokens(ctx, tokens, B, st);
    if (rc) return rc;
    for (int b = 0; b < B; b++) {
        DS_ASSERT(states[b]->model == ctx->m);
        for (int b2 = 0; b2 < b; b2++) DS_ASSERT(states[b2] != states[b]);
        if (states[b]->n_past >= states[b]->n_ctx)
            return status_fail(st, STATUS_RANGE, "sequence %d: context of %d tokens is full", b,
                               states[b]->n_ctx);
    }
    return STATUS_OK;
}

void cpu_fwd_rows_prefill(qwen35_ctx *ctx, qwen35_state *s, int n)
{
    DS_ASSERT(n >= 1 && n <= ctx->max_tokens);
    ctx->n_rows = n;
    ctx->prefill = true;
    ctx->keep = NULL;
    for (int r = 0; r < n; r++) {
        ctx->row_state[r] = s;
        ctx->row_pos[r] = s->n_past + r;
    }
}

void cpu_fwd_rows_decode(qwen35_ctx *ctx, qwen35_state *const *states, int B)
{
    DS_ASSERT(B >= 1 && B <= ctx->max_batch);
    ctx->n_rows = B;
    ctx->prefill = false;
    ctx->keep = NULL;
    for (int b = 0; b < B; b++) {
        ctx->row_state[b] = states[b];
        ctx->row_pos[b] = states[b]->n_past;
    }
}

void cpu_fwd_rows_keep(qwen35_ctx *ctx, float *keep, uint64_t stride)
{
    DS_ASSERT(ctx->prefill || !keep);
    ctx->keep = keep;
    ctx->keep_stride = stride;
}

int qwen35_prefill(qwen35_ctx *ctx, qwen35_state *s, const int32_t *tokens, int T,
                   float *logits, bool all_logits, status *st)
{
    return qwen35_prefill_hidden(ctx, s, tokens, T, logits, all_logits, NULL, st);
}

int qwen35_prefill_hidden(qwen35_ctx *ctx, qwen35_state *s, const int32_t *tokens, int T,
                          float *logits, bool all_logits, float *hidden, status *st)
{
    int rc = check_prefill(ctx, s, tokens, T, st);
    if (rc) return rc;
    const qwen35_config *c = &ctx->m->cfg;
    int V = c->V;
    for (int t0 = 0; t0 < T; t0 += ctx->max_tokens) {
        int n = T - t0 < ctx->max_tokens ? T - t0 : ctx->max_tokens;
        bool last = t0 + n == T;
        cpu_fwd_rows_prefill(ctx, s, n);
        float *lg = NULL;
        int first = 0;
        if (logits && all_logits) lg = logits + (long)t0 * V;
        else if (logits && last) lg = logits, first = n - 1;
        cpu_fwd_run(&ctx, 1, tokens + t0);
        for (int r = 0; hidden && r < n; r++) /* the lm_head's input (head() computes the same) */
            ref_rmsnorm(ctx->x + (long)r * c->H, ctx->m->output_norm, c->H, c->eps,
                        hidden + (long)(t0 + r) * c->H);
        if (lg) cpu_fwd_run_head(&ctx, NULL, 1, first, n - first, lg, V);
        s->n_past += n;
    }
    return STATUS_OK;
}

int qwen35_decode_batch(qwen35_ctx *ctx, qwen35_state *const *states, const int32_t *tokens,
                        int B, float *logits, status *st)
{
    int rc = check_decode(ctx, states, tokens, B, st);
    if (rc) return rc;
    cpu_fwd_rows_decode(ctx, states, B);
    cpu_fwd_run(&ctx, 1, tokens);
    if (logits) cpu_fwd_run_head(&ctx, NULL, 1, 0, B, logits, ctx->m->cfg.V);
    for (int b = 0; b < B; b++) states[b]->n_past++;
    return STATUS_OK;
}
