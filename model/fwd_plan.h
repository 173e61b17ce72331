/* A forward's memory plan: how many sequence slots, of what context, with how many KV blocks,
 * fit in the memory a device has for them. Pure arithmetic (no device, no allocation), shared
 * by the forwards (forward_cpu.c, forward_cuda.c) and tested alone.
 *
 * The model: every slot holds its recurrent state whole and a few bytes per context position
 * (slot_bytes + n_ctx * pos_bytes: the sampler's token history, on the CPU); the KV cache is a
 * pool of blocks of block_tokens positions that the slots share (paged: a sequence takes blocks
 * as it grows, the scheduler admits on the blocks actually free and preempts when the pool runs
 * dry); ctx_bytes more per context position are taken once, whatever the slot count (the CUDA
 * step's attention partials grow with the context). A plan fits when
 *   ctx_bytes * n_ctx + n_slots * (slot_bytes + n_ctx * pos_bytes) + n_blocks * block_bytes
 * is at most room, and the pool holds at least one full context.
 *
 *   - The context: the wanted n_ctx; with ctx_fit (the model's length, not a flag's), the
 *     longest multiple of FWD_PLAN_CTX_STEP (or of block_tokens, if larger) at most n_ctx whose
 *     one slot with a full context fits; without it, a context whose one full slot does not fit
 *     fails.
 *   - The slots: given, they must fit with one full context in the pool; chosen (0), as many as
 *     fit with a quarter of the context each on average in the pool, at most max_slots.
 *   - The pool: given kv_blocks must fit; chosen, every slot's full context when that fits,
 *     else what the room leaves after the slots (at least one full context).
 * Failures are STATUS_NOMEM with one line saying what needs how much and how much there is
 * (where: the caller's room_what, e.g. "half of 31.2 GiB available RAM"). */
#ifndef DS_MODEL_FWD_PLAN_H
#define DS_MODEL_FWD_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"

#define FWD_PLAN_CTX_STEP 1024 /* a shrunk context is a multiple of this many positions */

typedef struct fwd_plan_in {
    uint64_t room;        /* bytes for everything below */
    const char *room_what; /* says where room comes from, for the log and errors */
    uint64_t slot_bytes;  /* per slot, whatever the context */
    uint64_t pos_bytes;   /* per slot and context position, outside the KV pool */
    uint64_t ctx_bytes;   /* per context position, once */
    uint64_t block_bytes; /* one KV block: every attention layer, K and V */
    int block_tokens;     /* positions of a KV block (>= 1) */
    int n_ctx;            /* wanted context (>= 1) */
    bool ctx_fit;         /* n_ctx may shrink to what fits */
    int n_slots;          /* given (>= 1), or 0: chosen */
    int max_slots;        /* most chosen slots (>= 1) */
    int64_t kv_blocks;    /* given (> 0), or 0: chosen */
} fwd_plan_in;

typedef struct fwd_plan {
    int n_ctx;            /* positions per sequence */
    int n_slots;
    int64_t n_blocks;     /* KV pool blocks */
    uint64_t bytes;       /* what the plan takes of room */
    bool shrunk;          /* n_ctx is below the wanted one */
    char why[320];        /* one line: the sizing and its reason, for the start-up log */
} fwd_plan;

/* Plans, or STATUS_NOMEM / STATUS_INVALID (bad inputs) with the reason in st. */
int fwd_plan_make(const fwd_plan_in *in, fwd_plan *out, status *st);

/* Bytes of a plan's pieces: one slot holding a full context of n_ctx (with its KV blocks). */
uint64_t fwd_plan_one_slot_bytes(const fwd_plan_in *in, int n_ctx);

#endif
