/* The MTP head on the CUDA forward (model/fwd.h mtp_feed / mtp_draft) against the CPU head
 * (model/mtp.h), the specification, on the same hidden rows (the CPU forward's final-norm
 * outputs of a prompt):
 *  - drafts: the prompt's pairs fed, then k = 1..7 greedy drafts from its last row; each draft
 *    equals the CPU's while the CPU's top two logits of that row lie more than gate(depth)
 *    ·max|logit| apart (past a closer pair the chains may part, and are not compared further);
 *    every model must compare some;
 *    (feeds of 1 row to several passes: short passes by gemv_cols, longer ones by the GEMM);
 *  - a draft repeated from the same position gives the same drafts bit for bit; the rows fed in
 *    two feeds, or a feed after a draft over that draft's scratch rows, give the CPU's drafts
 *    as above;
 *  - errors by name, nothing run: a bad slot, rows past the slot's fed positions, a token id
 *    outside the vocabulary, k outside 1..7, drafts past the context;
 *  - fwd_has_mtp: only with a head and verify runs (without: STATUS_UNSUPPORTED).
 * Models: the demo model (models/demo-en-17m.gguf, its trained head, F32) and a synthetic
 * "tiny" Q4_K_M with a head written here (gguf/synth.h), so the quantised kernels run too. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/sampling.h"
#include "common/status.h"
#include "gguf/synth.h"
#include "model/forward.h"
#include "model/fwd.h"
#include "model/mtp.h"
#include "model/qwen35.h"
#include "tests/gpu/gpu_models.h"
#include "tests/gpu/gpu_parity.h"

enum { MAX_K = 7, N_CTX = 512, T_LONG = 150 };

/* The near-tie gate of draft `depth` (0-based), over max|logit|. A draft's hidden row feeds the
 * next, so a rounding difference compounds down the chain: on the CPU, this file's tiny Q4_K_M
 * head drafting 512 chains of 7 with its Q8 dots against exact float dots (a wider difference
 * than the GPU's Q8 against the CPU's Q8) parted chains at top-two gaps of at most 7.9e-3,
 * 9.7e-3, 1.27e-2, 7.0e-3, 1.38e-2, 1.52e-2 and 2.47e-2 at depths 0..6; the gate lies above
 * each. */
static double gate(int depth) { return 8e-3 * (1 + 0.5 * depth); }

static bool g_have_gpu;
static gpu_models g_models;
static char g_synth[64];

static const sampling_params k_greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */

static void find_models(void)
{
    char p[1024];
    gpu_models_demo_path(p, sizeof p);
    gpu_models_load(&g_models, p, "demo");
    snprintf(g_synth, sizeof g_synth, "/tmp/mtp_parity_%d.gguf", (int)getpid());
    const synth_options o = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_Q4_K_M,
                             .seed = 7, .mtp = true};
    status st;
    if (synth_write(g_synth, &o, NULL, &st)) {
        printf("  synth: %s\n", st.msg);
        CU_FAIL("synth");
        return;
    }
    gpu_models_load(&g_models, g_synth, "tiny q4_k_m");
}

static fwd *make(const qwen35_model *m, int verify_rows)
{
    /* passes of at most 64 rows: a long prompt's feed takes several */
    const fwd_opts o = {.n_slots = 2, .n_ctx = N_CTX, .max_rows = 40, .verify_rows = verify_rows};
    fwd *f = NULL;
    status st;
    if (fwd_create("cuda", m, &o, &f, &st)) printf("  fwd_create: %s\n", st.msg);
    return f;
}

/* T prompt ids spread over the vocabulary (seeded) */
static void prompt_ids(const qwen35_model *m, int T, uint64_t seed, int32_t *ids)
{
    gpu_rng r;
    gpu_rng_seed(&r, seed);
    for (int i = 0; i < T; i++) ids[i] = (int32_t)(gpu_rng_u64(&r) % (uint64_t)m->cfg.V);
}

/* The CPU's side: the prompt's hidden rows h ([T][H]) from the CPU forward, the head fed its
 * T-1 pairs, then k drafts from (h[T-1], next), each row's margin (top two logits apart, over
 * max|logit|) in margin[]. */
typedef struct cpu_ref {
    float *h;
    int32_t drafts[MAX_K];
    double margin[MAX_K];
} cpu_ref;

static bool cpu_reference(const qwen35_model *m, const int32_t *ids, int T, int32_t next, int k,
                          cpu_ref *out)
{
    const qwen35_config *c = &m->cfg;
    status st;
    qwen35_ctx *ctx = NULL;
    qwen35_state *s = NULL;
    qwen35_mtp_state *ms = NULL;
    float *logits = malloc((size_t)c->V * sizeof(float));
    float *g = malloc(2 * (size_t)c->H * sizeof(float));
    out->h = malloc((size_t)T * c->H * sizeof(float));
    bool ok = logits && g && out->h &&
              !qwen35_ctx_create(m, &(qwen35_ctx_opts){.max_tokens = 64, .n_threads = 0}, &ctx, &st) &&
              !qwen35_state_create(m, N_CTX, &s, &st) &&
              !qwen35_mtp_state_create(m, N_CTX, &ms, &st) &&
              !qwen35_prefill_hidden(ctx, s, ids, T, NULL, false, out->h, &st) &&
              (T == 1 || !qwen35_mtp_step(ctx, ms, out->h, ids + 1, T - 1, NULL, NULL, &st));
    const float *hin = out->h + (size_t)(T - 1) * c->H;
    int32_t tok = next;
    for (int i = 0; ok && i < k; i++) {
        float *gi = g + (size_t)(i & 1) * c->H;
        if (qwen35_mtp_step(ctx, ms, hin, &tok, 1, logits, gi, &st)) {
            ok = false;
            break;
        }
        int32_t best = 0;
        float b1 = -INFINITY, b2 = -INFINITY, amax = 0;
        for (int v = 0; v < c->V; v++) {
            const float x = logits[v];
            if (fabsf(x) > amax) amax = fabsf(x);
            if (x > b1) b2 = b1, b1 = x, best = v;
            else if (x > b2) b2 = x;
        }
        out->drafts[i] = tok = best;
        out->margin[i] = amax > 0 ? (double)(b1 - b2) / amax : 0;
        hin = gi;
    }
    if (!ok) printf("  cpu reference: %s\n", st.msg);
    qwen35_mtp_state_destroy(ms);
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    free(logits);
    free(g);
    return ok;
}

/* The slot's sequence: the T prompt rows through the GPU forward (the blocks the head's rows
 * lie in), nothing sampled. */
static bool gpu_prompt(fwd *f, int slot, const int32_t *ids, int T)
{
    status st;
    fwd_row *rows = calloc((size_t)T, sizeof *rows);
    bool ok = rows && !fwd_seq_start(f, slot, &k_greedy, &st);
    for (int i = 0; ok && i < T; i++)
        rows[i] = (fwd_row){.token = ids[i], .slot = slot, .pos = i, .prompt = true};
    for (int t0 = 0; ok && t0 < T; t0 += f->max_rows) { /* in steps of max_rows rows */
        const int n = T - t0 < f->max_rows ? T - t0 : f->max_rows;
        ok = !fwd_step(f, rows + t0, n, &st);
    }
    if (!ok) printf("  gpu prompt: %s\n", st.msg);
    free(rows);
    return ok;
}

/* feeds rows 0 .. T-2 of the CPU's hidden rows in pieces split at `split` (0: one feed) */
static bool gpu_feed(fwd *f, int slot, const qwen35_model *m, const float *h, const int32_t *ids,
                     int T, int split)
{
    status st;
    const size_t H = (size_t)m->cfg.H;
    const int n = T - 1;
    if (n < 1) return true;
    const int a = split > 0 && split < n ? split : n;
    if (fwd_mtp_feed(f, slot, 0, h, ids + 1, a, &st) ||
        (a < n && fwd_mtp_feed(f, slot, a, h + (size_t)a * H, ids + 1 + a, n - a, &st))) {
        printf("  feed: %s\n", st.msg);
        return false;
    }
    return true;
}

static bool gpu_draft(fwd *f, int slot, const qwen35_model *m, const float *h, int T,
                      int32_t next, int k, int32_t *drafts)
{
    status st;
    if (fwd_mtp_draft(f, slot, T - 1, h + (size_t)(T - 1) * m->cfg.H, next, k, drafts, &st)) {
        printf("  draft: %s\n", st.msg);
        return false;
    }
    return true;
}

/* the GPU's k drafts against the CPU's, up to the first near tie (counted in *near); each
 * draft's gap printed (a parting at a near tie too, not asserted); the drafts compared */
static int check_drafts(const char *name, int T, const int32_t *d, const cpu_ref *ref, int k,
                        int *near)
{
    int compared = 0;
    for (int i = 0; i < k; i++) {
        const bool same = d[i] == ref->drafts[i], tie = ref->margin[i] <= gate(i);
        printf("  %s: T %d k %d: draft %d: gap %.2e%s: %s\n", name, T, k, i, ref->margin[i],
               tie ? " (near tie)" : "", same ? "same" : "parted");
        if (tie) { /* the chains may part here */
            ++*near;
            break;
        }
        compared++;
        if (!same) printf("  %s: T %d k %d: draft %d: gpu %d, cpu %d\n", name, T, k, i, d[i],
                          ref->drafts[i]);
        CU_ASSERT(same);
        if (!same) break;
    }
    return compared;
}

static void test_drafts(void)
{
    if (!g_have_gpu) return;
    static const int lens[] = {1, 5, 37, T_LONG};
    for (int c = 0; c < g_models.n; c++) {
        const qwen35_model *m = g_models.m[c];
        fwd *f = make(m, MAX_K + 1);
        CU_ASSERT_FATAL(f != NULL);
        CU_ASSERT(fwd_has_mtp(f));
        int compared = 0, near = 0;
        for (int li = 0; li < (int)(sizeof lens / sizeof *lens); li++) {
            const int T = lens[li];
            int32_t ids[T_LONG];
            prompt_ids(m, T, 100 + (uint64_t)li, ids);
            const int32_t next = (int32_t)((ids[T - 1] * 7 + 3) % m->cfg.V);
            cpu_ref ref;
            CU_ASSERT_FATAL(cpu_reference(m, ids, T, next, MAX_K, &ref));
            for (int k = 1; k <= MAX_K; k += 3) {
                int32_t d[MAX_K];
                CU_ASSERT_FATAL(gpu_prompt(f, 0, ids, T));
                CU_ASSERT_FATAL(gpu_feed(f, 0, m, ref.h, ids, T, 0));
                CU_ASSERT_FATAL(gpu_draft(f, 0, m, ref.h, T, next, k, d));
                compared += check_drafts(g_models.name[c], T, d, &ref, k, &near);
            }
            free(ref.h);
        }
        printf("  %s: %d drafts compared, %d chains stopped at a near tie\n", g_models.name[c], compared,
               near);
        CU_ASSERT(compared > 0);
        fwd_destroy(f);
    }
}

/* a draft repeated: the same bits; the rows fed in two feeds, or over a draft's scratch rows:
 * the CPU's drafts */
static void test_feeds(void)
{
    if (!g_have_gpu) return;
    enum { T = T_LONG, K = 4 };
    for (int c = 0; c < g_models.n; c++) {
        const qwen35_model *m = g_models.m[c];
        fwd *f = make(m, K + 1);
        CU_ASSERT_FATAL(f != NULL);
        int32_t ids[T];
        prompt_ids(m, T, 7, ids);
        const int32_t next = 11 % m->cfg.V;
        cpu_ref ref;
        CU_ASSERT_FATAL(cpu_reference(m, ids, T, next, K, &ref));
        int32_t base[K], d[K];
        int near = 0;
        CU_ASSERT_FATAL(gpu_prompt(f, 0, ids, T) && gpu_feed(f, 0, m, ref.h, ids, T, 0) &&
                        gpu_draft(f, 0, m, ref.h, T, next, K, base));
        check_drafts(g_models.name[c], T, base, &ref, K, &near);
        /* again from the same position: its scratch rows rewritten, the same bits */
        CU_ASSERT_FATAL(gpu_draft(f, 0, m, ref.h, T, next, K, d));
        CU_ASSERT(!memcmp(d, base, sizeof d));
        /* two feeds, in the other slot */
        CU_ASSERT_FATAL(gpu_prompt(f, 1, ids, T) && gpu_feed(f, 1, m, ref.h, ids, T, 70) &&
                        gpu_draft(f, 1, m, ref.h, T, next, K, d));
        check_drafts(g_models.name[c], T, d, &ref, K, &near);
        /* a draft from the middle, then the rest fed over its scratch rows */
        status st;
        const int mid = 60;
        CU_ASSERT_FATAL(gpu_prompt(f, 1, ids, T) && gpu_feed(f, 1, m, ref.h, ids, mid + 1, 0));
        int32_t tmp[K];
        CU_ASSERT(!fwd_mtp_draft(f, 1, mid, ref.h + (size_t)mid * m->cfg.H, ids[mid + 1], K, tmp,
                                 &st));
        CU_ASSERT(!fwd_mtp_feed(f, 1, mid, ref.h + (size_t)mid * m->cfg.H, ids + mid + 1,
                                T - 1 - mid, &st));
        CU_ASSERT_FATAL(gpu_draft(f, 1, m, ref.h, T, next, K, d));
        check_drafts(g_models.name[c], T, d, &ref, K, &near);
        free(ref.h);
        fwd_destroy(f);
    }
}

static void expect(int rc, const status *st, int code, const char *what)
{
    printf("  %s: %s\n", what, st->msg);
    CU_ASSERT_EQUAL(rc, code);
}

static void test_errors(void)
{
    if (!g_have_gpu || !g_models.n) return;
    const qwen35_model *m = g_models.m[0];
    fwd *f = make(m, 3);
    CU_ASSERT_FATAL(f != NULL);
    enum { T = 8 };
    int32_t ids[T];
    prompt_ids(m, T, 3, ids);
    float *h = calloc((size_t)T * m->cfg.H, sizeof(float));
    CU_ASSERT_FATAL(h && gpu_prompt(f, 0, ids, T));
    int32_t d[MAX_K], bad = m->cfg.V;
    status st;
    expect(fwd_mtp_feed(f, 2, 0, h, ids, 1, &st), &st, STATUS_RANGE, "slot 2");
    expect(fwd_mtp_feed(f, 0, 0, h, ids, T + 1, &st), &st, STATUS_RANGE, "rows past the fed");
    expect(fwd_mtp_feed(f, 0, 0, h, &bad, 1, &st), &st, STATUS_RANGE, "token V");
    expect(fwd_mtp_feed(f, 0, 0, h, ids, 0, &st), &st, STATUS_RANGE, "0 rows");
    expect(fwd_mtp_draft(f, 0, T - 1, h, ids[0], 0, d, &st), &st, STATUS_RANGE, "k 0");
    expect(fwd_mtp_draft(f, 0, T - 1, h, ids[0], FWD_MAX_VERIFY_ROWS, d, &st), &st, STATUS_RANGE,
           "k 8");
    expect(fwd_mtp_draft(f, 0, T - 1, h, -1, 2, d, &st), &st, STATUS_RANGE, "token -1");
    expect(fwd_mtp_draft(f, 0, N_CTX - 2, h, ids[0], 2, d, &st), &st, STATUS_RANGE,
           "past the context");
    CU_ASSERT(!fwd_mtp_draft(f, 0, T - 1, h, ids[0], 2, d, &st)); /* and it still drafts */
    free(h);
    fwd_destroy(f);
    fwd *plain = make(m, 0); /* no verify runs: no head on the device */
    CU_ASSERT_FATAL(plain != NULL);
    CU_ASSERT(!fwd_has_mtp(plain));
    float h1[1] = {0};
    expect(fwd_mtp_feed(plain, 0, 0, h1, ids, 1, &st), &st, STATUS_UNSUPPORTED, "no head");
    fwd_destroy(plain);
}

static void test_models(void)
{
    const char *req = getenv("DS_REQUIRE_GPU");
    if (g_have_gpu && req && !strcmp(req, "1")) CU_ASSERT(g_models.n == 2);
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("the MTP head on CUDA");
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    if (g_have_gpu) find_models();
    CU_pSuite s = CU_add_suite("mtp_parity", NULL, NULL);
    CU_add_test(s, "models", test_models);
    CU_add_test(s, "drafts equal the CPU head's", test_drafts);
    CU_add_test(s, "feeds and drafts in any order", test_feeds);
    CU_add_test(s, "errors", test_errors);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    gpu_models_free(&g_models);
    if (g_synth[0]) unlink(g_synth);
    return failed ? 1 : 0;
}
