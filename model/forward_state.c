/* Per-sequence state of the CPU forward pass: DeltaNet conv windows and S matrices, and the
 * paged KV cache of the attention layers (layouts in forward.h and model/README.md). */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

static uint64_t conv_floats(const qwen35_config *c)
{
    return (uint64_t)c->n_gdn_layers * c->C * (c->K_conv - 1);
}

static uint64_t ssm_floats(const qwen35_config *c)
{
    return (uint64_t)c->n_gdn_layers * c->n_v * c->d_v * c->d_k;
}

static int blocks_for(int n_ctx) { return (n_ctx + QWEN35_KV_BLOCK_TOKENS - 1) / QWEN35_KV_BLOCK_TOKENS; }

uint64_t qwen35_kv_floats(const qwen35_model *m, int kv_blocks, int block_tokens)
{
    const qwen35_config *c = &m->cfg;
    return (uint64_t)c->n_attn_layers * kv_blocks * block_tokens * c->n_kv * c->d_h;
}

uint64_t qwen35_state_recurrent_bytes(const qwen35_model *m)
{
    return 4 * (conv_floats(&m->cfg) + ssm_floats(&m->cfg));
}

uint64_t qwen35_state_bytes(const qwen35_model *m, int n_ctx)
{
    return qwen35_state_recurrent_bytes(m) +
           8 * qwen35_kv_floats(m, blocks_for(n_ctx), QWEN35_KV_BLOCK_TOKENS);
}

int qwen35_state_create_paged(const qwen35_model *m, int n_ctx, float *k_cache, float *v_cache,
                              int kv_blocks, int block_tokens, const int32_t *block_table,
                              qwen35_state **out, status *st)
{
    *out = NULL;
    if (n_ctx < 1) return status_fail(st, STATUS_INVALID, "qwen35_state: context of %d tokens", n_ctx);
    DS_ASSERT(kv_blocks >= 1 && block_tokens >= 1 && block_table);
    const qwen35_config *c = &m->cfg;
    qwen35_state *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "qwen35_state: out of memory");
    s->model = m;
    s->n_ctx = n_ctx;
    /* +1 so that a model without layers of a kind still gets valid pointers */
    s->conv = calloc(conv_floats(c) + 1, sizeof(float));
    s->ssm = calloc(ssm_floats(c) + 1, sizeof(float));
    s->k_cache = k_cache;
    s->v_cache = v_cache;
    s->kv_blocks = kv_blocks;
    s->block_tokens = block_tokens;
    s->block_table = block_table;
    if (!s->conv || !s->ssm) {
        qwen35_state_destroy(s);
        return status_fail(st, STATUS_NOMEM, "qwen35_state: out of memory for %llu bytes",
                           (unsigned long long)qwen35_state_recurrent_bytes(m));
    }
    *out = s;
    return STATUS_OK;
}

int qwen35_state_create(const qwen35_model *m, int n_ctx, qwen35_state **out, status *st)
{
    *out = NULL;
    if (n_ctx < 1) return status_fail(st, STATUS_INVALID, "qwen35_state: context of %d tokens", n_ctx);
    const int nb = blocks_for(n_ctx);
    const uint64_t kv = qwen35_kv_floats(m, nb, QWEN35_KV_BLOCK_TOKENS) + 1;
    float *k = malloc(kv * sizeof(float)), *v = malloc(kv * sizeof(float));
    int32_t *table = malloc((size_t)nb * sizeof *table);
    if (!k || !v || !table) {
        free(k), free(v), free(table);
        return status_fail(st, STATUS_NOMEM, "qwen35_state: out of memory for %llu bytes (%d tokens)",
                           (unsigned long long)qwen35_state_bytes(m, n_ctx), n_ctx);
    }
    for (int b = 0; b < nb; b++) table[b] = b; /* its own blocks, in order */
    int rc = qwen35_state_create_paged(m, n_ctx, k, v, nb, QWEN35_KV_BLOCK_TOKENS, table, out, st);
    if (rc) {
        free(k), free(v), free(table);
        return rc;
    }
    (*out)->own_kv = true;
    return STATUS_OK;
}

void qwen35_state_destroy(qwen35_state *s)
{
    if (!s) return;
    free(s->conv);
    free(s->ssm);
    if (s->own_kv) {
        free(s->k_cache);
        free(s->v_cache);
        free((int32_t *)s->block_table);
    }
    free(s);
}

void qwen35_state_reset(qwen35_state *s)
{
    const qwen35_config *c = &s->model->cfg;
    s->n_past = 0;
    memset(s->conv, 0, conv_floats(c) * sizeof(float));
    memset(s->ssm, 0, ssm_floats(c) * sizeof(float));
}

void qwen35_state_copy(qwen35_state *dst, const qwen35_state *src)
{
    DS_ASSERT(dst->model == src->model && dst->n_ctx >= src->n_past);
    const qwen35_config *c = &src->model->cfg;
    memcpy(dst->conv, src->conv, conv_floats(c) * sizeof(float));
    memcpy(dst->ssm, src->ssm, ssm_floats(c) * sizeof(float));
    const size_t row = (size_t)c->n_kv * c->d_h * sizeof(float);
    for (int a = 0; a < c->n_attn_layers; a++)
        for (int p = 0; p < src->n_past; p++) {
            memcpy(dst->k_cache + qwen35_kv_offset(dst, a, p), src->k_cache + qwen35_kv_offset(src, a, p), row);
            memcpy(dst->v_cache + qwen35_kv_offset(dst, a, p), src->v_cache + qwen35_kv_offset(src, a, p), row);
        }
    dst->n_past = src->n_past;
}

void qwen35_state_save_recurrent(const qwen35_state *s, float *dst)
{
    const qwen35_config *c = &s->model->cfg;
    memcpy(dst, s->conv, conv_floats(c) * sizeof(float));
    memcpy(dst + conv_floats(c), s->ssm, ssm_floats(c) * sizeof(float));
}

void qwen35_state_load_recurrent(qwen35_state *s, const float *src, int n_past)
{
    const qwen35_config *c = &s->model->cfg;
    DS_ASSERT(n_past >= 0 && n_past <= s->n_ctx);
    memcpy(s->conv, src, conv_floats(c) * sizeof(float));
    memcpy(s->ssm, src + conv_floats(c), ssm_floats(c) * sizeof(float));
    s->n_past = n_past;
}
