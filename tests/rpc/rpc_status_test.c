/* The one status <-> gRPC code mapping: every status code maps, the mapping is the documented
 * one, and a round trip keeps the meaning of every code a peer can send back. */
#include <CUnit/Basic.h>

#include "rpc/rpc_status.h"
#include "tests/testutil/testutil.h"

static void test_to_grpc(void)
{
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_OK), GRPC_STATUS_OK);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_INVALID), GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_RANGE), GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_FORMAT), GRPC_STATUS_INVALID_ARGUMENT);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_EXHAUSTED), GRPC_STATUS_RESOURCE_EXHAUSTED);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_NOMEM), GRPC_STATUS_RESOURCE_EXHAUSTED);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_NOT_FOUND), GRPC_STATUS_NOT_FOUND);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_UNAVAILABLE), GRPC_STATUS_UNAVAILABLE);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_IO), GRPC_STATUS_UNAVAILABLE);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_CANCELLED), GRPC_STATUS_CANCELLED);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_DEADLINE), GRPC_STATUS_DEADLINE_EXCEEDED);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_UNSUPPORTED), GRPC_STATUS_UNIMPLEMENTED);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_DEVICE), GRPC_STATUS_INTERNAL);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_INTERNAL), GRPC_STATUS_INTERNAL);
    CU_ASSERT_EQUAL(rpc_status_to_grpc(STATUS_UNAUTHENTICATED), GRPC_STATUS_UNAUTHENTICATED);
    CU_ASSERT_EQUAL(rpc_status_to_grpc((status_code)99), GRPC_STATUS_INTERNAL);
}

static void test_round_trip(void)
{
    /* every code a worker can send comes back as a status that maps to the same gRPC code */
    for (int c = STATUS_OK; c <= STATUS_UNAUTHENTICATED; c++) {
        grpc_status_code g = rpc_status_to_grpc((status_code)c);
        CU_ASSERT_EQUAL(rpc_status_to_grpc(rpc_status_from_grpc(g)), g);
    }
    CU_ASSERT_EQUAL(rpc_status_from_grpc(GRPC_STATUS_UNKNOWN), STATUS_INTERNAL);
    CU_ASSERT_EQUAL(rpc_status_from_grpc(GRPC_STATUS_DEADLINE_EXCEEDED), STATUS_DEADLINE);
    CU_ASSERT_EQUAL(rpc_status_from_grpc(GRPC_STATUS_RESOURCE_EXHAUSTED), STATUS_EXHAUSTED);
    CU_ASSERT_EQUAL(rpc_status_from_grpc(GRPC_STATUS_UNAUTHENTICATED), STATUS_UNAUTHENTICATED);
}

static void test_names(void)
{
    CU_ASSERT_STRING_EQUAL(rpc_status_grpc_name(GRPC_STATUS_OK), "OK");
    CU_ASSERT_STRING_EQUAL(rpc_status_grpc_name(GRPC_STATUS_INVALID_ARGUMENT), "INVALID_ARGUMENT");
    CU_ASSERT_STRING_EQUAL(rpc_status_grpc_name(GRPC_STATUS_RESOURCE_EXHAUSTED), "RESOURCE_EXHAUSTED");
    CU_ASSERT_STRING_EQUAL(rpc_status_grpc_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED");
    CU_ASSERT_STRING_EQUAL(rpc_status_grpc_name((grpc_status_code)77), "UNKNOWN");
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("rpc_status", NULL, NULL);
    CU_add_test(s, "to_grpc", test_to_grpc);
    CU_add_test(s, "round_trip", test_round_trip);
    CU_add_test(s, "names", test_names);
    return testutil_cunit_run();
}
