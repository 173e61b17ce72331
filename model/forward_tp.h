/* The tensor-parallel CPU forward: N ranks simulated in one process (issue 15), so CI proves
 * the sharded forward equals the unsharded one (model/forward.h) without several GPUs.
 *
 * Each rank is an ordinary CPU forward (qwen35_ctx, qwen35_state) over its shard of the model
 * (model/tp_shard.h: whole attention heads with their KV cache, whole delta-rule heads with their
 * conv channels and S state, F/N of the FFN, V/N of the lm_head). A step runs every rank on the
 * same rows and, after each layer's mixer and FFN, sums the ranks' partial outputs [rows][H]
 * in rank order 0, 1, .., N-1 (the in-memory all-reduce: every rank gets the same bits) before
 * the residual add; the lm_head's slices are written straight into the caller's [rows][V]
 * (the gather). The ranks run one after the other on one shared thread pool; nothing is
 * allocated per token.
 *
 *   qwen35_tp *tp; qwen35_tp_state *s;
 *   qwen35_tp_create(model, 2, &(qwen35_ctx_opts){.max_batch = 8}, &tp, &st);
 *   qwen35_tp_state_create(tp, 4096, &s, &st);
 *   qwen35_tp_prefill(tp, s, prompt, n_prompt, logits, false, &st);   logits: [V]
 *   qwen35_tp_decode_batch(tp, &s, &next, 1, logits, &st);            logits: [B][V]
 *
 * Same contracts as qwen35_prefill / qwen35_decode_batch (errors leave the states unchanged).
 * Threading: as qwen35_ctx (one caller thread at a time). */
#ifndef DS_MODEL_FORWARD_TP_H
#define DS_MODEL_FORWARD_TP_H

#include "model/forward.h"
#include "model/tp_shard.h"

typedef struct qwen35_tp qwen35_tp;

/* One sequence: a state per rank, each in its shard's dims (n_past advances together). */
typedef struct qwen35_tp_state {
    int n_ranks;
    qwen35_state *rank[TP_SHARD_MAX_RANKS]; /* owned, [n_ranks] */
} qwen35_tp_state;

/* Shards m over n_ranks ranks (tp_shard_model_create: STATUS_UNSUPPORTED naming the dimension
 * or tensor that does not split) and creates one workspace per rank (opts as
 * qwen35_ctx_create; one pool of opts->n_threads threads shared by the ranks). m must outlive
 * tp. */
int qwen35_tp_create(const qwen35_model *m, int n_ranks, const qwen35_ctx_opts *opts,
                     qwen35_tp **out, status *st);
void qwen35_tp_destroy(qwen35_tp *tp);
int qwen35_tp_n_ranks(const qwen35_tp *tp);
int qwen35_tp_n_threads(const qwen35_tp *tp);
/* Rank r's shard (its model and where its vocabulary slice begins). */
const tp_shard_model *qwen35_tp_shard(const qwen35_tp *tp, int r);
void qwen35_tp_set_gdn_mode(qwen35_tp *tp, qwen35_gdn_mode mode);
void qwen35_tp_set_dot_mode(qwen35_tp *tp, qwen35_dot_mode mode);

/* Bytes qwen35_tp_state_create allocates (all ranks) for n_ctx positions. */
uint64_t qwen35_tp_state_bytes(const qwen35_tp *tp, int n_ctx);
int qwen35_tp_state_create(const qwen35_tp *tp, int n_ctx, qwen35_tp_state **out, status *st);
void qwen35_tp_state_destroy(qwen35_tp_state *s);
void qwen35_tp_state_reset(qwen35_tp_state *s);
static inline int qwen35_tp_state_n_past(const qwen35_tp_state *s) { return s->rank[0]->n_past; }

int qwen35_tp_prefill(qwen35_tp *tp, qwen35_tp_state *s, const int32_t *tokens, int T,
                      float *logits, bool all_logits, status *st);
int qwen35_tp_decode_batch(qwen35_tp *tp, qwen35_tp_state *const *states, const int32_t *tokens,
                           int B, float *logits, status *st);

#endif
