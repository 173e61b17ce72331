/* The CUDA forward's run state (forward_cuda_impl.h): each slot's recurrent state, device
 * position and argmax word (S in F32 or bf16: e->S_bf16), the KV cache's block pools (F16 or F32, e->kv_type) and block table
 * in one arena; the activations one row uses (shared by every slot: rows run one after another)
 * in another. Laid out by a sizing pass (NULL base), then for real. The KV block tables are the
 * group's pool (rank 0's, model/kv_pool.h); each rank's device mirror of them is kept here,
 * behind fc_kv_*. */
#include <stdlib.h>

#include "kernels/cuda/attn.h"
#include "model/forward_cuda_impl.h"

/* one block of one layer's K (or V) pool */
static uint64_t kv_block_bytes(const fc_rank *e)
{
    const qwen35_config *c = &e->cfg;
    return (uint64_t)ATTN_KV_BLOCK * c->n_kv * c->d_h * e->kv_elem_bytes;
}

void fc_state_layout(fc_rank *e, fc_arena *a)
{
    const qwen35_config *c = &e->cfg;
    /* and the pad slot and the keep slots (forward_cuda_impl.h), one stride apart */
    for (int i = 0; i <= e->n_slots + e->n_keep; i++) {
        fc_slot *sl = &e->slots[i];
        sl->d_conv = fc_arena_take(a, (uint64_t)c->n_gdn_layers * c->C * (c->K_conv - 1) * 4);
        sl->d_S = fc_arena_take(a, (uint64_t)c->n_gdn_layers * c->n_v * c->d_v * c->d_k *
                                       e->S_elem_bytes);
        sl->d_pos = fc_arena_take(a, 8);
        sl->d_best = fc_arena_take(a, 8);
    }
    fc_kv *kv = &e->kv;
    kv->layer_bytes = (uint64_t)kv->n_blocks * kv_block_bytes(e);
    kv->d_k = fc_arena_take(a, (uint64_t)e->n_kv_layers * kv->layer_bytes);
    kv->d_v = fc_arena_take(a, (uint64_t)e->n_kv_layers * kv->layer_bytes);
    kv->d_table = fc_arena_take(a, (uint64_t)(e->n_slots + 1) * kv->ld * 4);
}

void *fc_kv_layer(const fc_rank *e, void *pool, int kind_index)
{
    return (uint8_t *)pool + (uint64_t)kind_index * e->kv.layer_bytes;
}

/* ---- the block tables: model/kv_pool.h's, mirrored to d_table ---- */

int fc_kv_alloc(fc_rank *e, status *st)
{
    fc_kv *kv = &e->kv;
    kv->mirror = calloc((size_t)e->n_slots, sizeof *kv->mirror);
    int32_t *pad = malloc((size_t)kv->ld * sizeof *pad);
    if (!kv->mirror || !pad) {
        free(pad);
        return status_fail(st, STATUS_NOMEM, "cuda: KV table mirrors");
    }
    /* the slots' rows empty (no entry is read before the pool lists it), the pad slot's rows
     * all at position 0 of its block, the device pools' last */
    for (int i = 0; i < kv->ld; i++) pad[i] = kv->n_blocks - 1;
    const int rc = cuda_memset(kv->d_table, 0, (size_t)e->n_slots * kv->ld * 4, st) ||
                   cuda_upload(kv->d_table + (size_t)e->n_slots * kv->ld, pad,
                               (size_t)kv->ld * 4, st);
    free(pad);
    if (rc) return st->code;
    if (e->tp_rank > 0) return STATUS_OK; /* rank 0's pool, once every rank is made */
    void *table;
    if (cuda_host_alloc(&table, (size_t)e->n_slots * kv->ld * 4, "KV block table", st))
        return st->code;
    kv->h_table = table;
    const kv_pool_opts o = {.n_seqs = e->n_slots, .block_tokens = ATTN_KV_BLOCK,
                            .n_blocks = kv->n_blocks - 1, .max_blocks_per_seq = kv->ld,
                            .table = kv->h_table};
    if (kv_pool_create(&o, &kv->pool, st)) return st->code;
    kv->own_pool = true;
    fc_kv_borrow(e, kv->pool);
    return STATUS_OK;
}

void fc_kv_borrow(fc_rank *e, kv_pool *pool)
{
    fc_kv *kv = &e->kv;
    kv->pool = pool;
    for (int i = 0; i < e->n_slots; i++) /* d_table holds none of the tables' entries yet */
        kv->mirror[i] = (fc_kv_mirror){0, kv_pool_version(pool, i)};
}

void fc_kv_destroy(fc_rank *e)
{
    if (e->kv.own_pool) kv_pool_destroy(e->kv.pool);
    e->kv.pool = NULL;
    free(e->kv.mirror);
    cuda_host_free(e->kv.h_table);
}

void fc_kv_sync(fc_rank *e, int slot, int last)
{
    fc_kv *kv = &e->kv;
    DS_ASSERT(kv_pool_held(kv->pool, slot) * ATTN_KV_BLOCK > last);
    int from, to;
    fc_kv_mirror_sync(kv->pool, slot, &kv->mirror[slot], &from, &to);
    if (from == to) return;
    cuda_copy_h2d_async(kv->d_table + (size_t)slot * kv->ld + from,
                        kv_pool_table(kv->pool, slot) + from, (size_t)(to - from) * 4,
                        e->launch.stream);
    e->stats.h2d_bytes += (uint64_t)(to - from) * 4;
}

void fc_act_layout(fc_rank *e, fc_arena *ar)
{
    const qwen35_config *c = &e->cfg;
    fc_act *a = &e->a;
    const int64_t D_v = (int64_t)c->n_v * c->d_v, HA = (int64_t)c->n_h * c->d_h;
    int64_t proj = c->C + D_v + 2 * c->n_v;
    const int64_t proj_attn = 2 * HA + 2 * (int64_t)c->n_kv * c->d_h;
    if (proj_attn > proj) proj = proj_attn;
    const int64_t ymax = D_v > HA ? D_v : HA;
    a->d_x = fc_arena_take(ar, c->H * 4);
    a->d_h = fc_arena_take(ar, c->H * 4);
    a->d_hq = fc_arena_take(ar, gemv_xq_bytes(c->H));
    a->d_proj = fc_arena_take(ar, proj * 4);
    a->d_o = fc_arena_take(ar, D_v * 4);
    a->d_y = fc_arena_take(ar, ymax * 4);
    a->d_yq = fc_arena_take(ar, gemv_xq_bytes(ymax));
    a->d_ffn = fc_arena_take(ar, (int64_t)c->F * 4);
    a->d_ffnq = fc_arena_take(ar, gemv_xq_bytes(c->F));
    a->d_q = fc_arena_take(ar, HA * 4);
    a->d_part = fc_arena_take(ar, attn_partial_floats(c->n_h, c->d_h, e->n_ctx) * 4);
    a->d_logits = fc_arena_take(ar, (int64_t)c->V * 4);
    a->d_cursor = fc_arena_take(ar, 4 * ((uint64_t)e->max_rows + 1));
    a->d_tokens = a->d_cursor ? a->d_cursor + 1 : NULL;
    a->d_tok_out = fc_arena_take(ar, 4);
}

/* Position 0, recurrent state zeroed (setup path: synchronous); its KV blocks are the group's
 * to release: positions are written before they are read. The state's memset goes on the stream
 * (a snapshot copy of this slot may still be reading it: the stream is non-blocking, a memset on
 * the default stream would not wait for it); cuda_upload's device-wide sync then waits for it. */
int fc_slot_clear(fc_rank *e, int slot, status *st)
{
    fc_slot *sl = &e->slots[slot];
    const int32_t pos[2] = {0, 0};
    /* conv windows and S lie back to back before d_pos (fc_state_layout) */
    cuda_memset_async(sl->d_conv, 0, (size_t)((uint8_t *)sl->d_pos - (uint8_t *)sl->d_conv),
                      e->launch.stream);
    if (cuda_upload(sl->d_pos, pos, sizeof pos, st) || cuda_memset(sl->d_best, 0, 8, st))
        return st->code;
    sl->n_past = 0;
    sl->chain_ok = false;
    return STATUS_OK;
}

int fc_slot_fill(fc_rank *e, int slot, int n_past, status *st)
{
    fc_slot *sl = &e->slots[slot];
    /* the blocks of positions 0 .. n_past (the next token's too), holding finite values, which
     * do not change the speed: 0x2c2c is F16 0.0659, 0x2c2c2c2c F32 2.45e-12 (exponent 0x58:
     * normal, not a NaN or infinity) */
    fc_kv_sync(e, slot, n_past);
    const int32_t *row = kv_pool_table(e->kv.pool, slot);
    for (int il = 0; il < e->n_kv_layers; il++)
        for (int b = 0; b < kv_pool_held(e->kv.pool, slot); b++) {
            const uint64_t off = (uint64_t)row[b] * kv_block_bytes(e);
            if (cuda_memset((uint8_t *)fc_kv_layer(e, e->kv.d_k, il) + off, 0x2c,
                            kv_block_bytes(e), st) ||
                cuda_memset((uint8_t *)fc_kv_layer(e, e->kv.d_v, il) + off, 0x2c,
                            kv_block_bytes(e), st))
                return st->code;
        }
    if (cuda_sync(e->launch.stream, "KV block table", st)) return st->code;
    const int32_t pos[2] = {n_past > 0 ? n_past - 1 : 0, n_past};
    if (cuda_upload(sl->d_pos, pos, sizeof pos, st)) return st->code;
    sl->n_past = n_past;
    return STATUS_OK;
}

/* ---- snapshots ---- */

static uint64_t round256(uint64_t n) { return (n + 255) & ~(uint64_t)255; }

uint64_t fc_snap_bytes(const fc_rank *e)
{
    const qwen35_config *c = &e->cfg; /* as fc_state_layout takes d_conv, then d_S */
    return round256((uint64_t)c->n_gdn_layers * c->C * (c->K_conv - 1) * 4) +
           round256((uint64_t)c->n_gdn_layers * c->n_v * c->d_v * c->d_k * e->S_elem_bytes);
}

static uint8_t *snap_at(const fc_rank *e, int snap)
{
    return (uint8_t *)e->d_snaps + (uint64_t)snap * e->snap_bytes;
}

void fc_snap_save(fc_rank *e, int slot, int snap)
{
    const fc_slot *sl = &e->slots[slot];
    DS_ASSERT((uint64_t)((uint8_t *)sl->d_pos - (uint8_t *)sl->d_conv) == e->snap_bytes);
    cuda_copy_async(snap_at(e, snap), sl->d_conv, e->snap_bytes, e->launch.stream);
}

int fc_slot_resume(fc_rank *e, int slot, const fc_resume *r, status *st)
{
    fc_slot *sl = &e->slots[slot];
    const int32_t pos[2] = {r->n_pos - 1, r->n_pos};
    if (cuda_upload(sl->d_pos, pos, sizeof pos, st)) return st->code;
    cuda_copy_async(sl->d_conv, snap_at(e, r->snap), e->snap_bytes, e->launch.stream);
    const int rows = r->n_pos % ATTN_KV_BLOCK;
    if (rows) { /* the partial block's first rows: they lie at its start ([row][n_kv][d_h]) */
        const uint64_t block = kv_block_bytes(e), bytes = block / ATTN_KV_BLOCK * rows;
        const uint64_t src = (uint64_t)r->src_block * block, dst = (uint64_t)r->dst_block * block;
        for (int il = 0; il < e->n_kv_layers; il++) {
            uint8_t *k = fc_kv_layer(e, e->kv.d_k, il), *v = fc_kv_layer(e, e->kv.d_v, il);
            cuda_copy_async(k + dst, k + src, bytes, e->launch.stream);
            cuda_copy_async(v + dst, v + src, bytes, e->launch.stream);
        }
    }
    sl->n_past = r->n_pos;
    sl->chain_ok = false;
    return cuda_check("resuming a slot from a snapshot", st);
}
