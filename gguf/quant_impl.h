/* Internal to gguf/quant*.c: the per-type kernels the traits table points at.
 * Not for other modules: they go through quant_get(). */
#ifndef DS_GGUF_QUANT_IMPL_H
#define DS_GGUF_QUANT_IMPL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "gguf/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QUANT_HAVE_AVX2 1
#else
#define QUANT_HAVE_AVX2 0
#endif

/* The 12 packed scale bytes of Q4_K/Q5_K -> sc[0..7] in bytes 0..7, m[0..7] in bytes 8..15, all
 * eight sub-blocks at once (ggml's kmask trick; equals qb_scale_min_k4 for j = 0..7): the
 * AVX2 dots' unpacking. */
static inline void quant_unpack_k4_scales(const uint8_t *scales, uint8_t out[16]) {
    const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
    uint32_t u[4];
    memcpy(u, scales, 12);
    u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
    const uint32_t uaux = u[1] & kmask1;
    u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
    u[2] = uaux;
    u[0] &= kmask1;
    memcpy(out, u, 16);
}

/* quant_quantize.c */
void quant_quantize_f32(const float *src, void *dst, int64_t n);
void quant_quantize_f16(const float *src, void *dst, int64_t n);
void quant_quantize_bf16(const float *src, void *dst, int64_t n);
void quant_quantize_q8_0(const float *src, void *dst, int64_t n);
void quant_quantize_q4_K(const float *src, void *dst, int64_t n);
void quant_quantize_q5_K(const float *src, void *dst, int64_t n);
void quant_quantize_q6_K(const float *src, void *dst, int64_t n);

/* quant_q8.c: the integer path's scalar references. */
float quant_dot_q8_ref_q8_0(const void *row, const void *xq, int64_t n);
float quant_dot_q8_ref_q4_K(const void *row, const void *xq, int64_t n);
float quant_dot_q8_ref_q5_K(const void *row, const void *xq, int64_t n);
float quant_dot_q8_ref_q6_K(const void *row, const void *xq, int64_t n);
void quant_dot_q8_ref_cols_q8_0(const void *row, const void *xq, uint64_t stride, int nc, int64_t n, float *out);
void quant_dot_q8_ref_cols_q4_K(const void *row, const void *xq, uint64_t stride, int nc, int64_t n, float *out);
void quant_dot_q8_ref_cols_q5_K(const void *row, const void *xq, uint64_t stride, int nc, int64_t n, float *out);
void quant_dot_q8_ref_cols_q6_K(const void *row, const void *xq, uint64_t stride, int nc, int64_t n, float *out);

/* Horizontal sums in the order of the AVX2 reductions (the scalar twins use these). */
static inline float quant_hsum8_order(const float a[8]) {
    return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}
static inline float quant_hsum4_order(const float a[4]) { return (a[0] + a[2]) + (a[1] + a[3]); }

#if QUANT_HAVE_AVX2
/* quant_q8_avx2.c: callable only when quant_cpu_has_avx2(). */
float quant_dot_q8_avx2_q8_0(const void *row, const void *xq, int64_t n);
float quant_dot_q8_avx2_q4_K(const void *row, const void *xq, int64_t n);
float quant_dot_q8_avx2_q5_K(const void *row, const void *xq, int64_t n);
float quant_dot_q8_avx2_q6_K(const void *row, const void *xq, int64_t n);
void quant_dot_q8_avx2_cols_q8_0(const void *row, const void *xq, uint64_t stride, int nc, int64_t n, float *out);
void quant_dot_q8_avx2_cols_q4_K(const void *row, const void *xq, uint64_t stride, int nc, int64_t n, float *out);
void quant_dot_q8_avx2_cols_q5_K(const void *row, const void *xq, uint64_t stride, int nc, int64_t n, float *out);
void quant_dot_q8_avx2_cols_q6_K(const void *row, const void *xq, uint64_t stride, int nc, int64_t n, float *out);
void quant_quantize_row_q8_K_avx2(const float *x, block_q8_K *y, int64_t n);
void quant_quantize_row_q8_0_avx2(const float *x, block_q8_0 *y, int64_t n);

/* quant_avx2.c: callable only when quant_cpu_has_avx2(). */
float quant_dot_avx2_f32(const void *row, const float *x, int64_t n);
float quant_dot_avx2_f16(const void *row, const float *x, int64_t n);
float quant_dot_avx2_bf16(const void *row, const float *x, int64_t n);
float quant_dot_avx2_q8_0(const void *row, const float *x, int64_t n);
float quant_dot_avx2_q4_K(const void *row, const float *x, int64_t n);
float quant_dot_avx2_q5_K(const void *row, const float *x, int64_t n);
float quant_dot_avx2_q6_K(const void *row, const float *x, int64_t n);
/* Matvec with per-call precomputation for the types that have one; false: not handled, caller loops dot. */
bool quant_matvec_avx2(uint32_t type, const void *w, uint64_t row_bytes, int64_t n_in,
                        const float *x, float *y, int64_t row_begin, int64_t row_end);
#endif

#endif
