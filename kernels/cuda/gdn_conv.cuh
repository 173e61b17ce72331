// Internal to kernels/cuda: one channel of the DeltaNet causal conv + SiLU, shared by gdn_conv
// and the GEMV epilogue (gemv_conv). w: [K] (w[K-1] multiplies the newest input), state: [K-1]
// oldest first, updated to [state[1..], x].
#ifndef DS_KERNELS_CUDA_GDN_CONV_CUH
#define DS_KERNELS_CUDA_GDN_CONV_CUH

// (state_in: where the state is read, a copy in shared memory or state itself)
static __device__ __forceinline__ float gdn_conv_channel_from(float x, const float *w,
                                                              const float *state_in,
                                                              float *state, int K)
{
    float acc = w[K - 1] * x;
    for (int k = 0; k < K - 1; k++) acc += w[k] * state_in[k];
    for (int k = 0; k < K - 2; k++) state[k] = state_in[k + 1];
    if (K > 1) state[K - 2] = x;
    return acc / (1.0f + expf(-acc));
}

static __device__ __forceinline__ float gdn_conv_channel(float x, const float *w, float *state,
                                                         int K)
{
    return gdn_conv_channel_from(x, w, state, state, K);
}

// Value e (0 <= e < 2K-1) of channel row's conv inputs: its K weights, then its K-1 state values
static __device__ __forceinline__ float gdn_conv_value(const float *w, const float *state,
                                                       int64_t row, int K, int e)
{
    return e < K ? w[row * K + e] : state[row * (K - 1) + e - K];
}

// L2 prefetch of what gdn_conv_channel reads for channel `row` (its K weights and K-1 state
// values): issued when a kernel starts, so that the epilogue after the row's dot product does
// not wait a DRAM latency of its own. The state was last written by the previous token's step.
static __device__ __forceinline__ void gdn_conv_prefetch(const float *w, const float *state,
                                                         int64_t row, int K)
{
    const float *pw = w + row * K, *ps = state + row * (K - 1);
    asm volatile("prefetch.global.L2 [%0];" ::"l"(pw));
    asm volatile("prefetch.global.L2 [%0];" ::"l"(pw + K - 1));
    if (K > 1) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(ps));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(ps + K - 2));
    }
}

#endif
