/* The CUDA forward behind model/fwd.h (forward_cuda_fwd.h): the rows passed through, one
 * rank (qwen35_cuda) or several (qwen35_cuda_tp), and the kv_pool that mirrors the forward's
 * own block allocator. */
#include "model/forward_cuda_fwd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_device.h"
#include "model/forward_cuda.h"
#include "model/forward_cuda_tp.h"

typedef struct cuda_forward {
    fwd base;
    qwen35_cuda *e;         /* rank 0's forward (owned by tp when tp) */
    qwen35_cuda_tp *tp;     /* owned: ranks > 1, else NULL */
} cuda_forward;

static int cuda_seq_start(fwd *f, int slot, const sampling_params *p, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    int rc = c->tp ? qwen35_cuda_tp_seq_start(c->tp, slot, p, st) : qwen35_cuda_seq_start(c->e, slot, p, st);
    if (rc) return rc;
    kv_pool_release(f->kv, slot); /* the forward released the slot's blocks too */
    f->n_past[slot] = 0;
    return STATUS_OK;
}

static void cuda_seq_end(fwd *f, int slot)
{
    cuda_forward *c = (cuda_forward *)f;
    if (c->tp)
        qwen35_cuda_tp_seq_end(c->tp, slot);
    else
        qwen35_cuda_seq_end(c->e, slot);
    kv_pool_release(f->kv, slot);
}

/* The rows' ids, slots and positions (the forward checks them again; here before the pool
 * moves), then the blocks of each run's last position, all or none. */
static int take_blocks(cuda_forward *c, const fwd_row *rows, int n, status *st)
{
    fwd *f = &c->base;
    if (n < 1 || n > f->max_rows)
        return status_fail(st, STATUS_RANGE, "cuda forward: a step of %d rows (1..%d)", n, f->max_rows);
    uint64_t need = 0;
    for (int i = 0; i < n; i++) {
        const fwd_row *r = &rows[i];
        if (r->token < 0 || r->token >= f->vocab || r->slot < 0 || r->slot >= f->n_slots)
            return status_fail(st, STATUS_RANGE, "row %d: token %d / slot %d out of range", i,
                               r->token, r->slot);
        const bool cont = i > 0 && rows[i - 1].slot == r->slot;
        const int want = cont ? rows[i - 1].pos + 1 : f->n_past[r->slot];
        if (r->pos != want || r->pos >= f->n_ctx)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d at position %d, expected %d "
                               "(context %d)", i, r->slot, r->pos, want, f->n_ctx);
        if (i == n - 1 || rows[i + 1].slot != r->slot)
            need += kv_pool_need(f->kv, r->slot, (int64_t)r->pos + 1);
    }
    if (need > kv_pool_free_blocks(f->kv))
        return status_fail(st, STATUS_EXHAUSTED, "cuda forward: the step needs %llu KV blocks, %u free",
                           (unsigned long long)need, kv_pool_free_blocks(f->kv));
    for (int i = 0; i < n; i++)
        if ((i == n - 1 || rows[i + 1].slot != rows[i].slot) &&
            kv_pool_ensure(f->kv, rows[i].slot, (int64_t)rows[i].pos + 1, st))
            return st->code;
    return STATUS_OK;
}

static int cuda_step(fwd *f, fwd_row *rows, int n, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (take_blocks(c, rows, n, st)) return st->code;
    int rc = c->tp ? qwen35_cuda_tp_step(c->tp, rows, n, st) : qwen35_cuda_step(c->e, rows, n, st);
    for (int i = 0; i < n; i++) f->n_past[rows[i].slot] = qwen35_cuda_n_past(c->e, rows[i].slot);
    return rc;
}

static int cuda_fill(fwd *f, int slot, int n_past, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    int rc = c->tp ? qwen35_cuda_tp_fill(c->tp, slot, n_past, st) : qwen35_cuda_fill(c->e, slot, n_past, st);
    if (rc) return rc;
    /* the forward holds blocks for positions 0 .. n_past (the next token's too) */
    kv_pool_release(f->kv, slot);
    if (kv_pool_ensure(f->kv, slot, (int64_t)n_past + 1, st)) return st->code;
    f->n_past[slot] = n_past;
    return STATUS_OK;
}

static void cuda_get_stats(const fwd *f, fwd_stats *out)
{
    qwen35_cuda_stats s;
    qwen35_cuda_get_stats(((const cuda_forward *)f)->e, &s);
    *out = (fwd_stats){.tokens = s.tokens, .steps = s.steps, .graph_launches = s.graph_launches,
                       .kernels_per_token = s.kernels_per_token, .d2h_bytes = s.d2h_bytes,
                       .h2d_bytes = s.h2d_bytes, .weight_bytes = s.weight_bytes,
                       .state_bytes = s.state_bytes, .bytes_per_token = s.bytes_per_token};
}

static void cuda_destroy(fwd *f)
{
    cuda_forward *c = (cuda_forward *)f;
    if (!c) return;
    if (c->tp)
        qwen35_cuda_tp_destroy(c->tp);
    else
        qwen35_cuda_destroy(c->e);
    kv_pool_destroy(f->kv);
    free(f->n_past);
    free(c);
}

static const fwd_vt cuda_vt = {
    .seq_start = cuda_seq_start,
    .seq_end = cuda_seq_end,
    .step = cuda_step,
    .fill = cuda_fill,
    .get_stats = cuda_get_stats,
    .destroy = cuda_destroy,
};

static void device_name(cuda_forward *c, int ranks)
{
    fwd *f = &c->base;
    if (!c->tp) {
        snprintf(f->device, sizeof f->device, "cuda:%d %s", qwen35_cuda_device_index(c->e),
                 qwen35_cuda_device_name(c->e));
        return;
    }
    int at = snprintf(f->device, sizeof f->device, "cuda:");
    for (int r = 0; r < ranks && at < (int)sizeof f->device; r++)
        at += snprintf(f->device + at, sizeof f->device - (size_t)at, "%s%d", r ? "," : "",
                       qwen35_cuda_device_index(qwen35_cuda_tp_rank(c->tp, r)));
    if (at < (int)sizeof f->device)
        snprintf(f->device + at, sizeof f->device - (size_t)at, " %s, tensor parallel %d",
                 qwen35_cuda_device_name(c->e), ranks);
}

static int cuda_create(const qwen35_model *m, const fwd_opts *o, fwd **out, status *st)
{
    *out = NULL;
    if (o->n_slots < 0 || o->n_ctx < 1 || o->max_rows < 0 || o->ranks < 0 || o->ranks > FWD_MAX_RANKS ||
        o->n_devices < 0 || o->n_devices > FWD_MAX_RANKS)
        return status_fail(st, STATUS_INVALID, "cuda forward: slots %d, ctx %d, rows %d, ranks %d, "
                           "%d devices", o->n_slots, o->n_ctx, o->max_rows, o->ranks, o->n_devices);
    if (o->kv_block_tokens && o->kv_block_tokens != 64)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda forward: KV blocks of %d positions (the "
                           "kernels' are 64)", o->kv_block_tokens);
    const int ranks = o->ranks > 1 ? o->ranks : 1;
    if (o->n_devices && o->n_devices != ranks)
        return status_fail(st, STATUS_INVALID, "cuda forward: %d devices for %d ranks", o->n_devices, ranks);
    cuda_forward *c = calloc(1, sizeof *c);
    if (!c) return status_fail(st, STATUS_NOMEM, "cuda forward: out of memory");
    fwd *f = &c->base;
    f->vt = &cuda_vt;
    f->model = m;
    f->n_ctx = o->n_ctx;
    f->vocab = m->cfg.V;
    f->ranks = ranks;
    const qwen35_cuda_opts co = {.n_ctx = o->n_ctx, .n_slots = o->n_slots, .max_rows = o->max_rows,
                                 .device = o->n_devices ? o->devices[0] : 0,
                                 .batch_invariant = o->batch_invariant, .dense_rows = o->dense_rows,
                                 .dense_per_pass = o->dense_per_pass, .kv_blocks = o->kv_blocks};
    int rc;
    if (ranks > 1) { /* one rank per GPU: the listed ones, or 0 .. ranks-1 */
        int devs[FWD_MAX_RANKS];
        for (int r = 0; r < ranks; r++) devs[r] = o->n_devices ? o->devices[r] : r;
        if ((rc = qwen35_cuda_tp_create(m, ranks, devs, &co, &c->tp, st))) goto fail;
        c->e = qwen35_cuda_tp_rank(c->tp, 0);
    } else if ((rc = qwen35_cuda_create(m, &co, &c->e, st))) {
        goto fail;
    }
    f->n_slots = qwen35_cuda_n_slots(c->e);
    f->max_rows = qwen35_cuda_max_rows(c->e);
    f->pass_rows = qwen35_cuda_pass_rows(c->e);
    int bt = 0;
    const int n_blocks = qwen35_cuda_kv_blocks(c->e, &bt);
    f->n_past = calloc((size_t)f->n_slots, sizeof *f->n_past);
    if (!f->n_past) {
        rc = status_fail(st, STATUS_NOMEM, "cuda forward: %d rows", f->max_rows);
        goto fail;
    }
    if ((rc = kv_pool_create(&(kv_pool_opts){.n_seqs = f->n_slots, .block_tokens = bt,
                                             .n_blocks = n_blocks,
                                             .max_blocks_per_seq = (f->n_ctx + bt - 1) / bt},
                             &f->kv, st)))
        goto fail;
    qwen35_cuda_stats s;
    qwen35_cuda_get_stats(c->e, &s);
    f->state_bytes = s.state_bytes / (uint64_t)(f->n_slots + 1);
    device_name(c, ranks);
    *out = f;
    return STATUS_OK;
fail:
    cuda_destroy(f);
    return rc;
}

const fwd_backend fwd_backend_cuda = {.name = "cuda", .create = cuda_create,
                                      .device_count = cuda_device_count};
