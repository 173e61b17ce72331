/* GPU dequantisation (kernels/cuda/dequant.h) against the CPU twin quant_get(type)->dequant
 * over awkward shapes: one block, odd row counts, a large tensor; per element atol + rtol*|ref|
 * and NMSE. One case perturbs the GPU output on purpose and asserts the check then fails.
 * Without a GPU the GPU cases print that they were skipped; the checker self-test still runs. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/dequant.h"
#include "tests/gpu/gpu_parity.h"

static const uint32_t k_types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16,
                                   GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                   GGML_TYPE_Q6_K};

typedef struct shape {
    int64_t rows, blocks_per_row;
} shape;

/* rows x (blocks_per_row * block size) */
static const shape k_shapes[] = {{1, 1}, {3, 1}, {7, 2}, {17, 3}, {1, 20}, {33, 5}, {4096, 20}};

static bool g_have_gpu;

/* Dequantises one random tensor on both sides; returns true when they agree. perturb: add an
 * error to one GPU element first (the check must then fail). */
static bool run_case(uint32_t type, shape sh, bool perturb, bool quiet)
{
    const quant_traits *tr = quant_get(type);
    DS_ASSERT(tr && tr->supported);
    const int64_t n_in = sh.blocks_per_row * tr->block_size, n = sh.rows * n_in;
    const uint64_t bytes = quant_row_bytes(type, (uint64_t)n);
    status st;
    status_clear(&st);
    void *src = malloc(bytes);
    float *ref = malloc((size_t)n * sizeof(float)), *got = malloc((size_t)n * sizeof(float));
    DS_ASSERT(src && ref && got);
    gpu_rng rng;
    gpu_rng_seed(&rng, 1000 * type + (uint64_t)n);
    gpu_random_tensor(type, n, 1.0f, &rng, src);
    const uint64_t row_bytes = quant_row_bytes(type, (uint64_t)n_in);
    for (int64_t r = 0; r < sh.rows; r++)
        tr->dequant((const uint8_t *)src + r * row_bytes, ref + r * n_in, n_in);

    void *d_src = NULL;
    float *d_dst = NULL;
    bool ok = false;
    if (cuda_alloc(&d_src, bytes, "dequant src", &st) ||
        cuda_alloc((void **)&d_dst, (size_t)n * sizeof(float), "dequant dst", &st) ||
        cuda_upload(d_src, src, bytes, &st) ||
        cuda_memset(d_dst, 0xff, (size_t)n * sizeof(float), &st)) /* poison: NaN */
        goto fail;
    dequant_f32(type, d_src, d_dst, n, NULL);
    if (cuda_sync(NULL, "dequant_f32", &st) ||
        cuda_download(got, d_dst, (size_t)n * sizeof(float), &st))
        goto fail;
    if (perturb) got[n / 2] += 1e-2f * (1.0f + fabsf(ref[n / 2]));
    char name[96];
    snprintf(name, sizeof name, "dequant %s %lldx%lld%s", tr->name, (long long)sh.rows,
             (long long)n_in, perturb ? " (perturbed)" : "");
    /* Same arithmetic on both sides; only FMA contraction may differ (1-2 ulp). */
    ok = gpu_parity_check(name, got, ref, n, 1e-6, 1e-5, 1e-10, quiet, NULL);
fail:
    if (st.code) printf("  %s\n", st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    cuda_free(d_src);
    cuda_free(d_dst);
    free(src);
    free(ref);
    free(got);
    return ok;
}

static void test_all_types_all_shapes(void)
{
    if (!g_have_gpu) return;
    for (size_t t = 0; t < sizeof k_types / sizeof k_types[0]; t++)
        for (size_t s = 0; s < sizeof k_shapes / sizeof k_shapes[0]; s++)
            CU_ASSERT_TRUE(run_case(k_types[t], k_shapes[s], false, false));
}

static void test_perturbed_output_fails(void)
{
    if (!g_have_gpu) return;
    CU_ASSERT_FALSE(run_case(GGML_TYPE_Q4_K, (shape){3, 2}, true, false));
    CU_ASSERT_FALSE(run_case(GGML_TYPE_Q6_K, (shape){1, 1}, true, false));
}

/* The checker itself, on the CPU: it must accept equal data and reject an error, a NaN and an
 * NMSE above the bound. Runs without a GPU. */
static void test_checker_can_fail(void)
{
    float ref[64], got[64];
    for (int i = 0; i < 64; i++) ref[i] = got[i] = (float)(i - 32) * 0.25f;
    CU_ASSERT_TRUE(gpu_parity_check("checker equal", got, ref, 64, 1e-6, 1e-5, 1e-12, true, NULL));
    got[5] += 0.01f;
    CU_ASSERT_FALSE(gpu_parity_check("checker one error", got, ref, 64, 1e-6, 1e-5, 1, true, NULL));
    got[5] = ref[5];
    got[9] = NAN;
    CU_ASSERT_FALSE(gpu_parity_check("checker NaN", got, ref, 64, 1e-6, 1e-5, 1, true, NULL));
    got[9] = ref[9];
    for (int i = 0; i < 64; i++) got[i] = ref[i] * 1.001f;
    CU_ASSERT_FALSE(gpu_parity_check("checker nmse", got, ref, 64, 1, 1, 1e-8, true, NULL));
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("dequant parity on the GPU");
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("dequant_parity", NULL, NULL);
    CU_add_test(s, "checker_can_fail", test_checker_can_fail);
    CU_add_test(s, "all_types_all_shapes", test_all_types_all_shapes);
    CU_add_test(s, "perturbed_output_fails", test_perturbed_output_fails);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
