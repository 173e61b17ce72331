/* common/utf8: valid text of every length, and each kind of invalid sequence, with the valid
 * prefix before it. */
#include <CUnit/Basic.h>
#include <string.h>

#include "common/utf8.h"
#include "tests/testutil/testutil.h"

static void test_valid(void)
{
    CU_ASSERT(utf8_valid("", 0));
    CU_ASSERT(utf8_valid("abc", 3));
    CU_ASSERT(utf8_valid("\xc3\xa9", 2));             /* é */
    CU_ASSERT(utf8_valid("\xe2\x82\xac", 3));         /* € */
    CU_ASSERT(utf8_valid("\xf0\x9f\x98\x80", 4));     /* 😀 */
    CU_ASSERT(utf8_valid("\xf4\x8f\xbf\xbf", 4));     /* U+10FFFF */
    CU_ASSERT(utf8_valid("\xed\x9f\xbf", 3));         /* U+D7FF, below the surrogates */
    CU_ASSERT(utf8_valid("a\0b", 3));                 /* NUL is a character */
}

static void test_invalid(void)
{
    CU_ASSERT(!utf8_valid("\xe2\x82", 2));            /* truncated */
    CU_ASSERT(!utf8_valid("\xc0\xaf", 2));            /* overlong 2 */
    CU_ASSERT(!utf8_valid("\xe0\x80\xaf", 3));        /* overlong 3 */
    CU_ASSERT(!utf8_valid("\xf0\x80\x80\xaf", 4));    /* overlong 4 */
    CU_ASSERT(!utf8_valid("\xed\xa0\x80", 3));        /* surrogate */
    CU_ASSERT(!utf8_valid("\x80", 1));                /* stray continuation */
    CU_ASSERT(!utf8_valid("\xf4\x90\x80\x80", 4));    /* > U+10FFFF */
    CU_ASSERT(!utf8_valid("\xff", 1));
    CU_ASSERT(!utf8_valid("\xe2\x28\xa1", 3));        /* bad continuation */
    CU_ASSERT_EQUAL(utf8_valid_prefix("ab\xe2\x82\xac\xe2\x82", 7), 5);
    CU_ASSERT_EQUAL(utf8_valid_prefix("\x80" "abc", 4), 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("common/utf8", NULL, NULL);
    CU_add_test(s, "valid", test_valid);
    CU_add_test(s, "invalid", test_invalid);
    return testutil_cunit_run();
}
