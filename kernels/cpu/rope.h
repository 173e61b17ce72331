/* Partial NEOX rotary embedding (docs/QWEN35.md §2.3: for text, Qwen3.5's interleaved MRoPE
 * is exactly this). Dims [0, n_rot) of each head are rotated, pairing i with i + n_rot/2;
 * dims [n_rot, d_h) pass through. θ_i = pos · base^(−2i/n_rot), computed as HF does in FP32:
 * inv_freq_i = 1 / base^(2i/n_rot), angle = pos · inv_freq_i. */
#ifndef DS_KERNELS_CPU_ROPE_H
#define DS_KERNELS_CPU_ROPE_H

/* x: [n_heads][d_h] in place. */
void ref_rope(float *x, int n_heads, int d_h, int n_rot, int pos, float base);

#endif
