/* The CUDA engine for Qwen3.5 on one GPU, batch-1 decode of n_slots sequences (one at a time,
 * each with its own resident state and graphs): weights uploaded once
 * (GEMV layout, same-type in-projections packed together), recurrent state and an F16 KV cache
 * resident, and the whole token recorded once per slot as a CUDA graph and replayed: one graph launch
 * and one host sync per token, reading back only the 8-byte argmax (greedy) or the logits when
 * asked. Op for op the CPU forward (model/forward.h) fused: kernels/cuda/{norm,gemv,gdn,attn}.h.
 *
 *   cuda_backend *e; cuda_backend_create(model, &(cuda_backend_opts){.n_ctx = 4096}, &e, &st);
 *   cuda_backend_decode(e, slot, token, logits_or_NULL, &next, &st);  teacher-forced / prompt
 *   cuda_backend_generate(e, slot, first, n, out_ids, &st);          greedy, argmax on the GPU
 *
 * Counters (cuda_backend_stats) let tests assert that after warm-up a token costs no host or
 * device allocation and at most 8 device-to-host bytes (greedy). */
#ifndef DS_WORKER_CUDA_BACKEND_H
#define DS_WORKER_CUDA_BACKEND_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "model/qwen35.h"

typedef struct cuda_backend_opts {
    int n_ctx;    /* KV positions per slot (prompt + generated); 0 -> 4096 */
    int n_slots;  /* sequences with resident state; 0 -> 1 */
    int device;   /* CUDA device index */
    bool verbose; /* print upload progress and sizes to stderr */
} cuda_backend_opts;

typedef struct cuda_backend_stats {
    uint64_t tokens;            /* decode steps run */
    uint64_t d2h_bytes;         /* device -> host bytes copied by steps */
    uint64_t h2d_bytes;         /* host -> device bytes copied by steps */
    uint64_t graph_launches;
    uint64_t kernels_per_token; /* kernel nodes in the step graph */
    uint64_t weight_bytes;      /* device bytes of weights */
    uint64_t state_bytes;       /* recurrent state + KV cache, all slots */
    uint64_t bytes_per_token;   /* weights + state read/written + KV read at n_ctx (estimate) */
} cuda_backend_stats;

typedef struct cuda_backend cuda_backend;

/* Uploads the model (progress on stderr when verbose) and captures the step graphs.
 * STATUS_UNAVAILABLE without a GPU, STATUS_UNSUPPORTED for a shape or type mix the kernels do
 * not handle (named), STATUS_NOMEM / STATUS_DEVICE from the device. */
int cuda_backend_create(const qwen35_model *m, const cuda_backend_opts *o, cuda_backend **out,
                       status *st);
void cuda_backend_destroy(cuda_backend *e);

int cuda_backend_n_slots(const cuda_backend *e);

/* Forgets the sequence of a slot: position 0, state zeroed. */
int cuda_backend_reset(cuda_backend *e, int slot, status *st);
int cuda_backend_n_past(const cuda_backend *e, int slot);

/* Benchmarks: jump to position n_past as if a context had been consumed (the slot's KV rows
 * filled with a constant finite pattern, recurrent state kept). */
int cuda_backend_set_position(cuda_backend *e, int slot, int n_past, status *st);

/* Feeds `token` to a slot at its next position; logits ([V]) copied back when not NULL; *next
 * (may be NULL) = argmax of the logits (lowest id on ties). STATUS_RANGE: bad id or full
 * context. */
int cuda_backend_decode(cuda_backend *e, int slot, int32_t token, float *logits, int32_t *next,
                        status *st);

/* cuda_backend_decode without the sync: the step is queued on the engine's stream and the
 * host goes on at once, for work that follows it on that stream and ends in the caller's own
 * sync (the GPU sampler: one sync per token instead of two). The caller then calls
 * cuda_backend_step_synced; until then every other call here first waits for the step. */
int cuda_backend_decode_enqueue(cuda_backend *e, int slot, int32_t token, status *st);
void cuda_backend_step_synced(cuda_backend *e);

/* Greedy: feeds `first`, then each argmax, n times; out[i] = the i-th generated id. */
int cuda_backend_generate(cuda_backend *e, int slot, int32_t first, int n, int32_t *out,
                          status *st);

void cuda_backend_get_stats(const cuda_backend *e, cuda_backend_stats *s);

/* The engine behind worker/backend.h (worker/cuda_backend_worker.c, target
 * //worker:cuda_worker): n_slots engine slots, greedy on the GPU, other sampling on the host.
 * STATUS_UNAVAILABLE without a GPU (the caller falls back to the CPU backend). */
struct worker_backend;
struct worker_backend_opts;
int worker_backend_cuda_create(const qwen35_model *m, const struct worker_backend_opts *o,
                               struct worker_backend **out, status *st);
const char *cuda_backend_device_name(const cuda_backend *e);

/* For on-device sampling after a step (cuda_backend_decode with logits NULL): the device
 * logits of the last step ([V] F32, valid until the next step) and the engine's stream (work
 * queued on it runs after the step). */
const float *cuda_backend_device_logits(const cuda_backend *e);
struct CUstream_st *cuda_backend_stream(const cuda_backend *e);

#endif
