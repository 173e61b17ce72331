/* sampler_bench: microseconds per sampler_sample call at the Qwen3.5 vocabulary size for the
 * usual parameter mixes. Logits are N(0, 3^2) (a broad distribution: the worst case for
 * top-p); penalties see 2000 distinct tokens.
 *
 *   sampler_bench [--vocab V] [--iters N]
 *
 * One thread; each figure is the median of N calls, in thread CPU time (this process shares
 * its cores with others: wall time would count their turns too). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/sampler.h"

static double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts); /* CPU time: the machine is shared */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int32_t V = 248320;
    int iters = 200;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--vocab")) V = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: sampler_bench [--vocab V] [--iters N]\n");
            return 2;
        }
    }
    static const struct { const char *name; sampling_params p; } cases[] = {
        {"greedy", {.temperature = 0}},
        {"greedy + logprobs 5", {.n_logprobs = 5}},
        {"T 0.8", {.temperature = 0.8f}},
        {"T 0.8 top_k 40", {.temperature = 0.8f, .top_k = 40}},
        {"T 0.8 top_p 0.95", {.temperature = 0.8f, .top_p = 0.95f}},
        {"T 0.7 top_k 20 top_p 0.8 (qwen)", {.temperature = 0.7f, .top_k = 20, .top_p = 0.8f}},
        {"T 1 min_p 0.05", {.temperature = 1.0f, .min_p = 0.05f}},
        {"T 0.8 top_p 0.95 + penalties + logprobs 5",
         {.temperature = 0.8f, .top_p = 0.95f, .repetition_penalty = 1.1f, .presence_penalty = 0.5f,
          .frequency_penalty = 0.2f, .penalize_prompt = true, .n_logprobs = 5}},
    };
    float *base = malloc((size_t)V * sizeof *base), *z = malloc((size_t)V * sizeof *z);
    double *t = malloc((size_t)iters * sizeof *t);
    int32_t *prompt = malloc(2000 * sizeof *prompt);
    if (!base || !z || !t || !prompt) return 1;
    uint64_t s = 1;
    for (int32_t i = 0; i < V; i++) { /* Box-Muller from an LCG */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u = ((s >> 11) + 1.0) / 9007199254740993.0;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double v = (s >> 11) / 9007199254740992.0;
        base[i] = (float)(3 * sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
    }
    for (int i = 0; i < 2000; i++) prompt[i] = (int32_t)((i * 7919u) % (uint32_t)V);
    printf("sampler_bench: vocab %d, %d calls per case, median\n", (int)V, iters);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sampler *sm;
        status st;
        if (sampler_create(&sm, V, 4096, &cases[c].p, &st)) {
            fprintf(stderr, "sampler_bench: %s\n", st.msg);
            return 1;
        }
        sampler_accept_prompt(sm, prompt, 2000);
        sample_result res;
        for (int k = 0; k < iters; k++) {
            memcpy(z, base, (size_t)V * sizeof *z);
            double t0 = bench_now();
            /* logprobs only when the case asks for them, as the engine does */
            bool lps = cases[c].p.n_logprobs > 0;
            sampler_sample(sm, z, lps ? &res : NULL);
            t[k] = bench_now() - t0;
        }
        qsort(t, (size_t)iters, sizeof *t, bench_cmp);
        printf("  %-44s %8.1f us\n", cases[c].name, 1e6 * t[iters / 2]);
        sampler_destroy(sm);
    }
    free(base), free(z), free(t), free(prompt);
    return 0;
}
