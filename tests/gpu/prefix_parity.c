/* Prefix reuse on the CUDA forward (model/fwd.h snap_save / seq_resume; docs/GPU.md
 * "Snapshots"): a sequence resumed from a snapshot and the shared KV blocks of a cached prefix
 * computes what the same sequence computes cold.
 *
 * Three runs of one prompt of P tokens, each followed by G decode rows fed the cold run's greedy
 * tokens (teacher forcing, so that every row's logits compare):
 *   cold    the prompt in one step (slot 0);
 *   split   the prompt's first n tokens in one step, the rest in another (slot 0);
 *   resume  a source (slot 1) fed the first n tokens, its state saved (snap_save), the source
 *           then fed other tokens (its partial block's later rows and its state change); slot 2
 *           resumed from the snapshot and the source's blocks, fed the rest.
 * resume against split: the same kernels on the same inputs, so bit-identical logits and the
 * same sampled tokens on every row (a byte of state or KV off shows here). resume against cold:
 * within the forwards' bound (1e-3 of max|logit| on the demo and reference models, 0.5 on the
 * random-weight synthetic 4B as engine_parity), argmax equal wherever its margin is clear.
 * Prefixes: every n in 1..20 of a 21-token prompt, n = 1, 37, 63, 64 (the block edge: no partial
 * block), 65, 99 of a 100-token prompt, 128 and 150 of a 200-token one; and a snapshot resumed
 * after its source ended, its blocks kept by kv_pool_retain (as the prefix cache holds them) and
 * the source's slot reused for another sequence, with the pool's free blocks counted before and
 * after. With penalties and logprobs the resumed sampler must count the prefix as prompt tokens:
 * tokens and logprobs equal to the split run's (and the prompt's penalty shown to move them).
 * Sizing: the chosen snapshot count (one a slot at least), snap_bytes from the config, a budget
 * of 3.5 snapshots giving 3, 0 giving none. snap_save: no host or device allocation, no step
 * counted, and no host sync (on the 4B, 400 saves of ~50 MB enqueue in well under half the time
 * they take on the device). Errors: bad slot / snapshot / n_pos (STATUS_RANGE), a block not held
 * (STATUS_INVALID), no free block for the partial copy (STATUS_EXHAUSTED), each leaving the slot
 * empty and the pool's counts as before.
 *
 * The positions case runs with the DeltaNet state stored as F32 and as bf16 (fwd_opts.state_dtype):
 * with bf16, resume against split stays bit-identical and snap_bytes counts S at 2 bytes an
 * element; against cold, where S is rounded at other rows (chunks, not rows), the bound is 0.1
 * of max|logit| on the small models (the random-weight own-r2-tied moves by ~2% with a bf16
 * state at all: tests/model/fwd_bf16_test).
 *
 * Models: the demo model (models/demo-en-17m.gguf), the reference own-r2-tied
 * ($DS_REPO_ROOT/tests/reference), the synthetic 4B (synth/4b.gguf, tools/gpu-test makes it);
 * with DS_REQUIRE_GPU=1 the 4B and one of the small ones must be there. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/sampling.h"
#include "common/splitmix64.h"
#include "common/status.h"
#include "kernels/cuda/cuda_device.h"
#include "model/fwd.h"
#include "model/kv_pool.h"
#include "model/qwen35.h"
#include "tests/gpu/gpu_parity.h"

/* Counting allocator (as engine_parity's): every malloc/calloc/realloc of the thread that sets
 * t_mine while g_counting is set. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
static atomic_long g_mine;
static atomic_int g_counting;
static _Thread_local int t_mine;
static void count_alloc(void)
{
    if (atomic_load(&g_counting) && t_mine) atomic_fetch_add(&g_mine, 1);
}
void *malloc(size_t n)
{
    count_alloc();
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    count_alloc();
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    count_alloc();
    return __libc_realloc(p, n);
}
void free(void *p) { __libc_free(p); }

static bool g_have_gpu;

enum { G = 8, NROW = G + 1, MAX_P = 200, N_CTX = 512, N_SLOTS = 4 };

/* ---- the models ---- */

typedef struct model_case {
    char path[1024];
    const char *name;
    bool synthetic; /* random weights: the loose bound */
} model_case;

static int g_n_models;
static model_case g_models[3];

static bool exists(const char *p) { return access(p, R_OK) == 0; }

static void find_models(void)
{
    const char *root = getenv("DS_REPO_ROOT");
    model_case *m = &g_models[g_n_models];
    /* the demo model: beside the test (runfiles) or in the checkout */
    snprintf(m->path, sizeof m->path, "models/demo-en-17m.gguf");
    if (!exists(m->path) && root)
        snprintf(m->path, sizeof m->path, "%s/models/demo-en-17m.gguf", root);
    m->name = "demo";
    m->synthetic = false;
    if (exists(m->path)) g_n_models++;
    else printf("  the demo model is absent (models/demo-en-17m.gguf: a device call without it, "
                "see docs/GPU.md \"Snapshots\"): not run\n");
    m = &g_models[g_n_models];
    snprintf(m->path, sizeof m->path, "%s/tests/reference/own-r2-tied.gguf", root ? root : ".");
    m->name = "own-r2-tied";
    m->synthetic = false;
    if (exists(m->path)) g_n_models++;
    else printf("  %s absent: not run\n", m->path);
    m = &g_models[g_n_models];
    snprintf(m->path, sizeof m->path, "synth/4b.gguf");
    m->name = "synthetic 4B";
    m->synthetic = true;
    if (exists(m->path)) g_n_models++;
    else printf("  synth/4b.gguf absent (tools/gpu-test makes it: tag synth=4b): not run\n");
}

/* ---- runs ---- */

static const sampling_params k_greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */

typedef struct run_out {
    float *logits;           /* [NROW][V]: the prompt's last row, then the G decode rows */
    sample_result out[NROW]; /* the sampled rows' results */
} run_out;

static fwd_row g_rows[MAX_P];

/* ids[from .. to) into slot as one step; the last row sampled into o->out[0] with its logits
 * (o NULL: nothing sampled) */
static int feed(fwd *f, int slot, const int32_t *ids, int from, int to, run_out *o, status *st)
{
    for (int i = from; i < to; i++)
        g_rows[i - from] = (fwd_row){.token = ids[i], .slot = slot, .pos = i, .prompt = true,
                                     .sample = o && i + 1 == to,
                                     .logits = o && i + 1 == to ? o->logits : NULL};
    if (fwd_step(f, g_rows, to - from, st)) return st->code;
    if (o) o->out[0] = g_rows[to - from - 1].out;
    return STATUS_OK;
}

/* G decode rows at positions P.., fed force[0 .. G) (NULL: the run's own tokens) */
static int decode(fwd *f, int slot, int P, const run_out *force, run_out *o, int V, status *st)
{
    for (int g = 0; g < G; g++) {
        fwd_row r = {.token = force ? force->out[g].token : o->out[g].token, .slot = slot,
                     .pos = P + g, .sample = true, .logits = o->logits + (size_t)(g + 1) * V};
        if (fwd_step(f, &r, 1, st)) return st->code;
        o->out[g + 1] = r.out;
    }
    return STATUS_OK;
}

static int run_cold(fwd *f, const sampling_params *sp, const int32_t *ids, int P,
                    const run_out *force, run_out *o, status *st)
{
    if (fwd_seq_start(f, 0, sp, st) || feed(f, 0, ids, 0, P, o, st) ||
        decode(f, 0, P, force, o, f->vocab, st))
        return st->code;
    fwd_seq_end(f, 0);
    return STATUS_OK;
}

static int run_split(fwd *f, const sampling_params *sp, const int32_t *ids, int P, int n,
                     const run_out *force, run_out *o, status *st)
{
    if (fwd_seq_start(f, 0, sp, st) || feed(f, 0, ids, 0, n, NULL, st) ||
        feed(f, 0, ids, n, P, o, st) || decode(f, 0, P, force, o, f->vocab, st))
        return st->code;
    fwd_seq_end(f, 0);
    return STATUS_OK;
}

/* other tokens than ids past n (the source's own continuation) */
static void other_tokens(const int32_t *ids, int P, int V, int32_t *out)
{
    for (int i = 0; i < P; i++) out[i] = (int32_t)((ids[i] + 1 + i % 5) % V);
}

/* The source (slot 1) fed ids[0 .. n), saved into snapshot snap, then fed other tokens to P
 * (its partial block's rows past n and its state change after the save); slot 2 resumed from
 * the snapshot and slot 1's blocks, fed ids[n .. P), decoded. */
static int run_resume(fwd *f, const sampling_params *sp, const int32_t *ids, int P, int n,
                      int snap, const run_out *force, run_out *o, status *st)
{
    int32_t other[MAX_P];
    other_tokens(ids, P, f->vocab, other);
    if (fwd_seq_start(f, 1, &k_greedy, st) || feed(f, 1, ids, 0, n, NULL, st) ||
        fwd_snap_save(f, 1, snap, st) || feed(f, 1, other, n, P, NULL, st))
        return st->code;
    const fwd_prefix x = {.snap = snap, .n_pos = n, .blocks = kv_pool_table(f->kv, 1),
                          .tokens = ids};
    if (fwd_seq_resume(f, 2, sp, &x, st)) return st->code;
    if (fwd_n_past(f, 2) != n)
        return status_fail(st, STATUS_INTERNAL, "resumed at %d, expected %d", fwd_n_past(f, 2),
                           n);
    if (feed(f, 2, ids, n, P, o, st) || decode(f, 2, P, force, o, f->vocab, st))
        return st->code;
    fwd_seq_end(f, 1);
    fwd_seq_end(f, 2);
    return STATUS_OK;
}

/* ---- comparisons ---- */

/* max|a-b| / max|a| over V (inf for a non-finite b); *clear: a's argmax margin over its
 * runner-up exceeds twice max|a-b|; *same: b's argmax is a's */
static double rel_diff(const float *a, const float *b, int V, bool *clear, bool *same)
{
    double maxabs = 0, maxd = 0;
    int a1 = 0, a2 = -1, b1 = 0;
    *clear = *same = false;
    for (int i = 0; i < V; i++) {
        if (!isfinite(b[i])) return INFINITY;
        maxabs = fmax(maxabs, fabs(a[i]));
        maxd = fmax(maxd, fabs((double)a[i] - b[i]));
        if (a[i] > a[a1]) a2 = a1, a1 = i;
        else if (i != a1 && (a2 < 0 || a[i] > a[a2])) a2 = i;
        if (b[i] > b[b1]) b1 = i;
    }
    *clear = a2 < 0 || (double)a[a1] - a[a2] > 2 * maxd;
    *same = a1 == b1;
    return maxd / (maxabs > 0 ? maxabs : 1);
}

typedef struct tally {
    int runs, exact_rows, rows, tokens_equal, argmax_clear, argmax_equal;
    double worst_split, worst_cold;
} tally;

/* resume vs split (bit-identical, same tokens) and vs cold (bound, argmax where clear) */
static void compare(const model_case *mc, const char *what, int V, const run_out *cold,
                    const run_out *split, const run_out *res, double bound, tally *t)
{
    t->runs++;
    bool all_exact = true;
    for (int r = 0; r < NROW; r++) {
        const float *lr = res->logits + (size_t)r * V;
        bool clear, same;
        const double ds = rel_diff(split->logits + (size_t)r * V, lr, V, &clear, &same);
        const bool exact = !memcmp(split->logits + (size_t)r * V, lr, (size_t)V * 4);
        const double dc = rel_diff(cold->logits + (size_t)r * V, lr, V, &clear, &same);
        t->rows++;
        t->exact_rows += exact;
        t->tokens_equal += res->out[r].token == split->out[r].token;
        t->worst_split = fmax(t->worst_split, ds);
        t->worst_cold = fmax(t->worst_cold, dc);
        if (clear && isfinite(dc)) {
            t->argmax_clear++;
            t->argmax_equal += same;
        }
        all_exact &= exact && res->out[r].token == split->out[r].token;
        if (!(dc <= bound))
            printf("  %s %s row %d: resumed vs cold %.3g of max|logit| (bound %.1g)\n", mc->name,
                   what, r, dc, bound);
    }
    if (!all_exact)
        printf("  %s %s: resumed and split runs DIFFER (worst %.3g of max|logit|)\n", mc->name,
               what, t->worst_split);
}

static void tally_assert(const model_case *mc, const char *what, const tally *t, double bound)
{
    printf("  %s, %s: %d runs, %d/%d rows bit-identical to the split run (tokens %d/%d), "
           "vs cold worst %.3g of max|logit| (bound %.1g), argmax %d/%d where clear\n", mc->name,
           what, t->runs, t->exact_rows, t->rows, t->tokens_equal, t->rows, t->worst_cold, bound,
           t->argmax_equal, t->argmax_clear);
    CU_ASSERT(t->runs > 0);
    CU_ASSERT_EQUAL(t->exact_rows, t->rows);
    CU_ASSERT_EQUAL(t->tokens_equal, t->rows);
    CU_ASSERT(t->worst_cold <= bound);
    CU_ASSERT_EQUAL(t->argmax_equal, t->argmax_clear);
}

static void prompt_make(int32_t *ids, int P, int V, uint64_t seed)
{
    uint64_t s = seed;
    for (int i = 0; i < P; i++) ids[i] = (int32_t)(splitmix64_next(&s) % (uint64_t)V);
}

static void run_alloc(run_out *o, int V)
{
    o->logits = malloc((size_t)NROW * V * sizeof(float));
    DS_ASSERT(o->logits);
    memset(o->out, 0, sizeof o->out);
}

/* ---- the cases ---- */

static uint64_t round256(uint64_t n) { return (n + 255) & ~(uint64_t)255; }

static fwd_state_dtype g_state; /* the forwards' state storage (F32 unless a case says) */

static fwd *make_fwd(const qwen35_model *m, int64_t budget, int kv_blocks, status *st)
{
    fwd *f = NULL;
    fwd_create("cuda", m, &(fwd_opts){.n_slots = N_SLOTS, .n_ctx = N_CTX, .max_rows = MAX_P,
                                      .kv_blocks = kv_blocks, .snap_budget = budget,
                                      .state_dtype = g_state}, &f, st);
    return f;
}

/* resume at each n of ns on a P-token prompt: greedy, against split and cold */
static int prefixes(fwd *f, const model_case *mc, int P, const int *ns, int n_ns, uint64_t seed,
                    tally *t, status *st)
{
    const int V = f->vocab;
    const double bound = mc->synthetic ? 0.5 : g_state == FWD_STATE_BF16 ? 0.1 : 1e-3;
    int32_t ids[MAX_P];
    prompt_make(ids, P, V, seed);
    run_out cold, split, res;
    run_alloc(&cold, V), run_alloc(&split, V), run_alloc(&res, V);
    int rc = run_cold(f, &k_greedy, ids, P, NULL, &cold, st);
    for (int k = 0; k < n_ns && !rc; k++) {
        char what[64];
        snprintf(what, sizeof what, "prompt %d resumed at %d", P, ns[k]);
        rc = run_split(f, &k_greedy, ids, P, ns[k], &cold, &split, st) ||
             run_resume(f, &k_greedy, ids, P, ns[k], k % f->n_snaps, &cold, &res, st);
        if (!rc) compare(mc, what, V, &cold, &split, &res, bound, t);
    }
    free(cold.logits), free(split.logits), free(res.logits);
    return rc ? st->code : STATUS_OK;
}

static void test_positions_on(const model_case *mc)
{
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    fwd *f = NULL;
    if (qwen35_model_load(&m, mc->path, &st) || !(f = make_fwd(m, -1, 0, &st))) goto fail;
    const qwen35_config *c = &m->cfg;
    const uint64_t S_elem = g_state == FWD_STATE_BF16 ? 2 : 4;
    const uint64_t want = round256((uint64_t)c->n_gdn_layers * c->C * (c->K_conv - 1) * 4) +
                          round256((uint64_t)c->n_gdn_layers * c->n_v * c->d_v * c->d_k * S_elem);
    printf("  %s (%s, state %s): %d snapshots of %.2f MB chosen for %d slots\n", mc->name,
           f->device, fwd_state_dtype_name(g_state), f->n_snaps, f->snap_bytes / 1e6, f->n_slots);
    CU_ASSERT_EQUAL(f->snap_bytes, want);
    CU_ASSERT(f->n_snaps >= f->n_slots);
    CU_ASSERT(f->n_snaps <= 8 * f->n_slots);
    if (f->n_snaps < 1) goto fail;
    const uint32_t free0 = kv_pool_free_blocks(f->kv);
    tally t = {0};
    int every[20];
    for (int i = 0; i < 20; i++) every[i] = i + 1;
    static const int at100[] = {1, 37, 63, 64, 65, 99}, at200[] = {128, 150};
    if (prefixes(f, mc, 21, every, 20, 21, &t, &st) ||
        prefixes(f, mc, 100, at100, 6, 100, &t, &st) ||
        prefixes(f, mc, 200, at200, 2, 200, &t, &st))
        goto fail;
    tally_assert(mc, g_state == FWD_STATE_BF16
                         ? "bf16 state: every position 1..20 of 21, block edges of 100 and 200"
                         : "every position 1..20 of 21, block edges of 100 and 200",
                 &t, mc->synthetic ? 0.5 : g_state == FWD_STATE_BF16 ? 0.1 : 1e-3);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), free0);
fail:
    if (st.code) printf("  %s: %s\n", mc->name, st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    fwd_destroy(f);
    qwen35_model_free(m);
}

static void test_positions(void)
{
    if (!g_have_gpu) return;
    for (int i = 0; i < g_n_models; i++) test_positions_on(&g_models[i]);
    g_state = FWD_STATE_BF16;
    for (int i = 0; i < g_n_models; i++) test_positions_on(&g_models[i]);
    g_state = FWD_STATE_F32;
}

/* A snapshot and its blocks outliving the source: retained, the source ended and its slot
 * reused (another sequence, another snapshot saved), then resumed; every block back after. */
static void test_retained_on(const model_case *mc)
{
    enum { P = 100, N = 70 };
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    fwd *f = NULL;
    run_out cold, split, res;
    memset(&cold, 0, sizeof cold), memset(&split, 0, sizeof split), memset(&res, 0, sizeof res);
    if (qwen35_model_load(&m, mc->path, &st) || !(f = make_fwd(m, -1, 0, &st))) goto fail;
    if (f->n_snaps < 2) {
        status_fail(&st, STATUS_INTERNAL, "%d snapshots (2 needed)", f->n_snaps);
        goto fail;
    }
    const int V = f->vocab;
    kv_pool *kv = f->kv;
    const uint32_t free0 = kv_pool_free_blocks(kv);
    int32_t ids[P], other[P], kept[2];
    prompt_make(ids, P, V, 7);
    other_tokens(ids, P, V, other);
    run_alloc(&cold, V), run_alloc(&split, V), run_alloc(&res, V);
    if (run_cold(f, &k_greedy, ids, P, NULL, &cold, &st) ||
        run_split(f, &k_greedy, ids, P, N, &cold, &split, &st))
        goto fail;
    /* the source: N tokens, saved, its blocks retained, more tokens, ended */
    if (fwd_seq_start(f, 1, &k_greedy, &st) || feed(f, 1, ids, 0, N, NULL, &st) ||
        fwd_snap_save(f, 1, 0, &st))
        goto fail;
    const int nb = (int)kv_pool_blocks_for(kv, N);
    memcpy(kept, kv_pool_table(kv, 1), (size_t)nb * sizeof *kept);
    kv_pool_retain(kv, kept, nb);
    if (feed(f, 1, other, N, P, NULL, &st)) goto fail;
    fwd_seq_end(f, 1);
    CU_ASSERT_EQUAL(kv_pool_refs(kv, kept[0]), 1);
    CU_ASSERT_EQUAL(kv_pool_refs(kv, kept[1]), 1);
    /* the slot reused: a sequence over other tokens, saved into another snapshot */
    if (fwd_seq_start(f, 1, &k_greedy, &st) || feed(f, 1, other, 0, P, NULL, &st) ||
        fwd_snap_save(f, 1, 1, &st))
        goto fail;
    fwd_seq_end(f, 1);
    const fwd_prefix x = {.snap = 0, .n_pos = N, .blocks = kept, .tokens = ids};
    if (fwd_seq_resume(f, 2, &k_greedy, &x, &st)) goto fail;
    CU_ASSERT_EQUAL(kv_pool_held(kv, 2), nb);
    CU_ASSERT_EQUAL(kv_pool_table(kv, 2)[0], kept[0]); /* the full block shared */
    CU_ASSERT_NOT_EQUAL(kv_pool_table(kv, 2)[1], kept[1]); /* the partial one copied */
    CU_ASSERT_EQUAL(kv_pool_refs(kv, kept[0]), 2);
    if (feed(f, 2, ids, N, P, &res, &st) || decode(f, 2, P, &cold, &res, V, &st)) goto fail;
    fwd_seq_end(f, 2);
    tally t = {0};
    compare(mc, "retained after the source ended", V, &cold, &split, &res,
            mc->synthetic ? 0.5 : 1e-3, &t);
    tally_assert(mc, "retained blocks after the source ended", &t, mc->synthetic ? 0.5 : 1e-3);
    kv_pool_drop(kv, kept, nb);
    printf("  %s: free KV blocks %u before, %u after\n", mc->name, free0,
           kv_pool_free_blocks(kv));
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), free0);
fail:
    if (st.code) printf("  %s: %s\n", mc->name, st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    free(cold.logits), free(split.logits), free(res.logits);
    fwd_destroy(f);
    qwen35_model_free(m);
}

static void test_retained(void)
{
    if (!g_have_gpu) return;
    for (int i = 0; i < g_n_models; i++) test_retained_on(&g_models[i]);
}

/* Penalties and logprobs: the resumed sampler counts the prefix as prompt tokens. The split and
 * resumed runs sample the same tokens with the same logprobs; with the prompt not penalised the
 * first row's logprob differs (so counting the prefix is what the equality shows). */
static void test_sampler_on(const model_case *mc)
{
    enum { P = 100, N = 65 };
    const sampling_params pen = {.temperature = 0, .top_p = 1, .repetition_penalty = 1.5f,
                                 .penalize_prompt = true, .n_logprobs = 2};
    sampling_params pen_gen = pen;
    pen_gen.penalize_prompt = false;
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    fwd *f = NULL;
    run_out cold, split, res, gen;
    memset(&cold, 0, sizeof cold), memset(&split, 0, sizeof split), memset(&res, 0, sizeof res);
    memset(&gen, 0, sizeof gen);
    if (qwen35_model_load(&m, mc->path, &st) || !(f = make_fwd(m, -1, 0, &st))) goto fail;
    const int V = f->vocab;
    int32_t ids[P];
    prompt_make(ids, P, V, 5);
    for (int i = 0; i < 20; i++) ids[P - 20 + i] = ids[i % 4]; /* repeats: the penalty bites */
    run_alloc(&cold, V), run_alloc(&split, V), run_alloc(&res, V), run_alloc(&gen, V);
    if (run_cold(f, &pen, ids, P, NULL, &cold, &st) ||
        run_split(f, &pen, ids, P, N, &cold, &split, &st) ||
        run_resume(f, &pen, ids, P, N, 0, &cold, &res, &st) ||
        run_split(f, &pen_gen, ids, P, N, &cold, &gen, &st))
        goto fail;
    int same = 0;
    for (int r = 0; r < NROW; r++)
        same += res.out[r].token == split.out[r].token &&
                res.out[r].logprob == split.out[r].logprob &&
                res.out[r].n_top == split.out[r].n_top && res.out[r].n_top == 2 &&
                !memcmp(res.out[r].top_id, split.out[r].top_id, 2 * sizeof(int32_t)) &&
                !memcmp(res.out[r].top_logprob, split.out[r].top_logprob, 2 * sizeof(float));
    printf("  %s, penalised prompt + logprobs: %d/%d sampled rows equal to the split run's; "
           "first logprob %.6g (prompt penalised) vs %.6g (not)\n", mc->name, same, NROW,
           res.out[0].logprob, gen.out[0].logprob);
    CU_ASSERT_EQUAL(same, NROW);
    CU_ASSERT(res.out[0].logprob != gen.out[0].logprob);
fail:
    if (st.code) printf("  %s: %s\n", mc->name, st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    free(cold.logits), free(split.logits), free(res.logits), free(gen.logits);
    fwd_destroy(f);
    qwen35_model_free(m);
}

static void test_sampler(void)
{
    if (!g_have_gpu) return;
    for (int i = 0; i < g_n_models; i++) test_sampler_on(&g_models[i]);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* snap_save allocates nothing, counts no step and does not wait for the device: SAVES saves
 * enqueue in less than half the time from the first save to the end of the step after them
 * (asserted where that copy takes over 2 ms, the 4B's; printed on the others) */
static void test_save_async_on(const model_case *mc)
{
    enum { SAVES = 400 };
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    fwd *f = NULL;
    if (qwen35_model_load(&m, mc->path, &st) || !(f = make_fwd(m, -1, 0, &st))) goto fail;
    int32_t ids[8];
    prompt_make(ids, 8, f->vocab, 3);
    if (fwd_seq_start(f, 0, &k_greedy, &st) || feed(f, 0, ids, 0, 8, NULL, &st)) goto fail;
    fwd_row r = {.token = ids[0], .slot = 0, .pos = 8, .sample = true};
    double step = 1e9;
    for (int i = 0; i < 3; i++) { /* a step alone */
        const double t0 = now_s();
        if (fwd_step(f, &r, 1, &st)) goto fail;
        step = fmin(step, now_s() - t0);
        r = (fwd_row){.token = r.out.token, .slot = 0, .pos = r.pos + 1, .sample = true};
    }
    if (fwd_snap_save(f, 0, 0, &st) || fwd_step(f, &r, 1, &st)) goto fail; /* a first copy */
    r = (fwd_row){.token = r.out.token, .slot = 0, .pos = r.pos + 1, .sample = true};
    fwd_stats s0, s1;
    fwd_get_stats(f, &s0);
    const uint64_t dev0 = cuda_alloc_count();
    atomic_store(&g_mine, 0);
    t_mine = 1;
    atomic_store(&g_counting, 1);
    const double t0 = now_s();
    int rc = STATUS_OK;
    for (int i = 0; i < SAVES && !rc; i++) rc = fwd_snap_save(f, 0, i % f->n_snaps, &st);
    const double t1 = now_s();
    atomic_store(&g_counting, 0);
    t_mine = 0;
    if (rc) goto fail;
    fwd_get_stats(f, &s1);
    const long allocs = atomic_load(&g_mine);
    CU_ASSERT_EQUAL(allocs, 0);
    CU_ASSERT_EQUAL(cuda_alloc_count(), dev0);
    CU_ASSERT_EQUAL(s1.steps, s0.steps);
    CU_ASSERT_EQUAL(s1.d2h_bytes, s0.d2h_bytes);
    if (fwd_step(f, &r, 1, &st)) goto fail; /* waits for the copies */
    const double t2 = now_s();
    const double device = t2 - t0 - step;
    printf("  %s: %d saves of %.2f MB: enqueued in %.2f ms, done %.2f ms later (a step alone "
           "%.2f ms); %ld host allocations\n", mc->name, SAVES, f->snap_bytes / 1e6,
           (t1 - t0) * 1e3, (t2 - t1) * 1e3, step * 1e3, allocs);
    if (device > 2e-3) CU_ASSERT(t1 - t0 < 0.5 * (t2 - t0));
    fwd_seq_end(f, 0);
fail:
    if (st.code) printf("  %s: %s\n", mc->name, st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    fwd_destroy(f);
    qwen35_model_free(m);
}

static void test_save_async(void)
{
    if (!g_have_gpu) return;
    for (int i = 0; i < g_n_models; i++) test_save_async_on(&g_models[i]);
}

/* Sizing by budget, and the errors (on the first model): each failed resume leaves the slot
 * empty and the pool's counts as they were. */
static void expect_rc(int rc, int want, const char *what, status *st)
{
    printf("  %s: %s (%s)\n", what, status_code_name(rc), rc ? st->msg : "");
    CU_ASSERT_EQUAL(rc, want);
    status_clear(st);
}

static void test_errors(void)
{
    if (!g_have_gpu || !g_n_models) return;
    const model_case *mc = &g_models[0];
    status st;
    status_clear(&st);
    qwen35_model *m = NULL;
    fwd *f = NULL;
    if (qwen35_model_load(&m, mc->path, &st) || !(f = make_fwd(m, 0, 0, &st))) goto fail;
    /* budgets: 0 none; 3.5 snapshots' bytes: 3 */
    CU_ASSERT_EQUAL(f->n_snaps, 0);
    expect_rc(fwd_snap_save(f, 0, 0, &st), STATUS_RANGE, "budget 0: snap_save", &st);
    const uint64_t one = f->snap_bytes;
    CU_ASSERT(one > 0);
    fwd_destroy(f);
    f = NULL;
    /* a pool of 3 blocks: a 70-token source (slot 1) holds 2, one is free */
    if (!(f = make_fwd(m, (int64_t)(3 * one + one / 2), 3, &st))) goto fail;
    printf("  budget of 3.5 snapshots: %d snapshots\n", f->n_snaps);
    CU_ASSERT_EQUAL(f->n_snaps, 3);
    kv_pool *kv = f->kv;
    int32_t ids[70];
    prompt_make(ids, 70, f->vocab, 9);
    expect_rc(fwd_snap_save(f, -1, 0, &st), STATUS_RANGE, "snap_save slot -1", &st);
    expect_rc(fwd_snap_save(f, N_SLOTS, 0, &st), STATUS_RANGE, "snap_save slot n_slots", &st);
    expect_rc(fwd_snap_save(f, 0, 3, &st), STATUS_RANGE, "snap_save snapshot n_snaps", &st);
    expect_rc(fwd_snap_save(f, 0, -1, &st), STATUS_RANGE, "snap_save snapshot -1", &st);
    if (fwd_seq_start(f, 1, &k_greedy, &st) || feed(f, 1, ids, 0, 70, NULL, &st) ||
        fwd_snap_save(f, 1, 2, &st))
        goto fail;
    int32_t src[2];
    memcpy(src, kv_pool_table(kv, 1), sizeof src);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 1);
    int32_t free_block = -1;
    for (int32_t b = 0; b < 3; b++)
        if (!kv_pool_refs(kv, b)) free_block = b;
    const int32_t not_held[2] = {src[0], free_block}, out_of_range[2] = {src[0], 99};
    /* slot 2 holds the free block before each resume (but the last two): a failed resume lets
     * it go and takes nothing */
    const struct {
        int slot, snap, n_pos;
        const int32_t *blocks;
        int want;
        const char *what;
    } cases[] = {
        {-1, 2, 70, src, STATUS_RANGE, "resume slot -1"},
        {N_SLOTS, 2, 70, src, STATUS_RANGE, "resume slot n_slots"},
        {2, 3, 70, src, STATUS_RANGE, "resume snapshot n_snaps"},
        {2, -1, 70, src, STATUS_RANGE, "resume snapshot -1"},
        {2, 2, 0, src, STATUS_RANGE, "resume at 0 positions"},
        {2, 2, N_CTX, src, STATUS_RANGE, "resume at n_ctx positions"},
        {2, 2, 70, not_held, STATUS_INVALID, "resume from a block not held"},
        {2, 2, 70, out_of_range, STATUS_INVALID, "resume from a block out of range"},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    for (int k = 0; k < n_cases; k++) {
        const bool hold = k < n_cases - 2; /* the free block must stay free to be named */
        if (hold && (fwd_seq_start(f, 2, &k_greedy, &st) || feed(f, 2, ids, 0, 1, NULL, &st)))
            goto fail;
        const fwd_prefix x = {.snap = cases[k].snap, .n_pos = cases[k].n_pos,
                              .blocks = cases[k].blocks, .tokens = ids};
        expect_rc(fwd_seq_resume(f, cases[k].slot, &k_greedy, &x, &st), cases[k].want,
                  cases[k].what, &st);
        if (cases[k].slot == 2) { /* the slot empty, its block back, nothing adopted */
            CU_ASSERT_EQUAL(kv_pool_held(kv, 2), 0);
            CU_ASSERT_EQUAL(fwd_n_past(f, 2), 0);
            CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 1);
        }
        CU_ASSERT_EQUAL(kv_pool_refs(kv, src[0]), 1);
        CU_ASSERT_EQUAL(kv_pool_refs(kv, src[1]), 1);
        fwd_seq_end(f, 2);
    }
    /* exhausted: slot 2 takes the free block, none is left for the partial block's copy */
    if (fwd_seq_start(f, 2, &k_greedy, &st) || feed(f, 2, ids, 0, 1, NULL, &st)) goto fail;
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 0);
    const fwd_prefix x = {.snap = 2, .n_pos = 70, .blocks = src, .tokens = ids};
    expect_rc(fwd_seq_resume(f, 3, &k_greedy, &x, &st), STATUS_EXHAUSTED,
              "resume with no free block for the partial copy", &st);
    CU_ASSERT_EQUAL(kv_pool_held(kv, 3), 0);
    CU_ASSERT_EQUAL(kv_pool_refs(kv, src[0]), 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 0);
    /* at the block edge no block is taken: the same pool resumes (the snapshot's position is
     * the caller's to keep right; only the bookkeeping is checked here) */
    const fwd_prefix edge = {.snap = 2, .n_pos = 64, .blocks = src, .tokens = ids};
    expect_rc(fwd_seq_resume(f, 3, &k_greedy, &edge, &st), STATUS_OK,
              "resume at the block edge with no free block", &st);
    CU_ASSERT_EQUAL(kv_pool_held(kv, 3), 1);
    CU_ASSERT_EQUAL(kv_pool_refs(kv, src[0]), 2);
    CU_ASSERT_EQUAL(fwd_n_past(f, 3), 64);
    for (int sl = 0; sl < N_SLOTS; sl++) fwd_seq_end(f, sl);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(kv), 3);
fail:
    if (st.code) printf("  %s: %s\n", mc->name, st.msg);
    CU_ASSERT_EQUAL(st.code, STATUS_OK);
    fwd_destroy(f);
    qwen35_model_free(m);
}

/* The models this run has (find_models): with DS_REQUIRE_GPU=1 the 4B and a small one. */
static void test_models(void)
{
    if (!g_have_gpu) return;
    const char *req = getenv("DS_REQUIRE_GPU");
    if (!(req && !strcmp(req, "1"))) return;
    int small = 0, synth = 0;
    for (int i = 0; i < g_n_models; i++) {
        synth += g_models[i].synthetic;
        small += !g_models[i].synthetic;
    }
    if (!small || !synth)
        printf("  DS_REQUIRE_GPU=1: the synthetic 4B and one of the demo or reference models "
               "are required\n");
    CU_ASSERT(small >= 1);
    CU_ASSERT(synth >= 1);
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("CUDA prefix reuse");
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("prefix_parity", NULL, NULL);
    if (g_have_gpu) find_models();
    CU_add_test(s, "models", test_models);
    CU_add_test(s, "positions", test_positions);
    CU_add_test(s, "retained", test_retained);
    CU_add_test(s, "sampler", test_sampler);
    CU_add_test(s, "save_async", test_save_async);
    CU_add_test(s, "errors", test_errors);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
