/* Synthetic Qwen3.5 GGUFs of the real shapes (docs/QWEN35.md §1.2-1.6, §4, §5.3): the
 * benchmark inputs of the project. A file has the real metadata, tensor names, shapes and
 * tied/untied layout of a size, the type mix of a file type (f32/f16/bf16/q8_0, or the
 * llama-quantize Q4_K_M rules), random but valid weights of plausible magnitude, and a
 * byte-level BPE tokenizer of the model's vocabulary size.
 *
 *   synth_options o = {.preset = synth_preset_find("0.8b"), .quant = SYNTH_QUANT_Q4_K_M,
 *                      .seed = 1};
 *   synth_stats s;
 *   if (synth_write("m.gguf", &o, &s, &st)) ... st.msg names what failed
 *
 * Values are a pure function of (seed, tensor name, element or block index): a counter-based
 * RNG, so a file is byte-identical whatever the thread count and chunking. Quantised tensors
 * are written directly as random valid blocks (never generated in F32 and quantised). Threads
 * pwrite whole chunks of rows into their final place: no whole-file buffer. */
#ifndef DS_GGUF_SYNTH_H
#define DS_GGUF_SYNTH_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

/* File types a synthetic model can have. */
typedef enum synth_quant {
    SYNTH_QUANT_F32 = 0,
    SYNTH_QUANT_F16,
    SYNTH_QUANT_BF16,
    SYNTH_QUANT_Q8_0,
    SYNTH_QUANT_Q4_K_M,
    SYNTH_QUANT_COUNT
} synth_quant;

/* One model shape. Dimension vocabulary as in model/README.md. */
typedef struct synth_preset {
    const char *name; /* "tiny", "0.8b", "2b", "4b", "9b", "27b" */
    int n_layer;      /* L, main layers (the MTP block, when written, is layer L) */
    int H, F, V;
    int n_h, n_kv, d_h;             /* attention */
    int n_k, n_v, d_k, d_v, K_conv; /* Gated DeltaNet */
    int n_rot;
    int rope_sections[4];
    int full_attn_interval; /* layer i is attention when (i+1) % interval == 0 */
    bool tied;              /* no output.weight: lm_head = token_embd */
    uint32_t n_ctx_train;
    float rope_base, eps;
} synth_preset;

/* Presets by name; NULL if unknown. */
const synth_preset *synth_preset_find(const char *name);

/* "f32", "f16", "bf16", "q8_0", "q4_k_m" <-> enum; parse returns -1 if unknown. */
int synth_quant_parse(const char *s);
const char *synth_quant_name(synth_quant q);
/* llama_ftype stored as general.file_type: 0, 1, 32, 7, 15. */
uint32_t synth_quant_file_type(synth_quant q);

/* Every tensor kind of a qwen35 file, in the order a layer writes them. */
typedef enum synth_kind {
    SYNTH_KIND_TOKEN_EMBD = 0,
    SYNTH_KIND_OUTPUT_NORM,
    SYNTH_KIND_OUTPUT,
    SYNTH_KIND_ATTN_NORM,
    SYNTH_KIND_POST_ATTN_NORM,
    SYNTH_KIND_FFN_GATE,
    SYNTH_KIND_FFN_UP,
    SYNTH_KIND_FFN_DOWN,
    /* Gated DeltaNet layer */
    SYNTH_KIND_ATTN_QKV,
    SYNTH_KIND_ATTN_GATE,
    SYNTH_KIND_SSM_BETA,
    SYNTH_KIND_SSM_ALPHA,
    SYNTH_KIND_SSM_CONV1D,
    SYNTH_KIND_SSM_DT_BIAS,
    SYNTH_KIND_SSM_A,
    SYNTH_KIND_SSM_NORM,
    SYNTH_KIND_SSM_OUT,
    /* full-attention layer */
    SYNTH_KIND_ATTN_Q,
    SYNTH_KIND_ATTN_K,
    SYNTH_KIND_ATTN_V,
    SYNTH_KIND_ATTN_OUTPUT,
    SYNTH_KIND_ATTN_Q_NORM,
    SYNTH_KIND_ATTN_K_NORM,
    /* MTP block (layer L, after an attention layer's tensors; docs/QWEN35.md §1.4) */
    SYNTH_KIND_NEXTN_EH_PROJ,
    SYNTH_KIND_NEXTN_ENORM,
    SYNTH_KIND_NEXTN_HNORM,
    SYNTH_KIND_NEXTN_SHARED_HEAD_NORM,
    SYNTH_KIND_COUNT
} synth_kind;

/* How a kind's values are generated, and whether it is a quantisable 2D matmul weight. */
typedef enum synth_values {
    SYNTH_VALUES_MATMUL,   /* ~ N(0, 1/sqrt(n_in)) */
    SYNTH_VALUES_NORM,     /* ~ 1 (GGUF stores 1 + w; ssm_norm stores w ~ 1) */
    SYNTH_VALUES_CONV,     /* small */
    SYNTH_VALUES_DT_BIAS,  /* small */
    SYNTH_VALUES_SSM_A,    /* -exp(small) */
} synth_values;

typedef struct synth_tensor {
    char name[48];
    synth_kind kind;
    int layer;          /* -1 for global tensors */
    uint32_t n_dims;    /* 1 or 2 */
    uint64_t ne[2];     /* ggml order: ne[0] contiguous (n_in of a matmul) */
    uint32_t type;      /* ggml type id */
    uint64_t row_bytes; /* bytes of one ne[0] row */
    uint64_t n_bytes;   /* row_bytes * ne[1] */
} synth_tensor;

/* Layer kind (docs/QWEN35.md §1.3). */
bool synth_layer_is_recurrent(const synth_preset *p, int layer);

/* llama-quantize's use_more_bits(i, n) (docs/QWEN35.md §5.3). */
bool synth_use_more_bits(int i, int n);

/* The ggml type of a tensor kind at a layer under a file type: 1D tensors, norms, ssm_conv1d,
 * ssm_a and ssm_dt.bias are always F32; f32/f16/bf16/q8_0 put every 2D matmul weight in that
 * type; q4_k_m follows docs/QWEN35.md §5.3 (output Q6_K; token_embd Q6_K when tied else Q4_K;
 * attn_v/attn_qkv and ffn_down Q6_K when use_more_bits, else Q4_K; everything else Q4_K). */
uint32_t synth_tensor_type(const synth_preset *p, synth_quant q, synth_kind kind, int layer);

/* Value class of a kind. */
synth_values synth_kind_values(synth_kind kind);

/* The tensor table of a file in write order: token_embd, output_norm, [output], then each
 * layer. *out is malloc'ed (free it); *n_out its length. Fails on shapes that do not fit the
 * block size of the chosen type. synth_plan_mtp with mtp adds the MTP block of a converted
 * file as layer L: an attention layer's 11 tensors and nextn.{eh_proj, enorm, hnorm,
 * shared_head_norm} (15); the MTP layer's types follow the same rules at layer index L. */
int synth_plan(const synth_preset *p, synth_quant q, synth_tensor **out, int *n_out,
               status *st);
int synth_plan_mtp(const synth_preset *p, synth_quant q, bool mtp, synth_tensor **out,
                   int *n_out, status *st);

/* Fills rows [row0, row0 + n_rows) of tensor t (2D: ne[0]-element rows; 1D: one row) into dst
 * (n_rows * t->row_bytes bytes). Values depend only on (key, element/block index); key comes
 * from synth_fill_key. */
uint64_t synth_fill_key(uint64_t seed, const char *name);
void synth_fill_rows(const synth_tensor *t, uint64_t key, uint64_t row0, uint64_t n_rows,
                     void *dst);

typedef struct synth_options {
    const synth_preset *preset;
    synth_quant quant;
    uint64_t seed;
    bool mtp;             /* also write the MTP block (block_count L + 1, nextn_predict_layers 1) */
    int chat_template;    /* synth_template (synth_vocab.h): 0 Qwen3.5's, as the real models */
    int n_threads;        /* 0: number of online CPUs */
    uint64_t chunk_bytes; /* 0: default (4 MiB); the unit of work and of one pwrite */
} synth_options;

typedef struct synth_stats {
    int n_tensors;
    uint64_t n_bytes;      /* file size */
    uint64_t tensor_bytes; /* sum of the tensors' data sizes */
    int n_threads;
    double seconds;        /* wall time of the whole write */
} synth_stats;

/* Writes the file. stats may be NULL. On failure the partial file is removed. */
int synth_write(const char *path, const synth_options *o, synth_stats *stats, status *st);

#endif
