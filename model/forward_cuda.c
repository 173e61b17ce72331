/* One rank of the CUDA forward (forward_cuda_impl.h fc_rank): create / destroy, the step
 * graphs' capture, and the step: rows enqueued graph after graph, each sampled row's sampler
 * behind its graph on the same stream, one host sync, the results read. Device memory is taken
 * only at create. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "gguf/quant.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/blas.h"
#include "model/forward_cuda_impl.h"
#include "model/fwd_plan.h"

static int check_shapes(const qwen35_config *c, status *st)
{
    if (c->d_k != 32 && c->d_k != 64 && c->d_k != 128)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: DeltaNet d_k %d (32, 64, 128)", c->d_k);
    if (c->d_v % 32 || c->d_v > 1024)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: DeltaNet d_v %d", c->d_v);
    if (c->d_h % 32 || c->d_h > 256 || c->n_h % c->n_kv || c->n_h / c->n_kv > ATTN_MAX_GROUP)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: attention d_h %d, heads %d/%d", c->d_h,
                           c->n_h, c->n_kv);
    if (c->H % 32 || c->F % 32 || (c->n_v * c->d_v) % 32)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: H, F and D_v must be multiples of 32");
    return STATUS_OK;
}

/* The KV cache's element type: F32 when every attention layer's q, k and v weights are F32, so
 * no activation is rounded below the weights' precision (an F16 cache alone put the F32
 * reference models 1.3e-3·max|logit| from Hugging Face); F16, BF16 and quantised weights keep
 * the F16 cache: half the bytes read per token, its rounding no coarser than the weights'. */
static attn_kv_type choose_kv_type(const qwen35_model *m)
{
    for (int il = 0; il < m->cfg.n_layer; il++) {
        const qwen35_layer *W = &m->layers[il];
        if (m->cfg.recurrent[il]) continue;
        if (W->q.type != GGML_TYPE_F32 || W->k.type != GGML_TYPE_F32 ||
            W->v.type != GGML_TYPE_F32)
            return ATTN_KV_F16;
    }
    return ATTN_KV_F32;
}

/* Both graphs of every slot; with programmatic dependent launch where the device has it (a
 * capture that fails with it is retried without). On the H200 PDL made the step 12% / 6% / 1.3%
 * faster on the 0.8B / 4B / 27B. */
static int capture_graphs(fc_rank *e, status *st)
{
    e->pdl = e->props.cc_major >= 9 && !e->tp; /* PDL edges and NCCL's kernels: not mixed */
    for (;;) {
        int rc = STATUS_OK;
        e->launch.pdl = e->pdl;
        for (int i = 0; i < e->n_slots && !rc; i++) {
            fc_slot *sl = &e->slots[i];
            rc = cuda_graph_capture_begin(e->launch.stream, st);
            if (!rc) fc_record_token(e, sl, true);
            size_t n_kernels = 0;
            if (!rc) rc = cuda_graph_capture_end(e->launch.stream, &sl->g_forced, &n_kernels, st);
            e->stats.kernels_per_token = n_kernels;
            if (!rc) rc = cuda_graph_capture_begin(e->launch.stream, st);
            if (!rc) fc_record_token(e, sl, false);
            if (!rc) rc = cuda_graph_capture_end(e->launch.stream, &sl->g_chained, NULL, st);
        }
        e->launch.pdl = false;
        if (!rc) rc = cuda_check("graph capture", st);
        if (!rc || !e->pdl) return rc;
        LOG_WARN("cuda: capture with programmatic dependent launch failed (%s); capturing "
                 "without", st->msg);
        for (int i = 0; i < e->n_slots; i++) {
            cuda_graph_exec_destroy(e->slots[i].g_forced);
            cuda_graph_exec_destroy(e->slots[i].g_chained);
            e->slots[i].g_forced = e->slots[i].g_chained = NULL;
        }
        status_clear(st);
        (void)cuda_check("clearing the capture error", st);
        status_clear(st);
        e->pdl = false;
    }
}

/* The state and activation arenas (a sizing pass, then for real), the snapshots' (one
 * allocation, outside the state's: stats.state_bytes stays the slots' and the cache's), the KV
 * cache's block tables,
 * the batched step's and the one-row step's pinned buffers; every slot and the pad slot
 * cleared. */
static int alloc_run_state(fc_rank *e, status *st)
{
    fc_arena sa = {0}, aa = {0};
    fc_state_layout(e, &sa);
    fc_act_layout(e, &aa);
    fc_mtp_layout(e, &aa);
    fc_batch_layout(e, &aa);
    e->state_bytes = sa.used, e->act_bytes = aa.used;
    if (cuda_alloc(&e->d_state, sa.used, "state and KV cache", st) ||
        cuda_alloc(&e->d_act, aa.used, "activations", st) ||
        (e->n_snaps &&
         cuda_alloc(&e->d_snaps, (uint64_t)e->n_snaps * e->snap_bytes, "snapshots", st)))
        return st->code;
    sa = (fc_arena){e->d_state, 0, e->state_bytes};
    aa = (fc_arena){e->d_act, 0, e->act_bytes};
    fc_state_layout(e, &sa);
    fc_act_layout(e, &aa);
    fc_mtp_layout(e, &aa);
    fc_batch_layout(e, &aa);
    if (fc_kv_alloc(e, st) || fc_batch_alloc_host(e, st) || fc_mtp_alloc_host(e, st) ||
        cuda_host_alloc(&e->h_pinned, 16 * (size_t)e->n_slots + 4 * ((size_t)e->max_rows + 1),
                        "pinned step buffers", st))
        return st->code;
    unsigned long long *h_best = (unsigned long long *)e->h_pinned;
    e->h_stage = (int32_t *)(h_best + e->n_slots);
    e->h_rpos = e->h_stage + e->max_rows + 1;
    for (int i = 0; i < e->n_slots; i++) e->slots[i].h_best = h_best + i;
    e->h_ids = malloc((size_t)e->max_rows * 4);
    if (!e->h_ids) return status_fail(st, STATUS_NOMEM, "cuda: step ids");
    void *hidden = NULL; /* verify runs: pinned, so a hidden output's copy syncs nothing */
    if (e->verify_rows && cuda_host_alloc(&hidden, (size_t)e->max_rows * e->cfg.H * 4,
                                          "pinned hidden outputs", st))
        return st->code;
    e->h_hidden = hidden;
    if (cuda_memset(e->d_act, 0, e->act_bytes, st)) return st->code;
    for (int i = 0; i <= e->n_slots; i++) /* and the pad slot */
        if (fc_slot_clear(e, i, st)) return st->code;
    return STATUS_OK;
}

#define FC_PART_ROWS 257 /* rows of attention partials: a batched pass's 256 and the one-row
                            step's */

/* With ctx_fit: the longest context (fwd_plan.h) whose one slot fits in room with its whole KV
 * and FC_PART_ROWS rows of attention partials (at most ATTN_MAX_SPLITS a head: attn.h), beside the
 * pad slot; e->n_ctx and the KV tables' width follow. *why gets what the model's context would
 * need when it is shrunk (else ""). */
static int fit_context(fc_rank *e, uint64_t room, uint64_t per_slot, uint64_t block,
                       const char *what, char *why, size_t why_len, status *st)
{
    const qwen35_config *c = &e->cfg;
    why[0] = 0;
    const uint64_t parts = 4ull * FC_PART_ROWS * (uint64_t)attn_partial_floats(c->n_h, c->d_h, e->n_ctx);
    const uint64_t pad = per_slot + block;
    fwd_plan_in in = {
        .room = room > pad ? room - pad : 0,
        .room_what = what,
        .slot_bytes = per_slot,
        .pos_bytes = 8, /* the sampler's token history, on the device and pinned */
        .ctx_bytes = (parts + (uint64_t)e->n_ctx - 1) / (uint64_t)e->n_ctx,
        .block_bytes = block,
        .block_tokens = ATTN_KV_BLOCK,
        .n_ctx = e->n_ctx,
        .ctx_fit = true,
        .n_slots = e->n_slots > 0 ? e->n_slots : 1,
        .max_slots = 1,
    };
    fwd_plan plan;
    if (fwd_plan_make(&in, &plan, st)) {
        char m[sizeof st->msg];
        snprintf(m, sizeof m, "%s", st->msg);
        return status_fail(st, STATUS_NOMEM, "cuda: %s", m);
    }
    if (plan.n_ctx < e->n_ctx) {
        snprintf(why, why_len, "; the model's %d does not fit: one sequence of it needs %.2f GiB "
                 "with its attention partials", e->n_ctx,
                 (double)fwd_plan_one_slot_bytes(&in, e->n_ctx) / (1 << 30));
        e->n_ctx = plan.n_ctx;
        e->kv.ld = (e->n_ctx + ATTN_KV_BLOCK - 1) / ATTN_KV_BLOCK;
    }
    return STATUS_OK;
}

/* fwd.plan: the sizing in one line. */
static void plan_line(fc_rank *e, int blocks, uint64_t block, uint64_t parts, const char *slots,
                      const char *what, const char *shrunk)
{
    snprintf(e->plan, sizeof e->plan, "context %d tokens, %d slots (%s), KV pool %.2f GiB (%d "
             "blocks of %d positions: %.1f full contexts), attention partials %.2f GiB; %s%s",
             e->n_ctx, e->n_slots, slots, (double)blocks * block / 1073741824.0, blocks,
             ATTN_KV_BLOCK, (double)blocks / e->kv.ld, parts / 1073741824.0, what, shrunk);
}

/* n_slots, the KV pool and the snapshots from free device memory (after the weights). A slot's
 * recurrent state is held whole; KV goes in blocks from one pool (paged), so the pool is sized
 * for every slot holding a quarter of n_ctx on average (the scheduler admits on the blocks
 * actually free and preempts a sequence when the pool runs dry): slots = room / (state + n_ctx/4
 * positions of KV), at most 256; then the snapshots (fc_snaps_for) from what lies beyond that
 * quarter of a context per slot and one full context (so they never shrink the pool below
 * either), or a given budget's before the slots; the pool the rest (at most what full contexts
 * would take). The room: free memory less what a batched step's activations take at 256 rows,
 * their attention partials at n_ctx (FC_PART_ROWS rows: they grow with the context) and a
 * reserve of 2 GB or 5% (the CUDA context, graphs, fragmentation), at most the memory budget,
 * less the verify runs' keep slots (docs/GPU.md "Verify runs"); with ctx_fit, n_ctx then shrinks
 * to the longest that fits one slot (fit_context). With
 * n_slots given, the pool holds kv_blocks blocks when given, else every slot's full context, as
 * a contiguous cache would, or as many blocks as fit when those do not (at least one full
 * context), and chosen snapshots take their share of what the slots and the pool leave; one
 * more block is the pad slot's. e->plan says the outcome in one line. */
static int size_state(fc_rank *e, status *st)
{
    fc_kv *kv = &e->kv;
    kv->ld = (e->n_ctx + ATTN_KV_BLOCK - 1) / ATTN_KV_BLOCK;
    const qwen35_config *c = &e->cfg;
    const uint64_t block = 2ull * e->n_kv_layers * ATTN_KV_BLOCK * c->n_kv * c->d_h *
                           e->kv_elem_bytes; /* K and V of one block, every layer */
    e->snap_bytes = fc_snap_bytes(e);
    const int given = e->n_slots, n_keep = e->n_keep;
    fc_slot probe[2];
    memset(probe, 0, sizeof probe);
    e->slots = probe;
    e->n_slots = 1;
    e->n_keep = 0;
    kv->n_blocks = 0;
    fc_arena a = {0};
    fc_state_layout(e, &a); /* one slot and the pad slot, no KV */
    e->slots = NULL;
    e->n_slots = given;
    e->n_keep = n_keep;
    const uint64_t per_slot = a.used / 2;
    cuda_device_props p;
    if (cuda_device_props_get(e->device, &p, st)) return st->code;
    const uint64_t row_fixed = 4 * ((uint64_t)c->V + 3ull * c->F + 4ull * c->H + 2ull * c->C +
                                    4ull * c->n_h * c->d_h + 2ull * c->n_v * c->d_v);
    uint64_t reserve = p.mem_total_bytes / 20;
    if (reserve < (2ull << 30)) reserve = 2ull << 30;
    reserve += 256 * row_fixed;
    if (e->dense.resident) reserve += fc_dense_bytes(e); /* uploaded with the batched path */
    uint64_t room = p.mem_free_bytes > reserve ? p.mem_free_bytes - reserve : 0;
    char what[128], shrunk[160];
    if (e->mem_budget > 0 && (uint64_t)e->mem_budget < room) {
        room = (uint64_t)e->mem_budget;
        snprintf(what, sizeof what, "a budget of %.1f MiB", (double)room / (1 << 20));
    } else {
        snprintf(what, sizeof what, "%.2f GiB free on the GPU after the weights, less a %.2f GiB "
                 "reserve", p.mem_free_bytes / 1073741824.0, reserve / 1073741824.0);
    }
    /* the verify runs' keep slots, before anything is fitted in what is left */
    const uint64_t keeps = (uint64_t)e->n_keep * per_slot;
    room = room > keeps ? room - keeps : 0;
    if (e->n_keep)
        LOG_INFO("cuda: %d kept states for verify runs (%d runs of up to %d rows a step): %.1f MB",
                 e->n_keep, e->verify_runs, e->verify_rows, keeps / 1e6);
    if (e->ctx_fit && fit_context(e, room, per_slot, block, what, shrunk, sizeof shrunk, st))
        return st->code;
    if (!e->ctx_fit) shrunk[0] = 0;
    /* the attention partials of a batched pass's 256 rows and the one-row step, at n_ctx */
    const uint64_t parts = 4ull * FC_PART_ROWS * (uint64_t)attn_partial_floats(c->n_h, c->d_h, e->n_ctx);
    room = room > parts ? room - parts : 0;
    const uint64_t snap = e->snap_bytes;
    if (e->n_slots) {
        const uint64_t states = (uint64_t)(e->n_slots + 1) * per_slot;
        const uint64_t fits = room > states ? (room - states) / block : 0; /* blocks */
        kv->n_blocks = e->kv_blocks_opt > 0 ? e->kv_blocks_opt + 1
                                            : e->n_slots * kv->ld + 1; /* + the pad slot's */
        if (e->kv_blocks_opt <= 0 && (uint64_t)kv->n_blocks > fits && fits >= (uint64_t)kv->ld + 1)
            kv->n_blocks = (int)fits; /* every slot's whole context does not fit: what does */
        const uint64_t taken = (uint64_t)(e->n_slots + 1) * per_slot + kv->n_blocks * block;
        const uint64_t left = room > taken ? room - taken : 0;
        e->n_snaps = fc_snaps_for(e->snap_budget, snap, left, left, e->n_slots);
        if (e->n_snaps)
            LOG_INFO("cuda: %d snapshots of %.1f MB (%.2f GB%s)", e->n_snaps, snap / 1e6,
                     (double)e->n_snaps * snap / 1e9,
                     e->snap_budget < 0 ? ", chosen: 8 a slot, at most 1/8 of what the slots "
                                          "and the KV pool leave" : "");
        if (taken > room)
            return status_fail(st, STATUS_NOMEM, "cuda: %d slots of %d positions need %.2f GiB of "
                               "state and KV; %.2f GiB are there (%s, less %.2f GiB of attention "
                               "partials)", e->n_slots, e->n_ctx, taken / 1073741824.0,
                               room / 1073741824.0, what, parts / 1073741824.0);
        plan_line(e, kv->n_blocks - 1, block, parts, "given", what, shrunk);
        return STATUS_OK;
    }
    if (e->snap_budget > 0) { /* a given budget first */
        e->n_snaps = fc_snaps_for(e->snap_budget, snap, 0, 0, 0);
        if ((uint64_t)e->n_snaps * snap > room)
            return status_fail(st, STATUS_NOMEM, "cuda: %d snapshots of %.1f MB (the budget) "
                               "exceed the %.2f GB free beyond the reserve", e->n_snaps,
                               snap / 1e6, (double)room / 1e9);
        room -= (uint64_t)e->n_snaps * snap;
    }
    const uint64_t quarter = (uint64_t)(kv->ld + 3) / 4 * block;
    const uint64_t full = (uint64_t)kv->ld * block;
    uint64_t fit = room / (per_slot + quarter);
    if (fit > 256) fit = 256;
    if (fit < 1 || room < per_slot + full + block)
        return status_fail(st, STATUS_NOMEM, "cuda: one slot needs %.1f MB of state and %.1f MB "
                           "of KV (%d positions); %.2f GB are there (%s, less %.2f GB of attention "
                           "partials%s)", per_slot / 1e6, full / 1e6, e->n_ctx, (double)room / 1e9,
                           what, parts / 1e9, e->n_snaps ? " and the snapshots" : "");
    e->n_slots = (int)fit;
    if (e->snap_budget < 0) { /* chosen: from what lies beyond the pool's quarter contexts
                                 (and one full context) */
        const uint64_t kv_min = fit * quarter > full + block ? fit * quarter : full + block;
        const uint64_t used = fit * per_slot + kv_min, spare = room > used ? room - used : 0;
        e->n_snaps = fc_snaps_for(e->snap_budget, snap, room, spare, (int)fit);
    }
    uint64_t blocks = (room - fit * per_slot - (uint64_t)e->n_snaps * snap) / block;
    if (blocks > fit * kv->ld + 1) blocks = fit * kv->ld + 1;
    kv->n_blocks = (int)blocks;
    LOG_INFO("cuda: %.1f MB of recurrent state per slot, %.1f KB of KV per position; %.1f GB "
             "free: %d slots, KV pool of %d blocks of %d positions (%.1f GB: %.1f full contexts "
             "of %d; --slots overrides), %d snapshots (%.2f GB)", per_slot / 1e6,
             block / 1e3 / ATTN_KV_BLOCK, p.mem_free_bytes / 1e9, e->n_slots, kv->n_blocks - 1,
             ATTN_KV_BLOCK, (double)blocks * block / 1e9, (double)(kv->n_blocks - 1) / kv->ld,
             e->n_ctx, e->n_snaps, (double)e->n_snaps * snap / 1e9);
    plan_line(e, kv->n_blocks - 1, block, parts, "as many as fit a quarter context each, at most 256",
              what, shrunk);
    return STATUS_OK;
}

int fc_rank_create(const qwen35_model *m, const fc_rank_opts *o, fc_rank **out, status *st)
{
    *out = NULL;
    if (!cuda_device_available(st)) return st->code;
    fc_rank *e = calloc(1, sizeof *e);
    if (!e) return status_fail(st, STATUS_NOMEM, "cuda forward");
    e->model = m;
    e->cfg = m->cfg;
    e->n_ctx = o && o->n_ctx > 0 ? o->n_ctx : 4096;
    e->n_slots = o && o->n_slots > 0 ? o->n_slots : 0; /* 0: sized by free memory below */
    e->device = o ? o->device : 0;
    e->kv_type = choose_kv_type(m);
    e->kv_elem_bytes = e->kv_type == ATTN_KV_F32 ? 4 : 2;
    e->batch_invariant = o && o->batch_invariant;
    e->S_bf16 = o && o->state_bf16;
    e->S_elem_bytes = e->S_bf16 ? 2 : 4;
    e->kv_blocks_opt = o ? o->kv_blocks : 0;
    e->ctx_fit = o && o->ctx_fit;
    e->mem_budget = o && o->mem_budget > 0 ? o->mem_budget : 0;
    e->snap_budget = o ? o->snap_budget : 0;
    e->dense_rows_opt = o && !o->batch_invariant ? o->dense_rows : 0;
    e->verify_rows = o && o->verify_rows >= 2 ? o->verify_rows : 0;
    e->verify_runs = o && o->verify_runs > 0 ? o->verify_runs : FWD_VERIFY_RUNS;
    e->n_keep = e->verify_rows ? e->verify_runs * (e->verify_rows - 1) : 0;
    e->tp = o ? o->tp : NULL;
    e->tp_rank = o && o->tp ? o->tp_rank : 0;
    e->mtp.on = m->mtp.present && e->verify_rows && !e->tp; /* the head runs beside verify runs */
    e->n_kv_layers = e->cfg.n_attn_layers + (e->mtp.on ? 1 : 0);
    e->vocab_begin = o && o->tp ? o->vocab_begin : 0;
    if (check_shapes(&e->cfg, st) || cuda_device_props_get(e->device, &e->props, st) ||
        gemv_init(&e->props, st) || cuda_stream_create(&e->launch.stream, st) ||
        fc_weights_upload(e, st) ||
        fc_dense_decide(e, e->dense_rows_opt != 0 && !(o && o->dense_per_pass), st) ||
        size_state(e, st))
        goto fail;
    e->max_rows = o && o->max_rows > 0 ? o->max_rows : e->n_slots + 256;
    /* + the pad slot and the keep slots */
    e->slots = calloc((size_t)e->n_slots + 1 + e->n_keep, sizeof *e->slots);
    if (!e->slots) {
        status_fail(st, STATUS_NOMEM, "cuda forward: %d slots", e->n_slots);
        goto fail;
    }
    fc_batch_plan(e);
    if (!e->b.rows) e->verify_rows = 0; /* verify runs take the batched path */
    if (alloc_run_state(e, st)) goto fail;
    LOG_INFO("cuda: %s: weights %.2f GB, state+KV %.2f GB (%d slots of up to %d positions, KV "
             "%s in %d blocks of %d), scratch %.1f MB", e->props.name, e->w.bytes / 1e9,
             e->state_bytes / 1e9, e->n_slots, e->n_ctx,
             e->kv_type == ATTN_KV_F32 ? "F32" : "F16", e->kv.n_blocks - 1, ATTN_KV_BLOCK,
             e->act_bytes / 1e6);
    if (fc_samplers_create(e, st) || capture_graphs(e, st) || fc_batch_capture(e, st)) goto fail;
    if (e->dense.failed) {
        status_fail(st, STATUS_DEVICE, "cuda: a dense GEMM could not be recorded (cuBLAS)");
        goto fail;
    }
    if (e->tp_failed) {
        status_fail(st, STATUS_DEVICE, "cuda: an all-reduce could not be recorded (rank %d)",
                    e->tp_rank);
        goto fail;
    }
    if (e->b.rows) {
        LOG_INFO("cuda: batched steps: buckets of 1..%d rows (%.1f MB of activations)%s", e->b.rows,
                 e->b.act_bytes / 1e6, e->batch_invariant ? ", every step (batch invariant)" : "");
        if (e->dense.blas)
            LOG_INFO("cuda: dense GEMM from %d rows: %s", e->dense.from, blas_describe());
    } else {
        LOG_INFO("cuda: no batched steps: %s", e->b.why_not);
    }
    snprintf(e->path, sizeof e->path, "GEMV kernels from the tuning table%s%s%s",
             e->pdl ? ", PDL" : "", e->h_logits ? ", host sampler" : ", GPU sampler",
             e->b.rows ? ", batched GEMM" : "");
    LOG_INFO("cuda: ready: %llu kernels per token (%s)",
             (unsigned long long)e->stats.kernels_per_token, e->path);
    const qwen35_config *c = &e->cfg;
    e->stats.weight_bytes = e->w.bytes;
    e->stats.state_bytes = e->state_bytes;
    const uint64_t kv_read =
        (uint64_t)c->n_attn_layers * e->n_ctx * c->n_kv * c->d_h * e->kv_elem_bytes * 2; /* K, V */
    const uint64_t S_rw = 2ull * c->n_gdn_layers * c->n_v * c->d_v * c->d_k * e->S_elem_bytes;
    e->stats.bytes_per_token = e->w.bytes + S_rw + kv_read;
    *out = e;
    return STATUS_OK;
fail:
    fc_rank_destroy(e);
    return st->code;
}

void fc_rank_destroy(fc_rank *e)
{
    if (!e) return;
    for (int i = 0; e->slots && i < e->n_slots; i++) {
        cuda_graph_exec_destroy(e->slots[i].g_forced);
        cuda_graph_exec_destroy(e->slots[i].g_chained);
    }
    fc_samplers_destroy(e);
    fc_batch_destroy(e);
    fc_dense_destroy(e);
    fc_mtp_destroy(e);
    free(e->slots);
    free(e->h_ids);
    fc_kv_destroy(e);
    cuda_free(e->w.d_arena);
    cuda_free(e->d_state);
    cuda_free(e->d_act);
    cuda_free(e->d_snaps);
    cuda_host_free(e->h_pinned);
    cuda_host_free(e->h_hidden);
    cuda_stream_destroy(e->launch.stream);
    free(e);
}

int fc_rank_seq_start(fc_rank *e, int slot, const sampling_params *p, status *st)
{
    if (fc_slot_clear(e, slot, st)) return st->code;
    return fc_sampler_start(e, &e->slots[slot], p, st);
}

int fc_rank_seq_resume(fc_rank *e, int slot, const sampling_params *p, const fc_resume *r,
                       status *st)
{
    if (fc_rank_seq_start(e, slot, p, st) || fc_slot_resume(e, slot, r, st)) return st->code;
    fc_sampler_prompt(e, &e->slots[slot], r->tokens, r->n_pos);
    return STATUS_OK;
}

/* true when row i's token is its slot's last argmax, still on the device: the chained graph
 * takes it from there (only the first row of a slot in a step can be chained) */
static bool row_chained(const fc_rank *e, const fwd_row *rows, int i)
{
    const fc_slot *sl = &e->slots[rows[i].slot];
    return (i == 0 || rows[i - 1].slot != rows[i].slot) && sl->chain_ok && !rows[i].prompt &&
           rows[i].token == sl->last_next;
}

/* Enqueues row i's graph: chained, or forced (the step's next staged token). */
static int launch_row(fc_rank *e, const fwd_row *rows, int i, status *st)
{
    fc_slot *sl = &e->slots[rows[i].slot];
    const bool chained = row_chained(e, rows, i);
    sl->chain_ok = false;
    if (cuda_graph_launch(chained ? sl->g_chained : sl->g_forced, e->launch.stream))
        return cuda_check("cudaGraphLaunch", st);
    sl->n_past++;
    e->stats.tokens++;
    e->stats.graph_launches++;
    e->stats.d2h_bytes += 8;
    return STATUS_OK;
}

/* Stages the forced rows' tokens behind a zero cursor, in launch order: one H2D copy (none when
 * every row is chained, as in greedy decode). */
static void stage_tokens(fc_rank *e, const fwd_row *rows, int B)
{
    int n = 0;
    for (int i = 0; i < B; i++)
        if (!row_chained(e, rows, i)) e->h_stage[1 + n++] = rows[i].token;
    if (!n) return;
    e->h_stage[0] = 0; /* the cursor */
    cuda_copy_h2d_async(e->a.d_cursor, e->h_stage, (size_t)(n + 1) * 4, e->launch.stream);
    e->stats.h2d_bytes += (uint64_t)(n + 1) * 4;
}

void fc_rank_rollback(fc_rank *e, int slot, int n_past)
{
    fc_slot *sl = &e->slots[slot];
    const int row = n_past - sl->v_first - 1;
    DS_ASSERT(sl->v_len > 0 && row >= 0 && row < sl->v_len);
    if (row + 1 < sl->v_len) { /* conv windows and S lie back to back, as a snapshot's */
        const fc_slot *k = &e->slots[sl->v_keep + row];
        cuda_copy_async(sl->d_conv, k->d_conv, e->snap_bytes, e->launch.stream);
    }
    int32_t *pos = e->h_rpos + 2 * (int64_t)slot; /* the one-row graphs read it */
    pos[0] = n_past - 1;
    pos[1] = n_past;
    cuda_copy_h2d_async(sl->d_pos, pos, 8, e->launch.stream);
    sl->n_past = n_past;
    sl->chain_ok = false;
    sl->v_len = row + 1; /* a later rollback only goes further back */
    if (sl->sampler && !sl->greedy) sample_set_step(sl->sampler, sl->v_sstep + (uint64_t)row + 1);
}

/* true when the step goes through the batched graphs: more than one row (decode rows of several
 * slots, a prompt chunk), a verify run (one row too: its record for rollback), or every step
 * when batch invariant */
static bool step_batched(const fc_rank *e, const fwd_row *rows, int B)
{
    return e->b.rows && (B > 1 || e->batch_invariant || rows[0].verify);
}

int fc_rank_step(fc_rank *e, fwd_row *rows, int B, status *st)
{
    for (int i = 0; i < B; i++) /* the device's tables up to each slot's last row of the step */
        if (i + 1 == B || rows[i + 1].slot != rows[i].slot)
            fc_kv_sync(e, rows[i].slot, rows[i].pos);
    if (step_batched(e, rows, B)) return fc_batch_step(e, rows, B, st);
    stage_tokens(e, rows, B);
    for (int i = 0; i < B;) {
        int j = i + 1;
        while (j < B && rows[j].slot == rows[i].slot) j++;
        for (int k = i; k < j; k++) {
            if (launch_row(e, rows, k, st)) return st->code;
            if (rows[k].logits) { /* eval and tests: a pageable copy, not the serving path */
                cuda_copy_d2h_async(rows[k].logits, e->a.d_logits, (size_t)e->cfg.V * 4,
                                    e->launch.stream);
                e->stats.d2h_bytes += (uint64_t)e->cfg.V * 4;
            }
            if (rows[k].hidden) fc_hidden_copy(e, k, e->a.d_h); /* the final norm's output */
        }
        if (fc_sample_run(e, rows, i, j, e->a.d_logits, st)) return st->code;
        i = j;
    }
    if (cuda_sync(e->launch.stream, "step", st)) return st->code;
    e->stats.steps++;
    fc_hidden_out(e, rows, B);
    for (int i = 0; i < B; i++) {
        const fc_slot *sl = &e->slots[rows[i].slot];
        const bool last_of_slot = i + 1 == B || rows[i + 1].slot != rows[i].slot;
        if (!rows[i].sample || !last_of_slot || !(sl->greedy || sl->sampler)) continue;
        if (fc_read_sample(e, &rows[i], gemv_argmax_row(*sl->h_best), st)) return st->code;
        if (sl->greedy) {
            e->slots[rows[i].slot].chain_ok = true;
            e->slots[rows[i].slot].last_next = rows[i].out.token;
        }
    }
    return STATUS_OK;
}
