/* deltaserve eval: run token ids teacher-forced through the model and write the logits after
 * every token, little-endian float32 [T][V], to --logits-out.
 *   --mode prefill   one prefill of all T tokens (internally in steps of --batch-tokens)
 *   --mode decode    prefill the first --prompt-len tokens (0: none), then decode the rest one
 *                    token at a time
 * Through the forward contract (model/fwd.h) on the device --device picks (worker_fwd_create:
 * the registry, "no GPU, using CPU" when there is none): a prefill chunk is the rows of one step,
 * each row's logits copied out, as a served request runs. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_ids.h"
#include "common/flags.h"
#include "model/qwen35.h"
#include "model/fwd.h"
#include "worker/backend.h"

typedef struct eval_opts {
    const char *model, *ids, *logits_out, *mode, *device;
    int threads, prompt_len, batch_tokens, ctx, tp;
    bool exact_dot;
} eval_opts;

static const flag_spec eval_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(eval_opts, model), "GGUF model file (arch qwen35)"},
    {"ids", NULL, NULL, FLAG_STR, offsetof(eval_opts, ids), "token ids, comma separated"},
    {"logits-out", NULL, NULL, FLAG_STR, offsetof(eval_opts, logits_out), "output file: float32 [T][V]"},
    {"mode", NULL, "prefill", FLAG_STR, offsetof(eval_opts, mode), "prefill | decode"},
    {"prompt-len", NULL, "0", FLAG_INT, offsetof(eval_opts, prompt_len), "decode mode: tokens prefilled first"},
    {"device", "DS_DEVICE", "cpu", FLAG_STR, offsetof(eval_opts, device), "cpu | cuda | cuda:N | cuda:A,B,... (the --tp ranks' GPUs; no GPU: the CPU)"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(eval_opts, threads), "CPU threads (0: all online CPUs)"},
    {"tp", "DS_TP", "1", FLAG_INT, offsetof(eval_opts, tp), "tensor-parallel ranks (cpu: simulated in one process)"},
    {"batch-tokens", NULL, "512", FLAG_INT, offsetof(eval_opts, batch_tokens), "tokens per prefill step"},
    {"exact-dot", NULL, "false", FLAG_BOOL, offsetof(eval_opts, exact_dot), "cpu: quantised weights dotted in float with the F32 activations, not Q8 ones (comparisons with a float reference)"},
    {"ctx", NULL, "0", FLAG_INT, offsetof(eval_opts, ctx), "context length (0: the model's)"},
    {0},
};

int cmd_eval(int argc, char **argv)
{
    eval_opts o = {0};
    status st = {0};
    int rc = flags_parse(eval_flags, &o, argc, argv, "deltaserve eval --model F --ids 1,2,3 --logits-out FILE", &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc) {
        fprintf(stderr, "deltaserve eval: %s\n", st.msg);
        return 2;
    }
    if (!o.model || !o.logits_out) {
        fprintf(stderr, "deltaserve eval: --model and --logits-out are required\n");
        return 2;
    }
    bool decode = !strcmp(o.mode, "decode");
    if (!decode && strcmp(o.mode, "prefill")) {
        fprintf(stderr, "deltaserve eval: --mode must be prefill or decode, not '%s'\n", o.mode);
        return 2;
    }
    if (strcmp(o.device, "cpu") && strcmp(o.device, "cuda") && strncmp(o.device, "cuda:", 5)) {
        fprintf(stderr, "deltaserve eval: --device must be cpu, cuda, cuda:N or cuda:A,B,... (the "
                "GPUs of --tp ranks), not '%s'\n", o.device);
        return 2;
    }
    if (o.batch_tokens < 1 || o.prompt_len < 0 || o.ctx < 0) {
        fprintf(stderr, "deltaserve eval: --batch-tokens must be >= 1, --prompt-len and --ctx >= 0\n");
        return 2;
    }

    int32_t *ids = NULL;
    int T = 0;
    qwen35_model *m = NULL;
    fwd *f = NULL;
    fwd_row *rows = NULL;
    float *logits = NULL;
    FILE *out = NULL;
    int ret = 1;
    if (cli_ids_parse(o.ids, &ids, &T, &st) || qwen35_model_load(&m, o.model, &st)) goto fail;
    int n_ctx = o.ctx ? o.ctx : m->cfg.n_ctx_train;
    if (T > n_ctx) {
        status_fail(&st, STATUS_RANGE, "%d tokens exceed the context of %d", T, n_ctx);
        goto fail;
    }
    for (int i = 0; i < T; i++)
        if (ids[i] >= m->cfg.V) {
            status_fail(&st, STATUS_RANGE, "token id %d at index %d is outside the vocabulary [0, %d)",
                        ids[i], i, m->cfg.V);
            goto fail;
        }
    long V = m->cfg.V;
    logits = malloc((size_t)T * V * sizeof(float));
    if (!logits) {
        status_fail(&st, STATUS_NOMEM, "out of memory for %d x %ld logits", T, V);
        goto fail;
    }
    const fwd_opts fo = {.n_slots = 1, .n_ctx = T + 1 > 2 ? T + 1 : 2, .max_rows = o.batch_tokens, .ranks = o.tp,
                         .n_threads = o.threads, .exact_dot = o.exact_dot};
    const sampling_params greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
    if (worker_fwd_create(o.device, m, &fo, &f, &st) || fwd_seq_start(f, 0, &greedy, &st)) goto fail;
    rows = malloc(sizeof *rows * (size_t)f->max_rows);
    if (!rows) {
        status_fail(&st, STATUS_NOMEM, "out of memory for %d rows", f->max_rows);
        goto fail;
    }
    const int n_pre = decode ? (o.prompt_len < T ? o.prompt_len : T) : T;
    const int step = o.batch_tokens < f->max_rows ? o.batch_tokens : f->max_rows;
    for (int t = 0; t < T;) { /* the prefill in chunks of --batch-tokens, then one by one */
        const int n = t < n_pre ? (n_pre - t < step ? n_pre - t : step) : 1;
        for (int k = 0; k < n; k++)
            rows[k] = (fwd_row){.token = ids[t + k], .slot = 0, .pos = t + k, .prompt = true,
                                .logits = logits + (size_t)(t + k) * V};
        if (fwd_step(f, rows, n, &st)) goto fail;
        t += n;
    }
    out = fopen(o.logits_out, "wb");
    if (!out) {
        status_fail(&st, STATUS_IO, "cannot open %s for writing", o.logits_out);
        goto fail;
    }
    if (fwrite(logits, sizeof(float) * V, (size_t)T, out) != (size_t)T || fclose(out)) {
        out = NULL;
        status_fail(&st, STATUS_IO, "%s: write failed", o.logits_out);
        goto fail;
    }
    out = NULL;
    ret = 0;
fail:
    if (ret) fprintf(stderr, "deltaserve eval: %s\n", st.msg);
    if (out) fclose(out);
    free(logits);
    free(ids);
    free(rows);
    fwd_destroy(f);
    qwen35_model_free(m);
    return ret;
}
