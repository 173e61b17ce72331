/* rpc_wire_find_nul over real packed requests: a NUL in each kind of string field (top level,
 * in a oneof, repeated, nested repeated messages) is found with its path and offset; strings
 * without one, bytes after a nested message and malformed input are not reported. */
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "rpc/rpc_wire.h"
#include "tests/testutil/testutil.h"

/* Packs m; returns the bytes (caller frees) and their count. */
static uint8_t *pack(const ProtobufCMessage *m, size_t *n)
{
    *n = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(*n ? *n : 1);
    protobuf_c_message_pack(m, b);
    return b;
}

/* Replaces the first '#' in b[0, n) by a NUL: protobuf-c packs with strlen, so the NUL is put
 * into the wire bytes after packing, as a client in another language would send it. */
static void put_nul(uint8_t *b, size_t n)
{
    uint8_t *p = memchr(b, '#', n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    *p = 0;
}

static int find(const uint8_t *b, size_t n, char *path, size_t *off)
{
    return rpc_wire_find_nul(&deltaserve__v1__generate_request__descriptor, b, n, path, off);
}

static void test_clean(void)
{
    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    char *stops[] = {"a", "b"};
    g.request_id = "id";
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
    g.text = "Hello";
    g.n_stop = 2;
    g.stop = stops;
    size_t n, off;
    uint8_t *b = pack(&g.base, &n);
    char path[RPC_WIRE_PATH_MAX];
    CU_ASSERT_EQUAL(find(b, n, path, &off), 0);
    CU_ASSERT_STRING_EQUAL(path, "");
    /* truncated: the walk stops quietly (unpack refuses it) */
    CU_ASSERT_EQUAL(find(b, n - 1, path, &off), 0);
    free(b);
}

static void test_text_and_id_and_stop(void)
{
    char path[RPC_WIRE_PATH_MAX];
    size_t n, off;
    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
    g.text = "Hello# and a long tail";
    uint8_t *b = pack(&g.base, &n);
    put_nul(b, n);
    CU_ASSERT_EQUAL(find(b, n, path, &off), 1);
    CU_ASSERT_STRING_EQUAL(path, "text");
    CU_ASSERT_EQUAL(off, 5);
    free(b);

    g.text = "fine";
    g.request_id = "a#b";
    b = pack(&g.base, &n);
    put_nul(b, n);
    CU_ASSERT_EQUAL(find(b, n, path, &off), 1);
    CU_ASSERT_STRING_EQUAL(path, "request_id");
    CU_ASSERT_EQUAL(off, 1);
    free(b);

    char *stops[] = {"zz", "yy", "xx#"};
    g.request_id = "";
    g.n_stop = 3;
    g.stop = stops;
    b = pack(&g.base, &n);
    put_nul(b, n);
    CU_ASSERT_EQUAL(find(b, n, path, &off), 1);
    CU_ASSERT_STRING_EQUAL(path, "stop[2]");
    CU_ASSERT_EQUAL(off, 2);
    free(b);
}

static void test_chat_fields(void)
{
    char path[RPC_WIRE_PATH_MAX];
    size_t n, off;
    Deltaserve__V1__ChatMessage m0 = DELTASERVE__V1__CHAT_MESSAGE__INIT, m1 = m0;
    Deltaserve__V1__ToolCall tc0 = DELTASERVE__V1__TOOL_CALL__INIT, tc1 = tc0;
    Deltaserve__V1__ToolCall *tcs[] = {&tc0, &tc1};
    Deltaserve__V1__ChatMessage *ms[] = {&m0, &m1};
    Deltaserve__V1__Tool t0 = DELTASERVE__V1__TOOL__INIT;
    Deltaserve__V1__Tool *ts[] = {&t0};
    Deltaserve__V1__ChatPrompt chat = DELTASERVE__V1__CHAT_PROMPT__INIT;
    chat.n_messages = 2;
    chat.messages = ms;
    chat.n_tools = 1;
    chat.tools = ts;
    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT;
    g.chat = &chat;
    m0.role = "user";
    m0.content = "hi";
    m1.role = "assistant";
    m1.n_tool_calls = 2;
    m1.tool_calls = tcs;
    tc0.name = "f";
    tc1.name = "g";
    t0.name = "f";
    struct {
        char **slot;
        const char *val, *path;
        size_t off;
    } cases[] = {
        {&m0.role, "us#er", "chat.messages[0].role", 2},
        {&m1.content, "#", "chat.messages[1].content", 0},
        {&m1.reasoning_content, "think#", "chat.messages[1].reasoning_content", 5},
        {&m1.tool_call_id, "c#1", "chat.messages[1].tool_call_id", 1},
        {&m1.name, "n#", "chat.messages[1].name", 1},
        {&tc1.arguments, "{\"a\":#}", "chat.messages[1].tool_calls[1].arguments", 5},
        {&tc0.id, "call_#", "chat.messages[1].tool_calls[0].id", 5},
        {&t0.description, "d#", "chat.tools[0].description", 1},
        {&t0.parameters, "{#}", "chat.tools[0].parameters", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *old = *cases[i].slot;
        *cases[i].slot = (char *)cases[i].val;
        uint8_t *b = pack(&g.base, &n);
        put_nul(b, n);
        CU_ASSERT_EQUAL(find(b, n, path, &off), 1);
        CU_ASSERT_STRING_EQUAL(path, cases[i].path);
        CU_ASSERT_EQUAL(off, cases[i].off);
        if (strcmp(path, cases[i].path) || off != cases[i].off)
            printf("case %zu: got %s offset %zu\n", i, path, off);
        free(b);
        *cases[i].slot = old;
    }
}

/* The check can fail: a packed request with no NUL but a '#' is clean. */
static void test_no_false_positive(void)
{
    char path[RPC_WIRE_PATH_MAX];
    size_t n, off;
    Deltaserve__V1__WorkerGenerateRequest w = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    int32_t ids[] = {0, 0, 0}; /* zero bytes in a packed varint field are not a string's */
    w.request_id = "r#";
    w.n_prompt_token_ids = 3;
    w.prompt_token_ids = ids;
    uint8_t *b = pack(&w.base, &n);
    CU_ASSERT_EQUAL(rpc_wire_find_nul(&deltaserve__v1__worker_generate_request__descriptor, b, n,
                                      path, &off), 0);
    put_nul(b, n);
    CU_ASSERT_EQUAL(rpc_wire_find_nul(&deltaserve__v1__worker_generate_request__descriptor, b, n,
                                      path, &off), 1);
    CU_ASSERT_STRING_EQUAL(path, "request_id");
    free(b);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("rpc_wire", NULL, NULL);
    CU_add_test(s, "clean", test_clean);
    CU_add_test(s, "text_id_stop", test_text_and_id_and_stop);
    CU_add_test(s, "chat_fields", test_chat_fields);
    CU_add_test(s, "no_false_positive", test_no_false_positive);
    return testutil_cunit_run();
}
