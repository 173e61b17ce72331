/* The batched step of the CUDA forward (forward_cuda_impl.h fc_batch): the rows of a step whose
 * slots are distinct run together, one graph launch for all of them, every weight read once.
 *
 * Rounds: rows of one slot are consecutive in a step (a prompt chunk); round k takes the k-th
 * row of every slot's run, so each round has distinct slots and a slot's rows stay in order.
 * A round of n rows runs the graph of the smallest bucket >= n (1, 2, 4, ..., rows), the rows
 * past n padded with the pad slot (its state absorbs them; their outputs are not read). Before
 * each round one host-to-device copy stages its tokens, slots and positions; after it, its
 * argmax keys are copied back, its sampled rows sampled, its logits copied for eval. Each round
 * has its own pinned staging, so the whole step still costs one host sync.
 *
 * Batch invariance: the batched GEMM and the rows kernels compute each row on its own in a fixed
 * order, so a row's logits do not depend on the bucket or on the other rows. Batch-1 steps take
 * the GEMV graphs (faster at one row, other rounding) unless qwen35_cuda_opts.batch_invariant. */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/gemm.h"
#include "model/forward_cuda_impl.h"

static int pow2_ceil(int n)
{
    int p = 1;
    while (p < n) p *= 2;
    return p;
}

/* every matrix of the model in a layout the batched GEMM reads, or the first that is not */
static const gemv_matrix *unsupported_matrix(const qwen35_cuda *e)
{
    for (int il = 0; il < e->cfg.n_layer; il++) {
        const fc_layer *L = &e->w.layers[il];
        for (int g = 0; g < L->n_in; g++)
            if (!gemm_supported(L->in[g].m.type, L->in[g].m.n_in)) return &L->in[g].m;
        const gemv_matrix *m[4] = {&L->out, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 4; i++)
            if (!gemm_supported(m[i]->type, m[i]->n_in)) return m[i];
    }
    if (!gemm_supported(e->w.head.type, e->w.head.n_in)) return &e->w.head;
    return NULL;
}

void fc_batch_plan(qwen35_cuda *e)
{
    fc_batch *b = &e->b;
    const qwen35_config *c = &e->cfg;
    int want = e->n_slots < e->max_rows ? e->n_slots : e->max_rows;
    if (want > 256) want = 256;
    b->rows = 0;
    if (e->n_slots < 2 && !e->batch_invariant) {
        snprintf(b->why_not, sizeof b->why_not, "one slot");
        return;
    }
    const gemv_matrix *u = unsupported_matrix(e);
    if (u) {
        snprintf(b->why_not, sizeof b->why_not, "the batched GEMM does not take type %u, %lld-wide rows",
                 u->type, (long long)u->n_in);
        return;
    }
    b->rows = pow2_ceil(want);
    b->n_buckets = 0;
    for (int nb = 1; nb <= b->rows; nb *= 2) b->bucket[b->n_buckets++] = nb;
    const int64_t D_v = (int64_t)c->n_v * c->d_v, HA = (int64_t)c->n_h * c->d_h;
    int64_t proj = c->C + D_v + 2 * c->n_v;
    const int64_t proj_attn = 2 * HA + 2 * (int64_t)c->n_kv * c->d_h;
    if (proj_attn > proj) proj = proj_attn;
    b->ld_proj = (proj + 31) / 32 * 32;
    b->ld_y = D_v > HA ? D_v : HA;
}

/* the largest split-K workspace of any matrix at R rows */
static int64_t work_floats(const qwen35_cuda *e, int R)
{
    int64_t w = 0;
    for (int il = 0; il < e->cfg.n_layer; il++) {
        const fc_layer *L = &e->w.layers[il];
        for (int g = 0; g < L->n_in; g++) {
            const int64_t f = gemm_work_floats(&L->in[g].m, R);
            w = f > w ? f : w;
        }
        const gemv_matrix *m[4] = {&L->out, &L->gate, &L->up, &L->down};
        for (int i = 0; i < 4; i++) {
            const int64_t f = gemm_work_floats(m[i], R);
            w = f > w ? f : w;
        }
    }
    const int64_t f = gemm_work_floats(&e->w.head, R);
    return f > w ? f : w;
}

void fc_batch_layout(qwen35_cuda *e, fc_arena *a)
{
    fc_batch *b = &e->b;
    const qwen35_config *c = &e->cfg;
    if (!b->rows) return;
    const int64_t R = b->rows, D_v = (int64_t)c->n_v * c->d_v, HA = (int64_t)c->n_h * c->d_h;
    const uint64_t before = a->used;
    b->d_x = fc_arena_take(a, R * c->H * 4);
    b->d_h = fc_arena_take(a, R * c->H * 4);
    b->d_proj = fc_arena_take(a, R * b->ld_proj * 4);
    b->d_o = fc_arena_take(a, R * D_v * 4);
    b->d_y = fc_arena_take(a, R * b->ld_y * 4);
    b->d_gu = fc_arena_take(a, R * 2 * (int64_t)c->F * 4);
    b->d_ffn = fc_arena_take(a, R * (int64_t)c->F * 4);
    b->d_q = fc_arena_take(a, R * HA * 4);
    b->d_part = fc_arena_take(a, attn_partial_floats_rows(c->n_h, c->d_h, e->n_ctx, (int)R) * 4);
    b->d_logits = fc_arena_take(a, R * (int64_t)c->V * 4);
    b->d_work = fc_arena_take(a, work_floats(e, (int)R) * 4);
    int64_t xw = c->H > c->F ? c->H : c->F;
    xw = xw > b->ld_y ? xw : b->ld_y;
    b->d_xh = fc_arena_take(a, R * xw * 2);
    b->half_x = gemm_reads_half(e->w.head.type);
    for (int il = 0; il < c->n_layer; il++) {
        const fc_layer *L = &e->w.layers[il];
        for (int g = 0; g < L->n_in; g++) b->half_x |= gemm_reads_half(L->in[g].m.type);
        b->half_x |= gemm_reads_half(L->out.type) || gemm_reads_half(L->gate.type) ||
                     gemm_reads_half(L->up.type) || gemm_reads_half(L->down.type);
    }
    b->d_rows = fc_arena_take(a, 3 * R * 4);
    b->d_best = fc_arena_take(a, R * 8);
    b->act_bytes = a->used - before;
}

int fc_batch_capture(qwen35_cuda *e, status *st)
{
    fc_batch *b = &e->b;
    if (!b->rows) return STATUS_OK;
    b->slot_stride = (int64_t)((uint8_t *)e->slots[1].d_conv - (uint8_t *)e->slots[0].d_conv);
    if (gemm_init(st)) return st->code;
    e->launch.pdl = e->pdl;
    int rc = STATUS_OK;
    for (int i = 0; i < b->n_buckets && !rc; i++) {
        rc = cuda_graph_capture_begin(e->launch.stream, st);
        if (!rc) fc_record_batch(e, b->bucket[i]);
        if (!rc) rc = cuda_graph_capture_end(e->launch.stream, &b->graph[i], NULL, st);
    }
    e->launch.pdl = false;
    if (!rc) rc = cuda_check("batched graph capture", st);
    return rc;
}

void fc_batch_destroy(qwen35_cuda *e)
{
    for (int i = 0; i < e->b.n_buckets; i++) cuda_graph_exec_destroy(e->b.graph[i]);
}

/* rows [i0, i0 + n) of round's list idx[] as one bucket launch; h_rows / h_best: this round's
 * pinned staging */
static int run_round(qwen35_cuda *e, qwen35_cuda_row *rows, const int *idx, int n, int32_t *h_rows,
                     unsigned long long *h_best, status *st)
{
    fc_batch *b = &e->b;
    int k = 0;
    while (b->bucket[k] < n) k++;
    const int nb = b->bucket[k], V = e->cfg.V;
    for (int j = 0; j < nb; j++) {
        const bool real = j < n;
        const qwen35_cuda_row *r = real ? &rows[idx[j]] : NULL;
        h_rows[j] = real ? r->token : 0;
        h_rows[nb + j] = real ? r->slot : e->n_slots; /* the pad slot */
        h_rows[2 * nb + j] = real ? r->pos : 0;
    }
    cuda_copy_h2d_async(b->d_rows, h_rows, (size_t)nb * 12, e->launch.stream);
    if (cuda_graph_launch(b->graph[k], e->launch.stream)) return cuda_check("cudaGraphLaunch (batch)", st);
    cuda_copy_d2h_async(h_best, b->d_best, (size_t)n * 8, e->launch.stream);
    e->stats.graph_launches++;
    e->stats.h2d_bytes += (uint64_t)nb * 12;
    e->stats.d2h_bytes += (uint64_t)n * 8;
    for (int j = 0; j < n; j++) {
        qwen35_cuda_row *r = &rows[idx[j]];
        fc_slot *sl = &e->slots[r->slot];
        const float *d_logits = b->d_logits + (int64_t)j * V;
        sl->n_past++;
        sl->chain_ok = false;
        e->stats.tokens++;
        if (r->logits) { /* eval and tests: a pageable copy, not the serving path */
            cuda_copy_d2h_async(r->logits, d_logits, (size_t)V * 4, e->launch.stream);
            e->stats.d2h_bytes += (uint64_t)V * 4;
        }
        fc_accept_rows(e, rows, idx[j], idx[j] + 1);
        if (r->sample && !sl->greedy && sl->sampler) sample_run(sl->sampler, d_logits, &e->launch);
        if (r->sample && !sl->greedy && !sl->sampler && fc_sample_on_host(e, r, d_logits, st))
            return st->code;
    }
    return STATUS_OK;
}

int fc_batch_step(qwen35_cuda *e, qwen35_cuda_row *rows, int B, status *st)
{
    fc_batch *b = &e->b;
    /* runs of one slot: start and length, in step order */
    int start[B], len[B], n_runs = 0, max_len = 0;
    for (int i = 0; i < B;) {
        int j = i + 1;
        while (j < B && rows[j].slot == rows[i].slot) j++;
        start[n_runs] = i;
        len[n_runs++] = j - i;
        if (j - i > max_len) max_len = j - i;
        i = j;
    }
    int idx[B], best_of[B];
    int32_t *h_rows = b->h_rows;
    unsigned long long *h_best = b->h_best;
    for (int k = 0; k < max_len; k++) {
        int n = 0;
        for (int s = 0; s < n_runs; s++)
            if (len[s] > k) idx[n++] = start[s] + k;
        for (int off = 0; off < n; off += b->rows) { /* more slots than the largest bucket */
            const int m = n - off < b->rows ? n - off : b->rows;
            for (int j = 0; j < m; j++) best_of[idx[off + j]] = (int)(h_best - b->h_best) + j;
            if (run_round(e, rows, idx + off, m, h_rows, h_best, st)) return st->code;
            h_rows += 3 * pow2_ceil(m);
            h_best += m;
        }
    }
    if (cuda_sync(e->launch.stream, "step", st)) return st->code;
    e->stats.steps++;
    for (int i = 0; i < B; i++) {
        const fc_slot *sl = &e->slots[rows[i].slot];
        if (!rows[i].sample || !(sl->greedy || sl->sampler)) continue;
        if (fc_read_sample(e, &rows[i], gemv_argmax_row(b->h_best[best_of[i]]), st)) return st->code;
    }
    return STATUS_OK;
}
