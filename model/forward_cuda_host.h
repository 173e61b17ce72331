/* Host-side pieces of the CUDA forward that touch no device (plain C, tested on the CPU by
 * tests/model/forward_cuda_host_test.c): the staged inputs of a batched pass, which entries
 * of the KV block tables the device lacks, and how many snapshots a rank holds. forward_cuda_batch.c and forward_cuda_state.c copy
 * what they produce to the device. */
#ifndef DS_MODEL_FORWARD_CUDA_HOST_H
#define DS_MODEL_FORWARD_CUDA_HOST_H

#include <stdbool.h>
#include <stdint.h>

#include "model/fwd.h"
#include "model/kv_pool.h"

/* ---- a batched pass's staged inputs (forward_cuda_impl.h fc_batch.stage) ----
 * A pass of n rows runs the bucket of nb >= n rows (rows: the largest bucket). Its inputs lie
 * in one buffer of FC_STAGE_INTS(rows) ints, copied to the device in one piece; fc_stage_at
 * names its arrays for the bucket of nb rows (the layout depends on nb), on the host staging as
 * on its device mirror. */
#define FC_STAGE_INTS(rows) (9 * (rows) + 8) /* a pass's staged ints, rounded up */
/* Runs of this many rows or more go to the chunked delta rule and the attention tiles; shorter
 * ones row by row, which spreads them over more CTAs (a chunked CTA takes a run at a time, and
 * 256 two-row runs of a pass measured 3x slower through it than row by row). */
#define FC_LONG_RUN_ROWS 16

typedef struct fc_stage {
    int32_t *head_rows; /* [rows]: the lm_head's rows (the rows whose logits are read), padded
                           to their bucket with the first one */
    int32_t *tokens;    /* [nb] */
    int32_t *slots;     /* [nb]: the pad slot past n */
    int32_t *pos;       /* [nb] */
    int32_t *runs;      /* [2][nb] (kernels/cuda/gdn.h "Runs"): the runs' first rows, then */
    int32_t *run_len;   /* [nb] = runs + nb: their lengths (runs of one slot's consecutive rows;
                           entries past the runs empty) */
    int32_t *long_runs; /* [1 + nb] (gdn.h "Chunked runs"): the number of long runs
                           (FC_LONG_RUN_ROWS rows or more), then */
    int32_t *long_idx;  /* [nb] = long_runs + 1: their indices in runs */
    int32_t *tile_rows; /* [nb]: 1 for a row attn_prefill_runs takes (a row of a long run, when
                           attn_tiles): attn_decode_rows' d_skip */
    int32_t *keep;      /* [nb] (gdn.h "Keep"): the slot index a verify row's state is kept in
                           too, -1 for the rest */
    int nb;
    int ints;           /* ints from head_rows to the last array, the bytes a pass copies:
                           rows + 8 nb + 1 */
} fc_stage;

/* The arrays of the bucket of nb rows in a staging buffer of FC_STAGE_INTS(rows) ints at base
 * (device or host): head_rows [0, rows), then tokens, slots, pos, runs (with run_len),
 * long_runs (with long_idx), tile_rows, keep back to back. */
fc_stage fc_stage_at(int32_t *base, int rows, int nb);

typedef struct fc_pass_info {
    int k, nb;        /* the body's bucket index and rows */
    int n_runs, n_long;
    int nh, kh;       /* lm_head rows, and their bucket index (when nh > 0) */
    int staged_ints;  /* ints to copy (fc_stage.ints of bucket k) */
} fc_pass_info;

/* Stages rows[0 .. n) (1 <= n <= the largest bucket) into the staging buffer at base (the
 * arrays fc_stage_at names for the pass's bucket): bucket[0 .. n_buckets) ascending powers of
 * two, the last = rows; keep: NULL, or row j's keep slot (-1: none); head[j] = row j's lm_head
 * row (-1: its logits are not read: a prompt row before its run's last, unless it asks for
 * logits or its final-norm output, or is a verify row). */
void fc_stage_pass(const fwd_row *rows, int n, const int *bucket, int n_buckets,
                   int pad_slot, bool attn_tiles, const int32_t *keep, int32_t *base, int *head,
                   fc_pass_info *info);

/* ---- the KV block tables' device mirror (kernels/cuda/attn.h "KV blocks") ----
 * The block tables are model/kv_pool.h's; the forward keeps a device copy of each slot's table
 * for its kernels. A mirror holds the first `held` entries of the table as it stood at
 * `version` (kv_pool_version). */
typedef struct fc_kv_mirror {
    int held;
    uint32_t version;
} fc_kv_mirror;

/* The entries of seq's table the mirror lacks, [*from, *to): the appended ones while the
 * table's version is the mirror's, else the whole table (it was released or shared since);
 * the mirror then holds them (the caller copies them). *from == *to: nothing to copy. */
void fc_kv_mirror_sync(const kv_pool *p, int seq, fc_kv_mirror *m, int *from, int *to);

/* ---- the recurrent-state snapshots' count (docs/GPU.md "Snapshots") ----
 * budget 0, or snapshots of no bytes (a model without DeltaNet layers): none; budget > 0:
 * floor(budget / snap_bytes); budget < 0 (chosen): min(8 a slot, an eighth of `left` /
 * snap_bytes), yet one a slot where `left` holds them, and never more than `spare` holds (left:
 * the memory the share is taken from; spare: what may go to snapshots without shrinking the KV
 * pool below its floor). At most FC_MAX_SNAPS. */
#define FC_MAX_SNAPS (1 << 20)
int fc_snaps_for(int64_t budget, uint64_t snap_bytes, uint64_t left, uint64_t spare,
                 int n_slots);

#endif
