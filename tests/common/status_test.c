#include <CUnit/Basic.h>
#include <string.h>

#include "common/status.h"
#include "tests/testutil/testutil.h"

static void test_fail_sets_code_and_message(void)
{
    status st;
    status_clear(&st);
    int rc = status_fail(&st, STATUS_FORMAT, "file %s: offset %d", "x.gguf", 42);
    CU_ASSERT_EQUAL(rc, STATUS_FORMAT);
    CU_ASSERT_EQUAL(st.code, STATUS_FORMAT);
    CU_ASSERT_STRING_EQUAL(st.msg, "file x.gguf: offset 42");
    CU_ASSERT_STRING_EQUAL(status_code_name(STATUS_FORMAT), "FORMAT");
    CU_ASSERT_EQUAL(status_fail(NULL, STATUS_IO, "ignored"), STATUS_IO);
}

static void test_long_message_truncated(void)
{
    status st;
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    status_fail(&st, STATUS_INVALID, "%s", big);
    CU_ASSERT_EQUAL(strlen(st.msg), sizeof st.msg - 1);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("common/status", NULL, NULL);
    CU_add_test(s, "fail sets code and message", test_fail_sets_code_and_message);
    CU_add_test(s, "long message truncated", test_long_message_truncated);
    return testutil_cunit_run();
}
