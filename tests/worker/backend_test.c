/* The engine's backend adapter (worker/backend.h) over the real CPU forward:
 *  - items longer than the forward's max_rows go over several forward steps and give the same
 *    logits and sampled tokens as one step that holds them all;
 *  - a step the KV pool cannot hold is refused before any row runs;
 *  - device names resolve through the registry this binary links (//model:backends_cpu): "cpu";
 *    "cuda" falls back to the CPU; malformed or unknown names and impossible --tp are refused. */
#include <CUnit/Basic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/qwen35.h"
#include "tests/testutil/testutil.h"
#include "worker/backend.h"
#include "worker_test_util.h"

static qwen35_model *g_model;
static wt_prompt g_prompts[WT_MAX_PROMPTS];
static int g_n_prompts;
static const sampling_params GREEDY = {.top_p = 1, .repetition_penalty = 1}; /* resolved */

/* Two items (slot 0: the first prompt; slot 1: the second) in one backend step: the logits of
 * every token and each item's sampled token. */
static int run_two(int max_prefill, float *logits, int32_t *next, int *max_rows)
{
    status st;
    worker_backend *b;
    const worker_backend_opts o = {.n_slots = 2, .n_ctx = 256, .n_threads = 2,
                                   .max_prefill_tokens = max_prefill};
    if (worker_backend_create("cpu", g_model, &o, &b, &st)) return fprintf(stderr, "%s\n", st.msg), -1;
    *max_rows = b->f->max_rows;
    const wt_prompt *p0 = &g_prompts[0], *p1 = &g_prompts[1 % g_n_prompts];
    const int V = b->vocab;
    worker_batch_item it[2] = {
        {.slot = 0, .tokens = p0->ids, .n_tokens = p0->n_ids, .prompt = true, .sample = true,
         .logits = logits},
        {.slot = 1, .tokens = p1->ids, .n_tokens = p1->n_ids, .prompt = true, .sample = true,
         .logits = logits + (size_t)p0->n_ids * V},
    };
    int rc = worker_backend_seq_start(b, 0, &GREEDY, &st) || worker_backend_seq_start(b, 1, &GREEDY, &st) ||
             worker_backend_step(b, it, 2, &st);
    if (rc) fprintf(stderr, "%s\n", st.msg);
    next[0] = it[0].out.token, next[1] = it[1].out.token;
    if (!rc && (fwd_n_past(b->f, 0) != p0->n_ids || fwd_n_past(b->f, 1) != p1->n_ids)) rc = -1;
    worker_backend_destroy(b);
    return rc;
}

static void test_split_items(void)
{
    const int n0 = g_prompts[0].n_ids, n1 = g_prompts[1 % g_n_prompts].n_ids, V = g_model->cfg.V;
    float *a = malloc(sizeof(float) * (n0 + n1) * V), *b = malloc(sizeof(float) * (n0 + n1) * V);
    int32_t na[2], nb[2];
    int rows_a, rows_b;
    CU_ASSERT_EQUAL_FATAL(run_two(256, a, na, &rows_a), 0); /* one forward step */
    CU_ASSERT_EQUAL_FATAL(run_two(1, b, nb, &rows_b), 0);   /* 3 rows a step: split */
    CU_ASSERT(rows_a >= n0 + n1);
    CU_ASSERT_EQUAL(rows_b, 3);
    CU_ASSERT(n0 > 3);
    CU_ASSERT(na[0] == nb[0] && na[1] == nb[1]);
    /* the same rows in smaller passes: equal up to the order of the sums (prefill in 3-row
     * steps; tests/model:forward_ref_test bounds the step size's effect) */
    double worst = 0;
    for (long i = 0; i < (long)(n0 + n1) * V; i++) {
        const double d = a[i] - b[i];
        worst = d > worst ? d : -d > worst ? -d : worst;
    }
    printf("\n    %d + %d prompt tokens in steps of %d rows: max |delta logit| %.3g", n0, n1, rows_b, worst);
    CU_ASSERT(worst < 1e-3);
    free(a), free(b);
}

static void test_exhausted_runs_nothing(void)
{
    status st;
    worker_backend *b;
    const worker_backend_opts o = {.n_slots = 2, .n_ctx = 256, .n_threads = 2, .max_prefill_tokens = 4,
                                   .kv_blocks = 1};
    CU_ASSERT_EQUAL_FATAL(worker_backend_create("cpu", g_model, &o, &b, &st), 0);
    CU_ASSERT_EQUAL(kv_pool_total_blocks(b->kv), 1);
    const wt_prompt *p = &g_prompts[0];
    CU_ASSERT_FATAL(p->n_ids >= 2 && p->n_ids <= 64);
    worker_batch_item it[2] = {{.slot = 0, .tokens = p->ids, .n_tokens = p->n_ids, .prompt = true},
                               {.slot = 1, .tokens = p->ids, .n_tokens = 1, .prompt = true}};
    CU_ASSERT_EQUAL(worker_backend_seq_start(b, 0, &GREEDY, &st), 0);
    CU_ASSERT_EQUAL(worker_backend_seq_start(b, 1, &GREEDY, &st), 0);
    CU_ASSERT_EQUAL(worker_backend_step(b, it, 2, &st), STATUS_EXHAUSTED); /* 2 blocks of 1 */
    CU_ASSERT(fwd_n_past(b->f, 0) == 0 && fwd_n_past(b->f, 1) == 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(b->kv), 1);
    CU_ASSERT_EQUAL(worker_backend_step(b, it, 1, &st), 0); /* one of them fits */
    CU_ASSERT_EQUAL(fwd_n_past(b->f, 0), p->n_ids);
    worker_backend_seq_end(b, 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(b->kv), 1);
    worker_backend_destroy(b);
}

static void test_device_names(void)
{
    status st;
    worker_backend *b = NULL;
    const worker_backend_opts o = {.n_slots = 1, .n_ctx = 16, .n_threads = 1};
    CU_ASSERT_PTR_NULL(fwd_backend_find("cuda")); /* the CPU registry */
    CU_ASSERT_EQUAL(worker_backend_create("cuda", g_model, &o, &b, &st), 0); /* falls back */
    CU_ASSERT_PTR_NOT_NULL(b);
    if (b) CU_ASSERT_EQUAL(strncmp(b->device, "cpu", 3), 0);
    worker_backend_destroy(b);
    CU_ASSERT_EQUAL(worker_backend_create("cuda:x", g_model, &o, &b, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "cuda:x"));
    CU_ASSERT_EQUAL(worker_backend_create("tpu", g_model, &o, &b, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "unknown device 'tpu'"));
    CU_ASSERT_EQUAL(worker_backend_check_tp("cpu", 4, &st), 0);
    CU_ASSERT_EQUAL(worker_backend_check_tp("cuda", 2, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--tp 2 needs 2 GPUs, this host has 0"));
    CU_ASSERT_EQUAL(worker_backend_check_tp("cuda:0,1", 3, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(worker_backend_check_tp("cuda:0,1", 1, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(worker_backend_check_tp("cpu", 65, &st), STATUS_INVALID);
}

static int suite_init(void)
{
    char path[PATH_MAX];
    status st;
    wt_reference_path(path, sizeof path, "tiny-r2-tied", ".gguf");
    if (qwen35_model_load(&g_model, path, &st)) {
        fprintf(stderr, "%s: %s\n", path, st.msg);
        return -1;
    }
    g_n_prompts = wt_load_prompts("tiny-r2-tied", g_prompts, WT_MAX_PROMPTS);
    return g_n_prompts > 0 ? 0 : -1;
}

static int suite_clean(void)
{
    qwen35_model_free(g_model);
    return 0;
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("backend", suite_init, suite_clean);
    CU_add_test(s, "split_items", test_split_items);
    CU_add_test(s, "exhausted_runs_nothing", test_exhausted_runs_nothing);
    CU_add_test(s, "device_names", test_device_names);
    return testutil_cunit_run();
}
