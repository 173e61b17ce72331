/* The embedded FileDescriptorSet is present and parseable, indexes every file and the symbols
 * tools ask for, computes dependency closures, and a damaged set is rejected. */
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "proto/proto_descriptors.h"
#include "rpc/rpc_reflection.h"
#include "tests/testutil/testutil.h"

static const char *services[] = {"deltaserve.v1.Worker"};

static void test_descriptor_present(void)
{
    CU_ASSERT(proto_descriptors_bytes > 1000);
    CU_ASSERT_EQUAL(proto_descriptors_data[0], 0x0a); /* field 1 (file), length-delimited */
}

static void test_parse_and_lookup(void)
{
    rpc_reflection *r;
    status st;
    CU_ASSERT_EQUAL_FATAL(rpc_reflection_create(proto_descriptors_data, proto_descriptors_bytes,
                                                services, 1, &r, &st), STATUS_OK);
    CU_ASSERT_EQUAL(rpc_reflection_n_files(r), 4);
    int ds = rpc_reflection_find_file(r, "deltaserve/v1/deltaserve.proto");
    int health = rpc_reflection_find_file(r, "grpc/health/v1/health.proto");
    CU_ASSERT(ds >= 0);
    CU_ASSERT(health >= 0);
    CU_ASSERT(rpc_reflection_find_file(r, "grpc/reflection/v1/reflection.proto") >= 0);
    CU_ASSERT(rpc_reflection_find_file(r, "grpc/reflection/v1alpha/reflection.proto") >= 0);
    CU_ASSERT_EQUAL(rpc_reflection_find_file(r, "nope.proto"), -1);

    const char *in_ds[] = {"deltaserve.v1.Worker",
                           "deltaserve.v1.Worker.Generate", "deltaserve.v1.Worker.GetLoad",
                           "deltaserve.v1.GenerateRequest",
                           "deltaserve.v1.GenerateResponse", "deltaserve.v1.FinishReason",
                           ".deltaserve.v1.Load", "deltaserve.v1.SamplingParams"};
    for (size_t i = 0; i < sizeof in_ds / sizeof *in_ds; i++) {
        CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, in_ds[i]), ds);
    }
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "grpc.health.v1.HealthCheckRequest"), health);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "grpc.health.v1.Health"), -1); /* not given */
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "grpc.health.v1.HealthCheckResponse.ServingStatus"),
                    health); /* nested enum */
    /* only the services given are described: the same file's Generation is not */
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1.Generation"), -1);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1.Generation.Generate"), -1);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1.Nope"), -1);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1"), -1);

    int idx[8];
    CU_ASSERT_EQUAL(rpc_reflection_closure(r, ds, idx, 8), 1); /* self-contained */
    CU_ASSERT_EQUAL(idx[0], ds);
    rpc_reflection_destroy(r);
}

/* The router's view: Generation described, Worker not; and the other way round. */
static void test_only_served_services(void)
{
    static const char *gen[] = {"deltaserve.v1.Generation", "grpc.health.v1.Health"};
    rpc_reflection *r;
    status st;
    CU_ASSERT_EQUAL_FATAL(rpc_reflection_create(proto_descriptors_data, proto_descriptors_bytes,
                                                gen, 2, &r, &st), STATUS_OK);
    int ds = rpc_reflection_find_file(r, "deltaserve/v1/deltaserve.proto");
    CU_ASSERT(ds >= 0);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1.Generation"), ds);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1.Generation.Abort"), ds);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1.Generation.GetModelInfo"), ds);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1.Worker"), -1);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "deltaserve.v1.Worker.GetLoad"), -1);
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "grpc.health.v1.Health"),
                    rpc_reflection_find_file(r, "grpc/health/v1/health.proto"));
    /* reflection's own files keep no service that was not given either */
    CU_ASSERT_EQUAL(rpc_reflection_find_symbol(r, "grpc.reflection.v1.ServerReflection"), -1);
    CU_ASSERT(rpc_reflection_find_symbol(r, "grpc.reflection.v1.ServerReflectionRequest") >= 0);
    rpc_reflection_destroy(r);
}

static void test_damaged_set_rejected(void)
{
    rpc_reflection *r = NULL;
    status st;
    /* truncated in the middle of the first file */
    CU_ASSERT_EQUAL(rpc_reflection_create(proto_descriptors_data, 100, services, 1, &r, &st),
                    STATUS_FORMAT);
    CU_ASSERT_PTR_NULL(r);
    /* empty */
    CU_ASSERT_EQUAL(rpc_reflection_create(proto_descriptors_data, 0, services, 1, &r, &st),
                    STATUS_FORMAT);
    /* a byte flipped into an impossible wire type */
    unsigned char *copy = malloc(proto_descriptors_bytes);
    memcpy(copy, proto_descriptors_data, proto_descriptors_bytes);
    copy[0] = 0x0f; /* field 1, wire type 7 */
    CU_ASSERT_EQUAL(rpc_reflection_create(copy, proto_descriptors_bytes, services, 1, &r, &st),
                    STATUS_FORMAT);
    free(copy);
}

static void test_closure_with_dependencies(void)
{
    /* a hand-made set: a.proto depends on b.proto which depends on c.proto */
    static const unsigned char set[] = {
        0x0a, 0x0e, 0x0a, 0x07, 'a', '.', 'p', 'r', 'o', 't', 'o', 0x1a, 0x03, 'b', '.', 'p',
        0x0a, 0x0c, 0x0a, 0x03, 'b', '.', 'p', 0x1a, 0x03, 'c', '.', 'p', 0x12, 0x00,
        0x0a, 0x05, 0x0a, 0x03, 'c', '.', 'p',
    };
    rpc_reflection *r;
    status st;
    CU_ASSERT_EQUAL_FATAL(rpc_reflection_create(set, sizeof set, services, 1, &r, &st), STATUS_OK);
    int idx[4];
    int a = rpc_reflection_find_file(r, "a.proto");
    CU_ASSERT_EQUAL_FATAL(rpc_reflection_closure(r, a, idx, 4), 3);
    CU_ASSERT_STRING_EQUAL(rpc_reflection_file_name(r, idx[0]), "a.proto");
    CU_ASSERT_STRING_EQUAL(rpc_reflection_file_name(r, idx[1]), "b.p");
    CU_ASSERT_STRING_EQUAL(rpc_reflection_file_name(r, idx[2]), "c.p");
    rpc_reflection_destroy(r);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("rpc_reflection", NULL, NULL);
    CU_add_test(s, "descriptor_present", test_descriptor_present);
    CU_add_test(s, "parse_and_lookup", test_parse_and_lookup);
    CU_add_test(s, "only_served_services", test_only_served_services);
    CU_add_test(s, "damaged_set_rejected", test_damaged_set_rejected);
    CU_add_test(s, "closure_with_dependencies", test_closure_with_dependencies);
    return testutil_cunit_run();
}
