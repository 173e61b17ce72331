/* The CUDA forward behind the forward contract (model/forward_cuda.h fwd_backend_cuda): a group
 * of N >= 1 ranks, each one GPU's forward (forward_cuda.c). The group checks a step's rows,
 * takes the KV blocks they need in the one pool (fwd.kv: rank 0's; the caller may have taken
 * them before) and runs the step on every rank: one rank on the caller's thread, several at
 * once on their own threads (forward_cuda_tp.c), each over its own copy of the rows (rank 0's
 * are the caller's and carry the results). Every rank copies the pool's tables to its own
 * device before its graphs read them, so the ranks' caches agree block for block. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "kernels/cuda/tp_comm.h"
#include "model/forward_cuda.h"
#include "model/forward_cuda_impl.h"
#include "model/tp_shard.h"

enum rank_job { JOB_CREATE, JOB_SEQ_START, JOB_SEQ_RESUME, JOB_SNAP_SAVE, JOB_FILL, JOB_STEP,
                JOB_ROLLBACK, JOB_DESTROY };

typedef struct cuda_forward {
    fwd base;
    int n_ranks;
    int devs[FWD_MAX_RANKS];              /* each rank's CUDA device */
    fc_rank *rank[FWD_MAX_RANKS];         /* owned; rank 0 owns the KV pool (fwd.kv) */
    /* several ranks */
    tp_shard_model *shard[FWD_MAX_RANKS]; /* owned: each rank's part of the model */
    tp_comm *comm[FWD_MAX_RANKS];         /* owned: each rank's NCCL communicator */
    fc_ranks *threads;                    /* owned: a host thread per rank */
    fwd_row *rows_of[FWD_MAX_RANKS];      /* owned for r > 0, [max_rows]: each rank's copy of a
                                             step's rows (it writes the sampled ids) */
    /* the job the ranks run (on_ranks) and its arguments */
    enum rank_job job;
    const qwen35_model *m;
    fc_rank_opts opts;
    const sampling_params *params;
    int slot, n_past, n, snap;
    fc_resume resume;
    fwd_row *rows;
    int rc[FWD_MAX_RANKS];
    status st[FWD_MAX_RANKS];
} cuda_forward;

/* ---- the ranks' jobs ---- */

/* The current job on rank r. */
static int run_on(cuda_forward *c, int r, status *st)
{
    switch (c->job) {
    case JOB_CREATE: {
        fc_rank_opts o = c->opts;
        o.device = c->devs[r];
        if (c->n_ranks == 1) return fc_rank_create(c->m, &o, &c->rank[r], st);
        o.tp = c->comm[r];
        o.tp_rank = r;
        o.vocab_begin = c->shard[r]->vocab_begin;
        return fc_rank_create(&c->shard[r]->model, &o, &c->rank[r], st);
    }
    case JOB_SEQ_START: return fc_rank_seq_start(c->rank[r], c->slot, c->params, st);
    case JOB_SEQ_RESUME:
        return fc_rank_seq_resume(c->rank[r], c->slot, c->params, &c->resume, st);
    case JOB_SNAP_SAVE:
        fc_snap_save(c->rank[r], c->slot, c->snap);
        return STATUS_OK;
    case JOB_FILL: return fc_slot_fill(c->rank[r], c->slot, c->n_past, st);
    case JOB_STEP: return fc_rank_step(c->rank[r], r ? c->rows_of[r] : c->rows, c->n, st);
    case JOB_ROLLBACK:
        fc_rank_rollback(c->rank[r], c->slot, c->n_past);
        return STATUS_OK;
    case JOB_DESTROY:
        fc_rank_destroy(c->rank[r]);
        c->rank[r] = NULL;
        return STATUS_OK;
    }
    return STATUS_OK;
}

static void rank_job(void *arg, int r)
{
    cuda_forward *c = arg;
    status_clear(&c->st[r]);
    c->rc[r] = run_on(c, r, &c->st[r]);
}

/* The job on every rank: one rank on the caller's thread, several at once on their threads;
 * the first failing rank's error, named (st may be NULL). */
static int on_ranks(cuda_forward *c, enum rank_job job, status *st)
{
    c->job = job;
    if (!c->threads) return run_on(c, 0, st);
    fc_ranks_run(c->threads, rank_job, c);
    for (int r = 0; r < c->n_ranks; r++)
        if (c->rc[r]) {
            if (st) status_fail(st, c->rc[r], "tensor-parallel rank %d (cuda:%d): %s", r,
                                c->devs[r], c->st[r].msg);
            return c->rc[r];
        }
    return STATUS_OK;
}

/* ---- the contract ---- */

static int cuda_seq_start(fwd *f, int slot, const sampling_params *p, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "slot %d outside [0, %d)", slot, f->n_slots);
    kv_pool_release(f->kv, slot);
    c->slot = slot;
    c->params = p;
    if (on_ranks(c, JOB_SEQ_START, st)) return st->code;
    f->n_past[slot] = 0;
    return STATUS_OK;
}

static void cuda_seq_end(fwd *f, int slot)
{
    DS_ASSERT(slot >= 0 && slot < f->n_slots);
    kv_pool_release(f->kv, slot);
}

/* Every row valid before any runs: ids, slots, positions in order, room in the context. */
static int check_rows(const fwd *f, const fwd_row *rows, int n, status *st)
{
    if (n < 1 || n > f->max_rows)
        return status_fail(st, STATUS_RANGE, "step of %d rows (1..%d)", n, f->max_rows);
    for (int i = 0; i < n; i++) {
        const fwd_row *r = &rows[i];
        if (r->token < 0 || r->token >= f->vocab)
            return status_fail(st, STATUS_RANGE, "row %d: token id %d outside [0, %d)", i,
                               r->token, f->vocab);
        if (r->slot < 0 || r->slot >= f->n_slots)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d outside [0, %d)", i, r->slot,
                               f->n_slots);
        const bool cont = i > 0 && rows[i - 1].slot == r->slot;
        const int want = cont ? rows[i - 1].pos + 1 : f->n_past[r->slot];
        if (r->pos != want)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d: position %d, expected %d", i,
                               r->slot, r->pos, want);
        if (r->pos >= f->n_ctx)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d: context full (%d positions)",
                               i, r->slot, f->n_ctx);
    }
    return STATUS_OK;
}

static int cuda_step(fwd *f, fwd_row *rows, int n, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (check_rows(f, rows, n, st) || fwd_check_verify(f, rows, n, st) ||
        fwd_take_blocks(f, rows, n, st))
        return st->code;
    int rc;
    if (!c->threads) { /* one rank: the caller's thread, no hop */
        rc = fc_rank_step(c->rank[0], rows, n, st);
    } else {
        for (int r = 1; r < c->n_ranks; r++) memcpy(c->rows_of[r], rows, (size_t)n * sizeof *rows);
        c->rows = rows;
        c->n = n;
        rc = on_ranks(c, JOB_STEP, st);
    }
    const fc_slot *slots = c->rank[0]->slots; /* the rows that ran */
    for (int i = 0; i < n; i++) f->n_past[rows[i].slot] = slots[rows[i].slot].n_past;
    return rc;
}

static int cuda_fill(fwd *f, int slot, int n_past, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "slot %d outside [0, %d)", slot, f->n_slots);
    if (n_past < 0 || n_past >= f->n_ctx)
        return status_fail(st, STATUS_RANGE, "position %d outside [0, %d)", n_past, f->n_ctx);
    /* fresh blocks for positions 0 .. n_past (the next token's too) */
    kv_pool_release(f->kv, slot);
    if (kv_pool_ensure(f->kv, slot, (int64_t)n_past + 1, st)) return st->code;
    c->slot = slot;
    c->n_past = n_past;
    if (on_ranks(c, JOB_FILL, st)) return st->code;
    f->n_past[slot] = n_past;
    return STATUS_OK;
}

/* After a verify run in the last step (docs/GPU.md "Verify runs"): the kept state of the row
 * before n_past copied back on every rank. */
static int cuda_rollback(fwd *f, int slot, int n_past, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "rollback: slot %d outside [0, %d)", slot,
                           f->n_slots);
    const fc_rank *e = c->rank[0];
    const fc_slot *sl = &e->slots[slot];
    if (!sl->v_len || sl->v_step != e->stats.steps)
        return status_fail(st, STATUS_RANGE, "rollback: slot %d ran no verify run in the last "
                           "step", slot);
    if (n_past <= sl->v_first || n_past > sl->v_first + sl->v_len)
        return status_fail(st, STATUS_RANGE, "rollback: slot %d: position %d outside its verify "
                           "run's [%d, %d]", slot, n_past, sl->v_first + 1,
                           sl->v_first + sl->v_len);
    c->slot = slot;
    c->n_past = n_past;
    if (on_ranks(c, JOB_ROLLBACK, st)) return st->code;
    f->n_past[slot] = n_past;
    return STATUS_OK;
}

/* ---- the MTP head (fwd.h mtp_feed / mtp_draft; one rank) ---- */

static int check_mtp(const fwd *f, int slot, int pos, const int32_t *tokens, int T, status *st)
{
    if (!f->mtp)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: no MTP head on the device (the model "
                           "has none, no verify runs, or tensor parallel)", f->device);
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "MTP: slot %d outside [0, %d)", slot, f->n_slots);
    if (pos < 0 || T < 1)
        return status_fail(st, STATUS_RANGE, "MTP: %d rows at position %d", T, pos);
    for (int i = 0; i < T; i++)
        if (tokens[i] < 0 || tokens[i] >= f->vocab)
            return status_fail(st, STATUS_RANGE, "MTP: row %d: token id %d outside [0, %d)", i,
                               tokens[i], f->vocab);
    return STATUS_OK;
}

static int cuda_mtp_feed(fwd *f, int slot, int pos, const float *hidden, const int32_t *tokens,
                         int T, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (check_mtp(f, slot, pos, tokens, T, st)) return st->code;
    if ((int64_t)pos + T > f->n_past[slot])
        return status_fail(st, STATUS_RANGE, "MTP: slot %d: rows %d .. %d past its %d fed "
                           "positions", slot, pos, pos + T - 1, f->n_past[slot]);
    return fc_rank_mtp_feed(c->rank[0], slot, pos, hidden, tokens, T, st);
}

static int cuda_mtp_draft(fwd *f, int slot, int pos, const float *h, int32_t token, int k,
                          int32_t *drafts, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (check_mtp(f, slot, pos, &token, 1, st)) return st->code;
    if (k < 1 || k >= FWD_MAX_VERIFY_ROWS)
        return status_fail(st, STATUS_RANGE, "MTP: %d drafts (1..%d)", k, FWD_MAX_VERIFY_ROWS - 1);
    if (pos > f->n_past[slot] || (int64_t)pos + k >= f->n_ctx)
        return status_fail(st, STATUS_RANGE, "MTP: slot %d: %d drafts from position %d (%d fed, "
                           "context %d)", slot, k, pos, f->n_past[slot], f->n_ctx);
    if (kv_pool_ensure(f->kv, slot, (int64_t)pos + k + 1, st)) return st->code;
    return fc_rank_mtp_draft(c->rank[0], slot, pos, h, token, k, drafts, st);
}

/* ---- prefix reuse (fwd.h snap_save / seq_resume; docs/GPU.md "Snapshots") ---- */

static int cuda_snap_save(fwd *f, int slot, int snap, status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "snapshot: slot %d outside [0, %d)", slot,
                           f->n_slots);
    if (snap < 0 || snap >= f->n_snaps)
        return status_fail(st, STATUS_RANGE, "snapshot %d outside [0, %d)", snap, f->n_snaps);
    c->slot = slot;
    c->snap = snap;
    return on_ranks(c, JOB_SNAP_SAVE, st); /* an asynchronous copy on each rank's stream */
}

/* The prefix's snapshot, length and tokens (the blocks are checked once the slot let go of its
 * own: it may have held the prefix's). */
static int check_prefix(const fwd *f, const fwd_prefix *x, status *st)
{
    if (!x || !x->blocks || !x->tokens)
        return status_fail(st, STATUS_INVALID, "resume: no prefix, blocks or tokens");
    if (x->snap < 0 || x->snap >= f->n_snaps)
        return status_fail(st, STATUS_RANGE, "resume: snapshot %d outside [0, %d)", x->snap,
                           f->n_snaps);
    if (x->n_pos < 1 || x->n_pos >= f->n_ctx)
        return status_fail(st, STATUS_RANGE, "resume: %d positions outside [1, %d)", x->n_pos,
                           f->n_ctx);
    for (int i = 0; i < x->n_pos; i++)
        if (x->tokens[i] < 0 || x->tokens[i] >= f->vocab)
            return status_fail(st, STATUS_RANGE, "resume: token %d: id %d outside [0, %d)", i,
                               x->tokens[i], f->vocab);
    return STATUS_OK;
}

static int check_blocks(const fwd *f, const fwd_prefix *x, status *st)
{
    const int n = (int)kv_pool_blocks_for(f->kv, x->n_pos);
    for (int i = 0; i < n; i++)
        if (kv_pool_refs(f->kv, x->blocks[i]) < 1)
            return status_fail(st, STATUS_INVALID, "resume: block %d (entry %d of %d) is not "
                               "held", x->blocks[i], i, n);
    return STATUS_OK;
}

/* The slot empties (its blocks released) and the prefix is checked; the full blocks are adopted
 * (a table change: each rank's mirror re-copies the table before the next step reads it,
 * fc_kv_sync), a fresh block taken for the partial one; then each rank starts the slot and copies
 * the snapshot into its state and the partial block's rows into the fresh block
 * (fc_rank_seq_resume). Any error leaves the slot empty. */
static int cuda_seq_resume(fwd *f, int slot, const sampling_params *p, const fwd_prefix *x,
                           status *st)
{
    cuda_forward *c = (cuda_forward *)f;
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "resume: slot %d outside [0, %d)", slot,
                           f->n_slots);
    kv_pool_release(f->kv, slot);
    f->n_past[slot] = 0;
    int rc = check_prefix(f, x, st);
    if (!rc) rc = check_blocks(f, x, st);
    const int full = rc ? 0 : x->n_pos / ATTN_KV_BLOCK, part = rc ? 0 : x->n_pos % ATTN_KV_BLOCK;
    if (!rc) rc = kv_pool_adopt(f->kv, slot, x->blocks, full, st);
    if (!rc && part) rc = kv_pool_ensure(f->kv, slot, x->n_pos, st);
    if (!rc) {
        c->slot = slot;
        c->params = p;
        c->resume = (fc_resume){.snap = x->snap, .n_pos = x->n_pos,
                                .src_block = part ? x->blocks[full] : -1,
                                .dst_block = part ? kv_pool_table(f->kv, slot)[full] : -1,
                                .tokens = x->tokens};
        rc = on_ranks(c, JOB_SEQ_RESUME, st);
    }
    if (rc) {
        kv_pool_release(f->kv, slot);
        return rc;
    }
    f->n_past[slot] = x->n_pos;
    return STATUS_OK;
}

static void cuda_get_stats(const fwd *f, fwd_stats *out)
{
    *out = ((const cuda_forward *)f)->rank[0]->stats; /* rank 0 reports */
}

static void cuda_destroy(fwd *f)
{
    cuda_forward *c = (cuda_forward *)f;
    if (!c) return;
    if (c->threads) /* each rank on its thread */
        (void)on_ranks(c, JOB_DESTROY, NULL);
    else
        fc_rank_destroy(c->rank[0]);
    fc_ranks_stop(c->threads);
    for (int r = 0; r < FWD_MAX_RANKS; r++) {
        tp_comm_destroy(c->comm[r]);
        tp_shard_model_destroy(c->shard[r]);
        free(c->rows_of[r]);
    }
    free(f->n_past);
    free(c);
}

static const fwd_vt cuda_vt = {
    .seq_start = cuda_seq_start,
    .seq_end = cuda_seq_end,
    .step = cuda_step,
    .fill = cuda_fill,
    .snap_save = cuda_snap_save,
    .seq_resume = cuda_seq_resume,
    .rollback = cuda_rollback,
    .mtp_feed = cuda_mtp_feed,
    .mtp_draft = cuda_mtp_draft,
    .get_stats = cuda_get_stats,
    .destroy = cuda_destroy,
};

/* ---- create ---- */

/* Several ranks: the model's shards, the NCCL communicators, a thread per rank, and every rank
 * made at once (capturing a graph may connect NCCL's peers, which then must all be there), each
 * with the same slots and so the same KV pool (sized from free memory each rank could choose
 * differently, so 0 slots means 64 here); then ranks 1.. take rank 0's pool as their tables. */
static int create_ranks(cuda_forward *c, status *st)
{
    const int n = c->n_ranks;
    int rc = STATUS_OK;
    for (int r = 0; r < n && !rc; r++) rc = tp_shard_model_create(c->m, n, r, &c->shard[r], st);
    if (!rc) rc = tp_comm_init_all(n, c->devs, c->comm, st);
    if (!rc) rc = fc_ranks_start(n, &c->threads, st);
    if (rc) return rc;
    if (c->opts.n_slots <= 0) c->opts.n_slots = 64;
    if ((rc = on_ranks(c, JOB_CREATE, st))) return rc;
    LOG_INFO("cuda: tensor parallel over %d GPUs (%s)", n, tp_comm_describe());
    const fc_rank *e0 = c->rank[0];
    for (int r = 1; r < n; r++) {
        const fc_rank *e = c->rank[r];
        if (e->n_slots != e0->n_slots || e->n_ctx != e0->n_ctx || e->kv.n_blocks != e0->kv.n_blocks ||
            e->kv.ld != e0->kv.ld || e->max_rows != e0->max_rows || e->b.rows != e0->b.rows)
            return status_fail(st, STATUS_INTERNAL, "tensor parallel: rank %d sized %d slots of "
                               "%d positions, %d KV blocks, %d rows (%d a pass); rank 0 %d of %d, "
                               "%d, %d (%d) (give --slots and --ctx)", r, e->n_slots, e->n_ctx,
                               e->kv.n_blocks - 1, e->max_rows, e->b.rows, e0->n_slots,
                               e0->n_ctx, e0->kv.n_blocks - 1, e0->max_rows, e0->b.rows);
        c->rows_of[r] = calloc((size_t)e0->max_rows, sizeof *c->rows_of[r]);
        if (!c->rows_of[r]) return status_fail(st, STATUS_NOMEM, "tensor parallel: rows");
        fc_kv_borrow(c->rank[r], e0->kv.pool);
    }
    return STATUS_OK;
}

static void device_name(cuda_forward *c)
{
    fwd *f = &c->base;
    const fc_rank *e = c->rank[0];
    if (c->n_ranks == 1) {
        snprintf(f->device, sizeof f->device, "cuda:%d %.100s", e->device, e->props.name);
        return;
    }
    int at = snprintf(f->device, sizeof f->device, "cuda:");
    for (int r = 0; r < c->n_ranks && at < (int)sizeof f->device; r++)
        at += snprintf(f->device + at, sizeof f->device - (size_t)at, "%s%d", r ? "," : "",
                       c->devs[r]);
    if (at < (int)sizeof f->device)
        snprintf(f->device + at, sizeof f->device - (size_t)at, " %.64s, tensor parallel %d",
                 e->props.name, c->n_ranks);
}

static int cuda_create(const qwen35_model *m, const fwd_opts *o, fwd **out, status *st)
{
    *out = NULL;
    if (o->n_slots < 0 || o->n_ctx < 1 || o->max_rows < 0 || o->ranks < 0 ||
        o->ranks > FWD_MAX_RANKS || o->n_devices < 0 || o->n_devices > FWD_MAX_RANKS ||
        o->verify_rows < 0 || o->verify_rows > FWD_MAX_VERIFY_ROWS || o->verify_runs < 0)
        return status_fail(st, STATUS_INVALID, "cuda forward: slots %d, ctx %d, rows %d, ranks "
                           "%d, %d devices, verify runs of %d rows, %d a step", o->n_slots,
                           o->n_ctx, o->max_rows, o->ranks, o->n_devices, o->verify_rows,
                           o->verify_runs);
    if (o->kv_block_tokens && o->kv_block_tokens != ATTN_KV_BLOCK)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda forward: KV blocks of %d positions (the "
                           "kernels' are %d)", o->kv_block_tokens, ATTN_KV_BLOCK);
    const int ranks = o->ranks > 1 ? o->ranks : 1;
    if (o->n_devices && o->n_devices != ranks)
        return status_fail(st, STATUS_INVALID, "cuda forward: %d devices for %d ranks",
                           o->n_devices, ranks);
    int devs[FWD_MAX_RANKS]; /* one rank per GPU: the listed ones, or 0 .. ranks-1 */
    for (int r = 0; r < ranks; r++) {
        devs[r] = o->n_devices ? o->devices[r] : r;
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r])
                return status_fail(st, STATUS_INVALID, "tensor parallel: cuda:%d twice", devs[r]);
    }
    /* tensor parallel needs NCCL: refused, not served on the CPU in its stead */
    if (ranks > 1 && !tp_comm_available())
        return status_fail(st, STATUS_UNSUPPORTED, "--tp %d needs NCCL (libnccl.so.2): %s", ranks,
                           tp_comm_describe());
    if (!cuda_device_available(st)) return st->code;
    if (ranks > 1 && tp_shard_check(&m->cfg, ranks, st)) return st->code;
    cuda_forward *c = calloc(1, sizeof *c);
    if (!c) return status_fail(st, STATUS_NOMEM, "cuda forward: out of memory");
    fwd *f = &c->base;
    f->vt = &cuda_vt;
    f->model = m;
    f->n_ctx = o->n_ctx;
    f->vocab = m->cfg.V;
    f->ranks = c->n_ranks = ranks;
    memcpy(c->devs, devs, (size_t)ranks * sizeof *devs);
    c->m = m;
    c->opts = (fc_rank_opts){.n_ctx = o->n_ctx, .n_slots = o->n_slots, .max_rows = o->max_rows,
                             .batch_invariant = o->batch_invariant, .dense_rows = o->dense_rows,
                             .dense_per_pass = o->dense_per_pass, .kv_blocks = o->kv_blocks,
                             .ctx_fit = o->ctx_fit,
                             .mem_budget = o->mem_budget > 0 ? o->mem_budget / ranks : 0,
                             /* each rank's share: floor(share / its bytes) is floor(budget /
                                the group's bytes), the ranks' shards being alike */
                             .snap_budget = o->snap_budget > 0 ? o->snap_budget / ranks
                                                               : o->snap_budget,
                             .state_bf16 = o->state_dtype == FWD_STATE_BF16,
                             .verify_rows = o->verify_rows, .verify_runs = o->verify_runs};
    int rc = ranks > 1 ? create_ranks(c, st) : on_ranks(c, JOB_CREATE, st);
    if (rc) goto fail;
    const fc_rank *e = c->rank[0];
    f->n_slots = e->n_slots;
    f->n_ctx = e->n_ctx; /* shrunk to what fits with ctx_fit */
    snprintf(f->plan, sizeof f->plan, "%s", e->plan);
    f->max_rows = e->max_rows;
    f->pass_rows = e->b.rows;
    f->kv = e->kv.pool;
    f->n_past = calloc((size_t)f->n_slots, sizeof *f->n_past);
    if (!f->n_past) {
        rc = status_fail(st, STATUS_NOMEM, "cuda forward: %d slots", f->n_slots);
        goto fail;
    }
    f->state_bytes = e->stats.state_bytes / (uint64_t)(f->n_slots + 1 + e->n_keep);
    f->verify_rows = e->verify_rows; /* 0 without a batched path */
    /* sampled verify runs draw on the GPU sampler (rank 0's; none on the host fallback) */
    f->verify_sampled = e->verify_rows && e->slots[0].sampler;
    f->mtp = e->mtp.on && e->verify_rows;
    f->state_dtype = o->state_dtype;
    f->n_snaps = e->n_snaps; /* the fewest of any rank (each chose from its own free memory) */
    for (int r = 0; r < ranks; r++) {
        if (c->rank[r]->n_snaps < f->n_snaps) f->n_snaps = c->rank[r]->n_snaps;
        f->snap_bytes += c->rank[r]->snap_bytes;
        const fc_kv *kv = &c->rank[r]->kv; /* K and V of every attention layer */
        f->kv_block_bytes += 2 * (uint64_t)c->rank[r]->n_kv_layers * kv->layer_bytes /
                             (uint64_t)kv->n_blocks;
    }
    device_name(c);
    *out = f;
    return STATUS_OK;
fail:
    cuda_destroy(f);
    return rc;
}

const fwd_backend fwd_backend_cuda = {.name = "cuda", .create = cuda_create,
                                      .device_count = cuda_device_count};
