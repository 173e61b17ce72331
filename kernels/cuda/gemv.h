/* Quantised GEMV for batch-1 decode: y = W·x with W in any GGUF weight type (F32, F16, BF16,
 * Q8_0, Q4_K, Q5_K, Q6_K), read block by block, never dequantised whole.
 *
 * Weight layout: gemv_pack re-lays a GGUF tensor out once at load time so every load is 16
 * bytes and coalesced: Q4_K/Q5_K/F32/F16/BF16 stay as GGUF stores them (blocks are 16-byte
 * multiples); Q6_K (210-byte blocks) becomes [blocks][192] ql|qh, then [blocks][16] scales, then
 * [blocks] d; Q8_0 (34-byte blocks) becomes [blocks][32] qs, then [blocks] d.
 *
 * Activations: quantised weight types take x as Q8 (gemv_quantize_x: per 32 elements an int8
 * vector and (d, d·Σq), as ggml's q8_1), so the dot is integer dp4a; float weight types take
 * x as F32. Both forms are passed; each kernel reads the one it needs.
 *
 * CPU twin: quant_matvec (gguf/quant.h) on the dequantised Q8 x (cuda_twin_q8_quantize in
 * kernels/cpu/cuda_twin_q8.h), which is the same sum in a different order. */
#ifndef DS_KERNELS_CUDA_GEMV_H
#define DS_KERNELS_CUDA_GEMV_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix on the device in the GEMV layout: n_out rows of n_in elements. */
typedef struct gemv_matrix {
    uint32_t type;  /* ggml type id */
    int64_t n_in, n_out;
    const void *d_w; /* borrowed, device, gemv_packed_bytes(type, n_in, n_out) bytes */
    int rows_per_warp; /* warp kernel: 1, 2 or 4 rows per warp sharing x loads; 0: by shape */
    int kernel;        /* gemv_kernel: GEMV_KERNEL_AUTO (0) = flat where gemv_flat_supported */
    int unroll;        /* flat kernel, GEMV_STORE only: blocks in flight per lane group, 1 or
                          2 (0: 2); the bench compares them */
} gemv_matrix;

/* The two kernels. Warp: one warp per row (rows_per_warp rows), a grid that strides over rows.
 * Flat: CTA k owns the k-th contiguous stretch of rows (equal to a row), its lane groups walk the
 * stretch's blocks in order whatever row they are in (equal to a block), partials summed per
 * row in shared memory in a fixed order (deterministic); Q4_K and Q6_K with 32 bytes of quants
 * per lane. Both have the fused epilogues (gemv_swiglu_q8, gemv_add_norm); the ring kernel does
 * not (a ring matrix takes the warp kernel for them). */
typedef enum gemv_kernel_kind {
    GEMV_KERNEL_AUTO = 0,
    GEMV_KERNEL_WARP = 1,
    GEMV_KERNEL_FLAT = 2,
    /* Ring (Q4_K, Q5_K; gemv_ring_supported): CTA k owns the k-th contiguous stretch of rows
     * and streams it through a ring of shared-memory stages with cp.async, several stages
     * ahead of the arithmetic (bytes in flight not bounded by registers); x in shared memory.
     * Epilogues: store, add, SwiGLU, conv, argmax; other shapes and modes take the warp kernel. */
    GEMV_KERNEL_RING = 3,
    /* Warp-ring (Q4_K): the warp kernel's rows, each warp streaming its blocks through its own
     * small ring of shared-memory stages by cp.async ahead of the arithmetic, at the warp
     * kernel's occupancy. Epilogues: all but argmax; matrices whose rows do not fill the GPU
     * (the warp kernel would split rows over warps) and argmax take the warp kernel. */
    GEMV_KERNEL_WRING = 4,
} gemv_kernel_kind;

typedef enum gemv_epilogue {
    GEMV_STORE = 0, /* y[r] = W[r]·x */
    GEMV_ADD,       /* y[r] += W[r]·x (residual add fused) */
} gemv_epilogue;

bool gemv_supported(uint32_t type);
/* Bytes of the packed layout (>= the GGUF bytes; 0 when type/n_in is not supported). */
uint64_t gemv_packed_bytes(uint32_t type, int64_t n_in, int64_t n_out);
/* Re-lays d_src (n_out GGUF rows, device) out into d_dst (gemv_packed_bytes). Load time only. */
void gemv_pack(uint32_t type, const void *d_src, void *d_dst, int64_t n_in, int64_t n_out,
               cuda_stream stream);

/* Q8 form of an activation vector of n elements (n % 32 == 0): int8 qs[n], then float2 ds[n/32]
 * (d = max|x|/127 and d·Σq per 32 elements). */
uint64_t gemv_xq_bytes(int64_t n);
void gemv_quantize_x(const float *d_x, void *d_xq, int64_t n, cuda_stream stream);

/* d_x: [n_in] F32, d_xq: gemv_xq_bytes(n_in) (either may be NULL if the type does not read it:
 * float types read d_x, quantised types d_xq); d_y: [n_out]. */
void gemv(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
          gemv_epilogue ep, cuda_stream stream);

/* true when the ring kernel handles this type and row width (Q4_K/Q5_K, n_in % 256 == 0, rows
 * small enough for its shared-memory stages) */
bool gemv_ring_supported(uint32_t type, int64_t n_in);
/* true when the flat kernel handles this type and row width (K-quants: n_in % 256, Q8_0/F32:
 * % 32, F16/BF16: % 64) */
bool gemv_flat_supported(uint32_t type, int64_t n_in);

/* Counters the fused epilogues below need (uint32 words, zero before the first launch; every
 * launch leaves them zero): gemv_sync_words(n_out) for a matrix of n_out rows. Launches on one
 * stream may share one buffer. */
uint64_t gemv_sync_words(int64_t n_out);

/* gemv_swiglu that also writes the Q8 form of d_y (n_out % 32 == 0): the input of the down
 * projection, without a gemv_quantize_x launch. The matrix's kernel: flat (when
 * gemv_flat_supported) or warp. */
void gemv_swiglu_q8(const gemv_matrix *gate, const gemv_matrix *up, const float *d_x,
                    const void *d_xq, float *d_y, void *d_yq, unsigned *d_sync,
                    cuda_stream stream);

/* d_y += W·x (GEMV_ADD: the residual stream), then the RMSNorm of the whole updated d_y
 * (n_out % 32 == 0) times d_norm_w into d_norm_y (F32, may be NULL) and d_norm_yq (Q8):
 * residual add + the next norm in one launch (the last CTA to finish normalises). Same result
 * as gemv(GEMV_ADD) + norm_rms up to float summation order. Flat or warp kernel. */
void gemv_add_norm(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
                   const float *d_norm_w, float eps, float *d_norm_y, void *d_norm_yq,
                   unsigned *d_sync, cuda_stream stream);

/* The next gemv/gemv_swiglu/gemv_conv/gemv_argmax launch from this thread (warp kernel,
 * quantised types, n_in % 32 == 0) takes x = RMSNorm(d_x)·d_w (norm_rms's arithmetic, n_in
 * elements) instead of d_xq: every CTA computes and quantises it into its shared memory, which
 * saves the norm_rms launch. One launch consumes it. */
void gemv_x_norm(const float *d_x, const float *d_w, float eps);

/* The next gemv/gemv_swiglu/gemv_conv/gemv_argmax launch from this thread (warp kernel) also
 * prefetches the first max_bytes of m's weights into L2 once each of its warps is done with its
 * rows (m: the GEMV that follows in the stream; weights never depend on activations). One launch
 * consumes it; NULL or 0 clears it. */
void gemv_prefetch_next(const gemv_matrix *m, uint64_t max_bytes);

/* Host twins for tests without a GPU: gemv_pack on host memory, and the flat kernel's STORE
 * path run serially on the host (same partition into `grid` CTAs, same block walk, same slice
 * code). h_w: packed; x: F32 (float types) or NULL; xq: Q8 x (quantised types) or NULL.
 * Returns 0, or -1 when the flat kernel does not support the type/shape/grid. */
void gemv_pack_host(uint32_t type, const void *src, void *dst, int64_t n_in, int64_t n_out);
int gemv_flat_emulate(uint32_t type, const void *h_w, int64_t n_in, int64_t n_out,
                      const float *x, const void *xq, float *y, int grid);

/* FFN up half fused: d_y[r] = silu(gate[r]·x) * (up[r]·x); gate and up of one type and shape. */
void gemv_swiglu(const gemv_matrix *gate, const gemv_matrix *up, const float *d_x,
                 const void *d_xq, float *d_y, cuda_stream stream);

/* DeltaNet in-projection fused with the causal conv + SiLU (gdn.h gdn_conv): rows r < n_conv
 * get d_y[r] = silu(conv over [conv_state[r] | W[r]·x]) and their conv window shifted;
 * rows r >= n_conv (z, β, α rows packed behind qkv at load) get W[r]·x.
 * conv_w: [n_conv][K_conv]; conv_state: [n_conv][K_conv-1] in/out. */
void gemv_conv(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
               const float *d_conv_w, float *d_conv_state, int64_t n_conv, int K_conv,
               cuda_stream stream);

/* Two GEMVs of the same Q8 input in one launch, on two parts of one grid: d_y0 = W0·x (with
 * gemv_conv's causal conv on its first n_conv rows when d_conv_w is not NULL) and d_y1 = W1·x.
 * For a layer whose in-projection groups are of two weight types (Q4_K_M: the 0.8B's Q6_K qkv
 * beside its Q4_K z|β|α): one dependent step instead of two. Q4_K/Q6_K warp-kernel matrices
 * of one width only (gemv_pair_supported); one row a warp. */
bool gemv_pair_supported(const gemv_matrix *w0, const gemv_matrix *w1);
void gemv_pair(const gemv_matrix *w0, const gemv_matrix *w1, const void *d_xq, float *d_y0,
               float *d_y1, const float *d_conv_w, float *d_conv_state, int64_t n_conv,
               int K_conv, cuda_stream stream);

/* lm_head fused with greedy argmax: d_y = W·x (the logits, [n_out]) and *d_best = max over rows
 * of (ordered value << 32 | ~row), so ties pick the lowest row. *d_best must be 0 before the
 * launch (gemv_argmax_reset, or any earlier kernel of the step). gemv_argmax_row decodes. */
void gemv_argmax(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
                 unsigned long long *d_best, cuda_stream stream);
void gemv_argmax_reset(unsigned long long *d_best, cuda_stream stream);

/* The first kernel of a decode step: takes the token (*d_tok_in when not NULL, else the row
 * gemv_argmax left in *d_best), resets *d_best to 0, writes the token to *d_tok_out, advances
 * the position (d_pos[0] = d_pos[1]++, so d_pos[0] is the position of this token), and writes
 * row `token` of emb (any GEMV layout, dequantised) to d_x [emb->n_in]. */
void gemv_embed_step(const gemv_matrix *emb, const int32_t *d_tok_in,
                     unsigned long long *d_best, int32_t *d_tok_out, int32_t *d_pos,
                     float *d_x, cuda_stream stream);
static inline int32_t gemv_argmax_row(unsigned long long best)
{
    return (int32_t)(~(uint32_t)(best & 0xffffffffu));
}

#ifdef __cplusplus
}
#endif

#endif
