/* The CUDA forward's run state (forward_cuda_impl.h): each slot's recurrent state, device
 * position and argmax word, the KV cache's block pools (F16 or F32, e->kv_type) and block table
 * in one arena; the activations one row uses (shared by every slot: rows run one after another)
 * in another. Laid out by a sizing pass (NULL base), then for real. The host's KV block tables
 * (which block holds which positions of a slot) are kept here alone, behind fc_kv_*. */
#include <stdlib.h>

#include "kernels/cuda/attn.h"
#include "model/forward_cuda_impl.h"

/* one block of one layer's K (or V) pool */
static uint64_t kv_block_bytes(const qwen35_cuda *e)
{
    const qwen35_config *c = &e->cfg;
    return (uint64_t)ATTN_KV_BLOCK * c->n_kv * c->d_h * e->kv_elem_bytes;
}

void fc_state_layout(qwen35_cuda *e, fc_arena *a)
{
    const qwen35_config *c = &e->cfg;
    for (int i = 0; i <= e->n_slots; i++) { /* and the pad slot (forward_cuda_impl.h) */
        fc_slot *sl = &e->slots[i];
        sl->d_conv = fc_arena_take(a, (uint64_t)c->n_gdn_layers * c->C * (c->K_conv - 1) * 4);
        sl->d_S = fc_arena_take(a, (uint64_t)c->n_gdn_layers * c->n_v * c->d_v * c->d_k * 4);
        sl->d_pos = fc_arena_take(a, 8);
        sl->d_best = fc_arena_take(a, 8);
    }
    fc_kv *kv = &e->kv;
    kv->layer_bytes = (uint64_t)kv->n_blocks * kv_block_bytes(e);
    kv->d_k = fc_arena_take(a, (uint64_t)c->n_attn_layers * kv->layer_bytes);
    kv->d_v = fc_arena_take(a, (uint64_t)c->n_attn_layers * kv->layer_bytes);
    kv->d_table = fc_arena_take(a, (uint64_t)(e->n_slots + 1) * kv->ld * 4);
}

void *fc_kv_layer(const qwen35_cuda *e, void *pool, int kind_index)
{
    return (uint8_t *)pool + (uint64_t)kind_index * e->kv.layer_bytes;
}

/* ---- the block tables: the host's allocator (forward_cuda_host.h) behind these functions ---- */

/* slot's table row (host), its first kv_held entries valid */
static const int32_t *kv_table(const qwen35_cuda *e, int slot)
{
    return e->kv.blk.table + (size_t)slot * e->kv.blk.ld;
}

static int kv_held(const qwen35_cuda *e, int slot) { return e->kv.blk.held[slot]; }

int fc_kv_alloc(qwen35_cuda *e, status *st)
{
    fc_kv_blocks *blk = &e->kv.blk;
    blk->n_rows = e->n_slots + 1;
    blk->ld = e->kv.ld;
    blk->n_blocks = e->kv.n_blocks;
    const size_t table_bytes = (size_t)blk->n_rows * blk->ld * 4;
    blk->free_ids = malloc((size_t)blk->n_blocks * 4);
    blk->held = calloc((size_t)blk->n_rows, sizeof *blk->held);
    if (!blk->free_ids || !blk->held) return status_fail(st, STATUS_NOMEM, "cuda: KV block list");
    void *table;
    if (cuda_host_alloc(&table, table_bytes, "KV block table", st)) return st->code;
    blk->table = table;
    fc_kv_blocks_reset(blk, e->n_slots); /* the pad slot holds block 0 */
    return cuda_upload(e->kv.d_table, blk->table, table_bytes, st);
}

void fc_kv_destroy(qwen35_cuda *e)
{
    free(e->kv.blk.free_ids);
    free(e->kv.blk.held);
    cuda_host_free(e->kv.blk.table);
}

int fc_kv_grow(qwen35_cuda *e, int slot, int last, status *st)
{
    fc_kv_blocks *k = &e->kv.blk;
    const int first = k->held[slot], got = fc_kv_blocks_grow(k, slot, last, ATTN_KV_BLOCK);
    if (got < 0)
        return status_fail(st, STATUS_EXHAUSTED, "slot %d: KV cache full (%d more blocks of %d "
                           "positions needed, %d of %d free)", slot,
                           last / ATTN_KV_BLOCK + 1 - first, ATTN_KV_BLOCK, k->n_free,
                           k->n_blocks - 1);
    if (!got) return STATUS_OK;
    const size_t at = (size_t)slot * k->ld + first;
    cuda_copy_h2d_async(e->kv.d_table + at, k->table + at, (size_t)got * 4, e->launch.stream);
    e->stats.h2d_bytes += (uint64_t)got * 4;
    return STATUS_OK;
}

void fc_kv_release(qwen35_cuda *e, int slot) { fc_kv_blocks_release(&e->kv.blk, slot); }

void fc_act_layout(qwen35_cuda *e, fc_arena *ar)
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

/* Position 0, recurrent state zeroed (setup path: synchronous); its KV blocks are the caller's
 * (fc_kv_release): positions are written before they are read. */
int fc_slot_clear(qwen35_cuda *e, int slot, status *st)
{
    fc_slot *sl = &e->slots[slot];
    const int32_t pos[2] = {0, 0};
    /* conv windows and S lie back to back before d_pos (fc_state_layout) */
    if (cuda_memset(sl->d_conv, 0, (size_t)((uint8_t *)sl->d_pos - (uint8_t *)sl->d_conv), st) ||
        cuda_upload(sl->d_pos, pos, sizeof pos, st) || cuda_memset(sl->d_best, 0, 8, st))
        return st->code;
    sl->n_past = 0;
    sl->chain_ok = false;
    return STATUS_OK;
}

int fc_slot_fill(qwen35_cuda *e, int slot, int n_past, status *st)
{
    fc_slot *sl = &e->slots[slot];
    /* blocks for positions 0 .. n_past (the next token's too), holding finite values, which
     * do not change the speed: 0x2c2c is F16 0.0659, 0x2c2c2c2c F32 2.45e-12 (exponent 0x58:
     * normal, not a NaN or infinity) */
    fc_kv_release(e, slot);
    if (fc_kv_grow(e, slot, n_past, st)) return st->code;
    const int32_t *row = kv_table(e, slot);
    for (int il = 0; il < e->cfg.n_attn_layers; il++)
        for (int b = 0; b < kv_held(e, slot); b++) {
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
