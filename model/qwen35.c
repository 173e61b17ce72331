/* Qwen3.5 config from GGUF metadata and weight binding (docs/QWEN35.md §1.2-1.7).
 * Tolerant of the variants seen in the wild (§1.7): 3- or 4-element rope sections, per-layer
 * head_count_kv arrays with 0 for recurrent layers, per-layer head_count / feed_forward_length
 * arrays, ssm_dt with or without ".bias", extra v.* / mtp.* tensors, block_count including
 * the nextn (MTP) layers, whose first one is bound as the MTP head (§1.4). */
#include "model/qwen35.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"

#define KEY(name) "qwen35." name

/* ---- metadata helpers ---- */

static int get_u32_req(const gguf_file *f, const char *key, int *out, status *st)
{
    uint32_t v;
    int rc = gguf_get_u32(f, key, &v, st);
    if (rc == STATUS_NOT_FOUND)
        return status_fail(st, STATUS_FORMAT, "%s: missing metadata key '%s'", f->path, key);
    if (rc) return rc;
    if (v > (1u << 30)) return status_fail(st, STATUS_FORMAT, "%s: key '%s' = %u is out of range", f->path, key, v);
    *out = (int)v;
    return STATUS_OK;
}

static int get_u32_opt(const gguf_file *f, const char *key, int def, int *out, status *st)
{
    if (!gguf_find_kv(f, key)) {
        *out = def;
        return STATUS_OK;
    }
    return get_u32_req(f, key, out, st);
}

static int get_f32_opt(const gguf_file *f, const char *key, float def, float *out, status *st)
{
    int rc = gguf_get_f32(f, key, out, st);
    if (rc == STATUS_NOT_FOUND) {
        *out = def;
        return STATUS_OK;
    }
    return rc;
}

/* A key that is either one integer or an array of one integer per layer (n_all entries).
 * vals gets n_all values. present: whether the key exists; is_arr: whether it was an array. */
static int get_per_layer(const gguf_file *f, const char *key, int n_all, int *vals, bool *present,
                         bool *is_arr, status *st)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    *present = kv != NULL;
    *is_arr = false;
    if (!kv) return STATUS_OK;
    if (kv->type == GGUF_VTYPE_ARRAY) {
        *is_arr = true;
        if (kv->n < (uint64_t)n_all)
            return status_fail(st, STATUS_FORMAT, "%s: key '%s' has %llu entries, expected %d (one per layer)",
                               f->path, key, (unsigned long long)kv->n, n_all);
    }
    for (int i = 0; i < n_all; i++) {
        int64_t v;
        if (gguf_kv_get_int(kv, kv->type == GGUF_VTYPE_ARRAY ? (uint64_t)i : 0, &v) ||
            v < 0 || v > (1 << 30))
            return status_fail(st, STATUS_FORMAT, "%s: offset %llu: key '%s' entry %d is not a valid count",
                               f->path, (unsigned long long)kv->file_offset, key, i);
        vals[i] = (int)v;
    }
    return STATUS_OK;
}

/* The one non-zero value of a per-layer array over the layers where use[i] holds; all equal. */
static int uniform_value(const gguf_file *f, const char *key, const int *vals, const bool *use,
                         int n, int *out, status *st)
{
    *out = 0;
    for (int i = 0; i < n; i++) {
        if (!use[i]) continue;
        if (vals[i] == 0)
            return status_fail(st, STATUS_FORMAT, "%s: key '%s' is 0 for layer %d", f->path, key, i);
        if (*out && vals[i] != *out)
            return status_fail(st, STATUS_UNSUPPORTED,
                               "%s: key '%s' differs between layers (%d vs %d at layer %d)", f->path,
                               key, *out, vals[i], i);
        *out = vals[i];
    }
    return STATUS_OK;
}

static int load_config(const gguf_file *f, qwen35_config *c, status *st)
{
    int rc;
    gguf_str arch;
    rc = gguf_get_str(f, "general.architecture", &arch, st);
    if (rc == STATUS_NOT_FOUND)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: no general.architecture: not a qwen35 model", f->path);
    if (rc) return rc;
    if (!gguf_str_eq(arch, "qwen35"))
        return status_fail(st, STATUS_UNSUPPORTED, "%s: architecture '%.*s' is not qwen35", f->path,
                           (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);

    int nextn;
    if ((rc = get_u32_req(f, KEY("embedding_length"), &c->H, st)) ||
        (rc = get_u32_req(f, KEY("block_count"), &c->n_layer_all, st)) ||
        (rc = get_u32_opt(f, KEY("nextn_predict_layers"), 0, &nextn, st)) ||
        (rc = get_u32_req(f, KEY("attention.key_length"), &c->d_h, st)) ||
        (rc = get_u32_req(f, KEY("ssm.conv_kernel"), &c->K_conv, st)) ||
        (rc = get_u32_req(f, KEY("ssm.state_size"), &c->d_k, st)) ||
        (rc = get_u32_req(f, KEY("ssm.group_count"), &c->n_k, st)) ||
        (rc = get_u32_req(f, KEY("ssm.time_step_rank"), &c->n_v, st)) ||
        (rc = get_u32_opt(f, KEY("context_length"), 4096, &c->n_ctx_train, st)) ||
        (rc = get_f32_opt(f, KEY("attention.layer_norm_rms_epsilon"), 1e-6f, &c->eps, st)) ||
        (rc = get_f32_opt(f, KEY("rope.freq_base"), 1e7f, &c->rope_base, st)))
        return rc;
    c->n_layer = c->n_layer_all - nextn;
    c->n_nextn = nextn;
    if (c->n_layer < 1 || c->n_layer_all > QWEN35_MAX_LAYERS)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: %d layers (%d nextn): this engine runs 1..%d",
                           f->path, c->n_layer_all, nextn, QWEN35_MAX_LAYERS);
    int d_v_len;
    if ((rc = get_u32_opt(f, KEY("attention.value_length"), c->d_h, &d_v_len, st)) ||
        (rc = get_u32_opt(f, KEY("rope.dimension_count"), c->d_h, &c->n_rot, st)))
        return rc;
    if (d_v_len != c->d_h)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: attention key_length %d != value_length %d",
                           f->path, c->d_h, d_v_len);
    if (c->n_rot < 2 || c->n_rot > c->d_h || c->n_rot % 2)
        return status_fail(st, STATUS_FORMAT, "%s: rope.dimension_count %d does not fit head dim %d",
                           f->path, c->n_rot, c->d_h);
    const gguf_kv *sec = gguf_find_kv(f, KEY("rope.dimension_sections"));
    if (sec && (sec->type != GGUF_VTYPE_ARRAY || sec->n < 3 || sec->n > 4))
        return status_fail(st, STATUS_FORMAT, "%s: offset %llu: rope.dimension_sections must have 3 or 4 entries",
                           f->path, (unsigned long long)sec->file_offset);
    if (!(c->eps > 0) || !(c->rope_base > 1))
        return status_fail(st, STATUS_FORMAT, "%s: bad rms eps %g or rope base %g", f->path, c->eps, c->rope_base);

    /* DeltaNet dims */
    int inner;
    if ((rc = get_u32_opt(f, KEY("ssm.inner_size"), c->n_v * c->d_k, &inner, st))) return rc;
    if (c->n_k < 1 || c->n_v < 1 || c->n_v % c->n_k || inner % c->n_v || c->d_k < 1 || c->K_conv < 1 || c->K_conv > 16)
        return status_fail(st, STATUS_FORMAT, "%s: inconsistent ssm dims (group_count %d, time_step_rank %d, inner %d, state %d, conv %d)",
                           f->path, c->n_k, c->n_v, inner, c->d_k, c->K_conv);
    c->d_v = inner / c->n_v;
    c->C = 2 * c->n_k * c->d_k + c->n_v * c->d_v;

    /* layer kinds and per-layer attention/FFN sizes */
    int n_all = c->n_layer_all, L = c->n_layer;
    int kv[QWEN35_MAX_LAYERS], nh[QWEN35_MAX_LAYERS], ff[QWEN35_MAX_LAYERS];
    bool kv_present, kv_arr, nh_present, nh_arr, ff_present, ff_arr;
    if ((rc = get_per_layer(f, KEY("attention.head_count_kv"), n_all, kv, &kv_present, &kv_arr, st)) ||
        (rc = get_per_layer(f, KEY("attention.head_count"), n_all, nh, &nh_present, &nh_arr, st)) ||
        (rc = get_per_layer(f, KEY("feed_forward_length"), n_all, ff, &ff_present, &ff_arr, st)))
        return rc;
    if (!nh_present || !ff_present)
        return status_fail(st, STATUS_FORMAT, "%s: missing metadata key '%s'", f->path,
                           !nh_present ? KEY("attention.head_count") : KEY("feed_forward_length"));
    const gguf_kv *rl = gguf_find_kv(f, KEY("attention.recurrent_layers"));
    if (rl) {
        if (rl->type != GGUF_VTYPE_ARRAY || rl->n < (uint64_t)L)
            return status_fail(st, STATUS_FORMAT, "%s: offset %llu: attention.recurrent_layers needs %d entries",
                               f->path, (unsigned long long)rl->file_offset, L);
        for (int i = 0; i < L; i++) {
            int64_t v;
            if (gguf_kv_get_int(rl, (uint64_t)i, &v))
                return status_fail(st, STATUS_FORMAT, "%s: attention.recurrent_layers entry %d", f->path, i);
            c->recurrent[i] = v != 0;
        }
    } else if (kv_arr) {
        for (int i = 0; i < L; i++) c->recurrent[i] = kv[i] == 0; /* Ollama: 0 KV heads = recurrent */
    } else {
        int interval;
        if ((rc = get_u32_opt(f, KEY("full_attention_interval"), 4, &interval, st))) return rc;
        if (interval < 1) return status_fail(st, STATUS_FORMAT, "%s: full_attention_interval 0", f->path);
        for (int i = 0; i < L; i++) c->recurrent[i] = (i + 1) % interval != 0;
    }
    bool is_attn[QWEN35_MAX_LAYERS] = {0}, all_main[QWEN35_MAX_LAYERS] = {0};
    c->n_attn_layers = c->n_gdn_layers = 0;
    for (int i = 0; i < L; i++) {
        is_attn[i] = !c->recurrent[i];
        all_main[i] = true;
        c->slot[i] = c->recurrent[i] ? c->n_gdn_layers++ : c->n_attn_layers++;
    }
    if (!kv_present) return status_fail(st, STATUS_FORMAT, "%s: missing metadata key '%s'", f->path, KEY("attention.head_count_kv"));
    if ((rc = uniform_value(f, KEY("attention.head_count_kv"), kv, is_attn, L, &c->n_kv, st)) ||
        (rc = uniform_value(f, KEY("attention.head_count"), nh, is_attn, L, &c->n_h, st)) ||
        (rc = uniform_value(f, KEY("feed_forward_length"), ff, all_main, L, &c->F, st)))
        return rc;
    if (c->n_attn_layers == 0) c->n_h = nh[0], c->n_kv = kv[0] ? kv[0] : 1;
    if (c->n_h < 1 || c->n_kv < 1 || c->n_h % c->n_kv)
        return status_fail(st, STATUS_FORMAT, "%s: %d attention heads do not group over %d KV heads",
                           f->path, c->n_h, c->n_kv);
    return STATUS_OK;
}

/* ---- tensor binding ---- */

static const gguf_tensor *find_t(const gguf_file *f, const char *name)
{
    return gguf_find_tensor(f, name);
}

static int shape_fail(const gguf_file *f, const gguf_tensor *t, const char *name, const char *want,
                      status *st)
{
    return status_fail(st, STATUS_FORMAT,
                       "%s: tensor '%s' has shape [%llu, %llu, %llu] type %u, expected %s", f->path,
                       name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                       (unsigned long long)t->ne[2], t->type, want);
}

/* An F32 vector/matrix of exactly n0 x n1 elements (n1 = 1 for a vector). */
static int bind_f32(const gguf_file *f, const char *name, int64_t n0, int64_t n1,
                    const float **out, status *st)
{
    const gguf_tensor *t = find_t(f, name);
    if (!t) return status_fail(st, STATUS_FORMAT, "%s: missing tensor '%s'", f->path, name);
    char want[96];
    snprintf(want, sizeof want, "[%lld, %lld] f32", (long long)n0, (long long)n1);
    if (t->type != GGML_TYPE_F32 || t->ne[0] != (uint64_t)n0 || t->ne[1] != (uint64_t)n1 ||
        t->ne[2] != 1 || t->ne[3] != 1)
        return shape_fail(f, t, name, want, st);
    *out = t->data;
    return STATUS_OK;
}

/* A weight matrix ne=[n_in, n_out] of any supported type. */
static int bind_mat(const gguf_file *f, const char *name, int64_t n_in, int64_t n_out,
                    qwen35_mat *m, status *st)
{
    const gguf_tensor *t = find_t(f, name);
    if (!t) return status_fail(st, STATUS_FORMAT, "%s: missing tensor '%s'", f->path, name);
    char want[96];
    snprintf(want, sizeof want, "[%lld, %lld]", (long long)n_in, (long long)n_out);
    if (t->ne[0] != (uint64_t)n_in || t->ne[1] != (uint64_t)n_out || t->ne[2] != 1 || t->ne[3] != 1)
        return shape_fail(f, t, name, want, st);
    const quant_traits *qt = quant_get(t->type);
    if (!qt || !qt->supported)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: tensor '%s' has type %s (%u), not supported here",
                           f->path, name, qt ? qt->name : "unknown", t->type);
    uint64_t rb = quant_row_bytes(t->type, (uint64_t)n_in);
    if (rb == 0 || rb * (uint64_t)n_out != t->n_bytes)
        return status_fail(st, STATUS_FORMAT, "%s: tensor '%s': %lld elements per row do not fit type %s",
                           f->path, name, (long long)n_in, qt->name);
    m->data = t->data;
    m->type = t->type;
    m->n_in = n_in;
    m->n_out = n_out;
    m->row_bytes = rb;
    return STATUS_OK;
}

#define NAME(buf, il, suffix) (snprintf(buf, sizeof buf, "blk.%d.%s", il, suffix), buf)

static int bind_layer(const gguf_file *f, const qwen35_config *c, int il, qwen35_layer *ly,
                      status *st)
{
    char b[128];
    int rc;
    int64_t H = c->H, F = c->F;
    if ((rc = bind_f32(f, NAME(b, il, "attn_norm.weight"), H, 1, &ly->attn_norm, st)) ||
        (rc = bind_f32(f, NAME(b, il, "post_attention_norm.weight"), H, 1, &ly->post_norm, st)) ||
        (rc = bind_mat(f, NAME(b, il, "ffn_gate.weight"), H, F, &ly->ffn_gate, st)) ||
        (rc = bind_mat(f, NAME(b, il, "ffn_up.weight"), H, F, &ly->ffn_up, st)) ||
        (rc = bind_mat(f, NAME(b, il, "ffn_down.weight"), F, H, &ly->ffn_down, st)))
        return rc;
    if (c->recurrent[il]) {
        int64_t Dv = (int64_t)c->n_v * c->d_v;
        if ((rc = bind_mat(f, NAME(b, il, "attn_qkv.weight"), H, c->C, &ly->qkv, st)) ||
            (rc = bind_mat(f, NAME(b, il, "attn_gate.weight"), H, Dv, &ly->gate, st)) ||
            (rc = bind_mat(f, NAME(b, il, "ssm_beta.weight"), H, c->n_v, &ly->beta, st)) ||
            (rc = bind_mat(f, NAME(b, il, "ssm_alpha.weight"), H, c->n_v, &ly->alpha, st)) ||
            (rc = bind_mat(f, NAME(b, il, "ssm_out.weight"), Dv, H, &ly->ssm_out, st)) ||
            (rc = bind_f32(f, NAME(b, il, "ssm_conv1d.weight"), c->K_conv, c->C, &ly->conv1d, st)) ||
            (rc = bind_f32(f, NAME(b, il, "ssm_a"), c->n_v, 1, &ly->ssm_a, st)) ||
            (rc = bind_f32(f, NAME(b, il, "ssm_norm.weight"), c->d_v, 1, &ly->ssm_norm, st)))
            return rc;
        /* ssm_dt.bias (llama.cpp converter) or plain ssm_dt (Ollama) */
        const char *dt = find_t(f, NAME(b, il, "ssm_dt.bias")) ? "ssm_dt.bias" : "ssm_dt";
        if (!find_t(f, NAME(b, il, dt))) dt = "ssm_dt.bias"; /* for the error message */
        return bind_f32(f, NAME(b, il, dt), c->n_v, 1, &ly->dt_bias, st);
    }
    int64_t q_out = 2LL * c->n_h * c->d_h, kv_out = (int64_t)c->n_kv * c->d_h;
    if ((rc = bind_mat(f, NAME(b, il, "attn_q.weight"), H, q_out, &ly->q, st)) ||
        (rc = bind_mat(f, NAME(b, il, "attn_k.weight"), H, kv_out, &ly->k, st)) ||
        (rc = bind_mat(f, NAME(b, il, "attn_v.weight"), H, kv_out, &ly->v, st)) ||
        (rc = bind_mat(f, NAME(b, il, "attn_output.weight"), (int64_t)c->n_h * c->d_h, H, &ly->o, st)) ||
        (rc = bind_f32(f, NAME(b, il, "attn_q_norm.weight"), c->d_h, 1, &ly->q_norm, st)) ||
        (rc = bind_f32(f, NAME(b, il, "attn_k_norm.weight"), c->d_h, 1, &ly->k_norm, st)))
        return rc;
    return STATUS_OK;
}

/* The MTP block at layer L (docs/QWEN35.md §1.4): an attention layer's tensors, the nextn
 * projection and norms, and the optional embedding / head norm / head with their fallbacks. */
static int bind_mtp(const gguf_file *f, qwen35_model *m, status *st)
{
    const qwen35_config *c = &m->cfg;
    qwen35_config ca = *c; /* the MTP layer is a full-attention layer */
    const int il = c->n_layer;
    ca.recurrent[il] = false;
    qwen35_mtp *t = &m->mtp;
    char b[128];
    int rc;
    if ((rc = bind_layer(f, &ca, il, &t->layer, st)) ||
        (rc = bind_mat(f, NAME(b, il, "nextn.eh_proj.weight"), 2LL * c->H, c->H, &t->eh_proj, st)) ||
        (rc = bind_f32(f, NAME(b, il, "nextn.enorm.weight"), c->H, 1, &t->enorm, st)) ||
        (rc = bind_f32(f, NAME(b, il, "nextn.hnorm.weight"), c->H, 1, &t->hnorm, st)))
        return rc;
    t->head_norm = m->output_norm;
    t->embd = m->tok_embd;
    t->head = m->output;
    if (find_t(f, NAME(b, il, "nextn.shared_head_norm.weight")) &&
        (rc = bind_f32(f, b, c->H, 1, &t->head_norm, st)))
        return rc;
    if (find_t(f, NAME(b, il, "nextn.embed_tokens.weight")) &&
        (rc = bind_mat(f, b, c->H, c->V, &t->embd, st)))
        return rc;
    if (find_t(f, NAME(b, il, "nextn.shared_head_head.weight")) &&
        (rc = bind_mat(f, b, c->H, c->V, &t->head, st)))
        return rc;
    t->layer_index = il;
    t->present = true;
    return STATUS_OK;
}

static int qwen35_model_from_gguf(qwen35_model **out, gguf_file *f, status *st)
{
    *out = NULL;
    qwen35_model *m = calloc(1, sizeof *m);
    if (!m) {
        gguf_close(f);
        return status_fail(st, STATUS_NOMEM, "qwen35: out of memory");
    }
    m->file = f;
    qwen35_config *c = &m->cfg;
    int rc = load_config(f, c, st);
    if (rc) goto fail;

    const gguf_tensor *emb = find_t(f, "token_embd.weight");
    if (!emb) {
        rc = status_fail(st, STATUS_FORMAT, "%s: missing tensor 'token_embd.weight'", f->path);
        goto fail;
    }
    if (emb->ne[1] < 1 || emb->ne[1] > (1u << 30)) {
        rc = shape_fail(f, emb, "token_embd.weight", "[H, V]", st);
        goto fail;
    }
    c->V = (int)emb->ne[1];
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (toks && toks->n > (uint64_t)c->V) {
        rc = status_fail(st, STATUS_FORMAT, "%s: %llu tokenizer tokens but token_embd.weight has %d rows",
                         f->path, (unsigned long long)toks->n, c->V);
        goto fail;
    }
    if ((rc = bind_mat(f, "token_embd.weight", c->H, c->V, &m->tok_embd, st)) ||
        (rc = bind_f32(f, "output_norm.weight", c->H, 1, &m->output_norm, st)))
        goto fail;
    c->tied = find_t(f, "output.weight") == NULL;
    if (c->tied)
        m->output = m->tok_embd;
    else if ((rc = bind_mat(f, "output.weight", c->H, c->V, &m->output, st)))
        goto fail;
    for (int il = 0; il < c->n_layer; il++)
        if ((rc = bind_layer(f, c, il, &m->layers[il], st))) goto fail;
    if (c->n_nextn > 0 && (rc = bind_mtp(f, m, st))) goto fail;
    *out = m;
    return STATUS_OK;
fail:
    qwen35_model_free(m);
    return rc;
}

int qwen35_model_load(qwen35_model **out, const char *path, status *st)
{
    *out = NULL;
    gguf_file *f;
    int rc = gguf_open(&f, path, st);
    if (rc) return rc;
    return qwen35_model_from_gguf(out, f, st);
}

void qwen35_model_free(qwen35_model *m)
{
    if (!m) return;
    gguf_close(m->file);
    free(m);
}
