/* Verify runs and rollback on the CPU forward (model/fwd.h, speculative decoding), on the
 * reference models, ranks 1 and 2, KV blocks of 8 positions (a run crosses block edges):
 *  - a verify run of k+1 rows (k = 1..4) gives the logits, sampled tokens and final-norm outputs
 *    of k+1 one-row steps, bit for bit;
 *  - after a verify run, rollback to any of its positions continues bit-identically with a
 *    sequence that was fed only the rows up to there (greedy logits; and with a seeded sampler
 *    with penalties, the drawn tokens: the sampler's accepted tokens and RNG counter roll back);
 *  - errors by name: verify rows or a hidden output on a forward without verify runs, a run
 *    longer than verify_rows, a run mixing verify rows and others, rollback outside the last run
 *    (and after a later step);
 *  - a verify step and a rollback allocate nothing (malloc, calloc, realloc wrapped).
 * The first three again with the DeltaNet state stored as bf16 (fwd_opts.state_dtype): the kept
 * states and the one-row steps round S at the same rows, so everything stays bit for bit. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward_test_util.h"
#include "model/fwd.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/alloc_count.h"
#include "tests/testutil/testutil.h"

#define MAX_K 4
#define AFTER 6 /* steps after a rollback */

static ref_case case_list[REF_CASES_MAX];
static int N_CASES;
static qwen35_model *models[REF_CASES_MAX];
static ref_prompt *prompts[REF_CASES_MAX];
static int n_prompts[REF_CASES_MAX];

static const sampling_params GREEDY = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
static const sampling_params DRAWN = {.temperature = 0.9f, .top_p = 0.95f, .top_k = 40,
                                      .repetition_penalty = 1.3f, .presence_penalty = 0.4f,
                                      .penalty_window = 5, .seed = 1234};

static int setup(void)
{
    N_CASES = ref_cases_list(case_list, REF_CASES_MAX);
    if (N_CASES <= 0) {
        fprintf(stderr, "no reference cases (shared/reference, tests/reference)\n");
        return 1;
    }
    for (int c = 0; c < N_CASES; c++) {
        char path[4400];
        status st;
        ref_case_path(&case_list[c], ".gguf", path, sizeof path);
        if (qwen35_model_load(&models[c], path, &st)) {
            fprintf(stderr, "%s: %s\n", path, st.msg);
            return 1;
        }
        n_prompts[c] = forward_test_read_prompts_in(case_list[c].dir, case_list[c].name, &prompts[c]);
        if (n_prompts[c] <= 0) return 1;
        /* the cases' prompts, cut to what one 64-row run and a 128-position context leave room for */
        for (int i = 0; i < n_prompts[c]; i++)
            if (prompts[c][i].n_ids > 48) prompts[c][i].n_ids = 48;
    }
    return 0;
}

static int teardown(void)
{
    for (int c = 0; c < N_CASES; c++) {
        forward_test_free_prompts(prompts[c], n_prompts[c]);
        qwen35_model_free(models[c]);
    }
    return 0;
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

static fwd *make(const qwen35_model *m, int ranks, int verify_rows)
{
    fwd_opts o = {.n_slots = 2, .n_ctx = 128, .n_threads = 2, .ranks = ranks, .kv_block_tokens = 8,
                  .verify_rows = verify_rows, .state_dtype = g_state};
    fwd *f = NULL;
    status st;
    if (fwd_create("cpu", m, &o, &f, &st)) fprintf(stderr, "fwd_create: %s\n", st.msg);
    return f;
}

/* seq_start, then the prompt as one run (no sampling). */
static void start(fwd *f, int slot, const sampling_params *p, const int32_t *ids, int n)
{
    status st;
    CU_ASSERT_EQUAL_FATAL(fwd_seq_start(f, slot, p, &st), STATUS_OK);
    fwd_row rows[64];
    CU_ASSERT_FATAL(n <= 64);
    for (int i = 0; i < n; i++)
        rows[i] = (fwd_row){.token = ids[i], .slot = slot, .pos = i, .prompt = true};
    CU_ASSERT_EQUAL_FATAL(fwd_step(f, rows, n, &st), STATUS_OK);
}

/* One row a step: token at the slot's position, sampled, its logits (and, verify, h) out. */
static int32_t one(fwd *f, int slot, int32_t token, bool verify, float *logits, float *h)
{
    status st;
    fwd_row r = {.token = token, .slot = slot, .pos = fwd_n_past(f, slot), .sample = true,
                 .logits = logits, .verify = verify, .hidden = h};
    CU_ASSERT_EQUAL_FATAL(fwd_step(f, &r, 1, &st), STATUS_OK);
    return r.out.token;
}

/* A verify run of n rows toks[0..n) from the slot's position; tokens out, logits [n][V], h. */
static void verify(fwd *f, int slot, const int32_t *toks, int n, int32_t *out, float *logits,
                   float *h)
{
    const int V = f->vocab, H = f->model->cfg.H, p = fwd_n_past(f, slot);
    fwd_row rows[MAX_K + 1];
    for (int i = 0; i < n; i++)
        rows[i] = (fwd_row){.token = toks[i], .slot = slot, .pos = p + i, .sample = true,
                            .verify = true, .logits = logits ? logits + (size_t)i * V : NULL,
                            .hidden = h ? h + (size_t)i * H : NULL};
    status st;
    CU_ASSERT_EQUAL_FATAL(fwd_step(f, rows, n, &st), STATUS_OK);
    for (int i = 0; i < n; i++) out[i] = rows[i].out.token;
}

/* The continuation the tests feed: the reference greedy tokens, else the prompt again. */
static void drafts(const ref_prompt *p, int32_t *d, int n)
{
    for (int i = 0; i < n; i++) d[i] = i < p->n_greedy ? p->greedy[i] : p->ids[i % p->n_ids];
}

static void test_verify_equals_single_rows(void)
{
    for (int c = 0; c < N_CASES; c++)
        for (int ranks = 1; ranks <= 2; ranks++) {
            const qwen35_model *m = models[c];
            const int V = m->cfg.V, H = m->cfg.H;
            const ref_prompt *pr = &prompts[c][0];
            fwd *one_f = make(m, ranks, MAX_K + 1), *run_f = make(m, ranks, MAX_K + 1);
            CU_ASSERT_PTR_NOT_NULL_FATAL(one_f);
            CU_ASSERT_PTR_NOT_NULL_FATAL(run_f);
            float *l1 = malloc((size_t)(MAX_K + 1) * V * sizeof(float));
            float *l2 = malloc((size_t)(MAX_K + 1) * V * sizeof(float));
            float *l3 = malloc((size_t)(MAX_K + 1) * V * sizeof(float));
            float *h1 = malloc((size_t)(MAX_K + 1) * H * sizeof(float));
            float *h2 = malloc((size_t)(MAX_K + 1) * H * sizeof(float));
            int32_t toks[MAX_K + 1], t1[MAX_K + 1], t2[MAX_K + 1], t3[MAX_K + 1];
            drafts(pr, toks, MAX_K + 1);
            for (int k = 1; k <= MAX_K; k++) {
                /* plain one-row steps, one-row verify runs, one run of k+1 rows */
                start(one_f, 0, &GREEDY, pr->ids, pr->n_ids);
                start(one_f, 1, &GREEDY, pr->ids, pr->n_ids);
                start(run_f, 0, &GREEDY, pr->ids, pr->n_ids);
                for (int i = 0; i <= k; i++) {
                    t3[i] = one(one_f, 0, toks[i], false, l3 + (size_t)i * V, NULL);
                    t1[i] = one(one_f, 1, toks[i], true, l1 + (size_t)i * V, h1 + (size_t)i * H);
                }
                verify(run_f, 0, toks, k + 1, t2, l2, h2);
                CU_ASSERT(memcmp(l1, l3, (size_t)(k + 1) * V * sizeof(float)) == 0);
                CU_ASSERT(memcmp(l1, l2, (size_t)(k + 1) * V * sizeof(float)) == 0);
                CU_ASSERT(memcmp(h1, h2, (size_t)(k + 1) * H * sizeof(float)) == 0);
                CU_ASSERT(memcmp(t1, t2, (size_t)(k + 1) * sizeof(int32_t)) == 0);
                CU_ASSERT(memcmp(t1, t3, (size_t)(k + 1) * sizeof(int32_t)) == 0);
                CU_ASSERT_EQUAL(fwd_n_past(run_f, 0), pr->n_ids + k + 1);
                /* h is the lm_head's input: the greedy token is the argmax of h's logits */
                CU_ASSERT_EQUAL(t2[k], forward_test_argmax(l2 + (size_t)k * V, V));
            }
            free(l1), free(l2), free(l3), free(h1), free(h2);
            fwd_destroy(one_f);
            fwd_destroy(run_f);
        }
}

/* After a verify run of k+1 rows rolled back to keep a+1 of them, AFTER more steps (fed the
 * tokens the reference sampled) equal a sequence fed those a+1 rows one by one. */
static void rollback_case(const qwen35_model *m, const ref_prompt *pr, int ranks,
                          const sampling_params *sp)
{
    const int V = m->cfg.V;
    fwd *ref_f = make(m, ranks, MAX_K + 1), *spec_f = make(m, ranks, MAX_K + 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(ref_f);
    CU_ASSERT_PTR_NOT_NULL_FATAL(spec_f);
    float *lr = malloc((size_t)V * sizeof(float)), *ls = malloc((size_t)V * sizeof(float));
    int32_t toks[MAX_K + 1], out[MAX_K + 1];
    drafts(pr, toks, MAX_K + 1);
    for (int k = 1; k <= MAX_K; k++)
        for (int a = 0; a <= k; a++) {
            start(ref_f, 0, sp, pr->ids, pr->n_ids);
            start(spec_f, 0, sp, pr->ids, pr->n_ids);
            int32_t next_r = 0, next_s;
            for (int i = 0; i <= a; i++) next_r = one(ref_f, 0, toks[i], false, NULL, NULL);
            verify(spec_f, 0, toks, k + 1, out, NULL, NULL);
            next_s = out[a];
            CU_ASSERT_EQUAL(next_s, next_r);
            status st;
            const long before = testutil_allocs();
            CU_ASSERT_EQUAL(fwd_rollback(spec_f, 0, pr->n_ids + a + 1, &st), STATUS_OK);
            CU_ASSERT_EQUAL(testutil_allocs(), before);
            CU_ASSERT_EQUAL(fwd_n_past(spec_f, 0), pr->n_ids + a + 1);
            for (int s = 0; s < AFTER; s++) {
                const int32_t tr = one(ref_f, 0, next_r, false, lr, NULL);
                const int32_t ts = one(spec_f, 0, next_s, false, ls, NULL);
                CU_ASSERT_EQUAL(tr, ts);
                CU_ASSERT(memcmp(lr, ls, (size_t)V * sizeof(float)) == 0);
                next_r = tr, next_s = ts;
            }
        }
    free(lr), free(ls);
    fwd_destroy(ref_f);
    fwd_destroy(spec_f);
}

static void test_rollback_greedy(void)
{
    for (int c = 0; c < N_CASES; c++)
        for (int ranks = 1; ranks <= 2; ranks++) rollback_case(models[c], &prompts[c][0], ranks, &GREEDY);
}

static void test_rollback_sampled(void)
{
    const sampling_params p = sampling_params_resolve(&DRAWN);
    for (int c = 0; c < N_CASES; c++) rollback_case(models[c], &prompts[c][0], 1, &p);
}

static void test_errors(void)
{
    const qwen35_model *m = models[0];
    const ref_prompt *pr = &prompts[0][0];
    status st;
    fwd *plain = make(m, 1, 0), *f = make(m, 1, 3);
    CU_ASSERT_PTR_NOT_NULL_FATAL(plain);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    start(plain, 0, &GREEDY, pr->ids, pr->n_ids);
    start(f, 0, &GREEDY, pr->ids, pr->n_ids);
    const int p = pr->n_ids;
    fwd_row r = {.token = 1, .slot = 0, .pos = p, .sample = true, .verify = true};
    CU_ASSERT_EQUAL(fwd_step(plain, &r, 1, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "verify"));
    CU_ASSERT_EQUAL(fwd_rollback(plain, 0, p, &st), STATUS_RANGE);
    fwd_row rows[4];
    for (int i = 0; i < 4; i++)
        rows[i] = (fwd_row){.token = 1, .slot = 0, .pos = p + i, .sample = true, .verify = true};
    CU_ASSERT_EQUAL(fwd_step(f, rows, 4, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "longer than 3"));
    rows[1].verify = false;
    CU_ASSERT_EQUAL(fwd_step(f, rows, 3, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "mixes"));
    rows[1].verify = true;
    float h[4096];
    CU_ASSERT_FATAL(m->cfg.H <= 4096);
    fwd_row plain_row = {.token = 1, .slot = 0, .pos = p, .sample = true, .hidden = h};
    CU_ASSERT_EQUAL(fwd_step(plain, &plain_row, 1, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "hidden"));
    CU_ASSERT_EQUAL(fwd_n_past(f, 0), p); /* nothing ran */
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, p + 1, &st), STATUS_RANGE); /* no verify run yet */
    rows[1].verify = true;
    const long before = testutil_allocs();
    CU_ASSERT_EQUAL(fwd_step(f, rows, 3, &st), STATUS_OK);
    CU_ASSERT_EQUAL(testutil_allocs(), before);
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, p, &st), STATUS_RANGE);     /* before the run */
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, p + 4, &st), STATUS_RANGE); /* past it */
    CU_ASSERT_EQUAL(fwd_rollback(f, 1, p + 1, &st), STATUS_RANGE); /* another slot */
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, p + 2, &st), STATUS_OK);
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, p + 3, &st), STATUS_RANGE); /* only further back */
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, p + 1, &st), STATUS_OK);
    one(f, 0, 2, false, NULL, NULL);
    CU_ASSERT_EQUAL(fwd_rollback(f, 0, p + 1, &st), STATUS_RANGE); /* a step ended the run */
    fwd_opts bad = {.n_slots = 1, .n_ctx = 16, .verify_rows = FWD_MAX_VERIFY_ROWS + 1};
    fwd *g = NULL;
    CU_ASSERT_EQUAL(fwd_create("cpu", m, &bad, &g, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NULL(g);
    fwd_destroy(plain);
    fwd_destroy(f);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("fwd_verify", setup, teardown);
    CU_add_test(s, "a verify run equals one-row steps", test_verify_equals_single_rows);
    CU_add_test(s, "rollback continues bit-identically (greedy)", test_rollback_greedy);
    CU_add_test(s, "rollback restores the sampler (seeded draws)", test_rollback_sampled);
    CU_add_test(s, "errors", test_errors);
    CU_pSuite b = CU_add_suite("fwd_verify, bf16 state", setup_bf16, teardown_bf16);
    CU_add_test(b, "a verify run equals one-row steps", test_verify_equals_single_rows);
    CU_add_test(b, "rollback continues bit-identically (greedy)", test_rollback_greedy);
    CU_add_test(b, "rollback restores the sampler (seeded draws)", test_rollback_sampled);
    return testutil_cunit_run();
}
