/* rpc_codec_unpack_with and rpc_arena (rpc/rpc_codec.h): a message unpacked from a one-slice
 * buffer (in place) and from a buffer of several slices (copied) reads back the same; messages
 * unpacked into an arena live in it until a reset, a message larger than the arena spills to
 * malloc (freed through the arena's free), the next reset grows the arena so the same message
 * then fits, and a string put into an arena message from malloc (the router's logprob text) is
 * freed with the message. */
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "rpc/rpc_codec.h"
#include "tests/testutil/testutil.h"

/* A response of n token ids 100, 101, ... with served_by "w0" and usage. */
static grpc_byte_buffer *response_buffer(size_t n, int split)
{
    int32_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(100 + i);
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    Deltaserve__V1__Usage u = DELTASERVE__V1__USAGE__INIT;
    u.prompt_tokens = 7;
    m.token_ids = ids;
    m.n_token_ids = n;
    m.usage = &u;
    m.served_by = "w0";
    const size_t len = protobuf_c_message_get_packed_size(&m.base);
    uint8_t *b = malloc(len);
    protobuf_c_message_pack(&m.base, b);
    free(ids);
    grpc_byte_buffer *bb;
    if (!split) {
        grpc_slice sl = grpc_slice_from_copied_buffer((const char *)b, len);
        bb = grpc_raw_byte_buffer_create(&sl, 1);
        grpc_slice_unref(sl);
    } else { /* two slices: the unpack must copy them into one */
        grpc_slice sl[2] = {grpc_slice_from_copied_buffer((const char *)b, len / 2),
                            grpc_slice_from_copied_buffer((const char *)b + len / 2,
                                                          len - len / 2)};
        bb = grpc_raw_byte_buffer_create(sl, 2);
        grpc_slice_unref(sl[0]);
        grpc_slice_unref(sl[1]);
    }
    free(b);
    return bb;
}

static void check_response(const Deltaserve__V1__GenerateResponse *m, size_t n)
{
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(m->n_token_ids, n);
    for (size_t i = 0; i < n; i++) CU_ASSERT_EQUAL(m->token_ids[i], (int32_t)(100 + i));
    CU_ASSERT_STRING_EQUAL(m->served_by, "w0");
    CU_ASSERT_PTR_NOT_NULL_FATAL(m->usage);
    CU_ASSERT_EQUAL(m->usage->prompt_tokens, 7);
}

static int in_arena(const rpc_arena *a, const void *p)
{
    const unsigned char *c = p;
    return a->buf && c >= a->buf && c < a->buf + a->cap;
}

static void test_unpack_one_and_many_slices(void)
{
    for (int split = 0; split < 2; split++) {
        grpc_byte_buffer *bb = response_buffer(5, split);
        ProtobufCMessage *m =
            rpc_codec_unpack_with(bb, &deltaserve__v1__generate_response__descriptor, 0, NULL);
        check_response((Deltaserve__V1__GenerateResponse *)m, 5);
        protobuf_c_message_free_unpacked(m, NULL);
        /* larger than max_bytes: refused */
        CU_ASSERT_PTR_NULL(
            rpc_codec_unpack_with(bb, &deltaserve__v1__generate_response__descriptor, 4, NULL));
        grpc_byte_buffer_destroy(bb);
    }
}

static void test_arena_lifetime_spill_and_growth(void)
{
    rpc_arena a;
    CU_ASSERT_EQUAL_FATAL(rpc_arena_init(&a, 512), 0);
    grpc_byte_buffer *small = response_buffer(4, 0), *big = response_buffer(400, 0);

    /* two small messages side by side in the arena, both intact until the reset */
    ProtobufCMessage *m1 =
        rpc_codec_unpack_with(small, &deltaserve__v1__generate_response__descriptor, 0, &a.alloc);
    ProtobufCMessage *m2 =
        rpc_codec_unpack_with(small, &deltaserve__v1__generate_response__descriptor, 0, &a.alloc);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m2);
    CU_ASSERT(in_arena(&a, m1) && in_arena(&a, m2));
    CU_ASSERT_NOT_EQUAL(m1, m2);
    CU_ASSERT_FALSE(a.spilled);
    check_response((Deltaserve__V1__GenerateResponse *)m1, 4);
    check_response((Deltaserve__V1__GenerateResponse *)m2, 4);
    protobuf_c_message_free_unpacked(m1, &a.alloc);
    protobuf_c_message_free_unpacked(m2, &a.alloc);
    rpc_arena_reset(&a);
    CU_ASSERT_EQUAL(a.used, 0);
    CU_ASSERT_EQUAL(a.cap, 512); /* nothing spilled: not grown */

    /* 400 ids (1.6 KB) do not fit: the ids array spills to malloc, the message still reads */
    ProtobufCMessage *mb =
        rpc_codec_unpack_with(big, &deltaserve__v1__generate_response__descriptor, 0, &a.alloc);
    check_response((Deltaserve__V1__GenerateResponse *)mb, 400);
    CU_ASSERT(a.spilled);
    CU_ASSERT_FALSE(in_arena(&a, ((Deltaserve__V1__GenerateResponse *)mb)->token_ids));
    protobuf_c_message_free_unpacked(mb, &a.alloc); /* the spilled part goes back to free */
    /* resets double it until the big message fits without spilling */
    for (int i = 0; i < 8 && a.spilled; i++) {
        rpc_arena_reset(&a);
        mb = rpc_codec_unpack_with(big, &deltaserve__v1__generate_response__descriptor, 0,
                                   &a.alloc);
        check_response((Deltaserve__V1__GenerateResponse *)mb, 400);
        protobuf_c_message_free_unpacked(mb, &a.alloc);
    }
    CU_ASSERT_FALSE(a.spilled);
    CU_ASSERT(a.cap >= 2048 && a.cap <= RPC_ARENA_MAX_BYTES);
    rpc_arena_reset(&a);

    /* a malloc'd string put into an arena message is freed with it (the router's logprob
     * alternatives' text; valgrind/ASan would report a leak or a bad free otherwise) */
    ProtobufCMessage *ms =
        rpc_codec_unpack_with(small, &deltaserve__v1__generate_response__descriptor, 0, &a.alloc);
    Deltaserve__V1__GenerateResponse *r = (Deltaserve__V1__GenerateResponse *)ms;
    r->text = strdup("hello");
    CU_ASSERT_FALSE(in_arena(&a, r->text));
    protobuf_c_message_free_unpacked(ms, &a.alloc);

    grpc_byte_buffer_destroy(small);
    grpc_byte_buffer_destroy(big);
    rpc_arena_free(&a);
    CU_ASSERT_PTR_NULL(a.buf);
}

/* An arena whose buffer could not be had serves every request from malloc. */
static void test_arena_empty(void)
{
    rpc_arena a;
    rpc_arena_init(&a, 64);
    free(a.buf); /* as after a failed init */
    a.buf = NULL;
    a.cap = 0;
    grpc_byte_buffer *small = response_buffer(3, 0);
    ProtobufCMessage *m =
        rpc_codec_unpack_with(small, &deltaserve__v1__generate_response__descriptor, 0, &a.alloc);
    check_response((Deltaserve__V1__GenerateResponse *)m, 3);
    CU_ASSERT(a.spilled);
    protobuf_c_message_free_unpacked(m, &a.alloc);
    grpc_byte_buffer_destroy(small);
    rpc_arena_reset(&a); /* grows to 4 KB */
    CU_ASSERT_EQUAL(a.cap, 4096);
    rpc_arena_free(&a);
}

int main(void)
{
    grpc_init();
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("rpc_codec", NULL, NULL);
    CU_add_test(s, "unpack_slices", test_unpack_one_and_many_slices);
    CU_add_test(s, "arena", test_arena_lifetime_spill_and_growth);
    CU_add_test(s, "arena_empty", test_arena_empty);
    int rc = testutil_cunit_run();
    grpc_shutdown();
    return rc;
}
