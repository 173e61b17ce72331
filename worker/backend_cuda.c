/* The CUDA backend (worker/backend.h) over the CUDA forward (model/forward_cuda.h): a step's
 * items become rows (one per token: decode items one row, prefill chunks a run of rows, one per
 * prompt token), run as one forward step with one host sync; the forward samples each item's last
 * row on the GPU (the greedy argmax inside the step graph, or the GPU sampler behind it).
 * Twin of backend_cpu.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "model/forward_cuda.h"
#include "model/forward_cuda_tp.h"
#include "worker/backend.h"

typedef struct cuda_worker {
    worker_backend base;
    qwen35_cuda *fwd;     /* owned; with tp, rank 0's (owned by tp) */
    qwen35_cuda_tp *tp;   /* owned: tensor parallel, or NULL */
    qwen35_cuda_row *rows; /* owned, [max_rows] */
    worker_batch_item **row_item; /* owned, [max_rows]: the item a sampled row answers */
    int max_rows;
} cuda_worker;

static int cw_seq_start(worker_backend *b, int slot, const sampling_params *p, status *st)
{
    cuda_worker *c = (cuda_worker *)b;
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    return c->tp ? qwen35_cuda_tp_seq_start(c->tp, slot, p, st)
                 : qwen35_cuda_seq_start(c->fwd, slot, p, st);
}

/* Runs rows[0..n) and hands each sampled row's result to its item. */
static int cw_flush(cuda_worker *c, int n, status *st)
{
    if (!n) return STATUS_OK;
    if (c->tp ? qwen35_cuda_tp_step(c->tp, c->rows, n, st) : qwen35_cuda_step(c->fwd, c->rows, n, st))
        return st->code;
    for (int i = 0; i < n; i++) {
        const qwen35_cuda_row *r = &c->rows[i];
        worker_batch_item *it = c->row_item[i];
        if (!it) continue;
        it->token = r->next;
        it->logprob = r->logprob;
        it->n_top = r->n_top;
        for (int k = 0; k < r->n_top; k++) {
            it->top[k].id = r->top_id[k];
            it->top[k].logprob = r->top_logprob[k];
        }
    }
    return STATUS_OK;
}

static int cw_step(worker_backend *b, worker_batch_item *items, int n, status *st)
{
    cuda_worker *c = (cuda_worker *)b;
    int nr = 0;
    for (int i = 0; i < n; i++) {
        worker_batch_item *it = &items[i];
        DS_ASSERT(it->slot >= 0 && it->slot < b->n_slots && it->n_tokens >= 1);
        const int n_past = qwen35_cuda_n_past(c->fwd, it->slot);
        if (n_past + it->n_tokens > b->n_ctx)
            return status_fail(st, STATUS_RANGE, "slot %d: %d + %d tokens exceed the context %d",
                               it->slot, n_past, it->n_tokens, b->n_ctx);
        if (nr + it->n_tokens > c->max_rows && cw_flush(c, nr, st)) return st->code;
        if (nr + it->n_tokens > c->max_rows) nr = 0;
        for (int k = 0; k < it->n_tokens; k++) {
            if (nr == c->max_rows) { /* an item longer than a step: its rows over several */
                if (cw_flush(c, nr, st)) return st->code;
                nr = 0;
            }
            const bool last = k == it->n_tokens - 1;
            c->rows[nr] = (qwen35_cuda_row){
                .token = it->tokens[k],
                .slot = it->slot,
                .pos = nr > 0 && c->rows[nr - 1].slot == it->slot
                           ? c->rows[nr - 1].pos + 1
                           : qwen35_cuda_n_past(c->fwd, it->slot),
                .prompt = it->prompt,
                .sample = last && it->sample,
                .logits = it->logits ? it->logits + (size_t)k * b->vocab : NULL,
            };
            c->row_item[nr] = last && it->sample ? it : NULL;
            nr++;
        }
    }
    return cw_flush(c, nr, st);
}

static void cw_seq_end(worker_backend *b, int slot)
{
    cuda_worker *c = (cuda_worker *)b;
    if (c->tp)
        qwen35_cuda_tp_seq_end(c->tp, slot);
    else
        qwen35_cuda_seq_end(c->fwd, slot);
}

static int cw_fill(worker_backend *b, int slot, int n_past, status *st)
{
    cuda_worker *c = (cuda_worker *)b;
    return c->tp ? qwen35_cuda_tp_fill(c->tp, slot, n_past, st)
                 : qwen35_cuda_fill(c->fwd, slot, n_past, st);
}

static void cw_get_stats(const worker_backend *b, worker_backend_stats *out)
{
    qwen35_cuda_stats s;
    qwen35_cuda_get_stats(((const cuda_worker *)b)->fwd, &s);
    *out = (worker_backend_stats){
        .tokens = s.tokens, .steps = s.steps, .graph_launches = s.graph_launches,
        .kernels_per_token = s.kernels_per_token, .d2h_bytes = s.d2h_bytes,
        .h2d_bytes = s.h2d_bytes, .weight_bytes = s.weight_bytes,
        .bytes_per_token = s.bytes_per_token};
}

static void cw_destroy(worker_backend *b)
{
    cuda_worker *c = (cuda_worker *)b;
    if (!c) return;
    if (c->tp)
        qwen35_cuda_tp_destroy(c->tp);
    else
        qwen35_cuda_destroy(c->fwd);
    free(c->rows);
    free(c->row_item);
    free(c);
}

static const worker_backend_vt cw_vt = {
    .seq_start = cw_seq_start, .step = cw_step, .destroy = cw_destroy, .fill = cw_fill,
    .get_stats = cw_get_stats, .seq_end = cw_seq_end};

int worker_backend_cuda_create(const qwen35_model *m, const worker_backend_opts *o,
                               worker_backend **out, status *st)
{
    *out = NULL;
    if (o->n_slots < 0 || o->n_ctx < 2)
        return status_fail(st, STATUS_INVALID, "cuda backend: need slots >= 0 and ctx >= 2 (got %d, %d)",
                           o->n_slots, o->n_ctx);
    cuda_worker *c = calloc(1, sizeof *c);
    if (!c) return status_fail(st, STATUS_NOMEM, "cuda backend");
    worker_backend *b = &c->base;
    b->vt = &cw_vt;
    b->model = m;
    b->n_ctx = o->n_ctx;
    b->vocab = m->cfg.V;
    const int prefill = o->max_prefill_tokens > 0 ? o->max_prefill_tokens : 256;
    const qwen35_cuda_opts fo = {.n_ctx = o->n_ctx, .n_slots = o->n_slots,
                                 .max_rows = o->n_slots > 0 ? o->n_slots + prefill : 0,
                                 .device = o->device, .batch_invariant = o->batch_invariant,
                                 .dense_rows = o->dense_rows, .dense_per_pass = o->dense_per_pass};
    if (o->tp > 1) { /* one rank per GPU: the listed ones, or tp from o->device */
        int devs[64];
        for (int r = 0; r < o->tp; r++) devs[r] = o->n_tp_devices ? o->tp_devices[r] : o->device + r;
        if (qwen35_cuda_tp_create(m, o->tp, devs, &fo, &c->tp, st)) goto fail;
        c->fwd = qwen35_cuda_tp_rank(c->tp, 0);
    } else if (qwen35_cuda_create(m, &fo, &c->fwd, st)) {
        goto fail;
    }
    b->n_slots = qwen35_cuda_n_slots(c->fwd);
    c->max_rows = qwen35_cuda_max_rows(c->fwd);
    c->rows = calloc((size_t)c->max_rows, sizeof *c->rows);
    c->row_item = calloc((size_t)c->max_rows, sizeof *c->row_item);
    if (!c->rows || !c->row_item) {
        status_fail(st, STATUS_NOMEM, "cuda backend: %d rows", c->max_rows);
        goto fail;
    }
    /* a prompt chunk is a run of rows in the step's batched pass, beside the decode rows
     * (model/forward_cuda.h): the engine's step budget bounds it. Without a batched path prompt
     * tokens replay the batch-1 graph one by one: one per request while others decode, so a
     * long prompt does not hold their tokens back. */
    b->prompt_rows_while_decoding = qwen35_cuda_pass_rows(c->fwd) ? 0 : 1;
    b->kv_blocks_total = (uint32_t)qwen35_cuda_kv_blocks(c->fwd, &b->kv_block_tokens);
    qwen35_cuda_stats s;
    qwen35_cuda_get_stats(c->fwd, &s);
    b->state_bytes = s.state_bytes / (uint64_t)(b->n_slots + 1);
    if (c->tp) {
        int at = snprintf(b->device, sizeof b->device, "cuda:");
        for (int r = 0; r < o->tp && at < (int)sizeof b->device; r++)
            at += snprintf(b->device + at, sizeof b->device - (size_t)at, "%s%d", r ? "," : "",
                           qwen35_cuda_device_index(qwen35_cuda_tp_rank(c->tp, r)));
        if (at < (int)sizeof b->device)
            snprintf(b->device + at, sizeof b->device - (size_t)at, " %s, tensor parallel %d",
                     qwen35_cuda_device_name(c->fwd), o->tp);
    } else {
        snprintf(b->device, sizeof b->device, "cuda:%d %s", qwen35_cuda_device_index(c->fwd),
                 qwen35_cuda_device_name(c->fwd));
    }
    *out = b;
    return STATUS_OK;
fail:
    cw_destroy(b);
    return st->code;
}
