/* CPU forward benchmark: prefill tok/s of a P-token prompt, single-sequence decode tok/s, and
 * batched decode (B sequences, one token each per step) tok/s, on any qwen35 GGUF, through the
 * CPU forward as the worker runs it (model/forward_cpu.h: fwd_step, each step's last rows
 * sampled greedily).
 *
 *   cpu_forward_bench --model F [--prompt 512] [--decode 32] [--batch 4] [--threads 0] [--reps 2]
 *                     [--dot default|q8|exact|both]
 *
 * Token ids are pseudo-random (the values do not change the speed). Times are wall-clock
 * (CLOCK_MONOTONIC); the best of --reps runs is reported, with the weight bytes streamed per
 * decode step turned into GB/s. One line per measurement, stable for docs/BENCH.md.
 * --dot picks how quantised weights are dotted (fwd_opts.exact_dot: exact, else the Q8 integer
 * path); "both" interleaves the integer and exact modes rep by rep (alternating which goes first,
 * a forward each) so that a shared, noisy machine disturbs both alike, and reports each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf/quant.h"
#include "kernels/cpu/cpu_pool.h"
#include "kernels/cpu/matmul.h"
#include "model/forward_cpu.h"
#include "model/fwd.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU seconds of the whole process (all threads): with the wall time it shows how many cores
 * the run really had on a shared machine. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t mat_bytes(const qwen35_mat *m) { return m->data ? m->row_bytes * (uint64_t)m->n_out : 0; }

/* Weight bytes read by one decode step (every matrix once; the embedding row is negligible). */
static uint64_t step_bytes(const qwen35_model *m)
{
    uint64_t b = mat_bytes(&m->output);
    for (int il = 0; il < m->cfg.n_layer; il++) {
        const qwen35_layer *l = &m->layers[il];
        const qwen35_mat *ms[] = {&l->qkv, &l->gate, &l->beta, &l->alpha, &l->ssm_out, &l->q, &l->k,
                                  &l->v, &l->o, &l->ffn_gate, &l->ffn_up, &l->ffn_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) b += mat_bytes(ms[i]);
    }
    return b;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *dot = "default";
    int P = 512, D = 32, B = 4, threads = 0, reps = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt")) P = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode")) D = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dot")) dot = argv[i + 1];
        else {
            fprintf(stderr, "unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    /* the modes to run, in the order of the first rep */
    bool modes[2]; /* exact_dot */
    const char *mode_names[2];
    int n_modes = 1;
    if (!strcmp(dot, "default")) modes[0] = false, mode_names[0] = "default";
    else if (!strcmp(dot, "q8")) modes[0] = false, mode_names[0] = "q8";
    else if (!strcmp(dot, "exact")) modes[0] = true, mode_names[0] = "exact";
    else if (!strcmp(dot, "both")) {
        modes[0] = false, mode_names[0] = "q8";
        modes[1] = true, mode_names[1] = "exact";
        n_modes = 2;
    } else model = NULL;
    if (!model || P < 1 || D < 1 || B < 1 || B > 64 || reps < 1) {
        fprintf(stderr, "usage: cpu_forward_bench --model F [--prompt 512] [--decode 32] [--batch 4 (<= 64)] [--threads 0] [--reps 2] [--dot default|q8|exact|both]\n");
        return 2;
    }
    status st;
    qwen35_model *m;
    cpu_pool *pool = NULL; /* the output layer's alone */
    fwd *f[2] = {NULL, NULL};
    if (qwen35_model_load(&m, model, &st) || cpu_pool_create(&pool, threads, &st)) {
        fprintf(stderr, "cpu_forward_bench: %s\n", st.msg);
        return 1;
    }
    const int n_threads = cpu_pool_n_threads(pool);
    for (int k = 0; k < n_modes; k++) {
        const fwd_opts fo = {.n_slots = B, .n_ctx = P + D + 1, .max_rows = P > B * 8 ? P : B * 8,
                             .n_threads = n_threads, .exact_dot = modes[k]};
        if (fwd_backend_cpu.create(m, &fo, &f[k], &st)) {
            fprintf(stderr, "cpu_forward_bench: %s\n", st.msg);
            return 1;
        }
    }
    int V = m->cfg.V;
    int32_t *ids = malloc(sizeof(int32_t) * (P + D) * B);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < (P + D) * B; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)V);
    }
    fwd_row *rows = malloc(sizeof *rows * (size_t)(P > B * 8 ? P : B * 8));
    const sampling_params greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
    double best_pre[2] = {1e30, 1e30}, best_dec[2] = {1e30, 1e30}, best_bat[2] = {1e30, 1e30};
    double cpu_pre[2] = {0}, cpu_dec[2] = {0}, cpu_bat[2] = {0};
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < n_modes; k++) {
            const int mi = (k + r) % n_modes; /* alternate which mode goes first */
            fwd *fm = f[mi];
            for (int b = 0; b < B; b++)
                if (fwd_seq_start(fm, b, &greedy, &st)) goto fail;
            for (int t = 0; t < P; t++)
                rows[t] = (fwd_row){.token = ids[t], .slot = 0, .pos = t, .prompt = true,
                                    .sample = t == P - 1};
            double c0 = cpu_now(), t0 = now();
            if (fwd_step(fm, rows, P, &st)) goto fail;
            double c1 = cpu_now(), t1 = now();
            for (int d = 0; d < D; d++) {
                rows[0] = (fwd_row){.token = ids[P + d], .slot = 0, .pos = P + d, .sample = true};
                if (fwd_step(fm, rows, 1, &st)) goto fail;
            }
            double c2 = cpu_now(), t2 = now();
            if (B > 1) {
                for (int b = 0; b < B; b++) /* short prompts for every sequence, one step */
                    if (fwd_seq_start(fm, b, &greedy, &st)) goto fail;
                for (int b = 0; b < B; b++)
                    for (int t = 0; t < 8; t++)
                        rows[b * 8 + t] = (fwd_row){.token = ids[(P + D) * b + t], .slot = b, .pos = t,
                                                    .prompt = true, .sample = t == 7};
                if (fwd_step(fm, rows, B * 8, &st)) goto fail;
                double c3 = cpu_now(), t3 = now();
                for (int d = 0; d < D; d++) {
                    for (int b = 0; b < B; b++)
                        rows[b] = (fwd_row){.token = ids[(P + D) * b + 8 + d], .slot = b, .pos = 8 + d,
                                            .sample = true};
                    if (fwd_step(fm, rows, B, &st)) goto fail;
                }
                double c4 = cpu_now(), t4 = now();
                if (t4 - t3 < best_bat[mi]) best_bat[mi] = t4 - t3, cpu_bat[mi] = c4 - c3;
            }
            if (t1 - t0 < best_pre[mi]) best_pre[mi] = t1 - t0, cpu_pre[mi] = c1 - c0;
            if (t2 - t1 < best_dec[mi]) best_dec[mi] = t2 - t1, cpu_dec[mi] = c2 - c1;
        }
    }
    double gb = step_bytes(m) / 1e9;
    printf("model %s: H %d L %d V %d, weights read per decode step %.3f GB, threads %d\n", model,
           m->cfg.H, m->cfg.n_layer, V, gb, n_threads);
    /* The output layer (lm_head) alone, the largest single matmul of a decode step: T = 1 and
     * T = B inputs through cpu_matmul with the forward's thread count, best of 5 per mode. */
    const qwen35_mat *out = &m->output;
    float *scratch = malloc(sizeof(float) * cpu_matmul_scratch_floats(out->n_in, n_threads));
    float *xin = malloc(sizeof(float) * out->n_in * B), *yout = malloc(sizeof(float) * out->n_out * B);
    for (long i = 0; i < out->n_in * B; i++) xin[i] = (float)((i * 7919) % 2001 - 1000) * 1e-3f;
    double lm_best[2][2] = {{1e30, 1e30}, {1e30, 1e30}}, lm_cpu[2][2] = {{0}};
    for (int r = 0; r < 5; r++)
        for (int k = 0; k < n_modes; k++) {
            const int mi = (k + r) % n_modes;
            for (int bi = 0; bi < (B > 1 ? 2 : 1); bi++) {
                const int T = bi ? B : 1;
                double c0 = cpu_now(), t0 = now();
                cpu_matmul(pool, out->data, out->type, out->row_bytes, out->n_in, out->n_out, xin, out->n_in, T,
                           yout, out->n_out, scratch, modes[mi] ? CPU_MATMUL_DOT_EXACT : CPU_MATMUL_DOT_Q8);
                double dt = now() - t0;
                if (dt < lm_best[mi][bi]) lm_best[mi][bi] = dt, lm_cpu[mi][bi] = cpu_now() - c0;
            }
        }
    cpu_pool_destroy(pool);
    free(scratch), free(xin), free(yout);
    for (int mi = 0; mi < n_modes; mi++) {
        const char *tag = mode_names[mi];
        const double ob = (double)mat_bytes(out) / 1e9;
        printf("[dot %s] output layer %s %lldx%lld (%.3f GB): T=1 %.2f ms (%.2f GB/s, %.2f cores busy, %.0f%% of a "
               "decode step)", tag, quant_get(out->type) ? quant_get(out->type)->name : "?", (long long)out->n_out,
               (long long)out->n_in, ob, 1e3 * lm_best[mi][0], ob / lm_best[mi][0], lm_cpu[mi][0] / lm_best[mi][0],
               100.0 * lm_best[mi][0] / (best_dec[mi] / D));
        if (B > 1)
            printf("; T=%d %.2f ms (%.0f%% of a batched step)", B, 1e3 * lm_best[mi][1],
                   100.0 * lm_best[mi][1] / (best_bat[mi] / D));
        printf("\n");
    }
    for (int mi = 0; mi < n_modes; mi++) {
        const char *tag = mode_names[mi];
        /* "cores busy" = CPU seconds / wall seconds: below the thread count, the machine was shared */
        printf("[dot %s] prefill %d tokens: %.3f s, %.1f tok/s (%.2f cores busy; %.1f tok per CPU-second)\n",
               tag, P, best_pre[mi], P / best_pre[mi], cpu_pre[mi] / best_pre[mi], P / cpu_pre[mi]);
        printf("[dot %s] decode 1 seq, %d steps after the prompt: %.2f ms/token, %.2f tok/s, %.2f GB/s of "
               "weights (%.2f cores busy; %.2f tok per CPU-second)\n",
               tag, D, 1e3 * best_dec[mi] / D, D / best_dec[mi], gb * D / best_dec[mi],
               cpu_dec[mi] / best_dec[mi], D / cpu_dec[mi]);
        if (B > 1)
            printf("[dot %s] decode %d seqs, %d steps: %.2f ms/step, %.2f tok/s aggregate (%.2f cores busy; "
                   "%.2f tok per CPU-second)\n",
                   tag, B, D, 1e3 * best_bat[mi] / D, (double)B * D / best_bat[mi],
                   cpu_bat[mi] / best_bat[mi], (double)B * D / cpu_bat[mi]);
    }
    for (int k = 0; k < n_modes; k++) fwd_destroy(f[k]);
    free(rows), free(ids);
    qwen35_model_free(m);
    return 0;
fail:
    fprintf(stderr, "cpu_forward_bench: %s\n", st.msg);
    return 1;
}
