/* Unit tests for gguf/quant: the traits table, f16/bf16 conversions, dequantisation of
 * hand-built blocks, AVX2 dot vs the scalar reference, matvec, and quantise round-trip
 * error bounds. Parity with gguf-py is tests/gguf/quant_py_parity.py. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "tests/testutil/testutil.h"

/* ---- helpers ---------------------------------------------------------------------------- */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static const uint32_t supported_types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16,
                                           GGML_TYPE_Q8_0, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                                           GGML_TYPE_Q6_K};
#define N_SUPPORTED (sizeof supported_types / sizeof supported_types[0])

/* Fills n elements' worth of valid random blocks of TYPE: random bytes, with every scale
 * half (d, dmin) set to a finite value of magnitude 2^-10..2^-4 (either sign for d of Q8_0
 * and Q6_K), and plain types to finite values. */
static void fill_random_blocks(uint32_t type, void *dst, int64_t n, uint64_t *s) {
    const quant_traits *t = quant_get(type);
    uint8_t *p = dst;
    uint64_t bytes = quant_row_bytes(type, (uint64_t)n);
    for (uint64_t i = 0; i < bytes; i++) p[i] = (uint8_t)testutil_rng_next(s);
    int64_t nb = n / t->block_size;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * t->type_size;
        float mag =
            ldexpf(1.0f + 0.5f * testutil_rng_uniform(s), -4 - (int)(testutil_rng_next(s) % 7));
        ggml_half h = quant_f32_to_f16(mag);
        ggml_half hneg = quant_f32_to_f16(testutil_rng_next(s) & 1 ? -mag : mag);
        ggml_half hm = quant_f32_to_f16(mag * (0.5f + 0.5f * testutil_rng_uniform(s)));
        switch (type) {
        case GGML_TYPE_F32: {
            float v = testutil_rng_uniform(s);
            memcpy(blk, &v, 4);
            break;
        }
        case GGML_TYPE_F16: memcpy(blk, &hneg, 2); break;
        case GGML_TYPE_BF16: {
            ggml_bf16 v = quant_f32_to_bf16(testutil_rng_uniform(s));
            memcpy(blk, &v, 2);
            break;
        }
        case GGML_TYPE_Q8_0: memcpy(blk, &hneg, 2); break;
        case GGML_TYPE_Q4_K:
        case GGML_TYPE_Q5_K:
            memcpy(blk, &h, 2);
            memcpy(blk + 2, &hm, 2);
            break;
        case GGML_TYPE_Q6_K: memcpy(blk + offsetof(block_q6_K, d), &hneg, 2); break;
        default: CU_FAIL("fill_random_blocks: unsupported type");
        }
    }
}

/* Per-element magnitude scale of the dot: sum |x_i| * (|w_i| + |min term_i|); a float dot is
 * accurate to a small multiple of eps times this (the min term is separate in K-quants). */
static double dot_magnitude(uint32_t type, const void *row, const float *w, const float *x,
                            int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double extra = 0;
        if (type == GGML_TYPE_Q4_K || type == GGML_TYPE_Q5_K) {
            const uint8_t *blk = (const uint8_t *)row + (i / QK_K) * quant_get(type)->type_size;
            ggml_half hdmin;
            memcpy(&hdmin, blk + 2, 2);
            const uint8_t *sc = blk + 4;
            int j = (int)(i % QK_K) / 32;
            int mm = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
            extra = fabs(quant_f16_to_f32(hdmin) * mm);
        }
        m += fabs((double)x[i]) * (fabs((double)w[i]) + extra);
    }
    return m;
}

/* |got - ref| <= rel * mag; prints the case when not. */
static int close_enough_verbose = 1;

static int close_enough(const char *what, const char *type, int64_t n, double got, double ref,
                        double mag, double rel) {
    double err = fabs(got - ref);
    if (err <= rel * mag + 1e-30) return 1;
    if (!close_enough_verbose) return 0;
    printf("\n  %s %s n=%lld: got %.9g ref %.9g err %.3g > %.3g (mag %.3g)\n", what, type,
           (long long)n, got, ref, err, rel * mag, mag);
    return 0;
}

/* ---- traits table ----------------------------------------------------------------------- */

static void test_struct_sizes(void) {
    CU_ASSERT_EQUAL(sizeof(block_q8_0), 34);
    CU_ASSERT_EQUAL(sizeof(block_q4_K), 144);
    CU_ASSERT_EQUAL(sizeof(block_q5_K), 176);
    CU_ASSERT_EQUAL(sizeof(block_q6_K), 210);
    CU_ASSERT_EQUAL(offsetof(block_q6_K, d), 208);
    CU_ASSERT_EQUAL(offsetof(block_q5_K, qs), 48);
}

static void test_traits_table(void) {
    /* ggml ids with (block size, type size) as ggml.c type_traits; 0 = no such type */
    static const struct { uint32_t id; const char *name; uint32_t bs, ts; bool sup; } want[] = {
        {0, "f32", 1, 4, true},        {1, "f16", 1, 2, true},       {2, "q4_0", 32, 18, false},
        {3, "q4_1", 32, 20, false},    {6, "q5_0", 32, 22, false},   {7, "q5_1", 32, 24, false},
        {8, "q8_0", 32, 34, true},     {9, "q8_1", 32, 36, false},   {10, "q2_K", 256, 84, false},
        {11, "q3_K", 256, 110, false}, {12, "q4_K", 256, 144, true}, {13, "q5_K", 256, 176, true},
        {14, "q6_K", 256, 210, true},  {15, "q8_K", 256, 292, false},
        {16, "iq2_xxs", 256, 66, false}, {17, "iq2_xs", 256, 74, false},
        {18, "iq3_xxs", 256, 98, false}, {19, "iq1_s", 256, 50, false},
        {20, "iq4_nl", 32, 18, false}, {21, "iq3_s", 256, 110, false},
        {22, "iq2_s", 256, 82, false}, {23, "iq4_xs", 256, 136, false}, {24, "i8", 1, 1, false},
        {25, "i16", 1, 2, false},      {26, "i32", 1, 4, false},     {27, "i64", 1, 8, false},
        {28, "f64", 1, 8, false},      {29, "iq1_m", 256, 56, false}, {30, "bf16", 1, 2, true},
        {34, "tq1_0", 256, 54, false}, {35, "tq2_0", 256, 66, false},
        {39, "mxfp4", 32, 17, false},
    };
    bool known[64] = {false};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const quant_traits *t = quant_get(want[k].id);
        known[want[k].id] = true;
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        CU_ASSERT_STRING_EQUAL(t->name, want[k].name);
        CU_ASSERT_EQUAL(t->block_size, want[k].bs);
        CU_ASSERT_EQUAL(t->type_size, want[k].ts);
        CU_ASSERT_EQUAL(t->supported, want[k].sup);
        if (t->supported) {
            CU_ASSERT(t->dequant && t->dot && t->dot_ref && t->quantize);
            CU_ASSERT_PTR_EQUAL(quant_get_ref(want[k].id)->dot, t->dot_ref);
            CU_ASSERT_EQUAL(quant_cpu_has_avx2(), t->dot != t->dot_ref);
        } else {
            CU_ASSERT(!t->dequant && !t->dot && !t->dot_ref && !t->quantize);
        }
    }
    for (uint32_t id = 0; id < 64; id++)
        if (!known[id]) CU_ASSERT_PTR_NULL(quant_get(id));
    CU_ASSERT_PTR_NULL(quant_get(UINT32_MAX));
}

static void test_row_bytes(void) {
    CU_ASSERT_EQUAL(quant_row_bytes(GGML_TYPE_Q4_K, 4096), 16 * 144);
    CU_ASSERT_EQUAL(quant_row_bytes(GGML_TYPE_Q8_0, 64), 68);
    CU_ASSERT_EQUAL(quant_row_bytes(GGML_TYPE_F16, 3), 6);
    CU_ASSERT_EQUAL(quant_row_bytes(GGML_TYPE_Q4_K, 100), 0);  /* not a multiple */
    CU_ASSERT_EQUAL(quant_row_bytes(GGML_TYPE_Q2_K, 512), 168); /* known, unsupported */
    CU_ASSERT_EQUAL(quant_row_bytes(4, 32), 0);                 /* removed id */
    CU_ASSERT_EQUAL(quant_row_bytes(GGML_TYPE_F32, 0), 0);
}

/* ---- f16 / bf16 ------------------------------------------------------------------------- */

static void test_f16_edges(void) {
    static const struct { float f; ggml_half h; } cases[] = {
        {0.0f, 0x0000},         {-0.0f, 0x8000},       {1.0f, 0x3C00},     {-2.0f, 0xC000},
        {65504.0f, 0x7BFF},     {65519.99f, 0x7BFF},   {65520.0f, 0x7C00}, /* ties to inf */
        {1e9f, 0x7C00},         {-1e9f, 0xFC00},       {0x1p-14f, 0x0400}, /* smallest normal */
        {0x1p-24f, 0x0001},     {0x1p-25f, 0x0000},    /* tie -> even (0) */
        {0x1.8p-24f, 0x0002},   /* 1.5 ulp: tie -> even (2) */
        {0x1.4p-24f, 0x0001},   {0x1.000002p-25f, 0x0001}, /* just above the tie */
        {0x1.ffcp-15f, 0x0400}, /* largest subnormal 1023*2^-24 is 0x1.ff8p-15; this rounds up */
        {0x1.ff8p-15f, 0x03FF}, {1.0f + 0x1p-11f, 0x3C00}, /* tie -> even */
        {1.0f + 0x1.8p-11f, 0x3C01}, {1.0f + 0x3p-11f, 0x3C02}, /* tie -> even (up) */
        {INFINITY, 0x7C00},     {-INFINITY, 0xFC00},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ggml_half h = quant_f32_to_f16(cases[k].f);
        if (h != cases[k].h) printf("\n  f32_to_f16(%a) = %04x, want %04x\n", cases[k].f, h, cases[k].h);
        CU_ASSERT_EQUAL(h, cases[k].h);
    }
    CU_ASSERT_EQUAL(quant_f32_to_f16(NAN) & 0x7FFF, 0x7E00);
    CU_ASSERT_EQUAL(quant_f16_to_f32(0x0001), 0x1p-24f);
    CU_ASSERT_EQUAL(quant_f16_to_f32(0x03FF), 0x1.ff8p-15f);
    CU_ASSERT_EQUAL(quant_f16_to_f32(0x7BFF), 65504.0f);
    CU_ASSERT(isinf(quant_f16_to_f32(0xFC00)) && quant_f16_to_f32(0xFC00) < 0);
    CU_ASSERT(isnan(quant_f16_to_f32(0x7C01)) && isnan(quant_f16_to_f32(0xFE00)));
    CU_ASSERT_EQUAL(f32_bits(quant_f16_to_f32(0x8000)), 0x80000000u);
    /* every non-nan half survives the round trip; value order is monotonic */
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = quant_f16_to_f32((ggml_half)h);
        if (isnan(f)) {
            bad += ((h & 0x7C00) != 0x7C00 || (h & 0x3FF) == 0);
            continue;
        }
        bad += quant_f32_to_f16(f) != h;
        if (h > 0 && h < 0x7C00) bad += !(quant_f16_to_f32((ggml_half)(h - 1)) < f);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* f32 -> f16 against an independent, slow definition: the nearest of the two neighbouring
 * halves (found by bisection on the half's value), ties to even mantissa. */
static ggml_half f16_slow(float f) {
    if (isnan(f)) return 0x7E00;
    ggml_half sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7C00;
    uint32_t lo = 0, hi = 0x7BFF;
    while (lo < hi) { /* largest h with value(h) <= a */
        uint32_t mid = (lo + hi + 1) / 2;
        if ((double)quant_f16_to_f32((ggml_half)mid) <= a) lo = mid; else hi = mid - 1;
    }
    double vlo = quant_f16_to_f32((ggml_half)lo);
    double vhi = lo == 0x7BFF ? 65536.0 : (double)quant_f16_to_f32((ggml_half)(lo + 1));
    uint32_t r;
    if (a - vlo < vhi - a) r = lo;
    else if (a - vlo > vhi - a) r = lo + 1;
    else r = (lo & 1) ? lo + 1 : lo;
    return (ggml_half)(sign | r);
}

static void test_f16_random(void) {
    uint64_t s = 42;
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        /* bits in the interesting range: subnormal halves to overflow */
        uint32_t u = 0x33000000u - 0x200000u +
                     (uint32_t)(testutil_rng_next(&s) % (0x47800000u - 0x33000000u + 0x400000u));
        if (testutil_rng_next(&s) & 1) u |= 0x80000000u;
        float f = bits_f32(u);
        ggml_half got = quant_f32_to_f16(f), want = f16_slow(f);
        if (got != want && bad++ < 5) printf("\n  f32_to_f16(%a) = %04x, want %04x\n", f, got, want);
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_bf16(void) {
    CU_ASSERT_EQUAL(quant_f32_to_bf16(1.0f), 0x3F80);
    CU_ASSERT_EQUAL(quant_f32_to_bf16(1.0f + 0x1p-8f), 0x3F80);   /* tie -> even (down) */
    CU_ASSERT_EQUAL(quant_f32_to_bf16(1.0f + 0x3p-8f), 0x3F82);   /* tie -> even (up) */
    CU_ASSERT_EQUAL(quant_f32_to_bf16(1.0f + 0x1.2p-8f), 0x3F81); /* above the tie */
    CU_ASSERT_EQUAL(quant_f32_to_bf16(-0.0f), 0x8000);
    CU_ASSERT_EQUAL(quant_f32_to_bf16(INFINITY), 0x7F80);
    CU_ASSERT_EQUAL(quant_f32_to_bf16(0x1.fffffep127f), 0x7F80); /* rounds to inf */
    CU_ASSERT_EQUAL(quant_f32_to_bf16(0x1p-133f), 0x0001);       /* f32 subnormal kept */
    ggml_bf16 n = quant_f32_to_bf16(bits_f32(0x7F800001u));      /* signalling nan payload */
    CU_ASSERT((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0);        /* still a nan */
    CU_ASSERT_EQUAL(quant_bf16_to_f32(0x3F80), 1.0f);
    CU_ASSERT_EQUAL(f32_bits(quant_bf16_to_f32(0xC2F7)), 0xC2F70000u);
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = quant_bf16_to_f32((ggml_bf16)h);
        if (!isnan(f)) bad += quant_f32_to_bf16(f) != h;
    }
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- dequantisation of hand-built blocks ------------------------------------------------ */

static void test_dequant_q8_0(void) {
    block_q8_0 b;
    b.d = quant_f32_to_f16(0.5f);
    for (int j = 0; j < 32; j++) b.qs[j] = (int8_t)(j * 8 - 128);
    float y[32];
    quant_get(GGML_TYPE_Q8_0)->dequant(&b, y, 32);
    for (int j = 0; j < 32; j++) CU_ASSERT_EQUAL(y[j], 0.5f * (j * 8 - 128));
}

/* Packs 6-bit sc[8], m[8] as ggml does (inverse of get_scale_min_k4). */
static void pack_k4_scales(const int sc[8], const int m[8], uint8_t out[12]) {
    memset(out, 0, 12);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = (uint8_t)sc[j];
            out[j + 4] = (uint8_t)m[j];
        } else {
            out[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            out[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            out[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

static void test_dequant_q4_K_q5_K(void) {
    const int sc[8] = {1, 63, 17, 32, 48, 5, 60, 33}, m[8] = {0, 2, 63, 40, 16, 59, 1, 31};
    const float d = 0.25f, dmin = 0.125f;
    block_q4_K b4;
    block_q5_K b5;
    b4.d = b5.d = quant_f32_to_f16(d);
    b4.dmin = b5.dmin = quant_f32_to_f16(dmin);
    pack_k4_scales(sc, m, b4.scales);
    pack_k4_scales(sc, m, b5.scales);
    int level[256];
    for (int i = 0; i < 256; i++) level[i] = (i * 7 + 3) % 32;
    memset(b4.qs, 0, sizeof b4.qs);
    memset(b5.qs, 0, sizeof b5.qs);
    memset(b5.qh, 0, sizeof b5.qh);
    for (int i = 0; i < 256; i++) { /* weight i: group i/64, nibble (i%64)/32, byte i%32 */
        int g = i / 64, hiN = (i % 64) / 32, l = i % 32;
        b4.qs[32 * g + l] |= (uint8_t)((level[i] & 0xF) << (4 * hiN));
        b5.qs[32 * g + l] |= (uint8_t)((level[i] & 0xF) << (4 * hiN));
        if (level[i] & 16) b5.qh[l] |= (uint8_t)(1 << (2 * g + hiN));
    }
    float y4[256], y5[256];
    quant_get(GGML_TYPE_Q4_K)->dequant(&b4, y4, 256);
    quant_get(GGML_TYPE_Q5_K)->dequant(&b5, y5, 256);
    int bad = 0;
    for (int i = 0; i < 256; i++) {
        int j = i / 32;
        bad += y4[i] != d * sc[j] * (level[i] & 0xF) - dmin * m[j];
        bad += y5[i] != d * sc[j] * level[i] - dmin * m[j];
    }
    CU_ASSERT_EQUAL(bad, 0);
}

static void test_dequant_q6_K(void) {
    block_q6_K b;
    memset(&b, 0, sizeof b);
    b.d = quant_f32_to_f16(0.5f);
    for (int s = 0; s < 16; s++) b.scales[s] = (int8_t)(s * 17 - 128);
    int level[256];
    for (int i = 0; i < 256; i++) level[i] = (i * 29 + 5) % 64;
    for (int i = 0; i < 256; i++) { /* half i/128; within: l = i%32, quarter (i%128)/32 */
        int h = i / 128, q = (i % 128) / 32, l = i % 32;
        int lo = level[i] & 0xF, hi = level[i] >> 4;
        b.ql[64 * h + l + (q & 1) * 32] |= (uint8_t)(lo << (4 * (q >> 1)));
        b.qh[32 * h + l] |= (uint8_t)(hi << (2 * q));
    }
    float y[256];
    quant_get(GGML_TYPE_Q6_K)->dequant(&b, y, 256);
    int bad = 0;
    for (int i = 0; i < 256; i++) bad += y[i] != 0.5f * b.scales[i / 16] * (level[i] - 32);
    CU_ASSERT_EQUAL(bad, 0);
}

/* ---- dot: AVX2 vs scalar reference, dequant consistency, matvec ------------------------- */

static int dot_cases_check(double rel, int perturb) {
    static const int64_t lens[] = {256, 512, 768, 4352, 5120, 17408};
    uint64_t s = 7;
    int failures = 0;
    for (size_t k = 0; k < N_SUPPORTED; k++) {
        uint32_t type = supported_types[k];
        const quant_traits *t = quant_get(type);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            int64_t n = lens[li] + (t->block_size == 1 ? 3 : 0); /* plain types: odd tails */
            uint8_t *row = malloc(quant_row_bytes(type, (uint64_t)n));
            float *x = malloc((size_t)n * sizeof(float)), *w = malloc((size_t)n * sizeof(float));
            fill_random_blocks(type, row, n, &s);
            for (int64_t i = 0; i < n; i++) x[i] = testutil_rng_uniform(&s);
            t->dequant(row, w, n);
            double direct = 0;
            for (int64_t i = 0; i < n; i++) direct += (double)w[i] * x[i];
            double mag = dot_magnitude(type, row, w, x, n);
            double ref = t->dot_ref(row, x, n);
            double got = t->dot(row, x, n);
            if (perturb) got += 1e-4 * mag;
            /* the reference sums in double: within a float rounding of the direct sum */
            failures += !close_enough("dot_ref", t->name, n, ref, direct, mag, 1e-7);
            failures += !close_enough("dot", t->name, n, got, ref, mag, rel);
            free(row), free(x), free(w);
        }
    }
    return failures;
}

static void test_dot_vs_ref(void) {
    if (!quant_cpu_has_avx2()) printf("\n  (no AVX2 on this CPU: dot is the reference)\n");
    CU_ASSERT_EQUAL(dot_cases_check(5e-7, 0), 0);
}

/* The check above must be able to fail: a 1e-4 relative perturbation is caught. */
static void test_dot_check_can_fail(void) {
    close_enough_verbose = 0;
    int n_cases = (int)N_SUPPORTED * 6;
    CU_ASSERT_EQUAL(dot_cases_check(5e-7, 1), n_cases); /* every perturbed dot is caught */
    close_enough_verbose = 1;
}

static void test_matvec(void) {
    uint64_t s = 99;
    for (size_t k = 0; k < N_SUPPORTED; k++) {
        uint32_t type = supported_types[k];
        const quant_traits *t = quant_get(type);
        const int64_t n_in = 1024, n_out = 37;
        const uint64_t rb = quant_row_bytes(type, n_in), stride = rb + 64; /* padded rows */
        uint8_t *w = malloc(stride * n_out);
        float *x = malloc(n_in * sizeof(float)), *y = malloc(n_out * sizeof(float));
        float *wf = malloc(n_in * sizeof(float));
        for (int64_t r = 0; r < n_out; r++) fill_random_blocks(type, w + r * stride, n_in, &s);
        for (int64_t i = 0; i < n_in; i++) x[i] = testutil_rng_uniform(&s);
        for (int64_t r = 0; r < n_out; r++) y[r] = -12345.0f;
        quant_matvec(type, w, stride, n_in, x, y, 5, 30);
        int bad = 0;
        for (int64_t r = 0; r < n_out; r++) {
            if (r < 5 || r >= 30) {
                bad += y[r] != -12345.0f; /* rows outside the range untouched */
                continue;
            }
            t->dequant(w + r * stride, wf, n_in);
            double mag = dot_magnitude(type, w + r * stride, wf, x, n_in);
            bad += !close_enough("matvec", t->name, n_in, y[r], t->dot_ref(w + r * stride, x, n_in),
                                 mag, 5e-7);
        }
        CU_ASSERT_EQUAL(bad, 0);
        free(w), free(x), free(y), free(wf);
    }
}

/* ---- quantise round trips --------------------------------------------------------------- */

/* RMSE(dequant(quantize(x)) - x) / RMS(x) over Gaussian data with a few outliers. */
static double roundtrip_rel_rmse(uint32_t type, int outliers) {
    const quant_traits *t = quant_get(type);
    const int64_t n = 256 * 256;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    void *q = malloc(quant_row_bytes(type, n));
    uint64_t s = 1234 + type;
    for (int64_t i = 0; i < n; i++) x[i] = 0.02f * testutil_rng_gauss(&s);
    if (outliers)
        for (int64_t i = 0; i < n; i += 97) x[i] *= 8.0f;
    t->quantize(x, q, n);
    t->dequant(q, y, n);
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        r += (double)x[i] * x[i];
    }
    free(x), free(y), free(q);
    return sqrt(e / r);
}

static void test_quantize_error_bounds(void) {
    /* measured on this data (gaussian / 1 in 97 values x8): f16 2.1e-4 / 2.1e-4, bf16
     * 1.66e-3 / 1.65e-3, q8_0 5.4e-3 / 8.7e-3, q6_K 1.77e-2 / 2.62e-2, q5_K 3.60e-2 /
     * 4.54e-2, q4_K 7.09e-2 / 8.97e-2; bounds leave 10-20% headroom */
    static const struct { uint32_t type; double bound[2]; } b[] = {
        {GGML_TYPE_F32, {0.0, 0.0}},          {GGML_TYPE_F16, {2.5e-4, 2.5e-4}},
        {GGML_TYPE_BF16, {2.0e-3, 2.0e-3}},   {GGML_TYPE_Q8_0, {0.0065, 0.010}},
        {GGML_TYPE_Q6_K, {0.020, 0.030}},     {GGML_TYPE_Q5_K, {0.040, 0.050}},
        {GGML_TYPE_Q4_K, {0.080, 0.100}},
    };
    for (size_t k = 0; k < sizeof b / sizeof b[0]; k++) {
        for (int o = 0; o < 2; o++) {
            double e = roundtrip_rel_rmse(b[k].type, o);
            printf("\n  %-5s %s rel rmse %.5f (bound %.4f)", quant_get(b[k].type)->name,
                   o ? "outliers" : "gaussian", e, b[k].bound[o]);
            CU_ASSERT(e <= b[k].bound[o]);
        }
    }
}

static void test_quantize_special_blocks(void) {
    for (size_t k = 0; k < N_SUPPORTED; k++) {
        const quant_traits *t = quant_get(supported_types[k]);
        float x[512], y[512];
        uint8_t q[512 * sizeof(float)];
        /* all zero -> exactly zero */
        memset(x, 0, sizeof x);
        t->quantize(x, q, 512);
        t->dequant(q, y, 512);
        int bad = 0;
        for (int i = 0; i < 512; i++) bad += y[i] != 0.0f;
        /* a constant positive block and a single spike: small error relative to the max */
        for (int i = 0; i < 512; i++) x[i] = i < 256 ? 0.75f : (i == 300 ? -3.0f : 0.0f);
        t->quantize(x, q, 512);
        t->dequant(q, y, 512);
        for (int i = 0; i < 512; i++) bad += fabsf(y[i] - x[i]) > 0.02f * (i < 256 ? 0.75f : 3.0f);
        if (bad) printf("\n  %s: %d bad elements\n", t->name, bad);
        CU_ASSERT_EQUAL(bad, 0);
    }
}

/* Quantising what was dequantised gives the same values back for Q8_0 (a fixed point of the
 * round trip): the scale is recovered exactly when the block's max level is +-127. */
static void test_quantize_q8_0_fixed_point(void) {
    block_q8_0 b[4], b2[4];
    uint64_t s = 5;
    for (int i = 0; i < 4; i++) {
        b[i].d = quant_f32_to_f16(0.01f * (i + 1));
        for (int j = 0; j < 32; j++)
            b[i].qs[j] = (int8_t)((int)(testutil_rng_next(&s) % 255) - 127);
        b[i].qs[i] = 127;
    }
    float y[128], y2[128];
    quant_get(GGML_TYPE_Q8_0)->dequant(b, y, 128);
    quant_get(GGML_TYPE_Q8_0)->quantize(y, b2, 128);
    quant_get(GGML_TYPE_Q8_0)->dequant(b2, y2, 128);
    CU_ASSERT_EQUAL(memcmp(y, y2, sizeof y), 0);
}

int main(void) {
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("quant", NULL, NULL);
    CU_add_test(s, "struct_sizes", test_struct_sizes);
    CU_add_test(s, "traits_table", test_traits_table);
    CU_add_test(s, "row_bytes", test_row_bytes);
    CU_add_test(s, "f16_edges", test_f16_edges);
    CU_add_test(s, "f16_random_vs_slow", test_f16_random);
    CU_add_test(s, "bf16", test_bf16);
    CU_add_test(s, "dequant_q8_0", test_dequant_q8_0);
    CU_add_test(s, "dequant_q4_K_q5_K", test_dequant_q4_K_q5_K);
    CU_add_test(s, "dequant_q6_K", test_dequant_q6_K);
    CU_add_test(s, "dot_vs_ref", test_dot_vs_ref);
    CU_add_test(s, "dot_check_can_fail", test_dot_check_can_fail);
    CU_add_test(s, "matvec", test_matvec);
    CU_add_test(s, "quantize_error_bounds", test_quantize_error_bounds);
    CU_add_test(s, "quantize_special_blocks", test_quantize_special_blocks);
    CU_add_test(s, "quantize_q8_0_fixed_point", test_quantize_q8_0_fixed_point);
    return testutil_cunit_run();
}
