/* Speculative decoding's draft side in the worker (docs/ARCHITECTURE.md §5 "Speculative
 * decoding"): the MTP head (model/mtp.h) of every slot kept in step with the main model, and
 * its drafts: the head's argmax tokens, for greedy and sampled sequences alike. Every verify row
 * chooses its token as a one-row step would (docs/SAMPLER.md), so the drafts decide only how many
 * tokens a run keeps. The engine (engine.c) owns one when the
 * model has an MTP head and the forward runs verify runs (fwd.verify_rows >= k + 1).
 *
 * Per slot: the MTP state (its own KV, one row per main-model position but the last) and the
 * pending h, the main model's final-norm output of the row that produced the slot's last token.
 * Every item the engine feeds a speculating slot returns its rows' h into spec_hidden(slot)
 * (worker_batch_item.hidden); spec_fed then queues the pairs it completes: (pending h, first
 * token), (h of row i, token i+1) ..., and keeps the last row's h pending. The queued pairs go
 * to the MTP in one feed when a draft needs them (spec_flush, before the verify item is built)
 * or when the next item's rows would not fit behind them (spec_reserve): so while the gate
 * (below) has the slot decode plainly, its rows reach the head a batch at a time, not a row a
 * step. A verify item (the last token, then the drafts) counts as an item of its accepted rows
 * only (the forward rolled back past the others), so the MTP's rows stay those of the main model:
 *
 *   spec_start(sp, slot);                               the slot's sequence started cold
 *   spec_reserve(sp, slot, n, &st); it.hidden = spec_hidden(sp, slot); step;
 *   spec_fed(sp, slot, it.tokens, it.n_tokens);
 *   spec_flush(sp, slot, &st); it.hidden = spec_hidden(sp, slot);
 *   spec_draft(sp, slot, last, k, &st);                 sp->tokens(slot): last, d1 .. dk
 *   verify item of k+1 rows; a accepted; rollback; spec_fed(sp, slot, tokens, a + 1)
 *
 * Where the forward has the head on its device (fwd_has_mtp: cuda), the rows go there
 * (fwd_mtp_feed / fwd_mtp_draft: the same pairs, the head's KV in the slot's blocks); else the
 * head runs here on the CPU (model/mtp.h).
 *
 * Memory: everything at create (on the CPU an MTP state of n_ctx positions per slot: its KV is
 * one attention layer's); nothing per token. Engine thread only. */
#ifndef DS_WORKER_SPEC_H
#define DS_WORKER_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "model/forward.h"
#include "model/fwd.h"
#include "model/mtp.h"

#define SPEC_MAX_K 4

typedef struct worker_spec {
    const qwen35_model *m;      /* borrowed */
    int k;                      /* drafts per verify run (1 .. SPEC_MAX_K) */
    int n_slots, chunk, H;      /* chunk: most tokens of one item */
    fwd *dev;                   /* borrowed: the forward whose device runs the head, or NULL */
    int *n_past;                /* owned, [n_slots] with dev: the head's rows fed */
    qwen35_ctx *ctx;            /* owned without dev: the MTP's workspace */
    qwen35_mtp_state **ms;      /* owned without dev, [n_slots] */
    float *h;                   /* owned, [n_slots][cap][H]: the queued pairs' h, the pending
                                   h, then the next item's rows */
    int32_t *qtok;              /* owned, [n_slots][cap]: the queued pairs' tokens */
    int *queued;                /* owned, [n_slots]: pairs queued (not fed to the MTP yet) */
    int cap;                    /* rows a slot holds: 1 + chunk + SPEC_QUEUE_ROWS */
    bool *pending;              /* owned, [n_slots] */
    int32_t *tok;               /* owned, [n_slots][SPEC_MAX_K + 1]: last token, drafts */
    sample_result *outs;        /* owned, [n_slots][SPEC_MAX_K + 1]: a verify item's choices */
    uint64_t bytes;             /* allocated, for the start-up log */
} worker_spec;

/* The head on f's device when it has one (fwd_has_mtp; f may be NULL), else on the CPU.
 * STATUS_UNSUPPORTED when m has no MTP head; STATUS_INVALID for k outside 1..SPEC_MAX_K;
 * STATUS_NOMEM. n_threads as qwen35_ctx_opts (0: all online CPUs). */
int spec_create(const qwen35_model *m, fwd *f, int n_slots, int n_ctx, int chunk, int k,
                int n_threads, worker_spec **out, status *st);
void spec_destroy(worker_spec *sp);

void spec_start(worker_spec *sp, int slot);
/* Rows of decode steps a slot queues beyond an item's (spec_reserve feeds them then). */
#define SPEC_QUEUE_ROWS 64
/* Where the next item's rows go: after the queued pairs and the pending h. */
static inline float *spec_hidden(worker_spec *sp, int slot)
{
    const uint64_t row = (uint64_t)slot * (uint64_t)sp->cap + (uint64_t)sp->queued[slot] +
                         (sp->pending[slot] ? 1u : 0u);
    return sp->h + row * (uint64_t)sp->H;
}
/* The queued pairs fed to the MTP, then the pending h moved to the slot's first row: before a
 * draft. Errors as qwen35_mtp_step (a full MTP context). */
int spec_flush(worker_spec *sp, int slot, status *st);
/* Room behind the queued pairs for an item of n rows (1 <= n <= chunk + 1), feeding them first
 * when there is none. */
int spec_reserve(worker_spec *sp, int slot, int n, status *st);
static inline int32_t *spec_tokens(worker_spec *sp, int slot)
{
    return sp->tok + (uint64_t)slot * (SPEC_MAX_K + 1);
}
static inline sample_result *spec_outs(worker_spec *sp, int slot)
{
    return sp->outs + (uint64_t)slot * (SPEC_MAX_K + 1);
}
/* The pairs that n (1 <= n <= chunk + 1) fed tokens, whose h are in spec_hidden's rows,
 * complete, queued for the MTP (spec_flush feeds them). */
void spec_fed(worker_spec *sp, int slot, const int32_t *tokens, int n);
/* k greedy drafts after token `last` (not fed yet) into spec_tokens(slot) [1 .. k], [0] = last,
 * the queue flushed (spec_flush); the MTP's rows are as before (the drafts' rows are
 * truncated). */
int spec_draft(worker_spec *sp, int slot, int32_t last, int k, status *st);
/* The rolling acceptance rule (engine.c): after each verify run of a request, its mean
 * acceptance moves by SPEC_ACCEPT_WEIGHT of the way to that run's accepted / drafted (the first
 * run sets it); once a request has made SPEC_ACCEPT_MIN_RUNS runs with the mean below
 * engine_opts.spec_min_accept, it decodes without drafts for the rest of its life. */
#define SPEC_ACCEPT_WEIGHT (1.0 / 8)
#define SPEC_ACCEPT_MIN_RUNS 8
/* The crowd rule (engine.c): once more than engine_opts.spec_max_batch sequences have decoded in
 * SPEC_CROWDED_STEPS consecutive steps, the requests decoding then stop speculating for the rest
 * of their lives, so a full server does not feed their rows to the head for drafts it will not
 * make (the feeds cost the head's layer a token: ~1/65 of the 27B's work, ~1/33 of the 4B's). */
#define SPEC_CROWDED_STEPS 32

/* The mean after a run of k >= 1 drafts accepted a, the request's run count now n (1: the first). */
static inline double spec_accept_mean(double mean, int n, int k, int a)
{
    const double x = (double)a / k;
    return n <= 1 ? x : mean + SPEC_ACCEPT_WEIGHT * (x - mean);
}

/* Whether speculation pays, measured (engine_opts.spec_gate; engine.c): per number b of decoding
 * sequences (1 .. SPEC_GATE_MAX_B), the seconds per generated token of the last SPEC_GATE_WINDOW
 * steps that speculated and of the last that did not (steps without prompt rows only, the
 * head's feeds and drafts included), each
 * side's cost the fastest of its window: other load only ever slows a step, so the minimum
 * stays the step's own cost under it. A step at b speculates while either side has fewer than
 * SPEC_GATE_MIN steps (the side with fewer next), then when speculating is the cheaper side,
 * except every SPEC_GATE_PROBE-th step at b, which takes the other side to keep its window
 * current. So where drafting and verify runs cost more than they give (a small model, a low
 * acceptance, a busy batch), the sequences decode one token a step. */
#define SPEC_GATE_MAX_B 64
#define SPEC_GATE_MIN 4
#define SPEC_GATE_PROBE 32
#define SPEC_GATE_WINDOW 8

typedef struct spec_gate {
    float s_tok[2][SPEC_GATE_MAX_B + 1][SPEC_GATE_WINDOW]; /* [speculated][b]: seconds a token */
    uint32_t n[2][SPEC_GATE_MAX_B + 1];  /* steps measured (the window's next entry: n % W) */
    uint32_t turns[SPEC_GATE_MAX_B + 1]; /* decisions made at b */
} spec_gate;

/* Whether the next step with b >= 1 decoding sequences speculates (b past SPEC_GATE_MAX_B: as
 * SPEC_GATE_MAX_B). */
bool spec_gate_choose(spec_gate *g, int b);
/* A step with b decoding sequences (and no prompt rows) took seconds for tokens >= 1 generated
 * tokens, speculating or not. */
void spec_gate_record(spec_gate *g, int b, bool speculated, double seconds, uint64_t tokens);

#endif
