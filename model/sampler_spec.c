/* model/sampler speculative sampling (sampler.h): the distribution a sampler draws from, as
 * probabilities (a draft head's q), and the verify draw that keeps a draft with probability
 * min(1, p/q) and otherwise draws from norm(max(0, p - q)), so that the token is distributed
 * as p whatever q is (Leviathan et al. 2023; Chen et al. 2023). */
#include <math.h>
#include <string.h>

#include "model/sampler_internal.h"

/* Steps 4-7 on z into s->cand_w, then their normaliser. */
static double sampler_spec_filter(sampler *s, const float *z, bool *dense, int64_t *n) {
    int64_t argmax;
    bool any_nan;
    const float zmax = sampler_select_argmax(z, s->n_vocab, &argmax, &any_nan);
    if (any_nan || !(zmax > -INFINITY) || zmax == INFINITY) return -1;
    *n = sampler_select_filter(s, z, zmax, dense);
    return sampler_select_sum(s->cand_w, *n);
}

int sampler_probs(sampler *s, const float *logits, float *q) {
    DS_ASSERT(s->p.temperature > 0 && sampling_params_no_penalty(&s->p));
    bool dense;
    int64_t n;
    const double S = sampler_spec_filter(s, logits, &dense, &n);
    if (!(S > 0)) return -1;
    if (dense) {
        for (int64_t i = 0; i < n; i++) q[i] = (float)((double)s->cand_w[i] / S);
    } else {
        memset(q, 0, (size_t)s->n_vocab * sizeof *q);
        for (int64_t i = 0; i < n; i++) q[s->cand_id[i]] = (float)((double)s->cand_w[i] / S);
    }
    return 0;
}

int32_t sampler_draw_probs(const float *q, int32_t V, float u) {
    double acc = 0, target = (double)u;
    int32_t last = -1;
    for (int32_t i = 0; i < V; i++) {
        if (!(q[i] > 0)) continue;
        acc += q[i];
        last = i;
        if (acc > target) return i;
    }
    return last; /* rounding: the last token with mass */
}

/* The two uniforms of a verify draw: Philox of (step, 1) under the request's key, so that they
 * are independent of every plain draw (counter word 2 is 0 there). */
static void sampler_spec_uniforms(const sampler *s, uint64_t step, float u[2]) {
    const uint32_t ctr[4] = {(uint32_t)step, (uint32_t)(step >> 32), 1, 0};
    const uint32_t key[2] = {(uint32_t)s->p.seed, (uint32_t)(s->p.seed >> 32)};
    uint32_t r[4];
    sampler_philox4x32_10(ctr, key, r);
    u[0] = (float)(r[0] >> 8) * 0x1p-24f;
    u[1] = (float)(r[1] >> 8) * 0x1p-24f;
}

int32_t sampler_sample_verify(sampler *s, float *logits, int32_t draft, const float *q,
                              sample_result *out) {
    if (s->p.temperature == 0 || !q) return sampler_sample(s, logits, out);
    DS_ASSERT(sampling_params_no_penalty(&s->p) && draft >= 0 && draft < s->n_vocab);
    const uint64_t step = s->step;
    /* logprobs and the step's accounting as sampler_sample; its draw is replaced below */
    if (sampler_sample(s, logits, out) < 0) return -1;
    bool dense;
    int64_t n;
    const double S = sampler_spec_filter(s, logits, &dense, &n);
    if (!(S > 0)) return -1;
    float u[2];
    sampler_spec_uniforms(s, step, u);
    /* p(draft): its weight among the candidates (ascending ids), 0 when filtered out */
    double pd = 0;
    if (dense) {
        pd = (double)s->cand_w[draft] / S;
    } else {
        int64_t lo = 0, hi = n;
        while (lo < hi) {
            const int64_t mid = (lo + hi) / 2;
            if (s->cand_id[mid] < draft) lo = mid + 1;
            else hi = mid;
        }
        if (lo < n && s->cand_id[lo] == draft) pd = (double)s->cand_w[lo] / S;
    }
    const double qd = q[draft];
    int32_t tok;
    if ((double)u[0] * qd < pd) {
        tok = draft; /* kept with probability min(1, p/q) */
    } else {
        /* rejected (so p(draft) < q(draft)): the residual max(0, p - q), whose mass at the
           draft is 0, into sel[0 .. n), then a draw from it */
        double R = 0;
        for (int64_t i = 0; i < n; i++) {
            const int32_t id = dense ? (int32_t)i : s->cand_id[i];
            const double r = (double)s->cand_w[i] / S - (double)q[id];
            s->sel[i] = r > 0 ? (float)r : 0.0f;
            R += s->sel[i];
        }
        tok = -1;
        if (R > 0) {
            const double target = (double)u[1] * R;
            double acc = 0;
            for (int64_t i = 0; i < n && tok < 0; i++) {
                if (!(s->sel[i] > 0)) continue;
                acc += s->sel[i];
                if (acc > target) tok = dense ? (int32_t)i : s->cand_id[i];
            }
            for (int64_t i = n - 1; tok < 0 && i >= 0; i--) /* rounding: the last with mass */
                if (s->sel[i] > 0) tok = dense ? (int32_t)i : s->cand_id[i];
        }
        if (tok < 0) tok = draft; /* p == q to rounding: nothing to correct */
    }
    if (out) {
        out->token = tok;
        if (out->n_top > 0) { /* the logprob of the token kept, at temperature 1 */
            int64_t a;
            bool nan;
            const float zmax = sampler_select_argmax(logits, s->n_vocab, &a, &nan);
            sampler_select_exp(logits, zmax, 1.0f, s->sel, s->n_vocab);
            const double lse = (double)zmax + log(sampler_select_sum(s->sel, s->n_vocab));
            out->logprob = (float)((double)logits[tok] - lse);
        }
    }
    return tok;
}
