/* Verify runs and rollback on the CUDA forward (model/fwd.h, speculative decoding; docs/GPU.md
 * "Verify runs"), with the DeltaNet state as F32 and as bf16:
 *  - with --batch-invariant (every step through the batched kernels): a verify run of k+1 rows
 *    (k = 1..4) gives the logits, greedy tokens and final-norm outputs of k+1 one-row steps,
 *    bit for bit; after it, rollback to any of its positions continues bit-identically with a
 *    sequence fed only the rows up to there (the kept state copied back; rolled back twice,
 *    further each time, too); two verify runs of 5 rows (every keep slot) and a decode row in
 *    one step equal each run alone;
 *  - by default (one-row steps take the GEMV graphs, another rounding): a verify run's logits
 *    within 5e-3 of max|logit| of the one-row steps' (each is within 2e-3 of the CPU's:
 *    batch_parity), the greedy tokens' agreement printed; on the synthetic 0.8B Q4_K_M
 *    (DS_ENGINE_GGUF: gemv_cols at 2 rows, gemv_mma from 3) verify runs of 2-5 rows and
 *    decode steps of 9-32 sequences within 1.5x + 1e-3 of the batch-invariant forward's
 *    distance from the same one-row steps;
 *  - a sampled sequence's verify run (fwd.verify_sampled: the GPU sampler) draws as one-row
 *    steps do, with --batch-invariant: each row's token is the one-row step's at its position,
 *    and after a rollback the next draw is that of the sequence fed only the rows kept;
 *  - errors by name, nothing run: a sampled sequence's verify run with a penalty, more verify
 *    runs in a step than verify_runs, rollback outside the last run, of another slot, or after
 *    a later step;
 *  - fwd.verify_rows is what was asked, and 0 without verify runs asked.
 * Models: the demo model (models/demo-en-17m.gguf) and the reference own-r2-tied
 * ($DS_REPO_ROOT/tests/reference); with DS_REQUIRE_GPU=1 one of them must be there. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sampling.h"
#include "common/status.h"
#include "model/fwd.h"
#include "model/qwen35.h"
#include "tests/gpu/gpu_models.h"
#include "tests/gpu/gpu_parity.h"

enum { MAX_K = 4, P = 21, AFTER = 6, N_CTX = 256 };

static bool g_have_gpu;
static gpu_models g_models;
static fwd_state_dtype g_dtype;

static const sampling_params k_greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */

static void find_models(void)
{
    const char *root = getenv("DS_REPO_ROOT");
    char p[1024];
    gpu_models_demo_path(p, sizeof p);
    gpu_models_load(&g_models, p, "demo");
    snprintf(p, sizeof p, "%s/tests/reference/own-r2-tied.gguf", root ? root : ".");
    gpu_models_load(&g_models, p, "own-r2-tied");
}

static fwd *make(const qwen35_model *m, bool invariant, int verify_rows, int verify_runs)
{
    const fwd_opts o = {.n_slots = 4, .n_ctx = N_CTX, .batch_invariant = invariant,
                        .verify_rows = verify_rows, .verify_runs = verify_runs,
                        .state_dtype = g_dtype};
    fwd *f = NULL;
    status st;
    if (fwd_create("cuda", m, &o, &f, &st)) printf("  fwd_create: %s\n", st.msg);
    return f;
}

/* the prompt: P ids spread over the vocabulary */
static void prompt_ids(const qwen35_model *m, int32_t *ids)
{
    for (int i = 0; i < P; i++) ids[i] = (int32_t)((7919u * (unsigned)(i + 3)) % (unsigned)m->cfg.V);
}

/* seq_start, then the prompt as one run (no sampling). */
static void start(fwd *f, int slot, const sampling_params *p)
{
    status st;
    int32_t ids[P];
    prompt_ids(f->model, ids);
    CU_ASSERT_EQUAL_FATAL(fwd_seq_start(f, slot, p, &st), STATUS_OK);
    fwd_row rows[P];
    for (int i = 0; i < P; i++)
        rows[i] = (fwd_row){.token = ids[i], .slot = slot, .pos = i, .prompt = true};
    CU_ASSERT_EQUAL_FATAL(fwd_step(f, rows, P, &st), STATUS_OK);
}

/* One row a step: token at the slot's position, sampled, its logits and h out. */
static int32_t one(fwd *f, int slot, int32_t token, float *logits, float *h)
{
    status st;
    fwd_row r = {.token = token, .slot = slot, .pos = fwd_n_past(f, slot), .sample = true,
                 .logits = logits, .hidden = h};
    CU_ASSERT_EQUAL_FATAL(fwd_step(f, &r, 1, &st), STATUS_OK);
    return r.out.token;
}

/* The rows of a verify run of n rows toks[0..n) of slot from its position into rows. */
static void verify_rows(fwd *f, int slot, const int32_t *toks, int n, float *logits, float *h,
                        fwd_row *rows)
{
    const int V = f->vocab, H = f->model->cfg.H, p = fwd_n_past(f, slot);
    for (int i = 0; i < n; i++)
        rows[i] = (fwd_row){.token = toks[i], .slot = slot, .pos = p + i, .sample = true,
                            .verify = true, .logits = logits ? logits + (size_t)i * V : NULL,
                            .hidden = h ? h + (size_t)i * H : NULL};
}

static void verify(fwd *f, int slot, const int32_t *toks, int n, int32_t *out, float *logits,
                   float *h)
{
    fwd_row rows[MAX_K + 1];
    verify_rows(f, slot, toks, n, logits, h, rows);
    status st;
    CU_ASSERT_EQUAL_FATAL(fwd_step(f, rows, n, &st), STATUS_OK);
    for (int i = 0; i < n; i++) out[i] = rows[i].out.token;
}

/* The tokens a verify run feeds: the greedy continuation of the prompt for the first `good`
 * (found by f_one's slot 3), then ids it would not choose. */
static void drafts(fwd *f, int good, int32_t *toks)
{
    start(f, 3, &k_greedy);
    int32_t t = 1;
    for (int i = 0; i <= MAX_K; i++) {
        toks[i] = i <= good ? t : (t + 17 * i + 1) % f->vocab;
        t = one(f, 3, toks[i], NULL, NULL);
    }
}

static float max_abs(const float *x, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* the largest |a - b| of n rows of V logits, each over its row's max|a| */
static float worst_rows(const float *l1, const float *l2, int n, int V)
{
    float worst = 0;
    for (int i = 0; i < n; i++) {
        const float *a = l1 + (size_t)i * V, *b = l2 + (size_t)i * V;
        float d = 0;
        for (int v = 0; v < V; v++) d = fmaxf(d, fabsf(a[v] - b[v]));
        worst = fmaxf(worst, d / max_abs(a, (size_t)V));
    }
    return worst;
}

static void test_equals_rows(void)
{
    for (int c = 0; g_have_gpu && c < g_models.n; c++) {
        const qwen35_model *m = g_models.m[c];
        const int V = m->cfg.V, H = m->cfg.H;
        fwd *fo = make(m, true, MAX_K + 1, 2), *fr = make(m, true, MAX_K + 1, 2);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fo);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fr);
        CU_ASSERT_EQUAL(fr->verify_rows, MAX_K + 1);
        CU_ASSERT(fr->verify_sampled);
        float *l1 = malloc((size_t)(MAX_K + 1) * V * 4), *l2 = malloc((size_t)(MAX_K + 1) * V * 4);
        float *h1 = malloc((size_t)(MAX_K + 1) * H * 4), *h2 = malloc((size_t)(MAX_K + 1) * H * 4);
        int32_t toks[MAX_K + 1], t1[MAX_K + 1], t2[MAX_K + 1];
        drafts(fo, 2, toks);
        int bad = 0;
        for (int k = 1; k <= MAX_K; k++) {
            start(fo, 0, &k_greedy);
            start(fr, 0, &k_greedy);
            for (int i = 0; i <= k; i++)
                t1[i] = one(fo, 0, toks[i], l1 + (size_t)i * V, h1 + (size_t)i * H);
            verify(fr, 0, toks, k + 1, t2, l2, h2);
            const bool same = !memcmp(l1, l2, (size_t)(k + 1) * V * 4) &&
                              !memcmp(h1, h2, (size_t)(k + 1) * H * 4) &&
                              !memcmp(t1, t2, (size_t)(k + 1) * 4);
            bad += !same;
            CU_ASSERT(same);
            CU_ASSERT_EQUAL(fwd_n_past(fr, 0), P + k + 1);
        }
        printf("  %s%s: verify runs of 2..%d rows %s one-row steps (logits, tokens, h)\n",
               g_models.name[c], g_dtype == FWD_STATE_BF16 ? " (bf16 state)" : "", MAX_K + 1,
               bad ? "DIFFER from" : "bit-identical to");
        free(l1), free(l2), free(h1), free(h2);
        fwd_destroy(fo);
        fwd_destroy(fr);
    }
}

/* After a verify run of k+1 rows rolled back to keep a+1 of them, AFTER more greedy steps equal
 * a sequence fed those a+1 rows one by one (logits bit for bit). Also rolled back twice. */
static void test_rollback(void)
{
    for (int c = 0; g_have_gpu && c < g_models.n; c++) {
        const qwen35_model *m = g_models.m[c];
        const int V = m->cfg.V;
        fwd *fr = make(m, true, MAX_K + 1, 2), *fs = make(m, true, MAX_K + 1, 2);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fr);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fs);
        float *lr = malloc((size_t)V * 4), *ls = malloc((size_t)V * 4);
        int32_t toks[MAX_K + 1], out[MAX_K + 1];
        drafts(fr, 1, toks);
        int bad = 0, cases = 0;
        for (int k = 1; k <= MAX_K; k++)
            for (int a = 0; a <= k; a++)
                for (int twice = 0; twice < (a < k ? 2 : 1); twice++) {
                    start(fr, 0, &k_greedy);
                    start(fs, 1, &k_greedy);
                    int32_t nr = 0;
                    for (int i = 0; i <= a; i++) nr = one(fr, 0, toks[i], NULL, NULL);
                    verify(fs, 1, toks, k + 1, out, NULL, NULL);
                    int32_t ns = out[a];
                    status st;
                    if (twice) /* first to the run's end less one row, then to a */
                        CU_ASSERT_EQUAL(fwd_rollback(fs, 1, P + k, &st), STATUS_OK);
                    CU_ASSERT_EQUAL(fwd_rollback(fs, 1, P + a + 1, &st), STATUS_OK);
                    CU_ASSERT_EQUAL(fwd_n_past(fs, 1), P + a + 1);
                    bool same = ns == nr;
                    for (int s = 0; s < AFTER; s++) {
                        const int32_t tr = one(fr, 0, nr, lr, NULL), ts = one(fs, 1, ns, ls, NULL);
                        same &= tr == ts && !memcmp(lr, ls, (size_t)V * 4);
                        nr = tr, ns = ts;
                    }
                    bad += !same;
                    cases++;
                    CU_ASSERT(same);
                }
        printf("  %s%s: rollback, %d cases (k 1..%d, every a, twice): %d differ from the rows "
               "fed alone\n", g_models.name[c], g_dtype == FWD_STATE_BF16 ? " (bf16 state)" : "", cases,
               MAX_K, bad);
        free(lr), free(ls);
        fwd_destroy(fr);
        fwd_destroy(fs);
    }
}

/* Two verify runs of MAX_K + 1 rows (all 2 x MAX_K keep slots) and a decode row in one step,
 * rolled back to different rows, against each alone, then onwards; a third run in the step is
 * refused. */
static void test_two_runs(void)
{
    for (int c = 0; g_have_gpu && c < g_models.n; c++) {
        const qwen35_model *m = g_models.m[c];
        const int V = m->cfg.V, n = MAX_K + 1, R = 2 * n + 1;
        fwd *fa = make(m, true, n, 2), *fb = make(m, true, n, 2);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fa);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fb);
        float *la = malloc((size_t)R * V * 4), *lb = malloc((size_t)R * V * 4);
        int32_t t0[MAX_K + 1], t1[MAX_K + 1], oa[2 * MAX_K + 3], ob[2 * MAX_K + 3];
        drafts(fa, 2, t0);
        for (int i = 0; i < n; i++) t1[i] = t0[(i + 1) % n];
        for (int s = 0; s < 3; s++) {
            start(fa, s, &k_greedy);
            start(fb, s, &k_greedy);
        }
        fwd_row rows[2 * MAX_K + 4];
        verify_rows(fa, 0, t0, n, la, NULL, rows);
        verify_rows(fa, 1, t1, n, la + (size_t)n * V, NULL, rows + n);
        rows[2 * n] = (fwd_row){.token = t0[0], .slot = 2, .pos = P, .sample = true,
                                .logits = la + (size_t)(2 * n) * V};
        status st;
        /* a third verify run: more than the two the forward keeps states for */
        fwd_row third[2 * MAX_K + 4];
        memcpy(third, rows, sizeof rows);
        third[2 * n].verify = true;
        third[2 * n + 1] = (fwd_row){.token = t0[1], .slot = 2, .pos = P + 1, .sample = true,
                                     .verify = true};
        CU_ASSERT_EQUAL(fwd_step(fa, third, R + 1, &st), STATUS_RANGE);
        CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "keeps the states of 2 runs"));
        CU_ASSERT_EQUAL(fwd_n_past(fa, 2), P);
        CU_ASSERT_EQUAL_FATAL(fwd_step(fa, rows, R, &st), STATUS_OK);
        for (int i = 0; i < R; i++) oa[i] = rows[i].out.token;
        CU_ASSERT_EQUAL(fwd_rollback(fa, 0, P + 2, &st), STATUS_OK);
        CU_ASSERT_EQUAL(fwd_rollback(fa, 1, P + 1, &st), STATUS_OK);
        /* each alone on fb */
        verify(fb, 0, t0, n, ob, lb, NULL);
        CU_ASSERT_EQUAL(fwd_rollback(fb, 0, P + 2, &st), STATUS_OK);
        verify(fb, 1, t1, n, ob + n, lb + (size_t)n * V, NULL);
        CU_ASSERT_EQUAL(fwd_rollback(fb, 1, P + 1, &st), STATUS_OK);
        ob[2 * n] = one(fb, 2, t0[0], lb + (size_t)(2 * n) * V, NULL);
        bool same = !memcmp(la, lb, (size_t)R * V * 4) && !memcmp(oa, ob, (size_t)R * 4);
        /* onwards from the rows kept: slot 0 after its row 1, slot 1 after its row 0 */
        int32_t na[2] = {oa[1], oa[n]}, nb[2] = {ob[1], ob[n]};
        for (int i = 0; i < AFTER; i++)
            for (int s = 0; s < 2; s++) {
                na[s] = one(fa, s, na[s], la, NULL);
                nb[s] = one(fb, s, nb[s], lb, NULL);
                same &= na[s] == nb[s] && !memcmp(la, lb, (size_t)V * 4);
            }
        CU_ASSERT(same);
        printf("  %s%s: two verify runs and a decode row in one step %s each alone\n", g_models.name[c],
               g_dtype == FWD_STATE_BF16 ? " (bf16 state)" : "", same ? "equal" : "DIFFER from");
        free(la), free(lb);
        fwd_destroy(fa);
        fwd_destroy(fb);
    }
}

/* the quantised models' bound: 1.5x the batch-invariant forward's distance from the one-row
 * steps, + 1e-3 of max|logit| */
static float near_limit(float base) { return 1.5f * base + 1e-3f; }

/* The default forward: one-row steps through the GEMV graphs, a verify run of n rows through
 * the batched passes (gemv_cols, or gemv_mma from GEMV_MMA_FROM rows for the K-quants): close,
 * not bit-identical. With bound > 0, within bound of max|logit|; with bound 0 (the quantised
 * models, whose random weights amplify any rounding difference through their layers), within
 * 1.5x + 1e-3 of the batch-invariant forward's verify run (the batched GEMM on F16 rows for
 * every matrix) against the same one-row steps: the Q8 products round as the GEMV does, so
 * they land nearer than that; a wrongly wired matrix differs by O(1). */
static void default_path_case(const qwen35_model *m, const char *name, int n, float bound)
{
    const int V = m->cfg.V;
    fwd *fo = make(m, false, n, 0), *fr = make(m, false, n, 0), *fi = NULL;
    CU_ASSERT_PTR_NOT_NULL_FATAL(fo);
    CU_ASSERT_PTR_NOT_NULL_FATAL(fr);
    float *l1 = malloc((size_t)n * V * 4), *l2 = malloc((size_t)n * V * 4);
    float *l3 = malloc((size_t)n * V * 4);
    CU_ASSERT_PTR_NOT_NULL_FATAL(l1 && l2 && l3);
    int32_t toks[MAX_K + 1], t1[MAX_K + 1], t2[MAX_K + 1], t3[MAX_K + 1];
    drafts(fo, n - 1, toks);
    start(fo, 0, &k_greedy);
    start(fr, 0, &k_greedy);
    for (int i = 0; i < n; i++) t1[i] = one(fo, 0, toks[i], l1 + (size_t)i * V, NULL);
    verify(fr, 0, toks, n, t2, l2, NULL);
    const float worst = worst_rows(l1, l2, n, V);
    int agree = 0;
    for (int i = 0; i < n; i++) agree += t1[i] == t2[i];
    float base = 0, limit = bound;
    if (bound == 0) {
        fi = make(m, true, n, 0);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fi);
        start(fi, 0, &k_greedy);
        verify(fi, 0, toks, n, t3, l3, NULL);
        base = worst_rows(l1, l3, n, V);
        limit = near_limit(base);
    }
    printf("  %s: default path: verify run of %d rows vs one-row GEMV steps: logits within %.2e "
           "of max|logit| (bound %.2e", name, n, worst, limit);
    if (bound == 0) printf("; the batch-invariant run's %.2e", base);
    printf("), greedy tokens %d of %d the same\n", agree, n);
    CU_ASSERT(worst <= limit);
    free(l1), free(l2), free(l3);
    fwd_destroy(fo);
    fwd_destroy(fr);
    if (fi) fwd_destroy(fi);
}

static void test_default_path(void)
{
    if (g_dtype != FWD_STATE_F32) return;
    for (int c = 0; g_have_gpu && c < g_models.n; c++)
        default_path_case(g_models.m[c], g_models.name[c], MAX_K + 1, 5e-3f);
}

/* Decode steps of n = 9..32 sequences on the default path (their K-quant matrices through
 * gemv_mma's 64-row tiles on Q8_K rows, split K on the 0.8B's small matrices) against each
 * sequence's one-row GEMV step: every row's logits within 1.5x + 1e-3 of the same step on the
 * batch-invariant forward (the batched GEMM on F16 rows) against those one-row steps. */
static void rows_case(const qwen35_model *m, const char *name, int n)
{
    const int V = m->cfg.V;
    const fwd_opts o = {.n_slots = n, .n_ctx = N_CTX, .state_dtype = g_dtype};
    fwd_opts oi = o;
    oi.batch_invariant = true;
    fwd *fo = NULL, *fr = NULL, *fi = NULL;
    status st;
    CU_ASSERT_EQUAL_FATAL(fwd_create("cuda", m, &o, &fo, &st), STATUS_OK);
    CU_ASSERT_EQUAL_FATAL(fwd_create("cuda", m, &o, &fr, &st), STATUS_OK);
    CU_ASSERT_EQUAL_FATAL(fwd_create("cuda", m, &oi, &fi, &st), STATUS_OK);
    float *l1 = malloc((size_t)n * V * 4), *l2 = malloc((size_t)n * V * 4);
    float *l3 = malloc((size_t)n * V * 4);
    fwd_row *rows = malloc((size_t)n * sizeof *rows), *irows = malloc((size_t)n * sizeof *irows);
    CU_ASSERT_PTR_NOT_NULL_FATAL(l1 && l2 && l3 && rows && irows);
    int agree = 0;
    for (int i = 0; i < n; i++) {
        start(fo, i, &k_greedy);
        start(fr, i, &k_greedy);
        start(fi, i, &k_greedy);
        const int32_t tok = (int32_t)((37u * (unsigned)i + 5u) % (unsigned)V);
        one(fo, i, tok, l1 + (size_t)i * V, NULL);
        rows[i] = (fwd_row){.token = tok, .slot = i, .pos = P, .sample = true,
                            .logits = l2 + (size_t)i * V};
        irows[i] = rows[i];
        irows[i].logits = l3 + (size_t)i * V;
    }
    CU_ASSERT_EQUAL_FATAL(fwd_step(fr, rows, n, &st), STATUS_OK);
    CU_ASSERT_EQUAL_FATAL(fwd_step(fi, irows, n, &st), STATUS_OK);
    const float worst = worst_rows(l1, l2, n, V), base = worst_rows(l1, l3, n, V);
    const float limit = near_limit(base);
    for (int i = 0; i < n; i++) {
        const float *a = l1 + (size_t)i * V;
        int best = 0;
        for (int v = 1; v < V; v++) best = a[v] > a[best] ? v : best;
        agree += rows[i].out.token == best;
    }
    printf("  %s: default path: a decode step of %d sequences vs one-row GEMV steps: logits "
           "within %.2e of max|logit| (bound %.2e; the batch-invariant step's %.2e), greedy "
           "tokens %d of %d the same\n", name, n, worst, limit, base, agree, n);
    CU_ASSERT(worst <= limit);
    free(l1), free(l2), free(l3), free(rows), free(irows);
    fwd_destroy(fo);
    fwd_destroy(fr);
    fwd_destroy(fi);
}

/* The same on the synthetic 0.8B Q4_K_M of DS_ENGINE_GGUF (its Q4_K, Q5_K and Q6_K matrices
 * through gemv_mma at 3-5 rows, gemv_cols at 2), and decode steps of 9-32 sequences
 * (rows_case); random weights amplify a rounding difference through 24 layers, so both are
 * bounded by the batch-invariant forward's distance from the one-row steps. */
static void test_default_path_quantised(void)
{
    const char *list = getenv("DS_ENGINE_GGUF");
    if (g_dtype != FWD_STATE_F32 || !g_have_gpu || !list || !*list) {
        if (g_have_gpu && g_dtype == FWD_STATE_F32) printf("  DS_ENGINE_GGUF unset: skipped\n");
        return;
    }
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL, *p = strtok_r(buf, ":", &save);
    gpu_models q = {0};
    gpu_models_load(&q, p, "synthetic 0.8B Q4_K_M");
    for (int c = 0; c < q.n; c++) {
        for (int n = 2; n <= MAX_K + 1; n++) default_path_case(q.m[c], q.name[c], n, 0);
        static const int steps[] = {9, 17, 32};
        for (int k = 0; k < 3; k++) rows_case(q.m[c], q.name[c], steps[k]);
    }
    gpu_models_free(&q);
}

static void test_sampled(void)
{
    for (int c = 0; g_have_gpu && c < g_models.n; c++) {
        const qwen35_model *m = g_models.m[c];
        fwd *fo = make(m, true, MAX_K + 1, 2), *fr = make(m, true, MAX_K + 1, 2);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fo);
        CU_ASSERT_PTR_NOT_NULL_FATAL(fr);
        const sampling_params sp = sampling_params_resolve(
            &(sampling_params){.temperature = 1.0f, .top_p = 0.95f, .seed = 11});
        int32_t toks[MAX_K + 1], a[MAX_K + 1], b[MAX_K + 1];
        for (int i = 0; i <= MAX_K; i++) toks[i] = (int32_t)((7 + 31 * i) % m->cfg.V);
        start(fo, 0, &sp);
        start(fr, 0, &sp);
        for (int i = 0; i <= MAX_K; i++) a[i] = one(fo, 0, toks[i], NULL, NULL);
        verify(fr, 0, toks, MAX_K + 1, b, NULL, NULL);
        int same = 0;
        for (int i = 0; i <= MAX_K; i++) same += a[i] == b[i];
        /* two rows kept, then a row of token 5: the draw of the sequence fed toks[0], toks[1], 5 */
        status st;
        CU_ASSERT_EQUAL(fwd_rollback(fr, 0, P + 2, &st), STATUS_OK);
        const int32_t y = one(fr, 0, 5, NULL, NULL);
        start(fo, 1, &sp);
        one(fo, 1, toks[0], NULL, NULL);
        one(fo, 1, toks[1], NULL, NULL);
        const int32_t x = one(fo, 1, 5, NULL, NULL);
        printf("  %s: sampled verify run: %d of %d draws those of one-row steps; after rollback "
               "%d, one-row %d\n", g_models.name[c], same, MAX_K + 1, y, x);
        CU_ASSERT_EQUAL(same, MAX_K + 1);
        CU_ASSERT_EQUAL(x, y);
        fwd_destroy(fo);
        fwd_destroy(fr);
    }
}

static void test_errors(void)
{
    if (!g_have_gpu || g_dtype != FWD_STATE_F32 || !g_models.n) return;
    const qwen35_model *m = g_models.m[0];
    fwd *plain = make(m, false, 0, 0), *f = make(m, true, 3, 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(plain);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    CU_ASSERT_EQUAL(plain->verify_rows, 0);
    status st;
    start(plain, 0, &k_greedy);
    fwd_row r = {.token = 1, .slot = 0, .pos = P, .sample = true, .verify = true};
    CU_ASSERT_EQUAL(fwd_step(plain, &r, 1, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "verify"));
    /* a sampled sequence with a penalty: refused by name, nothing run */
    const sampling_params drawn = sampling_params_resolve(
        &(sampling_params){.temperature = 0.8f, .top_p = 0.9f, .seed = 7,
                           .repetition_penalty = 1.1f});
    start(f, 1, &drawn);
    fwd_row rows[3];
    for (int i = 0; i < 3; i++)
        rows[i] = (fwd_row){.token = 1, .slot = 1, .pos = P + i, .sample = true, .verify = true};
    CU_ASSERT_EQUAL(fwd_step(f, rows, 3, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "penalties"));
    CU_ASSERT_EQUAL(fwd_n_past(f, 1), P);
    start(f, 0, &k_greedy);
    for (int i = 0; i < 3; i++) rows[i].slot = 0;
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, P + 1, &st), STATUS_RANGE); /* no verify run yet */
    CU_ASSERT_EQUAL_FATAL(fwd_step(f, rows, 3, &st), STATUS_OK);
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, P, &st), STATUS_RANGE);     /* before the run */
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, P + 4, &st), STATUS_RANGE); /* past it */
    CU_ASSERT_EQUAL(fwd_rollback(f, 1, P + 1, &st), STATUS_RANGE); /* another slot */
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, P + 2, &st), STATUS_OK);
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, P + 3, &st), STATUS_RANGE); /* only further back */
    CU_ASSERT_EQUAL(fwd_n_past(f, 0), P + 2);
    one(f, 0, 2, NULL, NULL);
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, P + 2, &st), STATUS_RANGE); /* a step ended the run */
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "last step"));
    fwd *g = NULL;
    const fwd_opts bad = {.n_slots = 1, .n_ctx = 64, .verify_rows = FWD_MAX_VERIFY_ROWS + 1};
    CU_ASSERT_EQUAL(fwd_create("cuda", m, &bad, &g, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NULL(g);
    fwd_destroy(plain);
    fwd_destroy(f);
}

static void test_models(void)
{
    const char *req = getenv("DS_REQUIRE_GPU");
    if (g_have_gpu && req && !strcmp(req, "1")) CU_ASSERT(g_models.n >= 1);
}

static int use_bf16(void)
{
    g_dtype = FWD_STATE_BF16;
    return 0;
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("CUDA verify runs");
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    if (g_have_gpu) find_models();
    CU_pSuite s = CU_add_suite("verify_parity", NULL, NULL);
    CU_add_test(s, "models", test_models);
    CU_add_test(s, "a verify run equals one-row steps", test_equals_rows);
    CU_add_test(s, "rollback continues bit-identically", test_rollback);
    CU_add_test(s, "two verify runs in one step", test_two_runs);
    CU_add_test(s, "default path", test_default_path);
    CU_add_test(s, "default path, quantised", test_default_path_quantised);
    CU_add_test(s, "a sampled verify run draws as one-row steps", test_sampled);
    CU_add_test(s, "errors", test_errors);
    CU_pSuite b = CU_add_suite("verify_parity, bf16 state", use_bf16, NULL);
    CU_add_test(b, "a verify run equals one-row steps", test_equals_rows);
    CU_add_test(b, "rollback continues bit-identically", test_rollback);
    CU_add_test(b, "two verify runs in one step", test_two_runs);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    gpu_models_free(&g_models);
    return failed ? 1 : 0;
}
