/* deltaserve bench batch: throughput of B sequences decoding together, in llama-batched-bench's
 * columns so the two compare line by line.
 *   deltaserve bench batch --model F --prompt 512 --gen 128 --batch 1,16,64,256 [--device cuda]
 * For each B: B slots start; their prompts (PP random token ids each, distinct per sequence) go
 * in as chunks, every sequence max(1, step-tokens / B) tokens a step (llama-batched-bench's
 * ubatch: 512 tokens a step); then TG greedy decode steps of B rows each. Columns:
 *   PP, TG, B; N_KV = B·(PP + TG); T_PP / S_PP = prompt time and B·PP / T_PP; T_TG / S_TG =
 *   decode time and B·TG / T_TG; T / S = both, and N_KV / T.
 * Through the forward contract (model/fwd.h) on the device --device picks: a step's rows are
 * every sequence's chunk (a run of rows each), or one decode row each. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/sampling.h"
#include "common/splitmix64.h"
#include "model/qwen35.h"
#include "model/fwd.h"
#include "worker/backend.h"

#define BATCH_MAX_SIZES 16

typedef struct batch_opts {
    const char *model, *device, *batch, *state_dtype;
    int prompt, gen, threads, step_tokens, tp;
    int batch_invariant; /* FLAG_BOOL: int */
    int dense_rows;
    int dense_per_pass; /* FLAG_BOOL: int */
} batch_opts;

static const flag_spec batch_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(batch_opts, model), "GGUF model file"},
    {"device", "DS_DEVICE", "cuda", FLAG_STR, offsetof(batch_opts, device), "cuda | cuda:N | cuda:A,B,... (the --tp ranks' GPUs) | cpu (cuda without a GPU: CPU)"},
    {"tp", "DS_TP", "1", FLAG_INT, offsetof(batch_opts, tp), "tensor-parallel ranks (cpu: simulated in one process)"},
    {"prompt", NULL, "512", FLAG_INT, offsetof(batch_opts, prompt), "prompt tokens per sequence (PP)"},
    {"gen", NULL, "128", FLAG_INT, offsetof(batch_opts, gen), "generated tokens per sequence (TG)"},
    {"batch", NULL, "1,16,64,256", FLAG_STR, offsetof(batch_opts, batch), "sequences at once (B), comma-separated"},
    {"step-tokens", NULL, "512", FLAG_INT, offsetof(batch_opts, step_tokens), "prompt tokens of all sequences per step"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(batch_opts, threads), "CPU threads (cpu)"},
    {"dense-rows", NULL, "-1", FLAG_INT, offsetof(batch_opts, dense_rows), "passes of this many rows or more multiply the quantised weights as F16 through cuBLAS (-1: 64 with the F16 copies resident, 128 when dequantised every pass; 0: never; cuda, not with --batch-invariant)"},
    {"dense-per-pass", NULL, "false", FLAG_BOOL, offsetof(batch_opts, dense_per_pass), "the dense path dequantises every pass instead of keeping F16 copies of the weights resident (they are kept when they take at most half of the free GPU memory)"},
    {"batch-invariant", NULL, "false", FLAG_BOOL, offsetof(batch_opts, batch_invariant), "every step through the batched kernels (B = 1 too)"},
    {"state-dtype", "DS_STATE_DTYPE", "f32", FLAG_STR, offsetof(batch_opts, state_dtype), "f32 | bf16: how the DeltaNet recurrent state S is stored (arithmetic F32 either way)"},
    {0},
};

/* Runs rows[0 .. n), in forward steps of at most max_rows rows (a run is never split). */
static int run_rows(fwd *f, fwd_row *rows, int n, int run, status *st)
{
    const int per = f->max_rows / run * run;
    for (int i = 0; i < n; i += per)
        if (fwd_step(f, rows + i, n - i < per ? n - i : per, st)) return st->code;
    return STATUS_OK;
}

/* One line of the table for B sequences; toks: [B][prompt]; rows: [B * max(1, step-tokens / B)]. */
static int run_one(fwd *f, const batch_opts *o, int B, fwd_row *rows, int32_t *toks, status *st)
{
    const sampling_params greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
    const int V = f->vocab, ld = o->prompt;
    uint64_t rng = 0x5eed0000u + (uint64_t)B;
    for (int i = 0; i < B; i++) {
        if (fwd_seq_start(f, i, &greedy, st)) return st->code;
        for (int p = 0; p < o->prompt; p++)
            toks[(size_t)i * ld + p] = (int32_t)(splitmix64_next(&rng) % (uint64_t)V);
    }
    int chunk = o->step_tokens / B > 1 ? o->step_tokens / B : 1;
    if (chunk > f->max_rows) chunk = f->max_rows;
    const double t0 = clock_now_s();
    for (int p = 0; p < o->prompt; p += chunk) { /* a chunk of every sequence's prompt a step */
        const int n = o->prompt - p < chunk ? o->prompt - p : chunk;
        for (int i = 0; i < B; i++)
            for (int k = 0; k < n; k++)
                rows[i * n + k] = (fwd_row){.token = toks[(size_t)i * ld + p + k], .slot = i,
                                            .pos = p + k, .prompt = true,
                                            .sample = p + k == o->prompt - 1};
        if (run_rows(f, rows, B * n, n, st)) return st->code;
    }
    const int last = (o->prompt - 1) % chunk; /* the row of a sequence's sampled prompt token */
    const int n_last = o->prompt - (o->prompt - 1) / chunk * chunk;
    for (int i = 0; i < B; i++) toks[(size_t)i * ld] = rows[i * n_last + last].out.token;
    const double t1 = clock_now_s();
    for (int g = 0; g < o->gen - 1; g++) { /* the prompt's last step sampled the first token */
        for (int i = 0; i < B; i++)
            rows[i] = (fwd_row){.token = toks[(size_t)i * ld], .slot = i, .pos = fwd_n_past(f, i),
                                .sample = true};
        if (run_rows(f, rows, B, 1, st)) return st->code;
        for (int i = 0; i < B; i++) toks[(size_t)i * ld] = rows[i].out.token;
    }
    const double t2 = clock_now_s();
    const double t_pp = t1 - t0, t_tg = t2 - t1;
    const long n_kv = (long)B * (o->prompt + o->gen);
    printf("| %5d | %5d | %4d | %7ld | %8.3f | %9.2f | %8.3f | %9.2f | %8.3f | %9.2f |\n",
           o->prompt, o->gen, B, n_kv, t_pp, (double)B * o->prompt / t_pp, t_tg,
           (double)B * o->gen / t_tg, t_pp + t_tg, n_kv / (t_pp + t_tg));
    fflush(stdout);
    return STATUS_OK;
}

int cmd_bench_batch(int argc, char **argv)
{
    const char *usage = "deltaserve bench batch --model F [--prompt 512] [--gen 128] "
                        "[--batch 1,16,64,256] [--step-tokens 512] [--device cuda|cpu] [--tp N]";
    batch_opts o = {0};
    status st = {0};
    int rc = flags_parse(batch_flags, &o, argc, argv, usage, &st);
    if (rc == STATUS_CANCELLED) return 0;
    int sizes[BATCH_MAX_SIZES];
    const int n_sizes = rc ? 0 : flags_int_list(o.batch, sizes, BATCH_MAX_SIZES, 1, 4096);
    fwd_state_dtype state_dtype = FWD_STATE_F32;
    if (!rc && fwd_state_dtype_parse(o.state_dtype, &state_dtype, &st)) {
        fprintf(stderr, "deltaserve bench batch: --state-dtype: %s\n", st.msg);
        return 2;
    }
    if (rc || !o.model || o.prompt < 1 || o.gen < 1 || o.step_tokens < 1 || !n_sizes) {
        fprintf(stderr, "deltaserve bench batch: %s\n",
                rc ? st.msg : !o.model ? "--model is required"
                : !n_sizes ? "--batch: a comma-separated list of sizes in [1, 4096]"
                           : "--prompt, --gen and --step-tokens must be >= 1");
        return 2;
    }
    int max_b = 0;
    for (int i = 0; i < n_sizes; i++) max_b = sizes[i] > max_b ? sizes[i] : max_b;
    qwen35_model *m = NULL;
    if (qwen35_model_load(&m, o.model, &st)) {
        fprintf(stderr, "deltaserve bench batch: %s\n", st.msg);
        return 1;
    }
    fwd *f = NULL;
    const int chunk_max = o.step_tokens > 1 ? o.step_tokens : 1;
    fwd_row *rows = calloc((size_t)max_b * (size_t)chunk_max, sizeof *rows);
    int32_t *toks = calloc((size_t)max_b * o.prompt, sizeof *toks);
    const fwd_opts fo = {.n_slots = max_b, .n_ctx = o.prompt + o.gen + 1,
                         .max_rows = max_b + o.step_tokens, .ranks = o.tp, .n_threads = o.threads,
                         .batch_invariant = o.batch_invariant, .dense_rows = o.dense_rows,
                         .dense_per_pass = o.dense_per_pass, .state_dtype = state_dtype};
    rc = !rows || !toks ? status_fail(&st, STATUS_NOMEM, "%d sequences", max_b)
                        : worker_fwd_create(o.device, m, &fo, &f, &st);
    if (!rc) {
        printf("model %s\ndevice %s\nstate S %s: %.1f MiB a slot\n\n", o.model, f->device,
               fwd_state_dtype_name(f->state_dtype), (double)f->state_bytes / (1 << 20));
        printf("|    PP |    TG |    B |    N_KV |   T_PP s |  S_PP t/s |   T_TG s |  S_TG t/s |      T s |    S t/s |\n");
        printf("|-------|-------|------|---------|----------|-----------|----------|-----------|----------|-----------|\n");
    }
    for (int i = 0; i < n_sizes && !rc; i++) rc = run_one(f, &o, sizes[i], rows, toks, &st);
    if (rc) fprintf(stderr, "deltaserve bench batch: %s\n", st.msg);
    fwd_destroy(f);
    free(rows);
    free(toks);
    qwen35_model_free(m);
    return rc ? 1 : 0;
}
