/* GPU GEMV (kernels/cuda/gemv.h) against the CPU twin quant_matvec (gguf/quant.h) for every
 * weight type over awkward shapes (1 row, one block, odd row counts, the reference models'
 * 128-wide rows, large), with each epilogue (store, residual add, SwiGLU, argmax) on the warp
 * kernel (rows per warp by the tuning table, and forced to 1, 2 and 4) and the flat kernel, the
 * two-matrix launch (gemv_pair) and the tuning table's choices, plus the Q8 activation
 * quantiser against its C twin (exact), and the multi-column GEMV of short passes (gemv_cols)
 * column by column. The conv epilogue and the embedding step are in
 * kernels_parity. Quantised types are compared with
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
#include "tests/gpu/gemv_emulate.h"
#include "tests/gpu/gpu_parity.h"

static bool g_have_gpu;
static cuda_device_props g_props; /* for gemv_matrix_plan */

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
    dm->m = (gemv_matrix){.type = type, .n_in = n_in, .n_out = n_out, .d_w = dm->d_w};
    return rc;
}

/* Plans the matrix with a kernel (GEMV_KERNEL_AUTO: the tuning table's) and rows per warp
 * (0: the table's). */
static int matrix_plan(dev_matrix *dm, int kernel, int rows_per_warp, status *st)
{
    dm->m.kernel = kernel;
    dm->m.rows_per_warp = rows_per_warp;
    return gemv_matrix_plan(&dm->m, &g_props, st);
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
static const char *k_kernel_names[] = {"planned", "warp", "flat"};

/* One case; returns true when the GPU matches. perturb: corrupt one GPU output first. kernel:
 * GEMV_KERNEL_AUTO (the tuning table) / WARP / FLAT; rpw: rows per warp (0: the table's). */
static bool run_case_k(uint32_t type, int64_t n_in, int64_t n_out, mode md, bool perturb,
                       int kernel, int rpw)
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
    const bool swiglu = md == MODE_SWIGLU;
    bool ok = false;
    if (matrix_make(&W, type, n_in, n_out, 11 + n_out, &st) || matrix_plan(&W, kernel, rpw, &st))
        goto fail;
    if (swiglu && (matrix_make(&U, type, n_in, n_out, 12 + n_out, &st) ||
                   matrix_plan(&U, kernel, rpw, &st)))
        goto fail;
    if (cuda_alloc((void **)&d_x, n_in * sizeof(float), "x", &st) ||
        cuda_alloc(&d_xq, gemv_xq_bytes(n_in), "xq", &st) ||
        cuda_alloc((void **)&d_y, n_out * sizeof(float), "y", &st) ||
        cuda_alloc((void **)&d_best, sizeof best, "best", &st) ||
        cuda_upload(d_x, x, n_in * sizeof(float), &st) ||
        cuda_upload(d_y, y0, n_out * sizeof(float), &st))
        goto fail;
    if (md != MODE_ADD && cuda_memset(d_y, 0xff, n_out * sizeof(float), &st))
        goto fail; /* NaN */
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
    if (swiglu) {
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
    snprintf(name, sizeof name, "gemv %s %s %lldx%lld %s r%d%s", tr->name, k_mode_names[md],
             (long long)n_out, (long long)n_in, k_kernel_names[W.m.plan.kernel == GEMV_KERNEL_FLAT ? 2 : kernel],
             W.m.plan.rows_per_warp, perturb ? " (perturbed)" : "");
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
    const double up_scale = swiglu ? 1.0 + rms(up, n_out) : 1.0;
    /* same products, another summation order: float rounding only */
    ok = gpu_parity_check(name, got, ref, n_out, 2e-6 * sqrt((double)n_in) * A * up_scale, 1e-4,
                          n_out >= 16 ? 1e-8 : 1.0, false, NULL);
    if (q && !perturb && !swiglu) { /* what quantising x to 8 bits costs */
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

/* Every kernel that takes the case: the tuning table's plan, the warp kernel (its rows per
 * warp, and 1, 2 and 4 with `all_rows`), the flat kernel where it applies. perturb: true when
 * any of them fails (each must, the output being corrupted). */
static bool run_case_r(uint32_t type, int64_t n_in, int64_t n_out, mode md, bool perturb,
                       bool all_rows)
{
    bool ok = run_case_k(type, n_in, n_out, md, perturb, GEMV_KERNEL_AUTO, 0);
    ok = perturb ? ok || run_case_k(type, n_in, n_out, md, perturb, GEMV_KERNEL_WARP, 0)
                 : ok & run_case_k(type, n_in, n_out, md, perturb, GEMV_KERNEL_WARP, 0);
    for (int r = 1; all_rows && r <= 4; r *= 2)
        ok = perturb ? ok || run_case_k(type, n_in, n_out, md, perturb, GEMV_KERNEL_WARP, r)
                     : ok & run_case_k(type, n_in, n_out, md, perturb, GEMV_KERNEL_WARP, r);
    if (gemv_flat_supported(type, n_in))
        ok = perturb ? ok || run_case_k(type, n_in, n_out, md, perturb, GEMV_KERNEL_FLAT, 0)
                     : ok & run_case_k(type, n_in, n_out, md, perturb, GEMV_KERNEL_FLAT, 0);
    return ok;
}

static bool run_case(uint32_t type, int64_t n_in, int64_t n_out, mode md, bool perturb)
{
    return run_case_r(type, n_in, n_out, md, perturb, false);
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
    /* the 27B's shapes: gate/up as a SwiGLU pair, down, a last CTA of fewer rows, fewer rows
     * than CTAs; Q4_K and Q5_K */
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q4_K, 5120, 17408, MODE_SWIGLU, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q4_K, 17408, 5120, MODE_ADD, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q5_K, 17408, 1029, MODE_SWIGLU, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q4_K, 2560, 9219, MODE_STORE, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q5_K, 4096, 70, MODE_ARGMAX, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q4_K, 1024, 248320, MODE_ARGMAX, false));
    /* the 0.8B's shapes (the warp kernel splits their rows over 2-4 warps) */
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q4_K, 1024, 3584, MODE_SWIGLU, false));
    CU_ASSERT_TRUE(run_case(GGML_TYPE_Q4_K, 3584, 1024, MODE_ADD, false));
    /* every rows-per-warp build of every type, each epilogue, odd rows */
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++)
        for (int md = MODE_STORE; md <= MODE_ARGMAX; md++)
            CU_ASSERT_TRUE(run_case_r(k_types[t], 512, 203, (mode)md, false, true));
}

/* The tuning table's choices (gemv_matrix_plan) for the shapes it was measured on. */
static void test_plan(void)
{
    if (!g_have_gpu) return;
    static const struct {
        uint32_t type;
        int64_t n_out, n_in;
        int kernel, rows;
    } k[] = {
        {GGML_TYPE_Q6_K, 5120, 17408, GEMV_KERNEL_FLAT, 0},   /* 27B ffn_down (Q6_K layers) */
        {GGML_TYPE_Q6_K, 10240, 5120, GEMV_KERNEL_FLAT, 0},   /* 27B attn_qkv */
        {GGML_TYPE_Q6_K, 248320, 5120, GEMV_KERNEL_WARP, 4},  /* lm_heads */
        {GGML_TYPE_Q6_K, 248320, 1024, GEMV_KERNEL_WARP, 4},
        {GGML_TYPE_Q6_K, 6144, 1024, GEMV_KERNEL_WARP, 2},    /* under 2^25 weights */
        {GGML_TYPE_Q6_K, 1024, 1024, GEMV_KERNEL_WARP, 1},
        {GGML_TYPE_Q4_K, 17408, 5120, GEMV_KERNEL_WARP, 1},
        {GGML_TYPE_Q4_K, 9216, 2560, GEMV_KERNEL_WARP, 1},
        {GGML_TYPE_Q5_K, 10240, 5120, GEMV_KERNEL_WARP, 1},
        {GGML_TYPE_Q8_0, 48, 5120, GEMV_KERNEL_WARP, 1},
        {GGML_TYPE_F32, 64, 128, GEMV_KERNEL_WARP, 1},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        status st;
        gemv_matrix m = {.type = k[i].type, .n_in = k[i].n_in, .n_out = k[i].n_out, .d_w = NULL};
        CU_ASSERT_EQUAL_FATAL(gemv_matrix_plan(&m, &g_props, &st), STATUS_OK);
        CU_ASSERT_EQUAL(m.plan.kernel, k[i].kernel);
        if (k[i].rows) CU_ASSERT_EQUAL(m.plan.rows_per_warp, k[i].rows);
        for (int e = 0; e < GEMV_N_SHAPES; e++) CU_ASSERT_TRUE(m.plan.shape[e].grid >= 1);
        if (m.plan.kernel != k[i].kernel || (k[i].rows && m.plan.rows_per_warp != k[i].rows))
            printf("  plan %s %lldx%lld: kernel %d, %d rows a warp\n", quant_get(k[i].type)->name,
                   (long long)k[i].n_out, (long long)k[i].n_in, m.plan.kernel, m.plan.rows_per_warp);
    }
    /* forcing a kernel the shape cannot take fails */
    status st;
    gemv_matrix bad = {.type = GGML_TYPE_F32, .n_in = 8, .n_out = 4, .kernel = GEMV_KERNEL_FLAT};
    CU_ASSERT_EQUAL(gemv_matrix_plan(&bad, &g_props, &st), STATUS_UNSUPPORTED);
    /* the pair: both in-projection groups of the 0.8B (6.3 MiB) yes, the 27B's (~55 MiB) no */
    gemv_matrix a = {.type = GGML_TYPE_Q6_K, .n_in = 1024, .n_out = 6144};
    gemv_matrix b = {.type = GGML_TYPE_Q4_K, .n_in = 1024, .n_out = 2080};
    CU_ASSERT_EQUAL_FATAL(gemv_matrix_plan(&a, &g_props, &st), STATUS_OK);
    CU_ASSERT_EQUAL_FATAL(gemv_matrix_plan(&b, &g_props, &st), STATUS_OK);
    CU_ASSERT_TRUE(gemv_pair_planned(&a, &b));
    /* two Q4_K matrices together over 32 MiB */
    gemv_matrix c = {.type = GGML_TYPE_Q4_K, .n_in = 5120, .n_out = 6144};
    gemv_matrix d = {.type = GGML_TYPE_Q4_K, .n_in = 5120, .n_out = 6144};
    CU_ASSERT_EQUAL_FATAL(gemv_matrix_plan(&c, &g_props, &st), STATUS_OK);
    CU_ASSERT_EQUAL_FATAL(gemv_matrix_plan(&d, &g_props, &st), STATUS_OK);
    CU_ASSERT_TRUE(gemv_pair_supported(&c, &d));
    CU_ASSERT_FALSE(gemv_pair_planned(&c, &d));
}

/* gemv_pair (two matrices, one launch) against the two launches it replaces (gemv_conv or
 * gemv, then gemv) on the same input: the outputs and the conv windows it leaves. Rows may be
 * split over warps differently (each side has part of the grid), so float rounding only. */
static bool pair_case(uint32_t t0, int64_t n0, int64_t n_conv, uint32_t t1, int64_t n1,
                      int64_t n_in, bool perturb)
{
    status st;
    status_clear(&st);
    const int K = 4;
    gpu_rng rng;
    gpu_rng_seed(&rng, (uint64_t)(n0 * 31 + n1 * 7 + n_in + t0 * 1000 + t1));
    dev_matrix A = {0}, B = {0};
    float *x = malloc(n_in * sizeof(float)), *cw = malloc((n_conv * K + 1) * sizeof(float));
    float *cs = malloc((n_conv * (K - 1) + 1) * sizeof(float));
    float *y0 = malloc(n0 * sizeof(float)), *y1 = malloc(n1 * sizeof(float));
    float *r0 = malloc(n0 * sizeof(float)), *r1 = malloc(n1 * sizeof(float));
    float *cs_got = malloc((n_conv * (K - 1) + 1) * sizeof(float));
    float *cs_ref = malloc((n_conv * (K - 1) + 1) * sizeof(float));
    DS_ASSERT(x && cw && cs && y0 && y1 && r0 && r1 && cs_got && cs_ref);
    for (int64_t i = 0; i < n_in; i++) x[i] = gpu_rng_normal(&rng);
    for (int64_t i = 0; i < n_conv * K; i++) cw[i] = 0.5f * gpu_rng_normal(&rng);
    for (int64_t i = 0; i < n_conv * (K - 1); i++) cs[i] = gpu_rng_normal(&rng);
    float *d_x = NULL, *d_y0 = NULL, *d_y1 = NULL, *d_cw = NULL, *d_cs = NULL;
    void *d_xq = NULL;
    const size_t csb = (size_t)(n_conv * (K - 1) + 1) * sizeof(float);
    bool ok = false;
    if (matrix_make(&A, t0, n_in, n0, 21 + n0, &st) || matrix_make(&B, t1, n_in, n1, 22 + n1, &st) ||
        cuda_alloc((void **)&d_x, n_in * sizeof(float), "x", &st) ||
        cuda_alloc(&d_xq, gemv_xq_bytes(n_in), "xq", &st) ||
        cuda_alloc((void **)&d_y0, n0 * sizeof(float), "y0", &st) ||
        cuda_alloc((void **)&d_y1, n1 * sizeof(float), "y1", &st) ||
        cuda_alloc((void **)&d_cw, (n_conv * K + 1) * sizeof(float), "conv w", &st) ||
        cuda_alloc((void **)&d_cs, csb, "conv state", &st) ||
        cuda_upload(d_x, x, n_in * sizeof(float), &st) ||
        cuda_upload(d_cw, cw, (n_conv * K + 1) * sizeof(float), &st))
        goto fail;
    if (matrix_plan(&A, GEMV_KERNEL_WARP, 0, &st) || matrix_plan(&B, GEMV_KERNEL_WARP, 0, &st))
        goto fail;
    CU_ASSERT_TRUE(gemv_pair_supported(&A.m, &B.m));
    gemv_quantize_x(d_x, d_xq, n_in, NULL);
    /* the two launches */
    if (cuda_upload(d_cs, cs, csb, &st)) goto fail;
    if (n_conv)
        gemv_conv(&A.m, d_x, d_xq, d_y0, d_cw, d_cs, n_conv, K, NULL);
    else
        gemv(&A.m, d_x, d_xq, d_y0, GEMV_STORE, NULL);
    gemv(&B.m, d_x, d_xq, d_y1, GEMV_STORE, NULL);
    if (cuda_sync(NULL, "gemv x2", &st) || cuda_download(r0, d_y0, n0 * sizeof(float), &st) ||
        cuda_download(r1, d_y1, n1 * sizeof(float), &st) || cuda_download(cs_ref, d_cs, csb, &st))
        goto fail;
    /* the pair, from the same conv windows, into NaN-filled outputs */
    if (cuda_upload(d_cs, cs, csb, &st) || cuda_memset(d_y0, 0xff, n0 * sizeof(float), &st) ||
        cuda_memset(d_y1, 0xff, n1 * sizeof(float), &st))
        goto fail;
    gemv_pair(&A.m, &B.m, d_xq, d_y0, d_y1, n_conv ? d_cw : NULL, n_conv ? d_cs : NULL, n_conv, K,
              NULL);
    if (cuda_sync(NULL, "gemv_pair", &st) || cuda_download(y0, d_y0, n0 * sizeof(float), &st) ||
        cuda_download(y1, d_y1, n1 * sizeof(float), &st) || cuda_download(cs_got, d_cs, csb, &st))
        goto fail;
    if (perturb) y1[n1 / 2] += 0.05f * (float)(rms(r1, n1) + 1e-3);
    char name[160];
    snprintf(name, sizeof name, "gemv_pair %s %lldx%lld%s + %s %lldx%lld%s",
             quant_get(t0)->name, (long long)n0, (long long)n_in, n_conv ? " (conv)" : "",
             quant_get(t1)->name, (long long)n1, (long long)n_in, perturb ? " (perturbed)" : "");
    ok = gpu_parity_check(name, y0, r0, n0, 1e-5 * (rms(r0, n0) + 1e-3), 1e-4, 1e-8, false, NULL);
    ok &= gpu_parity_check("  second matrix", y1, r1, n1, 1e-5 * (rms(r1, n1) + 1e-3), 1e-4,
                           1e-8, false, NULL);
    if (n_conv) /* the windows hold x-independent history and this step's W·x: same values */
        ok &= gpu_parity_check("  conv windows", cs_got, cs_ref, n_conv * (K - 1),
                               1e-5 * (rms(cs_ref, n_conv * (K - 1)) + 1e-3), 1e-4, 1e-8, false, NULL);
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    matrix_free(&A);
    matrix_free(&B);
    cuda_free(d_x), cuda_free(d_xq), cuda_free(d_y0), cuda_free(d_y1), cuda_free(d_cw), cuda_free(d_cs);
    free(x), free(cw), free(cs), free(y0), free(y1), free(r0), free(r1), free(cs_got), free(cs_ref);
    return ok && st.code == STATUS_OK;
}

static void test_pair(void)
{
    if (!g_have_gpu) return;
    /* the 0.8B's GDN in-projection (Q6_K qkv with the conv, Q4_K z|beta|alpha) */
    CU_ASSERT_TRUE(pair_case(GGML_TYPE_Q6_K, 6144, 6144, GGML_TYPE_Q4_K, 2080, 1024, false));
    /* conv on part of the rows; the other order of types; both of one type; tiny and uneven */
    CU_ASSERT_TRUE(pair_case(GGML_TYPE_Q4_K, 700, 512, GGML_TYPE_Q6_K, 33, 2560, false));
    CU_ASSERT_TRUE(pair_case(GGML_TYPE_Q4_K, 4096, 0, GGML_TYPE_Q6_K, 1024, 1024, false));
    CU_ASSERT_TRUE(pair_case(GGML_TYPE_Q6_K, 1, 0, GGML_TYPE_Q6_K, 70, 256, false));
    CU_ASSERT_TRUE(pair_case(GGML_TYPE_Q4_K, 8192, 8192, GGML_TYPE_Q4_K, 4128, 2560, false));
    /* a large pair: the wave split by bytes (27B-like widths) */
    CU_ASSERT_TRUE(pair_case(GGML_TYPE_Q6_K, 10240, 10240, GGML_TYPE_Q4_K, 6208, 5120, false));
    CU_ASSERT_FALSE(pair_case(GGML_TYPE_Q6_K, 512, 512, GGML_TYPE_Q4_K, 96, 1024, true));
}

/* Runs without a GPU: the flat kernel's walk and slices executed on the host
 * (gemv_flat_emulate) against quant_matvec on the Q8-rounded x, for every type, awkward shapes
 * and several grids (one CTA, a few, one CTA per row); plus one perturbed case that must fail. */
static bool emulate_case(uint32_t type, int64_t n_in, int64_t n_out, int grid, bool perturb)
{
    gpu_rng rng;
    gpu_rng_seed(&rng, (uint64_t)(n_in * 131 + n_out * 7 + type + grid));
    const uint64_t raw = quant_row_bytes(type, (uint64_t)(n_in * n_out));
    const uint64_t packed = gemv_packed_bytes(type, n_in, n_out);
    void *host = malloc(raw), *pk = calloc(1, packed);
    float *x = malloc(n_in * sizeof(float)), *xd = malloc(n_in * sizeof(float));
    float *ref = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
    int8_t *xq = malloc(gemv_xq_bytes(n_in));
    float *qd = malloc((n_in / 32 + 1) * sizeof(float)), *qsum = malloc((n_in / 32 + 1) * sizeof(float));
    DS_ASSERT(host && pk && x && xd && ref && got && xq && qd && qsum);
    gpu_random_tensor(type, n_in * n_out, 0.1f, &rng, host);
    for (int64_t i = 0; i < n_in; i++) x[i] = gpu_rng_normal(&rng);
    const bool q = is_quant(type);
    if (q) {
        gpu_twin_q8_quantize(x, n_in, xq, qd, qsum, xd);
        float *ds = (float *)(xq + n_in);
        for (int64_t b = 0; b < n_in / 32; b++) ds[2 * b] = qd[b], ds[2 * b + 1] = qsum[b];
    } else {
        memcpy(xd, x, n_in * sizeof(float));
    }
    gemv_pack_host(type, host, pk, n_in, n_out);
    const int rc = gemv_flat_emulate(type, pk, n_in, n_out, q ? NULL : x, q ? xq : NULL, got, grid);
    CU_ASSERT_EQUAL(rc, 0);
    const uint64_t rb = quant_row_bytes(type, n_in);
    quant_matvec(type, host, rb, n_in, xd, ref, 0, n_out);
    double A = 0;
    float *wr = malloc(n_in * sizeof(float));
    for (int64_t r = 0; r < n_out; r++) {
        quant_get(type)->dequant((const uint8_t *)host + r * rb, wr, n_in);
        double a = 0;
        for (int64_t i = 0; i < n_in; i++) a += (double)wr[i] * wr[i] * xd[i] * xd[i];
        A = fmax(A, sqrt(a));
    }
    free(wr);
    if (perturb) got[n_out / 2] += 0.05f * (float)(rms(ref, n_out) + 1e-3);
    char name[128];
    snprintf(name, sizeof name, "flat (host) %s %lldx%lld grid %d%s", quant_get(type)->name,
             (long long)n_out, (long long)n_in, grid, perturb ? " (perturbed)" : "");
    const bool ok = rc == 0 && gpu_parity_check(name, got, ref, n_out, 2e-6 * sqrt((double)n_in) * A,
                                                1e-4, n_out >= 16 ? 1e-8 : 1.0, !perturb, NULL);
    free(host), free(pk), free(x), free(xd), free(ref), free(got), free(xq), free(qd), free(qsum);
    return ok;
}

static void test_flat_emulated(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {3, 1}, {17, 2}, {33, 3}, {129, 4}, {257, 20}, {5, 68}};
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        const int64_t unit = (k_types[t] == GGML_TYPE_Q4_K || k_types[t] == GGML_TYPE_Q5_K ||
                              k_types[t] == GGML_TYPE_Q6_K) ? 256 : 64;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t n_out = shapes[s][0], n_in = shapes[s][1] * unit;
            const int grids[] = {1, 2, 7, (int)n_out};
            for (int g = 0; g < 4; g++) {
                if (grids[g] > n_out) continue;
                CU_ASSERT_TRUE(emulate_case(k_types[t], n_in, n_out, grids[g], false));
            }
        }
    }
    CU_ASSERT_FALSE(emulate_case(GGML_TYPE_Q4_K, 512, 64, 3, true));
    CU_ASSERT_FALSE(emulate_case(GGML_TYPE_Q6_K, 512, 64, 3, true));
}

/* The float-rounding scale of a GEMV against quant_matvec: A = max over rows of
 * sqrt(sum (w x)^2) for the dequantised weights of the GGUF rows in host. */
static double sum_scale(uint32_t type, const void *host, int64_t n_in, int64_t n_out,
                        const float *x)
{
    const quant_traits *tr = quant_get(type);
    const uint64_t rb = quant_row_bytes(type, n_in);
    float *wr = malloc(n_in * sizeof(float));
    DS_ASSERT(wr);
    double A = 0;
    for (int64_t r = 0; r < n_out; r++) {
        tr->dequant((const uint8_t *)host + r * rb, wr, n_in);
        double a = 0;
        for (int64_t k = 0; k < n_in; k++) a += (double)wr[k] * wr[k] * x[k] * x[k];
        A = fmax(A, sqrt(a));
    }
    free(wr);
    return A;
}

/* gemv_cols (B rows of x through one read of the weights) on the matrix as planned: each
 * column against quant_matvec on that row's Q8-rounded x (the tight bound of run_case_k) and
 * against gemv of that row alone (the same walk: printed when not bit-identical, within the
 * same bound); the Q8 rows of gemv_quantize_rows equal gemv_quantize_x's row by row; nothing
 * written past the B rows' n_out columns. perturb: corrupt one output first. */
static bool cols_case_r(uint32_t type, int64_t n_in, int64_t n_out, int B, bool add, bool perturb,
                        int rows)
{
    status st;
    status_clear(&st);
    const quant_traits *tr = quant_get(type);
    const bool q = is_quant(type);
    const int64_t ld_x = n_in + 4, ld_y = n_out + 3, xs = (int64_t)gemv_xq_bytes(n_in);
    gpu_rng rng;
    gpu_rng_seed(&rng, (uint64_t)(n_in * 131 + n_out * 7 + type * 3 + B));
    float *x = calloc((size_t)(B * ld_x), sizeof(float)), *xd = malloc(n_in * sizeof(float));
    float *y0 = malloc((size_t)(B * ld_y) * sizeof(float)), *got = malloc((size_t)(B * ld_y) * sizeof(float));
    float *one = malloc(n_out * sizeof(float)), *ref = malloc(n_out * sizeof(float));
    int8_t *qs = malloc(n_in), *gq = malloc((size_t)(B * xs)), *gq1 = malloc(gemv_xq_bytes(n_in));
    float *qd = malloc(n_in / 32 * sizeof(float) + 4), *qsum = malloc(n_in / 32 * sizeof(float) + 4);
    DS_ASSERT(x && xd && y0 && got && one && ref && qs && gq && gq1 && qd && qsum);
    for (int64_t i = 0; i < B * ld_x; i++) x[i] = gpu_rng_normal(&rng);
    for (int64_t i = 0; i < B * ld_y; i++) y0[i] = gpu_rng_normal(&rng);
    dev_matrix W = {0};
    float *d_x = NULL, *d_y = NULL, *d_one = NULL;
    void *d_xq = NULL, *d_xq1 = NULL;
    bool ok = true;
    if (matrix_make(&W, type, n_in, n_out, 21 + n_out, &st) ||
        (W.m.cols_rows = rows, matrix_plan(&W, GEMV_KERNEL_AUTO, 0, &st)) ||
        cuda_alloc((void **)&d_x, (size_t)(B * ld_x) * sizeof(float), "x", &st) ||
        cuda_alloc(&d_xq, (size_t)(B * xs), "xq", &st) ||
        cuda_alloc(&d_xq1, gemv_xq_bytes(n_in), "xq1", &st) ||
        cuda_alloc((void **)&d_y, (size_t)(B * ld_y) * sizeof(float), "y", &st) ||
        cuda_alloc((void **)&d_one, n_out * sizeof(float), "one", &st) ||
        cuda_upload(d_x, x, (size_t)(B * ld_x) * sizeof(float), &st) ||
        cuda_upload(d_y, y0, (size_t)(B * ld_y) * sizeof(float), &st))
        goto fail;
    CU_ASSERT_TRUE(gemv_cols_planned(&W.m));
    if (!add) /* NaN in the rows' columns, the padding past n_out keeps y0 */
        for (int i = 0; i < B && !st.code; i++)
            cuda_memset(d_y + i * ld_y, 0xff, n_out * sizeof(float), &st);
    if (q) gemv_quantize_rows(d_x, ld_x, d_xq, n_in, B, NULL);
    gemv_cols(&W.m, d_x, ld_x, d_xq, d_y, ld_y, add ? GEMV_ADD : GEMV_STORE, B, NULL);
    if (cuda_sync(NULL, "gemv_cols", &st) ||
        cuda_download(got, d_y, (size_t)(B * ld_y) * sizeof(float), &st) ||
        (q && cuda_download(gq, d_xq, (size_t)(B * xs), &st)))
        goto fail;
    if (perturb) got[(B - 1) * ld_y + n_out / 2] += 1.0f + fabsf(got[(B - 1) * ld_y + n_out / 2]);
    const uint64_t rb = quant_row_bytes(type, n_in);
    for (int i = 0; i < B; i++) {
        const float *xi = x + i * ld_x;
        if (q) {
            gpu_twin_q8_quantize(xi, n_in, qs, qd, qsum, xd);
            /* the row's Q8 form: gemv_quantize_x's, byte for byte */
            gemv_quantize_x(d_x + i * ld_x, d_xq1, n_in, NULL);
            if (cuda_sync(NULL, "gemv_quantize_x", &st) ||
                cuda_download(gq1, d_xq1, gemv_xq_bytes(n_in), &st))
                goto fail;
            if (memcmp(gq1, gq + i * xs, gemv_xq_bytes(n_in)) != 0) {
                printf("  cols: row %d's Q8 form differs from gemv_quantize_x's\n", i);
                ok = false;
            }
        } else {
            memcpy(xd, xi, n_in * sizeof(float));
        }
        /* gemv of the row alone (d_xq1 holds its Q8 form) */
        if (!add) gemv(&W.m, d_x + i * ld_x, d_xq1, d_one, GEMV_STORE, NULL);
        else if (cuda_upload(d_one, y0 + i * ld_y, n_out * sizeof(float), &st))
            goto fail;
        else
            gemv(&W.m, d_x + i * ld_x, d_xq1, d_one, GEMV_ADD, NULL);
        if (cuda_sync(NULL, "gemv", &st) || cuda_download(one, d_one, n_out * sizeof(float), &st))
            goto fail;
        quant_matvec(type, W.host, rb, n_in, xd, ref, 0, n_out);
        const double A = sum_scale(type, W.host, n_in, n_out, xd);
        if (add)
            for (int64_t r = 0; r < n_out; r++) ref[r] += y0[i * ld_y + r];
        char name[128];
        snprintf(name, sizeof name, "gemv_cols %s %s %lldx%lld B=%d r%d row %d%s", tr->name,
                 add ? "add" : "store", (long long)n_out, (long long)n_in, B, rows, i,
                 perturb ? " (perturbed)" : "");
        const double atol = 2e-6 * sqrt((double)n_in) * A;
        const double nmse = n_out >= 16 ? 1e-8 : 1.0;
        ok &= gpu_parity_check(name, got + i * ld_y, ref, n_out, atol, 1e-4, nmse, true, NULL);
        int64_t same = 0;
        for (int64_t r = 0; r < n_out; r++) same += got[i * ld_y + r] == one[r];
        if (same != n_out) {
            snprintf(name, sizeof name, "  row %d against gemv alone (%lld of %lld equal)", i,
                     (long long)same, (long long)n_out);
            ok &= gpu_parity_check(name, got + i * ld_y, one, n_out, atol, 1e-4, nmse, false, NULL);
        }
        for (int64_t r = n_out; r < ld_y; r++)
            if (memcmp(&got[i * ld_y + r], &y0[i * ld_y + r], sizeof(float)) != 0) {
                printf("  cols: row %d column %lld past n_out written\n", i, (long long)r);
                ok = false;
            }
    }
    if (!perturb)
        printf("  gemv_cols %s %s %lldx%lld B=%d r%d: %s\n", tr->name, add ? "add" : "store",
               (long long)n_out, (long long)n_in, B, rows, ok ? "ok" : "FAILED");
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    matrix_free(&W);
    cuda_free(d_x), cuda_free(d_xq), cuda_free(d_xq1), cuda_free(d_y), cuda_free(d_one);
    free(x), free(xd), free(y0), free(got), free(one), free(ref), free(qs), free(gq), free(gq1);
    free(qd), free(qsum);
    return ok && st.code == STATUS_OK;
}

/* gemv_mma: each column of a pass of B <= GEMV_MMA_ROWS rows (the one-tile kernels to 8, the
 * 64-row tiles from 9, split K where the matrix has few tiles) against quant_matvec on that row's
 * x as gemv_mma_quantize rounds it (Q8_K, whose levels and scales must equal the CPU's
 * quant_quantize_row_q8_K_ref bit for bit), within the tight bound of gemv_cols;
 * nothing written past n_out. */
static bool q8k_row_check(const float *x, int64_t n_in, const uint8_t *gq, float *xd, int row)
{
    const int64_t nb = n_in / 256;
    block_q8_K *k = malloc((size_t)nb * sizeof(block_q8_K));
    DS_ASSERT(k);
    quant_quantize_row_q8_K_ref(x, k, n_in);
    bool ok = true;
    for (int64_t b = 0; b < nb; b++) {
        float d;
        memcpy(&d, gq + n_in + 4 * b, 4);
        if (memcmp(&d, &k[b].d, 4) != 0 || memcmp(gq + 256 * b, k[b].qs, 256) != 0) {
            if (ok) printf("  q8_K: row %d block %lld differs from the CPU's (d %g / %g)\n", row,
                           (long long)b, d, k[b].d);
            ok = false;
        }
        for (int e = 0; e < 256; e++) xd[256 * b + e] = k[b].d * (float)k[b].qs[e];
    }
    free(k);
    return ok;
}

static bool mma_case(uint32_t type, int64_t n_in, int64_t n_out, int B, bool add)
{
    status st;
    status_clear(&st);
    const char *kname = quant_get(type)->name;
    const int64_t ld_x = n_in + 4, ld_y = n_out + 3, xs = (int64_t)gemv_xq_bytes(n_in);
    gpu_rng rng;
    gpu_rng_seed(&rng, (uint64_t)(n_in * 17 + n_out * 5 + B));
    float *x = calloc((size_t)(B * ld_x), sizeof(float)), *xd = malloc(n_in * sizeof(float));
    float *y0 = malloc((size_t)(B * ld_y) * sizeof(float)), *got = malloc((size_t)(B * ld_y) * sizeof(float));
    float *ref = malloc(n_out * sizeof(float));
    uint8_t *gq = malloc((size_t)(B * xs));
    DS_ASSERT(x && xd && y0 && got && ref && gq);
    for (int64_t i = 0; i < B * ld_x; i++) x[i] = gpu_rng_normal(&rng);
    for (int64_t i = 0; i < B * ld_y; i++) y0[i] = gpu_rng_normal(&rng);
    dev_matrix W = {0};
    float *d_x = NULL, *d_y = NULL, *d_work = NULL;
    void *d_xq = NULL;
    bool ok = true;
    if (matrix_make(&W, type, n_in, n_out, 29 + n_out, &st) ||
        matrix_plan(&W, GEMV_KERNEL_AUTO, 0, &st))
        goto fail;
    const int64_t work = gemv_mma_work_floats(&W.m, B);
    if ((work && cuda_alloc((void **)&d_work, (size_t)work * sizeof(float), "work", &st)) ||
        cuda_alloc((void **)&d_x, (size_t)(B * ld_x) * sizeof(float), "x", &st) ||
        cuda_alloc(&d_xq, (size_t)(B * xs), "xq", &st) ||
        cuda_alloc((void **)&d_y, (size_t)(B * ld_y) * sizeof(float), "y", &st) ||
        cuda_upload(d_x, x, (size_t)(B * ld_x) * sizeof(float), &st) ||
        cuda_upload(d_y, y0, (size_t)(B * ld_y) * sizeof(float), &st))
        goto fail;
    gemv_mma_quantize(d_x, ld_x, d_xq, n_in, B, NULL);
    gemv_mma(&W.m, d_xq, d_y, ld_y, add ? GEMV_ADD : GEMV_STORE, B, d_work, NULL);
    if (cuda_sync(NULL, kname, &st) ||
        cuda_download(got, d_y, (size_t)(B * ld_y) * sizeof(float), &st) ||
        cuda_download(gq, d_xq, (size_t)(B * xs), &st))
        goto fail;
    const uint64_t rb = quant_row_bytes(type, n_in);
    for (int i = 0; i < B; i++) {
        ok &= q8k_row_check(x + i * ld_x, n_in, gq + i * xs, xd, i);
        quant_matvec(type, W.host, rb, n_in, xd, ref, 0, n_out);
        const double A = sum_scale(type, W.host, n_in, n_out, xd);
        if (add)
            for (int64_t r = 0; r < n_out; r++) ref[r] += y0[i * ld_y + r];
        char name[128];
        snprintf(name, sizeof name, "gemv_mma %s %s %lldx%lld B=%d row %d", kname, add ? "add" : "store",
                 (long long)n_out, (long long)n_in, B, i);
        const double atol = 2e-6 * sqrt((double)n_in) * A;
        ok &= gpu_parity_check(name, got + i * ld_y, ref, n_out, atol, 1e-4, n_out >= 16 ? 1e-8 : 1.0,
                               true, NULL);
        for (int64_t r = n_out; r < ld_y; r++)
            if (memcmp(&got[i * ld_y + r], &y0[i * ld_y + r], sizeof(float)) != 0) {
                printf("  mma: row %d column %lld past n_out written\n", i, (long long)r);
                ok = false;
            }
    }
    printf("  gemv_mma %s %s %lldx%lld B=%d: %s\n", kname, add ? "add" : "store", (long long)n_out,
           (long long)n_in, B, ok ? "ok" : "FAILED");
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    matrix_free(&W);
    cuda_free(d_x), cuda_free(d_xq), cuda_free(d_y), cuda_free(d_work);
    free(x), free(xd), free(y0), free(got), free(ref), free(gq);
    return ok && st.code == STATUS_OK;
}

/* gemv_quantize_rows_k on the blocks the CPU's Q8_K treats specially: all zero, a tie of |x|
 * between a negative and a later positive value (the first wins: levels of the opposite sign),
 * a NaN, an infinity, a tiny block; each row's levels and scales equal the CPU's bit for bit. */
static void test_quantize_k(void)
{
    if (!g_have_gpu) return;
    enum { N = 1280, R = 2 };
    const int64_t xs = (int64_t)gemv_xq_bytes(N);
    float *x = malloc(R * N * sizeof(float)), *xd = malloc(N * sizeof(float));
    uint8_t *gq = malloc((size_t)(R * xs));
    DS_ASSERT(x && xd && gq);
    gpu_rng rng;
    gpu_rng_seed(&rng, 77);
    for (int i = 0; i < R * N; i++) x[i] = gpu_rng_normal(&rng);
    for (int i = 0; i < 256; i++) x[i] = 0.0f;     /* row 0 block 0: zeros */
    x[256 + 5] = -9.0f, x[256 + 200] = 9.0f;         /* block 1: a tie, the negative first */
    x[512 + 17] = NAN;                                /* block 2: NaN */
    x[768 + 255] = INFINITY;                          /* block 3: infinity */
    for (int i = 1024; i < 1280; i++) x[i] *= 1e-30f; /* block 4: tiny */
    x[N + 3] = 5.0f, x[N + 4] = -5.0f;                /* row 1: the positive first */
    status st;
    status_clear(&st);
    float *d_x = NULL;
    void *d_xq = NULL;
    bool ok = false;
    if (!cuda_alloc((void **)&d_x, R * N * sizeof(float), "x", &st) &&
        !cuda_alloc(&d_xq, (size_t)(R * xs), "xq", &st) &&
        !cuda_upload(d_x, x, R * N * sizeof(float), &st)) {
        gemv_quantize_rows_k(d_x, N, d_xq, N, R, NULL);
        if (!cuda_sync(NULL, "quantize_k", &st) && !cuda_download(gq, d_xq, (size_t)(R * xs), &st)) {
            ok = true;
            for (int r = 0; r < R; r++) ok &= q8k_row_check(x + r * N, N, gq + r * xs, xd, r);
        }
    }
    if (st.code) printf("  %s\n", st.msg);
    printf("  gemv_quantize_rows_k special blocks: %s\n", ok ? "ok" : "FAILED");
    CU_ASSERT_TRUE(ok);
    cuda_free(d_x), cuda_free(d_xq);
    free(x), free(xd), free(gq);
}

static void test_mma(void)
{
    if (!g_have_gpu) return;
    static const int64_t shapes[][2] = {{256, 16}, {512, 37}, {2560, 1000}, {5120, 4099}};
    static const uint32_t types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    for (int ti = 0; ti < 3; ti++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            for (int B = 1; B <= 8; B++) {
                CU_ASSERT_TRUE(mma_case(types[ti], shapes[s][0], shapes[s][1], B, false));
                if (B == 3 || B == 8)
                    CU_ASSERT_TRUE(mma_case(types[ti], shapes[s][0], shapes[s][1], B, true));
            }
            /* the 64-row tiles: each column-tile count, its edges; the largest shape (split K
             * on a 132-SM GPU: 5 splits of 4 super-blocks) at a few */
            static const int tiled[] = {9, 16, 17, 32, 33, 64};
            for (size_t k = 0; k < sizeof tiled / sizeof tiled[0]; k++) {
                const int B = tiled[k];
                if (shapes[s][1] > 2000 && B != 9 && B != 33 && B != 64) continue;
                CU_ASSERT_TRUE(mma_case(types[ti], shapes[s][0], shapes[s][1], B, B == 17 || B == 64));
            }
        }
}

/* gemv_cols_swiglu: each row of the pass against silu(gate·x') * (up·x') from quant_matvec on
 * the row's Q8-rounded x' (run_case_k's SwiGLU bound). */
static bool cols_swiglu_case(uint32_t type, int64_t n_in, int64_t n_out, int B, bool perturb)
{
    status st;
    status_clear(&st);
    const quant_traits *tr = quant_get(type);
    const bool q = is_quant(type);
    const int64_t ld_y = n_out + 1, xs = (int64_t)gemv_xq_bytes(n_in);
    gpu_rng rng;
    gpu_rng_seed(&rng, (uint64_t)(n_in * 17 + n_out * 5 + type + B));
    float *x = malloc((size_t)(B * n_in) * sizeof(float)), *xd = malloc(n_in * sizeof(float));
    float *got = malloc((size_t)(B * ld_y) * sizeof(float));
    float *g = malloc(n_out * sizeof(float)), *u = malloc(n_out * sizeof(float));
    int8_t *qs = malloc(n_in);
    float *qd = malloc(n_in / 32 * sizeof(float) + 4), *qsum = malloc(n_in / 32 * sizeof(float) + 4);
    DS_ASSERT(x && xd && got && g && u && qs && qd && qsum);
    for (int64_t i = 0; i < B * n_in; i++) x[i] = gpu_rng_normal(&rng);
    dev_matrix G = {0}, U = {0};
    float *d_x = NULL, *d_y = NULL;
    void *d_xq = NULL;
    bool ok = true;
    if (matrix_make(&G, type, n_in, n_out, 31 + n_out, &st) ||
        matrix_plan(&G, GEMV_KERNEL_AUTO, 0, &st) ||
        matrix_make(&U, type, n_in, n_out, 32 + n_out, &st) ||
        matrix_plan(&U, GEMV_KERNEL_AUTO, 0, &st) ||
        cuda_alloc((void **)&d_x, (size_t)(B * n_in) * sizeof(float), "x", &st) ||
        cuda_alloc(&d_xq, (size_t)(B * xs), "xq", &st) ||
        cuda_alloc((void **)&d_y, (size_t)(B * ld_y) * sizeof(float), "y", &st) ||
        cuda_upload(d_x, x, (size_t)(B * n_in) * sizeof(float), &st) ||
        cuda_memset(d_y, 0xff, (size_t)(B * ld_y) * sizeof(float), &st))
        goto fail;
    if (q) gemv_quantize_rows(d_x, n_in, d_xq, n_in, B, NULL);
    gemv_cols_swiglu(&G.m, &U.m, d_x, n_in, d_xq, d_y, ld_y, B, NULL);
    if (cuda_sync(NULL, "gemv_cols_swiglu", &st) ||
        cuda_download(got, d_y, (size_t)(B * ld_y) * sizeof(float), &st))
        goto fail;
    if (perturb) got[n_out / 2] += 1.0f + fabsf(got[n_out / 2]);
    const uint64_t rb = quant_row_bytes(type, n_in);
    for (int i = 0; i < B; i++) {
        if (q)
            gpu_twin_q8_quantize(x + i * n_in, n_in, qs, qd, qsum, xd);
        else
            memcpy(xd, x + i * n_in, n_in * sizeof(float));
        quant_matvec(type, G.host, rb, n_in, xd, g, 0, n_out);
        quant_matvec(type, U.host, rb, n_in, xd, u, 0, n_out);
        const double A = sum_scale(type, G.host, n_in, n_out, xd);
        const double up_scale = 1.0 + rms(u, n_out);
        for (int64_t r = 0; r < n_out; r++) g[r] = g[r] / (1.0f + expf(-g[r])) * u[r];
        char name[128];
        snprintf(name, sizeof name, "gemv_cols_swiglu %s %lldx%lld B=%d row %d%s", tr->name,
                 (long long)n_out, (long long)n_in, B, i, perturb ? " (perturbed)" : "");
        ok &= gpu_parity_check(name, got + i * ld_y, g, n_out,
                               2e-6 * sqrt((double)n_in) * A * up_scale, 1e-4,
                               n_out >= 16 ? 1e-8 : 1.0, !perturb, NULL);
    }
    if (!perturb)
        printf("  gemv_cols_swiglu %s %lldx%lld B=%d: %s\n", tr->name, (long long)n_out,
               (long long)n_in, B, ok ? "ok" : "FAILED");
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    matrix_free(&G);
    matrix_free(&U);
    cuda_free(d_x), cuda_free(d_xq), cuda_free(d_y);
    free(x), free(xd), free(got), free(g), free(u), free(qs), free(qd), free(qsum);
    return ok && st.code == STATUS_OK;
}

/* the plan's rows a warp (cols_rows 0) */
static bool cols_case(uint32_t type, int64_t n_in, int64_t n_out, int B, bool add, bool perturb)
{
    return cols_case_r(type, n_in, n_out, B, add, perturb, 0);
}

static void test_cols(void)
{
    if (!g_have_gpu) return;
    static const int64_t shapes[][2] = {{1, 1}, {33, 3}, {1000, 20}, {2, 68}, {4099, 10}};
    static const int Bs[] = {1, 2, 3, 4};
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++) {
        const int64_t unit = (k_types[t] == GGML_TYPE_Q4_K || k_types[t] == GGML_TYPE_Q5_K ||
                              k_types[t] == GGML_TYPE_Q6_K) ? 256 : 32;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t b = 0; gemv_cols_supported(k_types[t], shapes[s][1] * unit) &&
                               b < sizeof Bs / sizeof Bs[0];
                 b++)
                CU_ASSERT_TRUE(cols_case(k_types[t], shapes[s][1] * unit, shapes[s][0], Bs[b],
                                         (s + b) % 2 == 1, false));
    }
    /* the reference models' 128-wide float rows; the 27B's shapes (ffn up, down: flat-planned
     * Q6_K, the in-projection), an lm_head's rows */
    CU_ASSERT_TRUE(cols_case(GGML_TYPE_F32, 128, 256, 4, false, false));
    CU_ASSERT_TRUE(cols_case(GGML_TYPE_F16, 136, 7, 3, true, false));
    CU_ASSERT_TRUE(cols_case(GGML_TYPE_Q4_K, 5120, 17408, 4, false, false));
    CU_ASSERT_TRUE(cols_case(GGML_TYPE_Q4_K, 17408, 5120, 4, true, false));
    CU_ASSERT_TRUE(cols_case(GGML_TYPE_Q6_K, 17408, 5120, 4, true, false));
    CU_ASSERT_TRUE(cols_case(GGML_TYPE_Q6_K, 5120, 10240, 2, false, false));
    CU_ASSERT_TRUE(cols_case(GGML_TYPE_Q6_K, 1024, 248320, 4, false, false));
    CU_ASSERT_FALSE(cols_case(GGML_TYPE_Q4_K, 512, 64, 3, false, true));
    CU_ASSERT_FALSE(cols_case(GGML_TYPE_F32, 128, 40, 4, true, true));
    /* every rows-a-warp build forced, odd rows */
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++)
        for (int r = 1; r <= 4; r *= 2)
            for (int B = 2; B <= GEMV_MAX_COLS; B++)
                CU_ASSERT_TRUE(cols_case_r(k_types[t], 512, 203, B, B % 2 == 1, false, r));
    /* what gemv_cols takes */
    CU_ASSERT_TRUE(gemv_cols_supported(GGML_TYPE_F16, 136));
    CU_ASSERT_FALSE(gemv_cols_supported(GGML_TYPE_F16, 132));
    CU_ASSERT_FALSE(gemv_cols_supported(GGML_TYPE_F32, 130));
    CU_ASSERT_FALSE(gemv_cols_supported(GGML_TYPE_Q8_0, 96));
    /* the SwiGLU pair: every type, the 27B's and the 0.8B's FFN shapes, a perturbed one fails */
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++)
        for (int B = 1; B <= GEMV_MAX_COLS; B++)
            CU_ASSERT_TRUE(cols_swiglu_case(k_types[t], 512, 301, B, false));
    CU_ASSERT_TRUE(cols_swiglu_case(GGML_TYPE_Q4_K, 5120, 17408, 4, false));
    CU_ASSERT_TRUE(cols_swiglu_case(GGML_TYPE_Q4_K, 1024, 3584, 2, false));
    CU_ASSERT_FALSE(cols_swiglu_case(GGML_TYPE_Q4_K, 512, 64, 3, true));
}

static void test_perturbed_fails(void)
{
    if (!g_have_gpu) return;
    CU_ASSERT_FALSE(run_case(GGML_TYPE_Q4_K, 512, 64, MODE_STORE, true));
    CU_ASSERT_FALSE(run_case(GGML_TYPE_F16, 256, 9, MODE_ADD, true));
    CU_ASSERT_FALSE(run_case(GGML_TYPE_Q6_K, 512, 64, MODE_STORE, true));
    CU_ASSERT_FALSE(run_case(GGML_TYPE_Q4_K, 1024, 352, MODE_SWIGLU, true));
    CU_ASSERT_FALSE(run_case(GGML_TYPE_Q6_K, 1024, 4099, MODE_ARGMAX, true));
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("gemv parity on the GPU");
    if (g_have_gpu) {
        status st;
        if (cuda_device_props_get(0, &g_props, &st) || gemv_init(&g_props, &st)) {
            printf("%s\n", st.msg);
            return 1;
        }
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("gemv_parity", NULL, NULL);
    CU_add_test(s, "flat_emulated", test_flat_emulated);
    CU_add_test(s, "shapes", test_shapes);
    CU_add_test(s, "float_odd_widths", test_float_odd_widths);
    CU_add_test(s, "epilogues", test_epilogues);
    CU_add_test(s, "perturbed_fails", test_perturbed_fails);
    CU_add_test(s, "pair", test_pair);
    CU_add_test(s, "cols", test_cols);
    CU_add_test(s, "quantize_k", test_quantize_k);
    CU_add_test(s, "mma", test_mma);
    CU_add_test(s, "plan", test_plan);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
