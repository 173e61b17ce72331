/* Tensor-parallel CPU forward (forward_tp.h): the ranks' CPU forwards over their shards, in
 * lock step, with an in-memory all-reduce after every mixer and FFN and the lm_head gathered.
 * The per-rank arithmetic is forward.c's own (fwd_* in forward_impl.h); this file only
 * sequences the ranks, like the NCCL version will on its streams. */
#include "model/forward_tp.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/act.h"
#include "model/forward_impl.h"

struct qwen35_tp {
    const qwen35_model *m; /* borrowed: the full model */
    int n_ranks;
    cpu_pool *pool;                              /* owned, shared by the ranks' ctx */
    tp_shard_model *shard[TP_SHARD_MAX_RANKS];  /* owned, [n_ranks] */
    qwen35_ctx *ctx[TP_SHARD_MAX_RANKS];        /* owned, [n_ranks] (pool borrowed) */
    qwen35_state **rank_states;                  /* owned, [max_batch]: one rank's decode rows */
};

int qwen35_tp_create(const qwen35_model *m, int n_ranks, const qwen35_ctx_opts *opts,
                     qwen35_tp **out, status *st)
{
    *out = NULL;
    int rc = tp_shard_check(&m->cfg, n_ranks, st);
    if (rc) return rc;
    qwen35_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return status_fail(st, STATUS_NOMEM, "qwen35_tp: out of memory");
    tp->m = m;
    tp->n_ranks = n_ranks;
    if ((rc = cpu_pool_create(&tp->pool, opts ? opts->n_threads : 0, st))) goto fail;
    for (int r = 0; r < n_ranks; r++) {
        if ((rc = tp_shard_model_create(m, n_ranks, r, &tp->shard[r], st)) ||
            (rc = fwd_ctx_create(&tp->shard[r]->model, opts, tp->pool, &tp->ctx[r], st)))
            goto fail;
    }
    tp->rank_states = calloc((size_t)tp->ctx[0]->max_batch, sizeof *tp->rank_states);
    if (!tp->rank_states) {
        rc = status_fail(st, STATUS_NOMEM, "qwen35_tp: out of memory");
        goto fail;
    }
    *out = tp;
    return STATUS_OK;
fail:
    qwen35_tp_destroy(tp);
    return rc;
}

void qwen35_tp_destroy(qwen35_tp *tp)
{
    if (!tp) return;
    for (int r = 0; r < tp->n_ranks; r++) {
        qwen35_ctx_destroy(tp->ctx[r]);
        tp_shard_model_destroy(tp->shard[r]);
    }
    cpu_pool_destroy(tp->pool);
    free(tp->rank_states);
    free(tp);
}

int qwen35_tp_n_ranks(const qwen35_tp *tp) { return tp->n_ranks; }
int qwen35_tp_n_threads(const qwen35_tp *tp) { return cpu_pool_n_threads(tp->pool); }
const tp_shard_model *qwen35_tp_shard(const qwen35_tp *tp, int r)
{
    DS_ASSERT(r >= 0 && r < tp->n_ranks);
    return tp->shard[r];
}

void qwen35_tp_set_gdn_mode(qwen35_tp *tp, qwen35_gdn_mode mode)
{
    for (int r = 0; r < tp->n_ranks; r++) qwen35_ctx_set_gdn_mode(tp->ctx[r], mode);
}

void qwen35_tp_set_dot_mode(qwen35_tp *tp, qwen35_dot_mode mode)
{
    for (int r = 0; r < tp->n_ranks; r++) qwen35_ctx_set_dot_mode(tp->ctx[r], mode);
}

/* ---- states ---- */

uint64_t qwen35_tp_state_bytes(const qwen35_tp *tp, int n_ctx)
{
    uint64_t n = 0;
    for (int r = 0; r < tp->n_ranks; r++) n += qwen35_state_bytes(&tp->shard[r]->model, n_ctx);
    return n;
}

int qwen35_tp_state_create(const qwen35_tp *tp, int n_ctx, qwen35_tp_state **out, status *st)
{
    *out = NULL;
    qwen35_tp_state *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "qwen35_tp_state: out of memory");
    s->n_ranks = tp->n_ranks;
    for (int r = 0; r < tp->n_ranks; r++) {
        int rc = qwen35_state_create(&tp->shard[r]->model, n_ctx, &s->rank[r], st);
        if (rc) {
            qwen35_tp_state_destroy(s);
            return rc;
        }
    }
    *out = s;
    return STATUS_OK;
}

void qwen35_tp_state_destroy(qwen35_tp_state *s)
{
    if (!s) return;
    for (int r = 0; r < s->n_ranks; r++) qwen35_state_destroy(s->rank[r]);
    free(s);
}

void qwen35_tp_state_reset(qwen35_tp_state *s)
{
    for (int r = 0; r < s->n_ranks; r++) qwen35_state_reset(s->rank[r]);
}

/* ---- one step ---- */

/* The in-memory all-reduce of the ranks' partial outputs [n_rows][H]: rank 0's buffer
 * accumulates ranks 1..N-1 in order, then every rank gets a copy of the sum. */
static void all_reduce(qwen35_tp *tp)
{
    const long n = (long)tp->ctx[0]->n_rows * tp->m->cfg.H;
    float *sum = tp->ctx[0]->out;
    for (int r = 1; r < tp->n_ranks; r++) ref_add(sum, tp->ctx[r]->out, (int)n);
    for (int r = 1; r < tp->n_ranks; r++) memcpy(tp->ctx[r]->out, sum, (size_t)n * sizeof(float));
}

/* forward.c run_step over the ranks: logits for rows [first, n_rows), row stride V. */
static void tp_step(qwen35_tp *tp, const int32_t *tokens, int first, float *logits)
{
    const int N = tp->n_ranks;
    for (int r = 0; r < N; r++) fwd_embed(tp->ctx[r], tokens);
    for (int il = 0; il < tp->m->cfg.n_layer; il++) {
        for (int r = 0; r < N; r++) fwd_mixer(tp->ctx[r], il);
        all_reduce(tp);
        for (int r = 0; r < N; r++) fwd_residual(tp->ctx[r]);
        for (int r = 0; r < N; r++) fwd_ffn(tp->ctx[r], il);
        all_reduce(tp);
        for (int r = 0; r < N; r++) fwd_residual(tp->ctx[r]);
    }
    if (!logits) return;
    for (int r = 0; r < N; r++) /* each rank's vocabulary slice, in place: the gather */
        fwd_head(tp->ctx[r], first, logits + tp->shard[r]->vocab_begin, tp->m->cfg.V);
}

static void check_state(const qwen35_tp *tp, const qwen35_tp_state *s)
{
    DS_ASSERT(s->n_ranks == tp->n_ranks);
    for (int r = 0; r < tp->n_ranks; r++) {
        DS_ASSERT(s->rank[r]->model == &tp->shard[r]->model);
        DS_ASSERT(s->rank[r]->n_past == s->rank[0]->n_past);
    }
}

int qwen35_tp_prefill(qwen35_tp *tp, qwen35_tp_state *s, const int32_t *tokens, int T,
                      float *logits, bool all_logits, status *st)
{
    check_state(tp, s);
    int rc = fwd_check_prefill(tp->ctx[0], s->rank[0], tokens, T, st);
    if (rc) return rc;
    const int V = tp->m->cfg.V, step = tp->ctx[0]->max_tokens;
    for (int t0 = 0; t0 < T; t0 += step) {
        int n = T - t0 < step ? T - t0 : step;
        for (int r = 0; r < tp->n_ranks; r++) fwd_rows_prefill(tp->ctx[r], s->rank[r], n);
        float *lg = NULL;
        int first = 0;
        if (logits && all_logits) lg = logits + (long)t0 * V;
        else if (logits && t0 + n == T) lg = logits, first = n - 1;
        tp_step(tp, tokens + t0, first, lg);
        for (int r = 0; r < tp->n_ranks; r++) s->rank[r]->n_past += n;
    }
    return STATUS_OK;
}

int qwen35_tp_decode_batch(qwen35_tp *tp, qwen35_tp_state *const *states, const int32_t *tokens,
                           int B, float *logits, status *st)
{
    if (B < 1 || B > tp->ctx[0]->max_batch) /* before rank_states is indexed */
        return fwd_check_decode(tp->ctx[0], NULL, tokens, B, st);
    for (int b = 0; b < B; b++) {
        check_state(tp, states[b]);
        tp->rank_states[b] = states[b]->rank[0];
    }
    int rc = fwd_check_decode(tp->ctx[0], tp->rank_states, tokens, B, st);
    if (rc) return rc;
    for (int r = 0; r < tp->n_ranks; r++) {
        for (int b = 0; b < B; b++) tp->rank_states[b] = states[b]->rank[r];
        fwd_rows_decode(tp->ctx[r], tp->rank_states, B); /* copies the pointers */
    }
    tp_step(tp, tokens, 0, logits);
    for (int b = 0; b < B; b++)
        for (int r = 0; r < tp->n_ranks; r++) states[b]->rank[r]->n_past++;
    return STATUS_OK;
}
