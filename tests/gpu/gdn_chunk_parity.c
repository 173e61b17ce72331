/* The chunked delta rule of prefill runs (gdn_chunk_runs, kernels/cuda/gdn.h "Chunked runs")
 * against its CPU twin ref_gdn_chunked (kernels/cpu/gdn.h) and against the row-by-row rule
 * (gdn_decode_runs on every run), at the 0.8B / 4B / 27B head shapes and a small one.
 *
 * A launch holds runs of 1, 2, 63, 64, 65 and 200 rows (chunks cut inside and at the boundary,
 * runs of one row left to gdn_decode_runs), on distinct slots of random states, with more run
 * entries than runs (a bucket's empty padding) and more runs than the kernel's run CTAs. The
 * rows' conv outputs come from gdn_conv_runs (in place, as the forward), so both paths and the
 * twin read the same inputs. Checked:
 *  - every output row and every named slot's final state against the twin (per element
 *    |err| <= 2e-4 + 2e-3 |ref|, and the normalised squared error <= 1e-8);
 *  - the same against the row-by-row rule (the two forms agree in exact arithmetic);
 *  - the one-row runs bit-identical to the row-by-row launch (the same kernel, also when its
 *    CTAs take several runs each beside the chunked rule), slots no run names untouched;
 *  - a perturbed output fails the check.
 * With S stored as bf16 (gdn.h "State storage") the same, the twin rounding S after every chunk
 * (where the kernel does: a run below long_rows goes row by row, so its twin is fed one row at a
 * time and rounds after every row) and the row-by-row rule after every row: against the twin a
 * few bf16 steps more where the two round apart (|err| <= 4e-4 + 2e-2 |ref|: 3 steps seen on an
 * H100; nmse <= 1e-6, 7e-10 seen); against the row-by-row rule, whose
 * roundings fall elsewhere (up to 200 rows apart: on an H100 differences of 2.2e-3 on states of
 * max ~0.3, nmse 7e-6), |err| <= 4e-3 + 5e-2 |ref| and nmse <= 1e-4. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "kernels/cpu/gdn.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gdn.h"
#include "tests/gpu/gpu_dev.h"
#include "tests/gpu/gpu_parity.h"

static bool g_have_gpu;
static gpu_rng g_rng;

typedef struct shape {
    int n_k, n_v, d_k, d_v;
} shape;

typedef struct bound {
    double atol, rtol, nmse;
} bound;
static const bound F32_BOUND = {2e-4, 2e-3, 1e-8}, BF16_TWIN = {4e-4, 2e-2, 1e-6},
                   BF16_ROWS = {4e-3, 5e-2, 1e-4};

/* worst per-element excess over atol + rtol |ref| (0: all within) and the nmse, printed */
static bool close_to(const char *what, const float *got, const float *ref, int64_t n, bound b)
{
    double num = 0, den = 0, worst = 0;
    int64_t at = -1;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]), lim = b.atol + b.rtol * fabs(ref[i]);
        if (!(d <= lim) && (at < 0 || d - lim > worst)) worst = d - lim, at = i;
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    const double nmse = num / (den > 0 ? den : 1);
    const bool ok = at < 0 && nmse <= b.nmse;
    if (!ok)
        printf("    %s: %s (nmse %.3g, worst element %lld: %g vs %g)\n", what, "FAIL", nmse,
               (long long)at, at >= 0 ? got[at] : 0, at >= 0 ? ref[at] : 0);
    else
        printf("    %s: ok (nmse %.3g)\n", what, nmse);
    return ok;
}

/* One launch of the runs len[0 .. n_runs) (entries past n_runs up to R empty): those of
 * long_rows rows or more chunked, the rest row by row. */
static bool chunk_case(shape sh, const int *len, int n_runs, int R, int long_rows, bool bf16,
                       bool perturb)
{
    const int K = 4, C = 2 * sh.n_k * sh.d_k + sh.n_v * sh.d_v, D_v = sh.n_v * sh.d_v;
    const int D_k = sh.n_k * sh.d_k;
    const float eps = 1e-6f;
    const int64_t nS = (int64_t)sh.n_v * sh.d_v * sh.d_k, S_stride = nS + 64; /* elements */
    const int64_t nCS = (int64_t)C * (K - 1), ld_p = C + D_v + 2 * sh.n_v + 3, ld_o = D_v + 2;
    int B = 0;
    for (int r = 0; r < n_runs; r++) B += len[r];
    const int n_slots = n_runs + 2;
    int32_t *slot = gpu_xmalloc((size_t)B * 4), *run = gpu_xmalloc((size_t)2 * R * 4);
    int32_t *lng = gpu_xmalloc((size_t)(1 + R) * 4);
    int32_t *perm = gpu_xmalloc((size_t)n_slots * 4);
    gpu_rng_permutation(&g_rng, perm, n_slots);
    gpu_runs_make(len, n_runs, R, perm, slot, run);
    lng[0] = 0;
    for (int r = 0; r < n_runs; r++)
        if (len[r] >= long_rows) lng[1 + lng[0]++] = r;
    float *conv_w = gpu_rand_vec(&g_rng, (int64_t)C * K, 0.5f);
    float *dt = gpu_rand_vec(&g_rng, sh.n_v, 1.0f);
    float *ssm_a = gpu_rand_vec(&g_rng, sh.n_v, 1.0f);
    for (int h = 0; h < sh.n_v; h++) ssm_a[h] = -expf(0.5f * ssm_a[h]);
    float *S0 = gpu_rand_vec(&g_rng, n_slots * S_stride, 0.05f);
    float *cs0 = gpu_rand_vec(&g_rng, (int64_t)n_slots * nCS, 1.0f);
    float *p = gpu_rand_vec(&g_rng, (int64_t)B * ld_p, 1.0f);
    const size_t Sb = (size_t)n_slots * S_stride * 4, CSb = (size_t)n_slots * nCS * 4;
    const size_t Pb = (size_t)B * ld_p * 4, Ob = (size_t)B * ld_o * 4;
    float *d_cw = dev_from(conv_w, (size_t)C * K * 4), *d_dt = dev_from(dt, sh.n_v * 4);
    float *d_sa = dev_from(ssm_a, sh.n_v * 4), *d_cs = dev_from(cs0, CSb);
    int32_t *d_slot = dev_from(slot, (size_t)B * 4), *d_run = dev_from(run, (size_t)2 * R * 4);
    int32_t *d_long = dev_from(lng, (size_t)(1 + R) * 4);
    float *d_p = dev_from(p, Pb);
    void *d_S = gpu_state_dev(S0, n_slots * S_stride, bf16); /* S0 then holds its values */
    void *d_S1 = gpu_state_dev(S0, n_slots * S_stride, bf16);
    float *d_o = dev(Ob), *d_o1 = dev(Ob);
    float *d_scr = dev((size_t)gdn_chunk_scratch_floats(sh.n_v, sh.d_k, sh.d_v, B, long_rows) * 4);
    status st;
    CU_ASSERT_EQUAL(cuda_memset(d_o, 0, Ob, &st), STATUS_OK);
    CU_ASSERT_EQUAL(cuda_memset(d_o1, 0, Ob, &st), STATUS_OK);
    gdn_conv_runs(d_p, ld_p, d_cw, d_cs, nCS, d_slot, d_run, NULL, long_rows, C, K, d_p, ld_p, R,
                  NULL);
    const float *d_b = d_p + C + D_v, *d_a = d_b + sh.n_v;
    /* chunked: short runs by the row-by-row kernel, the rest by the chunked one */
    gdn_decode_runs(d_p, ld_p, d_b, d_a, ld_p, d_dt, d_sa, sh.n_k, sh.n_v, sh.d_k, sh.d_v, eps,
                    d_S, bf16, S_stride, d_slot, d_run, NULL, long_rows, d_o, ld_o, R, NULL);
    gdn_chunk_runs(d_p, ld_p, d_b, d_a, ld_p, d_dt, d_sa, sh.n_k, sh.n_v, sh.d_k, sh.d_v, eps,
                   d_S, bf16, S_stride, d_slot, d_run, d_long, d_o, ld_o, R, B, long_rows, d_scr,
                   NULL);
    /* row by row, every run */
    gdn_decode_runs(d_p, ld_p, d_b, d_a, ld_p, d_dt, d_sa, sh.n_k, sh.n_v, sh.d_k, sh.d_v, eps,
                    d_S1, bf16, S_stride, d_slot, d_run, NULL, 0, d_o1, ld_o, R, NULL);
    CU_ASSERT_EQUAL(cuda_check("gdn chunk launches", &st), STATUS_OK);
    float *P = gpu_host_of(d_p, Pb), *o = gpu_host_of(d_o, Ob), *o1 = gpu_host_of(d_o1, Ob);
    float *S = gpu_state_host(d_S, n_slots * S_stride, bf16);
    float *S1 = gpu_state_host(d_S1, n_slots * S_stride, bf16);
    if (perturb) o[(B - 1) * ld_o + D_v / 2] += 0.01f;

    /* the twin: per run and value head, norms and gates as ref_gdn_decode, then ref_gdn_chunked */
    char name[160];
    snprintf(name, sizeof name,
             "gdn chunk n_k %d n_v %d d_k %d d_v %d%s: %d runs (%d rows) in %d, chunked from %d "
             "rows%s", sh.n_k, sh.n_v, sh.d_k, sh.d_v, bf16 ? " bf16 state" : "", n_runs, B, R,
             long_rows, perturb ? " (perturbed)" : "");
    printf("  %s\n", name);
    float *qk = gpu_xmalloc((size_t)B * C * 4), *beta = gpu_xmalloc((size_t)B * sh.n_v * 4);
    float *g = gpu_xmalloc((size_t)B * sh.n_v * 4), *o_ref = gpu_xmalloc((size_t)B * D_v * 4);
    float *S_ref = gpu_xmalloc(Sb);
    float *scratch = gpu_xmalloc(ref_gdn_chunked_scratch_floats(sh.d_k, sh.d_v) * 4);
    memcpy(S_ref, S0, Sb);
    for (int i = 0; i < B; i++) {
        memcpy(qk + (size_t)i * C, P + i * ld_p, (size_t)C * 4);
        ref_gdn_qk_norm(qk + (size_t)i * C, sh.n_k, sh.d_k, eps);
        ref_gdn_gates(P + i * ld_p + C + D_v, P + i * ld_p + C + D_v + sh.n_v, dt, ssm_a, sh.n_v,
                      beta + (size_t)i * sh.n_v, g + (size_t)i * sh.n_v);
    }
    for (int r = 0; r < n_runs; r++) {
        const int i0 = run[r];
        for (int hv = 0; hv < sh.n_v; hv++) {
            const int kh = hv % sh.n_k;
            const float *q = qk + (size_t)i0 * C + kh * sh.d_k, *k = q + D_k;
            const float *v = qk + (size_t)i0 * C + 2 * D_k + hv * sh.d_v;
            /* bf16: a run the kernel takes row by row rounds S after every row */
            const int step = bf16 && len[r] < long_rows ? 1 : len[r];
            for (int t = 0; t < len[r]; t += step)
                ref_gdn_chunked(step, q + (size_t)t * C, k + (size_t)t * C, C,
                                v + (size_t)t * C, C, beta + (size_t)(i0 + t) * sh.n_v + hv,
                                g + (size_t)(i0 + t) * sh.n_v + hv, sh.n_v, sh.d_k, sh.d_v,
                                S_ref + perm[r] * S_stride + (int64_t)hv * sh.d_v * sh.d_k, bf16,
                                o_ref + (size_t)(i0 + t) * D_v + hv * sh.d_v, D_v, scratch);
        }
    }
    bool ok = true;
    float *o_rows = gpu_xmalloc((size_t)B * D_v * 4), *o1_rows = gpu_xmalloc((size_t)B * D_v * 4);
    for (int i = 0; i < B; i++) {
        memcpy(o_rows + (size_t)i * D_v, o + i * ld_o, (size_t)D_v * 4);
        memcpy(o1_rows + (size_t)i * D_v, o1 + i * ld_o, (size_t)D_v * 4);
    }
    const bound twin = bf16 ? BF16_TWIN : F32_BOUND, by_rows = bf16 ? BF16_ROWS : F32_BOUND;
    ok &= close_to("outputs vs the twin (ref_gdn_chunked)", o_rows, o_ref, (int64_t)B * D_v, twin);
    ok &= close_to("outputs vs row by row (gdn_decode_runs)", o_rows, o1_rows, (int64_t)B * D_v,
                   by_rows);
    int bad_one = 0, bad_kept = 0;
    for (int r = 0; r < n_runs; r++) {
        const int64_t s = perm[r];
        char what[96];
        snprintf(what, sizeof what, "run %d (%d rows): state vs the twin", r, len[r]);
        ok &= close_to(what, S + s * S_stride, S_ref + s * S_stride, nS, twin);
        snprintf(what, sizeof what, "run %d (%d rows): state vs row by row", r, len[r]);
        ok &= close_to(what, S + s * S_stride, S1 + s * S_stride, nS, by_rows);
        if (len[r] < long_rows) /* row by row: bit-identical */
            bad_one += memcmp(o + run[r] * ld_o, o1 + run[r] * ld_o, (size_t)D_v * 4) != 0 ||
                       memcmp(S + s * S_stride, S1 + s * S_stride, (size_t)nS * 4) != 0;
    }
    for (int s = n_runs; s < n_slots; s++) /* slots no run names */
        bad_kept += memcmp(S + perm[s] * S_stride, S0 + perm[s] * S_stride, (size_t)nS * 4) != 0;
    if (bad_one || bad_kept)
        printf("    short runs differing from the row-by-row kernel: %d; slots no run names "
               "changed: %d\n", bad_one, bad_kept);
    ok &= !bad_one && !bad_kept;
    cuda_free(d_cw), cuda_free(d_dt), cuda_free(d_sa), cuda_free(d_cs), cuda_free(d_slot);
    cuda_free(d_run), cuda_free(d_long), cuda_free(d_p), cuda_free(d_S), cuda_free(d_S1);
    cuda_free(d_o);
    cuda_free(d_o1);
    cuda_free(d_scr);
    free(slot), free(run), free(lng), free(perm), free(conv_w), free(dt), free(ssm_a), free(S0);
    free(cs0);
    free(p), free(P), free(o), free(o1), free(S), free(S1), free(qk), free(beta), free(g);
    free(o_ref), free(S_ref), free(scratch), free(o_rows), free(o1_rows);
    return ok;
}

static void test_chunk_runs(void)
{
    if (!g_have_gpu) return;
    status st;
    CU_ASSERT_EQUAL_FATAL(gdn_chunk_init(&st), STATUS_OK);
    static const int runs[] = {2, 63, 1, 64, 65, 200, 1}, one[] = {130};
    static const int many[] = {16, 15, 40, 3, 16, 17, 2, 33, 16, 20, 1, 18, 16, 16}; /* 10 long */
    static const shape shapes[] = {{16, 16, 128, 128}, {16, 32, 128, 128}, {16, 48, 128, 128},
                                   {2, 4, 64, 64}, {4, 4, 32, 32}};
    int lots[90];
    for (int r = 0; r < 90; r++) lots[r] = r == 40 ? 70 : r == 77 ? 16 : 1 + r % 5;
    for (int bf16 = 0; bf16 < 2; bf16++) { /* S as F32, then as bf16 */
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            CU_ASSERT_TRUE(chunk_case(shapes[i], runs, 7, 12, 2, bf16, false));
        CU_ASSERT_TRUE(chunk_case(shapes[1], one, 1, 1, 2, bf16, false));
        /* more long runs than the grid takes at once, short ones (< 16) row by row */
        CU_ASSERT_TRUE(chunk_case(shapes[1], many, 14, 20, 16, bf16, false));
        CU_ASSERT_TRUE(chunk_case(shapes[3], many, 14, 14, 16, bf16, false));
        /* more run entries than gdn_decode_runs' CTAs in z beside the chunked rule (64): its
         * CTAs each take several short runs, still bit-identical to the row-by-row launch */
        CU_ASSERT_TRUE(chunk_case(shapes[1], lots, 90, 150, 16, bf16, false));
        CU_ASSERT_FALSE(chunk_case(shapes[3], runs, 7, 7, 2, bf16, true)); /* can fail */
    }
}

/* launch grids against the device limits, and the shared memory against the H100/H200's
 * 227 KB per block (no GPU needed) */
static void test_dims(void)
{
    static const int d[] = {32, 64, 128};
    for (int i = 0; i < 3; i++) {
        const size_t b = gdn_chunk_smem_bytes(d[i]);
        CU_ASSERT(b > 0 && b <= 227 * 1024);
    }
    CU_ASSERT_EQUAL(gdn_chunk_smem_bytes(96), 0);
    const cuda_launch_dims a = gdn_chunk_runs_dims(48, 128, 256);
    const cuda_launch_dims c = gdn_chunk_runs_dims(16, 128, 1);
    CU_ASSERT(a.grid_x == 48 && a.grid_y == 4 && a.grid_z >= 1 && a.grid_z <= 256);
    CU_ASSERT(c.grid_z == 1 && c.block % 32 == 0 && c.block <= 1024);
}

int main(void)
{
    g_have_gpu = gpu_test_have_gpu("chunked delta rule parity on the GPU");
    gpu_rng_seed(&g_rng, 29);
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("gdn_chunk_parity", NULL, NULL);
    CU_add_test(s, "dims", test_dims);
    CU_add_test(s, "chunk_runs", test_chunk_runs);
    CU_basic_set_mode(CU_BRM_VERBOSE);
    CU_basic_run_tests();
    const unsigned failed = CU_get_number_of_tests_failed() + CU_get_number_of_failures();
    CU_cleanup_registry();
    return failed ? 1 : 0;
}
