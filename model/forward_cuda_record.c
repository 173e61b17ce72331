/* One token of one slot as launched into the step graph: cpu_fwd_run of model/forward.c,
 * sublayer by sublayer, on the CUDA kernels. Each function names the CPU function it mirrors.
 *
 * Fusions against the CPU's op list: the DeltaNet in-projection GEMV also runs the causal conv
 * + SiLU on its qkv rows (gemv_conv); the two in-projection groups of two weight types run as
 * one launch when the tuning table says so (gemv_pair); the residual add is the GEMV's ADD
 * epilogue; gate and up are one GEMV with SwiGLU (gemv_swiglu); the lm_head computes the greedy
 * argmax as it writes the logits (gemv_argmax); every kernel whose output feeds a quantised GEMV
 * also writes its Q8 form. */
#include "common/log.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/tp_comm.h"
#include "model/forward_cuda_impl.h"

/* Tensor parallel: the residual matmuls' epilogue (rank 0 adds to x, the others store their
 * partial sums), and the sum of n floats over the ranks (nothing without tp; a failure is
 * checked after capture). */
static gemv_epilogue residual_ep(const fc_rank *e)
{
    return e->tp && e->tp_rank > 0 ? GEMV_STORE : GEMV_ADD;
}

static void tp_sum(fc_rank *e, float *d_buf, int64_t n)
{
    if (!e->tp) return;
    status st;
    if (tp_comm_sum(e->tp, d_buf, (size_t)n, e->launch.stream, &st)) e->tp_failed = 1;
}

/* norm_rows: h = RMSNorm(x) * w, with its Q8 form */
static void rec_norm(fc_rank *e, const float *d_w)
{
    norm_rms(e->a.d_x, d_w, e->cfg.H, e->cfg.eps, e->a.d_h, e->a.d_hq, &e->launch);
}

/* The in-projections of h into d_proj; conv: the DeltaNet layer's conv weights and window (the
 * first group holds qkv: conv + SiLU fused on its first C rows), NULL for attention. */
static void rec_in_proj(fc_rank *e, const fc_layer *L, float *conv)
{
    const qwen35_config *c = &e->cfg;
    fc_act *a = &e->a;
    const int64_t n_conv = conv ? c->C : 0;
    if (L->in_pair) {
        gemv_pair(&L->in[0].m, &L->in[1].m, a->d_hq, a->d_proj + L->in[0].y_off,
                  a->d_proj + L->in[1].y_off, conv ? L->d_conv_w : NULL, conv, n_conv, c->K_conv,
                  &e->launch);
        return;
    }
    for (int g = 0; g < L->n_in; g++) {
        float *y = a->d_proj + L->in[g].y_off;
        if (g == 0 && conv)
            gemv_conv(&L->in[g].m, a->d_h, a->d_hq, y, L->d_conv_w, conv, c->C, c->K_conv,
                      &e->launch);
        else
            gemv(&L->in[g].m, a->d_h, a->d_hq, y, GEMV_STORE, &e->launch);
    }
}

/* cpu_fwd_gdn_layer (model/forward_gdn.c) without its residual: the gated delta rule into d_y */
static void rec_gdn(fc_rank *e, const fc_slot *sl, const fc_layer *L)
{
    const qwen35_config *c = &e->cfg;
    fc_act *a = &e->a;
    const int64_t D_v = (int64_t)c->n_v * c->d_v;
    float *conv = sl->d_conv + (int64_t)L->kind_index * c->C * (c->K_conv - 1);
    void *S = (uint8_t *)sl->d_S +
              (int64_t)L->kind_index * c->n_v * c->d_v * c->d_k * e->S_elem_bytes;
    rec_in_proj(e, L, conv);
    const float *z = a->d_proj + c->C, *beta = z + D_v, *alpha = beta + c->n_v;
    gdn_decode(a->d_proj, beta, alpha, L->d_dt_bias, L->d_ssm_a, c->n_k, c->n_v, c->d_k, c->d_v,
               c->eps, S, e->S_bf16, a->d_o, &e->launch);
    gdn_norm_gated(a->d_o, z, L->d_ssm_norm, c->n_v, c->d_v, c->eps, a->d_y, a->d_yq, &e->launch);
}

/* cpu_fwd_attn_layer (model/forward_attn.c) without its residual: gated attention into d_y, at
 * the position after d_pos's pair, slot's KV under its table row */
static void rec_attn_at(fc_rank *e, int slot, const int32_t *d_pos, const fc_layer *L)
{
    const qwen35_config *c = &e->cfg;
    fc_act *a = &e->a;
    const int64_t HA = (int64_t)c->n_h * c->d_h, KVA = (int64_t)c->n_kv * c->d_h;
    void *kc = fc_kv_layer(e, e->kv.d_k, L->kind_index);
    void *vc = fc_kv_layer(e, e->kv.d_v, L->kind_index);
    const int32_t *table = e->kv.d_table + (int64_t)slot * e->kv.ld; /* its row */
    rec_in_proj(e, L, NULL);
    const float *qg = a->d_proj, *k = qg + 2 * HA, *v = k + KVA;
    attn_prep(qg, k, v, L->d_q_norm, L->d_k_norm, c->n_h, c->n_kv, c->d_h, c->n_rot, c->rope_base,
              c->eps, d_pos, table, kc, vc, a->d_q, e->kv_type, &e->launch);
    attn_decode(a->d_q, qg, table, kc, vc, c->n_h, c->n_kv, c->d_h, e->n_ctx, d_pos, a->d_part,
                a->d_y, a->d_yq, e->kv_type, &e->launch);
}

static void rec_attn(fc_rank *e, const fc_slot *sl, const fc_layer *L)
{
    rec_attn_at(e, (int)(sl - e->slots), sl->d_pos, L);
}

/* ffn + residual: x += down(silu(gate·h) * (up·h)) */
static void rec_ffn(fc_rank *e, const fc_layer *L)
{
    fc_act *a = &e->a;
    gemv_swiglu(&L->gate, &L->up, a->d_h, a->d_hq, a->d_ffn, &e->launch);
    gemv_quantize_x(a->d_ffn, a->d_ffnq, e->cfg.F, &e->launch);
    gemv(&L->down, a->d_ffn, a->d_ffnq, a->d_x, residual_ep(e), &e->launch);
    tp_sum(e, a->d_x, e->cfg.H);
}

/* cpu_fwd_run for one row: embed, the layers, the final norm, the lm_head with the argmax, and
 * the argmax key read back into the slot's pinned word. */
void fc_record_token(fc_rank *e, const fc_slot *sl, bool forced)
{
    const qwen35_config *c = &e->cfg;
    fc_act *a = &e->a;
    gemv_embed_step(&e->w.embd, forced ? a->d_tokens : NULL, a->d_cursor, sl->d_best,
                    a->d_tok_out, sl->d_pos, a->d_x, &e->launch);
    for (int il = 0; il < c->n_layer; il++) {
        const fc_layer *L = &e->w.layers[il];
        rec_norm(e, L->d_attn_norm);
        if (L->gdn)
            rec_gdn(e, sl, L);
        else
            rec_attn(e, sl, L);
        gemv(&L->out, a->d_y, a->d_yq, a->d_x, residual_ep(e), &e->launch); /* residual */
        tp_sum(e, a->d_x, c->H);
        rec_norm(e, L->d_post_norm);
        rec_ffn(e, L);
    }
    rec_norm(e, e->w.d_out_norm);
    if (e->tp) { /* this rank's vocabulary rows, the others' zeros, summed: all the logits */
        cuda_memset_async(a->d_logits, 0, (size_t)c->V * 4, e->launch.stream);
        gemv(&e->w.head, a->d_h, a->d_hq, a->d_logits + e->vocab_begin, GEMV_STORE, &e->launch);
        tp_sum(e, a->d_logits, c->V);
        gemm_argmax_rows(a->d_logits, c->V, c->V, sl->d_best, 1, &e->launch);
    } else {
        gemv_argmax(&e->w.head, a->d_h, a->d_hq, a->d_logits, sl->d_best, &e->launch);
    }
    cuda_copy_d2h_async(sl->h_best, sl->d_best, 8, e->launch.stream);
}

/* run_rows of model/mtp.c for one row: u = eh_proj·[RMSNorm(e)·enorm ; RMSNorm(h)·hnorm], the
 * head's decoder layer on u (its KV the pool's MTP layer), g = RMSNorm(u)·head_norm and the
 * argmax of head·g. The embedding kernel takes the token and advances the position pair. */
void fc_record_mtp_row(fc_rank *e, int slot, const float *d_hin, bool forced, bool head)
{
    const qwen35_config *c = &e->cfg;
    fc_act *a = &e->a;
    fc_mtp *m = &e->mtp;
    const fc_layer *L = &m->layer;
    int32_t *in = m->d_in; /* position pair, cursor, token out, tokens */
    gemv_embed_step(&m->embd, forced ? in + 4 : NULL, in + 2, m->d_best, in + 3, in, a->d_x,
                    &e->launch);
    norm_rms(a->d_x, m->d_enorm, c->H, c->eps, m->d_cat, NULL, &e->launch);
    norm_rms(d_hin, m->d_hnorm, c->H, c->eps, m->d_cat + c->H, NULL, &e->launch);
    gemv_quantize_x(m->d_cat, m->d_catq, 2 * (int64_t)c->H, &e->launch);
    gemv(&m->eh_proj, m->d_cat, m->d_catq, a->d_x, GEMV_STORE, &e->launch);
    rec_norm(e, L->d_attn_norm);
    rec_attn_at(e, slot, in, L);
    gemv(&L->out, a->d_y, a->d_yq, a->d_x, GEMV_ADD, &e->launch);
    rec_norm(e, L->d_post_norm);
    rec_ffn(e, L);
    if (!head) return;
    norm_rms(a->d_x, m->d_head_norm, c->H, c->eps, m->d_g, a->d_hq, &e->launch);
    gemv_argmax(&m->head, m->d_g, a->d_hq, a->d_logits, m->d_best, &e->launch);
}

/* ---- the batched step: cpu_fwd_run for nb rows in runs of one slot (forward_cuda_batch.c) ----
 * The same sublayers on [nb][...] activations: the batched GEMM (kernels/cuda/gemm.h) for every
 * matrix, the rows kernels for the rest, each row's recurrent state and KV cache found by its
 * slot id (slot 0's view + slot id * slot stride). The DeltaNet conv runs after its GEMM
 * (gemv_conv's fusion is a GEMV epilogue), in place on the qkv columns. */

/* views of layer L's state in slot 0: the rows kernels add slot id * stride */
static float *slot0_conv(const fc_rank *e, const fc_layer *L)
{
    const qwen35_config *c = &e->cfg;
    return e->slots[0].d_conv + (int64_t)L->kind_index * c->C * (c->K_conv - 1);
}
static void *slot0_S(const fc_rank *e, const fc_layer *L)
{
    const qwen35_config *c = &e->cfg;
    return (uint8_t *)e->slots[0].d_S +
           (int64_t)L->kind_index * c->n_v * c->d_v * c->d_k * e->S_elem_bytes;
}

/* a pass of nb rows multiplies by gemv_cols (short passes: each weight block read once for
 * the pass, against the rows' Q8 forms) rather than the GEMM; a dense path asked for from so
 * few rows (--dense-rows) keeps them */
static bool recb_cols(const fc_rank *e, int nb)
{
    return e->b.cols && nb <= GEMV_MAX_COLS && !(e->dense.blas && nb >= e->dense.from);
}

/* where a kernel whose output a short pass's matrices read next writes its Q8 rows (the
 * rows kernels' d_y_q8): d_xq when the pass multiplies by gemv_cols and some matrix is
 * quantised (half_x), else NULL */
static void *recb_q8(const fc_rank *e, int nb)
{
    return recb_cols(e, nb) && e->b.half_x ? e->b.act.d_xq : NULL;
}

/* a pass of nb rows multiplies its Q4_K, Q5_K and Q6_K matrices on the int8 tensor cores
 * (recb_mma: this matrix of it) */
static bool recb_mma_pass(const fc_rank *e, int nb)
{
    return e->b.mma_from && nb >= e->b.mma_from && nb <= GEMV_MMA_ROWS &&
           !(e->dense.blas && nb >= e->dense.from);
}
static bool recb_mma(const fc_rank *e, int nb, uint32_t type)
{
    return recb_mma_pass(e, nb) && gemv_mma_supported(type);
}

/* the Q8_K rows gemv_mma reads in a pass of nb rows (recb_x_half writes them) */
static void *recb_mma_xq(const fc_rank *e, int nb)
{
    return recb_cols(e, nb) ? e->b.act.d_xqk : e->b.act.d_xq;
}

/* the GEMM's F16 rows of x (d_xh), read by the quantised matrices that multiply it next, and
 * for an mma pass its Q8_K rows (gemv_mma_quantize): in d_xq, or in d_xqk for a short pass,
 * whose d_xq holds the Q8 rows that the kernel that wrote x made for gemv_cols (recb_q8) */
static void recb_x_half(fc_rank *e, const float *x, int64_t ld, int64_t n, int nb)
{
    if (!recb_cols(e, nb) && e->b.half_x) gemm_x_half(x, ld, n, e->b.act.d_xh, nb, &e->launch);
    if (recb_mma_pass(e, nb)) gemv_mma_quantize(x, ld, recb_mma_xq(e, nb), n, nb, &e->launch);
}

/* y (+)= m·x for the nb rows: gemv_cols for a short pass; the dense path (gemm.h) from
 * dense.from rows for the quantised types; else the quantised GEMM, which reads x's F16 rows
 * d_xh when the type does */
static void recb_gemm(fc_rank *e, const gemv_matrix *m, const float *x, int64_t ld_x,
                      float *y, int64_t ld_y, gemv_epilogue ep, int nb)
{
    const fc_batch_act *a = &e->b.act;
    fc_dense *d = &e->dense;
    if (recb_cols(e, nb) && !recb_mma(e, nb, m->type)) {
        gemv_cols(m, x, ld_x, a->d_xq, y, ld_y, ep, nb, &e->launch);
        return;
    }
    if (recb_mma(e, nb, m->type)) {
        gemv_mma(m, recb_mma_xq(e, nb), y, ld_y, ep, nb, a->d_work, &e->launch);
        return;
    }
    if (d->blas && nb >= d->from && gemm_reads_half(m->type)) {
        DS_ASSERT(ep == GEMV_STORE || ep == GEMV_ADD);
        status st;
        const uint16_t *w16 = fc_dense_weights(e, m); /* resident, or dequantised now */
        if (!w16) gemm_dequant_half(m, d->d_w16, &e->launch);
        if (blas_gemm_f16(d->blas, m->n_out, nb, m->n_in, w16 ? w16 : d->d_w16, gemm_dense_ld(m),
                          a->d_xh, m->n_in, y, ld_y, ep == GEMV_ADD, e->launch.stream, &st)) {
            LOG_ERROR("cuda: %s", st.msg);
            d->failed = 1;
        }
        return;
    }
    gemm_rows(m, x, ld_x, a->d_xh, y, ld_y, ep, nb, a->d_work, &e->launch);
}

static void recb_in_proj(fc_rank *e, const fc_layer *L, int nb)
{
    const fc_batch *b = &e->b;
    for (int g = 0; g < L->n_in; g++)
        recb_gemm(e, &L->in[g].m, b->act.d_h, e->cfg.H, b->act.d_proj + L->in[g].y_off,
                  b->ld_proj, GEMV_STORE, nb);
}

/* prefill: the pass's long runs (s->long_runs) by the chunked rule, the other runs by the
 * row-by-row one; else (decode rows, or batch invariant) every run row by row, so a prompt's
 * results do not depend on how it was cut */
static void recb_gdn(fc_rank *e, const fc_layer *L, const fc_stage *s, bool prefill)
{
    const qwen35_config *c = &e->cfg;
    const fc_batch *b = &e->b;
    const fc_batch_act *a = &b->act;
    const int nb = s->nb;
    const int64_t D_v = (int64_t)c->n_v * c->d_v, stride = b->slot_stride / 4;
    const int64_t S_stride = b->slot_stride / e->S_elem_bytes; /* in S's elements */
    const int long_rows = prefill ? FC_LONG_RUN_ROWS : 0;
    recb_in_proj(e, L, nb);
    gdn_conv_runs(a->d_proj, b->ld_proj, L->d_conv_w, slot0_conv(e, L), stride, s->slots, s->runs,
                  s->keep, long_rows, c->C, c->K_conv, a->d_proj, b->ld_proj, nb, &e->launch);
    const float *z = a->d_proj + c->C, *beta = z + D_v, *alpha = beta + c->n_v;
    gdn_decode_runs(a->d_proj, b->ld_proj, beta, alpha, b->ld_proj, L->d_dt_bias, L->d_ssm_a,
                    c->n_k, c->n_v, c->d_k, c->d_v, c->eps, slot0_S(e, L), e->S_bf16, S_stride,
                    s->slots, s->runs, s->keep, long_rows, a->d_o, D_v, nb, &e->launch);
    if (prefill)
        gdn_chunk_runs(a->d_proj, b->ld_proj, beta, alpha, b->ld_proj, L->d_dt_bias, L->d_ssm_a,
                       c->n_k, c->n_v, c->d_k, c->d_v, c->eps, slot0_S(e, L), e->S_bf16,
                       S_stride, s->slots, s->runs, s->long_runs, a->d_o, D_v, nb, nb, FC_LONG_RUN_ROWS,
                       a->d_gdn_scratch, &e->launch);
    gdn_norm_gated_rows(a->d_o, D_v, z, b->ld_proj, L->d_ssm_norm, c->n_v, c->d_v, c->eps, a->d_y,
                        b->ld_y, recb_q8(e, nb), nb, &e->launch);
}

static void recb_attn(fc_rank *e, const fc_layer *L, const fc_stage *s, bool prefill)
{
    const qwen35_config *c = &e->cfg;
    const fc_batch *b = &e->b;
    const fc_batch_act *a = &b->act;
    const int nb = s->nb;
    const int64_t HA = (int64_t)c->n_h * c->d_h, KVA = (int64_t)c->n_kv * c->d_h;
    void *kc = fc_kv_layer(e, e->kv.d_k, L->kind_index);
    void *vc = fc_kv_layer(e, e->kv.d_v, L->kind_index);
    const int32_t *table = e->kv.d_table;
    const int ld = e->kv.ld;
    recb_in_proj(e, L, nb);
    const float *qg = a->d_proj, *k = qg + 2 * HA, *v = k + KVA;
    attn_prep_rows(qg, k, v, b->ld_proj, L->d_q_norm, L->d_k_norm, c->n_h, c->n_kv, c->d_h,
                   c->n_rot, c->rope_base, c->eps, s->pos, s->slots, table, ld, kc, vc, a->d_q,
                   HA, e->kv_type, nb, &e->launch);
    /* prompt chunks' rows in tiles (attn_prefill_runs), marked for attn_decode_rows to skip */
    const bool tiles = prefill && b->attn_tiles;
    if (tiles)
        attn_prefill_runs(a->d_q, HA, kc, vc, s->slots, table, ld, s->pos, s->runs, s->long_runs,
                          c->n_h, c->n_kv, c->d_h, e->n_ctx, a->d_part, nb, nb, FC_LONG_RUN_ROWS,
                          &e->launch);
    attn_decode_rows(a->d_q, HA, qg, b->ld_proj, kc, vc, s->slots, table, ld, s->pos,
                     tiles ? s->tile_rows : NULL, c->n_h, c->n_kv, c->d_h, e->n_ctx, a->d_part,
                     a->d_y, b->ld_y, recb_q8(e, nb), e->kv_type, nb, &e->launch);
}

/* one decoder layer on the pass's residual stream d_x */
static void recb_layer(fc_rank *e, const fc_layer *L, const fc_stage *s, bool prefill)
{
    const qwen35_config *c = &e->cfg;
    const fc_batch *b = &e->b;
    const fc_batch_act *a = &b->act;
    const cuda_launch *l = &e->launch;
    const int nb = s->nb;
    const int64_t H = c->H, F = c->F;
    norm_rms_rows(a->d_x, H, L->d_attn_norm, (int)H, c->eps, a->d_h, H, recb_q8(e, nb), nb, l);
    recb_x_half(e, a->d_h, H, H, nb);
    if (L->gdn)
        recb_gdn(e, L, s, prefill);
    else
        recb_attn(e, L, s, prefill);
    recb_x_half(e, a->d_y, b->ld_y, L->out.n_in, nb);
    recb_gemm(e, &L->out, a->d_y, b->ld_y, a->d_x, H, residual_ep(e), nb); /* residual */
    tp_sum(e, a->d_x, nb * H);
    norm_rms_rows(a->d_x, H, L->d_post_norm, (int)H, c->eps, a->d_h, H, recb_q8(e, nb), nb, l);
    recb_x_half(e, a->d_h, H, H, nb);
    if (recb_cols(e, nb) && L->gate.type == L->up.type &&
        !recb_mma(e, nb, L->gate.type)) {
        gemv_cols_swiglu(&L->gate, &L->up, a->d_h, H, a->d_xq, a->d_ffn, F, nb, l);
    } else {
        recb_gemm(e, &L->gate, a->d_h, H, a->d_gu, 2 * F, GEMV_STORE, nb);
        recb_gemm(e, &L->up, a->d_h, H, a->d_gu + F, 2 * F, GEMV_STORE, nb);
        gemm_swiglu_rows(a->d_gu, 2 * F, (int)F, a->d_ffn, F, nb, l);
    }
    if (recb_cols(e, nb) && gemm_reads_half(L->down.type))
        gemv_quantize_rows(a->d_ffn, F, a->d_xq, F, nb, l);
    recb_x_half(e, a->d_ffn, F, F, nb);
    recb_gemm(e, &L->down, a->d_ffn, F, a->d_x, H, residual_ep(e), nb);
    tp_sum(e, a->d_x, nb * H);
}

void fc_record_batch(fc_rank *e, const fc_stage *s, bool prefill)
{
    const qwen35_config *c = &e->cfg;
    const fc_batch *b = &e->b;
    gemv_embed_rows(&e->w.embd, s->tokens, s->slots, s->pos, e->slots[0].d_pos,
                    b->slot_stride / 4, b->act.d_x, c->H, s->nb, &e->launch);
    for (int il = 0; il < c->n_layer; il++) recb_layer(e, &e->w.layers[il], s, prefill);
}

/* run_rows of model/mtp.c for a pass of rows (their hidden inputs d_hin [nb][H]): the two norms
 * into the [nb][2H] rows of mtp.d_cat, eh_proj, the head's layer (its attention row by row:
 * attn_decode_rows) */
void fc_record_mtp_rows(fc_rank *e, const fc_stage *s, const float *d_hin)
{
    const qwen35_config *c = &e->cfg;
    const fc_batch_act *a = &e->b.act;
    const cuda_launch *l = &e->launch;
    const fc_mtp *m = &e->mtp;
    const int nb = s->nb;
    const int64_t H = c->H;
    gemv_embed_rows(&m->embd, s->tokens, s->slots, s->pos, NULL, 0, a->d_x, H, nb, l);
    norm_rms_rows(a->d_x, H, m->d_enorm, (int)H, c->eps, m->d_cat, 2 * H, NULL, nb, l);
    norm_rms_rows(d_hin, H, m->d_hnorm, (int)H, c->eps, m->d_cat + H, 2 * H, NULL, nb, l);
    if (recb_cols(e, nb) && gemm_reads_half(m->eh_proj.type))
        gemv_quantize_rows(m->d_cat, 2 * H, a->d_xq, 2 * H, nb, l);
    recb_x_half(e, m->d_cat, 2 * H, 2 * H, nb);
    recb_gemm(e, &m->eh_proj, m->d_cat, 2 * H, a->d_x, H, GEMV_STORE, nb);
    recb_layer(e, &m->layer, s, false);
}

/* The lm_head of nh = s->nb rows of the pass's residual stream, the rows s->head_rows[0, nh)
 * (those whose logits are read: sampled and eval rows), gathered by the final norm; logits and
 * argmax keys in rows [0, nh). */
void fc_record_head(fc_rank *e, const fc_stage *s)
{
    const qwen35_config *c = &e->cfg;
    const fc_batch_act *a = &e->b.act;
    const cuda_launch *l = &e->launch;
    const int nh = s->nb;
    const int64_t H = c->H;
    /* the graph's first kernel: a plain launch, as the body's embedding */
    const cuda_launch plain = {l->stream, false};
    norm_rms_gather(a->d_x, H, s->head_rows, e->w.d_out_norm, (int)H, c->eps, a->d_h, H,
                    recb_q8(e, nh), nh, &plain);
    recb_x_half(e, a->d_h, H, H, nh);
    if (e->tp) /* this rank's vocabulary columns, the others' zeros: summed, all the logits */
        cuda_memset_async(a->d_logits, 0, (size_t)nh * c->V * 4, l->stream);
    if (recb_mma(e, nh, e->w.head.type))
        gemv_mma(&e->w.head, recb_mma_xq(e, nh), a->d_logits + e->vocab_begin, c->V, GEMV_STORE, nh, a->d_work, l);
    else if (recb_cols(e, nh))
        gemv_cols(&e->w.head, a->d_h, H, a->d_xq, a->d_logits + e->vocab_begin, c->V, GEMV_STORE,
                  nh, l);
    else
        gemm_rows(&e->w.head, a->d_h, H, a->d_xh, a->d_logits + e->vocab_begin, c->V,
                  GEMV_STORE, nh, a->d_work, l);
    tp_sum(e, a->d_logits, (int64_t)nh * c->V);
    gemm_argmax_rows(a->d_logits, c->V, c->V, a->d_best, nh, l);
}
