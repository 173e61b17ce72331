/* deltaserve generate: run a model locally (CPU or GPU) and stream the generated text.
 *
 *   deltaserve generate --model F (--prompt TEXT | --ids 1,2,3) [--chat [--thinking on|off]]
 *       --max-tokens N [--temperature T --top-k K --top-p P --min-p M --repetition-penalty R
 *        --presence-penalty A --frequency-penalty B --seed S] [--print-ids] [--speculative-k K
 *        [--spec-min-acceptance A]]
 *
 * Text is streamed to stdout as it is produced (streaming detokenizer: never a broken UTF-8
 * sequence), then one summary line goes to stderr: prompt tokens, generated tokens, prefill and
 * decode tok/s. With --print-ids stdout gets one line instead: the generated ids as a JSON
 * array. Generation stops at an end-of-generation token (not printed, not in the ids) or after
 * --max-tokens.
 *
 * --chat renders --prompt as one user turn with the model's own chat template (GGUF
 * tokenizer.chat_template, model/chat_template.h, as the router renders chat prompts), the
 * generation prompt added; --thinking on|off sets the template's enable_thinking (default: the
 * template's own). The output is then split as the router splits it (model/chat_split.h): the
 * answer streams to stdout, the reasoning (inside <think>...</think>, or from the start when
 * the prompt ends inside <think>) to stderr, ended by a newline, and a tool call goes to stdout
 * as one line {"name": ..., "arguments": {...}}. The summary line then also gives the reasoning
 * tokens: those from the first through the one whose text completes </think>.
 *
 * The generation runs in the worker's engine (worker/engine.h) over the backend --device picks,
 * one slot: the same loop, stop rules and samplers as a served request. Tokens reach this
 * thread through the engine's sink.
 *
 * --speculative-k K (1..4) decodes speculatively as the worker's flag of that name does: the
 * model's MTP head drafts K tokens, one verify run of K + 1 rows checks them (worker/spec.h).
 * The summary line then adds the request's verify runs, drafts, accepted drafts, the acceptance
 * rate (accepted / drafted) and the mean accepted length (tokens per verify run: accepted / runs
 * + 1); "speculative off" and why when the model, the device or the sampling settings rule it
 * out (no MTP head, no verify runs, penalties). --spec-min-acceptance A (default 0.3, as the
 * worker's) switches speculation off for the rest of the generation once its rolling acceptance
 * is below A after 8 verify runs (engine_opts.spec_min_accept); the summary then says so, with
 * the counts up to there. 0 keeps it on (tools/train/acceptance.py measures a head that way). */
#include <inttypes.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "cli/cli.h"
#include "cli/cli_ids.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/log.h"
#include "common/sampling.h"
#include "model/chat_split.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "worker/backend.h"
#include "worker/engine.h"
#include "worker/spec.h"

typedef struct gen_opts {
    const char *model, *prompt, *ids, *device, *thinking;
    int chat, print_ids, max_tokens, threads, ctx, top_k, tp, speculative_k, spec_gate;
    float spec_min_acceptance;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
    int64_t seed;
} gen_opts;

static const flag_spec gen_flags[] = {
    {"model", "DS_MODEL", NULL, FLAG_STR, offsetof(gen_opts, model), "GGUF model file (arch qwen35)"},
    {"prompt", NULL, NULL, FLAG_STR, offsetof(gen_opts, prompt), "prompt text"},
    {"ids", NULL, NULL, FLAG_STR, offsetof(gen_opts, ids), "prompt token ids, comma separated (instead of --prompt)"},
    {"chat", NULL, "0", FLAG_BOOL, offsetof(gen_opts, chat), "render --prompt as a user turn with the model's chat template; reasoning to stderr"},
    {"thinking", NULL, NULL, FLAG_STR, offsetof(gen_opts, thinking), "with --chat: on | off (the template's enable_thinking; default: the template's)"},
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
    {"speculative-k", "DS_SPECULATIVE_K", "0", FLAG_INT, offsetof(gen_opts, speculative_k), "speculative decoding with the model's MTP head: tokens drafted per verify run, 0 (off) .. 4"},
    {"spec-gate", "DS_SPEC_GATE", "true", FLAG_BOOL, offsetof(gen_opts, spec_gate), "speculate only while speculating steps measure faster per token than plain ones (as the worker's --spec-gate); false: every step"},
    {"spec-min-acceptance", "DS_SPEC_MIN_ACCEPTANCE", "0.3", FLAG_FLOAT, offsetof(gen_opts, spec_min_acceptance), "0..1: stop speculating once the rolling draft acceptance (accepted / drafted, each verify run weighted 1/8) is below this after 8 verify runs (0: never)"},
    {0},
};

/* --prompt as one user turn rendered with the model's chat template (thinking: -1 the
 * template's default, 0 off, 1 on). *text is malloc'd; *in_reasoning: the prompt ends inside
 * <think>. */
static int chat_prompt(const char *prompt, int thinking, const tokenizer *tok, char **text,
                       size_t *len, bool *in_reasoning, status *st)
{
    size_t src_len;
    const char *src = tokenizer_chat_template(tok, &src_len);
    if (!src)
        return status_fail(st, STATUS_PRECONDITION, "--chat: the model has no chat template "
                           "(GGUF tokenizer.chat_template); give the prompt text without --chat");
    char err[200];
    chat_template *t = NULL;
    if (chat_template_parse(src, src_len, &t, err, sizeof err))
        return status_fail(st, STATUS_INVALID, "--chat: the model's chat template cannot be "
                           "rendered: %s", err);
    json_object *msgs = json_object_new_array(), *m = json_object_new_object();
    int rc = STATUS_OK;
    if (!msgs || !m) {
        json_object_put(m);
        rc = status_fail(st, STATUS_NOMEM, "out of memory");
        goto out;
    }
    json_object_object_add(m, "role", json_object_new_string("user"));
    json_object_object_add(m, "content", json_object_new_string(prompt));
    json_object_array_add(msgs, m);
    if (chat_template_render_chat(t, msgs, NULL, thinking, true, text, len, in_reasoning, err,
                                  sizeof err))
        rc = status_fail(st, STATUS_INVALID, "--chat: rendering the model's chat template: %s",
                         err);
out:
    json_object_put(msgs);
    chat_template_free(t);
    return rc;
}

/* The prompt ids: parsed --ids, or --prompt encoded (rendered with the chat template with
 * --chat). */
static int prompt_ids(const gen_opts *o, int thinking, const tokenizer *tok, int32_t **ids,
                      int *n, bool *in_reasoning, status *st)
{
    *in_reasoning = false;
    if (o->ids) return cli_ids_parse(o->ids, ids, n, st);
    char *text = NULL;
    size_t len = strlen(o->prompt);
    if (o->chat && chat_prompt(o->prompt, thinking, tok, &text, &len, in_reasoning, st))
        return st->code;
    size_t n_ids = 0;
    int rc = tokenizer_encode(tok, text ? text : o->prompt, len, ids, &n_ids, st);
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

/* Where the text goes: stdout, or with --chat the splitter's pieces (the answer to stdout, the
 * reasoning to stderr, tool calls to stdout as JSON lines). */
typedef struct gen_out {
    chat_split *split;    /* owned, NULL without --chat */
    size_t *at;           /* owned, [max_tokens + 1] with --chat: where each token's text starts */
    size_t n_bytes;       /* text detokenized so far */
    bool reasoning_shown; /* some reasoning went to stderr */
    bool reasoning_ended; /* ... and its line was ended */
} gen_out;

static void end_reasoning(gen_out *o)
{
    if (o->reasoning_shown && !o->reasoning_ended) fputc('\n', stderr);
    o->reasoning_ended = true;
}

static void on_piece(void *ud, const chat_piece *p)
{
    gen_out *o = ud;
    if (p->kind == CHAT_PIECE_REASONING) {
        fwrite(p->text, 1, p->len, stderr);
        o->reasoning_shown = true;
        return;
    }
    end_reasoning(o);
    if (p->kind == CHAT_PIECE_CONTENT) {
        fwrite(p->text, 1, p->len, stdout);
        return;
    }
    json_object *name = json_object_new_string(p->name);
    printf("{\"name\": %s, \"arguments\": %s}\n",
           name ? json_object_to_json_string_ext(name, JSON_C_TO_STRING_PLAIN) : "null",
           p->arguments);
    json_object_put(name);
}

static void out_text(gen_out *o, const char *p, size_t n)
{
    if (o->split)
        chat_split_feed(o->split, p, n, on_piece, o); /* out of memory: the text passes as text */
    else
        fwrite(p, 1, n, stdout);
    o->n_bytes += n;
}

/* Streams the tokens the engine produces until it finishes the request: text to stdout as it
 * comes (or nothing, with --print-ids). Returns the request's result code. */
static int stream_tokens(gen_run *g, const gen_opts *o, const tokenizer *tok, char *piece,
                         size_t cap, gen_out *out, status *st)
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
            if (out->at) out->at[shown] = out->n_bytes;
            if (o->print_ids || tokenizer_is_eog(tok, g->gen[shown])) continue;
            size_t n_out = 0;
            if (tokenizer_detok_push(&dt, g->gen[shown], piece, cap, &n_out, st)) return st->code;
            out_text(out, piece, n_out);
            fflush(stdout);
        }
        if (done) break;
    }
    if (!o->print_ids) {
        size_t n_out = tokenizer_detok_flush(&dt, piece, cap);
        out_text(out, piece, n_out);
        if (out->split) chat_split_finish(out->split, on_piece, out);
        end_reasoning(out);
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
    if (o.chat && o.ids) return usage_error("--chat renders --prompt text; it does not apply to --ids");
    int thinking = -1;
    if (o.thinking) {
        if (!o.chat) return usage_error("--thinking applies to --chat");
        if (!strcmp(o.thinking, "on")) thinking = 1;
        else if (!strcmp(o.thinking, "off")) thinking = 0;
        else return usage_error("--thinking must be on or off");
    }
    if (o.max_tokens < 1) return usage_error("--max-tokens must be >= 1");
    if (o.ctx < 0) return usage_error("--ctx must be >= 0");
    if (o.speculative_k < 0 || o.speculative_k > SPEC_MAX_K) return usage_error("--speculative-k must be 0..4");
    if (!(o.spec_min_acceptance >= 0 && o.spec_min_acceptance <= 1)) /* NaN too */
        return usage_error("--spec-min-acceptance must be 0..1 (0: never switch speculation off)");
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
    gen_out out = {0};
    int n_prompt = 0, ret = 1;
    bool in_reasoning = false;
    if (qwen35_model_load(&m, o.model, &st) || tokenizer_load(&tok, m->file, &st) ||
        prompt_ids(&o, thinking, tok, &ids, &n_prompt, &in_reasoning, &st))
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
    const int spec_k = m->mtp.present ? o.speculative_k : 0;
    const worker_backend_opts bo = {.n_slots = 1, .n_ctx = n_ctx, .n_threads = o.threads,
                                    .max_prefill_tokens = 512, .tp = o.tp,
                                    .verify_rows = spec_k ? spec_k + 1 : 0, .verify_runs = 1};
    engine_opts eo = {.queue = 1, .step_tokens = 512, .spec_k = spec_k, .spec_threads = o.threads,
                      .spec_min_accept = o.spec_min_acceptance, .spec_gate = o.spec_gate != 0};
    int32_t eog[ENGINE_MAX_EOS_IDS];
    const size_t n_eog = tokenizer_eog_ids(tok, eog);
    for (size_t i = 0; i < n_eog && eo.n_eos_ids < ENGINE_MAX_EOS_IDS; i++) eo.eos_ids[eo.n_eos_ids++] = eog[i];
    const size_t cap = tokenizer_detok_max_out(tok);
    g.gen = malloc(sizeof(int32_t) * (size_t)(o.max_tokens + 1));
    piece = malloc(cap);
    if (o.chat) {
        out.split = chat_split_new();
        if (out.split) chat_split_reset(out.split, in_reasoning, NULL);
        out.at = malloc(sizeof *out.at * (size_t)(o.max_tokens + 1));
    }
    if (!g.gen || !piece || (o.chat && (!out.split || !out.at))) {
        status_fail(&st, STATUS_NOMEM, "out of memory");
        goto fail;
    }
    if (worker_backend_create(o.device, m, &bo, &be, &st) || engine_create(be, &eo, &eng, &st))
        goto fail;
    engine_load load;
    engine_get_load(eng, &load);
    const bool eng_speculates = load.speculative;
    /* from here a failure is the request's result, which this command prints as its one line;
     * the engine's own log lines (a failed step) would say it twice */
    log_threshold = LOG_LEVEL_OFF;
    engine_params ep = {.prompt = ids, .n_prompt = n_prompt, .sampling = sp,
                        .max_new_tokens = o.max_tokens};
    snprintf(ep.id, sizeof ep.id, "generate");
    const int64_t t0 = clock_now_us();
    if (engine_submit(eng, &ep, &gen_sink, &g, &st) ||
        stream_tokens(&g, &o, tok, piece, cap, &out, &st))
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
    char reasoning[48] = "";
    if (out.split && !o.print_ids) { /* the tokens whose text starts before the reasoning's end */
        bool final;
        const size_t end = chat_split_reasoning_end(out.split, &final);
        int n_reasoning = 0;
        for (int i = 0; i < n_gen; i++) n_reasoning += out.at[i] < end;
        snprintf(reasoning, sizeof reasoning, ", reasoning tokens %d", n_reasoning);
    }
    char spec[256] = "";
    if (o.speculative_k && (g.end.spec || g.end.spec_switched_off)) {
        const int n = snprintf(spec, sizeof spec, ", speculative k %d: verify runs %d, drafted %d, "
                               "accepted %d, acceptance %.4f, mean accepted length %.3f",
                               o.speculative_k, g.end.spec_steps, g.end.spec_drafted,
                               g.end.spec_accepted,
                               g.end.spec_drafted ? (double)g.end.spec_accepted / g.end.spec_drafted : 0.0,
                               g.end.spec_steps ? (double)g.end.spec_accepted / g.end.spec_steps + 1 : 0.0);
        const int n2 = n > 0 && (size_t)n < sizeof spec
                           ? n + snprintf(spec + n, sizeof spec - (size_t)n, ", drafts on %s",
                                          fwd_has_mtp(be->f) ? "the device" : "the CPU")
                           : n;
        if (g.end.spec_switched_off && n2 > 0 && (size_t)n2 < sizeof spec)
            snprintf(spec + n2, sizeof spec - (size_t)n2, ", then switched off (rolling acceptance "
                     "%.3f < --spec-min-acceptance %.2f)", g.end.spec_accept,
                     (double)o.spec_min_acceptance);
    } else if (o.speculative_k)
        snprintf(spec, sizeof spec, ", speculative off (%s)",
                 !m->mtp.present ? "the model has no MTP head"
                 : !eng_speculates ? "the device runs no verify runs"
                                   : "the sampling settings have penalties");
    fprintf(stderr, "generate: %s, prompt tokens %d, generated tokens %d%s, prefill %.1f tok/s, "
            "decode %.1f tok/s%s\n", be->device, n_prompt, n_gen, reasoning,
            pre_s > 0 ? n_prompt / pre_s : 0.0, n_dec && dec_s > 0 ? n_dec / dec_s : 0.0, spec);
    ret = 0;
fail:
    if (ret) fprintf(stderr, "deltaserve generate: %s\n", st.msg);
    engine_destroy(eng);
    worker_backend_destroy(be);
    free(piece);
    free(g.gen);
    chat_split_free(out.split);
    free(out.at);
    free(ids);
    tokenizer_destroy(tok);
    qwen35_model_free(m);
    return ret;
}
