/* Prefix reuse on the CPU forward (model/fwd.h snap_save / seq_resume, kv_pool adopt / retain /
 * drop) with the demo model (models/demo-en-17m.gguf) and the reference models (ref_cases.h),
 * KV blocks of 8 positions, ranks 1 and, on the models whose heads split over two (not the
 * demo model's 3 DeltaNet key heads), 2:
 *  - split invariance: a prompt fed in different passes (one row a step, chunks of 3, uneven
 *    splits, one pass) gives the same logits bit for bit;
 *  - resume parity: for every s in 1 .. P-1 (inside blocks and at block edges) a source slot
 *    feeds the prompt's first s tokens, saves a snapshot and ends with its blocks kept outside
 *    the tables (kv_pool_retain, as the prefix cache does); another slot resumes there and feeds
 *    the rest: every later row's logits equal the cold run's (memcmp) and the greedy
 *    continuation under a prompt-counting repetition penalty is the cold one; a second resume
 *    from the same snapshot gives the same again (the kept partial block was copied, not
 *    written); every block is back at the end;
 *  - snapshot sizing (snap_budget 0, < 0, > 0, smaller than one) and snap_bytes;
 *  - errors, each leaving the slot empty and the pool as it was: a bad snapshot, slot or n_pos,
 *    a block not held (full or partial), no block free for the partial copy;
 *  - snap_save and seq_resume allocate nothing (malloc, calloc, realloc wrapped).
 * Split invariance and resume parity again with the DeltaNet state stored as bf16
 * (fwd_opts.state_dtype): still bit for bit, S being rounded after every row whatever the
 * passes. */
#include <CUnit/Basic.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/fwd.h"
#include "tests/testutil/alloc_count.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

#define P 40   /* prompt tokens */
#define G 8    /* greedy tokens after it */
#define BT 8   /* positions per KV block */
#define NCTX 64

#define MAX_MODELS (REF_CASES_MAX + 1)

static qwen35_model *models[MAX_MODELS];
static char names[MAX_MODELS][128];
static int n_models;
/* the model under test (use_model) */
static qwen35_model *model;
static int V;
static int32_t prompt[P];
static sampling_params params; /* greedy, a repetition penalty that counts the prompt */

static int load(const char *path, const char *name)
{
    status st;
    if (qwen35_model_load(&models[n_models], path, &st)) {
        fprintf(stderr, "%s: %s\n", path, st.msg);
        return 1;
    }
    snprintf(names[n_models++], sizeof names[0], "%s", name);
    return 0;
}

static int setup(void)
{
    const char *root = getenv("DS_REPO_ROOT");
    char path[4400];
    snprintf(path, sizeof path, "models/demo-en-17m.gguf"); /* runfiles (//models:demo) */
    FILE *f = fopen(path, "rb");
    if (f) fclose(f);
    else if (root) snprintf(path, sizeof path, "%s/models/demo-en-17m.gguf", root);
    if (load(path, "demo-en-17m")) return 1;
    static ref_case cases[REF_CASES_MAX];
    const int n = ref_cases_list(cases, REF_CASES_MAX);
    for (int c = 0; c < n; c++) {
        ref_case_path(&cases[c], ".gguf", path, sizeof path);
        if (load(path, cases[c].name)) return 1;
    }
    params = sampling_params_resolve(&(sampling_params){.repetition_penalty = 1.3f,
                                                        .penalize_prompt = true});
    return 0;
}

static int teardown(void)
{
    for (int i = 0; i < n_models; i++) qwen35_model_free(models[i]);
    n_models = 0; /* the next suite's setup loads them again */
    return 0;
}

/* Model i under test, with a prompt of P ids of its vocabulary. */
static void use_model(int i)
{
    model = models[i];
    V = model->cfg.V;
    uint64_t rng = 2024;
    for (int k = 0; k < P; k++) prompt[k] = (int32_t)(testutil_rng_next(&rng) % (uint64_t)V);
}

/* Whether ranks split model's heads (fwd_create refuses with STATUS_UNSUPPORTED otherwise). */
static bool splits_over(int ranks)
{
    fwd *f = NULL;
    status st;
    const int rc = fwd_create("cpu", model, &(fwd_opts){.n_ctx = 8, .ranks = ranks, .n_threads = 1}, &f, &st);
    fwd_destroy(f);
    if (rc) CU_ASSERT_EQUAL(rc, STATUS_UNSUPPORTED);
    return rc == STATUS_OK;
}

static fwd_state_dtype g_state; /* the suite's */

static int setup_bf16(void)
{
    g_state = FWD_STATE_BF16;
    return setup();
}

static int teardown_bf16(void)
{
    g_state = FWD_STATE_F32;
    return teardown();
}

static fwd *make(int ranks, int kv_blocks, int64_t snap_budget)
{
    fwd *f = NULL;
    status st;
    if (fwd_create("cpu", model, &(fwd_opts){.n_slots = 4, .n_ctx = NCTX, .max_rows = 64,
                                             .ranks = ranks, .kv_block_tokens = BT,
                                             .kv_blocks = kv_blocks, .n_threads = 2,
                                             .snap_budget = snap_budget,
                                             .state_dtype = g_state},
                   &f, &st))
        fprintf(stderr, "fwd_create: %s\n", st.msg);
    return f;
}

/* Feeds prompt[from, to) to slot in passes of at most chunk rows, each row's logits into
 * lg[pos] ([NCTX][V]); the prompt's last row samples the first generated token (*first). */
static int32_t first_token;

static int feed(fwd *f, int slot, int from, int to, int chunk, float *lg)
{
    fwd_row rows[64];
    status st;
    for (int a = from; a < to; a += chunk) {
        const int n = to - a < chunk ? to - a : chunk;
        for (int k = 0; k < n; k++)
            rows[k] = (fwd_row){.token = prompt[a + k], .slot = slot, .pos = a + k, .prompt = true,
                                .sample = a + k == P - 1, .logits = lg + (size_t)(a + k) * V};
        if (fwd_step(f, rows, n, &st)) {
            fprintf(stderr, "feed: %s\n", st.msg);
            return st.code;
        }
        if (a + n == P) first_token = rows[n - 1].out.token;
    }
    return STATUS_OK;
}

/* After the whole prompt: G greedy tokens (the first sampled by the prompt's last row), each
 * decode row's logits into lg[pos]. */
static int generate(fwd *f, int slot, int32_t *out, float *lg)
{
    status st;
    out[0] = first_token;
    for (int g = 1; g < G; g++) {
        const int pos = fwd_n_past(f, slot);
        fwd_row row = {.token = out[g - 1], .slot = slot, .pos = pos, .sample = true,
                       .logits = lg + (size_t)pos * V};
        if (fwd_step(f, &row, 1, &st)) {
            fprintf(stderr, "generate: %s\n", st.msg);
            return st.code;
        }
        out[g] = row.out.token;
    }
    return STATUS_OK;
}

/* ---- split invariance ---- */

static void check_splits(int ranks)
{
    fwd *f = make(ranks, 0, 0);
    CU_ASSERT_FATAL(f != NULL);
    const size_t bytes = sizeof(float) * P * V;
    float *ref = malloc(sizeof(float) * NCTX * V), *got = malloc(sizeof(float) * NCTX * V);
    status st;
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &params, &st), 0);
    CU_ASSERT_EQUAL(feed(f, 0, 0, P, P, ref), 0);
    static const int splits[][3] = {{1, 0, 0}, {3, 0, 0}, {5, 35, 0}, {17, 23, 0}, {8, 9, 7}};
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
        CU_ASSERT_EQUAL(fwd_seq_start(f, 1, &params, &st), 0);
        if (splits[k][1] == 0) {
            CU_ASSERT_EQUAL(feed(f, 1, 0, P, splits[k][0], got), 0);
        } else { /* passes of the given lengths, the last one the rest */
            int at = 0;
            for (int i = 0; i < 3 && splits[k][i]; i++) {
                const int n = splits[k][i];
                CU_ASSERT_EQUAL(feed(f, 1, at, at + n, n, got), 0);
                at += n;
            }
            if (at < P) CU_ASSERT_EQUAL(feed(f, 1, at, P, P - at, got), 0);
        }
        if (memcmp(ref, got, bytes)) {
            int row = 0;
            while (row < P && !memcmp(ref + (size_t)row * V, got + (size_t)row * V, sizeof(float) * V)) row++;
            fprintf(stderr, "ranks %d split %zu: row %d differs from one pass\n", ranks, k, row);
            CU_FAIL("split changes the logits");
        }
    }
    fwd_destroy(f);
    free(ref), free(got);
}

static void test_split_invariance(void)
{
    int two = 0;
    for (int i = 0; i < n_models; i++) {
        use_model(i);
        check_splits(1);
        if (splits_over(2)) check_splits(2), two++;
    }
    CU_ASSERT(two >= 1);
}

/* ---- resume parity ---- */

/* The blocks of slot's first n_pos positions kept outside the tables (the prefix cache's hold),
 * then the slot ended. Returns the count. */
static int keep_and_end(fwd *f, int slot, int n_pos, int32_t *kept)
{
    const int n = (int)kv_pool_blocks_for(f->kv, n_pos);
    memcpy(kept, kv_pool_table(f->kv, slot), sizeof(int32_t) * (size_t)n);
    kv_pool_retain(f->kv, kept, n);
    fwd_seq_end(f, slot);
    return n;
}

static void check_resume(int ranks)
{
    fwd *f = make(ranks, 0, -1);
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(f->n_snaps, FWD_CPU_SNAPS_PER_SLOT * 4);
    float *cold = malloc(sizeof(float) * NCTX * V), *warm = malloc(sizeof(float) * NCTX * V);
    int32_t cold_out[G], warm_out[G];
    status st;
    const uint32_t total = kv_pool_total_blocks(f->kv);
    /* cold: the whole prompt in one pass, then G tokens */
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &params, &st), 0);
    CU_ASSERT_EQUAL(feed(f, 0, 0, P, P, cold), 0);
    CU_ASSERT_EQUAL(generate(f, 0, cold_out, cold), 0);
    fwd_seq_end(f, 0);
    int bad = 0;
    for (int s = 1; s < P && !bad; s++) {
        /* the source: s tokens, a snapshot, its blocks kept, the slot ended */
        CU_ASSERT_EQUAL(fwd_seq_start(f, 1, &params, &st), 0);
        CU_ASSERT_EQUAL(feed(f, 1, 0, s, s, warm), 0);
        const int snap = s % f->n_snaps;
        CU_ASSERT_EQUAL(fwd_snap_save(f, 1, snap, &st), 0);
        int32_t kept[NCTX / BT];
        const int n_kept = keep_and_end(f, 1, s, kept);
        for (int again = 0; again < 2; again++) {
            const int slot = 2 + again;
            memset(warm, 0, sizeof(float) * NCTX * V);
            const fwd_prefix x = {.snap = snap, .n_pos = s, .blocks = kept, .tokens = prompt};
            const long allocs = testutil_allocs();
            CU_ASSERT_EQUAL(fwd_seq_resume(f, slot, &params, &x, &st), 0);
            CU_ASSERT_EQUAL(testutil_allocs(), allocs);
            CU_ASSERT_EQUAL(fwd_n_past(f, slot), s);
            CU_ASSERT_EQUAL(kv_pool_held(f->kv, slot), n_kept);
            for (int b = 0; b < s / BT; b++) CU_ASSERT_EQUAL(kv_pool_table(f->kv, slot)[b], kept[b]);
            if (s % BT) CU_ASSERT_NOT_EQUAL(kv_pool_table(f->kv, slot)[s / BT], kept[s / BT]);
            CU_ASSERT_EQUAL(feed(f, slot, s, P, P - s, warm), 0);
            CU_ASSERT_EQUAL(generate(f, slot, warm_out, warm), 0);
            const size_t from = (size_t)s * V, n = (size_t)(P + G - 1 - s) * V;
            if (memcmp(cold + from, warm + from, n * sizeof(float)) ||
                memcmp(cold_out, warm_out, sizeof cold_out)) {
                fprintf(stderr, "ranks %d: resume at %d (time %d) differs from cold\n", ranks, s, again);
                bad++;
            }
            fwd_seq_end(f, slot);
        }
        kv_pool_drop(f->kv, kept, n_kept);
        CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), total);
    }
    CU_ASSERT_EQUAL(bad, 0);
    printf("\n      ranks %d: resumed at 1..%d, greedy", ranks, P - 1);
    for (int g = 0; g < G; g++) printf(" %d", cold_out[g]);
    fwd_destroy(f);
    free(cold), free(warm);
}

static void test_resume_parity(void)
{
    int two = 0;
    for (int i = 0; i < n_models; i++) {
        use_model(i);
        printf("\n    %s:", names[i]);
        check_resume(1);
        if (splits_over(2)) check_resume(2), two++;
    }
    CU_ASSERT(two >= 1);
}

/* ---- sizing ---- */

static void test_snap_sizing(void)
{
    int i = 0;
    while (i < n_models && (use_model(i), !splits_over(2))) i++;
    CU_ASSERT_FATAL(i < n_models);
    const uint64_t one = qwen35_state_recurrent_bytes(model);
    fwd *f = make(1, 0, 0);
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(f->n_snaps, 0);
    CU_ASSERT_EQUAL(f->snap_bytes, one);
    status st;
    CU_ASSERT_EQUAL(fwd_snap_save(f, 0, 0, &st), STATUS_RANGE);
    fwd_destroy(f);
    f = make(1, 0, (int64_t)(3 * one + one / 2));
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(f->n_snaps, 3);
    fwd_destroy(f);
    f = make(1, 0, (int64_t)one - 1);
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(f->n_snaps, 0);
    fwd_destroy(f);
    f = make(2, 0, -1); /* two ranks: the shards' states, every rank together */
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_EQUAL(f->n_snaps, FWD_CPU_SNAPS_PER_SLOT * 4);
    CU_ASSERT_EQUAL(f->snap_bytes, one);
    fwd_destroy(f);
}

/* ---- errors ---- */

/* The slot is empty and the pool as it was. */
static void check_empty(fwd *f, int slot, uint32_t free_before)
{
    CU_ASSERT_EQUAL(fwd_n_past(f, slot), 0);
    CU_ASSERT_EQUAL(kv_pool_held(f->kv, slot), 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), free_before);
}

static void test_errors(void)
{
    use_model(0);
    /* 6 blocks: a kept prefix of 20 positions holds 3 (2 full, 1 partial) */
    fwd *f = make(1, 6, -1);
    CU_ASSERT_FATAL(f != NULL);
    float *lg = malloc(sizeof(float) * NCTX * V);
    status st;
    CU_ASSERT_EQUAL(fwd_seq_start(f, 0, &params, &st), 0);
    CU_ASSERT_EQUAL(feed(f, 0, 0, 20, 20, lg), 0);
    CU_ASSERT_EQUAL(fwd_snap_save(f, 0, 1, &st), 0);
    CU_ASSERT_EQUAL(fwd_snap_save(f, 0, f->n_snaps, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(fwd_snap_save(f, 4, 0, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(fwd_snap_save(f, -1, 0, &st), STATUS_RANGE);
    int32_t kept[3];
    CU_ASSERT_EQUAL(keep_and_end(f, 0, 20, kept), 3);
    uint32_t free_before = kv_pool_free_blocks(f->kv);
    CU_ASSERT_EQUAL(free_before, 3);
    fwd_prefix x = {.snap = 1, .n_pos = 20, .blocks = kept, .tokens = prompt};
    /* a slot that held a sequence: an error leaves it empty */
    const fwd_prefix bad_snaps[] = {{.snap = -1, .n_pos = 20, .blocks = kept, .tokens = prompt},
                                    {.snap = f->n_snaps, .n_pos = 20, .blocks = kept, .tokens = prompt},
                                    {.snap = 1, .n_pos = 0, .blocks = kept, .tokens = prompt},
                                    {.snap = 1, .n_pos = NCTX, .blocks = kept, .tokens = prompt}};
    for (size_t k = 0; k < sizeof bad_snaps / sizeof bad_snaps[0]; k++) {
        CU_ASSERT_EQUAL(fwd_seq_start(f, 1, &params, &st), 0);
        CU_ASSERT_EQUAL(feed(f, 1, 0, 3, 3, lg), 0);
        free_before = kv_pool_free_blocks(f->kv) + 1; /* slot 1's block comes back */
        CU_ASSERT_EQUAL(fwd_seq_resume(f, 1, &params, &bad_snaps[k], &st), STATUS_RANGE);
        check_empty(f, 1, free_before);
    }
    CU_ASSERT_EQUAL(fwd_seq_resume(f, 4, &params, &x, &st), STATUS_RANGE);
    free_before = kv_pool_free_blocks(f->kv);
    /* a full block not held, then the partial one */
    int32_t free_id = -1;
    for (int32_t b = 0; b < 6 && free_id < 0; b++)
        if (kv_pool_refs(f->kv, b) == 0) free_id = b;
    CU_ASSERT_FATAL(free_id >= 0);
    for (int k = 0; k < 3; k++) {
        int32_t blocks[3] = {kept[0], kept[1], kept[2]};
        blocks[k] = free_id;
        fwd_prefix y = x;
        y.blocks = blocks;
        CU_ASSERT_EQUAL(fwd_seq_resume(f, 2, &params, &y, &st), STATUS_INVALID);
        check_empty(f, 2, free_before);
        for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(f->kv, kept[i]), 1);
    }
    /* no block free for the partial copy: slot 3 takes the 3 free ones */
    CU_ASSERT_EQUAL(kv_pool_ensure(f->kv, 3, 3 * BT, &st), 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), 0);
    CU_ASSERT_EQUAL(fwd_seq_resume(f, 2, &params, &x, &st), STATUS_EXHAUSTED);
    printf("\n    %s", st.msg);
    check_empty(f, 2, 0);
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(f->kv, kept[i]), 1);
    /* at a block edge no copy is needed: the resume goes through */
    fwd_prefix edge = x;
    edge.n_pos = 16;
    CU_ASSERT_EQUAL(fwd_seq_resume(f, 2, &params, &edge, &st), 0);
    CU_ASSERT_EQUAL(fwd_n_past(f, 2), 16);
    CU_ASSERT_EQUAL(kv_pool_held(f->kv, 2), 2);
    fwd_seq_end(f, 2);
    /* with a block free again the partial copy works */
    fwd_seq_end(f, 3);
    CU_ASSERT_EQUAL(fwd_seq_resume(f, 2, &params, &x, &st), 0);
    CU_ASSERT_EQUAL(fwd_n_past(f, 2), 20);
    fwd_seq_end(f, 2);
    kv_pool_drop(f->kv, kept, 3);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(f->kv), kv_pool_total_blocks(f->kv));
    /* no snapshots: every resume is out of range */
    fwd *g = make(1, 0, 0);
    CU_ASSERT_FATAL(g != NULL);
    x.snap = 0;
    CU_ASSERT_EQUAL(fwd_seq_resume(g, 0, &params, &x, &st), STATUS_RANGE);
    fwd_destroy(g);
    fwd_destroy(f);
    free(lg);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("fwd_prefix", setup, teardown);
    CU_add_test(s, "split_invariance", test_split_invariance);
    CU_add_test(s, "resume_parity", test_resume_parity);
    CU_add_test(s, "snap_sizing", test_snap_sizing);
    CU_add_test(s, "errors", test_errors);
    CU_pSuite b = CU_add_suite("fwd_prefix, bf16 state", setup_bf16, teardown_bf16);
    CU_add_test(b, "split_invariance", test_split_invariance);
    CU_add_test(b, "resume_parity", test_resume_parity);
    return testutil_cunit_run();
}
