/* router_request: validation names the field; ChatML rendering; prompt ids with the tiny
 * reference tokenizer (testutil_reference_dir). */
#include <CUnit/Basic.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/router_request.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

static tokenizer *tok;
static bool own_model; /* own-r2-tied (no shared folder): its own vocabulary */

static int setup(void)
{
    char path[PATH_MAX + 32];
    ref_case rc;
    if (ref_case_resolve("tiny-r2-tied", &rc)) return 1;
    ref_case_path(&rc, ".gguf", path, sizeof path);
    own_model = strcmp(rc.name, "tiny-r2-tied") != 0;
    status st;
    if (tokenizer_load_path(&tok, path, &st)) {
        fprintf(stderr, "cannot load %s: %s\n", path, st.msg);
        return 1;
    }
    return 0;
}

static int teardown(void)
{
    tokenizer_destroy(tok);
    return 0;
}

/* The field a request is refused for: the start of the message up to ':'. */
static const char *refused(const Deltaserve__V1__GenerateRequest *g, const tokenizer *t)
{
    static status st;
    if (router_request_validate(g, t, &st) == 0) return "";
    CU_ASSERT_EQUAL(st.code, STATUS_INVALID);
    char *colon = strchr(st.msg, ':');
    if (colon) *colon = 0;
    return st.msg;
}

static void test_validation(void)
{
    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    CU_ASSERT_STRING_EQUAL(refused(&g, tok), "prompt");
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
    g.text = "";
    CU_ASSERT_STRING_EQUAL(refused(&g, tok), "text");
    g.text = "hello";
    CU_ASSERT_STRING_EQUAL(refused(&g, tok), "");
    CU_ASSERT_STRING_EQUAL(refused(&g, NULL), "text"); /* no tokenizer */
    g.text = "bad \xff utf8";
    CU_ASSERT_STRING_EQUAL(refused(&g, tok), "text");
    g.text = "hello";

    Deltaserve__V1__TokenIds ids = DELTASERVE__V1__TOKEN_IDS__INIT;
    int32_t v[3] = {1, 1028, 1029};
    ids.ids = v;
    ids.n_ids = 2;
    Deltaserve__V1__GenerateRequest gi = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    gi.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    gi.token_ids = &ids;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "");
    ids.n_ids = 3;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "token_ids.ids[2]"); /* 1029 = vocab size */
    CU_ASSERT_STRING_EQUAL(refused(&gi, NULL), "");                /* the worker checks */
    v[0] = -1;
    CU_ASSERT_STRING_EQUAL(refused(&gi, NULL), "token_ids.ids[0]");
    v[0] = 1;
    ids.n_ids = 0;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "token_ids.ids");
    ids.n_ids = 2;

    Deltaserve__V1__SamplingParams s = DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    gi.sampling = &s;
    s.temperature = NAN;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "sampling.temperature");
    s.temperature = 0.7f;
    s.top_p = 1.5f;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "sampling.top_p");
    s.top_p = 0;
    s.top_k = -1;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "sampling.top_k");
    s.top_k = 0;
    s.min_p = -0.1f;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "sampling.min_p");
    s.min_p = 0;
    s.presence_penalty = 3;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "sampling.presence_penalty");
    s.presence_penalty = 0;
    s.repetition_penalty = -1;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "sampling.repetition_penalty");
    s.repetition_penalty = 0;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "");

    char *stops[17];
    for (int i = 0; i < 17; i++) stops[i] = "x";
    gi.stop = stops;
    gi.n_stop = 17;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "stop");
    gi.n_stop = 2;
    stops[1] = "";
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "stop[1]");
    stops[1] = "y";
    CU_ASSERT_STRING_EQUAL(refused(&gi, NULL), "stop"); /* needs the tokenizer */
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "");
    gi.logprobs = 21;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "logprobs");
    gi.logprobs = 20;
    char rid[200];
    memset(rid, 'r', sizeof rid - 1);
    rid[sizeof rid - 1] = 0;
    gi.request_id = rid;
    CU_ASSERT_STRING_EQUAL(refused(&gi, tok), "request_id");
}

static void test_chatml_and_prompt_ids(void)
{
    Deltaserve__V1__ChatMessage m[2] = {DELTASERVE__V1__CHAT_MESSAGE__INIT,
                                        DELTASERVE__V1__CHAT_MESSAGE__INIT};
    Deltaserve__V1__ChatMessage *mp[2] = {&m[0], &m[1]};
    m[0].role = "system";
    m[0].content = "Be brief.";
    m[1].role = "user";
    m[1].content = "Hi";
    Deltaserve__V1__ChatPrompt chat = DELTASERVE__V1__CHAT_PROMPT__INIT;
    chat.messages = mp;
    chat.n_messages = 2;
    char *text;
    size_t len;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_request_chatml(&chat, &text, &len, &st), 0);
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\n";
    CU_ASSERT_STRING_EQUAL(text, want);
    CU_ASSERT_EQUAL(len, strlen(want));

    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT;
    g.chat = &chat;
    CU_ASSERT_EQUAL(router_request_validate(&g, tok, &st), 0);
    int32_t *ids, *want_ids;
    size_t n, n_want;
    CU_ASSERT_EQUAL_FATAL(router_request_prompt_ids(&g, tok, &ids, &n, &st), 0);
    CU_ASSERT_EQUAL_FATAL(tokenizer_encode(tok, text, len, &want_ids, &n_want, &st), 0);
    CU_ASSERT_EQUAL(n, n_want);
    CU_ASSERT(n == n_want && !memcmp(ids, want_ids, n * sizeof *ids));
    CU_ASSERT_EQUAL(ids[0], tokenizer_im_start_id(tok)); /* special tokens are matched */
    free(ids);
    free(want_ids);
    free(text);
    m[1].role = "us\ner";
    CU_ASSERT_STRING_EQUAL(refused(&g, tok), "chat.messages[1].role");

    /* text prompt: the reference ids of "Hello world" pieces */
    Deltaserve__V1__GenerateRequest gt = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    gt.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
    gt.text = "Hello world";
    CU_ASSERT_EQUAL_FATAL(router_request_prompt_ids(&gt, tok, &ids, &n, &st), 0);
    static const int32_t hello[] = {441, 718, 417, 712};                 /* tiny-r2-tied */
    static const int32_t hello_own[] = {39, 68, 75, 373, 268, 272, 605}; /* own-r2-tied */
    const int32_t *want_hello = own_model ? hello_own : hello;
    size_t n_hello = own_model ? 7 : 4;
    CU_ASSERT_EQUAL(n, n_hello);
    CU_ASSERT(n == n_hello && !memcmp(ids, want_hello, n_hello * sizeof *want_hello));
    free(ids);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("router/request", setup, teardown);
    CU_add_test(s, "validation names the field", test_validation);
    CU_add_test(s, "chatml and prompt ids", test_chatml_and_prompt_ids);
    return testutil_cunit_run();
}
