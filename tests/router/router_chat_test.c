/* router_chat: a chat stream's messages filled with the answer, the reasoning and tool calls
 * (ids "call_" + 24 hex); bad tool schemas name the field; the prompt's open <think> found; no
 * allocation per message without tool calls (malloc wrapped: see tests/router/BUILD); the
 * reasoning tokens counted exactly whatever the tokens per message and however late the text
 * of a token is released (as a stop matcher holds it back). */
#include <CUnit/Basic.h>
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "router/router_chat.h"
#include "tests/testutil/alloc_count.h"
#include "tests/testutil/testutil.h"

static Deltaserve__V1__Tool weather = DELTASERVE__V1__TOOL__INIT;
static Deltaserve__V1__Tool *tools[1] = {&weather};

static void chat_with_tools(Deltaserve__V1__ChatPrompt *chat, const char *params)
{
    Deltaserve__V1__ChatPrompt init = DELTASERVE__V1__CHAT_PROMPT__INIT;
    *chat = init;
    weather.name = "get_weather";
    weather.parameters = (char *)params;
    chat->n_tools = 1;
    chat->tools = tools;
}

static void test_messages(void)
{
    Deltaserve__V1__ChatPrompt chat;
    chat_with_tools(&chat, "{\"type\": \"object\", \"properties\": {\"days\": {\"type\": \"string\"}}}");
    router_chat c;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_chat_init(&c, &chat, true, 64, 7, &st), 0);
    static const char *pieces[] = {"Thinking", " <", "/think>\n\nHi", " <tool_", "call>\n<function=get_weather>\n",
                                   "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", " <"};
    char reasoning[256] = "", text[256] = "";
    int n_calls = 0;
    for (int i = 0; i < 7; i++) {
        Deltaserve__V1__GenerateResponse out = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
        CU_ASSERT_EQUAL(router_chat_message(&c, pieces[i], strlen(pieces[i]), i == 6, &out), 0);
        strcat(reasoning, out.reasoning);
        strcat(text, out.text);
        for (size_t k = 0; k < out.n_tool_calls; k++, n_calls++) {
            Deltaserve__V1__ToolCall *t = out.tool_calls[k];
            CU_ASSERT_EQUAL(i, 5);
            CU_ASSERT_STRING_EQUAL(t->name, "get_weather");
            CU_ASSERT_STRING_EQUAL(t->arguments, "{\"days\": \"3\"}"); /* the schema says string */
            CU_ASSERT_EQUAL(strlen(t->id), 29);
            CU_ASSERT_EQUAL(strncmp(t->id, "call_", 5), 0);
            for (int j = 5; j < 29; j++) CU_ASSERT(isxdigit((unsigned char)t->id[j]) && !isupper(t->id[j]));
        }
    }
    CU_ASSERT_STRING_EQUAL(reasoning, "Thinking ");
    CU_ASSERT_STRING_EQUAL(text, "\n\nHi  <");
    CU_ASSERT_EQUAL(n_calls, 1);
    router_chat_free(&c);
}

static void test_bad_schema(void)
{
    Deltaserve__V1__ChatPrompt chat;
    router_chat c;
    status st;
    chat_with_tools(&chat, "{\"type\": ");
    CU_ASSERT_EQUAL(router_chat_init(&c, &chat, false, 64, 1, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "chat.tools[0].parameters"));
    chat_with_tools(&chat, "[1, 2]");
    CU_ASSERT_EQUAL(router_chat_init(&c, &chat, false, 64, 1, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "chat.tools[0].parameters"));
    chat_with_tools(&chat, "");
    CU_ASSERT_EQUAL(router_chat_init(&c, &chat, false, 64, 1, &st), 0); /* empty = {} */
    router_chat_free(&c);
}

static void test_prompt_in_reasoning(void)
{
    static const char *yes[] = {"<|im_start|>assistant\n<think>\n", "<think>\nabc"};
    static const char *no[] = {"<|im_start|>assistant\n", "<think>\n\n</think>\n\n",
                               "<think>a</think><think>b</think>", ""};
    for (int i = 0; i < 2; i++) CU_ASSERT_TRUE(router_chat_prompt_in_reasoning(yes[i], strlen(yes[i])));
    for (int i = 0; i < 4; i++) CU_ASSERT_FALSE(router_chat_prompt_in_reasoning(no[i], strlen(no[i])));
}

/* The expected reasoning tokens of an output of tokens toks[0..n): those whose text starts
 * before the end of the reasoning (a prefix, through </think>; all when it is not closed). */
static uint32_t expected_reasoning(bool in_reasoning, const char *const *toks, int n)
{
    char all[512] = "";
    for (int i = 0; i < n; i++) strcat(all, toks[i]);
    if (!in_reasoning && strncmp(all, "<think>", 7) != 0) return 0;
    const char *close = strstr(all, "</think>");
    size_t end = close ? (size_t)(close - all) + 8 : SIZE_MAX;
    uint32_t k = 0;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (at < end) k++;
        at += strlen(toks[i]);
    }
    return k;
}

/* Feeds toks as the relay does: per_msg tokens a message, each token registered at its start
 * offset, its text released `lag` bytes late (as a stop matcher holds text back). */
static uint32_t counted_reasoning(bool in_reasoning, const char *const *toks, int n, int per_msg,
                                  size_t lag)
{
    Deltaserve__V1__ChatPrompt chat = DELTASERVE__V1__CHAT_PROMPT__INIT;
    router_chat c;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_chat_init(&c, &chat, in_reasoning, 64, 1, &st), 0);
    char all[512] = "";
    size_t total = 0, released = 0;
    for (int i = 0; i < n; i += per_msg) {
        router_chat_begin(&c);
        for (int j = i; j < i + per_msg && j < n; j++) {
            router_chat_token(&c, total);
            strcat(all, toks[j]);
            total += strlen(toks[j]);
            if (total > released + lag) {
                CU_ASSERT_EQUAL(router_chat_feed(&c, all + released, total - lag - released), 0);
                released = total - lag;
            }
        }
        bool last = i + per_msg >= n;
        if (last) CU_ASSERT_EQUAL(router_chat_feed(&c, all + released, total - released), 0);
        Deltaserve__V1__GenerateResponse out = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
        CU_ASSERT_EQUAL(router_chat_end(&c, last, &out), 0);
    }
    uint32_t k = router_chat_reasoning_tokens(&c);
    router_chat_free(&c);
    return k;
}

static void test_reasoning_tokens(void)
{
    static const char *const closed[] = {"Let", " me", " think", "</", "think", ">", "\n\n", "Hi", ""};
    static const char *const opened[] = {"<", "think", ">", "a", "", "</think>", "b", "</think>"};
    static const char *const opened_whole[] = {"<think>", "a</think>b", "c"};
    static const char *const none[] = {"Hi", "<think>", "x", "</think>", "y"};
    static const char *const call[] = {"<tool_", "call>", "x", "</tool_call>", "</think>"};
    static const char *const open_end[] = {"a", "<", "/thi", "", ""};
    static const char *const close_first[] = {"</think>", "x", "y"};
    struct {
        bool in_reasoning;
        const char *const *toks;
        int n;
        uint32_t want;
    } cases[] = {
        {true, closed, 9, 6},         {false, opened, 8, 6},  {false, opened_whole, 3, 2},
        {false, none, 5, 0},          {false, call, 5, 0},    {true, open_end, 5, 5},
        {true, close_first, 3, 1},    {false, closed, 9, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        CU_ASSERT_EQUAL(expected_reasoning(cases[k].in_reasoning, cases[k].toks, cases[k].n),
                        cases[k].want);
        for (int per_msg = 1; per_msg <= cases[k].n; per_msg++)
            for (size_t lag = 0; lag < 12; lag++) {
                uint32_t got = counted_reasoning(cases[k].in_reasoning, cases[k].toks, cases[k].n,
                                                 per_msg, lag);
                if (got != cases[k].want)
                    printf("case %zu per_msg %d lag %zu: %u reasoning tokens, want %u\n", k,
                           per_msg, lag, got, cases[k].want);
                CU_ASSERT_EQUAL(got, cases[k].want);
            }
    }
}

static void test_no_alloc_per_message(void)
{
    Deltaserve__V1__ChatPrompt chat = DELTASERVE__V1__CHAT_PROMPT__INIT;
    router_chat c;
    status st;
    CU_ASSERT_EQUAL_FATAL(router_chat_init(&c, &chat, true, 64, 1, &st), 0);
    long before = testutil_allocs();
    for (int i = 0; i < 1000; i++) {
        Deltaserve__V1__GenerateResponse out = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
        const char *p = i == 500 ? "</think>" : "word <b> ";
        CU_ASSERT_EQUAL(router_chat_message(&c, p, strlen(p), i == 999, &out), 0);
    }
    CU_ASSERT_EQUAL(testutil_allocs(), before);
    router_chat_free(&c);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("router_chat", NULL, NULL);
    CU_add_test(s, "messages", test_messages);
    CU_add_test(s, "bad_schema", test_bad_schema);
    CU_add_test(s, "prompt_in_reasoning", test_prompt_in_reasoning);
    CU_add_test(s, "reasoning_tokens", test_reasoning_tokens);
    CU_add_test(s, "no_alloc_per_message", test_no_alloc_per_message);
    return testutil_cunit_run();
}
