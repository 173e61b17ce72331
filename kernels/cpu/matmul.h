/* Matrix products over GGUF weight rows (any supported ggml type), threaded over output rows.
 *
 * W is n_out rows of n_in elements, each row row_bytes bytes of ggml type `type` (GGUF
 * ne=[n_in, n_out]). x holds T input rows of n_in floats (row stride ldx), y gets T output rows
 * of n_out floats (row stride ldy):  y[t][o] = W[o] · x[t].
 *
 * Quantised weights (Q8_0, Q4_K, Q5_K, Q6_K), default (integer) mode, any T, as llama.cpp's CPU
 * path: each input row is quantised once per call (Q8_K / Q8_0, gguf/quant.h
 * quant_quantize_act) into the scratch, and blocks of weight rows are dotted in integers with
 * the inputs 4 at a time while they are hot in L1/L2 (quant_get(type)->dot_q8_cols, AVX2: the
 * row is unpacked once per 4 inputs). An output depends only on its weight row and its input
 * row: the same bits whatever T, the batch or the prefill step size.
 * F32/F16/BF16 weights, or the exact mode: small T (decode) on F32/F16/BF16 dots the rows
 * straight from the weights, the weights streamed once per call; larger T (prefill, batched
 * decode), and every T of quantised weights in the exact mode, dequantises a tile of rows
 * (kernels/cpu/dequant.h, AVX2) into per-thread scratch once and multiplies it against all T
 * inputs with an FP32 register-blocked 4x3 kernel. Never a whole tensor. Every one of these
 * kernels sums an output in one order (one 8-lane accumulator over the row in order, then the
 * lanes, then the tail), so here too an output has the same bits whatever T: a prompt fed in
 * any split gives the same results (the CPU forward's prefix reuse resumes bit for bit).
 *
 * Exact vs integer path: the integer path quantises the input (about 0.2% relative error of a
 * dot on random data, |error| <= sum_i |w_i| d_block(i) / 2; tests/gguf/quant_q8_test.c); the
 * exact mode computes the F32 math on the dequantised weights (1e-5 relative), which is the
 * specification's. CPU_MATMUL_DOT_EXACT selects it (per call; qwen35_ctx_opts.dot_mode per ctx). */
#ifndef DS_KERNELS_CPU_MATMUL_H
#define DS_KERNELS_CPU_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu_pool.h"

/* Floats of one thread's dequantised row tile on the prefill path (256 KiB: sits in L2 while
 * all T inputs stream past it); the tile holds max(4, this / n_in) rows, a multiple of 4. */
#define CPU_MATMUL_TILE_FLOATS 65536
/* From this many input rows on, F32 (3) and F16/BF16 (6) rows go through the tile path
 * (measured: below it, dotting the rows directly per input is cheaper than dequantising; above
 * it the FP32 micro-kernel wins). */
#define CPU_MATMUL_TILE_MIN_T_F32 3
#define CPU_MATMUL_TILE_MIN_T_HALF 6
/* Rows dotted against every input in turn on the decode path (kept hot in L1/L2). */
#define CPU_MATMUL_DOT_BLOCK 32
/* Most weight bytes one task of the dot paths reads (threads claim tasks dynamically). */
#define CPU_MATMUL_TASK_BYTES (256 * 1024)
/* The integer path quantises the inputs into the scratch (~1.14 n_in bytes each), as many as
 * fit at a time, at least this many (the scratch holds >= 16 n_in bytes). */
#define CPU_MATMUL_Q8_MIN_COLS 14

/* How quantised weights are dotted (F32/F16/BF16 weights always take the float path). */
typedef enum cpu_matmul_dot {
    CPU_MATMUL_DOT_DEFAULT = 0, /* Q8 */
    CPU_MATMUL_DOT_Q8,          /* integer dots against the Q8-quantised inputs */
    CPU_MATMUL_DOT_EXACT,       /* float dots against the F32 input */
} cpu_matmul_dot;

/* Floats of scratch cpu_matmul needs for rows up to n_in_max with n_threads threads. */
size_t cpu_matmul_scratch_floats(int64_t n_in_max, int n_threads);

/* y = x · Wᵀ as above. pool may be NULL (serial). scratch: cpu_matmul_scratch_floats(n_in,
 * cpu_pool_n_threads(pool)) floats (may be NULL only for F32/F16/BF16 weights with T < 3). The type must be supported by gguf/quant.h and n_in a multiple of
 * its block size (checked at load). */
void cpu_matmul(cpu_pool *pool, const void *w, uint32_t type, uint64_t row_bytes, int64_t n_in,
                int64_t n_out, const float *x, int64_t ldx, int T, float *y, int64_t ldy,
                float *scratch, cpu_matmul_dot dot);

/* FP32 vector helpers (AVX2+FMA when the CPU has it). */
float ref_dot_f32(const float *a, const float *b, int64_t n);          /* a·b */
void ref_axpy_f32(float *y, float a, const float *x, int64_t n);       /* y += a x */
void ref_scale_f32(float *y, float a, int64_t n);                      /* y *= a */
float ref_scale_dot_f32(float *s, float a, const float *k, int64_t n); /* s *= a; return s·k */
float ref_axpy_dot_f32(float *s, float d, const float *k, const float *q, int64_t n);
                                                                       /* s += d k; return s·q */

#endif
