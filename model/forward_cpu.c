/* The CPU forward behind model/fwd.h (forward_cpu.h): the ranks, their paged KV pools and slot
 * states, the samplers, and a step's passes. The arithmetic is forward.c's (cpu_fwd_run). */
#include "model/forward_cpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/cpu/norm.h"
#include "model/forward_impl.h"
#include "model/fwd_plan.h"
#include "model/sampler.h"
#include "model/tp_shard.h"

#define CPU_HEAD_MIN_ROWS 16 /* logits rows of the scratch at least (a prompt's head in groups) */
#define CPU_FILL_VALUE 0.0659f /* fill(): any finite value */
#define FWD_CPU_DEFAULT_SLOTS 8 /* chosen slots at most: the CPU is compute-bound beyond a few */

typedef struct cpu_rank {
    const qwen35_model *m;   /* the model (one rank: borrowed) or the shard's */
    tp_shard_model *shard;   /* owned; NULL for one rank */
    float *k, *v;            /* owned: this rank's KV pool (qwen35_kv_floats) */
    qwen35_state **slot;     /* owned, [n_slots]: recurrent state, KV in k / v by the slot's table */
    qwen35_state **pass;     /* owned, [max_rows]: the states of a decode pass's rows */
    float *snap;             /* owned, [n_snaps][snap_floats]: recurrent-state snapshots */
    float *kept;             /* owned, [n_slots][verify_rows][snap_floats]: the recurrent state
                                after each row of a slot's last verify run */
    uint64_t snap_floats;    /* one snapshot of this rank (conv windows, then S) */
} cpu_rank;

typedef struct cpu_forward {
    fwd base;
    int n_ranks;
    cpu_pool *pool;          /* owned, shared by the ranks' ctx */
    cpu_rank *rank;          /* owned, [n_ranks] */
    qwen35_ctx **ctx;        /* owned, [n_ranks]: the ranks' workspaces */
    int64_t *vocab_begin;    /* owned, [n_ranks]: each rank's first lm_head row */
    int n_blocks, block_tokens;
    sampler **samplers;      /* owned, [n_slots] */
    int32_t *tokens;         /* owned, [max_rows]: a pass's tokens */
    int *pass_row;           /* owned, [max_rows]: the step's row of pass row j */
    uint32_t *seen;          /* owned, [n_slots]: the step (stamp) whose rows last named the slot */
    uint32_t stamp;
    float *logits;           /* owned, [head_rows][V] */
    int head_rows;
    /* each slot's last verify run (rollback): its first position, rows, and its sampler's
     * accepted tokens and RNG counter before it; vrows[slot] 0: none since the last step */
    int *vfirst, *vrows;
    int64_t *vaccepted;
    uint64_t *vstep;
    uint8_t *vsampled;       /* owned, [n_slots][verify_rows]: row j of the run sampled */
    fwd_stats stats;
} cpu_forward;

/* ---- a step ---- */

static int check_rows(cpu_forward *c, const fwd_row *rows, int n, status *st)
{
    const fwd *f = &c->base;
    if (n < 1 || n > f->max_rows)
        return status_fail(st, STATUS_RANGE, "cpu forward: a step of %d rows (1..%d)", n, f->max_rows);
    if (++c->stamp == 0) { /* wrapped: no slot may look seen */
        memset(c->seen, 0, (size_t)f->n_slots * sizeof *c->seen);
        c->stamp = 1;
    }
    for (int i = 0; i < n; i++) {
        const fwd_row *r = &rows[i];
        if (r->token < 0 || r->token >= f->vocab)
            return status_fail(st, STATUS_RANGE, "row %d: token %d is outside the vocabulary [0, %d)",
                               i, r->token, f->vocab);
        if (r->slot < 0 || r->slot >= f->n_slots)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d outside [0, %d)", i, r->slot, f->n_slots);
        const bool cont = i > 0 && rows[i - 1].slot == r->slot;
        if (!cont && c->seen[r->slot] == c->stamp)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d's rows are not consecutive", i, r->slot);
        c->seen[r->slot] = c->stamp;
        const int want = cont ? rows[i - 1].pos + 1 : f->n_past[r->slot];
        if (r->pos != want)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d at position %d, expected %d", i,
                               r->slot, r->pos, want);
        if (r->pos >= f->n_ctx)
            return status_fail(st, STATUS_RANGE, "row %d: slot %d's context of %d positions is full",
                               i, r->slot, f->n_ctx);
    }
    return STATUS_OK;
}

static void accept(cpu_forward *c, const fwd_row *r)
{
    if (r->prompt)
        sampler_accept_prompt(c->samplers[r->slot], &r->token, 1);
    else
        sampler_accept(c->samplers[r->slot], r->token);
}

static bool wants_logits(const fwd_row *r) { return r->sample || r->logits; }

/* After a pass of np rows (ctx row j = step row pass_row[j]): the rows' tokens accepted in
 * order, the logits each row asks for, the sampled rows' next tokens. The lm_head runs on the
 * rows that need it: straight into the caller's rows where they lie one after the other and none
 * samples (eval), else through the scratch, head_rows at a time. */
static int finish_pass(cpu_forward *c, fwd_row *rows, int np, status *st)
{
    const int V = c->base.vocab;
    const qwen35_config *cf = &c->rank[0].m->cfg;
    for (int j = 0; j < np; j++) { /* the lm_head's input, as head() computes it */
        float *h = rows[c->pass_row[j]].hidden;
        if (h) ref_rmsnorm(c->ctx[0]->x + (long)j * cf->H, c->rank[0].m->output_norm, cf->H, cf->eps, h);
    }
    for (int j = 0; j < np;) {
        fwd_row *r = &rows[c->pass_row[j]];
        if (!wants_logits(r)) {
            accept(c, r);
            j++;
            continue;
        }
        int k = j + 1;
        if (!r->sample) { /* the caller's own rows, while they are contiguous */
            while (k < np) {
                const fwd_row *q = &rows[c->pass_row[k]];
                if (q->sample || q->logits != rows[c->pass_row[k - 1]].logits + V) break;
                k++;
            }
            cpu_fwd_run_head(c->ctx, c->vocab_begin, c->n_ranks, j, k - j, r->logits, V);
            for (int t = j; t < k; t++) accept(c, &rows[c->pass_row[t]]);
            j = k;
            continue;
        }
        while (k < np && k - j < c->head_rows && wants_logits(&rows[c->pass_row[k]])) k++;
        cpu_fwd_run_head(c->ctx, c->vocab_begin, c->n_ranks, j, k - j, c->logits, V);
        for (int t = j; t < k; t++) {
            fwd_row *q = &rows[c->pass_row[t]];
            float *lg = c->logits + (size_t)(t - j) * V;
            accept(c, q);
            if (q->logits) memcpy(q->logits, lg, (size_t)V * sizeof(float));
            if (q->sample && sampler_sample(c->samplers[q->slot], lg, &q->out) < 0)
                return status_fail(st, STATUS_INTERNAL, "slot %d: the model produced no finite "
                                   "logit (NaN or inf; are the weights broken?)", q->slot);
        }
        j = k;
    }
    return STATUS_OK;
}

/* Positions move on by n for slot's states on every rank and in fwd.n_past. */
static void advance(cpu_forward *c, int slot, int n)
{
    for (int r = 0; r < c->n_ranks; r++) c->rank[r].slot[slot]->n_past += n;
    c->base.n_past[slot] += n;
}

/* Every one-row run of the step in one batched pass. */
static int decode_pass(cpu_forward *c, fwd_row *rows, int n, status *st)
{
    int B = 0;
    for (int i = 0; i < n; i++) {
        const bool alone = (i == 0 || rows[i - 1].slot != rows[i].slot) &&
                           (i == n - 1 || rows[i + 1].slot != rows[i].slot);
        if (!alone || rows[i].verify) continue;
        for (int r = 0; r < c->n_ranks; r++) c->rank[r].pass[B] = c->rank[r].slot[rows[i].slot];
        c->tokens[B] = rows[i].token;
        c->pass_row[B++] = i;
    }
    if (!B) return STATUS_OK;
    for (int r = 0; r < c->n_ranks; r++) cpu_fwd_rows_decode(c->ctx[r], c->rank[r].pass, B);
    cpu_fwd_run(c->ctx, c->n_ranks, c->tokens);
    for (int b = 0; b < B; b++) advance(c, rows[c->pass_row[b]].slot, 1);
    return finish_pass(c, rows, B, st);
}

/* A verify run of len rows starts: what rollback needs to undo its rows. */
static void verify_begin(cpu_forward *c, const fwd_row *rows, int len)
{
    const int slot = rows[0].slot;
    c->vfirst[slot] = rows[0].pos;
    c->vrows[slot] = len;
    c->vaccepted[slot] = sampler_n_accepted(c->samplers[slot]);
    c->vstep[slot] = sampler_step(c->samplers[slot]);
    for (int j = 0; j < len; j++) c->vsampled[(size_t)slot * c->base.verify_rows + j] = rows[j].sample;
}

/* Each longer run, a pass of its own (a verify run's one of them even when it is one row). */
static int prefill_passes(cpu_forward *c, fwd_row *rows, int n, status *st)
{
    for (int i = 0; i < n;) {
        int e = i + 1;
        while (e < n && rows[e].slot == rows[i].slot) e++;
        if (e - i > 1 || rows[i].verify) {
            const int slot = rows[i].slot, len = e - i;
            for (int j = 0; j < len; j++) {
                c->tokens[j] = rows[i + j].token;
                c->pass_row[j] = i + j;
            }
            const bool verify = rows[i].verify;
            for (int r = 0; r < c->n_ranks; r++) {
                cpu_rank *k = &c->rank[r];
                cpu_fwd_rows_prefill(c->ctx[r], k->slot[slot], len);
                if (verify)
                    cpu_fwd_rows_keep(c->ctx[r], k->kept + (uint64_t)slot * c->base.verify_rows *
                                      k->snap_floats, k->snap_floats);
            }
            if (verify) verify_begin(c, rows + i, len);
            cpu_fwd_run(c->ctx, c->n_ranks, c->tokens);
            advance(c, slot, len);
            if (finish_pass(c, rows, len, st)) return st->code;
        }
        i = e;
    }
    return STATUS_OK;
}

static int cpu_step(fwd *f, fwd_row *rows, int n, status *st)
{
    cpu_forward *c = (cpu_forward *)f;
    if (check_rows(c, rows, n, st) || fwd_check_verify(f, rows, n, st) ||
        fwd_take_blocks(&c->base, rows, n, st))
        return st->code;
    for (int i = 0; i < n; i++) c->vrows[rows[i].slot] = 0; /* a step ends the last verify run */
    if (decode_pass(c, rows, n, st) || prefill_passes(c, rows, n, st)) return st->code;
    c->stats.tokens += (uint64_t)n;
    c->stats.steps++;
    return STATUS_OK;
}

/* ---- slots ---- */

static int cpu_seq_start(fwd *f, int slot, const sampling_params *p, status *st)
{
    cpu_forward *c = (cpu_forward *)f;
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "slot %d outside [0, %d)", slot, f->n_slots);
    kv_pool_release(f->kv, slot);
    for (int r = 0; r < c->n_ranks; r++) qwen35_state_reset(c->rank[r].slot[slot]);
    f->n_past[slot] = 0;
    c->vrows[slot] = 0;
    sampler_reset(c->samplers[slot], p);
    return STATUS_OK;
}

static void cpu_seq_end(fwd *f, int slot)
{
    cpu_forward *c = (cpu_forward *)f;
    DS_ASSERT(slot >= 0 && slot < f->n_slots);
    kv_pool_release(f->kv, slot);
    for (int r = 0; r < c->n_ranks; r++) c->rank[r].slot[slot]->n_past = 0;
    f->n_past[slot] = 0;
    c->vrows[slot] = 0;
}

static int cpu_fill(fwd *f, int slot, int n_past, status *st)
{
    cpu_forward *c = (cpu_forward *)f;
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "slot %d outside [0, %d)", slot, f->n_slots);
    if (n_past < 0 || n_past >= f->n_ctx)
        return status_fail(st, STATUS_RANGE, "position %d outside [0, %d)", n_past, f->n_ctx);
    if (kv_pool_ensure(f->kv, slot, n_past, st)) return st->code;
    const int32_t *table = kv_pool_table(f->kv, slot);
    const int held = kv_pool_held(f->kv, slot);
    for (int r = 0; r < c->n_ranks; r++) {
        const qwen35_config *cf = &c->rank[r].m->cfg;
        const size_t block = (size_t)c->block_tokens * cf->n_kv * cf->d_h;
        for (int a = 0; a < cf->n_attn_layers; a++)
            for (int b = 0; b < held; b++) {
                const size_t off = ((size_t)a * c->n_blocks + (size_t)table[b]) * block;
                for (size_t i = 0; i < block; i++) c->rank[r].k[off + i] = c->rank[r].v[off + i] = CPU_FILL_VALUE;
            }
        c->rank[r].slot[slot]->n_past = n_past;
    }
    f->n_past[slot] = n_past;
    return STATUS_OK;
}

/* ---- prefix reuse ---- */

static int cpu_snap_save(fwd *f, int slot, int snap, status *st)
{
    cpu_forward *c = (cpu_forward *)f;
    if (slot < 0 || slot >= f->n_slots || snap < 0 || snap >= f->n_snaps)
        return status_fail(st, STATUS_RANGE, "snapshot %d of slot %d: slots [0, %d), snapshots "
                           "[0, %d)", snap, slot, f->n_slots, f->n_snaps);
    for (int r = 0; r < c->n_ranks; r++) {
        cpu_rank *k = &c->rank[r];
        qwen35_state_save_recurrent(k->slot[slot], k->snap + (uint64_t)snap * k->snap_floats);
    }
    return STATUS_OK;
}

/* The first rows rows of block src copied into block dst, every attention layer, K and V,
 * every rank. */
static void copy_block_rows(cpu_forward *c, int32_t src, int32_t dst, int rows)
{
    for (int r = 0; r < c->n_ranks; r++) {
        const cpu_rank *k = &c->rank[r];
        const qwen35_config *cf = &k->m->cfg;
        const size_t row = (size_t)cf->n_kv * cf->d_h, block = (size_t)c->block_tokens * row;
        for (int a = 0; a < cf->n_attn_layers; a++) {
            const size_t from = ((size_t)a * c->n_blocks + (size_t)src) * block;
            const size_t to = ((size_t)a * c->n_blocks + (size_t)dst) * block;
            memcpy(k->k + to, k->k + from, (size_t)rows * row * sizeof(float));
            memcpy(k->v + to, k->v + from, (size_t)rows * row * sizeof(float));
        }
    }
}

/* seq_resume's work after seq_start: on an error the caller empties the slot. */
static int resume(cpu_forward *c, int slot, const fwd_prefix *x, status *st)
{
    fwd *f = &c->base;
    if (x->snap < 0 || x->snap >= f->n_snaps || x->n_pos < 1 || x->n_pos >= f->n_ctx)
        return status_fail(st, STATUS_RANGE, "slot %d: resume from snapshot %d at position %d "
                           "(snapshots [0, %d), positions [1, %d))", slot, x->snap, x->n_pos,
                           f->n_snaps, f->n_ctx);
    const int full = x->n_pos / c->block_tokens, part = x->n_pos % c->block_tokens;
    if (kv_pool_adopt(f->kv, slot, x->blocks, full, st)) return st->code;
    if (part) {
        const int32_t src = x->blocks[full];
        if (kv_pool_refs(f->kv, src) < 1)
            return status_fail(st, STATUS_INVALID, "slot %d: the partial block %d of the prefix "
                               "(entry %d) is not a held block", slot, src, full);
        if (kv_pool_ensure(f->kv, slot, x->n_pos, st)) return st->code;
        copy_block_rows(c, src, kv_pool_table(f->kv, slot)[full], part);
    }
    for (int r = 0; r < c->n_ranks; r++) {
        cpu_rank *k = &c->rank[r];
        qwen35_state_load_recurrent(k->slot[slot], k->snap + (uint64_t)x->snap * k->snap_floats,
                                    x->n_pos);
    }
    f->n_past[slot] = x->n_pos;
    sampler_accept_prompt(c->samplers[slot], x->tokens, x->n_pos);
    return STATUS_OK;
}

static int cpu_seq_resume(fwd *f, int slot, const sampling_params *p, const fwd_prefix *x,
                          status *st)
{
    cpu_forward *c = (cpu_forward *)f;
    if (cpu_seq_start(f, slot, p, st)) return st->code;
    if (resume(c, slot, x, st)) {
        cpu_seq_end(f, slot);
        return st->code;
    }
    return STATUS_OK;
}

/* ---- speculative rollback ---- */

static int cpu_rollback(fwd *f, int slot, int n_past, status *st)
{
    cpu_forward *c = (cpu_forward *)f;
    if (slot < 0 || slot >= f->n_slots)
        return status_fail(st, STATUS_RANGE, "slot %d outside [0, %d)", slot, f->n_slots);
    const int first = c->vfirst[slot], len = c->vrows[slot];
    if (!len || n_past < first + 1 || n_past > first + len)
        return status_fail(st, STATUS_RANGE, "slot %d: rollback to position %d outside its last "
                           "verify run (%d rows from %d)", slot, n_past, len, first);
    const int row = n_past - first - 1;
    for (int r = 0; r < c->n_ranks; r++) {
        cpu_rank *k = &c->rank[r];
        qwen35_state_load_recurrent(k->slot[slot], k->kept + ((uint64_t)slot * f->verify_rows +
                                    (uint64_t)row) * k->snap_floats, n_past);
    }
    f->n_past[slot] = n_past;
    uint64_t step = c->vstep[slot];
    for (int j = 0; j <= row; j++) step += c->vsampled[(size_t)slot * f->verify_rows + j];
    sampler_rollback(c->samplers[slot], c->vaccepted[slot] + row + 1, step);
    c->vrows[slot] = row + 1; /* a later rollback may only go back further */
    return STATUS_OK;
}

static void cpu_get_stats(const fwd *f, fwd_stats *s) { *s = ((const cpu_forward *)f)->stats; }

static void cpu_destroy(fwd *f)
{
    cpu_forward *c = (cpu_forward *)f;
    if (!c) return;
    for (int r = 0; c->rank && r < c->n_ranks; r++) {
        cpu_rank *k = &c->rank[r];
        for (int s = 0; k->slot && s < f->n_slots; s++) qwen35_state_destroy(k->slot[s]);
        free(k->slot);
        free(k->pass);
        free(k->snap);
        free(k->kept);
        free(k->k);
        free(k->v);
        if (c->ctx) qwen35_ctx_destroy(c->ctx[r]);
        tp_shard_model_destroy(k->shard);
    }
    for (int s = 0; c->samplers && s < f->n_slots; s++) sampler_destroy(c->samplers[s]);
    cpu_pool_destroy(c->pool);
    kv_pool_destroy(f->kv);
    free(f->n_past);
    free(c->rank);
    free(c->ctx);
    free(c->vocab_begin);
    free(c->samplers);
    free(c->tokens);
    free(c->pass_row);
    free(c->seen);
    free(c->logits);
    free(c->vfirst);
    free(c->vrows);
    free(c->vaccepted);
    free(c->vstep);
    free(c->vsampled);
    free(c);
}

static const fwd_vt cpu_vt = {
    .seq_start = cpu_seq_start,
    .seq_end = cpu_seq_end,
    .step = cpu_step,
    .fill = cpu_fill,
    .snap_save = cpu_snap_save,
    .seq_resume = cpu_seq_resume,
    .rollback = cpu_rollback,
    .get_stats = cpu_get_stats,
    .destroy = cpu_destroy,
};

/* ---- create ---- */

static int check_opts(const qwen35_model *m, const fwd_opts *o, status *st)
{
    if (o->n_slots < 0 || o->n_ctx < 1 || o->max_rows < 0 || o->n_threads < 0)
        return status_fail(st, STATUS_INVALID, "cpu forward: need slots >= 0, ctx >= 1, rows >= 0 "
                           "and threads >= 0 (got %d, %d, %d, %d)", o->n_slots, o->n_ctx,
                           o->max_rows, o->n_threads);
    if (o->kv_blocks < 0 || o->kv_block_tokens < 0)
        return status_fail(st, STATUS_INVALID, "cpu forward: KV blocks %d of %d positions", o->kv_blocks,
                           o->kv_block_tokens);
    if (o->verify_rows < 0 || o->verify_rows > FWD_MAX_VERIFY_ROWS)
        return status_fail(st, STATUS_INVALID, "cpu forward: verify runs of %d rows (0..%d)",
                           o->verify_rows, FWD_MAX_VERIFY_ROWS);
    if (o->ranks < 0 || o->ranks > FWD_MAX_RANKS)
        return status_fail(st, STATUS_INVALID, "--tp %d: expected 1..%d", o->ranks, FWD_MAX_RANKS);
    return o->ranks > 1 ? tp_shard_check(&m->cfg, o->ranks, st) : STATUS_OK;
}

/* Rank r: its model (a shard, or the model itself for one rank), workspace, KV pool and slots. */
static int rank_create(cpu_forward *c, const qwen35_model *m, const fwd_opts *o, int r, status *st)
{
    fwd *f = &c->base;
    cpu_rank *k = &c->rank[r];
    if (c->n_ranks > 1) {
        int rc = tp_shard_model_create(m, c->n_ranks, r, &k->shard, st);
        if (rc) return rc;
        k->m = &k->shard->model;
        c->vocab_begin[r] = k->shard->vocab_begin;
    } else {
        k->m = m;
    }
    const qwen35_ctx_opts co = {.max_batch = f->max_rows, .max_tokens = f->max_rows,
                                .n_threads = o->n_threads, .gdn_mode = QWEN35_GDN_RECURRENT,
                                .dot_mode = o->exact_dot ? QWEN35_DOT_EXACT : QWEN35_DOT_DEFAULT,
                                .bf16_state = o->state_dtype == FWD_STATE_BF16};
    int rc = cpu_fwd_ctx_create(k->m, &co, c->pool, &c->ctx[r], st);
    if (rc) return rc;
    const uint64_t kv = qwen35_kv_floats(k->m, c->n_blocks, c->block_tokens) + 1;
    k->k = malloc(kv * sizeof(float));
    k->v = malloc(kv * sizeof(float));
    k->slot = calloc((size_t)f->n_slots, sizeof *k->slot);
    k->pass = calloc((size_t)f->max_rows, sizeof *k->pass);
    if (!k->k || !k->v || !k->slot || !k->pass)
        return status_fail(st, STATUS_NOMEM, "cpu forward: out of memory for a KV pool of %d blocks "
                           "of %d positions (%.1f MiB)", c->n_blocks, c->block_tokens,
                           (double)kv * 8 / (1 << 20));
    for (int s = 0; s < f->n_slots; s++)
        if ((rc = qwen35_state_create_paged(k->m, f->n_ctx, k->k, k->v, c->n_blocks, c->block_tokens,
                                            kv_pool_table(f->kv, s), &k->slot[s], st)))
            return rc;
    return STATUS_OK;
}

/* The snapshot buffers of prefix reuse, every rank's, sized by budget (fwd_opts.snap_budget):
 * 0 none; < 0 FWD_CPU_SNAPS_PER_SLOT per slot; > 0 as many whole snapshots as fit. */
static int snaps_create(cpu_forward *c, int64_t budget, status *st)
{
    fwd *f = &c->base;
    f->snap_bytes = 0;
    f->kv_block_bytes = 0;
    for (int r = 0; r < c->n_ranks; r++) {
        c->rank[r].snap_floats = qwen35_state_recurrent_bytes(c->rank[r].m) / sizeof(float);
        f->snap_bytes += c->rank[r].snap_floats * sizeof(float);
        f->kv_block_bytes += 2 * qwen35_kv_floats(c->rank[r].m, 1, c->block_tokens) * sizeof(float);
    }
    int64_t n = 0;
    if (budget < 0 || (budget > 0 && f->snap_bytes == 0)) n = (int64_t)FWD_CPU_SNAPS_PER_SLOT * f->n_slots;
    else if (budget > 0) n = budget / (int64_t)f->snap_bytes;
    if (n > INT32_MAX / 2) n = INT32_MAX / 2;
    f->n_snaps = (int)n;
    for (int r = 0; f->verify_rows && r < c->n_ranks; r++) {
        cpu_rank *k = &c->rank[r];
        k->kept = malloc(((size_t)f->n_slots * f->verify_rows * k->snap_floats + 1) * sizeof(float));
        if (!k->kept)
            return status_fail(st, STATUS_NOMEM, "cpu forward: out of memory for %d kept states "
                               "of %.1f MiB per slot (verify runs)", f->verify_rows,
                               (double)f->snap_bytes / (1 << 20));
    }
    if (!n) return STATUS_OK;
    for (int r = 0; r < c->n_ranks; r++) {
        cpu_rank *k = &c->rank[r];
        k->snap = malloc(((size_t)n * k->snap_floats + 1) * sizeof(float));
        if (!k->snap)
            return status_fail(st, STATUS_NOMEM, "cpu forward: out of memory for %lld snapshots of "
                               "%.1f MiB", (long long)n, (double)f->snap_bytes / (1 << 20));
    }
    return STATUS_OK;
}

/* The first unsigned number in file path, or 0 (absent, unreadable, "max"). */
static uint64_t read_u64(const char *path)
{
    FILE *fp = fopen(path, "r");
    unsigned long long v = 0;
    if (fp) {
        if (fscanf(fp, "%llu", &v) != 1) v = 0;
        fclose(fp);
    }
    return (uint64_t)v;
}

/* The memory this process may still take, in bytes: MemAvailable of /proc/meminfo (else the
 * free physical pages), and under a cgroup memory limit (a container: cgroup v2 memory.max, v1
 * memory.limit_in_bytes) no more than the limit less the cgroup's usage. 0 if nothing is
 * known. */
static uint64_t mem_available(void)
{
    FILE *fp = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    while (fp && fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (fp) fclose(fp);
    uint64_t avail = (uint64_t)kb << 10;
    if (!avail) {
        const long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        avail = pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
    }
    uint64_t limit = read_u64("/sys/fs/cgroup/memory.max"), used = 0;
    if (limit) used = read_u64("/sys/fs/cgroup/memory.current");
    else if ((limit = read_u64("/sys/fs/cgroup/memory/memory.limit_in_bytes")))
        used = read_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (limit && limit < (1ull << 60)) { /* v1 says "no limit" with a huge number */
        const uint64_t left = limit > used ? limit - used : 0;
        if (!avail || left < avail) avail = left;
    }
    return avail;
}

/* Slots, context and KV pool from memory (fwd_plan.h): the budget given, else
 * FWD_CPU_MEM_PERCENT of the available RAM (mem_available). A slot: its recurrent state and its sampler (a
 * token and a flag per position, vocabulary-sized candidate buffers); the KV pool holds F32 K
 * and V of every attention layer (every rank together: the ranks split the heads). */
static int plan_memory(const qwen35_model *m, const fwd_opts *o, int block_tokens, fwd_plan *out,
                       status *st)
{
    char what[96];
    uint64_t room = (uint64_t)o->mem_budget;
    if (o->mem_budget > 0) {
        snprintf(what, sizeof what, "a budget of %.1f MiB", (double)room / (1 << 20));
    } else {
        const uint64_t avail = mem_available();
        room = avail ? avail / 100 * FWD_CPU_MEM_PERCENT : UINT64_MAX / 4;
        snprintf(what, sizeof what, "%d%% of %.2f GiB available RAM", FWD_CPU_MEM_PERCENT,
                 (double)avail / (1 << 30));
        if (!avail) snprintf(what, sizeof what, "no limit: the available RAM is not known");
    }
    const fwd_plan_in in = {
        .room = room,
        .room_what = what,
        .slot_bytes = qwen35_state_recurrent_bytes(m) + 16ull * (uint64_t)m->cfg.V,
        .pos_bytes = sizeof(int32_t) + 1,
        .block_bytes = 2 * qwen35_kv_floats(m, 1, block_tokens) * sizeof(float),
        .block_tokens = block_tokens,
        .n_ctx = o->n_ctx,
        .ctx_fit = o->ctx_fit,
        .n_slots = o->n_slots,
        .max_slots = FWD_CPU_DEFAULT_SLOTS,
        .kv_blocks = o->kv_blocks,
    };
    if (fwd_plan_make(&in, out, st)) {
        char msg[sizeof st->msg];
        snprintf(msg, sizeof msg, "%s", st->msg);
        return status_fail(st, st->code, "cpu forward: %s", msg);
    }
    return STATUS_OK;
}

static int cpu_create(const qwen35_model *m, const fwd_opts *o, fwd **out, status *st)
{
    *out = NULL;
    int rc = check_opts(m, o, st);
    if (rc) return rc;
    cpu_forward *c = calloc(1, sizeof *c);
    if (!c) return status_fail(st, STATUS_NOMEM, "cpu forward: out of memory");
    fwd *f = &c->base;
    f->vt = &cpu_vt;
    f->model = m;
    f->n_slots = 0; /* cpu_destroy on a failed plan frees no slot */
    f->ranks = c->n_ranks = o->ranks > 1 ? o->ranks : 1;
    c->block_tokens = o->kv_block_tokens ? o->kv_block_tokens : 64;
    fwd_plan plan;
    if ((rc = plan_memory(m, o, c->block_tokens, &plan, st))) goto fail;
    f->n_slots = plan.n_slots;
    f->n_ctx = plan.n_ctx;
    f->vocab = m->cfg.V;
    f->max_rows = o->max_rows ? o->max_rows : f->n_slots + 256;
    f->pass_rows = f->max_rows; /* a prompt chunk is one pass of rows */
    snprintf(f->plan, sizeof f->plan, "%s", plan.why);
    const int per_seq = (f->n_ctx + c->block_tokens - 1) / c->block_tokens;
    const int64_t n_blocks = plan.n_blocks;
    if (n_blocks > INT32_MAX) {
        rc = status_fail(st, STATUS_INVALID, "cpu forward: %d slots x %d positions: too many KV blocks",
                         f->n_slots, f->n_ctx);
        goto fail;
    }
    c->n_blocks = (int)n_blocks;
    c->head_rows = f->n_slots > CPU_HEAD_MIN_ROWS ? f->n_slots : CPU_HEAD_MIN_ROWS;
    if (c->head_rows > f->max_rows) c->head_rows = f->max_rows;
    if ((rc = kv_pool_create(&(kv_pool_opts){.n_seqs = f->n_slots, .block_tokens = c->block_tokens,
                                             .n_blocks = c->n_blocks, .max_blocks_per_seq = per_seq},
                             &f->kv, st)) ||
        (rc = cpu_pool_create(&c->pool, o->n_threads, st)))
        goto fail;
    const size_t S = (size_t)f->n_slots, R = (size_t)f->max_rows, N = (size_t)c->n_ranks;
    f->n_past = calloc(S, sizeof *f->n_past);
    c->rank = calloc(N, sizeof *c->rank);
    c->ctx = calloc(N, sizeof *c->ctx);
    c->vocab_begin = calloc(N, sizeof *c->vocab_begin);
    c->samplers = calloc(S, sizeof *c->samplers);
    c->tokens = calloc(R, sizeof *c->tokens);
    c->pass_row = calloc(R, sizeof *c->pass_row);
    c->seen = calloc(S, sizeof *c->seen);
    c->logits = malloc((size_t)c->head_rows * (size_t)f->vocab * sizeof(float));
    f->verify_rows = o->verify_rows;
    f->verify_sampled = true;
    c->vfirst = calloc(S, sizeof *c->vfirst);
    c->vrows = calloc(S, sizeof *c->vrows);
    c->vaccepted = calloc(S, sizeof *c->vaccepted);
    c->vstep = calloc(S, sizeof *c->vstep);
    c->vsampled = calloc(S * (size_t)(o->verify_rows + 1), 1);
    if (!c->vfirst || !c->vrows || !c->vaccepted || !c->vstep || !c->vsampled || !f->n_past || !c->rank || !c->ctx || !c->vocab_begin || !c->samplers || !c->tokens ||
        !c->pass_row || !c->seen || !c->logits) {
        rc = status_fail(st, STATUS_NOMEM, "cpu forward: out of memory for %d slots, %d rows",
                         f->n_slots, f->max_rows);
        goto fail;
    }
    for (int r = 0; r < c->n_ranks; r++)
        if ((rc = rank_create(c, m, o, r, st))) goto fail;
    if ((rc = snaps_create(c, o->snap_budget, st))) goto fail;
    const sampling_params greedy = sampling_params_resolve(&(sampling_params){0});
    for (int s = 0; s < f->n_slots; s++)
        if ((rc = sampler_create(&c->samplers[s], f->vocab, f->n_ctx, &greedy, st))) goto fail;
    uint64_t per_slot = 0;
    for (int r = 0; r < c->n_ranks; r++)
        per_slot += qwen35_state_recurrent_bytes(c->rank[r].m) +
                    8 * qwen35_kv_floats(c->rank[r].m, per_seq, c->block_tokens);
    f->state_bytes = per_slot;
    f->state_dtype = o->state_dtype;
    c->stats.state_bytes = per_slot * S;
    const int nt = cpu_pool_n_threads(c->pool);
    if (c->n_ranks > 1)
        snprintf(f->device, sizeof f->device, "cpu (%d threads, tensor parallel: %d simulated ranks)",
                 nt, c->n_ranks);
    else
        snprintf(f->device, sizeof f->device, "cpu (%d threads)", nt);
    *out = f;
    return STATUS_OK;
fail:
    cpu_destroy(f);
    return rc;
}

const fwd_backend fwd_backend_cpu = {.name = "cpu", .create = cpu_create, .device_count = NULL};
