/* The chat-template renderer (model/chat_template.h): Jinja features against outputs jinja2 3
 * produced with transformers' environment (the cases table), errors naming line:col, bounds
 * (recursion, loops, output), and every prefix of the Qwen3.5 template parsed without a crash. */
#include <CUnit/Basic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "model/chat_template.h"
#include "tests/testutil/testutil.h"

typedef struct render_case {
    const char *src, *vars, *want;
} render_case;

/* Expected outputs from jinja2 (transformers' _compile_jinja_template: trim_blocks,
 * lstrip_blocks, HF's tojson). */
static const render_case CASES[] = {
    {"{{ 'a' ~ 1 ~ none ~ true }}|{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.0 }} {{ 1e20 }} {{ 0.1 + 0.2 }}",
     "{}",
     "a1NoneTrue|3 -4 -2 3.5 1024 1.0 1e+20 0.30000000000000004"},
    {"{% for x in items if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }}{% if not loop.last %},{% endif %}{% else %}empty{% endfor %}",
     "{\"items\": [1, 2, 3]}",
     "1/2:2,2/2:3"},
    {"{% for x in [] %}x{% else %}empty{% endfor %}",
     "{}",
     "empty"},
    {"{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{{ d|length }}{{ d.keys()|list }}",
     "{\"d\": {\"b\": 1, \"a\": [1, \"x\", null, true, 2.5]}}",
     "b=1;a=[1, 'x', None, True, 2.5];2['b', 'a']"},
    {"{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-2:] }}|{{ l[::2] }}|{{ l[-1] }}|{{ s|length }}",
     "{\"s\": \"h\\u00e9llo\", \"l\": [1, 2, 3, 4, 5]}",
     "oll\xc3""\xa9""h|\xc3""\xa9""l|lo|[1, 3, 5]|5|5"},
    {"{{ '  x y  '|trim }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ 'ab'.startswith('a') }}{{ 'ab'.endswith('a') }}",
     "{}",
     "x y|['a', 'b', '', 'c']|['a', 'b']|hi|hi\n|TrueFalse"},
    {"{%- set ns = namespace(n=0, s='') %}{%- for i in range(5) %}{%- if i == 3 %}{% break %}{% endif %}{%- set ns.n = ns.n + i %}{%- endfor %}{{ ns.n }}",
     "{}",
     "3"},
    {"{% macro m(a, b=2, c='z') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(1, c='q') }}{{ m(b=5, a=0)|trim }}",
     "{}",
     "[12z][13z][12q][05z]"},
    {"{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ 'caf\xc3""\xa9"" \"</s>\"'|tojson }}",
     "{\"x\": {\"b\": [1, 2.0, null, true, \"\\u00fc\\n\"], \"a\": {}}}",
     "{\"b\": [1, 2.0, null, true, \"\xc3""\xbc""\\n\"], \"a\": {}}|{\n  \"b\": [\n    1,\n    2.0,\n    null,\n    true,\n    \"\xc3""\xbc""\\n\"\n  ],\n  \"a\": {}\n}|\"caf\xc3""\xa9"" \\\"</s>\\\"\""},
    {"{{ x is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ l is iterable }}{{ s is sequence }}{{ d is not mapping }}{{ f is false }}{{ t is true }}{{ 3 is odd }}{{ y is iterable }}",
     "{\"x\": 1, \"n\": null, \"s\": \"s\", \"d\": {}, \"l\": [], \"f\": false, \"t\": true}",
     "TrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrue"},
    {"{{ 'a' if x else 'b' }}{{ 'c' if y }}|{{ x and 'yes' }}|{{ y or 'dflt' }}|{{ 'b' in 'abc' }}{{ 2 in [1,2] }}{{ 'k' in {'k':1} }}{{ 'z' not in 'abc' }}",
     "{\"x\": 1}",
     "a|yes|dflt|TrueTrueTrueTrue"},
    {"  {%- if true %}\n  a\n  {% endif %}\n  b {# c #}\n    {% if true %}x{% endif %}\n{{- ' y ' -}}\n z",
     "{}",
     "  a\n  b x y z"},
    {"{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]{{ y|default('dv') }}{{ [1,2,3]|join('-') }}{{ 'Ab'|upper }}{{ 'Ab'|lower }}{{ [3,4]|first }}{{ [3,4]|last }}",
     "{}",
     "[inner 2]dv1-2-3ABab34"},
    {"{{ d.get('a') }}{{ d.get('zz', 'no') }}{{ d['a'] }}{{ d.a }}{{ d.missing }}|{{ l }}|{{ d }}",
     "{\"d\": {\"a\": \"it's\"}, \"l\": [\"a'b\", \"q\\\"\", 1.5, null]}",
     "it'snoit'sit's|[\"a'b\", 'q\"', 1.5, None]|{'a': \"it's\"}"},
    {"{{ 'abc'.replace('b', 'X') }}{{ 'a-b'|replace('-', '+') }}{{ '3'|int + 1 }}{{ 'x'|title }}{{ '%s'|string }}{{ 5|string }}",
     "{}",
     "aXca+b4X%s5"},
};

/* Renders src with vars (JSON text); returns the output (malloc'd) or NULL with err set. */
static char *render(const char *src, const char *vars, char *err, size_t errlen)
{
    chat_template *t;
    if (chat_template_parse(src, strlen(src), &t, err, errlen)) return NULL;
    json_object *v = json_tokener_parse(vars);
    char *out = NULL;
    size_t len;
    if (chat_template_render(t, v, &out, &len, err, errlen)) out = NULL;
    json_object_put(v);
    chat_template_free(t);
    return out;
}

static void test_cases(void)
{
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) {
        char err[512] = "";
        char *out = render(CASES[i].src, CASES[i].vars, err, sizeof err);
        if (!out || strcmp(out, CASES[i].want)) {
            printf("\ncase %zu: %s\n  want %s\n  got  %s\n", i, CASES[i].src, CASES[i].want,
                   out ? out : err);
            CU_FAIL("render differs from jinja2");
        }
        free(out);
    }
}

/* A check that a broken expectation is caught: the cases above can fail. */
static void test_case_check_can_fail(void)
{
    char err[512];
    char *out = render("{{ 1 + 1 }}", "{}", err, sizeof err);
    CU_ASSERT_PTR_NOT_NULL_FATAL(out);
    CU_ASSERT_STRING_NOT_EQUAL(out, "3");
    CU_ASSERT_STRING_EQUAL(out, "2");
    free(out);
}

static void expect_error(const char *src, const char *vars, const char *want)
{
    char err[512] = "";
    char *out = render(src, vars, err, sizeof err);
    CU_ASSERT_PTR_NULL(out);
    if (!strstr(err, want)) {
        printf("\n%s\n  want an error with '%s'\n  got '%s'\n", src, want, out ? out : err);
        CU_FAIL("error message");
    }
    free(out);
}

static void test_parse_errors(void)
{
    expect_error("{% if x %}a", "{}", "line 1:12: unexpected end of template, expected '{% endif %}'");
    expect_error("a\n  {{ x | nosuch }}", "{}", "line 2:10: unsupported filter 'nosuch'");
    expect_error("{{ x is nosuch }}", "{}", "line 1:9: unsupported test 'nosuch'");
    expect_error("{% include 'x' %}", "{}", "line 1:4: unsupported statement 'include'");
    expect_error("{% for x in y recursive %}{% endfor %}", "{}", "line 1:15: unsupported: recursive");
    expect_error("{{ 'abc }}", "{}", "line 1:4: unterminated string literal");
    expect_error("{{ x ", "{}", "line 1:1: unterminated '{{'");
    expect_error("{# c", "{}", "line 1:1: unterminated comment");
    expect_error("{{ x ! y }}", "{}", "line 1:6: unexpected character '!'");
    expect_error("{% endif %}", "{}", "line 1:4: unexpected 'endif'");
    expect_error("{{ (1 }}", "{}", "line 1:7: expected ')', found '}}'");
    expect_error("{{ }}", "{}", "line 1:4: expected an expression, found '}}'");
    expect_error("{% set %}", "{}", "line 1:8: expected a variable name");
    expect_error("{{ a[] }}", "{}", "line 1:5: empty subscript");
    char deep[2000];
    size_t k = 0;
    k += (size_t)sprintf(deep, "{{ ");
    for (int i = 0; i < 600; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 600; i++) deep[k++] = ')';
    strcpy(deep + k, " }}");
    expect_error(deep, "{}", "nesting deeper than");
}

static void test_render_errors(void)
{
    expect_error("{{ raise_exception('No user query found in messages.') }}", "{}",
                 "No user query found in messages.");
    expect_error("x\n{{ a.b.c }}", "{}", "line 2:6: attribute 'b' of an undefined value");
    expect_error("{{ a.b.c }}", "{\"a\": {}}", "line 1:8: attribute 'c' of an undefined value");
    expect_error("{{ 1 + 'a' }}", "{}", "line 1:6: unsupported operand types: a int and a string");
    expect_error("{{ x.upper2() }}", "{\"x\": \"s\"}", "unsupported method 'upper2' of a string");
    expect_error("{{ nosuch() }}", "{}", "'nosuch' is undefined");
    expect_error("{% for x in 5 %}{% endfor %}", "{}", "line 1:13: a int is not iterable");
    expect_error("{% set x = 1 %}{% set x.a = 2 %}", "{}", "only a namespace's attributes");
    expect_error("{{ 1 // 0 }}", "{}", "division by zero");
    expect_error("{{ m(1, 2) }}{% macro m(a) %}{% endmacro %}", "{}", "'m' is undefined");
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "{}", "too many arguments");
}

static void test_bounds(void)
{
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}",
                 "calls nested deeper than 64");
    expect_error("{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}",
                 "{}", "more than 1000000 loop iterations");
    expect_error("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}"
                 "{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
                 "{}", "out of memory or output past");
    /* many strings, each under the output bound: the total is bounded too */
    expect_error("{% set ns = namespace(l=[]) %}{% set s = 'x' * 1000000 %}"
                 "{% for i in range(400) %}{% set ns.l = ns.l + [s ~ i] %}{% endfor %}",
                 "{}", "strings made past");
}

static void test_chat(void)
{
    char err[512];
    size_t n;
    char *src = testutil_read_file("tests/model/data/qwen35_chat_template.jinja", &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(src);
    chat_template *t;
    CU_ASSERT_EQUAL_FATAL(chat_template_parse(src, n, &t, err, sizeof err), 0);
    CU_ASSERT_TRUE(chat_template_thinking_default(t));
    json_object *msgs = json_tokener_parse(
        "[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":null,"
        "\"tool_calls\":[{\"id\":\"1\",\"type\":\"function\",\"function\":{\"name\":\"f\","
        "\"arguments\":\"{\\\"x\\\": 1}\"}}]}]");
    char *out;
    size_t len;
    bool in_reasoning = true;
    CU_ASSERT_EQUAL_FATAL(chat_template_render_chat(t, msgs, NULL, 0, true, &out, &len,
                                                    &in_reasoning, err, sizeof err), 0);
    CU_ASSERT_FALSE(in_reasoning);
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "<function=f>\n<parameter=x>\n1\n</parameter>"));
    CU_ASSERT_PTR_NOT_NULL(strstr(out, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    free(out);
    CU_ASSERT_EQUAL(chat_template_render_chat(t, msgs, NULL, -1, true, &out, &len,
                                              &in_reasoning, err, sizeof err), 0);
    CU_ASSERT_TRUE(in_reasoning);
    free(out);
    json_object_put(msgs);
    /* arguments that are not a JSON object name the field */
    msgs = json_tokener_parse(
        "[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"\","
        "\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{oops\"}}]}]");
    CU_ASSERT_EQUAL(chat_template_render_chat(t, msgs, NULL, -1, true, &out, &len, NULL, err,
                                              sizeof err), -1);
    CU_ASSERT_PTR_NOT_NULL(strstr(err, "messages[1].tool_calls[0].function.arguments"));
    json_object_put(msgs);
    msgs = json_tokener_parse("[{\"content\":\"no role\"}]");
    CU_ASSERT_EQUAL(chat_template_render_chat(t, msgs, NULL, -1, true, &out, &len, NULL, err,
                                              sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "messages[0].role: missing or not a string");
    json_object_put(msgs);
    msgs = json_tokener_parse("[{\"role\":\"system\",\"content\":\"s\"}]");
    CU_ASSERT_EQUAL(chat_template_render_chat(t, msgs, NULL, -1, true, &out, &len, NULL, err,
                                              sizeof err), -1);
    CU_ASSERT_STRING_EQUAL(err, "No user query found in messages.");
    json_object_put(msgs);

    /* every prefix of the template: parses or fails with a message, never crashes */
    for (size_t k = 0; k < n; k++) {
        chat_template *p = NULL;
        err[0] = 0;
        int rc = chat_template_parse(src, k, &p, err, sizeof err);
        CU_ASSERT(rc == 0 || !strncmp(err, "line ", 5));
        chat_template_free(p);
    }
    chat_template_free(t);
    free(src);
}

/* Random byte soup built from template pieces: parse and render never crash. */
static void test_fuzz(void)
{
    static const char *const pieces[] = {
        "{{", "}}", "{%", "%}", "{#", "#}", "-", "+", " ", "\n", "if", "for", "in", "x", "set",
        "=", "'", "\"", "(", ")", "[", "]", ":", ",", ".", "|", "trim", "endif", "endfor",
        "else", "macro", "endmacro", "loop", "messages", "1", "~", "is", "not", "string", "ns",
        "namespace", "items", "{", "}", "\\", "raise_exception", "**", "//",
    };
    uint64_t rng = 29;
    char src[512];
    json_object *vars = json_tokener_parse(
        "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"x\":[1,2]}");
    for (int it = 0; it < 20000; it++) {
        size_t k = 0;
        int n = (int)(testutil_rng_next(&rng) % 24);
        for (int i = 0; i < n; i++) {
            const char *p = pieces[testutil_rng_next(&rng) % (sizeof pieces / sizeof *pieces)];
            size_t m = strlen(p);
            if (k + m + 1 >= sizeof src) break;
            memcpy(src + k, p, m);
            k += m;
        }
        src[k] = 0;
        chat_template *t;
        char err[256];
        if (chat_template_parse(src, k, &t, err, sizeof err) == 0) {
            char *out;
            size_t len;
            if (chat_template_render(t, vars, &out, &len, err, sizeof err) == 0) free(out);
            chat_template_free(t);
        }
    }
    json_object_put(vars);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("chat_template", NULL, NULL);
    CU_add_test(s, "cases", test_cases);
    CU_add_test(s, "case_check_can_fail", test_case_check_can_fail);
    CU_add_test(s, "parse_errors", test_parse_errors);
    CU_add_test(s, "render_errors", test_render_errors);
    CU_add_test(s, "bounds", test_bounds);
    CU_add_test(s, "chat", test_chat);
    CU_add_test(s, "fuzz", test_fuzz);
    return testutil_cunit_run();
}
