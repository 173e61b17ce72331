/* The batched step's dense path (forward_cuda_impl.h fc_dense; kernels/cuda/gemm.h "Dense
 * path"): in buckets of dense.from rows or more the quantised matrices multiply as F16 through
 * cuBLAS, from F16 copies resident since create or dequantised matrix by matrix every pass into
 * one scratch. Never batch invariant: cuBLAS's sums depend on the rows. */
#include <stdlib.h>

#include "common/log.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/gemm.h"
#include "model/forward_cuda_impl.h"

/* layer L's quantised matrices, which the dense path multiplies (at most 4 + FC_MAX_GROUPS) */
static int layer_dense(const fc_layer *L, const gemv_matrix **out)
{
    const gemv_matrix *m[4 + FC_MAX_GROUPS] = {&L->out, &L->gate, &L->up, &L->down};
    int k = 4, n = 0;
    for (int g = 0; g < L->n_in; g++) m[k++] = &L->in[g].m;
    for (int i = 0; i < k; i++)
        if (gemm_reads_half(m[i]->type)) out[n++] = m[i];
    return n;
}

static int64_t dense_halves_of(const gemv_matrix *m) { return m->n_out * gemm_dense_ld(m); }

/* the largest F16 copy of a quantised layer matrix (halves: the per-pass scratch), and all of
 * them (bytes: the resident copies) */
static void dense_sizes(const fc_rank *e, int64_t *largest, uint64_t *total)
{
    *largest = 0, *total = 0;
    for (int il = 0; il < e->cfg.n_layer; il++) {
        const gemv_matrix *m[4 + FC_MAX_GROUPS];
        const int n = layer_dense(&e->w.layers[il], m);
        for (int i = 0; i < n; i++) {
            const int64_t h = dense_halves_of(m[i]);
            *largest = h > *largest ? h : *largest;
            *total += (uint64_t)h * 2;
        }
    }
}

static int64_t dense_halves(const fc_rank *e)
{
    int64_t largest;
    uint64_t total;
    dense_sizes(e, &largest, &total);
    return largest;
}

uint64_t fc_dense_bytes(const fc_rank *e)
{
    int64_t largest;
    uint64_t total;
    dense_sizes(e, &largest, &total);
    return total;
}

/* The F16 copies resident when they take at most half of the memory free after the weights
 * (the 27B's 54 GB do, the KV pool and the slots' state then share the rest;
 * fc_rank_opts.dense_per_pass); the state's sizing leaves them their room (with n_slots
 * given, upload falls back to per pass when they no longer fit). */
int fc_dense_decide(fc_rank *e, bool wanted, status *st)
{
    e->dense.resident = false;
    if (!wanted) return STATUS_OK;
    cuda_device_props p;
    if (cuda_device_props_get(e->device, &p, st)) return st->code;
    const uint64_t bytes = fc_dense_bytes(e);
    e->dense.resident = bytes > 0 && bytes <= p.mem_free_bytes / 2;
    LOG_INFO("cuda: dense path's F16 weights (%.2f GB): %s", bytes / 1e9,
             e->dense.resident ? "resident" : "dequantised every pass (over half of the free "
                                              "memory)");
    return STATUS_OK;
}

/* The first bucket on the dense path (0: none): from dense_rows_opt rows, or by default from 64
 * with resident F16 copies and from 128 when each pass dequantises (decode at 64 rows measured
 * 25-40% faster on the dense path with resident copies, and slower than the quantised GEMM with
 * per-pass ones). */
static int dense_from(const fc_rank *e)
{
    const int r = e->dense_rows_opt > 0 ? e->dense_rows_opt : e->dense.resident ? 64 : 128;
    return e->dense_rows_opt != 0 && !e->batch_invariant && r <= e->b.rows ? fc_pow2_ceil(r) : 0;
}

void fc_dense_plan(fc_rank *e) { e->dense.from = dense_from(e); }

void fc_dense_layout(fc_rank *e, fc_arena *a)
{
    fc_dense *d = &e->dense;
    if (!d->from) return;
    if (!d->resident) d->d_w16 = fc_arena_take(a, dense_halves(e) * 2);
    d->d_blas_ws = fc_arena_take(a, FC_BLAS_WS);
}

/* The resident F16 copies, dequantised on the device, when e->dense.resident and the plan has a
 * dense path; per pass instead (a scratch of the largest matrix) when they no longer fit. */
static int upload(fc_rank *e, status *st)
{
    fc_dense *d = &e->dense;
    if (!d->from || !d->resident) return STATUS_OK;
    cuda_device_props p;
    if (cuda_device_props_get(e->device, &p, st)) return st->code;
    if (p.mem_free_bytes < fc_dense_bytes(e) + (1ull << 30)) { /* given slots took the room */
        LOG_WARN("cuda: %.2f GB free: too little for the dense path's F16 weights (%.2f GB); "
                 "each pass dequantises", p.mem_free_bytes / 1e9, fc_dense_bytes(e) / 1e9);
        d->resident = false;
        d->from = dense_from(e);
        if (!d->from) return STATUS_OK;
        if (cuda_alloc(&d->d_alloc, (size_t)dense_halves(e) * 2, "the dense path's scratch", st))
            return st->code;
        d->d_w16 = d->d_alloc;
        return STATUS_OK;
    }
    const int cap = e->cfg.n_layer * (4 + FC_MAX_GROUPS);
    d->m = malloc((size_t)cap * sizeof *d->m);
    d->w = malloc((size_t)cap * sizeof *d->w);
    if (!d->m || !d->w) return status_fail(st, STATUS_NOMEM, "cuda: dense copies");
    int n = 0;
    for (int il = 0; il < e->cfg.n_layer; il++) n += layer_dense(&e->w.layers[il], d->m + n);
    if (cuda_alloc(&d->d_alloc, fc_dense_bytes(e), "the dense path's F16 weights", st))
        return st->code;
    uint16_t *at = d->d_alloc;
    const cuda_launch plain = {e->launch.stream, false};
    for (int i = 0; i < n; i++) {
        d->w[i] = at;
        gemm_dequant_half(d->m[i], at, &plain);
        at += dense_halves_of(d->m[i]);
    }
    d->n = n;
    return cuda_sync(e->launch.stream, "dense F16 weights", st);
}

int fc_dense_open(fc_rank *e, status *st)
{
    fc_dense *d = &e->dense;
    if (d->from && blas_open(d->d_blas_ws, FC_BLAS_WS, &d->blas, st)) {
        if (st->code != STATUS_UNAVAILABLE) return st->code;
        LOG_WARN("cuda: no dense GEMM (%s): every pass on the quantised GEMM", st->msg);
        d->from = 0;
        *st = (status){0};
    }
    return upload(e, st);
}

const uint16_t *fc_dense_weights(const fc_rank *e, const gemv_matrix *m)
{
    for (int i = 0; i < e->dense.n; i++)
        if (e->dense.m[i] == m) return e->dense.w[i];
    return NULL;
}

void fc_dense_destroy(fc_rank *e)
{
    fc_dense *d = &e->dense;
    blas_close(d->blas);
    d->blas = NULL;
    cuda_free(d->d_alloc);
    d->d_alloc = NULL;
    free(d->m);
    free(d->w);
    d->m = NULL, d->w = NULL, d->n = 0;
}
