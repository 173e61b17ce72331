/* Token sampler (model/sampler.h): the API, the order of operations and the draw. The parts:
 * sampler_penalty.c (step 1), sampler_select.c (the O(V) loops, steps 4-7), sampler_rng.c
 * (Philox); sampler_internal.h lists them. The definition it implements, step by step, is
 * docs/SAMPLER.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler_internal.h"

/* ---- params ----------------------------------------------------------------------------- */

/* The sampler takes parameters validated where the request entered the process (a violation
 * is a caller bug) and keeps them resolved: resolution is idempotent, so resolved parameters
 * and zero-defaulted ones (a zeroed struct = greedy) mean the same here. */
static sampling_params sampler_take_params(const sampling_params *p) {
    DS_ASSERT(sampling_params_validate(p, NULL, NULL) == STATUS_OK);
    return sampling_params_resolve(p);
}

/* ---- create / reset --------------------------------------------------------------------- */

int sampler_create(sampler **out, int32_t n_vocab, int32_t n_ctx_max, const sampling_params *p,
                   status *st) {
    *out = NULL;
    if (n_vocab < 1 || n_ctx_max < 1)
        return status_fail(st, STATUS_INVALID, "sampler: n_vocab %d, n_ctx_max %d: must be >= 1",
                           (int)n_vocab, (int)n_ctx_max);
    sampler *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "sampler: out of memory");
    s->p = sampler_take_params(p);
    s->n_vocab = n_vocab;
    s->n_ctx_max = n_ctx_max;
    s->n_dense_max = n_vocab < n_ctx_max ? n_vocab : n_ctx_max;
    uint32_t cap = 16, bits = 4;
    while (cap < 2u * (uint32_t)s->n_dense_max) cap <<= 1, bits++;
    s->map_mask = cap - 1;
    s->map_shift = 32 - bits;
    s->seq = malloc((size_t)n_ctx_max * sizeof *s->seq);
    s->seq_counted = malloc((size_t)n_ctx_max);
    s->d_tok = malloc((size_t)s->n_dense_max * sizeof *s->d_tok);
    s->d_cnt = malloc((size_t)s->n_dense_max * sizeof *s->d_cnt);
    s->map_key = malloc((size_t)cap * sizeof *s->map_key);
    s->map_idx = malloc((size_t)cap * sizeof *s->map_idx);
    s->cand_id = malloc((size_t)n_vocab * sizeof *s->cand_id);
    s->cand_w = malloc((size_t)n_vocab * sizeof *s->cand_w);
    s->sel = malloc((size_t)n_vocab * sizeof *s->sel);
    if (!s->seq || !s->seq_counted || !s->d_tok || !s->d_cnt || !s->map_key || !s->map_idx ||
        !s->cand_id || !s->cand_w || !s->sel) {
        sampler_destroy(s);
        return status_fail(st, STATUS_NOMEM, "sampler: out of memory (vocab %d, context %d)",
                           (int)n_vocab, (int)n_ctx_max);
    }
    memset(s->map_key, 0xFF, (size_t)cap * sizeof *s->map_key); /* all -1 */
    *out = s;
    return STATUS_OK;
}

void sampler_destroy(sampler *s) {
    if (!s) return;
    free(s->seq);
    free(s->seq_counted);
    free(s->d_tok);
    free(s->d_cnt);
    free(s->map_key);
    free(s->map_idx);
    free(s->cand_id);
    free(s->cand_w);
    free(s->sel);
    free(s);
}

void sampler_reset(sampler *s, const sampling_params *p) {
    const sampling_params r = sampler_take_params(p);
    sampler_penalty_reset(s);
    s->step = 0;
    s->p = r;
}

uint64_t sampler_step(const sampler *s) { return s->step; }

/* ---- sample ----------------------------------------------------------------------------- */

/* Steps 4-9 for temperature > 0. zmax is the largest logit. */
static int32_t sampler_draw(sampler *s, const float *z, float zmax, uint64_t step) {
    bool dense; /* candidates = the whole vocabulary, ids implicit */
    const int64_t n = sampler_select_filter(s, z, zmax, &dense);
    DS_ASSERT(n > 0);
    /* the draw: target = u * S; the first candidate (ascending ids) whose running sum
     * exceeds it, found block by block with the same block sums as S */
    const double target = (double)sampler_uniform(s->p.seed, step) * sampler_select_sum(s->cand_w, n);
    double acc = 0;
    int64_t pick = -1;
    for (int64_t b = 0; b < n && pick < 0; b += SAMPLER_BLOCK) {
        const int64_t nb = n - b < SAMPLER_BLOCK ? n - b : SAMPLER_BLOCK;
        const double bs = sampler_select_block_sum(s->cand_w + b, nb);
        if (acc + bs <= target) {
            acc += bs;
            continue;
        }
        for (int64_t i = b; i < b + nb && pick < 0; i++) {
            acc += s->cand_w[i];
            if (acc > target) pick = i;
        }
    }
    if (pick < 0) /* rounding: the last candidate with weight */
        for (pick = n - 1; pick > 0 && !(s->cand_w[pick] > 0); pick--) {}
    return dense ? (int32_t)pick : s->cand_id[pick];
}

int32_t sampler_sample(sampler *s, float *logits, sample_result *out) {
    const sampling_params *p = &s->p;
    const int32_t V = s->n_vocab;
    uint64_t step = s->step++;
    if (out) {
        out->token = -1;
        out->logprob = 0;
        out->n_top = 0;
    }
    sampler_penalty_apply(s, logits);
    int64_t argmax;
    bool any_nan;
    const float zmax = sampler_select_argmax(logits, V, &argmax, &any_nan);
    /* a broken model: nothing finite, a nan, or +inf (whose weight would be inf/inf) */
    if (any_nan || !(zmax > -INFINITY) || zmax == INFINITY) return -1;
    double lse = 0;
    const bool want_lp = out && p->n_logprobs > 0;
    if (want_lp) { /* log-softmax at temperature 1 over the vocabulary */
        sampler_select_exp(logits, zmax, 1.0f, s->cand_w, V);
        lse = (double)zmax + log(sampler_select_sum(s->cand_w, V));
        int32_t n = p->n_logprobs < V ? p->n_logprobs : V;
        float bv[SAMPLING_MAX_LOGPROBS];
        int32_t bi[SAMPLING_MAX_LOGPROBS];
        sampler_select_best(logits, V, n, bv, bi);
        out->n_top = p->n_logprobs;
        for (int32_t j = 0; j < p->n_logprobs; j++) {
            out->top_id[j] = j < n ? bi[j] : -1;
            out->top_logprob[j] = j < n ? (float)((double)bv[j] - lse) : -INFINITY;
        }
    }
    int32_t tok;
    if (p->temperature == 0)
        tok = (int32_t)argmax; /* lowest id of the maximum */
    else
        tok = sampler_draw(s, logits, zmax, step);
    if (out) {
        out->token = tok;
        if (want_lp) out->logprob = (float)((double)logits[tok] - lse);
    }
    return tok;
}
