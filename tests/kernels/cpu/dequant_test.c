/* kernels/cpu/dequant (AVX2) is bit-identical to gguf/quant's scalar dequant on every type,
 * on quantised data and on random block bytes (with finite scales), over several blocks. */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "kernel_check.h"
#include "kernels/cpu/dequant.h"
#include "tests/testutil/testutil.h"

static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                 GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};

/* A finite half in [-2, 2] with random bits in the mantissa (subnormals included). */
static uint16_t rand_half(kc_rng *r)
{
    uint16_t h = (uint16_t)(kc_uniform(r) * 65536);
    return (uint16_t)(h & 0xBFFF); /* exponent < 0x10: |h| < 2, never inf/nan */
}

/* Overwrites the f16 scale fields of each block with finite random halves. */
static void fix_scales(uint32_t type, uint8_t *row, int64_t n, kc_rng *r)
{
    const quant_traits *qt = quant_get(type);
    int64_t nb = n / qt->block_size;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = row + b * qt->type_size;
        uint16_t h1 = rand_half(r), h2 = rand_half(r);
        switch (type) {
        case GGML_TYPE_Q8_0: memcpy(blk, &h1, 2); break;
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K: memcpy(blk, &h1, 2), memcpy(blk + 2, &h2, 2); break;
        case GGML_TYPE_Q6_K: memcpy(blk + 208, &h1, 2); break;
        case GGML_TYPE_F16:
            for (int64_t i = 0; i < n; i++) {
                uint16_t h = rand_half(r);
                memcpy(row + 2 * i, &h, 2);
            }
            return;
        default: return; /* F32 / BF16: any bits are fine for a bitwise copy test */
        }
    }
}

static int same(uint32_t type, const uint8_t *row, int64_t n)
{
    float *a = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n);
    quant_get(type)->dequant(row, a, n);
    ref_dequant_row(type, row, b, n);
    int ok = memcmp(a, b, sizeof(float) * n) == 0;
    if (!ok)
        for (int64_t i = 0; i < n; i++)
            if (memcmp(&a[i], &b[i], 4)) {
                fprintf(stderr, "  %s[%lld]: scalar %.9g avx2 %.9g\n", quant_get(type)->name, (long long)i, a[i], b[i]);
                break;
            }
    free(a), free(b);
    return ok;
}

static void test_bit_identical(void)
{
    kc_rng r = {31};
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        uint32_t type = types[t];
        int64_t n = 4 * 256;
        uint64_t rb = quant_row_bytes(type, n);
        uint8_t *row = malloc(rb);
        float *src = malloc(sizeof(float) * n);
        for (int rep = 0; rep < 20; rep++) {
            kc_fill(&r, src, n, (float)(0.01 + 10 * kc_uniform(&r)));
            quant_get(type)->quantize(src, row, n);
            CU_ASSERT(same(type, row, n));
            for (uint64_t i = 0; i < rb; i++) row[i] = (uint8_t)(kc_uniform(&r) * 256);
            fix_scales(type, row, n, &r);
            if (type != GGML_TYPE_F32 && type != GGML_TYPE_BF16) CU_ASSERT(same(type, row, n));
        }
        free(row), free(src);
    }
}

static void test_check_can_fail(void)
{
    /* the comparison itself: a scalar dequant against a perturbed copy differs */
    float src[256], a[256], b[256];
    kc_rng r = {5};
    kc_fill(&r, src, 256, 1);
    uint8_t row[210];
    quant_get(GGML_TYPE_Q6_K)->quantize(src, row, 256);
    quant_get(GGML_TYPE_Q6_K)->dequant(row, a, 256);
    ref_dequant_row(GGML_TYPE_Q6_K, row, b, 256);
    b[77] = b[77] * 1.0000001f + 1e-7f;
    CU_ASSERT(memcmp(a, b, sizeof a) != 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("dequant", NULL, NULL);
    CU_add_test(s, "bit_identical", test_bit_identical);
    CU_add_test(s, "check_can_fail", test_check_can_fail);
    return testutil_cunit_run();
}
