/* Qwen3.5 CPU reference forward pass: per-sequence state, a per-engine workspace, prefill of T
 * tokens (token-parallel projections + chunked gated delta rule) and batched decode (B
 * sequences, one token each, every weight row read once for all B).
 *
 * Served, it runs behind the forward contract (model/forward_cpu.h: slots, the KV pool, the
 * samplers, tensor-parallel ranks); the calls below are the same arithmetic on one standalone
 * state, for the reference tests and benchmarks.
 *
 * This is the specification every other backend matches (docs/QWEN35.md §2, §3). It works on
 * every weight type the GGUF may hold (F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K) by dotting the
 * quantised rows directly; no tensor is ever dequantised whole.
 *
 * Lifetimes (docs/STYLE.md "Memory"):
 *   model  - qwen35_model_load (model/qwen35.h), read-only, shared by every ctx and state;
 *   ctx    - qwen35_ctx_create once per engine thread: scratch for up to max_batch sequences /
 *            max_tokens tokens and a thread pool; nothing is allocated per token afterwards;
 *   state  - qwen35_state_create once per sequence slot; reset (not freed) between requests.
 *
 *   qwen35_ctx *ctx; qwen35_state *s; status st;
 *   qwen35_ctx_create(model, &(qwen35_ctx_opts){.max_batch = 8}, &ctx, &st);
 *   qwen35_state_create(model, 4096, &s, &st);
 *   qwen35_prefill(ctx, s, prompt, n_prompt, logits, false, &st);   logits: [V] of last token
 *   qwen35_decode_batch(ctx, &s, &next, 1, logits, &st);            logits: [B][V]
 *
 * Threading: a ctx is used by one caller thread at a time; it splits each operation over its
 * own pool internally. States are independent; a state must not be in two calls at once.
 *
 * Dimension vocabulary: model/README.md (H, F, V, n_h/n_kv/d_h, n_k/n_v/d_k/d_v, C, K_conv,
 * T tokens, B sequences). */
#ifndef DS_MODEL_FORWARD_H
#define DS_MODEL_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "model/qwen35.h"

/* Recurrent + KV state of one sequence. Layers are numbered separately per kind: the g-th
 * DeltaNet layer (in model order) owns conv/ssm slice g, the a-th attention layer owns the KV
 * cache's layer a (qwen35_config.slot[il] gives a model layer's index within its kind).
 *
 * S layout: llama.cpp's key-contiguous one. For value head hv the HF matrix S[i][j]
 * (i over d_k keys, j over d_v values) is stored at ssm[((g*n_v + hv)*d_v + j)*d_k + i], so a
 * value column S[:, j] is contiguous: u_j = S[:,j]·k and o_j = S[:,j]·q are contiguous dots.
 *
 * KV layout (the one the CPU forward has): paged. k_cache and v_cache are pools of kv_blocks
 * blocks of block_tokens positions per attention layer, [n_attn_layers][kv_blocks]
 * [block_tokens][n_kv][d_h]; position p of the sequence lies in block block_table[p /
 * block_tokens] at row p % block_tokens (qwen35_kv_offset). A state of qwen35_state_create owns
 * its pool and an identity table (blocks of QWEN35_KV_BLOCK_TOKENS); the slots of a forward
 * (model/forward_cpu.h) share the forward's pool, each reading its table from the block
 * manager (model/kv_pool.h). */
#define QWEN35_KV_BLOCK_TOKENS 64

typedef struct qwen35_state {
    const qwen35_model *model; /* borrowed */
    int n_ctx;                 /* positions the table can address (0..n_ctx-1) */
    int n_past;                /* tokens consumed so far = position of the next token */
    float *conv;    /* owned, [n_gdn_layers][C][K_conv-1]: last K_conv-1 pre-conv inputs per
                       channel, oldest first; zeros after reset */
    float *ssm;     /* owned, [n_gdn_layers][n_v][d_v][d_k] FP32 delta-rule state (see above) */
    float *k_cache; /* the KV pool (owned when own_kv): K after k_norm and RoPE */
    float *v_cache;
    int kv_blocks;             /* blocks of the pool per attention layer */
    int block_tokens;          /* positions per block */
    const int32_t *block_table; /* [ceil(n_ctx / block_tokens)] (owned when own_kv) */
    bool own_kv;
} qwen35_state;

/* Floats from the start of k_cache (or v_cache) to attention layer a's row of position pos. */
static inline uint64_t qwen35_kv_offset(const qwen35_state *s, int a, int pos)
{
    const qwen35_config *c = &s->model->cfg;
    const uint64_t block = (uint64_t)a * (uint64_t)s->kv_blocks +
                           (uint64_t)s->block_table[pos / s->block_tokens];
    return (block * (uint64_t)s->block_tokens + (uint64_t)(pos % s->block_tokens)) *
           (uint64_t)c->n_kv * (uint64_t)c->d_h;
}

/* Bytes qwen35_state_create allocates for one sequence of n_ctx positions (for pool sizing). */
uint64_t qwen35_state_bytes(const qwen35_model *m, int n_ctx);
/* Bytes of the recurrent state alone (conv windows and S) of one sequence. */
uint64_t qwen35_state_recurrent_bytes(const qwen35_model *m);
/* Floats of one of K, V for kv_blocks blocks of block_tokens positions, every attention layer. */
uint64_t qwen35_kv_floats(const qwen35_model *m, int kv_blocks, int block_tokens);

/* Allocates a zeroed state able to hold n_ctx positions (1 <= n_ctx) with its own KV pool.
 * STATUS_NOMEM on failure, STATUS_INVALID for a bad n_ctx. */
int qwen35_state_create(const qwen35_model *m, int n_ctx, qwen35_state **out, status *st);
/* A state whose KV lives in a pool of the caller (k_cache, v_cache of qwen35_kv_floats(m,
 * kv_blocks, block_tokens) floats each; block_table: the sequence's table, read at every step,
 * must cover the positions a step feeds). Owns only its recurrent state. */
int qwen35_state_create_paged(const qwen35_model *m, int n_ctx, float *k_cache, float *v_cache,
                              int kv_blocks, int block_tokens, const int32_t *block_table,
                              qwen35_state **out, status *st);
void qwen35_state_destroy(qwen35_state *s);

/* Forgets the sequence: n_past = 0, recurrent state zeroed (KV rows need no clearing). */
void qwen35_state_reset(qwen35_state *s);

/* Snapshot: dst becomes an exact copy of src (same model; dst->n_ctx >= src->n_past). Copies
 * only the n_past KV rows in use, each to where dst's table puts it. */
void qwen35_state_copy(qwen35_state *dst, const qwen35_state *src);

/* The recurrent state alone (conv windows, then S: qwen35_state_recurrent_bytes) copied out to
 * dst, or in from src with n_past set to n_past (a snapshot of the CPU forward's prefix reuse;
 * the KV rows are the caller's). */
void qwen35_state_save_recurrent(const qwen35_state *s, float *dst);
void qwen35_state_load_recurrent(qwen35_state *s, const float *src, int n_past);

/* How prefill runs the gated delta rule over T > 1 tokens. */
typedef enum qwen35_gdn_mode {
    QWEN35_GDN_CHUNKED = 0, /* default: chunked form, chunk QWEN35_GDN_CHUNK (docs/QWEN35.md §3) */
    QWEN35_GDN_RECURRENT,   /* token by token, the decode recurrence (docs/QWEN35.md §2.4) */
} qwen35_gdn_mode;

#define QWEN35_GDN_CHUNK 64

/* How matmuls dot quantised weights (kernels/cpu/matmul.h cpu_matmul_dot). F32/F16/BF16
 * weights always take the float path, so the reference-model tests do not depend on this. */
typedef enum qwen35_dot_mode {
    QWEN35_DOT_DEFAULT = 0, /* Q8 */
    QWEN35_DOT_Q8,          /* decode (and small steps): input quantised to Q8_K/Q8_0 once per
                               matmul, integer dots (llama.cpp's CPU path; ~2x faster) */
    QWEN35_DOT_EXACT,       /* float dots of the quantised rows with the F32 input */
} qwen35_dot_mode;

typedef struct qwen35_ctx_opts {
    int max_batch;  /* most sequences per qwen35_decode_batch; 0 -> 1 */
    int max_tokens; /* tokens per internal prefill step; longer prefills are split; 0 -> 512 */
    int n_threads;  /* 0 -> the number of online CPUs (the CLI passes --threads) */
    qwen35_gdn_mode gdn_mode;
    qwen35_dot_mode dot_mode;
    bool bf16_state; /* the DeltaNet S rounded to bf16 values (RNE) where the GPU stores its bf16
                        state (kernels/cpu/gdn.h): after every token of the row-by-row rule, after
                        every chunk of the chunked one; still held in F32 floats here. The conv
                        windows stay F32 */
} qwen35_ctx_opts;

typedef struct qwen35_ctx qwen35_ctx;

/* Allocates the workspace and starts the thread pool. opts may be NULL (all defaults). */
int qwen35_ctx_create(const qwen35_model *m, const qwen35_ctx_opts *opts, qwen35_ctx **out,
                      status *st);
void qwen35_ctx_destroy(qwen35_ctx *ctx);
/* Changes how later prefills run the delta rule (tests compare the two). */
void qwen35_ctx_set_gdn_mode(qwen35_ctx *ctx, qwen35_gdn_mode mode);

/* Feeds T >= 1 tokens to sequence s at positions s->n_past .. s->n_past+T-1 and advances
 * n_past. logits: NULL (none wanted), [V] for the last token, or [T][V] when all_logits.
 * Errors (state unchanged): STATUS_RANGE for a token id outside [0, V) or n_past+T > n_ctx,
 * naming the offending index; STATUS_INVALID for T < 1. */
int qwen35_prefill(qwen35_ctx *ctx, qwen35_state *s, const int32_t *tokens, int T,
                   float *logits, bool all_logits, status *st);

/* qwen35_prefill that also writes, when hidden is not NULL, every token's final-norm output
 * RMSNorm(x)·output_norm (the lm_head's input; [T][H]): the h the MTP head reads (model/mtp.h,
 * docs/QWEN35.md §2.8). */
int qwen35_prefill_hidden(qwen35_ctx *ctx, qwen35_state *s, const int32_t *tokens, int T,
                          float *logits, bool all_logits, float *hidden, status *st);

/* One token for each of B sequences (1 <= B <= max_batch; all distinct states of this model):
 * tokens[b] goes to states[b] at position states[b]->n_past. logits: NULL or [B][V].
 * Errors (no state changed): STATUS_RANGE (bad id, a full context), STATUS_INVALID (bad B). */
int qwen35_decode_batch(qwen35_ctx *ctx, qwen35_state *const *states, const int32_t *tokens,
                        int B, float *logits, status *st);

#endif
