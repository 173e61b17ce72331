/* Gated DeltaNet building blocks (docs/QWEN35.md §2.4 decode, §2.5 prefill, §3 chunked).
 * Dimension names: model/README.md. State S of one value head is [d_v][d_k] (key-contiguous,
 * llama.cpp's layout: HF's S[i][j] lives at S[j*d_k + i]). Value head hv uses key head
 * hv % n_k (GGUF tiled order). All arithmetic FP32.
 *
 * bf16 state storage (fwd_opts.state_dtype, the GPU's S in bf16): the functions taking `bf16`
 * round S to bf16 (round to nearest even, ref_gdn_round_bf16) where the GPU stores it: after
 * every token of the row-by-row rule, after every chunk of the chunked one. S then holds bf16
 * values in F32 floats; false leaves every result bit-for-bit what it is without the flag. */
#ifndef DS_KERNELS_CPU_GDN_H
#define DS_KERNELS_CPU_GDN_H

#include <stdbool.h>

/* Causal depthwise conv1d + SiLU over T tokens of C channels (no bias).
 * x: T rows of stride ldx (channels [0, C) used); w: [C][K_conv] (w[c][K_conv-1] multiplies the
 * newest input); state: [C][K_conv-1] in/out, oldest first (zeros for a new sequence);
 * y: [T][C], must not alias x. New state = last K_conv-1 columns of [state | x]. */
void ref_gdn_conv(const float *x, long ldx, int T, int C, int K_conv, const float *w,
                  float *state, float *y);

/* On one token's conv output y = [q (n_k·d_k) | k (n_k·d_k) | v]: L2-normalise every q and k
 * head (x / sqrt(Σx² + eps)) and scale q by 1/sqrt(d_k). In place. */
void ref_gdn_qk_norm(float *y, int n_k, int d_k, float eps);

/* β = sigmoid(b), g = ssm_a · softplus(a + dt_bias) (ssm_a = −exp(A_log)), for n_v heads. */
void ref_gdn_gates(const float *b, const float *a, const float *dt_bias, const float *ssm_a,
                   int n_v, float *beta, float *g);

/* One token of the gated delta rule for one value head (S: [d_v][d_k] in/out, o: [d_v]):
 *   S ← e^g S;  u = Sᵀk;  S ← S + k (β(v − u))ᵀ;  o = Sᵀq   (o uses the updated state). */
void ref_gdn_step(const float *q, const float *k, const float *v, float beta, float g, int d_k,
                  int d_v, float *S, float *o);

/* S[0 .. n) rounded in place to the nearest bf16 value (ties to even; the GPU's store of a bf16
 * state, __float2bfloat16_rn). */
void ref_gdn_round_bf16(float *S, long n);

/* T tokens of one value head: token t reads q + t*ld_qk, k + t*ld_qk, v + t*ld_v,
 * beta[t*ld_g], g[t*ld_g] and writes o + t*ld_o [d_v]. S: [d_v][d_k] in/out; bf16: rounded
 * after every token (a token's output is computed before its rounding). */
void ref_gdn_recurrent(int T, const float *q, const float *k, long ld_qk, const float *v,
                       long ld_v, const float *beta, const float *g, long ld_g, int d_k, int d_v,
                       float *S, bool bf16, float *o, long ld_o);

#define REF_GDN_CHUNK 64

/* Floats of scratch ref_gdn_chunked needs. */
long ref_gdn_chunked_scratch_floats(int d_k, int d_v);

/* Same contract as ref_gdn_recurrent, computed by the chunked (WY / UT-transform) algorithm of
 * docs/QWEN35.md §3 over chunks of REF_GDN_CHUNK tokens. Equal to the recurrence in exact
 * arithmetic. scratch: ref_gdn_chunked_scratch_floats(d_k, d_v) floats. bf16: S rounded after
 * every chunk (chunks start at token 0: where gdn_chunk_runs stores S). */
void ref_gdn_chunked(int T, const float *q, const float *k, long ld_qk, const float *v,
                     long ld_v, const float *beta, const float *g, long ld_g, int d_k, int d_v,
                     float *S, bool bf16, float *o, long ld_o, float *scratch);

/* Floats of scratch ref_gdn_decode needs. */
long ref_gdn_decode_scratch_floats(int C, int n_v);

/* The whole DeltaNet mixer of one token of one sequence, between the projections and ssm_out
 * (the twin of the fused CUDA decode kernel): conv window + SiLU, q/k L2 norms, q scale,
 * gates, delta rule on every value head, gated RMSNorm with silu(z).
 * mixed: [C] = W_qkv·h; z: [D_v]; b, a: [n_v]; conv_w: [C][K_conv]; dt_bias, ssm_a: [n_v];
 * norm_w: [d_v]; conv_state: [C][K_conv-1] and S: [n_v][d_v][d_k] in/out (bf16: S rounded
 * after the step; the conv window stays F32); y: [D_v] out. */
void ref_gdn_decode(const float *mixed, const float *z, const float *b, const float *a,
                    const float *conv_w, const float *dt_bias, const float *ssm_a,
                    const float *norm_w, int n_k, int n_v, int d_k, int d_v, int K_conv,
                    float eps, float *conv_state, float *S, bool bf16, float *y, float *scratch);

#endif
