/* Internal to gguf/quant*.c: the per-type kernels the traits table points at.
 * Not for other modules: they go through quant_get(). */
#ifndef DS_GGUF_QUANT_IMPL_H
#define DS_GGUF_QUANT_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "gguf/quant.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define QUANT_HAVE_AVX2 1
#else
#define QUANT_HAVE_AVX2 0
#endif

/* get_scale_min_k4 of ggml: 6-bit scale and min of sub-block j (0..7) from scales[12]. */
void quant_scale_min_k4(int j, const uint8_t *scales, uint8_t *sc, uint8_t *m);

/* quant_quantize.c */
void quant_quantize_f32(const float *src, void *dst, int64_t n);
void quant_quantize_f16(const float *src, void *dst, int64_t n);
void quant_quantize_bf16(const float *src, void *dst, int64_t n);
void quant_quantize_q8_0(const float *src, void *dst, int64_t n);
void quant_quantize_q4_K(const float *src, void *dst, int64_t n);
void quant_quantize_q5_K(const float *src, void *dst, int64_t n);
void quant_quantize_q6_K(const float *src, void *dst, int64_t n);

#if QUANT_HAVE_AVX2
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
