/* deltaserve generate: run a model locally (CPU or GPU) and stream the generated text.
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
 *   <|im_start|>user\nTEXT<|im_end|>\n<|im_start|>assistant\n
 *
 * The generation runs in the worker's engine (worker/engine.h) over the backend --device picks,
 * one slot: the same loop, stop rules and samplers as a served request. Tokens reach this
 * thread through the engine's sink. */
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_ids.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/sampling.h"
#include "model/tokenizer.h"
#include "worker/backend.h"
#include "worker/engine.h"

typedef struct gen_opts {
    const char *model, *prompt, *ids, *device;
    int chat, print_ids, max_tokens, threads, ctx, top_k, tp;
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
    {"device", "DS_DEVICE", "cpu", FLAG_STR, offsetof(gen_opts, device), "cpu | cuda | cuda:N | cuda:A,B,... (the --tp ranks' GPUs; cuda without a GPU: CPU)"},
    {"threads", "DS_THREADS", "0", FLAG_INT, offsetof(gen_opts, threads), "CPU threads (0: all online CPUs)"},
    {"tp", "DS_TP", "1", FLAG_INT, offsetof(gen_opts, tp), "tensor-parallel ranks (cpu: simulated in one process)"},
    {"ctx", NULL, "0", FLAG_INT, offsetof(gen_opts, ctx), "context length (0: the model's)"},
    {0},
};

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

/* What the engine thread hands over: tokens as they come, then the end. */
typedef struct gen_run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t *gen;  /* [max_tokens] */
    int n_gen;     /* tokens written to gen */
    int64_t t_first_us, t_end_us;
    bool done;
    engine_request end; /* the request as it finished */
} gen_run;

static bool gen_cancelled(void *arg)
{
    (void)arg;
    return false;
}

static void gen_on_token(void *arg, const engine_request *r, const worker_batch_item *item)
{
    gen_run *g = arg;
    pthread_mutex_lock(&g->mu);
    if (!g->n_gen) g->t_first_us = clock_now_us();
    g->gen[g->n_gen++] = item->out.token;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    (void)r;
}

static void gen_on_finish(void *arg, const engine_request *r)
{
    gen_run *g = arg;
    pthread_mutex_lock(&g->mu);
    g->end = *r;
    g->t_end_us = clock_now_us();
    g->done = true;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static const engine_sink gen_sink = {gen_cancelled, gen_on_token, gen_on_finish, NULL, NULL};

/* Streams the tokens the engine produces until it finishes the request: text to stdout as it
 * comes (or nothing, with --print-ids). Returns the request's result code. */
static int stream_tokens(gen_run *g, const gen_opts *o, const tokenizer *tok, char *piece,
                         size_t cap, status *st)
{
    tokenizer_detok dt;
    tokenizer_detok_init(&dt, tok);
    int shown = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (shown == g->n_gen && !g->done) pthread_cond_wait(&g->cv, &g->mu);
        const int n = g->n_gen;
        const bool done = g->done;
        pthread_mutex_unlock(&g->mu);
        for (; shown < n; shown++) {
            if (o->print_ids || tokenizer_is_eog(tok, g->gen[shown])) continue;
            size_t n_out = 0;
            if (tokenizer_detok_push(&dt, g->gen[shown], piece, cap, &n_out, st)) return st->code;
            fwrite(piece, 1, n_out, stdout);
            fflush(stdout);
        }
        if (done) break;
    }
    if (!o->print_ids) {
        size_t n_out = tokenizer_detok_flush(&dt, piece, cap);
        fwrite(piece, 1, n_out, stdout);
        printf("\n");
    }
    if (g->end.result.code) *st = g->end.result;
    return st->code;
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
    if (o.ctx < 0) return usage_error("--ctx must be >= 0");
    sampling_params sp = {.temperature = o.temperature, .top_k = o.top_k, .top_p = o.top_p,
                          .min_p = o.min_p, .repetition_penalty = o.repetition_penalty,
                          .presence_penalty = o.presence_penalty,
                          .frequency_penalty = o.frequency_penalty, .penalize_prompt = true,
                          .seed = o.seed >= 0 ? (uint64_t)o.seed
                                              : (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)getpid()};
    if (sampling_params_validate(&sp, "--", &st)) { /* a bad value, not a bad command line */
        fprintf(stderr, "deltaserve generate: %s\n", st.msg);
        return 1;
    }
    sp = sampling_params_resolve(&sp);
    if (log_threshold < LOG_LEVEL_WARN) log_threshold = LOG_LEVEL_WARN; /* stderr: the summary */

    qwen35_model *m = NULL;
    tokenizer *tok = NULL;
    worker_backend *be = NULL;
    engine *eng = NULL;
    int32_t *ids = NULL;
    char *piece = NULL;
    gen_run g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    int n_prompt = 0, ret = 1;
    if (qwen35_model_load(&m, o.model, &st) || tokenizer_load(&tok, m->file, &st) ||
        prompt_ids(&o, tok, &ids, &n_prompt, &st))
        goto fail;
    const int V = m->cfg.V;
    for (int i = 0; i < n_prompt; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            status_fail(&st, STATUS_RANGE, "token id %d at index %d is outside the vocabulary [0, %d)", ids[i], i, V);
            goto fail;
        }
    const int n_ctx = o.ctx ? o.ctx : n_prompt + o.max_tokens;
    if ((int64_t)n_prompt + o.max_tokens > n_ctx ||
        (m->cfg.n_ctx_train > 0 && (int64_t)n_prompt + o.max_tokens > m->cfg.n_ctx_train)) {
        status_fail(&st, STATUS_RANGE, "%d prompt tokens + %d new tokens exceed the context of %d",
                    n_prompt, o.max_tokens, o.ctx ? n_ctx : m->cfg.n_ctx_train);
        goto fail;
    }
    const worker_backend_opts bo = {.n_slots = 1, .n_ctx = n_ctx, .n_threads = o.threads,
                                    .max_prefill_tokens = 512, .tp = o.tp};
    engine_opts eo = {.queue = 1, .step_tokens = 512};
    int32_t eog[ENGINE_MAX_EOS_IDS];
    const size_t n_eog = tokenizer_eog_ids(tok, eog);
    for (size_t i = 0; i < n_eog && eo.n_eos_ids < ENGINE_MAX_EOS_IDS; i++) eo.eos_ids[eo.n_eos_ids++] = eog[i];
    const size_t cap = tokenizer_detok_max_out(tok);
    g.gen = malloc(sizeof(int32_t) * (size_t)(o.max_tokens + 1));
    piece = malloc(cap);
    if (!g.gen || !piece) {
        status_fail(&st, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    if (worker_backend_create(o.device, m, &bo, &be, &st) || engine_create(be, &eo, &eng, &st))
        goto fail;
    /* from here a failure is the request's result, which this command prints as its one line;
     * the engine's own log lines (a failed step) would say it twice */
    log_threshold = LOG_LEVEL_OFF;
    engine_params ep = {.prompt = ids, .n_prompt = n_prompt, .sampling = sp,
                        .max_new_tokens = o.max_tokens};
    snprintf(ep.id, sizeof ep.id, "generate");
    const int64_t t0 = clock_now_us();
    if (engine_submit(eng, &ep, &gen_sink, &g, &st) ||
        stream_tokens(&g, &o, tok, piece, cap, &st))
        goto fail;
    /* the eog token that stopped it is not printed and not in the ids */
    const int n_gen = g.n_gen - (g.end.finish == FINISH_STOP && g.n_gen > 0 &&
                                 tokenizer_is_eog(tok, g.gen[g.n_gen - 1]));
    if (o.print_ids) {
        printf("[");
        for (int i = 0; i < n_gen; i++) printf(i ? ", %" PRId32 : "%" PRId32, g.gen[i]);
        printf("]\n");
    }
    fflush(stdout);
    const double pre_s = (g.t_first_us - t0) / 1e6, dec_s = (g.t_end_us - g.t_first_us) / 1e6;
    const int n_dec = g.n_gen > 1 ? g.n_gen - 1 : 0;
    fprintf(stderr, "generate: %s, prompt tokens %d, generated tokens %d, prefill %.1f tok/s, "
            "decode %.1f tok/s\n", be->device, n_prompt, n_gen,
            pre_s > 0 ? n_prompt / pre_s : 0.0, n_dec && dec_s > 0 ? n_dec / dec_s : 0.0);
    ret = 0;
fail:
    if (ret) fprintf(stderr, "deltaserve generate: %s\n", st.msg);
    engine_destroy(eng);
    worker_backend_destroy(be);
    free(piece);
    free(g.gen);
    free(ids);
    tokenizer_destroy(tok);
    qwen35_model_free(m);
    return ret;
}
