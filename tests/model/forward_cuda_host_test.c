/* The CUDA forward's host-side pieces (model/forward_cuda_host.h), on the CPU:
 *  - a batched pass's staging buffer: its named arrays back to back in one copy (fc_stage_at);
 *  - a batched pass's staged inputs for steps of decode rows, prompt chunks, both, eval rows and
 *    padding: every array checked against what the rows say;
 *  - the KV block tables' device mirror: appended entries copied alone, the whole table after
 *    a release or a share (model/kv_pool.h), the mirror equal to the table after each copy;
 *  - the ranks of a group mirroring one pool: a rank whose mirror starts after blocks were
 *    taken (fc_kv_borrow's {0, version}) copies the whole table, and every rank's device copy
 *    equals the pool's table whoever took the blocks (the step or the caller before it);
 *  - the snapshots' count from a budget or chosen from the memory (fc_snaps_for). */
#include <CUnit/Basic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward_cuda_host.h"
#include "model/kv_pool.h"

static const int g_bucket[] = {1, 2, 4, 8, 16, 32, 64};
#define N_BUCKETS ((int)(sizeof g_bucket / sizeof g_bucket[0]))
#define ROWS 64
#define PAD 9 /* the pad slot */

/* rows: runs given as (slot, length, first position); the last row of each run samples */
static int make_rows(fwd_row *rows, const int (*runs)[3], int n_runs)
{
    int n = 0;
    for (int r = 0; r < n_runs; r++)
        for (int k = 0; k < runs[r][1]; k++, n++)
            rows[n] = (fwd_row){.token = 100 + n, .slot = runs[r][0],
                                        .pos = runs[r][2] + k, .prompt = runs[r][1] > 1,
                                        .sample = k == runs[r][1] - 1};
    return n;
}

/* fc_stage_at: every array of the bucket inside one staging buffer, none overlapping, the
 * last ending at s.ints (the one copy a pass makes) */
static void test_stage_at(void)
{
    int32_t buf[FC_STAGE_INTS(ROWS)];
    for (int k = 0; k < N_BUCKETS; k++) {
        const int nb = g_bucket[k];
        const fc_stage s = fc_stage_at(buf, ROWS, nb);
        const struct { const int32_t *at; int n; } arr[] = {
            {s.head_rows, ROWS}, {s.tokens, nb}, {s.slots, nb}, {s.pos, nb}, {s.runs, nb},
            {s.run_len, nb}, {s.long_runs, 1}, {s.long_idx, nb}, {s.tile_rows, nb},
            {s.keep, nb},
        };
        const int32_t *at = buf; /* back to back, in this order */
        for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) {
            CU_ASSERT_PTR_EQUAL(arr[i].at, at);
            at += arr[i].n;
        }
        CU_ASSERT_EQUAL(at - buf, s.ints);
        CU_ASSERT(s.ints <= FC_STAGE_INTS(ROWS));
    }
}

/* the layout of fc_stage_pass for these rows (keep: NULL or each row's keep slot), checked
 * field by field */
static void check_stage_keep(const fwd_row *rows, int n, bool tiles, const int32_t *keep)
{
    int32_t stage[FC_STAGE_INTS(ROWS)];
    int head[ROWS];
    fc_pass_info in;
    memset(stage, 0x7f, sizeof stage);
    fc_stage_pass(rows, n, g_bucket, N_BUCKETS, PAD, tiles, keep, stage, head, &in);
    int nb = 1;
    while (nb < n) nb *= 2;
    CU_ASSERT_EQUAL(in.nb, nb);
    CU_ASSERT_EQUAL(g_bucket[in.k], nb);
    CU_ASSERT_EQUAL(in.staged_ints, ROWS + 8 * nb + 1);
    const fc_stage s = fc_stage_at(stage, ROWS, nb);
    CU_ASSERT_EQUAL(s.nb, nb);
    CU_ASSERT_EQUAL(s.ints, in.staged_ints);
    const int32_t *tok = s.tokens, *slot = s.slots, *pos = s.pos, *run = s.runs;
    const int32_t *lng = s.long_runs, *skip = s.tile_rows;
    CU_ASSERT_PTR_EQUAL(s.run_len, run + nb);     /* the kernels' [2][nb] runs */
    CU_ASSERT_PTR_EQUAL(s.long_idx, lng + 1);     /* and their count-then-indices list */
    for (int j = 0; j < nb; j++) {
        CU_ASSERT_EQUAL(tok[j], j < n ? rows[j].token : 0);
        CU_ASSERT_EQUAL(slot[j], j < n ? rows[j].slot : PAD);
        CU_ASSERT_EQUAL(pos[j], j < n ? rows[j].pos : 0);
        CU_ASSERT_EQUAL(s.keep[j], j < n && keep ? keep[j] : -1); /* padding keeps nothing */
    }
    /* runs: maximal stretches of one slot, in order, covering the n rows; the rest empty */
    int covered = 0, n_runs = 0, n_long = 0;
    for (int x = 0; x < nb; x++) {
        if (run[nb + x] == 0) {
            CU_ASSERT_EQUAL(run[x], 0);
            continue;
        }
        CU_ASSERT_EQUAL(x, n_runs); /* the runs come first */
        CU_ASSERT_EQUAL(run[x], covered);
        for (int k = 0; k < run[nb + x]; k++) CU_ASSERT_EQUAL(rows[covered + k].slot, rows[covered].slot);
        covered += run[nb + x];
        if (covered < n) CU_ASSERT_NOT_EQUAL(rows[covered].slot, rows[covered - 1].slot);
        if (run[nb + x] >= FC_LONG_RUN_ROWS) {
            CU_ASSERT_EQUAL(lng[1 + n_long], x);
            n_long++;
        }
        n_runs++;
    }
    CU_ASSERT_EQUAL(covered, n);
    CU_ASSERT_EQUAL(in.n_runs, n_runs);
    CU_ASSERT_EQUAL(lng[0], n_long);
    CU_ASSERT_EQUAL(in.n_long, n_long);
    for (int j = 0; j < nb; j++) { /* tiles take the rows of the long runs, and only with tiles */
        bool in_long = false;
        for (int x = 0, at = 0; x < n_runs; at += run[nb + x], x++)
            if (j >= at && j < at + run[nb + x]) in_long = run[nb + x] >= FC_LONG_RUN_ROWS;
        CU_ASSERT_EQUAL(skip[j], tiles && j < n && in_long);
    }
    /* the lm_head's rows: each run's sampled last row, every sampled verify row and every row
     * asking for logits or its final-norm output, padded to their bucket with the first */
    int nh = 0;
    for (int j = 0; j < n; j++) {
        const bool last = j + 1 == n || rows[j + 1].slot != rows[j].slot;
        const bool want = rows[j].logits || rows[j].hidden ||
                          (rows[j].sample && (last || rows[j].verify));
        CU_ASSERT_EQUAL(head[j] >= 0, want);
        if (want) {
            CU_ASSERT_EQUAL(head[j], nh);
            CU_ASSERT_EQUAL(s.head_rows[nh], j);
            nh++;
        }
    }
    CU_ASSERT_EQUAL(in.nh, nh);
    if (nh) {
        CU_ASSERT(g_bucket[in.kh] >= nh && (in.kh == 0 || g_bucket[in.kh - 1] < nh));
        for (int j = nh; j < g_bucket[in.kh]; j++) CU_ASSERT_EQUAL(s.head_rows[j], s.head_rows[0]);
    }
}

static void check_stage(const fwd_row *rows, int n, bool tiles)
{
    check_stage_keep(rows, n, tiles, NULL);
}

static void test_stage_pass(void)
{
    fwd_row rows[ROWS];
    static const int decode[][3] = {{3, 1, 40}, {0, 1, 7}, {5, 1, 0}};
    static const int prompt[][3] = {{2, 11, 64}};
    static const int mixed[][3] = {{3, 1, 40}, {1, 6, 0}, {0, 1, 7}, {4, 5, 10}, {6, 1, 2}};
    static const int one[][3] = {{7, 1, 99}};
    static const int full[][3] = {{1, 9, 0}, {2, 7, 3}};
    /* runs on both sides of FC_LONG_RUN_ROWS (16): only those of 16 rows or more are long */
    static const int longer[][3] = {{1, 20, 0}, {2, 1, 5}, {3, 15, 3}, {4, 16, 30}, {5, 12, 0}};
    for (int t = 0; t < 2; t++) {
        int n = make_rows(rows, decode, 3);
        check_stage(rows, n, t);
        n = make_rows(rows, prompt, 1);
        check_stage(rows, n, t);
        rows[4].logits = (float *)rows; /* an eval row mid-run: its logits are read */
        check_stage(rows, n, t);
        n = make_rows(rows, mixed, 5);
        check_stage(rows, n, t);
        n = make_rows(rows, one, 1);
        check_stage(rows, n, t);
        n = make_rows(rows, full, 2);
        CU_ASSERT_EQUAL(n, 16);
        check_stage(rows, n, t);
        rows[8].sample = false; /* a chunk that does not end its prompt: no lm_head row */
        rows[15].sample = false;
        check_stage(rows, n, t);
        n = make_rows(rows, longer, 5);
        CU_ASSERT_EQUAL(n, 64);
        check_stage(rows, n, t);
    }
}

/* verify runs (speculative decoding): every row sampled and read by the lm_head, the rows but
 * the last kept; rows asking for their final-norm output read too */
static void test_stage_verify(void)
{
    fwd_row rows[ROWS];
    static const int mixed[][3] = {{3, 1, 40}, {1, 4, 9}, {0, 1, 7}, {4, 3, 10}, {6, 12, 0}};
    const int n = make_rows(rows, mixed, 5);
    int32_t keep[ROWS];
    for (int j = 0; j < n; j++) keep[j] = -1;
    for (int j = 1; j < 5; j++) { /* slot 1's 4 rows and slot 4's 3 form verify runs */
        rows[j].verify = true, rows[j].prompt = false, rows[j].sample = true;
        if (j < 4) keep[j] = 20 + j;
    }
    for (int j = 6; j < 9; j++) {
        rows[j].verify = true, rows[j].prompt = false, rows[j].sample = true;
        if (j < 8) keep[j] = 30 + j;
    }
    float h[4];
    rows[12].hidden = h; /* a prompt row mid-chunk with its final-norm output read */
    check_stage_keep(rows, n, false, keep);
    check_stage_keep(rows, n, true, keep);
    check_stage_keep(rows, n, false, NULL);
}

/* ---- the KV block tables' device mirror ---- */

/* copies what fc_kv_mirror_sync asks for from the pool's table into `dev` (the mirror's
 * memory), then checks dev holds the table's valid entries */
static void sync_and_check(const kv_pool *p, int seq, fc_kv_mirror *m, int32_t *dev, int ld,
                           int want_from, int want_to)
{
    int from, to;
    fc_kv_mirror_sync(p, seq, m, &from, &to);
    CU_ASSERT_EQUAL(from, want_from);
    CU_ASSERT_EQUAL(to, want_to);
    const int32_t *t = kv_pool_table(p, seq);
    for (int b = from; b < to; b++) dev[seq * ld + b] = t[b];
    for (int b = 0; b < kv_pool_held(p, seq); b++) CU_ASSERT_EQUAL(dev[seq * ld + b], t[b]);
}

static void test_kv_mirror(void)
{
    enum { SEQS = 3, LD = 4, BLOCKS = 8, BP = 64 };
    int32_t table[SEQS * LD], dev[SEQS * LD];
    memset(dev, 0x7f, sizeof dev); /* what the device held before: nothing valid */
    kv_pool *p;
    status st;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&(kv_pool_opts){.n_seqs = SEQS, .block_tokens = BP,
                                                         .n_blocks = BLOCKS,
                                                         .max_blocks_per_seq = LD,
                                                         .table = table},
                                         &p, &st),
                          STATUS_OK);
    fc_kv_mirror m[SEQS] = {{0}};
    sync_and_check(p, 0, &m[0], dev, LD, 0, 0);          /* empty: nothing to copy */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 1, &st), STATUS_OK);
    sync_and_check(p, 0, &m[0], dev, LD, 0, 1);          /* the first block */
    sync_and_check(p, 0, &m[0], dev, LD, 1, 1);          /* nothing new */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 3 * BP, &st), STATUS_OK);
    sync_and_check(p, 0, &m[0], dev, LD, 1, 3);          /* only the appended ones */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 1, 2 * BP, &st), STATUS_OK);
    sync_and_check(p, 1, &m[1], dev, LD, 0, 2);
    /* released and grown back to as many blocks: other blocks, the whole table again */
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 2, 2 * BP, &st), STATUS_OK); /* takes 0's first blocks */
    sync_and_check(p, 2, &m[2], dev, LD, 0, 2);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 3 * BP, &st), STATUS_OK);
    sync_and_check(p, 0, &m[0], dev, LD, 0, 3);
    /* released and not grown: nothing valid to copy, and the next growth copies from 0 */
    kv_pool_release(p, 1);
    sync_and_check(p, 1, &m[1], dev, LD, 0, 0);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 1, 1, &st), STATUS_OK);
    sync_and_check(p, 1, &m[1], dev, LD, 0, 1);
    /* shared: the whole table, then appended entries only */
    kv_pool_release(p, 2);
    sync_and_check(p, 2, &m[2], dev, LD, 0, 0);
    CU_ASSERT_EQUAL(kv_pool_share(p, 2, 0, 2, &st), STATUS_OK);
    sync_and_check(p, 2, &m[2], dev, LD, 0, 2);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 2, 3 * BP, &st), STATUS_OK);
    sync_and_check(p, 2, &m[2], dev, LD, 2, 3);
    kv_pool_destroy(p);
}

/* Two ranks' device copies of one pool's tables (forward_cuda_state.c: rank 0 owns the pool,
 * the others borrow it once every rank is made, their mirrors then {0, version}): the same
 * syncs leave both equal to the tables. */
static void test_kv_mirror_ranks(void)
{
    enum { SEQS = 2, LD = 4, BLOCKS = 8, BP = 64, RANKS = 2 };
    int32_t table[SEQS * LD], dev[RANKS][SEQS * LD];
    memset(dev, 0x7f, sizeof dev);
    kv_pool *p;
    status st;
    CU_ASSERT_EQUAL_FATAL(kv_pool_create(&(kv_pool_opts){.n_seqs = SEQS, .block_tokens = BP,
                                                         .n_blocks = BLOCKS,
                                                         .max_blocks_per_seq = LD,
                                                         .table = table},
                                         &p, &st),
                          STATUS_OK);
    fc_kv_mirror m[RANKS][SEQS];
    for (int s = 0; s < SEQS; s++) m[0][s] = (fc_kv_mirror){0, kv_pool_version(p, s)};
    /* seq 0 grows before rank 1 borrows the pool (as a benchmark's fill could) */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, BP + 1, &st), STATUS_OK);
    sync_and_check(p, 0, &m[0][0], dev[0], LD, 0, 2);
    for (int s = 0; s < SEQS; s++) m[1][s] = (fc_kv_mirror){0, kv_pool_version(p, s)};
    sync_and_check(p, 0, &m[1][0], dev[1], LD, 0, 2);
    /* the caller (the scheduler) takes seq 1's blocks before a step, then the step syncs each
     * rank: both copy the same entries */
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 1, 3 * BP, &st), STATUS_OK);
    for (int r = 0; r < RANKS; r++) sync_and_check(p, 1, &m[r][1], dev[r], LD, 0, 3);
    /* seq 0 released and taken again: the whole table on every rank */
    kv_pool_release(p, 0);
    CU_ASSERT_EQUAL(kv_pool_ensure(p, 0, 1, &st), STATUS_OK);
    for (int r = 0; r < RANKS; r++) sync_and_check(p, 0, &m[r][0], dev[r], LD, 0, 1);
    for (int s = 0; s < SEQS; s++)
        CU_ASSERT_EQUAL(memcmp(dev[0] + s * LD, dev[1] + s * LD,
                               (size_t)kv_pool_held(p, s) * sizeof(int32_t)), 0);
    kv_pool_destroy(p);
}

/* The snapshots' count (docs/GPU.md "Snapshots"): none without a budget or without DeltaNet
 * state; a budget's floor; chosen: 8 a slot while an eighth of the memory holds them, an eighth
 * of it beyond, one a slot while the memory holds them, never past the spare. */
static void test_snaps_for(void)
{
    const uint64_t MB = 1000000, GB = 1000 * MB;
    CU_ASSERT_EQUAL(fc_snaps_for(0, 50 * MB, 100 * GB, 100 * GB, 8), 0);
    CU_ASSERT_EQUAL(fc_snaps_for(-1, 0, 100 * GB, 100 * GB, 8), 0);
    CU_ASSERT_EQUAL(fc_snaps_for(1000, 0, 0, 0, 8), 0);
    /* a budget: its floor, whatever the memory says */
    CU_ASSERT_EQUAL(fc_snaps_for(175 * (int64_t)MB, 50 * MB, 0, 0, 8), 3);
    CU_ASSERT_EQUAL(fc_snaps_for(49 * (int64_t)MB, 50 * MB, 0, 0, 8), 0);
    CU_ASSERT_EQUAL(fc_snaps_for(1ll << 60, 1, 0, 0, 8), FC_MAX_SNAPS);
    /* chosen, plenty of memory: 8 a slot */
    CU_ASSERT_EQUAL(fc_snaps_for(-1, 50 * MB, 100 * GB, 100 * GB, 8), 64);
    /* an eighth of 16 GB is 40 snapshots of 50 MB: fewer than 8 a slot, more than one */
    CU_ASSERT_EQUAL(fc_snaps_for(-1, 50 * MB, 16 * GB, 16 * GB, 8), 40);
    /* an eighth holds 2, the memory 16: one a slot (8) */
    CU_ASSERT_EQUAL(fc_snaps_for(-1, 50 * MB, 800 * MB, 800 * MB, 8), 8);
    /* the memory holds 5: 5 */
    CU_ASSERT_EQUAL(fc_snaps_for(-1, 50 * MB, 250 * MB, 250 * MB, 8), 5);
    /* the spare caps every rule */
    CU_ASSERT_EQUAL(fc_snaps_for(-1, 50 * MB, 100 * GB, 120 * MB, 8), 2);
    CU_ASSERT_EQUAL(fc_snaps_for(-1, 50 * MB, 800 * MB, 0, 8), 0);
    CU_ASSERT_EQUAL(fc_snaps_for(-1, 50 * MB, 0, 0, 8), 0);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("forward_cuda_host", NULL, NULL);
    CU_add_test(s, "stage_at", test_stage_at);
    CU_add_test(s, "stage_pass", test_stage_pass);
    CU_add_test(s, "stage_verify", test_stage_verify);
    CU_add_test(s, "kv_mirror", test_kv_mirror);
    CU_add_test(s, "kv_mirror_ranks", test_kv_mirror_ranks);
    CU_add_test(s, "snaps_for", test_snaps_for);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
