#include "gguf_rewrite.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"

static char *cstr(gguf_str s)
{
    char *c = malloc(s.len + 1);
    if (c) {
        memcpy(c, s.ptr, s.len);
        c[s.len] = 0;
    }
    return c;
}

static int copy_kv(gguf_writer *w, const gguf_kv *kv)
{
    char *key = cstr(kv->key);
    int rc = STATUS_OK;
    if (kv->type == GGUF_VTYPE_STRING) {
        char *v = cstr(kv->strs[0]);
        rc = gguf_writer_set_str(w, key, v);
        free(v);
    } else if (kv->type == GGUF_VTYPE_ARRAY && kv->arr_type == GGUF_VTYPE_STRING) {
        char **v = calloc(kv->n ? kv->n : 1, sizeof *v);
        for (uint64_t i = 0; i < kv->n; i++) v[i] = cstr(kv->strs[i]);
        rc = gguf_writer_set_arr_str(w, key, (const char *const *)v, kv->n);
        for (uint64_t i = 0; i < kv->n; i++) free(v[i]);
        free(v);
    } else if (kv->type == GGUF_VTYPE_ARRAY) {
        rc = gguf_writer_set_arr(w, key, kv->arr_type, kv->data, kv->n);
    } else {
        rc = gguf_writer_set_val(w, key, kv->type, kv->data);
    }
    free(key);
    return rc;
}

static uint64_t tensor_bytes(uint32_t type, const uint64_t *ne)
{
    uint64_t rows = ne[1] * ne[2] * ne[3];
    return quant_row_bytes(type, ne[0]) * rows;
}

int gguf_rewrite(const char *src_path, const char *dst_path, const gguf_rewrite_opts *o, status *st)
{
    gguf_file *f;
    int rc = gguf_open(&f, src_path, st);
    if (rc) return rc;
    gguf_writer *w = NULL;
    gguf_rewrite_tensor *outs = calloc(f->n_tensors + 1, sizeof *outs);
    float *row = NULL;
    if (!outs) {
        rc = status_fail(st, STATUS_NOMEM, "rewrite: out of memory");
        goto done;
    }
    if ((rc = gguf_writer_create(&w, dst_path, st))) goto done;
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (!o->keep_kv || o->keep_kv(o->arg, &f->kv[i])) copy_kv(w, &f->kv[i]);
    if (o->extra_kv) o->extra_kv(o->arg, w);
    uint64_t max_row = 1;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        gguf_rewrite_tensor *r = &outs[i];
        snprintf(r->name, sizeof r->name, "%.*s", (int)t->name.len, t->name.ptr);
        r->n_dims = t->n_dims;
        memcpy(r->ne, t->ne, sizeof r->ne);
        r->type = t->type;
        if (o->tensor) o->tensor(o->arg, f, t, r);
        if (r->drop) continue;
        if (t->ne[0] > max_row) max_row = t->ne[0];
        gguf_writer_add_tensor(w, r->name, r->n_dims, r->ne, r->type);
    }
    int n_out = 0, n_extra = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) n_out += !outs[i].drop;
    if (o->extra_tensors) n_extra = o->extra_tensors(o->arg, w);
    if ((rc = gguf_writer_begin_data(w, st))) goto done;
    row = malloc(sizeof(float) * max_row);
    uint8_t *qrow = malloc(quant_row_bytes(GGML_TYPE_F32, max_row) + 64);
    for (uint64_t i = 0; i < f->n_tensors && !rc; i++) {
        const gguf_tensor *t = &f->tensors[i];
        const gguf_rewrite_tensor *r = &outs[i];
        if (r->drop) continue;
        uint64_t out_bytes = tensor_bytes(r->type, r->ne);
        if (r->type != t->type) { /* re-type row by row through F32 */
            const quant_traits *src = quant_get(t->type), *dst = quant_get(r->type);
            uint64_t n = t->ne[0], rows = t->ne[1] * t->ne[2] * t->ne[3];
            uint64_t srb = quant_row_bytes(t->type, n), drb = quant_row_bytes(r->type, n);
            for (uint64_t k = 0; k < rows && !rc; k++) {
                src->dequant((const uint8_t *)t->data + k * srb, row, (int64_t)n);
                dst->quantize(row, qrow, (int64_t)n);
                rc = gguf_writer_write_data(w, qrow, drb, st);
            }
        } else if (out_bytes <= t->n_bytes) {
            rc = gguf_writer_write_data(w, t->data, out_bytes, st);
        } else {
            rc = gguf_writer_write_data(w, t->data, t->n_bytes, st);
            uint8_t zero[4096] = {0};
            for (uint64_t left = out_bytes - t->n_bytes; left && !rc;) {
                uint64_t n = left < sizeof zero ? left : sizeof zero;
                rc = gguf_writer_write_data(w, zero, n, st);
                left -= n;
            }
        }
    }
    free(qrow);
    for (int e = 0; e < n_extra && !rc; e++) {
        uint64_t left = gguf_writer_tensor_bytes(w, n_out + e);
        uint8_t zero[4096] = {0};
        while (left && !rc) {
            uint64_t n = left < sizeof zero ? left : sizeof zero;
            rc = gguf_writer_write_data(w, zero, n, st);
            left -= n;
        }
    }
    if (!rc) rc = gguf_writer_finish(w, st);
done:
    gguf_writer_destroy(w);
    free(outs);
    free(row);
    gguf_close(f);
    return rc;
}

/* ---- llama-quantize policies ---- */

typedef struct requant_ctx {
    requant_kind kind;
    uint32_t type;
    int n_layer_all;
    int n_attn_v, i_attn_v; /* attn_v / attn_qkv tensors: total and running counter */
    bool has_output;
} requant_ctx;

static bool ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static bool quantisable(const char *name, uint32_t n_dims)
{
    return n_dims == 2 && ends_with(name, "weight") && !ends_with(name, "_norm.weight") &&
           !strstr(name, "ssm_conv1d");
}

static bool use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static bool is_attn_v(const char *name)
{
    return strstr(name, "attn_v.weight") || strstr(name, "attn_qkv.weight");
}

static void requant_tensor(void *arg, const gguf_file *src, const gguf_tensor *t, gguf_rewrite_tensor *out)
{
    requant_ctx *c = arg;
    if (!quantisable(out->name, t->n_dims)) return;
    uint32_t type = c->type;
    if (c->kind == REQUANT_Q8_0) type = GGML_TYPE_Q8_0;
    if (c->kind == REQUANT_Q4_K_M) {
        type = GGML_TYPE_Q4_K;
        int layer = -1;
        sscanf(out->name, "blk.%d.", &layer);
        if (!strcmp(out->name, "output.weight")) type = GGML_TYPE_Q6_K;
        else if (!strcmp(out->name, "token_embd.weight")) type = c->has_output ? GGML_TYPE_Q4_K : GGML_TYPE_Q6_K;
        else if (is_attn_v(out->name)) {
            if (use_more_bits(c->i_attn_v, c->n_attn_v)) type = GGML_TYPE_Q6_K;
            c->i_attn_v++;
        } else if (strstr(out->name, "ffn_down.weight") && layer >= 0 && use_more_bits(layer, c->n_layer_all))
            type = GGML_TYPE_Q6_K;
    }
    const quant_traits *qt = quant_get(type);
    if (t->ne[0] % qt->block_size) type = GGML_TYPE_Q8_0;
    if (t->ne[0] % quant_get(type)->block_size) return; /* keep as is */
    out->type = type;
}

static void requant_extra_kv(void *arg, gguf_writer *w)
{
    requant_ctx *c = arg;
    uint32_t ft = c->kind == REQUANT_Q8_0 ? 7 : c->kind == REQUANT_Q4_K_M ? 15 : 0;
    if (c->kind == REQUANT_ALL) {
        switch (c->type) {
        case GGML_TYPE_F16: ft = 1; break;
        case GGML_TYPE_BF16: ft = 32; break;
        case GGML_TYPE_Q8_0: ft = 7; break;
        case GGML_TYPE_Q4_K: ft = 14; break; /* Q4_K_S */
        case GGML_TYPE_Q5_K: ft = 16; break; /* Q5_K_S */
        case GGML_TYPE_Q6_K: ft = 18; break;
        default: break;
        }
    }
    gguf_writer_set_u32(w, "general.file_type", ft);
}

int requant_file(const char *src, const char *dst, requant_kind kind, uint32_t type, status *st)
{
    requant_ctx c = {.kind = kind, .type = type};
    gguf_file *f;
    int rc = gguf_open(&f, src, st);
    if (rc) return rc;
    uint32_t bc = 0;
    gguf_get_u32(f, "qwen35.block_count", &bc, NULL);
    c.n_layer_all = (int)bc;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        char name[80];
        snprintf(name, sizeof name, "%.*s", (int)f->tensors[i].name.len, f->tensors[i].name.ptr);
        if (is_attn_v(name)) c.n_attn_v++;
        if (!strcmp(name, "output.weight")) c.has_output = true;
    }
    gguf_close(f);
    if (kind == REQUANT_ALL) {
        const quant_traits *qt = quant_get(type);
        if (!qt || !qt->supported || !qt->quantize)
            return status_fail(st, STATUS_UNSUPPORTED, "requant: type %u cannot be written", type);
    }
    gguf_rewrite_opts o = {.tensor = requant_tensor, .extra_kv = requant_extra_kv, .arg = &c};
    return gguf_rewrite(src, dst, &o, st);
}
