/* GPU dequantisation of GGUF blocks to F32 (F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K).
 * CPU twin: quant_get(type)->dequant (gguf/quant.h), which tests/gpu/dequant_parity checks
 * element by element. The forward does not call it (its weights stay quantised; the dense path
 * dequantises to F16 with gemm_dequant_half, kernels/cuda/gemm.h). */
#ifndef DS_KERNELS_CUDA_DEQUANT_H
#define DS_KERNELS_CUDA_DEQUANT_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* d_src: n elements of ggml type `type` as GGUF stores them (whole blocks; rows of a matrix are
 * packed without padding, so a whole tensor is one run of blocks); d_dst: [n] F32.
 * n must be a multiple of the type's block size (asserted). No sync; check with cuda_check. */
void dequant_f32(uint32_t type, const void *d_src, float *d_dst, int64_t n,
                 const cuda_launch *l);

#ifdef __cplusplus
}
#endif

#endif
