/* Unit tests for model/kv_pool: sizes checked, tables grown block by block, exhaustion that
 * takes nothing, release in any order giving every block back, shared blocks counted and freed
 * by the last holder, blocks adopted from a list and held outside the tables (retain / drop),
 * versions for mirrored tables, caller-owned table memory, and a random walk of ensure / share /
 * adopt / retain / drop / release checked against a plain recount. */
#include <CUnit/Basic.h>
#include <stdbool.h>
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

/* A sequence's blocks kept by an outside holder (retain) outlive the sequence; another sequence
 * adopts them from the list; drop lets the outside holder go. */
static void test_adopt_retain_drop(void)
{
    kv_pool *p = make(3, 4, 8, 4, NULL);
    status st = {0};
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 10, &st), STATUS_OK); /* 3 blocks */
    int32_t kept[3];
    memcpy(kept, kv_pool_table(p, 0), sizeof kept);
    kv_pool_retain(p, kept, 3);
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(p, kept[i]), 2);
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 5); /* the retained blocks stay taken */
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(p, kept[i]), 1);
    /* adopt two of them; the table is theirs, the version moves */
    const uint32_t v1 = kv_pool_version(p, 1);
    CU_ASSERT_EQUAL(kv_pool_adopt(p, 1, kept, 2, &st), STATUS_OK);
    CU_ASSERT_EQUAL(kv_pool_version(p, 1), v1 + 1);
    CU_ASSERT_EQUAL(kv_pool_held(p, 1), 2);
    CU_ASSERT_EQUAL(kv_pool_table(p, 1)[0], kept[0]);
    CU_ASSERT_EQUAL(kv_pool_table(p, 1)[1], kept[1]);
    CU_ASSERT_EQUAL(kv_pool_refs(p, kept[0]), 2);
    CU_ASSERT_EQUAL(kv_pool_refs(p, kept[2]), 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 5);
    /* refusals change nothing: seq 1 holds blocks; a free block; out of range; past the table */
    CU_ASSERT_EQUAL(kv_pool_adopt(p, 1, kept, 1, &st), STATUS_INVALID);
    int32_t free_one = -1;
    for (int32_t b = 0; b < 8 && free_one < 0; b++)
        if (kv_pool_refs(p, b) == 0) free_one = b;
    const int32_t bad[][2] = {{kept[0], free_one}, {kept[0], 8}, {-1, kept[0]}};
    for (int k = 0; k < 3; k++) {
        CU_ASSERT_EQUAL(kv_pool_adopt(p, 2, bad[k], 2, &st), STATUS_INVALID);
        CU_ASSERT_EQUAL(kv_pool_held(p, 2), 0);
        CU_ASSERT_EQUAL(kv_pool_refs(p, kept[0]), 2);
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "not a held block"));
    CU_ASSERT_EQUAL(kv_pool_adopt(p, 2, kept, 5, &st), STATUS_INVALID); /* table of 4 */
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 5);
    /* seq 1 grows past the adopted blocks with its own */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 1, 12, &st), STATUS_OK);
    CU_ASSERT(kv_pool_table(p, 1)[2] != kept[2]);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 4);
    /* the outside holder drops: the adopted blocks stay with seq 1, the third goes back */
    kv_pool_drop(p, kept, 3);
    CU_ASSERT_EQUAL(kv_pool_refs(p, kept[0]), 1);
    CU_ASSERT_EQUAL(kv_pool_refs(p, kept[2]), 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 5);
    kv_pool_release(p, 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 8);
    /* adopting nothing is allowed */
    CU_ASSERT_EQUAL(kv_pool_adopt(p, 0, kept, 0, &st), STATUS_OK);
    CU_ASSERT_EQUAL(kv_pool_held(p, 0), 0);
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

/* Random ensure / share / adopt / retain / drop / release against a recount of every block's
 * holders: the tables' entries and the outside lists (a cache keeping block lists). */
static void test_random_walk(void)
{
    enum { S = 6, BLK = 20, LD = 6, KEPT = 8 };
    kv_pool *p = make(S, 4, BLK, LD, NULL);
    status st = {0};
    int32_t kept[KEPT][LD]; /* outside holders: lists of retained blocks */
    int n_kept[KEPT] = {0};
    uint64_t rng = 12345;
    for (int it = 0; it < 30000; it++) {
        const int op = (int)(testutil_rng_next(&rng) % 6), s = (int)(testutil_rng_next(&rng) % S);
        const int h = (int)(testutil_rng_next(&rng) % KEPT);
        if (op == 0) {
            const int64_t n = (int64_t)(testutil_rng_next(&rng) % (LD * 4 + 1));
            const uint32_t need = kv_pool_need(p, s, n), fr = kv_pool_free_blocks(p);
            const int rc = kv_pool_ensure(p, s, n, &st);
            CU_ASSERT_EQUAL(rc, need > fr ? STATUS_EXHAUSTED : STATUS_OK);
        } else if (op == 1) {
            const int src = (int)(testutil_rng_next(&rng) % S);
            if (src != s && kv_pool_held(p, s) == 0 && kv_pool_held(p, src) > 0)
                CU_ASSERT_EQUAL(kv_pool_share(p, s, src, kv_pool_held(p, src), &st), STATUS_OK);
        } else if (op == 2) { /* an outside holder keeps a prefix of s's table */
            if (n_kept[h] == 0 && kv_pool_held(p, s) > 0) {
                const int n = 1 + (int)(testutil_rng_next(&rng) % (uint64_t)kv_pool_held(p, s));
                memcpy(kept[h], kv_pool_table(p, s), (size_t)n * sizeof(int32_t));
                kv_pool_retain(p, kept[h], n);
                n_kept[h] = n;
            }
        } else if (op == 3) { /* s continues a kept list */
            const int n = n_kept[h] ? 1 + (int)(testutil_rng_next(&rng) % (uint64_t)n_kept[h]) : 0;
            const bool empty = kv_pool_held(p, s) == 0;
            CU_ASSERT_EQUAL(kv_pool_adopt(p, s, kept[h], n, &st), empty ? STATUS_OK : STATUS_INVALID);
            if (empty) CU_ASSERT_EQUAL(kv_pool_held(p, s), n);
        } else if (op == 4) {
            kv_pool_drop(p, kept[h], n_kept[h]);
            n_kept[h] = 0;
        } else {
            kv_pool_release(p, s);
        }
        int refs[BLK] = {0};
        for (int q = 0; q < S; q++)
            for (int i = 0; i < kv_pool_held(p, q); i++) refs[kv_pool_table(p, q)[i]]++;
        for (int k = 0; k < KEPT; k++)
            for (int i = 0; i < n_kept[k]; i++) refs[kept[k][i]]++;
        uint32_t n_free = 0;
        for (int b = 0; b < BLK; b++) {
            CU_ASSERT_EQUAL(kv_pool_refs(p, b), refs[b]);
            n_free += refs[b] == 0;
        }
        CU_ASSERT_EQUAL(kv_pool_free_blocks(p), n_free);
        if (CU_get_number_of_failures()) break;
    }
    for (int q = 0; q < S; q++) kv_pool_release(p, q);
    for (int k = 0; k < KEPT; k++) kv_pool_drop(p, kept[k], n_kept[k]);
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
    CU_add_test(s, "adopt_retain_drop", test_adopt_retain_drop);
    CU_add_test(s, "caller_table", test_caller_table);
    CU_add_test(s, "random_walk", test_random_walk);
    return testutil_cunit_run();
}
