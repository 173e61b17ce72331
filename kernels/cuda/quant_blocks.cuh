// Internal to kernels/cuda: the GGUF block formats as the GPU reads them. Same layouts as
// gguf/quant.h (shared/QWEN35.md §5); the parity tests against gguf/quant.c prove they agree.
// kernels/ may not depend on gguf/, hence this copy of the structs, checked by size.
#ifndef DS_KERNELS_CUDA_QUANT_BLOCKS_CUH
#define DS_KERNELS_CUDA_QUANT_BLOCKS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

// ggml type ids (gguf/quant.h ggml_type)
enum {
    QB_F32 = 0,
    QB_F16 = 1,
    QB_Q8_0 = 8,
    QB_Q4_K = 12,
    QB_Q5_K = 13,
    QB_Q6_K = 14,
    QB_BF16 = 30,
};

#define QB_QK_K 256
#define QB_QK8_0 32

struct qb_q8_0 {
    uint16_t d;
    int8_t qs[32];
};
struct qb_q4_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
};
struct qb_q5_K {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
};
struct qb_q6_K {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
};
static_assert(sizeof(qb_q8_0) == 34, "q8_0");
static_assert(sizeof(qb_q4_K) == 144, "q4_K");
static_assert(sizeof(qb_q5_K) == 176, "q5_K");
static_assert(sizeof(qb_q6_K) == 210, "q6_K");

__device__ __forceinline__ float qb_half(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ float qb_bf16(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

// 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (ggml get_scale_min_k4)
__device__ __forceinline__ void qb_scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

#endif
