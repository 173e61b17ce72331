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

// Prefill tiles (attn.h "Prefill runs"): tile y of the long runs' tiles of QT rows, counted run
// by run in d_long's order: its run's first row and length, and the tile's first row in the run
// (-1: past the last tile).
static __device__ __forceinline__ int64_t attn_tile_at(const int32_t *run, int R,
                                                       const int32_t *lng, int y, int QT,
                                                       int64_t *row0, int64_t *n_run)
{
    const int n_long = lng[0];
    for (int x = 0; x < n_long; x++) {
        const int r = lng[1 + x], nt_r = (run[R + r] + QT - 1) / QT;
        if (y < nt_r) {
            *row0 = run[r], *n_run = run[R + r];
            return (int64_t)y * QT;
        }
        y -= nt_r;
    }
    return -1;
}

// A tile's segment z of n_segs: equal parts of positions [0, p_max], whole chunks of kc
// positions each; [*c_lo, *c_hi] (empty when *c_lo > p_max), *seg_len its length.
static __device__ __forceinline__ void attn_segment(int p_max, int z, int n_segs, int kc,
                                                    int *seg_len, int *c_lo, int *c_hi)
{
    *seg_len = ((p_max + 1 + n_segs - 1) / n_segs + kc - 1) / kc * kc;
    *c_lo = z * *seg_len;
    *c_hi = min(p_max, *c_lo + *seg_len - 1);
}

#endif
