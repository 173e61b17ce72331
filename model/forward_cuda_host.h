/* Host-side pieces of the CUDA forward that touch no device (plain C, tested on the CPU by
 * tests/model/forward_cuda_host_test.c): the staged inputs of a batched pass and the paged KV
 * cache's block allocator. forward_cuda_batch.c and forward_cuda_state.c copy what they produce
 * to the device. */
#ifndef DS_MODEL_FORWARD_CUDA_HOST_H
#define DS_MODEL_FORWARD_CUDA_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "model/forward_cuda.h"

/* ---- a batched pass's staged inputs (forward_cuda_impl.h fc_batch.stage) ----
 * A pass of n rows runs the bucket of nb >= n rows (rows: the largest bucket). Its inputs lie
 * in one buffer of FC_STAGE_INTS(rows) ints, copied to the device in one piece; fc_stage_at
 * names its arrays for the bucket of nb rows (the layout depends on nb), on the host staging as
 * on its device mirror. */
#define FC_STAGE_INTS(rows) (8 * (rows) + 8) /* a pass's staged ints, rounded up */
/* Runs of this many rows or more go to the chunked delta rule and the attention tiles; shorter
 * ones row by row, which spreads them over more CTAs (a chunked CTA takes a run at a time, and
 * 256 two-row runs of a pass measured 3x slower through it than row by row). */
#define FC_LONG_RUN_ROWS 16

typedef struct fc_stage {
    int32_t *head_rows; /* [rows]: the lm_head's rows (the rows whose logits are read), padded
                           to their bucket with the first one */
    int32_t *tokens;    /* [nb] */
    int32_t *slots;     /* [nb]: the pad slot past n */
    int32_t *pos;       /* [nb] */
    int32_t *runs;      /* [2][nb] (kernels/cuda/gdn.h "Runs"): the runs' first rows, then */
    int32_t *run_len;   /* [nb] = runs + nb: their lengths (runs of one slot's consecutive rows;
                           entries past the runs empty) */
    int32_t *long_runs; /* [1 + nb] (gdn.h "Chunked runs"): the number of long runs
                           (FC_LONG_RUN_ROWS rows or more), then */
    int32_t *long_idx;  /* [nb] = long_runs + 1: their indices in runs */
    int32_t *tile_rows; /* [nb]: 1 for a row attn_prefill_runs takes (a row of a long run, when
                           attn_tiles): attn_decode_rows' d_skip */
    int nb;
    int ints;           /* ints from head_rows to the last array, the bytes a pass copies:
                           rows + 7 nb + 1 */
} fc_stage;

/* The arrays of the bucket of nb rows in a staging buffer of FC_STAGE_INTS(rows) ints at base
 * (device or host): head_rows [0, rows), then tokens, slots, pos, runs (with run_len),
 * long_runs (with long_idx), tile_rows back to back. */
fc_stage fc_stage_at(int32_t *base, int rows, int nb);

typedef struct fc_pass_info {
    int k, nb;        /* the body's bucket index and rows */
    int n_runs, n_long;
    int nh, kh;       /* lm_head rows, and their bucket index (when nh > 0) */
    int staged_ints;  /* ints to copy (fc_stage.ints of bucket k) */
} fc_pass_info;

/* Stages rows[0 .. n) (1 <= n <= the largest bucket) into the staging buffer at base (the
 * arrays fc_stage_at names for the pass's bucket): bucket[0 .. n_buckets) ascending powers of
 * two, the last = rows; head[j] = row j's lm_head row (-1: its logits are not read: a prompt
 * row before its run's last, unless it asks for logits). */
void fc_stage_pass(const qwen35_cuda_row *rows, int n, const int *bucket, int n_buckets,
                   int pad_slot, bool attn_tiles, int32_t *base, int *head, fc_pass_info *info);

/* ---- the paged KV cache's blocks (kernels/cuda/attn.h "KV blocks") ----
 * n_rows table rows (the slots and the pad slot) of ld blocks; block ids in [0, n_blocks), a
 * stack of the free ones. */
typedef struct fc_kv_blocks {
    int32_t *table;    /* [n_rows][ld]: row r's blocks, its first held[r] entries valid */
    int32_t *free_ids; /* [n_blocks]: the free blocks, a stack of n_free */
    int *held;         /* [n_rows] */
    int n_rows, ld, n_blocks, n_free;
} fc_kv_blocks;

/* Every block free but block 0, which row `reserved` holds (the pad slot: its rows all sit at
 * position 0); every table entry 0. */
void fc_kv_blocks_reset(fc_kv_blocks *k, int reserved);
/* Blocks for row's positions up to `last` (< ld * block positions): the blocks taken, new
 * entries at table[row][held before ..]; -1 (nothing taken) when too few are free. */
int fc_kv_blocks_grow(fc_kv_blocks *k, int row, int last, int block_positions);
/* Row's blocks back to the stack. */
void fc_kv_blocks_release(fc_kv_blocks *k, int row);

#endif
