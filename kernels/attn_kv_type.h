/* The KV cache's element type, one definition for the CUDA attention kernels
 * (kernels/cuda/attn.h) and their CPU twins (kernels/cpu/attn.h), which take it alike. Plain C,
 * read by nvcc and the C compiler both. */
#ifndef DS_KERNELS_ATTN_KV_TYPE_H
#define DS_KERNELS_ATTN_KV_TYPE_H

typedef enum attn_kv_type {
    ATTN_KV_F16, /* 2 bytes an element, round to nearest even */
    ATTN_KV_F32, /* 4 bytes an element, no rounding */
} attn_kv_type;

#endif
