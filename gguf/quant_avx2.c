/* AVX2+FMA+F16C dot kernels: a quantised row against an F32 vector, the CPU engine's GEMV
 * hot loop. Every function is compiled for avx2/fma/f16c by attribute, so no global -mavx2
 * is needed; quant_get() only hands them out when the CPU has those features.
 *
 * Each block is decoded to floats in registers (bytes -> int32 lanes -> float) and FMA'd
 * against x; no row buffer (K-quants stage one block of int8 levels, see below). Scales are
 * factored out of the inner sums: per sub-block S_q = sum q*x and S_x = sum x, then
 * d*sc*S_q - dmin*m*S_x. quant_matvec_avx2 precomputes
 * S_x for the whole x once per call (it is shared by all rows), which removes one add per
 * eight weights from the K-quant loops.
 *
 * Results differ from the double-accumulating reference (quant.c) by float rounding only;
 * tests/gguf/quant_test.c bounds the relative error. */
#include <string.h>

#include "gguf/quant.h"
#include "gguf/quant_impl.h"

#if QUANT_HAVE_AVX2

#include <immintrin.h>

#define QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))

QUANT_AVX2 static inline float quant_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QUANT_AVX2 static inline float quant_h2f(ggml_half h) { return _cvtsh_ss(h); }

/* Software prefetch distance in bytes ahead of the block being decoded (0 = none: leave it
 * to the hardware prefetchers). 1024 measured best of 0/512/1024/2048 on weights streamed
 * from DRAM (Q8_0 +55%, Q6_K +50%, Q4_K/Q5_K +10-30%; in-cache speed unchanged): see
 * docs/BENCH.md. Override at compile time to experiment. */
#ifndef QUANT_PREFETCH_DISTANCE
#define QUANT_PREFETCH_DISTANCE 1024
#endif

/* Prefetches the cache lines of [p + D, p + D + bytes). */
static inline void quant_prefetch(const void *p, size_t bytes) {
    if (QUANT_PREFETCH_DISTANCE <= 0) return;
    const char *c = (const char *)p + QUANT_PREFETCH_DISTANCE;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

/* 8 bytes at p, zero- / sign-extended to int32 lanes. */
QUANT_AVX2 static inline __m256i quant_u8x8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}
QUANT_AVX2 static inline __m256i quant_i8x8(const int8_t *p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* ---- plain types ------------------------------------------------------------------------ */

QUANT_AVX2 float quant_dot_avx2_f32(const void *row, const float *x, int64_t n) {
    const float *w = row;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float s = quant_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) s += w[i] * x[i];
    return s;
}

QUANT_AVX2 static inline __m256 quant_load_f16x8(const ggml_half *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

QUANT_AVX2 static inline __m256 quant_load_bf16x8(const ggml_bf16 *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

/* One body for the two 16-bit float types: LOAD turns 8 elements into 8 floats. */
#define QUANT_DOT_HALF(name, T, LOAD, TO_F32)                                               \
    QUANT_AVX2 float quant_dot_avx2_##name(const void *row, const float *x, int64_t n) {    \
        const T *w = row;                                                                   \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                         \
        int64_t i = 0;                                                                      \
        for (; i + 32 <= n; i += 32) {                                                      \
            a0 = _mm256_fmadd_ps(LOAD(w + i), _mm256_loadu_ps(x + i), a0);                 \
            a1 = _mm256_fmadd_ps(LOAD(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);          \
            a2 = _mm256_fmadd_ps(LOAD(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);        \
            a3 = _mm256_fmadd_ps(LOAD(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);        \
        }                                                                                   \
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOAD(w + i), _mm256_loadu_ps(x + i), a0); \
        float s = quant_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));  \
        for (; i < n; i++) s += TO_F32(w[i]) * x[i];                                        \
        return s;                                                                           \
    }
QUANT_DOT_HALF(f16, ggml_half, quant_load_f16x8, quant_h2f)
QUANT_DOT_HALF(bf16, ggml_bf16, quant_load_bf16x8, quant_bf16_to_f32)

/* ---- Q8_0 ------------------------------------------------------------------------------- */

QUANT_AVX2 float quant_dot_avx2_q8_0(const void *row, const float *x, int64_t n) {
    const block_q8_0 *b = row;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        if ((i & 1) == 0) quant_prefetch(b + i, 2 * sizeof(block_q8_0));
        const int8_t *q = b[i].qs;
        __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(quant_i8x8(q)), _mm256_loadu_ps(x));
        __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(quant_i8x8(q + 8)), _mm256_loadu_ps(x + 8));
        s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quant_i8x8(q + 16)), _mm256_loadu_ps(x + 16), s0);
        s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quant_i8x8(q + 24)), _mm256_loadu_ps(x + 24), s1);
        const __m256 d = _mm256_set1_ps(quant_h2f(b[i].d));
        if (i & 1)
            acc1 = _mm256_fmadd_ps(d, _mm256_add_ps(s0, s1), acc1);
        else
            acc0 = _mm256_fmadd_ps(d, _mm256_add_ps(s0, s1), acc0);
    }
    return quant_hsum(_mm256_add_ps(acc0, acc1));
}

/* ---- K-quants ---------------------------------------------------------------------------
 * A block's quants are first expanded with 256-bit byte operations (32 weights per
 * instruction) into one block of int8 levels on the stack, in weight order; then each group
 * of 8 levels is widened to int32 with a load (vpmovzx/sx from memory), converted to float
 * and FMA'd with x. The 256-byte staging is per block and stays in L1; the bit twiddling at
 * byte width costs a quarter of doing it in 32-bit lanes. */

/* sum of x over each 32-element sub-block: xs[j] = sum x[32j .. 32j+31], j < n/32. */
QUANT_AVX2 static void quant_xsum32(const float *x, int64_t n, float *xs) {
    for (int64_t j = 0; j < n / 32; j++, x += 32) {
        __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                                 _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
        xs[j] = quant_hsum(s);
    }
}

/* sum_{k<4} float(q[8k..8k+7]) * x[8k..8k+7] as 8 lanes; q unsigned (U) or signed levels. */
QUANT_AVX2 static inline __m256 quant_dot32_u8(const uint8_t *q, const float *x) {
    __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(quant_u8x8(q)), _mm256_loadu_ps(x));
    __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(quant_u8x8(q + 8)), _mm256_loadu_ps(x + 8));
    s0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quant_u8x8(q + 16)), _mm256_loadu_ps(x + 16), s0);
    s1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(quant_u8x8(q + 24)), _mm256_loadu_ps(x + 24), s1);
    return _mm256_add_ps(s0, s1);
}

QUANT_AVX2 static inline __m256 quant_dot16_i8(const int8_t *q, const float *x) {
    __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(quant_i8x8(q)), _mm256_loadu_ps(x));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(quant_i8x8(q + 8)), _mm256_loadu_ps(x + 8), s0);
}

/* Q4_K and Q5_K share one loop; Q5 selects the 5th bit from qh.
 * Per 64-weight group g: the low nibbles of qs[32g..32g+31] are weights 64g..64g+31 (scale
 * 2g), the high nibbles weights 64g+32.. (scale 2g+1); Q5_K adds 16 when bit 2g (resp.
 * 2g+1) of qh[l] is set. Sub-block j contributes d*sc[j]*S_q(j) - dmin*m[j]*S_x(j).
 * xs: per-sub-block sums of x precomputed for the whole row, or NULL to sum here. */
QUANT_AVX2 static inline float quant_dot_k45(const uint8_t *row, const int q5, const float *x,
                                             const float *xs, int64_t n) {
    const size_t bsize = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const __m256i m4 = _mm256_set1_epi8(0xF), m16 = _mm256_set1_epi8(0x10);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, accm = acc0;
    _Alignas(32) uint8_t lv[QK_K]; /* the block's levels, weight order */
    _Alignas(32) float fsc[16];    /* d*sc[j], then dmin*m[j] */
    for (int64_t i = 0; i < n / QK_K; i++, row += bsize, x += QK_K) {
        quant_prefetch(row, bsize);
        const uint8_t *qs = row + 16 + (q5 ? 32 : 0);
        uint8_t sm[16];
        quant_unpack_k4_scales(row + 4, sm);
        ggml_half hd, hdmin;
        memcpy(&hd, row, 2);
        memcpy(&hdmin, row + 2, 2);
        const __m256 dm = _mm256_mul_ps(_mm256_set1_ps(quant_h2f(hdmin)), _mm256_cvtepi32_ps(quant_u8x8(sm + 8)));
        _mm256_store_ps(fsc, _mm256_mul_ps(_mm256_set1_ps(quant_h2f(hd)), _mm256_cvtepi32_ps(quant_u8x8(sm))));
        _mm256_store_ps(fsc + 8, dm);
        /* levels: lo nibble | bit 2g of qh << 4, hi nibble | bit 2g+1 of qh << 4 */
        __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)(row + 16)) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i lo = _mm256_and_si256(v, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), m16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), m16));
                hb = _mm256_srli_epi16(hb, 2); /* bits shifted in from the next byte are masked */
            }
            _mm256_store_si256((__m256i *)(lv + 64 * g), lo);
            _mm256_store_si256((__m256i *)(lv + 64 * g + 32), hi);
        }
        for (int j = 0; j < 8; j += 2) {
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(fsc + j), quant_dot32_u8(lv + 32 * j, x + 32 * j), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(fsc + j + 1),
                                   quant_dot32_u8(lv + 32 * j + 32, x + 32 * j + 32), acc1);
        }
        if (xs) {
            accm = _mm256_fmadd_ps(dm, _mm256_loadu_ps(xs + 8 * i), accm);
        } else {
            for (int j = 0; j < 8; j++) {
                const float *xj = x + 32 * j;
                __m256 sx = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(xj), _mm256_loadu_ps(xj + 8)),
                                          _mm256_add_ps(_mm256_loadu_ps(xj + 16), _mm256_loadu_ps(xj + 24)));
                accm = _mm256_fmadd_ps(_mm256_broadcast_ss(fsc + 8 + j), sx, accm);
            }
        }
    }
    return quant_hsum(_mm256_sub_ps(_mm256_add_ps(acc0, acc1), accm));
}

QUANT_AVX2 float quant_dot_avx2_q4_K(const void *row, const float *x, int64_t n) {
    return quant_dot_k45(row, 0, x, NULL, n);
}

QUANT_AVX2 float quant_dot_avx2_q5_K(const void *row, const float *x, int64_t n) {
    return quant_dot_k45(row, 1, x, NULL, n);
}

/* Q6_K: per 128-weight half, with l = 0..31 (bytes of 32-wide vectors):
 *   weight l      = (ql[l]    & 15) | (qh[l] & 3) << 4
 *   weight l + 32 = (ql[l+32] & 15) | (qh[l] >> 2 & 3) << 4
 *   weight l + 64 = (ql[l]    >> 4) | (qh[l] >> 4 & 3) << 4
 *   weight l + 96 = (ql[l+32] >> 4) | (qh[l] >> 6) << 4
 * each minus 32; weight w of the block has scale sc[w / 16]. */
QUANT_AVX2 float quant_dot_avx2_q6_K(const void *row, const float *x, int64_t n) {
    const block_q6_K *b = row;
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    const __m256i c32 = _mm256_set1_epi8(32);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    _Alignas(32) int8_t lv[QK_K]; /* the block's levels - 32, weight order */
    _Alignas(32) float fsc[16];   /* d*sc[s] */
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        quant_prefetch(b + i, sizeof(block_q6_K));
        const __m256 d = _mm256_set1_ps(quant_h2f(b[i].d));
        _mm256_store_ps(fsc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(quant_i8x8(b[i].scales))));
        _mm256_store_ps(fsc + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(quant_i8x8(b[i].scales + 8))));
        for (int h = 0; h < 2; h++) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h));
            const __m256i c = _mm256_loadu_si256((const __m256i *)(b[i].ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(b[i].qh + 32 * h));
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, m30));
            __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
            int8_t *o = lv + 128 * h;
            _mm256_store_si256((__m256i *)(o + 0), _mm256_sub_epi8(q1, c32));
            _mm256_store_si256((__m256i *)(o + 32), _mm256_sub_epi8(q2, c32));
            _mm256_store_si256((__m256i *)(o + 64), _mm256_sub_epi8(q3, c32));
            _mm256_store_si256((__m256i *)(o + 96), _mm256_sub_epi8(q4, c32));
        }
        for (int s = 0; s < 16; s += 2) {
            acc0 = _mm256_fmadd_ps(_mm256_broadcast_ss(fsc + s), quant_dot16_i8(lv + 16 * s, x + 16 * s), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_broadcast_ss(fsc + s + 1),
                                   quant_dot16_i8(lv + 16 * s + 16, x + 16 * s + 16), acc1);
        }
    }
    return quant_hsum(_mm256_add_ps(acc0, acc1));
}

/* ---- matvec ----------------------------------------------------------------------------- */

/* Q4_K/Q5_K rows with the sub-block sums of x computed once for all rows. Other types (and
 * rows too long for the stack buffer) return false: the caller loops the plain dot. */
QUANT_AVX2 bool quant_matvec_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t n_in,
                                  const float *x, float *y, int64_t row_begin, int64_t row_end) {
    if (type != GGML_TYPE_Q4_K && type != GGML_TYPE_Q5_K) return false;
    enum { QUANT_XS_MAX = 4096 }; /* n_in up to 131072 */
    if (n_in / 32 > QUANT_XS_MAX) return false;
    float xs[QUANT_XS_MAX]; /* [n_in/32] sums of x per 32-element sub-block */
    quant_xsum32(x, n_in, xs);
    const uint8_t *base = w;
    if (type == GGML_TYPE_Q5_K)
        for (int64_t r = row_begin; r < row_end; r++)
            y[r] = quant_dot_k45(base + (uint64_t)r * row_bytes, 1, x, xs, n_in);
    else
        for (int64_t r = row_begin; r < row_end; r++)
            y[r] = quant_dot_k45(base + (uint64_t)r * row_bytes, 0, x, xs, n_in);
    return true;
}

#endif
