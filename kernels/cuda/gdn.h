/* Gated DeltaNet decode on the GPU (shared/QWEN35.md §2.4), one token of one sequence, in three
 * steps whose composition is the CPU twin ref_gdn_decode (kernels/cpu/gdn.h):
 *   gdn_conv        conv window update + SiLU (also fused into the qkv GEMV: gemv_conv)
 *   gdn_decode      q/k L2 norms, q scale, gates, the delta rule on the FP32 state
 *   gdn_norm_gated  gated RMSNorm with silu(z), output F32 + Q8 for the ssm_out GEMV
 * Dimension names: model/README.md. S layout: [n_v][d_v][d_k] (key-contiguous, as the CPU's).
 * Value head hv uses key head hv % n_k. d_k and d_v must be 32, 64 or 128 (asserted). */
#ifndef DS_KERNELS_CUDA_GDN_H
#define DS_KERNELS_CUDA_GDN_H

#include <stdint.h>

#include "kernels/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mixed: [C] = W_qkv·h; conv_w: [C][K_conv]; conv_state: [C][K_conv-1] in/out (oldest first);
 * out: [C] = silu(conv). */
void gdn_conv(const float *d_mixed, const float *d_conv_w, float *d_conv_state, int C,
              int K_conv, float *d_out, const cuda_launch *l);

/* conv: [C] = [q (n_k·d_k) | k (n_k·d_k) | v (n_v·d_v)] after gdn_conv; b, a: [n_v] (W_beta·h,
 * W_alpha·h); dt_bias, ssm_a: [n_v]; S: [n_v][d_v][d_k] in/out; o: [n_v·d_v] raw outputs. */
void gdn_decode(const float *d_conv, const float *d_b, const float *d_a, const float *d_dt_bias,
                const float *d_ssm_a, int n_k, int n_v, int d_k, int d_v, float eps, float *d_S,
                float *d_o, const cuda_launch *l);

/* y_hv = RMSNorm(o_hv) · norm_w · silu(z_hv) per value head. o, z: [n_v·d_v]; norm_w: [d_v];
 * y: [n_v·d_v] F32 (may be NULL); y_q8: gemv_xq_bytes(n_v·d_v) (may be NULL). */
void gdn_norm_gated(const float *d_o, const float *d_z, const float *d_norm_w, int n_v, int d_v,
                    float eps, float *d_y, void *d_y_q8, const cuda_launch *l);

#ifdef __cplusplus
}
#endif

#endif
