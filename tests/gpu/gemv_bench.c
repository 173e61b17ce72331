/* GEMV bandwidth on the GPU: for each (type, n_out x n_in) shape, enough copies of the weight
 * to exceed the L2 many times over are rotated, each GEMV timed with CUDA events over many
 * repetitions after a warm-up; prints µs per GEMV, achieved GB/s (weight + activation bytes)
 * and % of 4.6 TB/s. Also the device-to-device copy bandwidth (the practical ceiling) and the
 * cost of a tiny GEMV (launch-bound). Each shape: the warp kernel with rows per warp by shape
 * and with 1, 2 and 4, and the flat kernel (1 block in flight per lane group). The warp
 * kernel's L2 prefetch depth follows DS_GEMV_PREFETCH (default 1). Usage: gemv_bench [reps] [key|all] [shape substring] (key: the short list) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/status.h"
#include "gguf/quant.h"
#include "kernels/cuda/cuda_device.h"
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

static int bench_one(const bench_shape *s, int reps, status *st)
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
    /* the warp kernel (rows per warp by shape, then 1, 2, 4), the flat kernel */
    static const int k_kern[] = {GEMV_KERNEL_WARP, GEMV_KERNEL_WARP, GEMV_KERNEL_WARP,
                                 GEMV_KERNEL_WARP, GEMV_KERNEL_FLAT, GEMV_KERNEL_RING};
    static const int k_rpw[] = {0, 1, 2, 4, 0, 0};
    static const int k_unroll[] = {0, 0, 0, 0, 1, 0};
    static const char *k_vname[] = {"warp", "warp r1", "warp r2", "warp r4", "flat u1", "ring"};
    for (int v = 0; !rc && v < 6; v++) {
        if (k_kern[v] == GEMV_KERNEL_FLAT && !gemv_flat_supported(s->type, n_in)) continue;
        if (k_kern[v] == GEMV_KERNEL_RING && !gemv_ring_supported(s->type, n_in)) continue;
        /* DS_GEMV_BENCH_FAST=1: the default warp variant, flat and ring only */
        if (k_rpw[v] && getenv("DS_GEMV_BENCH_FAST")) continue;
#define BENCH_M(i) {s->type, n_in, n_out, d_w[i], k_rpw[v], k_kern[v], k_unroll[v]}
        for (int i = 0; i < 2 * copies; i++) {
            gemv_matrix m = BENCH_M(i % copies);
            gemv(&m, d_x, d_xq, d_y, GEMV_STORE, stream);
        }
        cuda_event_record(e0, stream);
        for (int i = 0; i < reps; i++) {
            gemv_matrix m = BENCH_M(i % copies);
            gemv(&m, d_x, d_xq, d_y, GEMV_STORE, stream);
        }
        cuda_event_record(e1, stream);
        if ((rc = cuda_sync(stream, "gemv bench", st))) break;
        const double us = cuda_event_elapsed_ms(e0, e1) * 1e3 / reps;
        /* the same GEMVs captured once in a graph (one per weight copy) and replayed */
        cuda_graph_exec g = NULL;
        if ((rc = cuda_graph_capture_begin(stream, st))) break;
        for (int i = 0; i < copies; i++) {
            gemv_matrix m = BENCH_M(i);
            gemv(&m, d_x, d_xq, d_y, GEMV_STORE, stream);
        }
        if ((rc = cuda_graph_capture_end(stream, &g, st))) break;
        const int gr = reps / copies + 2;
        cuda_graph_launch(g, stream);
        cuda_event_record(e0, stream);
        for (int i = 0; i < gr; i++) cuda_graph_launch(g, stream);
        cuda_event_record(e1, stream);
        if ((rc = cuda_sync(stream, "gemv graph bench", st))) break;
        const double gus = cuda_event_elapsed_ms(e0, e1) * 1e3 / ((double)gr * copies);
        cuda_graph_exec_destroy(g);
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
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    const bool key_only = argc > 2 && strcmp(argv[2], "key") == 0;
    const char *only = argc > 3 ? argv[3] : NULL; /* shapes whose name contains this */
    if (!gpu_test_have_gpu("gemv bench")) return 0;
    status st;
    status_clear(&st);
    cuda_device_props p;
    if (cuda_device_props_get(0, &p, &st)) {
        fprintf(stderr, "%s\n", st.msg);
        return 1;
    }
    printf("device: %s, %d SMs, %.1f GiB, L2 %.0f MiB; reps %d\n", p.name, p.sm_count,
           p.mem_total_bytes / 1073741824.0, p.l2_bytes / 1048576.0, reps);
    if (bench_copy(50, &st)) fprintf(stderr, "copy: %s\n", st.msg);
    int fails = 0;
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        if ((!key_only || k_shapes[i].key) && (!only || strstr(k_shapes[i].what, only)) &&
            bench_one(&k_shapes[i], reps, &st)) {
            fprintf(stderr, "%s: %s\n", k_shapes[i].what, st.msg);
            fails++;
        }
    return fails ? 1 : 0;
}
