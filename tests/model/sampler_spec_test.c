/* Speculative sampling (model/sampler.h: sampler_probs, sampler_sample_verify): a verify draw
 * over a draft drawn from q gives tokens distributed as p, the sampler's own distribution,
 * whatever q is. Over many seeds, the histogram of the tokens is checked against p by Pearson's
 * chi-square at a threshold (p-value about 1e-6) that two broken rules fail on the same draws:
 * keeping every draft (the tokens are q's), and redrawing from p instead of the residual
 * norm(max(0, p - q)) after a rejection. Cases: the whole vocabulary (dense) and top-k + top-p
 * (candidates by id), a q that puts mass on tokens p filters out, and q = p (every draft kept).
 * A verify draw with the same seed and draft is the same token (reproducible), and greedy
 * parameters ignore q. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/sampler.h"
#include "tests/testutil/testutil.h"

#define V 24
#define N_DRAWS 40000
/* chi-square critical value at p ~ 1e-6 for up to V - 1 = 23 degrees of freedom (Wilson-Hilferty
 * at z = 4.75 gives 63.6 for df 23); below that for fewer cells with mass */
#define CHI2_MAX 64.0

/* Pearson's statistic of counts against probabilities p over N draws; cells with p = 0 must
 * have no draw (else +inf). */
static double chi2(const int *count, const float *p, int n)
{
    double x = 0;
    for (int i = 0; i < V; i++) {
        const double e = (double)p[i] * n;
        if (e <= 0) {
            if (count[i]) return INFINITY;
            continue;
        }
        x += (count[i] - e) * (count[i] - e) / e;
    }
    return x;
}

/* Runs N_DRAWS verify draws (seeds 1000..) of drafts from q over fixed logits; returns the
 * chi-square of the tokens against p and sets *xa / *xr to those of the broken rules and *kept
 * to the drafts kept. p_out: NULL or [V], p. */
static double check_case(const sampling_params *sp, const float *q, const char *name, double *xa_out,
                         double *xr_out, int *kept_out, float *p_out)
{
    float z[V], p[V], lg[V];
    uint64_t r = 77;
    for (int i = 0; i < V; i++) z[i] = (float)((double)(testutil_rng_next(&r) >> 40) / 16777216.0 * 4.0);
    sampler *s = NULL;
    status st;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&s, V, 16, sp, &st), STATUS_OK);
    memcpy(lg, z, sizeof lg);
    CU_ASSERT_EQUAL_FATAL(sampler_probs(s, lg, p), 0);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += p[i];
    CU_ASSERT(fabs(sum - 1) < 1e-5);
    int good[V] = {0}, keep_all[V] = {0}, redraw[V] = {0}, kept = 0;
    for (int n = 0; n < N_DRAWS; n++) {
        sampling_params pp = *sp;
        pp.seed = 1000 + (uint64_t)n;
        sampler_reset(s, &pp);
        const int32_t d = sampler_draw_probs(q, V, sampler_uniform(0xd2a4f7ull, (uint64_t)n));
        CU_ASSERT_FATAL(d >= 0 && q[d] > 0);
        memcpy(lg, z, sizeof lg);
        sample_result out;
        const int32_t t = sampler_sample_verify(s, lg, d, q, &out);
        CU_ASSERT_FATAL(t >= 0 && t < V);
        CU_ASSERT_EQUAL(out.token, t);
        CU_ASSERT(p[t] > 0);
        good[t]++;
        keep_all[d]++;
        kept += t == d;
        if (t == d) {
            redraw[t]++;
        } else { /* the broken rule: p again instead of the residual */
            sampler_reset(s, &pp);
            memcpy(lg, z, sizeof lg);
            redraw[sampler_sample(s, lg, NULL)]++;
        }
        if (n < 50) { /* the same seed and draft: the same token */
            sampler_reset(s, &pp);
            memcpy(lg, z, sizeof lg);
            CU_ASSERT_EQUAL(sampler_sample_verify(s, lg, d, q, NULL), t);
        }
    }
    const double x = chi2(good, p, N_DRAWS), xa = chi2(keep_all, p, N_DRAWS),
                 xr = chi2(redraw, p, N_DRAWS);
    printf("\n    %s: chi2 %.1f (keep every draft %.1f, redraw from p %.1f), %d of %d kept", name,
           x, xa, xr, kept, N_DRAWS);
    sampler_destroy(s);
    *xa_out = xa;
    *xr_out = xr;
    *kept_out = kept;
    if (p_out) memcpy(p_out, p, sizeof p);
    return x;
}

/* q: a distribution unlike p (a reversed ramp over every token) */
static void ramp(float *q)
{
    double s = 0;
    for (int i = 0; i < V; i++) s += (q[i] = (float)(V - i));
    for (int i = 0; i < V; i++) q[i] = (float)(q[i] / s);
}

static void test_dense(void)
{
    float q[V];
    ramp(q);
    const sampling_params sp = sampling_params_resolve(&(sampling_params){.temperature = 0.9f});
    double xa, xr;
    int kept;
    CU_ASSERT(check_case(&sp, q, "dense", &xa, &xr, &kept, NULL) < CHI2_MAX);
    CU_ASSERT(xa > CHI2_MAX); /* the check tells the broken rules apart */
    CU_ASSERT(xr > CHI2_MAX);
    CU_ASSERT(kept > 0 && kept < N_DRAWS);
}

static void test_filtered(void)
{
    float q[V];
    ramp(q);
    const sampling_params sp = sampling_params_resolve(
        &(sampling_params){.temperature = 1.3f, .top_k = 9, .top_p = 0.9f, .min_p = 0.05f});
    double xa, xr;
    int kept;
    float p[V];
    CU_ASSERT(check_case(&sp, q, "top-k 9, top-p 0.9, min-p 0.05", &xa, &xr, &kept, p) < CHI2_MAX);
    CU_ASSERT(xa > CHI2_MAX);
    CU_ASSERT(xr > CHI2_MAX);
    /* q = p: every draft is kept, and the tokens are still p's */
    CU_ASSERT(check_case(&sp, p, "q = p", &xa, &xr, &kept, NULL) < CHI2_MAX);
    CU_ASSERT_EQUAL(kept, N_DRAWS);
}

static void test_greedy_ignores_q(void)
{
    float q[V], z[V];
    ramp(q);
    for (int i = 0; i < V; i++) z[i] = (float)(i % 7);
    sampler *s = NULL;
    status st;
    CU_ASSERT_EQUAL_FATAL(sampler_create(&s, V, 16, &(sampling_params){0}, &st), STATUS_OK);
    CU_ASSERT_EQUAL(sampler_sample_verify(s, z, 0, q, NULL), 6); /* the argmax, lowest id */
    CU_ASSERT_EQUAL(sampler_step(s), 1);
    sampler_destroy(s);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite su = CU_add_suite("sampler_spec", NULL, NULL);
    CU_add_test(su, "dense", test_dense);
    CU_add_test(su, "filtered", test_filtered);
    CU_add_test(su, "greedy_ignores_q", test_greedy_ignores_q);
    return testutil_cunit_run();
}
