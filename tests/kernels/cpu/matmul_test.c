/* cpu_matmul on every supported weight type against dequantise-then-double-dot, on both the
 * decode (dot) and prefill (tile) paths, serial and threaded, in the exact mode; in the
 * integer (Q8) mode, bit for bit against the scalar references of gguf/quant (quantise each
 * input, integer dot per row) where the integer path runs; every output the same bits whatever
 * the number of inputs of the call (each mode, every type, serial and threaded); and the pool
 * itself. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/quant.h"
#include "kernel_check.h"
#include "kernels/cpu/cpu_pool.h"
#include "kernels/cpu/matmul.h"
#include "tests/testutil/testutil.h"

static const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                                 GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};

/* Returns failures. n_in must fit the type's block. dot: the cpu_matmul mode; in the Q8 mode
 * the integer path's outputs (quantised types, any T) must equal the scalar references exactly,
 * float types the double dot within 1e-5 relative. */
static long mm_case_mode(cpu_pool *pool, uint32_t type, int64_t n_in, int64_t n_out, int T, int perturb,
                         cpu_matmul_dot dot)
{
    const quant_traits *qt = quant_get(type);
    kc_rng r = {77 + type * 131 + (uint64_t)T};
    uint64_t rb = quant_row_bytes(type, (uint64_t)n_in);
    uint8_t *w = malloc(rb * n_out);
    float *row = malloc(sizeof(float) * n_in), *x = malloc(sizeof(float) * T * (n_in + 3));
    float *y = malloc(sizeof(float) * T * (n_out + 5)), *ref = malloc(sizeof(float) * T * (n_out + 5));
    float *scratch = malloc(sizeof(float) * cpu_matmul_scratch_floats(n_in, cpu_pool_n_threads(pool)));
    long ldx = n_in + 3, ldy = n_out + 5; /* strided rows */
    kc_fill(&r, x, T * ldx, 1);
    double *acc = calloc((size_t)T * n_out, sizeof(double)), *mag = calloc((size_t)T * n_out, sizeof(double));
    for (int64_t o = 0; o < n_out; o++) {
        kc_fill(&r, row, n_in, 1);
        qt->quantize(row, w + o * rb, n_in);
        qt->dequant(w + o * rb, row, n_in);
        for (int t = 0; t < T; t++)
            for (int64_t i = 0; i < n_in; i++) {
                acc[t * n_out + o] += (double)row[i] * x[t * ldx + i];
                mag[t * n_out + o] += fabs((double)row[i] * x[t * ldx + i]);
            }
    }
    for (long i = 0; i < T * ldy; i++) y[i] = ref[i] = -7; /* padding must stay untouched */
    for (int t = 0; t < T; t++)
        for (int64_t o = 0; o < n_out; o++) ref[t * ldy + o] = (float)acc[t * n_out + o];
    const int q8 = dot == CPU_MATMUL_DOT_Q8 && qt->dot_q8;
    if (q8) { /* the integer path's exact expectation */
        uint64_t xb = quant_act_bytes(type, n_in);
        uint8_t *xq = malloc(xb);
        for (int t = 0; t < T; t++) {
            if (qt->vec_dot_type == GGML_TYPE_Q8_K) quant_quantize_row_q8_K_ref(x + t * ldx, (block_q8_K *)xq, n_in);
            else quant_quantize_row_q8_0_ref(x + t * ldx, (block_q8_0 *)xq, n_in);
            for (int64_t o = 0; o < n_out; o++) ref[t * ldy + o] = qt->dot_q8_ref(w + o * rb, xq, n_in);
        }
        free(xq);
    }
    cpu_matmul(pool, w, type, rb, n_in, n_out, x, ldx, T, y, ldy, scratch, dot);
    if (perturb) y[ldy * (T - 1) + n_out / 2] += q8 ? 1e-6f * fabsf(y[ldy * (T - 1) + n_out / 2]) + 1e-30f : 0.5f;
    long bad = 0;
    for (int t = 0; t < T; t++)
        for (int64_t o = 0; o < ldy; o++) {
            long i = t * ldy + o;
            double tol = o < n_out && !q8 ? 1e-5 * mag[t * n_out + o] + 1e-6 : 0;
            if (!(fabs((double)y[i] - ref[i]) <= tol)) {
                if (bad < 5)
                    fprintf(stderr, "  %s T=%d n_out=%lld [%d][%lld]: got %g ref %g\n", qt->name, T,
                            (long long)n_out, t, (long long)o, y[i], ref[i]);
                bad++;
            }
        }
    free(w), free(row), free(x), free(y), free(ref), free(scratch), free(acc), free(mag);
    return bad;
}

static long mm_case(cpu_pool *pool, uint32_t type, int64_t n_in, int64_t n_out, int T, int perturb)
{
    return mm_case_mode(pool, type, n_in, n_out, T, perturb, CPU_MATMUL_DOT_EXACT) +
           mm_case_mode(pool, type, n_in, n_out, T, perturb, CPU_MATMUL_DOT_Q8);
}

static void run_types(cpu_pool *pool)
{
    static const int Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 17, 35}; /* both sides of the thresholds */
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        int64_t n_in = quant_get(type)->block_size == QK_K ? 512 : 96;
        for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
            CU_ASSERT_EQUAL(mm_case(pool, type, n_in, 37, Ts[k], 0), 0);
            CU_ASSERT_EQUAL(mm_case(pool, type, 256, 301, Ts[k], 0), 0);
        }
    }
    /* long rows: the integer path's inputs do not all fit the scratch at once (chunks of
     * CPU_MATMUL_Q8_MIN_COLS = 14 at n_in 16384 with one thread's scratch) */
    CU_ASSERT_EQUAL(mm_case(pool, GGML_TYPE_Q4_K, 16384, 9, 35, 0), 0);
    CU_ASSERT_EQUAL(mm_case(pool, GGML_TYPE_Q8_0, 16384, 9, 31, 0), 0);
}

static void test_serial(void) { run_types(NULL); }

static void test_threaded(void)
{
    cpu_pool *p;
    status st;
    CU_ASSERT_FATAL(cpu_pool_create(&p, 3, &st) == STATUS_OK);
    run_types(p);
    cpu_pool_destroy(p);
}

/* An output depends only on its weight row and its input: T inputs in one call give, bit for
 * bit, what each input gives alone (the decode and tile paths, the tile's last rows). */
static long invariant_case(cpu_pool *pool, uint32_t type, int64_t n_in, int64_t n_out, int T,
                           cpu_matmul_dot dot)
{
    const quant_traits *qt = quant_get(type);
    kc_rng r = {5 + type * 17 + (uint64_t)T};
    const uint64_t rb = quant_row_bytes(type, (uint64_t)n_in);
    uint8_t *w = malloc(rb * n_out);
    float *row = malloc(sizeof(float) * n_in), *x = malloc(sizeof(float) * T * n_in);
    float *all = malloc(sizeof(float) * T * n_out), *one = malloc(sizeof(float) * n_out);
    float *scratch = malloc(sizeof(float) * cpu_matmul_scratch_floats(n_in, cpu_pool_n_threads(pool)));
    for (int64_t o = 0; o < n_out; o++) kc_fill(&r, row, n_in, 1), qt->quantize(row, w + o * rb, n_in);
    kc_fill(&r, x, T * n_in, 1);
    cpu_matmul(pool, w, type, rb, n_in, n_out, x, n_in, T, all, n_out, scratch, dot);
    long bad = 0;
    for (int t = 0; t < T; t++) {
        cpu_matmul(pool, w, type, rb, n_in, n_out, x + t * n_in, n_in, 1, one, n_out, scratch, dot);
        if (memcmp(one, all + t * n_out, sizeof(float) * n_out)) {
            if (bad < 3) fprintf(stderr, "  %s mode %d T=%d: input %d differs from alone\n", qt->name, dot, T, t);
            bad++;
        }
    }
    free(w), free(row), free(x), free(all), free(one), free(scratch);
    return bad;
}

static void test_t_invariant(void)
{
    static const int Ts[] = {2, 3, 5, 6, 7, 17};
    cpu_pool *p;
    status st;
    CU_ASSERT_FATAL(cpu_pool_create(&p, 3, &st) == STATUS_OK);
    cpu_pool *pools[2] = {NULL, p};
    for (int pi = 0; pi < 2; pi++)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const int bs = quant_get(types[ti])->block_size;
            const int64_t n_in = bs == QK_K ? 512 : bs == 1 ? 203 : 224; /* 203: a tail */
            for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++)
                for (int m = CPU_MATMUL_DOT_Q8; m <= CPU_MATMUL_DOT_EXACT; m++)
                    CU_ASSERT_EQUAL(invariant_case(pools[pi], types[ti], n_in, 301, Ts[k], m), 0);
        }
    cpu_pool_destroy(p);
}

static void test_check_can_fail(void)
{
    for (int m = CPU_MATMUL_DOT_Q8; m <= CPU_MATMUL_DOT_EXACT; m++) {
        CU_ASSERT_NOT_EQUAL(mm_case_mode(NULL, GGML_TYPE_Q4_K, 256, 37, 5, 1, m), 0);
        CU_ASSERT_NOT_EQUAL(mm_case_mode(NULL, GGML_TYPE_Q4_K, 256, 37, 20, 1, m), 0);
        CU_ASSERT_NOT_EQUAL(mm_case_mode(NULL, GGML_TYPE_Q8_0, 256, 37, 1, 1, m), 0);
    }
}

/* The integer path is really used (the exact mode differs from it) and is the default. */
static void test_modes_differ(void)
{
    const int64_t n_in = 512, n_out = 40;
    kc_rng r = {9};
    uint64_t rb = quant_row_bytes(GGML_TYPE_Q4_K, n_in);
    uint8_t *w = malloc(rb * n_out);
    float row[512], x[512], a[40], b[40], c[40];
    float *scratch = malloc(sizeof(float) * cpu_matmul_scratch_floats(n_in, 1));
    for (int64_t o = 0; o < n_out; o++) kc_fill(&r, row, n_in, 1), quant_get(GGML_TYPE_Q4_K)->quantize(row, w + o * rb, n_in);
    kc_fill(&r, x, n_in, 1);
    cpu_matmul(NULL, w, GGML_TYPE_Q4_K, rb, n_in, n_out, x, n_in, 1, a, n_out, scratch, CPU_MATMUL_DOT_Q8);
    cpu_matmul(NULL, w, GGML_TYPE_Q4_K, rb, n_in, n_out, x, n_in, 1, b, n_out, scratch, CPU_MATMUL_DOT_EXACT);
    cpu_matmul(NULL, w, GGML_TYPE_Q4_K, rb, n_in, n_out, x, n_in, 1, c, n_out, scratch, CPU_MATMUL_DOT_DEFAULT);
    CU_ASSERT(memcmp(a, b, sizeof a) != 0);
    CU_ASSERT(memcmp(c, a, sizeof a) == 0);
    free(w), free(scratch);
}

static void test_dot_f32(void)
{
    kc_rng r = {4};
    float a[203], b[203];
    kc_fill(&r, a, 203, 1), kc_fill(&r, b, 203, 1);
    for (int n = 0; n <= 203; n += 29) {
        double ref = 0, mag = 0;
        for (int i = 0; i < n; i++) ref += (double)a[i] * b[i], mag += fabs((double)a[i] * b[i]);
        CU_ASSERT(fabs(ref_dot_f32(a, b, n) - ref) <= 1e-6 * mag + 1e-7);
    }
}

static void test_vec_helpers(void)
{
    enum { N = 203 };
    kc_rng r = {6};
    float x[N], y[N], k[N], q[N], ref[N];
    kc_fill(&r, x, N, 1), kc_fill(&r, y, N, 1), kc_fill(&r, k, N, 1), kc_fill(&r, q, N, 1);
    for (int i = 0; i < N; i++) ref[i] = y[i] + 0.7f * x[i];
    ref_axpy_f32(y, 0.7f, x, N);
    CU_ASSERT_EQUAL(kernel_check("axpy", y, ref, N, 1e-6, 1e-6), 0);
    for (int i = 0; i < N; i++) ref[i] = y[i] * -1.3f;
    ref_scale_f32(y, -1.3f, N);
    CU_ASSERT_EQUAL(kernel_check("scale", y, ref, N, 1e-6, 1e-6), 0);
    double d = 0;
    for (int i = 0; i < N; i++) ref[i] = y[i] * 0.5f, d += (double)ref[i] * k[i];
    float got = ref_scale_dot_f32(y, 0.5f, k, N);
    CU_ASSERT_EQUAL(kernel_check("scale_dot s", y, ref, N, 1e-6, 1e-6), 0);
    CU_ASSERT(fabs(got - d) < 1e-4);
    d = 0;
    for (int i = 0; i < N; i++) ref[i] = y[i] + 0.25f * k[i], d += (double)ref[i] * q[i];
    got = ref_axpy_dot_f32(y, 0.25f, k, q, N);
    CU_ASSERT_EQUAL(kernel_check("axpy_dot s", y, ref, N, 1e-6, 1e-6), 0);
    CU_ASSERT(fabs(got - d) < 1e-4);
}

typedef struct pool_count {
    atomic_int hits[1000];
    atomic_int max_index;
} pool_count;

static void count_task(void *arg, int t)
{
    pool_count *c = arg;
    atomic_fetch_add(&c->hits[t], 1);
    int ti = cpu_pool_thread_index(), m = atomic_load(&c->max_index);
    while (ti > m && !atomic_compare_exchange_weak(&c->max_index, &m, ti)) {
    }
}

static void test_pool(void)
{
    cpu_pool *p;
    status st;
    CU_ASSERT_FATAL(cpu_pool_create(&p, 4, &st) == STATUS_OK);
    CU_ASSERT_EQUAL(cpu_pool_n_threads(p), 4);
    static pool_count c;
    for (int round = 0; round < 200; round++) {
        int n = 1 + round * 5 % 1000;
        memset(&c, 0, sizeof c);
        cpu_pool_run(p, count_task, &c, n);
        int ok = 1;
        for (int t = 0; t < 1000; t++) ok &= atomic_load(&c.hits[t]) == (t < n ? 1 : 0);
        CU_ASSERT(ok);
        CU_ASSERT(atomic_load(&c.max_index) < 4);
    }
    cpu_pool_destroy(p);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("matmul", NULL, NULL);
    CU_add_test(s, "serial", test_serial);
    CU_add_test(s, "threaded", test_threaded);
    CU_add_test(s, "t_invariant", test_t_invariant);
    CU_add_test(s, "check_can_fail", test_check_can_fail);
    CU_add_test(s, "modes_differ", test_modes_differ);
    CU_add_test(s, "dot_f32", test_dot_f32);
    CU_add_test(s, "vec_helpers", test_vec_helpers);
    CU_add_test(s, "pool", test_pool);
    return testutil_cunit_run();
}
