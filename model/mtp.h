/* Qwen3.5's multi-token-prediction (MTP) head on the CPU (docs/QWEN35.md §2.8): the draft model
 * of speculative decoding, the specification other backends will match.
 *
 * One MTP row takes the main model's final-norm output h_t (qwen35_prefill_hidden) and the
 * token x_{t+1} after it, runs at position t, and gives logits for x_{t+2} and its own
 * final-norm output g_t:
 *   u = eh_proj · [RMSNorm(embd[x_{t+1}])·enorm ; RMSNorm(h_t)·hnorm]
 *   u = the MTP layer (a gated full-attention decoder layer with its own KV cache) on u
 *   g_t = RMSNorm(u)·head_norm;  logits = head · g_t
 * Drafting k tokens chains rows: (g_t, d_1) at t+1 gives d_2, and so on.
 *
 *   qwen35_mtp_state *ms;
 *   qwen35_mtp_state_create(model, n_ctx, &ms, &st);        once per sequence slot
 *   qwen35_prefill_hidden(ctx, s, prompt, T, logits, false, h, &st);   h: [T][H]
 *   next = argmax(logits);  pairs: tokens prompt[1..T-1], next
 *   qwen35_mtp_step(ctx, ms, h, pairs, T, NULL, NULL, &st);  fills MTP positions 0..T-1
 *   -- or, to draft: step the first T-1 pairs, then
 *   qwen35_mtp_draft(ctx, ms, h + (T-1)*H, next, k, drafts, &st);
 *   ... verify the drafts with the main model, then qwen35_mtp_truncate(ms, last verified
 *   pair) and feed the accepted pairs again with the main model's h.
 *
 * Lifetimes: the state owns the MTP layer's KV (n_ctx positions, one attention layer) and the
 * draft's scratch (a row of logits, two of g); nothing is allocated per token afterwards. The
 * ctx (model/forward.h) must come from a model with an MTP head (its buffers then fit the
 * 2H-wide rows of eh_proj). Threading as forward.h: one caller per ctx and per state. */
#ifndef DS_MODEL_MTP_H
#define DS_MODEL_MTP_H

#include <stdint.h>

#include "common/status.h"
#include "model/forward.h"

typedef struct qwen35_mtp_state {
    int n_past;       /* MTP rows fed = position of the next row */
    qwen35_state kv;  /* the MTP layer's KV (attention slot 0; no recurrent state) */
    float *logits;    /* owned, [V]: the draft's scratch */
    float *g;         /* owned, [2][H]: the draft's chained hidden */
} qwen35_mtp_state;

/* A state of n_ctx MTP positions (1 <= n_ctx). STATUS_UNSUPPORTED when the model has no MTP
 * head, STATUS_INVALID for a bad n_ctx, STATUS_NOMEM. */
int qwen35_mtp_state_create(const qwen35_model *m, int n_ctx, qwen35_mtp_state **out,
                            status *st);
void qwen35_mtp_state_destroy(qwen35_mtp_state *ms);
/* Forgets the sequence (n_past = 0). */
void qwen35_mtp_state_reset(qwen35_mtp_state *ms);
/* Rollback: keeps the first n_past rows (0 <= n_past <= ms->n_past); later rows are
 * overwritten by the next step. */
void qwen35_mtp_truncate(qwen35_mtp_state *ms, int n_past);

/* T >= 1 rows at positions ms->n_past .. +T-1: row r pairs hidden[r] ([T][H]) with tokens[r].
 * logits: NULL or [T][V]; g: NULL or [T][H] (the rows' head-norm outputs, the next chained
 * row's hidden). Rows give the same bits however they are split into calls.
 * Errors (state unchanged): STATUS_UNSUPPORTED (no MTP head), STATUS_INVALID (T < 1),
 * STATUS_RANGE naming the index of a token outside [0, V), or rows past n_ctx. */
int qwen35_mtp_step(qwen35_ctx *ctx, qwen35_mtp_state *ms, const float *hidden,
                    const int32_t *tokens, int T, float *logits, float *g, status *st);

/* k >= 1 greedy drafts (the lowest id of the maximum, as the sampler's greedy): row (h, token)
 * at ms->n_past gives drafts[0]; row (its g, drafts[i-1]) at the next position gives
 * drafts[i]. Advances n_past by k. Errors as qwen35_mtp_step (state unchanged). */
int qwen35_mtp_draft(qwen35_ctx *ctx, qwen35_mtp_state *ms, const float *h, int32_t token,
                     int k, int32_t *drafts, status *st);

#endif
