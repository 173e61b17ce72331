/* Unit tests for model/sampler: create checks, the Philox RNG, greedy, determinism, the sampled
 * distribution of every filter combination against a brute-force reference (chi-square with
 * a fixed seed), penalties with exact values and a sliding window, logprobs, and no
 * allocation after create (malloc is wrapped at link time: see tests/model/BUILD). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/sampler.h"
#include "tests/testutil/alloc_count.h"
#include "tests/testutil/testutil.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static float rng_uniform(uint64_t *s) { /* [0, 1) */
    return (float)((testutil_rng_next(s) >> 40) * (1.0 / 16777216.0));
}

static sampler *make(int32_t V, int32_t n_ctx, const sampling_params *p) {
    sampler *s = NULL;
    status st = {0};
    int rc = sampler_create(&s, V, n_ctx, p, &st);
    if (rc) printf("\n  sampler_create: %s\n", st.msg);
    CU_ASSERT_EQUAL_FATAL(rc, STATUS_OK);
    return s;
}

/* The definition of docs/SAMPLER.md, written plainly (sort, double precision): the
 * probability of each token after temperature, top-k, top-p, min-p. */
static void ref_dist(const float *z, int V, const sampling_params *p0, double *prob) {
    sampling_params p = sampling_params_resolve(p0);
    int order[64];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 1; i < V; i++) /* insertion sort: z desc, id asc */
        for (int j = i; j > 0 && (z[order[j]] > z[order[j - 1]] ||
                                  (z[order[j]] == z[order[j - 1]] && order[j] < order[j - 1])); j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    for (int i = 0; i < V; i++) prob[i] = 0;
    if (p.temperature == 0) {
        prob[order[0]] = 1;
        return;
    }
    int n = p.top_k > 0 && p.top_k < V ? p.top_k : V;
    double w[64], S = 0;
    for (int r = 0; r < n; r++) S += w[r] = exp(((double)z[order[r]] - z[order[0]]) / p.temperature);
    if (p.top_p < 1) {
        double cum = 0;
        int m = 0;
        while (m < n && cum < p.top_p * S) cum += w[m++];
        n = m;
    }
    double T = 0;
    for (int r = 0; r < n; r++) {
        if (w[r] < p.min_p * w[0]) continue;
        prob[order[r]] = w[r];
        T += w[r];
    }
    for (int i = 0; i < V; i++) prob[i] /= T;
}

/* Chi-square critical value for df at upper tail z sigma (Wilson-Hilferty). */
static double chi2_crit(int df, double z) {
    double a = 2.0 / (9.0 * df);
    return df * pow(1 - a + z * sqrt(a), 3);
}

/* Pearson chi-square of counts against prob; counts where prob is 0 must be 0 (else inf). */
static double chi2(const long *cnt, const double *prob, int V, long N, int *df) {
    double c = 0;
    *df = -1;
    for (int i = 0; i < V; i++) {
        if (prob[i] == 0) {
            if (cnt[i]) return INFINITY;
            continue;
        }
        double e = prob[i] * N;
        c += (cnt[i] - e) * (cnt[i] - e) / e;
        (*df)++;
    }
    return c;
}

/* ---- parameters ------------------------------------------------------------------------ */

/* Parameters arrive validated (common/sampling.h, tested in tests/common/sampling_test.c);
 * the tests write them zero-defaulted, as requests do, which the sampler resolves. */
static void test_create_checks(void) {
    sampling_params z = {0}, p = z;
    sampler *s = NULL;
    status st = {0};
    CU_ASSERT_EQUAL(sampler_create(&s, 0, 10, &z, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "n_vocab"));
    CU_ASSERT_PTR_NULL(s);
    s = make(10, 10, &z); /* create resolves the zero defaults */
    sampler_accept(s, 3);
    float lg[10] = {0};
    lg[3] = 1;
    CU_ASSERT_EQUAL(sampler_sample(s, lg, NULL), 3);
    CU_ASSERT_EQUAL(sampler_step(s), 1);
    p.temperature = 0.5f;
    sampler_reset(s, &p);
    CU_ASSERT_EQUAL(sampler_step(s), 0);
    sampler_destroy(s);
}

/* ---- RNG -------------------------------------------------------------------------------- */

static void test_philox_kat(void) {
    /* Random123 kat_vectors, philox4x32 10 */
    static const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                       {~0u, ~0u, ~0u, ~0u},
                                       {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}};
    static const uint32_t key[3][2] = {{0, 0}, {~0u, ~0u}, {0xa4093822, 0x299f31d0}};
    static const uint32_t want[3][4] = {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
                                        {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
                                        {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}};
    for (int k = 0; k < 3; k++) {
        uint32_t out[4];
        sampler_philox4x32_10(ctr[k], key[k], out);
        CU_ASSERT(memcmp(out, want[k], sizeof out) == 0);
    }
    /* the uniform: key = seed halves, counter = step halves */
    uint32_t out[4];
    const uint32_t c[4] = {5, 1, 0, 0}, kk[2] = {0x89abcdef, 0x01234567};
    sampler_philox4x32_10(c, kk, out);
    CU_ASSERT_EQUAL(sampler_uniform(0x0123456789abcdefull, 0x100000005ull), (float)(out[0] >> 8) * 0x1p-24f);
    double mean = 0;
    float lo = 1, hi = 0;
    for (uint64_t t = 0; t < 100000; t++) {
        float u = sampler_uniform(42, t);
        mean += u;
        lo = fminf(lo, u), hi = fmaxf(hi, u);
    }
    mean /= 100000;
    CU_ASSERT(fabs(mean - 0.5) < 0.005 && lo >= 0 && hi < 1);
}

/* ---- greedy and determinism ------------------------------------------------------------- */

static void test_greedy(void) {
    sampling_params p = {0};
    sampler *s = make(7, 64, &p);
    float a[7] = {1, 5, -INFINITY, 5, 4.999f, -3, 0};
    float b[7];
    memcpy(b, a, sizeof a);
    CU_ASSERT_EQUAL(sampler_sample(s, b, NULL), 1); /* tie 1 and 3: lowest id */
    float c[7] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -7};
    CU_ASSERT_EQUAL(sampler_sample(s, c, NULL), 6);
    /* top_k = 1 and a tiny top_p are greedy at any temperature and seed */
    uint64_t r = 3;
    for (int trial = 0; trial < 200; trial++) {
        float z[7], z2[7];
        int arg = 0;
        for (int i = 0; i < 7; i++) {
            z[i] = (float)(testutil_rng_next(&r) % 5); /* many ties */
            if (z[i] > z[arg]) arg = i;
        }
        sampling_params q = {.temperature = 3.0f, .top_k = 1, .seed = (uint64_t)trial};
        sampler_reset(s, &q);
        memcpy(z2, z, sizeof z);
        CU_ASSERT_EQUAL(sampler_sample(s, z2, NULL), arg);
        q.top_k = 0, q.top_p = 1e-6f;
        sampler_reset(s, &q);
        memcpy(z2, z, sizeof z);
        CU_ASSERT_EQUAL(sampler_sample(s, z2, NULL), arg);
    }
    sampler_destroy(s);
}

static void draw_sequence(sampler *s, int n, int32_t *out) {
    uint64_t r = 11; /* the same logits every run */
    for (int t = 0; t < n; t++) {
        float z[100];
        for (int i = 0; i < 100; i++) z[i] = 3 * rng_uniform(&r);
        out[t] = sampler_sample(s, z, NULL);
    }
}

static void test_determinism(void) {
    sampling_params p = {.temperature = 1.0f, .top_p = 0.95f, .seed = 1234};
    sampler *a = make(100, 1000, &p), *b = make(100, 1000, &p);
    int32_t sa[300], sb[300], sc[300];
    draw_sequence(a, 300, sa);
    /* b interleaves draws of another request between its own: no effect (per-sequence
     * counter, no shared state) */
    sampling_params other = {.temperature = 1.0f, .seed = 99};
    sampler *o = make(100, 1000, &other);
    uint64_t r = 11;
    for (int t = 0; t < 300; t++) {
        float z[100], junk[100];
        for (int i = 0; i < 100; i++) z[i] = 3 * rng_uniform(&r), junk[i] = (float)i;
        sampler_sample(o, junk, NULL);
        sb[t] = sampler_sample(b, z, NULL);
    }
    CU_ASSERT(memcmp(sa, sb, sizeof sa) == 0);
    /* reset restarts the stream */
    sampler_reset(a, &p);
    draw_sequence(a, 300, sc);
    CU_ASSERT(memcmp(sa, sc, sizeof sa) == 0);
    /* another seed gives another sequence */
    p.seed = 1235;
    sampler_reset(a, &p);
    draw_sequence(a, 300, sc);
    int diff = 0;
    for (int t = 0; t < 300; t++) diff += sa[t] != sc[t];
    CU_ASSERT(diff > 200);
    sampler_destroy(a), sampler_destroy(b), sampler_destroy(o);
}

/* ---- the sampled distribution ----------------------------------------------------------- */

#define DIST_V 12
static const float dist_logits[DIST_V] = {2.0f, 1.5f, 1.2f, 0.9f, 0.5f, 0.3f, 0.0f,
                                          -0.4f, -1.0f, -1.5f, -2.5f, -4.0f};

/* Draws N tokens with p from dist_logits; counts per token. */
static void draw_counts(const sampling_params *p, long N, long *cnt) {
    sampler *s = make(DIST_V, 16, p);
    memset(cnt, 0, DIST_V * sizeof *cnt);
    for (long t = 0; t < N; t++) {
        float z[DIST_V];
        memcpy(z, dist_logits, sizeof z);
        cnt[sampler_sample(s, z, NULL)]++;
    }
    sampler_destroy(s);
}

static void test_distribution(void) {
    static const sampling_params cases[] = {
        {.temperature = 1.0f, .seed = 1},
        {.temperature = 0.6f, .seed = 2},
        {.temperature = 1.7f, .seed = 3},
        {.temperature = 1.0f, .top_k = 4, .seed = 4},
        {.temperature = 1.0f, .top_p = 0.8f, .seed = 5},
        {.temperature = 2.0f, .top_p = 0.5f, .seed = 6},
        {.temperature = 1.0f, .min_p = 0.2f, .seed = 7},
        {.temperature = 0.8f, .top_k = 7, .top_p = 0.9f, .min_p = 0.05f, .seed = 8},
        {.temperature = 1.3f, .top_k = 10, .min_p = 0.1f, .seed = 9},
        {.temperature = 1.0f, .top_k = 3, .top_p = 0.99f, .seed = 10},
    };
    const long N = 100000;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        long cnt[DIST_V];
        double prob[DIST_V];
        draw_counts(&cases[c], N, cnt);
        ref_dist(dist_logits, DIST_V, &cases[c], prob);
        int df;
        double x2 = chi2(cnt, prob, DIST_V, N, &df);
        double crit = chi2_crit(df > 0 ? df : 1, 4.5); /* ~3e-6 upper tail */
        printf("\n  case %zu: chi2 %.2f df %d (crit %.1f)", c, x2, df, crit);
        CU_ASSERT(df == 0 ? x2 == 0 : x2 < crit);
        int support = 0;
        for (int i = 0; i < DIST_V; i++) support += prob[i] > 0;
        if (c == 3) CU_ASSERT_EQUAL(support, 4);
        if (c == 6) CU_ASSERT(support > 1 && support < DIST_V);
    }
}

/* The same check must reject near misses: temperature 1 draws against the temperature 1.1
 * distribution, and top-p 0.8 draws against the unfiltered softmax. */
static void test_distribution_check_can_fail(void) {
    const long N = 100000;
    long cnt[DIST_V];
    double prob[DIST_V];
    int df;
    sampling_params p = {.temperature = 1.0f, .seed = 1}, q = p;
    draw_counts(&p, N, cnt);
    q.temperature = 1.1f;
    ref_dist(dist_logits, DIST_V, &q, prob);
    CU_ASSERT(chi2(cnt, prob, DIST_V, N, &df) > chi2_crit(df, 4.5));
    p.top_p = 0.8f;
    draw_counts(&p, N, cnt);
    q = p, q.top_p = 1;
    ref_dist(dist_logits, DIST_V, &q, prob);
    CU_ASSERT(isinf(chi2(cnt, prob, DIST_V, N, &df)) == 0); /* support differs the other way */
    CU_ASSERT(chi2(cnt, prob, DIST_V, N, &df) > chi2_crit(df, 4.5));
}

/* A larger vocabulary (not a multiple of 8, with ties) through the other code paths: top-k
 * above the insertion limit (selection by partitioning), the dense top-p histogram, min-p.
 * Tokens are grouped into bins of about equal reference mass for the chi-square; a token
 * outside the reference support must never be drawn. */
static void test_distribution_large_vocab(void) {
    enum { V = 1003, BINS = 16 };
    static float z[V];
    uint64_t r = 2024;
    for (int i = 0; i < V; i++) z[i] = 3 * rng_uniform(&r) - 2;
    for (int i = 0; i < V; i += 7) z[i] = z[(i * 13) % V]; /* ties */
    static const sampling_params cases[] = {
        {.temperature = 1.0f, .top_k = 300, .seed = 21},
        {.temperature = 0.9f, .top_p = 0.7f, .seed = 22},
        {.temperature = 1.2f, .top_p = 0.9f, .min_p = 0.3f, .seed = 23},
        {.temperature = 1.0f, .top_k = 200, .top_p = 0.8f, .seed = 24},
    };
    const long N = 100000;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        /* reference: sort ids by (z desc, id asc), then the plain definition */
        static int order[V];
        static double w[V], prob[V];
        for (int i = 0; i < V; i++) order[i] = i;
        for (int i = 1; i < V; i++)
            for (int j = i; j > 0 && (z[order[j]] > z[order[j - 1]] ||
                                      (z[order[j]] == z[order[j - 1]] && order[j] < order[j - 1])); j--) {
                int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
            }
        sampling_params p = sampling_params_resolve(&cases[c]);
        int n = p.top_k > 0 ? p.top_k : V;
        double S = 0, cum = 0, T = 0;
        for (int k = 0; k < n; k++) S += w[k] = exp(((double)z[order[k]] - z[order[0]]) / p.temperature);
        int m = 0;
        while (m < n && cum < p.top_p * S) cum += w[m++];
        for (int i = 0; i < V; i++) prob[i] = 0;
        for (int k = 0; k < m; k++)
            if (w[k] >= p.min_p * w[0]) T += prob[order[k]] = w[k];
        int support = 0;
        for (int i = 0; i < V; i++) support += (prob[i] /= T) > 0;
        /* draws */
        sampler *s = make(V, 16, &cases[c]);
        static long cnt[V];
        memset(cnt, 0, sizeof cnt);
        static float zz[V];
        for (long t = 0; t < N; t++) {
            memcpy(zz, z, sizeof z);
            cnt[sampler_sample(s, zz, NULL)]++;
        }
        sampler_destroy(s);
        long outside = 0;
        for (int i = 0; i < V; i++) outside += prob[i] == 0 ? cnt[i] : 0;
        /* bins of ~1/BINS of the mass, in reference order */
        long bc[BINS] = {0};
        double bp[BINS] = {0}, acc = 0;
        for (int k = 0; k < V; k++) {
            int i = order[k];
            if (prob[i] == 0) continue;
            int b = (int)(acc * BINS);
            if (b >= BINS) b = BINS - 1;
            bc[b] += cnt[i];
            bp[b] += prob[i];
            acc += prob[i];
        }
        int df;
        double x2 = chi2(bc, bp, BINS, N, &df);
        printf("\n  large vocab case %zu: support %d, chi2 %.2f df %d (crit %.1f), outside %ld", c,
               support, x2, df, chi2_crit(df, 4.5), outside);
        CU_ASSERT_EQUAL(outside, 0);
        CU_ASSERT(x2 < chi2_crit(df, 4.5));
        CU_ASSERT(support > 20 && support < V);
    }
}

static void test_ties_and_min_p(void) {
    /* eight equal logits, top_p 0.5: exactly the four lowest ids, uniformly */
    sampling_params p = {.temperature = 1.0f, .top_p = 0.5f, .seed = 77};
    sampler *s = make(8, 8, &p);
    long cnt[8] = {0};
    for (int t = 0; t < 40000; t++) {
        float z[8] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
        cnt[sampler_sample(s, z, NULL)]++;
    }
    for (int i = 0; i < 8; i++) CU_ASSERT(i < 4 ? labs(cnt[i] - 10000) < 600 : cnt[i] == 0);
    /* top_k 3 with a tie at the boundary: ids 0, 1 (the larger) and 2 (lowest of the tie) */
    sampling_params q = {.temperature = 1.0f, .top_k = 3, .seed = 5};
    sampler_reset(s, &q);
    memset(cnt, 0, sizeof cnt);
    for (int t = 0; t < 20000; t++) {
        float z[8] = {1, 2, 0, 0, 0, -1, 0, -5};
        cnt[sampler_sample(s, z, NULL)]++;
    }
    CU_ASSERT(cnt[0] > 0 && cnt[1] > 0 && cnt[2] > 0);
    CU_ASSERT(cnt[3] + cnt[4] + cnt[5] + cnt[6] + cnt[7] == 0);
    /* min_p: p_i >= min_p * p_max exactly at the boundary; e^-ln(4) = 0.25 */
    sampling_params m = {.temperature = 1.0f, .min_p = 0.25f, .seed = 6};
    sampler_reset(s, &m);
    memset(cnt, 0, sizeof cnt);
    for (int t = 0; t < 20000; t++) {
        float z[8] = {0, -1.0f, -1.3f, -1.4f, -1.5f, -3, -8, 0.1f};
        cnt[sampler_sample(s, z, NULL)]++;
    }
    /* relative to the max 0.1: -1.0 -> e^-1.1 = .33 kept, -1.3 -> e^-1.4 = .247 dropped */
    CU_ASSERT(cnt[0] > 0 && cnt[1] > 0 && cnt[7] > 0);
    CU_ASSERT(cnt[2] + cnt[3] + cnt[4] + cnt[5] + cnt[6] == 0);
    /* the same boundary behind top_k (the candidate list, not the whole vocabulary): the
     * weight exactly min_p stays, as it does without top_k */
    sampling_params mk = {.temperature = 1.0f, .top_k = 4, .min_p = 0.25f, .seed = 6};
    sampler_reset(s, &mk);
    memset(cnt, 0, sizeof cnt);
    for (int t = 0; t < 20000; t++) {
        float z[8] = {-5, 0, -6, -1.38f, -7, -8, -9, -1.4f}; /* e^-1.38 = .252, e^-1.4 = .247 */
        cnt[sampler_sample(s, z, NULL)]++;
    }
    CU_ASSERT(cnt[1] > 0 && cnt[3] > 0);
    CU_ASSERT(cnt[0] + cnt[2] + cnt[4] + cnt[5] + cnt[6] + cnt[7] == 0);
    /* min_p = 1 keeps only the largest weight (exactly 1): the argmax, with or without top_k
     * (with top_k this once emptied the list and tripped an assertion) */
    for (int k = 0; k < 2; k++) {
        sampling_params one = {.temperature = 0.7f, .top_k = k ? 5 : 0, .min_p = 1, .seed = 9};
        sampler_reset(s, &one);
        for (int t = 0; t < 100; t++) {
            float z[8] = {0.3f, 2.5f, -1, 2.4f, 0, 1, 2, -3};
            CU_ASSERT_EQUAL(sampler_sample(s, z, NULL), 1);
        }
    }
    sampler_destroy(s);
}

/* Logits with nothing finite, a NaN or +inf (a broken model) give -1, greedy or drawn, with
 * or without logprobs; -inf among finite logits is fine. */
static void test_no_finite_logit(void) {
    sampling_params ps[3] = {{.temperature = 0, .n_logprobs = 2},
                            {.temperature = 0.8f, .top_k = 3, .top_p = 0.9f, .min_p = 0.1f},
                            {.temperature = 1.0f, .n_logprobs = 3}};
    sampler *s = make(8, 8, &ps[0]), *s9 = make(9, 8, &ps[0]);
    for (int k = 0; k < 3; k++) {
        sampler_reset(s, &ps[k]);
        sampler_reset(s9, &ps[k]);
        sample_result res;
        float z[8];
        for (int i = 0; i < 8; i++) z[i] = NAN;
        CU_ASSERT_EQUAL(sampler_sample(s, z, &res), -1);
        for (int i = 0; i < 8; i++) z[i] = i & 1 ? -INFINITY : NAN;
        CU_ASSERT_EQUAL(sampler_sample(s, z, &res), -1);
        for (int i = 0; i < 8; i++) z[i] = i == 5 ? 0.5f : -INFINITY;
        CU_ASSERT_EQUAL(sampler_sample(s, z, &res), 5);
        for (int j = 0; j < 9; j++) { /* one NaN or +inf anywhere, past the 8-wide loop too */
            float y[9] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f};
            y[j] = j & 1 ? INFINITY : NAN;
            CU_ASSERT_EQUAL(sampler_sample(s9, y, &res), -1);
        }
    }
    sampler_destroy(s);
    sampler_destroy(s9);
}

/* ---- penalties -------------------------------------------------------------------------- */

static void test_penalties_exact(void) {
    /* prompt 1 1 2, generated 3 3 3 4; rep 2, freq 0.5, presence 0.25 */
    const int32_t prompt[3] = {1, 1, 2};
    for (int pp = 0; pp < 2; pp++) {
        sampling_params p = {.repetition_penalty = 2, .frequency_penalty = 0.5f,
                            .presence_penalty = 0.25f, .penalize_prompt = pp};
        sampler *s = make(6, 16, &p);
        sampler_accept_prompt(s, prompt, 3);
        for (int i = 0; i < 3; i++) sampler_accept(s, 3);
        sampler_accept(s, 4);
        float z[6] = {1, 4, -2, 3, -1, 8};
        sampler_sample(s, z, NULL);
        /* counted: token 1 x2 and 2 x1 (prompt, when penalize_prompt), 3 x3, 4 x1 */
        CU_ASSERT_EQUAL(z[0], 1.0f);
        CU_ASSERT_EQUAL(z[1], pp ? 4.0f / 2 - 2 * 0.5f - 0.25f : 4.0f);
        CU_ASSERT_EQUAL(z[2], pp ? -2.0f * 2 - 0.5f - 0.25f : -2.0f);
        CU_ASSERT_EQUAL(z[3], 3.0f / 2 - 3 * 0.5f - 0.25f);
        CU_ASSERT_EQUAL(z[4], -1.0f * 2 - 0.5f - 0.25f);
        CU_ASSERT_EQUAL(z[5], 8.0f);
        sampler_destroy(s);
    }
    /* window 2: only the last two positions count */
    sampling_params w = {.frequency_penalty = 1, .penalty_window = 2, .penalize_prompt = true};
    sampler *s = make(6, 16, &w);
    const int32_t seq[5] = {5, 5, 2, 5, 1};
    sampler_accept_prompt(s, seq, 5);
    float z[6] = {0, 0, 0, 0, 0, 0};
    sampler_sample(s, z, NULL);
    CU_ASSERT(z[1] == -1 && z[5] == -1 && z[2] == 0 && z[0] == 0);
    /* reset forgets everything */
    sampler_reset(s, &w);
    float y[6] = {0, 0, 0, 0, 0, 0};
    sampler_sample(s, y, NULL);
    for (int i = 0; i < 6; i++) CU_ASSERT_EQUAL(y[i], 0.0f);
    sampler_destroy(s);
}

/* The windowed multiset against brute force, with a large vocabulary (hash collisions,
 * backward-shift deletions) and a small one (many repeats). */
static void test_penalty_window_stress(void) {
    static const struct { int32_t V, n_ctx, window; } cfg[] = {
        {200000, 6000, 700}, {50, 3000, 37}, {1000, 2000, 0}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int32_t V = cfg[c].V, n_ctx = cfg[c].n_ctx, W = cfg[c].window;
        sampling_params p = {.frequency_penalty = 1, .penalty_window = W};
        sampler *s = make(V, n_ctx, &p);
        int32_t *seq = malloc(n_ctx * sizeof *seq);
        float *z = malloc(V * sizeof *z);
        int *want = calloc(V, sizeof *want);
        uint64_t r = 17 + c;
        int bad = 0;
        for (int32_t t = 0; t < n_ctx; t++) {
            seq[t] = (int32_t)(testutil_rng_next(&r) % (uint64_t)V);
            if (t % 3 == 0 && t > 0)
                seq[t] = seq[t - 1 - (int32_t)(testutil_rng_next(&r) % (uint64_t)t)];
            sampler_accept(s, seq[t]);
            if (t % 250 != 249 && t != n_ctx - 1) continue;
            for (int32_t i = 0; i < V; i++) z[i] = 0;
            sampler_sample(s, z, NULL);
            memset(want, 0, V * sizeof *want);
            for (int32_t k = W > 0 && t + 1 > W ? t + 1 - W : 0; k <= t; k++) want[seq[k]]++;
            for (int32_t i = 0; i < V; i++) bad += z[i] != -(float)want[i];
        }
        if (bad) printf("\n  V %d window %d: %d wrong penalties\n", V, W, bad);
        CU_ASSERT_EQUAL(bad, 0);
        free(seq), free(z), free(want);
        sampler_destroy(s);
    }
}

/* ---- logprobs --------------------------------------------------------------------------- */

static void test_logprobs(void) {
    const int V = 16;
    float base[16];
    uint64_t r = 8;
    for (int i = 0; i < V; i++) base[i] = 4 * rng_uniform(&r) - 2;
    base[9] = base[4]; /* a tie */
    sampling_params p = {.temperature = 0.5f, .n_logprobs = 16, .repetition_penalty = 1.5f, .seed = 3};
    sampler *s = make(V, 32, &p);
    sampler_accept(s, 2);
    sample_result res, res2;
    float z[16];
    memcpy(z, base, sizeof z);
    int32_t tok = sampler_sample(s, z, &res);
    CU_ASSERT_EQUAL(res.token, tok);
    CU_ASSERT_EQUAL(res.n_top, 16);
    /* normalised over the whole vocabulary, descending, z[] penalised, ties by id */
    double sum = 0;
    for (int j = 0; j < V; j++) {
        sum += exp(res.top_logprob[j]);
        if (j > 0) CU_ASSERT(res.top_logprob[j] <= res.top_logprob[j - 1]);
        if (j > 0 && res.top_logprob[j] == res.top_logprob[j - 1]) CU_ASSERT(res.top_id[j] > res.top_id[j - 1]);
        CU_ASSERT(fabsf(res.top_logprob[j] - (z[res.top_id[j]] - z[res.top_id[0]]) - res.top_logprob[0]) < 1e-5f);
    }
    CU_ASSERT(fabs(sum - 1) < 1e-5);
    for (int j = 0; j < V; j++)
        if (res.top_id[j] == tok) CU_ASSERT_EQUAL(res.top_logprob[j], res.logprob);
    /* temperature does not change them (temperature 1 semantics); penalty does */
    sampling_params q = p;
    q.temperature = 2.0f;
    sampler_reset(s, &q);
    sampler_accept(s, 2);
    memcpy(z, base, sizeof z);
    sampler_sample(s, z, &res2);
    CU_ASSERT_EQUAL(res2.n_top, 16);
    CU_ASSERT(memcmp(res.top_id, res2.top_id, 16 * sizeof res.top_id[0]) == 0);
    CU_ASSERT(memcmp(res.top_logprob, res2.top_logprob, 16 * sizeof res.top_logprob[0]) == 0);
    /* greedy: chosen logprob is the best one; n_logprobs beyond the vocabulary pads */
    sampling_params g = {.n_logprobs = 20};
    sampler *s3 = make(3, 4, &g);
    sample_result r3;
    float z3[3] = {0, 1, 0};
    CU_ASSERT_EQUAL(sampler_sample(s3, z3, &r3), 1);
    CU_ASSERT_EQUAL(r3.n_top, 20);
    CU_ASSERT_EQUAL(r3.top_id[0], 1);
    CU_ASSERT_EQUAL(r3.top_id[1], 0);
    CU_ASSERT_EQUAL(r3.top_id[2], 2);
    CU_ASSERT(r3.top_id[3] == -1 && isinf(r3.top_logprob[19]));
    CU_ASSERT(fabsf(r3.logprob - (float)(1 - log(2 + exp(1.0)))) < 1e-6f);
    /* no logprobs asked: none given */
    sampling_params g0 = {0};
    sampler_reset(s3, &g0);
    float z4[3] = {0, 1, 0};
    r3.n_top = 7;
    CU_ASSERT_EQUAL(sampler_sample(s3, z4, &r3), 1);
    CU_ASSERT(r3.token == 1 && r3.n_top == 0 && r3.logprob == 0);
    sampler_destroy(s), sampler_destroy(s3);
}

/* ---- no allocation after create --------------------------------------------------------- */

static void test_no_alloc_after_create(void) {
    const int32_t V = 5000;
    sampling_params p = {.temperature = 0.9f, .top_k = 50, .top_p = 0.9f, .min_p = 0.01f,
                        .repetition_penalty = 1.2f, .frequency_penalty = 0.3f, .presence_penalty = 0.1f,
                        .penalize_prompt = true, .penalty_window = 64, .seed = 5, .n_logprobs = 5};
    long before = testutil_allocs();
    sampler *s = make(V, 600, &p);
    CU_ASSERT(testutil_allocs() > before); /* the counter works: create allocates */
    float *z = malloc(V * sizeof *z);
    sample_result res;
    int32_t prompt[100];
    for (int i = 0; i < 100; i++) prompt[i] = i * 37 % V;
    uint64_t r = 1;
    long after_create = testutil_allocs();
    for (int req = 0; req < 3; req++) {
        p.top_k = req == 1 ? 0 : 50; /* also the no-top-k path */
        sampler_reset(s, &p);
        sampler_accept_prompt(s, prompt, 100);
        for (int t = 0; t < 150; t++) {
            for (int i = 0; i < V; i++) z[i] = 5 * rng_uniform(&r);
            sampler_accept(s, sampler_sample(s, z, &res));
        }
    }
    CU_ASSERT_EQUAL(testutil_allocs(), after_create);
    free(z);
    sampler_destroy(s);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("sampler", NULL, NULL);
    CU_add_test(s, "create_checks", test_create_checks);
    CU_add_test(s, "philox_kat", test_philox_kat);
    CU_add_test(s, "greedy", test_greedy);
    CU_add_test(s, "determinism", test_determinism);
    CU_add_test(s, "distribution", test_distribution);
    CU_add_test(s, "distribution_check_can_fail", test_distribution_check_can_fail);
    CU_add_test(s, "distribution_large_vocab", test_distribution_large_vocab);
    CU_add_test(s, "ties_and_min_p", test_ties_and_min_p);
    CU_add_test(s, "no_finite_logit", test_no_finite_logit);
    CU_add_test(s, "penalties_exact", test_penalties_exact);
    CU_add_test(s, "penalty_window_stress", test_penalty_window_stress);
    CU_add_test(s, "logprobs", test_logprobs);
    CU_add_test(s, "no_alloc_after_create", test_no_alloc_after_create);
    return testutil_cunit_run();
}
