/* common/dynlib: a library's symbols resolved and callable; a missing symbol or library gives
 * NULL, every symbol NULL and one sentence naming what is missing. */
#include <CUnit/Basic.h>
#include <string.h>

#include "common/dynlib.h"
#include "tests/testutil/testutil.h"

typedef size_t (*strlen_fn)(const char *);
typedef int (*abs_fn)(int);

static void test_resolves(void)
{
    strlen_fn f_strlen = NULL;
    abs_fn f_abs = NULL;
    const dynlib_sym syms[] = {{"strlen", (void **)&f_strlen}, {"abs", (void **)&f_abs}};
    char what[160] = "";
    void *lib = dynlib_open("libc.so.6", syms, 2, what, sizeof what);
    CU_ASSERT_PTR_NOT_NULL_FATAL(lib);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f_strlen);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f_abs);
    CU_ASSERT_EQUAL(f_strlen("deltaserve"), 10);
    CU_ASSERT_EQUAL(f_abs(-7), 7);
    dynlib_close(lib);
    dynlib_close(NULL);
}

static void test_missing_symbol(void)
{
    strlen_fn f_strlen = NULL;
    void *f_none = (void *)&f_strlen; /* not NULL before: must be NULL after */
    const dynlib_sym syms[] = {{"strlen", (void **)&f_strlen},
                               {"ds_no_such_symbol_here", &f_none}};
    char what[160] = "";
    CU_ASSERT_PTR_NULL(dynlib_open("libc.so.6", syms, 2, what, sizeof what));
    CU_ASSERT_PTR_NULL(f_strlen);
    CU_ASSERT_PTR_NULL(f_none);
    CU_ASSERT_STRING_EQUAL(what, "libc.so.6 lacks ds_no_such_symbol_here");
}

static void test_missing_library(void)
{
    strlen_fn f_strlen = (strlen_fn)strlen;
    const dynlib_sym syms[] = {{"strlen", (void **)&f_strlen}};
    char what[160] = "";
    CU_ASSERT_PTR_NULL(dynlib_open("libds-no-such-library.so.9", syms, 1, what, sizeof what));
    CU_ASSERT_PTR_NULL(f_strlen);
    CU_ASSERT(strncmp(what, "libds-no-such-library.so.9 not found (", 38) == 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(what, "LD_LIBRARY_PATH"));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("common/dynlib", NULL, NULL);
    CU_add_test(s, "resolves", test_resolves);
    CU_add_test(s, "missing_symbol", test_missing_symbol);
    CU_add_test(s, "missing_library", test_missing_library);
    return testutil_cunit_run();
}
