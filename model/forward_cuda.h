/* Qwen3.5 forward pass on one CUDA GPU: the twin of the CPU forward (model/forward.h, the
 * specification), op for op, fused where it pays (kernels/cuda/{gemv,norm,gdn,attn,sample}.h).
 *
 * Lifetimes, as the CPU forward's (STYLE.md "Memory"):
 *   weights - uploaded once at create into one device arena, re-laid out for the GEMV
 *             (forward_cuda_weights.c);
 *   state   - n_slots sequence slots, each its conv windows, delta-rule state and device
 *             position; the KV cache in blocks of 64 positions from one pool, a block table row
 *             per slot (kernels/cuda/attn.h "KV blocks"), taken as a sequence grows and returned
 *             when it ends; the activations one step shares (forward_cuda_state.c);
 *   step    - one token of one slot recorded once per slot as a CUDA graph
 *             (forward_cuda_record.c: one function per sublayer, as run_step in forward.c) and
 *             replayed (forward_cuda.c).
 * Nothing is allocated after create.
 *
 * The step takes a batch of B rows (token, slot, position; the slot carries its sampling
 * parameters). A step of one row (a lone sequence decoding) replays that slot's batch-1 graph
 * (GEMV kernels); a step of more rows (decode rows of several slots, prompt chunks, both) goes in
 * passes of up to 256 rows through the batched graphs (forward_cuda_batch.c: one graph per bucket
 * of rows, every weight read once a pass, a prompt chunk's recurrent state carried on chip from
 * token to token). Either way the step costs one host sync before reading back the sampled ids
 * (8 bytes per greedy row, the result struct per sampled row).
 *
 *   qwen35_cuda *e;
 *   qwen35_cuda_create(model, &(qwen35_cuda_opts){.n_ctx = 4096, .n_slots = 8}, &e, &st);
 *   qwen35_cuda_seq_start(e, slot, &params, &st);
 *   qwen35_cuda_step(e, rows, B, &st);        rows[i].out: the sampled id of each sample row
 *
 * Threading: one caller thread at a time. */
#ifndef DS_MODEL_FORWARD_CUDA_H
#define DS_MODEL_FORWARD_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "common/sampling.h"
#include "common/status.h"
#include "model/fwd.h"
#include "model/qwen35.h"

typedef struct qwen35_cuda_opts {
    int n_ctx;    /* KV positions per slot (prompt + generated); 0 -> 4096 */
    int n_slots;  /* sequences with resident state; 0 -> as many as fit in free device memory
                     (at most 256, leaving a reserve; the log says the bytes per slot), the KV
                     pool sized for a quarter of n_ctx per slot on average; given: a pool with
                     every slot's whole context */
    int max_rows; /* most rows of one step; 0 -> n_slots + 256 */
    int device;   /* CUDA device index */
    bool batch_invariant; /* every step through the batched kernels, one row too: a sequence's
                             logits then do not depend on the rows beside it, at the price of the
                             batch-1 GEMV's speed (docs/GPU.md "Batched decode") */
    int dense_rows;       /* passes of this many rows or more multiply the quantised matrices as
                             F16 through cuBLAS (kernels/cuda/gemm.h "Dense path"); 0: never;
                             < 0: 64 when the F16 copies are resident, 128 when each pass
                             dequantises. Not with batch_invariant (cuBLAS's sums depend on the
                             rows) */
    bool dense_per_pass;  /* the dense path dequantises each matrix every pass; by default the F16
                             copies stay resident when they take at most half of the free
                             device memory (2 bytes a weight), else per pass */
    int kv_blocks;        /* > 0: the KV pool's blocks (the tensor-parallel ranks all take rank
                             0's); 0: sized with the slots */
    /* Tensor parallel (model/forward_cuda_tp.h; the model is then the rank's shard): this
     * rank's communicator (NULL: none), its rank (rank 0 samples and reports; every rank sums
     * the row-parallel outputs and gathers the vocabulary-split logits in its graphs) and its
     * first lm_head row in the vocabulary. */
    struct tp_comm *tp;
    int tp_rank;
    int64_t vocab_begin;
} qwen35_cuda_opts;

typedef struct qwen35_cuda_stats {
    uint64_t tokens;            /* rows run */
    uint64_t steps;             /* qwen35_cuda_step calls (one host sync each) */
    uint64_t d2h_bytes;         /* device -> host bytes copied by steps */
    uint64_t h2d_bytes;         /* host -> device bytes copied by steps */
    uint64_t graph_launches;
    uint64_t kernels_per_token; /* kernel nodes in the step graph */
    uint64_t weight_bytes;      /* device bytes of weights */
    uint64_t state_bytes;       /* recurrent state + KV cache, all slots */
    uint64_t bytes_per_token;   /* weights + state read/written + KV read at n_ctx (estimate) */
} qwen35_cuda_stats;

typedef struct qwen35_cuda qwen35_cuda;

/* Uploads the model, lays out the slots and captures the step graphs.
 * STATUS_UNAVAILABLE without a GPU, STATUS_UNSUPPORTED for a shape or weight type the kernels
 * do not handle (named), STATUS_NOMEM / STATUS_DEVICE from the device. */
int qwen35_cuda_create(const qwen35_model *m, const qwen35_cuda_opts *o, qwen35_cuda **out,
                       status *st);
void qwen35_cuda_destroy(qwen35_cuda *e);

/* A new sequence in a slot: position 0, state zeroed, sampler reset with p (valid and resolved:
 * common/sampling.h). */
int qwen35_cuda_seq_start(qwen35_cuda *e, int slot, const sampling_params *p, status *st);

/* Runs rows[0..B) (1 <= B <= max_rows) in order; one host sync. STATUS_RANGE for a bad token
 * id, slot, position or a full context (no row run); STATUS_INTERNAL when a sampled row found
 * no token (NaN or inf logits: broken weights); STATUS_DEVICE when the device failed. */
int qwen35_cuda_step(qwen35_cuda *e, fwd_row *rows, int B, status *st);

/* The sequence in slot has ended: its KV blocks go back to the pool (seq_start does it too). */
void qwen35_cuda_seq_end(qwen35_cuda *e, int slot);

/* The paged KV cache: blocks in the pool for sequences (*block_positions positions each). A
 * step fails with STATUS_EXHAUSTED, running nothing, when its rows need more blocks than are
 * free: callers that admit sequences by their worst case (worker/engine.c) never see it. */
int qwen35_cuda_kv_blocks(const qwen35_cuda *e, int *block_positions);

int qwen35_cuda_n_past(const qwen35_cuda *e, int slot);
int qwen35_cuda_n_slots(const qwen35_cuda *e);
int qwen35_cuda_max_rows(const qwen35_cuda *e);
/* Rows of the largest batched graph (a pass), 0 when there is no batched path (then every row of
 * a step replays its slot's batch-1 graph: a prompt goes token by token). */
int qwen35_cuda_pass_rows(const qwen35_cuda *e);

/* Benchmarks only: the slot continues at position n_past as if that context had been consumed
 * (its KV rows hold a constant finite pattern, the recurrent state is kept). */
int qwen35_cuda_fill(qwen35_cuda *e, int slot, int n_past, status *st);

void qwen35_cuda_get_stats(const qwen35_cuda *e, qwen35_cuda_stats *s);
/* "NVIDIA H200" */
const char *qwen35_cuda_device_name(const qwen35_cuda *e);
int qwen35_cuda_device_index(const qwen35_cuda *e);
/* The kernel path the step graph took, for logs ("warp/flat GEMV by tuning table, PDL"). */
const char *qwen35_cuda_path(const qwen35_cuda *e);

#endif
