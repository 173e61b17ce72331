/* The draft side of speculative decoding (worker/spec.h). */
#include "worker/spec.h"

#include <stdlib.h>
#include <string.h>

int spec_create(const qwen35_model *m, fwd *f, int n_slots, int n_ctx, int chunk, int k,
                int n_threads, worker_spec **out, status *st)
{
    *out = NULL;
    if (!m->mtp.present)
        return status_fail(st, STATUS_UNSUPPORTED, "speculative decoding: the model has no MTP head");
    if (k < 1 || k > SPEC_MAX_K)
        return status_fail(st, STATUS_INVALID, "--speculative-k %d: expected 1..%d", k, SPEC_MAX_K);
    if (n_slots < 1 || n_ctx < 1 || chunk < 1)
        return status_fail(st, STATUS_INVALID, "speculative decoding: %d slots of %d positions, "
                           "items of %d tokens", n_slots, n_ctx, chunk);
    worker_spec *sp = calloc(1, sizeof *sp);
    if (!sp) return status_fail(st, STATUS_NOMEM, "speculative decoding: out of memory");
    sp->m = m;
    sp->dev = f && fwd_has_mtp(f) ? f : NULL;
    sp->k = k;
    sp->n_slots = n_slots;
    sp->chunk = chunk;
    sp->H = m->cfg.H;
    sp->cap = 1 + (chunk > SPEC_MAX_K + 1 ? chunk : SPEC_MAX_K + 1) + SPEC_QUEUE_ROWS;
    const size_t S = (size_t)n_slots, rows = (size_t)sp->cap * (size_t)sp->H;
    sp->h = malloc(S * rows * sizeof(float));
    sp->qtok = malloc(S * (size_t)sp->cap * sizeof *sp->qtok);
    sp->queued = calloc(S, sizeof *sp->queued);
    sp->pending = calloc(S, sizeof *sp->pending);
    sp->tok = calloc(S * (SPEC_MAX_K + 1), sizeof *sp->tok);
    sp->outs = calloc(S * (SPEC_MAX_K + 1), sizeof *sp->outs);
    int rc = STATUS_OK;
    if (!sp->h || !sp->qtok || !sp->queued || !sp->pending || !sp->tok || !sp->outs) goto nomem;
    sp->bytes = S * rows * sizeof(float);
    if (sp->dev) { /* the head's state is in the forward's KV blocks */
        if (!(sp->n_past = calloc(S, sizeof *sp->n_past))) goto nomem;
        *out = sp;
        return STATUS_OK;
    }
    sp->ms = calloc(S, sizeof *sp->ms);
    if (!sp->ms) goto nomem;
    const qwen35_ctx_opts co = {.max_batch = 1, .max_tokens = chunk + 1, .n_threads = n_threads};
    if ((rc = qwen35_ctx_create(m, &co, &sp->ctx, st))) goto fail;
    for (int s = 0; s < n_slots; s++) {
        if ((rc = qwen35_mtp_state_create(m, n_ctx, &sp->ms[s], st))) goto fail;
        sp->bytes += (uint64_t)n_ctx * 2u * (uint64_t)m->cfg.n_kv * (uint64_t)m->cfg.d_h * sizeof(float);
    }
    *out = sp;
    return STATUS_OK;
nomem:
    rc = status_fail(st, STATUS_NOMEM, "speculative decoding: out of memory for %d slots", n_slots);
fail:
    spec_destroy(sp);
    return rc;
}

void spec_destroy(worker_spec *sp)
{
    if (!sp) return;
    for (int s = 0; sp->ms && s < sp->n_slots; s++) qwen35_mtp_state_destroy(sp->ms[s]);
    qwen35_ctx_destroy(sp->ctx);
    free(sp->ms);
    free(sp->n_past);
    free(sp->h);
    free(sp->qtok);
    free(sp->queued);
    free(sp->pending);
    free(sp->tok);
    free(sp->outs);
    free(sp);
}

void spec_start(worker_spec *sp, int slot)
{
    if (sp->dev)
        sp->n_past[slot] = 0;
    else
        qwen35_mtp_state_reset(sp->ms[slot]);
    sp->queued[slot] = 0;
    sp->pending[slot] = false;
}

/* T >= 1 rows of the head: the device's or the CPU's */
static int feed(worker_spec *sp, int slot, const float *h, const int32_t *tokens, int T,
                status *st)
{
    if (!sp->dev) return qwen35_mtp_step(sp->ctx, sp->ms[slot], h, tokens, T, NULL, NULL, st);
    const int rc = fwd_mtp_feed(sp->dev, slot, sp->n_past[slot], h, tokens, T, st);
    if (!rc) sp->n_past[slot] += T;
    return rc;
}

/* the slot's first row of h, and of queued tokens */
static float *slot_rows(worker_spec *sp, int slot)
{
    return sp->h + (uint64_t)slot * (uint64_t)sp->cap * (uint64_t)sp->H;
}
static int32_t *slot_tokens(worker_spec *sp, int slot)
{
    return sp->qtok + (uint64_t)slot * (uint64_t)sp->cap;
}

void spec_fed(worker_spec *sp, int slot, const int32_t *tokens, int n)
{
    int q = sp->queued[slot];
    DS_ASSERT(n >= 1 && q + 1 + n <= sp->cap);
    int32_t *qt = slot_tokens(sp, slot);
    if (sp->pending[slot]) { /* (pending, t0), (h_0, t1), .., (h_{n-2}, t_{n-1}) */
        memcpy(qt + q, tokens, (size_t)n * sizeof *tokens);
        q += n;
    } else { /* the sequence's first item: (h_0, t1), .. */
        DS_ASSERT(q == 0);
        memcpy(qt, tokens + 1, (size_t)(n - 1) * sizeof *tokens);
        q = n - 1;
    }
    sp->queued[slot] = q; /* h_{n-1} pending, after the queued rows */
    sp->pending[slot] = true;
}

int spec_flush(worker_spec *sp, int slot, status *st)
{
    const int q = sp->queued[slot];
    if (!q) return STATUS_OK;
    float *h = slot_rows(sp, slot);
    const int rc = feed(sp, slot, h, slot_tokens(sp, slot), q, st);
    if (rc) return rc;
    memmove(h, h + (size_t)q * (size_t)sp->H, (size_t)sp->H * sizeof(float)); /* the pending h */
    sp->queued[slot] = 0;
    return STATUS_OK;
}

int spec_reserve(worker_spec *sp, int slot, int n, status *st)
{
    DS_ASSERT(n >= 1 && 1 + n <= sp->cap);
    if (sp->queued[slot] + (sp->pending[slot] ? 1 : 0) + n <= sp->cap) return STATUS_OK;
    return spec_flush(sp, slot, st);
}

int spec_draft(worker_spec *sp, int slot, int32_t last, int k, status *st)
{
    DS_ASSERT(sp->pending[slot] && !sp->queued[slot] && k >= 1 && k <= SPEC_MAX_K);
    int32_t *t = spec_tokens(sp, slot);
    t[0] = last;
    if (sp->dev)
        return fwd_mtp_draft(sp->dev, slot, sp->n_past[slot], spec_hidden(sp, slot) - sp->H, last,
                             k, t + 1, st);
    qwen35_mtp_state *ms = sp->ms[slot];
    const int n_past = ms->n_past;
    const int rc = qwen35_mtp_draft(sp->ctx, ms, spec_hidden(sp, slot) - sp->H, last, k, t + 1, st);
    qwen35_mtp_truncate(ms, n_past);
    return rc;
}

/* ---- the gate ---- */

static int gate_b(int b) { return b < 1 ? 1 : b > SPEC_GATE_MAX_B ? SPEC_GATE_MAX_B : b; }

/* the fastest of side s's window at b */
static float gate_cost(const spec_gate *g, int s, int b)
{
    const uint32_t n = g->n[s][b] < SPEC_GATE_WINDOW ? g->n[s][b] : SPEC_GATE_WINDOW;
    float c = g->s_tok[s][b][0];
    for (uint32_t i = 1; i < n; i++)
        if (g->s_tok[s][b][i] < c) c = g->s_tok[s][b][i];
    return c;
}

bool spec_gate_choose(spec_gate *g, int b)
{
    b = gate_b(b);
    const uint32_t ns = g->n[1][b], np = g->n[0][b];
    const uint32_t turn = g->turns[b]++;
    if (ns < SPEC_GATE_MIN || np < SPEC_GATE_MIN) return ns <= np;
    const bool cheaper = gate_cost(g, 1, b) < gate_cost(g, 0, b);
    return turn % SPEC_GATE_PROBE == SPEC_GATE_PROBE - 1 ? !cheaper : cheaper;
}

void spec_gate_record(spec_gate *g, int b, bool speculated, double seconds, uint64_t tokens)
{
    if (tokens < 1 || !(seconds >= 0)) return;
    b = gate_b(b);
    const int s = speculated;
    g->s_tok[s][b][g->n[s][b] % SPEC_GATE_WINDOW] = (float)(seconds / (double)tokens);
    if (g->n[s][b] < UINT32_MAX) g->n[s][b]++;
}
