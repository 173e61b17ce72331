/* Batched GEMM for decode steps of B >= 2 rows: Y[i] = W·X[i] (or += for the residual) for the
 * B rows of a step, every weight read once per 16-128 rows. W is a planned gemv_matrix (gemv.h)
 * in the GEMV's packed layout, read in place: no second copy of the weights.
 *
 * How: a CTA owns 128 weight rows and up to 128 batch rows; per 128-wide K step it dequantises
 * its weight tile to F16 in shared memory and multiplies on the tensor cores (WMMA 16x16x16, F32
 * accumulation) in a fixed K order.
 * - Quantised weights (Q4_K / Q5_K / Q6_K / Q8_0, gemm_q.cu) read X as F16 rows made once per
 *   activation by gemm_x_half; the next step's raw blocks load into registers and its X rows
 *   stream into a second stage (cp.async) while the current step multiplies. Dequantisation in
 *   half2 arithmetic. Rounding against the F32 CPU twin: the sub-block scale and min, each weight,
 *   and x to F16 (2^-11 relative each).
 * - Float weights (F16 / BF16 / F32, gemm.cu) read X as F32 and keep what F16 drops: F16/BF16
 *   weights add x's F16 remainder tile (hi·hi + hi·lo), F32 weights also the weights' (+ lo·hi),
 *   about 22 bits a product, so F32 models are not rounded to F16.
 * Each output element is its own row·column dot in that order, so row i of Y is bit-identical
 * whatever B is and whatever other rows share the launch (batch invariance, docs/GPU.md
 * "Batched decode").
 *
 * CPU twin: quant_matvec (gguf/quant.h) row by row; tests/gpu/gemm_parity.c. */
#ifndef DS_KERNELS_CUDA_GEMM_H
#define DS_KERNELS_CUDA_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemv.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GEMM_MAX_ROWS 65535 /* B bound from the reduction's and gemm_x_half's grids */

/* Once per process before the first launch (and outside graph capture): the kernels' opt-in to
 * more than 48 KiB of shared memory. STATUS_DEVICE when the device refuses. */
int gemm_init(status *st);

/* true when gemm_rows takes this weight type and row width (n_in % 32 == 0; K-quants: % 256) */
bool gemm_supported(uint32_t type, int64_t n_in);

/* true when gemm_rows reads X as F16 rows (gemm_x_half) for this weight type: the quantised ones */
bool gemm_reads_half(uint32_t type);

/* X's F16 rows for the quantised kernels: d_xh[i][k] = x[i][k] rounded to F16 (saturating at
 * ±65504), [B][n] contiguous; n % 4 == 0, ld_x % 4 == 0. Once per activation, read by every
 * matrix that multiplies it. */
void gemm_x_half(const float *d_x, int64_t ld_x, int64_t n, uint16_t *d_xh, int B,
                 const cuda_launch *l);

/* X: d_x [B][ld_x] F32 (float weight types read the first n_in of each row) and d_xh, its F16
 * rows [B][n_in] (quantised types; may be NULL when the type is not). d_y: [B][ld_y] F32, the
 * first n_out of each row written (GEMV_STORE) or added to (GEMV_ADD). 1 <= B <= GEMM_MAX_ROWS.
 * Matrices with too few 128-row tiles to fill the GPU split K (a number of splits fixed by the
 * matrix and the GPU, not by B) into partials in d_work, summed in split order by a second
 * launch; d_work: at least gemm_work_floats(w, B) floats (NULL when that is 0). */
void gemm_rows(const gemv_matrix *w, const float *d_x, int64_t ld_x, const uint16_t *d_xh,
               float *d_y, int64_t ld_y, gemv_epilogue ep, int B, float *d_work,
               const cuda_launch *l);
int64_t gemm_work_floats(const gemv_matrix *w, int B);

/* Dense path (passes of many rows, model/forward_cuda_record.c): a quantised matrix dequantised
 * to F16 rows in a scratch, then multiplied by cuBLAS (kernels/cuda/blas.h) against the same F16
 * rows of X. The weights round as the GEMM's tiles do (gemm_q.cu: the same code), so the two
 * paths differ only in the order of the F32 sums. gemm_dense_ld: the scratch's row stride (n_in
 * rounded up to 128, zeros past n_in); gemm_dequant_half writes [n_out][gemm_dense_ld(w)]
 * halves to d_w16 (quantised types only: gemm_reads_half). */
int64_t gemm_dense_ld(const gemv_matrix *w);
void gemm_dequant_half(const gemv_matrix *w, uint16_t *d_w16, const cuda_launch *l);

/* The batched FFN's middle: out[i][r] = silu(gu[i][r]) * gu[i][F + r] for r < F (gu: the gate
 * and up GEMMs' outputs side by side, [B][ld_gu]; out: [B][ld_out]). CPU twin: ref_swiglu
 * (kernels/cpu/act.h). */
void gemm_swiglu_rows(const float *d_gu, int64_t ld_gu, int F, float *d_out, int64_t ld_out,
                      int B, const cuda_launch *l);

/* Greedy argmax of each row of logits [B][ld] over n columns: d_best[i] = the key gemv_argmax
 * writes (ties pick the lowest column; decode with gemv_argmax_row). */
void gemm_argmax_rows(const float *d_logits, int64_t ld, int64_t n, unsigned long long *d_best,
                      int B, const cuda_launch *l);

#ifdef __cplusplus
}
#endif

#endif
