/* Threaded matmul over quantised rows; see matmul.h. */
#include "kernels/cpu/matmul.h"

#include <immintrin.h>
#include <stdbool.h>

#include "common/status.h"
#include "gguf/quant.h"

/* ---- FP32 kernels: scalar and AVX2+FMA, picked once at run time ---- */

static float dot_f32_scalar(const float *a, const float *b, int64_t n)
{
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += a[i + l] * b[i + l];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

/* acc[r][t] = w[r]·x[t] for 4 rows (stride ldw) and 2 inputs (stride ldx). */
static void kernel_4x2_scalar(const float *w, int64_t ldw, const float *x, int64_t ldx, int64_t n,
                              float acc[4][2])
{
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 2; t++) acc[r][t] = dot_f32_scalar(w + r * ldw, x + t * ldx, n);
}

#if defined(__x86_64__) || defined(__i386__)
#define HAVE_X86 1

__attribute__((target("avx2,fma"))) static inline float hsum256(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) static float dot_f32_avx2(const float *a, const float *b,
                                                              int64_t n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float r = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

__attribute__((target("avx2,fma"))) static void kernel_4x2_avx2(const float *w, int64_t ldw,
                                                                const float *x, int64_t ldx,
                                                                int64_t n, float acc[4][2])
{
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    const float *x0 = x, *x1 = x + ldx;
    __m256 a00 = _mm256_setzero_ps(), a01 = _mm256_setzero_ps();
    __m256 a10 = _mm256_setzero_ps(), a11 = _mm256_setzero_ps();
    __m256 a20 = _mm256_setzero_ps(), a21 = _mm256_setzero_ps();
    __m256 a30 = _mm256_setzero_ps(), a31 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i);
        __m256 r = _mm256_loadu_ps(w0 + i);
        a00 = _mm256_fmadd_ps(r, v0, a00);
        a01 = _mm256_fmadd_ps(r, v1, a01);
        r = _mm256_loadu_ps(w1 + i);
        a10 = _mm256_fmadd_ps(r, v0, a10);
        a11 = _mm256_fmadd_ps(r, v1, a11);
        r = _mm256_loadu_ps(w2 + i);
        a20 = _mm256_fmadd_ps(r, v0, a20);
        a21 = _mm256_fmadd_ps(r, v1, a21);
        r = _mm256_loadu_ps(w3 + i);
        a30 = _mm256_fmadd_ps(r, v0, a30);
        a31 = _mm256_fmadd_ps(r, v1, a31);
    }
    acc[0][0] = hsum256(a00), acc[0][1] = hsum256(a01);
    acc[1][0] = hsum256(a10), acc[1][1] = hsum256(a11);
    acc[2][0] = hsum256(a20), acc[2][1] = hsum256(a21);
    acc[3][0] = hsum256(a30), acc[3][1] = hsum256(a31);
    for (; i < n; i++)
        for (int r = 0; r < 4; r++) {
            acc[r][0] += w[r * ldw + i] * x0[i];
            acc[r][1] += w[r * ldw + i] * x1[i];
        }
}
#endif

typedef float (*dot_f32_fn)(const float *, const float *, int64_t);
typedef void (*kernel_4x2_fn)(const float *, int64_t, const float *, int64_t, int64_t,
                              float[4][2]);

static bool have_avx2(void)
{
#ifdef HAVE_X86
    static int cached = -1;
    if (cached < 0) {
        __builtin_cpu_init();
        cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return cached;
#else
    return false;
#endif
}

float ref_dot_f32(const float *a, const float *b, int64_t n)
{
#ifdef HAVE_X86
    if (have_avx2()) return dot_f32_avx2(a, b, n);
#endif
    return dot_f32_scalar(a, b, n);
}

/* ---- the threaded matmul ---- */

typedef struct mm_job {
    const uint8_t *w;
    const quant_traits *qt;
    uint32_t type;
    uint64_t row_bytes;
    int64_t n_in, n_out;
    const float *x;
    int64_t ldx;
    int T;
    float *y;
    int64_t ldy;
    float *scratch; /* [n_threads][REF_MATMUL_TILE][n_in] */
    int64_t rows_per_task;
    int n_threads;
    dot_f32_fn dot;
    kernel_4x2_fn k4x2;
} mm_job;

size_t ref_matmul_scratch_floats(int64_t n_in_max, int n_threads)
{
    return (size_t)n_threads * REF_MATMUL_TILE * (size_t)n_in_max;
}

/* Decode path: each row dotted against every input while it is in L1. */
static void mm_rows_dot(const mm_job *j, int64_t r0, int64_t r1)
{
    quant_dot_fn dot = j->qt->dot;
    for (int64_t r = r0; r < r1; r++) {
        const void *row = j->w + (uint64_t)r * j->row_bytes;
        for (int t = 0; t < j->T; t++) j->y[t * j->ldy + r] = dot(row, j->x + t * j->ldx, j->n_in);
    }
}

/* rows [r0, r0+n) given as FP32 rows `w` (stride n_in) times every input. */
static void mm_tile_f32(const mm_job *j, const float *w, int64_t r0, int n)
{
    int64_t n_in = j->n_in;
    int r = 0;
    for (; r + 4 <= n; r += 4) {
        int t = 0;
        for (; t + 2 <= j->T; t += 2) {
            float acc[4][2];
            j->k4x2(w + r * n_in, n_in, j->x + t * j->ldx, j->ldx, n_in, acc);
            for (int a = 0; a < 4; a++) {
                j->y[t * j->ldy + r0 + r + a] = acc[a][0];
                j->y[(t + 1) * j->ldy + r0 + r + a] = acc[a][1];
            }
        }
        for (; t < j->T; t++)
            for (int a = 0; a < 4; a++)
                j->y[t * j->ldy + r0 + r + a] = j->dot(w + (r + a) * n_in, j->x + t * j->ldx, n_in);
    }
    for (; r < n; r++)
        for (int t = 0; t < j->T; t++)
            j->y[t * j->ldy + r0 + r] = j->dot(w + r * n_in, j->x + t * j->ldx, n_in);
}

static void mm_task(void *arg, int task)
{
    const mm_job *j = arg;
    int64_t r0 = task * j->rows_per_task;
    int64_t r1 = r0 + j->rows_per_task < j->n_out ? r0 + j->rows_per_task : j->n_out;
    if (j->T < REF_MATMUL_TILE_MIN_T) {
        mm_rows_dot(j, r0, r1);
        return;
    }
    if (j->type == GGML_TYPE_F32 && j->row_bytes == (uint64_t)j->n_in * 4) {
        mm_tile_f32(j, (const float *)(j->w + (uint64_t)r0 * j->row_bytes), r0, (int)(r1 - r0));
        return;
    }
    int ti = cpu_pool_thread_index();
    DS_ASSERT(ti < j->n_threads);
    float *tile = j->scratch + (size_t)ti * REF_MATMUL_TILE * j->n_in;
    for (int64_t r = r0; r < r1; r += REF_MATMUL_TILE) {
        int n = r1 - r < REF_MATMUL_TILE ? (int)(r1 - r) : REF_MATMUL_TILE;
        for (int a = 0; a < n; a++)
            j->qt->dequant(j->w + (uint64_t)(r + a) * j->row_bytes, tile + a * j->n_in, j->n_in);
        mm_tile_f32(j, tile, r, n);
    }
}

void ref_matmul(cpu_pool *pool, const void *w, uint32_t type, uint64_t row_bytes, int64_t n_in,
                int64_t n_out, const float *x, int64_t ldx, int T, float *y, int64_t ldy,
                float *scratch)
{
    const quant_traits *qt = quant_get(type);
    DS_ASSERT(qt && qt->supported && T >= 1 && n_out >= 1);
    DS_ASSERT(T < REF_MATMUL_TILE_MIN_T || type == GGML_TYPE_F32 || scratch);
    int n_threads = cpu_pool_n_threads(pool);
    mm_job j = {.w = w, .qt = qt, .type = type, .row_bytes = row_bytes, .n_in = n_in,
                .n_out = n_out, .x = x, .ldx = ldx, .T = T, .y = y, .ldy = ldy,
                .scratch = scratch, .n_threads = n_threads, .dot = dot_f32_scalar, .k4x2 = kernel_4x2_scalar};
#ifdef HAVE_X86
    if (have_avx2()) j.dot = dot_f32_avx2, j.k4x2 = kernel_4x2_avx2;
#endif
    /* ~4 tasks per thread for balance, each a multiple of the tile, at least 16 rows. */
    int64_t per = (n_out + 4 * n_threads - 1) / (4 * n_threads);
    if (per < 16) per = 16;
    per = (per + REF_MATMUL_TILE - 1) / REF_MATMUL_TILE * REF_MATMUL_TILE;
    j.rows_per_task = per;
    int n_tasks = (int)((n_out + per - 1) / per);
    cpu_pool_run(pool, mm_task, &j, n_tasks);
}
