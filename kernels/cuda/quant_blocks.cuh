// Internal to kernels/cuda: the GGUF block formats as the GPU reads them. The type ids, block
// structs and qb_scale_min_k4 are gguf/quant_blocks.h, the one copy C and CUDA share; this adds
// the half/bf16 conversions of the device code.
#ifndef DS_KERNELS_CUDA_QUANT_BLOCKS_CUH
#define DS_KERNELS_CUDA_QUANT_BLOCKS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "gguf/quant_blocks.h"

__device__ __forceinline__ float qb_half(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float qb_bf16(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

#endif
