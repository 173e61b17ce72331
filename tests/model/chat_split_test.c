/* Unit tests for model/chat_split: realistic Qwen3.5 outputs (reasoning + answer, reasoning +
 * tool calls, parameters typed by a schema and without one, thinking off, literal "<" text,
 * unterminated blocks) fed whole, cut at every character boundary and at every pair of
 * boundaries; each time the pieces, adjacent text of one kind joined, must equal the expected
 * split. Also: reuse after reset, where the reasoning ends (chat_split_reasoning_end, fed a
 * byte at a time), and no allocation per feed outside tool calls (malloc is wrapped at link
 * time: see tests/model/BUILD). */
#include <CUnit/Basic.h>
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/chat_split.h"
#include "tests/testutil/alloc_count.h"
#include "tests/testutil/testutil.h"

/* ---- the collected split ------------------------------------------------------------------ */

/* The emitted pieces as one string: "R[...]" reasoning, "C[...]" content, "T<i>[name](args)"
 * a call, adjacent text pieces of one kind joined. */
typedef struct {
    char buf[8192];
    size_t len;
    int last_kind;
    int bad_json; /* a call's arguments were not one JSON object */
} collect;

static void put(collect *c, const char *p, size_t n)
{
    if (c->len + n >= sizeof c->buf) n = sizeof c->buf - 1 - c->len;
    memcpy(c->buf + c->len, p, n);
    c->len += n;
    c->buf[c->len] = 0;
}

static void sink(void *ud, const chat_piece *p)
{
    collect *c = ud;
    if (p->kind == CHAT_PIECE_TOOL_CALL) {
        char head[64];
        if (c->last_kind == CHAT_PIECE_REASONING || c->last_kind == CHAT_PIECE_CONTENT) put(c, "]", 1);
        snprintf(head, sizeof head, "T%d[", p->index);
        put(c, head, strlen(head));
        put(c, p->name, strlen(p->name));
        put(c, "](", 2);
        put(c, p->arguments, strlen(p->arguments));
        put(c, ")", 1);
        struct json_object *o = json_tokener_parse(p->arguments);
        if (!o || !json_object_is_type(o, json_type_object)) c->bad_json = 1;
        json_object_put(o);
        c->last_kind = CHAT_PIECE_TOOL_CALL;
        return;
    }
    CU_ASSERT(p->len > 0);
    if ((int)p->kind != c->last_kind) {
        if (c->last_kind == CHAT_PIECE_REASONING || c->last_kind == CHAT_PIECE_CONTENT) put(c, "]", 1);
        put(c, p->kind == CHAT_PIECE_REASONING ? "R[" : "C[", 2);
    }
    put(c, p->text, p->len);
    c->last_kind = (int)p->kind;
}

static void done(collect *c)
{
    if (c->last_kind == CHAT_PIECE_REASONING || c->last_kind == CHAT_PIECE_CONTENT) put(c, "]", 1);
    c->last_kind = 0;
}

/* Feeds text cut at the given positions (ascending, each inside (0, len)) and finishes. */
static void run_cuts(chat_split *s, bool in_reasoning, struct json_object *tools, const char *text,
                     const size_t *cuts, int n_cuts, collect *c)
{
    memset(c, 0, sizeof *c);
    chat_split_reset(s, in_reasoning, tools);
    size_t at = 0, len = strlen(text);
    for (int i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        CU_ASSERT_EQUAL(chat_split_feed(s, text + at, to - at, sink, c), 0);
        at = to;
    }
    CU_ASSERT_EQUAL(chat_split_finish(s, sink, c), 0);
    done(c);
}

static int char_boundary(const char *t, size_t i) { return ((unsigned char)t[i] & 0xc0) != 0x80; }

static int n_failed_cuts;

/* The whole feed, every single cut and (for short texts) every pair of cuts, and one character
 * per piece, each against want. */
static void check_split(bool in_reasoning, struct json_object *tools, const char *text,
                        const char *want)
{
    chat_split *s = chat_split_new();
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    collect c;
    run_cuts(s, in_reasoning, tools, text, NULL, 0, &c);
    if (strcmp(c.buf, want)) {
        printf("\n  whole feed of %s\n    got  %s\n    want %s\n", text, c.buf, want);
        CU_FAIL("whole feed");
    }
    CU_ASSERT_FALSE(c.bad_json);
    size_t len = strlen(text);
    int fails = 0;
    for (size_t i = 1; i < len; i++) {
        if (!char_boundary(text, i)) continue;
        run_cuts(s, in_reasoning, tools, text, &i, 1, &c);
        if (strcmp(c.buf, want) && fails++ < 3)
            printf("\n  cut at %zu of %s\n    got  %s\n    want %s\n", i, text, c.buf, want);
        if (len > 160) continue;
        for (size_t j = i + 1; j < len; j++) {
            if (!char_boundary(text, j)) continue;
            size_t two[2] = {i, j};
            run_cuts(s, in_reasoning, tools, text, two, 2, &c);
            if (strcmp(c.buf, want) && fails++ < 3)
                printf("\n  cuts at %zu, %zu of %s\n    got  %s\n    want %s\n", i, j, text, c.buf,
                       want);
        }
    }
    size_t *every = calloc(len + 1, sizeof *every);
    CU_ASSERT_PTR_NOT_NULL_FATAL(every);
    int n = 0;
    for (size_t i = 1; i < len; i++)
        if (char_boundary(text, i)) every[n++] = i;
    run_cuts(s, in_reasoning, tools, text, every, n, &c);
    if (strcmp(c.buf, want) && fails++ < 3)
        printf("\n  one character per piece of %s\n    got  %s\n    want %s\n", text, c.buf, want);
    free(every);
    CU_ASSERT_EQUAL(fails, 0);
    n_failed_cuts += fails;
    chat_split_free(s);
}

/* ---- tools -------------------------------------------------------------------------------- */

static struct json_object *tools_of(const char *json)
{
    struct json_object *t = json_tokener_parse(json);
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    return t;
}

static const char WEATHER_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
    "{\"type\": \"integer\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"get_time\", \"parameters\": "
    "{\"type\": \"object\", \"properties\": {\"zone\": {\"type\": \"string\"}}}}}]";

static const char TYPED_TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": "
    "\"object\", \"properties\": {\"count\": {\"type\": \"integer\"}, \"ratio\": {\"type\": "
    "\"number\"}, \"flag\": {\"type\": \"boolean\"}, \"opts\": {\"type\": \"object\"}, "
    "\"tags\": {\"type\": \"array\"}, \"note\": {\"type\": \"string\"}, \"bad\": {\"type\": "
    "\"integer\"}, \"whole\": {\"type\": \"number\"}, \"gone\": {\"type\": \"string\"}, "
    "\"any\": {\"description\": \"no type\"}}}}}]";

/* ---- cases -------------------------------------------------------------------------------- */

static void test_reasoning_then_answer(void)
{
    check_split(true, NULL,
                "The user asks for the capital of France.\nThat is Paris.\n</think>\n\n"
                "The capital of France is Paris.",
                "R[The user asks for the capital of France.\nThat is Paris.\n]"
                "C[\n\nThe capital of France is Paris.]");
    /* an output that opens its own think block (a prompt without <think>) */
    check_split(false, NULL, "<think>\nShort.\n</think>\n\nYes.", "R[\nShort.\n]C[\n\nYes.]");
}

static void test_reasoning_then_tool_calls(void)
{
    struct json_object *tools = tools_of(WEATHER_TOOLS);
    check_split(true, tools,
                "I need the weather and the time.\n</think>\n\n"
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
                "<tool_call>\n<function=get_time>\n<parameter=zone>\nEurope/Paris\n</parameter>\n"
                "</function>\n</tool_call>",
                "R[I need the weather and the time.\n]C[\n\n]"
                "T0[get_weather]({\"city\": \"Paris\", \"days\": 3})C[\n]"
                "T1[get_time]({\"zone\": \"Europe/Paris\"})");
    /* an answer before the call; a city that looks like a number stays a string (schema) */
    check_split(false, tools,
                "Let me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n"
                "</parameter>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
                "C[Let me check.\n\n]T0[get_weather]({\"city\": \"1984\", \"days\": \"three\"})");
    json_object_put(tools);
}

static void test_schema_types(void)
{
    struct json_object *tools = tools_of(TYPED_TOOLS);
    check_split(false, tools,
                "<tool_call>\n<function=f>\n"
                "<parameter=count>\n7\n</parameter>\n"
                "<parameter=ratio>\n0.5\n</parameter>\n"
                "<parameter=whole>\n2\n</parameter>\n"
                "<parameter=flag>\nTrue\n</parameter>\n"
                "<parameter=opts>\n{\"deep\": {\"a\": [1, 2]},\n \"b\": null}\n</parameter>\n"
                "<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n"
                "<parameter=note>\n42\n</parameter>\n"
                "<parameter=bad>\nseven\n</parameter>\n"
                "<parameter=gone>\nNULL\n</parameter>\n"
                "<parameter=extra>\n5\n</parameter>\n"
                "<parameter=any>\n[1,\n</parameter>\n"
                "</function>\n</tool_call>",
                "T0[f]({\"count\": 7, \"ratio\": 0.5, \"whole\": 2, \"flag\": true, "
                "\"opts\": {\"deep\": {\"a\": [1, 2]},\n \"b\": null}, \"tags\": [\"x\", \"y\"], "
                "\"note\": \"42\", \"bad\": \"seven\", \"gone\": null, \"extra\": \"5\", "
                "\"any\": \"[1,\"})");
    /* a multi-line string keeps its inner newlines, loses the format's outer ones */
    check_split(false, tools,
                "<tool_call>\n<function=f>\n<parameter=note>\nline one\nline \"two\"\n\n"
                "</parameter>\n</function>\n</tool_call>",
                "T0[f]({\"note\": \"line one\\nline \\\"two\\\"\\n\"})");
    json_object_put(tools);
}

static void test_no_schema(void)
{
    /* no tools: JSON if it parses, else a string; a function the tools do not name likewise */
    const char *text = "<tool_call>\n<function=g>\n<parameter=n>\n3\n</parameter>\n"
                       "<parameter=s>\nParis\n</parameter>\n<parameter=o>\n{\"a\": 1}\n</parameter>\n"
                       "<parameter=b>\ntrue\n</parameter>\n<parameter=x>\n[1,\n</parameter>\n"
                       "<parameter=f>\n-2.5e3\n</parameter>\n</function>\n</tool_call>";
    const char *want = "T0[g]({\"n\": 3, \"s\": \"Paris\", \"o\": {\"a\": 1}, \"b\": true, "
                       "\"x\": \"[1,\", \"f\": -2.5e3})";
    check_split(false, NULL, text, want);
    struct json_object *tools = tools_of(WEATHER_TOOLS);
    check_split(false, tools, text, want);
    json_object_put(tools);
    /* a parameter without </parameter> ends at the next one; UTF-8 and quotes in values */
    check_split(true, NULL,
                "Él piensa… ☃\n</think>\n\n<tool_call>\n<function=say>\n<parameter=a>\n1\n"
                "<parameter=text>\n\"héllo\" ☃\n</parameter>\n</function>\n</tool_call>",
                "R[Él piensa… ☃\n]C[\n\n]T0[say]({\"a\": 1, \"text\": \"\\\"héllo\\\" ☃\"})");
}

static void test_thinking_off_and_literal_markers(void)
{
    check_split(false, NULL,
                "Use a < b and <b>bold</b>, x <tool that is not a call, <tool_cal> nor "
                "<think later, nor </think> here.",
                "C[Use a < b and <b>bold</b>, x <tool that is not a call, <tool_cal> nor "
                "<think later, nor </think> here.]");
    check_split(false, NULL, "Write <think> in the middle.", "C[Write <think> in the middle.]");
    check_split(false, NULL, "<b>Bold</b> start", "C[<b>Bold</b> start]");
    check_split(false, NULL, "ends with <", "C[ends with <]");
    check_split(false, NULL, "ends with <tool_ca", "C[ends with <tool_ca]");
    check_split(false, NULL, "<<<tool_call>\n<function=h>\n</function>\n</tool_call><",
                "C[<<]T0[h]({})C[<]");
    /* inside reasoning, a tool call is reasoning text */
    check_split(true, NULL, "Maybe <tool_call>\n<function=x>\n</function>\n</tool_call>?</think>ok",
                "R[Maybe <tool_call>\n<function=x>\n</function>\n</tool_call>?]C[ok]");
    check_split(true, NULL, "a </thin> b <</think>c", "R[a </thin> b <]C[c]");
}

static void test_unterminated(void)
{
    check_split(true, NULL, "Thinking on and on </thi", "R[Thinking on and on </thi]");
    check_split(false, NULL, "Sure.<tool_call>\n<function=f>\n<parameter=x>\n1",
                "C[Sure.<tool_call>\n<function=f>\n<parameter=x>\n1]");
    /* </function> came, </tool_call> did not: the call stands */
    check_split(false, NULL, "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n",
                "T0[f]({\"x\": 1})");
    /* closed but not a call: the block is answer text, markers included */
    check_split(false, NULL, "<tool_call>\nnot a call\n</tool_call> after",
                "C[<tool_call>\nnot a call\n</tool_call> after]");
    check_split(false, NULL, "<tool_call>\n<function=>\n</function>\n</tool_call>",
                "C[<tool_call>\n<function=>\n</function>\n</tool_call>]");
    check_split(false, NULL, "<tool_call>\n<function=f>\n</function>\ntrailing\n</tool_call>",
                "C[<tool_call>\n<function=f>\n</function>\ntrailing\n</tool_call>]");
    check_split(false, NULL, "<think>\nnever closed", "R[\nnever closed]");
}

static void test_check_can_fail(void)
{
    /* the comparison itself: a wrong expectation is caught at every cut */
    chat_split *s = chat_split_new();
    collect c;
    run_cuts(s, true, NULL, "a</think>b", NULL, 0, &c);
    CU_ASSERT_STRING_EQUAL(c.buf, "R[a]C[b]");
    CU_ASSERT_STRING_NOT_EQUAL(c.buf, "R[a</think>b]");
    size_t cut = 3;
    run_cuts(s, true, NULL, "a</think>b", &cut, 1, &c);
    CU_ASSERT_STRING_EQUAL(c.buf, "R[a]C[b]");
    chat_split_free(s);
}

static void test_reset_and_state(void)
{
    chat_split *s = chat_split_new();
    collect c;
    memset(&c, 0, sizeof c);
    chat_split_reset(s, true, NULL);
    CU_ASSERT_TRUE(chat_split_in_reasoning(s));
    chat_split_feed(s, "abc</thi", 8, sink, &c);
    CU_ASSERT_TRUE(chat_split_in_reasoning(s));
    chat_split_feed(s, "nk>x", 4, sink, &c);
    CU_ASSERT_FALSE(chat_split_in_reasoning(s));
    chat_split_feed(s, "<tool_call>\n<function=f>", 24, sink, &c);
    /* a new request drops what the old one held */
    memset(&c, 0, sizeof c);
    chat_split_reset(s, false, NULL);
    CU_ASSERT_FALSE(chat_split_in_reasoning(s));
    chat_split_feed(s, "hi", 2, sink, &c);
    chat_split_finish(s, sink, &c);
    done(&c);
    CU_ASSERT_STRING_EQUAL(c.buf, "C[hi]");
    chat_split_free(s);
}

/* chat_split_reasoning_end fed a byte at a time: never past the final answer while open, the
 * final answer once known and after finish (SIZE_MAX: the output ended inside reasoning). */
static void test_reasoning_end(void)
{
    static const struct {
        bool in_reasoning;
        const char *text;
        size_t want;
    } cases[] = {
        {true, "abc</think>\n\nHi", 11},
        {false, "<think>x</think>y <think>z</think>", 16},
        {false, "Hi <think>x</think>", 0},
        {true, "abc</thi", SIZE_MAX},
        {false, "<thi", 0},
        {false, "<tool_call>\n<function=f>\n</function>\n</tool_call></think>", 0},
        {true, "</think>", 8},
        {false, "", 0},
    };
    chat_split *s = chat_split_new();
    CU_ASSERT_PTR_NOT_NULL_FATAL(s);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        collect c;
        memset(&c, 0, sizeof c);
        chat_split_reset(s, cases[k].in_reasoning, NULL);
        size_t n = strlen(cases[k].text);
        bool final;
        for (size_t i = 0; i < n; i++) {
            chat_split_feed(s, cases[k].text + i, 1, sink, &c);
            size_t end = chat_split_reasoning_end(s, &final);
            if (final) {
                CU_ASSERT_EQUAL(end, cases[k].want);
            } else {
                CU_ASSERT_TRUE(end <= i + 1 && end <= cases[k].want);
            }
        }
        chat_split_finish(s, sink, &c);
        size_t end = chat_split_reasoning_end(s, &final);
        CU_ASSERT_TRUE(final);
        if (end != cases[k].want) printf("case %zu: reasoning end %zu, want %zu\n", k, end, cases[k].want);
        CU_ASSERT_EQUAL(end, cases[k].want);
    }
    chat_split_free(s);
}

static void test_big_call_grows(void)
{
    /* a call longer than the initial buffers */
    size_t n = 20000;
    char *text = malloc(n + 200), *want = malloc(n + 200);
    int k = sprintf(text, "<tool_call>\n<function=w>\n<parameter=s>\n");
    memset(text + k, 'z', n);
    sprintf(text + k + n, "\n</parameter>\n</function>\n</tool_call>");
    k = sprintf(want, "T0[w]({\"s\": \"");
    memset(want + k, 'z', n);
    sprintf(want + k + n, "\"})");
    chat_split *s = chat_split_new();
    collect *c = malloc(sizeof *c);
    memset(c, 0, sizeof *c);
    chat_split_reset(s, false, NULL);
    for (size_t i = 0; text[i]; i += 7)
        CU_ASSERT_EQUAL(chat_split_feed(s, text + i, strlen(text + i) < 7 ? strlen(text + i) : 7,
                                        sink, c), 0);
    chat_split_finish(s, sink, c);
    done(c);
    /* the collector keeps 8 KiB: compare the head and the length reached */
    CU_ASSERT_EQUAL(strncmp(c->buf, want, sizeof c->buf - 1), 0);
    free(c);
    free(text);
    free(want);
    chat_split_free(s);
}

static void count_sink(void *ud, const chat_piece *p) { *(size_t *)ud += p->len; }

static void test_no_alloc_per_feed(void)
{
    chat_split *s = chat_split_new();
    static const char text[] = "Some reasoning with < and </thi and more.\n</think>\n\nAn answer "
                               "with <b>tags</b> and <tool_ca text, ending in <";
    long before = testutil_allocs();
    size_t got = 0;
    for (int r = 0; r < 50; r++) {
        chat_split_reset(s, true, NULL);
        for (size_t i = 0; i < sizeof text - 1; i += 3)
            chat_split_feed(s, text + i, sizeof text - 1 - i < 3 ? sizeof text - 1 - i : 3,
                            count_sink, &got);
        chat_split_finish(s, count_sink, &got);
    }
    CU_ASSERT_EQUAL(testutil_allocs(), before);
    CU_ASSERT_EQUAL(got, 50 * (sizeof text - 1 - strlen("</think>")));
    chat_split_free(s);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("chat_split", NULL, NULL);
    CU_add_test(s, "reasoning_then_answer", test_reasoning_then_answer);
    CU_add_test(s, "reasoning_then_tool_calls", test_reasoning_then_tool_calls);
    CU_add_test(s, "schema_types", test_schema_types);
    CU_add_test(s, "no_schema", test_no_schema);
    CU_add_test(s, "thinking_off_and_literal_markers", test_thinking_off_and_literal_markers);
    CU_add_test(s, "unterminated", test_unterminated);
    CU_add_test(s, "check_can_fail", test_check_can_fail);
    CU_add_test(s, "reset_and_state", test_reset_and_state);
    CU_add_test(s, "reasoning_end", test_reasoning_end);
    CU_add_test(s, "big_call_grows", test_big_call_grows);
    CU_add_test(s, "no_alloc_per_feed", test_no_alloc_per_feed);
    return testutil_cunit_run();
}
