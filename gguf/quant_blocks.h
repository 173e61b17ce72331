/* The GGUF block formats, the one copy shared by C (gguf/, kernels/cpu) and CUDA (kernels/cuda):
 * ggml type ids, block structs with their size checks, and the K-quant scale/min unpacking.
 * Layouts: docs/QWEN35.md §5 (from ggml-common.h / ggml-quants.c). Definitions only: no
 * functions with linkage, so nvcc and the C compiler both take it whole (kernels/cuda lists it
 * in cu_hdrs; C code gets it through gguf/quant.h or //gguf:quant_blocks). */
#ifndef DS_GGUF_QUANT_BLOCKS_H
#define DS_GGUF_QUANT_BLOCKS_H

#include <stdint.h>

#ifdef __CUDACC__
#define QB_INLINE static __host__ __device__ __forceinline__
#else
#define QB_INLINE static inline
#endif
#ifdef __cplusplus
#define QB_STATIC_ASSERT static_assert
#else
#define QB_STATIC_ASSERT _Static_assert
#endif

#define QK_K 256
#define QK8_0 32
#define K_SCALE_SIZE 12

/* ggml type ids (ggml.h). Supported here: F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K; the others
 * are known (sizes in the traits table) so files holding them can be validated. Ids 4, 5,
 * 31-33 and 36-38 were removed from ggml and are not valid. */
typedef enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_IQ2_XXS = 16,
    GGML_TYPE_IQ2_XS = 17,
    GGML_TYPE_IQ3_XXS = 18,
    GGML_TYPE_IQ1_S = 19,
    GGML_TYPE_IQ4_NL = 20,
    GGML_TYPE_IQ3_S = 21,
    GGML_TYPE_IQ2_S = 22,
    GGML_TYPE_IQ4_XS = 23,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_IQ1_M = 29,
    GGML_TYPE_BF16 = 30,
    GGML_TYPE_TQ1_0 = 34,
    GGML_TYPE_TQ2_0 = 35,
    GGML_TYPE_MXFP4 = 39,
    GGML_TYPE_MAX_ID = 40, /* one past the largest id known here */
} ggml_type;

typedef uint16_t ggml_half; /* IEEE binary16 bits */
typedef uint16_t ggml_bf16; /* upper half of an fp32 */

typedef struct block_q8_0 {
    ggml_half d;
    int8_t qs[QK8_0];
} block_q8_0;

typedef struct block_q4_K {
    ggml_half d;
    ggml_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;

typedef struct block_q5_K {
    ggml_half d;
    ggml_half dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;

typedef struct block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    ggml_half d;
} block_q6_K;

/* Activation format of the K-quant integer dots (ggml's block_q8_K; never a weight type):
 * x[i] ~ d * qs[i], bsums[j] = sum of qs[16j .. 16j+15]. */
typedef struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;

QB_STATIC_ASSERT(sizeof(block_q8_0) == 34, "block_q8_0 size");
QB_STATIC_ASSERT(sizeof(block_q4_K) == 144, "block_q4_K size");
QB_STATIC_ASSERT(sizeof(block_q5_K) == 176, "block_q5_K size");
QB_STATIC_ASSERT(sizeof(block_q6_K) == 210, "block_q6_K size");
QB_STATIC_ASSERT(sizeof(block_q8_K) == 292, "block_q8_K size");

/* 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block from its scales[12]
 * (ggml get_scale_min_k4). The one copy: gguf/quant.c, kernels/cpu and kernels/cuda use it. */
QB_INLINE void qb_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = (uint8_t)(q[j] & 63);
        *m = (uint8_t)(q[j + 4] & 63);
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

#endif
