/* Tensor-parallel sharding of a Qwen3.5 model over N ranks (docs/GPU.md §7):
 * which rows or columns of every weight each rank owns, the rank's local config, and a host
 * model holding one rank's shard. Device-independent: the CPU's simulated ranks
 * (model/forward_cpu.h) use it, and an NCCL/CUDA implementation uploads the same shards (a
 * shard model is an ordinary qwen35_model of smaller dims, so the single-GPU weight upload
 * can take it as it is).
 *
 * The split (Megatron-style; one all-reduce after each row-parallel matmul):
 *   column-parallel (a rank owns some OUTPUT rows, the input is replicated):
 *     attn_q (its query heads, each [q | gate] interleaved rows), attn_k, attn_v (its KV
 *     heads), ffn_gate, ffn_up (F/N rows), attn_qkv and ssm_conv1d (the q, k channels of its key
 *     heads and the v channels of their value heads), attn_gate, ssm_beta, ssm_alpha, ssm_dt,
 *     ssm_a (its value heads), output (lm_head: V rows split by vocabulary, logits gathered);
 *   row-parallel (a rank owns some INPUT columns and produces a partial sum over them):
 *     attn_output (its heads' d_h columns), ffn_down (its F/N), ssm_out (its value heads' d_v);
 *   replicated: token_embd, every norm (attn_norm, post_attention_norm, output_norm, q/k_norm,
 *     ssm_norm).
 * So each rank owns whole attention heads (and their KV cache) and whole delta-rule heads (their
 * conv channels, gates and S state); per layer a rank's mixer and FFN each end in one partial
 * [H] vector per token, summed over the ranks by one all-reduce each (2 per layer).
 *
 * Heads, rank r of N:
 *   attention: n_h % N == 0 required; rank r owns query heads [r n_h/N, (r+1) n_h/N). KV heads:
 *     n_kv % N == 0: heads [r n_kv/N, ...) (n_kv/N each); else N % n_kv == 0: the one KV head its
 *     query heads read, r / (N/n_kv), replicated on N/n_kv ranks (vLLM's rule for N > n_kv).
 *   DeltaNet (GGUF tiled order: value head hv reads key head hv % n_k; ratio rho = n_v/n_k):
 *     n_k % N == 0: key heads [k0, k0 + n_k/N), k0 = r n_k/N, and ALL their value heads
 *     {j n_k + kh : j < rho}; else N % n_k == 0 and rho % (N/n_k) == 0: the one key head
 *     r / (N/n_k), replicated on m = N/n_k ranks, each owning rho/m of its value heads
 *     (j in [p rho/m, (p+1) rho/m), p = r % m). Local value head order is j-major, so the
 *     local heads keep the tiled rule (local hv reads local key head hv % n_k_local).
 *   FFN: F % N == 0. Vocabulary: any N; rank r owns rows [V r / N, V (r+1) / N).
 *   Anything else is STATUS_UNSUPPORTED naming the dimension (tp_shard_check).
 * Row-parallel columns of a quantised weight must be whole blocks (e.g. F/N a multiple of 256
 * for a Q4_K ffn_down); tp_shard_model_create refuses otherwise, naming tensor and rank. */
#ifndef DS_MODEL_TP_SHARD_H
#define DS_MODEL_TP_SHARD_H

#include <stdint.h>

#include "common/status.h"
#include "model/qwen35.h"

#define TP_SHARD_MAX_RANKS 64
#define TP_SHARD_MAX_RANGES 64 /* 2 + value-head groups of one rank (rho/m) */

/* The parts of the model that split differently. Units are elements of the split dimension
 * (rows for column-parallel weights, columns for row-parallel ones, entries for vectors). */
typedef enum tp_shard_part {
    TP_SHARD_ATTN_Q,   /* attn_q rows [2 n_h d_h] */
    TP_SHARD_ATTN_KV,  /* attn_k, attn_v rows [n_kv d_h]; the rank's KV cache heads */
    TP_SHARD_ATTN_O,   /* attn_output columns [n_h d_h] */
    TP_SHARD_GDN_QKV,  /* attn_qkv rows and ssm_conv1d channels [C] */
    TP_SHARD_GDN_V,    /* attn_gate rows and ssm_out columns [D_v] */
    TP_SHARD_GDN_HEAD, /* ssm_beta, ssm_alpha rows; ssm_dt, ssm_a entries [n_v] */
    TP_SHARD_FFN,      /* ffn_gate, ffn_up rows and ffn_down columns [F] */
    TP_SHARD_VOCAB,    /* output (lm_head) rows [V] */
} tp_shard_part;

typedef struct tp_shard_range {
    int64_t begin, n; /* [begin, begin + n) of the full dimension */
} tp_shard_range;

/* A rank's part of one dimension: ranges of the full dimension, concatenated in this order
 * to form the local dimension. */
typedef struct tp_shard_ranges {
    int n;
    int64_t total; /* sum of the lengths: the local dimension */
    tp_shard_range r[TP_SHARD_MAX_RANGES];
} tp_shard_ranges;

/* Can c run on n_ranks ranks (1 <= n_ranks <= TP_SHARD_MAX_RANKS)? STATUS_UNSUPPORTED naming
 * the dimension that does not split (e.g. "n_kv = 2 KV heads do not split over 3 ranks"),
 * STATUS_INVALID for a bad n_ranks. Type alignment is checked by tp_shard_model_create. */
int tp_shard_check(const qwen35_config *c, int n_ranks, status *st);

/* The config of rank `rank`'s shard: n_h, n_kv, n_k, n_v, C, F local; V stays the full
 * vocabulary (embeddings are replicated; the rank's lm_head has tp_shard_ranges(VOCAB).total
 * rows); everything else as c. c must pass tp_shard_check. */
void tp_shard_config(const qwen35_config *c, int n_ranks, int rank, qwen35_config *local);

/* The ranges of `part` that rank owns. c must pass tp_shard_check. */
void tp_shard_ranges_get(const qwen35_config *c, int n_ranks, int rank, tp_shard_part part,
                         tp_shard_ranges *out);

/* A host model of one rank's shard: its config (tp_shard_config) and weight views. A weight
 * whose part is one contiguous range is a view into m's mmap (row-parallel columns: the same
 * row stride, the data pointer moved to the first column); a weight of several ranges (the
 * DeltaNet in-projections, conv, gate vectors and ssm_out when n_v > n_k) is gathered into one
 * arena the shard owns. m must outlive the shard. STATUS_UNSUPPORTED from tp_shard_check, or
 * for row-parallel columns that are not whole quantisation blocks; STATUS_NOMEM. */
typedef struct tp_shard_model {
    qwen35_model model; /* the shard: cfg local, file NULL (not owned), weights as above */
    int rank, n_ranks;
    int64_t vocab_begin; /* the lm_head's first row in the full vocabulary */
    void *arena;         /* owned, host: the gathered weights */
    uint64_t arena_bytes;
} tp_shard_model;

int tp_shard_model_create(const qwen35_model *m, int n_ranks, int rank, tp_shard_model **out,
                          status *st);
void tp_shard_model_destroy(tp_shard_model *s);

#endif
