/* RMSNorm on the GPU, writing both the F32 result and its Q8 form for the GEMV that follows.
 * CPU twin: ref_rmsnorm (kernels/cpu/norm.h) and, for the Q8 form, gemv_quantize_x's.
 * One kernel: norm_rms is norm_rms_rows with B = 1, so a row's result is bit-identical
 * whatever B is and whatever other rows share the launch. */
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

/* The same for B rows in one launch (1 <= B <= 65535; one CTA per row): row i reads
 * d_x + i*ld_x [n] and writes d_y + i*ld_y [n] (d_y may be NULL) and its Q8 form at
 * (uint8_t *)d_y_q8 + i*gemv_xq_bytes(n) (d_y_q8 may be NULL; needs n % 32 == 0). ld_*: elements
 * between rows. */
void norm_rms_rows(const float *d_x, int64_t ld_x, const float *d_w, int n, float eps, float *d_y,
                   int64_t ld_y, void *d_y_q8, int B, const cuda_launch *l);
/* The same, row i of the output from row d_src[i] of d_x (a step input: the rows that need the
 * lm_head, gathered); bit-identical to norm_rms_rows on those rows. */
void norm_rms_gather(const float *d_x, int64_t ld_x, const int32_t *d_src, const float *d_w,
                     int n, float eps, float *d_y, int64_t ld_y, void *d_y_q8, int B,
                     const cuda_launch *l);
/* The launch grid of norm_rms_rows (cuda_device.h), for limit checks. */
cuda_launch_dims norm_rms_rows_dims(int n, int B);

#ifdef __cplusplus
}
#endif

#endif
