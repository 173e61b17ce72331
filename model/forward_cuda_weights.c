/* The CUDA forward's weights (forward_cuda_impl.h): every matrix uploaded once into one arena
 * in the GEMV layout (gemv_pack), the in-projections of one input packed together when of one
 * type, each matrix's launch configuration chosen once from the tuning table (gemv_matrix_plan).
 * Run twice: a sizing pass (no device memory), then the upload into the allocated arena. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "gguf/quant.h"
#include "model/forward_cuda_impl.h"

void *fc_arena_take(fc_arena *a, uint64_t bytes)
{
    const uint64_t off = (a->used + 255) & ~(uint64_t)255;
    a->used = off + bytes;
    if (!a->base) return NULL; /* sizing pass */
    DS_ASSERT(a->used <= a->cap);
    return a->base + off;
}

typedef struct fc_upload {
    fc_rank *e;
    fc_arena *w;
    bool sizing;
    void *d_stage;      /* device staging for GGUF bytes before gemv_pack */
    uint64_t stage_cap; /* bytes */
    uint8_t *h_cat;     /* host staging for packing matrices together */
    uint64_t done, total;
} fc_upload;

static int upload_vec(fc_upload *u, const float *src, int64_t n, const float **out, status *st)
{
    float *d = fc_arena_take(u->w, (uint64_t)n * sizeof(float));
    *out = d;
    if (u->sizing) return STATUS_OK;
    return cuda_upload(d, src, (uint64_t)n * sizeof(float), st);
}

/* Uploads mats[0..n) (one type and width) as one packed GEMV matrix of their rows in order. */
static int upload_mats(fc_upload *u, const qwen35_mat *const *mats, int n, gemv_matrix *out,
                       status *st)
{
    const qwen35_mat *m0 = mats[0];
    int64_t n_out = 0;
    for (int i = 0; i < n; i++) {
        DS_ASSERT(mats[i]->type == m0->type && mats[i]->n_in == m0->n_in);
        n_out += mats[i]->n_out;
    }
    if (!gemv_supported(m0->type))
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: weight type %u not supported", m0->type);
    const uint64_t rb = quant_row_bytes(m0->type, (uint64_t)m0->n_in);
    const uint64_t raw = rb * (uint64_t)n_out;
    const uint64_t packed = gemv_packed_bytes(m0->type, m0->n_in, n_out);
    if (!packed)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: %lld-wide rows of type %u",
                           (long long)m0->n_in, m0->type);
    void *d = fc_arena_take(u->w, packed);
    *out = (gemv_matrix){.type = m0->type, .n_in = m0->n_in, .n_out = n_out, .d_w = d};
    if (gemv_matrix_plan(out, &u->e->props, st)) return st->code;
    if (u->sizing) {
        if (raw > u->stage_cap) u->stage_cap = raw;
        u->total += raw;
        return STATUS_OK;
    }
    /* GGUF rows -> device staging (gathered on the host when several matrices, or rows with a
     * longer stride: a tensor-parallel shard's columns of a row-parallel weight), repacked */
    const void *src = m0->data;
    bool gather = n > 1;
    for (int i = 0; i < n; i++) {
        DS_ASSERT(mats[i]->row_bytes >= rb);
        gather |= mats[i]->row_bytes != rb;
    }
    if (gather) {
        uint64_t off = 0;
        for (int i = 0; i < n; i++) {
            const uint8_t *m = mats[i]->data;
            if (mats[i]->row_bytes == rb) {
                memcpy(u->h_cat + off, m, rb * (uint64_t)mats[i]->n_out);
                off += rb * (uint64_t)mats[i]->n_out;
                continue;
            }
            for (int64_t r = 0; r < mats[i]->n_out; r++, off += rb)
                memcpy(u->h_cat + off, m + (uint64_t)r * mats[i]->row_bytes, rb);
        }
        src = u->h_cat;
    }
    if (cuda_upload(u->d_stage, src, raw, st)) return st->code;
    gemv_pack(m0->type, u->d_stage, d, m0->n_in, n_out, NULL);
    if (cuda_sync(NULL, "gemv_pack", st)) return st->code;
    const uint64_t before = u->done * 10 / (u->total ? u->total : 1);
    u->done += raw;
    if (u->done * 10 / u->total != before)
        LOG_INFO("cuda: uploading weights %3d%% (%.2f GB)", (int)(100 * u->done / u->total),
                 u->done / 1e9);
    return STATUS_OK;
}

static int upload_one(fc_upload *u, const qwen35_mat *m, gemv_matrix *out, status *st)
{
    return upload_mats(u, &m, 1, out, st);
}

/* Groups consecutive same-type matrices of one input into packed GEMVs; y offsets follow. */
static int upload_groups(fc_upload *u, const qwen35_mat *const *mats, int n, fc_layer *L,
                         status *st)
{
    L->n_in = 0;
    int64_t y_off = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && mats[j]->type == mats[i]->type) j++;
        DS_ASSERT(L->n_in < FC_MAX_GROUPS);
        fc_group *g = &L->in[L->n_in++];
        if (upload_mats(u, mats + i, j - i, &g->m, st)) return st->code;
        g->y_off = y_off;
        y_off += g->m.n_out;
        i = j;
    }
    L->in_pair = L->n_in == 2 && gemv_pair_planned(&L->in[0].m, &L->in[1].m);
    return STATUS_OK;
}

static int upload_gdn(fc_upload *u, const qwen35_layer *W, fc_layer *L, status *st)
{
    const qwen35_config *c = &u->e->cfg;
    const qwen35_mat *in[4] = {&W->qkv, &W->gate, &W->beta, &W->alpha};
    if (upload_groups(u, in, 4, L, st) || upload_one(u, &W->ssm_out, &L->out, st) ||
        upload_vec(u, W->conv1d, (int64_t)c->C * c->K_conv, &L->d_conv_w, st) ||
        upload_vec(u, W->dt_bias, c->n_v, &L->d_dt_bias, st) ||
        upload_vec(u, W->ssm_a, c->n_v, &L->d_ssm_a, st) ||
        upload_vec(u, W->ssm_norm, c->d_v, &L->d_ssm_norm, st))
        return st->code;
    return STATUS_OK;
}

static int upload_attn(fc_upload *u, const qwen35_layer *W, fc_layer *L, status *st)
{
    const qwen35_config *c = &u->e->cfg;
    const qwen35_mat *in[3] = {&W->q, &W->k, &W->v};
    if (upload_groups(u, in, 3, L, st) || upload_one(u, &W->o, &L->out, st) ||
        upload_vec(u, W->q_norm, c->d_h, &L->d_q_norm, st) ||
        upload_vec(u, W->k_norm, c->d_h, &L->d_k_norm, st))
        return st->code;
    return STATUS_OK;
}

/* The MTP head (fc_mtp): its layer as an attention layer whose KV is the pool's layer after the
 * model's, the projection, the norms; its embedding and lm_head the main model's when the file
 * shares them (the same tensor data), else uploaded. */
static int upload_mtp(fc_upload *u, status *st)
{
    fc_rank *e = u->e;
    const qwen35_config *c = &e->cfg;
    const qwen35_model *m = e->model;
    const qwen35_mtp *W = &m->mtp;
    fc_mtp *t = &e->mtp;
    fc_layer *L = &t->layer;
    L->gdn = false;
    L->kind_index = c->n_attn_layers;
    if (W->layer.ffn_gate.type != W->layer.ffn_up.type)
        return status_fail(st, STATUS_UNSUPPORTED,
                           "cuda: the MTP layer's ffn_gate and ffn_up of different types");
    if (upload_vec(u, W->layer.attn_norm, c->H, &L->d_attn_norm, st) ||
        upload_vec(u, W->layer.post_norm, c->H, &L->d_post_norm, st) ||
        upload_attn(u, &W->layer, L, st) || upload_one(u, &W->layer.ffn_gate, &L->gate, st) ||
        upload_one(u, &W->layer.ffn_up, &L->up, st) ||
        upload_one(u, &W->layer.ffn_down, &L->down, st) ||
        upload_one(u, &W->eh_proj, &t->eh_proj, st) ||
        upload_vec(u, W->enorm, c->H, &t->d_enorm, st) ||
        upload_vec(u, W->hnorm, c->H, &t->d_hnorm, st) ||
        upload_vec(u, W->head_norm, c->H, &t->d_head_norm, st))
        return st->code;
    if (W->embd.data == m->tok_embd.data)
        t->embd = e->w.embd;
    else if (upload_one(u, &W->embd, &t->embd, st))
        return st->code;
    if (W->head.data == m->output.data)
        t->head = e->w.head;
    else if (W->head.data == m->tok_embd.data)
        t->head = e->w.embd;
    else if (upload_one(u, &W->head, &t->head, st))
        return st->code;
    return STATUS_OK;
}

static int upload_layers(fc_upload *u, status *st)
{
    fc_rank *e = u->e;
    const qwen35_config *c = &e->cfg;
    for (int il = 0, n_gdn = 0, n_attn = 0; il < c->n_layer; il++) {
        const qwen35_layer *W = &e->model->layers[il];
        fc_layer *L = &e->w.layers[il];
        L->gdn = c->recurrent[il];
        L->kind_index = L->gdn ? n_gdn++ : n_attn++;
        if (upload_vec(u, W->attn_norm, c->H, &L->d_attn_norm, st) ||
            upload_vec(u, W->post_norm, c->H, &L->d_post_norm, st) ||
            (L->gdn ? upload_gdn(u, W, L, st) : upload_attn(u, W, L, st)))
            return st->code;
        if (W->ffn_gate.type != W->ffn_up.type)
            return status_fail(st, STATUS_UNSUPPORTED,
                               "cuda: layer %d: ffn_gate and ffn_up of different types", il);
        if (upload_one(u, &W->ffn_gate, &L->gate, st) || upload_one(u, &W->ffn_up, &L->up, st) ||
            upload_one(u, &W->ffn_down, &L->down, st))
            return st->code;
    }
    const qwen35_model *m = e->model;
    if (upload_one(u, &m->tok_embd, &e->w.embd, st) ||
        upload_vec(u, m->output_norm, c->H, &e->w.d_out_norm, st))
        return st->code;
    /* tied: the embedding's rows serve as the lm_head, unless this is a tensor-parallel shard,
     * whose lm_head is its slice of the vocabulary */
    if (c->tied && m->output.data == m->tok_embd.data && m->output.n_out == m->tok_embd.n_out)
        e->w.head = e->w.embd;
    else if (upload_one(u, &m->output, &e->w.head, st))
        return st->code;
    return e->mtp.on ? upload_mtp(u, st) : STATUS_OK;
}

/* Sizing pass (no device memory), one allocation for the arena and the staging buffers, then
 * the upload pass into the arena; the staging is freed before returning. */
int fc_weights_upload(fc_rank *e, status *st)
{
    fc_arena arena = {0};
    fc_upload u = {.e = e, .w = &arena, .sizing = true};
    int rc = upload_layers(&u, st);
    if (rc) return rc;
    e->w.bytes = arena.used;
    rc = cuda_alloc(&e->w.d_arena, arena.used, "weights", st) ||
         cuda_alloc(&u.d_stage, u.stage_cap, "upload staging", st);
    if (rc) {
        rc = st->code;
        goto done;
    }
    u.h_cat = malloc(u.stage_cap);
    if (!u.h_cat) {
        rc = status_fail(st, STATUS_NOMEM, "upload staging (%llu bytes)",
                         (unsigned long long)u.stage_cap);
        goto done;
    }
    arena = (fc_arena){e->w.d_arena, 0, e->w.bytes};
    u.sizing = false;
    rc = upload_layers(&u, st);
done: /* rc, not st->code: a caller's status need not start cleared */
    cuda_free(u.d_stage);
    free(u.h_cat);
    return rc;
}
