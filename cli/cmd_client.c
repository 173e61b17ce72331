/* deltaserve client: streams one generation from a router (deltaserve.v1.Generation/Generate)
 * or, with --worker, straight from a worker (deltaserve.v1.Worker/Generate, ids only).
 *
 * Output (stdout): the text as it streams (default); with --print-ids one JSON array of the
 * generated ids at the end instead; with --json one JSON object per response message. With
 * --verbose a summary of the final message goes to stderr. A non-OK status exits 1 after
 * printing "deltaserve client: CODE_NAME: message" on stderr.
 *
 * --model-info (GetModelInfo) and --abort ID (Abort) make one unary call instead and print its
 * answer as one JSON object. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/flags.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "rpc/rpc_auth.h"
#include "rpc/rpc_client.h"
#include "rpc/rpc_tls.h"
#include "rpc/rpc_status.h"

#define CLIENT_MAX_STOPS 64

typedef struct client_opts {
    const char *addr, *prompt, *ids, *chat, *system, *stop_ids, *request_id, *tls_ca;
    const char *auth_token_file, *abort_id;
    int model_info;
    int max_tokens, top_k, logprobs, print_ids, json, verbose, worker, ignore_eos;
    int64_t seed, timeout_ms;
    float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
} client_opts;

static const flag_spec specs[] = {
    {"addr", "DS_ADDR", "127.0.0.1:50051", FLAG_STR, offsetof(client_opts, addr),
     "router (or, with --worker, worker) address HOST:PORT"},
    {"tls-ca", "DS_TLS_CA", NULL, FLAG_STR, offsetof(client_opts, tls_ca),
     "PEM CA bundle: connect over TLS, verifying the server with it"},
    {"auth-token-file", "DS_AUTH_TOKEN_FILE", NULL, FLAG_STR,
     offsetof(client_opts, auth_token_file),
     "send metadata 'authorization: Bearer <file's token>' (the server's --auth-token-file)"},
    {"prompt", NULL, NULL, FLAG_STR, offsetof(client_opts, prompt), "prompt text"},
    {"ids", NULL, NULL, FLAG_STR, offsetof(client_opts, ids), "prompt token ids: 1,2,3"},
    {"chat", NULL, NULL, FLAG_STR, offsetof(client_opts, chat),
     "one user message, sent as chat (the router applies the chat template)"},
    {"system", NULL, NULL, FLAG_STR, offsetof(client_opts, system),
     "with --chat: a system message before it"},
    {"max-tokens", "DS_MAX_TOKENS", "0", FLAG_INT, offsetof(client_opts, max_tokens),
     "most tokens to generate (0 = server default)"},
    {"temperature", NULL, "0", FLAG_FLOAT, offsetof(client_opts, temperature),
     "0 = greedy"},
    {"top-k", NULL, "0", FLAG_INT, offsetof(client_opts, top_k), "0 = off"},
    {"top-p", NULL, "0", FLAG_FLOAT, offsetof(client_opts, top_p), "0 = off (1.0)"},
    {"min-p", NULL, "0", FLAG_FLOAT, offsetof(client_opts, min_p), "0 = off"},
    {"repetition-penalty", NULL, "0", FLAG_FLOAT, offsetof(client_opts, repetition_penalty),
     "0 = off (1.0)"},
    {"presence-penalty", NULL, "0", FLAG_FLOAT, offsetof(client_opts, presence_penalty), ""},
    {"frequency-penalty", NULL, "0", FLAG_FLOAT, offsetof(client_opts, frequency_penalty), ""},
    {"seed", NULL, "0", FLAG_I64, offsetof(client_opts, seed), "sampler seed (0 = server picks)"},
    {"stop-ids", NULL, NULL, FLAG_STR, offsetof(client_opts, stop_ids),
     "token ids that end generation: 1,2"},
    {"ignore-eos", NULL, NULL, FLAG_BOOL, offsetof(client_opts, ignore_eos),
     "do not stop at end-of-generation tokens"},
    {"logprobs", NULL, "0", FLAG_INT, offsetof(client_opts, logprobs),
     "alternatives per token to return with log probabilities (shown with --json)"},
    {"timeout-ms", "DS_TIMEOUT_MS", "0", FLAG_I64, offsetof(client_opts, timeout_ms),
     "deadline of the call (0 = none)"},
    {"request-id", NULL, NULL, FLAG_STR, offsetof(client_opts, request_id), "request id"},
    {"print-ids", NULL, NULL, FLAG_BOOL, offsetof(client_opts, print_ids),
     "print one JSON array of the generated ids at the end instead of the text"},
    {"json", NULL, NULL, FLAG_BOOL, offsetof(client_opts, json),
     "print every response message as one JSON line"},
    {"verbose", NULL, NULL, FLAG_BOOL, offsetof(client_opts, verbose),
     "print the final message's summary (finish reason, usage, timings) on stderr"},
    {"worker", NULL, NULL, FLAG_BOOL, offsetof(client_opts, worker),
     "--addr is a worker: call deltaserve.v1.Worker/Generate (ids prompts only)"},
    {"model-info", NULL, NULL, FLAG_BOOL, offsetof(client_opts, model_info),
     "print the model served (GetModelInfo) as one JSON object instead of generating"},
    {"abort", NULL, NULL, FLAG_STR, offsetof(client_opts, abort_id),
     "end the running or waiting request with this id (Abort) and print {\"found\": ...}"},
    {0},
};

/* Parses "1,2,3" (spaces and [] allowed) into a malloc'd array. */
static int parse_ids(const char *s, int32_t **out, size_t *n, const char *flag)
{
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    while (*s) {
        while (*s == ' ' || *s == ',' || *s == '[' || *s == ']') s++;
        if (!*s) break;
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < INT32_MIN || x > INT32_MAX) {
            fprintf(stderr, "deltaserve client: --%s: '%s' is not a list of ids\n", flag, s);
            free(v);
            return -1;
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[k++] = (int32_t)x;
        s = end;
    }
    *out = v;
    *n = k;
    return 0;
}

static void json_str(FILE *o, const char *s)
{
    fputc('"', o);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(o, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", o);
        else if (*p == '\r') fputs("\\r", o);
        else if (*p == '\t') fputs("\\t", o);
        else if (*p < 0x20) fprintf(o, "\\u%04x", *p);
        else fputc(*p, o);
    }
    fputc('"', o);
}

static const char *finish_str(Deltaserve__V1__FinishReason f)
{
    static const char *n[] = {"", "stop", "length", "cancelled", "error"};
    return (unsigned)f < 5 ? n[f] : "unknown";
}

static void json_message(FILE *o, const Deltaserve__V1__GenerateResponse *m)
{
    fputs("{\"token_ids\":[", o);
    for (size_t i = 0; i < m->n_token_ids; i++) fprintf(o, "%s%d", i ? "," : "", m->token_ids[i]);
    fputs("],\"text\":", o);
    json_str(o, m->text);
    if (m->n_logprobs) {
        fputs(",\"logprobs\":[", o);
        for (size_t i = 0; i < m->n_logprobs; i++) {
            const Deltaserve__V1__TokenLogprob *l = m->logprobs[i];
            fprintf(o, "%s{\"token_id\":%d,\"logprob\":%.9g,\"top\":[", i ? "," : "", l->token_id,
                    l->logprob);
            for (size_t j = 0; j < l->n_top; j++) {
                fprintf(o, "%s{\"token_id\":%d,\"logprob\":%.9g,\"text\":", j ? "," : "",
                        l->top[j]->token_id, l->top[j]->logprob);
                json_str(o, l->top[j]->text);
                fputc('}', o);
            }
            fputs("]}", o);
        }
        fputc(']', o);
    }
    if (m->finish_reason) {
        fprintf(o, ",\"finish_reason\":\"%s\"", finish_str(m->finish_reason));
        if (m->matched_stop_case == DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_TOKEN_ID)
            fprintf(o, ",\"stop_token_id\":%d", m->stop_token_id);
        if (m->matched_stop_case == DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_STRING) {
            fputs(",\"stop_string\":", o);
            json_str(o, m->stop_string);
        }
        if (m->usage)
            fprintf(o, ",\"usage\":{\"prompt_tokens\":%u,\"completion_tokens\":%u,"
                       "\"cached_tokens\":%u,\"reasoning_tokens\":%u}",
                    m->usage->prompt_tokens, m->usage->completion_tokens,
                    m->usage->cached_tokens, m->usage->reasoning_tokens);
        if (m->timings)
            fprintf(o, ",\"timings\":{\"queue_ms\":%.3f,\"prefill_ms\":%.3f,\"ttft_ms\":%.3f,"
                       "\"decode_ms\":%.3f,\"total_ms\":%.3f,\"mean_itl_ms\":%.3f}",
                    m->timings->queue_ms, m->timings->prefill_ms, m->timings->ttft_ms,
                    m->timings->decode_ms, m->timings->total_ms, m->timings->mean_itl_ms);
        fputs(",\"request_id\":", o);
        json_str(o, m->request_id);
        fprintf(o, ",\"seed\":%llu,\"served_by\":", (unsigned long long)m->seed);
        json_str(o, m->served_by);
    }
    fputs("}\n", o);
}

/* Takes every --stop S / --stop=S out of argv (the flag table holds one value per flag);
 * comma lists are split. Returns the new argc. */
static void json_model_info(FILE *o, const Deltaserve__V1__ModelInfo *m)
{
    fputs("{\"architecture\":", o);
    json_str(o, m->architecture);
    fputs(",\"name\":", o);
    json_str(o, m->name);
    fprintf(o, ",\"n_params\":%llu,\"n_layers\":%u,\"n_deltanet_layers\":%u,"
               "\"n_attention_layers\":%u,\"hidden_size\":%u,\"vocab_size\":%u,"
               "\"eos_token_ids\":[",
            (unsigned long long)m->n_params, m->n_layers, m->n_deltanet_layers,
            m->n_attention_layers, m->hidden_size, m->vocab_size);
    for (size_t i = 0; i < m->n_eos_token_ids; i++)
        fprintf(o, "%s%d", i ? "," : "", m->eos_token_ids[i]);
    fprintf(o, "],\"max_context\":%u,\"quantization\":", m->max_context);
    json_str(o, m->quantization);
    fputs(",\"device\":", o);
    json_str(o, m->device);
    fprintf(o, ",\"max_running\":%u,\"path\":", m->max_running);
    json_str(o, m->path);
    fprintf(o, ",\"bos_token_id\":%d,\"has_chat_template\":%s,\"thinking_default\":%s}\n",
            m->bos_token_id, m->has_chat_template ? "true" : "false",
            m->thinking_default ? "true" : "false");
}

/* --model-info / --abort: one unary call to Generation (Worker with --worker); the answer as
 * one JSON line. Exit status as for a stream: 1 on a non-OK status or no connection. */
static int unary_command(const client_opts *o)
{
    const char *svc = o->worker ? "/deltaserve.v1.Worker/" : "/deltaserve.v1.Generation/";
    char path[64];
    Deltaserve__V1__GetModelInfoRequest ir = DELTASERVE__V1__GET_MODEL_INFO_REQUEST__INIT;
    Deltaserve__V1__AbortRequest ar = DELTASERVE__V1__ABORT_REQUEST__INIT;
    const ProtobufCMessage *req;
    const ProtobufCMessageDescriptor *resp_desc;
    if (o->model_info) {
        snprintf(path, sizeof path, "%sGetModelInfo", svc);
        req = &ir.base;
        resp_desc = &deltaserve__v1__model_info__descriptor;
    } else {
        snprintf(path, sizeof path, "%sAbort", svc);
        ar.request_id = (char *)o->abort_id;
        req = &ar.base;
        resp_desc = &deltaserve__v1__abort_response__descriptor;
    }
    status st;
    rpc_client_channel *ch = NULL;
    rpc_auth *auth = NULL;
    const int tls_on = o->tls_ca && o->tls_ca[0];
    rpc_tls_client tls = {tls_on ? o->tls_ca : NULL, NULL, NULL, NULL};
    if ((o->auth_token_file && o->auth_token_file[0] &&
         rpc_auth_create(o->auth_token_file, &auth, &st)) ||
        rpc_client_channel_create_tls(&ch, o->addr, tls_on ? &tls : NULL, &st)) {
        fprintf(stderr, "deltaserve client: %s\n", st.msg);
        rpc_client_channel_destroy(ch);
        rpc_auth_destroy(auth);
        return 1;
    }
    rpc_client_channel_set_auth(ch, auth);
    ProtobufCMessage *resp = NULL;
    rpc_client_result res;
    int rc = 0;
    if (rpc_client_unary(ch, path, req, resp_desc, &resp, o->timeout_ms, &res)) {
        rpc_client_explain(ch, &res, 2000);
        fprintf(stderr, "deltaserve client: %s: %s\n", rpc_status_grpc_name(res.code),
                res.message);
        rc = 1;
    } else if (o->model_info) {
        json_model_info(stdout, (const Deltaserve__V1__ModelInfo *)resp);
    } else {
        printf("{\"found\":%s}\n",
               ((const Deltaserve__V1__AbortResponse *)resp)->found ? "true" : "false");
    }
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    rpc_client_channel_destroy(ch);
    rpc_auth_destroy(auth);
    return rc;
}

static int take_stops(int argc, char **argv, char *buf, size_t cap, char **stops, int *n_stops)
{
    int k = 0;
    size_t used = 0;
    *n_stops = 0;
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        if (!strcmp(argv[i], "--stop") && i + 1 < argc) v = argv[++i];
        else if (!strncmp(argv[i], "--stop=", 7)) v = argv[i] + 7;
        else { argv[k++] = argv[i]; continue; }
        size_t l = strlen(v);
        if (used + l + 1 > cap) return -1;
        char *copy = buf + used;
        memcpy(copy, v, l + 1);
        used += l + 1;
        for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ","))
            if (*n_stops < CLIENT_MAX_STOPS) stops[(*n_stops)++] = tok;
    }
    return k;
}

int cmd_client(int argc, char **argv)
{
    static char stop_buf[16384];
    char *stops[CLIENT_MAX_STOPS];
    int n_stops = 0;
    argc = take_stops(argc, argv, stop_buf, sizeof stop_buf, stops, &n_stops);
    if (argc < 0) {
        fprintf(stderr, "deltaserve client: --stop: too long\n");
        return 2;
    }
    client_opts o;
    memset(&o, 0, sizeof o);
    status st;
    status_clear(&st);
    int rc = flags_parse(specs, &o, argc, argv,
                         "deltaserve client (also: --stop S, repeatable or a comma list)", &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc) {
        fprintf(stderr, "deltaserve client: %s\n", st.msg);
        return 2;
    }
    int n_prompts = !!o.prompt + !!o.ids + !!o.chat;
    if (o.model_info || o.abort_id) {
        if (n_prompts || (o.model_info && o.abort_id)) {
            fprintf(stderr, "deltaserve client: --model-info and --abort take no prompt and "
                            "not each other\n");
            return 2;
        }
        return unary_command(&o);
    }
    if (n_prompts != 1) {
        fprintf(stderr, "deltaserve client: give exactly one of --prompt, --ids and --chat\n");
        return 2;
    }
    if (o.worker && !o.ids) {
        fprintf(stderr, "deltaserve client: --worker takes --ids prompts only\n");
        return 2;
    }
    if (o.worker && n_stops) {
        fprintf(stderr, "deltaserve client: --worker: workers have no stop strings\n");
        return 2;
    }

    int32_t *ids = NULL, *stop_ids = NULL;
    size_t n_ids = 0, n_stop_ids = 0;
    if (o.ids && parse_ids(o.ids, &ids, &n_ids, "ids")) return 2;
    if (o.stop_ids && parse_ids(o.stop_ids, &stop_ids, &n_stop_ids, "stop-ids")) {
        free(ids);
        return 2;
    }

    Deltaserve__V1__SamplingParams samp = DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    samp.temperature = o.temperature;
    samp.top_k = o.top_k;
    samp.top_p = o.top_p;
    samp.min_p = o.min_p;
    samp.repetition_penalty = o.repetition_penalty;
    samp.presence_penalty = o.presence_penalty;
    samp.frequency_penalty = o.frequency_penalty;
    samp.seed = (uint64_t)o.seed;
    Deltaserve__V1__StoppingCriteria stopc = DELTASERVE__V1__STOPPING_CRITERIA__INIT;
    stopc.max_new_tokens = o.max_tokens > 0 ? (uint32_t)o.max_tokens : 0;
    stopc.n_stop_token_ids = n_stop_ids;
    stopc.stop_token_ids = stop_ids;
    stopc.ignore_eos = o.ignore_eos;

    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    Deltaserve__V1__WorkerGenerateRequest wg = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    Deltaserve__V1__TokenIds tids = DELTASERVE__V1__TOKEN_IDS__INIT;
    Deltaserve__V1__ChatPrompt chat = DELTASERVE__V1__CHAT_PROMPT__INIT;
    Deltaserve__V1__ChatMessage msgs[2] = {DELTASERVE__V1__CHAT_MESSAGE__INIT,
                                           DELTASERVE__V1__CHAT_MESSAGE__INIT};
    Deltaserve__V1__ChatMessage *msg_ptrs[2];
    const ProtobufCMessage *req;
    const char *path;
    if (o.worker) {
        if (o.request_id) wg.request_id = (char *)o.request_id;
        wg.n_prompt_token_ids = n_ids;
        wg.prompt_token_ids = ids;
        wg.sampling = &samp;
        wg.stopping = &stopc;
        wg.logprobs = (uint32_t)(o.logprobs > 0 ? o.logprobs : 0);
        req = &wg.base;
        path = "/deltaserve.v1.Worker/Generate";
    } else {
        if (o.request_id) g.request_id = (char *)o.request_id;
        if (o.prompt) {
            g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
            g.text = (char *)o.prompt;
        } else if (o.ids) {
            g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
            tids.n_ids = n_ids;
            tids.ids = ids;
            g.token_ids = &tids;
        } else {
            size_t k = 0;
            if (o.system) {
                msgs[k].role = "system";
                msgs[k].content = (char *)o.system;
                msg_ptrs[k] = &msgs[k];
                k++;
            }
            msgs[k].role = "user";
            msgs[k].content = (char *)o.chat;
            msg_ptrs[k] = &msgs[k];
            k++;
            chat.n_messages = k;
            chat.messages = msg_ptrs;
            g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT;
            g.chat = &chat;
        }
        g.sampling = &samp;
        g.stopping = &stopc;
        g.n_stop = (size_t)n_stops;
        g.stop = stops;
        g.logprobs = (uint32_t)(o.logprobs > 0 ? o.logprobs : 0);
        req = &g.base;
        path = "/deltaserve.v1.Generation/Generate";
    }

    rpc_client_channel *ch = NULL;
    rpc_client_stream *s = NULL;
    rpc_auth *auth = NULL;
    const int tls_on = o.tls_ca && o.tls_ca[0];
    rpc_tls_client tls = {tls_on ? o.tls_ca : NULL, NULL, NULL, NULL};
    if ((o.auth_token_file && o.auth_token_file[0] &&
         rpc_auth_create(o.auth_token_file, &auth, &st)) ||
        rpc_client_channel_create_tls(&ch, o.addr, tls_on ? &tls : NULL, &st) ||
        (rpc_client_channel_set_auth(ch, auth), 0) ||
        rpc_client_stream_start(&s, ch, path, req, o.timeout_ms, NULL, &st)) {
        fprintf(stderr, "deltaserve client: %s\n", st.msg);
        rpc_client_channel_destroy(ch);
        rpc_auth_destroy(auth);
        free(ids);
        free(stop_ids);
        return 1;
    }
    int print_ids = o.print_ids || (o.worker && !o.json);
    size_t n_out = 0, cap_out = 256;
    int32_t *out_ids = malloc(cap_out * sizeof *out_ids);
    int ends_nl = 1, wrote_text = 0;
    char summary[1024] = "";
    ProtobufCMessage *pm;
    rpc_client_result res;
    while (rpc_client_stream_next(s, &deltaserve__v1__generate_response__descriptor, &pm, &res)) {
        Deltaserve__V1__GenerateResponse *m = (Deltaserve__V1__GenerateResponse *)pm;
        for (size_t i = 0; i < m->n_token_ids; i++) {
            if (n_out == cap_out) {
                int32_t *nv = realloc(out_ids, (cap_out *= 2) * sizeof *nv);
                if (!nv) break;
                out_ids = nv;
            }
            if (out_ids) out_ids[n_out++] = m->token_ids[i];
        }
        if (o.json) {
            json_message(stdout, m);
            fflush(stdout);
        } else if (!print_ids && m->text[0]) {
            fputs(m->text, stdout);
            fflush(stdout);
            ends_nl = m->text[strlen(m->text) - 1] == '\n';
            wrote_text = 1;
        }
        if (m->finish_reason && o.verbose) {
            size_t k = 0;
            k += (size_t)snprintf(summary + k, sizeof summary - k, "finish_reason=%s",
                                  finish_str(m->finish_reason));
            if (m->matched_stop_case == DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_STRING)
                k += (size_t)snprintf(summary + k, sizeof summary - k, " stop_string=\"%s\"",
                                      m->stop_string);
            if (m->matched_stop_case == DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_TOKEN_ID)
                k += (size_t)snprintf(summary + k, sizeof summary - k, " stop_token_id=%d",
                                      m->stop_token_id);
            if (m->usage && k < sizeof summary)
                k += (size_t)snprintf(summary + k, sizeof summary - k,
                                      " prompt_tokens=%u cached_tokens=%u completion_tokens=%u"
                                      " reasoning_tokens=%u",
                                      m->usage->prompt_tokens, m->usage->cached_tokens,
                                      m->usage->completion_tokens, m->usage->reasoning_tokens);
            if (m->timings && k < sizeof summary)
                k += (size_t)snprintf(summary + k, sizeof summary - k,
                                      " ttft_ms=%.1f total_ms=%.1f mean_itl_ms=%.2f",
                                      m->timings->ttft_ms, m->timings->total_ms,
                                      m->timings->mean_itl_ms);
            if (k < sizeof summary)
                snprintf(summary + k, sizeof summary - k, " seed=%llu served_by=%s request_id=%s",
                         (unsigned long long)m->seed, m->served_by, m->request_id);
        }
        protobuf_c_message_free_unpacked(pm, NULL);
    }
    if (print_ids) {
        fputc('[', stdout);
        for (size_t i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out_ids[i]);
        fputs("]\n", stdout);
    } else if (wrote_text && !ends_nl && (o.verbose || isatty(STDOUT_FILENO))) {
        fputc('\n', stdout); /* end the text's line before a summary or the shell prompt */
    }
    fflush(stdout);
    if (summary[0]) fprintf(stderr, "%s\n", summary);
    free(out_ids);
    const int64_t n_received = rpc_client_stream_n_received(s);
    rpc_client_stream_destroy(s);
    /* no connection: a server speaking the other protocol (TLS or not) is named as such; a
     * failed handshake with a TLS server is a certificate to check */
    const int explained = res.code == GRPC_STATUS_UNAVAILABLE && n_received == 0 &&
                          rpc_client_explain(ch, &res, 1000);
    rpc_client_channel_destroy(ch);
    rpc_auth_destroy(auth);
    free(ids);
    free(stop_ids);
    if (res.code != GRPC_STATUS_OK) {
        const int tls_hint = !explained && tls_on && res.code == GRPC_STATUS_UNAVAILABLE &&
                             n_received == 0;
        fprintf(stderr, "deltaserve client: %s: %s%s\n",
                rpc_status_grpc_name((grpc_status_code)res.code), res.message,
                tls_hint ? " (TLS: no connection; check the server certificate against --tls-ca)"
                         : "");
        return 1;
    }
    return 0;
}
