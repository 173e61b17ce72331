/* Gated attention decode on the GPU (docs/QWEN35.md §2.2, §2.3), one token of one sequence:
 *   attn_prep    per-head RMSNorm of q and k (q_norm/k_norm weights, already 1+w), partial
 *                NEOX RoPE on dims [0, n_rot) at position *d_pos, K/V appended to the cache
 *   attn_decode  GQA softmax attention over positions 0..*d_pos (split over super-chunks of
 *                attn_split_positions(n_ctx) positions, then merged), times sigmoid(gate);
 *                output F32 + Q8
 * CPU twins (kernels/cpu/attn.h): ref_attn_prep, ref_attn_decode, ref_sigmoid_gate.
 * The position lives on the device so a captured graph replays for every token. The cache's
 * element type (attn_kv_type) is the caller's choice: F32 holds K and V as computed, F16 halves
 * the bytes read per token and rounds them (2^-11 relative).
 *
 * KV blocks (paged cache): k_cache and v_cache are pools of blocks of ATTN_KV_BLOCK positions,
 * [n_blocks][ATTN_KV_BLOCK][n_kv][d_h] of kv_type (16-byte aligned). Position p of slot s lies
 * in block d_table[s*table_ld + p / ATTN_KV_BLOCK] at row p % ATTN_KV_BLOCK (d_table: int32 on
 * the device, a step input: read after waiting for the preceding launch); d_table NULL: slot s
 * owns blocks s*table_ld .. s*table_ld + table_ld - 1, a contiguous cache of table_ld blocks
 * per slot (one slot and table_ld 0 for B = 1: the plain [n_ctx][n_kv][d_h] cache). Which blocks
 * a slot holds changes nothing in the arithmetic: a paged cache gives bit-identical results.
 *
 * Rows: each function has a *_rows form running B rows (1 <= B <= 65535) in one launch. Row i
 * is the token of sequence slot d_slot[i] at position d_pos[i] (d_pos: [B] int32 on the device,
 * indexed by row; d_slot NULL: slot 0 for every row, for B = 1); the rows of one slot are its
 * consecutive positions (a prompt chunk) or one. ld_*: elements
 * between consecutive rows of a [B][...] activation. There is one kernel per step: the B = 1
 * functions are the rows functions with B = 1 and no slot map (d_pos[0] the position), and the
 * split into chunks and their merge depend only on the row's position, so a row's outputs and
 * cache rows are bit-identical whatever B is and whatever other rows share the launch.
 * d_pos and d_slot are read after waiting for the preceding launch (PDL), except by attn_decode
 * (B = 1), which reads *d_pos and copies the cache rows below it before that wait: the caller
 * promises that the launch just before it (attn_prep) writes neither (only row *d_pos).
 * *_rows_dims: the launch grids (cuda_device.h), for limit checks. */
#ifndef DS_KERNELS_CUDA_ATTN_H
#define DS_KERNELS_CUDA_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/attn_kv_type.h"
#include "kernels/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_CHUNK 32
#define ATTN_KV_BLOCK 64  /* positions of a KV cache block */
#define ATTN_MAX_GROUP 8 /* n_h / n_kv */
#define ATTN_MAX_SPLITS 512 /* most partials of a row (of each head) */

/* Super-chunks: a row's attention is split into partials of S = attn_split_positions(n_ctx)
 * positions each (one (o, m, l) per head), S = ATTN_CHUNK x ceil(chunks / ATTN_MAX_SPLITS) with
 * chunks = ceil(n_ctx / ATTN_CHUNK): ATTN_CHUNK up to 16,384 positions, 512 at 262,144. S is a
 * function of the n_ctx the caller passes (the forward's, fixed) alone, so how a row's positions
 * are split and merged depends on its position and n_ctx only, never on B or the other rows; and
 * a row's partials number attn_n_split(n_ctx) <= ATTN_MAX_SPLITS whatever the context, which
 * bounds the partial buffers (attn_partial_floats). */
static inline int attn_split_positions(int n_ctx)
{
    const int chunks = (n_ctx + ATTN_CHUNK - 1) / ATTN_CHUNK;
    return ATTN_CHUNK * ((chunks + ATTN_MAX_SPLITS - 1) / ATTN_MAX_SPLITS);
}
static inline int attn_n_split(int n_ctx)
{
    const int S = attn_split_positions(n_ctx);
    return (n_ctx + S - 1) / S;
}

/* qg: [n_h][2][d_h] (attn_q output: per head the query then the gate); k, v: [n_kv][d_h];
 * q_norm_w, k_norm_w: [d_h]; k_cache, v_cache: the slot's blocks (d_table: its row of the
 * block table, or NULL: a plain [n_ctx][n_kv][d_h] cache) of kv_type, position *d_pos written;
 * q_out: [n_h][d_h] normalised and rotated query. d_h % 32 == 0, d_h <= 256. */
void attn_prep(const float *d_qg, const float *d_k, const float *d_v, const float *d_q_norm_w,
               const float *d_k_norm_w, int n_h, int n_kv, int d_h, int n_rot,
               float rope_base, float eps, const int32_t *d_pos, const int32_t *d_table,
               void *d_k_cache, void *d_v_cache, float *d_q_out, attn_kv_type kv_type,
               const cuda_launch *l);
/* Rows: qg, k, v of row i at d_qg + i*ld_in, d_k + i*ld_in, d_v + i*ld_in (one stride: the
 * three are slices of one projection row); q_out row i at d_q_out + i*ld_q; position d_pos[i]
 * of slot d_slot[i] written ("KV blocks"). */
void attn_prep_rows(const float *d_qg, const float *d_k, const float *d_v, int64_t ld_in,
                    const float *d_q_norm_w, const float *d_k_norm_w, int n_h, int n_kv, int d_h,
                    int n_rot, float rope_base, float eps, const int32_t *d_pos,
                    const int32_t *d_slot, const int32_t *d_table, int table_ld,
                    void *d_k_cache, void *d_v_cache, float *d_q_out, int64_t ld_q,
                    attn_kv_type kv_type, int B, const cuda_launch *l);
cuda_launch_dims attn_prep_rows_dims(int n_h, int n_kv, int d_h, int B);

/* Floats of scratch attn_decode needs for a cache of n_ctx positions (attn_n_split(n_ctx)
 * partials of every head); attn_decode_rows needs B times that (row i's at
 * d_partial + i*attn_partial_floats). */
int64_t attn_partial_floats(int n_h, int d_h, int n_ctx);
int64_t attn_partial_floats_rows(int n_h, int d_h, int n_ctx, int B);

/* o = concat_h(softmax(q_h·K/sqrt(d_h)) V) ⊙ sigmoid(gate_h); q: [n_h][d_h] (attn_prep);
 * qg: the gates as in attn_prep; caches as above (the kv_type attn_prep wrote) with positions
 * 0..*d_pos valid;
 * partial: attn_partial_floats; o: [n_h·d_h] F32 (may be NULL); o_q8: gemv_xq_bytes (may be
 * NULL). */
void attn_decode(const float *d_q, const float *d_qg, const int32_t *d_table,
                 const void *d_k_cache, const void *d_v_cache, int n_h, int n_kv, int d_h,
                 int n_ctx, const int32_t *d_pos, float *d_partial, float *d_o, void *d_o_q8,
                 attn_kv_type kv_type, const cuda_launch *l);
/* Rows: row i attends over positions 0..d_pos[i] of slot d_slot[i]'s caches (n_ctx positions
 * each); q, qg, o rows at d_q + i*ld_q, d_qg + i*ld_qg, d_o + i*ld_o (d_o may be NULL); the Q8
 * form of row i at (uint8_t *)d_o_q8 + i*gemv_xq_bytes(n_h·d_h) (may be NULL); d_partial:
 * attn_partial_floats_rows. The grid covers every super-chunk of n_ctx at B = 1; at B > 1 it has
 * fewer split CTAs per row (attn_decode_rows_dims: about 8192 CTAs in all), each looping over the
 * row's super-chunks below its position and leaving at once past it, so short rows in a large
 * batch cost little and no host-side position bound is needed (the grid is fixed for a CUDA
 * graph). */
void attn_decode_rows(const float *d_q, int64_t ld_q, const float *d_qg, int64_t ld_qg,
                      const void *d_k_cache, const void *d_v_cache, const int32_t *d_slot,
                      const int32_t *d_table, int table_ld, const int32_t *d_pos,
                      const int32_t *d_skip, int n_h, int n_kv, int d_h, int n_ctx,
                      float *d_partial, float *d_o, int64_t ld_o, void *d_o_q8,
                      attn_kv_type kv_type, int B, const cuda_launch *l);
/* The grids of attn_decode_rows' two launches (the chunk partials, then their merge). */
void attn_decode_rows_dims(int n_h, int n_kv, int d_h, int n_ctx, int B, cuda_launch_dims *split,
                           cuda_launch_dims *combine);

/* Prefill runs (prompt chunks): rows in runs of one sequence (kernels/cuda/gdn.h "Runs": d_run =
 * [2][R] first rows and lengths; d_long = the number of long runs, then their indices, each of
 * long_rows >= 2 rows or more), each row at its own position d_pos[row] of slot d_slot[first
 * row]'s F16 cache blocks ("KV blocks"), whose rows up to the run's last position attn_prep_rows
 * has written. attn_prefill_runs computes the softmax attention of every row of the long runs:
 * a tile of 64 / G rows and the G query heads of one KV head a CTA, over one of 16 segments of
 * the tile's positions (whole super-chunks each); K and V read once a tile, on tensor cores (F16 products with F16
 * remainders for q and the probabilities, F32 scores, softmax and sums); each segment written as
 * one of the row's partials (d_partial as attn_decode_rows'). attn_decode_rows with d_skip (1 for
 * those rows, 0 for the others) then leaves their chunks alone and merges and gates every row.
 * Equal to attn_decode_rows in exact arithmetic, not bit for bit. attn_prefill_init (once,
 * before the first launch or capture) raises the kernel's shared memory limit. */
int attn_prefill_init(status *st);
size_t attn_prefill_smem_bytes(int d_h); /* 0 for an unsupported d_h */
void attn_prefill_runs(const float *d_q, int64_t ld_q, const void *d_k_cache,
                       const void *d_v_cache, const int32_t *d_slot, const int32_t *d_table,
                       int table_ld, const int32_t *d_pos, const int32_t *d_run,
                       const int32_t *d_long, int n_h, int n_kv, int d_h, int n_ctx,
                       float *d_partial, int B, int R, int long_rows, const cuda_launch *l);
cuda_launch_dims attn_prefill_runs_dims(int n_h, int n_kv, int B, int long_rows);

#ifdef __cplusplus
}
#endif

#endif
