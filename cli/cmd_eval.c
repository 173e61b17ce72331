/* deltaserve eval: run token ids teacher-forced through the model and write the logits after
 * every token, little-endian float32 [T][V], to --logits-out, and/or (--ppl) print the
 * perplexity of the ids: exp(mean negative log-likelihood of each token given the ones before
 * it), with a count of non-finite logits.
 *   --mode prefill   one prefill of all T tokens (internally in steps of --batch-tokens)
 *   --mode decode    prefill the first --prompt-len tokens (0: none), then decode the rest one
 *                    token at a time
 *   --window N       the ids cut into windows of N tokens (the last may be shorter), each run as
 *                    a new sequence and predicted within itself (tools/train/perplexity.py's
 *                    held-out windows); 0: one window, the whole sequence
 * The ids come from --ids or from a file (--ids-file, the same comma-separated list: long
 * sequences do not fit in an argument).
 * Through the forward contract (model/fwd.h) on the device --device picks (worker_fwd_create:
 * the registry, "no GPU, using CPU" when there is none): a prefill chunk is the rows of one step,
 * each row's logits copied out, as a served request runs. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
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
    const char *model, *ids, *ids_file, *logits_out, *mode, *device, *state_dtype;
    int threads, prompt_len, batch_tokens, ctx, tp, window;
    int exact_dot, ppl; /* FLAG_BOOL: int */
} eval_opts;

static const flag_spec eval_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(eval_opts, model), "GGUF model file (arch qwen35)"},
    {"ids", NULL, NULL, FLAG_STR, offsetof(eval_opts, ids), "token ids, comma separated"},
    {"ids-file", NULL, NULL, FLAG_STR, offsetof(eval_opts, ids_file), "file of token ids, comma separated (instead of --ids)"},
    {"logits-out", NULL, NULL, FLAG_STR, offsetof(eval_opts, logits_out), "output file: float32 [T][V]"},
    {"ppl", NULL, "false", FLAG_BOOL, offsetof(eval_opts, ppl), "print the perplexity of the ids (and the non-finite logits seen)"},
    {"window", NULL, "0", FLAG_INT, offsetof(eval_opts, window), "tokens per window, each a new sequence (0: the whole sequence)"},
    {"mode", NULL, "prefill", FLAG_STR, offsetof(eval_opts, mode), "prefill | decode"},
    {"prompt-len", NULL, "0", FLAG_INT, offsetof(eval_opts, prompt_len), "decode mode: tokens prefilled first"},
    {"device", "DS_DEVICE", "cpu", FLAG_STR, offsetof(eval_opts, device), "cpu | cuda | cuda:N | cuda:A,B,... (the --tp ranks' GPUs; no GPU: the CPU)"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(eval_opts, threads), "CPU threads (0: all online CPUs)"},
    {"tp", "DS_TP", "1", FLAG_INT, offsetof(eval_opts, tp), "tensor-parallel ranks (cpu: simulated in one process)"},
    {"batch-tokens", NULL, "512", FLAG_INT, offsetof(eval_opts, batch_tokens), "tokens per prefill step"},
    {"exact-dot", NULL, "false", FLAG_BOOL, offsetof(eval_opts, exact_dot), "cpu: quantised weights dotted in float with the F32 activations, not Q8 ones (comparisons with a float reference)"},
    {"ctx", NULL, "0", FLAG_INT, offsetof(eval_opts, ctx), "context length (0: the model's)"},
    {"state-dtype", "DS_STATE_DTYPE", "f32", FLAG_STR, offsetof(eval_opts, state_dtype), "f32 | bf16: how the DeltaNet recurrent state S is stored (arithmetic F32 either way)"},
    {0},
};

/* The whole of a text file in *out (NUL-terminated, the caller frees). */
static int read_text(const char *path, char **out, status *st)
{
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return status_fail(st, STATUS_IO, "cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(fp);
            return status_fail(st, STATUS_NOMEM, "%s: out of memory", path);
        }
        n += fread(buf + n, 1, cap - 1 - n, fp);
        if (n < cap - 1) break;
        cap *= 2;
        char *g = realloc(buf, cap);
        if (!g) free(buf);
        buf = g;
    }
    const bool bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return status_fail(st, STATUS_IO, "%s: read failed", path);
    }
    buf[n] = 0;
    *out = buf;
    return STATUS_OK;
}

/* The perplexity's sums: -log softmax(logits)[target] in double, and the non-finite logits. */
typedef struct eval_nll {
    double sum;
    int64_t n, non_finite;
} eval_nll;

static void eval_nll_add(eval_nll *a, const float *lg, long V, int32_t target)
{
    double mx = -INFINITY;
    for (long i = 0; i < V; i++) {
        if (!isfinite(lg[i])) a->non_finite++;
        else if (lg[i] > mx) mx = lg[i];
    }
    if (target < 0) return;
    double sum = 0;
    for (long i = 0; i < V; i++) sum += exp((double)lg[i] - mx);
    a->sum += mx + log(sum) - (double)lg[target];
    a->n++;
}

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
    if (!o.model || (!o.logits_out && !o.ppl) || !o.ids == !o.ids_file) {
        fprintf(stderr, "deltaserve eval: --model, one of --ids and --ids-file, and --logits-out "
                "or --ppl are required\n");
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
    fwd_state_dtype state_dtype;
    if (fwd_state_dtype_parse(o.state_dtype, &state_dtype, &st)) {
        fprintf(stderr, "deltaserve eval: --state-dtype: %s\n", st.msg);
        return 2;
    }
    if (o.batch_tokens < 1 || o.prompt_len < 0 || o.ctx < 0 || o.window < 0) {
        fprintf(stderr, "deltaserve eval: --batch-tokens must be >= 1, --prompt-len, --ctx and "
                "--window >= 0\n");
        return 2;
    }

    int32_t *ids = NULL;
    int T = 0;
    qwen35_model *m = NULL;
    fwd *f = NULL;
    fwd_row *rows = NULL;
    float *logits = NULL;
    FILE *out = NULL;
    char *text = NULL;
    int ret = 1;
    if (o.ids_file && read_text(o.ids_file, &text, &st)) goto fail;
    if (cli_ids_parse(text ? text : o.ids, &ids, &T, &st) || qwen35_model_load(&m, o.model, &st))
        goto fail;
    const int W = o.window > 0 && o.window < T ? o.window : T; /* tokens per window */
    int n_ctx = o.ctx ? o.ctx : m->cfg.n_ctx_train;
    if (W > n_ctx) {
        status_fail(&st, STATUS_RANGE, "%d tokens exceed the context of %d", W, n_ctx);
        goto fail;
    }
    for (int i = 0; i < T; i++)
        if (ids[i] >= m->cfg.V) {
            status_fail(&st, STATUS_RANGE, "token id %d at index %d is outside the vocabulary [0, %d)",
                        ids[i], i, m->cfg.V);
            goto fail;
        }
    long V = m->cfg.V;
    /* every token's logits for --logits-out, else a step's */
    const long n_logits = o.logits_out ? T : o.batch_tokens;
    logits = malloc((size_t)n_logits * V * sizeof(float));
    if (!logits) {
        status_fail(&st, STATUS_NOMEM, "out of memory for %ld x %ld logits", n_logits, V);
        goto fail;
    }
    const fwd_opts fo = {.n_slots = 1, .n_ctx = W + 1 > 2 ? W + 1 : 2, .max_rows = o.batch_tokens, .ranks = o.tp,
                         .n_threads = o.threads, .exact_dot = o.exact_dot,
                         .state_dtype = state_dtype};
    const sampling_params greedy = {.top_p = 1, .repetition_penalty = 1}; /* resolved */
    if (worker_fwd_create(o.device, m, &fo, &f, &st)) goto fail;
    rows = malloc(sizeof *rows * (size_t)f->max_rows);
    if (!rows) {
        status_fail(&st, STATUS_NOMEM, "out of memory for %d rows", f->max_rows);
        goto fail;
    }
    const int step = o.batch_tokens < f->max_rows ? o.batch_tokens : f->max_rows;
    eval_nll nll = {0};
    for (int w0 = 0; w0 < T; w0 += W) { /* each window a new sequence from position 0 */
        const int w1 = w0 + W < T ? w0 + W : T;
        const int n_pre = decode && o.prompt_len < w1 - w0 ? w0 + o.prompt_len : w1;
        if (w0 > 0) fwd_seq_end(f, 0);
        if (fwd_seq_start(f, 0, &greedy, &st)) goto fail;
        for (int t = w0; t < w1;) { /* the prefill in chunks of --batch-tokens, then one by one */
            const int n = t < n_pre ? (n_pre - t < step ? n_pre - t : step) : 1;
            float *lg = o.logits_out ? logits + (size_t)t * V : logits;
            for (int k = 0; k < n; k++)
                rows[k] = (fwd_row){.token = ids[t + k], .slot = 0, .pos = t - w0 + k,
                                    .prompt = true, .logits = lg + (size_t)k * V};
            if (fwd_step(f, rows, n, &st)) goto fail;
            for (int k = 0; k < n; k++) /* the window's last token predicts nothing */
                eval_nll_add(&nll, lg + (size_t)k * V, V, t + k + 1 < w1 ? ids[t + k + 1] : -1);
            t += n;
        }
    }
    if (o.ppl) {
        const double mean = nll.n ? nll.sum / (double)nll.n : 0;
        printf("perplexity %.6f: mean NLL %.6f nats over %lld predictions in %d window%s of up to "
               "%d tokens; state %s; non-finite logits: %lld\n", exp(mean), mean,
               (long long)nll.n, (T + W - 1) / W, (T + W - 1) / W == 1 ? "" : "s", W,
               fwd_state_dtype_name(f->state_dtype), (long long)nll.non_finite);
        fflush(stdout);
    }
    if (!o.logits_out) {
        ret = 0;
        goto fail;
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
    free(text);
    free(ids);
    free(rows);
    fwd_destroy(f);
    qwen35_model_free(m);
    return ret;
}
