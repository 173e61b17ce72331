/* Threaded matmul over quantised rows; see matmul.h. */
#include "kernels/cpu/matmul.h"

#include <immintrin.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cpu/dequant.h"

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

/* acc[r][t] = w[r]·x[t] for 4 rows (stride ldw) and 3 inputs (stride ldx). */
static void kernel_4x3_scalar(const float *w, int64_t ldw, const float *x, int64_t ldx, int64_t n,
                              float acc[4][3])
{
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 3; t++) acc[r][t] = dot_f32_scalar(w + r * ldw, x + t * ldx, n);
}

/* acc[r][t] for 4 rows and nt < 3 inputs (the remainder columns of the tile path). */
static void kernel_4xn_scalar(const float *w, int64_t ldw, const float *x, int64_t ldx, int64_t n,
                              int nt, float acc[4][3])
{
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < nt; t++) acc[r][t] = dot_f32_scalar(w + r * ldw, x + t * ldx, n);
}

/* The plain-type rows (F32, F16, BF16) straight from the weights in dot_f32_scalar's order per
 * output (the scalar tile path's bits): each 8-element block converted, then dotted. */
static float plain_elem(uint32_t type, const uint8_t *row, int64_t i)
{
    switch (type) {
    case GGML_TYPE_F16: return quant_f16_to_f32(((const ggml_half *)row)[i]);
    case GGML_TYPE_BF16: return quant_bf16_to_f32(((const ggml_bf16 *)row)[i]);
    default: return ((const float *)row)[i];
    }
}

static void plain_rows_scalar(uint32_t type, const uint8_t *w, uint64_t row_bytes, int nr,
                              const float *x, int64_t ldx, int nt, int64_t n, float *y, int64_t ldy)
{
    for (int t = 0; t < nt; t++)
        for (int r = 0; r < nr; r++) {
            const uint8_t *row = w + (uint64_t)r * row_bytes;
            const float *xt = x + t * ldx;
            float s[8] = {0};
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                for (int l = 0; l < 8; l++) s[l] += plain_elem(type, row, i + l) * xt[i + l];
            float v = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
            for (; i < n; i++) v += plain_elem(type, row, i) * xt[i];
            y[t * ldy + r] = v;
        }
}

static void axpy_scalar(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void scale_scalar(float *y, float a, int64_t n)
{
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

static float scale_dot_scalar(float *s, float a, const float *k, int64_t n)
{
    scale_scalar(s, a, n);
    return dot_f32_scalar(s, k, n);
}

static float axpy_dot_scalar(float *s, float d, const float *k, const float *q, int64_t n)
{
    axpy_scalar(s, d, k, n);
    return dot_f32_scalar(s, q, n);
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

/* a·b with one 8-lane accumulator over the 8-element blocks in order, the lanes summed by
 * hsum256, then the tail: each output of kernel_4x3_avx2 / kernel_4xn_avx2 in this order, so
 * that a row computed alone has the bits it has inside a tile. */
__attribute__((target("avx2,fma"))) static float dot1_f32_avx2(const float *a, const float *b,
                                                               int64_t n)
{
    __m256 s = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
    float r = hsum256(s);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

/* y[t][r] = w[r]·x[t] for nr rows of a plain type (F32, F16, BF16: exact in F32) straight from
 * the weights, in dot1_f32_avx2's order per output (the tile path's bits without the tile);
 * 4 rows at a time, each its own accumulator. */
#define PLAIN_ROWS_AVX2(name, T, LOAD, TO_F32)                                                \
    __attribute__((target("avx2,fma,f16c"))) static void name(                                \
        const uint8_t *w, uint64_t row_bytes, int nr, const float *x, int64_t ldx, int nt,     \
        int64_t n, float *y, int64_t ldy)                                                      \
    {                                                                                          \
        for (int t = 0; t < nt; t++) {                                                         \
            const float *xt = x + t * ldx;                                                     \
            float *yt = y + t * ldy;                                                           \
            int r = 0;                                                                         \
            for (; r + 4 <= nr; r += 4) {                                                      \
                const T *w0 = (const T *)(w + (uint64_t)r * row_bytes);                        \
                const T *w1 = (const T *)(w + (uint64_t)(r + 1) * row_bytes);                  \
                const T *w2 = (const T *)(w + (uint64_t)(r + 2) * row_bytes);                  \
                const T *w3 = (const T *)(w + (uint64_t)(r + 3) * row_bytes);                  \
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                    \
                int64_t i = 0;                                                                 \
                for (; i + 8 <= n; i += 8) {                                                   \
                    const __m256 v = _mm256_loadu_ps(xt + i);                                  \
                    a0 = _mm256_fmadd_ps(LOAD(w0 + i), v, a0);                                 \
                    a1 = _mm256_fmadd_ps(LOAD(w1 + i), v, a1);                                 \
                    a2 = _mm256_fmadd_ps(LOAD(w2 + i), v, a2);                                 \
                    a3 = _mm256_fmadd_ps(LOAD(w3 + i), v, a3);                                 \
                }                                                                              \
                float s0 = hsum256(a0), s1 = hsum256(a1), s2 = hsum256(a2), s3 = hsum256(a3);  \
                for (; i < n; i++) {                                                           \
                    s0 += TO_F32(w0[i]) * xt[i];                                               \
                    s1 += TO_F32(w1[i]) * xt[i];                                               \
                    s2 += TO_F32(w2[i]) * xt[i];                                               \
                    s3 += TO_F32(w3[i]) * xt[i];                                               \
                }                                                                              \
                yt[r] = s0, yt[r + 1] = s1, yt[r + 2] = s2, yt[r + 3] = s3;                    \
            }                                                                                  \
            for (; r < nr; r++) {                                                              \
                const T *wr = (const T *)(w + (uint64_t)r * row_bytes);                        \
                __m256 a = _mm256_setzero_ps();                                                \
                int64_t i = 0;                                                                 \
                for (; i + 8 <= n; i += 8) a = _mm256_fmadd_ps(LOAD(wr + i), _mm256_loadu_ps(xt + i), a); \
                float sr = hsum256(a);                                                         \
                for (; i < n; i++) sr += TO_F32(wr[i]) * xt[i];                                \
                yt[r] = sr;                                                                    \
            }                                                                                  \
        }                                                                                      \
    }

__attribute__((target("avx2,fma,f16c"))) static inline __m256 load_f32x8(const float *p)
{
    return _mm256_loadu_ps(p);
}
__attribute__((target("avx2,fma,f16c"))) static inline __m256 load_f16x8(const ggml_half *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
__attribute__((target("avx2,fma,f16c"))) static inline __m256 load_bf16x8(const ggml_bf16 *p)
{
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline float f32_id(float v) { return v; }
PLAIN_ROWS_AVX2(plain_rows_f32_avx2, float, load_f32x8, f32_id)
PLAIN_ROWS_AVX2(plain_rows_f16_avx2, ggml_half, load_f16x8, quant_f16_to_f32)
PLAIN_ROWS_AVX2(plain_rows_bf16_avx2, ggml_bf16, load_bf16x8, quant_bf16_to_f32)

__attribute__((target("avx2,fma"))) static void kernel_4x3_avx2(const float *w, int64_t ldw,
                                                                const float *x, int64_t ldx,
                                                                int64_t n, float acc[4][3])
{
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    const float *x0 = x, *x1 = x + ldx, *x2 = x + 2 * ldx;
    __m256 a[4][3];
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 3; t++) a[r][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x0 + i), v1 = _mm256_loadu_ps(x1 + i), v2 = _mm256_loadu_ps(x2 + i);
        __m256 r0 = _mm256_loadu_ps(w0 + i), r1 = _mm256_loadu_ps(w1 + i);
        a[0][0] = _mm256_fmadd_ps(r0, v0, a[0][0]);
        a[0][1] = _mm256_fmadd_ps(r0, v1, a[0][1]);
        a[0][2] = _mm256_fmadd_ps(r0, v2, a[0][2]);
        a[1][0] = _mm256_fmadd_ps(r1, v0, a[1][0]);
        a[1][1] = _mm256_fmadd_ps(r1, v1, a[1][1]);
        a[1][2] = _mm256_fmadd_ps(r1, v2, a[1][2]);
        __m256 r2 = _mm256_loadu_ps(w2 + i), r3 = _mm256_loadu_ps(w3 + i);
        a[2][0] = _mm256_fmadd_ps(r2, v0, a[2][0]);
        a[2][1] = _mm256_fmadd_ps(r2, v1, a[2][1]);
        a[2][2] = _mm256_fmadd_ps(r2, v2, a[2][2]);
        a[3][0] = _mm256_fmadd_ps(r3, v0, a[3][0]);
        a[3][1] = _mm256_fmadd_ps(r3, v1, a[3][1]);
        a[3][2] = _mm256_fmadd_ps(r3, v2, a[3][2]);
    }
    for (int r = 0; r < 4; r++)
        for (int t = 0; t < 3; t++) acc[r][t] = hsum256(a[r][t]);
    for (; i < n; i++)
        for (int r = 0; r < 4; r++)
            for (int t = 0; t < 3; t++) acc[r][t] += w[r * ldw + i] * x[t * ldx + i];
}

__attribute__((target("avx2,fma"))) static void kernel_4xn_avx2(const float *w, int64_t ldw,
                                                                const float *x, int64_t ldx,
                                                                int64_t n, int nt, float acc[4][3])
{
    if (nt == 1) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), v, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + ldw + i), v, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 2 * ldw + i), v, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + 3 * ldw + i), v, a3);
        }
        acc[0][0] = hsum256(a0), acc[1][0] = hsum256(a1), acc[2][0] = hsum256(a2), acc[3][0] = hsum256(a3);
        for (; i < n; i++)
            for (int r = 0; r < 4; r++) acc[r][0] += w[r * ldw + i] * x[i];
        return;
    }
    __m256 a[4][2];
    for (int r = 0; r < 4; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + ldx + i);
        for (int r = 0; r < 4; r++) {
            __m256 wr = _mm256_loadu_ps(w + r * ldw + i);
            a[r][0] = _mm256_fmadd_ps(wr, v0, a[r][0]);
            a[r][1] = _mm256_fmadd_ps(wr, v1, a[r][1]);
        }
    }
    for (int r = 0; r < 4; r++) acc[r][0] = hsum256(a[r][0]), acc[r][1] = hsum256(a[r][1]);
    for (; i < n; i++)
        for (int r = 0; r < 4; r++) acc[r][0] += w[r * ldw + i] * x[i], acc[r][1] += w[r * ldw + i] * x[ldx + i];
}

__attribute__((target("avx2,fma"))) static void axpy_avx2(float *y, float a, const float *x, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

__attribute__((target("avx2,fma"))) static void scale_avx2(float *y, float a, int64_t n)
{
    __m256 va = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(va, _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] *= a;
}

__attribute__((target("avx2,fma"))) static float scale_dot_avx2(float *s, float a, const float *k, int64_t n)
{
    __m256 va = _mm256_set1_ps(a), acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(va, _mm256_loadu_ps(s + i));
        _mm256_storeu_ps(s + i, v);
        acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(k + i), acc);
    }
    float r = hsum256(acc);
    for (; i < n; i++) r += (s[i] *= a) * k[i];
    return r;
}

__attribute__((target("avx2,fma"))) static float axpy_dot_avx2(float *s, float d, const float *k,
                                                              const float *q, int64_t n)
{
    __m256 vd = _mm256_set1_ps(d), acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_fmadd_ps(vd, _mm256_loadu_ps(k + i), _mm256_loadu_ps(s + i));
        _mm256_storeu_ps(s + i, v);
        acc = _mm256_fmadd_ps(v, _mm256_loadu_ps(q + i), acc);
    }
    float r = hsum256(acc);
    for (; i < n; i++) r += (s[i] += d * k[i]) * q[i];
    return r;
}
#endif

typedef float (*dot_f32_fn)(const float *, const float *, int64_t);
typedef void (*kernel_4x3_fn)(const float *, int64_t, const float *, int64_t, int64_t,
                              float[4][3]);
typedef void (*kernel_4xn_fn)(const float *, int64_t, const float *, int64_t, int64_t, int,
                              float[4][3]);
typedef void (*plain_rows_fn)(const uint8_t *, uint64_t, int, const float *, int64_t, int, int64_t,
                              float *, int64_t);

static bool have_avx2(void)
{
#ifdef HAVE_X86
    /* computed once; racing first calls compute the same value (atomic: no data race) */
    static _Atomic int cached = -1;
    int c = atomic_load_explicit(&cached, memory_order_relaxed);
    if (c < 0) {
        __builtin_cpu_init();
        c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
            __builtin_cpu_supports("f16c");
        atomic_store_explicit(&cached, c, memory_order_relaxed);
    }
    return c;
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

void ref_axpy_f32(float *y, float a, const float *x, int64_t n)
{
#ifdef HAVE_X86
    if (have_avx2()) return axpy_avx2(y, a, x, n);
#endif
    axpy_scalar(y, a, x, n);
}

void ref_scale_f32(float *y, float a, int64_t n)
{
#ifdef HAVE_X86
    if (have_avx2()) return scale_avx2(y, a, n);
#endif
    scale_scalar(y, a, n);
}

float ref_scale_dot_f32(float *s, float a, const float *k, int64_t n)
{
#ifdef HAVE_X86
    if (have_avx2()) return scale_dot_avx2(s, a, k, n);
#endif
    return scale_dot_scalar(s, a, k, n);
}

float ref_axpy_dot_f32(float *s, float d, const float *k, const float *q, int64_t n)
{
#ifdef HAVE_X86
    if (have_avx2()) return axpy_dot_avx2(s, d, k, q, n);
#endif
    return axpy_dot_scalar(s, d, k, q, n);
}

/* ---- the threaded matmul ---- */

static bool plain_type(uint32_t type)
{
    return type == GGML_TYPE_F32 || type == GGML_TYPE_F16 || type == GGML_TYPE_BF16;
}

/* The float path's T from which rows go through the tile: quantised rows always do (their
 * block dots sum in another order than the tile's kernels: one order for every T). */
static int tile_min_t(uint32_t type)
{
    if (!plain_type(type)) return 1;
    return type == GGML_TYPE_F32 ? CPU_MATMUL_TILE_MIN_T_F32 : CPU_MATMUL_TILE_MIN_T_HALF;
}

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
    float *scratch; /* [n_threads][tile_rows][n_in] */
    const uint8_t *xq; /* integer path: [T][xq_bytes] quantised inputs (in scratch), else NULL */
    uint64_t xq_bytes;
    int tile_rows;
    int tile_min_t;        /* T from which the tile path runs */
    int64_t rows_per_task;
    int n_threads;
    dot_f32_fn dot;        /* the tile's last < 4 rows: the 4x3 kernel's order per output */
    plain_rows_fn plain;   /* plain types below tile_min_t (NULL: plain_rows_scalar) */
    kernel_4x3_fn k4x3;
    kernel_4xn_fn k4xn;
    ref_dequant_fn dequant;
} mm_job;

static int tile_rows_for(int64_t n_in)
{
    int64_t r = CPU_MATMUL_TILE_FLOATS / n_in / 4 * 4;
    return r < 4 ? 4 : r > 64 ? 64 : (int)r;
}

size_t cpu_matmul_scratch_floats(int64_t n_in_max, int n_threads)
{
    size_t per = CPU_MATMUL_TILE_FLOATS > 4 * n_in_max ? CPU_MATMUL_TILE_FLOATS : 4 * (size_t)n_in_max;
    return (size_t)n_threads * per;
}

/* Small T on plain types: blocks of rows, each block dotted against every input while it is hot,
 * straight from the weights in the tile path's order per output. */
static void mm_rows_plain(const mm_job *j, int64_t r0, int64_t r1)
{
    for (int64_t b = r0; b < r1; b += CPU_MATMUL_DOT_BLOCK) {
        const int nr = (int)(b + CPU_MATMUL_DOT_BLOCK < r1 ? CPU_MATMUL_DOT_BLOCK : r1 - b);
        const uint8_t *w = j->w + (uint64_t)b * j->row_bytes;
        if (j->plain) j->plain(w, j->row_bytes, nr, j->x, j->ldx, j->T, j->n_in, j->y + b, j->ldy);
        else plain_rows_scalar(j->type, w, j->row_bytes, nr, j->x, j->ldx, j->T, j->n_in, j->y + b, j->ldy);
    }
}

/* Rows ahead of the one being dotted whose cache lines the integer path prefetches, all at
 * once (about 1 KiB ahead): streaming from DRAM, Q4_K/Q8_0/Q6_K rows of 1024 went from
 * 5.6/6.1/7.4 to 7.8/7.9/8.0 GB/s per core with it (docs/BENCH.md), the kernels' own per-block
 * prefetch notwithstanding. */
static int q8_prefetch_rows(uint64_t row_bytes) { return row_bytes >= 1024 ? 1 : (int)((1024 + row_bytes - 1) / row_bytes); }

static inline void prefetch_row(const uint8_t *p, uint64_t bytes)
{
    for (uint64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

/* Integer path: blocks of rows, each dotted against the quantised inputs 4 at a time (the row
 * is unpacked once per 4 columns, dot_q8_cols), while the block is hot in L1/L2. */
static void mm_rows_dot_q8(const mm_job *j, int64_t r0, int64_t r1)
{
    quant_dot_q8_cols_fn dot = j->qt->dot_q8_cols;
    const int pd = q8_prefetch_rows(j->row_bytes);
    const uint64_t used = quant_row_bytes(j->type, (uint64_t)j->n_in);
    float out[QUANT_Q8_MAX_COLS];
    for (int64_t b = r0; b < r1; b += CPU_MATMUL_DOT_BLOCK) {
        int64_t e = b + CPU_MATMUL_DOT_BLOCK < r1 ? b + CPU_MATMUL_DOT_BLOCK : r1;
        for (int t = 0; t < j->T; t += QUANT_Q8_MAX_COLS) {
            const int nc = j->T - t < QUANT_Q8_MAX_COLS ? j->T - t : QUANT_Q8_MAX_COLS;
            const uint8_t *xq = j->xq + (uint64_t)t * j->xq_bytes;
            float *y = j->y + t * j->ldy;
            for (int64_t r = b; r < e; r++) {
                if (t == 0 && r + pd < r1) prefetch_row(j->w + (uint64_t)(r + pd) * j->row_bytes, used);
                dot(j->w + (uint64_t)r * j->row_bytes, xq, j->xq_bytes, nc, j->n_in, out);
                for (int c = 0; c < nc; c++) y[c * j->ldy + r] = out[c];
            }
        }
    }
}

/* rows [r0, r0+n) given as FP32 rows `w` (stride n_in) times every input: 4 rows x 3 inputs
 * per micro-kernel call, the last 1-2 inputs by a 4x1 / 4x2 kernel, the last <4 rows by dots. */
static void mm_tile_f32(const mm_job *j, const float *w, int64_t r0, int n)
{
    int64_t n_in = j->n_in;
    for (int t = 0; t < j->T; t += 3) {
        int nt = j->T - t < 3 ? j->T - t : 3;
        const float *x = j->x + t * j->ldx;
        float *y = j->y + t * j->ldy + r0;
        int r = 0;
        for (; r + 4 <= n; r += 4) {
            float acc[4][3];
            if (nt == 3) j->k4x3(w + r * n_in, n_in, x, j->ldx, n_in, acc);
            else j->k4xn(w + r * n_in, n_in, x, j->ldx, n_in, nt, acc);
            for (int u = 0; u < nt; u++)
                for (int a = 0; a < 4; a++) y[u * j->ldy + r + a] = acc[a][u];
        }
        for (; r < n; r++)
            for (int u = 0; u < nt; u++) y[u * j->ldy + r] = j->dot(w + r * n_in, x + u * j->ldx, n_in);
    }
}

static void mm_task(void *arg, int task)
{
    const mm_job *j = arg;
    int64_t r0 = task * j->rows_per_task;
    int64_t r1 = r0 + j->rows_per_task < j->n_out ? r0 + j->rows_per_task : j->n_out;
    if (j->xq) {
        mm_rows_dot_q8(j, r0, r1);
        return;
    }
    if (j->T < j->tile_min_t) {
        mm_rows_plain(j, r0, r1);
        return;
    }
    bool f32 = j->type == GGML_TYPE_F32 && j->row_bytes == (uint64_t)j->n_in * 4;
    int ti = cpu_pool_thread_index();
    DS_ASSERT(ti < j->n_threads);
    float *tile = j->scratch + (size_t)ti * (cpu_matmul_scratch_floats(j->n_in, 1));
    for (int64_t r = r0; r < r1; r += j->tile_rows) {
        int n = r1 - r < j->tile_rows ? (int)(r1 - r) : j->tile_rows;
        const float *w = tile;
        if (f32) w = (const float *)(j->w + (uint64_t)r * j->row_bytes);
        else
            for (int a = 0; a < n; a++)
                j->dequant(j->w + (uint64_t)(r + a) * j->row_bytes, tile + a * j->n_in, j->n_in);
        mm_tile_f32(j, w, r, n);
    }
}

/* Runs the row tasks of one call (or of one chunk of input columns on the integer path). */
static void mm_run(cpu_pool *pool, mm_job *j, bool rows_dot)
{
    /* ~4 tasks per thread for balance; a task is a multiple of the row tile (prefill) or of
     * the dot block (decode, integer path), at least 16 rows. Dotted rows are also capped at
     * CPU_MATMUL_TASK_BYTES of weights per task, so that a thread the OS preempts holds up at
     * most a small task (the output layer: ~750 tasks, not 8). */
    int64_t unit = rows_dot ? CPU_MATMUL_DOT_BLOCK : j->tile_rows;
    int64_t per = (j->n_out + 4 * j->n_threads - 1) / (4 * j->n_threads);
    if (rows_dot && j->n_threads > 1) {
        int64_t cap = (int64_t)(CPU_MATMUL_TASK_BYTES / j->row_bytes) / unit * unit;
        if (cap < unit) cap = unit;
        if (per > cap) per = cap;
    }
    if (per < 16) per = 16;
    if (per > unit) per = (per + unit - 1) / unit * unit;
    j->rows_per_task = per;
    int n_tasks = (int)((j->n_out + per - 1) / per);
    cpu_pool_run(pool, mm_task, j, n_tasks);
}

void cpu_matmul(cpu_pool *pool, const void *w, uint32_t type, uint64_t row_bytes, int64_t n_in,
                int64_t n_out, const float *x, int64_t ldx, int T, float *y, int64_t ldy,
                float *scratch, cpu_matmul_dot dot)
{
    const quant_traits *qt = quant_get(type);
    DS_ASSERT(qt && qt->supported && T >= 1 && n_out >= 1);
    if (dot == CPU_MATMUL_DOT_DEFAULT) dot = CPU_MATMUL_DOT_Q8;
    const bool q8 = dot == CPU_MATMUL_DOT_Q8 && qt->dot_q8_cols;
    DS_ASSERT(q8 || T < tile_min_t(type) || type == GGML_TYPE_F32 || scratch);
    int n_threads = cpu_pool_n_threads(pool);
    mm_job j = {.w = w, .qt = qt, .type = type, .row_bytes = row_bytes, .n_in = n_in,
                .n_out = n_out, .x = x, .ldx = ldx, .T = T, .y = y, .ldy = ldy,
                .scratch = scratch, .tile_rows = tile_rows_for(n_in), .tile_min_t = tile_min_t(type), .n_threads = n_threads,
                .dot = dot_f32_scalar, .k4x3 = kernel_4x3_scalar, .k4xn = kernel_4xn_scalar, .dequant = ref_dequant_get(type)};
#ifdef HAVE_X86
    if (have_avx2()) {
        j.dot = dot1_f32_avx2, j.k4x3 = kernel_4x3_avx2, j.k4xn = kernel_4xn_avx2;
        j.plain = type == GGML_TYPE_F16    ? plain_rows_f16_avx2
                  : type == GGML_TYPE_BF16 ? plain_rows_bf16_avx2
                                           : plain_rows_f32_avx2;
    }
#endif
    if (!q8) {
        mm_run(pool, &j, T < j.tile_min_t);
        return;
    }
    /* Integer path: the inputs are quantised on this thread into the scratch (no tile is
     * needed), as many columns at a time as fit (at least 14: see CPU_MATMUL_Q8_MIN_COLS),
     * then every thread dots its rows with them. */
    DS_ASSERT(scratch);
    j.xq_bytes = quant_act_bytes(type, n_in);
    DS_ASSERT(j.xq_bytes > 0);
    const uint64_t cap = cpu_matmul_scratch_floats(n_in, n_threads) * sizeof(float) / j.xq_bytes;
    DS_ASSERT(cap >= CPU_MATMUL_Q8_MIN_COLS);
    uint8_t *xq = (uint8_t *)scratch;
    j.xq = xq;
    for (int t0 = 0; t0 < T; t0 += (int)cap) {
        const int nt = (uint64_t)(T - t0) < cap ? T - t0 : (int)cap;
        for (int t = 0; t < nt; t++)
            quant_quantize_act(type, x + (t0 + t) * ldx, xq + (uint64_t)t * j.xq_bytes, n_in);
        j.T = nt;
        j.y = y + t0 * ldy;
        mm_run(pool, &j, true);
    }
}
