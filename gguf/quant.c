/* The one ggml type-traits table, exact f16/bf16 conversions, the scalar reference kernels
 * (dequantise a row, dot a row with an F32 vector) and the row-range matvec.
 *
 * Dequantisation follows ggml-org/ggml src/ggml-quants.c dequantize_row_* operation for
 * operation (same float products in the same order), so results are bit-identical to ggml
 * and gguf-py. The dot reference dequantises one block into a stack buffer and accumulates
 * in double: it is the yardstick the AVX2 kernels (quant_avx2.c) are tested against.
 * Quantisation lives in quant_quantize.c. */
#include "gguf/quant.h"

#include <string.h>

#include "common/status.h"
#include "gguf/quant_impl.h"

/* ---- f16 / bf16 ------------------------------------------------------------------------- */

static inline uint32_t quant_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float quant_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float quant_f16_to_f32(ggml_half h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {
        /* inf; nan keeps its payload and is quieted, as F16C and numpy do */
        bits = sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0u);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13); /* normal: rebias 15 -> 127 */
    } else if (man == 0) {
        bits = sign; /* +-0 */
    } else {
        /* subnormal: man * 2^-24, exact in f32; normalise the mantissa */
        int e = 113; /* exponent of 2^-14 in f32 bias is 127-14 = 113 */
        while ((man & 0x400u) == 0) {
            man <<= 1;
            e--;
        }
        bits = sign | ((uint32_t)e << 23) | ((man & 0x3FFu) << 13);
    }
    return quant_bits_f32(bits);
}

ggml_half quant_f32_to_f16(float f) {
    uint32_t u = quant_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (ggml_half)(sign | 0x7E00u); /* nan -> quiet nan (as ggml) */
    if (a >= 0x477FF000u) return (ggml_half)(sign | 0x7C00u); /* rounds to >= 65520: inf */
    if (a >= 0x38800000u) {
        /* normal half: drop 13 mantissa bits, round to nearest even; a carry into the
         * exponent is the correct result (including 65504 -> inf handled above) */
        uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
        return (ggml_half)(sign | ((r - 0x38000000u) >> 13));
    }
    if (a < 0x33000000u) return (ggml_half)sign; /* below half the smallest subnormal: 0 */
    /* subnormal half: value = m * 2^-24 with m = round(a_value * 2^24) */
    uint32_t e = a >> 23;                  /* 102..112 */
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u; /* 24-bit significand, value m * 2^(e-150) */
    uint32_t shift = 126u - e;             /* to units of 2^-24: shift right by (-24)-(e-150) */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (ggml_half)(sign | q); /* q == 0x400 becomes the smallest normal: correct */
}

float quant_bf16_to_f32(ggml_bf16 h) { return quant_bits_f32((uint32_t)h << 16); }

ggml_bf16 quant_f32_to_bf16(float f) {
    uint32_t u = quant_f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (ggml_bf16)((u >> 16) | 64u); /* quiet nan */
    return (ggml_bf16)((u + (0x7FFFu + ((u >> 16) & 1u))) >> 16);
}

/* ---- scalar dequantisation (exact ggml semantics) --------------------------------------- */

static void quant_dequant_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void quant_dequant_f16(const void *src, float *dst, int64_t n) {
    const ggml_half *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(s[i]);
}

static void quant_dequant_bf16(const void *src, float *dst, int64_t n) {
    const ggml_bf16 *s = src;
    for (int64_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(s[i]);
}

static void quant_dequant_q8_0(const void *src, float *dst, int64_t n) {
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        const float d = quant_f16_to_f32(x[i].d);
        for (int j = 0; j < QK8_0; j++) dst[i * QK8_0 + j] = x[i].qs[j] * d;
    }
}

static void quant_dequant_q4_K(const void *src, float *y, int64_t n) {
    const block_q4_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = quant_f16_to_f32(x[i].d);
        const float min = quant_f16_to_f32(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            qb_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc;
            const float m1 = min * m;
            qb_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc;
            const float m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static void quant_dequant_q5_K(const void *src, float *y, int64_t n) {
    const block_q5_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].qs;
        const uint8_t *qh = x[i].qh;
        const float d = quant_f16_to_f32(x[i].d);
        const float min = quant_f16_to_f32(x[i].dmin);
        int is = 0;
        uint8_t sc, m;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            qb_scale_min_k4(is + 0, x[i].scales, &sc, &m);
            const float d1 = d * sc;
            const float m1 = min * m;
            qb_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc;
            const float m2 = min * m;
            for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static void quant_dequant_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *x = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_f16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql;
        const uint8_t *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int k = 0; k < QK_K; k += 128) {
            for (int l = 0; l < 32; ++l) {
                int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * sc[is + 0] * q1;
                y[l + 32] = d * sc[is + 2] * q2;
                y[l + 64] = d * sc[is + 4] * q3;
                y[l + 96] = d * sc[is + 6] * q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

/* ---- scalar reference dot: one block at a time through a stack buffer, double sum ------ */

/* Generic: dequantise CHUNK elements at a time (one block, or 256 plain elements). */
static float quant_dot_generic(quant_dequant_fn dq, uint32_t block, uint32_t bytes,
                               const void *row, const float *x, int64_t n) {
    float buf[QK_K]; /* one dequantised block (or 256 plain elements) */
    const uint32_t chunk = block == 1 ? QK_K : block;
    const uint32_t chunk_bytes = block == 1 ? QK_K * bytes : bytes;
    const uint8_t *p = row;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        dq(p, buf, m);
        for (int64_t j = 0; j < m; j++) sum += (double)buf[j] * (double)x[i + j];
        p += chunk_bytes;
    }
    return (float)sum;
}

#define QUANT_DOT_REF(name, block, bytes)                                               \
    static float quant_dot_ref_##name(const void *row, const float *x, int64_t n) {      \
        return quant_dot_generic(quant_dequant_##name, block, bytes, row, x, n);         \
    }
QUANT_DOT_REF(f32, 1, 4)
QUANT_DOT_REF(f16, 1, 2)
QUANT_DOT_REF(bf16, 1, 2)
QUANT_DOT_REF(q8_0, QK8_0, sizeof(block_q8_0))
QUANT_DOT_REF(q4_K, QK_K, sizeof(block_q4_K))
QUANT_DOT_REF(q5_K, QK_K, sizeof(block_q5_K))
QUANT_DOT_REF(q6_K, QK_K, sizeof(block_q6_K))

/* ---- the type-traits table -------------------------------------------------------------- */

/* Block and byte sizes as ggml's type_traits (ggml.c / ggml-common.h). Ids 4, 5 (old
 * Q4_2/Q4_3), 31-33 and 36-38 (removed repacked types) are not valid in files: NULL.
 * Note: gguf-py 0.17 lists Q8_1 as 40 bytes; ggml's block_q8_1 is {half d, half s,
 * int8 qs[32]} = 36 bytes, which is what ggml validates files against. */
#define QUANT_KNOWN(id, nm, bs, ts) [id] = {.name = nm, .block_size = bs, .type_size = ts}
/* plain types: vec_dot_type F32 (0), no integer path */
#define QUANT_SUP(id, nm, bs, ts, fn, dotfn)                                              \
    [id] = {.name = nm, .block_size = bs, .type_size = ts, .supported = true,            \
            .dequant = quant_dequant_##fn, .dot = dotfn, .dot_ref = quant_dot_ref_##fn,  \
            .quantize = quant_quantize_##fn}
/* quantised types: also the integer path against vdt activations */
#define QUANT_SUPQ(id, nm, bs, ts, fn, dotfn, vdt, dq8fn)                                 \
    [id] = {.name = nm, .block_size = bs, .type_size = ts, .supported = true,            \
            .dequant = quant_dequant_##fn, .dot = dotfn, .dot_ref = quant_dot_ref_##fn,  \
            .quantize = quant_quantize_##fn, .vec_dot_type = vdt, .dot_q8 = dq8fn##_##fn, \
            .dot_q8_ref = quant_dot_q8_ref_##fn, .dot_q8_cols = dq8fn##_cols_##fn,       \
            .dot_q8_cols_ref = quant_dot_q8_ref_cols_##fn}

/* DQ8: the integer-path kernel family, quant_dot_q8_ref or quant_dot_q8_avx2: the table
 * takes DQ8_<type> and DQ8_cols_<type> (quant_q8.c, quant_q8_avx2.c). */
#define QUANT_TABLE(DOT_F32, DOT_F16, DOT_BF16, DOT_Q8_0, DOT_Q4_K, DOT_Q5_K, DOT_Q6_K, DQ8)   \
    {                                                                                      \
        QUANT_SUP(0, "f32", 1, 4, f32, DOT_F32),                                           \
        QUANT_SUP(1, "f16", 1, 2, f16, DOT_F16),                                           \
        QUANT_KNOWN(2, "q4_0", 32, 18),                                                    \
        QUANT_KNOWN(3, "q4_1", 32, 20),                                                    \
        QUANT_KNOWN(6, "q5_0", 32, 22),                                                    \
        QUANT_KNOWN(7, "q5_1", 32, 24),                                                    \
        QUANT_SUPQ(8, "q8_0", 32, 34, q8_0, DOT_Q8_0, GGML_TYPE_Q8_0, DQ8),                \
        QUANT_KNOWN(9, "q8_1", 32, 36),                                                    \
        QUANT_KNOWN(10, "q2_K", 256, 84),                                                  \
        QUANT_KNOWN(11, "q3_K", 256, 110),                                                 \
        QUANT_SUPQ(12, "q4_K", 256, 144, q4_K, DOT_Q4_K, GGML_TYPE_Q8_K, DQ8),             \
        QUANT_SUPQ(13, "q5_K", 256, 176, q5_K, DOT_Q5_K, GGML_TYPE_Q8_K, DQ8),             \
        QUANT_SUPQ(14, "q6_K", 256, 210, q6_K, DOT_Q6_K, GGML_TYPE_Q8_K, DQ8),             \
        QUANT_KNOWN(15, "q8_K", 256, 292),                                                 \
        QUANT_KNOWN(16, "iq2_xxs", 256, 66),                                               \
        QUANT_KNOWN(17, "iq2_xs", 256, 74),                                                \
        QUANT_KNOWN(18, "iq3_xxs", 256, 98),                                               \
        QUANT_KNOWN(19, "iq1_s", 256, 50),                                                 \
        QUANT_KNOWN(20, "iq4_nl", 32, 18),                                                 \
        QUANT_KNOWN(21, "iq3_s", 256, 110),                                                \
        QUANT_KNOWN(22, "iq2_s", 256, 82),                                                 \
        QUANT_KNOWN(23, "iq4_xs", 256, 136),                                               \
        QUANT_KNOWN(24, "i8", 1, 1),                                                       \
        QUANT_KNOWN(25, "i16", 1, 2),                                                      \
        QUANT_KNOWN(26, "i32", 1, 4),                                                      \
        QUANT_KNOWN(27, "i64", 1, 8),                                                      \
        QUANT_KNOWN(28, "f64", 1, 8),                                                      \
        QUANT_KNOWN(29, "iq1_m", 256, 56),                                                 \
        QUANT_SUP(30, "bf16", 1, 2, bf16, DOT_BF16),                                       \
        QUANT_KNOWN(34, "tq1_0", 256, 54),                                                 \
        QUANT_KNOWN(35, "tq2_0", 256, 66),                                                 \
        QUANT_KNOWN(39, "mxfp4", 32, 17),                                                  \
    }

static const quant_traits quant_table_ref[GGML_TYPE_MAX_ID] =
    QUANT_TABLE(quant_dot_ref_f32, quant_dot_ref_f16, quant_dot_ref_bf16, quant_dot_ref_q8_0,
                quant_dot_ref_q4_K, quant_dot_ref_q5_K, quant_dot_ref_q6_K, quant_dot_q8_ref);

#if QUANT_HAVE_AVX2
static const quant_traits quant_table_avx2[GGML_TYPE_MAX_ID] =
    QUANT_TABLE(quant_dot_avx2_f32, quant_dot_avx2_f16, quant_dot_avx2_bf16, quant_dot_avx2_q8_0,
                quant_dot_avx2_q4_K, quant_dot_avx2_q5_K, quant_dot_avx2_q6_K, quant_dot_q8_avx2);
#endif

bool quant_cpu_has_avx2(void) {
#if QUANT_HAVE_AVX2
    /* __builtin_cpu_supports reads libgcc's cpu model, filled by a constructor; calling
     * __builtin_cpu_init first makes this safe from other constructors too. */
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return false;
#endif
}

const quant_traits *quant_get(uint32_t type) {
    if (type >= GGML_TYPE_MAX_ID) return NULL;
    const quant_traits *t = &quant_table_ref[type];
#if QUANT_HAVE_AVX2
    if (quant_cpu_has_avx2()) t = &quant_table_avx2[type];
#endif
    return t->name ? t : NULL;
}

const quant_traits *quant_get_ref(uint32_t type) {
    if (type >= GGML_TYPE_MAX_ID) return NULL;
    const quant_traits *t = &quant_table_ref[type];
    return t->name ? t : NULL;
}

uint64_t quant_row_bytes(uint32_t type, uint64_t n) {
    const quant_traits *t = quant_get(type);
    if (!t || n % t->block_size != 0) return 0;
    return n / t->block_size * t->type_size;
}

/* ---- matvec ----------------------------------------------------------------------------- */

void quant_matvec(uint32_t type, const void *w, uint64_t row_bytes, int64_t n_in,
                  const float *x, float *y, int64_t row_begin, int64_t row_end) {
    const quant_traits *t = quant_get(type);
    DS_ASSERT(t && t->supported);
    DS_ASSERT(n_in % t->block_size == 0);
    DS_ASSERT(row_bytes >= (uint64_t)(n_in / t->block_size) * t->type_size);
#if QUANT_HAVE_AVX2
    if (t->dot != t->dot_ref && quant_matvec_avx2(type, w, row_bytes, n_in, x, y, row_begin,
                                                   row_end))
        return;
#endif
    const uint8_t *base = w;
    for (int64_t r = row_begin; r < row_end; r++) y[r] = t->dot(base + (uint64_t)r * row_bytes, x, n_in);
}
