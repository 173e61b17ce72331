/* Per-sequence state of the CPU forward pass: DeltaNet conv windows and S matrices, and the
 * KV cache of the attention layers (layouts in forward.h and model/README.md). */
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

static uint64_t kv_floats(const qwen35_config *c, int n_ctx) /* one of K, V */
{
    return (uint64_t)c->n_attn_layers * n_ctx * c->n_kv * c->d_h;
}

uint64_t qwen35_state_bytes(const qwen35_model *m, int n_ctx)
{
    const qwen35_config *c = &m->cfg;
    return 4 * (conv_floats(c) + ssm_floats(c) + 2 * kv_floats(c, n_ctx));
}

int qwen35_state_create(const qwen35_model *m, int n_ctx, qwen35_state **out, status *st)
{
    *out = NULL;
    if (n_ctx < 1) return status_fail(st, STATUS_INVALID, "qwen35_state: context of %d tokens", n_ctx);
    const qwen35_config *c = &m->cfg;
    qwen35_state *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "qwen35_state: out of memory");
    s->model = m;
    s->n_ctx = n_ctx;
    /* +1 so that a model without layers of a kind still gets valid pointers */
    s->conv = calloc(conv_floats(c) + 1, sizeof(float));
    s->ssm = calloc(ssm_floats(c) + 1, sizeof(float));
    s->k_cache = malloc((kv_floats(c, n_ctx) + 1) * sizeof(float));
    s->v_cache = malloc((kv_floats(c, n_ctx) + 1) * sizeof(float));
    if (!s->conv || !s->ssm || !s->k_cache || !s->v_cache) {
        qwen35_state_destroy(s);
        return status_fail(st, STATUS_NOMEM, "qwen35_state: out of memory for %llu bytes (%d tokens)",
                           (unsigned long long)qwen35_state_bytes(m, n_ctx), n_ctx);
    }
    *out = s;
    return STATUS_OK;
}

void qwen35_state_destroy(qwen35_state *s)
{
    if (!s) return;
    free(s->conv);
    free(s->ssm);
    free(s->k_cache);
    free(s->v_cache);
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
    uint64_t row = (uint64_t)c->n_kv * c->d_h;
    for (int a = 0; a < c->n_attn_layers; a++) {
        memcpy(dst->k_cache + (uint64_t)a * dst->n_ctx * row,
               src->k_cache + (uint64_t)a * src->n_ctx * row, src->n_past * row * sizeof(float));
        memcpy(dst->v_cache + (uint64_t)a * dst->n_ctx * row,
               src->v_cache + (uint64_t)a * src->n_ctx * row, src->n_past * row * sizeof(float));
    }
    dst->n_past = src->n_past;
}

int qwen35_state_layer_slot(const qwen35_model *m, int il)
{
    DS_ASSERT(il >= 0 && il < m->cfg.n_layer);
    return m->cfg.slot[il];
}
