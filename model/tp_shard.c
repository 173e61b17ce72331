/* Tensor-parallel shards of a Qwen3.5 model (tp_shard.h): the split rules, a rank's ranges of
 * each part, and a rank's host model (views where its part is one range, else gathered into an
 * arena sized by a first pass over the same code). */
#include "model/tp_shard.h"

#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"

/* ---- the split ---- */

/* How a rank's DeltaNet heads sit in the full model: key heads [k0, k0 + n_kl) and, for each
 * j in [j0, j0 + n_j), value heads [j n_k + k0, j n_k + k0 + n_kl). */
typedef struct gdn_split {
    int k0, n_kl, j0, n_j;
} gdn_split;

static gdn_split gdn_split_of(const qwen35_config *c, int N, int r)
{
    int rho = c->n_v / c->n_k;
    if (c->n_k % N == 0) return (gdn_split){r * (c->n_k / N), c->n_k / N, 0, rho};
    int m = N / c->n_k, n_j = rho / m; /* m ranks share each key head */
    return (gdn_split){r / m, 1, (r % m) * n_j, n_j};
}

int tp_shard_check(const qwen35_config *c, int N, status *st)
{
    if (N < 1 || N > TP_SHARD_MAX_RANKS)
        return status_fail(st, STATUS_INVALID, "tensor parallel: %d ranks (1..%d)", N, TP_SHARD_MAX_RANKS);
    if (c->n_attn_layers > 0) {
        if (c->n_h % N)
            return status_fail(st, STATUS_UNSUPPORTED, "tensor parallel: n_h = %d query heads do "
                               "not split over %d ranks", c->n_h, N);
        if (c->n_kv % N && N % c->n_kv)
            return status_fail(st, STATUS_UNSUPPORTED, "tensor parallel: n_kv = %d KV heads do not "
                               "split over %d ranks (nor does %d replicate them evenly)", c->n_kv, N, N);
    }
    if (c->n_gdn_layers > 0) {
        int rho = c->n_v / c->n_k;
        if (c->n_k % N && (N % c->n_k || rho % (N / c->n_k)))
            return status_fail(st, STATUS_UNSUPPORTED, "tensor parallel: DeltaNet n_k = %d key heads "
                               "(n_v = %d value heads) do not split over %d ranks", c->n_k, c->n_v, N);
        if (2 + gdn_split_of(c, N, 0).n_j > TP_SHARD_MAX_RANGES)
            return status_fail(st, STATUS_UNSUPPORTED, "tensor parallel: n_v / n_k = %d value heads "
                               "per key head: more than %d ranges per rank", rho, TP_SHARD_MAX_RANGES - 2);
    }
    if (c->F % N)
        return status_fail(st, STATUS_UNSUPPORTED, "tensor parallel: F = %d FFN rows do not split "
                           "over %d ranks", c->F, N);
    if (c->V < N)
        return status_fail(st, STATUS_UNSUPPORTED, "tensor parallel: V = %d vocabulary rows do not "
                           "split over %d ranks", c->V, N);
    return STATUS_OK;
}

void tp_shard_config(const qwen35_config *c, int N, int r, qwen35_config *local)
{
    DS_ASSERT(N >= 1 && r >= 0 && r < N);
    *local = *c;
    local->n_h = c->n_h / N;
    local->n_kv = c->n_kv % N == 0 ? c->n_kv / N : 1;
    if (c->n_k > 0) {
        gdn_split g = gdn_split_of(c, N, r);
        local->n_k = g.n_kl;
        local->n_v = g.n_kl * g.n_j;
        local->C = 2 * local->n_k * c->d_k + local->n_v * c->d_v;
    }
    local->F = c->F / N;
}

static void add(tp_shard_ranges *o, int64_t begin, int64_t n)
{
    if (o->n > 0 && o->r[o->n - 1].begin + o->r[o->n - 1].n == begin) { /* adjacent: merge */
        o->r[o->n - 1].n += n;
    } else {
        DS_ASSERT(o->n < TP_SHARD_MAX_RANGES);
        o->r[o->n++] = (tp_shard_range){begin, n};
    }
    o->total += n;
}

void tp_shard_ranges_get(const qwen35_config *c, int N, int r, tp_shard_part part,
                         tp_shard_ranges *o)
{
    DS_ASSERT(N >= 1 && r >= 0 && r < N);
    memset(o, 0, sizeof *o);
    int64_t d_h = c->d_h, n_hl = c->n_h / N;
    int64_t Dk = (int64_t)c->n_k * c->d_k;
    switch (part) {
    case TP_SHARD_ATTN_Q: add(o, r * n_hl * 2 * d_h, n_hl * 2 * d_h); return;
    case TP_SHARD_ATTN_O: add(o, r * n_hl * d_h, n_hl * d_h); return;
    case TP_SHARD_ATTN_KV:
        if (c->n_kv % N == 0) add(o, (int64_t)r * (c->n_kv / N) * d_h, (c->n_kv / N) * d_h);
        else add(o, (int64_t)(r / (N / c->n_kv)) * d_h, d_h); /* replicated */
        return;
    case TP_SHARD_FFN: add(o, (int64_t)r * (c->F / N), c->F / N); return;
    case TP_SHARD_VOCAB: {
        int64_t b = (int64_t)c->V * r / N, e = (int64_t)c->V * (r + 1) / N;
        add(o, b, e - b);
        return;
    }
    default: break;
    }
    gdn_split g = gdn_split_of(c, N, r);
    if (part == TP_SHARD_GDN_QKV) {
        add(o, (int64_t)g.k0 * c->d_k, (int64_t)g.n_kl * c->d_k);      /* q */
        add(o, Dk + (int64_t)g.k0 * c->d_k, (int64_t)g.n_kl * c->d_k); /* k */
    }
    for (int j = g.j0; j < g.j0 + g.n_j; j++) {
        int64_t hv = (int64_t)j * c->n_k + g.k0;
        switch (part) {
        case TP_SHARD_GDN_QKV: add(o, 2 * Dk + hv * c->d_v, (int64_t)g.n_kl * c->d_v); break;
        case TP_SHARD_GDN_V: add(o, hv * c->d_v, (int64_t)g.n_kl * c->d_v); break;
        case TP_SHARD_GDN_HEAD: add(o, hv, g.n_kl); break;
        default: DS_ASSERT(!"tp_shard_part");
        }
    }
}

/* ---- a rank's host model ---- */

typedef struct arena {
    uint8_t *base; /* NULL: the sizing pass */
    uint64_t used;
} arena;

static void *arena_take(arena *a, uint64_t n)
{
    uint64_t off = (a->used + 63) & ~(uint64_t)63;
    a->used = off + n;
    return a->base ? a->base + off : NULL;
}

typedef struct builder {
    const qwen35_model *m;
    int N, r, il;
    arena *a;
    status *st;
} builder;

static void shard_rows(builder *b, const qwen35_mat *w, tp_shard_part part, qwen35_mat *out)
{
    tp_shard_ranges rg;
    tp_shard_ranges_get(&b->m->cfg, b->N, b->r, part, &rg);
    *out = *w;
    out->n_out = rg.total;
    if (rg.n == 1) {
        out->data = (const uint8_t *)w->data + (uint64_t)rg.r[0].begin * w->row_bytes;
        return;
    }
    uint8_t *dst = arena_take(b->a, (uint64_t)rg.total * w->row_bytes);
    out->data = dst;
    for (int i = 0; dst && i < rg.n; i++) {
        uint64_t n = (uint64_t)rg.r[i].n * w->row_bytes;
        memcpy(dst, (const uint8_t *)w->data + (uint64_t)rg.r[i].begin * w->row_bytes, n);
        dst += n;
    }
}

static int shard_cols(builder *b, const qwen35_mat *w, tp_shard_part part, const char *name,
                      qwen35_mat *out)
{
    tp_shard_ranges rg;
    tp_shard_ranges_get(&b->m->cfg, b->N, b->r, part, &rg);
    const quant_traits *qt = quant_get(w->type);
    const uint64_t bs = qt->block_size, ts = qt->type_size;
    for (int i = 0; i < rg.n; i++)
        if (rg.r[i].begin % bs || rg.r[i].n % bs)
            return status_fail(b->st, STATUS_UNSUPPORTED, "tensor parallel: blk.%d.%s: columns "
                               "[%lld, %lld) of rank %d of %d are not whole %s blocks of %llu",
                               b->il, name, (long long)rg.r[i].begin,
                               (long long)(rg.r[i].begin + rg.r[i].n), b->r, b->N, qt->name,
                               (unsigned long long)bs);
    *out = *w;
    out->n_in = rg.total;
    if (rg.n == 1) { /* a view: same row stride, first column moved */
        out->data = (const uint8_t *)w->data + (uint64_t)rg.r[0].begin / bs * ts;
        return STATUS_OK;
    }
    out->row_bytes = (uint64_t)rg.total / bs * ts;
    uint8_t *dst = arena_take(b->a, (uint64_t)w->n_out * out->row_bytes);
    out->data = dst;
    for (int64_t row = 0; dst && row < w->n_out; row++) {
        const uint8_t *src = (const uint8_t *)w->data + (uint64_t)row * w->row_bytes;
        for (int i = 0; i < rg.n; i++) {
            uint64_t n = (uint64_t)rg.r[i].n / bs * ts;
            memcpy(dst, src + (uint64_t)rg.r[i].begin / bs * ts, n);
            dst += n;
        }
    }
    return STATUS_OK;
}

/* width floats per index of part (a conv row of K_conv, a gate entry of 1) */
static const float *shard_f32(builder *b, const float *v, int64_t width, tp_shard_part part)
{
    tp_shard_ranges rg;
    tp_shard_ranges_get(&b->m->cfg, b->N, b->r, part, &rg);
    if (rg.n == 1) return v + rg.r[0].begin * width;
    float *dst = arena_take(b->a, (uint64_t)rg.total * width * sizeof(float));
    for (int i = 0; dst && i < rg.n; i++) {
        memcpy(dst, v + rg.r[i].begin * width, (size_t)(rg.r[i].n * width) * sizeof(float));
        dst += rg.r[i].n * width;
    }
    return dst ? dst - rg.total * width : v; /* the sizing pass keeps a placeholder */
}

static int build_layer(builder *b, const qwen35_layer *ly, qwen35_layer *o)
{
    const qwen35_config *c = &b->m->cfg;
    *o = *ly; /* norms replicated */
    shard_rows(b, &ly->ffn_gate, TP_SHARD_FFN, &o->ffn_gate);
    shard_rows(b, &ly->ffn_up, TP_SHARD_FFN, &o->ffn_up);
    int rc = shard_cols(b, &ly->ffn_down, TP_SHARD_FFN, "ffn_down.weight", &o->ffn_down);
    if (rc) return rc;
    if (!c->recurrent[b->il]) {
        shard_rows(b, &ly->q, TP_SHARD_ATTN_Q, &o->q);
        shard_rows(b, &ly->k, TP_SHARD_ATTN_KV, &o->k);
        shard_rows(b, &ly->v, TP_SHARD_ATTN_KV, &o->v);
        return shard_cols(b, &ly->o, TP_SHARD_ATTN_O, "attn_output.weight", &o->o);
    }
    shard_rows(b, &ly->qkv, TP_SHARD_GDN_QKV, &o->qkv);
    shard_rows(b, &ly->gate, TP_SHARD_GDN_V, &o->gate);
    shard_rows(b, &ly->beta, TP_SHARD_GDN_HEAD, &o->beta);
    shard_rows(b, &ly->alpha, TP_SHARD_GDN_HEAD, &o->alpha);
    o->conv1d = shard_f32(b, ly->conv1d, c->K_conv, TP_SHARD_GDN_QKV);
    o->dt_bias = shard_f32(b, ly->dt_bias, 1, TP_SHARD_GDN_HEAD);
    o->ssm_a = shard_f32(b, ly->ssm_a, 1, TP_SHARD_GDN_HEAD);
    return shard_cols(b, &ly->ssm_out, TP_SHARD_GDN_V, "ssm_out.weight", &o->ssm_out);
}

static int build(builder *b, tp_shard_model *s)
{
    const qwen35_model *m = b->m;
    qwen35_model *o = &s->model;
    tp_shard_config(&m->cfg, b->N, b->r, &o->cfg);
    o->file = NULL;
    o->tok_embd = m->tok_embd; /* replicated */
    o->output_norm = m->output_norm;
    shard_rows(b, &m->output, TP_SHARD_VOCAB, &o->output);
    for (b->il = 0; b->il < m->cfg.n_layer; b->il++) {
        int rc = build_layer(b, &m->layers[b->il], &o->layers[b->il]);
        if (rc) return rc;
    }
    return STATUS_OK;
}

int tp_shard_model_create(const qwen35_model *m, int n_ranks, int rank, tp_shard_model **out,
                          status *st)
{
    *out = NULL;
    int rc = tp_shard_check(&m->cfg, n_ranks, st);
    if (rc) return rc;
    if (rank < 0 || rank >= n_ranks)
        return status_fail(st, STATUS_INVALID, "tensor parallel: rank %d of %d", rank, n_ranks);
    tp_shard_model *s = calloc(1, sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "tensor parallel: out of memory");
    s->rank = rank;
    s->n_ranks = n_ranks;
    tp_shard_ranges v;
    tp_shard_ranges_get(&m->cfg, n_ranks, rank, TP_SHARD_VOCAB, &v);
    s->vocab_begin = v.r[0].begin;
    arena a = {0};
    builder b = {.m = m, .N = n_ranks, .r = rank, .a = &a, .st = st};
    if ((rc = build(&b, s))) goto fail; /* sizing pass: every check, no copy */
    s->arena_bytes = a.used;
    s->arena = malloc(a.used ? a.used : 1);
    if (!s->arena) {
        rc = status_fail(st, STATUS_NOMEM, "tensor parallel: out of memory for rank %d's %llu "
                         "bytes of gathered weights", rank, (unsigned long long)a.used);
        goto fail;
    }
    a = (arena){.base = s->arena};
    if ((rc = build(&b, s))) goto fail;
    DS_ASSERT(a.used == s->arena_bytes);
    *out = s;
    return STATUS_OK;
fail:
    tp_shard_model_destroy(s);
    return rc;
}

void tp_shard_model_destroy(tp_shard_model *s)
{
    if (!s) return;
    free(s->arena);
    free(s);
}
