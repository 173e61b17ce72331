/* deltaserve bench decode: batch-1 decode speed of one model.
 *   deltaserve bench decode --model F --ctx 4096 --tokens 256 [--device cuda|cpu]
 * cuda: the CUDA engine (worker/cuda_backend.h) starts at position --ctx as if that context had
 * been consumed (KV rows 0..ctx-1 hold a constant pattern: attention reads all of them, the
 * values do not change the speed), warms up, then decodes --tokens tokens greedily, one graph
 * launch and one sync each. Prints tok/s, the bytes a token must move (weights + DeltaNet state
 * read and written + KV read), achieved GB/s and % of the H200's 4.6 TB/s, kernels per token
 * and host<->device bytes per token.
 * cpu: the CPU forward (model/forward.h) decodes --tokens tokens from position 0 (no context
 * fill: a CPU prefill of 4K tokens takes minutes); tok/s only. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "common/flags.h"
#include "model/forward.h"
#include "model/qwen35.h"
#include "worker/cuda_backend.h"

#define BENCH_PEAK_GBS 4600.0

typedef struct bench_opts {
    const char *model, *device;
    int ctx, tokens, warmup, threads;
} bench_opts;

static const flag_spec bench_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(bench_opts, model), "GGUF model file"},
    {"device", "DS_DEVICE", "cuda", FLAG_STR, offsetof(bench_opts, device), "cuda | cpu"},
    {"ctx", NULL, "4096", FLAG_INT, offsetof(bench_opts, ctx), "context already consumed (cuda)"},
    {"tokens", NULL, "256", FLAG_INT, offsetof(bench_opts, tokens), "tokens decoded and timed"},
    {"warmup", NULL, "16", FLAG_INT, offsetof(bench_opts, warmup), "untimed tokens first"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(bench_opts, threads), "CPU threads (cpu)"},
    {0},
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int bench_cuda(const qwen35_model *m, const bench_opts *o, status *st)
{
    cuda_backend *g = NULL;
    int32_t *out = malloc((size_t)(o->tokens + o->warmup + 1) * sizeof(int32_t));
    const double t_load = now_s();
    if (!out) return status_fail(st, STATUS_NOMEM, "bench buffers");
    if (cuda_backend_create(m, &(cuda_backend_opts){.n_ctx = o->ctx + o->warmup + o->tokens + 2,
                                                    .verbose = true}, &g, st) ||
        cuda_backend_set_position(g, 0, o->ctx, st))
        goto fail;
    fprintf(stderr, "cuda: ready in %.1f s\n", now_s() - t_load);
    if (cuda_backend_generate(g, 0, 1, o->warmup, out, st)) goto fail;
    cuda_backend_stats s0, s1;
    cuda_backend_get_stats(g, &s0);
    const double t0 = now_s();
    if (cuda_backend_generate(g, 0, out[o->warmup > 0 ? o->warmup - 1 : 0], o->tokens, out, st))
        goto fail;
    const double dt = now_s() - t0;
    cuda_backend_get_stats(g, &s1);
    const double tps = o->tokens / dt, n = (double)(s1.tokens - s0.tokens);
    const double gbs = (double)s1.bytes_per_token * tps / 1e9;
    printf("model %s\ndevice %s, batch 1, context %d..%d\n", o->model,
           cuda_backend_device_name(g), o->ctx + o->warmup, o->ctx + o->warmup + o->tokens);
    printf("decode: %d tokens in %.3f s = %.1f tok/s (%.1f us/token)\n", o->tokens, dt, tps,
           1e6 * dt / o->tokens);
    printf("bytes/token: %.3f GB (weights %.3f GB + state + KV at ctx %d) -> %.0f GB/s = %.1f%% "
           "of 4.6 TB/s\n", s1.bytes_per_token / 1e9, s1.weight_bytes / 1e9, o->ctx, gbs,
           100.0 * gbs / BENCH_PEAK_GBS);
    printf("kernels/token: %llu (one CUDA graph launch, one host sync)\n",
           (unsigned long long)s1.kernels_per_token);
    printf("host<->device bytes/token: D2H %.1f, H2D %.1f\n", (s1.d2h_bytes - s0.d2h_bytes) / n,
           (s1.h2d_bytes - s0.h2d_bytes) / n);
fail:
    cuda_backend_destroy(g);
    free(out);
    return st->code;
}

static int bench_cpu(const qwen35_model *m, const bench_opts *o, status *st)
{
    qwen35_ctx *ctx = NULL;
    qwen35_state *s = NULL;
    float *logits = malloc((size_t)m->cfg.V * sizeof(float));
    if (!logits) return status_fail(st, STATUS_NOMEM, "bench logits");
    if (qwen35_ctx_create(m, &(qwen35_ctx_opts){.n_threads = o->threads}, &ctx, st) ||
        qwen35_state_create(m, o->warmup + o->tokens + 2, &s, st))
        goto fail;
    int32_t tok = 1;
    double t0 = 0;
    for (int i = 0; i < o->warmup + o->tokens; i++) {
        if (i == o->warmup) t0 = now_s();
        if (qwen35_decode_batch(ctx, &s, &tok, 1, logits, st)) goto fail;
        int a = 0;
        for (int v = 1; v < m->cfg.V; v++)
            if (logits[v] > logits[a]) a = v;
        tok = a;
    }
    const double dt = now_s() - t0;
    printf("model %s\ndevice cpu (%d threads), batch 1, positions %d..%d\n", o->model,
           qwen35_ctx_n_threads(ctx), o->warmup, o->warmup + o->tokens);
    printf("decode: %d tokens in %.3f s = %.2f tok/s\n", o->tokens, dt, o->tokens / dt);
fail:
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    free(logits);
    return st->code;
}

int cmd_bench(int argc, char **argv)
{
    const char *usage = "deltaserve bench decode --model F [--ctx 4096] [--tokens 256] [--device cuda|cpu]";
    if (argc < 2 || strcmp(argv[1], "decode")) {
        fprintf(stderr, "usage: %s\n", usage);
        return 2;
    }
    bench_opts o = {0};
    status st = {0};
    int rc = flags_parse(bench_flags, &o, argc - 1, argv + 1, usage, &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc || !o.model || o.tokens < 1 || o.ctx < 0 || o.warmup < 1) {
        fprintf(stderr, "deltaserve bench: %s\n", rc ? st.msg : "--model, --tokens >= 1, --warmup >= 1");
        return 2;
    }
    qwen35_model *m = NULL;
    if (qwen35_model_load(&m, o.model, &st)) {
        fprintf(stderr, "deltaserve bench: %s\n", st.msg);
        return 1;
    }
    if (!strcmp(o.device, "cuda")) {
        rc = bench_cuda(m, &o, &st);
        if (rc == STATUS_UNAVAILABLE) { /* no GPU or driver: say so once and run on the CPU */
            fprintf(stderr, "deltaserve bench: %s; no GPU, using CPU\n", st.msg);
            status_clear(&st);
            rc = bench_cpu(m, &o, &st);
        }
    } else if (!strcmp(o.device, "cpu")) {
        rc = bench_cpu(m, &o, &st);
    } else {
        fprintf(stderr, "deltaserve bench: unknown --device '%s' (cuda, cpu)\n", o.device);
        qwen35_model_free(m);
        return 2;
    }
    if (rc) fprintf(stderr, "deltaserve bench: %s\n", st.msg);
    qwen35_model_free(m);
    return rc ? 1 : 0;
}
