/* The integer path, AVX2: activation quantisers and integer dots, bit-identical to the scalar
 * references in quant_q8.c (the lane layout they mirror is described there). Compiled for
 * avx2/fma/f16c by attribute; quant_get() hands them out only when the CPU has those.
 *
 * Per block of weights the levels are unpacked with byte operations (nibbles, high bits),
 * multiplied with the int8 activation by vpmaddubsw (unsigned level x signed activation ->
 * int16 pair sums, which cannot saturate for levels < 64 and activations in [-127, 127]),
 * widened and weighted by the sub-block scale in one vpmaddwd, and summed in int32 lanes; one
 * convert, multiply and add per block moves the integer sums to float. The K-quant mins use the
 * activation's precomputed bsums (8 sub-block sums x 8 mins by one vpmaddwd). */
#include <string.h>

#include "gguf/quant.h"
#include "gguf/quant_impl.h"

#if QUANT_HAVE_AVX2

#include <immintrin.h>

#define QUANT_AVX2 __attribute__((target("avx2,fma,f16c")))

/* Same prefetch distance as the float kernels (quant_avx2.c, measured in docs/BENCH.md); for
 * these kernels distances 0..16384 and hints T0/T1/T2/NTA measured alike (docs/BENCH.md). */
#ifndef QUANT_PREFETCH_DISTANCE
#define QUANT_PREFETCH_DISTANCE 1024
#endif

static inline void quant_q8_prefetch(const void *p, size_t bytes) {
    if (QUANT_PREFETCH_DISTANCE <= 0) return;
    const char *c = (const char *)p + QUANT_PREFETCH_DISTANCE;
    for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(c + o, _MM_HINT_T0);
}

/* ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)): quant_hsum8_order */
QUANT_AVX2 static inline float quant_q8_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* (a0+a2) + (a1+a3): quant_hsum4_order */
QUANT_AVX2 static inline float quant_q8_hsum4(__m128 s) {
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QUANT_AVX2 static inline float quant_q8_h2f(ggml_half h) { return _cvtsh_ss(h); }

/* ---- activation quantisers -------------------------------------------------------------- */

/* max |x| over n (multiple of 8) floats, and whether all are finite. */
QUANT_AVX2 static inline float quant_q8_amax(const float *x, int n, int *finite) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 big = _mm256_set1_ps(3.40282347e38f);
    __m256 m = _mm256_setzero_ps();
    __m256 bad = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + j), absmask);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ)); /* inf or NaN */
        m = _mm256_max_ps(m, a);
    }
    *finite = _mm256_movemask_ps(bad) == 0;
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 int32 lanes (4 vectors, in element order) -> 32 int8 (saturating; values are in range). */
QUANT_AVX2 static inline __m256i quant_q8_pack32(__m256i v0, __m256i v1, __m256i v2, __m256i v3) {
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v0, v1), _mm256_packs_epi32(v2, v3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

QUANT_AVX2 void quant_quantize_row_q8_K_avx2(const float *x, block_q8_K *y, int64_t n) {
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        int finite;
        const float amax = quant_q8_amax(x, QK_K, &finite);
        if (!finite || amax == 0) {
            memset(y[i].qs, 0, sizeof y[i].qs);
            memset(y[i].bsums, 0, sizeof y[i].bsums);
            y[i].d = finite ? 0.0f : __builtin_nanf("");
            continue;
        }
        /* the first element with |x| == amax gives the sign (as the scalar scan) */
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
        const __m256 va = _mm256_set1_ps(amax);
        float max = 0;
        for (int j = 0; j < QK_K; j += 8) {
            int mask = _mm256_movemask_ps(
                _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), va, _CMP_EQ_OQ));
            if (mask) {
                max = x[j + __builtin_ctz((unsigned)mask)];
                break;
            }
        }
        const float iscale = -127.f / max;
        if (!(__builtin_fabsf(iscale) <= 3.40282347e38f)) { /* as the reference: zero block */
            memset(y[i].qs, 0, sizeof y[i].qs);
            memset(y[i].bsums, 0, sizeof y[i].bsums);
            y[i].d = 0.0f;
            continue;
        }
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i c127 = _mm256_set1_epi32(127);
        __m256i sums[8]; /* per 32 elements: int32 lanes summing pairs of 16-groups */
        for (int g = 0; g < QK_K / 32; g++) {
            __m256i v[4];
            for (int k = 0; k < 4; k++) {
                /* cvtps rounds half to even under the default MXCSR, like nearest_int */
                v[k] = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 32 * g + 8 * k))), c127);
            }
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * g), quant_q8_pack32(v[0], v[1], v[2], v[3]));
            /* 16-group 2g = elements 32g..32g+15 = v0 + v1; group 2g+1 = v2 + v3 */
            sums[g] = _mm256_hadd_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
            /* sums[g] = [a01 a23 b01 b23 | a45 a67 b45 b67] with a = group 2g, b = group 2g+1 */
        }
        /* per g: group 2g = lanes 0,1,4,5; group 2g+1 = lanes 2,3,6,7 */
        const __m256i h01 = _mm256_hadd_epi32(sums[0], sums[1]); /* [a0 b0 a1 b1 | a0' b0' a1' b1'] */
        const __m256i h23 = _mm256_hadd_epi32(sums[2], sums[3]);
        const __m256i h45 = _mm256_hadd_epi32(sums[4], sums[5]);
        const __m256i h67 = _mm256_hadd_epi32(sums[6], sums[7]);
        /* lane-wise: low half + high half gives the group sums of 4 16-groups per h */
        const __m256i lo = _mm256_permute2x128_si256(h01, h23, 0x20);
        const __m256i hi = _mm256_permute2x128_si256(h01, h23, 0x31);
        const __m256i lo2 = _mm256_permute2x128_si256(h45, h67, 0x20);
        const __m256i hi2 = _mm256_permute2x128_si256(h45, h67, 0x31);
        const __m256i b03 = _mm256_add_epi32(lo, hi);   /* bsums 0..7 */
        const __m256i b47 = _mm256_add_epi32(lo2, hi2); /* bsums 8..15 */
        const __m256i b16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(b03, b47), 0xD8);
        _mm256_storeu_si256((__m256i *)y[i].bsums, b16);
        y[i].d = 1 / iscale;
    }
}

QUANT_AVX2 void quant_quantize_row_q8_0_avx2(const float *x, block_q8_0 *y, int64_t n) {
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        int finite;
        const float amax = quant_q8_amax(x, QK8_0, &finite);
        if (!finite) {
            memset(y[i].qs, 0, sizeof y[i].qs);
            y[i].d = quant_f32_to_f16(__builtin_nanf(""));
            continue;
        }
        const float d = amax / 127.f;
        float id = amax != 0 ? 127.f / amax : 0.f;
        if (!(id <= 3.40282347e38f)) id = 0; /* amax below ~3.7e-37: zero levels */
        y[i].d = quant_f32_to_f16(d);
        const __m256 vs = _mm256_set1_ps(id);
        __m256i v[4];
        for (int k = 0; k < 4; k++) v[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vs));
        _mm256_storeu_si256((__m256i *)y[i].qs, quant_q8_pack32(v[0], v[1], v[2], v[3]));
    }
}

/* ---- the dots: one weight row against NC (1..4) activation rows ------------------------
 * Each kernel is written once for NC columns (a compile-time constant after inlining): the
 * row's levels are unpacked once and multiplied with every column, and column c gets exactly
 * the operations the NC = 1 kernel performs, so dot_q8_cols == dot_q8 per column bit for bit.
 * Column c's blocks start at xq + c * stride bytes. */

#define QUANT_Q8_INLINE QUANT_AVX2 static inline __attribute__((always_inline))
/* The column, group and quarter loops must be unrolled for the accumulators to live in
 * registers (GCC does not unroll them at -O2 by itself). */
#define QUANT_UNROLL _Pragma("GCC unroll 8")

/* ---- Q8_0 x Q8_0 ------------------------------------------------------------------------ */

QUANT_Q8_INLINE void quant_q8_0_cols(const block_q8_0 *w, const uint8_t *xq, uint64_t stride,
                                     int64_t n, const int NC, float *out) {
    const int64_t nb = n / QK8_0;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc0[QUANT_Q8_MAX_COLS], acc1[QUANT_Q8_MAX_COLS];
    QUANT_UNROLL
    for (int c = 0; c < NC; c++) acc0[c] = acc1[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b += 2) {
        quant_q8_prefetch(w + b, 2 * sizeof(block_q8_0));
        const int two = b + 1 < nb; /* block b goes to acc0, block b+1 to acc1 */
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)w[b].qs);
        const __m256i a0 = _mm256_sign_epi8(w0, w0);
        const float fw0 = quant_q8_h2f(w[b].d);
        const __m256i w1 = two ? _mm256_loadu_si256((const __m256i *)w[b + 1].qs) : w0;
        const __m256i a1 = _mm256_sign_epi8(w1, w1);
        const float fw1 = two ? quant_q8_h2f(w[b + 1].d) : 0.0f;
        QUANT_UNROLL
        for (int c = 0; c < NC; c++) {
            const block_q8_0 *x = (const block_q8_0 *)(xq + c * stride) + b;
            const __m256i s0 = _mm256_madd_epi16(
                _mm256_maddubs_epi16(a0, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x[0].qs), w0)), ones);
            acc0[c] = _mm256_add_ps(acc0[c], _mm256_mul_ps(_mm256_set1_ps(fw0 * quant_q8_h2f(x[0].d)),
                                                           _mm256_cvtepi32_ps(s0)));
            if (two) {
                const __m256i s1 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(a1, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x[1].qs), w1)), ones);
                acc1[c] = _mm256_add_ps(acc1[c], _mm256_mul_ps(_mm256_set1_ps(fw1 * quant_q8_h2f(x[1].d)),
                                                               _mm256_cvtepi32_ps(s1)));
            }
        }
    }
    QUANT_UNROLL
    for (int c = 0; c < NC; c++) out[c] = quant_q8_hsum8(_mm256_add_ps(acc0[c], acc1[c]));
}

/* ---- Q4_K / Q5_K x Q8_K ----------------------------------------------------------------- */

/* Shuffle mask broadcasting int16 lane s (0..7) of each 128-bit half to all its lanes. */
QUANT_AVX2 static inline __m256i quant_q8_bcast16_mask(int s) {
    return _mm256_set1_epi16((short)((2 * s) | ((2 * s + 1) << 8)));
}

/* Per block: mins lane k = m[2k] * S[2k] + m[2k+1] * S[2k+1] with S[s] = bsums[2s] +
 * bsums[2s+1] (one vpmaddwd); levels lane l as described in quant_q8.c. */
QUANT_Q8_INLINE void quant_q8_k45_cols(const uint8_t *row, const uint8_t *xq, uint64_t stride,
                                       int64_t n, const int q5, const int NC, float *out) {
    const size_t bsize = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const __m256i m4 = _mm256_set1_epi8(0xF), m16 = _mm256_set1_epi8(0x10);
    __m256 acc[QUANT_Q8_MAX_COLS];
    __m128 accm[QUANT_Q8_MAX_COLS];
    QUANT_UNROLL
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps(), accm[c] = _mm_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++, row += bsize) {
        quant_q8_prefetch(row, bsize);
        ggml_half hd, hdmin;
        memcpy(&hd, row, 2);
        memcpy(&hdmin, row + 2, 2);
        const float fd = quant_q8_h2f(hd), fdmin = quant_q8_h2f(hdmin);
        uint8_t sm[16];
        quant_unpack_k4_scales(row + 4, sm);
        const __m256i sm16 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)sm));
        const __m128i mins = _mm256_extracti128_si256(sm16, 1);
        const block_q8_K *x[QUANT_Q8_MAX_COLS];
        QUANT_UNROLL
        for (int c = 0; c < NC; c++) {
            x[c] = (const block_q8_K *)(xq + c * stride) + b;
            const __m256i bs = _mm256_loadu_si256((const __m256i *)x[c]->bsums);
            const __m128i s8 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
            const __m128i prodm = _mm_madd_epi16(mins, s8);
            accm[c] = _mm_add_ps(accm[c], _mm_mul_ps(_mm_set1_ps(fdmin * x[c]->d), _mm_cvtepi32_ps(prodm)));
        }
        const __m256i sc = _mm256_permute2x128_si256(sm16, sm16, 0x00); /* scales, both halves */
        const uint8_t *qs = row + 16 + (q5 ? 32 : 0);
        __m256i hb = q5 ? _mm256_loadu_si256((const __m256i *)(row + 16)) : _mm256_setzero_si256();
        __m256i sumi[QUANT_Q8_MAX_COLS];
        QUANT_UNROLL
        for (int c = 0; c < NC; c++) sumi[c] = _mm256_setzero_si256();
        QUANT_UNROLL
        for (int g = 0; g < 4; g++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
            __m256i lo = _mm256_and_si256(v, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (q5) {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), m16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), m16));
                hb = _mm256_srli_epi16(hb, 2); /* bits shifted in from the next byte are masked */
            }
            const __m256i scl = _mm256_shuffle_epi8(sc, quant_q8_bcast16_mask(2 * g));
            const __m256i sch = _mm256_shuffle_epi8(sc, quant_q8_bcast16_mask(2 * g + 1));
            QUANT_UNROLL
            for (int c = 0; c < NC; c++) {
                const int8_t *q8 = x[c]->qs + 64 * g;
                const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)q8));
                const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 32)));
                sumi[c] = _mm256_add_epi32(sumi[c], _mm256_add_epi32(_mm256_madd_epi16(scl, pl), _mm256_madd_epi16(sch, ph)));
            }
        }
        QUANT_UNROLL
        for (int c = 0; c < NC; c++)
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_set1_ps(fd * x[c]->d), _mm256_cvtepi32_ps(sumi[c])));
    }
    QUANT_UNROLL
    for (int c = 0; c < NC; c++) out[c] = quant_q8_hsum8(acc[c]) - quant_q8_hsum4(accm[c]);
}

/* ---- Q6_K x Q8_K ------------------------------------------------------------------------
 * Per 128-weight half h, with l = 0..31 the bytes of 32-wide vectors (docs/QWEN35.md §5.2):
 *   q1 (weights l)    = (ql[l]    & 15) | (qh[l] & 3) << 4
 *   q2 (weights l+32) = (ql[l+32] & 15) | (qh[l] >> 2 & 3) << 4
 *   q3 (weights l+64) = (ql[l]    >> 4) | (qh[l] >> 4 & 3) << 4
 *   q4 (weights l+96) = (ql[l+32] >> 4) | (qh[l] >> 6) << 4
 * The levels 0..63 go into maddubs unsigned; the -32 offset is applied once per block from
 * the activation's bsums: lane l -= 32 * (sc[2l] bsums[2l] + sc[2l+1] bsums[2l+1]). */
QUANT_Q8_INLINE void quant_q8_q6_K_cols(const block_q6_K *w, const uint8_t *xq, uint64_t stride,
                                        int64_t n, const int NC, float *out) {
    const __m256i m4 = _mm256_set1_epi8(0xF), m30 = _mm256_set1_epi8(0x30);
    /* quarter k of a half: scale 2k in the low 128-bit half, 2k+1 in the high one */
    const __m256i shuf[4] = {
        _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3),
        _mm256_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7),
        _mm256_setr_epi8(8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11),
        _mm256_setr_epi8(12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15),
    };
    __m256 acc[QUANT_Q8_MAX_COLS];
    QUANT_UNROLL
    for (int c = 0; c < NC; c++) acc[c] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; b++) {
        quant_q8_prefetch(w + b, sizeof(block_q6_K));
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[b].scales));
        const block_q8_K *x[QUANT_Q8_MAX_COLS];
        __m256i sumi[QUANT_Q8_MAX_COLS];
        QUANT_UNROLL
        for (int c = 0; c < NC; c++) {
            x[c] = (const block_q8_K *)(xq + c * stride) + b;
            const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)x[c]->bsums));
            sumi[c] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
        }
        QUANT_UNROLL
        for (int h = 0; h < 2; h++) {
            /* scales 8h..8h+7 as int16 in both halves */
            const __m256i sc = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                                 : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            const __m256i a = _mm256_loadu_si256((const __m256i *)(w[b].ql + 64 * h));
            const __m256i cc = _mm256_loadu_si256((const __m256i *)(w[b].ql + 64 * h + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(w[b].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(cc, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(cc, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30));
            QUANT_UNROLL
            for (int k = 0; k < 4; k++) {
                const __m256i sck = _mm256_shuffle_epi8(sc, shuf[k]);
                QUANT_UNROLL
                for (int c = 0; c < NC; c++) {
                    const __m256i y8 = _mm256_loadu_si256((const __m256i *)(x[c]->qs + 128 * h + 32 * k));
                    sumi[c] = _mm256_add_epi32(sumi[c], _mm256_madd_epi16(sck, _mm256_maddubs_epi16(q[k], y8)));
                }
            }
        }
        const float fd = quant_q8_h2f(w[b].d);
        QUANT_UNROLL
        for (int c = 0; c < NC; c++)
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_set1_ps(fd * x[c]->d), _mm256_cvtepi32_ps(sumi[c])));
    }
    QUANT_UNROLL
    for (int c = 0; c < NC; c++) out[c] = quant_q8_hsum8(acc[c]);
}

/* ---- entry points: NC specialised --------------------------------------------------------- */

#define QUANT_Q8_ENTRY(name, CALL)                                                               \
    QUANT_AVX2 float quant_dot_q8_avx2_##name(const void *row, const void *xq, int64_t n) {     \
        float out[1];                                                                            \
        const uint64_t stride = 0;                                                               \
        const int NC = 1;                                                                        \
        CALL;                                                                                    \
        return out[0];                                                                           \
    }                                                                                            \
    QUANT_AVX2 void quant_dot_q8_avx2_cols_##name(const void *row, const void *xq, uint64_t stride, \
                                                  int nc, int64_t n, float *out) {               \
        switch (nc) {                                                                            \
        case 1: { const int NC = 1; CALL; break; }                                               \
        case 2: { const int NC = 2; CALL; break; }                                               \
        case 3: { const int NC = 3; CALL; break; }                                               \
        default: { const int NC = 4; CALL; break; }                                              \
        }                                                                                        \
    }

QUANT_Q8_ENTRY(q8_0, quant_q8_0_cols(row, xq, stride, n, NC, out))
QUANT_Q8_ENTRY(q4_K, quant_q8_k45_cols(row, xq, stride, n, 0, NC, out))
QUANT_Q8_ENTRY(q5_K, quant_q8_k45_cols(row, xq, stride, n, 1, NC, out))
QUANT_Q8_ENTRY(q6_K, quant_q8_q6_K_cols(row, xq, stride, n, NC, out))

#endif
