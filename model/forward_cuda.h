/* Qwen3.5 forward pass on CUDA GPUs behind the forward contract (model/fwd.h): the twin of the
 * CPU forward (model/forward.h, the specification), op for op, fused where it pays
 * (kernels/cuda/{gemv,norm,gdn,attn,sample}.h). Callers reach it through fwd.h only:
 *
 *   fwd *f;
 *   fwd_create("cuda", model, &(fwd_opts){.n_ctx = 4096, .n_slots = 8}, &f, &st);
 *
 * A group of N >= 1 ranks, one GPU each (fwd_opts.ranks, fwd_opts.devices): with N = 1 every
 * call runs on the caller's thread; with N > 1 the model is split by model/tp_shard.h
 * (column-parallel in-projections, FFN gate/up and lm_head by vocabulary; row-parallel o_proj /
 * ssm_out / ffn_down; norms and embeddings replicated), each rank runs its shard on its own GPU
 * from its own host thread (CUDA's current device is per thread; NCCL's collectives are called
 * one thread per GPU), and every call runs on all ranks at once and returns when all have.
 * Inside every rank's step graphs, after each row-parallel matmul, one NCCL all-reduce
 * (kernels/cuda/tp_comm.h) sums the ranks' partial outputs into the residual stream, two a
 * layer; the lm_head's vocabulary slices are summed into the whole logits, so every rank takes
 * the same argmax and rank 0's GPU sampler reads the whole row. tests/gpu's tp2_eval and
 * tp2_greedy hold `--tp 2` to `--tp 1` on two GPUs (logits within 1e-3 of max|logit|, 256 greedy
 * ids equal).
 *
 * Lifetimes, as the CPU forward's (docs/STYLE.md "Memory"):
 *   weights - uploaded once at create into one device arena per rank, re-laid out for the GEMV
 *             (forward_cuda_weights.c);
 *   state   - n_slots sequence slots, each its conv windows, delta-rule state and device
 *             position; the KV cache in blocks of 64 positions (kernels/cuda/attn.h "KV
 *             blocks"); the activations one step shares (forward_cuda_state.c);
 *   step    - one token of one slot recorded once per slot as a CUDA graph
 *             (forward_cuda_record.c: one function per sublayer, as cpu_fwd_run in
 *             model/forward.c) and replayed (forward_cuda.c); the batched passes' graphs one
 *             per bucket of rows (forward_cuda_batch.c).
 * Nothing is allocated after create.
 *
 * KV blocks: fwd.kv is the one bookkeeper (model/kv_pool.h; rank 0 keeps its tables in pinned
 * memory). A step takes the blocks its rows need unless the caller took them before; every
 * rank mirrors the tables into its own device copy (forward_cuda_host.h fc_kv_mirror_sync), so
 * the ranks' caches agree block for block.
 *
 * A step of one row (a lone sequence decoding) replays that slot's batch-1 graph (GEMV
 * kernels); a step of more rows (decode rows of several slots, prompt chunks, both) goes in
 * passes of up to 256 rows through the batched graphs (forward_cuda_batch.c: one graph per
 * bucket of rows, every weight read once a pass, a prompt chunk's recurrent state carried on
 * chip from token to token). Either way the step costs one host sync per rank before reading
 * back the sampled ids (8 bytes per greedy row, the result struct per sampled row).
 *
 * fwd_opts the CUDA forward reads: n_slots (0: as many as fit in free device memory, at most
 * 256, the KV pool sized for a quarter of n_ctx per slot on average; 64 with several ranks, so
 * that every rank sizes alike; given: a pool with every slot's whole context), n_ctx, max_rows,
 * ranks, devices, kv_blocks, kv_block_tokens (0 or 64), batch_invariant, dense_rows,
 * dense_per_pass.
 *
 * Threading: one caller thread at a time. */
#ifndef DS_MODEL_FORWARD_CUDA_H
#define DS_MODEL_FORWARD_CUDA_H

#include "model/fwd.h"

/* create: STATUS_UNAVAILABLE without a GPU or driver; STATUS_UNSUPPORTED for a model or shape
 * the kernels do not run (named), for ranks > 1 without NCCL ("--tp 2 needs NCCL
 * (libnccl.so.2): ..."), or a model whose heads do not split over the ranks; STATUS_NOMEM /
 * STATUS_DEVICE from the device. device_count: the CUDA devices visible (0 without a driver). */
extern const fwd_backend fwd_backend_cuda;

#endif
