/* AVX2 row dequantisation, bit-identical to gguf/quant.c's scalar kernels; see dequant.h. */
#include "kernels/cpu/dequant.h"

#include <immintrin.h>
#include <stdbool.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "gguf/quant_blocks.h"

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_X86 1

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* y[0..8) = (float)(8 unsigned bytes) * d - m  (two roundings, as the scalar d1 * q - m1) */
AVX2 static inline void put8u(float *y, __m128i b8, __m256 d, __m256 m)
{
    __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b8));
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(d, q), m));
}

/* y[0..32) from 32 unsigned bytes with one scale and min */
AVX2 static inline void put32u(float *y, __m256i b, __m256 d, __m256 m)
{
    __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
    put8u(y, lo, d, m);
    put8u(y + 8, _mm_srli_si128(lo, 8), d, m);
    put8u(y + 16, hi, d, m);
    put8u(y + 24, _mm_srli_si128(hi, 8), d, m);
}

/* y[0..8) = s * (float)(8 signed bytes) */
AVX2 static inline void put8s(float *y, __m128i b8, __m256 s)
{
    _mm256_storeu_ps(y, _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8))));
}

AVX2 static void dequant_f16(const void *src, float *dst, int64_t n)
{
    const ggml_half *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) dst[i] = quant_f16_to_f32(s[i]);
}

AVX2 static void dequant_bf16(const void *src, float *dst, int64_t n)
{
    const ggml_bf16 *s = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) dst[i] = quant_bf16_to_f32(s[i]);
}

AVX2 static void dequant_q8_0(const void *src, float *dst, int64_t n)
{
    const block_q8_0 *x = src;
    for (int64_t i = 0; i < n / QK8_0; i++) {
        __m256 d = _mm256_set1_ps(quant_f16_to_f32(x[i].d));
        __m256i q = _mm256_loadu_si256((const __m256i *)x[i].qs);
        __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        float *y = dst + i * QK8_0;
        put8s(y, lo, d);
        put8s(y + 8, _mm_srli_si128(lo, 8), d);
        put8s(y + 16, hi, d);
        put8s(y + 24, _mm_srli_si128(hi, 8), d);
    }
}

AVX2 static void dequant_q4_K(const void *src, float *y, int64_t n)
{
    const block_q4_K *x = src;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const float d = quant_f16_to_f32(x[i].d), min = quant_f16_to_f32(x[i].dmin);
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32, y += 64) {
            uint8_t sc, m;
            qb_scale_min_k4(is, x[i].scales, &sc, &m);
            __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(min * m);
            qb_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(min * m);
            __m256i b = _mm256_loadu_si256((const __m256i *)q);
            put32u(y, _mm256_and_si256(b, m4), d1, m1);
            put32u(y + 32, _mm256_and_si256(_mm256_srli_epi16(b, 4), m4), d2, m2);
        }
    }
}

AVX2 static void dequant_q5_K(const void *src, float *y, int64_t n)
{
    const block_q5_K *x = src;
    const __m256i m4 = _mm256_set1_epi8(0x0F), zero = _mm256_setzero_si256();
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *ql = x[i].qs;
        __m256i qh = _mm256_loadu_si256((const __m256i *)x[i].qh);
        const float d = quant_f16_to_f32(x[i].d), min = quant_f16_to_f32(x[i].dmin);
        for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32, y += 64) {
            uint8_t sc, m;
            qb_scale_min_k4(is, x[i].scales, &sc, &m);
            __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(min * m);
            qb_scale_min_k4(is + 1, x[i].scales, &sc, &m);
            __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(min * m);
            __m256i u1 = _mm256_set1_epi8((char)(1 << (2 * (j / 64))));
            __m256i u2 = _mm256_set1_epi8((char)(2 << (2 * (j / 64))));
            /* 16 where qh & u is set */
            __m256i h1 = _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u1), zero), sixteen);
            __m256i h2 = _mm256_andnot_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, u2), zero), sixteen);
            __m256i b = _mm256_loadu_si256((const __m256i *)ql);
            put32u(y, _mm256_add_epi8(_mm256_and_si256(b, m4), h1), d1, m1);
            put32u(y + 32, _mm256_add_epi8(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4), h2), d2, m2);
        }
    }
}

/* 32 signed values (bytes of v) with scale s0 for the first 16 and s1 for the last 16 */
AVX2 static inline void put32s2(float *y, __m256i v, __m256 s0, __m256 s1)
{
    __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    put8s(y, lo, s0);
    put8s(y + 8, _mm_srli_si128(lo, 8), s0);
    put8s(y + 16, hi, s1);
    put8s(y + 24, _mm_srli_si128(hi, 8), s1);
}

AVX2 static void dequant_q6_K(const void *src, float *y, int64_t n)
{
    const block_q6_K *x = src;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = quant_f16_to_f32(x[i].d);
        const uint8_t *ql = x[i].ql, *qh = x[i].qh;
        const int8_t *sc = x[i].scales;
        for (int k = 0; k < QK_K; k += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            __m256i a = _mm256_loadu_si256((const __m256i *)ql);
            __m256i b = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q1 = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            __m256i q2 = _mm256_or_si256(_mm256_and_si256(b, m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
            __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
            __m256i q4 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), m4),
                                         _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
            __m256 s[8];
            for (int t = 0; t < 8; t++) s[t] = _mm256_set1_ps(d * sc[t]);
            put32s2(y, _mm256_sub_epi8(q1, off), s[0], s[1]);
            put32s2(y + 32, _mm256_sub_epi8(q2, off), s[2], s[3]);
            put32s2(y + 64, _mm256_sub_epi8(q3, off), s[4], s[5]);
            put32s2(y + 96, _mm256_sub_epi8(q4, off), s[6], s[7]);
        }
    }
}
#endif

ref_dequant_fn ref_dequant_get(uint32_t type)
{
    const quant_traits *qt = quant_get(type);
    DS_ASSERT(qt && qt->supported);
#ifdef HAVE_X86
    if (quant_cpu_has_avx2()) {
        switch (type) {
        case GGML_TYPE_F16: return dequant_f16;
        case GGML_TYPE_BF16: return dequant_bf16;
        case GGML_TYPE_Q8_0: return dequant_q8_0;
        case GGML_TYPE_Q4_K: return dequant_q4_K;
        case GGML_TYPE_Q5_K: return dequant_q5_K;
        case GGML_TYPE_Q6_K: return dequant_q6_K;
        default: break;
        }
    }
#endif
    return qt->dequant;
}

void ref_dequant_row(uint32_t type, const void *src, float *dst, int64_t n)
{
    ref_dequant_get(type)(src, dst, n);
}
