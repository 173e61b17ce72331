/* common/sampling: every field's range, the message naming the field as the .proto spells it
 * (with the caller's prefix; logprobs without it), the defaults, and the greedy test. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/sampling.h"
#include "tests/testutil/testutil.h"

static void expect_invalid(sampling_params p, const char *prefix, const char *want)
{
    status st = {0};
    CU_ASSERT_EQUAL(sampling_params_validate(&p, prefix, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(st.code, STATUS_INVALID);
    if (strncmp(st.msg, want, strlen(want)))
        printf("\n  message '%s' does not start with '%s'\n", st.msg, want);
    CU_ASSERT_EQUAL(strncmp(st.msg, want, strlen(want)), 0);
}

static void test_validate(void)
{
    const sampling_params z = {0};
    CU_ASSERT_EQUAL(sampling_params_validate(&z, "sampling.", NULL), STATUS_OK);
    const sampling_params ok = {.temperature = 0.7f, .top_k = 40, .top_p = 1, .min_p = 1,
                                .repetition_penalty = 1.1f, .presence_penalty = -2,
                                .frequency_penalty = 2, .penalty_window = 64, .seed = ~0ull,
                                .n_logprobs = SAMPLING_MAX_LOGPROBS};
    CU_ASSERT_EQUAL(sampling_params_validate(&ok, NULL, NULL), STATUS_OK);
    sampling_params p;
    p = z, p.top_p = 1.5f, expect_invalid(p, "sampling.", "sampling.top_p: 1.5 is outside (0, 1]");
    p = z, p.top_p = 1.5f, expect_invalid(p, NULL, "top_p: 1.5");
    p = z, p.top_p = -0.1f, expect_invalid(p, "sampling.", "sampling.top_p:");
    p = z, p.top_p = NAN, expect_invalid(p, "sampling.", "sampling.top_p:");
    p = z, p.temperature = -0.1f, expect_invalid(p, "sampling.", "sampling.temperature:");
    p = z, p.temperature = NAN, expect_invalid(p, "sampling.", "sampling.temperature:");
    p = z, p.temperature = INFINITY, expect_invalid(p, "sampling.", "sampling.temperature:");
    p = z, p.top_k = -1, expect_invalid(p, "sampling.", "sampling.top_k: -1");
    p = z, p.min_p = -0.01f, expect_invalid(p, "sampling.", "sampling.min_p:");
    p = z, p.min_p = 1.01f, expect_invalid(p, "sampling.", "sampling.min_p:");
    p = z, p.repetition_penalty = -1, expect_invalid(p, "sampling.", "sampling.repetition_penalty:");
    p = z, p.repetition_penalty = NAN, expect_invalid(p, "sampling.", "sampling.repetition_penalty:");
    p = z, p.repetition_penalty = INFINITY,
    expect_invalid(p, "sampling.", "sampling.repetition_penalty:");
    p = z, p.presence_penalty = 2.5f, expect_invalid(p, "sampling.", "sampling.presence_penalty:");
    p = z, p.presence_penalty = NAN, expect_invalid(p, "sampling.", "sampling.presence_penalty:");
    p = z, p.frequency_penalty = -3, expect_invalid(p, "sampling.", "sampling.frequency_penalty:");
    p = z, p.frequency_penalty = NAN, expect_invalid(p, "sampling.", "sampling.frequency_penalty:");
    p = z, p.penalty_window = -1, expect_invalid(p, "sampling.", "sampling.penalty_window:");
    /* logprobs sits beside `sampling` on the wire: never prefixed */
    p = z, p.n_logprobs = 21, expect_invalid(p, "sampling.", "logprobs: 21 is more than 20");
    p = z, p.n_logprobs = -1, expect_invalid(p, "sampling.", "logprobs: -1");
    /* the first bad field is the one named */
    p = z, p.top_k = -1, p.min_p = 2, expect_invalid(p, "sampling.", "sampling.top_k:");
}

static void test_resolve(void)
{
    const sampling_params z = {0};
    sampling_params r = sampling_params_resolve(&z);
    CU_ASSERT(r.top_p == 1 && r.repetition_penalty == 1 && r.temperature == 0 && r.seed == 0);
    const sampling_params set = {.top_p = 0.5f, .repetition_penalty = 1.2f, .seed = 7};
    r = sampling_params_resolve(&set);
    CU_ASSERT(r.top_p == 0.5f && r.repetition_penalty == 1.2f && r.seed == 7);
    const sampling_params again = sampling_params_resolve(&r); /* idempotent */
    CU_ASSERT(again.top_p == r.top_p && again.repetition_penalty == r.repetition_penalty &&
              again.seed == r.seed && again.temperature == r.temperature);
}

static void test_is_greedy(void)
{
    const sampling_params z = {0};
    sampling_params p = sampling_params_resolve(&z);
    CU_ASSERT_TRUE(sampling_params_is_greedy(&p));
    p.temperature = 0.8f;
    CU_ASSERT_FALSE(sampling_params_is_greedy(&p));
    p.top_k = 1; /* top-k 1 keeps only the argmax whatever the temperature */
    CU_ASSERT_TRUE(sampling_params_is_greedy(&p));
    p.top_p = 0.5f, p.min_p = 0.3f; /* filters after top-k 1 change nothing */
    CU_ASSERT_TRUE(sampling_params_is_greedy(&p));
    p = sampling_params_resolve(&z), p.repetition_penalty = 1.1f;
    CU_ASSERT_FALSE(sampling_params_is_greedy(&p)); /* penalties change the logits */
    p = sampling_params_resolve(&z), p.presence_penalty = 0.5f;
    CU_ASSERT_FALSE(sampling_params_is_greedy(&p));
    p = sampling_params_resolve(&z), p.frequency_penalty = -0.5f;
    CU_ASSERT_FALSE(sampling_params_is_greedy(&p));
    p = sampling_params_resolve(&z), p.n_logprobs = 5; /* logprobs do not change the pick */
    CU_ASSERT_TRUE(sampling_params_is_greedy(&p));
    /* no penalty: the filters and the temperature do not count */
    p = sampling_params_resolve(&(sampling_params){.temperature = 0.7f, .top_k = 5, .top_p = 0.9f,
                                                   .min_p = 0.1f});
    CU_ASSERT_TRUE(sampling_params_no_penalty(&p));
    CU_ASSERT_TRUE(sampling_params_no_penalty(&z)); /* repetition 0: the default 1 */
    p.repetition_penalty = 0.9f;
    CU_ASSERT_FALSE(sampling_params_no_penalty(&p));
    p = sampling_params_resolve(&z), p.presence_penalty = 0.1f;
    CU_ASSERT_FALSE(sampling_params_no_penalty(&p));
    p = sampling_params_resolve(&z), p.frequency_penalty = 0.1f;
    CU_ASSERT_FALSE(sampling_params_no_penalty(&p));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("common/sampling", NULL, NULL);
    CU_add_test(s, "validate", test_validate);
    CU_add_test(s, "resolve", test_resolve);
    CU_add_test(s, "is_greedy", test_is_greedy);
    return testutil_cunit_run();
}
