/* Norms, activations, RoPE and attention against plain double-precision formulas. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_check.h"
#include "kernels/cpu/act.h"
#include "kernels/cpu/attn.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"
#include "tests/testutil/testutil.h"

static void test_rmsnorm(void)
{
    enum { N = 257 };
    kc_rng r = {1};
    float x[N], w[N], y[N], ref[N];
    kc_fill(&r, x, N, 3), kc_fill(&r, w, N, 2);
    double ss = 0;
    for (int i = 0; i < N; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < N; i++) ref[i] = (float)(x[i] / sqrt(ss / N + 1e-6) * w[i]);
    ref_rmsnorm(x, w, N, 1e-6f, y);
    CU_ASSERT_EQUAL(kernel_check("rmsnorm", y, ref, N, 1e-6, 1e-5), 0);
    ref_rmsnorm(x, w, N, 1e-6f, x); /* in place */
    CU_ASSERT_EQUAL(kernel_check("rmsnorm in place", x, ref, N, 1e-6, 1e-5), 0);
    /* gated: RMSNorm(o)·w·silu(z) */
    float o[N], z[N], g[N];
    kc_fill(&r, o, N, 3), kc_fill(&r, z, N, 3);
    ss = 0;
    for (int i = 0; i < N; i++) ss += (double)o[i] * o[i];
    for (int i = 0; i < N; i++) g[i] = (float)(o[i] / sqrt(ss / N + 1e-6) * w[i] * z[i] / (1 + exp(-z[i])));
    ref_rmsnorm_gated(o, z, w, N, 1e-6f);
    CU_ASSERT_EQUAL(kernel_check("rmsnorm_gated", o, g, N, 1e-6, 1e-5), 0);
}

static void test_l2norm(void)
{
    float x[64], ref[64];
    kc_rng r = {2};
    kc_fill(&r, x, 64, 5);
    double ss = 0;
    for (int i = 0; i < 64; i++) ss += (double)x[i] * x[i];
    for (int i = 0; i < 64; i++) ref[i] = (float)(x[i] / sqrt(ss + 1e-6) * 0.125);
    ref_l2norm(x, 64, 1e-6f, 0.125f);
    CU_ASSERT_EQUAL(kernel_check("l2norm", x, ref, 64, 1e-7, 1e-5), 0);
    float zero[8] = {0};
    ref_l2norm(zero, 8, 1e-6f, 1.0f); /* eps keeps it finite */
    CU_ASSERT(zero[0] == 0.0f);
}

static void test_act(void)
{
    float g[5] = {-30, -1, 0, 1, 30}, u[5] = {1, 2, 3, 4, 5}, out[5];
    ref_swiglu(g, u, 5, out);
    for (int i = 0; i < 5; i++)
        CU_ASSERT_DOUBLE_EQUAL(out[i], g[i] / (1 + exp(-g[i])) * u[i], 1e-5);
    float o[3] = {2, 2, 2}, gate[3] = {0, 100, -100};
    ref_sigmoid_gate(o, gate, 3);
    CU_ASSERT_DOUBLE_EQUAL(o[0], 1.0, 1e-7);
    CU_ASSERT_DOUBLE_EQUAL(o[1], 2.0, 1e-7);
    CU_ASSERT(o[2] >= 0 && o[2] < 1e-30);
    CU_ASSERT_DOUBLE_EQUAL(ref_softplus(21.0f), 21.0, 1e-6);
    CU_ASSERT_DOUBLE_EQUAL(ref_softplus(0.5f), log1p(exp(0.5)), 1e-6);
}

/* NEOX partial rope: dims [0, n_rot) rotate pairs (i, i + n_rot/2), the rest pass through. */
static void test_rope(void)
{
    enum { NH = 3, D = 64, ROT = 16 };
    kc_rng r = {3};
    float x[NH * D], y[NH * D], ref[NH * D];
    kc_fill(&r, x, NH * D, 1);
    static const int positions[] = {0, 1, 7, 1000, 40000};
    for (size_t p = 0; p < sizeof positions / sizeof positions[0]; p++) {
        int pos = positions[p];
        memcpy(y, x, sizeof x);
        memcpy(ref, x, sizeof x);
        ref_rope(y, NH, D, ROT, pos, 1e7f);
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < ROT / 2; i++) {
                double th = pos * pow(1e7, -2.0 * i / ROT);
                double a = x[h * D + i], b = x[h * D + i + ROT / 2];
                ref[h * D + i] = (float)(a * cos(th) - b * sin(th));
                ref[h * D + i + ROT / 2] = (float)(a * sin(th) + b * cos(th));
            }
        /* FP32 angles as HF computes them: absolute error grows with pos */
        CU_ASSERT_EQUAL(kernel_check("rope", y, ref, NH * D, 2e-6 + 2e-8 * pos, 1e-5), 0);
        for (int h = 0; h < NH; h++)
            CU_ASSERT_EQUAL(memcmp(y + h * D + ROT, x + h * D + ROT, sizeof(float) * (D - ROT)), 0);
    }
}

/* Attention of one head over n positions against a two-pass double softmax. */
static long attn_case(int n, int perturb)
{
    enum { D = 32, NKV = 2 };
    kc_rng r = {100 + (uint64_t)n};
    long ld = NKV * D;
    float *k = malloc(sizeof(float) * n * ld), *v = malloc(sizeof(float) * n * ld);
    float q[D], o[D], ref[D], scores[REF_ATTN_BLOCK];
    kc_fill(&r, k, n * ld, 2), kc_fill(&r, v, n * ld, 1), kc_fill(&r, q, D, 2);
    const float *kh = k + D, *vh = v + D; /* head 1 of 2 */
    double *s = malloc(sizeof(double) * n), mx = -INFINITY, sum = 0;
    for (int t = 0; t < n; t++) {
        double d = 0;
        for (int c = 0; c < D; c++) d += (double)q[c] * kh[t * ld + c];
        s[t] = d * 0.25;
        mx = fmax(mx, s[t]);
    }
    for (int t = 0; t < n; t++) sum += s[t] = exp(s[t] - mx);
    for (int c = 0; c < D; c++) {
        double acc = 0;
        for (int t = 0; t < n; t++) acc += s[t] / sum * vh[t * ld + c];
        ref[c] = (float)acc;
    }
    ref_attn_head(q, kh, vh, ld, n, D, 0.25f, scores, o);
    if (perturb) o[3] += 1e-3f;
    long bad = kernel_check("attn", o, ref, D, 1e-6, 1e-4);
    free(k), free(v), free(s);
    return bad;
}

static void test_attn(void)
{
    static const int ns[] = {1, 2, 255, 256, 257, 700};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) CU_ASSERT_EQUAL(attn_case(ns[i], 0), 0);
    CU_ASSERT_NOT_EQUAL(attn_case(300, 1), 0); /* the check can fail */
}

/* ref_attn_decode maps query head h to KV head h / (n_h / n_kv). */
static void test_attn_gqa(void)
{
    enum { NH = 4, NKV = 2, D = 8, N = 5 };
    kc_rng r = {5};
    float q[NH * D], k[N * NKV * D], v[N * NKV * D], o[NH * D], oh[D], scores[REF_ATTN_BLOCK];
    kc_fill(&r, q, NH * D, 1), kc_fill(&r, k, N * NKV * D, 1), kc_fill(&r, v, N * NKV * D, 1);
    ref_attn_decode(q, k, v, N, NH, NKV, D, 0.3f, scores, o);
    for (int h = 0; h < NH; h++) {
        int kvh = h / (NH / NKV);
        ref_attn_head(q + h * D, k + kvh * D, v + kvh * D, NKV * D, N, D, 0.3f, scores, oh);
        CU_ASSERT_EQUAL(memcmp(oh, o + h * D, sizeof oh), 0);
    }
}

/* ref_attn_head_paged over blocks laid out in a shuffled order gives ref_attn_head's bits on the
 * contiguous rows (the same arithmetic, each row read where its block lies); a wrong table entry
 * changes the result. */
static void test_attn_paged(void)
{
    enum { D = 16, NKV = 2, N = 300, BT = 7, NB = (N + BT - 1) / BT };
    kc_rng r = {77};
    const long ld = NKV * D;
    float *k = malloc(sizeof(float) * N * ld), *v = malloc(sizeof(float) * N * ld);
    float *pk = malloc(sizeof(float) * NB * BT * ld), *pv = malloc(sizeof(float) * NB * BT * ld);
    float q[D], o[D], op[D], scores[REF_ATTN_BLOCK];
    kc_fill(&r, k, N * ld, 2), kc_fill(&r, v, N * ld, 1), kc_fill(&r, q, D, 2);
    int32_t table[NB];
    for (int b = 0; b < NB; b++) table[b] = (b * 17 + 5) % NB; /* a permutation: 17 is prime to 43 */
    for (int p = 0; p < N; p++) {
        memcpy(pk + ((long)table[p / BT] * BT + p % BT) * ld, k + (long)p * ld, sizeof(float) * ld);
        memcpy(pv + ((long)table[p / BT] * BT + p % BT) * ld, v + (long)p * ld, sizeof(float) * ld);
    }
    for (int n = 1; n <= N; n += 37) {
        ref_attn_head(q, k + D, v + D, ld, n, D, 0.25f, scores, o);
        ref_attn_head_paged(q, pk + D, pv + D, table, BT, BT * ld, ld, n, D, 0.25f, scores, op);
        CU_ASSERT_EQUAL(memcmp(o, op, sizeof o), 0);
    }
    table[3] = table[4];
    ref_attn_head_paged(q, pk + D, pv + D, table, BT, BT * ld, ld, N, D, 0.25f, scores, op);
    ref_attn_head(q, k + D, v + D, ld, N, D, 0.25f, scores, o);
    CU_ASSERT_NOT_EQUAL(memcmp(o, op, sizeof o), 0);
    free(k), free(v), free(pk), free(pv);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("ops", NULL, NULL);
    CU_add_test(s, "rmsnorm", test_rmsnorm);
    CU_add_test(s, "l2norm", test_l2norm);
    CU_add_test(s, "act", test_act);
    CU_add_test(s, "rope", test_rope);
    CU_add_test(s, "attn", test_attn);
    CU_add_test(s, "attn_gqa", test_attn_gqa);
    CU_add_test(s, "attn_paged", test_attn_paged);
    return testutil_cunit_run();
}
