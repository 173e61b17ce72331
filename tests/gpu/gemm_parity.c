/* GPU batched GEMM (kernels/cuda/gemm.h) against its CPU twin, quant_matvec (gguf/quant.h) row
 * by row, for every weight type over awkward shapes (one tile row, odd row counts, rows not a
 * multiple of the 128-wide K step, the reference models' 64/128-wide rows, a 4B-sized FFN row)
 * and B = 1, 3, 17, 64, 256, with the store and residual-add epilogues, K split or not (few
 * rows, long rows). For quantised weights the kernel rounds the weights and x to F16 and
 * accumulates in F32, so each element is held to |got - ref| <= 2e-3 · Σ_k |w_k x_k| + 1e-6 (two
 * F16 roundings a product, plus the sum); float weights keep F16 remainders: 2e-5.
 * Batch invariance: every row of every launch is compared bit for bit with the same row run
 * alone (B = 1). A perturbed output must fail the check. The batched step's row helpers too:
 * gemm_swiglu_rows against ref_swiglu, gemm_argmax_rows against a first-maximum scan (ties to
 * the lowest column), gemv_embed_rows against the dequantised rows and the slots' positions.
 * The dense path (gemm.h, quantised types): gemm_dequant_half then cuBLAS (blas.h), every B and
 * both epilogues, against the twin with the GEMM's bound and against the GEMM's own rows within
 * 2e-5 of the bound (the same F16 weights and x: only the order of the F32 sums differs), and the
 * F16 scratch past n_in zero. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cpu/act.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "tests/gpu/gpu_parity.h"

static bool g_have_gpu;
static cuda_device_props g_props;
static blas *g_blas; /* the dense path's cuBLAS (NULL: it could not be loaded: the test fails) */

typedef struct tcase {
    uint32_t type;
    int64_t n_in, n_out;
} tcase;

static const tcase k_cases[] = {
    {GGML_TYPE_Q4_K, 256, 1},     {GGML_TYPE_Q4_K, 1024, 300},  {GGML_TYPE_Q4_K, 2560, 1000},
    {GGML_TYPE_Q5_K, 768, 129},   {GGML_TYPE_Q6_K, 1024, 257},  {GGML_TYPE_Q6_K, 256, 5},
    {GGML_TYPE_Q8_0, 96, 130},    {GGML_TYPE_Q8_0, 1024, 384},  {GGML_TYPE_F16, 64, 200},
    {GGML_TYPE_BF16, 160, 77},    {GGML_TYPE_F32, 64, 128},     {GGML_TYPE_F32, 128, 1500},
    {GGML_TYPE_Q4_K, 9728, 130},  {GGML_TYPE_Q6_K, 4096, 200},  {GGML_TYPE_F32, 2048, 64},
};
static const int k_batches[] = {1, 3, 17, 64, 100, 256};

/* the check of one launch's output against the twin; returns the number of bad elements */
static int64_t check(const float *got, const float *ref, const float *bound, int64_t n, double tol)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]);
        if (!(e <= tol * bound[i] + 1e-6)) {
            if (bad < 3) printf("    [%lld] got %.7g ref %.7g bound %.3g\n", (long long)i, got[i], ref[i], bound[i]);
            bad++;
        }
    }
    return bad;
}

/* The dense path of matrix m at every batch size and both epilogues (header). */
static bool dense_case(const gemv_matrix *m, const uint16_t *d_xh, float *d_y, const float *y0,
                       const float *alone, const float *ref, const float *bound, float *got,
                       double tol, status *st)
{
    if (!g_blas) {
        printf("  dense path: no cuBLAS (%s)\n", blas_describe());
        return false;
    }
    const int64_t n_in = m->n_in, n_out = m->n_out, ld = gemm_dense_ld(m);
    uint16_t *d_w16 = NULL, *w16 = malloc((size_t)(n_out * ld) * 2);
    bool ok = w16 && !cuda_alloc((void **)&d_w16, (size_t)(n_out * ld) * 2, "w16", st);
    if (ok) {
        gemm_dequant_half(m, d_w16, NULL);
        ok = !cuda_sync(NULL, "dequant half", st) &&
             !cuda_download(w16, d_w16, (size_t)(n_out * ld) * 2, st);
    }
    int64_t pad = 0;
    for (int64_t r = 0; ok && r < n_out; r++)
        for (int64_t k = n_in; k < ld; k++) pad += (w16[r * ld + k] & 0x7fff) != 0; /* ±0 */
    if (pad) printf("  dense %s %lldx%lld: %lld nonzero halves past n_in\n",
                    quant_get(m->type)->name, (long long)n_in, (long long)n_out, (long long)pad);
    ok = ok && pad == 0;
    for (size_t ib = 0; ok && ib < sizeof k_batches / sizeof k_batches[0]; ib++) {
        const int B = k_batches[ib];
        for (int add = 0; ok && add < 2; add++) {
            if (cuda_upload(d_y, y0, (size_t)(B * n_out) * 4, st) ||
                blas_gemm_f16(g_blas, n_out, B, n_in, d_w16, ld, d_xh, n_in, d_y, n_out, add,
                              NULL, st) ||
                cuda_sync(NULL, "dense gemm", st) ||
                cuda_download(got, d_y, (size_t)(B * n_out) * 4, st)) {
                ok = false;
                break;
            }
            int64_t near = 0;
            for (int64_t i = 0; i < B * n_out; i++) {
                if (add) got[i] -= y0[i];
                const double e = fabs((double)got[i] - alone[i]);
                if (!(e <= 2e-5 * bound[i] + 1e-6)) near++;
            }
            const int64_t nb = check(got, ref, bound, B * n_out, tol);
            if (nb || near)
                printf("  dense %s %lldx%lld B=%d %s: %lld outside the bound, %lld away from the "
                       "GEMM's\n", quant_get(m->type)->name, (long long)n_in, (long long)n_out,
                       B, add ? "add" : "store", (long long)nb, (long long)near);
            ok = nb == 0 && near == 0;
        }
    }
    cuda_free(d_w16);
    free(w16);
    return ok;
}

/* One weight matrix, every batch size, both epilogues. perturb: corrupt one output first (the
 * check must then fail). Returns true when everything matched. */
static bool run_case(const tcase *tc, bool perturb)
{
    status st;
    status_clear(&st);
    const int64_t n_in = tc->n_in, n_out = tc->n_out, Bmax = 256;
    const bool quant = tc->type != GGML_TYPE_F32 && tc->type != GGML_TYPE_F16 && tc->type != GGML_TYPE_BF16;
    const double tol = quant ? 2e-3 : 2e-5;
    const uint64_t raw = quant_row_bytes(tc->type, (uint64_t)(n_in * n_out));
    const uint64_t packed = gemv_packed_bytes(tc->type, n_in, n_out);
    void *host = malloc(raw);
    float *W = malloc((size_t)(n_in * n_out) * 4), *x = malloc((size_t)(Bmax * n_in) * 4);
    float *y0 = malloc((size_t)(Bmax * n_out) * 4), *ref = malloc((size_t)(Bmax * n_out) * 4);
    float *bound = malloc((size_t)(Bmax * n_out) * 4), *got = malloc((size_t)(Bmax * n_out) * 4);
    float *alone = malloc((size_t)(Bmax * n_out) * 4);
    DS_ASSERT(host && W && x && y0 && ref && bound && got && alone);
    gpu_rng rng;
    gpu_rng_seed(&rng, (uint64_t)(n_in * 131 + n_out + tc->type * 7));
    gpu_random_tensor(tc->type, n_in * n_out, 0.1f, &rng, host);
    quant_get(tc->type)->dequant(host, W, (uint64_t)(n_in * n_out));
    for (int64_t i = 0; i < Bmax * n_in; i++) x[i] = 2.0f * gpu_rng_normal(&rng);
    for (int64_t i = 0; i < Bmax * n_out; i++) y0[i] = gpu_rng_normal(&rng);
    for (int64_t b = 0; b < Bmax; b++) {
        quant_matvec(tc->type, host, quant_row_bytes(tc->type, (uint64_t)n_in), n_in, x + b * n_in,
                     ref + b * n_out, 0, n_out);
        for (int64_t r = 0; r < n_out; r++) {
            double s = 0;
            for (int64_t k = 0; k < n_in; k++) s += fabs((double)W[r * n_in + k] * x[b * n_in + k]);
            bound[b * n_out + r] = (float)s;
        }
    }

    void *d_raw = NULL, *d_w = NULL;
    float *d_x = NULL, *d_y = NULL, *d_work = NULL;
    uint16_t *d_xh = NULL;
    bool ok = false;
    if (cuda_alloc(&d_raw, raw, "raw", &st) || cuda_alloc(&d_w, packed, "packed", &st) ||
        cuda_alloc((void **)&d_x, (size_t)(Bmax * n_in) * 4, "x", &st) ||
        cuda_alloc((void **)&d_y, (size_t)(Bmax * n_out) * 4, "y", &st) ||
        cuda_alloc((void **)&d_xh, (size_t)(Bmax * n_in) * 2, "xh", &st) ||
        cuda_upload(d_raw, host, raw, &st) || cuda_upload(d_x, x, (size_t)(Bmax * n_in) * 4, &st))
        goto done;
    gemv_pack(tc->type, d_raw, d_w, n_in, n_out, NULL);
    gemv_matrix m = {.type = tc->type, .n_in = n_in, .n_out = n_out, .d_w = d_w};
    if (gemv_matrix_plan(&m, &g_props, &st)) goto done; /* the SM count the K split reads */
    const int64_t work = gemm_work_floats(&m, (int)Bmax);
    if (work && cuda_alloc((void **)&d_work, (size_t)work * 4, "work", &st)) goto done;

    /* X's F16 rows for the quantised kernels: row b alone is the same row of all Bmax */
    gemm_x_half(d_x, n_in, n_in, d_xh, (int)Bmax, NULL);
    /* every row alone (B = 1), the invariance reference */
    for (int64_t b = 0; b < Bmax; b++)
        gemm_rows(&m, d_x + b * n_in, n_in, d_xh + b * n_in, d_y + b * n_out, n_out, GEMV_STORE, 1,
                  d_work, NULL);
    if (cuda_sync(NULL, "gemm alone", &st) || cuda_download(alone, d_y, (size_t)(Bmax * n_out) * 4, &st))
        goto done;
    int64_t bad = check(alone, ref, bound, Bmax * n_out, tol);
    ok = bad == 0;
    for (size_t ib = 0; ib < sizeof k_batches / sizeof k_batches[0]; ib++) {
        const int B = k_batches[ib];
        for (int add = 0; add < 2; add++) {
            if (cuda_upload(d_y, y0, (size_t)(B * n_out) * 4, &st)) goto done;
            gemm_rows(&m, d_x, n_in, d_xh, d_y, n_out, add ? GEMV_ADD : GEMV_STORE, B, d_work, NULL);
            if (cuda_sync(NULL, "gemm", &st) || cuda_download(got, d_y, (size_t)(B * n_out) * 4, &st))
                goto done;
            if (perturb) got[(B * n_out) / 2] += 0.05f * (1.0f + fabsf(got[(B * n_out) / 2]));
            int64_t nb = 0, nvar = 0;
            for (int64_t i = 0; i < B * n_out; i++) {
                const float want = add ? y0[i] + alone[i] : alone[i]; /* the GPU's add, bit for bit */
                if (memcmp(&got[i], &want, 4)) nvar++;
                if (add) got[i] -= y0[i]; /* the product part, for the twin */
            }
            nb = check(got, ref, bound, B * n_out, tol);
            if (nb || nvar)
                printf("  %s %lldx%lld B=%d %s: %lld outside the bound, %lld differ from B=1\n",
                       quant_get(tc->type)->name, (long long)n_in, (long long)n_out, B,
                       add ? "add" : "store", (long long)nb, (long long)nvar);
            ok = ok && nb == 0 && nvar == 0;
        }
    }
    if (quant && !perturb && !dense_case(&m, d_xh, d_y, y0, alone, ref, bound, got, tol, &st))
        ok = false;
done:
    if (st.code) {
        printf("  device: %s\n", st.msg);
        ok = false;
    }
    cuda_free(d_raw);
    cuda_free(d_w);
    cuda_free(d_x);
    cuda_free(d_xh);
    cuda_free(d_y);
    cuda_free(d_work);
    free(host), free(W), free(x), free(y0), free(ref), free(bound), free(got), free(alone);
    return ok;
}

static void test_types(void)
{
    if (!g_have_gpu) return;
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        const bool ok = run_case(&k_cases[i], false);
        if (!ok)
            printf("  FAILED: %s %lldx%lld\n", quant_get(k_cases[i].type)->name,
                   (long long)k_cases[i].n_in, (long long)k_cases[i].n_out);
        CU_ASSERT(ok);
    }
}

static void test_perturbed_fails(void)
{
    if (!g_have_gpu) return;
    CU_ASSERT_FALSE(run_case(&k_cases[1], true));
}

/* the row helpers of the batched step over B = 17 rows with strides past the row */
static void test_row_helpers(void)
{
    if (!g_have_gpu) return;
    status st;
    status_clear(&st);
    enum { B = 17, F = 1000, LD = 2 * F + 8, V = 3001, LDV = V + 3, H = 256, NE = 50, STRIDE = 6 };
    gpu_rng rng;
    gpu_rng_seed(&rng, 77);
    float *gu = malloc(sizeof(float) * B * LD), *out = malloc(sizeof(float) * B * F),
          *ref = malloc(sizeof(float) * F), *lg = malloc(sizeof(float) * B * LDV),
          *emb = malloc(sizeof(float) * NE * H), *x = malloc(sizeof(float) * B * H);
    void *eh = malloc(quant_row_bytes(GGML_TYPE_Q6_K, (uint64_t)NE * H));
    DS_ASSERT(gu && out && ref && lg && emb && x && eh);
    for (int i = 0; i < B * LD; i++) gu[i] = 3.0f * gpu_rng_normal(&rng);
    for (int i = 0; i < B * LDV; i++) lg[i] = gpu_rng_normal(&rng);
    int want[B];
    for (int i = 0; i < B; i++) { /* the row's maximum twice: the lower column must win */
        const int a = (int)(gpu_rng_u64(&rng) % V), b = (int)(gpu_rng_u64(&rng) % V);
        lg[i * LDV + a] = lg[i * LDV + b] = 10.0f + i;
        want[i] = a < b ? a : b;
    }
    gpu_random_tensor(GGML_TYPE_Q6_K, (int64_t)NE * H, 0.1f, &rng, eh);
    quant_get(GGML_TYPE_Q6_K)->dequant(eh, emb, (int64_t)NE * H);
    int32_t rows[3 * B], pos[B * STRIDE];
    for (int i = 0; i < B; i++) {
        rows[i] = (int32_t)((i * 13) % NE);  /* tokens */
        rows[B + i] = B - 1 - i;             /* slots */
        rows[2 * B + i] = 5 * i;             /* positions */
    }
    float *d_gu = NULL, *d_out = NULL, *d_lg = NULL, *d_x = NULL;
    void *d_raw = NULL, *d_emb = NULL;
    int32_t *d_rows = NULL, *d_pos = NULL;
    unsigned long long *d_best = NULL, best[B];
    const uint64_t eraw = quant_row_bytes(GGML_TYPE_Q6_K, (uint64_t)NE * H);
    if (cuda_alloc((void **)&d_gu, sizeof(float) * B * LD, "gu", &st) ||
        cuda_alloc((void **)&d_out, sizeof(float) * B * F, "out", &st) ||
        cuda_alloc((void **)&d_lg, sizeof(float) * B * LDV, "logits", &st) ||
        cuda_alloc((void **)&d_x, sizeof(float) * B * H, "x", &st) ||
        cuda_alloc(&d_raw, eraw, "emb raw", &st) ||
        cuda_alloc(&d_emb, gemv_packed_bytes(GGML_TYPE_Q6_K, H, NE), "emb", &st) ||
        cuda_alloc((void **)&d_rows, sizeof rows, "rows", &st) ||
        cuda_alloc((void **)&d_pos, sizeof pos, "pos", &st) ||
        cuda_alloc((void **)&d_best, sizeof best, "best", &st) ||
        cuda_upload(d_gu, gu, sizeof(float) * B * LD, &st) ||
        cuda_upload(d_lg, lg, sizeof(float) * B * LDV, &st) || cuda_upload(d_raw, eh, eraw, &st) ||
        cuda_upload(d_rows, rows, sizeof rows, &st) || cuda_memset(d_pos, 0, sizeof pos, &st))
        goto done;
    gemv_pack(GGML_TYPE_Q6_K, d_raw, d_emb, H, NE, NULL);
    const gemv_matrix em = {.type = GGML_TYPE_Q6_K, .n_in = H, .n_out = NE, .d_w = d_emb};
    gemm_swiglu_rows(d_gu, LD, F, d_out, F, B, NULL);
    gemm_argmax_rows(d_lg, LDV, V, d_best, B, NULL);
    gemv_embed_rows(&em, d_rows, d_rows + B, d_rows + 2 * B, d_pos, STRIDE, d_x, H, B, NULL);
    if (cuda_sync(NULL, "row helpers", &st) || cuda_download(out, d_out, sizeof(float) * B * F, &st) ||
        cuda_download(best, d_best, sizeof best, &st) || cuda_download(x, d_x, sizeof(float) * B * H, &st) ||
        cuda_download(pos, d_pos, sizeof pos, &st))
        goto done;
    int bad_sw = 0, bad_am = 0, bad_em = 0, bad_pos = 0;
    for (int i = 0; i < B; i++) {
        ref_swiglu(gu + i * LD, gu + i * LD + F, F, ref);
        for (int r = 0; r < F; r++)
            bad_sw += !(fabsf(out[i * F + r] - ref[r]) <= 1e-5f * (1.0f + fabsf(ref[r])));
        bad_am += gemv_argmax_row(best[i]) != want[i];
        for (int e = 0; e < H; e++) {
            const float r = emb[rows[i] * H + e];
            bad_em += !(fabsf(x[i * H + e] - r) <= 1e-6f * (1.0f + fabsf(r)));
        }
        const int32_t *p = pos + rows[B + i] * STRIDE;
        bad_pos += p[0] != rows[2 * B + i] || p[1] != rows[2 * B + i] + 1 || p[2] != 0;
    }
    printf("  row helpers, B = %d: swiglu %d bad, argmax %d bad, embedding %d bad, positions %d bad\n",
           B, bad_sw, bad_am, bad_em, bad_pos);
    CU_ASSERT(bad_sw == 0 && bad_am == 0 && bad_em == 0 && bad_pos == 0);
done:
    if (st.code) printf("  device: %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    cuda_free(d_gu), cuda_free(d_out), cuda_free(d_lg), cuda_free(d_x), cuda_free(d_raw);
    cuda_free(d_emb), cuda_free(d_rows), cuda_free(d_pos), cuda_free(d_best);
    free(gu), free(out), free(ref), free(lg), free(emb), free(x), free(eh);
}

static void test_supported(void)
{
    CU_ASSERT(gemm_supported(GGML_TYPE_Q4_K, 2560));
    CU_ASSERT_FALSE(gemm_supported(GGML_TYPE_Q4_K, 96));
    CU_ASSERT(gemm_supported(GGML_TYPE_Q8_0, 96));
    CU_ASSERT_FALSE(gemm_supported(GGML_TYPE_Q8_0, 100));
    CU_ASSERT_FALSE(gemm_supported(GGML_TYPE_Q4_0, 256));
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("gemm_parity");
    if (g_have_gpu) {
        status st;
        if (cuda_device_props_get(0, &g_props, &st) || gemv_init(&g_props, &st) || gemm_init(&st)) {
            printf("gemm_init: %s\n", st.msg);
            return 1;
        }
        if (blas_open(NULL, 0, &g_blas, &st)) printf("dense path: %s\n", st.msg);
    }
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("gemm_parity", NULL, NULL);
    CU_add_test(s, "supported", test_supported);
    CU_add_test(s, "every type, B = 1..256, store and add, bit-identical rows", test_types);
    CU_add_test(s, "a perturbed output fails", test_perturbed_fails);
    CU_add_test(s, "SwiGLU, argmax and embedding over rows", test_row_helpers);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned fails = CU_get_number_of_failures();
    CU_cleanup_registry();
    blas_close(g_blas);
    return fails ? 1 : 0;
}
