// Internal to kernels/cuda: the greedy argmax as one 64-bit key, so a max (atomicMax, a warp
// shuffle) picks the largest value and, among equal values, the lowest row. gemv_argmax and
// gemm_argmax_rows write it; gemv_argmax_row (gemv.h) decodes it.
#ifndef DS_KERNELS_CUDA_ARGMAX_KEY_CUH
#define DS_KERNELS_CUDA_ARGMAX_KEY_CUH

#include <stdint.h>

static __device__ __forceinline__ unsigned long long argmax_key(float v, int64_t row)
{
    const uint32_t u = __float_as_uint(v);
    const uint32_t k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)k << 32) | (uint32_t)~(uint32_t)row;
}

#endif
