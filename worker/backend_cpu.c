/* The CPU backend: model/forward.h (qwen35_decode_batch for the decode items of a step, one
 * qwen35_prefill per prefill chunk) and a per-slot sampler (worker/sample.h). With opts.tp > 1
 * the forward is model/forward_tp.h instead: tp simulated tensor-parallel ranks (the same
 * calls, per-rank states behind each slot). */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/forward_tp.h"
#include "worker/backend.h"
#include "worker/sample.h"

typedef struct cpu_backend {
    worker_backend base;
    qwen35_ctx *ctx;        /* owned; NULL when tp */
    qwen35_state **states;  /* owned, [n_slots]; NULL when tp */
    qwen35_tp *tp;          /* owned when opts.tp > 1, else NULL */
    qwen35_tp_state **tp_states;     /* owned, [n_slots] when tp */
    qwen35_tp_state **dec_tp_states; /* owned, [n_slots] scratch when tp: decode batch */
    worker_sampler **samplers; /* owned, [n_slots] */
    float *logits;          /* owned, [n_slots][V]: row i = item i of the step */
    qwen35_state **dec_states; /* owned, [n_slots] scratch: decode batch */
    int32_t *dec_tokens;    /* owned, [n_slots] */
    int *dec_item;          /* owned, [n_slots]: item index of decode entry b */
    float *dec_logits;      /* owned, [n_slots][V] */
} cpu_backend;

static int cpu_seq_start(worker_backend *b, int slot, const sampling_params *s, status *st)
{
    (void)st;
    cpu_backend *c = (cpu_backend *)b;
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    if (c->tp) qwen35_tp_state_reset(c->tp_states[slot]);
    else qwen35_state_reset(c->states[slot]);
    worker_sampler_start(c->samplers[slot], s);
    return STATUS_OK;
}

static int cpu_step(worker_backend *b, worker_batch_item *items, int n, status *st)
{
    cpu_backend *c = (cpu_backend *)b;
    int V = b->vocab, B = 0;
    DS_ASSERT(n >= 1 && n <= b->n_slots);
    /* decode items: one batched call reading every weight once */
    for (int i = 0; i < n; i++) {
        DS_ASSERT(items[i].slot >= 0 && items[i].slot < b->n_slots && items[i].n_tokens >= 1);
        if (items[i].n_tokens != 1) continue;
        if (c->tp) c->dec_tp_states[B] = c->tp_states[items[i].slot];
        else c->dec_states[B] = c->states[items[i].slot];
        c->dec_tokens[B] = items[i].tokens[0];
        c->dec_item[B++] = i;
    }
    if (B > 0) {
        if (c->tp ? qwen35_tp_decode_batch(c->tp, c->dec_tp_states, c->dec_tokens, B, c->dec_logits, st)
                  : qwen35_decode_batch(c->ctx, c->dec_states, c->dec_tokens, B, c->dec_logits, st))
            return st->code;
        for (int k = 0; k < B; k++) {
            const worker_batch_item *it = &items[c->dec_item[k]];
            memcpy(c->logits + (size_t)c->dec_item[k] * V, c->dec_logits + (size_t)k * V,
                   (size_t)V * sizeof(float));
            if (it->logits)
                memcpy(it->logits, c->dec_logits + (size_t)k * V, (size_t)V * sizeof(float));
        }
    }
    /* prefill chunks, one sequence at a time */
    for (int i = 0; i < n; i++) {
        worker_batch_item *it = &items[i];
        if (it->n_tokens == 1) continue;
        float *lg = it->logits ? it->logits : it->sample ? c->logits + (size_t)i * V : NULL;
        if (c->tp ? qwen35_tp_prefill(c->tp, c->tp_states[it->slot], it->tokens, it->n_tokens, lg,
                                      it->logits != NULL, st)
                  : qwen35_prefill(c->ctx, c->states[it->slot], it->tokens, it->n_tokens, lg,
                                   it->logits != NULL, st))
            return st->code;
        if (it->logits && it->sample) /* the last row is the one to sample from */
            memcpy(c->logits + (size_t)i * V, it->logits + (size_t)(it->n_tokens - 1) * V,
                   (size_t)V * sizeof(float));
    }
    /* penalties see every fed token; then sample */
    for (int i = 0; i < n; i++) {
        worker_batch_item *it = &items[i];
        worker_sampler *s = c->samplers[it->slot];
        worker_sampler_accept(s, it->tokens, it->n_tokens, it->prompt);
        if (it->sample && worker_sampler_sample(s, c->logits + (size_t)i * V, it, st))
            return st->code;
    }
    return STATUS_OK;
}

/* s continues at n_past (its model's dims: a rank's shard under tp) */
static void fill_state(qwen35_state *s, int n_past)
{
    const qwen35_config *cf = &s->model->cfg;
    const size_t n = (size_t)cf->n_attn_layers * s->n_ctx * cf->n_kv * cf->d_h;
    for (size_t i = 0; i < n; i++) s->k_cache[i] = s->v_cache[i] = 0.0659f; /* finite */
    s->n_past = n_past;
}

static int cpu_fill(worker_backend *b, int slot, int n_past, status *st)
{
    cpu_backend *c = (cpu_backend *)b;
    if (slot < 0 || slot >= b->n_slots)
        return status_fail(st, STATUS_RANGE, "slot %d outside [0, %d)", slot, b->n_slots);
    if (n_past < 0 || n_past >= b->n_ctx)
        return status_fail(st, STATUS_RANGE, "position %d outside [0, %d)", n_past, b->n_ctx);
    if (!c->tp) {
        fill_state(c->states[slot], n_past);
        return STATUS_OK;
    }
    for (int r = 0; r < c->tp_states[slot]->n_ranks; r++) fill_state(c->tp_states[slot]->rank[r], n_past);
    return STATUS_OK;
}

static void cpu_destroy(worker_backend *b)
{
    cpu_backend *c = (cpu_backend *)b;
    if (!c) return;
    for (int i = 0; c->states && i < b->n_slots; i++) qwen35_state_destroy(c->states[i]);
    for (int i = 0; c->tp_states && i < b->n_slots; i++) qwen35_tp_state_destroy(c->tp_states[i]);
    for (int i = 0; c->samplers && i < b->n_slots; i++) worker_sampler_destroy(c->samplers[i]);
    qwen35_ctx_destroy(c->ctx);
    qwen35_tp_destroy(c->tp);
    free(c->states);
    free(c->tp_states);
    free(c->dec_tp_states);
    free(c->samplers);
    free(c->logits);
    free(c->dec_states);
    free(c->dec_tokens);
    free(c->dec_item);
    free(c->dec_logits);
    free(c);
}

static const worker_backend_vt cpu_vt = {
    .seq_start = cpu_seq_start, .step = cpu_step, .destroy = cpu_destroy, .fill = cpu_fill};

int worker_backend_cpu_create(const qwen35_model *m, const worker_backend_opts *o,
                              worker_backend **out, status *st)
{
    *out = NULL;
    if (o->n_slots < 1 || o->n_ctx < 2)
        return status_fail(st, STATUS_INVALID, "cpu backend: need slots >= 1 and ctx >= 2 (got %d, %d)",
                           o->n_slots, o->n_ctx);
    if (o->tp < 0 || o->tp > TP_SHARD_MAX_RANKS)
        return status_fail(st, STATUS_INVALID, "--tp %d: expected 1..%d", o->tp, TP_SHARD_MAX_RANKS);
    const bool tp = o->tp > 1;
    cpu_backend *c = calloc(1, sizeof *c);
    if (!c) return status_fail(st, STATUS_NOMEM, "cpu backend: out of memory");
    worker_backend *b = &c->base;
    b->vt = &cpu_vt;
    b->model = m;
    b->n_slots = o->n_slots;
    b->n_ctx = o->n_ctx;
    b->vocab = m->cfg.V;
    size_t S = (size_t)o->n_slots, V = (size_t)m->cfg.V;
    if (tp) {
        c->tp_states = calloc(S, sizeof *c->tp_states);
        c->dec_tp_states = calloc(S, sizeof *c->dec_tp_states);
    } else {
        c->states = calloc(S, sizeof *c->states);
    }
    c->samplers = calloc(S, sizeof *c->samplers);
    c->logits = malloc(S * V * sizeof(float));
    c->dec_logits = malloc(S * V * sizeof(float));
    c->dec_states = calloc(S, sizeof *c->dec_states);
    c->dec_tokens = calloc(S, sizeof *c->dec_tokens);
    c->dec_item = calloc(S, sizeof *c->dec_item);
    if ((tp ? !c->tp_states || !c->dec_tp_states : !c->states) || !c->samplers || !c->logits ||
        !c->dec_logits || !c->dec_states || !c->dec_tokens || !c->dec_item) {
        status_fail(st, STATUS_NOMEM, "cpu backend: out of memory for %d slots", o->n_slots);
        goto fail;
    }
    qwen35_ctx_opts co = {.max_batch = o->n_slots, .max_tokens = o->max_prefill_tokens,
                          .n_threads = o->n_threads,
                          .dot_mode = o->exact_dot ? QWEN35_DOT_EXACT : QWEN35_DOT_DEFAULT};
    if (tp ? qwen35_tp_create(m, o->tp, &co, &c->tp, st) : qwen35_ctx_create(m, &co, &c->ctx, st))
        goto fail;
    for (int i = 0; i < o->n_slots; i++) {
        if (tp ? qwen35_tp_state_create(c->tp, o->n_ctx, &c->tp_states[i], st)
               : qwen35_state_create(m, o->n_ctx, &c->states[i], st))
            goto fail;
        if (worker_sampler_create(m->cfg.V, o->n_ctx, &c->samplers[i], st)) goto fail;
    }
    b->state_bytes = tp ? qwen35_tp_state_bytes(c->tp, o->n_ctx) : qwen35_state_bytes(m, o->n_ctx);
    if (tp)
        snprintf(b->device, sizeof b->device, "cpu (%d threads, tensor parallel: %d simulated ranks)",
                 qwen35_tp_n_threads(c->tp), o->tp);
    else
        snprintf(b->device, sizeof b->device, "cpu (%d threads)", qwen35_ctx_n_threads(c->ctx));
    *out = b;
    return STATUS_OK;
fail:
    cpu_destroy(b);
    return st->code;
}
