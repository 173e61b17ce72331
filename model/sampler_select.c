/* model/sampler selection: the O(V) loops (exp, sums, argmax, the n best), hand-vectorised,
 * and steps 4-7 of docs/SAMPLER.md (temperature, top-k, top-p, min-p) by selection and
 * partitioning, without sorting the vocabulary. */
#include <math.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "model/sampler_internal.h"

/* top-k up to this uses insertion behind a threshold; above it, selection by partitioning */
#define SAMPLER_TOPK_INSERT 128

/* ---- numeric helpers -------------------------------------------------------------------- */

/* The O(V) loops (exp, sums, argmax) are written on GCC/Clang generic vectors of 8 lanes
 * because -O2 does not vectorise them; each lane computes exactly what the scalar code
 * computes, so the results do not depend on the instruction set. They are compiled twice
 * (target_clones): for AVX2 (one ymm per vector) and the x86-64 baseline (two xmm). */
typedef float sampler_v8f __attribute__((vector_size(32)));
typedef int32_t sampler_v8i __attribute__((vector_size(32)));
typedef float sampler_v4f __attribute__((vector_size(16)));
typedef double sampler_v4d __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SAMPLER_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SAMPLER_CLONES
#endif

#define SAMPLER_SPLAT(x) ((sampler_v8f){x, x, x, x, x, x, x, x})

/* Helpers are macros, not functions: functions passing 32-byte vectors draw GCC ABI notes
 * when compiled without AVX. */
#define SAMPLER_LOAD8(dst, p) memcpy(&(dst), (p), sizeof(dst))
#define SAMPLER_SELECT(m, a, b) ((sampler_v8f)(((sampler_v8i)(a) & (m)) | ((sampler_v8i)(b) & ~(m))))

/* e^x for x <= 0; 0 below -87 (e^-87 = 1.6e-38) and for -inf. Cephes expf: Cody-Waite
 * reduction by ln 2 (ln2_hi = 0.693359375, ln2_lo = -2.12194440e-4), degree-5 polynomial,
 * about 1 ulp, no branches. Every softmax weight goes through it (docs/SAMPLER.md). */
static inline float sampler_exp(float x) {
    const bool small = x < -87.0f;
    const float xc = small ? -87.0f : x;
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
    const float r = (xc - n * 0.693359375f) - n * -2.12194440e-4f;
    const float r2 = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * r2 + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23; /* 2^n, n in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return small ? 0.0f : y * scale;
}

/* sampler_exp on 8 lanes, operation for operation: out[0..7] = exp(in[0..7]). */
static inline void sampler_exp8(const float *in, float *out) {
    sampler_v8f x;
    SAMPLER_LOAD8(x, in);
    const sampler_v8i small = x < SAMPLER_SPLAT(-87.0f);
    const sampler_v8f xc = SAMPLER_SELECT(small, SAMPLER_SPLAT(-87.0f), x);
    const sampler_v8f n = (xc * SAMPLER_SPLAT(1.44269504088896341f) + SAMPLER_SPLAT(12582912.0f)) -
                          SAMPLER_SPLAT(12582912.0f);
    const sampler_v8f r = (xc - n * SAMPLER_SPLAT(0.693359375f)) - n * SAMPLER_SPLAT(-2.12194440e-4f);
    const sampler_v8f r2 = r * r;
    sampler_v8f y = SAMPLER_SPLAT(1.9875691500e-4f);
    y = y * r + SAMPLER_SPLAT(1.3981999507e-3f);
    y = y * r + SAMPLER_SPLAT(8.3334519073e-3f);
    y = y * r + SAMPLER_SPLAT(4.1665795894e-2f);
    y = y * r + SAMPLER_SPLAT(1.6666665459e-1f);
    y = y * r + SAMPLER_SPLAT(5.0000001201e-1f);
    y = y * r2 + r + SAMPLER_SPLAT(1.0f);
    const sampler_v8i bits = (__builtin_convertvector(n, sampler_v8i) + 127) << 23;
    const sampler_v8f res = SAMPLER_SELECT(small, SAMPLER_SPLAT(0.0f), y * (sampler_v8f)bits);
    memcpy(out, &res, sizeof res);
}

/* w[i] = exp((z[i] - zmax) * inv_t) for i < n. */
SAMPLER_CLONES void sampler_select_exp(const float *z, float zmax, float inv_t, float *w, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        sampler_v8f v;
        SAMPLER_LOAD8(v, z + i);
        v = (v - SAMPLER_SPLAT(zmax)) * SAMPLER_SPLAT(inv_t);
        memcpy(w + i, &v, sizeof v);
        sampler_exp8(w + i, w + i);
    }
    for (; i < n; i++) w[i] = sampler_exp((z[i] - zmax) * inv_t);
}

/* w[i] = w[i] >= tau ? w[i] : 0: a filter on the whole vocabulary without compaction (a
 * zero weight is never drawn). */
SAMPLER_CLONES static void sampler_zero_below(float *w, int64_t n, float tau) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        sampler_v8f v;
        SAMPLER_LOAD8(v, w + i);
        v = SAMPLER_SELECT(v >= SAMPLER_SPLAT(tau), v, SAMPLER_SPLAT(0.0f));
        memcpy(w + i, &v, sizeof v);
    }
    for (; i < n; i++) w[i] = w[i] >= tau ? w[i] : 0.0f;
}

/* Sum of w[0, n), n <= SAMPLER_BLOCK, as 8 interleaved double lanes (lane l holds elements
 * l, l+8, ...) added ((0+1)+(2+3))+((4+5)+(6+7)). */
SAMPLER_CLONES double sampler_select_block_sum(const float *w, int64_t n) {
    sampler_v4d a = {0, 0, 0, 0}, b = {0, 0, 0, 0}; /* lanes 0-3, 4-7 */
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        sampler_v4f x, y;
        memcpy(&x, w + i, sizeof x);
        memcpy(&y, w + i + 4, sizeof y);
        a += __builtin_convertvector(x, sampler_v4d);
        b += __builtin_convertvector(y, sampler_v4d);
    }
    double lane[8] = {a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]};
    for (; i < n; i++) lane[i & 7] += w[i];
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* The softmax normaliser of weights w[0, n): block sums of SAMPLER_BLOCK added in order. */
double sampler_select_sum(const float *w, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i += SAMPLER_BLOCK)
        s += sampler_select_block_sum(w + i, n - i < SAMPLER_BLOCK ? n - i : SAMPLER_BLOCK);
    return s;
}

/* The largest of z[0, n) and its lowest index (8 lanes, each keeping its first maximum);
 * nan is never larger. *idx = -1 when nothing is > -inf; *any_nan tells whether some z is
 * nan (the same pass, so the check costs nothing extra). */
SAMPLER_CLONES float sampler_select_argmax(const float *z, int64_t n, int64_t *idx, bool *any_nan) {
    sampler_v8f best = SAMPLER_SPLAT(-INFINITY);
    sampler_v8i bi = {-1, -1, -1, -1, -1, -1, -1, -1}, cur = {0, 1, 2, 3, 4, 5, 6, 7};
    sampler_v8i nan = {0};
    int64_t i = 0;
    for (; i + 8 <= n && i + 8 <= INT32_MAX; i += 8) {
        sampler_v8f x;
        SAMPLER_LOAD8(x, z + i);
        const sampler_v8i gt = x > best;
        nan |= x != x;
        best = SAMPLER_SELECT(gt, x, best);
        bi = (gt & cur) | (~gt & bi);
        cur += 8;
    }
    float m = -INFINITY;
    int64_t mi = -1;
    bool has_nan = false;
    for (int l = 0; l < 8; l++) {
        has_nan |= nan[l] != 0;
        if (best[l] > m || (best[l] == m && bi[l] >= 0 && bi[l] < mi)) m = best[l], mi = bi[l];
    }
    for (; i < n; i++) {
        has_nan |= z[i] != z[i];
        if (z[i] > m) m = z[i], mi = i;
    }
    *idx = mi;
    *any_nan = has_nan;
    return m;
}

/* The n best of z[0, V) in (value desc, id asc) order into bv/bi (n <= V), by insertion
 * behind a threshold test: O(V) compares plus O(n log(V/n)) expected insertions. */
void sampler_select_best(const float *z, int32_t V, int32_t n, float *bv, int32_t *bi) {
    int32_t cnt = 0;
    int32_t i = 0;
    while (i < V) {
#ifdef __SSE2__
        if (cnt == n && i + 8 <= V) { /* full: skip 8 at a time while none beats the last */
            const __m128 t = _mm_set1_ps(bv[n - 1]);
            if (_mm_movemask_ps(_mm_or_ps(_mm_cmpgt_ps(_mm_loadu_ps(z + i), t),
                                          _mm_cmpgt_ps(_mm_loadu_ps(z + i + 4), t))) == 0) {
                i += 8;
                continue;
            }
        }
#endif
        const int32_t end = i + 8 < V ? i + 8 : V;
        for (; i < end; i++) {
            const float v = z[i];
            if (cnt == n && !(v > bv[n - 1])) continue;
            int32_t j = cnt < n ? cnt++ : n - 1;
            while (j > 0 && v > bv[j - 1]) {
                bv[j] = bv[j - 1];
                bi[j] = bi[j - 1];
                j--;
            }
            bv[j] = v;
            bi[j] = i;
        }
    }
}

/* ---- selection by partitioning ---------------------------------------------------------- */

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

/* Nucleus threshold over weights a[0, n) (all >= 0, permuted): taking the weights in
 * descending order, the shortest prefix whose sum reaches target is {w > *tau} plus *n_eq of
 * the weights == *tau (of *n_eq_all equal ones). Sums in double. If rounding leaves target
 * unreached, everything is kept (*tau = -1). */
static void sampler_nucleus(float *a, int64_t n, double target, float *tau, int64_t *n_eq,
                            int64_t *n_eq_all) {
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
            *n_eq_all = e - g;
            return;
        } else {
            above += m_gt + m_eq;
            lo = e;
        }
    }
    *tau = -1;
    *n_eq = *n_eq_all = 0;
}

/* Keeps the candidates with w > tau plus the first n_eq (lowest ids) with w == tau; the list
 * stays in ascending id order. dense: the list is the whole vocabulary (cand_id[i] == i,
 * not stored). Returns the new count. */
static int64_t sampler_keep(sampler *s, int64_t n, bool dense, float tau, int64_t n_eq) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) { /* branch-free: the outcome is often a coin toss */
        const float w = s->cand_w[i];
        const int64_t eq = (w == tau) & (n_eq > 0);
        n_eq -= eq;
        s->cand_id[m] = dense ? (int32_t)i : s->cand_id[i]; /* m <= i: reads before writes */
        s->cand_w[m] = w;
        m += (w > tau) | eq;
    }
    return m;
}

/* ---- the filters ------------------------------------------------------------------------ */

/* top-k into cand_id (ascending ids): the k best of z by (value desc, id asc). */
static int64_t sampler_top_k(sampler *s, const float *z, int32_t k) {
    const int32_t V = s->n_vocab;
    if (k <= SAMPLER_TOPK_INSERT) { /* insertion behind a threshold, then ids sorted */
        int32_t *ids = s->cand_id;
        sampler_select_best(z, V, k, s->sel, ids);
        for (int32_t i = 1; i < k; i++)
            for (int32_t j = i; j > 0 && ids[j] < ids[j - 1]; j--) {
                int32_t t = ids[j];
                ids[j] = ids[j - 1];
                ids[j - 1] = t;
            }
        return k;
    }
    /* large k: the k-th largest value by selection, then z > tau and the lowest ids of
     * z == tau up to k in all */
    memcpy(s->sel, z, (size_t)V * sizeof *z);
    float tau = sampler_kth_largest(s->sel, V, k);
    int64_t n_gt = 0, n = 0;
    for (int32_t i = 0; i < V; i++) n_gt += z[i] > tau;
    int64_t n_eq = k - n_gt;
    for (int32_t i = 0; i < V; i++)
        if (z[i] > tau || (z[i] == tau && n_eq-- > 0)) s->cand_id[n++] = i;
    return n;
}

/* top-p over the n candidates (weights in [0, 1], ascending ids) with target = top_p * S.
 * 1. Weights below eps = (1 - top_p) * S / n are never in the nucleus (everything they could
 *    precede weighs less than (1 - top_p) * S together), so only the others are looked at;
 *    for a peaked distribution that drops most of the vocabulary in one branch-free pass.
 * 2. A histogram of the survivors by the top 12 bits of the float (exponent and 3 mantissa
 *    bits: 8 buckets per octave) finds the bucket where the nucleus ends.
 * 3. Selection by partitioning inside that bucket gives the exact threshold.
 * On the whole vocabulary (*dense) without a tie to split at the threshold, the weights
 * below it are zeroed in place; otherwise the list is compacted (and *dense cleared). */
static int64_t sampler_top_p(sampler *s, int64_t n, bool *dense, double S, double target) {
    const float eps = (float)((S - target) / (double)n * 0.999);
    int64_t m = 0;
    for (int64_t i = 0; i < n;) {
#ifdef __SSE2__
        if (i + 8 <= n) { /* most weights of a peaked distribution: skip 8 at a time */
            const __m128 e = _mm_set1_ps(eps);
            if (_mm_movemask_ps(_mm_or_ps(_mm_cmpge_ps(_mm_loadu_ps(s->cand_w + i), e),
                                          _mm_cmpge_ps(_mm_loadu_ps(s->cand_w + i + 4), e))) == 0) {
                i += 8;
                continue;
            }
        }
#endif
        const int64_t end = i + 8 < n ? i + 8 : n;
        for (; i < end; i++) {
            const float w = s->cand_w[i];
            s->sel[m] = w;
            m += w >= eps;
        }
    }
    /* four interleaved histograms (element i into copy i & 3): neighbours often share a
     * bucket, and one copy would make every add wait for the previous one */
    double(*h)[SAMPLER_HIST] = s->hist_mass;
    memset(h, 0, sizeof s->hist_mass);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4)
        for (int c = 0; c < 4; c++) {
            uint32_t bits;
            memcpy(&bits, &s->sel[i + c], sizeof bits);
            h[c][bits >> 20] += s->sel[i + c];
        }
    for (; i < m; i++) {
        uint32_t bits;
        memcpy(&bits, &s->sel[i], sizeof bits);
        h[0][bits >> 20] += s->sel[i];
    }
    for (int b = 0; b < SAMPLER_HIST; b++) h[0][b] += (h[1][b] + h[2][b]) + h[3][b];
    double above = 0;
    int b = SAMPLER_HIST - 1;
    for (; b > 0 && above + h[0][b] < target; b--) above += h[0][b];
    int64_t k = 0; /* the boundary bucket's weights, moved to the front of sel */
    for (i = 0; i < m; i++) {
        const float w = s->sel[i];
        uint32_t bits;
        memcpy(&bits, &w, sizeof bits);
        s->sel[k] = w;
        k += (int)(bits >> 20) == b;
    }
    float tau;
    int64_t n_eq, n_eq_all;
    sampler_nucleus(s->sel, k, target - above, &tau, &n_eq, &n_eq_all);
    if (tau < 0) tau = 0, n_eq = n_eq_all = 0; /* rounding: keep every positive weight */
    if (*dense && n_eq == n_eq_all) { /* no tie to split: zero the weights below tau */
        sampler_zero_below(s->cand_w, n, tau);
        return n;
    }
    n = sampler_keep(s, n, *dense, tau, n_eq);
    *dense = false;
    return n;
}

/* Steps 4-7 (sampler_internal.h). */
int64_t sampler_select_filter(sampler *s, const float *z, float zmax, bool *dense) {
    const sampling_params *p = &s->p;
    const int32_t V = s->n_vocab;
    const float inv_t = 1.0f / p->temperature;
    int64_t n;
    if (p->top_k > 0 && p->top_k < V) {
        n = sampler_top_k(s, z, p->top_k);
        *dense = false;
        for (int64_t i = 0; i < n; i++) s->cand_w[i] = sampler_exp((z[s->cand_id[i]] - zmax) * inv_t);
    } else {
        n = V;
        *dense = true;
        sampler_select_exp(z, zmax, inv_t, s->cand_w, n); /* -inf logits get weight 0 */
    }
    /* the largest weight is exactly 1 */
    if (p->top_p < 1) {
        const double S = sampler_select_sum(s->cand_w, n);
        n = sampler_top_p(s, n, dense, S, (double)p->top_p * S);
    }
    /* min-p: p_i >= min_p * p_max, i.e. w_i >= min_p (w_max = 1 survives every filter) */
    if (p->min_p > 0) {
        if (*dense) {
            sampler_zero_below(s->cand_w, n, p->min_p);
        } else {
            n = sampler_keep(s, n, *dense, p->min_p, n); /* every w == min_p stays too */
        }
    }
    DS_ASSERT(n > 0);
    return n;
}
