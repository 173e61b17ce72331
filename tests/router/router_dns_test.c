#include <CUnit/Basic.h>
#include <string.h>

#include "router/router_dns.h"
#include "tests/testutil/testutil.h"

static router_dns_list L; /* large: static */

static void test_parse_list(void)
{
    status st;
    CU_ASSERT_EQUAL(router_dns_parse_list("a:1, b:2,a:1,[::1]:3", &L, &st), 0);
    CU_ASSERT_EQUAL(L.n, 3);
    CU_ASSERT_STRING_EQUAL(L.addr[0], "a:1");
    CU_ASSERT_STRING_EQUAL(L.addr[1], "b:2");
    CU_ASSERT_STRING_EQUAL(L.addr[2], "[::1]:3");
    const char *bad[] = {"", " , ", "a", "a:", "a:0", "a:70000", ":5", "a:b", "::1:5", "[::1]5",
                         "x:1,y"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CU_ASSERT_EQUAL(router_dns_parse_list(bad[i], &L, &st), STATUS_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--workers"));
    }
    CU_ASSERT_EQUAL(router_dns_parse_list("x:1,y", &L, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "'y'"));
}

static void test_resolve_localhost(void)
{
    status st;
    CU_ASSERT_EQUAL_FATAL(router_dns_resolve("localhost:5005", &L, &st), 0);
    int found = 0;
    for (int i = 0; i < L.n; i++) found |= !strcmp(L.addr[i], "127.0.0.1:5005");
    CU_ASSERT(found);
    CU_ASSERT_EQUAL(router_dns_resolve("127.0.0.1:7", &L, &st), 0);
    CU_ASSERT_EQUAL(L.n, 1);
    CU_ASSERT_STRING_EQUAL(L.addr[0], "127.0.0.1:7");
    CU_ASSERT_EQUAL(router_dns_resolve("localhost", &L, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--workers-dns"));
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("router/dns", NULL, NULL);
    CU_add_test(s, "parse list", test_parse_list);
    CU_add_test(s, "resolve localhost", test_resolve_localhost);
    return testutil_cunit_run();
}
