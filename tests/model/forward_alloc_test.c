/* No allocation per token: after qwen35_ctx_create / qwen35_state_create, prefill (in several
 * internal steps, chunked and recurrent) and batched decode call malloc/calloc/realloc zero
 * times, on the F32 reference model and on a Q4_K_M copy of it in both dot modes (the integer
 * path quantises each matmul input into the ctx's scratch). malloc, calloc and realloc are
 * wrapped (-Wl,--wrap) to count calls. */
#include <CUnit/Basic.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "forward_test_util.h"
#include "gguf_rewrite.h"
#include "model/forward.h"
#include "tests/testutil/alloc_count.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

static void no_alloc_per_token(const char *path, qwen35_dot_mode dot)
{
    status st;
    qwen35_model *m;
    CU_ASSERT_FATAL(qwen35_model_load(&m, path, &st) == 0);
    qwen35_ctx *ctx;
    qwen35_state *s[3];
    CU_ASSERT_FATAL(qwen35_ctx_create(m, &(qwen35_ctx_opts){.max_batch = 3, .max_tokens = 48, .n_threads = 2, .dot_mode = dot}, &ctx, &st) == 0);
    for (int b = 0; b < 3; b++) CU_ASSERT_FATAL(qwen35_state_create(m, 256, &s[b], &st) == 0);
    int V = m->cfg.V;
    float *logits = malloc(sizeof(float) * 130 * V);
    int32_t ids[130];
    for (int i = 0; i < 130; i++) ids[i] = (i * 37) % V;

    long before = testutil_allocs();
    CU_ASSERT(qwen35_prefill(ctx, s[0], ids, 130, logits, true, &st) == 0); /* 3 steps of <= 48 */
    qwen35_ctx_set_gdn_mode(ctx, QWEN35_GDN_RECURRENT);
    CU_ASSERT(qwen35_prefill(ctx, s[1], ids, 70, logits, false, &st) == 0);
    qwen35_ctx_set_gdn_mode(ctx, QWEN35_GDN_CHUNKED);
    CU_ASSERT(qwen35_prefill(ctx, s[2], ids, 5, NULL, false, &st) == 0);
    for (int step = 0; step < 40; step++) {
        CU_ASSERT(qwen35_decode_batch(ctx, s, ids + step, 3, logits, &st) == 0);
        CU_ASSERT(qwen35_decode_batch(ctx, s + 1, ids + step, 1, logits, &st) == 0);
    }
    qwen35_state_reset(s[0]);
    qwen35_state_copy(s[0], s[1]);
    long during = testutil_allocs() - before;
    printf("\n    allocations during 205 prefill tokens and 160 decoded tokens: %ld", during);
    CU_ASSERT_EQUAL(during, 0);

    free(logits);
    for (int b = 0; b < 3; b++) qwen35_state_destroy(s[b]);
    qwen35_ctx_destroy(ctx);
    qwen35_model_free(m);
}

static void test_no_alloc_per_token(void)
{
    char path[4096];
    ref_case_resolve_path("tiny-r2-tied", ".gguf", path, sizeof path);
    no_alloc_per_token(path, QWEN35_DOT_DEFAULT);
}

static void test_no_alloc_per_token_q4_k_m(void)
{
    char src[4096], dst[4300];
    ref_case_resolve_path("tiny-r2-tied", ".gguf", src, sizeof src);
    snprintf(dst, sizeof dst, "%s/alloc.q4_k_m.%d.gguf", testutil_tmp_dir(), (int)getpid());
    status st;
    CU_ASSERT_FATAL(requant_file(src, dst, REQUANT_Q4_K_M, 0, &st) == 0);
    no_alloc_per_token(dst, QWEN35_DOT_Q8);
    no_alloc_per_token(dst, QWEN35_DOT_EXACT);
    unlink(dst);
}

/* The counter counts: creating a state allocates. */
static void test_counter_counts(void)
{
    char path[4096];
    ref_case_resolve_path("tiny-r2-tied", ".gguf", path, sizeof path);
    status st;
    qwen35_model *m;
    CU_ASSERT_FATAL(qwen35_model_load(&m, path, &st) == 0);
    long before = testutil_allocs();
    qwen35_state *s;
    CU_ASSERT_FATAL(qwen35_state_create(m, 16, &s, &st) == 0);
    CU_ASSERT(testutil_allocs() - before >= 4);
    qwen35_state_destroy(s);
    qwen35_model_free(m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite su = CU_add_suite("forward_alloc", NULL, NULL);
    CU_add_test(su, "no_alloc_per_token", test_no_alloc_per_token);
    CU_add_test(su, "no_alloc_per_token_q4_k_m", test_no_alloc_per_token_q4_k_m);
    CU_add_test(su, "counter_counts", test_counter_counts);
    return testutil_cunit_run();
}
