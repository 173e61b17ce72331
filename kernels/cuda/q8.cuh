// Internal to kernels/cuda: device helpers shared by kernel families: warp/block sums, and the
// Q8 activation writer (the layout of gemv.h: int8 qs[n] then float2 ds[n/32]) used by every
// kernel whose output feeds a quantised GEMV.
#ifndef DS_KERNELS_CUDA_Q8_CUH
#define DS_KERNELS_CUDA_Q8_CUH

#include <stdint.h>

// Bytes of the Q8 form of n elements, gemv_xq_bytes(n) of gemv.h (int8 qs[n], float2 ds[n/32]):
// also the row stride of the Q8 forms of a [B][n] activation.
static inline __host__ __device__ int64_t ds_q8_bytes(int64_t n) { return n + n / 32 * 8; }

static __device__ __forceinline__ float ds_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// N independent warp sums at once (their shuffles interleave: one chain of 5 steps, not N)
template <int N> static __device__ __forceinline__ void ds_warp_sum_n(float *v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int i = 0; i < N; i++) v[i] += __shfl_xor_sync(0xffffffffu, v[i], o);
}

static __device__ __forceinline__ float ds_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the CTA (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// scratch: 32 floats of shared memory. Contains __syncthreads: call from all threads.
static __device__ __forceinline__ float ds_block_sum(float v, float *scratch)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = ds_warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nw ? scratch[lane] : 0.0f;
    return ds_warp_sum(v);
}

// The 32 lanes of a warp hold elements e0 .. e0+31 (e0 % 32 == 0, lane i holds e0 + i) of an
// activation of n elements: write their Q8 form (same arithmetic as gemv_quantize_x).
static __device__ __forceinline__ void ds_q8_store_warp(float v, int64_t e0, int64_t n, void *xq)
{
    int8_t *qs = (int8_t *)xq;
    float2 *ds = (float2 *)(qs + n);
    const float amax = ds_warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int)roundf(v / d);
    qs[e0 + (threadIdx.x & 31)] = (int8_t)q;
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) ds[e0 / 32] = make_float2(d, d * (float)sum);
}

#endif
