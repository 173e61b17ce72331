// Internal to kernels/cuda: the paged KV cache's addressing (attn.h "KV blocks"). Position p of
// slot s lies in block attn_kv_block(table, ld, s, p / ATTN_KV_BLOCK), row p % ATTN_KV_BLOCK;
// without a table, slot s owns blocks s·ld .. s·ld + ld - 1 (a contiguous cache per slot).
#ifndef DS_KERNELS_CUDA_ATTN_KV_CUH
#define DS_KERNELS_CUDA_ATTN_KV_CUH

#include <stdint.h>

#include "kernels/cuda/attn.h"

static_assert(ATTN_KV_BLOCK % ATTN_CHUNK == 0, "a decode chunk lies in one KV block");

static __device__ __forceinline__ int64_t attn_kv_block(const int32_t *table, int ld, int64_t s,
                                                        int b)
{
    return table ? (int64_t)table[s * ld + b] : s * ld + b;
}

#endif
