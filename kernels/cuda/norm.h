/* RMSNorm on the GPU, writing both the F32 result and its Q8 form for the GEMV that follows.
 * CPU twin: ref_rmsnorm (kernels/cpu/norm.h) and, for the Q8 form, gemv_quantize_x's. */
#ifndef DS_KERNELS_CUDA_NORM_H
#define DS_KERNELS_CUDA_NORM_H

#include <stdint.h>

#include "kernels/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = x / sqrt(mean(x²) + eps) * w over n elements (one vector; w may be NULL = 1).
 * d_y: [n] F32 (may be NULL); d_y_q8: gemv_xq_bytes(n) (may be NULL; needs n % 32 == 0). */
void norm_rms(const float *d_x, const float *d_w, int n, float eps, float *d_y, void *d_y_q8,
              const cuda_launch *l);

#ifdef __cplusplus
}
#endif

#endif
