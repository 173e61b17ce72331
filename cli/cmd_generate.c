/* deltaserve generate: run a model locally on the CPU and stream the generated text.
 *
 *   deltaserve generate --model F (--prompt TEXT | --ids 1,2,3) [--chat] --max-tokens N
 *       [--temperature T --top-k K --top-p P --min-p M --repetition-penalty R
 *        --presence-penalty A --frequency-penalty B --seed S] [--print-ids]
 *
 * Text is streamed to stdout as it is produced (streaming detokenizer: never a broken UTF-8
 * sequence), then one summary line goes to stderr: prompt tokens, generated tokens, prefill and
 * decode tok/s. With --print-ids stdout gets one line instead: the generated ids as a JSON
 * array. Generation stops at an end-of-generation token (not printed, not in the ids) or after
 * --max-tokens. --chat wraps the prompt text in ChatML:
 *   <|im_start|>user\nTEXT<|im_end|>\n<|im_start|>assistant\n */
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_ids.h"
#include "common/flags.h"
#include "model/forward.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

typedef struct gen_opts {
    const char *model, *prompt, *ids, *device;
    int chat, print_ids, max_tokens, threads, ctx, top_k;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    int64_t seed;
} gen_opts;

static const flag_spec gen_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(gen_opts, model), "GGUF model file (arch qwen35)"},
    {"prompt", NULL, NULL, FLAG_STR, offsetof(gen_opts, prompt), "prompt text"},
    {"ids", NULL, NULL, FLAG_STR, offsetof(gen_opts, ids), "prompt token ids, comma separated (instead of --prompt)"},
    {"chat", NULL, "0", FLAG_BOOL, offsetof(gen_opts, chat), "wrap --prompt in ChatML (user turn, then the assistant's)"},
    {"max-tokens", NULL, "64", FLAG_INT, offsetof(gen_opts, max_tokens), "most tokens to generate"},
    {"temperature", NULL, "0", FLAG_FLOAT, offsetof(gen_opts, temperature), "0: greedy"},
    {"top-k", NULL, "0", FLAG_INT, offsetof(gen_opts, top_k), "0: off"},
    {"top-p", NULL, "0", FLAG_FLOAT, offsetof(gen_opts, top_p), "(0, 1]; 0: off"},
    {"min-p", NULL, "0", FLAG_FLOAT, offsetof(gen_opts, min_p), "[0, 1]; 0: off"},
    {"repetition-penalty", NULL, "0", FLAG_FLOAT, offsetof(gen_opts, repetition_penalty), "> 0; 0: off (1)"},
    {"presence-penalty", NULL, "0", FLAG_FLOAT, offsetof(gen_opts, presence_penalty), "[-2, 2]"},
    {"frequency-penalty", NULL, "0", FLAG_FLOAT, offsetof(gen_opts, frequency_penalty), "[-2, 2]"},
    {"seed", NULL, "-1", FLAG_I64, offsetof(gen_opts, seed), "RNG seed; -1: from the clock"},
    {"print-ids", NULL, "0", FLAG_BOOL, offsetof(gen_opts, print_ids), "print the generated ids as one JSON line instead of text"},
    {"device", "DS_DEVICE", "cpu", FLAG_STR, offsetof(gen_opts, device), "cpu (cuda: not in this build)"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(gen_opts, threads), "CPU threads (0: all online CPUs)"},
    {"ctx", NULL, "0", FLAG_INT, offsetof(gen_opts, ctx), "context length (0: the model's)"},
    {0},
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The prompt ids: parsed --ids, or --prompt encoded (ChatML-wrapped with --chat). */
static int prompt_ids(const gen_opts *o, const tokenizer *tok, int32_t **ids, int *n, status *st)
{
    if (o->ids) return cli_ids_parse(o->ids, ids, n, st);
    const char *pre = o->chat ? "<|im_start|>user\n" : "";
    const char *post = o->chat ? "<|im_end|>\n<|im_start|>assistant\n" : "";
    size_t len = strlen(pre) + strlen(o->prompt) + strlen(post);
    char *text = malloc(len + 1);
    if (!text) return status_fail(st, STATUS_NOMEM, "out of memory");
    snprintf(text, len + 1, "%s%s%s", pre, o->prompt, post);
    size_t n_ids = 0;
    int rc = tokenizer_encode(tok, text, len, ids, &n_ids, st);
    free(text);
    if (rc) return rc;
    if (n_ids == 0 || n_ids > INT32_MAX) return status_fail(st, STATUS_INVALID, "the prompt encodes to no tokens");
    *n = (int)n_ids;
    return STATUS_OK;
}

static int usage_error(const char *msg)
{
    fprintf(stderr, "deltaserve generate: %s\n", msg);
    return 2;
}

int cmd_generate(int argc, char **argv)
{
    gen_opts o = {0};
    status st = {0};
    int rc = flags_parse(gen_flags, &o, argc, argv,
                         "deltaserve generate --model F (--prompt TEXT | --ids 1,2,3) [--chat] --max-tokens N", &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc) return usage_error(st.msg);
    if (!o.model) return usage_error("--model is required");
    if (!o.prompt == !o.ids) return usage_error("give exactly one of --prompt and --ids");
    if (o.chat && o.ids) return usage_error("--chat wraps --prompt text; it does not apply to --ids");
    if (o.max_tokens < 1) return usage_error("--max-tokens must be >= 1");
    if (strcmp(o.device, "cpu")) return usage_error("--device: only cpu is available in this build");
    if (o.ctx < 0) return usage_error("--ctx must be >= 0");

    qwen35_model *m = NULL;
    tokenizer *tok = NULL;
    qwen35_ctx *ctx = NULL;
    qwen35_state *s = NULL;
    sampler *smp = NULL;
    int32_t *ids = NULL, *gen = NULL;
    float *logits = NULL;
    char *piece = NULL;
    int n_prompt = 0, n_gen = 0, ret = 1;
    if (qwen35_model_load(&m, o.model, &st) || tokenizer_load(&tok, m->file, &st) ||
        prompt_ids(&o, tok, &ids, &n_prompt, &st))
        goto fail;
    int V = m->cfg.V;
    for (int i = 0; i < n_prompt; i++)
        if (ids[i] >= V) {
            status_fail(&st, STATUS_RANGE, "token id %d at index %d is outside the vocabulary [0, %d)", ids[i], i, V);
            goto fail;
        }
    int n_ctx = o.ctx ? o.ctx : m->cfg.n_ctx_train;
    if ((int64_t)n_prompt + o.max_tokens > n_ctx) {
        status_fail(&st, STATUS_RANGE, "%d prompt tokens + %d new tokens exceed the context of %d",
                    n_prompt, o.max_tokens, n_ctx);
        goto fail;
    }
    sampler_params sp = {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p,
                         .min_p = o.min_p, .repetition_penalty = o.repetition_penalty,
                         .presence_penalty = o.presence_penalty,
                         .frequency_penalty = o.frequency_penalty, .penalize_prompt = true,
                         .seed = o.seed >= 0 ? (uint64_t)o.seed
                                             : (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid()};
    qwen35_ctx_opts co = {.max_batch = 1, .max_tokens = 512, .n_threads = o.threads};
    if (sampler_create(&smp, V, n_prompt + o.max_tokens, &sp, &st) ||
        qwen35_ctx_create(m, &co, &ctx, &st) ||
        qwen35_state_create(m, n_prompt + o.max_tokens, &s, &st))
        goto fail;
    size_t cap = tokenizer_detok_max_out(tok);
    logits = malloc(sizeof(float) * V);
    gen = malloc(sizeof(int32_t) * o.max_tokens);
    piece = malloc(cap);
    if (!logits || !gen || !piece) {
        status_fail(&st, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    tokenizer_detok dt;
    tokenizer_detok_init(&dt, tok);

    double t0 = now();
    if (qwen35_prefill(ctx, s, ids, n_prompt, logits, false, &st)) goto fail;
    double t1 = now();
    sampler_accept_prompt(smp, ids, n_prompt);
    for (;;) {
        int32_t t = sampler_sample(smp, logits, NULL, NULL);
        if (t < 0) {
            status_fail(&st, STATUS_INTERNAL, "token %d: the model produced no finite logit "
                        "(NaN or inf; are the weights broken?)", n_gen);
            goto fail;
        }
        if (tokenizer_is_eog(tok, t)) break;
        sampler_accept(smp, t);
        gen[n_gen++] = t;
        if (!o.print_ids) {
            size_t n_out = 0;
            if (tokenizer_detok_push(&dt, t, piece, cap, &n_out, &st)) goto fail;
            fwrite(piece, 1, n_out, stdout);
            fflush(stdout);
        }
        if (n_gen == o.max_tokens) break;
        if (qwen35_decode_batch(ctx, &s, &t, 1, logits, &st)) goto fail;
    }
    double t2 = now();
    if (o.print_ids) {
        printf("[");
        for (int i = 0; i < n_gen; i++) printf(i ? ", %" PRId32 : "%" PRId32, gen[i]);
        printf("]\n");
    } else {
        size_t n_out = tokenizer_detok_flush(&dt, piece, cap);
        fwrite(piece, 1, n_out, stdout);
        printf("\n");
    }
    fflush(stdout);
    /* decode steps: one per generated token after the first (which came from the prefill) */
    int n_dec = n_gen > 1 ? n_gen - 1 : 0;
    fprintf(stderr, "generate: prompt tokens %d, generated tokens %d, prefill %.1f tok/s, decode %.1f tok/s\n",
            n_prompt, n_gen, n_prompt / (t1 - t0), n_dec ? n_dec / (t2 - t1) : 0.0);
    ret = 0;
fail:
    if (ret) fprintf(stderr, "deltaserve generate: %s\n", st.msg);
    free(piece);
    free(gen);
    free(logits);
    free(ids);
    sampler_destroy(smp);
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    tokenizer_destroy(tok);
    qwen35_model_free(m);
    return ret;
}
