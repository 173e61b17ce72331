/* The batched step of the CUDA forward (forward_cuda_impl.h fc_batch): the rows of a step run
 * together, one graph launch for up to the largest bucket of rows, every weight read once.
 *
 * Passes: a step's rows go in order, in passes of at most the largest bucket; a pass of n rows
 * runs a graph of the smallest bucket >= n (1, 2, 4, ..., rows), the rows past n padded with
 * the pad slot (outputs not read). Rows of one slot are consecutive: a run (one decode token, or
 * a prompt chunk). The DeltaNet conv and delta rule take the pass's runs (kernels/cuda/gdn.h
 * "Runs") and carry a run's state from row to row on chip; every other kernel computes each row
 * on its own (an attention row reads the KV cache up to its own position, which the pass's
 * attn_prep wrote first). So a prompt chunk of T tokens is one pass (prefill: every weight read
 * once for T tokens) and decode rows of other sequences share it. A bucket has two body graphs:
 * one for passes of decode rows only, one for passes with prompt chunks, whose runs of two or
 * more rows go through the chunked delta rule (gdn_chunk_runs) and, with an F16 cache, the tiled
 * attention (attn_prefill_runs) — unless batch invariant, when every run goes row by row. The
 * lm_head runs in a third graph, on the rows whose logits are read only (a run's sampled last
 * row, eval rows), gathered by the final norm: a prompt chunk's other rows cost no
 * vocabulary-wide GEMM. Before each pass one host-to-device copy stages its tokens, slots,
 * positions, runs, long runs, tiled rows and lm_head rows (fc_stage); after it, the argmax
 * keys of the lm_head rows come back (8 bytes each), each run's last row is sampled when asked,
 * eval rows copy their logits. Each pass has its own pinned staging, so the whole step still
 * costs one host sync.
 *
 * Batch invariance: each decode row's arithmetic is the same beside any other rows, so its
 * logits do not depend on the other rows; buckets of at most GEMV_MAX_COLS rows multiply by
 * gemv_cols (Q8 activations), larger ones by the GEMM (F16 activations), unless batch_invariant
 * (the GEMM at every size). A prompt chunk's
 * chunked rule depends on where its chunks start (equal to the row-by-row rule in exact
 * arithmetic); with fc_rank_opts.batch_invariant every run goes row by row, bit-identical
 * to the same tokens fed one per step. Steps of one decode row take the GEMV graphs (faster at
 * one row, other rounding) unless batch_invariant. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gemm.h"
#include "model/forward_cuda_host.h"
#include "model/forward_cuda_impl.h"

/* every matrix a batched pass multiplies: the layers', the lm_head, and the MTP head's (its
 * rows' passes, forward_cuda_mtp.c); *n of them into m (FC_MAX_MATRICES at most) */
#define FC_MAX_MATRICES (8 * (QWEN35_MAX_LAYERS + 1) + 2)
static void pass_matrices(const fc_rank *e, const gemv_matrix **m, int *n)
{
    int k = 0;
    for (int il = 0; il <= e->cfg.n_layer; il++) {
        const fc_layer *L = il < e->cfg.n_layer ? &e->w.layers[il] : &e->mtp.layer;
        if (il == e->cfg.n_layer && !e->mtp.on) break;
        for (int g = 0; g < L->n_in; g++) m[k++] = &L->in[g].m;
        m[k++] = &L->out, m[k++] = &L->gate, m[k++] = &L->up, m[k++] = &L->down;
    }
    m[k++] = &e->w.head;
    if (e->mtp.on) m[k++] = &e->mtp.eh_proj;
    DS_ASSERT(k <= FC_MAX_MATRICES);
    *n = k;
}

/* every such matrix in a layout the batched GEMM reads, or the first that is not */
static const gemv_matrix *unsupported_matrix(const fc_rank *e)
{
    const gemv_matrix *m[FC_MAX_MATRICES];
    int n;
    pass_matrices(e, m, &n);
    for (int i = 0; i < n; i++)
        if (!gemm_supported(m[i]->type, m[i]->n_in)) return m[i];
    return NULL;
}

/* every such matrix has gemv_cols' builds (short passes multiply by gemv_cols) */
static bool all_cols_planned(const fc_rank *e)
{
    const gemv_matrix *m[FC_MAX_MATRICES];
    int n;
    pass_matrices(e, m, &n);
    for (int i = 0; i < n; i++)
        if (!gemv_cols_planned(m[i])) return false;
    return true;
}

void fc_batch_plan(fc_rank *e)
{
    fc_batch *b = &e->b;
    const qwen35_config *c = &e->cfg;
    /* decode rows of every slot and prompt chunks: up to 256 rows a pass (the GEMM is compute
     * bound from there; longer steps take several passes) */
    const int want = e->max_rows < 256 ? e->max_rows : 256;
    b->rows = 0;
    if (want < 2 && !e->batch_invariant) {
        snprintf(b->why_not, sizeof b->why_not, "one row a step");
        return;
    }
    const gemv_matrix *u = unsupported_matrix(e);
    if (u) {
        snprintf(b->why_not, sizeof b->why_not, "the batched GEMM does not take type %u, %lld-wide rows",
                 u->type, (long long)u->n_in);
        return;
    }
    b->rows = fc_pow2_ceil(want);
    b->chunked = !e->batch_invariant;
    b->cols = !e->batch_invariant && all_cols_planned(e);
    b->mma_from = e->batch_invariant ? 0 : GEMV_MMA_FROM;
    b->attn_tiles = b->chunked && e->kv_type == ATTN_KV_F16;
    fc_dense_plan(e);
    b->n_buckets = 0;
    for (int nb = 1; nb <= b->rows; nb *= 2) b->bucket[b->n_buckets++] = nb;
    const int64_t D_v = (int64_t)c->n_v * c->d_v, HA = (int64_t)c->n_h * c->d_h;
    int64_t proj = c->C + D_v + 2 * c->n_v;
    const int64_t proj_attn = 2 * HA + 2 * (int64_t)c->n_kv * c->d_h;
    if (proj_attn > proj) proj = proj_attn;
    b->ld_proj = (proj + 31) / 32 * 32;
    b->ld_y = D_v > HA ? D_v : HA;
}

/* a matrix's split-K workspace at R rows: gemm_rows' or gemv_mma's */
static int64_t work_floats_of(const gemv_matrix *m, int R)
{
    const int64_t g = gemm_work_floats(m, R);
    const int64_t q = gemv_mma_work_floats(m, R < GEMV_MMA_ROWS ? R : GEMV_MMA_ROWS);
    return g > q ? g : q;
}

/* the largest split-K workspace of any matrix a pass multiplies, at R rows */
static int64_t work_floats(const fc_rank *e, int R)
{
    const gemv_matrix *m[FC_MAX_MATRICES];
    int n_m;
    pass_matrices(e, m, &n_m);
    int64_t w = 0;
    for (int i = 0; i < n_m; i++) {
        const int64_t f = work_floats_of(m[i], R);
        w = f > w ? f : w;
    }
    return w;
}

void fc_batch_layout(fc_rank *e, fc_arena *a)
{
    fc_batch *b = &e->b;
    fc_batch_act *x = &b->act;
    const qwen35_config *c = &e->cfg;
    if (!b->rows) return;
    const int64_t R = b->rows, D_v = (int64_t)c->n_v * c->d_v, HA = (int64_t)c->n_h * c->d_h;
    const uint64_t before = a->used;
    x->d_x = fc_arena_take(a, R * c->H * 4);
    x->d_h = fc_arena_take(a, R * c->H * 4);
    x->d_proj = fc_arena_take(a, R * b->ld_proj * 4);
    x->d_o = fc_arena_take(a, R * D_v * 4);
    x->d_y = fc_arena_take(a, R * b->ld_y * 4);
    x->d_gu = fc_arena_take(a, R * 2 * (int64_t)c->F * 4);
    x->d_ffn = fc_arena_take(a, R * (int64_t)c->F * 4);
    x->d_q = fc_arena_take(a, R * HA * 4);
    x->d_part = fc_arena_take(a, attn_partial_floats_rows(c->n_h, c->d_h, e->n_ctx, (int)R) * 4);
    x->d_logits = fc_arena_take(a, R * (int64_t)c->V * 4);
    x->d_work = fc_arena_take(a, work_floats(e, (int)R) * 4);
    int64_t xw = c->H > c->F ? c->H : c->F;
    xw = xw > b->ld_y ? xw : b->ld_y;
    if (e->mtp.on && 2 * (int64_t)c->H > xw) xw = 2 * (int64_t)c->H; /* the MTP's eh_proj */
    x->d_xh = fc_arena_take(a, R * xw * 2);
    const int64_t q8_rows = b->mma_from ? GEMV_MMA_ROWS : b->cols ? GEMV_MAX_COLS : 0;
    if (q8_rows) x->d_xq = fc_arena_take(a, (R < q8_rows ? R : q8_rows) * gemv_xq_bytes(xw));
    if (b->mma_from && b->cols && b->mma_from <= GEMV_MAX_COLS)
        x->d_xqk = fc_arena_take(a, (R < GEMV_MAX_COLS ? R : GEMV_MAX_COLS) * gemv_xq_bytes(xw));
    const gemv_matrix *m[FC_MAX_MATRICES];
    int n_m;
    pass_matrices(e, m, &n_m);
    b->half_x = false;
    for (int i = 0; i < n_m; i++) b->half_x |= gemm_reads_half(m[i]->type);
    int32_t *d_stage = fc_arena_take(a, FC_STAGE_INTS(R) * 4);
    for (int k = 0; d_stage && k < b->n_buckets; k++) /* not in the sizing pass */
        b->stage[k] = fc_stage_at(d_stage, b->rows, b->bucket[k]);
    x->d_best = fc_arena_take(a, R * 8);
    if (b->chunked && c->n_gdn_layers > 0)
        x->d_gdn_scratch =
            fc_arena_take(a, gdn_chunk_scratch_floats(c->n_v, c->d_k, c->d_v, (int)R,
                                                      FC_LONG_RUN_ROWS) * 4);
    fc_dense_layout(e, a);
    b->act_bytes = a->used - before;
}

int fc_batch_alloc_host(fc_rank *e, status *st)
{
    fc_batch *b = &e->b;
    if (!b->rows) return STATUS_OK;
    b->max_passes = (e->max_rows + b->rows - 1) / b->rows;
    const size_t bytes =
        8 * (size_t)e->max_rows + 4 * (size_t)FC_STAGE_INTS(b->rows) * b->max_passes;
    if (cuda_host_alloc(&b->h_pinned, bytes, "pinned batched step buffers", st)) return st->code;
    b->h_best = b->h_pinned;
    b->h_stage = (int32_t *)(b->h_best + e->max_rows);
    b->h_keep = malloc((size_t)e->max_rows * sizeof *b->h_keep);
    if (!b->h_keep) return status_fail(st, STATUS_NOMEM, "cuda: keep slots of a step");
    return STATUS_OK;
}

int fc_batch_capture(fc_rank *e, status *st)
{
    fc_batch *b = &e->b;
    if (!b->rows) return STATUS_OK;
    b->slot_stride = (int64_t)((uint8_t *)e->slots[1].d_conv - (uint8_t *)e->slots[0].d_conv);
    if (gemm_init(st) || gdn_chunk_init(st) || attn_prefill_init(st)) return st->code;
    if (fc_dense_open(e, st)) return st->code;
    e->launch.pdl = e->pdl;
    int rc = STATUS_OK;
    for (int k = 0; k < b->n_buckets && !rc; k++) {
        const fc_stage *s = &b->stage[k];
        rc = cuda_graph_capture_begin(e->launch.stream, st);
        if (!rc) fc_record_batch(e, s, false);
        if (!rc) rc = cuda_graph_capture_end(e->launch.stream, &b->g.body[k], NULL, st);
        if (!rc && b->chunked && s->nb > 1) {
            rc = cuda_graph_capture_begin(e->launch.stream, st);
            if (!rc) fc_record_batch(e, s, true);
            if (!rc) rc = cuda_graph_capture_end(e->launch.stream, &b->g.prefill[k], NULL, st);
        }
        if (!rc) rc = cuda_graph_capture_begin(e->launch.stream, st);
        if (!rc) fc_record_head(e, s);
        if (!rc) rc = cuda_graph_capture_end(e->launch.stream, &b->g.head[k], NULL, st);
    }
    e->launch.pdl = false;
    if (!rc) rc = cuda_check("batched graph capture", st);
    return rc;
}

void fc_batch_destroy(fc_rank *e)
{
    for (int k = 0; k < e->b.n_buckets; k++) {
        cuda_graph_exec_destroy(e->b.g.body[k]);
        cuda_graph_exec_destroy(e->b.g.prefill[k]);
        cuda_graph_exec_destroy(e->b.g.head[k]);
    }
    cuda_host_free(e->b.h_pinned);
    free(e->b.h_keep);
}

/* rows[0 .. n) (the step's rows i0 ..) as one pass: their tokens, slots, positions, runs and
 * lm_head rows staged in h_stage (one pass's staging buffer) and copied to the device in one
 * piece, the body graph of
 * the smallest bucket >= n, then, when some row's logits are read, the lm_head graph of the
 * smallest bucket >= those rows; their argmax keys back into h_best[0 ..), head[i] = row i's
 * lm_head row (-1: none). Each row's bookkeeping, logits copy and sampler are enqueued behind
 * the graphs. */
static int run_pass(fc_rank *e, fwd_row *rows, int i0, int n, const int32_t *keep,
                    int32_t *h_stage, unsigned long long *h_best, int *head, status *st)
{
    fc_batch *b = &e->b;
    const int V = e->cfg.V;
    fc_pass_info in;
    fc_stage_pass(rows, n, b->bucket, b->n_buckets, e->n_slots, b->attn_tiles, keep, h_stage,
                  head, &in);
    const int k = in.k, kh = in.kh, nh = in.nh;
    const size_t staged = (size_t)in.staged_ints * 4;
    cuda_copy_h2d_async(b->stage[k].head_rows, h_stage, staged, e->launch.stream);
    /* passes with prompt chunks take the graph with their kernels; decode rows the other */
    cuda_graph_exec body = b->chunked && in.n_long > 0 ? b->g.prefill[k] : b->g.body[k];
    if (cuda_graph_launch(body, e->launch.stream) ||
        (nh && cuda_graph_launch(b->g.head[kh], e->launch.stream)))
        return cuda_check("cudaGraphLaunch (batch)", st);
    if (nh) cuda_copy_d2h_async(h_best, b->act.d_best, (size_t)nh * 8, e->launch.stream);
    e->stats.graph_launches += 1 + (nh > 0);
    e->stats.h2d_bytes += staged;
    e->stats.d2h_bytes += (uint64_t)nh * 8;
    for (int j = 0; j < n; j++) {
        fwd_row *r = &rows[j];
        fc_slot *sl = &e->slots[r->slot];
        const float *d_logits = b->act.d_logits + (int64_t)(head[j] >= 0 ? head[j] : 0) * V;
        sl->n_past++;
        sl->chain_ok = false;
        e->stats.tokens++;
        if (r->logits) { /* eval and tests: a pageable copy, not the serving path */
            cuda_copy_d2h_async(r->logits, d_logits, (size_t)V * 4, e->launch.stream);
            e->stats.d2h_bytes += (uint64_t)V * 4;
        }
        if (r->hidden) /* the final norm's output: the head's gathered row */
            fc_hidden_copy(e, i0 + j, b->act.d_h + (int64_t)head[j] * e->cfg.H);
        if (r->verify && !sl->greedy && sl->sampler) { /* each row of a sampled run draws */
            sample_run_row(sl->sampler, d_logits, fc_verify_row(sl, r), &e->launch);
            continue;
        }
        if (j + 1 < n && rows[j + 1].slot == r->slot) continue; /* not the run's last */
        int j0 = j;
        while (j0 > 0 && rows[j0 - 1].slot == r->slot) j0--;
        if (fc_sample_run(e, rows, j0, j + 1, d_logits, st)) return st->code;
    }
    return STATUS_OK;
}

/* verify runs go row by row (gdn_decode_runs keeps their states), never the chunked rule */
_Static_assert(FWD_MAX_VERIFY_ROWS < FC_LONG_RUN_ROWS, "a verify run is a short run");
_Static_assert(FWD_MAX_VERIFY_ROWS <= SAMPLE_MAX_ROWS, "a sampled verify run's rows draw apart");

/* The step's verify runs (docs/GPU.md "Verify runs"), before any row runs: each run's rows but
 * the last get keep slots in b->h_keep (the rest -1) and its slot's record; refused: a sampled
 * sequence's run without the GPU sampler or with penalties, more runs than the keep slots
 * hold. */
static int plan_keeps(fc_rank *e, const fwd_row *rows, int B, status *st)
{
    int32_t *keep = e->b.h_keep;
    int next = 0, runs = 0;
    for (int i = 0; i < B;) {
        int j = i + 1;
        while (j < B && rows[j].slot == rows[i].slot) j++;
        for (int x = i; x < j; x++) keep[x] = -1;
        fc_slot *sl = &e->slots[rows[i].slot];
        if (rows[i].verify) {
            if (!sl->greedy && fc_samples(e) &&
                (!sl->sampler || !sampling_params_no_penalty(&sl->params)))
                return status_fail(st, STATUS_UNSUPPORTED, "row %d: slot %d: cuda verify runs "
                                   "take greedy sequences, and sampled ones without penalties on "
                                   "the GPU sampler", i, rows[i].slot);
            if (next + j - i - 1 > e->n_keep)
                return status_fail(st, STATUS_RANGE, "row %d: verify run %d of the step: the "
                                   "forward keeps the states of %d runs of %d rows", i, runs + 1,
                                   e->verify_runs, e->verify_rows);
            sl->v_first = rows[i].pos;
            sl->v_len = j - i;
            sl->v_keep = e->n_slots + 1 + next;
            sl->v_sstep = sl->sampler ? sample_step(sl->sampler) : 0;
            for (int x = i; x + 1 < j; x++) keep[x] = e->n_slots + 1 + next++;
            runs++;
        }
        i = j;
    }
    return STATUS_OK;
}

int fc_batch_step(fc_rank *e, fwd_row *rows, int B, status *st)
{
    fc_batch *b = &e->b;
    int head[B];
    if (plan_keeps(e, rows, B, st)) return st->code;
    for (int i = 0, p = 0; i < B; i += b->rows, p++) { /* passes of at most the largest bucket */
        const int m = B - i < b->rows ? B - i : b->rows;
        DS_ASSERT(p < b->max_passes);
        if (run_pass(e, rows + i, i, m, b->h_keep + i,
                     b->h_stage + (size_t)p * FC_STAGE_INTS(b->rows), b->h_best + i, head + i,
                     st))
            return st->code;
    }
    if (cuda_sync(e->launch.stream, "step", st)) return st->code;
    e->stats.steps++;
    fc_hidden_out(e, rows, B);
    for (int i = 0; i < B; i++) /* the verify runs' records name this step */
        if (rows[i].verify) e->slots[rows[i].slot].v_step = e->stats.steps;
    for (int i = 0; i < B; i++) {
        const fc_slot *sl = &e->slots[rows[i].slot];
        if (!rows[i].sample || head[i] < 0 || !(sl->greedy || sl->sampler)) continue;
        const unsigned long long key = b->h_best[i - (i % b->rows) + head[i]]; /* its pass's */
        if (fc_read_sample(e, &rows[i], gemv_argmax_row(key), st)) return st->code;
    }
    return STATUS_OK;
}
