/* deltaserve bench decode: batch-1 decode speed (bench batch: cmd_bench_batch.c) of one model,
 * through the forward contract (model/fwd.h) on the device --device picks, as a served request
 * decodes.
 *   deltaserve bench decode --model F --ctx 4096 --tokens 256 [--device cuda|cpu]
 * The slot starts at position --ctx as if that context had been consumed (fwd_fill: KV rows
 * 0..ctx-1 hold a constant pattern; attention reads all of them, the values do not change the
 * speed), warms up, then decodes --tokens tokens greedily, one step each (on the GPU: one graph
 * launch and one host sync). Prints tok/s; on the GPU also the bytes a token must move
 * (weights + DeltaNet state read and written + KV read), achieved GB/s and % of the H200's
 * 4.6 TB/s, kernels per token and host<->device bytes per token.
 *   deltaserve bench decode ... --speculative-k K --force-accept P
 * The main model's side of speculative decoding at a forced acceptance rate (synthetic weights
 * accept nothing): each step is a verify run of K+1 rows (the last token, then K drafts: the
 * previous run's choices), after which each draft in turn counts as accepted with probability P
 * (a fixed-seed draw) until one is not; the slot rolls back past the rejected rows (fwd_rollback)
 * and the run yields the accepted drafts plus one token. Timed: the verify steps and rollbacks
 * until --tokens tokens came out, and, where the model has an MTP head the forward runs on its
 * device (fwd_has_mtp: cuda), the drafting as served: each run's drafts made by the head
 * (fwd_mtp_draft, from the head's rows of the context: the fill's pattern), and after it the
 * accepted rows fed to it (fwd_mtp_feed). Without one the drafts' own cost is not in it.
 * Prints tok/s, verify runs and the mean tokens a run. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/sampling.h"
#include "model/qwen35.h"
#include "model/fwd.h"
#include "model/sampler.h"
#include "worker/backend.h"

#define BENCH_PEAK_GBS 4600.0
#define BENCH_ACCEPT_SEED 0x5eed /* --force-accept's draws: sampler_uniform(seed, draw) */

typedef struct bench_opts {
    const char *model, *device, *state_dtype;
    int ctx, tokens, warmup, threads, tp, spec_k;
    float force_accept;
} bench_opts;

static const flag_spec bench_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(bench_opts, model), "GGUF model file"},
    {"device", "DS_DEVICE", "cuda", FLAG_STR, offsetof(bench_opts, device), "cuda | cuda:N | cuda:A,B,... (the --tp ranks' GPUs) | cpu (cuda without a GPU: CPU)"},
    {"tp", "DS_TP", "1", FLAG_INT, offsetof(bench_opts, tp), "tensor-parallel ranks (cpu: simulated in one process)"},
    {"ctx", NULL, "4096", FLAG_INT, offsetof(bench_opts, ctx), "context already consumed"},
    {"tokens", NULL, "256", FLAG_INT, offsetof(bench_opts, tokens), "tokens decoded and timed"},
    {"warmup", NULL, "16", FLAG_INT, offsetof(bench_opts, warmup), "untimed tokens first"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(bench_opts, threads), "CPU threads (cpu)"},
    {"state-dtype", "DS_STATE_DTYPE", "f32", FLAG_STR, offsetof(bench_opts, state_dtype), "f32 | bf16: how the DeltaNet recurrent state S is stored (arithmetic F32 either way)"},
    {"speculative-k", NULL, "0", FLAG_INT, offsetof(bench_opts, spec_k), "verify runs of K drafts + 1 (1..4; 0: plain decode); with --force-accept"},
    {"force-accept", NULL, "0", FLAG_FLOAT, offsetof(bench_opts, force_accept), "each draft accepted with this probability (0..1); drafting timed where the forward runs the MTP head"},
    {0},
};

/* n greedy decode steps of slot 0 from token *tok; *tok = the last sampled token */
static int decode_steps(fwd *f, int n, int32_t *tok, status *st)
{
    for (int i = 0; i < n; i++) {
        fwd_row r = {.token = *tok, .slot = 0, .pos = fwd_n_past(f, 0), .sample = true};
        if (fwd_step(f, &r, 1, st)) return st->code;
        *tok = r.out.token;
    }
    return STATUS_OK;
}

/* Verify runs of slot 0 until n tokens came out (bench_opts.spec_k, force_accept): *tok the last
 * token; *runs += the runs made. With the head on the device (hb: [k + 2][H], row 0 the pending
 * h, the head fed up to the position before *tok's), each run is drafted by it and its accepted
 * rows fed to it after the rollback, as worker/spec.c does; without, the drafts are the last
 * run's choices. */
static int verify_steps(fwd *f, const bench_opts *o, int n, int32_t *tok, uint64_t *draw,
                        int *runs, float *hb, status *st)
{
    const int k = o->spec_k;
    const size_t H = (size_t)f->model->cfg.H;
    fwd_row rows[FWD_MAX_VERIFY_ROWS];
    int32_t drafts[FWD_MAX_VERIFY_ROWS] = {0}, fed[FWD_MAX_VERIFY_ROWS];
    for (int done = 0; done < n;) {
        const int p = fwd_n_past(f, 0);
        if (hb && fwd_mtp_draft(f, 0, p - 1, hb, *tok, k, drafts, st)) return st->code;
        for (int i = 0; i <= k; i++)
            rows[i] = (fwd_row){.token = i ? drafts[i - 1] : *tok, .slot = 0, .pos = p + i,
                                .sample = true, .verify = true,
                                .hidden = hb ? hb + (1 + i) * H : NULL};
        if (fwd_step(f, rows, k + 1, st)) return st->code;
        int a = 0; /* drafts accepted: each with probability force_accept, until one is not */
        while (a < k && sampler_uniform(BENCH_ACCEPT_SEED, (*draw)++) < o->force_accept) a++;
        if (a < k && fwd_rollback(f, 0, p + a + 1, st)) return st->code;
        if (hb) { /* (pending, t_0), (h_0, t_1) .. (h_{a-1}, t_a); h_a pending */
            for (int i = 0; i <= a; i++) fed[i] = rows[i].token;
            if (fwd_mtp_feed(f, 0, p - 1, hb, fed, a + 1, st)) return st->code;
            memcpy(hb, hb + (1 + a) * H, H * sizeof(float));
        } else {
            for (int i = 0; i < k; i++) drafts[i] = rows[i].out.token; /* any ids do */
        }
        *tok = rows[a].out.token;
        done += a + 1;
        ++*runs;
    }
    return STATUS_OK;
}

static int bench_run(const qwen35_model *m, const bench_opts *o, status *st)
{
    fwd *f = NULL;
    float *hb = NULL; /* the head's hidden rows, when it drafts on the device */
    const int k = o->spec_k;
    fwd_opts fo = {.n_slots = 1, .n_ctx = o->ctx + o->warmup + o->tokens + 2 + 2 * k,
                   .max_rows = k + 2, .ranks = o->tp, .n_threads = o->threads,
                   .verify_rows = k ? k + 1 : 0, .verify_runs = 1};
    if (fwd_state_dtype_parse(o->state_dtype, &fo.state_dtype, st)) return st->code;
    const sampling_params greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
    const double t_load = clock_now_s();
    if (worker_fwd_create(o->device, m, &fo, &f, st) || fwd_seq_start(f, 0, &greedy, st) ||
        fwd_fill(f, 0, o->ctx, st))
        goto fail;
    fprintf(stderr, "bench: %s ready in %.1f s\n", f->device, clock_now_s() - t_load);
    int32_t tok = 1;
    uint64_t draw = 0;
    int runs = 0;
    /* the head on the device: its rows of the context are the fill's, the pending h zeros */
    if (k && fwd_has_mtp(f) && !(hb = calloc((size_t)(k + 2) * m->cfg.H, sizeof(float)))) {
        status_fail(st, STATUS_NOMEM, "bench: hidden rows");
        goto fail;
    }
    if (k ? verify_steps(f, o, o->warmup, &tok, &draw, &runs, hb, st)
          : decode_steps(f, o->warmup, &tok, st))
        goto fail;
    runs = 0;
    fwd_stats s0 = {0}, s1 = {0};
    fwd_get_stats(f, &s0);
    const double t0 = clock_now_s();
    if (k ? verify_steps(f, o, o->tokens, &tok, &draw, &runs, hb, st)
          : decode_steps(f, o->tokens, &tok, st))
        goto fail;
    const double dt = clock_now_s() - t0;
    fwd_get_stats(f, &s1);
    const double tps = o->tokens / dt;
    printf("model %s\ndevice %s, batch 1, context %d..%d, state S %s (%.1f MiB a slot)\n", o->model,
           f->device, o->ctx + o->warmup, o->ctx + o->warmup + o->tokens,
           fwd_state_dtype_name(f->state_dtype), (double)f->state_bytes / (1 << 20));
    printf("decode: %d tokens in %.3f s = %.1f tok/s (%.1f us/token)\n", o->tokens, dt, tps,
           1e6 * dt / o->tokens);
    if (k)
        printf("speculative: k %d, forced acceptance %.2f: %d verify runs, %.3f tokens a run, "
               "%.1f us a run (%s)\n", k, o->force_accept, runs, (double)o->tokens / runs,
               1e6 * dt / runs, hb ? "drafting by the MTP head on the device timed"
                                   : "drafting not timed");
    if (s1.bytes_per_token) { /* a device that counts its traffic (the GPU) */
        const double n = (double)(s1.tokens - s0.tokens), gbs = (double)s1.bytes_per_token * tps / 1e9;
        printf("bytes/token: %.3f GB (weights %.3f GB + state + KV at ctx %d) -> %.0f GB/s = "
               "%.1f%% of 4.6 TB/s\n", s1.bytes_per_token / 1e9, s1.weight_bytes / 1e9, o->ctx,
               gbs, 100.0 * gbs / BENCH_PEAK_GBS);
        printf("kernels/token: %llu (%.2f graph launches and %.2f host syncs per token)\n",
               (unsigned long long)s1.kernels_per_token, (s1.graph_launches - s0.graph_launches) / n,
               (s1.steps - s0.steps) / n);
        printf("host<->device bytes/token: D2H %.1f, H2D %.1f\n", (s1.d2h_bytes - s0.d2h_bytes) / n,
               (s1.h2d_bytes - s0.h2d_bytes) / n);
    }
fail:
    free(hb);
    fwd_destroy(f);
    return st->code;
}

int cmd_bench(int argc, char **argv)
{
    const char *usage = "deltaserve bench decode --model F [--ctx 4096] [--tokens 256] [--device cuda|cpu] [--tp N]\n"
                        "       deltaserve bench batch --model F [--prompt 512] [--gen 128] [--batch 1,16,64,256]";
    if (argc >= 2 && !strcmp(argv[1], "batch")) return cmd_bench_batch(argc - 1, argv + 1);
    if (argc < 2 || strcmp(argv[1], "decode")) {
        fprintf(stderr, "usage: %s\n", usage);
        return 2;
    }
    bench_opts o = {0};
    status st = {0};
    int rc = flags_parse(bench_flags, &o, argc - 1, argv + 1, usage, &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc || !o.model || o.tokens < 1 || o.ctx < 0 || o.warmup < 1 || o.spec_k < 0 ||
        o.spec_k > FWD_MAX_VERIFY_ROWS - 1 || o.force_accept < 0 || o.force_accept > 1) {
        fprintf(stderr, "deltaserve bench: %s\n",
                rc ? st.msg : "--model, --tokens >= 1, --warmup >= 1, --speculative-k 0..7, "
                              "--force-accept 0..1");
        return 2;
    }
    qwen35_model *m = NULL;
    if (qwen35_model_load(&m, o.model, &st)) {
        fprintf(stderr, "deltaserve bench: %s\n", st.msg);
        return 1;
    }
    if (strcmp(o.device, "cuda") && strncmp(o.device, "cuda:", 5) && strcmp(o.device, "cpu")) {
        fprintf(stderr, "deltaserve bench: unknown --device '%s' (cuda, cuda:N, cuda:A,B,..., cpu)\n",
                o.device);
        qwen35_model_free(m);
        return 2;
    }
    rc = bench_run(m, &o, &st);
    if (rc) fprintf(stderr, "deltaserve bench: %s\n", st.msg);
    qwen35_model_free(m);
    return rc ? 1 : 0;
}
