/* Normalisations (docs/QWEN35.md §2.1, §2.4). All FP32; y may alias x. */
#ifndef DS_KERNELS_CPU_NORM_H
#define DS_KERNELS_CPU_NORM_H

/* y = x / sqrt(mean(x²) + eps) * w   (w: [n], GGUF norms already hold 1 + w_hf; NULL = 1). */
void ref_rmsnorm(const float *x, const float *w, int n, float eps, float *y);

/* RMSNorm of each of n_heads rows of d floats (row stride d), with one shared weight [d]. */
void ref_rmsnorm_heads(float *x, const float *w, int n_heads, int d, float eps);

/* x = x / sqrt(Σx² + eps) * scale  (HF l2norm, the FLA form). */
void ref_l2norm(float *x, int n, float eps, float scale);

/* DeltaNet gated norm of one value head: o = RMSNorm(o) · w · silu(z)   (w: [d], no +1). */
void ref_rmsnorm_gated(float *o, const float *z, const float *w, int d, float eps);

#endif
