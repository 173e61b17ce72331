/* GPU GEMV (kernels/cuda/gemv.h) against the CPU twin quant_matvec (gguf/quant.h) for every
 * weight type over awkward shapes (1 row, one block, odd row counts, the reference models'
 * 128-wide rows, large), with each epilogue (store, residual add, SwiGLU, argmax), plus the Q8
 * activation quantiser against its C twin (exact). Quantised types are compared with
 * quant_matvec on the dequantised Q8 x (same sum, another order: tight bound), and the error
 * that quantising x itself adds is reported against the float x (loose bound, NMSE). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemv.h"
#include "tests/gpu/gpu_parity.h"

static bool g_have_gpu;

typedef struct dev_matrix {
    gemv_matrix m;
    void *d_w;
    void *host; /* GGUF bytes */
} dev_matrix;

static int matrix_make(dev_matrix *dm, uint32_t type, int64_t n_in, int64_t n_out,
                       uint64_t seed, status *st)
{
    memset(dm, 0, sizeof *dm);
    const uint64_t raw = quant_row_bytes(type, (uint64_t)(n_in * n_out));
    const uint64_t packed = gemv_packed_bytes(type, n_in, n_out);
    DS_ASSERT(raw > 0 && packed >= raw);
    dm->host = malloc(raw);
    DS_ASSERT(dm->host);
    gpu_rng rng;
    gpu_rng_seed(&rng, seed);
    gpu_random_tensor(type, n_in * n_out, 0.1f, &rng, dm->host);
    void *d_raw = NULL;
    int rc = cuda_alloc(&d_raw, raw, "gemv raw", st);
    if (!rc) rc = cuda_alloc(&dm->d_w, packed, "gemv packed", st);
    if (!rc) rc = cuda_upload(d_raw, dm->host, raw, st);
    if (!rc) {
        gemv_pack(type, d_raw, dm->d_w, n_in, n_out, NULL);
        rc = cuda_sync(NULL, "gemv_pack", st);
    }
    cuda_free(d_raw);
    dm->m = (gemv_matrix){type, n_in, n_out, dm->d_w, 0};
    return rc;
}

static void matrix_free(dev_matrix *dm)
{
    cuda_free(dm->d_w);
    free(dm->host);
}

static bool is_quant(uint32_t t)
{
    return t == GGML_TYPE_Q8_0 || t == GGML_TYPE_Q4_K || t == GGML_TYPE_Q5_K ||
           t == GGML_TYPE_Q6_K;
}

static double rms(const float *v, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    return sqrt(s / (n > 0 ? n : 1));
}

typedef enum mode { MODE_STORE, MODE_ADD, MODE_SWIGLU, MODE_ARGMAX } mode;
static const char *k_mode_names[] = {"store", "add", "swiglu", "argmax"};

/* One case; returns true when the GPU matches. perturb: corrupt one GPU output first. */
static bool run_case(uint32_t type, int64_t n_in, int64_t n_out, mode md, bool perturb)
{
    status st;
    status_clear(&st);
    const quant_traits *tr = quant_get(type);
    gpu_rng rng;
    gpu_rng_seed(&rng, (uint64_t)(n_in * 7919 + n_out * 31 + type + 1000 * md));
    float *x = malloc(n_in * sizeof(float)), *xd = malloc(n_in * sizeof(float));
    float *y0 = malloc(n_out * sizeof(float)), *ref = malloc(n_out * sizeof(float));
    float *ref_exact = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
    float *up = malloc(n_out * sizeof(float)), *up_exact = malloc(n_out * sizeof(float));
    int8_t *qs = malloc(n_in), *gq = malloc(gemv_xq_bytes(n_in));
    float *qd = malloc(n_in / 32 * sizeof(float) + 4), *qsum = malloc(n_in / 32 * sizeof(float) + 4);
    DS_ASSERT(x && xd && y0 && ref && ref_exact && got && up && up_exact && qs && gq && qd && qsum);
    for (int64_t i = 0; i < n_in; i++) x[i] = gpu_rng_normal(&rng);
    for (int64_t i = 0; i < n_out; i++) y0[i] = gpu_rng_normal(&rng);
    const bool q = is_quant(type);
    if (n_in % 32 == 0) gpu_twin_q8_quantize(x, n_in, qs, qd, qsum, xd);
    if (!q) memcpy(xd, x, n_in * sizeof(float));

    dev_matrix W = {0}, U = {0};
    float *d_x = NULL, *d_y = NULL;
    void *d_xq = NULL;
    unsigned long long *d_best = NULL, best = 0;
    bool ok = false;
    if (matrix_make(&W, type, n_in, n_out, 11 + n_out, &st)) goto fail;
    if (md == MODE_SWIGLU && matrix_make(&U, type, n_in, n_out, 12 + n_out, &st)) goto fail;
    if (cuda_alloc((void **)&d_x, n_in * sizeof(float), "x", &st) ||
        cuda_alloc(&d_xq, gemv_xq_bytes(n_in), "xq", &st) ||
        cuda_alloc((void **)&d_y, n_out * sizeof(float), "y", &st) ||
        cuda_alloc((void **)&d_best, sizeof best, "best", &st) ||
        cuda_upload(d_x, x, n_in * sizeof(float), &st) ||
        cuda_upload(d_y, y0, n_out * sizeof(float), &st))
        goto fail;
    if (md != MODE_ADD && cuda_memset(d_y, 0xff, n_out * sizeof(float), &st)) goto fail; /* NaN */
    if (n_in % 32 == 0) {
        gemv_quantize_x(d_x, d_xq, n_in, NULL);
        if (cuda_sync(NULL, "gemv_quantize_x", &st) ||
            cuda_download(gq, d_xq, gemv_xq_bytes(n_in), &st))
            goto fail;
        /* the quantiser is exact: same int8, same d and s */
        const float *gds = (const float *)(gq + n_in);
        int64_t bad = 0;
        for (int64_t i = 0; i < n_in; i++) bad += gq[i] != qs[i];
        for (int64_t b = 0; b < n_in / 32; b++)
            bad += gds[2 * b] != qd[b] || fabsf(gds[2 * b + 1] - qsum[b]) > 1e-6f * (1 + fabsf(qsum[b]));
        if (bad) printf("  quantize_x n=%lld: %lld mismatches\n", (long long)n_in, (long long)bad);
        CU_ASSERT_EQUAL(bad, 0);
    }
    switch (md) {
    case MODE_STORE: gemv(&W.m, d_x, d_xq, d_y, GEMV_STORE, NULL); break;
    case MODE_ADD: gemv(&W.m, d_x, d_xq, d_y, GEMV_ADD, NULL); break;
    case MODE_SWIGLU: gemv_swiglu(&W.m, &U.m, d_x, d_xq, d_y, NULL); break;
    case MODE_ARGMAX:
        gemv_argmax_reset(d_best, NULL);
        gemv_argmax(&W.m, d_x, d_xq, d_y, d_best, NULL);
        break;
    }
    if (cuda_sync(NULL, "gemv", &st) || cuda_download(got, d_y, n_out * sizeof(float), &st) ||
        cuda_download(&best, d_best, sizeof best, &st))
        goto fail;

    const uint64_t rb = quant_row_bytes(type, n_in);
    quant_matvec(type, W.host, rb, n_in, xd, ref, 0, n_out);
    quant_matvec(type, W.host, rb, n_in, x, ref_exact, 0, n_out);
    if (md == MODE_SWIGLU) {
        quant_matvec(type, U.host, rb, n_in, xd, up, 0, n_out);
        quant_matvec(type, U.host, rb, n_in, x, up_exact, 0, n_out);
        for (int64_t i = 0; i < n_out; i++) {
            ref[i] = ref[i] / (1.0f + expf(-ref[i])) * up[i];
            ref_exact[i] = ref_exact[i] / (1.0f + expf(-ref_exact[i])) * up_exact[i];
        }
    }
    if (md == MODE_ADD)
        for (int64_t i = 0; i < n_out; i++) ref[i] += y0[i], ref_exact[i] += y0[i];
    if (perturb) got[n_out / 2] += 0.05f * (float)(rms(ref, n_out) + 1e-3);

    char name[128];
    snprintf(name, sizeof name, "gemv %s %s %lldx%lld%s", tr->name, k_mode_names[md],
             (long long)n_out, (long long)n_in, perturb ? " (perturbed)" : "");
    /* Error scales per row from the dequantised weights: A = max_r sqrt(sum (w x')^2) (float
     * rounding of a sum of n terms ~ eps sqrt(n) A) and N = max_r ||w_r|| (quantising x to 8
     * bits adds sum w d with |d| <= step/2: std ||w|| step / sqrt(12)). */
    double A = 0, N = 0, dmax = 0;
    {
        float *wr = malloc(n_in * sizeof(float));
        DS_ASSERT(wr);
        for (int64_t r = 0; r < n_out; r++) {
            tr->dequant((const uint8_t *)W.host + r * rb, wr, n_in);
            double a = 0, nn = 0;
            for (int64_t i = 0; i < n_in; i++) {
                a += (double)wr[i] * wr[i] * xd[i] * xd[i];
                nn += (double)wr[i] * wr[i];
            }
            A = fmax(A, sqrt(a));
            N = fmax(N, sqrt(nn));
        }
        free(wr);
        for (int64_t b = 0; q && b < n_in / 32; b++) dmax = fmax(dmax, qd[b]);
    }
    const double up_scale = md == MODE_SWIGLU ? 1.0 + rms(up, n_out) : 1.0;
    /* same products, another summation order: float rounding only */
    ok = gpu_parity_check(name, got, ref, n_out, 2e-6 * sqrt((double)n_in) * A * up_scale, 1e-4,
                          n_out >= 16 ? 1e-8 : 1.0, false, NULL);
    if (q && !perturb && md != MODE_SWIGLU) { /* what quantising x to 8 bits costs */
        snprintf(name, sizeof name, "  vs float x (Q8 activation error)");
        ok &= gpu_parity_check(name, got, ref_exact, n_out, 6.0 * N * dmax / sqrt(12.0), 1e-3,
                               n_out >= 16 ? 1e-3 : 1.0, false, NULL);
    }
    if (md == MODE_ARGMAX) {
        int64_t arg = 0;
        for (int64_t i = 1; i < n_out; i++)
            if (got[i] > got[arg]) arg = i;
        if (gemv_argmax_row(best) != arg) {
            printf("  argmax: GPU row %d, GPU logits' argmax %lld\n", gemv_argmax_row(best),
                   (long long)arg);
            ok = false;
        }
    }
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    matrix_free(&W);
    matrix_free(&U);
    cuda_free(d_x);
    cuda_free(d_xq);
    cuda_free(d_y);
    cuda_free(d_best);
    free(x), free(xd), free(y0), free(ref), free(ref_exact), free(got), free(up), free(up_exact);
    free(qs), free(gq), free(qd), free(qsum);
    return ok && st.code == STATUS_OK;
}

static const uint32_t k_types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16,
                                   GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                   GGML_TYPE_Q6_K};

static void test_shapes(void)
{
    if (!g_have_gpu) return;
    /* n_out x n_in; n_in in block units for K-quants (x256), Q8_0 (x32), floats (x32) */
    static const int64_t shapes[][2] = {{1, 1}, {3, 1}, {17, 2}, {33, 3}, {129, 4},
                                        {1000, 20}, {2, 68}, {4099, 10}};
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        const int64_t unit = (k_types[t] == GGML_TYPE_Q4_K || k_types[t] == GGML_TYPE_Q5_K ||
                              k_types[t] == GGML_TYPE_Q6_K) ? 256 : 32;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            CU_ASSERT_TRUE(run_case(k_types[t], shapes[s][1] * unit, shapes[s][0], MODE_STORE, false));
    }
}

static void test_float_odd_widths(void)
{
    if (!g_have_gpu) return;
    /* the reference models have 128-wide rows (attn_output, ssm_out); floats need n_in % 8 */
    CU_ASSERT_TRUE(run_case(GGML_TYPE_F32, 128, 256, MODE_STORE, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_F32, 132, 5, MODE_ADD, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_F16, 136, 7, MODE_STORE, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_BF16, 8, 3, MODE_STORE, false));
}

static void test_epilogues(void)
{
    if (!g_have_gpu) return;
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        CU_ASSERT_TRUE(run_case(k_types[t], 512, 77, MODE_ADD, false));
        CU_ASSERT_TRUE(run_case(k_types[t], 1024, 301, MODE_SWIGLU, false));
        CU_ASSERT_TRUE(run_case(k_types[t], 256, 5003, MODE_ARGMAX, false));
    }
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q6_K, 1024, 248320, MODE_ARGMAX, false)); /* lm_head rows */
}

static void test_perturbed_fails(void)
{
    if (!g_have_gpu) return;
    CU_ASSERT_FALSE(run_case(GGML_TYPE_Q4_K, 512, 64, MODE_STORE, true));
    CU_ASSERT_FALSE(run_case(GGML_TYPE_F16, 256, 9, MODE_ADD, true));
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("gemv parity on the GPU");
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("gemv_parity", NULL, NULL);
    CU_add_test(s, "shapes", test_shapes);
    CU_add_test(s, "float_odd_widths", test_float_odd_widths);
    CU_add_test(s, "epilogues", test_epilogues);
    CU_add_test(s, "perturbed_fails", test_perturbed_fails);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
