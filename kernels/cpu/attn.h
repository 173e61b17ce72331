/* Causal softmax attention over a KV cache (docs/QWEN35.md §2.2). FP32, except the F16
 * cache that ref_attn_prep (the twin of the GPU's attn_prep) writes when asked for one.
 * Positions are taken in blocks of REF_ATTN_BLOCK: scores within a block are exact two-pass
 * softmax terms, and blocks are merged with the running-max rescaling of flash attention, so
 * the scratch does not grow with the context. */
#ifndef DS_KERNELS_CPU_ATTN_H
#define DS_KERNELS_CPU_ATTN_H

#include <stdint.h>

#include "kernels/attn_kv_type.h"

#define REF_ATTN_BLOCK 256
#define REF_ATTN_PREP_MAX_D_H 256 /* as the CUDA kernel: one thread per dim, d_h <= 256 */

/* One query head over n >= 1 cached positions: o = Σ_t softmax_t(q·k_t · scale) v_t.
 * q: [d_h]; position t's key/value at k + t*ld, v + t*ld (head offset already applied);
 * scores: [REF_ATTN_BLOCK] scratch; o: [d_h]. */
void ref_attn_head(const float *q, const float *k, const float *v, long ld, int n, int d_h,
                   float scale, float *scores, float *o);

/* ref_attn_head over a paged cache (the CPU forward's; kernels/cuda/attn.h "KV blocks"):
 * position t's key and value rows at k + table[t / block_tokens] * block_ld
 * + (t % block_tokens) * ld, and v alike (head offset already applied). Each row is read where
 * it lies: nothing is gathered. ref_attn_head is the one-block case. */
void ref_attn_head_paged(const float *q, const float *k, const float *v, const int32_t *table,
                         int block_tokens, long block_ld, long ld, int n, int d_h, float scale,
                         float *scores, float *o);

/* One token, all heads (GQA: query head h reads KV head h / (n_h / n_kv)).
 * q: [n_h][d_h]; k_cache, v_cache: [n][n_kv][d_h] (positions 0..n-1, the new token's included);
 * scores: [REF_ATTN_BLOCK]; o: [n_h][d_h]. */
void ref_attn_decode(const float *q, const float *k_cache, const float *v_cache, int n, int n_h,
                     int n_kv, int d_h, float scale, float *scores, float *o);

/* Twin of attn_prep (kernels/cuda/attn.h), same arguments on host memory; one token:
 * q_out_h = RoPE(RMSNorm(q_h) · q_norm_w), K_j = RoPE(RMSNorm(k_j) · k_norm_w), V_j = v_j, the
 * RoPE partial NEOX on dims [0, n_rot) at position *pos with rope_base (ref_rope).
 * qg: [n_h][2][d_h] (per head the query then the gate, which is not read); k, v: [n_kv][d_h];
 * q_norm_w, k_norm_w: [d_h] (already 1 + w); k_cache, v_cache: [n_ctx][n_kv][d_h] of kv_type
 * (ATTN_KV_F16: ggml_half; ATTN_KV_F32: float, stored as computed), only row *pos written;
 * q_out: [n_h][d_h]. d_h <= REF_ATTN_PREP_MAX_D_H, n_rot even and <= d_h. */
void ref_attn_prep(const float *qg, const float *k, const float *v, const float *q_norm_w,
                   const float *k_norm_w, int n_h, int n_kv, int d_h, int n_rot,
                   float rope_base, float eps, const int32_t *pos, void *k_cache, void *v_cache,
                   float *q_out, attn_kv_type kv_type);

#endif
