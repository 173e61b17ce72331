/* Token sampler (model/sampler.h): penalties over a windowed token multiset, greedy,
 * temperature / top-k / top-p / min-p by selection (no vocabulary sort), Philox-4x32-10.
 * The definition it implements, step by step, is docs/SAMPLER.md. */
#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct sampler {
    sampler_params p; /* resolved (defaults filled) */
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
};

/* ---- params ----------------------------------------------------------------------------- */

int sampler_params_validate(const sampler_params *p, status *st) {
    if (!isfinite(p->temperature) || p->temperature < 0)
        return status_fail(st, STATUS_INVALID, "sampler: temperature = %g: must be finite and >= 0 (0 = greedy)",
                           (double)p->temperature);
    if (p->top_k < 0)
        return status_fail(st, STATUS_INVALID, "sampler: top_k = %d: must be >= 0 (0 = off)", (int)p->top_k);
    if (!(p->top_p >= 0 && p->top_p <= 1)) /* also rejects nan */
        return status_fail(st, STATUS_INVALID, "sampler: top_p = %g: must be in (0, 1] (0 = default 1)",
                           (double)p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return status_fail(st, STATUS_INVALID, "sampler: min_p = %g: must be in [0, 1] (0 = off)", (double)p->min_p);
    if (!isfinite(p->repetition_penalty) || p->repetition_penalty < 0)
        return status_fail(st, STATUS_INVALID,
                           "sampler: repetition_penalty = %g: must be finite and > 0 (0 = default 1)",
                           (double)p->repetition_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return status_fail(st, STATUS_INVALID, "sampler: presence_penalty = %g: must be in [-2, 2]",
                           (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return status_fail(st, STATUS_INVALID, "sampler: frequency_penalty = %g: must be in [-2, 2]",
                           (double)p->frequency_penalty);
    if (p->penalty_window < 0)
        return status_fail(st, STATUS_INVALID, "sampler: penalty_window = %d: must be >= 0 (0 = all)",
                           (int)p->penalty_window);
    if (p->n_logprobs < 0 || p->n_logprobs > SAMPLER_MAX_LOGPROBS)
        return status_fail(st, STATUS_INVALID, "sampler: n_logprobs = %d: must be in [0, %d]",
                           (int)p->n_logprobs, SAMPLER_MAX_LOGPROBS);
    return STATUS_OK;
}

sampler_params sampler_params_resolve(const sampler_params *p) {
    sampler_params r = *p;
    if (r.top_p == 0) r.top_p = 1;
    if (r.repetition_penalty == 0) r.repetition_penalty = 1;
    return r;
}

/* ---- RNG: Philox-4x32-10 ---------------------------------------------------------------- */

void sampler_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) { /* key schedule: Weyl sequence */
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0, c1 = lo1, c2 = n2, c3 = lo0;
    }
    out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

float sampler_uniform(uint64_t seed, uint64_t step) {
    const uint32_t ctr[4] = {(uint32_t)step, (uint32_t)(step >> 32), 0, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t r[4];
    sampler_philox4x32_10(ctr, key, r);
    return (float)(r[0] >> 8) * 0x1p-24f;
}

/* ---- create / reset --------------------------------------------------------------------- */

int sampler_create(sampler **out, int32_t n_vocab, int32_t n_ctx_max, const sampler_params *p,
                   status *st) {
    *out = NULL;
    if (n_vocab < 1 || n_ctx_max < 1)
        return status_fail(st, STATUS_INVALID, "sampler: n_vocab %d, n_ctx_max %d: must be >= 1",
                           (int)n_vocab, (int)n_ctx_max);
    int rc = sampler_params_validate(p, st);
    if (rc) return rc;
    sampler *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "sampler: out of memory");
    s->p = sampler_params_resolve(p);
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

static inline uint32_t sampler_hash(const sampler *s, int32_t tok) {
    return ((uint32_t)tok * 2654435761u) >> s->map_shift;
}

/* Slot holding tok, or the empty slot where it would go. */
static uint32_t sampler_map_slot(const sampler *s, int32_t tok) {
    uint32_t i = sampler_hash(s, tok);
    while (s->map_key[i] != -1 && s->map_key[i] != tok) i = (i + 1) & s->map_mask;
    return i;
}

int sampler_reset(sampler *s, const sampler_params *p, status *st) {
    int rc = sampler_params_validate(p, st);
    if (rc) return rc;
    /* find every occupied slot first (clearing one breaks the probe chains of others) */
    for (int32_t k = 0; k < s->n_distinct; k++) s->d_cnt[k] = (int32_t)sampler_map_slot(s, s->d_tok[k]);
    for (int32_t k = 0; k < s->n_distinct; k++) s->map_key[s->d_cnt[k]] = -1;
    s->n_distinct = 0;
    s->n_seq = 0;
    s->step = 0;
    s->p = sampler_params_resolve(p);
    return STATUS_OK;
}

uint64_t sampler_step(const sampler *s) { return s->step; }

/* ---- penalty multiset ------------------------------------------------------------------- */

static void sampler_count_add(sampler *s, int32_t tok) {
    uint32_t i = sampler_map_slot(s, tok);
    if (s->map_key[i] == tok) {
        s->d_cnt[s->map_idx[i]]++;
        return;
    }
    DS_ASSERT(s->n_distinct < s->n_dense_max);
    s->map_key[i] = tok;
    s->map_idx[i] = s->n_distinct;
    s->d_tok[s->n_distinct] = tok;
    s->d_cnt[s->n_distinct] = 1;
    s->n_distinct++;
}

/* Linear-probing deletion with backward shift: later entries of the probe run whose home
 * slot is not cyclically in (i, j] move back into the hole. */
static void sampler_map_delete(sampler *s, uint32_t i) {
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & s->map_mask;
        if (s->map_key[j] == -1) break;
        uint32_t h = sampler_hash(s, s->map_key[j]);
        bool stays = i <= j ? (h > i && h <= j) : (h > i || h <= j);
        if (!stays) {
            s->map_key[i] = s->map_key[j];
            s->map_idx[i] = s->map_idx[j];
            i = j;
        }
    }
    s->map_key[i] = -1;
}

static void sampler_count_remove(sampler *s, int32_t tok) {
    uint32_t i = sampler_map_slot(s, tok);
    DS_ASSERT(s->map_key[i] == tok);
    int32_t k = s->map_idx[i];
    if (--s->d_cnt[k] > 0) return;
    sampler_map_delete(s, i);
    int32_t last = --s->n_distinct;
    if (k != last) { /* move the last dense entry into the hole */
        s->d_tok[k] = s->d_tok[last];
        s->d_cnt[k] = s->d_cnt[last];
        s->map_idx[sampler_map_slot(s, s->d_tok[k])] = k;
    }
}

static void sampler_push(sampler *s, int32_t tok, bool counted) {
    DS_ASSERT(tok >= 0 && tok < s->n_vocab);
    DS_ASSERT(s->n_seq < s->n_ctx_max);
    s->seq[s->n_seq] = tok;
    s->seq_counted[s->n_seq] = counted;
    s->n_seq++;
    if (counted) sampler_count_add(s, tok);
    int64_t w = s->p.penalty_window;
    if (w > 0 && s->n_seq > w) { /* position n_seq - 1 - w leaves the window */
        int64_t old = s->n_seq - 1 - w;
        if (s->seq_counted[old]) sampler_count_remove(s, s->seq[old]);
    }
}

void sampler_accept_prompt(sampler *s, const int32_t *ids, int64_t n) {
    for (int64_t i = 0; i < n; i++) sampler_push(s, ids[i], s->p.penalize_prompt);
}

void sampler_accept(sampler *s, int32_t token) { sampler_push(s, token, true); }

static void sampler_apply_penalties(const sampler *s, float *logits) {
    const float rp = s->p.repetition_penalty, fp = s->p.frequency_penalty, pp = s->p.presence_penalty;
    if (rp == 1 && fp == 0 && pp == 0) return;
    for (int32_t k = 0; k < s->n_distinct; k++) {
        float z = logits[s->d_tok[k]];
        z = z > 0 ? z / rp : z * rp;
        z -= (float)s->d_cnt[k] * fp + pp;
        logits[s->d_tok[k]] = z;
    }
}

/* ---- selection -------------------------------------------------------------------------- */

/* Three-way partition of a[lo, hi) in descending order around v: on return a[lo, *g) > v,
 * a[*g, *e) == v, a[*e, hi) < v. Returns the sum of the elements > v. */
static double sampler_part3(float *a, int64_t lo, int64_t hi, float v, int64_t *g, int64_t *e) {
    int64_t lt = lo, i = lo, gt = hi;
    double sum_gt = 0;
    while (i < gt) {
        float x = a[i];
        if (x > v) {
            sum_gt += x;
            a[i++] = a[lt];
            a[lt++] = x;
        } else if (x < v) {
            a[i] = a[--gt];
            a[gt] = x;
        } else {
            i++;
        }
    }
    *g = lt;
    *e = gt;
    return sum_gt;
}

/* Median of three spread-out elements: the pivot only affects the running time. */
static float sampler_pivot(const float *a, int64_t lo, int64_t hi) {
    float x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi - 1];
    if (x > y) { float t = x; x = y; y = t; }
    if (y > z) y = z;
    return x > y ? x : y;
}

/* The k-th largest (1-based) of a[0, n); a is permuted. */
static float sampler_kth_largest(float *a, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n;
    for (;;) {
        float v = sampler_pivot(a, lo, hi);
        int64_t g, e;
        sampler_part3(a, lo, hi, v, &g, &e);
        if (k <= g - lo) {
            hi = g;
        } else if (k <= e - lo) {
            return v;
        } else {
            k -= e - lo;
            lo = e;
        }
    }
}

/* Nucleus threshold over weights a[0, n) (all >= 0, permuted): the smallest set of largest
 * weights whose sum reaches target is {w > *tau} plus *n_eq of the weights == *tau.
 * Sums in double. If rounding leaves target unreached, everything is kept (*tau = -1). */
static void sampler_nucleus(float *a, int64_t n, double target, float *tau, int64_t *n_eq) {
    int64_t lo = 0, hi = n;
    double above = 0; /* mass of the weights known to be larger than all of a[lo, hi) */
    while (lo < hi) {
        float v = sampler_pivot(a, lo, hi);
        int64_t g, e;
        double m_gt = sampler_part3(a, lo, hi, v, &g, &e);
        double m_eq = (double)(e - g) * v;
        if (g > lo && above + m_gt >= target) {
            hi = g;
        } else if (above + m_gt + m_eq >= target) {
            int64_t need = v > 0 ? (int64_t)ceil((target - above - m_gt) / v) : e - g;
            if (need < 1) need = 1;
            if (need > e - g) need = e - g;
            *tau = v;
            *n_eq = need;
            return;
        } else {
            above += m_gt + m_eq;
            lo = e;
        }
    }
    *tau = -1;
    *n_eq = 0;
}

/* Keeps the candidates with w > tau plus the first n_eq (lowest ids) with w == tau; the list
 * stays in ascending id order. Returns the new count. */
static int64_t sampler_keep(sampler *s, int64_t n, float tau, int64_t n_eq) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        float w = s->cand_w[i];
        if (w > tau || (w == tau && n_eq-- > 0)) {
            s->cand_id[m] = s->cand_id[i];
            s->cand_w[m] = w;
            m++;
        }
    }
    return m;
}

/* ---- sample ----------------------------------------------------------------------------- */

/* Steps 4-9 for temperature > 0. zmax is the largest logit. */
static int32_t sampler_draw(sampler *s, const float *z, float zmax, uint64_t step) {
    const sampler_params *p = &s->p;
    const int32_t V = s->n_vocab;
    const float T = p->temperature;
    int64_t n = 0;
    /* top-k: z > tau_k, plus the lowest ids of z == tau_k up to k in all */
    if (p->top_k > 0 && p->top_k < V) {
        memcpy(s->sel, z, (size_t)V * sizeof *z);
        float tau = sampler_kth_largest(s->sel, V, p->top_k);
        int64_t n_gt = 0;
        for (int32_t i = 0; i < V; i++) n_gt += z[i] > tau;
        int64_t n_eq = p->top_k - n_gt;
        for (int32_t i = 0; i < V; i++)
            if (z[i] > tau || (z[i] == tau && n_eq-- > 0)) s->cand_id[n++] = i;
    } else {
        for (int32_t i = 0; i < V; i++)
            if (z[i] > -INFINITY) s->cand_id[n++] = i;
    }
    /* temperature and the unnormalised softmax: the largest weight is exactly 1 */
    for (int64_t i = 0; i < n; i++) s->cand_w[i] = expf((z[s->cand_id[i]] - zmax) / T);
    /* top-p */
    if (p->top_p < 1) {
        double sum = 0;
        for (int64_t i = 0; i < n; i++) sum += s->cand_w[i];
        memcpy(s->sel, s->cand_w, (size_t)n * sizeof *s->sel);
        float tau;
        int64_t n_eq;
        sampler_nucleus(s->sel, n, (double)p->top_p * sum, &tau, &n_eq);
        n = sampler_keep(s, n, tau, n_eq);
    }
    /* min-p: p_i >= min_p * p_max, i.e. w_i >= min_p (w_max = 1 survives every filter) */
    if (p->min_p > 0) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if (s->cand_w[i] >= p->min_p) {
                s->cand_id[m] = s->cand_id[i];
                s->cand_w[m++] = s->cand_w[i];
            }
        n = m;
    }
    DS_ASSERT(n > 0);
    /* softmax normaliser and the draw, both summed in ascending id order in double */
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += s->cand_w[i];
    double target = (double)sampler_uniform(p->seed, step) * sum;
    double acc = 0;
    for (int64_t i = 0; i < n; i++) {
        acc += s->cand_w[i];
        if (acc > target) return s->cand_id[i];
    }
    for (int64_t i = n - 1; i > 0; i--) /* rounding: the last token with weight */
        if (s->cand_w[i] > 0) return s->cand_id[i];
    return s->cand_id[0];
}

/* The n highest logits, descending, lowest id first on ties; lse the log normaliser. Entries
 * beyond the vocabulary (n > V) are token -1, logprob -inf. */
static void sampler_top_logprobs(const float *z, int32_t V, int32_t n, double lse,
                                 sampler_logprob *top) {
    for (int32_t j = V; j < n; j++) top[j] = (sampler_logprob){.token = -1, .logprob = -INFINITY};
    if (n > V) n = V;
    int32_t cnt = 0;
    for (int32_t i = 0; i < V; i++) {
        if (cnt == n && !(z[i] > top[n - 1].logprob)) continue;
        int32_t j = cnt < n ? cnt++ : n - 1; /* insertion: shift smaller ones down */
        while (j > 0 && z[i] > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j].token = i;
        top[j].logprob = z[i]; /* the logit until the end */
    }
    for (int32_t j = 0; j < n; j++) top[j].logprob = (float)((double)top[j].logprob - lse);
}

int32_t sampler_sample(sampler *s, float *logits, sampler_logprob *top, float *chosen_logprob) {
    const sampler_params *p = &s->p;
    const int32_t V = s->n_vocab;
    uint64_t step = s->step++;
    sampler_apply_penalties(s, logits);
    float zmax = logits[0];
    int32_t argmax = 0;
    for (int32_t i = 1; i < V; i++)
        if (logits[i] > zmax) zmax = logits[i], argmax = i;
    DS_ASSERT(zmax > -INFINITY); /* at least one finite logit (and no nan in front) */
    double lse = 0;
    bool want_top = top && p->n_logprobs > 0;
    if (want_top || chosen_logprob) {
        double sum = 0;
        for (int32_t i = 0; i < V; i++) sum += expf(logits[i] - zmax);
        lse = (double)zmax + log(sum);
    }
    if (want_top) sampler_top_logprobs(logits, V, p->n_logprobs, lse, top);
    int32_t tok = p->temperature == 0 ? argmax : sampler_draw(s, logits, zmax, step);
    if (chosen_logprob) *chosen_logprob = (float)((double)logits[tok] - lse);
    return tok;
}
