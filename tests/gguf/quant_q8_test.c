/* Unit tests for the integer path of gguf/quant (quant_q8.c, quant_q8_avx2.c):
 *  - activation quantisers: AVX2 == scalar byte for byte (random, extreme, ties, zero,
 *    non-finite blocks); the scalar one's semantics (max element -> -127, |x - d q| <= d/2,
 *    bsums);
 *  - integer dots: dot_q8 (AVX2) == dot_q8_ref bit for bit, on random blocks with random
 *    scales, extreme scales included; dot_q8_cols (1..4 columns) == dot_q8 per column;
 *  - against the real-number dot of the dequantised weights and the dequantised activation,
 *    computed exactly in double: |err| <= (n_blocks + 6) * 2^-23 * M, M the sum of the
 *    absolute per-element terms (float rounding of the block scale products, the lane
 *    accumulation over n_blocks and the final horizontal sums; see quant.h);
 *  - against the float dot of the dequantised weights with the original x: within the
 *    Q8 activation error, sum_i |w_i| * |d_block(i)| / 2 (plus the above);
 *  - each check is shown to fail on a perturbed input (must-fail cases);
 *  - quant_matvec_q8 over a row range. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "tests/testutil/testutil.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static const uint32_t q_types[] = {GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
#define N_QTYPES 4

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Random valid blocks: random bytes, block scale halves finite with magnitude 2^lo..2^hi
 * (d of Q8_0/Q6_K either sign; Q4_K/Q5_K d, dmin >= 0 as the quantiser writes them). */
static void fill_blocks(uint32_t type, void *dst, int64_t n, uint64_t *s, int lo, int hi) {
    const quant_traits *t = quant_get(type);
    uint8_t *p = dst;
    uint64_t bytes = quant_row_bytes(type, (uint64_t)n);
    for (uint64_t i = 0; i < bytes; i++) p[i] = (uint8_t)testutil_rng_next(s);
    for (int64_t b = 0; b < n / t->block_size; b++) {
        uint8_t *blk = p + b * t->type_size;
        float mag = ldexpf(1.0f + 0.5f * testutil_rng_uniform(s),
                           lo + (int)(testutil_rng_next(s) % (uint64_t)(hi - lo + 1)));
        ggml_half h = quant_f32_to_f16(mag);
        ggml_half hneg = quant_f32_to_f16(testutil_rng_next(s) & 1 ? -mag : mag);
        ggml_half hm = quant_f32_to_f16(mag * (0.5f + 0.5f * testutil_rng_uniform(s)));
        switch (type) {
        case GGML_TYPE_Q8_0: memcpy(blk, &hneg, 2); break;
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
            memcpy(blk, &h, 2);
            memcpy(blk + 2, &hm, 2);
            break;
        case GGML_TYPE_Q6_K: memcpy(blk + offsetof(block_q6_K, d), &hneg, 2); break;
        default: CU_FAIL("fill_blocks: type");
        }
    }
}

/* Activation of n floats: gaussian times 2^scale_exp, with outliers (x16) every 61st element
 * and, when extreme, blocks of wildly different magnitude. */
static void fill_act(float *x, int64_t n, uint64_t *s, int scale_exp, int extreme) {
    for (int64_t i = 0; i < n; i++) {
        float v = ldexpf(testutil_rng_gauss(s), scale_exp);
        if (i % 61 == 7) v *= 16;
        if (extreme) v = ldexpf(v, ((int)(i / 256) % 5) * 9 - 18); /* 2^-18 .. 2^18 per block */
        x[i] = v;
    }
}

/* Dequantised activation element i of xq (vec_dot_type vdt) as an exact double. */
static double act_value(uint32_t vdt, const void *xq, int64_t i) {
    if (vdt == GGML_TYPE_Q8_K) {
        const block_q8_K *b = (const block_q8_K *)xq + i / QK_K;
        return (double)b->d * b->qs[i % QK_K];
    }
    const block_q8_0 *b = (const block_q8_0 *)xq + i / QK8_0;
    return (double)quant_f16_to_f32(b->d) * b->qs[i % QK8_0];
}

static double act_scale(uint32_t vdt, const void *xq, int64_t i) {
    if (vdt == GGML_TYPE_Q8_K) return fabs((double)((const block_q8_K *)xq)[i / QK_K].d);
    return fabs((double)quant_f16_to_f32(((const block_q8_0 *)xq)[i / QK8_0].d));
}

/* Element i of a weight row as the exact real a*q - b: Q4_K/Q5_K a = d*sc, b = dmin*m; Q6_K
 * a = d*sc with the level 0..63, b = 32*d*sc (the kernels apply the offset separately, from
 * the bsums); Q8_0 b = 0. Exact in double: at most 11+8+6 significant bits. */
static void weight_terms(uint32_t type, const uint8_t *row, int64_t i, double *a_q, double *b) {
    const quant_traits *t = quant_get(type);
    const uint8_t *blk = row + (i / t->block_size) * t->type_size;
    int e = (int)(i % t->block_size);
    *b = 0;
    if (type == GGML_TYPE_Q8_0) {
        const block_q8_0 *q = (const block_q8_0 *)blk;
        *a_q = (double)quant_f16_to_f32(q->d) * q->qs[e];
    } else if (type == GGML_TYPE_Q6_K) {
        const block_q6_K *q = (const block_q6_K *)blk;
        int h = e / 128, qq = (e % 128) / 32, l = e % 32;
        uint8_t lb = q->ql[64 * h + l + (qq & 1) * 32];
        int lv = ((qq >> 1) ? lb >> 4 : lb & 0xF) | (((q->qh[32 * h + l] >> (2 * qq)) & 3) << 4);
        *a_q = (double)quant_f16_to_f32(q->d) * q->scales[e / 16] * lv;
        *b = 32.0 * quant_f16_to_f32(q->d) * q->scales[e / 16];
    } else {
        const int q5 = type == GGML_TYPE_Q5_K;
        ggml_half hd, hdm;
        memcpy(&hd, blk, 2);
        memcpy(&hdm, blk + 2, 2);
        const uint8_t *sc = blk + 4, *qh = blk + 16, *qs = blk + 16 + (q5 ? 32 : 0);
        int j = e / 32;
        int scj = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        int mj = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        uint8_t byte = qs[32 * (e / 64) + e % 32];
        int lv = (e % 64) < 32 ? byte & 0xF : byte >> 4;
        if (q5) lv |= ((qh[e % 32] >> j) & 1) << 4;
        *a_q = (double)quant_f16_to_f32(hd) * scj * lv;
        *b = (double)quant_f16_to_f32(hdm) * mj;
    }
}

/* The exact dot of dequantised weights and dequantised activation, and M = sum of |terms|. */
static double exact_dot(uint32_t type, const uint8_t *row, const void *xq, int64_t n, double *mag) {
    const uint32_t vdt = quant_get(type)->vec_dot_type;
    long double sum = 0;
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double aq, b;
        weight_terms(type, row, i, &aq, &b);
        double xv = act_value(vdt, xq, i);
        sum += (long double)aq * xv - (long double)b * xv;
        m += fabs(aq * xv) + fabs(b * xv);
    }
    *mag = m;
    return (double)sum;
}

static int same_float(float a, float b) { return f32_bits(a) == f32_bits(b); }

/* ---- structs and traits ----------------------------------------------------------------- */

static void test_struct_and_traits(void) {
    CU_ASSERT_EQUAL(sizeof(block_q8_K), 292);
    CU_ASSERT_EQUAL(offsetof(block_q8_K, qs), 4);
    CU_ASSERT_EQUAL(offsetof(block_q8_K, bsums), 260);
    static const uint32_t plain[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16};
    for (int k = 0; k < 3; k++) {
        const quant_traits *t = quant_get(plain[k]);
        CU_ASSERT(t->vec_dot_type == GGML_TYPE_F32 && !t->dot_q8 && !t->dot_q8_ref);
        CU_ASSERT_EQUAL(quant_act_bytes(plain[k], 1024), 0);
    }
    CU_ASSERT_EQUAL(quant_get(GGML_TYPE_Q8_0)->vec_dot_type, GGML_TYPE_Q8_0);
    CU_ASSERT_EQUAL(quant_get(GGML_TYPE_Q4_K)->vec_dot_type, GGML_TYPE_Q8_K);
    CU_ASSERT_EQUAL(quant_get(GGML_TYPE_Q5_K)->vec_dot_type, GGML_TYPE_Q8_K);
    CU_ASSERT_EQUAL(quant_get(GGML_TYPE_Q6_K)->vec_dot_type, GGML_TYPE_Q8_K);
    CU_ASSERT_FALSE(quant_get(GGML_TYPE_Q8_K)->supported); /* activation format, not weights */
    for (int k = 0; k < N_QTYPES; k++) {
        const quant_traits *t = quant_get(q_types[k]);
        CU_ASSERT(t->dot_q8 && t->dot_q8_ref);
        CU_ASSERT_EQUAL(quant_cpu_has_avx2(), t->dot_q8 != t->dot_q8_ref);
        CU_ASSERT_PTR_EQUAL(quant_get_ref(q_types[k])->dot_q8, t->dot_q8_ref);
    }
    CU_ASSERT_EQUAL(quant_act_bytes(GGML_TYPE_Q4_K, 1024), 4 * 292);
    CU_ASSERT_EQUAL(quant_act_bytes(GGML_TYPE_Q8_0, 1024), 32 * 34);
    CU_ASSERT_EQUAL(quant_act_bytes(GGML_TYPE_Q6_K, 1000), 0);
    CU_ASSERT_EQUAL(quant_act_bytes(GGML_TYPE_Q8_0, 48), 0);
}

/* ---- activation quantisers -------------------------------------------------------------- */

/* Fills x[0..n) with case c of the quantiser corpus. */
static void quant_case(int c, float *x, int64_t n, uint64_t *s) {
    switch (c % 8) {
    case 0: fill_act(x, n, s, 0, 0); break;
    case 1: fill_act(x, n, s, -20, 1); break;
    case 2: fill_act(x, n, s, 20, 1); break;
    case 3: /* zeros with a few values, ties of +amax and -amax in either order */
        memset(x, 0, (size_t)n * sizeof(float));
        for (int64_t i = 5; i < n; i += 37) x[i] = (i / 37) % 2 ? 3.0f : -3.0f;
        for (int64_t i = 3; i < n; i += 41) x[i] = 1.5f;
        break;
    case 4: /* halves: values exactly on rounding ties */
        for (int64_t i = 0; i < n; i++)
            x[i] = (float)((int)(testutil_rng_next(s) % 255) - 127) * 0.5f;
        for (int64_t i = 0; i < n; i += 32) x[i] = 127.0f;
        break;
    case 5: /* subnormals and huge values in separate blocks */
        for (int64_t i = 0; i < n; i++)
            x[i] = (i / 256) % 2 ? testutil_rng_uniform(s) * 1e-40f : testutil_rng_uniform(s) * 1e37f;
        break;
    case 6: /* non-finite in some blocks */
        fill_act(x, n, s, 0, 0);
        if (n > 300) x[300] = NAN;
        if (n > 600) x[600] = INFINITY;
        if (n > 40) x[40] = -INFINITY;
        break;
    default: memset(x, 0, (size_t)n * sizeof(float)); break;
    }
}

static void test_quantize_avx2_equals_ref(void) {
    if (!quant_cpu_has_avx2()) printf("\n  (no AVX2 on this CPU: both are the reference)\n");
    uint64_t s = 11;
    const int64_t n = 2048;
    float *x = malloc(n * sizeof(float));
    block_q8_K *a = malloc(n / QK_K * sizeof *a), *b = malloc(n / QK_K * sizeof *b);
    block_q8_0 *c = malloc(n / QK8_0 * sizeof *c), *d = malloc(n / QK8_0 * sizeof *d);
    int bad_k = 0, bad_0 = 0;
    for (int k = 0; k < 64; k++) {
        quant_case(k, x, n, &s);
        memset(a, 0x55, n / QK_K * sizeof *a), memset(b, 0xAA, n / QK_K * sizeof *b);
        memset(c, 0x55, n / QK8_0 * sizeof *c), memset(d, 0xAA, n / QK8_0 * sizeof *d);
        quant_quantize_row_q8_K(x, a, n);
        quant_quantize_row_q8_K_ref(x, b, n);
        quant_quantize_row_q8_0(x, c, n);
        quant_quantize_row_q8_0_ref(x, d, n);
        bad_k += memcmp(a, b, n / QK_K * sizeof *a) != 0;
        bad_0 += memcmp(c, d, n / QK8_0 * sizeof *c) != 0;
    }
    CU_ASSERT_EQUAL(bad_k, 0);
    CU_ASSERT_EQUAL(bad_0, 0);
    free(x), free(a), free(b), free(c), free(d);
}

static void test_quantize_semantics(void) {
    uint64_t s = 12;
    const int64_t n = 1024;
    float *x = malloc(n * sizeof(float));
    block_q8_K *q = malloc(n / QK_K * sizeof *q);
    block_q8_0 *q0 = malloc(n / QK8_0 * sizeof *q0);
    int bad = 0;
    for (int k = 0; k < 6; k++) {
        quant_case(k, x, n, &s);
        quant_quantize_row_q8_K_ref(x, q, n);
        quant_quantize_row_q8_0_ref(x, q0, n);
        for (int64_t b = 0; b < n / QK_K; b++) {
            float amax = 0;
            int first = -1;
            for (int j = 0; j < QK_K; j++)
                if (fabsf(x[b * QK_K + j]) > amax) amax = fabsf(x[b * QK_K + j]), first = j;
            if (amax < 3.8e-37f) { /* zero, or -127/max overflows: a zero block */
                bad += q[b].d != 0 || q[b].qs[first < 0 ? 0 : first] != 0;
                continue;
            }
            bad += q[b].qs[first] != -127; /* the largest |x| maps to -127 */
            for (int j = 0; j < QK_K; j++) {
                int v = q[b].qs[j];
                bad += v < -127 || v > 127;
                /* |x - d q| <= |d| / 2, up to float rounding of iscale*x and of 1/iscale */
                double err = fabs((double)x[b * QK_K + j] - (double)q[b].d * v);
                bad += !(err <= fabs((double)q[b].d) * (0.5 + 1e-5) + 1e-45);
            }
            for (int g = 0; g < 16; g++) {
                int sum = 0;
                for (int l = 0; l < 16; l++) sum += q[b].qs[16 * g + l];
                bad += q[b].bsums[g] != sum;
            }
        }
        for (int64_t b = 0; b < n / QK8_0; b++) {
            double d = quant_f16_to_f32(q0[b].d);
            if (!isfinite(d)) continue; /* amax/127 beyond the f16 range (case 5): d = inf */
            double amax = 0;
            for (int j = 0; j < QK8_0; j++) amax = fmax(amax, fabs((double)x[b * QK8_0 + j]));
            /* levels round x*127/amax; the stored f16 d is amax/127 to 2^-11 relative, or to
             * 2^-25 absolute below the f16 normal range (then d may underflow to 0) */
            const double dr = amax / 127, dd = fmax(dr * ldexp(1, -11), ldexp(1, -25));
            for (int j = 0; j < QK8_0; j++) {
                double xv = x[b * QK8_0 + j];
                bad += q0[b].qs[j] < -127;
                bad += !(fabs(xv - d * q0[b].qs[j]) <= dr * 0.5 * (1 + 1e-5) + dd * 127 + 1e-45);
            }
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    /* non-finite blocks: NaN scale, zero levels; finite blocks untouched by them */
    quant_case(6, x, n, &s);
    quant_quantize_row_q8_K(x, q, n);
    quant_quantize_row_q8_0(x, q0, n);
    CU_ASSERT(isnan(q[0].d) && isnan(q[1].d) && isnan(q[2].d) && isfinite(q[3].d));
    CU_ASSERT(q[1].qs[0] == 0 && q[1].bsums[3] == 0);
    CU_ASSERT(isnan(quant_f16_to_f32(q0[1].d)) && isfinite(quant_f16_to_f32(q0[0].d)));
    /* all zero */
    memset(x, 0, n * sizeof(float));
    quant_quantize_row_q8_K(x, q, n);
    CU_ASSERT(q[0].d == 0 && q[0].qs[17] == 0 && q[0].bsums[5] == 0);
    free(x), free(q), free(q0);
}

/* quant_quantize_act writes exactly quant_act_bytes bytes and the right format. */
static void test_quantize_act_bounds(void) {
    uint64_t s = 13;
    const int64_t n = 768;
    float x[768];
    fill_act(x, n, &s, 0, 0);
    for (int k = 0; k < N_QTYPES; k++) {
        uint64_t bytes = quant_act_bytes(q_types[k], n);
        uint8_t *buf = malloc(bytes + 64), *want = malloc(bytes);
        memset(buf, 0xEE, bytes + 64);
        quant_quantize_act(q_types[k], x, buf, n);
        if (quant_get(q_types[k])->vec_dot_type == GGML_TYPE_Q8_K) quant_quantize_row_q8_K_ref(x, (block_q8_K *)want, n);
        else quant_quantize_row_q8_0_ref(x, (block_q8_0 *)want, n);
        CU_ASSERT(memcmp(buf, want, bytes) == 0);
        int guard = 0;
        for (int i = 0; i < 64; i++) guard += buf[bytes + i] != 0xEE;
        CU_ASSERT_EQUAL(guard, 0);
        free(buf), free(want);
    }
}

/* ---- integer dots ----------------------------------------------------------------------- */

static const int64_t dot_lens[] = {256, 512, 1024, 3584, 4352, 17408};
#define N_LENS 6

/* perturb: 0 none; 1 the AVX2 side sees one activation level changed by one;
 * 2 the result checked against the exact dot is off by 4x the bound.
 * Returns the number of (type, length, scale range) cases that failed each check
 * (twin[], exact[]). */
static void dot_cases(int perturb, int *twin_fail, int *exact_fail, int *act_fail, int *n_cases) {
    uint64_t s = 21 + (uint64_t)perturb;
    *twin_fail = *exact_fail = *act_fail = *n_cases = 0;
    double worst_exact = 0, worst_act = 0, typical_act = 0;
    for (int k = 0; k < N_QTYPES; k++) {
        const uint32_t type = q_types[k];
        const quant_traits *t = quant_get(type);
        for (int li = 0; li < N_LENS; li++) {
            for (int range = 0; range < 3; range++) {
                int64_t n = dot_lens[li];
                if (type == GGML_TYPE_Q8_0 && li == 0) n = 96; /* odd number of Q8_0 blocks */
                uint8_t *row = malloc(quant_row_bytes(type, n));
                float *x = malloc(n * sizeof(float)), *w = malloc(n * sizeof(float));
                uint64_t xb = quant_act_bytes(type, n);
                uint8_t *xq = malloc(xb), *xq2 = malloc(xb);
                /* scale ranges: ordinary; tiny (f16 subnormal d, tiny x); large d, large x */
                static const int lo[] = {-10, -24, 8}, hi[] = {-4, -14, 14}, xe[] = {0, -30, 10};
                fill_blocks(type, row, n, &s, lo[range], hi[range]);
                /* Q8_0 activations keep an f16 scale: tiny x would underflow it to 0 */
                int xexp = type == GGML_TYPE_Q8_0 && range == 1 ? -6 : xe[range];
                fill_act(x, n, &s, xexp, range == 2 && type != GGML_TYPE_Q8_0);
                quant_quantize_act(type, x, xq, n);
                memcpy(xq2, xq, xb);
                if (perturb == 1) { /* one level of the activation off by one, where |d sc q| is largest */
                    int64_t e = 0;
                    double best = -1;
                    for (int64_t i = 0; i < n; i++) {
                        double aq, b;
                        weight_terms(type, row, i, &aq, &b);
                        double tm = fabs(aq) * act_scale(t->vec_dot_type, xq, i); if (tm > best) best = tm, e = i;
                    }
                    int8_t *lv = t->vec_dot_type == GGML_TYPE_Q8_K ? &((block_q8_K *)xq2)[e / QK_K].qs[e % QK_K]
                                                                    : &((block_q8_0 *)xq2)[e / QK8_0].qs[e % QK8_0];
                    *lv = (int8_t)(*lv > 0 ? *lv - 1 : *lv + 1);
                }
                float ref = t->dot_q8_ref(row, xq, n);
                float got = t->dot_q8(row, xq2, n);
                if (perturb == 1 && !quant_cpu_has_avx2()) got = t->dot_q8_ref(row, xq2, n);
                *twin_fail += !same_float(got, ref);
                /* exact math */
                double mag, ex = exact_dot(type, row, xq, n, &mag);
                int64_t nb = n / t->block_size;
                double bound = (double)(nb + 6) * ldexp(1.0, -23) * mag;
                double err = fabs((double)ref - ex);
                if (perturb == 2) err = fabs((double)ref + 4 * bound + 1e-300 - ex);
                if (mag > 0 && err / mag > worst_exact) worst_exact = err / mag;
                *exact_fail += !(err <= bound);
                /* vs the float dot with the original x: within the activation error */
                t->dequant(row, w, n);
                double fdot = 0, wmag = 0, abound = 0;
                for (int64_t i = 0; i < n; i++) {
                    fdot += (double)w[i] * x[i];
                    wmag += fabs((double)w[i] * x[i]);
                    double a_q, b;
                    weight_terms(type, row, i, &a_q, &b);
                    /* |x - xq| <= d/2 (+ rounding); |w| from the exact terms */
                    abound += fabs(a_q - b) * (act_scale(t->vec_dot_type, xq, i) * 0.5 * (1 + 1e-3) + fabs(x[i]) * 1e-3);
                }
                double aerr = fabs((double)ref - fdot);
                if (perturb == 2) aerr += 4 * (abound + bound + 1e-7 * wmag) + 1e-300;
                *act_fail += !(aerr <= abound + bound + 1e-7 * wmag); /* 1e-7: the f32 weights */
                if (abound > 0 && aerr / abound > worst_act) worst_act = aerr / abound;
                if (range == 0 && wmag > 0) typical_act += aerr / wmag;
                (*n_cases)++;
                free(row), free(x), free(w), free(xq), free(xq2);
            }
        }
    }
    if (perturb == 0)
        printf("\n    worst |int - exact| / M = %.3g; worst |int - float dot| / activation bound = %.3g;"
               " mean |int - float dot| / sum|w x| (ordinary scales) = %.3g",
               worst_exact, worst_act, typical_act / (N_QTYPES * N_LENS));
}

static void test_dot_q8(void) {
    int twin, exact, act, n;
    dot_cases(0, &twin, &exact, &act, &n);
    CU_ASSERT_EQUAL(twin, 0);
    CU_ASSERT_EQUAL(exact, 0);
    CU_ASSERT_EQUAL(act, 0);
    CU_ASSERT_EQUAL(n, N_QTYPES * N_LENS * 3);
}

/* The checks can fail: an activation level off by one is caught by the twin check in every
 * case; a result off by 4x the bound by the exact and activation checks in every case. */
static void test_dot_q8_checks_can_fail(void) {
    int twin, exact, act, n;
    dot_cases(1, &twin, &exact, &act, &n);
    CU_ASSERT_EQUAL(twin, n);
    dot_cases(2, &twin, &exact, &act, &n);
    CU_ASSERT_EQUAL(exact, n);
    CU_ASSERT_EQUAL(act, n);
}

/* Exact equality with the real-number dot when nothing rounds: power-of-two scales and
 * activations whose integer sums stay below 2^24. */
static void test_dot_q8_exact_when_representable(void) {
    uint64_t s = 31;
    const int64_t n = 1024;
    float x[1024];
    for (int k = 0; k < N_QTYPES; k++) {
        const quant_traits *t = quant_get(q_types[k]);
        uint8_t *row = malloc(quant_row_bytes(q_types[k], n));
        uint8_t *xq = malloc(quant_act_bytes(q_types[k], n));
        fill_blocks(q_types[k], row, n, &s, -3, -3);
        /* fix every f16 scale to exactly 2^-3 (fill_blocks varies the mantissa) */
        for (int64_t b = 0; b < n / t->block_size; b++) {
            uint8_t *blk = row + b * t->type_size;
            ggml_half h = quant_f32_to_f16(0.125f);
            if (q_types[k] == GGML_TYPE_Q6_K) memcpy(blk + offsetof(block_q6_K, d), &h, 2);
            else memcpy(blk, &h, 2);
            if (q_types[k] == GGML_TYPE_Q4_K || q_types[k] == GGML_TYPE_Q5_K) memcpy(blk + 2, &h, 2);
        }
        for (int64_t i = 0; i < n; i++) x[i] = (float)((int)(testutil_rng_next(&s) % 11) - 5);
        /* the max element of each activation block -> -127: d = 1 */
        for (int64_t i = 0; i < n; i += (int64_t)(t->vec_dot_type == GGML_TYPE_Q8_K ? QK_K : QK8_0)) x[i] = -127;
        quant_quantize_act(q_types[k], x, xq, n);
        double mag, ex = exact_dot(q_types[k], row, xq, n, &mag);
        CU_ASSERT(mag < 16777216.0 / 8); /* multiples of 1/8 below 2^21: every partial sum exact */
        CU_ASSERT_EQUAL((double)t->dot_q8(row, xq, n), ex);
        CU_ASSERT_EQUAL((double)t->dot_q8_ref(row, xq, n), ex);
        free(row), free(xq);
    }
}

/* dot_q8_cols over 1..4 columns == dot_q8 per column, bit for bit; the scalar version too. */
static void test_dot_q8_cols(void) {
    uint64_t s = 51;
    int bad = 0;
    for (int k = 0; k < N_QTYPES; k++) {
        const uint32_t type = q_types[k];
        const quant_traits *t = quant_get(type);
        CU_ASSERT(t->dot_q8_cols && t->dot_q8_cols_ref);
        CU_ASSERT_EQUAL(quant_cpu_has_avx2(), t->dot_q8_cols != t->dot_q8_cols_ref);
        for (int li = 0; li < 3; li++) {
            const int64_t n = type == GGML_TYPE_Q8_0 && li == 0 ? 96 : dot_lens[li + 1];
            const uint64_t xb = quant_act_bytes(type, n), stride = xb + 64; /* padded columns */
            uint8_t *row = malloc(quant_row_bytes(type, n)), *xq = malloc(stride * QUANT_Q8_MAX_COLS);
            float *x = malloc(n * sizeof(float));
            fill_blocks(type, row, n, &s, -10, -4);
            for (int c = 0; c < QUANT_Q8_MAX_COLS; c++) {
                fill_act(x, n, &s, c - 2, c == 3);
                quant_quantize_act(type, x, xq + c * stride, n);
            }
            for (int nc = 1; nc <= QUANT_Q8_MAX_COLS; nc++) {
                float got[QUANT_Q8_MAX_COLS + 1], gref[QUANT_Q8_MAX_COLS + 1];
                got[nc] = gref[nc] = -7.0f;
                t->dot_q8_cols(row, xq, stride, nc, n, got);
                t->dot_q8_cols_ref(row, xq, stride, nc, n, gref);
                bad += got[nc] != -7.0f || gref[nc] != -7.0f; /* nothing beyond nc written */
                for (int c = 0; c < nc; c++) {
                    const float one = t->dot_q8(row, xq + c * stride, n);
                    bad += !same_float(got[c], one) || !same_float(gref[c], one);
                }
            }
            free(row), free(xq), free(x);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_matvec_q8(void) {
    uint64_t s = 41;
    for (int k = 0; k < N_QTYPES; k++) {
        const uint32_t type = q_types[k];
        const quant_traits *t = quant_get(type);
        const int64_t n_in = 1024, n_out = 37;
        const uint64_t rb = quant_row_bytes(type, n_in), stride = rb + 48;
        uint8_t *w = malloc(stride * n_out), *xq = malloc(quant_act_bytes(type, n_in));
        float *x = malloc(n_in * sizeof(float)), *y = malloc(n_out * sizeof(float));
        for (int64_t r = 0; r < n_out; r++) fill_blocks(type, w + r * stride, n_in, &s, -10, -4);
        fill_act(x, n_in, &s, 0, 0);
        quant_quantize_act(type, x, xq, n_in);
        for (int64_t r = 0; r < n_out; r++) y[r] = -12345.0f;
        quant_matvec_q8(type, w, stride, n_in, xq, y, 5, 30);
        int bad = 0;
        for (int64_t r = 0; r < n_out; r++)
            bad += r < 5 || r >= 30 ? y[r] != -12345.0f : !same_float(y[r], t->dot_q8_ref(w + r * stride, xq, n_in));
        CU_ASSERT_EQUAL(bad, 0);
        free(w), free(xq), free(x), free(y);
    }
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("quant_q8", NULL, NULL);
    CU_add_test(s, "struct_and_traits", test_struct_and_traits);
    CU_add_test(s, "quantize_avx2_equals_ref", test_quantize_avx2_equals_ref);
    CU_add_test(s, "quantize_semantics", test_quantize_semantics);
    CU_add_test(s, "quantize_act_bounds", test_quantize_act_bounds);
    CU_add_test(s, "dot_q8", test_dot_q8);
    CU_add_test(s, "dot_q8_checks_can_fail", test_dot_q8_checks_can_fail);
    CU_add_test(s, "dot_q8_exact_when_representable", test_dot_q8_exact_when_representable);
    CU_add_test(s, "dot_q8_cols", test_dot_q8_cols);
    CU_add_test(s, "matvec_q8", test_matvec_q8);
    return testutil_cunit_run();
}
