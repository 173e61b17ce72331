/* router_json (the HTTP door's output writer) checked against json-c's parser: escaped strings
 * read back as the input (valid UTF-8) or with U+FFFD per bad byte; numbers read back within
 * the printed precision; a buffer that is large enough is not reallocated. */
#include <CUnit/Basic.h>
#include <json-c/json.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/utf8.h"
#include "router/router_json.h"
#include "tests/testutil/testutil.h"

/* Parses b as one JSON string; returns its bytes (static) and length. */
static const char *parse_str(const router_json *b, size_t *len)
{
    static char out[4096];
    json_object *o = json_tokener_parse(b->p);
    CU_ASSERT_PTR_NOT_NULL_FATAL(o);
    CU_ASSERT_FATAL(json_object_is_type(o, json_type_string));
    *len = (size_t)json_object_get_string_len(o);
    CU_ASSERT_FATAL(*len < sizeof out);
    memcpy(out, json_object_get_string(o), *len);
    json_object_put(o);
    return out;
}

static void test_escapes(void)
{
    router_json b = {0};
    const char in[] = "a\"b\\c\n\t\x01\x1f/\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \0z";
    router_json_str(&b, in, sizeof in - 1);
    CU_ASSERT_FALSE(b.oom);
    size_t n;
    const char *s = parse_str(&b, &n);
    CU_ASSERT_EQUAL(n, sizeof in - 1); /* the NUL too: written as \u0000 */
    CU_ASSERT_EQUAL(memcmp(s, in, n), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(b.p, "\\u0000"));
    router_json_free(&b);
}

static void test_invalid_utf8_replaced(void)
{
    router_json b = {0};
    const char in[] = "x\xe2\x82"
                      "y\xff\xc0\xaf\xed\xa0\x80z"; /* cut, 0xff, overlong, surrogate */
    router_json_str(&b, in, sizeof in - 1);
    size_t n;
    const char *s = parse_str(&b, &n);
    CU_ASSERT_TRUE(utf8_valid(s, n));
    CU_ASSERT_EQUAL(s[0], 'x');
    CU_ASSERT_EQUAL(s[n - 1], 'z');
    CU_ASSERT_PTR_NOT_NULL(strstr(s, "y"));
    CU_ASSERT_PTR_NOT_NULL(strstr(s, "\xef\xbf\xbd")); /* U+FFFD */
    router_json_free(&b);
}

static void test_random_roundtrip(void)
{
    uint64_t rng = 42;
    router_json b = {0};
    for (int it = 0; it < 2000; it++) {
        char in[64];
        size_t n = testutil_rng_next(&rng) % sizeof in;
        for (size_t i = 0; i < n; i++)
            in[i] = (char)(testutil_rng_next(&rng) % 256);
        router_json_reset(&b);
        router_json_str(&b, in, n);
        size_t m;
        const char *s = parse_str(&b, &m);
        CU_ASSERT_TRUE(utf8_valid(s, m));
        if (utf8_valid(in, n)) {
            CU_ASSERT_EQUAL(m, n);
            CU_ASSERT_EQUAL(memcmp(s, in, n), 0);
        }
    }
    router_json_free(&b);
}

static void test_numbers(void)
{
    const int64_t ints[] = {0, 1, -1, 42, INT64_MAX, INT64_MIN, 1000000007};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        router_json b = {0};
        router_json_i64(&b, ints[i]);
        json_object *o = json_tokener_parse(b.p);
        CU_ASSERT_PTR_NOT_NULL_FATAL(o);
        CU_ASSERT_EQUAL(json_object_get_int64(o), ints[i]);
        json_object_put(o);
        router_json_free(&b);
    }
    const double fs[] = {0.0, -0.5, -1e-7, -0.0000005, -2.4204431, -13.999999, 3.0, -9998.25};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) {
        router_json b = {0};
        router_json_f(&b, fs[i]);
        json_object *o = json_tokener_parse(b.p);
        CU_ASSERT_PTR_NOT_NULL_FATAL(o);
        CU_ASSERT_TRUE(json_object_is_type(o, json_type_double));
        CU_ASSERT_DOUBLE_EQUAL(json_object_get_double(o), fs[i], 5e-7);
        json_object_put(o);
        router_json_free(&b);
    }
    router_json b = {0};
    router_json_f(&b, -INFINITY);
    router_json_raw(&b, " ", 1);
    router_json_f(&b, NAN);
    CU_ASSERT_STRING_EQUAL(b.p, "-9999.0 -9999.0");
    router_json_free(&b);
}

static void test_no_realloc_when_large_enough(void)
{
    router_json b = {0};
    CU_ASSERT_EQUAL(router_json_reserve(&b, 1 << 16), 0);
    char *p = b.p;
    for (int i = 0; i < 1000; i++) {
        router_json_reset(&b);
        router_json_lit(&b, "data: {\"text\":");
        router_json_str(&b, "hello \xe2\x82\xac", 9);
        router_json_f(&b, -1.25);
        router_json_i64(&b, i);
        CU_ASSERT_PTR_EQUAL(b.p, p);
    }
    router_json_free(&b);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("router/json", NULL, NULL);
    CU_add_test(s, "escapes", test_escapes);
    CU_add_test(s, "invalid utf8 replaced", test_invalid_utf8_replaced);
    CU_add_test(s, "random roundtrip", test_random_roundtrip);
    CU_add_test(s, "numbers", test_numbers);
    CU_add_test(s, "no realloc when large enough", test_no_realloc_when_large_enough);
    return testutil_cunit_run();
}
