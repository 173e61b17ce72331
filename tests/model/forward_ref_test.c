/* The CPU forward pass against the Hugging Face reference cases (every case of ref_cases.h:
 * shared/reference when present, and the repository's tests/reference): every row
 * of teacher-forced logits within 1e-3·max|logit| in prefill (chunked and token-by-token delta
 * rule, one step or many small steps) and in prefill-then-decode; greedy decoding reproduces
 * HF's greedy ids exactly; and the engine's own invariants: prefill+decode == longer prefill,
 * chunked == recurrent at chunk boundaries, batched decode == one-by-one decode, state copy,
 * error codes leaving the state untouched. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward_test_util.h"
#include "model/forward.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

#define REF_TOL 1e-3 /* the reference criterion: max|Δ| <= 1e-3 · max|logit| per row */
#define SELF_TOL 1e-4

static ref_case case_list[REF_CASES_MAX];
static const char *cases[REF_CASES_MAX]; /* names, for the messages */
static int N_CASES;

static qwen35_model *models[REF_CASES_MAX];
static ref_prompt *prompts[REF_CASES_MAX];
static int n_prompts[REF_CASES_MAX];
static qwen35_ctx *ctx_big[REF_CASES_MAX];   /* max_tokens 512, max_batch 8 */
static qwen35_ctx *ctx_small[REF_CASES_MAX]; /* max_tokens 7: many prefill steps */

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
        cases[c] = case_list[c].name;
        printf("\n    case %s in %s", cases[c], case_list[c].dir);
        ref_case_path(&case_list[c], ".gguf", path, sizeof path);
        if (qwen35_model_load(&models[c], path, &st)) {
            fprintf(stderr, "load %s: %s\n", path, st.msg);
            return 1;
        }
        n_prompts[c] = forward_test_read_prompts_in(case_list[c].dir, cases[c], &prompts[c]);
        if (n_prompts[c] <= 0) return 1;
        if (qwen35_ctx_create(models[c], &(qwen35_ctx_opts){.max_batch = 8, .max_tokens = 512, .n_threads = 2},
                              &ctx_big[c], &st) ||
            qwen35_ctx_create(models[c], &(qwen35_ctx_opts){.max_batch = 1, .max_tokens = 7, .n_threads = 2},
                              &ctx_small[c], &st)) {
            fprintf(stderr, "ctx: %s\n", st.msg);
            return 1;
        }
    }
    return 0;
}

static int teardown(void)
{
    for (int c = 0; c < N_CASES; c++) {
        qwen35_ctx_destroy(ctx_big[c]);
        qwen35_ctx_destroy(ctx_small[c]);
        forward_test_free_prompts(prompts[c], n_prompts[c]);
        qwen35_model_free(models[c]);
    }
    return 0;
}


/* Teacher-forced logits of all rows: prefill of the first n_pre ids, then decode one by one. */
static int run_rows(qwen35_ctx *ctx, qwen35_model *m, const int32_t *ids, int T, int n_pre,
                    float *logits)
{
    qwen35_state *s;
    status st;
    if (qwen35_state_create(m, T + 4, &s, &st)) return -1;
    int rc = n_pre ? qwen35_prefill(ctx, s, ids, n_pre, logits, true, &st) : 0;
    for (int t = n_pre; t < T && !rc; t++)
        rc = qwen35_decode_batch(ctx, &s, ids + t, 1, logits + (long)t * m->cfg.V, &st);
    if (rc) fprintf(stderr, "run_rows: %s\n", st.msg);
    if (!rc && s->n_past != T) rc = -1;
    qwen35_state_destroy(s);
    return rc;
}

static void check_reference(int n_pre_mode, qwen35_gdn_mode mode, bool small)
{
    for (int c = 0; c < N_CASES; c++) {
        qwen35_ctx *ctx = small ? ctx_small[c] : ctx_big[c];
        qwen35_ctx_set_gdn_mode(ctx, mode);
        for (int i = 0; i < n_prompts[c]; i++) {
            const ref_prompt *p = &prompts[c][i];
            CU_ASSERT_EQUAL_FATAL(p->V, models[c]->cfg.V);
            int32_t *ids = forward_test_full_ids(p);
            float *lg = malloc(sizeof(float) * p->rows * p->V);
            int n_pre = n_pre_mode < 0 ? p->rows : n_pre_mode == 0 ? p->n_ids : n_pre_mode;
            CU_ASSERT_EQUAL(run_rows(ctx, models[c], ids, p->rows, n_pre, lg), 0);
            double rel = forward_test_rows_rel(lg, p->logits, p->rows, p->V);
            printf("\n    %s prompt %d (%d rows, prefill %d, %s%s): worst row rel %.3g", cases[c], i,
                   p->rows, n_pre, mode == QWEN35_GDN_CHUNKED ? "chunked" : "recurrent",
                   small ? ", 7-token steps" : "", rel);
            CU_ASSERT(rel <= REF_TOL);
            free(lg), free(ids);
        }
        qwen35_ctx_set_gdn_mode(ctx, QWEN35_GDN_CHUNKED);
    }
}

static void test_prefill_chunked(void) { check_reference(-1, QWEN35_GDN_CHUNKED, false); }
static void test_prefill_recurrent(void) { check_reference(-1, QWEN35_GDN_RECURRENT, false); }
static void test_prefill_small_steps(void) { check_reference(-1, QWEN35_GDN_CHUNKED, true); }
static void test_prompt_then_decode(void) { check_reference(0, QWEN35_GDN_CHUNKED, false); }
static void test_decode_only(void) { check_reference(1, QWEN35_GDN_CHUNKED, false); }

static void test_greedy(void)
{
    for (int c = 0; c < N_CASES; c++)
        for (int i = 0; i < n_prompts[c]; i++) {
            const ref_prompt *p = &prompts[c][i];
            qwen35_state *s;
            status st;
            CU_ASSERT_FATAL(qwen35_state_create(models[c], p->rows + 1, &s, &st) == STATUS_OK);
            float *lg = malloc(sizeof(float) * p->V);
            CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[c], s, p->ids, p->n_ids, lg, false, &st), 0);
            int match = 0;
            for (int g = 0; g < p->n_greedy; g++) {
                int32_t tok = forward_test_argmax(lg, p->V);
                if (tok != p->greedy[g]) break;
                match++;
                CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[c], &s, &tok, 1, lg, &st), 0);
            }
            if (match != p->n_greedy)
                fprintf(stderr, "%s prompt %d: greedy diverges at %d\n", cases[c], i, match);
            CU_ASSERT_EQUAL(match, p->n_greedy);
            free(lg);
            qwen35_state_destroy(s);
        }
}

/* prefill(a) then prefill(b) then decodes == prefill(a ++ b ++ ...) on the engine itself. */
static void test_split_equals_whole(void)
{
    for (int c = 0; c < N_CASES; c++) {
        const ref_prompt *p = &prompts[c][n_prompts[c] - 1];
        int32_t *ids = forward_test_full_ids(p);
        int T = p->rows, V = p->V;
        float *whole = malloc(sizeof(float) * T * V), *split = malloc(sizeof(float) * T * V);
        CU_ASSERT_EQUAL(run_rows(ctx_big[c], models[c], ids, T, T, whole), 0);
        qwen35_state *s;
        status st;
        CU_ASSERT_FATAL(qwen35_state_create(models[c], T, &s, &st) == 0);
        int a = T / 3, b = T / 3 + 5;
        CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[c], s, ids, a, split, true, &st), 0);
        CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[c], s, ids + a, b - a, split + (long)a * V, true, &st), 0);
        for (int t = b; t < T; t++)
            CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[c], &s, ids + t, 1, split + (long)t * V, &st), 0);
        double rel = forward_test_rows_rel(split, whole, T, V);
        printf("\n    %s: split vs whole prefill worst row rel %.3g", cases[c], rel);
        CU_ASSERT(rel <= SELF_TOL);
        /* last-token logits of a prefill equal the last row of all_logits (not bit for bit: a
         * one-row lm_head takes the matmul's dot path, many rows its tile path) */
        qwen35_state_reset(s);
        float *last = malloc(sizeof(float) * V);
        CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[c], s, ids, T, last, false, &st), 0);
        CU_ASSERT(forward_test_rows_rel(last, whole + (long)(T - 1) * V, 1, V) <= 1e-5);
        free(last), free(whole), free(split), free(ids);
        qwen35_state_destroy(s);
    }
}

/* chunked vs token-by-token delta rule on a long pseudo-random id sequence at T around the
 * chunk size: all logits within 1e-4 relative per row. */
static void test_chunked_vs_recurrent(void)
{
    static const int Ts[] = {1, 63, 64, 65, 200};
    for (int c = 0; c < N_CASES; c++) {
        int V = models[c]->cfg.V;
        int32_t ids[200];
        uint64_t x = 12345;
        for (int i = 0; i < 200; i++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            ids[i] = (int32_t)((x >> 33) % (uint64_t)V);
        }
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            int T = Ts[k];
            float *a = malloc(sizeof(float) * T * V), *b = malloc(sizeof(float) * T * V);
            qwen35_ctx_set_gdn_mode(ctx_big[c], QWEN35_GDN_CHUNKED);
            CU_ASSERT_EQUAL(run_rows(ctx_big[c], models[c], ids, T, T, a), 0);
            qwen35_ctx_set_gdn_mode(ctx_big[c], QWEN35_GDN_RECURRENT);
            CU_ASSERT_EQUAL(run_rows(ctx_big[c], models[c], ids, T, T, b), 0);
            qwen35_ctx_set_gdn_mode(ctx_big[c], QWEN35_GDN_CHUNKED);
            double rel = forward_test_rows_rel(a, b, T, V);
            printf("\n    %s T=%d: chunked vs recurrent worst row rel %.3g", cases[c], T, rel);
            CU_ASSERT(rel <= SELF_TOL);
            free(a), free(b);
        }
    }
}

/* B sequences decoded together == each decoded alone (B=2 uses the per-row dot path of the
 * matmul, B=5 the tile path). */
static void check_batch(int c, int B)
{
    qwen35_model *m = models[c];
    int V = m->cfg.V, steps = 6;
    qwen35_state *sb[8], *s1[8];
    status st;
    float *lb = malloc(sizeof(float) * B * V), *l1 = malloc(sizeof(float) * V);
    for (int b = 0; b < B; b++) {
        const ref_prompt *p = &prompts[c][b % n_prompts[c]];
        int n = p->n_ids - b % 2 > 0 ? p->n_ids - b % 2 : p->n_ids; /* differing lengths */
        CU_ASSERT_FATAL(qwen35_state_create(m, p->n_ids + steps, &sb[b], &st) == 0);
        CU_ASSERT_FATAL(qwen35_state_create(m, p->n_ids + steps, &s1[b], &st) == 0);
        CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[c], sb[b], p->ids, n, NULL, false, &st), 0);
        qwen35_state_copy(s1[b], sb[b]);
    }
    double worst = 0;
    for (int step = 0; step < steps; step++) {
        int32_t toks[8];
        for (int b = 0; b < B; b++) toks[b] = (int32_t)((b * 37 + step * 11) % V);
        CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[c], sb, toks, B, lb, &st), 0);
        for (int b = 0; b < B; b++) {
            CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[c], &s1[b], &toks[b], 1, l1, &st), 0);
            worst = fmax(worst, forward_test_rows_rel(lb + (long)b * V, l1, 1, V));
        }
    }
    printf("\n    %s B=%d: batched vs single worst rel %.3g", cases[c], B, worst);
    CU_ASSERT(worst <= 1e-5);
    for (int b = 0; b < B; b++) qwen35_state_destroy(sb[b]), qwen35_state_destroy(s1[b]);
    free(lb), free(l1);
}

static void test_batch_decode(void)
{
    for (int c = 0; c < N_CASES; c++) {
        check_batch(c, 2);
        check_batch(c, 5);
    }
}

static void test_state_copy_and_errors(void)
{
    qwen35_model *m = models[0];
    const ref_prompt *p = &prompts[0][0];
    int V = m->cfg.V;
    status st;
    qwen35_state *a, *b, *tiny;
    CU_ASSERT_FATAL(qwen35_state_create(m, 64, &a, &st) == 0);
    CU_ASSERT_FATAL(qwen35_state_create(m, 64, &b, &st) == 0);
    CU_ASSERT_FATAL(qwen35_state_create(m, 3, &tiny, &st) == 0);
    CU_ASSERT(qwen35_state_bytes(m, 65) > qwen35_state_bytes(m, 64));
    CU_ASSERT_EQUAL(qwen35_state_bytes(m, 64), qwen35_state_bytes(m, 3)); /* whole KV blocks */
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[0], a, p->ids, p->n_ids, NULL, false, &st), 0);
    qwen35_state_copy(b, a);
    CU_ASSERT_EQUAL(b->n_past, p->n_ids);
    int32_t t = 5;
    CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[0], &a, &t, 1, la, &st), 0);
    CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[0], &b, &t, 1, lb, &st), 0);
    CU_ASSERT_EQUAL(memcmp(la, lb, sizeof(float) * V), 0);

    /* errors leave the state untouched */
    int n_past = a->n_past;
    int32_t bad[3] = {1, V, 2};
    CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[0], a, bad, 3, la, false, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "index 1"));
    int32_t neg = -1;
    CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[0], &a, &neg, 1, la, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[0], a, bad, 0, la, false, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(a->n_past, n_past);
    qwen35_state *many[9] = {a, b};
    int32_t toks[9] = {0};
    CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[0], many, toks, 9, NULL, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[0], many, toks, 0, NULL, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[0], tiny, p->ids, 4, NULL, false, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(tiny->n_past, 0);
    CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[0], tiny, p->ids, 3, NULL, false, &st), 0);
    CU_ASSERT_EQUAL(qwen35_decode_batch(ctx_big[0], &tiny, toks, 1, NULL, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(tiny->n_past, 3);
    /* reset forgets the sequence: the same prompt gives the same logits again */
    qwen35_state_reset(tiny);
    CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[0], tiny, p->ids, 3, la, false, &st), 0);
    qwen35_state_reset(tiny);
    CU_ASSERT_EQUAL(qwen35_prefill(ctx_big[0], tiny, p->ids, 3, lb, false, &st), 0);
    CU_ASSERT_EQUAL(memcmp(la, lb, sizeof(float) * V), 0);
    free(la), free(lb);
    qwen35_state_destroy(a), qwen35_state_destroy(b), qwen35_state_destroy(tiny);
}

/* The reference check can fail: the same prompt through a model with one DeltaNet weight
 * swapped (dt_bias <-> ssm_a of layer 0) must miss the reference by far more than 1e-3. */
static void test_check_can_fail(void)
{
    qwen35_model *broken = malloc(sizeof *broken);
    *broken = *models[0]; /* shares the mapping; freed with free(), not qwen35_model_free */
    const float *t = broken->layers[0].dt_bias;
    broken->layers[0].dt_bias = broken->layers[0].ssm_a;
    broken->layers[0].ssm_a = t;
    qwen35_ctx *ctx;
    status st;
    CU_ASSERT_FATAL(qwen35_ctx_create(broken, NULL, &ctx, &st) == 0);
    const ref_prompt *p = &prompts[0][0];
    int32_t *ids = forward_test_full_ids(p);
    float *lg = malloc(sizeof(float) * p->rows * p->V);
    CU_ASSERT_EQUAL(run_rows(ctx, broken, ids, p->rows, p->rows, lg), 0);
    double rel = forward_test_rows_rel(lg, p->logits, p->rows, p->V);
    printf("\n    broken model: worst row rel %.3g", rel);
    CU_ASSERT(rel > 10 * REF_TOL);
    free(lg), free(ids), free(broken);
    qwen35_ctx_destroy(ctx);
}

/* The shapes of the known cases, per shared/reference/README.md and tests/reference/README.md
 * (a case found under another name is only run, not checked here). */
static void test_config(void)
{
    int i = ref_cases_find(case_list, N_CASES, "tiny-r2-tied");
    if (i >= 0) {
        const qwen35_config *c = &models[i]->cfg;
        CU_ASSERT(c->H == 256 && c->n_layer == 4 && c->n_gdn_layers == 3 && c->n_attn_layers == 1);
        CU_ASSERT(c->n_h == 4 && c->n_kv == 2 && c->d_h == 64 && c->n_k == 2 && c->n_v == 4);
        CU_ASSERT(c->d_k == 64 && c->d_v == 64 && c->F == 768 && c->V == 1029 && c->tied);
        CU_ASSERT(c->n_rot == 16 && c->K_conv == 4 && c->C == 2 * 2 * 64 + 4 * 64);
        CU_ASSERT(c->recurrent[0] && c->recurrent[2] && !c->recurrent[3]);
        CU_ASSERT(models[i]->output.data == models[i]->tok_embd.data);
    }
    if ((i = ref_cases_find(case_list, N_CASES, "tiny-r1-untied")) >= 0) {
        const qwen35_config *c = &models[i]->cfg;
        CU_ASSERT(c->H == 256 && c->n_layer == 8 && c->n_gdn_layers == 6 && c->n_attn_layers == 2);
        CU_ASSERT(c->n_h == 2 && c->n_kv == 1 && c->n_k == 4 && c->n_v == 4 && c->d_k == 32);
        CU_ASSERT(c->F == 256 && c->V == 773 && !c->tied && !c->recurrent[7] && c->recurrent[4]);
        CU_ASSERT(models[i]->output.data != models[i]->tok_embd.data);
    }
    if ((i = ref_cases_find(case_list, N_CASES, "tiny-r3-gqa3")) >= 0) {
        const qwen35_config *c = &models[i]->cfg; /* GQA 3, 3 V heads per K head */
        CU_ASSERT(c->H == 128 && c->n_layer == 8 && c->n_gdn_layers == 6 && c->n_attn_layers == 2);
        CU_ASSERT(c->n_h == 6 && c->n_kv == 2 && c->d_h == 64 && c->n_k == 2 && c->n_v == 6);
        CU_ASSERT(c->d_k == 32 && c->d_v == 32 && c->F == 256 && c->V == 1005 && !c->tied);
        CU_ASSERT(c->n_rot == 16 && c->C == 2 * 2 * 32 + 6 * 32);
        CU_ASSERT(c->recurrent[0] && !c->recurrent[3] && c->recurrent[4] && !c->recurrent[7]);
        CU_ASSERT(models[i]->output.data != models[i]->tok_embd.data);
    }
    /* every case: the prompts fit the contexts of setup() */
    for (int c = 0; c < N_CASES; c++)
        for (int k = 0; k < n_prompts[c]; k++) CU_ASSERT(prompts[c][k].rows + 4 <= 512);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("forward_ref", setup, teardown);
    CU_add_test(s, "config", test_config);
    CU_add_test(s, "prefill_chunked", test_prefill_chunked);
    CU_add_test(s, "prefill_recurrent", test_prefill_recurrent);
    CU_add_test(s, "prefill_small_steps", test_prefill_small_steps);
    CU_add_test(s, "prompt_then_decode", test_prompt_then_decode);
    CU_add_test(s, "decode_only", test_decode_only);
    CU_add_test(s, "greedy", test_greedy);
    CU_add_test(s, "split_equals_whole", test_split_equals_whole);
    CU_add_test(s, "chunked_vs_recurrent", test_chunked_vs_recurrent);
    CU_add_test(s, "batch_decode", test_batch_decode);
    CU_add_test(s, "state_copy_and_errors", test_state_copy_and_errors);
    CU_add_test(s, "check_can_fail", test_check_can_fail);
    return testutil_cunit_run();
}
