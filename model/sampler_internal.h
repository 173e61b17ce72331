/* model/sampler internals, shared by its five files (not part of the API in sampler.h):
 *   sampler.c          the API: create / reset, the order of operations, the draw;
 *   sampler_penalty.c  the penalty multiset (accepted tokens, windowed counts) and step 1;
 *   sampler_rng.c      Philox-4x32-10 and the uniform of a draw;
 *   sampler_spec.c     speculative sampling: the distribution as probabilities, the verify draw;
 *   sampler_select.c   the O(V) loops (vectorised exp, sums, argmax, best n) and steps 4-7
 *                      (temperature, top-k, top-p, min-p) by selection, no vocabulary sort.
 * docs/SAMPLER.md numbers the steps. */
#ifndef DS_MODEL_SAMPLER_INTERNAL_H
#define DS_MODEL_SAMPLER_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "model/sampler.h"

/* Buckets of the top-p histogram: weights in [0, 1] keyed by their float bits >> 20. */
#define SAMPLER_HIST ((0x3F800000 >> 20) + 1)
/* Softmax normalisers and the draw add weights in blocks of this many, in order. */
#define SAMPLER_BLOCK 256

struct sampler {
    sampling_params p; /* resolved (defaults filled) */
    int32_t n_vocab;  /* V */
    int32_t n_ctx_max;
    uint64_t step;    /* RNG counter of the next sampler_sample call */

    /* Penalty bookkeeping: every accepted token in order, and the multiset of counted tokens
     * inside the window as a dense list indexed through an open-addressing hash map. */
    int32_t *seq;        /* owned, [n_ctx_max] accepted tokens in order */
    uint8_t *seq_counted; /* owned, [n_ctx_max] 1 if that token counts for penalties */
    int64_t n_seq;
    int32_t *d_tok;      /* owned, [n_dense_max] distinct counted tokens in the window */
    int32_t *d_cnt;      /* owned, [n_dense_max] their counts (> 0) */
    int32_t n_distinct;
    int32_t n_dense_max; /* min(V, n_ctx_max) */
    int32_t *map_key;    /* owned, [map_mask + 1] token id or -1 (empty) */
    int32_t *map_idx;    /* owned, [map_mask + 1] index into d_tok/d_cnt */
    uint32_t map_mask;
    uint32_t map_shift;  /* 32 - log2(capacity) */

    /* Sampling scratch. */
    int32_t *cand_id; /* owned, [V] candidate ids, ascending */
    float *cand_w;    /* owned, [V] their weights exp((z - z_max) / T) */
    float *sel;       /* owned, [V] copy permuted by the selections */
    double hist_mass[4][SAMPLER_HIST]; /* top-p histograms: weight mass per bucket */
};

/* ---- sampler_penalty.c ---- */

/* Forgets every accepted token: O(distinct tokens counted). */
void sampler_penalty_reset(sampler *s);
/* Step 1: the repetition, frequency and presence penalties on logits [V], in place. */
void sampler_penalty_apply(const sampler *s, float *logits);

/* ---- sampler_select.c ---- */

/* The largest of z[0, n) and its lowest index; *idx = -1 when nothing is > -inf; *any_nan
 * tells whether some z is nan. */
float sampler_select_argmax(const float *z, int64_t n, int64_t *idx, bool *any_nan);
/* w[i] = exp((z[i] - zmax) * inv_t) for i < n. */
void sampler_select_exp(const float *z, float zmax, float inv_t, float *w, int64_t n);
/* Sum of w[0, n), n <= SAMPLER_BLOCK, in a fixed order (8 double lanes). */
double sampler_select_block_sum(const float *w, int64_t n);
/* The softmax normaliser of w[0, n): block sums of SAMPLER_BLOCK added in order. */
double sampler_select_sum(const float *w, int64_t n);
/* The n best of z[0, V) in (value desc, id asc) order into bv/bi (n <= V). */
void sampler_select_best(const float *z, int32_t V, int32_t n, float *bv, int32_t *bi);
/* Steps 4-7 (temperature > 0; zmax the largest logit of z): the candidates left after
 * top-k, top-p and min-p, with weights exp((z - zmax) / T) in s->cand_w, in ascending id order.
 * *dense: the candidates are the whole vocabulary (cand_id not stored; filtered-out weights
 * are 0), else cand_id holds the ids. Returns their number (>= 1). */
int64_t sampler_select_filter(sampler *s, const float *z, float zmax, bool *dense);

#endif
