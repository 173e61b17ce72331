/* Qwen3.5 dense model on the CPU: config from GGUF metadata, weight views into the mmap, the
 * per-sequence state, and the reference forward pass (decode one token, prefill T tokens with
 * the chunked gated delta rule). This is the specification every other backend matches.
 * Dimension vocabulary (model/README.md): H hidden, F ffn, n_h/n_kv/d_h attention heads,
 * n_k/n_v/d_k/d_v DeltaNet heads, C conv channels, T tokens, V vocab. */
#ifndef DS_MODEL_QWEN35_H
#define DS_MODEL_QWEN35_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "gguf/gguf.h"

#define QWEN35_MAX_LAYERS 128

typedef struct qwen35_config {
    int n_layer;        /* main layers L (MTP layers excluded) */
    int n_layer_all;    /* block_count: L + nextn_predict_layers */
    int n_nextn;        /* nextn_predict_layers (MTP layers after the main ones; 0 none) */
    int H, F, V;
    int n_h, n_kv, d_h; /* attention */
    int n_k, n_v, d_k, d_v, C, K_conv; /* DeltaNet; C = 2*n_k*d_k + n_v*d_v */
    int n_rot;
    float rope_base, eps;
    int n_ctx_train;
    bool recurrent[QWEN35_MAX_LAYERS]; /* true: Gated DeltaNet layer; false: attention */
    bool tied;                          /* no output.weight: lm_head = token_embd */
    int n_attn_layers, n_gdn_layers;
    int slot[QWEN35_MAX_LAYERS]; /* index of layer il among layers of its kind */
} qwen35_config;

/* A weight matrix view: n_out rows of n_in elements of ggml type `type`, in the mmap. */
typedef struct qwen35_mat {
    const void *data;
    uint32_t type;
    int64_t n_in, n_out;
    uint64_t row_bytes;
} qwen35_mat;

typedef struct qwen35_layer {
    const float *attn_norm, *post_norm; /* [H], already 1+w */
    /* DeltaNet */
    qwen35_mat qkv, gate, beta, alpha, ssm_out;
    const float *conv1d; /* [C][K_conv] */
    const float *dt_bias, *ssm_a; /* [n_v] */
    const float *ssm_norm;        /* [d_v], no +1 */
    /* attention */
    qwen35_mat q, k, v, o;
    const float *q_norm, *k_norm; /* [d_h] */
    /* FFN */
    qwen35_mat ffn_gate, ffn_up, ffn_down;
} qwen35_layer;

/* The MTP (nextn) head, docs/QWEN35.md §1.4, §2.8: layer L of the file, a full-attention
 * decoder layer (`layer`: its attention and FFN fields) plus the projection of [embedding ;
 * hidden] and its norms. embd, head_norm, head are the file's nextn.embed_tokens /
 * shared_head_norm / shared_head_head when present, else the main model's token_embd /
 * output_norm / output. */
typedef struct qwen35_mtp {
    bool present;
    int layer_index;          /* L: its blk.L tensors */
    qwen35_layer layer;
    qwen35_mat eh_proj;       /* ne=[2H, H]: input [enorm(e) ; hnorm(h)], embedding first */
    const float *enorm, *hnorm, *head_norm; /* [H], already 1+w */
    qwen35_mat embd, head;    /* [H, V] */
} qwen35_mtp;

typedef struct qwen35_model {
    qwen35_config cfg;
    gguf_file *file; /* owned */
    qwen35_mat tok_embd, output; /* output == tok_embd when tied */
    const float *output_norm;
    qwen35_layer layers[QWEN35_MAX_LAYERS];
    qwen35_mtp mtp; /* present when nextn_predict_layers >= 1 (its first layer) */
} qwen35_model;

/* Loads config and binds every weight by name with shape and type checks, the MTP block's too
 * when nextn_predict_layers >= 1 (a file that announces one must carry it whole).
 * Errors: STATUS_IO (open), STATUS_UNSUPPORTED (architecture not qwen35, unsupported weight
 * type, layer kinds beyond what this engine runs), STATUS_FORMAT naming the key or tensor
 * (missing, mis-shaped, wrong type). Unknown tensors (v.*, mtp.*) are ignored. */
int qwen35_model_load(qwen35_model **out, const char *path, status *st);
void qwen35_model_free(qwen35_model *m);

#endif
