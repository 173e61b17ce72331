/* The engine's backend (backend.h): device names through the forward registry (model/fwd.h),
 * and the adapter from the engine's items to the forward's rows. */
#include "worker/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

#define MAX_DEVICES 64

/* "cuda", "cuda:N" or "cuda:A,B,...": the device list (n = 0 for "cuda"); -1 on a malformed one */
static int parse_cuda_devices(const char *device, int *devs, int max)
{
    if (strcmp(device, "cuda") == 0) return 0;
    if (strncmp(device, "cuda:", 5) != 0) return -1;
    int n = 0;
    for (const char *p = device + 5;;) {
        char *end = NULL;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 1023 || n == max) return -1;
        devs[n++] = (int)v;
        if (*end == ',') {
            p = end + 1;
            continue;
        }
        return *end ? -1 : n;
    }
}

static int bad_cuda_name(const char *device, status *st)
{
    return status_fail(st, STATUS_INVALID, "--device: '%s': expected cuda, cuda:N or cuda:A,B,... "
                       "with device indices", device);
}

int worker_backend_check_tp(const char *device, int tp, status *st)
{
    if (tp < 0 || tp > MAX_DEVICES) return status_fail(st, STATUS_INVALID, "--tp %d: expected 1..64", tp);
    if (!device || strcmp(device, "cpu") == 0) return STATUS_OK;
    int devs[MAX_DEVICES];
    const int nd = parse_cuda_devices(device, devs, MAX_DEVICES);
    if (nd < 0 && strncmp(device, "cuda", 4) == 0) return bad_cuda_name(device, st);
    if (nd < 0) return STATUS_OK; /* worker_fwd_create names the unknown device */
    if (tp <= 1) {
        if (nd > 1)
            return status_fail(st, STATUS_INVALID, "--device %s lists %d GPUs: give --tp %d", device,
                               nd, nd);
        return STATUS_OK;
    }
    if (nd > 1 && nd != tp)
        return status_fail(st, STATUS_INVALID, "--device %s lists %d GPUs for --tp %d", device, nd,
                           tp);
    const fwd_backend *cuda = fwd_backend_find("cuda");
    const int n = cuda && cuda->device_count ? cuda->device_count() : 0;
    int need = tp;
    for (int i = 0; i < nd; i++) need = devs[i] + 1 > need ? devs[i] + 1 : need;
    if (nd == 1) need = devs[0] + tp;
    if (n < need)
        return status_fail(st, STATUS_UNSUPPORTED, "--tp %d needs %d GPUs, this host has %d", tp,
                           need, n);
    return STATUS_OK;
}

int worker_fwd_create(const char *device, const qwen35_model *m, const fwd_opts *o, fwd **out,
                      status *st)
{
    *out = NULL;
    if (!device) device = "cpu";
    if (worker_backend_check_tp(device, o->ranks, st)) return st->code;
    fwd_opts fo = *o;
    fo.n_devices = 0;
    if (strcmp(device, "cpu") == 0) return fwd_create("cpu", m, &fo, out, st);
    const int nd = parse_cuda_devices(device, fo.devices, MAX_DEVICES);
    if (nd < 0 && strncmp(device, "cuda", 4) == 0) return bad_cuda_name(device, st);
    if (nd < 0)
        return status_fail(st, STATUS_INVALID, "--device: unknown device '%s' (cpu, cuda, cuda:N or "
                           "cuda:A,B,...)", device);
    const int ranks = fo.ranks > 1 ? fo.ranks : 1;
    if (nd == 1) /* cuda:N: the ranks from N on */
        for (int r = 1; r < ranks; r++) fo.devices[r] = fo.devices[0] + r;
    fo.n_devices = nd ? ranks : 0;
    if (!fwd_backend_find("cuda")) {
        LOG_WARN("no GPU, using CPU (this build has no CUDA backend)");
        return fwd_create("cpu", m, o, out, st);
    }
    status cst;
    status_clear(&cst);
    if (fwd_create("cuda", m, &fo, out, &cst) == STATUS_OK) return STATUS_OK;
    if (cst.code == STATUS_UNAVAILABLE) { /* no driver or no device: serve on the CPU */
        LOG_WARN("no GPU, using CPU (%s)", cst.msg);
        return fwd_create("cpu", m, o, out, st);
    }
    /* a GPU is there but the model does not fit or is not supported: say so, do not hide it */
    return status_fail(st, cst.code, "--device %s: %s", device, cst.msg);
}

int worker_backend_wrap(fwd *f, worker_backend **out, status *st)
{
    *out = NULL;
    worker_backend *b = calloc(1, sizeof *b);
    if (b) {
        b->rows = calloc((size_t)f->max_rows, sizeof *b->rows);
        b->row_out = calloc((size_t)f->max_rows, sizeof *b->row_out);
    }
    if (!b || !b->rows || !b->row_out) {
        if (b) free(b->rows), free(b->row_out), free(b);
        fwd_destroy(f);
        return status_fail(st, STATUS_NOMEM, "backend: out of memory for %d rows", f->max_rows);
    }
    b->f = f;
    b->model = f->model;
    b->n_slots = f->n_slots;
    b->n_ctx = f->n_ctx;
    b->vocab = f->vocab;
    b->state_bytes = f->state_bytes;
    b->prompt_rows_while_decoding = f->pass_rows ? 0 : 1;
    snprintf(b->device, sizeof b->device, "%s", f->device);
    b->kv = f->kv;
    *out = b;
    return STATUS_OK;
}

int worker_backend_create(const char *device, const qwen35_model *m, const worker_backend_opts *o,
                          worker_backend **out, status *st)
{
    *out = NULL;
    const int prefill = o->max_prefill_tokens > 0 ? o->max_prefill_tokens : 256;
    const fwd_opts fo = {.n_slots = o->n_slots, .n_ctx = o->n_ctx, .ctx_fit = o->ctx_fit,
                         .mem_budget = o->mem_budget,
                         .max_rows = o->n_slots > 0 ? o->n_slots + prefill : 0, .ranks = o->tp,
                         .kv_blocks = o->kv_blocks,
                         .kv_block_tokens = o->kv_block_tokens, .n_threads = o->n_threads,
                         .exact_dot = o->exact_dot, .batch_invariant = o->batch_invariant,
                         .dense_rows = o->dense_rows, .dense_per_pass = o->dense_per_pass,
                         .snap_budget = o->snap_budget, .verify_rows = o->verify_rows,
                         .verify_runs = o->verify_runs,
                         .state_dtype = o->state_dtype};
    fwd *f;
    if (worker_fwd_create(device, m, &fo, &f, st)) return st->code;
    return worker_backend_wrap(f, out, st);
}

void worker_backend_destroy(worker_backend *b)
{
    if (!b) return;
    fwd_destroy(b->f);
    free(b->rows);
    free(b->row_out);
    free(b);
}

int worker_backend_seq_start(worker_backend *b, int slot, const sampling_params *s, status *st)
{
    return fwd_seq_start(b->f, slot, s, st);
}

void worker_backend_seq_end(worker_backend *b, int slot) { fwd_seq_end(b->f, slot); }

int worker_backend_seq_resume(worker_backend *b, int slot, const sampling_params *s,
                              const fwd_prefix *x, status *st)
{
    return fwd_seq_resume(b->f, slot, s, x, st);
}

int worker_backend_snap_save(worker_backend *b, int slot, int snap, status *st)
{
    return fwd_snap_save(b->f, slot, snap, st);
}

void worker_backend_get_stats(const worker_backend *b, fwd_stats *s) { fwd_get_stats(b->f, s); }

int worker_backend_rollback(worker_backend *b, int slot, int n_past, status *st)
{
    return fwd_rollback(b->f, slot, n_past, st);
}

/* Runs rows[0..n) and hands each sampled row's result to its item. */
static int flush(worker_backend *b, int n, status *st)
{
    if (!n) return STATUS_OK;
    if (fwd_step(b->f, b->rows, n, st)) return st->code;
    for (int i = 0; i < n; i++)
        if (b->row_out[i]) *b->row_out[i] = b->rows[i].out;
    return STATUS_OK;
}

/* The items' slots and lengths, and KV room for all of them, before any row runs (an item split
 * over several forward steps must not fail half way for want of blocks). */
static int check_items(worker_backend *b, const worker_batch_item *items, int n, status *st)
{
    uint64_t need = 0;
    for (int i = 0; i < n; i++) {
        const worker_batch_item *it = &items[i];
        if (it->slot < 0 || it->slot >= b->n_slots || it->n_tokens < 1)
            return status_fail(st, STATUS_INVALID, "item %d: slot %d, %d tokens", i, it->slot,
                               it->n_tokens);
        const int64_t end = (int64_t)fwd_n_past(b->f, it->slot) + it->n_tokens;
        if (end > b->n_ctx)
            return status_fail(st, STATUS_RANGE, "slot %d: %d + %d tokens exceed the context %d",
                               it->slot, fwd_n_past(b->f, it->slot), it->n_tokens, b->n_ctx);
        need += kv_pool_need(b->kv, it->slot, end);
    }
    if (need > kv_pool_free_blocks(b->kv))
        return status_fail(st, STATUS_EXHAUSTED, "the step needs %llu KV blocks, %u free",
                           (unsigned long long)need, kv_pool_free_blocks(b->kv));
    return STATUS_OK;
}

int worker_backend_step(worker_backend *b, worker_batch_item *items, int n, status *st)
{
    if (check_items(b, items, n, st)) return st->code;
    const int max_rows = b->f->max_rows;
    int nr = 0;
    for (int i = 0; i < n; i++) {
        worker_batch_item *it = &items[i];
        if (nr + it->n_tokens > max_rows) { /* a new forward step for this item */
            if (flush(b, nr, st)) return st->code;
            nr = 0;
        }
        for (int k = 0; k < it->n_tokens; k++) {
            if (nr == max_rows) { /* an item longer than a step: its rows over several */
                if (flush(b, nr, st)) return st->code;
                nr = 0;
            }
            const bool last = k == it->n_tokens - 1;
            b->rows[nr] = (fwd_row){
                .token = it->tokens[k],
                .slot = it->slot,
                .pos = nr > 0 && b->rows[nr - 1].slot == it->slot ? b->rows[nr - 1].pos + 1
                                                                  : fwd_n_past(b->f, it->slot),
                .prompt = it->prompt,
                .sample = it->verify || (last && it->sample),
                .logits = it->logits ? it->logits + (size_t)k * b->vocab : NULL,
                .verify = it->verify,
                .hidden = it->hidden ? it->hidden + (size_t)k * b->model->cfg.H : NULL,
            };
            b->row_out[nr] = it->verify ? &it->outs[k] : last && it->sample ? &it->out : NULL;
            nr++;
        }
    }
    return flush(b, nr, st);
}
