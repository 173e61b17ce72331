/* router_request: validation names the field; chat prompts rendered with the model's own
 * template (the tiny reference model's ChatML one, and the Qwen3.5 template for tools,
 * thinking and the template's own errors); prompt ids with the tiny reference tokenizer
 * (testutil_reference_dir). */
#include <CUnit/Basic.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "router/router_request.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

static tokenizer *tok;
static router_request_template chat_tmpl; /* the tiny model's template */
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
    router_request_template_init(&chat_tmpl, tok);
    if (!chat_tmpl.tmpl) {
        fprintf(stderr, "%s: %s\n", path, chat_tmpl.why);
        return 1;
    }
    return 0;
}

static int teardown(void)
{
    router_request_template_free(&chat_tmpl);
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

static void test_chat_and_prompt_ids(void)
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
    const char *want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\n";
    status st;
    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT;
    g.chat = &chat;
    CU_ASSERT_EQUAL(router_request_validate(&g, tok, &st), 0);
    int32_t *ids, *want_ids;
    size_t n, n_want;
    bool in_reasoning = true;
    CU_ASSERT_EQUAL_FATAL(router_request_prompt_ids(&g, tok, &chat_tmpl, &ids, &n,
                                                    &in_reasoning, &st), 0);
    CU_ASSERT_FALSE(in_reasoning);
    CU_ASSERT_EQUAL_FATAL(tokenizer_encode(tok, want, strlen(want), &want_ids, &n_want, &st), 0);
    CU_ASSERT_EQUAL(n, n_want);
    CU_ASSERT(n == n_want && !memcmp(ids, want_ids, n * sizeof *ids));
    CU_ASSERT_EQUAL(ids[0], tokenizer_im_start_id(tok)); /* special tokens are matched */
    free(ids);
    free(want_ids);
    /* roles are the template's business: this one renders them as given */
    m[1].role = "us\ner";
    CU_ASSERT_STRING_EQUAL(refused(&g, tok), "");
    m[1].role = "";
    CU_ASSERT_STRING_EQUAL(refused(&g, tok), "chat.messages[1].role");
    m[1].role = "user";

    /* no template: FAILED_PRECONDITION naming why */
    router_request_template none;
    router_request_template_init(&none, NULL);
    CU_ASSERT_EQUAL(router_request_prompt_ids(&g, tok, &none, &ids, &n, NULL, &st),
                    STATUS_PRECONDITION);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "no tokenizer"));
    router_request_template_free(&none);
    CU_ASSERT_EQUAL(router_request_prompt_ids(&g, tok, NULL, &ids, &n, NULL, &st),
                    STATUS_PRECONDITION);

    /* the Qwen3.5 template: tools, a tool call, thinking off; its errors are INVALID */
    size_t src_len;
    char *src = testutil_read_file("tests/model/data/qwen35_chat_template.jinja", &src_len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(src);
    router_request_template qwen = {0};
    char err[256];
    CU_ASSERT_EQUAL_FATAL(chat_template_parse(src, src_len, &qwen.tmpl, err, sizeof err), 0);
    Deltaserve__V1__Tool tool = DELTASERVE__V1__TOOL__INIT, *tools[1] = {&tool};
    tool.name = "get_weather";
    tool.description = "Weather";
    tool.parameters = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}";
    chat.tools = tools;
    chat.n_tools = 1;
    chat.thinking = DELTASERVE__V1__THINKING__THINKING_OFF;
    json_object *jm, *jt;
    int thinking;
    CU_ASSERT_EQUAL_FATAL(router_request_chat_json(&chat, &jm, &jt, &thinking, &st), 0);
    CU_ASSERT_EQUAL(thinking, 0);
    char *text;
    size_t len;
    CU_ASSERT_EQUAL_FATAL(router_request_render_chat(&qwen, jm, jt, thinking, &text, &len,
                                                     &in_reasoning, &st), 0);
    CU_ASSERT_FALSE(in_reasoning);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "{\"type\": \"function\", \"function\": {\"name\": "
                                        "\"get_weather\", \"description\": \"Weather\", "
                                        "\"parameters\": {\"type\": \"object\""));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\n\nBe brief.<|im_end|>\n<|im_start|>user\nHi"));
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    free(text);
    json_object_put(jm);
    json_object_put(jt);
    chat.thinking = DELTASERVE__V1__THINKING__THINKING_DEFAULT;
    CU_ASSERT_EQUAL_FATAL(router_request_prompt_ids(&g, tok, &qwen, &ids, &n, &in_reasoning,
                                                    &st), 0);
    CU_ASSERT_TRUE(in_reasoning);
    free(ids);
    /* an assistant tool call with JSON-text arguments */
    Deltaserve__V1__ChatMessage m3[3] = {DELTASERVE__V1__CHAT_MESSAGE__INIT,
                                         DELTASERVE__V1__CHAT_MESSAGE__INIT,
                                         DELTASERVE__V1__CHAT_MESSAGE__INIT};
    Deltaserve__V1__ChatMessage *mp3[3] = {&m3[0], &m3[1], &m3[2]};
    Deltaserve__V1__ToolCall tc = DELTASERVE__V1__TOOL_CALL__INIT, *tcs[1] = {&tc};
    tc.id = "call_1";
    tc.name = "get_weather";
    tc.arguments = "{\"city\": \"Paris\"}";
    m3[0].role = "user";
    m3[0].content = "Weather?";
    m3[1].role = "assistant";
    m3[1].tool_calls = tcs;
    m3[1].n_tool_calls = 1;
    m3[2].role = "tool";
    m3[2].content = "sunny";
    m3[2].tool_call_id = "call_1";
    chat.messages = mp3;
    chat.n_messages = 3;
    CU_ASSERT_EQUAL_FATAL(router_request_chat_json(&chat, &jm, &jt, &thinking, &st), 0);
    CU_ASSERT_EQUAL_FATAL(router_request_render_chat(&qwen, jm, jt, thinking, &text, &len, NULL,
                                                     &st), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "<tool_call>\n<function=get_weather>\n<parameter=city>\n"
                                        "Paris\n</parameter>\n</function>\n</tool_call><|im_end|>\n"
                                        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>"));
    free(text);
    json_object_put(jm);
    json_object_put(jt);
    tc.arguments = "[1]";
    CU_ASSERT_EQUAL(router_request_prompt_ids(&g, tok, &qwen, &ids, &n, NULL, &st),
                    STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "messages[1].tool_calls[0].function.arguments"));
    tc.arguments = "{}";
    tool.parameters = "nope";
    CU_ASSERT_EQUAL(router_request_prompt_ids(&g, tok, &qwen, &ids, &n, NULL, &st),
                    STATUS_INVALID);
    CU_ASSERT_STRING_EQUAL(st.msg, "chat.tools[0].parameters: not a JSON object");
    tool.parameters = "";
    /* the template's raise_exception: INVALID with its message */
    m3[0].role = "robot";
    CU_ASSERT_EQUAL(router_request_prompt_ids(&g, tok, &qwen, &ids, &n, NULL, &st),
                    STATUS_INVALID);
    CU_ASSERT_STRING_EQUAL(st.msg, "chat: No user query found in messages.");
    chat_template_free(qwen.tmpl);
    free(src);

    /* text prompt: the reference ids of "Hello world" pieces */
    Deltaserve__V1__GenerateRequest gt = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    gt.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
    gt.text = "Hello world";
    CU_ASSERT_EQUAL_FATAL(router_request_prompt_ids(&gt, tok, NULL, &ids, &n, NULL, &st), 0);
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
    CU_add_test(s, "chat and prompt ids", test_chat_and_prompt_ids);
    return testutil_cunit_run();
}
