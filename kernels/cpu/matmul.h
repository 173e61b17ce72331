/* Matrix products over GGUF weight rows (any supported ggml type), threaded over output rows.
 *
 * W is n_out rows of n_in elements, each row row_bytes bytes of ggml type `type` (GGUF
 * ne=[n_in, n_out]). x holds T input rows of n_in floats (row stride ldx), y gets T output rows
 * of n_out floats (row stride ldy):  y[t][o] = W[o] · x[t].
 *
 * Small T (decode, B columns): blocks of rows are dotted against all T inputs while they are
 * hot in L1/L2, so the weights stream from memory once per call. For quantised weights (Q8_0,
 * Q4_K, Q5_K, Q6_K) the default is the integer path, as llama.cpp's: each input row is
 * quantised once per call (Q8_K / Q8_0, gguf/quant.h quant_quantize_act) into the scratch and
 * every weight row is dotted with it in integers (quant_get(type)->dot_q8, AVX2). Otherwise
 * (F32/F16/BF16 weights, or the exact mode) the float dots quant_get(type)->dot against the F32
 * inputs. Larger T (prefill, batched decode beyond the integer path's columns): a tile of rows
 * is dequantised (kernels/cpu/dequant.h, AVX2) into per-thread scratch once and multiplied
 * against all T inputs with an FP32 register-blocked 4x3 kernel. Never a whole tensor.
 *
 * Exact vs integer path: the integer path quantises the input (about 0.2% relative error of a
 * dot on random data, |error| <= sum_i |w_i| d_block(i) / 2; tests/gguf/quant_q8_test.c); the
 * exact mode computes the F32 math on the dequantised weights (1e-5 relative), which is the
 * specification's. REF_MATMUL_DOT_EXACT, or $DS_EXACT_DOT=1 for the default, selects it. */
#ifndef DS_KERNELS_CPU_MATMUL_H
#define DS_KERNELS_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_pool.h"

/* Floats of one thread's dequantised row tile on the prefill path (256 KiB: sits in L2 while
 * all T inputs stream past it); the tile holds max(4, this / n_in) rows, a multiple of 4. */
#define REF_MATMUL_TILE_FLOATS 65536
/* From this many input rows on, the dequantise-a-tile path is used: 3 for the K-quants and
 * F32, 6 for F16/BF16/Q8_0 (measured: below it, dotting the blocks directly per input is
 * cheaper than dequantising; above it the FP32 micro-kernel wins). */
#define REF_MATMUL_TILE_MIN_T_KQUANT 3
#define REF_MATMUL_TILE_MIN_T_OTHER 6
/* Rows dotted against every input in turn on the decode path (kept hot in L1/L2). */
#define REF_MATMUL_DOT_BLOCK 32
/* The integer path runs for T below this (measured: docs/BENCH.md); larger T take the tile
 * path. Its quantised inputs (T x ~1.14 n_in bytes) live in the scratch. */
#define REF_MATMUL_Q8_MAX_T 8

/* How quantised weights are dotted (F32/F16/BF16 weights always take the float path). */
typedef enum ref_matmul_dot {
    REF_MATMUL_DOT_DEFAULT = 0, /* EXACT when $DS_EXACT_DOT is set and not "0", else Q8 */
    REF_MATMUL_DOT_Q8,          /* integer dots against the Q8-quantised input (T < Q8_MAX_T) */
    REF_MATMUL_DOT_EXACT,       /* float dots against the F32 input */
} ref_matmul_dot;

/* DEFAULT resolved from the environment (read once per process). */
ref_matmul_dot ref_matmul_dot_default(void);

/* Floats of scratch ref_matmul needs for rows up to n_in_max with n_threads threads. */
size_t ref_matmul_scratch_floats(int64_t n_in_max, int n_threads);

/* y = x · Wᵀ as above. pool may be NULL (serial). scratch: ref_matmul_scratch_floats(n_in,
 * cpu_pool_n_threads(pool)) floats (may be NULL only for F32/F16/BF16 weights with T < 3, or
 * in the exact mode with T < 3). The type must be supported by gguf/quant.h and n_in a
 * multiple of its block size (checked at load). */
void ref_matmul(cpu_pool *pool, const void *w, uint32_t type, uint64_t row_bytes, int64_t n_in,
                int64_t n_out, const float *x, int64_t ldx, int T, float *y, int64_t ldy,
                float *scratch, ref_matmul_dot dot);

/* FP32 vector helpers (AVX2+FMA when the CPU has it). */
float ref_dot_f32(const float *a, const float *b, int64_t n);          /* a·b */
void ref_axpy_f32(float *y, float a, const float *x, int64_t n);       /* y += a x */
void ref_scale_f32(float *y, float a, int64_t n);                      /* y *= a */
float ref_scale_dot_f32(float *s, float a, const float *k, int64_t n); /* s *= a; return s·k */
float ref_axpy_dot_f32(float *s, float d, const float *k, const float *q, int64_t n);
                                                                       /* s += d k; return s·q */

#endif
