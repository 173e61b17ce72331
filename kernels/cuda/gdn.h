/* Gated DeltaNet decode on the GPU (docs/QWEN35.md §2.4), one token of one sequence, in three
 * steps whose composition is the CPU twin ref_gdn_decode (kernels/cpu/gdn.h):
 *   gdn_conv        conv window update + SiLU (also fused into the qkv GEMV: gemv_conv)
 *   gdn_decode      q/k L2 norms, q scale, gates, the delta rule (FP32 arithmetic)
 *   gdn_norm_gated  gated RMSNorm with silu(z), output F32 + Q8 for the ssm_out GEMV
 * Dimension names: model/README.md. S layout: [n_v][d_v][d_k] (key-contiguous, as the CPU's),
 * F32 or bf16 ("State storage" below).
 * Value head hv uses key head hv % n_k. d_k and d_v must be 32, 64 or 128 (asserted).
 *
 * Rows: each step also has a *_rows form running B rows (1 <= B <= 65535) in one launch, row i
 * of sequence slot d_slot[i]. ld_*: elements between consecutive rows of a [B][...] activation;
 * a state's slot stride is in elements (floats; S's in its storage type's); slot s's state is at base + s*stride (d_slot
 * NULL: every row uses the base, for B = 1). The slots of one launch must be distinct. There is
 * one kernel per step: the B = 1 functions are the rows functions with B = 1 and no slot map,
 * so a row's outputs and state are bit-identical whatever B is and whatever other rows share
 * the launch. d_slot is a step input: gdn_decode_rows reads it before waiting for the preceding
 * launch under PDL (to start loading S early), so it must not be written by the launch just
 * before that one (uploading it at the start of the step is fine). *_rows_dims: the launch
 * grids, for limit checks.
 *
 * Runs (prefill): gdn_conv_runs and gdn_decode_runs take rows in runs, d_run = [2][R]: run r is
 * rows [d_run[r], d_run[r] + d_run[R + r]), consecutive tokens of one sequence in position order,
 * slot d_slot[d_run[r]]; a run of length 0 does nothing (a bucket's unused runs). A launch takes
 * up to R runs (the grid's row dimension is R), their slots distinct. A run's rows go through
 * the state in order, the delta-rule state kept on chip between them and written back once:
 * every row's output and the final state are bit-identical to the rows launchers run once per
 * row in order (the rows launchers are the runs launchers with runs of one row). d_run is a step
 * input, like d_slot. gdn_decode_runs with long_rows > 0 leaves the runs of long_rows rows or
 * more to gdn_chunk_runs (below); 0 takes every run.
 *
 * Keep (verify runs of speculative decoding): d_keep NULL, or [R's rows]: d_keep[row] >= 0 is
 * a slot index (in the same slot stride as d_slot's) where the state after that row is written
 * too: the conv window by gdn_conv_runs, S by gdn_decode_runs (bf16: the rounded values a store
 * after that row would hold), bit-identical to the slot's state had the run stopped there; -1:
 * nothing kept. Keep slots are distinct from every run's slot and from each other. Only for
 * runs gdn_decode_runs takes (not the chunked ones). d_keep is a step input, like d_run.
 *
 * State storage: S_bf16 false: S is F32; true: S is bf16 (uint16_t bit patterns of bfloat16),
 * loaded into F32, updated in F32 (the decay and the gates F32 too) and stored rounded to
 * nearest even. The row rule rounds S after every row (a run's rows too, though S stays on chip
 * between them: a run still equals its rows one at a time); the chunked rule after every chunk.
 * The CPU twins round at the same points (kernels/cpu/gdn.h, `bf16`). Slot strides and pointers
 * are then in bf16 elements; the conv windows are F32 either way. Each kernel is instantiated
 * for both types: the F32 one is the same code as without the choice. */
#ifndef DS_KERNELS_CUDA_GDN_H
#define DS_KERNELS_CUDA_GDN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mixed: [C] = W_qkv·h; conv_w: [C][K_conv]; conv_state: [C][K_conv-1] in/out (oldest first);
 * out: [C] = silu(conv). */
void gdn_conv(const float *d_mixed, const float *d_conv_w, float *d_conv_state, int C,
              int K_conv, float *d_out, const cuda_launch *l);
/* Rows: mixed row i at d_mixed + i*ld_mixed, out row i at d_out + i*ld_out (d_out may be d_mixed
 * with ld_out == ld_mixed: in place), conv state of row i at
 * d_conv_state + d_slot[i]*state_slot_stride. */
void gdn_conv_rows(const float *d_mixed, int64_t ld_mixed, const float *d_conv_w,
                   float *d_conv_state, int64_t state_slot_stride, const int32_t *d_slot, int C,
                   int K_conv, float *d_out, int64_t ld_out, int B, const cuda_launch *l);
/* Runs: conv state of run r at d_conv_state + d_slot[start]*state_slot_stride. long_rows > 0
 * (prompt chunks of that many rows expected beside the decode rows): each thread loads 32 rows
 * of a run ahead instead of 8 (more registers; the same arithmetic, bit for bit). */
void gdn_conv_runs(const float *d_mixed, int64_t ld_mixed, const float *d_conv_w,
                   float *d_conv_state, int64_t state_slot_stride, const int32_t *d_slot,
                   const int32_t *d_run, const int32_t *d_keep, int long_rows, int C, int K_conv,
                   float *d_out, int64_t ld_out, int R, const cuda_launch *l);
cuda_launch_dims gdn_conv_rows_dims(int C, int B); /* also of R runs */

/* conv: [C] = [q (n_k·d_k) | k (n_k·d_k) | v (n_v·d_v)] after gdn_conv; b, a: [n_v] (W_beta·h,
 * W_alpha·h); dt_bias, ssm_a: [n_v]; S: [n_v][d_v][d_k] in/out (F32, or bf16 with S_bf16);
 * o: [n_v·d_v] raw outputs. */
void gdn_decode(const float *d_conv, const float *d_b, const float *d_a, const float *d_dt_bias,
                const float *d_ssm_a, int n_k, int n_v, int d_k, int d_v, float eps, void *d_S,
                bool S_bf16, float *d_o, const cuda_launch *l);
/* Rows: conv row i at d_conv + i*ld_conv; b, a of row i at d_b + i*ld_ba, d_a + i*ld_ba; S of
 * row i at d_S + d_slot[i]*S_slot_stride elements (d_S 16-byte aligned, S_slot_stride % 4 ==
 * 0: asserted); o row i at d_o + i*ld_o. */
void gdn_decode_rows(const float *d_conv, int64_t ld_conv, const float *d_b, const float *d_a,
                     int64_t ld_ba, const float *d_dt_bias, const float *d_ssm_a, int n_k,
                     int n_v, int d_k, int d_v, float eps, void *d_S, bool S_bf16,
                     int64_t S_slot_stride, const int32_t *d_slot, float *d_o, int64_t ld_o,
                     int B, const cuda_launch *l);
void gdn_decode_runs(const float *d_conv, int64_t ld_conv, const float *d_b, const float *d_a,
                     int64_t ld_ba, const float *d_dt_bias, const float *d_ssm_a, int n_k,
                     int n_v, int d_k, int d_v, float eps, void *d_S, bool S_bf16,
                     int64_t S_slot_stride, const int32_t *d_slot, const int32_t *d_run,
                     const int32_t *d_keep, int long_rows, float *d_o, int64_t ld_o, int R,
                     const cuda_launch *l);
/* also of R runs, but for gdn_decode_runs with long_rows > 0: at most 64 in z, each CTA taking
 * every 64th run */
cuda_launch_dims gdn_decode_rows_dims(int n_v, int d_v, int B);

/* Chunked runs (prefill): the same contract as gdn_decode_runs for the runs d_long lists (the
 * long ones: the caller's choice, each of long_rows >= 2 rows or more; a run of one row listed
 * is skipped), computed by the chunked WY / UT form of the CPU twin ref_gdn_chunked
 * (kernels/cpu/gdn.h) over chunks of 64 rows from each run's first row: equal to the row-by-row
 * rule in exact arithmetic, not bit for bit (a run's results depend on where its chunks start).
 * Two launches: what does not depend on the state, for every chunk and head at once, into
 * d_scratch (gdn_chunk_scratch_floats for a pass of `rows` rows); then per run, head and 32
 * state columns (kept in shared memory through the run) the chunks in order, the grid's third
 * dimension taking min(R, 8) runs at a time. d_long (a step input, like d_run): the number of
 * long runs, then their indices in d_run; their rows add up to at most `rows`.
 * gdn_chunk_init (once, before the first launch or capture) raises the kernels' shared memory
 * limit; gdn_chunk_smem_bytes: the most one CTA takes (0 for an unsupported d_k). */
int gdn_chunk_init(status *st);
size_t gdn_chunk_smem_bytes(int d_k);
int64_t gdn_chunk_scratch_floats(int n_v, int d_k, int d_v, int rows, int long_rows);
void gdn_chunk_runs(const float *d_conv, int64_t ld_conv, const float *d_b, const float *d_a,
                    int64_t ld_ba, const float *d_dt_bias, const float *d_ssm_a, int n_k, int n_v,
                    int d_k, int d_v, float eps, void *d_S, bool S_bf16, int64_t S_slot_stride,
                    const int32_t *d_slot, const int32_t *d_run, const int32_t *d_long,
                    float *d_o, int64_t ld_o, int R, int rows, int long_rows, float *d_scratch,
                    const cuda_launch *l);
cuda_launch_dims gdn_chunk_runs_dims(int n_v, int d_v, int R);

/* y_hv = RMSNorm(o_hv) · norm_w · silu(z_hv) per value head. o, z: [n_v·d_v]; norm_w: [d_v];
 * y: [n_v·d_v] F32 (may be NULL); y_q8: gemv_xq_bytes(n_v·d_v) (may be NULL). */
void gdn_norm_gated(const float *d_o, const float *d_z, const float *d_norm_w, int n_v, int d_v,
                    float eps, float *d_y, void *d_y_q8, const cuda_launch *l);
/* Rows: o, z, y row i at d_o + i*ld_o, d_z + i*ld_z, d_y + i*ld_y (d_y may be NULL); the Q8 form
 * of row i at (uint8_t *)d_y_q8 + i*gemv_xq_bytes(n_v·d_v) (may be NULL). */
void gdn_norm_gated_rows(const float *d_o, int64_t ld_o, const float *d_z, int64_t ld_z,
                         const float *d_norm_w, int n_v, int d_v, float eps, float *d_y,
                         int64_t ld_y, void *d_y_q8, int B, const cuda_launch *l);
cuda_launch_dims gdn_norm_gated_rows_dims(int n_v, int d_v, int B);

#ifdef __cplusplus
}
#endif

#endif
