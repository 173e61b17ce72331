/* router_wire against protobuf-c: the bytes router_wire_encode_tokens writes are the bytes
 * protobuf_c_message_pack writes for the same ids and text (negative ids, ids of every varint
 * length, empty text, text over 127 bytes, no ids); router_wire_decode_tokens reads what
 * protobuf-c packs and what another encoder may send (unpacked ids, several packed runs,
 * 10-byte ids), and refuses any other field, truncated input and an empty message, which then
 * go to protobuf-c. One case breaks the encoding on purpose and checks the comparison fails. */
#include <stdlib.h>
#include <string.h>

#include <CUnit/Basic.h>

#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "router/router_wire.h"
#include "tests/testutil/testutil.h"

static void *sys_alloc(void *d, size_t n)
{
    (void)d;
    return malloc(n);
}

static void sys_free(void *d, void *p)
{
    (void)d;
    free(p);
}

static ProtobufCAllocator heap = {sys_alloc, sys_free, NULL};

/* protobuf-c's bytes of ids + text; caller frees. */
static uint8_t *pb_pack(const int32_t *ids, size_t n, const char *text, size_t *len)
{
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    m.token_ids = (int32_t *)ids;
    m.n_token_ids = n;
    m.text = (char *)text;
    *len = protobuf_c_message_get_packed_size(&m.base);
    uint8_t *b = malloc(*len + 1);
    protobuf_c_message_pack(&m.base, b);
    return b;
}

/* 1: router_wire writes exactly protobuf-c's bytes for ids + text. */
static int same_as_protobuf_c(const int32_t *ids, size_t n, const char *text, int corrupt)
{
    size_t len;
    uint8_t *want = pb_pack(ids, n, text, &len);
    const size_t tl = strlen(text);
    uint8_t *got = malloc(router_wire_tokens_max(n, tl));
    size_t k = router_wire_encode_tokens(ids, n, text, tl, got);
    CU_ASSERT(k <= router_wire_tokens_max(n, tl));
    if (corrupt && k) got[k - 1] ^= 1;
    const int same = k == len && memcmp(got, want, len) == 0;
    free(want);
    free(got);
    return same;
}

static void test_encode_matches(void)
{
    const int32_t ids[] = {0, 1, 127, 128, 16383, 16384, 2097151, 2097152, 268435455, 268435456,
                           INT32_MAX, -1, -2, INT32_MIN, 151643, 248044};
    const size_t n_all = sizeof ids / sizeof ids[0];
    char long_text[300];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = 0;
    CU_ASSERT(same_as_protobuf_c(ids, n_all, "hello", 0));
    CU_ASSERT(same_as_protobuf_c(ids, n_all, "", 0));
    CU_ASSERT(same_as_protobuf_c(ids, 1, "\xe4\xbd\xa0", 0));
    CU_ASSERT(same_as_protobuf_c(ids, 0, "only text", 0));
    CU_ASSERT(same_as_protobuf_c(ids, 0, "", 0));
    CU_ASSERT(same_as_protobuf_c(ids, n_all, long_text, 0));
    for (size_t i = 0; i < n_all; i++) CU_ASSERT(same_as_protobuf_c(&ids[i], 1, "a", 0));
    /* the comparison can fail */
    CU_ASSERT_FALSE(same_as_protobuf_c(ids, n_all, "hello", 1));
}

static void check_decoded(const uint8_t *b, size_t n, const int32_t *want, size_t n_want)
{
    Deltaserve__V1__GenerateResponse *m = router_wire_decode_tokens(b, n, &heap);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(m->n_token_ids, n_want);
    for (size_t i = 0; i < n_want; i++) CU_ASSERT_EQUAL(m->token_ids[i], want[i]);
    CU_ASSERT_STRING_EQUAL(m->text, "");
    CU_ASSERT_PTR_NULL(m->usage);
    CU_ASSERT_EQUAL(m->finish_reason, 0);
    /* protobuf-c reads the same */
    Deltaserve__V1__GenerateResponse *p = deltaserve__v1__generate_response__unpack(NULL, n, b);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    CU_ASSERT_EQUAL_FATAL(p->n_token_ids, n_want);
    for (size_t i = 0; i < n_want; i++) CU_ASSERT_EQUAL(p->token_ids[i], m->token_ids[i]);
    deltaserve__v1__generate_response__free_unpacked(p, NULL);
    protobuf_c_message_free_unpacked(&m->base, &heap);
}

static void test_decode(void)
{
    const int32_t ids[] = {5, 300, -1, INT32_MIN, 248044};
    size_t len;
    uint8_t *b = pb_pack(ids, 5, "", &len);
    check_decoded(b, len, ids, 5);
    free(b);
    /* unpacked ids (wire type 0), then a packed run of two */
    const uint8_t unpacked[] = {0x08, 0x05, 0x08, 0xac, 0x02, 0x0a, 0x02, 0x07, 0x09};
    const int32_t want_u[] = {5, 300, 7, 9};
    check_decoded(unpacked, sizeof unpacked, want_u, 4);
    /* -1 as a 10-byte varint, unpacked */
    const uint8_t neg[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    const int32_t want_n[] = {-1};
    check_decoded(neg, sizeof neg, want_n, 1);
}

static void test_decode_refuses(void)
{
    const int32_t ids[] = {5, 6};
    /* with text, usage, a finish reason: not taken */
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    Deltaserve__V1__Usage u = DELTASERVE__V1__USAGE__INIT;
    m.token_ids = (int32_t *)ids;
    m.n_token_ids = 2;
    uint8_t buf[256];
    m.text = "t";
    size_t n = protobuf_c_message_pack(&m.base, buf);
    CU_ASSERT_PTR_NULL(router_wire_decode_tokens(buf, n, &heap));
    m.text = "";
    m.usage = &u;
    u.prompt_tokens = 3;
    n = protobuf_c_message_pack(&m.base, buf);
    CU_ASSERT_PTR_NULL(router_wire_decode_tokens(buf, n, &heap));
    m.usage = NULL;
    m.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    n = protobuf_c_message_pack(&m.base, buf);
    CU_ASSERT_PTR_NULL(router_wire_decode_tokens(buf, n, &heap));
    /* truncated: a packed run longer than the message, a varint cut short; empty */
    const uint8_t cut_run[] = {0x0a, 0x05, 0x01, 0x02};
    const uint8_t cut_varint[] = {0x08, 0xff};
    const uint8_t eleven[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    CU_ASSERT_PTR_NULL(router_wire_decode_tokens(cut_run, sizeof cut_run, &heap));
    CU_ASSERT_PTR_NULL(router_wire_decode_tokens(cut_varint, sizeof cut_varint, &heap));
    CU_ASSERT_PTR_NULL(router_wire_decode_tokens(eleven, sizeof eleven, &heap));
    CU_ASSERT_PTR_NULL(router_wire_decode_tokens(buf, 0, &heap));
    const uint8_t empty_run[] = {0x0a, 0x00};
    CU_ASSERT_PTR_NULL(router_wire_decode_tokens(empty_run, sizeof empty_run, &heap));
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("router_wire", NULL, NULL);
    CU_add_test(s, "encode_matches_protobuf_c", test_encode_matches);
    CU_add_test(s, "decode", test_decode);
    CU_add_test(s, "decode_refuses", test_decode_refuses);
    return testutil_cunit_run();
}
