// Internal to kernels/cuda: one channel of the DeltaNet causal conv + SiLU, shared by gdn_conv
// and the GEMV epilogue (gemv_conv). w: [K] (w[K-1] multiplies the newest input), state: [K-1]
// oldest first, updated to [state[1..], x].
#ifndef DS_KERNELS_CUDA_GDN_CONV_CUH
#define DS_KERNELS_CUDA_GDN_CONV_CUH

static __device__ __forceinline__ float gdn_conv_channel(float x, const float *w, float *state,
                                                         int K)
{
    float acc = w[K - 1] * x;
    for (int k = 0; k < K - 1; k++) acc += w[k] * state[k];
    for (int k = 0; k < K - 2; k++) state[k] = state[k + 1];
    if (K > 1) state[K - 2] = x;
    return acc / (1.0f + expf(-acc));
}

#endif
