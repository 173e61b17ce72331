/* A candidate prefill attention tile on mma.sync with S, P and O in registers (attn_tile.cu),
 * against the product's attn_prefill_runs (kernels/cuda/attn.h "Prefill runs"): the same
 * arguments, grid and partials, so attn_tile_bench swaps one for the other, checks the merged
 * outputs agree and times both. d_h 128 or 256. Kept out of the product until measured. */
#ifndef DS_BENCH_CUDA_ATTN_TILE_H
#define DS_BENCH_CUDA_ATTN_TILE_H

#include <stdint.h>

#include "kernels/cuda/cuda_device.h" /* and common/status.h, with C linkage */

#ifdef __cplusplus
extern "C" {
#endif

int attn_tile_init(status *st);
void attn_tile_runs(const float *d_q, int64_t ld_q, const void *d_k_cache, const void *d_v_cache,
                    const int32_t *d_slot, const int32_t *d_table, int table_ld,
                    const int32_t *d_pos, const int32_t *d_run, const int32_t *d_long, int n_h,
                    int n_kv, int d_h, int n_ctx, float *d_partial, int B, int R, int long_rows,
                    const cuda_launch *l);

#ifdef __cplusplus
}
#endif

#endif
