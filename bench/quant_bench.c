/* quant_bench: GB/s of the quantised-row dot kernels (scalar reference, AVX2 dot, matvec, and
 * the integer path: x quantised to Q8_K / Q8_0 once per pass, then integer dots) per supported
 * type, over a weight matrix that fits in L2 ("hot") and one far larger than L2 ("cold").
 * Bytes counted are the weight bytes read (x stays in cache).
 *
 *   quant_bench [--n-in N] [--hot-mib M] [--cold-mib M] [--seconds S]
 *
 * One thread. Each figure is the fastest single pass over the matrix within S/8 seconds.
 * "q8" quantises x once per pass and dots every row in integers; "q8x4" dots every row with 4
 * quantised inputs at once (dot_q8_cols) and counts the row's bytes 4 times; 0.00 = the type
 * has no integer path (F32/F16/BF16). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/quant.h"

typedef enum { BENCH_REF, BENCH_DOT, BENCH_MATVEC, BENCH_Q8, BENCH_Q8_REF, BENCH_Q8X4 } bench_kind;

static double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs KIND over all rows (one pass) repeatedly until min_s passed, at least 3 passes;
 * returns GB/s of weight bytes for the fastest pass. On a shared machine the fastest pass is
 * the least disturbed one, so passes are kept short (one pass over the matrix each). */
static double bench_run(const quant_traits *t, uint32_t type, bench_kind kind, const uint8_t *w,
                        uint64_t row_bytes, int64_t n_in, int64_t n_rows, const float *x,
                        float *y, void *xq, double min_s) {
    double best = 1e30, start = bench_now();
    for (int pass = 0; pass < 3 || bench_now() - start < min_s; pass++) {
        double t0 = bench_now();
        if (kind == BENCH_MATVEC) {
            quant_matvec(type, w, row_bytes, n_in, x, y, 0, n_rows);
        } else if (kind == BENCH_Q8) {
            quant_quantize_act(type, x, xq, n_in); /* once per matvec, as the engine does */
            quant_matvec_q8(type, w, row_bytes, n_in, xq, y, 0, n_rows);
        } else if (kind == BENCH_Q8X4) { /* 4 inputs per row (batched decode / prefill) */
            const uint64_t xb = quant_act_bytes(type, n_in);
            for (int c = 0; c < 4; c++) quant_quantize_act(type, x, (uint8_t *)xq + c * xb, n_in);
            float out[4];
            for (int64_t r = 0; r < n_rows; r++) {
                t->dot_q8_cols(w + (uint64_t)r * row_bytes, xq, xb, 4, n_in, out);
                y[r] = out[0] + out[3];
            }
        } else if (kind == BENCH_Q8_REF) {
            quant_quantize_act(type, x, xq, n_in);
            for (int64_t r = 0; r < n_rows; r++) y[r] = t->dot_q8_ref(w + (uint64_t)r * row_bytes, xq, n_in);
        } else {
            quant_dot_fn f = kind == BENCH_REF ? t->dot_ref : t->dot;
            for (int64_t r = 0; r < n_rows; r++) y[r] = f(w + (uint64_t)r * row_bytes, x, n_in);
        }
        double dt = bench_now() - t0;
        if (dt < best) best = dt;
    }
    /* q8x4 counts each row once per input: GB/s of weight bytes dotted */
    return (kind == BENCH_Q8X4 ? 4.0 : 1.0) * (double)n_rows * (double)row_bytes / best / 1e9;
}

int main(int argc, char **argv) {
    int64_t n_in = 4096;
    double hot_mib = 1, cold_mib = 256, seconds = 1.5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--n-in")) n_in = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--hot-mib")) hot_mib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--cold-mib")) cold_mib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
        else {
            fprintf(stderr, "usage: quant_bench [--n-in N] [--hot-mib M] [--cold-mib M] [--seconds S]\n");
            return 2;
        }
    }
    if (n_in <= 0 || n_in % 256) {
        fprintf(stderr, "quant_bench: --n-in must be a positive multiple of 256\n");
        return 2;
    }
    printf("quant_bench: n_in %lld, avx2 %s, hot %.1f MiB, cold %.0f MiB, one thread\n",
           (long long)n_in, quant_cpu_has_avx2() ? "yes" : "no", hot_mib, cold_mib);
    printf("%-6s %9s | %9s %9s %9s %9s %9s %9s | %9s %9s %9s   (GB/s of weights)\n", "type", "B/weight",
           "hot ref", "hot dot", "hot mv", "hot q8ref", "hot q8", "hot q8x4", "cold dot", "cold mv", "cold q8");
    const uint32_t types[] = {GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_BF16, GGML_TYPE_Q8_0,
                              GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K};
    float *x = malloc((size_t)n_in * sizeof(float));
    float *src = malloc((size_t)n_in * sizeof(float));
    void *xq = malloc((size_t)n_in * 8); /* >= 4 x quant_act_bytes of any type */
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int64_t i = 0; i < n_in; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((seed >> 40) & 0xFFFF) / 32768.0f - 1.0f;
        src[i] = x[i] * 0.05f;
    }
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const quant_traits *t = quant_get(types[k]);
        uint64_t row_bytes = quant_row_bytes(types[k], (uint64_t)n_in);
        int64_t hot_rows = (int64_t)(hot_mib * 1048576 / (double)row_bytes);
        int64_t cold_rows = (int64_t)(cold_mib * 1048576 / (double)row_bytes);
        if (hot_rows < 1) hot_rows = 1;
        if (cold_rows < 1) cold_rows = 1;
        uint8_t *w = malloc((size_t)(cold_rows * row_bytes));
        float *y = malloc((size_t)cold_rows * sizeof(float));
        if (!w || !y || !x || !src) {
            fprintf(stderr, "quant_bench: out of memory\n");
            return 1;
        }
        t->quantize(src, w, n_in); /* one real row, copied: values do not change the speed */
        for (int64_t r = 1; r < cold_rows; r++) memcpy(w + r * row_bytes, w, row_bytes);
        double s = seconds / 8;
        const int q8 = t->dot_q8 != NULL;
        double hr = bench_run(t, types[k], BENCH_REF, w, row_bytes, n_in, hot_rows, x, y, xq, s);
        double hd = bench_run(t, types[k], BENCH_DOT, w, row_bytes, n_in, hot_rows, x, y, xq, s);
        double hm = bench_run(t, types[k], BENCH_MATVEC, w, row_bytes, n_in, hot_rows, x, y, xq, s);
        double hqr = q8 ? bench_run(t, types[k], BENCH_Q8_REF, w, row_bytes, n_in, hot_rows, x, y, xq, s) : 0;
        double hq = q8 ? bench_run(t, types[k], BENCH_Q8, w, row_bytes, n_in, hot_rows, x, y, xq, s) : 0;
        double hq4 = q8 ? bench_run(t, types[k], BENCH_Q8X4, w, row_bytes, n_in, hot_rows, x, y, xq, s) : 0;
        double cd = bench_run(t, types[k], BENCH_DOT, w, row_bytes, n_in, cold_rows, x, y, xq, s);
        double cm = bench_run(t, types[k], BENCH_MATVEC, w, row_bytes, n_in, cold_rows, x, y, xq, s);
        double cq = q8 ? bench_run(t, types[k], BENCH_Q8, w, row_bytes, n_in, cold_rows, x, y, xq, s) : 0;
        printf("%-6s %9.4f | %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f | %9.2f %9.2f %9.2f\n", t->name,
               (double)t->type_size / t->block_size, hr, hd, hm, hqr, hq, hq4, cd, cm, cq);
        free(w);
        free(y);
    }
    free(x);
    free(src);
    free(xq);
    return 0;
}
