/* Rewrites a GGUF file: copies every metadata key and tensor, letting callbacks drop or
 * override keys, and drop, rename, reshape or re-type tensors. Re-typing goes row by row
 * through F32 (quant_get(src)->dequant, quant_get(dst)->quantize): never a whole tensor.
 * Used to make quantised copies of the reference models (Q8_0, Q4_K_M, ...) and the malformed
 * or variant files of the loader tests. */
#ifndef DS_TESTS_MODEL_GGUF_REWRITE_H
#define DS_TESTS_MODEL_GGUF_REWRITE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"

typedef struct gguf_rewrite_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint32_t type;
    bool drop;
} gguf_rewrite_tensor;

typedef struct gguf_rewrite_opts {
    /* Per source tensor, with *out prefilled as an unchanged copy. A changed type must keep ne;
     * a changed ne keeps the type and copies what fits (zeros after): for malformed files. */
    void (*tensor)(void *arg, const gguf_file *src, const gguf_tensor *t, gguf_rewrite_tensor *out);
    bool (*keep_kv)(void *arg, const gguf_kv *kv); /* NULL: keep all */
    void (*extra_kv)(void *arg, gguf_writer *w);   /* after the copied keys: set/override keys */
    /* after the source tensors: declare extra tensors (written zero-filled); returns how many */
    int (*extra_tensors)(void *arg, gguf_writer *w);
    void *arg;
} gguf_rewrite_opts;

int gguf_rewrite(const char *src_path, const char *dst_path, const gguf_rewrite_opts *o, status *st);

/* The quantisation policies of llama-quantize (docs/QWEN35.md §5.3), for requant_file. */
typedef enum requant_kind {
    REQUANT_Q8_0,   /* every quantisable 2D weight -> Q8_0 (ftype 7) */
    REQUANT_Q4_K_M, /* llama-quantize Q4_K_M mix (ftype 15) */
    REQUANT_ALL,    /* every quantisable 2D weight -> requant_opts.type */
} requant_kind;

/* Quantised copy of src: 1D tensors, *_norm.weight, ssm_conv1d and names not ending in
 * "weight" stay F32. A K-quant target whose row length is not a multiple of 256 falls back to
 * Q8_0 (llama.cpp falls back to Q5_0/Q8_0; Q5_0 is not implemented here). */
int requant_file(const char *src, const char *dst, requant_kind kind, uint32_t type, status *st);

#endif
