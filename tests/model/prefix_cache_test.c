/* Unit tests for model/prefix_cache: options checked, an empty cache, exact and partial blocks,
 * a snapshot at every position of three blocks, prompts that diverge inside a block, full nodes
 * shared by token content rather than block id, GreedyDual's order (value per byte first,
 * recency over time, a hit raising an entry again), reclaim giving only cache-held blocks back
 * (through an inner snapshot when it must), clear, heads, and a random walk of sequences that
 * resume, insert, end and reclaim, checked against a record of what was inserted with the
 * pool's counts verified after every operation. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/splitmix64.h"
#include "model/kv_pool.h"
#include "model/prefix_cache.h"
#include "tests/testutil/testutil.h"

#define MIB (1u << 20)

static kv_pool *make_pool(int seqs, int bt, int blocks, int per_seq)
{
    kv_pool *p = NULL;
    status st = {0};
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&(kv_pool_opts){.n_seqs = seqs, .block_tokens = bt,
                                                         .n_blocks = blocks,
                                                         .max_blocks_per_seq = per_seq},
                                         &p, &st),
                          STATUS_OK);
    return p;
}

static prefix_cache *make_cache(kv_pool *p, int snaps, uint64_t snap_bytes, uint64_t block_bytes)
{
    prefix_cache *c = NULL;
    status st = {0};
    CU_ASSERT_EQUAL_FATAL(prefix_cache_create(&(prefix_cache_opts){.kv = p, .n_snaps = snaps,
                                                                   .snap_bytes = snap_bytes,
                                                                   .block_bytes = block_bytes},
                                              &c, &st),
                          STATUS_OK);
    return c;
}

static void check(const prefix_cache *c)
{
    status st = {0};
    const int rc = prefix_cache_check(c, &st);
    if (rc != STATUS_OK) fprintf(stderr, "check: %s\n", st.msg);
    CU_ASSERT_EQUAL(rc, STATUS_OK);
}

static void fill(kv_pool *p, int seq, int n)
{
    status st = {0};
    CU_ASSERT_EQUAL_FATAL(kv_pool_ensure(p, seq, n, &st), STATUS_OK);
}

static void seq_tokens(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++) t[i] = base + i;
}

static prefix_match match(prefix_cache *c, const int32_t *t, int n, int64_t now)
{
    prefix_match m;
    memset(&m, 0x5a, sizeof m);
    prefix_cache_match(c, t, n, now, &m);
    return m;
}

static void test_create_checks(void)
{
    kv_pool *p = make_pool(1, 4, 4, 4);
    prefix_cache *c = NULL;
    status st = {0};
    CU_ASSERT_EQUAL(prefix_cache_create(&(prefix_cache_opts){.kv = NULL, .n_snaps = 2,
                                                             .snap_bytes = 1},
                                        &c, &st),
                    STATUS_INVALID);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "prefix cache"));
    CU_ASSERT_EQUAL(prefix_cache_create(&(prefix_cache_opts){.kv = p, .n_snaps = 0,
                                                             .snap_bytes = 1},
                                        &c, &st),
                    STATUS_INVALID);
    CU_ASSERT_EQUAL(prefix_cache_create(&(prefix_cache_opts){.kv = p, .n_snaps = 1,
                                                             .snap_bytes = 0},
                                        &c, &st),
                    STATUS_INVALID);
    CU_ASSERT_PTR_NULL(c);
    kv_pool_destroy(p);
}

static void test_empty(void)
{
    kv_pool *p = make_pool(2, 4, 16, 8);
    prefix_cache *c = make_cache(p, 4, MIB, 1024);
    const int32_t t[] = {1, 2, 3, 4, 5};
    prefix_match m = match(c, t, 5, 1);
    CU_ASSERT_EQUAL(m.n_pos, 0);
    CU_ASSERT_EQUAL(m.snap, -1);
    CU_ASSERT_EQUAL(m.n_kv, 0);
    m = match(c, t, 0, 2);
    CU_ASSERT_EQUAL(m.n_pos, 0);
    CU_ASSERT_EQUAL(m.n_kv, 0);
    prefix_cache_stats s;
    prefix_cache_get_stats(c, &s);
    CU_ASSERT_EQUAL(s.queries, 2);
    CU_ASSERT_EQUAL(s.hits, 0);
    CU_ASSERT_EQUAL(s.queried_tokens, 5);
    CU_ASSERT_EQUAL(s.snapshots, 0);
    CU_ASSERT_EQUAL(s.blocks, 0);
    uint64_t out[4];
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 1, out, 4), 0);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 0);
    CU_ASSERT_EQUAL(prefix_cache_reclaim(c, 16), 16);
    check(c);
    prefix_cache_destroy(c);
    kv_pool_destroy(p);
}

/* Ten tokens in blocks of four: two full nodes and a partial one of two tokens. */
static void test_exact_and_partial(void)
{
    kv_pool *p = make_pool(2, 4, 16, 8);
    prefix_cache *c = make_cache(p, 4, MIB, 1024);
    int32_t t[12];
    seq_tokens(t, 12, 10);
    fill(p, 0, 10);
    const int32_t *tab = kv_pool_table(p, 0);
    const int s10 = prefix_cache_insert(c, 0, t, 10, 1);
    CU_ASSERT(s10 >= 0 && s10 < 4);
    check(c);
    prefix_match m = match(c, t, 10, 2);
    CU_ASSERT_EQUAL(m.n_pos, 10);
    CU_ASSERT_EQUAL(m.snap, s10);
    CU_ASSERT_EQUAL(m.n_kv, 10);
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(m.blocks[i], tab[i]);
    m = match(c, t, 12, 3); /* longer: the same snapshot, KV as far as it goes */
    CU_ASSERT_EQUAL(m.n_pos, 10);
    CU_ASSERT_EQUAL(m.n_kv, 10);
    m = match(c, t, 9, 4); /* the snapshot lies past n: not usable, the KV partly is */
    CU_ASSERT_EQUAL(m.n_pos, 0);
    CU_ASSERT_EQUAL(m.snap, -1);
    CU_ASSERT_EQUAL(m.n_kv, 9);
    m = match(c, t, 8, 5);
    CU_ASSERT_EQUAL(m.n_pos, 0);
    CU_ASSERT_EQUAL(m.n_kv, 8);
    /* the same prefix again: nothing to save */
    CU_ASSERT_EQUAL(prefix_cache_insert(c, 0, t, 10, 6), -1);
    /* a snapshot at a block edge lives on the full node */
    const int s8 = prefix_cache_insert(c, 0, t, 8, 7);
    CU_ASSERT(s8 >= 0 && s8 != s10);
    m = match(c, t, 9, 8);
    CU_ASSERT_EQUAL(m.n_pos, 8);
    CU_ASSERT_EQUAL(m.snap, s8);
    CU_ASSERT_EQUAL(m.blocks[0], tab[0]);
    CU_ASSERT_EQUAL(m.blocks[1], tab[1]);
    m = match(c, t, 11, 9);
    CU_ASSERT_EQUAL(m.n_pos, 10);
    CU_ASSERT_EQUAL(m.snap, s10);
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(p, tab[i]), 2);
    prefix_cache_stats s;
    prefix_cache_get_stats(c, &s);
    CU_ASSERT_EQUAL(s.inserts, 2);
    CU_ASSERT_EQUAL(s.queries, 6);
    CU_ASSERT_EQUAL(s.hits, 4);
    CU_ASSERT_EQUAL(s.hit_tokens, 10 + 10 + 8 + 10);
    CU_ASSERT_EQUAL(s.snapshots, 2);
    CU_ASSERT_EQUAL(s.snapshot_bytes, 2ull * MIB);
    CU_ASSERT_EQUAL(s.blocks, 3);
    CU_ASSERT_EQUAL(s.blocks_only, 0);
    check(c);
    /* the sequence ends: the cache keeps its blocks */
    int32_t held[3];
    memcpy(held, tab, sizeof held);
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 13);
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(p, held[i]), 1);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 3);
    m = match(c, t, 10, 10);
    CU_ASSERT_EQUAL(m.n_pos, 10);
    prefix_cache_get_stats(c, &s);
    CU_ASSERT_EQUAL(s.blocks_only, 3);
    check(c);
    prefix_cache_destroy(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 16);
    kv_pool_destroy(p);
}

/* A snapshot after every token of three blocks: each one found where it is, and where a
 * query leaves the prefix right after it. */
static void test_every_position(void)
{
    enum { BT = 4, N = 3 * BT };
    kv_pool *p = make_pool(2, BT, 16, 4);
    prefix_cache *c = make_cache(p, 16, MIB, 1024);
    int32_t t[N];
    seq_tokens(t, N, 7);
    fill(p, 0, N);
    const int32_t *tab = kv_pool_table(p, 0);
    int snap[N + 1];
    for (int n = 1; n <= N; n++) {
        snap[n] = prefix_cache_insert(c, 0, t, n, n);
        CU_ASSERT(snap[n] >= 0);
        for (int k = 1; k < n; k++) CU_ASSERT(snap[k] != snap[n]);
    }
    check(c);
    for (int n = 1; n <= N; n++) {
        prefix_match m = match(c, t, n, 100 + n);
        CU_ASSERT_EQUAL(m.n_pos, n);
        CU_ASSERT_EQUAL(m.snap, snap[n]);
        CU_ASSERT_EQUAL(m.n_kv, n);
        for (uint32_t i = 0; i < kv_pool_blocks_for(p, n); i++)
            CU_ASSERT_EQUAL(m.blocks[i], tab[i]);
        if (n < N) {
            int32_t q[N];
            memcpy(q, t, sizeof q);
            q[n] = 999;
            m = match(c, q, N, 200 + n);
            CU_ASSERT_EQUAL(m.n_pos, n);
            CU_ASSERT_EQUAL(m.snap, snap[n]);
            CU_ASSERT_EQUAL(m.n_kv, n);
        }
    }
    /* each block: the sequence, its full node and three partial nodes (positions 1..3 in it) */
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(p, tab[i]), 5);
    prefix_cache_stats s;
    prefix_cache_get_stats(c, &s);
    CU_ASSERT_EQUAL(s.blocks, 3);
    CU_ASSERT_EQUAL(s.snapshots, N);
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 3);
    CU_ASSERT_EQUAL(prefix_cache_reclaim(c, 16), 16);
    prefix_cache_get_stats(c, &s);
    CU_ASSERT_EQUAL(s.snapshots, 0);
    CU_ASSERT_EQUAL(s.blocks, 0);
    check(c);
    prefix_cache_destroy(c);
    kv_pool_destroy(p);
}

/* Two prompts sharing six tokens (a block and a half): the second one's n_kv says where they
 * part, a snapshot taken there serves a third, which resumes and adds its own branch. */
static void test_divergence(void)
{
    enum { BT = 4, N = 12 };
    kv_pool *p = make_pool(3, BT, 24, 4);
    prefix_cache *c = make_cache(p, 8, MIB, 1024);
    int32_t ta[N], tb[N], tc[N];
    seq_tokens(ta, N, 100);
    memcpy(tb, ta, 6 * sizeof *ta);
    seq_tokens(tb + 6, N - 6, 200);
    memcpy(tc, ta, 6 * sizeof *ta);
    seq_tokens(tc + 6, N - 6, 300);
    fill(p, 0, N);
    fill(p, 1, N);
    const int32_t *tab0 = kv_pool_table(p, 0), *tab1 = kv_pool_table(p, 1);
    CU_ASSERT(prefix_cache_insert(c, 0, ta, N, 1) >= 0);
    prefix_match m = match(c, tb, N, 2);
    CU_ASSERT_EQUAL(m.n_pos, 0);
    CU_ASSERT_EQUAL(m.n_kv, 6);
    m = match(c, tb, 5, 3);
    CU_ASSERT_EQUAL(m.n_kv, 5);
    CU_ASSERT(prefix_cache_insert(c, 1, tb, N, 4) >= 0);
    /* the first block's node is the first sequence's: the second's copy is not held */
    CU_ASSERT_EQUAL(kv_pool_refs(p, tab0[0]), 2);
    CU_ASSERT_EQUAL(kv_pool_refs(p, tab1[0]), 1);
    CU_ASSERT_EQUAL(kv_pool_refs(p, tab1[1]), 2);
    /* a snapshot where they part */
    const int s6 = prefix_cache_insert(c, 1, tb, 6, 5);
    CU_ASSERT(s6 >= 0);
    check(c);
    m = match(c, tc, N, 6);
    CU_ASSERT_EQUAL(m.n_pos, 6);
    CU_ASSERT_EQUAL(m.snap, s6);
    CU_ASSERT_EQUAL(m.n_kv, 6);
    CU_ASSERT_EQUAL(m.blocks[0], tab0[0]);
    CU_ASSERT_EQUAL(m.blocks[1], tab1[1]);
    CU_ASSERT_EQUAL(match(c, ta, N, 7).n_pos, N);
    CU_ASSERT_EQUAL(match(c, tb, N, 8).n_pos, N);
    /* the third resumes: the full block shared, the partial one a fresh copy */
    m = match(c, tc, N, 9);
    status st = {0};
    CU_ASSERT_EQUAL(kv_pool_adopt(p, 2, m.blocks, m.n_pos / BT, &st), STATUS_OK);
    fill(p, 2, N);
    const int32_t *tab2 = kv_pool_table(p, 2);
    CU_ASSERT_EQUAL(tab2[0], tab0[0]);
    CU_ASSERT(tab2[1] != tab1[1]);
    CU_ASSERT(prefix_cache_insert(c, 2, tc, N, 10) >= 0);
    CU_ASSERT_EQUAL(kv_pool_refs(p, tab0[0]), 3);
    CU_ASSERT_EQUAL(kv_pool_refs(p, tab2[1]), 2);
    CU_ASSERT_EQUAL(match(c, tc, N, 11).n_pos, N);
    check(c);
    for (int s = 0; s < 3; s++) kv_pool_release(p, s);
    prefix_cache_destroy(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 24);
    kv_pool_destroy(p);
}

/* The same tokens computed by two sequences: the cache keeps the first one's full blocks and
 * takes only what is new from the second. */
static void test_shared_nodes(void)
{
    kv_pool *p = make_pool(2, 4, 16, 4);
    prefix_cache *c = make_cache(p, 4, MIB, 1024);
    int32_t t[10];
    seq_tokens(t, 10, 40);
    fill(p, 0, 8);
    fill(p, 1, 10);
    const int32_t *tab0 = kv_pool_table(p, 0), *tab1 = kv_pool_table(p, 1);
    CU_ASSERT(prefix_cache_insert(c, 0, t, 8, 1) >= 0);
    CU_ASSERT(prefix_cache_insert(c, 1, t, 10, 2) >= 0);
    CU_ASSERT_EQUAL(kv_pool_refs(p, tab1[0]), 1);
    CU_ASSERT_EQUAL(kv_pool_refs(p, tab1[1]), 1);
    CU_ASSERT_EQUAL(kv_pool_refs(p, tab1[2]), 2);
    prefix_match m = match(c, t, 10, 3);
    CU_ASSERT_EQUAL(m.n_pos, 10);
    CU_ASSERT_EQUAL(m.blocks[0], tab0[0]);
    CU_ASSERT_EQUAL(m.blocks[1], tab0[1]);
    CU_ASSERT_EQUAL(m.blocks[2], tab1[2]);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 11);
    kv_pool_release(p, 0); /* the cache still holds its blocks */
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 11);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 2);
    check(c);
    kv_pool_release(p, 1);
    prefix_cache_destroy(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 16);
    kv_pool_destroy(p);
}

/* Two snapshots, blocks free of charge, a snapshot of a MiB: an entry's value is its length.
 * X (14 tokens) against a stream of 4-token entries Y1, Y2, ...: each Y goes before X at
 * first (less value though newer), but every eviction raises L until a new Y outranks X. A hit
 * on X raises it again. The snapshot id an insert returns says whose was freed. */
static void greedy_dual_run(bool hit, int *x_evicted_at)
{
    enum { BT = 4, NY = 8 };
    kv_pool *p = make_pool(NY + 1, BT, 64, 4);
    prefix_cache *c = make_cache(p, 2, MIB, 0);
    int32_t tx[14], ty[NY][4];
    seq_tokens(tx, 14, 1000);
    fill(p, 0, 14);
    const int sx = prefix_cache_insert(c, 0, tx, 14, 1);
    CU_ASSERT(sx >= 0);
    *x_evicted_at = -1;
    for (int i = 0; i < NY && *x_evicted_at < 0; i++) {
        seq_tokens(ty[i], 4, 2000 + 100 * i);
        fill(p, 1 + i, 4);
        if (hit && i == 2) CU_ASSERT_EQUAL(match(c, tx, 14, 10 + 2 * i).n_pos, 14);
        const int s = prefix_cache_insert(c, 1 + i, ty[i], 4, 11 + 2 * i);
        CU_ASSERT(s >= 0);
        if (i >= 1) { /* the previous Y or X went */
            if (s == sx) *x_evicted_at = i;
            else CU_ASSERT_EQUAL(match(c, ty[i - 1], 4, 0).n_pos, 0);
        }
        check(c);
    }
    CU_ASSERT_EQUAL(match(c, tx, 14, 100).n_kv, 0); /* its whole path went with it */
    for (int s = 0; s <= NY; s++) kv_pool_release(p, s);
    prefix_cache_destroy(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 64);
    kv_pool_destroy(p);
}

static void test_greedy_dual(void)
{
    int cold = -1, hot = -1;
    greedy_dual_run(false, &cold);
    /* Y0 (H 4) out at Y1 (L 4, H 8), Y1 at Y2 (L 8, H 12), Y2 at Y3 (L 12, H 16); Y4 finds X
     * (14) the lowest */
    CU_ASSERT_EQUAL(cold, 4);
    greedy_dual_run(true, &hot);
    /* the hit before Y2 (L 4) raises X to 18: Y3 (16) goes at Y4 and X at Y5 */
    CU_ASSERT_EQUAL(hot, 5);
}

/* Eviction weighs bytes (a MiB a snapshot, a MiB a block): A and B, eight tokens each, the
 * same age; A was inserted holding both its blocks alone (8 tokens / 3 MiB), B sharing A's
 * first block (8 / 2): A goes first. A snapshot on an inner node costs only itself. */
static void test_value_per_byte(void)
{
    kv_pool *p = make_pool(3, 4, 16, 4);
    prefix_cache *c = make_cache(p, 2, MIB, MIB);
    int32_t ta[8], tb[8], tc[8];
    seq_tokens(ta, 8, 10);
    memcpy(tb, ta, 4 * sizeof *ta);
    seq_tokens(tb + 4, 4, 20);
    seq_tokens(tc, 8, 30);
    fill(p, 0, 8);
    fill(p, 1, 8);
    fill(p, 2, 8);
    const int sa = prefix_cache_insert(c, 0, ta, 8, 1);
    const int sb = prefix_cache_insert(c, 1, tb, 8, 1);
    CU_ASSERT(sa >= 0 && sb >= 0);
    CU_ASSERT_EQUAL(prefix_cache_insert(c, 2, tc, 8, 2), sa);
    prefix_match m = match(c, ta, 8, 3);
    CU_ASSERT_EQUAL(m.n_pos, 0);
    CU_ASSERT_EQUAL(m.n_kv, 4); /* the first block stays: B's path */
    CU_ASSERT_EQUAL(match(c, tb, 8, 3).n_pos, 8);
    check(c);
    for (int q = 0; q < 3; q++) kv_pool_release(p, q);
    prefix_cache_destroy(c);
    kv_pool_destroy(p);

    /* snapshots at 8 (a leaf: 8 tokens / 9 MiB with 4 MiB blocks) and at 4 (inner: 4 / 1) */
    p = make_pool(3, 4, 16, 4);
    c = make_cache(p, 2, MIB, 4 * MIB);
    fill(p, 0, 8);
    fill(p, 2, 8);
    const int s8 = prefix_cache_insert(c, 0, ta, 8, 1);
    const int s4 = prefix_cache_insert(c, 0, ta, 4, 1);
    CU_ASSERT(s8 >= 0 && s4 >= 0);
    CU_ASSERT_EQUAL(prefix_cache_insert(c, 2, tc, 8, 2), s8);
    m = match(c, ta, 8, 3);
    CU_ASSERT_EQUAL(m.n_pos, 4);
    CU_ASSERT_EQUAL(m.snap, s4);
    CU_ASSERT_EQUAL(m.n_kv, 4);
    check(c);
    for (int q = 0; q < 3; q++) kv_pool_release(p, q);
    prefix_cache_destroy(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 16);
    kv_pool_destroy(p);
}

static void test_reclaim(void)
{
    kv_pool *p = make_pool(4, 4, 8, 4);
    prefix_cache *c = make_cache(p, 4, MIB, MIB);
    int32_t ta[16], tb[8];
    seq_tokens(ta, 16, 10);
    seq_tokens(tb, 8, 100);
    fill(p, 0, 16);
    fill(p, 1, 8);
    int32_t a_blocks[4], b_blocks[2];
    memcpy(a_blocks, kv_pool_table(p, 0), sizeof a_blocks);
    memcpy(b_blocks, kv_pool_table(p, 1), sizeof b_blocks);
    CU_ASSERT(prefix_cache_insert(c, 0, ta, 16, 1) >= 0);
    CU_ASSERT(prefix_cache_insert(c, 1, tb, 8, 2) >= 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 2);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 0);
    /* nothing the cache alone holds: reclaim frees nothing, evicts nothing */
    CU_ASSERT_EQUAL(prefix_cache_reclaim(c, 8), 2);
    CU_ASSERT_EQUAL(match(c, ta, 16, 3).n_pos, 16);
    CU_ASSERT_EQUAL(match(c, tb, 8, 3).n_pos, 8);
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 2);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 4);
    /* A's blocks come back; B's stay with B (and its entry with them) */
    CU_ASSERT_EQUAL(prefix_cache_reclaim(c, 8), 6);
    CU_ASSERT_EQUAL(match(c, ta, 16, 4).n_pos, 0);
    CU_ASSERT_EQUAL(match(c, tb, 8, 4).n_pos, 8);
    for (int i = 0; i < 2; i++) CU_ASSERT_EQUAL(kv_pool_refs(p, b_blocks[i]), 2);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 0);
    check(c);
    kv_pool_release(p, 1);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 2);
    CU_ASSERT_EQUAL(prefix_cache_reclaim(c, 7), 8);
    prefix_cache_stats s;
    prefix_cache_get_stats(c, &s);
    CU_ASSERT_EQUAL(s.snapshots, 0);
    CU_ASSERT_EQUAL(s.blocks, 0);
    CU_ASSERT(s.evictions >= 4);
    check(c);

    /* an entry whose eviction frees memory goes before a lower one that frees none */
    fill(p, 0, 8);
    fill(p, 1, 8);
    CU_ASSERT(prefix_cache_insert(c, 0, ta, 8, 10) >= 0); /* older: lower */
    CU_ASSERT(prefix_cache_insert(c, 1, tb, 8, 11) >= 0);
    kv_pool_release(p, 1);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 4);
    CU_ASSERT_EQUAL(prefix_cache_reclaim(c, 5), 6);
    CU_ASSERT_EQUAL(match(c, ta, 8, 12).n_pos, 8);
    CU_ASSERT_EQUAL(match(c, tb, 8, 12).n_pos, 0);
    check(c);
    kv_pool_release(p, 0);
    prefix_cache_clear(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 8);

    /* the block only the cache holds lies under a leaf a sequence holds: the leaf goes first,
     * then the inner snapshot with the block */
    fill(p, 0, 8);
    fill(p, 1, 4);
    memcpy(a_blocks, kv_pool_table(p, 0), 2 * sizeof *a_blocks);
    CU_ASSERT(prefix_cache_insert(c, 0, ta, 4, 20) >= 0);
    CU_ASSERT(prefix_cache_insert(c, 0, ta, 8, 21) >= 0);
    status st = {0};
    const int32_t other[2] = {kv_pool_table(p, 1)[0], a_blocks[1]};
    CU_ASSERT_EQUAL(kv_pool_adopt(p, 2, other, 2, &st), STATUS_OK);
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(prefix_cache_reclaimable(c), 1);
    const uint32_t before = kv_pool_free_blocks(p);
    CU_ASSERT_EQUAL(prefix_cache_reclaim(c, before + 1), before + 1);
    CU_ASSERT_EQUAL(kv_pool_refs(p, a_blocks[0]), 0);
    CU_ASSERT_EQUAL(kv_pool_refs(p, a_blocks[1]), 1);
    CU_ASSERT_EQUAL(match(c, ta, 8, 22).n_kv, 0);
    check(c);
    kv_pool_release(p, 1);
    kv_pool_release(p, 2);
    prefix_cache_destroy(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 8);
    kv_pool_destroy(p);
}

static void test_clear(void)
{
    kv_pool *p = make_pool(3, 4, 16, 4);
    prefix_cache *c = make_cache(p, 4, MIB, MIB);
    int32_t t[3][12];
    for (int q = 0; q < 3; q++) {
        seq_tokens(t[q], 12, 100 * q);
        t[q][0] = 1; /* a shared first token */
        fill(p, q, 12);
        CU_ASSERT(prefix_cache_insert(c, q, t[q], 12 - q, q) >= 0);
    }
    kv_pool_release(p, 1);
    CU_ASSERT(kv_pool_free_blocks(p) < 16 - 6);
    prefix_cache_clear(c);
    check(c);
    prefix_cache_stats s;
    prefix_cache_get_stats(c, &s);
    CU_ASSERT_EQUAL(s.snapshots, 0);
    CU_ASSERT_EQUAL(s.blocks, 0);
    CU_ASSERT_EQUAL(s.inserts, 3);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 16 - 6);
    for (int i = 0; i < 3; i++) CU_ASSERT_EQUAL(kv_pool_refs(p, kv_pool_table(p, 0)[i]), 1);
    CU_ASSERT_EQUAL(match(c, t[0], 12, 5).n_kv, 0);
    /* usable again */
    CU_ASSERT(prefix_cache_insert(c, 0, t[0], 12, 6) >= 0);
    CU_ASSERT_EQUAL(match(c, t[0], 12, 7).n_pos, 12);
    kv_pool_release(p, 0);
    kv_pool_release(p, 2);
    prefix_cache_destroy(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), 16);
    kv_pool_destroy(p);
}

static void test_heads(void)
{
    kv_pool *p = make_pool(2, 4, 16, 4);
    prefix_cache *c = make_cache(p, 4, MIB, MIB);
    int32_t a[10], b[10];
    seq_tokens(a, 10, 1);
    memcpy(b, a, 5 * sizeof *a);
    seq_tokens(b + 5, 5, 50);
    fill(p, 0, 10);
    fill(p, 1, 10);
    CU_ASSERT(prefix_cache_insert(c, 0, a, 10, 1) >= 0);
    CU_ASSERT(prefix_cache_insert(c, 1, b, 10, 2) >= 0);
    uint64_t out[4];
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 0, out, 4), 0);
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 3, out, 4), 1);
    CU_ASSERT_EQUAL(out[0], splitmix64_tokens(a, 3));
    /* the second blocks differ after their first token: one head of 5 */
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 5, out, 4), 1);
    CU_ASSERT_EQUAL(out[0], splitmix64_tokens(a, 5));
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 6, out, 4), 2);
    CU_ASSERT_EQUAL(out[0], splitmix64_tokens(b, 6)); /* most recent first */
    CU_ASSERT_EQUAL(out[1], splitmix64_tokens(a, 6));
    CU_ASSERT_EQUAL(match(c, a, 10, 3).n_pos, 10);
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 6, out, 4), 2);
    CU_ASSERT_EQUAL(out[0], splitmix64_tokens(a, 6));
    CU_ASSERT_EQUAL(out[1], splitmix64_tokens(b, 6));
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 6, out, 1), 1);
    CU_ASSERT_EQUAL(out[0], splitmix64_tokens(a, 6));
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 10, out, 4), 2);
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 11, out, 4), 0);
    /* a partial node on the same tokens: the same head once */
    CU_ASSERT(prefix_cache_insert(c, 0, a, 6, 4) >= 0);
    CU_ASSERT_EQUAL(prefix_cache_heads(c, 6, out, 4), 2);
    CU_ASSERT_EQUAL(out[0], splitmix64_tokens(a, 6));
    CU_ASSERT_EQUAL(out[1], splitmix64_tokens(b, 6));
    kv_pool_release(p, 0);
    kv_pool_release(p, 1);
    prefix_cache_destroy(c);
    kv_pool_destroy(p);
}

/* Sequences start from what the cache matches (adopting its full blocks, a fresh block for a
 * partial one), grow, insert prefixes, end; the cache reclaims when the pool runs dry and is
 * cleared now and then. Every match is checked against a record of the prefix each snapshot id
 * was last handed out for, and against every prefix ever inserted for n_kv; the pool's counts
 * are recounted after every operation (prefix_cache_check). */
static void test_random_walk(void)
{
    enum { S = 5, BT = 4, BLK = 40, LD = 8, MAXT = LD * BT, SNAPS = 6, IT = 4000, FAM = 3 };
    kv_pool *p = make_pool(S, BT, BLK, LD);
    prefix_cache *c = make_cache(p, SNAPS, MIB, MIB / 8);
    uint64_t rng = 777;
    int32_t fam[FAM][MAXT];
    for (int f = 0; f < FAM; f++)
        for (int i = 0; i < MAXT; i++) fam[f][i] = (int32_t)(testutil_rng_next(&rng) % 3);
    int32_t tok[S][MAXT];
    int len[S] = {0};
    int32_t ref[SNAPS][MAXT];
    int ref_n[SNAPS];
    for (int s = 0; s < SNAPS; s++) ref_n[s] = -1;
    static int32_t log_tok[IT][MAXT];
    static int log_n[IT];
    int n_log = 0;
    int64_t now = 0;
    status st = {0};

    for (int it = 0; it < IT && !CU_get_number_of_failures(); it++) {
        const int op = (int)(testutil_rng_next(&rng) % 10);
        const int q = (int)(testutil_rng_next(&rng) % S);
        now++;
        if (op <= 2 && len[q] == 0) { /* start q from the cache */
            const int f = (int)(testutil_rng_next(&rng) % FAM);
            const int n = 1 + (int)(testutil_rng_next(&rng) % MAXT);
            const int keep = (int)(testutil_rng_next(&rng) % (n + 1));
            for (int i = 0; i < n; i++)
                tok[q][i] = i < keep ? fam[f][i] : (int32_t)(testutil_rng_next(&rng) % 3);
            prefix_match m = match(c, tok[q], n, now);
            CU_ASSERT(m.n_pos >= 0 && m.n_pos <= m.n_kv && m.n_kv <= n);
            if (m.n_pos > 0) {
                CU_ASSERT_FATAL(m.snap >= 0 && m.snap < SNAPS);
                CU_ASSERT_EQUAL(ref_n[m.snap], m.n_pos);
                CU_ASSERT(!memcmp(ref[m.snap], tok[q], (size_t)m.n_pos * sizeof(int32_t)));
                CU_ASSERT_EQUAL(kv_pool_adopt(p, q, m.blocks, m.n_pos / BT, &st), STATUS_OK);
            } else {
                CU_ASSERT_EQUAL(m.snap, -1);
            }
            bool seen = m.n_kv == 0;
            for (int l = 0; l < n_log && !seen; l++)
                seen = log_n[l] >= m.n_kv &&
                       !memcmp(log_tok[l], tok[q], (size_t)m.n_kv * sizeof(int32_t));
            CU_ASSERT(seen);
            const uint32_t need = kv_pool_need(p, q, n);
            if (need > kv_pool_free_blocks(p)) prefix_cache_reclaim(c, need);
            if (kv_pool_ensure(p, q, n, &st) == STATUS_OK) len[q] = n;
            else kv_pool_release(p, q);
        } else if (op <= 5 && len[q] > 0) { /* keep a prefix of q */
            const int n = 1 + (int)(testutil_rng_next(&rng) % len[q]);
            const int s = prefix_cache_insert(c, q, tok[q], n, now);
            CU_ASSERT(s >= -1 && s < SNAPS);
            if (s >= 0) {
                memcpy(ref[s], tok[q], (size_t)n * sizeof(int32_t));
                ref_n[s] = n;
                memcpy(log_tok[n_log], tok[q], (size_t)n * sizeof(int32_t));
                log_n[n_log++] = n;
                prefix_match m = match(c, tok[q], n, now);
                CU_ASSERT_EQUAL(m.n_pos, n);
                CU_ASSERT_EQUAL(m.snap, s);
                for (uint32_t i = 0; i < kv_pool_blocks_for(p, n); i++)
                    CU_ASSERT(kv_pool_refs(p, m.blocks[i]) >= 1);
            }
        } else if (op <= 7) {
            kv_pool_release(p, q);
            len[q] = 0;
        } else if (op == 8) {
            const uint32_t want = (uint32_t)(testutil_rng_next(&rng) % (BLK + 1));
            const uint32_t free_after = prefix_cache_reclaim(c, want);
            CU_ASSERT_EQUAL(free_after, kv_pool_free_blocks(p));
            CU_ASSERT(free_after >= want || prefix_cache_reclaimable(c) == 0);
        } else if (testutil_rng_next(&rng) % 20 == 0) {
            prefix_cache_clear(c);
            prefix_cache_stats s;
            prefix_cache_get_stats(c, &s);
            CU_ASSERT_EQUAL(s.snapshots, 0);
        }
        check(c);
    }
    prefix_cache_stats s;
    prefix_cache_get_stats(c, &s);
    CU_ASSERT(s.hits > 0 && s.evictions > 0 && s.inserts > SNAPS);
    for (int q = 0; q < S; q++) kv_pool_release(p, q);
    prefix_cache_destroy(c);
    CU_ASSERT_EQUAL(kv_pool_free_blocks(p), BLK);
    kv_pool_destroy(p);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("prefix_cache", NULL, NULL);
    CU_add_test(s, "create_checks", test_create_checks);
    CU_add_test(s, "empty", test_empty);
    CU_add_test(s, "exact_and_partial", test_exact_and_partial);
    CU_add_test(s, "every_position", test_every_position);
    CU_add_test(s, "divergence", test_divergence);
    CU_add_test(s, "shared_nodes", test_shared_nodes);
    CU_add_test(s, "greedy_dual", test_greedy_dual);
    CU_add_test(s, "value_per_byte", test_value_per_byte);
    CU_add_test(s, "reclaim", test_reclaim);
    CU_add_test(s, "clear", test_clear);
    CU_add_test(s, "heads", test_heads);
    CU_add_test(s, "random_walk", test_random_walk);
    return testutil_cunit_run();
}
