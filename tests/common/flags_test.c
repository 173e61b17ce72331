/* common/flags: defaults, the environment and the command line in that order of precedence;
 * every kind; errors that name the flag (unknown, missing value, bad number, bad boolean);
 * positional arguments only where asked; integer lists. */
#include <CUnit/Basic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/flags.h"
#include "tests/testutil/testutil.h"

typedef struct opts {
    const char *model;
    int n;
    int64_t big;
    float temp;
    int on;
} opts;

static const flag_spec specs[] = {
    {"model", "DS_FLAGS_TEST_MODEL", NULL, FLAG_STR, offsetof(opts, model), "model"},
    {"n", "DS_FLAGS_TEST_N", "64", FLAG_INT, offsetof(opts, n), "n"},
    {"big", NULL, "-1", FLAG_I64, offsetof(opts, big), "big"},
    {"temp", NULL, "0.5", FLAG_FLOAT, offsetof(opts, temp), "temp"},
    {"on", "DS_FLAGS_TEST_ON", "0", FLAG_BOOL, offsetof(opts, on), "on"},
    {0},
};

static int parse(opts *o, int argc, char **argv, status *st)
{
    memset(o, 0, sizeof *o);
    return flags_parse(specs, o, argc, argv, "flags_test", st);
}

static void test_precedence(void)
{
    status st = {0};
    opts o;
    unsetenv("DS_FLAGS_TEST_N");
    unsetenv("DS_FLAGS_TEST_ON");
    char *a0[] = {"cmd"};
    CU_ASSERT_EQUAL(parse(&o, 1, a0, &st), 0);
    CU_ASSERT(o.model == NULL && o.n == 64 && o.big == -1 && o.temp == 0.5f && o.on == 0);
    setenv("DS_FLAGS_TEST_N", "7", 1);
    setenv("DS_FLAGS_TEST_ON", "true", 1);
    CU_ASSERT_EQUAL(parse(&o, 1, a0, &st), 0);
    CU_ASSERT(o.n == 7 && o.on == 1);
    char *a1[] = {"cmd", "--n", "9", "--model=m.gguf", "--big", "12345678901", "--temp=0.25"};
    CU_ASSERT_EQUAL(parse(&o, 7, a1, &st), 0);
    CU_ASSERT(o.n == 9 && o.big == 12345678901LL && o.temp == 0.25f && o.on == 1);
    CU_ASSERT_STRING_EQUAL(o.model, "m.gguf");
    unsetenv("DS_FLAGS_TEST_N");
    unsetenv("DS_FLAGS_TEST_ON");
    char *a2[] = {"cmd", "--on"};
    CU_ASSERT_EQUAL(parse(&o, 2, a2, &st), 0);
    CU_ASSERT_EQUAL(o.on, 1);
}

static void test_errors(void)
{
    status st = {0};
    opts o;
    char *unknown[] = {"cmd", "--nope", "1"};
    CU_ASSERT_EQUAL(parse(&o, 3, unknown, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--nope"));
    char *missing[] = {"cmd", "--n"};
    CU_ASSERT_EQUAL(parse(&o, 2, missing, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--n needs a value"));
    char *bad_int[] = {"cmd", "--n", "12x"};
    CU_ASSERT_EQUAL(parse(&o, 3, bad_int, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--n"));
    char *bad_float[] = {"cmd", "--temp=warm"};
    CU_ASSERT_EQUAL(parse(&o, 2, bad_float, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--temp"));
    setenv("DS_FLAGS_TEST_ON", "maybe", 1);
    char *a0[] = {"cmd"};
    CU_ASSERT_EQUAL(parse(&o, 1, a0, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--on"));
    unsetenv("DS_FLAGS_TEST_ON");
    char *stray[] = {"cmd", "file.gguf"};
    CU_ASSERT_EQUAL(parse(&o, 2, stray, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "file.gguf"));
}

static void test_positional(void)
{
    status st = {0};
    opts o = {0};
    const char *pos[2];
    int n_pos = 0;
    char *a[] = {"cmd", "a.gguf", "--n", "3", "b.gguf"};
    CU_ASSERT_EQUAL(flags_parse_pos(specs, &o, 5, a, "flags_test", pos, 2, &n_pos, &st), 0);
    CU_ASSERT(n_pos == 2 && o.n == 3);
    CU_ASSERT_STRING_EQUAL(pos[0], "a.gguf");
    CU_ASSERT_STRING_EQUAL(pos[1], "b.gguf");
}

static void test_int_list(void)
{
    int v[4];
    CU_ASSERT_EQUAL(flags_int_list("1,16,64,256", v, 4, 1, 4096), 4);
    CU_ASSERT(v[0] == 1 && v[1] == 16 && v[2] == 64 && v[3] == 256);
    CU_ASSERT_EQUAL(flags_int_list("0,1", v, 4, 0, 7), 2);
    CU_ASSERT(v[0] == 0 && v[1] == 1);
    CU_ASSERT_EQUAL(flags_int_list("1,2,3,4,5", v, 4, 1, 9), 0); /* too many */
    CU_ASSERT_EQUAL(flags_int_list("1,0", v, 4, 1, 9), 0);       /* below lo */
    CU_ASSERT_EQUAL(flags_int_list("1,x", v, 4, 1, 9), 0);
    CU_ASSERT_EQUAL(flags_int_list("1,,2", v, 4, 1, 9), 0);
    CU_ASSERT_EQUAL(flags_int_list("", v, 4, 1, 9), 0);
    CU_ASSERT_EQUAL(flags_int_list(NULL, v, 4, 1, 9), 0);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("common/flags", NULL, NULL);
    CU_add_test(s, "precedence", test_precedence);
    CU_add_test(s, "errors", test_errors);
    CU_add_test(s, "positional", test_positional);
    CU_add_test(s, "int_list", test_int_list);
    return testutil_cunit_run();
}
