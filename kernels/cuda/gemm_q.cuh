// Internal to kernels/cuda (gemm.cu and gemm_q.cu): the quantised-weight GEMM's launcher. The
// public API, the K split and its reduction are gemm.h / gemm.cu.
#ifndef DS_KERNELS_CUDA_GEMM_Q_CUH
#define DS_KERNELS_CUDA_GEMM_Q_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemv.h"

#define GEMM_M 128  // weight rows a CTA (both kernels)
#define GEMM_KT 128 // K a step (both kernels); a K split is a whole number of steps

// Y (or, split, the partial of split blockIdx.z) of a Q4_K / Q5_K / Q6_K / Q8_0 matrix against
// the F16 rows xh ([B][n_in]); kps: K steps a split, splits: their number
void gemm_q_launch(const gemv_matrix *w, const uint16_t *xh, float *y, int64_t ld_y, int add,
                   int B, float *part, int kps, int splits, const cuda_launch *l);
cudaError_t gemm_q_init();
// the matrix as F16 rows [n_out][ld] (ld >= n_in rounded up to GEMM_KT; past n_in: zeros)
void gemm_q_half_launch(const gemv_matrix *w, uint16_t *w16, int64_t ld, const cuda_launch *l);

#endif
