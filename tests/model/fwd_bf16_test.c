/* The DeltaNet state stored as bf16 (fwd_opts.state_dtype) on the CPU forward, against the F32
 * state, every row's logits of a prompt and its reference greedy continuation fed
 * teacher-forced in one run, as max|Δlogit| / max|logit| of the row:
 *  - the demo model (models/demo-en-17m.gguf, trained weights): every row within DEMO_BOUND, and
 *    the greedy continuation of each of its reference prompts (models/demo-en-17m.json) the F32
 *    state's, token for token;
 *  - the reference models (ref_cases.h, random weights: their logits are flat, |logit| <= ~4,
 *    and they amplify a perturbation of the state; measured: rows ~1-2% off on average, the
 *    worst 10-35%): the mean over rows within REF_MEAN_BOUND and every row within
 *    REF_ROW_BOUND, a guard against a broken state (garbage is off by ~100%), not a precision
 *    claim;
 *  - either way not bit-identical to the F32 state's (the rounding does happen), and a copy with
 *    one logit moved by 5% of the row's largest fails the demo bound;
 *  - bad state dtypes are refused by name (fwd_create, fwd_state_dtype_parse); auto is f32
 *    on the CPU. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "forward_test_util.h"
#include "model/fwd.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

/* max|Δlogit| / max|logit| of a row, bf16 state against F32 (measured on the demo model: at most
 * 1.4e-3) */
#define DEMO_BOUND 5e-3
#define REF_MEAN_BOUND 5e-2
#define REF_ROW_BOUND 0.5
#define MAX_ROWS 128

static const sampling_params GREEDY = {.top_p = 1, .repetition_penalty = 1}; /* resolved */

static fwd *make(const qwen35_model *m, fwd_state_dtype t)
{
    fwd *f = NULL;
    status st;
    if (fwd_create("cpu", m, &(fwd_opts){.n_slots = 1, .n_ctx = MAX_ROWS + 1, .max_rows = MAX_ROWS,
                                         .n_threads = 2, .state_dtype = t},
                   &f, &st))
        fprintf(stderr, "fwd_create: %s\n", st.msg);
    CU_ASSERT_PTR_NOT_NULL(f);
    return f;
}

/* ids[0 .. n) teacher-forced in one run, every row's logits into lg [n][V] */
static int run(fwd *f, const int32_t *ids, int n, float *lg)
{
    status st;
    static fwd_row rows[MAX_ROWS];
    if (fwd_seq_start(f, 0, &GREEDY, &st)) return st.code;
    for (int i = 0; i < n; i++)
        rows[i] = (fwd_row){.token = ids[i], .slot = 0, .pos = i, .prompt = true,
                            .logits = lg + (size_t)i * f->vocab};
    const int rc = fwd_step(f, rows, n, &st);
    fwd_seq_end(f, 0);
    if (rc) fprintf(stderr, "fwd_step: %s\n", st.msg);
    return rc;
}

/* the prompt, then n greedy tokens one row a step; out[0 .. n) */
static int generate(fwd *f, const int32_t *prompt, int n_prompt, int n, int32_t *out)
{
    status st;
    static fwd_row rows[MAX_ROWS];
    if (fwd_seq_start(f, 0, &GREEDY, &st)) return st.code;
    for (int i = 0; i < n_prompt; i++)
        rows[i] = (fwd_row){.token = prompt[i], .slot = 0, .pos = i, .prompt = true,
                            .sample = i == n_prompt - 1};
    int rc = fwd_step(f, rows, n_prompt, &st);
    int32_t tok = rows[n_prompt - 1].out.token;
    for (int k = 0; k < n && !rc; k++) {
        out[k] = tok;
        fwd_row r = {.token = tok, .slot = 0, .pos = n_prompt + k, .sample = true};
        rc = fwd_step(f, &r, 1, &st);
        tok = r.out.token;
    }
    fwd_seq_end(f, 0);
    if (rc) fprintf(stderr, "generate: %s\n", st.msg);
    return rc;
}

/* max|a - b| / max|a| of each of n rows of V, into rel[] */
static void rows_rel(const float *a, const float *b, int n, int V, double *rel)
{
    for (int r = 0; r < n; r++) {
        double mx = 0, d = 0;
        for (int v = 0; v < V; v++) {
            mx = fmax(mx, fabs(a[(size_t)r * V + v]));
            const double e = fabs((double)a[(size_t)r * V + v] - b[(size_t)r * V + v]);
            d = e == e ? fmax(d, e) : INFINITY; /* NaN: worst */
        }
        rel[r] = d / (mx > 0 ? mx : 1);
    }
}

/* one model's prompts: the logits of the two states over each prompt + continuation; the worst
 * row into *worst, the sum of the rows' values and their count into *sum, *rows, whether any
 * row differed at all into *any_diff */
static void logits_close(const qwen35_model *m, ref_prompt *pr, int n_pr, double *worst,
                         double *sum, int *rows, bool *any_diff)
{
    fwd *f32 = make(m, FWD_STATE_F32), *b16 = make(m, FWD_STATE_BF16);
    if (!f32 || !b16) goto done;
    const int V = m->cfg.V;
    float *a = malloc((size_t)MAX_ROWS * V * sizeof(float));
    float *b = malloc((size_t)MAX_ROWS * V * sizeof(float));
    CU_ASSERT_FATAL(a && b);
    for (int i = 0; i < n_pr; i++) {
        int32_t *ids = forward_test_full_ids(&pr[i]);
        int n = pr[i].n_ids + pr[i].n_greedy;
        if (n > MAX_ROWS) n = MAX_ROWS;
        CU_ASSERT_EQUAL(run(f32, ids, n, a), STATUS_OK);
        CU_ASSERT_EQUAL(run(b16, ids, n, b), STATUS_OK);
        static double rel[MAX_ROWS];
        rows_rel(a, b, n, V, rel);
        for (int r = 0; r < n; r++) {
            if (!(rel[r] <= *worst)) *worst = rel[r];
            *sum += rel[r];
        }
        *rows += n;
        *any_diff |= memcmp(a, b, (size_t)n * V * sizeof(float)) != 0;
        if (i == 0) { /* the bound can fail: one logit moved by 5% of the row's largest */
            float mx = 0;
            for (int v = 0; v < V; v++) mx = fmaxf(mx, fabsf(a[v]));
            b[V / 2] = a[V / 2] + 0.05f * mx;
            CU_ASSERT(forward_test_rows_rel(b, a, 1, V) > DEMO_BOUND);
        }
        free(ids);
    }
    free(a);
    free(b);
done:
    fwd_destroy(f32);
    fwd_destroy(b16);
}

static void test_reference_logits(void)
{
    ref_case cases[REF_CASES_MAX];
    const int n = ref_cases_list(cases, REF_CASES_MAX);
    CU_ASSERT_FATAL(n > 0);
    double worst = 0, sum = 0;
    int rows = 0;
    bool any_diff = false;
    for (int c = 0; c < n; c++) {
        char path[4400];
        status st;
        qwen35_model *m = NULL;
        ref_prompt *pr = NULL;
        ref_case_path(&cases[c], ".gguf", path, sizeof path);
        CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, path, &st), STATUS_OK);
        const int n_pr = forward_test_read_prompts_in(cases[c].dir, cases[c].name, &pr);
        CU_ASSERT_FATAL(n_pr > 0);
        double w = 0, s = 0;
        int r = 0;
        logits_close(m, pr, n_pr, &w, &s, &r, &any_diff);
        printf("\n  %s: bf16 vs F32 state over %d rows: mean %.3g, worst %.3g of max|logit|",
               cases[c].name, r, s / r, w);
        worst = fmax(worst, w);
        sum += s;
        rows += r;
        forward_test_free_prompts(pr, n_pr);
        qwen35_model_free(m);
    }
    printf("\n  reference models: mean %.3g (bound %.3g), worst row %.3g (bound %.3g)\n",
           sum / rows, REF_MEAN_BOUND, worst, REF_ROW_BOUND);
    CU_ASSERT(sum / rows <= REF_MEAN_BOUND);
    CU_ASSERT(worst <= REF_ROW_BOUND);
    CU_ASSERT(any_diff);
}

static void test_demo_greedy(void)
{
    const char *root = getenv("DS_REPO_ROOT");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/models", root ? root : ".");
    char path[4200];
    snprintf(path, sizeof path, "%s/demo-en-17m.gguf", dir);
    status st;
    qwen35_model *m = NULL;
    ref_prompt *pr = NULL;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, path, &st), STATUS_OK);
    const int n_pr = forward_test_read_prompts_in(dir, "demo-en-17m", &pr);
    CU_ASSERT_FATAL(n_pr > 0);
    fwd *f32 = make(m, FWD_STATE_F32), *b16 = make(m, FWD_STATE_BF16);
    CU_ASSERT_FATAL(f32 && b16);
    int same = 0, total = 0;
    for (int i = 0; i < n_pr; i++) {
        int32_t ga[64], gb[64];
        const int n = pr[i].n_greedy < 64 ? pr[i].n_greedy : 64;
        CU_ASSERT_EQUAL(generate(f32, pr[i].ids, pr[i].n_ids, n, ga), STATUS_OK);
        CU_ASSERT_EQUAL(generate(b16, pr[i].ids, pr[i].n_ids, n, gb), STATUS_OK);
        for (int k = 0; k < n; k++) same += ga[k] == gb[k];
        total += n;
    }
    printf("\n  demo model: bf16 state greedy tokens equal to the F32 state's: %d of %d\n", same,
           total);
    CU_ASSERT_EQUAL(same, total);
    double w = 0, sum = 0;
    int rows = 0;
    bool any_diff = false;
    logits_close(m, pr, n_pr, &w, &sum, &rows, &any_diff);
    printf("  demo model: bf16 vs F32 state over %d rows: mean %.3g, worst %.3g of max|logit| "
           "(bound %.3g)\n", rows, sum / rows, w, DEMO_BOUND);
    CU_ASSERT(w <= DEMO_BOUND);
    CU_ASSERT(any_diff);
    fwd_destroy(f32);
    fwd_destroy(b16);
    forward_test_free_prompts(pr, n_pr);
    qwen35_model_free(m);
}

static void test_bad_dtype(void)
{
    status st;
    fwd_state_dtype t = FWD_STATE_F32;
    CU_ASSERT_EQUAL(fwd_state_dtype_parse("bf16", &t, &st), STATUS_OK);
    CU_ASSERT_EQUAL(t, FWD_STATE_BF16);
    CU_ASSERT_EQUAL(fwd_state_dtype_parse("f32", &t, &st), STATUS_OK);
    CU_ASSERT_EQUAL(t, FWD_STATE_F32);
    CU_ASSERT_EQUAL(fwd_state_dtype_parse("auto", &t, &st), STATUS_OK);
    CU_ASSERT_EQUAL(t, FWD_STATE_AUTO);
    CU_ASSERT_EQUAL(fwd_state_dtype_parse("f16", &t, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "'f16'"));
    CU_ASSERT_EQUAL(fwd_state_dtype_parse(NULL, &t, &st), STATUS_INVALID);
    CU_ASSERT_STRING_EQUAL(fwd_state_dtype_name(FWD_STATE_BF16), "bf16");
    ref_case cases[REF_CASES_MAX];
    CU_ASSERT_FATAL(ref_cases_list(cases, REF_CASES_MAX) > 0);
    char path[4400];
    ref_case_path(&cases[0], ".gguf", path, sizeof path);
    qwen35_model *m = NULL;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, path, &st), STATUS_OK);
    fwd *f = NULL;
    CU_ASSERT_EQUAL(fwd_create("cpu", m, &(fwd_opts){.n_slots = 1, .n_ctx = 8,
                                                     .state_dtype = (fwd_state_dtype)7},
                               &f, &st),
                    STATUS_INVALID);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "state dtype"));
    /* auto: the CPU's choice is f32 */
    CU_ASSERT_EQUAL(fwd_create("cpu", m, &(fwd_opts){.n_slots = 1, .n_ctx = 8,
                                                     .state_dtype = FWD_STATE_AUTO},
                               &f, &st),
                    STATUS_OK);
    if (f) {
        CU_ASSERT_EQUAL(f->state_dtype, FWD_STATE_F32);
        fwd_destroy(f);
    }
    qwen35_model_free(m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("fwd_bf16", NULL, NULL);
    CU_add_test(s, "reference models: logits near the F32 state's", test_reference_logits);
    CU_add_test(s, "demo model: greedy tokens of the F32 state", test_demo_greedy);
    CU_add_test(s, "bad state dtypes", test_bad_dtype);
    return testutil_cunit_run();
}
