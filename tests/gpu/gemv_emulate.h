/* Host twins of the GEMV family for tests without a GPU (tests/gpu/gemv_emulate.cu):
 * gemv_pack on host memory, and the flat kernel's STORE path run serially on the host (same
 * partition into `grid` CTAs, same block walk, same slice code). h_w: packed; x: F32 (float
 * types) or NULL; xq: Q8 x (quantised types) or NULL. gemv_flat_emulate returns 0, or -1 when
 * the flat kernel does not support the type/shape/grid. */
#ifndef DS_TESTS_GPU_GEMV_EMULATE_H
#define DS_TESTS_GPU_GEMV_EMULATE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void gemv_pack_host(uint32_t type, const void *src, void *dst, int64_t n_in, int64_t n_out);
int gemv_flat_emulate(uint32_t type, const void *h_w, int64_t n_in, int64_t n_out,
                      const float *x, const void *xq, float *y, int grid);

#ifdef __cplusplus
}
#endif

#endif
