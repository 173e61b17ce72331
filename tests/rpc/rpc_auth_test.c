/* rpc_auth: the bearer check ("Bearer <token>", the scheme in any case, the token exact: nothing
 * shorter, longer or without the scheme), the value a client sends (rpc_auth_bearer), file
 * errors at creation naming the flag, and the watched file: a rewritten token takes effect within
 * RPC_AUTH_RELOAD_MS (waited for as a condition, bounded), the old one is refused after, and an
 * emptied file keeps the previous token. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "rpc/rpc_auth.h"
#include "tests/testutil/testutil.h"

static char path[512];

static void write_file(const char *text)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    fputs(text, f);
    fclose(f);
    CU_ASSERT_EQUAL_FATAL(rename(tmp, path), 0);
}

static bool ok(rpc_auth *a, const char *v) { return rpc_auth_check(a, v, v ? strlen(v) : 0); }

/* Polls until v is accepted, at most 5 s (the reload happens within RPC_AUTH_RELOAD_MS). */
static bool accepted_soon(rpc_auth *a, const char *v)
{
    int64_t end = clock_now_ms() + 5000;
    while (clock_now_ms() < end) {
        if (ok(a, v)) return true;
        usleep(20000);
    }
    return false;
}

static void test_check(void)
{
    write_file("  s3cret-token\n");
    rpc_auth *a = NULL;
    status st;
    CU_ASSERT_EQUAL_FATAL(rpc_auth_create(path, &a, &st), STATUS_OK);
    CU_ASSERT_TRUE(ok(a, "Bearer s3cret-token"));
    CU_ASSERT_FALSE(ok(a, NULL));
    CU_ASSERT_FALSE(ok(a, ""));
    CU_ASSERT_FALSE(ok(a, "s3cret-token"));
    CU_ASSERT_FALSE(ok(a, "Bearer s3cret-toke"));
    CU_ASSERT_FALSE(ok(a, "Bearer s3cret-token2"));
    CU_ASSERT_FALSE(ok(a, "Bearer s3cret-tokeN"));
    CU_ASSERT_FALSE(rpc_auth_check(a, "Bearer s3cret-token", 18)); /* a prefix of the value */
    /* the scheme is case-insensitive (RFC 7235), the token is not */
    CU_ASSERT_TRUE(ok(a, "bearer s3cret-token"));
    CU_ASSERT_TRUE(ok(a, "BEARER s3cret-token"));
    CU_ASSERT_TRUE(ok(a, "bEaReR s3cret-token"));
    CU_ASSERT_FALSE(ok(a, "Bearer S3CRET-TOKEN"));
    CU_ASSERT_FALSE(ok(a, "Bearer\ts3cret-token"));
    CU_ASSERT_FALSE(ok(a, "Bearxr s3cret-token"));
    CU_ASSERT_FALSE(ok(a, "Bearer_s3cret-token"));
    char buf[RPC_AUTH_MAX_VALUE];
    size_t n = rpc_auth_bearer(a, buf);
    CU_ASSERT_EQUAL(n, strlen("Bearer s3cret-token"));
    CU_ASSERT_EQUAL(memcmp(buf, "Bearer s3cret-token", n), 0);
    rpc_auth_destroy(a);
}

static void test_create_errors(void)
{
    rpc_auth *a = NULL;
    status st;
    char missing[600];
    snprintf(missing, sizeof missing, "%s.missing", path);
    CU_ASSERT_EQUAL(rpc_auth_create(missing, &a, &st), STATUS_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, missing));
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--auth-token-file"));
    CU_ASSERT_EQUAL(rpc_auth_create_flag(missing, "--worker-token-file", &a, &st), STATUS_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "--worker-token-file"));
    write_file(" \n");
    CU_ASSERT_EQUAL(rpc_auth_create(path, &a, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "empty token"));
    CU_ASSERT_PTR_NULL(a);
}

static void test_reload(void)
{
    write_file("old-token");
    rpc_auth *a = NULL;
    status st;
    CU_ASSERT_EQUAL_FATAL(rpc_auth_create(path, &a, &st), STATUS_OK);
    CU_ASSERT_TRUE(ok(a, "Bearer old-token"));
    write_file("the-new-token\n");
    CU_ASSERT_TRUE(accepted_soon(a, "Bearer the-new-token"));
    CU_ASSERT_FALSE(ok(a, "Bearer old-token"));
    write_file(""); /* emptied (a writer mid-way): the token stays */
    int64_t end = clock_now_ms() + 2 * RPC_AUTH_RELOAD_MS + 100;
    bool kept = true;
    while (clock_now_ms() < end) { /* across two reload checks */
        kept = kept && ok(a, "Bearer the-new-token");
        usleep(20000);
    }
    CU_ASSERT_TRUE(kept);
    write_file("third");
    CU_ASSERT_TRUE(accepted_soon(a, "Bearer third"));
    rpc_auth_destroy(a);
}

int main(void)
{
    const char *dir = getenv("TEST_TMPDIR");
    snprintf(path, sizeof path, "%s/rpc_auth_token", dir ? dir : "/tmp");
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("rpc_auth", NULL, NULL);
    CU_add_test(s, "check", test_check);
    CU_add_test(s, "create_errors", test_create_errors);
    CU_add_test(s, "reload", test_reload);
    return testutil_cunit_run();
}
