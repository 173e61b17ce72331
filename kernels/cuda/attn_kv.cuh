// Internal to kernels/cuda: the paged KV cache's addressing (attn.h "KV blocks") and the split
// attention's partials, shared by attn.cu and attn_prefill.cu. Position p of
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

// One row's partials of the split attention (attn.cu's layout: o [n_h][n_split][d_h], then m
// [n_h][n_split], then l [n_h][n_split]), rounded up to 256 bytes so that every row's o
// partials start 16-byte aligned (attn_combine reads them as float4).
static inline __host__ __device__ int64_t partial_row_floats(int n_h, int n_split, int d_h)
{
    return ((int64_t)n_h * n_split * (d_h + 2) + 63) & ~(int64_t)63;
}

#endif
