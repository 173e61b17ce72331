/* Unit tests for model/kv_pool: sizes checked, tables grown block by block, exhaustion that
 * takes nothing, release in any order giving every block back, shared blocks counted and freed
 * by the last holder, versions for mirrored tables, caller-owned table memory, and a random
 * walk of ensure / share / release checked against a plain recount. */
#include <CUnit/Basic.h>
#include <stdlib.h>
#include <string.h>

#include "model/kv_pool.h"
#include "tests/testutil/testutil.h"

static kv_pool *make(int seqs, int bt, int blocks, int per_seq, int32_t *table)
{
    kv_pool *p = NULL;
    status st = {0};
    int rc = kv_pool_create(&(kv_pool_opts){.n_seqs = seqs, .block_tokens = bt,
                                            .n_blocks = blocks, .max_blocks_per_seq = per_seq,
                                            .table = table},
                            &p, &st);
    CU_ASSERT_EQUAL_FATAL(rc, STATUS_OK);
    return p;
}

static void test_create_checks(void)
{
    kv_pool *p = NULL;
    status st = {0};
    CU_ASSERT_EQUAL(kv_pool_create(&(kv_pool_opts){.n_seqs = 0, .block_tokens = 16,
                                                   .n_blocks = 4, .max_blocks_per_seq = 4},
                                   &p, &st),
                    STATUS_INVALID);
    CU_ASSERT_PTR_NULL(p);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "kv pool"));
    CU_ASSERT_EQUAL(kv_pool_create(&(kv_pool_opts){.n_seqs = 2, .block_tokens = 16,
                                                   .n_blocks = 0, .max_blocks_per_seq = 4},
                                   &p, &st),
                    STATUS_INVALID);
}

static void test_grow_and_release(void)
{
    kv_pool *p = make(3, 16, 8, 4, NULL);
    status st = {0};
    CU_ASSERT_EQUAL(kv_pool_total_blocks(p), 8);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 8);
    CU_ASSERT_EQUAL(kv_pool_blocks_for(p, 0), 0);
    CU_ASSERT_EQUAL(kv_pool_blocks_for(p, 16), 1);
    CU_ASSERT_EQUAL(kv_pool_blocks_for(p, 17), 2);
    CU_ASSERT_EQUAL(kv_pool_need(p, 0, 33), 3);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 1, &st), STATUS_OK);
    CU_ASSERT_EQUAL(kv_pool_held(p, 0), 1);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 16, &st), STATUS_OK); /* same block */
    CU_ASSERT_EQUAL(kv_pool_held(p, 0), 1);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 40, &st), STATUS_OK);
    CU_ASSERT_EQUAL(kv_pool_held(p, 0), 3);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 5);
    const int32_t *t = kv_pool_table(p, 0);
    CU_ASSERT(t[0] != t[1] && t[1] != t[2] && t[0] != t[2]);
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(p, t[i]), 1);
    /* past the table's length */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 1, 65, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(kv_pool_held(p, 1), 0);
    /* exhaustion takes nothing */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 1, 64, &st), STATUS_OK); /* 4 blocks, 1 left */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 2, 20, &st), STATUS_EXHAUSTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "needs 2 more blocks, 1 are free"));
    CU_ASSERT_EQUAL(kv_pool_held(p, 2), 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 1);
    const uint32_t v0 = kv_pool_version(p, 0);
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(kv_pool_version(p, 0), v0 + 1);
    CU_ASSERT_EQUAL(kv_pool_held(p, 0), 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 4);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 2, 20, &st), STATUS_OK);
    kv_pool_release(p, 1);
    kv_pool_release(p, 2);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 8);
    for (int b = 0; b < 8; b++) CU_ASSERT_EQUAL(kv_pool_refs(p, b), 0);
    kv_pool_destroy(p);
}

static void test_share(void)
{
    kv_pool *p = make(3, 4, 10, 5, NULL);
    status st = {0};
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 12, &st), STATUS_OK); /* 3 blocks */
    CU_ASSERT_EQUAL(kv_pool_share(p, 1, 0, 4, &st), STATUS_INVALID); /* src holds 3 */
    CU_ASSERT_EQUAL(kv_pool_share(p, 1, 0, 2, &st), STATUS_OK);
    CU_ASSERT_EQUAL(kv_pool_share(p, 1, 0, 1, &st), STATUS_INVALID); /* dst not empty */
    const int32_t *a = kv_pool_table(p, 0), *b = kv_pool_table(p, 1);
    CU_ASSERT_EQUAL(a[0], b[0]);
    CU_ASSERT_EQUAL(a[1], b[1]);
    CU_ASSERT_EQUAL(kv_pool_refs(p, a[0]), 2);
    CU_ASSERT_EQUAL(kv_pool_refs(p, a[2]), 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 7);
    /* dst grows past the shared prefix with blocks of its own */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 1, 10, &st), STATUS_OK);
    CU_ASSERT_EQUAL(kv_pool_held(p, 1), 3);
    CU_ASSERT(b[2] != a[2]);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 6);
    /* the first holder leaves: shared blocks stay, its own go back */
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 7);
    CU_ASSERT_EQUAL(kv_pool_refs(p, b[0]), 1);
    kv_pool_release(p, 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 10);
    kv_pool_destroy(p);
}

static void test_caller_table(void)
{
    int32_t mem[2 * 3];
    memset(mem, 0x7f, sizeof mem);
    kv_pool *p = make(2, 8, 6, 3, mem);
    status st = {0};
    for (int i = 0; i < 6; i++) CU_ASSERT_EQUAL(mem[i], 0); /* cleared at create */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 1, 24, &st), STATUS_OK);
    CU_ASSERT_PTR_EQUAL(kv_pool_table(p, 1), mem + 3);
    CU_ASSERT_EQUAL(mem[3], kv_pool_table(p, 1)[0]);
    kv_pool_destroy(p); /* does not free mem */
    CU_ASSERT_EQUAL(mem[0], 0);
}

/* Random ensure / share / release against a recount of every block's holders. */
static void test_random_walk(void)
{
    enum { S = 6, BLK = 20, LD = 6 };
    kv_pool *p = make(S, 4, BLK, LD, NULL);
    status st = {0};
    uint64_t rng = 12345;
    for (int it = 0; it < 20000; it++) {
        const int op = (int)(testutil_rng_next(&rng) % 3), s = (int)(testutil_rng_next(&rng) % S);
        if (op == 0) {
            const int64_t n = (int64_t)(testutil_rng_next(&rng) % (LD * 4 + 1));
            const uint32_t need = kv_pool_need(p, s, n), fr = kv_pool_free_blocks(p);
            const int rc = kv_pool_ensure(p, s, n, &st);
            CU_ASSERT_EQUAL(rc, need > fr ? STATUS_EXHAUSTED : STATUS_OK);
        } else if (op == 1) {
            const int src = (int)(testutil_rng_next(&rng) % S);
            if (src != s && kv_pool_held(p, s) == 0 && kv_pool_held(p, src) > 0)
                CU_ASSERT_EQUAL(kv_pool_share(p, s, src, kv_pool_held(p, src), &st), STATUS_OK);
        } else {
            kv_pool_release(p, s);
        }
        int refs[BLK] = {0};
        for (int q = 0; q < S; q++)
            for (int i = 0; i < kv_pool_held(p, q); i++) refs[kv_pool_table(p, q)[i]]++;
        uint32_t n_free = 0;
        for (int b = 0; b < BLK; b++) {
            CU_ASSERT_EQUAL(kv_pool_refs(p, b), refs[b]);
            n_free += refs[b] == 0;
        }
        CU_ASSERT_EQUAL(kv_pool_free_blocks(p), n_free);
        if (CU_get_number_of_failures()) break;
    }
    for (int q = 0; q < S; q++) kv_pool_release(p, q);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), BLK);
    kv_pool_destroy(p);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("kv_pool", NULL, NULL);
    CU_add_test(s, "create_checks", test_create_checks);
    CU_add_test(s, "grow_and_release", test_grow_and_release);
    CU_add_test(s, "share", test_share);
    CU_add_test(s, "caller_table", test_caller_table);
    CU_add_test(s, "random_walk", test_random_walk);
    return testutil_cunit_run();
}
