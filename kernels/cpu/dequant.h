/* Row dequantisation for the CPU matmul's prefill / batched path: AVX2 versions of
 * gguf/quant.h's scalar dequant for F16, BF16, Q8_0, Q4_K, Q5_K and Q6_K, bit-identical to it
 * (same float operations in the same order, no FMA contraction); every other type, or a CPU
 * without AVX2, goes to quant_get(type)->dequant. The block layouts stay defined in one place
 * (gguf/quant.h); these are the SIMD hot loops of the CPU backend. */
#ifndef DS_KERNELS_CPU_DEQUANT_H
#define DS_KERNELS_CPU_DEQUANT_H

#include <stdint.h>

/* dst[0..n) = the n elements of the row at src (n a multiple of the type's block size). */
void ref_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* The function ref_dequant_row dispatches to for type (for tests and benchmarks). */
typedef void (*ref_dequant_fn)(const void *src, float *dst, int64_t n);
ref_dequant_fn ref_dequant_get(uint32_t type);

#endif
