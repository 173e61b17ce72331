/* The CUDA forward's run state (forward_cuda_impl.h): each slot's recurrent state, KV cache
 * (F16 or F32, e->kv_type), device position and argmax word in one arena; the activations one row uses (shared by
 * every slot: rows run one after another) in another. Laid out by a sizing pass (NULL base),
 * then for real. */
#include "model/forward_cuda_impl.h"

#include "kernels/cuda/attn.h"

static uint64_t kv_bytes(const qwen35_cuda *e) /* one of K or V, every attention layer */
{
    const qwen35_config *c = &e->cfg;
    return (uint64_t)c->n_attn_layers * e->n_ctx * c->n_kv * c->d_h * e->kv_elem_bytes;
}

void fc_state_layout(qwen35_cuda *e, fc_arena *a)
{
    const qwen35_config *c = &e->cfg;
    for (int i = 0; i <= e->n_slots; i++) { /* and the pad slot (forward_cuda_impl.h) */
        fc_slot *sl = &e->slots[i];
        sl->d_conv = fc_arena_take(a, (uint64_t)c->n_gdn_layers * c->C * (c->K_conv - 1) * 4);
        sl->d_S = fc_arena_take(a, (uint64_t)c->n_gdn_layers * c->n_v * c->d_v * c->d_k * 4);
        sl->d_kc = fc_arena_take(a, kv_bytes(e));
        sl->d_vc = fc_arena_take(a, kv_bytes(e));
        sl->d_pos = fc_arena_take(a, 8);
        sl->d_best = fc_arena_take(a, 8);
    }
}

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

/* Position 0, recurrent state and KV zeroed (setup path: synchronous). */
int fc_slot_clear(qwen35_cuda *e, int slot, status *st)
{
    fc_slot *sl = &e->slots[slot];
    const int32_t pos[2] = {0, 0};
    /* conv windows, S and the KV cache lie back to back before d_pos (fc_state_layout) */
    if (cuda_memset(sl->d_conv, 0, (size_t)((uint8_t *)sl->d_pos - (uint8_t *)sl->d_conv), st) ||
        cuda_upload(sl->d_pos, pos, sizeof pos, st) || cuda_memset(sl->d_best, 0, 8, st))
        return st->code;
    sl->n_past = 0;
    sl->chain_ok = false;
    return STATUS_OK;
}

int qwen35_cuda_fill(qwen35_cuda *e, int slot, int n_past, status *st)
{
    if (slot < 0 || slot >= e->n_slots)
        return status_fail(st, STATUS_RANGE, "slot %d outside [0, %d)", slot, e->n_slots);
    if (n_past < 0 || n_past >= e->n_ctx)
        return status_fail(st, STATUS_RANGE, "position %d outside [0, %d)", n_past, e->n_ctx);
    fc_slot *sl = &e->slots[slot];
    /* finite values, which do not change the speed: 0x2c2c is F16 0.0659, 0x2c2c2c2c F32
     * 2.45e-12 (exponent 0x58: normal, not a NaN or infinity) */
    if (cuda_memset(sl->d_kc, 0x2c, kv_bytes(e), st) || cuda_memset(sl->d_vc, 0x2c, kv_bytes(e), st))
        return st->code;
    const int32_t pos[2] = {n_past > 0 ? n_past - 1 : 0, n_past};
    if (cuda_upload(sl->d_pos, pos, sizeof pos, st)) return st->code;
    sl->n_past = n_past;
    return STATUS_OK;
}
