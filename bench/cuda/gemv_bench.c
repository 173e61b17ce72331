/* GEMV bandwidth on the GPU: for each (type, n_out x n_in) shape, enough copies of the weight
 * to exceed the L2 many times over are rotated, each GEMV timed with CUDA events over many
 * repetitions after a warm-up; prints µs per GEMV, achieved GB/s (weight + activation bytes)
 * and % of 4.6 TB/s. Also the device-to-device copy bandwidth (the practical ceiling) and the
 * cost of a tiny GEMV (launch-bound). Each shape: the tuning table's plan (gemv_matrix_plan),
 * the warp kernel with 1, 2 and 4 rows per warp, and the flat kernel.
 * Usage: gemv_bench [--fast] [--prefetch N] [--cols] [reps] [key|all] [shape substring]
 *   key: the short list; --fast: the planned and flat variants only; --prefetch N: the warp
 *   kernel's L2 prefetch depth (row groups ahead, 0..2) instead of the table's (a sweep);
 *   --cols: short passes of B = 1, 2, 4, ... rows instead: B planned GEMVs, gemv_cols with 1, 2
 *   and 4 rows a warp (to 4 rows), the batched GEMM (gemm_rows) and for the K-quants gemv_mma
 *   (to 64 rows, checked against gemv_cols / gemm_rows), each in µs per pass; --cols-wpr W:
 *   gemv_cols' warps per row group forced to W (1, 2, 4) instead of the plan's (a sweep);
 *   --gemm: passes of B = 8, 16, ..., 128 rows through gemm_rows alone (µs and GB/s of the
 *   weights against their bytes). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "tests/gpu/gpu_parity.h"

#define PEAK_GBS 4600.0

typedef struct bench_shape {
    const char *what;
    uint32_t type;
    int64_t n_out, n_in;
    int key; /* in the short list (gemv_bench REPS key) */
} bench_shape;

static const bench_shape k_shapes[] = {
    {"27B ffn_gate/up", GGML_TYPE_Q4_K, 17408, 5120, 1},
    {"27B ffn_down", GGML_TYPE_Q4_K, 5120, 17408, 1},
    {"27B ffn_down (q6)", GGML_TYPE_Q6_K, 5120, 17408, 1},
    {"27B attn_qkv", GGML_TYPE_Q5_K, 10240, 5120, 1},
    {"27B attn_qkv (q6)", GGML_TYPE_Q6_K, 10240, 5120, 1},
    {"27B lm_head", GGML_TYPE_Q6_K, 248320, 5120, 1},
    {"27B ssm_alpha (q8)", GGML_TYPE_Q8_0, 48, 5120, 0},
    {"q8_0 big", GGML_TYPE_Q8_0, 17408, 5120, 0},
    {"bf16 big", GGML_TYPE_BF16, 17408, 5120, 0},
    {"f16 big", GGML_TYPE_F16, 17408, 5120, 0},
    {"f32 big", GGML_TYPE_F32, 8192, 5120, 0},
    {"4B ffn_gate/up", GGML_TYPE_Q4_K, 9216, 2560, 1},
    {"4B ffn_down", GGML_TYPE_Q4_K, 2560, 9216, 1},
    {"4B lm_head", GGML_TYPE_Q6_K, 248320, 2560, 1},
    {"0.8B ffn_gate/up", GGML_TYPE_Q4_K, 3584, 1024, 1},
    {"0.8B ffn_down", GGML_TYPE_Q4_K, 1024, 3584, 1},
    {"0.8B lm_head", GGML_TYPE_Q6_K, 248320, 1024, 1},
    {"tiny 1024x1024", GGML_TYPE_Q4_K, 1024, 1024, 1},
};

static int bench_copy(int reps, status *st)
{
    const size_t bytes = (size_t)2 << 30;
    void *a = NULL, *b = NULL;
    cuda_event e0, e1;
    if (cuda_alloc(&a, bytes, "copy src", st) || cuda_alloc(&b, bytes, "copy dst", st) ||
        cuda_event_create(&e0, st) || cuda_event_create(&e1, st))
        return st->code;
    cuda_memset(a, 1, bytes, st);
    cuda_copy_async(b, a, bytes, NULL);
    cuda_event_record(e0, NULL);
    for (int i = 0; i < reps; i++) cuda_copy_async(b, a, bytes, NULL);
    cuda_event_record(e1, NULL);
    if (cuda_sync(NULL, "copy", st)) return st->code;
    const float ms = cuda_event_elapsed_ms(e0, e1);
    printf("d2d copy %zu MiB: %.1f us, %.0f GB/s (read+write)\n", bytes >> 20, ms * 1e3 / reps,
           2.0 * bytes / (ms * 1e-3 / reps) / 1e9);
    cuda_free(a);
    cuda_free(b);
    cuda_event_destroy(e0);
    cuda_event_destroy(e1);
    return 0;
}

typedef struct bench_opts {
    bool fast;    /* the planned and flat variants only */
    int prefetch; /* -1: the table's */
    bool cols;    /* short passes (bench_cols) */
    bool gemm;    /* bench_cols' gemm_rows alone, over B = 8..128 */
    int cols_wpr; /* bench_cols: gemv_cols' warps a row group forced (1, 2, 4; 0: the plan's) */
} bench_opts;

/* µs per pass: pass(ctx, i, l) for each weight copy i captured once in a graph, the graph
 * launched once to warm up, then timed over reps / copies + 2 launches. */
typedef void (*bench_pass_fn)(void *ctx, int copy, const cuda_launch *l);
static int graph_us(bench_pass_fn pass, void *ctx, int copies, int reps, cuda_stream stream,
                    cuda_event e0, cuda_event e1, double *us, status *st)
{
    const cuda_launch l = {stream, false};
    cuda_graph_exec g = NULL;
    int rc = cuda_graph_capture_begin(stream, st);
    for (int i = 0; !rc && i < copies; i++) pass(ctx, i, &l);
    if (!rc) rc = cuda_graph_capture_end(stream, &g, NULL, st);
    if (rc) return rc;
    const int gr = reps / copies + 2;
    cuda_graph_launch(g, stream);
    cuda_event_record(e0, stream);
    for (int i = 0; i < gr; i++) cuda_graph_launch(g, stream);
    cuda_event_record(e1, stream);
    rc = cuda_sync(stream, "bench graph", st);
    if (!rc) *us = cuda_event_elapsed_ms(e0, e1) * 1e3 / ((double)gr * copies);
    cuda_graph_exec_destroy(g);
    return rc;
}

/* --cols: one shape's short passes. Variant v of a pass of B rows: 0 B planned GEMVs, 1-3
 * gemv_cols with 1, 2, 4 rows a warp, 4 gemm_rows. Timed as graphs of one pass per weight copy,
 * replayed. */
typedef struct cols_ctx {
    int v, B; /* the variant and rows of the pass being timed */
    gemv_matrix m;
    void **d_w;
    float *d_x, *d_y, *d_work;
    void *d_xq, *d_xqk; /* the rows' Q8 forms, and their Q8_K forms (gemv_mma's) */
    uint16_t *d_xh;
    int64_t xs;
} cols_ctx;

static void cols_pass(void *ctx, int copy, const cuda_launch *l)
{
    cols_ctx *c = ctx;
    const int v = c->v, B = c->B;
    c->m.d_w = c->d_w[copy];
    const int64_t n_in = c->m.n_in, n_out = c->m.n_out;
    if (v == 0)
        for (int i = 0; i < B; i++)
            gemv(&c->m, c->d_x + i * n_in, (uint8_t *)c->d_xq + i * c->xs, c->d_y + i * n_out,
                 GEMV_STORE, l);
    else if (v <= 3)
        gemv_cols(&c->m, c->d_x, n_in, c->d_xq, c->d_y, n_out, GEMV_STORE, B, l);
    else if (v == 5)
        gemv_mma(&c->m, c->d_xqk, c->d_y, n_out, GEMV_STORE, B, c->d_work, l);
    else
        gemm_rows(&c->m, c->d_x, n_in, c->d_xh, c->d_y, n_out, GEMV_STORE, B, c->d_work, l);
}

static int bench_cols(const bench_shape *s, int reps, const bench_opts *o,
                      const cuda_device_props *p, status *st)
{
    const int64_t n_in = s->n_in, n_out = s->n_out;
    const uint64_t raw = quant_row_bytes(s->type, (uint64_t)(n_in * n_out));
    const uint64_t packed = gemv_packed_bytes(s->type, n_in, n_out);
    int copies = (int)((1ull << 30) / packed) + 1;
    if (copies < 2) copies = 2;
    if (copies > 64) copies = 64;
    cols_ctx c = {.xs = (int64_t)gemv_xq_bytes(n_in)};
    c.d_w = calloc(copies, sizeof(void *));
    void *host = malloc(raw), *d_raw = NULL;
    DS_ASSERT(host && c.d_w);
    gpu_rng rng;
    gpu_rng_seed(&rng, 42);
    gpu_random_tensor(s->type, n_in * n_out, 0.05f, &rng, host);
    cuda_event e0 = NULL, e1 = NULL;
    cuda_stream stream = NULL;
    const int BM = o->gemm ? 128 : GEMV_MMA_ROWS;
    int rc = cuda_stream_create(&stream, st);
    if (!rc) rc = cuda_alloc(&d_raw, raw, "raw", st);
    for (int i = 0; !rc && i < copies; i++) rc = cuda_alloc(&c.d_w[i], packed, "w", st);
    if (!rc) rc = cuda_upload(d_raw, host, raw, st);
    for (int i = 0; !rc && i < copies; i++) gemv_pack(s->type, d_raw, c.d_w[i], n_in, n_out, NULL);
    if (!rc) rc = cuda_alloc((void **)&c.d_x, BM * n_in * sizeof(float), "x", st);
    if (!rc) rc = cuda_alloc(&c.d_xq, BM * c.xs, "xq", st);
    if (!rc) rc = cuda_alloc(&c.d_xqk, BM * c.xs, "xqk", st);
    if (!rc) rc = cuda_alloc((void **)&c.d_xh, BM * n_in * 2, "xh", st);
    if (!rc) rc = cuda_alloc((void **)&c.d_y, BM * n_out * sizeof(float), "y", st);
    c.m = (gemv_matrix){.type = s->type, .n_in = n_in, .n_out = n_out, .d_w = c.d_w[0]};
    if (!rc) rc = gemv_matrix_plan(&c.m, p, st);
    int64_t wf = rc ? 0 : gemm_work_floats(&c.m, BM);
    if (!rc && gemv_mma_supported(s->type) && gemv_mma_work_floats(&c.m, GEMV_MMA_ROWS) > wf)
        wf = gemv_mma_work_floats(&c.m, GEMV_MMA_ROWS);
    if (!rc && wf) rc = cuda_alloc((void **)&c.d_work, wf * sizeof(float), "work", st);
    if (!rc) rc = cuda_event_create(&e0, st);
    if (!rc) rc = cuda_event_create(&e1, st);
    if (!rc) {
        float *x = malloc(BM * n_in * sizeof(float));
        for (int64_t i = 0; i < BM * n_in; i++) x[i] = gpu_rng_normal(&rng);
        rc = cuda_upload(c.d_x, x, BM * n_in * sizeof(float), st);
        free(x);
        gemv_quantize_rows(c.d_x, n_in, c.d_xq, n_in, BM, NULL);
        if (n_in % 256 == 0) gemv_quantize_rows_k(c.d_x, n_in, c.d_xqk, n_in, BM, NULL);
        gemm_x_half(c.d_x, n_in, n_in, c.d_xh, BM, NULL);
    }
    if (!rc) rc = cuda_sync(NULL, "setup", st);
    static const char *k_vname[] = {"B gemv", "cols r1", "cols r2", "cols r4", "gemm_rows", "mma"};
    const bool mma = gemv_mma_supported(s->type);
    const int BX = o->gemm ? BM : mma ? GEMV_MMA_ROWS : 8;
    for (int B = o->gemm ? 8 : 1; !rc && B <= BX; B *= 2) {
        printf("%-20s %-5s %6lldx%-6lld B=%d:", s->what, quant_get(s->type)->name,
               (long long)n_out, (long long)n_in, B);
        for (int v = o->gemm ? 4 : 0; !rc && v < 6; v++) {
            if (v == 5 && (o->gemm || !mma)) break;
            if (B > GEMV_MAX_COLS && v < 4) continue;
            if (v >= 1 && v <= 3) {
                c.m.cols_rows = v == 1 ? 1 : v == 2 ? 2 : 4;
                if ((rc = gemv_matrix_plan(&c.m, p, st))) break;
                for (int k = 0; o->cols_wpr && k < 3; k++) { /* one CTA a row group */
                    gemv_shape *sh = &c.m.plan.cols[k];
                    const int64_t cta_rows = (int64_t)sh->rows * (4 / o->cols_wpr);
                    sh->wpr = (uint8_t)o->cols_wpr;
                    sh->grid = (uint32_t)((n_out + cta_rows - 1) / cta_rows);
                }
            }
            double us = 0;
            c.v = v, c.B = B;
            if ((rc = graph_us(cols_pass, &c, copies, reps, stream, e0, e1, &us, st))) break;
            printf("  %s %7.1f us (%4.0f GB/s)", k_vname[v], us, raw / (us * 1e-6) / 1e9);
        }
        if (!rc && !o->gemm && mma) { /* mma against gemv_cols / gemm_rows */
            const cuda_launch l = {stream, false};
            float *ya = malloc((size_t)B * n_out * 4), *yb = malloc((size_t)B * n_out * 4);
            DS_ASSERT(ya && yb);
            c.m.d_w = c.d_w[0];
            c.m.cols_rows = 0;
            rc = gemv_matrix_plan(&c.m, p, st);
            if (!rc) {
                if (B <= GEMV_MAX_COLS)
                    gemv_cols(&c.m, c.d_x, n_in, c.d_xq, c.d_y, n_out, GEMV_STORE, B, &l);
                else
                    gemm_rows(&c.m, c.d_x, n_in, c.d_xh, c.d_y, n_out, GEMV_STORE, B, c.d_work, &l);
                rc = cuda_sync(stream, "check", st);
                if (!rc) rc = cuda_download(ya, c.d_y, (size_t)B * n_out * 4, st);
            }
            if (!rc) {
                gemv_mma(&c.m, c.d_xqk, c.d_y, n_out, GEMV_STORE, B, c.d_work, &l);
                rc = cuda_sync(stream, "check", st);
                if (!rc) rc = cuda_download(yb, c.d_y, (size_t)B * n_out * 4, st);
                double mx = 0, d = 0;
                for (int64_t i = 0; !rc && i < (int64_t)B * n_out; i++) {
                    mx = fmax(mx, fabs(ya[i]));
                    d = fmax(d, fabs(ya[i] - yb[i]));
                }
                if (!rc) printf("  mma vs %s: max diff %.3g of max %.3g",
                                B <= GEMV_MAX_COLS ? "cols" : "gemm", d, mx);
            }
            free(ya), free(yb);
        }
        printf("\n");
    }
    for (int i = 0; i < copies; i++) cuda_free(c.d_w[i]);
    cuda_free(d_raw), cuda_free(c.d_x), cuda_free(c.d_xq), cuda_free(c.d_xqk), cuda_free(c.d_xh), cuda_free(c.d_y);
    cuda_free(c.d_work);
    cuda_event_destroy(e0);
    cuda_event_destroy(e1);
    cuda_stream_destroy(stream);
    free(c.d_w);
    free(host);
    return rc;
}

/* bench_one's graph: one planned GEMV of weight copy `copy` */
typedef struct one_ctx {
    gemv_matrix *m;
    void **d_w;
    const float *d_x;
    const void *d_xq;
    float *d_y;
} one_ctx;

static void one_pass(void *ctx, int copy, const cuda_launch *l)
{
    one_ctx *c = ctx;
    c->m->d_w = c->d_w[copy];
    gemv(c->m, c->d_x, c->d_xq, c->d_y, GEMV_STORE, l);
}

static int bench_one(const bench_shape *s, int reps, const bench_opts *o,
                     const cuda_device_props *p, status *st)
{
    const int64_t n_in = s->n_in, n_out = s->n_out;
    const uint64_t raw = quant_row_bytes(s->type, (uint64_t)(n_in * n_out));
    const uint64_t packed = gemv_packed_bytes(s->type, n_in, n_out);
    int copies = (int)((1ull << 30) / packed) + 1; /* >= 1 GiB of weights rotated */
    if (copies < 2) copies = 2;
    if (copies > 64) copies = 64;
    void *host = malloc(raw), *d_raw = NULL, **d_w = calloc(copies, sizeof(void *));
    DS_ASSERT(host && d_w);
    gpu_rng rng;
    gpu_rng_seed(&rng, 42);
    gpu_random_tensor(s->type, n_in * n_out, 0.05f, &rng, host);
    float *d_x = NULL, *d_y = NULL;
    void *d_xq = NULL;
    cuda_event e0 = NULL, e1 = NULL;
    cuda_stream stream = NULL;
    int rc = cuda_stream_create(&stream, st);
    if (!rc) rc = cuda_alloc(&d_raw, raw, "raw", st);
    for (int c = 0; !rc && c < copies; c++) rc = cuda_alloc(&d_w[c], packed, "w", st);
    if (!rc) rc = cuda_upload(d_raw, host, raw, st);
    for (int c = 0; !rc && c < copies; c++) gemv_pack(s->type, d_raw, d_w[c], n_in, n_out, NULL);
    if (!rc) rc = cuda_alloc((void **)&d_x, n_in * sizeof(float), "x", st);
    if (!rc) rc = cuda_alloc(&d_xq, gemv_xq_bytes(n_in), "xq", st);
    if (!rc) rc = cuda_alloc((void **)&d_y, n_out * sizeof(float), "y", st);
    if (!rc) rc = cuda_event_create(&e0, st);
    if (!rc) rc = cuda_event_create(&e1, st);
    if (!rc) {
        float *x = malloc(n_in * sizeof(float));
        for (int64_t i = 0; i < n_in; i++) x[i] = gpu_rng_normal(&rng);
        rc = cuda_upload(d_x, x, n_in * sizeof(float), st);
        free(x);
        gemv_quantize_x(d_x, d_xq, n_in, NULL);
    }
    if (!rc) rc = cuda_sync(NULL, "setup", st);
    const bool q = s->type != GGML_TYPE_F32 && s->type != GGML_TYPE_F16 &&
                   s->type != GGML_TYPE_BF16;
    const double bytes = (double)raw + (q ? (double)gemv_xq_bytes(n_in) : 4.0 * n_in) +
                         4.0 * n_out;
    /* the plan, the warp kernel with 1, 2, 4 rows per warp, the flat kernel */
    static const int k_kern[] = {GEMV_KERNEL_AUTO, GEMV_KERNEL_WARP, GEMV_KERNEL_WARP,
                                 GEMV_KERNEL_WARP, GEMV_KERNEL_FLAT};
    static const int k_rpw[] = {0, 1, 2, 4, 0};
    static const char *k_vname[] = {"planned", "warp r1", "warp r2", "warp r4", "flat"};
    const cuda_launch l = {stream, false};
    for (int v = 0; !rc && v < 5; v++) {
        if (k_kern[v] == GEMV_KERNEL_FLAT && !gemv_flat_supported(s->type, n_in)) continue;
        if (k_rpw[v] && o->fast) continue;
        gemv_matrix m0 = {.type = s->type, .n_in = n_in, .n_out = n_out, .d_w = d_w[0],
                          .kernel = k_kern[v], .rows_per_warp = k_rpw[v]};
        if ((rc = gemv_matrix_plan(&m0, p, st))) break;
        for (int e = 0; o->prefetch >= 0 && e < GEMV_N_SHAPES; e++)
            if (m0.plan.kernel == GEMV_KERNEL_WARP) m0.plan.shape[e].prefetch = (uint8_t)o->prefetch;
#define BENCH_M(i) (m0.d_w = d_w[i], &m0)
        for (int i = 0; i < 2 * copies; i++) gemv(BENCH_M(i % copies), d_x, d_xq, d_y, GEMV_STORE, &l);
        cuda_event_record(e0, stream);
        for (int i = 0; i < reps; i++) gemv(BENCH_M(i % copies), d_x, d_xq, d_y, GEMV_STORE, &l);
        cuda_event_record(e1, stream);
        if ((rc = cuda_sync(stream, "gemv bench", st))) break;
        const double us = cuda_event_elapsed_ms(e0, e1) * 1e3 / reps;
        /* the same GEMVs captured once in a graph (one per weight copy) and replayed */
        one_ctx oc = {&m0, d_w, d_x, d_xq, d_y};
        double gus = 0;
        if ((rc = graph_us(one_pass, &oc, copies, reps, stream, e0, e1, &gus, st))) break;
        const double gbs = bytes / (gus * 1e-6) / 1e9;
        printf("%-20s %-5s %6lldx%-6lld %-7s %8.1f MB  launch %8.2f us  graph %8.2f us "
               "%6.0f GB/s %5.1f%% of 4.6 TB/s\n",
               s->what, quant_get(s->type)->name, (long long)n_out, (long long)n_in, k_vname[v],
               bytes / 1e6, us, gus, gbs, 100.0 * gbs / PEAK_GBS);
    }
    for (int c = 0; c < copies; c++) cuda_free(d_w[c]);
    cuda_free(d_raw);
    cuda_free(d_x);
    cuda_free(d_xq);
    cuda_free(d_y);
    cuda_event_destroy(e0);
    cuda_event_destroy(e1);
    cuda_stream_destroy(stream);
    free(d_w);
    free(host);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts o = {false, -1, false, false, 0};
    int a = 1;
    for (; a < argc && strncmp(argv[a], "--", 2) == 0; a++) {
        if (strcmp(argv[a], "--fast") == 0) {
            o.fast = true;
        } else if (strcmp(argv[a], "--cols") == 0) {
            o.cols = true;
        } else if (strcmp(argv[a], "--gemm") == 0) {
            o.cols = o.gemm = true;
        } else if (strcmp(argv[a], "--cols-wpr") == 0 && a + 1 < argc) {
            o.cols_wpr = atoi(argv[++a]);
            if (o.cols_wpr != 1 && o.cols_wpr != 2) o.cols_wpr = 4;
        } else if (strcmp(argv[a], "--prefetch") == 0 && a + 1 < argc) {
            o.prefetch = atoi(argv[++a]);
            if (o.prefetch < 0 || o.prefetch > 2) o.prefetch = 2;
        } else {
            fprintf(stderr, "usage: gemv_bench [--fast] [--prefetch 0..2] [--cols [--cols-wpr 1|2|4]] [--gemm] [reps] [key|all] "
                            "[shape substring]\n");
            return 2;
        }
    }
    const int reps = argc > a ? atoi(argv[a]) : 200;
    const bool key_only = argc > a + 1 && strcmp(argv[a + 1], "key") == 0;
    const char *only = argc > a + 2 ? argv[a + 2] : NULL; /* shapes whose name contains this */
    if (!gpu_test_have_gpu("gemv bench")) return 0;
    status st;
    status_clear(&st);
    cuda_device_props p;
    if (cuda_device_props_get(0, &p, &st) || gemv_init(&p, &st) || gemm_init(&st)) {
        fprintf(stderr, "%s\n", st.msg);
        return 1;
    }
    printf("device: %s, %d SMs, %.1f GiB, L2 %.0f MiB; reps %d\n", p.name, p.sm_count,
           p.mem_total_bytes / 1073741824.0, p.l2_bytes / 1048576.0, reps);
    if (!o.cols && bench_copy(50, &st)) fprintf(stderr, "copy: %s\n", st.msg);
    int fails = 0;
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if ((!key_only || k_shapes[i].key) && (!only || strstr(k_shapes[i].what, only)) &&
            (o.cols ? bench_cols(&k_shapes[i], reps, &o, &p, &st)
                    : bench_one(&k_shapes[i], reps, &o, &p, &st))) {
            fprintf(stderr, "%s: %s\n", k_shapes[i].what, st.msg);
            fails++;
        }
    return fails ? 1 : 0;
}
