/* The CPU forward behind the forward contract (model/fwd.h): a tensor-parallel group of
 * fwd_opts.ranks >= 1 ranks simulated in one process, each rank the CPU forward of model/forward.h
 * (the specification) over its shard of the model (model/tp_shard.h; one rank borrows the model
 * as it is, nothing copied). Every step runs all ranks on the same rows through cpu_fwd_run
 * (forward_impl.h): one rank or N, one code path, the ranks' partial outputs summed in rank order
 * after each mixer and FFN, the lm_head's vocabulary slices gathered in place. The ranks take
 * turns on one shared thread pool of fwd_opts.n_threads.
 *
 * A step's rows are grouped by slot into runs (a slot's consecutive rows): every one-row run
 * (a decoding sequence) goes into one batched pass, every weight read once for all of them; a
 * longer run (a prompt chunk) is a pass of its own (the chunked delta rule). Then each row's
 * token is accepted by its slot's sampler (model/sampler.h, one per slot; prompt tokens count
 * for penalties when the parameters say so), its logits are copied out when row.logits asks,
 * and a row with .sample gets its slot's next token in row.out.
 *
 * KV cache: one pool per rank, [n_attn_layers][n_blocks][block_tokens][n_kv][d_h] for K and for
 * V, addressed through the block tables of the forward's kv_pool (fwd.kv: n_seqs = n_slots,
 * block_tokens = kv_block_tokens or 64, n_blocks = kv_blocks or every slot's whole context).
 * A step takes the blocks its rows need (a no-op when the scheduler took them) and fails with
 * STATUS_EXHAUSTED, running nothing, when the pool is short; seq_start and seq_end give a slot's
 * blocks back. Nothing is allocated after create. */
#ifndef DS_MODEL_FORWARD_CPU_H
#define DS_MODEL_FORWARD_CPU_H

#include "model/fwd.h"

/* "cpu": fwd_opts.n_slots 0 -> 8; max_rows 0 -> n_slots + 256; n_threads 0 -> the online CPUs;
 * exact_dot selects the F32 dots of quantised weights (QWEN35_DOT_EXACT). STATUS_UNSUPPORTED when
 * the model does not split over the ranks (tp_shard_check's message, or a tensor named by
 * tp_shard_model_create), STATUS_INVALID for bad sizes, STATUS_NOMEM. */
extern const fwd_backend fwd_backend_cpu;

#endif
