/* Synthetic Qwen3.5 GGUFs: presets, tensor table, type mix (synth.h). The values are in
 * synth_fill.c, the tokenizer in synth_vocab.c, the multi-threaded write in synth_write.c. */
#include "gguf/synth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"

/* docs/QWEN35.md §4.1/§4.2. n_ctx 262144, rope base 1e7, eps 1e-6, sections [11,11,10,0],
 * d_h 256, n_k 16, d_k = d_v 128, K_conv 4, n_rot 64, V 248320. */
#define REAL(nm, L, h, f, nh, nkv, nv, tie)                                                  \
    {                                                                                          \
        .name = nm, .n_layer = L, .H = h, .F = f, .V = 248320, .n_h = nh, .n_kv = nkv,         \
        .d_h = 256, .n_k = 16, .n_v = nv, .d_k = 128, .d_v = 128, .K_conv = 4, .n_rot = 64,    \
        .rope_sections = {11, 11, 10, 0}, .full_attn_interval = 4, .tied = tie,                \
        .n_ctx_train = 262144, .rope_base = 1.0e7f, .eps = 1e-6f,                              \
    }

static const synth_preset preset_table[] = {
    /* "tiny": the CPU engine's fast default (README demo, CI). Like the reference model
     * tiny-r2-tied (r = 2, so the tiled V-head order matters) but with F a multiple of 256
     * so every quant type applies; rope sections [3,3,2,0] sum to n_rot/2. */
    {
        .name = "tiny", .n_layer = 4, .H = 256, .F = 512, .V = 2048, .n_h = 4, .n_kv = 2,
        .d_h = 64, .n_k = 2, .n_v = 4, .d_k = 64, .d_v = 64, .K_conv = 4, .n_rot = 16,
        .rope_sections = {3, 3, 2, 0}, .full_attn_interval = 4, .tied = true,
        .n_ctx_train = 262144, .rope_base = 1.0e7f, .eps = 1e-6f,
    },
    REAL("0.8b", 24, 1024, 3584, 8, 2, 16, true),
    REAL("2b", 24, 2048, 6144, 8, 2, 16, true),
    REAL("4b", 32, 2560, 9216, 16, 4, 32, true),
    REAL("9b", 32, 4096, 12288, 16, 4, 32, false),
    REAL("27b", 64, 5120, 17408, 24, 4, 48, false),
};
#undef REAL
#define N_PRESETS (sizeof preset_table / sizeof preset_table[0])

const synth_preset *synth_preset_find(const char *name)
{
    for (size_t i = 0; i < N_PRESETS; i++)
        if (name && !strcmp(preset_table[i].name, name)) return &preset_table[i];
    return NULL;
}

static const struct {
    const char *name;
    uint32_t file_type; /* llama_ftype */
} quant_table[SYNTH_QUANT_COUNT] = {
    [SYNTH_QUANT_F32] = {"f32", 0},   [SYNTH_QUANT_F16] = {"f16", 1},
    [SYNTH_QUANT_BF16] = {"bf16", 32}, [SYNTH_QUANT_Q8_0] = {"q8_0", 7},
    [SYNTH_QUANT_Q4_K_M] = {"q4_k_m", 15},
};

int synth_quant_parse(const char *s)
{
    for (int q = 0; q < SYNTH_QUANT_COUNT; q++)
        if (s && !strcmp(quant_table[q].name, s)) return q;
    return -1;
}

const char *synth_quant_name(synth_quant q)
{
    DS_ASSERT((unsigned)q < SYNTH_QUANT_COUNT);
    return quant_table[q].name;
}

uint32_t synth_quant_file_type(synth_quant q)
{
    DS_ASSERT((unsigned)q < SYNTH_QUANT_COUNT);
    return quant_table[q].file_type;
}

/* One row per kind: name suffix, value class, quantisable 2D matmul weight. */
static const struct {
    const char *suffix;
    synth_values values;
    bool matmul;
} kind_table[SYNTH_KIND_COUNT] = {
    [SYNTH_KIND_TOKEN_EMBD] = {"token_embd.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_OUTPUT_NORM] = {"output_norm.weight", SYNTH_VALUES_NORM, false},
    [SYNTH_KIND_OUTPUT] = {"output.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_ATTN_NORM] = {"attn_norm.weight", SYNTH_VALUES_NORM, false},
    [SYNTH_KIND_POST_ATTN_NORM] = {"post_attention_norm.weight", SYNTH_VALUES_NORM, false},
    [SYNTH_KIND_FFN_GATE] = {"ffn_gate.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_FFN_UP] = {"ffn_up.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_FFN_DOWN] = {"ffn_down.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_ATTN_QKV] = {"attn_qkv.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_ATTN_GATE] = {"attn_gate.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_SSM_BETA] = {"ssm_beta.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_SSM_ALPHA] = {"ssm_alpha.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_SSM_CONV1D] = {"ssm_conv1d.weight", SYNTH_VALUES_CONV, false},
    [SYNTH_KIND_SSM_DT_BIAS] = {"ssm_dt.bias", SYNTH_VALUES_DT_BIAS, false},
    [SYNTH_KIND_SSM_A] = {"ssm_a", SYNTH_VALUES_SSM_A, false},
    [SYNTH_KIND_SSM_NORM] = {"ssm_norm.weight", SYNTH_VALUES_NORM, false},
    [SYNTH_KIND_SSM_OUT] = {"ssm_out.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_ATTN_Q] = {"attn_q.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_ATTN_K] = {"attn_k.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_ATTN_V] = {"attn_v.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_ATTN_OUTPUT] = {"attn_output.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_ATTN_Q_NORM] = {"attn_q_norm.weight", SYNTH_VALUES_NORM, false},
    [SYNTH_KIND_ATTN_K_NORM] = {"attn_k_norm.weight", SYNTH_VALUES_NORM, false},
    [SYNTH_KIND_NEXTN_EH_PROJ] = {"nextn.eh_proj.weight", SYNTH_VALUES_MATMUL, true},
    [SYNTH_KIND_NEXTN_ENORM] = {"nextn.enorm.weight", SYNTH_VALUES_NORM, false},
    [SYNTH_KIND_NEXTN_HNORM] = {"nextn.hnorm.weight", SYNTH_VALUES_NORM, false},
    [SYNTH_KIND_NEXTN_SHARED_HEAD_NORM] = {"nextn.shared_head_norm.weight", SYNTH_VALUES_NORM, false},
};

synth_values synth_kind_values(synth_kind kind)
{
    DS_ASSERT((unsigned)kind < SYNTH_KIND_COUNT);
    return kind_table[kind].values;
}

bool synth_layer_is_recurrent(const synth_preset *p, int layer)
{
    return layer >= 0 && layer < p->n_layer && (layer + 1) % p->full_attn_interval != 0;
}

bool synth_use_more_bits(int i, int n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

uint32_t synth_tensor_type(const synth_preset *p, synth_quant q, synth_kind kind, int layer)
{
    DS_ASSERT((unsigned)kind < SYNTH_KIND_COUNT && (unsigned)q < SYNTH_QUANT_COUNT);
    if (!kind_table[kind].matmul) return GGML_TYPE_F32;
    switch (q) {
    case SYNTH_QUANT_F32: return GGML_TYPE_F32;
    case SYNTH_QUANT_F16: return GGML_TYPE_F16;
    case SYNTH_QUANT_BF16: return GGML_TYPE_BF16;
    case SYNTH_QUANT_Q8_0: return GGML_TYPE_Q8_0;
    case SYNTH_QUANT_Q4_K_M: break;
    case SYNTH_QUANT_COUNT: DS_ASSERT(0);
    }
    switch (kind) {
    case SYNTH_KIND_OUTPUT: return GGML_TYPE_Q6_K;
    case SYNTH_KIND_TOKEN_EMBD: return p->tied ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
    /* The "attn_v-like" category: one per layer (attn_v or attn_qkv), so llama-quantize's
     * running counter i_attention_wv equals the layer index and n_attention_wv = L. */
    case SYNTH_KIND_ATTN_V:
    case SYNTH_KIND_ATTN_QKV:
    case SYNTH_KIND_FFN_DOWN:
        return synth_use_more_bits(layer, p->n_layer) ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
    default: return GGML_TYPE_Q4_K;
    }
}

/* ---- tensor table ------------------------------------------------------------------ */

static const synth_kind common_kinds[] = {SYNTH_KIND_ATTN_NORM, SYNTH_KIND_POST_ATTN_NORM,
                                          SYNTH_KIND_FFN_GATE, SYNTH_KIND_FFN_UP,
                                          SYNTH_KIND_FFN_DOWN};
static const synth_kind gdn_kinds[] = {
    SYNTH_KIND_ATTN_QKV,  SYNTH_KIND_ATTN_GATE,   SYNTH_KIND_SSM_BETA, SYNTH_KIND_SSM_ALPHA,
    SYNTH_KIND_SSM_CONV1D, SYNTH_KIND_SSM_DT_BIAS, SYNTH_KIND_SSM_A,    SYNTH_KIND_SSM_NORM,
    SYNTH_KIND_SSM_OUT};
static const synth_kind attn_kinds[] = {SYNTH_KIND_ATTN_Q,      SYNTH_KIND_ATTN_K,
                                        SYNTH_KIND_ATTN_V,      SYNTH_KIND_ATTN_OUTPUT,
                                        SYNTH_KIND_ATTN_Q_NORM, SYNTH_KIND_ATTN_K_NORM};
static const synth_kind nextn_kinds[] = {SYNTH_KIND_NEXTN_EH_PROJ, SYNTH_KIND_NEXTN_ENORM,
                                         SYNTH_KIND_NEXTN_HNORM,
                                         SYNTH_KIND_NEXTN_SHARED_HEAD_NORM};
#define N_OF(a) ((int)(sizeof(a) / sizeof(a)[0]))

/* Shape of a kind (docs/QWEN35.md §1.4): ne[0], ne[1] (1 for 1D tensors). */
static void kind_shape(const synth_preset *p, synth_kind kind, uint64_t ne[2], uint32_t *n_dims)
{
    DS_ASSERT((unsigned)kind < SYNTH_KIND_COUNT);
    uint64_t H = (uint64_t)p->H, F = (uint64_t)p->F, V = (uint64_t)p->V;
    uint64_t D_k = (uint64_t)p->n_k * p->d_k, D_v = (uint64_t)p->n_v * p->d_v;
    uint64_t C = 2 * D_k + D_v, Q = (uint64_t)p->n_h * p->d_h, KV = (uint64_t)p->n_kv * p->d_h;
    uint64_t a = 0, b = 1;
    switch (kind) {
    case SYNTH_KIND_TOKEN_EMBD: a = H, b = V; break;
    case SYNTH_KIND_OUTPUT: a = H, b = V; break;
    case SYNTH_KIND_OUTPUT_NORM:
    case SYNTH_KIND_ATTN_NORM:
    case SYNTH_KIND_POST_ATTN_NORM: a = H; break;
    case SYNTH_KIND_FFN_GATE:
    case SYNTH_KIND_FFN_UP: a = H, b = F; break;
    case SYNTH_KIND_FFN_DOWN: a = F, b = H; break;
    case SYNTH_KIND_ATTN_QKV: a = H, b = C; break;
    case SYNTH_KIND_ATTN_GATE: a = H, b = D_v; break;
    case SYNTH_KIND_SSM_BETA:
    case SYNTH_KIND_SSM_ALPHA: a = H, b = (uint64_t)p->n_v; break;
    case SYNTH_KIND_SSM_CONV1D: a = (uint64_t)p->K_conv, b = C; break;
    case SYNTH_KIND_SSM_DT_BIAS:
    case SYNTH_KIND_SSM_A: a = (uint64_t)p->n_v; break;
    case SYNTH_KIND_SSM_NORM: a = (uint64_t)p->d_v; break;
    case SYNTH_KIND_SSM_OUT: a = D_v, b = H; break;
    case SYNTH_KIND_ATTN_Q: a = H, b = 2 * Q; break;
    case SYNTH_KIND_ATTN_K:
    case SYNTH_KIND_ATTN_V: a = H, b = KV; break;
    case SYNTH_KIND_ATTN_OUTPUT: a = Q, b = H; break;
    case SYNTH_KIND_ATTN_Q_NORM:
    case SYNTH_KIND_ATTN_K_NORM: a = (uint64_t)p->d_h; break;
    case SYNTH_KIND_NEXTN_EH_PROJ: a = 2 * H, b = H; break;
    case SYNTH_KIND_NEXTN_ENORM:
    case SYNTH_KIND_NEXTN_HNORM:
    case SYNTH_KIND_NEXTN_SHARED_HEAD_NORM: a = H; break;
    case SYNTH_KIND_COUNT: DS_ASSERT(0);
    }
    ne[0] = a;
    ne[1] = b;
    /* conv1d is [K_conv, C]: 2D in the file although it is never a matmul */
    *n_dims = (kind_table[kind].matmul || kind == SYNTH_KIND_SSM_CONV1D) ? 2 : 1;
}

static int plan_add(const synth_preset *p, synth_quant q, synth_kind kind, int layer,
                    synth_tensor *t, status *st)
{
    memset(t, 0, sizeof *t);
    if (layer < 0)
        snprintf(t->name, sizeof t->name, "%s", kind_table[kind].suffix);
    else
        snprintf(t->name, sizeof t->name, "blk.%d.%s", layer, kind_table[kind].suffix);
    t->kind = kind;
    t->layer = layer;
    kind_shape(p, kind, t->ne, &t->n_dims);
    t->type = synth_tensor_type(p, q, kind, layer);
    t->row_bytes = quant_row_bytes(t->type, t->ne[0]);
    if (!t->row_bytes)
        return status_fail(st, STATUS_INVALID,
                           "synth %s: tensor %s: row of %llu elements does not fit type %u",
                           p->name, t->name, (unsigned long long)t->ne[0], t->type);
    t->n_bytes = t->row_bytes * t->ne[1];
    return 0;
}

int synth_plan(const synth_preset *p, synth_quant q, synth_tensor **out, int *n_out, status *st)
{
    return synth_plan_mtp(p, q, false, out, n_out, st);
}

int synth_plan_mtp(const synth_preset *p, synth_quant q, bool mtp, synth_tensor **out,
                   int *n_out, status *st)
{
    *out = NULL;
    *n_out = 0;
    if ((unsigned)q >= SYNTH_QUANT_COUNT)
        return status_fail(st, STATUS_INVALID, "synth: unknown quant %d", (int)q);
    if (p->n_layer < 1 || p->n_layer > 4096 || p->full_attn_interval < 1)
        return status_fail(st, STATUS_INVALID, "synth %s: bad layer count %d", p->name,
                           p->n_layer);
    int max = 3 + (p->n_layer + 1) * (N_OF(common_kinds) + N_OF(gdn_kinds) + N_OF(nextn_kinds));
    synth_tensor *t = calloc((size_t)max, sizeof *t);
    if (!t) return status_fail(st, STATUS_NOMEM, "synth %s: out of memory", p->name);
    int n = 0, rc;
    if ((rc = plan_add(p, q, SYNTH_KIND_TOKEN_EMBD, -1, &t[n++], st))) goto fail;
    if ((rc = plan_add(p, q, SYNTH_KIND_OUTPUT_NORM, -1, &t[n++], st))) goto fail;
    if (!p->tied && (rc = plan_add(p, q, SYNTH_KIND_OUTPUT, -1, &t[n++], st))) goto fail;
    for (int l = 0; l < p->n_layer; l++) {
        for (int i = 0; i < N_OF(common_kinds); i++)
            if ((rc = plan_add(p, q, common_kinds[i], l, &t[n++], st))) goto fail;
        bool rec = synth_layer_is_recurrent(p, l);
        const synth_kind *ks = rec ? gdn_kinds : attn_kinds;
        int nk = rec ? N_OF(gdn_kinds) : N_OF(attn_kinds);
        for (int i = 0; i < nk; i++)
            if ((rc = plan_add(p, q, ks[i], l, &t[n++], st))) goto fail;
    }
    if (mtp) { /* layer L: an attention layer plus the nextn tensors */
        int l = p->n_layer;
        for (int i = 0; i < N_OF(common_kinds); i++)
            if ((rc = plan_add(p, q, common_kinds[i], l, &t[n++], st))) goto fail;
        for (int i = 0; i < N_OF(attn_kinds); i++)
            if ((rc = plan_add(p, q, attn_kinds[i], l, &t[n++], st))) goto fail;
        for (int i = 0; i < N_OF(nextn_kinds); i++)
            if ((rc = plan_add(p, q, nextn_kinds[i], l, &t[n++], st))) goto fail;
    }
    DS_ASSERT(n <= max);
    *out = t;
    *n_out = n;
    return 0;
fail:
    free(t);
    return rc;
}
