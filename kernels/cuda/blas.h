/* cuBLAS for the dense GEMM of wide passes (kernels/cuda/gemm.h "Dense path"): F16 weights and
 * F16 rows of X, F32 accumulation and output.
 *
 * cuBLAS is loaded at run time (dlopen of libcublas.so.13: the CUDA install's or PyTorch's
 * nvidia-cublas wheel on a GPU host), not linked: with its libcublasLt it is ~600 MB, too large
 * to travel with the binaries to a GPU host (docs/GPU.md), and a binary that never takes the
 * dense path must not need it to start. The header comes from the CUDA install through Bazel,
 * so every call is type-checked. */
#ifndef DS_KERNELS_CUDA_BLAS_H
#define DS_KERNELS_CUDA_BLAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "kernels/cuda/cuda_device.h"

typedef struct blas blas;

/* A handle on the current device with d_workspace (bytes, device memory the caller owns; cuBLAS
 * then allocates nothing while a graph is captured) and default math (no TF32: F16 inputs).
 * STATUS_UNAVAILABLE when libcublas.so.13 cannot be loaded (the message says why),
 * STATUS_DEVICE when cuBLAS fails. */
int blas_open(void *d_workspace, size_t workspace_bytes, blas **out, status *st);
void blas_close(blas *b);
/* Y[i][r] (+)= sum_k W[r][k] X[i][k] for rows i < B, r < n_out, k < n_in: W [n_out][ld_w] F16,
 * X [B][ld_x] F16, Y [B][ld_y] F32, add: accumulate into Y. Enqueued on s (captured when s is
 * capturing). */
int blas_gemm_f16(blas *b, int64_t n_out, int B, int64_t n_in, const uint16_t *d_w, int64_t ld_w,
                  const uint16_t *d_x, int64_t ld_x, float *d_y, int64_t ld_y, bool add,
                  cuda_stream s, status *st);
/* "cuBLAS 130100 (libcublas.so.13)", or why it is not there. */
const char *blas_describe(void);

#endif
