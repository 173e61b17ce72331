/* ggml tensor types: the one type-traits table and the CPU kernels on blocks (dequantise a
 * row, dot a quantised row with an F32 vector, quantise a row from F32). The type ids and
 * block structs are gguf/quant_blocks.h, shared with the CUDA kernels.
 * Layouts: docs/QWEN35.md §5 (from ggml-common.h / ggml-quants.c). */
#ifndef DS_GGUF_QUANT_H
#define DS_GGUF_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf/quant_blocks.h" /* type ids, block structs, qb_scale_min_k4 */

/* Row kernels. n is the row length in elements, a multiple of the block size. */
typedef void (*quant_dequant_fn)(const void *src, float *dst, int64_t n);
typedef float (*quant_dot_fn)(const void *row, const float *x, int64_t n);
typedef void (*quant_quantize_fn)(const float *src, void *dst, int64_t n);
/* Integer dot of a quantised row with a quantised activation row (vec_dot_type blocks). */
typedef float (*quant_dot_q8_fn)(const void *row, const void *xq, int64_t n);
/* The same row against nc (1..QUANT_Q8_MAX_COLS) activation rows at once, the c-th starting
 * xq_stride bytes after the (c-1)-th: out[c] == dot_q8(row, xq + c * xq_stride, n) bit for bit
 * (the row's levels are unpacked once for all columns). */
#define QUANT_Q8_MAX_COLS 4
typedef void (*quant_dot_q8_cols_fn)(const void *row, const void *xq, uint64_t xq_stride, int nc,
                                     int64_t n, float *out);

typedef struct quant_traits {
    const char *name;         /* "q4_K" as ggml names it */
    uint32_t block_size;      /* elements per block */
    uint32_t type_size;       /* bytes per block */
    bool supported;           /* false: known id, no kernels here */
    quant_dequant_fn dequant; /* scalar reference */
    quant_dot_fn dot;         /* fastest available (AVX2 when the CPU has it) */
    quant_dot_fn dot_ref;     /* scalar reference */
    quant_quantize_fn quantize;
    /* The integer path (quantised weight types only; F32/F16/BF16: vec_dot_type F32, NULLs):
     * x is quantised once per matvec to vec_dot_type (Q8_K for the K-quants, Q8_0 for Q8_0)
     * and every row is dotted in integers, as ggml's ggml_vec_dot_<type>_q8_K. */
    uint32_t vec_dot_type;
    quant_dot_q8_fn dot_q8;     /* fastest available (AVX2 when the CPU has it) */
    quant_dot_q8_fn dot_q8_ref; /* scalar reference; bit-identical to dot_q8 (see below) */
    quant_dot_q8_cols_fn dot_q8_cols;     /* fastest available */
    quant_dot_q8_cols_fn dot_q8_cols_ref; /* scalar: dot_q8_ref per column */
} quant_traits;

/* Traits for a type id; NULL if the id is not a ggml type this program knows. */
const quant_traits *quant_get(uint32_t type);

/* Bytes of a row of n elements; 0 if n is not a multiple of the block size or type unknown. */
uint64_t quant_row_bytes(uint32_t type, uint64_t n);

/* Scalar-reference traits (dot = dot_ref) for a type id; NULL as quant_get. For tests. */
const quant_traits *quant_get_ref(uint32_t type);

/* True when this CPU has AVX2+FMA+F16C, i.e. quant_get's dot is the AVX2 kernel. */
bool quant_cpu_has_avx2(void);

/* y[r] = dot(row r of w, x) for r in [row_begin, row_end): the CPU GEMV. w is the tensor's
 * first row, rows row_bytes apart (row_bytes >= quant_row_bytes(type, n_in)); x is [n_in],
 * y is indexed by absolute row. Threads call it on disjoint row ranges. type must be
 * supported and n_in a multiple of its block size (asserted). */
void quant_matvec(uint32_t type, const void *w, uint64_t row_bytes, int64_t n_in,
                  const float *x, float *y, int64_t row_begin, int64_t row_end);

/* ---- the integer (Q8 activation) path ----------------------------------------------------
 *
 * Activation quantisers (n a multiple of the block; bit-identical AVX2 and scalar versions):
 *   Q8_K (ggml quantize_row_q8_K_ref): per 256, the element of largest |x| (the first one on a
 *     tie) maps to -127: iscale = -127/max, qs = min(127, round-half-even(iscale*x)),
 *     d = 1/iscale, bsums; an all-zero block is d = 0, qs = bsums = 0.
 *   Q8_0 (ggml's x86 quantize_row_q8_0): per 32, d = fp16(amax/127), qs =
 *     round-half-even(x * 127/amax).
 *   A block holding a NaN or an infinity gets d = NaN and zero levels, so non-finite
 *   activations give NaN outputs (ggml would drop NaNs silently; finite inputs are unaffected).
 * Both keep every level in [-127, 127], which the dots rely on (AVX2 sign trick, int16 pair
 * sums of maddubs, int16 bsums pairs): pass only blocks these functions wrote.
 *
 * Dots (quant_dot_q8_fn): per block the integer sums are exact (int32 lanes), then converted
 * to float (exact below 2^24, which Q4_K/Q5_K/Q8_0 lanes always are; a Q6_K lane can reach
 * ~2^25.6 and round by 2^-24 relative), scaled by fp16(w.d) * x.d and accumulated in float in
 * a fixed lane order that the scalar reference and the AVX2 kernel share operation for
 * operation (no FMA): dot_q8 == dot_q8_ref bit for bit on every input. Against the exact
 * real-number dot of the dequantised weights and the dequantised activation the float part
 * errs by at most (n/block + 6) * 2^-23 * M, M = sum_i |x_i| (|d sc q_i| + |m_i|) with the
 * weight written as d*sc*q - m (m: the Q4_K/Q5_K min, Q6_K's 32*d*sc offset, 0 for Q8_0);
 * tests/gguf/quant_q8_test.c checks it. */
void quant_quantize_row_q8_K(const float *x, block_q8_K *y, int64_t n);
void quant_quantize_row_q8_0(const float *x, block_q8_0 *y, int64_t n);
/* Scalar references of the two (tests). */
void quant_quantize_row_q8_K_ref(const float *x, block_q8_K *y, int64_t n);
void quant_quantize_row_q8_0_ref(const float *x, block_q8_0 *y, int64_t n);

/* Bytes of the quantised activation of n elements for weights of this type (its
 * vec_dot_type); 0 when the type has no integer path or n is not a multiple of the block. */
uint64_t quant_act_bytes(uint32_t type, int64_t n);
/* Quantises x[0..n) into xq (quant_act_bytes(type, n) bytes) for dots with weights of type. */
void quant_quantize_act(uint32_t type, const float *x, void *xq, int64_t n);

/* quant_matvec with the activation already quantised (quant_quantize_act): integer dots. */
void quant_matvec_q8(uint32_t type, const void *w, uint64_t row_bytes, int64_t n_in,
                     const void *xq, float *y, int64_t row_begin, int64_t row_end);

float quant_f16_to_f32(ggml_half h);
ggml_half quant_f32_to_f16(float f);  /* round to nearest even */
float quant_bf16_to_f32(ggml_bf16 h);
ggml_bf16 quant_f32_to_bf16(float f); /* round to nearest even */

#endif
