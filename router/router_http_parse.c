/* The HTTP door's input (router/router_http_parse.h). */
#include "router/router_http_parse.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/router_http.h"
#include "router/router_json.h"
#include "router/router_stop.h"

/* Returns -1, so an error path is one line. */
int router_http_parse_fail(router_http_error *e, unsigned http, const char *type, const char *code,
                           const char *param, const char *fmt, ...)
{
    e->http = http;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

#define BAD(e, param, ...)                                                                         \
    router_http_parse_fail((e), 400, "invalid_request_error", "invalid_value", (param), __VA_ARGS__)

/* ---- input: JSON fields ---- */

/* o[k], with JSON null read as absent. */
static json_object *field(json_object *o, const char *k)
{
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, k, &v) || json_object_is_type(v, json_type_null)) return NULL;
    return v;
}

static int get_num(json_object *o, const char *k, double *out, router_http_error *e)
{
    json_object *v = field(o, k);
    if (!v) return 0;
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return BAD(e, k, "%s: must be a number", k);
    *out = json_object_get_double(v);
    if (!isfinite(*out)) return BAD(e, k, "%s: must be finite", k);
    return 1;
}

static int get_int(json_object *o, const char *k, int64_t lo, int64_t hi, int64_t *out,
                   router_http_error *e)
{
    json_object *v = field(o, k);
    if (!v) return 0;
    double d = json_object_get_double(v);
    if (json_object_is_type(v, json_type_int)) {
        *out = json_object_get_int64(v);
    } else if (json_object_is_type(v, json_type_double) && d == floor(d) && fabs(d) < 9e15) {
        *out = (int64_t)d;
    } else {
        return BAD(e, k, "%s: must be an integer", k);
    }
    if (*out < lo || *out > hi)
        return BAD(e, k, "%s: %lld is outside [%lld, %lld]", k, (long long)*out, (long long)lo,
                   (long long)hi);
    return 1;
}

static int get_bool(json_object *o, const char *k, int *out, router_http_error *e)
{
    json_object *v = field(o, k);
    if (!v) return 0;
    if (!json_object_is_type(v, json_type_boolean)) return BAD(e, k, "%s: must be a boolean", k);
    *out = json_object_get_boolean(v);
    return 1;
}

/* A JSON string as a C string: refused when it holds U+0000 (it would be cut). */
static int str_of(json_object *v, const char *name, const char **s, router_http_error *e)
{
    if (!json_object_is_type(v, json_type_string))
        return BAD(e, name, "%s: must be a string", name);
    *s = json_object_get_string(v);
    if ((size_t)json_object_get_string_len(v) != strlen(*s))
        return BAD(e, name, "%s: contains a NUL character (U+0000)", name);
    return 1;
}

static int get_str(json_object *o, const char *k, const char *name, const char **s,
                   router_http_error *e)
{
    json_object *v = field(o, k);
    if (!v) return 0;
    return str_of(v, name, s, e);
}

static char *sdup(const char *s)
{
    return strdup(s ? s : "");
}

/* ---- input: the Generation request of choice i ---- */

/* content: a string, or an array of {"type":"text","text":...} parts, joined. */
static int message_content(json_object *v, size_t i, char **out, router_http_error *e)
{
    char name[64];
    snprintf(name, sizeof name, "messages[%zu].content", i);
    if (json_object_is_type(v, json_type_string)) {
        const char *s;
        if (str_of(v, name, &s, e) < 0) return -1;
        *out = sdup(s);
        return *out ? 0 : BAD(e, name, "out of memory");
    }
    if (!json_object_is_type(v, json_type_array))
        return BAD(e, name, "%s: must be a string or an array of text parts", name);
    router_json b = {0};
    router_json_raw(&b, "", 0);
    for (size_t j = 0; j < json_object_array_length(v); j++) {
        json_object *part = json_object_array_get_idx(v, j), *t;
        char pn[96];
        snprintf(pn, sizeof pn, "%s[%zu]", name, j);
        const char *type = NULL, *text = NULL;
        if (!json_object_is_type(part, json_type_object) ||
            get_str(part, "type", pn, &type, e) <= 0 || strcmp(type, "text") != 0 ||
            !(t = field(part, "text"))) {
            router_json_free(&b);
            if (e->http == 400) return -1;
            return BAD(e, pn, "%s: only {\"type\": \"text\", \"text\": ...} parts are supported",
                       pn);
        }
        snprintf(pn, sizeof pn, "%s[%zu].text", name, j);
        if (str_of(t, pn, &text, e) < 0) {
            router_json_free(&b);
            return -1;
        }
        router_json_raw(&b, text, strlen(text));
    }
    *out = b.p ? b.p : sdup("");
    return 0;
}

static int parse_message(json_object *o, size_t i, Deltaserve__V1__ChatMessage *m,
                         router_http_error *e)
{
    char name[64];
    snprintf(name, sizeof name, "messages[%zu]", i);
    if (!json_object_is_type(o, json_type_object))
        return BAD(e, name, "%s: must be an object", name);
    const char *s;
    char fn[96];
    snprintf(fn, sizeof fn, "%s.role", name);
    int rc = get_str(o, "role", fn, &s, e);
    if (rc < 0) return -1;
    if (rc == 0) return BAD(e, fn, "%s: required", fn);
    if (!(m->role = sdup(s))) return BAD(e, fn, "out of memory");
    json_object *c = field(o, "content");
    if (c && message_content(c, i, &m->content, e)) return -1;
    static const char *const strs[][2] = {{"reasoning_content", "reasoning_content"},
                                          {"reasoning", "reasoning_content"},
                                          {"tool_call_id", "tool_call_id"},
                                          {"name", "name"}};
    for (size_t k = 0; k < 4; k++) {
        snprintf(fn, sizeof fn, "%s.%s", name, strs[k][0]);
        if ((rc = get_str(o, strs[k][0], fn, &s, e)) < 0) return -1;
        if (!rc) continue;
        char **dst = k < 2 ? &m->reasoning_content : k == 2 ? &m->tool_call_id : &m->name;
        if (*dst != protobuf_c_empty_string) free(*dst);
        if (!(*dst = sdup(s))) return BAD(e, fn, "out of memory");
    }
    json_object *tc = field(o, "tool_calls");
    if (!tc) return 0;
    snprintf(fn, sizeof fn, "%s.tool_calls", name);
    if (!json_object_is_type(tc, json_type_array)) return BAD(e, fn, "%s: must be an array", fn);
    size_t n = json_object_array_length(tc);
    m->tool_calls = calloc(n ? n : 1, sizeof *m->tool_calls);
    if (!m->tool_calls) return BAD(e, fn, "out of memory");
    for (size_t j = 0; j < n; j++) {
        json_object *t = json_object_array_get_idx(tc, j), *f;
        Deltaserve__V1__ToolCall *call = malloc(sizeof *call);
        if (!call) return BAD(e, fn, "out of memory");
        deltaserve__v1__tool_call__init(call);
        m->tool_calls[m->n_tool_calls++] = call;
        char tn[192];
        snprintf(tn, sizeof tn, "%s[%zu].function", fn, j);
        if (!json_object_is_type(t, json_type_object) || !(f = field(t, "function")) ||
            !json_object_is_type(f, json_type_object))
            return BAD(e, tn, "%s: required (an object with name and arguments)", tn);
        snprintf(tn, sizeof tn, "%s[%zu].id", fn, j);
        if ((rc = get_str(t, "id", tn, &s, e)) < 0) return -1;
        if (rc && !(call->id = sdup(s))) return BAD(e, tn, "out of memory");
        snprintf(tn, sizeof tn, "%s[%zu].function.name", fn, j);
        if ((rc = get_str(f, "name", tn, &s, e)) < 0) return -1;
        if (!rc) return BAD(e, tn, "%s: required", tn);
        if (!(call->name = sdup(s))) return BAD(e, tn, "out of memory");
        snprintf(tn, sizeof tn, "%s[%zu].function.arguments", fn, j);
        json_object *a = field(f, "arguments");
        if (a && json_object_is_type(a, json_type_string)) {
            if (str_of(a, tn, &s, e) < 0) return -1;
            call->arguments = sdup(s);
        } else if (a) { /* an object: its JSON text */
            call->arguments = sdup(json_object_to_json_string_ext(a, JSON_C_TO_STRING_PLAIN));
        }
        if (!call->arguments) call->arguments = (char *)protobuf_c_empty_string;
    }
    return 0;
}

static int parse_tools(json_object *req, Deltaserve__V1__ChatPrompt *chat, router_http_error *e)
{
    json_object *choice = field(req, "tool_choice");
    if (choice) {
        const char *s = NULL;
        if (!json_object_is_type(choice, json_type_string) ||
            str_of(choice, "tool_choice", &s, e) < 0 ||
            (strcmp(s, "auto") != 0 && strcmp(s, "none") != 0)) {
            return BAD(e, "tool_choice", "tool_choice: only \"auto\" and \"none\" are supported");
        }
        if (!strcmp(s, "none")) return 0; /* the model is not offered the tools */
    }
    json_object *tools = field(req, "tools");
    if (!tools) return 0;
    if (!json_object_is_type(tools, json_type_array))
        return BAD(e, "tools", "tools: must be an array");
    size_t n = json_object_array_length(tools);
    chat->tools = calloc(n ? n : 1, sizeof *chat->tools);
    if (!chat->tools) return BAD(e, "tools", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *t = json_object_array_get_idx(tools, i), *f;
        char tn[96];
        snprintf(tn, sizeof tn, "tools[%zu].function", i);
        Deltaserve__V1__Tool *tool = malloc(sizeof *tool);
        if (!tool) return BAD(e, "tools", "out of memory");
        deltaserve__v1__tool__init(tool);
        chat->tools[chat->n_tools++] = tool;
        const char *s;
        if (!json_object_is_type(t, json_type_object) || !(f = field(t, "function")) ||
            !json_object_is_type(f, json_type_object))
            return BAD(e, tn, "%s: required (an object with a name)", tn);
        snprintf(tn, sizeof tn, "tools[%zu].function.name", i);
        int rc = get_str(f, "name", tn, &s, e);
        if (rc < 0) return -1;
        if (!rc || !s[0]) return BAD(e, tn, "%s: required", tn);
        if (!(tool->name = sdup(s))) return BAD(e, tn, "out of memory");
        snprintf(tn, sizeof tn, "tools[%zu].function.description", i);
        if ((rc = get_str(f, "description", tn, &s, e)) < 0) return -1;
        if (rc) tool->description = sdup(s);
        json_object *p = field(f, "parameters");
        if (p) tool->parameters = sdup(json_object_to_json_string_ext(p, JSON_C_TO_STRING_PLAIN));
        if (!tool->description) tool->description = (char *)protobuf_c_empty_string;
        if (!tool->parameters) tool->parameters = (char *)protobuf_c_empty_string;
    }
    return 0;
}

static int parse_chat(json_object *req, Deltaserve__V1__GenerateRequest *g, router_http_error *e)
{
    json_object *msgs = field(req, "messages");
    if (!msgs) return BAD(e, "messages", "messages: required");
    if (!json_object_is_type(msgs, json_type_array) || json_object_array_length(msgs) == 0)
        return BAD(e, "messages", "messages: must be a non-empty array");
    Deltaserve__V1__ChatPrompt *chat = malloc(sizeof *chat);
    if (!chat) return BAD(e, "messages", "out of memory");
    deltaserve__v1__chat_prompt__init(chat);
    g->chat = chat;
    g->prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT;
    size_t n = json_object_array_length(msgs);
    chat->messages = calloc(n, sizeof *chat->messages);
    if (!chat->messages) return BAD(e, "messages", "out of memory");
    for (size_t i = 0; i < n; i++) {
        Deltaserve__V1__ChatMessage *m = malloc(sizeof *m);
        if (!m) return BAD(e, "messages", "out of memory");
        deltaserve__v1__chat_message__init(m);
        chat->messages[chat->n_messages++] = m;
        if (parse_message(json_object_array_get_idx(msgs, i), i, m, e)) return -1;
    }
    /* thinking: chat_template_kwargs.enable_thinking, or top-level enable_thinking */
    int think = -1, rc;
    json_object *kw = field(req, "chat_template_kwargs");
    if (kw) {
        if (!json_object_is_type(kw, json_type_object))
            return BAD(e, "chat_template_kwargs", "chat_template_kwargs: must be an object");
        json_object *v = field(kw, "enable_thinking");
        if (v && !json_object_is_type(v, json_type_boolean))
            return BAD(e, "chat_template_kwargs.enable_thinking",
                       "chat_template_kwargs.enable_thinking: must be a boolean");
        if (v) think = json_object_get_boolean(v);
    }
    int t2;
    if ((rc = get_bool(req, "enable_thinking", &t2, e)) < 0) return -1;
    if (rc) think = t2;
    chat->thinking = think < 0 ? DELTASERVE__V1__THINKING__THINKING_DEFAULT
                     : think   ? DELTASERVE__V1__THINKING__THINKING_ON
                               : DELTASERVE__V1__THINKING__THINKING_OFF;
    return parse_tools(req, chat, e);
}

static int parse_prompt(json_object *req, Deltaserve__V1__GenerateRequest *g, router_http_error *e)
{
    json_object *p = field(req, "prompt");
    if (!p) return BAD(e, "prompt", "prompt: required");
    const char *s;
    if (json_object_is_type(p, json_type_array) && json_object_array_length(p) == 1 &&
        json_object_is_type(json_object_array_get_idx(p, 0), json_type_string))
        p = json_object_array_get_idx(p, 0);
    if (json_object_is_type(p, json_type_string)) {
        if (str_of(p, "prompt", &s, e) < 0) return -1;
        if (!(g->text = sdup(s))) return BAD(e, "prompt", "out of memory");
        g->prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
        return 0;
    }
    if (!json_object_is_type(p, json_type_array) || json_object_array_length(p) == 0)
        return BAD(e, "prompt", "prompt: must be a string, or a non-empty array of token ids");
    size_t n = json_object_array_length(p);
    Deltaserve__V1__TokenIds *t = malloc(sizeof *t);
    if (!t) return BAD(e, "prompt", "out of memory");
    deltaserve__v1__token_ids__init(t);
    g->token_ids = t;
    g->prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    if (!(t->ids = malloc(n * sizeof *t->ids))) return BAD(e, "prompt", "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_object *v = json_object_array_get_idx(p, i);
        if (!json_object_is_type(v, json_type_int))
            return BAD(e, "prompt",
                       "prompt[%zu]: a list prompt must hold token ids (one prompt "
                       "per request: several strings are not supported)",
                       i);
        int64_t id = json_object_get_int64(v);
        if (id < 0 || id > INT32_MAX)
            return BAD(e, "prompt", "prompt[%zu]: token id %lld out of range", i, (long long)id);
        t->ids[t->n_ids++] = (int32_t)id;
    }
    return 0;
}

static int parse_stop(json_object *req, Deltaserve__V1__GenerateRequest *g, router_http_error *e)
{
    json_object *v = field(req, "stop");
    if (!v) return 0;
    const char *s;
    if (json_object_is_type(v, json_type_string)) {
        if (str_of(v, "stop", &s, e) < 0) return -1;
        if (!(g->stop = malloc(sizeof *g->stop)) || !(g->stop[0] = sdup(s)))
            return BAD(e, "stop", "out of memory");
        g->n_stop = 1;
        return 0;
    }
    if (!json_object_is_type(v, json_type_array))
        return BAD(e, "stop", "stop: must be a string or an array of strings");
    size_t n = json_object_array_length(v);
    if (n > ROUTER_STOP_MAX)
        return BAD(e, "stop", "stop: %zu strings, at most %d", n, ROUTER_STOP_MAX);
    if (!(g->stop = calloc(n ? n : 1, sizeof *g->stop))) return BAD(e, "stop", "out of memory");
    for (size_t i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "stop[%zu]", i);
        if (str_of(json_object_array_get_idx(v, i), name, &s, e) < 0) return -1;
        if (!(g->stop[g->n_stop] = sdup(s))) return BAD(e, "stop", "out of memory");
        g->n_stop++;
    }
    return 0;
}

/* Fields shared by both endpoints into g (choice i). */
static int parse_common(json_object *req, const router_http_params *hp, int i,
                        Deltaserve__V1__GenerateRequest *g, router_http_error *e)
{
    Deltaserve__V1__SamplingParams *sp = malloc(sizeof *sp);
    Deltaserve__V1__StoppingCriteria *sc = malloc(sizeof *sc);
    if (sp) deltaserve__v1__sampling_params__init(sp);
    if (sc) deltaserve__v1__stopping_criteria__init(sc);
    g->sampling = sp;
    g->stopping = sc;
    if (!sp || !sc) return BAD(e, NULL, "out of memory");
    double d;
    int rc;
    sp->temperature = 1.0f; /* OpenAI's default; 0 = greedy */
    if ((rc = get_num(req, "temperature", &d, e)) < 0) return -1;
    if (rc) sp->temperature = (float)d;
    static const struct {
        const char *k;
        size_t off;
    } nums[] = {
        {"top_p", offsetof(Deltaserve__V1__SamplingParams, top_p)},
        {"min_p", offsetof(Deltaserve__V1__SamplingParams, min_p)},
        {"presence_penalty", offsetof(Deltaserve__V1__SamplingParams, presence_penalty)},
        {"frequency_penalty", offsetof(Deltaserve__V1__SamplingParams, frequency_penalty)},
        {"repetition_penalty", offsetof(Deltaserve__V1__SamplingParams, repetition_penalty)},
    };
    for (size_t k = 0; k < sizeof nums / sizeof nums[0]; k++) {
        if ((rc = get_num(req, nums[k].k, &d, e)) < 0) return -1;
        if (rc) *(float *)((char *)sp + nums[k].off) = (float)d;
    }
    int64_t v;
    if ((rc = get_int(req, "top_k", -1, INT32_MAX, &v, e)) < 0) return -1;
    if (rc) sp->top_k = v < 0 ? 0 : (int32_t)v; /* -1: no filter, as vLLM */
    if ((rc = get_int(req, "seed", INT64_MIN, INT64_MAX, &v, e)) < 0) return -1;
    if (rc) sp->seed = (uint64_t)v + (uint64_t)i;
    const char *mt = hp->kind == ROUTER_HTTP_CHAT && field(req, "max_completion_tokens")
                         ? "max_completion_tokens"
                         : "max_tokens";
    if ((rc = get_int(req, mt, 1, UINT32_MAX, &v, e)) < 0) return -1;
    if (rc) sc->max_new_tokens = (uint32_t)v;
    int b;
    if ((rc = get_bool(req, "ignore_eos", &b, e)) < 0) return -1;
    if (rc) sc->ignore_eos = b;
    if ((rc = get_bool(req, "speculative", &b, e)) < 0) return -1;
    if (rc) g->no_speculation = !b;
    if (parse_stop(req, g, e)) return -1;
    g->logprobs = hp->lp_top < 0 ? 0 : (uint32_t)(hp->lp_top ? hp->lp_top : 1);
    return 0;
}

/* The request of choice i, or NULL with e set. */
Deltaserve__V1__GenerateRequest *router_http_parse_request(json_object *req,
                                                           const router_http_params *hp,
                                                           const char *id, int i,
                                                           router_http_error *e)
{
    Deltaserve__V1__GenerateRequest *g = malloc(sizeof *g);
    if (!g) {
        (void)BAD(e, NULL, "out of memory");
        return NULL;
    }
    deltaserve__v1__generate_request__init(g);
    char rid[96];
    snprintf(rid, sizeof rid, "%s-%d", id, i);
    g->request_id = sdup(rid);
    int rc = !g->request_id                 ? BAD(e, NULL, "out of memory")
             : hp->kind == ROUTER_HTTP_CHAT ? parse_chat(req, g, e)
                                            : parse_prompt(req, g, e);
    if (!rc) rc = parse_common(req, hp, i, g, e);
    if (rc) {
        protobuf_c_message_free_unpacked(&g->base, NULL);
        return NULL;
    }
    return g;
}

/* Checks that do not depend on the choice: model, n, stream, logprobs, unsupported fields. */
int router_http_parse_params(json_object *req, router_http_kind kind, const char *model_id,
                             router_http_params *hp, router_http_error *e)
{
    memset(hp, 0, sizeof *hp);
    hp->kind = kind;
    hp->n = 1;
    hp->lp_top = -1;
    const char *s;
    int rc, b;
    int64_t v;
    if ((rc = get_str(req, "model", "model", &s, e)) < 0) return -1;
    if (rc && strcmp(s, model_id) != 0) {
        router_http_parse_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                               "model: '%s' is not served here (this router serves '%s')", s,
                               model_id);
        return -1;
    }
    if ((rc = get_str(req, "user", "user", &s, e)) < 0) return -1;
    if ((rc = get_int(req, "n", 1, ROUTER_HTTP_MAX_N, &v, e)) < 0) return -1;
    if (rc) hp->n = (int)v;
    if ((rc = get_bool(req, "stream", &b, e)) < 0) return -1;
    if (rc) hp->stream = b;
    json_object *so = field(req, "stream_options");
    if (so) {
        if (!json_object_is_type(so, json_type_object))
            return BAD(e, "stream_options", "stream_options: must be an object");
        json_object *iu = field(so, "include_usage");
        if (iu && !json_object_is_type(iu, json_type_boolean))
            return BAD(e, "stream_options.include_usage",
                       "stream_options.include_usage: must be a boolean");
        hp->include_usage = iu && json_object_get_boolean(iu);
    }
    if (kind == ROUTER_HTTP_CHAT) {
        int lp = 0;
        if ((rc = get_bool(req, "logprobs", &lp, e)) < 0) return -1;
        if ((rc = get_int(req, "top_logprobs", 0, 20, &v, e)) < 0) return -1;
        if (rc && !lp) return BAD(e, "top_logprobs", "top_logprobs: needs logprobs: true");
        if (lp) hp->lp_top = rc ? (int)v : 0;
        json_object *rf = field(req, "response_format"), *t;
        if (rf && (!json_object_is_type(rf, json_type_object) || !(t = field(rf, "type")) ||
                   !json_object_is_type(t, json_type_string) ||
                   strcmp(json_object_get_string(t), "text") != 0))
            return BAD(e, "response_format",
                       "response_format: only {\"type\": \"text\"} is "
                       "supported");
    } else {
        if ((rc = get_int(req, "logprobs", 0, 20, &v, e)) < 0) return -1;
        if (rc) hp->lp_top = (int)v;
        if ((rc = get_bool(req, "echo", &b, e)) < 0) return -1;
        if (rc && b) return BAD(e, "echo", "echo: not supported");
        if ((rc = get_str(req, "suffix", "suffix", &s, e)) < 0) return -1;
        if (rc && s[0]) return BAD(e, "suffix", "suffix: not supported");
        if ((rc = get_int(req, "best_of", 1, ROUTER_HTTP_MAX_N, &v, e)) < 0) return -1;
        if (rc && v != hp->n) return BAD(e, "best_of", "best_of: only equal to n is supported");
    }
    return 0;
}
