/* The integer path, scalar references: activation quantisers (Q8_K, Q8_0) and the integer
 * dots of Q4_K / Q5_K / Q6_K rows against Q8_K activations and of Q8_0 rows against Q8_0
 * activations, with the dispatching entry points (quant_quantize_act, quant_matvec_q8).
 *
 * The math is ggml's (ggml-quants.c quantize_row_q8_K_ref, ggml_vec_dot_q4_K_q8_K & co.):
 *   Q4_K/Q5_K: dot = sum_blocks  fp16(d)*x.d * sum_j sc_j * sum_{i in sub-block j} q_i*xq_i
 *                              - fp16(dmin)*x.d * sum_j m_j * (sum of xq over sub-block j)
 *              the second sum from the activation's bsums;
 *   Q6_K:      dot = sum_blocks fp16(d)*x.d * sum_s sc_s * sum_{i in 16-group s} (q_i-32)*xq_i;
 *   Q8_0:      dot = sum_blocks fp16(w.d)*fp16(x.d) * sum_i qw_i*qx_i.
 * The float part is laid out as the AVX2 kernels (quant_q8_avx2.c) compute it, so the two are
 * bit-identical: integer lane l (0..7) of a block holds the terms of the elements whose index
 * mod 32 lies in [4l, 4l+4) (that is what maddubs + madd produce on 32-byte vectors; Q6_K's
 * -32 offset enters lane l as -32 * the scaled bsums of 16-groups 2l and 2l+1); each
 * lane is converted to float, multiplied by the block's scale and added to float lane l; the
 * K-quant mins go to 4 float lanes (lane k: sub-blocks 2k, 2k+1); the lanes are summed at the
 * end in the order of the AVX2 horizontal sums. No FMA on either side (plain C11 does not
 * contract, and the AVX2 code multiplies and adds separately). */
#include <math.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "gguf/quant_impl.h"

/* Round half to even, as ggml's nearest_int (valid for |v| <= 4194303). */
static inline int quant_q8_nearest_int(float v) {
    float f = v + 12582912.f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* ---- activation quantisers -------------------------------------------------------------- */

void quant_quantize_row_q8_K_ref(const float *x, block_q8_K *y, int64_t n) {
    DS_ASSERT(n % QK_K == 0);
    for (int64_t i = 0; i < n / QK_K; i++, x += QK_K) {
        float amax = 0, max = 0;
        bool finite = true;
        for (int j = 0; j < QK_K; j++) {
            const float ax = fabsf(x[j]);
            finite &= ax <= 3.40282347e38f; /* false for inf and NaN */
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        memset(y[i].qs, 0, sizeof y[i].qs);
        memset(y[i].bsums, 0, sizeof y[i].bsums);
        if (!finite) {
            y[i].d = NAN;
            continue;
        }
        const float iscale = -127.f / max;
        if (amax == 0 || !(fabsf(iscale) <= 3.40282347e38f)) { /* zero, or below ~3.7e-37 */
            y[i].d = 0;
            continue;
        }
        for (int j = 0; j < QK_K; j++) {
            const int v = quant_q8_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)sum;
        }
        y[i].d = 1 / iscale;
    }
}

void quant_quantize_row_q8_0_ref(const float *x, block_q8_0 *y, int64_t n) {
    DS_ASSERT(n % QK8_0 == 0);
    for (int64_t i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float amax = 0;
        bool finite = true;
        for (int j = 0; j < QK8_0; j++) {
            const float ax = fabsf(x[j]);
            finite &= ax <= 3.40282347e38f;
            if (ax > amax) amax = ax;
        }
        memset(y[i].qs, 0, sizeof y[i].qs);
        if (!finite) {
            y[i].d = quant_f32_to_f16(NAN);
            continue;
        }
        const float d = amax / 127.f;
        float id = amax != 0 ? 127.f / amax : 0.f;
        if (!(id <= 3.40282347e38f)) id = 0; /* amax below ~3.7e-37: zero levels */
        y[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) y[i].qs[j] = (int8_t)quant_q8_nearest_int(x[j] * id);
    }
}

void quant_quantize_row_q8_K(const float *x, block_q8_K *y, int64_t n) {
#if QUANT_HAVE_AVX2
    if (quant_cpu_has_avx2()) {
        quant_quantize_row_q8_K_avx2(x, y, n);
        return;
    }
#endif
    quant_quantize_row_q8_K_ref(x, y, n);
}

void quant_quantize_row_q8_0(const float *x, block_q8_0 *y, int64_t n) {
#if QUANT_HAVE_AVX2
    if (quant_cpu_has_avx2()) {
        quant_quantize_row_q8_0_avx2(x, y, n);
        return;
    }
#endif
    quant_quantize_row_q8_0_ref(x, y, n);
}

uint64_t quant_act_bytes(uint32_t type, int64_t n) {
    const quant_traits *t = quant_get(type);
    if (!t || !t->dot_q8 || n < 0) return 0;
    if (t->vec_dot_type == GGML_TYPE_Q8_K)
        return n % QK_K ? 0 : (uint64_t)(n / QK_K) * sizeof(block_q8_K);
    return n % QK8_0 ? 0 : (uint64_t)(n / QK8_0) * sizeof(block_q8_0);
}

void quant_quantize_act(uint32_t type, const float *x, void *xq, int64_t n) {
    const quant_traits *t = quant_get(type);
    DS_ASSERT(t && t->dot_q8);
    if (t->vec_dot_type == GGML_TYPE_Q8_K) quant_quantize_row_q8_K(x, xq, n);
    else quant_quantize_row_q8_0(x, xq, n);
}

/* ---- integer dots (scalar references) --------------------------------------------------- */

float quant_dot_q8_ref_q8_0(const void *row, const void *xq, int64_t n) {
    const block_q8_0 *w = row, *x = xq;
    float acc[2][8] = {{0}};
    for (int64_t b = 0; b < n / QK8_0; b++) {
        const float dd = quant_f16_to_f32(w[b].d) * quant_f16_to_f32(x[b].d);
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int k = 0; k < 4; k++) s += w[b].qs[4 * l + k] * x[b].qs[4 * l + k];
            acc[b & 1][l] = acc[b & 1][l] + dd * (float)s;
        }
    }
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = acc[0][l] + acc[1][l];
    return quant_hsum8_order(t);
}

/* Q4_K / Q5_K: level of element e (0..255) of a block. */
static inline int quant_q45_level(const uint8_t *qs, const uint8_t *qh, int e) {
    const uint8_t byte = qs[32 * (e / 64) + e % 32];
    int q = (e % 64) < 32 ? byte & 0xF : byte >> 4;
    if (qh) q |= ((qh[e % 32] >> (e / 32)) & 1) << 4;
    return q;
}

static float quant_dot_q8_ref_k45(const uint8_t *row, const block_q8_K *x, int64_t n, int q5) {
    const size_t bsize = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    float acc[8] = {0}, accm[4] = {0};
    for (int64_t b = 0; b < n / QK_K; b++, row += bsize) {
        ggml_half hd, hdmin;
        memcpy(&hd, row, 2);
        memcpy(&hdmin, row + 2, 2);
        const uint8_t *scales = row + 4;
        const uint8_t *qh = q5 ? row + 16 : NULL;
        const uint8_t *qs = row + 16 + (q5 ? 32 : 0);
        uint8_t sc[8], m[8];
        for (int j = 0; j < 8; j++) qb_scale_min_k4(j, scales, &sc[j], &m[j]);
        int32_t isum[8] = {0};
        for (int e = 0; e < QK_K; e++)
            isum[(e % 32) / 4] += sc[e / 32] * quant_q45_level(qs, qh, e) * x[b].qs[e];
        const int16_t *bs = x[b].bsums;
        int32_t imin[4];
        for (int k = 0; k < 4; k++)
            imin[k] = m[2 * k] * (bs[4 * k] + bs[4 * k + 1]) + m[2 * k + 1] * (bs[4 * k + 2] + bs[4 * k + 3]);
        const float dd = quant_f16_to_f32(hd) * x[b].d;
        const float dm = quant_f16_to_f32(hdmin) * x[b].d;
        for (int l = 0; l < 8; l++) acc[l] = acc[l] + dd * (float)isum[l];
        for (int k = 0; k < 4; k++) accm[k] = accm[k] + dm * (float)imin[k];
    }
    return quant_hsum8_order(acc) - quant_hsum4_order(accm);
}

float quant_dot_q8_ref_q4_K(const void *row, const void *xq, int64_t n) {
    return quant_dot_q8_ref_k45(row, xq, n, 0);
}

float quant_dot_q8_ref_q5_K(const void *row, const void *xq, int64_t n) {
    return quant_dot_q8_ref_k45(row, xq, n, 1);
}

float quant_dot_q8_ref_q6_K(const void *row, const void *xq, int64_t n) {
    const block_q6_K *w = row;
    const block_q8_K *x = xq;
    float acc[8] = {0};
    for (int64_t b = 0; b < n / QK_K; b++) {
        /* the levels 0..63 times x; the -32 offset from the bsums: lane l takes
         * -32 * (sc[2l] * bsums[2l] + sc[2l+1] * bsums[2l+1]) */
        int32_t isum[8];
        for (int l = 0; l < 8; l++)
            isum[l] = -32 * (w[b].scales[2 * l] * x[b].bsums[2 * l] + w[b].scales[2 * l + 1] * x[b].bsums[2 * l + 1]);
        for (int e = 0; e < QK_K; e++) {
            /* docs/QWEN35.md §5.2: half h, l = e % 32, quarter q = (e % 128) / 32 */
            const int h = e / 128, q = (e % 128) / 32, l = e % 32;
            const uint8_t lb = w[b].ql[64 * h + l + (q & 1) * 32];
            const int lo = (q >> 1) ? lb >> 4 : lb & 0xF;
            const int hi = (w[b].qh[32 * h + l] >> (2 * q)) & 3;
            isum[l / 4] += w[b].scales[e / 16] * (lo | hi << 4) * x[b].qs[e];
        }
        const float dd = quant_f16_to_f32(w[b].d) * x[b].d;
        for (int l = 0; l < 8; l++) acc[l] = acc[l] + dd * (float)isum[l];
    }
    return quant_hsum8_order(acc);
}

/* nc columns: the single-column reference per column. */
#define QUANT_Q8_REF_COLS(name)                                                                    \
    void quant_dot_q8_ref_cols_##name(const void *row, const void *xq, uint64_t stride, int nc,   \
                                      int64_t n, float *out) {                                    \
        for (int c = 0; c < nc; c++) out[c] = quant_dot_q8_ref_##name(row, (const uint8_t *)xq + c * stride, n); \
    }
QUANT_Q8_REF_COLS(q8_0)
QUANT_Q8_REF_COLS(q4_K)
QUANT_Q8_REF_COLS(q5_K)
QUANT_Q8_REF_COLS(q6_K)

/* ---- matvec ----------------------------------------------------------------------------- */

void quant_matvec_q8(uint32_t type, const void *w, uint64_t row_bytes, int64_t n_in,
                     const void *xq, float *y, int64_t row_begin, int64_t row_end) {
    const quant_traits *t = quant_get(type);
    DS_ASSERT(t && t->dot_q8);
    DS_ASSERT(n_in % t->block_size == 0 && quant_act_bytes(type, n_in) > 0);
    DS_ASSERT(row_bytes >= (uint64_t)(n_in / t->block_size) * t->type_size);
    const uint8_t *base = w;
    const quant_dot_q8_fn dot = t->dot_q8;
    /* the whole row about 1 KiB ahead is prefetched at once (kernels/cpu/matmul.c measured it) */
    const uint64_t used = (uint64_t)(n_in / t->block_size) * t->type_size;
    const int64_t pd = row_bytes >= 1024 ? 1 : (int64_t)((1024 + row_bytes - 1) / row_bytes);
    for (int64_t r = row_begin; r < row_end; r++) {
        if (r + pd < row_end)
            for (uint64_t o = 0; o < used; o += 64) __builtin_prefetch(base + (uint64_t)(r + pd) * row_bytes + o, 0, 3);
        y[r] = dot(base + (uint64_t)r * row_bytes, xq, n_in);
    }
}
