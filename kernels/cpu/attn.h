/* Causal softmax attention over a KV cache (shared/QWEN35.md §2.2). FP32.
 * Positions are taken in blocks of REF_ATTN_BLOCK: scores within a block are exact two-pass
 * softmax terms, and blocks are merged with the running-max rescaling of flash attention, so
 * the scratch does not grow with the context. */
#ifndef DS_KERNELS_CPU_ATTN_H
#define DS_KERNELS_CPU_ATTN_H

#define REF_ATTN_BLOCK 256

/* One query head over n >= 1 cached positions: o = Σ_t softmax_t(q·k_t · scale) v_t.
 * q: [d_h]; position t's key/value at k + t*ld, v + t*ld (head offset already applied);
 * scores: [REF_ATTN_BLOCK] scratch; o: [d_h]. */
void ref_attn_head(const float *q, const float *k, const float *v, long ld, int n, int d_h,
                   float scale, float *scores, float *o);

/* One token, all heads (GQA: query head h reads KV head h / (n_h / n_kv)).
 * q: [n_h][d_h]; k_cache, v_cache: [n][n_kv][d_h] (positions 0..n-1, the new token's included);
 * scores: [REF_ATTN_BLOCK]; o: [n_h][d_h]. */
void ref_attn_decode(const float *q, const float *k_cache, const float *v_cache, int n, int n_h,
                     int n_kv, int d_h, float scale, float *scores, float *o);

#endif
