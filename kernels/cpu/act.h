/* Elementwise activations and gates (docs/QWEN35.md §2). FP32. */
#ifndef DS_KERNELS_CPU_ACT_H
#define DS_KERNELS_CPU_ACT_H

#include <math.h>

static inline float ref_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float ref_silu(float x) { return x / (1.0f + expf(-x)); }
/* torch/ggml softplus: linear above 20. */
static inline float ref_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* out[i] = silu(gate[i]) * up[i]; out may alias gate or up. */
void ref_swiglu(const float *gate, const float *up, int n, float *out);

/* o[i] *= sigmoid(gate[i])  (the attention output gate). */
void ref_sigmoid_gate(float *o, const float *gate, int n);

/* y[i] += x[i]  (residual). */
void ref_add(float *y, const float *x, int n);

#endif
