/* The CUDA forward behind the forward contract (model/fwd.h): "cuda", one GPU per rank, over
 * model/forward_cuda.h (one rank) or model/forward_cuda_tp.h (fwd_opts.ranks > 1, NCCL).
 * Rows go through as they are, the sampled ids and logprobs in fwd_row.out. The CUDA forward keeps its own KV block allocator (forward_cuda_host.h); the
 * fwd's kv_pool mirrors it block for block (the same pool size and block positions, blocks taken
 * for the same positions and given back at the same calls), so the scheduler reads real free
 * blocks from fwd.kv. */
#ifndef DS_MODEL_FORWARD_CUDA_FWD_H
#define DS_MODEL_FORWARD_CUDA_FWD_H

#include "model/fwd.h"

/* create: STATUS_UNAVAILABLE without a GPU (or NCCL for ranks > 1), STATUS_UNSUPPORTED for a
 * model or shape the kernels do not run, the forward's other errors; device_count: the CUDA
 * devices visible (0 without a driver). */
extern const fwd_backend fwd_backend_cuda;

#endif
