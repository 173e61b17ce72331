/* Quantised GEMV for batch-1 decode: y = W·x with W in any GGUF weight type (F32, F16, BF16,
 * Q8_0, Q4_K, Q5_K, Q6_K), read block by block, never dequantised whole. The family header of
 * gemv_plan.cu (tuning table, planning, dispatch), gemv_warp.cu, gemv_flat.cu, gemv_pair.cu,
 * gemv_pack.cu (load-time repack, the Q8 activation quantiser) and embed.cu (the embedding step).
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
 * Launch configuration: gemv_init once per device, then gemv_matrix_plan once per matrix at
 * load time picks the kernel and its shape from the tuning table (gemv_plan.cuh, the H200's
 * measured choices) and the device; every launch reads only that plan (no device queries, no
 * state of its own).
 *
 * CPU twin: quant_matvec (gguf/quant.h) on the dequantised Q8 x (gpu_twin_q8_quantize in
 * tests/gpu/gpu_parity.h), which is the same sum in a different order. */
#ifndef DS_KERNELS_CUDA_GEMV_H
#define DS_KERNELS_CUDA_GEMV_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The two kernels. Warp: one warp per row (rows_per_warp rows, or 2-4 warps per row when the
 * rows alone leave the GPU half empty), a grid that strides over rows. Flat: CTA k owns the
 * k-th contiguous stretch of rows (equal to a row), its lane groups walk the stretch's blocks in
 * order whatever row they are in (equal to a block), partials summed per row in shared memory
 * in a fixed order (deterministic); Q4_K and Q6_K with 32 bytes of quants per lane. Both have
 * every epilogue (store, add, SwiGLU, conv, argmax); gemv_pair is warp only. */
typedef enum gemv_kernel_kind {
    GEMV_KERNEL_AUTO = 0, /* gemv_matrix.kernel before planning: the tuning table decides */
    GEMV_KERNEL_WARP = 1,
    GEMV_KERNEL_FLAT = 2,
} gemv_kernel_kind;

/* One launch of a planned matrix with one epilogue. */
typedef struct gemv_shape {
    uint32_t grid;    /* CTAs */
    uint32_t smem;    /* dynamic shared memory, bytes (flat kernel: the partials) */
    uint8_t wpr;      /* warp kernel: warps per row (1, 2, 4), splitting its blocks */
    uint8_t prefetch; /* warp kernel: row groups prefetched into L2 ahead (0..2) */
    uint8_t rows;     /* gemv_cols: rows a warp (1, 2, 4) sharing each column's x loads */
} gemv_shape;

#define GEMV_N_SHAPES 5 /* one per epilogue: store, add, SwiGLU, argmax, conv */

/* gemv_matrix_plan's output: what every launch of the matrix reads. */
typedef struct gemv_plan {
    int kernel;                      /* GEMV_KERNEL_WARP or GEMV_KERNEL_FLAT; 0: not planned */
    int rows_per_warp;               /* warp kernel: 1, 2 or 4 rows per warp sharing x loads */
    int prefetch;                    /* warp kernel: the table's L2 prefetch depth (row groups
                                        ahead; each shape lowers it to fit the L2 budget) */
    int sm_count;                    /* of the device planned for */
    gemv_shape shape[GEMV_N_SHAPES]; /* by epilogue */
    uint8_t pair_per_sm[2][2];       /* gemv_pair with this matrix first, Q4_K/Q6_K only: CTAs
                                        per SM of the pair kernel, [store, conv][partner Q4_K,
                                        Q6_K] */
    gemv_shape cols[3];              /* gemv_cols' builds of 1, 2 and 4 columns (grid 0: the
                                        type or width has none, gemv_cols_supported) */
    gemv_shape cols_swiglu[3];       /* gemv_cols_swiglu's, this matrix the gate */
} gemv_plan;

/* A weight matrix on the device in the GEMV layout: n_out rows of n_in elements. Set the first
 * four fields (and kernel / rows_per_warp to force a choice: tests and benches), zero the rest,
 * then gemv_matrix_plan. */
typedef struct gemv_matrix {
    uint32_t type; /* ggml type id */
    int64_t n_in, n_out;
    const void *d_w;   /* borrowed, device, gemv_packed_bytes(type, n_in, n_out) bytes */
    int kernel;        /* GEMV_KERNEL_AUTO: the tuning table; WARP / FLAT: forced */
    int rows_per_warp; /* warp kernel: 0 = the tuning table; 1, 2 or 4: forced */
    int cols_rows;     /* gemv_cols' rows a warp: 0 = its table; 1, 2 or 4: forced (benches) */
    gemv_plan plan;    /* filled by gemv_matrix_plan */
} gemv_matrix;

typedef enum gemv_epilogue {
    GEMV_STORE = 0, /* y[r] = W[r]·x */
    GEMV_ADD,       /* y[r] += W[r]·x (residual add fused) */
} gemv_epilogue;

/* Once per device, before planning: STATUS_UNSUPPORTED when the device cannot run the GEMV
 * kernels (they are built for sm_90 only). */
int gemv_init(const cuda_device_props *p, status *st);

/* Fills m->plan from the tuning table and the device (load time: it queries occupancy). The
 * matrix's type, shape and d_w must be set; STATUS_UNSUPPORTED when the type/width has no
 * kernel, or a forced kernel cannot take the shape. */
int gemv_matrix_plan(gemv_matrix *m, const cuda_device_props *p, status *st);

bool gemv_supported(uint32_t type);
/* true when the flat kernel handles this type and row width (K-quants: n_in % 256, Q8_0/F32:
 * % 32, F16/BF16: % 64, and a row's partials fit its shared memory) */
bool gemv_flat_supported(uint32_t type, int64_t n_in);
/* Bytes of the packed layout (>= the GGUF bytes; 0 when type/n_in is not supported). */
uint64_t gemv_packed_bytes(uint32_t type, int64_t n_in, int64_t n_out);
/* Re-lays d_src (n_out GGUF rows, device) out into d_dst (gemv_packed_bytes). Load time only. */
void gemv_pack(uint32_t type, const void *d_src, void *d_dst, int64_t n_in, int64_t n_out,
               cuda_stream stream);

/* Q8 form of an activation vector of n elements (n % 32 == 0): int8 qs[n], then float2 ds[n/32]
 * (d = max|x|/127 and d·Σq per 32 elements). */
uint64_t gemv_xq_bytes(int64_t n);
void gemv_quantize_x(const float *d_x, void *d_xq, int64_t n, const cuda_launch *l);
/* The Q8 forms of B rows of x ([B][ld_x] F32, the first n of each): row i at
 * d_xq + i * gemv_xq_bytes(n), as the rows kernels write their Q8 outputs (norm_rms_rows...),
 * each as gemv_quantize_x writes it. */
void gemv_quantize_rows(const float *d_x, int64_t ld_x, void *d_xq, int64_t n, int B,
                        const cuda_launch *l);
/* The Q8_K forms of B rows of x (n % 256 == 0), in the same row slots: int8 qs[n], then float
 * d[n/256], each 256 values quantised as the CPU's Q8_K (gguf/quant.h, quant_quantize_row_q8_K_ref:
 * the value of largest |x| maps to -127, round half to even; qs and d bit-identical to it). */
void gemv_quantize_rows_k(const float *d_x, int64_t ld_x, void *d_xq, int64_t n, int B,
                          const cuda_launch *l);

/* The launchers below take planned matrices (asserted; gemv_embed_step reads only the layout).
 * d_x: [n_in] F32, d_xq: gemv_xq_bytes(n_in) (either may be NULL if the type does not read it:
 * float types read d_x, quantised types d_xq); d_y: [n_out]. */
void gemv(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
          gemv_epilogue ep, const cuda_launch *l);

/* FFN up half fused: d_y[r] = silu(gate[r]·x) * (up[r]·x); gate and up of one type and shape
 * (gate's plan runs both). */
void gemv_swiglu(const gemv_matrix *gate, const gemv_matrix *up, const float *d_x,
                 const void *d_xq, float *d_y, const cuda_launch *l);

/* DeltaNet in-projection fused with the causal conv + SiLU (gdn.h gdn_conv): rows r < n_conv
 * get d_y[r] = silu(conv over [conv_state[r] | W[r]·x]) and their conv window shifted;
 * rows r >= n_conv (z, β, α rows packed behind qkv at load) get W[r]·x.
 * conv_w: [n_conv][K_conv]; conv_state: [n_conv][K_conv-1] in/out. */
void gemv_conv(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
               const float *d_conv_w, float *d_conv_state, int64_t n_conv, int K_conv,
               const cuda_launch *l);

/* Two GEMVs of the same Q8 input in one launch, on two parts of one grid: d_y0 = W0·x (with
 * gemv_conv's causal conv on its first n_conv rows when d_conv_w is not NULL) and d_y1 = W1·x.
 * For a layer whose in-projection groups are of two weight types (Q4_K_M: the 0.8B's Q6_K qkv
 * beside its Q4_K z|β|α): one dependent step instead of two. gemv_pair_supported: Q4_K/Q6_K
 * matrices planned on the warp kernel, of one width (one row a warp in the pair);
 * gemv_pair_planned: supported, and the tuning table says pair them (small enough). */
bool gemv_pair_supported(const gemv_matrix *w0, const gemv_matrix *w1);
bool gemv_pair_planned(const gemv_matrix *w0, const gemv_matrix *w1);
void gemv_pair(const gemv_matrix *w0, const gemv_matrix *w1, const void *d_xq, float *d_y0,
               float *d_y1, const float *d_conv_w, float *d_conv_state, int64_t n_conv,
               int K_conv, const cuda_launch *l);

/* lm_head fused with greedy argmax: d_y = W·x (the logits, [n_out]) and *d_best = max over rows
 * of (ordered value << 32 | ~row), so ties pick the lowest row. *d_best must be 0 before the
 * launch (gemv_argmax_reset, or gemv_embed_step earlier in the step). gemv_argmax_row decodes. */
void gemv_argmax(const gemv_matrix *w, const float *d_x, const void *d_xq, float *d_y,
                 unsigned long long *d_best, const cuda_launch *l);
void gemv_argmax_reset(unsigned long long *d_best, const cuda_launch *l);

/* Multi-column GEMV for short batched passes (a verify run, a few decoding sequences):
 * d_y[i] (=, or += with GEMV_ADD) W·x[i] for the B <= GEMV_MAX_COLS rows of a pass, each
 * weight block read once for all of them (gemv_cols.cu). x: d_x [B][ld_x] F32 (float types) or
 * d_xq, the rows' Q8 forms, row i at i * gemv_xq_bytes(n_in) (quantised types); d_y: [B][ld_y].
 * The walk is the warp kernel's with 1, 2 or 4 rows a warp (plan.cols), so row i's result does
 * not depend on the other rows. gemv_cols_supported: K-quants, Q8_0 rows of a multiple of 64,
 * F32 of 4, F16/BF16 of 8; gemv_cols_planned: m's plan has the builds (gemv_matrix_plan made
 * them). CPU twin: quant_matvec row by row. */
#define GEMV_MAX_COLS 4
/* Passes of B <= GEMV_MMA_ROWS rows of a Q4_K, Q5_K or Q6_K matrix on the int8 tensor cores
 * (gemv_mma.cu): d_y (=, or += with GEMV_ADD) W·x[i] from the rows' Q8_K forms d_xq (row i at
 * i * gemv_xq_bytes(n_in)), as gemv_mma_quantize writes them (gemv_quantize_rows_k: the CPU
 * forward's rounding, so its integer dots per super-block; a row of another width than a
 * multiple of 256 is not written, none of these matrices reads one). Up to GEMV_MMA_TILED_FROM - 1
 * rows a CTA owns 16 weight rows and its warps split K; from GEMV_MMA_TILED_FROM rows a CTA owns
 * 64 weight rows and every column, and a matrix with too few such tiles to fill the GPU splits K
 * into partials in d_work (at least gemv_mma_work_floats(w, B) floats; NULL when that
 * is 0), summed in split order by a second launch. gemv_mma_init (gemv_init calls it): the tiled
 * kernels' opt-in to more than 48 KiB of shared memory. CPU twin: quant_matvec on the x as the
 * CPU forward's Q8_K rounds it. */
#define GEMV_MMA_ROWS 64
#define GEMV_MMA_TILED_FROM 9
#define GEMV_MMA_FROM 3 /* the batched passes' fewest rows for it */
bool gemv_mma_supported(uint32_t type);
int gemv_mma_init(status *st);
int64_t gemv_mma_work_floats(const gemv_matrix *w, int B);
void gemv_mma(const gemv_matrix *w, const void *d_xq, float *d_y, int64_t ld_y,
              gemv_epilogue ep, int B, float *d_work, const cuda_launch *l);
void gemv_mma_quantize(const float *d_x, int64_t ld_x, void *d_xq, int64_t n, int B,
                       const cuda_launch *l);
/* d_y (=, or += with GEMV_ADD) the sum of `splits` partials [splits][B][n_out] in split order
 * (gemv_mma's and gemm_rows' split K) */
void gemv_reduce_splits(const float *d_part, int splits, int B, int64_t n_out, float *d_y,
                        int64_t ld_y, gemv_epilogue ep, const cuda_launch *l);
bool gemv_cols_supported(uint32_t type, int64_t n_in);
static inline bool gemv_cols_planned(const gemv_matrix *m) { return m->plan.cols[0].grid > 0; }
void gemv_cols(const gemv_matrix *w, const float *d_x, int64_t ld_x, const void *d_xq,
               float *d_y, int64_t ld_y, gemv_epilogue ep, int B, const cuda_launch *l);
/* The FFN's up half for a short pass: d_y[i][r] = silu(gate[r]·x[i]) * (up[r]·x[i]), gate and up
 * of one type and shape walked together (each x load serves both; gate's plan). */
void gemv_cols_swiglu(const gemv_matrix *gate, const gemv_matrix *up, const float *d_x,
                      int64_t ld_x, const void *d_xq, float *d_y, int64_t ld_y, int B,
                      const cuda_launch *l);
static inline int32_t gemv_argmax_row(unsigned long long best)
{
    return (int32_t)(~(uint32_t)(best & 0xffffffffu));
}

/* The first kernel of a decode step: takes the token (d_tok_in[*d_cursor] when d_tok_in is not
 * NULL, advancing *d_cursor; else the row gemv_argmax left in *d_best), resets *d_best to 0,
 * writes the token to *d_tok_out, advances the position (d_pos[0] = d_pos[1]++, so d_pos[0] is
 * the position of this token), and writes row `token` of emb (any GEMV layout, dequantised) to
 * d_x [emb->n_in]. d_cursor may be NULL (index 0, nothing advanced). Launched without PDL
 * whatever l->pdl says: in the forced graph it follows the tokens' host-to-device copy, and the
 * programmatic attribute is for kernel-to-kernel edges only. */
void gemv_embed_step(const gemv_matrix *emb, const int32_t *d_tok_in, int32_t *d_cursor,
                     unsigned long long *d_best, int32_t *d_tok_out, int32_t *d_pos,
                     float *d_x, const cuda_launch *l);

/* The first kernel of a batched step (B rows; rows of one slot consecutive, in position order):
 * row i's token d_tok[i] (clamped into the vocabulary), embedding row into d_x[i] ([B][ld_x]);
 * when d_pos is not NULL, the device position of the slot of each run's last row i
 * (d_pos + d_slot[i] * pos_stride, int32 [2]) becomes {d_row_pos[i], d_row_pos[i] + 1}, as
 * gemv_embed_step leaves it. */
void gemv_embed_rows(const gemv_matrix *emb, const int32_t *d_tok, const int32_t *d_slot,
                     const int32_t *d_row_pos, int32_t *d_pos, int64_t pos_stride, float *d_x,
                     int64_t ld_x, int B, const cuda_launch *l);

#ifdef __cplusplus
}
#endif

#endif
