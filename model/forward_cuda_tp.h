/* Tensor parallel on several GPUs of one process: the model split over N ranks by
 * model/tp_shard.h (column-parallel in-projections, FFN gate/up and lm_head by vocabulary;
 * row-parallel o_proj / ssm_out / ffn_down; norms and embeddings replicated), one CUDA forward
 * (forward_cuda.h) per rank on its own GPU over its shard, NCCL communicators from
 * ncclCommInitAll (kernels/cuda/tp_comm.h).
 *
 * Inside every rank's step graphs, after each row-parallel matmul, one all-reduce sums the
 * ranks' partial outputs into the residual stream (rank 0's matmul adds to x, the others'
 * store their partial sums), two a layer; the lm_head's vocabulary slices are summed into the
 * whole logits (each rank's own columns, zeros elsewhere), so every rank takes the same argmax
 * and rank 0's GPU sampler reads the whole row. One host sync per step stays one per rank.
 *
 * Each rank has a host thread (CUDA's current device is per thread; NCCL's collectives are
 * called one thread per GPU): create, seq_start, seq_end, fill and step run on every rank at
 * once and return when all have; rank 0's rows carry the results. Every rank has the same
 * slots and so the same KV pool (n_slots 0 means 64 here: sized from free memory, each rank
 * might choose otherwise). On two H200s, `--tp 2` matched `--tp 1` (eval within 8.6e-6 of
 * max|logit|, 256 greedy ids equal). */
#ifndef DS_MODEL_FORWARD_CUDA_TP_H
#define DS_MODEL_FORWARD_CUDA_TP_H

#include "common/sampling.h"
#include "common/status.h"
#include "model/forward_cuda.h"
#include "model/qwen35.h"

typedef struct qwen35_cuda_tp qwen35_cuda_tp;

/* n_ranks ranks on CUDA devices devs[0 .. n_ranks) (distinct). STATUS_UNSUPPORTED when the
 * model does not split (tp_shard_check's message), STATUS_UNAVAILABLE without NCCL, the
 * forward's errors otherwise. */
int qwen35_cuda_tp_create(const qwen35_model *m, int n_ranks, const int *devs,
                          const qwen35_cuda_opts *o, qwen35_cuda_tp **out, status *st);
void qwen35_cuda_tp_destroy(qwen35_cuda_tp *t);

int qwen35_cuda_tp_seq_start(qwen35_cuda_tp *t, int slot, const sampling_params *p, status *st);
void qwen35_cuda_tp_seq_end(qwen35_cuda_tp *t, int slot);
/* qwen35_cuda_step on every rank; rows[i].out from rank 0. */
int qwen35_cuda_tp_step(qwen35_cuda_tp *t, fwd_row *rows, int B, status *st);
int qwen35_cuda_tp_fill(qwen35_cuda_tp *t, int slot, int n_past, status *st);
/* Rank r's forward (slots, positions, counters, names: rank 0's are the ones to report). */
qwen35_cuda *qwen35_cuda_tp_rank(const qwen35_cuda_tp *t, int r);
int qwen35_cuda_tp_n_ranks(const qwen35_cuda_tp *t);

#endif
