/* Worker/Generate validation: defaults for zero fields, and every bad field rejected with
 * STATUS_INVALID and a message naming the field. */
#include <math.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "worker/request.h"
#include "tests/testutil/testutil.h"

static const worker_limits lim = {.vocab = 1000, .n_ctx = 64};
static int32_t ids[100];

typedef struct req_fixture {
    Deltaserve__V1__WorkerGenerateRequest r;
    Deltaserve__V1__SamplingParams s;
    Deltaserve__V1__StoppingCriteria stop;
    int32_t stop_ids[32];
} req_fixture;

static void fixture(req_fixture *f, int n_prompt)
{
    f->r = (Deltaserve__V1__WorkerGenerateRequest)DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    f->s = (Deltaserve__V1__SamplingParams)DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    f->stop = (Deltaserve__V1__StoppingCriteria)DELTASERVE__V1__STOPPING_CRITERIA__INIT;
    f->r.request_id = "r1";
    f->r.n_prompt_token_ids = (size_t)n_prompt;
    f->r.prompt_token_ids = ids;
    f->r.sampling = &f->s;
    f->r.stopping = &f->stop;
    f->stop.stop_token_ids = f->stop_ids;
}

/* Expects STATUS_INVALID with `field` in the message. */
static void expect_invalid(req_fixture *f, const char *field)
{
    engine_params p;
    status st;
    status_clear(&st);
    int rc = worker_request_parse(&f->r, &lim, 42, "fallback", &p, &st);
    CU_ASSERT_EQUAL(rc, STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, field));
    if (rc != STATUS_INVALID || !strstr(st.msg, field))
        printf("\n  want '%s' in: %s (rc %d)\n", field, st.msg, rc);
}

static void test_defaults(void)
{
    req_fixture f;
    fixture(&f, 10);
    f.r.sampling = NULL;
    f.r.stopping = NULL;
    f.r.request_id = "";
    engine_params p;
    status st;
    CU_ASSERT_EQUAL_FATAL(worker_request_parse(&f.r, &lim, 42, "w7", &p, &st), STATUS_OK);
    CU_ASSERT_STRING_EQUAL(p.id, "w7");
    CU_ASSERT_EQUAL(p.n_prompt, 10);
    CU_ASSERT_EQUAL(p.sampling.temperature, 0);
    CU_ASSERT_EQUAL(p.sampling.top_p, 1.0f);
    CU_ASSERT_EQUAL(p.sampling.repetition_penalty, 1.0f);
    CU_ASSERT_EQUAL(p.sampling.seed, 42); /* seed 0: the one the service picked */
    CU_ASSERT_EQUAL(p.max_new_tokens, 54); /* default 256 clipped to the context left */
    CU_ASSERT(!p.ignore_eos);
    CU_ASSERT(!p.no_speculation);

    fixture(&f, 10);
    f.s.seed = 5;
    f.s.top_p = 0.5f;
    f.s.repetition_penalty = 1.2f;
    f.stop.max_new_tokens = 54; /* exactly fills the context */
    f.stop.n_stop_token_ids = 2;
    f.stop_ids[0] = 3;
    f.stop_ids[1] = 999;
    f.stop.ignore_eos = 1;
    f.r.logprobs = 20;
    f.r.no_speculation = 1;
    CU_ASSERT_EQUAL_FATAL(worker_request_parse(&f.r, &lim, 42, "w7", &p, &st), STATUS_OK);
    CU_ASSERT_STRING_EQUAL(p.id, "r1");
    CU_ASSERT_EQUAL(p.sampling.seed, 5);
    CU_ASSERT_EQUAL(p.sampling.top_p, 0.5f);
    CU_ASSERT_EQUAL(p.sampling.repetition_penalty, 1.2f);
    CU_ASSERT_EQUAL(p.max_new_tokens, 54);
    CU_ASSERT_EQUAL(p.n_stop_ids, 2);
    CU_ASSERT_EQUAL(p.stop_ids[1], 999);
    CU_ASSERT(p.ignore_eos);
    CU_ASSERT(p.no_speculation);
    CU_ASSERT_EQUAL(p.sampling.n_logprobs, 20);
}

static void test_prompt_errors(void)
{
    req_fixture f;
    fixture(&f, 0);
    expect_invalid(&f, "prompt_token_ids: empty prompt");
    fixture(&f, 64); /* no room for one generated token */
    expect_invalid(&f, "prompt_token_ids: 64 tokens do not fit the context of 64");
    fixture(&f, 5);
    ids[3] = 1000;
    expect_invalid(&f, "prompt_token_ids[3]: id 1000 is outside the vocabulary [0, 1000)");
    ids[3] = -1;
    expect_invalid(&f, "prompt_token_ids[3]: id -1");
    ids[3] = 3;
    char long_id[200];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    f.r.request_id = long_id;
    expect_invalid(&f, "request_id: longer than 128 bytes");
}

static void test_sampling_errors(void)
{
    req_fixture f;
    fixture(&f, 5);
    f.s.temperature = NAN;
    expect_invalid(&f, "sampling.temperature");
    f.s.temperature = -0.5f;
    expect_invalid(&f, "sampling.temperature");
    f.s.temperature = INFINITY;
    expect_invalid(&f, "sampling.temperature");
    fixture(&f, 5);
    f.s.top_k = -1;
    expect_invalid(&f, "sampling.top_k");
    fixture(&f, 5);
    f.s.top_p = 1.5f;
    expect_invalid(&f, "sampling.top_p: 1.5 is outside (0, 1]");
    f.s.top_p = -0.1f;
    expect_invalid(&f, "sampling.top_p");
    fixture(&f, 5);
    f.s.min_p = 2;
    expect_invalid(&f, "sampling.min_p");
    fixture(&f, 5);
    f.s.repetition_penalty = -1;
    expect_invalid(&f, "sampling.repetition_penalty");
    fixture(&f, 5);
    f.s.presence_penalty = 3;
    expect_invalid(&f, "sampling.presence_penalty");
    fixture(&f, 5);
    f.s.frequency_penalty = -2.5f;
    expect_invalid(&f, "sampling.frequency_penalty");
    fixture(&f, 5);
    f.r.logprobs = 21;
    expect_invalid(&f, "logprobs: 21 is more than 20");
}

static void test_stopping_errors(void)
{
    req_fixture f;
    fixture(&f, 10);
    f.stop.max_new_tokens = 55;
    expect_invalid(&f, "stopping.max_new_tokens: 55 exceeds the context left");
    fixture(&f, 10);
    f.stop.n_stop_token_ids = 17;
    expect_invalid(&f, "stopping.stop_token_ids: 17 ids, at most 16");
    fixture(&f, 10);
    f.stop.n_stop_token_ids = 2;
    f.stop_ids[0] = 1;
    f.stop_ids[1] = 5000;
    expect_invalid(&f, "stopping.stop_token_ids[1]: id 5000");
}

int main(void)
{
    for (int i = 0; i < 100; i++) ids[i] = i;
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("request", NULL, NULL);
    CU_add_test(s, "defaults", test_defaults);
    CU_add_test(s, "prompt_errors", test_prompt_errors);
    CU_add_test(s, "sampling_errors", test_sampling_errors);
    CU_add_test(s, "stopping_errors", test_stopping_errors);
    return testutil_cunit_run();
}
