/* The CUDA engine (cuda_backend.h): upload, buffers, the step graph, and the host side of a
 * token (one graph launch, one sync). Device memory is taken only at create (cuda_alloc). */
#include "worker/cuda_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "gguf/quant.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/norm.h"

#define CB_MAX_GROUPS 4

/* Matrices of one layer that read the same input, packed row after row when of one type. */
typedef struct cb_group {
    gemv_matrix m;   /* d_w into the weight arena */
    int64_t y_off;   /* first output row in the projection buffer */
} cb_group;

typedef struct cb_layer {
    bool gdn;
    int slot; /* index among layers of its kind */
    const float *d_attn_norm, *d_post_norm;
    cb_group in[CB_MAX_GROUPS]; /* DeltaNet: qkv|z|beta|alpha; attention: q|k|v */
    int n_in;
    gemv_matrix out; /* ssm_out or attn_output */
    gemv_matrix gate, up, down;
    const float *d_conv_w, *d_dt_bias, *d_ssm_a, *d_ssm_norm; /* DeltaNet */
    const float *d_q_norm, *d_k_norm;                         /* attention */
} cb_layer;

/* One sequence: its state views in the state arena, its position on the device, its graphs. */
typedef struct cb_slot {
    float *d_conv;      /* [n_gdn][C][K_conv-1] */
    float *d_S;         /* [n_gdn][n_v][d_v][d_k] */
    void *d_kc, *d_vc;  /* [n_attn][n_ctx][n_kv][d_h] F16 */
    int32_t *d_pos;     /* [2]: position of the current token, next position */
    cuda_graph_exec g_forced, g_greedy; /* owned */
    int n_past;
} cb_slot;

struct cuda_backend {
    const qwen35_model *model; /* borrowed */
    qwen35_config cfg;
    int n_ctx;
    cuda_device_props props;
    cuda_stream stream;
    cb_layer layers[QWEN35_MAX_LAYERS];
    gemv_matrix embd, head; /* head.d_w == embd.d_w when tied */
    const float *d_out_norm;
    /* device memory: one arena each, owned */
    void *d_weights;  /* all matrices and norm vectors */
    void *d_state;    /* conv windows, S, K and V caches */
    void *d_act;      /* activations and scratch */
    uint64_t weight_bytes, state_bytes, act_bytes;
    int n_slots;
    cb_slot *slots; /* owned, [n_slots] */
    /* activation views */
    float *d_x, *d_h, *d_proj, *d_o, *d_y, *d_ffn, *d_q, *d_part, *d_logits;
    void *d_hq, *d_yq, *d_ffnq;
    unsigned *d_sync; /* counters of the fused epilogues (zero between launches) */
    bool fuse;        /* flat GEMVs with fused epilogues (DS_GEMV_KERNEL=flat; default: warp) */
    bool wfuse;       /* the warp graph with the fused epilogues too (DS_GEMV_WARP_FUSE=1) */
    uint64_t pair_max; /* in-projection groups of two types in one launch up to these bytes
                          (DS_GEMV_PAIR_MB, default 32 MiB; 0: off) */
    bool pdl;         /* the step graph uses programmatic dependent launch (DS_PDL=0: not) */
    unsigned repeat;  /* DS_STEP_REPEAT: kernel kinds recorded twice (timing only, wrong output) */
    uint64_t next_pf; /* bytes of the next GEMV's weights each GEMV prefetches (DS_GEMV_NEXT_MB) */
    bool xnorm;       /* GEMVs normalise x in their prologue instead of a norm_rms (DS_GEMV_XNORM) */
    int gemv_kernel;  /* gemv_matrix.kernel of every matrix */
    unsigned long long *d_best;
    int32_t *d_tok_in, *d_tok_out;
    /* pinned host views */
    void *h_pinned; /* owned */
    int32_t *h_tok;
    unsigned long long *h_best;
    bool pending; /* a step was enqueued without a sync (cuda_backend_decode_enqueue) */
    cuda_backend_stats stats;
};

/* true when the environment variable is set and not "0" (an A/B switch read at create) */
static bool getenv_flag_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* ---- arena helper: 256-byte aligned bump allocation inside one cuda_alloc ---- */
typedef struct cb_arena {
    uint8_t *base;
    uint64_t used, cap;
} cb_arena;

static void *arena_take(cb_arena *a, uint64_t bytes)
{
    const uint64_t off = (a->used + 255) & ~(uint64_t)255;
    a->used = off + bytes;
    if (!a->base) return NULL; /* sizing pass */
    DS_ASSERT(a->used <= a->cap);
    return a->base + off;
}

/* ---- weights ---- */

typedef struct cb_upload {
    cb_arena *w;
    void *d_stage;      /* device staging for GGUF bytes before gemv_pack */
    uint64_t stage_cap; /* bytes */
    uint8_t *h_cat;     /* host staging for packing matrices together */
    uint64_t done, total;
    bool verbose;
    int gemv_kernel;
    cuda_stream s;
} cb_upload;

static int upload_vec(cb_upload *u, const float *src, int64_t n, const float **out, status *st)
{
    float *d = arena_take(u->w, (uint64_t)n * sizeof(float));
    *out = d;
    if (!d) return STATUS_OK;
    return cuda_upload(d, src, (uint64_t)n * sizeof(float), st);
}

/* Uploads matrices mats[0..n) (same type and n_in) as one packed GEMV matrix. */
static int upload_mats(cb_upload *u, const qwen35_mat *const *mats, int n, gemv_matrix *out,
                       status *st)
{
    const qwen35_mat *m0 = mats[0];
    int64_t n_out = 0;
    for (int i = 0; i < n; i++) {
        DS_ASSERT(mats[i]->type == m0->type && mats[i]->n_in == m0->n_in);
        n_out += mats[i]->n_out;
    }
    if (!gemv_supported(m0->type))
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: weight type %u not supported",
                           m0->type);
    const uint64_t rb = quant_row_bytes(m0->type, (uint64_t)m0->n_in);
    const uint64_t raw = rb * (uint64_t)n_out, packed = gemv_packed_bytes(m0->type, m0->n_in, n_out);
    if (!packed)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: %lld-wide rows of type %u",
                           (long long)m0->n_in, m0->type);
    void *d = arena_take(u->w, packed);
    /* DS_GEMV_SHORT_FLAT=1: the warp graph takes the flat kernel for short, wide matrices
     * (alone, the 0.8B's down projection 1024 x 3584 ran 3.3 us flat vs 4.8-5.7 us warp on the
     * H200, docs/BENCH.md run 8; but in the PDL step graph the 0.8B decoded 3% slower with it,
     * run 9, so it is off by default) */
    int kernel = u->gemv_kernel;
    if (kernel == GEMV_KERNEL_WARP && n_out <= 2048 && m0->n_in >= 2 * n_out &&
        gemv_flat_supported(m0->type, m0->n_in) && getenv_flag_on("DS_GEMV_SHORT_FLAT"))
        kernel = GEMV_KERNEL_FLAT;
    /* Q6_K matrices of 2^25 to 2^30 weights other than the lm_head (the 27B's ffn_down and
     * attn_qkv in its Q6_K layers) on the flat kernel; DS_GEMV_Q6_FLAT=0: never, =1: every Q6_K
     * matrix under 2^30 weights. H200 gemv_bench (BENCH run 20): 27B ffn_down 65.8% of 4.6 TB/s
     * flat vs 54.0% warp, attn_qkv 59.9 vs 49.0; decode (run 21, every Q6_K under 2^30 flat):
     * 27B 140.2 vs 135.8 tok/s, 4B even, 0.8B 1290 vs 1322 (its lm_head, in the step graph) */
    {
        const char *qf = getenv("DS_GEMV_Q6_FLAT");
        const uint64_t nw = (uint64_t)m0->n_in * (uint64_t)n_out;
        const bool all = qf && strcmp(qf, "1") == 0, off = qf && strcmp(qf, "0") == 0;
        if (kernel == GEMV_KERNEL_WARP && m0->type == GGML_TYPE_Q6_K && !off &&
            nw < (1ull << 30) && (all || (nw >= (1ull << 25) && n_out <= 65536)) &&
            gemv_flat_supported(m0->type, m0->n_in))
            kernel = GEMV_KERNEL_FLAT;
    }
    /* DS_GEMV_RING=1: the ring kernel (cp.async stages ahead of the arithmetic) for Q4_K/Q5_K
     * matrices of at least DS_GEMV_RING_MIN_KB (default 4096) KiB. Off by default: slower than
     * the warp kernel at every shape on the H200 (27B 124.3 vs 135.0 tok/s, BENCH run 17) */
    if (kernel == GEMV_KERNEL_WARP && gemv_ring_supported(m0->type, m0->n_in) &&
        getenv_flag_on("DS_GEMV_RING")) {
        const char *mk = getenv("DS_GEMV_RING_MIN_KB");
        const uint64_t min = (uint64_t)(mk ? atoll(mk) : 4096) << 10;
        if (packed >= min) kernel = GEMV_KERNEL_RING;
    }
    /* DS_GEMV_WRING=1: Q4_K matrices on the warp-ring kernel (each warp's own cp.async ring;
     * matrices too short to fill the GPU one row a warp stay on the warp kernel at launch).
     * Measured on the H200 (BENCH.md run 26): 1-27% slower; opt-in */
    if (kernel == GEMV_KERNEL_WARP && m0->type == GGML_TYPE_Q4_K && getenv_flag_on("DS_GEMV_WRING"))
        kernel = GEMV_KERNEL_WRING;
    *out = (gemv_matrix){m0->type, m0->n_in, n_out, d, 0, kernel, 0};
    if (!d) { /* sizing pass: the largest staging needs */
        if (raw > u->stage_cap) u->stage_cap = raw;
        u->total += raw;
        return STATUS_OK;
    }
    /* GGUF rows -> device staging (concatenated on the host when several), then repacked */
    const void *src = m0->data;
    for (int i = 0; i < n; i++) DS_ASSERT(mats[i]->row_bytes == rb);
    if (n > 1) {
        uint64_t off = 0;
        for (int i = 0; i < n; i++) {
            memcpy(u->h_cat + off, mats[i]->data, rb * (uint64_t)mats[i]->n_out);
            off += rb * (uint64_t)mats[i]->n_out;
        }
        src = u->h_cat;
    }
    if (cuda_upload(u->d_stage, src, raw, st)) return st->code;
    gemv_pack(m0->type, u->d_stage, d, m0->n_in, n_out, u->s);
    if (cuda_sync(u->s, "gemv_pack", st)) return st->code;
    const uint64_t before = u->done * 10 / (u->total ? u->total : 1);
    u->done += raw;
    if (u->verbose && u->done * 10 / u->total != before)
        fprintf(stderr, "cuda: uploading weights %3d%% (%.2f GB)\n",
                (int)(100 * u->done / u->total), u->done / 1e9);
    return STATUS_OK;
}

/* Groups consecutive same-type matrices of one input into packed GEMVs; y offsets follow. */
static int upload_groups(cb_upload *u, const qwen35_mat *const *mats, int n, cb_layer *L,
                         status *st)
{
    L->n_in = 0;
    int64_t y_off = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        while (j < n && mats[j]->type == mats[i]->type) j++;
        DS_ASSERT(L->n_in < CB_MAX_GROUPS);
        cb_group *g = &L->in[L->n_in++];
        if (upload_mats(u, mats + i, j - i, &g->m, st)) return st->code;
        g->y_off = y_off;
        y_off += g->m.n_out;
        i = j;
    }
    return STATUS_OK;
}

static int upload_model(cuda_backend *b, cb_upload *u, status *st)
{
    const qwen35_model *m = b->model;
    const qwen35_config *c = &b->cfg;
    for (int il = 0; il < c->n_layer; il++) {
        const qwen35_layer *W = &m->layers[il];
        cb_layer *L = &b->layers[il];
        L->gdn = c->recurrent[il];
        if (upload_vec(u, W->attn_norm, c->H, &L->d_attn_norm, st) ||
            upload_vec(u, W->post_norm, c->H, &L->d_post_norm, st))
            return st->code;
        if (L->gdn) {
            const qwen35_mat *in[4] = {&W->qkv, &W->gate, &W->beta, &W->alpha};
            if (upload_groups(u, in, 4, L, st) ||
                upload_mats(u, (const qwen35_mat *[]){&W->ssm_out}, 1, &L->out, st) ||
                upload_vec(u, W->conv1d, (int64_t)c->C * c->K_conv, &L->d_conv_w, st) ||
                upload_vec(u, W->dt_bias, c->n_v, &L->d_dt_bias, st) ||
                upload_vec(u, W->ssm_a, c->n_v, &L->d_ssm_a, st) ||
                upload_vec(u, W->ssm_norm, c->d_v, &L->d_ssm_norm, st))
                return st->code;
        } else {
            const qwen35_mat *in[3] = {&W->q, &W->k, &W->v};
            if (upload_groups(u, in, 3, L, st) ||
                upload_mats(u, (const qwen35_mat *[]){&W->o}, 1, &L->out, st) ||
                upload_vec(u, W->q_norm, c->d_h, &L->d_q_norm, st) ||
                upload_vec(u, W->k_norm, c->d_h, &L->d_k_norm, st))
                return st->code;
        }
        if (W->ffn_gate.type != W->ffn_up.type)
            return status_fail(st, STATUS_UNSUPPORTED,
                               "cuda: layer %d: ffn_gate and ffn_up of different types", il);
        if (upload_mats(u, (const qwen35_mat *[]){&W->ffn_gate}, 1, &L->gate, st) ||
            upload_mats(u, (const qwen35_mat *[]){&W->ffn_up}, 1, &L->up, st) ||
            upload_mats(u, (const qwen35_mat *[]){&W->ffn_down}, 1, &L->down, st))
            return st->code;
    }
    if (upload_mats(u, (const qwen35_mat *[]){&m->tok_embd}, 1, &b->embd, st) ||
        upload_vec(u, m->output_norm, c->H, &b->d_out_norm, st))
        return st->code;
    if (c->tied)
        b->head = b->embd;
    else if (upload_mats(u, (const qwen35_mat *[]){&m->output}, 1, &b->head, st))
        return st->code;
    return STATUS_OK;
}

/* ---- state and activations ---- */

static void layout_state(cuda_backend *b, cb_arena *a)
{
    const qwen35_config *c = &b->cfg;
    const uint64_t kv = (uint64_t)c->n_attn_layers * b->n_ctx * c->n_kv * c->d_h * 2;
    for (int i = 0; i < b->n_slots; i++) {
        cb_slot *sl = &b->slots[i];
        sl->d_conv = arena_take(a, (uint64_t)c->n_gdn_layers * c->C * (c->K_conv - 1) * 4);
        sl->d_S = arena_take(a, (uint64_t)c->n_gdn_layers * c->n_v * c->d_v * c->d_k * 4);
        sl->d_kc = arena_take(a, kv);
        sl->d_vc = arena_take(a, kv);
        sl->d_pos = arena_take(a, 8);
    }
}

static void layout_act(cuda_backend *b, cb_arena *a)
{
    const qwen35_config *c = &b->cfg;
    const int64_t D_v = (int64_t)c->n_v * c->d_v, HA = (int64_t)c->n_h * c->d_h;
    int64_t proj = c->C + D_v + 2 * c->n_v;
    const int64_t proj_attn = 2 * HA + 2 * (int64_t)c->n_kv * c->d_h;
    if (proj_attn > proj) proj = proj_attn;
    const int64_t ymax = D_v > HA ? D_v : HA;
    b->d_x = arena_take(a, c->H * 4);
    b->d_h = arena_take(a, c->H * 4);
    b->d_hq = arena_take(a, gemv_xq_bytes(c->H));
    b->d_proj = arena_take(a, proj * 4);
    b->d_o = arena_take(a, D_v * 4);
    b->d_y = arena_take(a, ymax * 4);
    b->d_yq = arena_take(a, gemv_xq_bytes(ymax));
    b->d_ffn = arena_take(a, (int64_t)c->F * 4);
    b->d_ffnq = arena_take(a, gemv_xq_bytes(c->F));
    b->d_q = arena_take(a, HA * 4);
    b->d_part = arena_take(a, attn_partial_floats(c->n_h, c->d_h, b->n_ctx) * 4);
    b->d_logits = arena_take(a, (int64_t)c->V * 4);
    int64_t nsync = (int64_t)gemv_sync_words(c->F > c->H ? c->F : c->H);
    if (nsync < c->n_v) nsync = c->n_v;
    b->d_sync = arena_take(a, (uint64_t)nsync * 4);
    b->d_best = arena_take(a, 8);
    b->d_tok_in = arena_take(a, 4);
    b->d_tok_out = arena_take(a, 4);
}

/* ---- one token, as launched into the graph ---- */


/* The step. With b->fuse or b->wfuse, a residual-add GEMV also computes the norm that follows
 * it (the next sublayer's input, d_h/d_hq), so the next sublayer skips its norm_rms: `normed`
 * says that d_h/d_hq already hold it. Each record_* returns whether it left the next norm done. */

/* The residual GEMV also computes the next norm (gemv_add_norm) and the gate/up GEMV also
 * quantises its output (gemv_swiglu_q8): two kernels fewer per layer. The flat graph always;
 * the warp graph with DS_GEMV_WARP_FUSE=1 (each matrix on its own kernel, warp or flat). */
static bool can_fuse(const cuda_backend *b, const gemv_matrix *m)
{
    if (b->fuse) return gemv_flat_supported(m->type, m->n_in);
    return b->wfuse && m->n_out % 32 == 0 &&
           (m->kernel != GEMV_KERNEL_FLAT || gemv_flat_supported(m->type, m->n_in));
}

/* DS_STEP_REPEAT="norm gdn ..." (a measurement aid, never for serving: the output is wrong):
 * each kernel of the named kinds is recorded twice, so `bench decode` against the plain step
 * gives what one kind costs inside the real graph (docs/GPU.md, BENCH.md run 12). */
enum { RP_NORM, RP_QUANT, RP_IN, RP_GDN, RP_GDNNORM, RP_PREP, RP_ATTN, RP_OUT, RP_FFN, RP_DOWN,
       RP_HEAD, RP_N };
static const char *const k_repeat_names[RP_N] = {"norm", "quant", "in", "gdn", "gdnnorm", "prep",
                                                 "attn", "out", "ffn", "down", "head"};

static unsigned parse_repeat(const char *env)
{
    unsigned m = 0;
    for (int k = 0; env && k < RP_N; k++) {
        const size_t n = strlen(k_repeat_names[k]);
        for (const char *p = env; (p = strstr(p, k_repeat_names[k])) != NULL; p += n)
            if ((p == env || p[-1] == ' ' || p[-1] == ',') && (p[n] == 0 || p[n] == ' ' || p[n] == ','))
                m |= 1u << k;
    }
    return m;
}

static int reps(const cuda_backend *b, int kind) { return (b->repeat >> kind & 1u) ? 2 : 1; }

/* With b->xnorm, a sublayer whose input GEMVs are all quantised warp-kernel matrices skips its
 * norm_rms: each of those GEMVs normalises x itself (gemv_x_norm). */
static bool xnorm_ok(const cuda_backend *b, const gemv_matrix *m)
{
    const bool q = m->type == GGML_TYPE_Q4_K || m->type == GGML_TYPE_Q5_K ||
                   m->type == GGML_TYPE_Q6_K || m->type == GGML_TYPE_Q8_0;
    return b->xnorm && !b->fuse && q && m->kernel == GEMV_KERNEL_WARP;
}

static bool xnorm_in(const cuda_backend *b, const cb_layer *L)
{
    for (int g = 0; g < L->n_in; g++)
        if (!xnorm_ok(b, &L->in[g].m)) return false;
    return true;
}

/* the next GEMV takes x = norm(d_x)·w itself when xn (then its d_h/d_hq arguments are NULL) */
static void xn_set(const cuda_backend *b, bool xn, const float *w)
{
    if (xn) gemv_x_norm(b->d_x, w, b->cfg.eps);
}

/* A sublayer's two in-projection groups (two weight types) as one launch (gemv_pair) */
static bool pair_in(const cuda_backend *b, const cb_layer *L, bool xn)
{
    if (!b->pair_max || xn || L->n_in != 2 || !gemv_pair_supported(&L->in[0].m, &L->in[1].m))
        return false;
    const gemv_matrix *m0 = &L->in[0].m, *m1 = &L->in[1].m;
    return gemv_packed_bytes(m0->type, m0->n_in, m0->n_out) +
               gemv_packed_bytes(m1->type, m1->n_in, m1->n_out) <= b->pair_max;
}

/* the GEMV recorded next prefetches m's first weights into L2 in its tail (gemv_prefetch_next) */
static void pf_next(const cuda_backend *b, const gemv_matrix *m) { gemv_prefetch_next(m, b->next_pf); }

/* x += W·y, then (fused when possible) h = norm(x)·next_norm_w; returns true when fused */
static bool record_residual(cuda_backend *b, const gemv_matrix *W, const float *y, const void *yq,
                            const float *next_norm_w, int kind, const gemv_matrix *next,
                            cuda_stream s)
{
    const qwen35_config *c = &b->cfg;
    pf_next(b, next);
    if (next_norm_w && can_fuse(b, W)) {
        gemv_add_norm(W, y, yq, b->d_x, next_norm_w, c->eps, b->d_h, b->d_hq, b->d_sync, s);
        return true;
    }
    for (int k = 0; k < reps(b, kind); k++) gemv(W, y, yq, b->d_x, GEMV_ADD, s);
    return false;
}

static bool record_ffn(cuda_backend *b, const cb_layer *L, bool normed, const float *next_norm_w,
                       const gemv_matrix *next, cuda_stream s)
{
    const qwen35_config *c = &b->cfg;
    const bool xn = !normed && !can_fuse(b, &L->gate) && xnorm_ok(b, &L->gate);
    for (int k = 0; !normed && !xn && k < reps(b, RP_NORM); k++)
        norm_rms(b->d_x, L->d_post_norm, c->H, c->eps, b->d_h, b->d_hq, s);
    const float *h = xn ? NULL : b->d_h;
    const void *hq = xn ? NULL : b->d_hq;
    if (can_fuse(b, &L->gate)) {
        gemv_swiglu_q8(&L->gate, &L->up, b->d_h, b->d_hq, b->d_ffn, b->d_ffnq, b->d_sync, s);
    } else {
        pf_next(b, &L->down);
        for (int k = 0; k < reps(b, RP_FFN); k++) {
            xn_set(b, xn, L->d_post_norm);
            gemv_swiglu(&L->gate, &L->up, h, hq, b->d_ffn, s);
        }
        for (int k = 0; k < reps(b, RP_QUANT); k++) gemv_quantize_x(b->d_ffn, b->d_ffnq, c->F, s);
    }
    return record_residual(b, &L->down, b->d_ffn, b->d_ffnq, next_norm_w, RP_DOWN, next, s);
}

static bool record_gdn(cuda_backend *b, const cb_slot *sl, const cb_layer *L, bool normed,
                       cuda_stream s)
{
    const qwen35_config *c = &b->cfg;
    const int64_t D_v = (int64_t)c->n_v * c->d_v;
    float *conv = sl->d_conv + (int64_t)L->slot * c->C * (c->K_conv - 1);
    float *S = sl->d_S + (int64_t)L->slot * c->n_v * c->d_v * c->d_k;
    const bool xn = !normed && xnorm_in(b, L);
    for (int k = 0; !normed && !xn && k < reps(b, RP_NORM); k++)
        norm_rms(b->d_x, L->d_attn_norm, c->H, c->eps, b->d_h, b->d_hq, s);
    const float *h = xn ? NULL : b->d_h;
    const void *hq = xn ? NULL : b->d_hq;
    if (pair_in(b, L, xn)) { /* qkv (conv + SiLU fused) and the other group, one launch */
        pf_next(b, &L->out);
        for (int k = 0; k < reps(b, RP_IN); k++)
            gemv_pair(&L->in[0].m, &L->in[1].m, hq, b->d_proj + L->in[0].y_off,
                      b->d_proj + L->in[1].y_off, L->d_conv_w, conv, c->C, c->K_conv, s);
    }
    for (int g = 0; g < L->n_in && !pair_in(b, L, xn); g++) {
        float *y = b->d_proj + L->in[g].y_off;
        pf_next(b, g + 1 < L->n_in ? &L->in[g + 1].m : &L->out);
        for (int k = 0; k < reps(b, RP_IN); k++) {
            xn_set(b, xn, L->d_attn_norm);
            if (g == 0) /* the group holding qkv: conv + SiLU fused on its first C rows */
                gemv_conv(&L->in[g].m, h, hq, y, L->d_conv_w, conv, c->C, c->K_conv, s);
            else
                gemv(&L->in[g].m, h, hq, y, GEMV_STORE, s);
        }
    }
    const float *z = b->d_proj + c->C, *beta = z + D_v, *alpha = beta + c->n_v;
    /* DS_GDN_FUSED=1 (or the flat graph): the gated norm in the head's last CTA; the warp graph
     * runs it as its own kernel by default (H200 run 9: 1-2% faster on all three sizes) */
    if (b->fuse || getenv_flag_on("DS_GDN_FUSED")) {
        gdn_decode_norm(b->d_proj, beta, alpha, L->d_dt_bias, L->d_ssm_a, c->n_k, c->n_v, c->d_k,
                        c->d_v, c->eps, S, b->d_o, z, L->d_ssm_norm, b->d_y, b->d_yq, b->d_sync,
                        s);
    } else {
        for (int k = 0; k < reps(b, RP_GDN); k++)
            gdn_decode(b->d_proj, beta, alpha, L->d_dt_bias, L->d_ssm_a, c->n_k, c->n_v, c->d_k,
                       c->d_v, c->eps, S, b->d_o, s);
        for (int k = 0; k < reps(b, RP_GDNNORM); k++)
            gdn_norm_gated(b->d_o, z, L->d_ssm_norm, c->n_v, c->d_v, c->eps, b->d_y, b->d_yq, s);
    }
    return record_residual(b, &L->out, b->d_y, b->d_yq, L->d_post_norm, RP_OUT, &L->gate, s);
}

static bool record_attn(cuda_backend *b, const cb_slot *sl, const cb_layer *L, bool normed,
                        cuda_stream s)
{
    const qwen35_config *c = &b->cfg;
    const int64_t HA = (int64_t)c->n_h * c->d_h, KVA = (int64_t)c->n_kv * c->d_h;
    const uint64_t kv_layer = (uint64_t)b->n_ctx * c->n_kv * c->d_h * 2;
    void *kc = (uint8_t *)sl->d_kc + L->slot * kv_layer, *vc = (uint8_t *)sl->d_vc + L->slot * kv_layer;
    const bool xn = !normed && xnorm_in(b, L);
    for (int k = 0; !normed && !xn && k < reps(b, RP_NORM); k++)
        norm_rms(b->d_x, L->d_attn_norm, c->H, c->eps, b->d_h, b->d_hq, s);
    if (pair_in(b, L, xn)) {
        pf_next(b, &L->out);
        for (int k = 0; k < reps(b, RP_IN); k++)
            gemv_pair(&L->in[0].m, &L->in[1].m, b->d_hq, b->d_proj + L->in[0].y_off,
                      b->d_proj + L->in[1].y_off, NULL, NULL, 0, 0, s);
    }
    for (int g = 0; g < L->n_in && !pair_in(b, L, xn); g++) {
        pf_next(b, g + 1 < L->n_in ? &L->in[g + 1].m : &L->out);
        for (int k = 0; k < reps(b, RP_IN); k++) {
            xn_set(b, xn, L->d_attn_norm);
            gemv(&L->in[g].m, xn ? NULL : b->d_h, xn ? NULL : b->d_hq,
                 b->d_proj + L->in[g].y_off, GEMV_STORE, s);
        }
    }
    const float *qg = b->d_proj, *k = qg + 2 * HA, *v = k + KVA;
    for (int r = 0; r < reps(b, RP_PREP); r++)
        attn_prep(qg, k, v, L->d_q_norm, L->d_k_norm, c->n_h, c->n_kv, c->d_h, c->n_rot,
                  c->rope_base, c->eps, sl->d_pos, kc, vc, b->d_q, s);
    for (int r = 0; r < reps(b, RP_ATTN); r++)
        attn_decode(b->d_q, qg, kc, vc, c->n_h, c->n_kv, c->d_h, b->n_ctx, sl->d_pos, b->d_part,
                    b->d_y, b->d_yq, s);
    return record_residual(b, &L->out, b->d_y, b->d_yq, L->d_post_norm, RP_OUT, &L->gate, s);
}

static void record_step(cuda_backend *b, const cb_slot *sl, bool forced, cuda_stream s)
{
    const qwen35_config *c = &b->cfg;
    if (forced) cuda_copy_h2d_async(b->d_tok_in, b->h_tok, 4, s);
    gemv_embed_step(&b->embd, forced ? b->d_tok_in : NULL, b->d_best, b->d_tok_out, sl->d_pos,
                    b->d_x, s);
    bool normed = false;
    for (int il = 0; il < c->n_layer; il++) {
        const cb_layer *L = &b->layers[il];
        const bool post_normed =
            L->gdn ? record_gdn(b, sl, L, normed, s) : record_attn(b, sl, L, normed, s);
        const float *next = il + 1 < c->n_layer ? b->layers[il + 1].d_attn_norm : b->d_out_norm;
        const gemv_matrix *next_m = il + 1 < c->n_layer ? &b->layers[il + 1].in[0].m : &b->head;
        normed = record_ffn(b, L, post_normed, next, next_m, s);
    }
    gemv_prefetch_next(NULL, 0);
    const bool xn = !normed && xnorm_ok(b, &b->head);
    if (!normed && !xn) norm_rms(b->d_x, b->d_out_norm, c->H, c->eps, b->d_h, b->d_hq, s);
    for (int k = 0; k < reps(b, RP_HEAD); k++) {
        xn_set(b, xn, b->d_out_norm);
        gemv_argmax(&b->head, xn ? NULL : b->d_h, xn ? NULL : b->d_hq, b->d_logits, b->d_best, s);
    }
    cuda_copy_d2h_async(b->h_best, b->d_best, 8, s);
}

/* ---- create / destroy ---- */

static int check_shapes(const qwen35_config *c, status *st)
{
    if (c->d_k != 32 && c->d_k != 64 && c->d_k != 128)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: DeltaNet d_k %d (32, 64, 128)", c->d_k);
    if (c->d_v % 32 || c->d_v > 1024)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: DeltaNet d_v %d", c->d_v);
    if (c->d_h % 32 || c->d_h > 256 || c->n_h % c->n_kv || c->n_h / c->n_kv > ATTN_MAX_GROUP)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: attention d_h %d, heads %d/%d",
                           c->d_h, c->n_h, c->n_kv);
    if (c->H % 32 || c->F % 32 || (c->n_v * c->d_v) % 32)
        return status_fail(st, STATUS_UNSUPPORTED, "cuda: H, F and D_v must be multiples of 32");
    return STATUS_OK;
}

int cuda_backend_create(const qwen35_model *m, const cuda_backend_opts *o, cuda_backend **out,
                        status *st)
{
    *out = NULL;
    if (!cuda_device_available(st)) return st->code;
    cuda_backend *b = calloc(1, sizeof *b);
    if (!b) return status_fail(st, STATUS_NOMEM, "cuda backend");
    b->model = m;
    b->cfg = m->cfg;
    b->n_ctx = o && o->n_ctx > 0 ? o->n_ctx : 4096;
    b->n_slots = o && o->n_slots > 0 ? o->n_slots : 1;
    b->slots = calloc((size_t)b->n_slots, sizeof *b->slots);
    if (!b->slots) {
        free(b);
        return status_fail(st, STATUS_NOMEM, "cuda backend: %d slots", o->n_slots);
    }
    const bool verbose = o && o->verbose;
    const qwen35_config *c = &b->cfg;
    cb_upload u = {0};
    /* DS_GEMV_KERNEL=flat: the flat GEMV kernel with the fused epilogues and programmatic
     * dependent launch; unset or =warp: the warp-per-row GEMV without fusions. Both pass the
     * H200 parity tests; the warp graph is the default because it decoded 12-16% faster there
     * (docs/BENCH.md run 5, docs/GPU.md). */
    const char *gk = getenv("DS_GEMV_KERNEL");
    const bool warp = !(gk && strcmp(gk, "flat") == 0);
    b->gemv_kernel = u.gemv_kernel = warp ? GEMV_KERNEL_WARP : GEMV_KERNEL_AUTO;
    b->fuse = !warp;
    /* DS_GEMV_WARP_FUSE=1: the warp graph's residual GEMVs compute the next norm and its
     * gate/up GEMVs quantise their output in their last CTA / warp (gemv_add_norm,
     * gemv_swiglu_q8), dropping each layer's norm_rms and gemv_quantize_x kernels. Opt-in:
     * 20-26% fewer tokens/s than the default on the H200 even after the tail fix of BENCH.md run 28
     * (the norm / Q8 tails run on one CTA or warp after every other is done, serial latency
     * that costs more than the small kernels they replace). */
    b->wfuse = warp && getenv_flag_on("DS_GEMV_WARP_FUSE");
    /* A sublayer whose in-projections form two groups (two weight types) runs them as one
     * launch (gemv_pair) when together they are at most DS_GEMV_PAIR_MB MiB (default 32; 0:
     * never). H200, BENCH.md runs 26-28: 0.8B (6.3 MiB) +4.4%, 4B (~22 MiB) +1.4%, 27B (~55 MiB)
     * -0.5%, so the default stops between the 4B and the 27B. */
    {
        const char *pm = getenv("DS_GEMV_PAIR_MB");
        const long long mb = pm ? atoll(pm) : 32;
        b->pair_max = warp && mb > 0 ? (uint64_t)mb << 20 : 0;
    }
    if (check_shapes(c, st) || cuda_device_props_get(o ? o->device : 0, &b->props, st) ||
        cuda_stream_create(&b->stream, st))
        goto fail;
    for (int il = 0, ng = 0, na = 0; il < c->n_layer; il++)
        b->layers[il].slot = c->recurrent[il] ? ng++ : na++;

    /* sizing passes (NULL arenas), then one allocation per arena */
    cb_arena wa = {0}, sa = {0}, aa = {0};
    u.w = &wa;
    u.verbose = verbose;
    if (upload_model(b, &u, st)) goto fail;
    layout_state(b, &sa);
    layout_act(b, &aa);
    b->weight_bytes = wa.used, b->state_bytes = sa.used, b->act_bytes = aa.used;
    if (verbose)
        fprintf(stderr, "cuda: %s: weights %.2f GB, state+KV %.2f GB (n_ctx %d), scratch %.1f MB\n",
                b->props.name, wa.used / 1e9, sa.used / 1e9, b->n_ctx, aa.used / 1e6);
    if (cuda_alloc(&b->d_weights, wa.used, "weights", st) ||
        cuda_alloc(&b->d_state, sa.used, "state and KV cache", st) ||
        cuda_alloc(&b->d_act, aa.used, "activations", st) ||
        cuda_alloc(&u.d_stage, u.stage_cap, "upload staging", st) ||
        cuda_host_alloc(&b->h_pinned, 64, "pinned step buffers", st))
        goto fail;
    u.h_cat = malloc(u.stage_cap);
    if (!u.h_cat) {
        status_fail(st, STATUS_NOMEM, "upload staging (%llu bytes)", (unsigned long long)u.stage_cap);
        goto fail;
    }
    b->h_tok = (int32_t *)b->h_pinned;
    b->h_best = (unsigned long long *)((uint8_t *)b->h_pinned + 8);
    wa = (cb_arena){b->d_weights, 0, b->weight_bytes};
    sa = (cb_arena){b->d_state, 0, b->state_bytes};
    aa = (cb_arena){b->d_act, 0, b->act_bytes};
    u.w = &wa;
    u.gemv_kernel = b->gemv_kernel;
    u.s = NULL; /* the legacy stream: ordered after each synchronous upload */
    u.done = 0;
    if (upload_model(b, &u, st)) goto fail;
    layout_state(b, &sa);
    layout_act(b, &aa);
    cuda_free(u.d_stage);
    u.d_stage = NULL;
    free(u.h_cat);
    u.h_cat = NULL;
    if (cuda_memset(b->d_act, 0, b->act_bytes, st)) goto fail;
    for (int i = 0; i < b->n_slots; i++)
        if (cuda_backend_reset(b, i, st)) goto fail;

    /* the step, recorded once per slot and mode; with programmatic dependent launch unless
     * DS_PDL=0 (then, or if a capture with it fails, without). H200 run 7: PDL made the warp
     * graph 12% / 6% / 1.3% faster on the 0.8B / 4B / 27B (the GEMV's first L2 prefetches and
     * the GDN state loads run before griddepcontrol.wait, overlapping the previous kernel) */
    b->repeat = parse_repeat(getenv("DS_STEP_REPEAT"));
    /* DS_GEMV_NEXT_MB (default 0 = off; H200 run 15: 16 MB made all three sizes 2-4% slower):
     * each GEMV prefetches that much of the next GEMV's weights into L2 in its tail */
    const char *nx = getenv("DS_GEMV_NEXT_MB");
    /* DS_GEMV_XNORM=1 (default 0 = off): the GEMVs after each RMSNorm compute it in their
     * prologue (every CTA re-reads x and the norm weight). H200 run 16: on, the 0.8B / 4B / 27B
     * decoded at 1013 / 370 / 92.5 tok/s against 1325 / 530 / 135 off (docs/GPU.md) */
    const char *xnv = getenv("DS_GEMV_XNORM");
    b->xnorm = xnv && strcmp(xnv, "1") == 0;
    b->next_pf = (uint64_t)(nx ? atoi(nx) : 0) << 20;
    if (b->repeat)
        fprintf(stderr, "cuda: DS_STEP_REPEAT=%s: kernels recorded twice, for timing only; "
                        "the output is wrong\n", getenv("DS_STEP_REPEAT"));
    const char *pdl_env = getenv("DS_PDL");
    b->pdl = !(pdl_env && strcmp(pdl_env, "0") == 0);
    for (;;) {
        int rc = STATUS_OK;
        cuda_set_pdl(b->pdl);
        for (int i = 0; i < b->n_slots && !rc; i++) {
            cb_slot *sl = &b->slots[i];
            rc = cuda_graph_capture_begin(b->stream, st);
            if (!rc) record_step(b, sl, true, b->stream);
            if (!rc) rc = cuda_graph_capture_end(b->stream, &sl->g_forced, st);
            if (!rc) b->stats.kernels_per_token = cuda_graph_last_kernel_nodes();
            if (!rc) rc = cuda_graph_capture_begin(b->stream, st);
            if (!rc) record_step(b, sl, false, b->stream);
            if (!rc) rc = cuda_graph_capture_end(b->stream, &sl->g_greedy, st);
        }
        cuda_set_pdl(false);
        if (!rc) rc = cuda_check("graph capture", st);
        if (!rc) break;
        if (!b->pdl) goto fail;
        fprintf(stderr, "cuda: capture with programmatic dependent launch failed (%s); "
                        "capturing without\n", st->msg);
        for (int i = 0; i < b->n_slots; i++) {
            cuda_graph_exec_destroy(b->slots[i].g_forced);
            cuda_graph_exec_destroy(b->slots[i].g_greedy);
            b->slots[i].g_forced = b->slots[i].g_greedy = NULL;
        }
        status_clear(st);
        (void)cuda_check("clearing the capture error", st);
        status_clear(st);
        b->pdl = false;
    }
    if (verbose)
        fprintf(stderr, "cuda: ready: %d slot(s) x %d positions, %llu kernels per token (%s)\n",
                b->n_slots, b->n_ctx, (unsigned long long)b->stats.kernels_per_token,
                b->fuse ? (b->pdl ? "flat GEMV, fused epilogues, PDL" : "flat GEMV, fused epilogues")
                        : b->wfuse ? (b->pdl ? "warp GEMV, fused epilogues, PDL" : "warp GEMV, fused epilogues")
                        : (b->pdl ? "warp GEMV, PDL (default)" : "warp GEMV"));

    b->stats.weight_bytes = b->weight_bytes;
    b->stats.state_bytes = b->state_bytes;
    const uint64_t kv_read = (uint64_t)c->n_attn_layers * b->n_ctx * c->n_kv * c->d_h * 2 * 2;
    const uint64_t S_rw = 2ull * c->n_gdn_layers * c->n_v * c->d_v * c->d_k * 4;
    b->stats.bytes_per_token = b->weight_bytes + S_rw + kv_read;
    *out = b;
    return STATUS_OK;
fail:
    cuda_free(u.d_stage);
    free(u.h_cat);
    cuda_backend_destroy(b);
    return st->code;
}

void cuda_backend_destroy(cuda_backend *b)
{
    if (!b) return;
    for (int i = 0; b->slots && i < b->n_slots; i++) {
        cuda_graph_exec_destroy(b->slots[i].g_forced);
        cuda_graph_exec_destroy(b->slots[i].g_greedy);
    }
    free(b->slots);
    cuda_free(b->d_weights);
    cuda_free(b->d_state);
    cuda_free(b->d_act);
    cuda_host_free(b->h_pinned);
    cuda_stream_destroy(b->stream);
    free(b);
}

int cuda_backend_n_slots(const cuda_backend *b) { return b->n_slots; }

/* Waits for an enqueued step the caller has not synchronised (normally the caller's own sync,
 * e.g. the GPU sampler's readback, has done it and said so with cuda_backend_step_synced):
 * the pinned token buffer and the slot's memory must not change under a running graph. */
static int settle(cuda_backend *b, status *st)
{
    if (!b->pending) return STATUS_OK;
    b->pending = false;
    return cuda_sync(b->stream, "enqueued step", st);
}

void cuda_backend_step_synced(cuda_backend *b) { b->pending = false; }

int cuda_backend_reset(cuda_backend *b, int slot, status *st)
{
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    if (settle(b, st)) return st->code;
    cb_slot *sl = &b->slots[slot];
    const int32_t pos[2] = {0, 0};
    /* conv windows, S and the KV cache lie back to back before d_pos (layout_state) */
    if (cuda_memset(sl->d_conv, 0, (size_t)((uint8_t *)sl->d_pos - (uint8_t *)sl->d_conv), st) ||
        cuda_upload(sl->d_pos, pos, sizeof pos, st) || cuda_memset(b->d_best, 0, 8, st))
        return st->code;
    sl->n_past = 0;
    return STATUS_OK;
}

int cuda_backend_n_past(const cuda_backend *b, int slot)
{
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    return b->slots[slot].n_past;
}

int cuda_backend_set_position(cuda_backend *b, int slot, int n_past, status *st)
{
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    cb_slot *sl = &b->slots[slot];
    if (n_past < 0 || n_past >= b->n_ctx)
        return status_fail(st, STATUS_RANGE, "position %d outside [0, %d)", n_past, b->n_ctx);
    if (settle(b, st)) return st->code;
    const qwen35_config *c = &b->cfg;
    const uint64_t kv = (uint64_t)c->n_attn_layers * b->n_ctx * c->n_kv * c->d_h * 2;
    /* 0x2c2c: F16 0.0659, finite; the values do not change the speed */
    if (cuda_memset(sl->d_kc, 0x2c, kv, st) || cuda_memset(sl->d_vc, 0x2c, kv, st))
        return st->code;
    const int32_t pos[2] = {n_past > 0 ? n_past - 1 : 0, n_past};
    if (cuda_upload(sl->d_pos, pos, sizeof pos, st)) return st->code;
    sl->n_past = n_past;
    return STATUS_OK;
}

static int run_step(cuda_backend *b, cb_slot *sl, cuda_graph_exec g, bool sync, status *st)
{
    if (sl->n_past >= b->n_ctx)
        return status_fail(st, STATUS_RANGE, "context full (%d positions)", b->n_ctx);
    if (cuda_graph_launch(g, b->stream)) return cuda_check("cudaGraphLaunch", st);
    if (sync && cuda_sync(b->stream, "decode step", st)) return st->code;
    b->pending = !sync;
    sl->n_past++;
    b->stats.tokens++;
    b->stats.graph_launches++;
    b->stats.d2h_bytes += 8;
    return STATUS_OK;
}

int cuda_backend_decode(cuda_backend *b, int slot, int32_t token, float *logits, int32_t *next,
                        status *st)
{
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    if (token < 0 || token >= b->cfg.V)
        return status_fail(st, STATUS_RANGE, "token id %d outside [0, %d)", token, b->cfg.V);
    if (settle(b, st)) return st->code;
    *b->h_tok = token;
    b->stats.h2d_bytes += 4;
    if (run_step(b, &b->slots[slot], b->slots[slot].g_forced, true, st)) return st->code;
    if (logits) {
        if (cuda_download(logits, b->d_logits, (size_t)b->cfg.V * 4, st)) return st->code;
        b->stats.d2h_bytes += (uint64_t)b->cfg.V * 4;
    }
    if (next) *next = gemv_argmax_row(*b->h_best);
    return STATUS_OK;
}

int cuda_backend_decode_enqueue(cuda_backend *b, int slot, int32_t token, status *st)
{
    DS_ASSERT(slot >= 0 && slot < b->n_slots);
    if (token < 0 || token >= b->cfg.V)
        return status_fail(st, STATUS_RANGE, "token id %d outside [0, %d)", token, b->cfg.V);
    if (settle(b, st)) return st->code;
    *b->h_tok = token;
    b->stats.h2d_bytes += 4;
    return run_step(b, &b->slots[slot], b->slots[slot].g_forced, false, st);
}

int cuda_backend_generate(cuda_backend *b, int slot, int32_t first, int n, int32_t *out,
                          status *st)
{
    int32_t next;
    if (n <= 0) return STATUS_OK;
    if (cuda_backend_decode(b, slot, first, NULL, &next, st)) return st->code;
    out[0] = next;
    for (int i = 1; i < n; i++) {
        if (run_step(b, &b->slots[slot], b->slots[slot].g_greedy, true, st)) return st->code;
        out[i] = gemv_argmax_row(*b->h_best);
    }
    return STATUS_OK;
}

void cuda_backend_get_stats(const cuda_backend *b, cuda_backend_stats *s) { *s = b->stats; }

const char *cuda_backend_device_name(const cuda_backend *b) { return b->props.name; }

const float *cuda_backend_device_logits(const cuda_backend *b) { return b->d_logits; }

struct CUstream_st *cuda_backend_stream(const cuda_backend *b) { return b->stream; }
