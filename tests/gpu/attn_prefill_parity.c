/* Prefill attention (attn_prefill_runs, kernels/cuda/attn.h "Prefill runs") against the row
 * kernels it stands in for (attn_decode_rows on every row: checked against the CPU twin
 * ref_attn_decode in rows_parity), at the 0.8B / 4B / 27B head shapes (d_h 256, G 4 and 6) and
 * small ones (G 1, 2, 3; d_h 64, 128).
 *
 * A step holds runs of 1, 2, 40, 1 and 150 rows on distinct slots of a paged cache (the slots'
 * blocks at random places of one pool) of random F16 contents; the long runs start at position
 * 0 or part-way (a later prompt chunk reads the cache its earlier chunks left), the one-row runs
 * anywhere. The projections are random; attn_prep_rows appends every row's K and V first, as the
 * forward does. Checked:
 *  - every output row within 2e-4 + 2e-3·|ref| per element and normalised squared error 1e-8
 *    of the row kernels' (the tiles' F16 products carry F16 remainders, so the two differ by
 *    F32 rounding);
 *  - the rows of one-row runs bit-identical (attn_decode_rows computes them either way);
 *  - a perturbed output fails. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cuda/attn.h"
#include "kernels/cuda/cuda_device.h"
#include "tests/gpu/gpu_dev.h"
#include "tests/gpu/gpu_parity.h"

static bool g_have_gpu;
static gpu_rng g_rng;

typedef struct shape {
    int n_h, n_kv, d_h, n_rot;
} shape;

/* len[r] rows at positions start[r] .. (consecutive; caches hold random values below) through
 * both paths, the runs of long_rows rows or more in tiles; true when they agree as the header
 * says. */
static bool prefill_case(shape sh, const int *len, const int *start, int n_runs, int n_ctx,
                         int long_rows, bool perturb)
{
    const int HA = sh.n_h * sh.d_h, KVA = sh.n_kv * sh.d_h;
    const float base = 1e7f, eps = 1e-6f;
    const int table_ld = (n_ctx + ATTN_KV_BLOCK - 1) / ATTN_KV_BLOCK;
    int B = 0;
    for (int r = 0; r < n_runs; r++) B += len[r];
    const int R = B, n_slots = n_runs + 1;
    const int64_t ld_in = 2 * HA + 2 * KVA + 3, ld_q = HA + 1, ld_o = HA + 2;
    int32_t *slot = gpu_xmalloc((size_t)B * 4), *pos = gpu_xmalloc((size_t)B * 4);
    int32_t *run = gpu_xmalloc((size_t)2 * R * 4), *lng = gpu_xmalloc((size_t)(1 + R) * 4);
    int32_t *skip = gpu_xmalloc((size_t)B * 4);
    lng[0] = 0;
    for (int r = 0, i = 0; r < R; r++) {
        run[r] = r < n_runs ? i : 0;
        run[R + r] = r < n_runs ? len[r] : 0;
        if (r < n_runs && len[r] >= long_rows) lng[1 + lng[0]++] = r;
        for (int k = 0; r < n_runs && k < len[r]; k++, i++) {
            slot[i] = (r * 7 + 1) % n_slots; /* distinct: 7 and n_slots coprime below */
            pos[i] = start[r] + k;
            skip[i] = len[r] >= long_rows;
        }
    }
    float *qw = gpu_rand_vec(&g_rng, sh.d_h, 0.5f), *kw = gpu_rand_vec(&g_rng, sh.d_h, 0.5f);
    for (int i = 0; i < sh.d_h; i++) qw[i] += 1.0f, kw[i] += 1.0f;
    float *p = gpu_rand_vec(&g_rng, (int64_t)B * ld_in, 1.0f);
    /* a paged cache: the slots' blocks at random places of one pool */
    const int n_blk = n_slots * table_ld;
    const size_t cb = (size_t)n_blk * ATTN_KV_BLOCK * KVA * 2;
    int32_t *table = gpu_xmalloc((size_t)n_blk * 4);
    gpu_rng_permutation(&g_rng, table, n_blk);
    uint16_t *c0 = gpu_xmalloc(cb);
    for (size_t i = 0; i < cb / 2; i++)
        c0[i] = quant_f32_to_f16(2.0f * gpu_rng_uniform(&g_rng) - 1.0f);
    float *d_qw = dev_from(qw, sh.d_h * 4), *d_kw = dev_from(kw, sh.d_h * 4);
    float *d_p = dev_from(p, (size_t)B * ld_in * 4);
    uint8_t *d_kc = dev_from(c0, cb), *d_vc = dev_from(c0, cb);
    int32_t *d_slot = dev_from(slot, (size_t)B * 4), *d_pos = dev_from(pos, (size_t)B * 4);
    int32_t *d_run = dev_from(run, (size_t)2 * R * 4), *d_long = dev_from(lng, (size_t)(1 + R) * 4);
    int32_t *d_skip = dev_from(skip, (size_t)B * 4), *d_table = dev_from(table, (size_t)n_blk * 4);
    float *d_q = dev((size_t)B * ld_q * 4), *d_o = dev((size_t)B * ld_o * 4);
    float *d_o1 = dev((size_t)B * ld_o * 4);
    float *d_part = dev(attn_partial_floats_rows(sh.n_h, sh.d_h, n_ctx, B) * 4);
    const float *d_k = d_p + 2 * HA, *d_v = d_k + KVA;
    status st;
    attn_prep_rows(d_p, d_k, d_v, ld_in, d_qw, d_kw, sh.n_h, sh.n_kv, sh.d_h, sh.n_rot, base, eps,
                   d_pos, d_slot, d_table, table_ld, d_kc, d_vc, d_q, ld_q, ATTN_KV_F16, B, NULL);
    /* the row kernels on every row, then the tiles with the row kernels on the rest */
    attn_decode_rows(d_q, ld_q, d_p, ld_in, d_kc, d_vc, d_slot, d_table, table_ld, d_pos, NULL,
                     sh.n_h, sh.n_kv, sh.d_h, n_ctx, d_part, d_o1, ld_o, NULL, ATTN_KV_F16, B,
                     NULL);
    attn_prefill_runs(d_q, ld_q, d_kc, d_vc, d_slot, d_table, table_ld, d_pos, d_run, d_long,
                      sh.n_h, sh.n_kv, sh.d_h, n_ctx, d_part, B, R, long_rows, NULL);
    attn_decode_rows(d_q, ld_q, d_p, ld_in, d_kc, d_vc, d_slot, d_table, table_ld, d_pos, d_skip,
                     sh.n_h, sh.n_kv, sh.d_h, n_ctx, d_part, d_o, ld_o, NULL, ATTN_KV_F16, B,
                     NULL);
    CU_ASSERT_EQUAL(cuda_check("attention launches", &st), STATUS_OK);
    float *o = gpu_host_of(d_o, (size_t)B * ld_o * 4);
    float *o1 = gpu_host_of(d_o1, (size_t)B * ld_o * 4);
    if (perturb) o[(B - 1) * ld_o + HA / 2] += 0.01f;

    printf("  attn prefill n_h %d n_kv %d d_h %d: %d runs (%d rows), n_ctx %d, tiles from %d "
           "rows%s\n", sh.n_h, sh.n_kv, sh.d_h, n_runs, B, n_ctx, long_rows,
           perturb ? " (perturbed)" : "");
    double num = 0, den = 0, worst = 0;
    int bad = 0, bad_one = 0, first = -1;
    for (int i = 0; i < B; i++) {
        for (int c = 0; c < HA; c++) {
            const double g = o[i * ld_o + c], r = o1[i * ld_o + c], d = fabs(g - r);
            num += d * d, den += r * r;
            if (!(d <= 2e-4 + 2e-3 * fabs(r))) {
                bad++;
                if (first < 0) first = i;
                worst = fmax(worst, d);
            }
        }
        if (!skip[i]) bad_one += memcmp(o + i * ld_o, o1 + i * ld_o, (size_t)HA * 4) != 0;
    }
    const double nmse = num / (den > 0 ? den : 1);
    printf("    vs the row kernels: %d elements outside the bound (first row %d, worst %.3g), "
           "nmse %.3g; rows of short runs differing: %d\n", bad, first, worst, nmse, bad_one);
    cuda_free(d_qw), cuda_free(d_kw), cuda_free(d_p), cuda_free(d_kc), cuda_free(d_vc);
    cuda_free(d_slot), cuda_free(d_pos), cuda_free(d_run), cuda_free(d_long), cuda_free(d_skip);
    cuda_free(d_table), free(table);
    cuda_free(d_q), cuda_free(d_o), cuda_free(d_o1), cuda_free(d_part);
    free(slot), free(pos), free(run), free(lng), free(skip), free(qw), free(kw), free(p);
    free(c0), free(o), free(o1);
    return bad == 0 && nmse <= 1e-8 && bad_one == 0;
}

static void test_prefill(void)
{
    if (!g_have_gpu) return;
    status st;
    CU_ASSERT_EQUAL_FATAL(attn_prefill_init(&st), STATUS_OK);
    static const int len[] = {1, 2, 40, 1, 150}, start[] = {500, 0, 77, 3, 300};
    static const shape shapes[] = {{8, 2, 256, 64},  {16, 4, 256, 64}, {24, 4, 256, 64},
                                   {4, 4, 64, 32},   {4, 2, 128, 32},  {6, 2, 64, 16}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        CU_ASSERT_TRUE(prefill_case(shapes[i], len, start, 5, 600, 2, false));
    static const int one[] = {300}, at0[] = {0};
    CU_ASSERT_TRUE(prefill_case(shapes[1], one, at0, 1, 300, 2, false)); /* to the last position */
    /* a late chunk of a long prompt: segments of many chunks each */
    static const int late[] = {100}, at3k[] = {3000};
    CU_ASSERT_TRUE(prefill_case(shapes[1], late, at3k, 1, 4000, 2, false));
    CU_ASSERT_TRUE(prefill_case(shapes[0], late, at3k, 1, 4000, 2, false));
    /* segments of whole super-chunks (70,000 positions: 160 each), one super-chunk partly
     * below a row's position */
    static const int at30k[] = {30001};
    CU_ASSERT_TRUE(prefill_case(shapes[5], late, at30k, 1, 70000, 2, false));
    CU_ASSERT_TRUE(prefill_case(shapes[1], late, at30k, 1, 70000, 2, false));
    /* many long runs (16 rows or more) beside short ones: every long run's tiles in the grid */
    static const int mix[] = {16, 15, 40, 3, 16, 17, 2, 33, 16, 20, 1, 18, 16, 16};
    static const int mix_at[] = {0, 9, 500, 1, 70, 0, 30, 250, 64, 1000, 7, 2, 33, 480};
    CU_ASSERT_TRUE(prefill_case(shapes[1], mix, mix_at, 14, 1100, 16, false));
    CU_ASSERT_TRUE(prefill_case(shapes[5], mix, mix_at, 14, 1100, 16, false));
    CU_ASSERT_FALSE(prefill_case(shapes[3], len, start, 5, 600, 2, true)); /* can fail */
}

/* shared memory within the H100/H200's 227 KB a block, grids within the limits (no GPU) */
static void test_dims(void)
{
    static const int d[] = {32, 64, 128, 256};
    for (int i = 0; i < 4; i++) {
        const size_t b = attn_prefill_smem_bytes(d[i]);
        CU_ASSERT(b > 0 && b <= 227 * 1024);
    }
    CU_ASSERT_EQUAL(attn_prefill_smem_bytes(96), 0);
    const cuda_launch_dims a = attn_prefill_runs_dims(24, 4, 256, 2);
    CU_ASSERT(a.grid_x == 4 && a.grid_y >= 1 && a.grid_y <= 65535 && a.grid_z >= 1 &&
              a.grid_z <= 65535 && a.block % 32 == 0 && a.block <= 1024);
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("prefill attention parity on the GPU");
    gpu_rng_seed(&g_rng, 31);
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("attn_prefill_parity", NULL, NULL);
    CU_add_test(s, "dims", test_dims);
    CU_add_test(s, "prefill", test_prefill);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
