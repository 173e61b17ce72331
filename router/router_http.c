/* The HTTP door (router/router_http.h): the daemon, routing, auth and admission, the request
 * parsed into Generation requests, and the response (one JSON body, or SSE chunks written by
 * the relays' sinks). Output is written with router_json, input read with json-c. */
#include "router/router_http.h"
#include "router/router_http_parse.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <grpc/status.h>
#include <json-c/json.h>
#include <microhttpd.h>

#include "common/log.h"
#include "router/router_internal.h"
#include "router/router_json.h"
#include "router/router_request.h"
#include "router/router_stop.h"
#include "rpc/rpc_status.h"
#include "rpc/rpc_tls.h"

struct router_http {
    router *r;                 /* borrowed */
    struct MHD_Daemon *daemon; /* owned; a thread per connection */
    int port;
    char *tls_cert, *tls_key; /* owned PEM text, or NULL (plaintext) */
    pthread_mutex_t mu;       /* guards live and stopping */
    pthread_cond_t cv;        /* a request left live */
    struct http_req *live;    /* requests whose relays may run */
    int stopping;
};

struct http_req;

/* One choice: its relay and what it said. Touched by its relay's steps (the sink) and, after
 * the relay ended, by the connection thread. */
typedef struct http_choice {
    struct http_req *h;
    int index;
    router_req *q; /* reference held, NULL if never created */
    int started;   /* first message or end seen (under h->mu) */
    int sent;      /* messages seen */
    int ended;
    int code; /* gRPC status of the end */
    char msg[600];
    int finish; /* proto FinishReason of the final message */
    int n_tool_calls;
    uint32_t prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens;
    int64_t text_bytes;                 /* bytes of text so far (completions' text_offset) */
    router_json chunk;                  /* owned: one SSE event being written */
    router_json lp_a, lp_b, lp_c, lp_d; /* owned: logprob fragments (chat: a; completions: a-d) */
    router_json content, reasoning, tools; /* owned: the whole answer (non-streaming) */
} http_choice;

typedef struct http_req {
    router_http *d;
    router_http_kind kind;
    int stream, include_usage, n;
    int lp_top; /* alternatives printed per token; -1: no logprobs */
    char id[64];
    int64_t created;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_started, n_ended;
    int streaming;   /* the 200 SSE response was queued: ends append the tail */
    int done;        /* the tail ([DONE]) is in out */
    int gone;        /* client gone or door stopping */
    router_json out; /* owned: SSE bytes not yet read by the daemon, from out_pos */
    size_t out_pos;
    atomic_int refs;              /* the connection + one per relay until its sink's end */
    struct http_req *prev, *next; /* d->live */
    http_choice c[];
} http_req;

/* Per connection request (MHD's con_cls). */
typedef struct http_conn {
    char *body; /* owned, [cap] */
    size_t len, cap;
    int too_big;
    http_req *h; /* one reference, or NULL */
} http_conn;

/* ---- errors ---- */

/* The OpenAI parameter a relay message names ("sampling.temperature: must be ...",
 * "stop[1]: ...", "text: ..."). */
static void param_of(const char *msg, router_http_kind kind, char *out, size_t cap)
{
    if (!strncmp(msg, "request ", 8) && strstr(msg, ": "))
        msg = strstr(msg, ": ") + 2; /* worker's */
    size_t n = strcspn(msg, ":[ ");
    if (msg[n] != ':' && msg[n] != '[') {
        out[0] = 0;
        return;
    }
    char f[96];
    snprintf(f, sizeof f, "%.*s", (int)(n < sizeof f ? n : sizeof f - 1), msg);
    const char *p = f;
    if (!strncmp(p, "sampling.", 9))
        p += 9;
    else if (!strncmp(p, "stopping.", 9))
        p += 9;
    static const char *const map[][2] = {
        {"max_new_tokens", "max_tokens"}, {"text", "prompt"},         {"token_ids.ids", "prompt"},
        {"chat.messages", "messages"},    {"chat", "messages"},       {"prompt", "prompt"},
        {"request_id", "user"},           {"stop_token_ids", "stop"},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(p, map[i][0])) {
            p = map[i][1];
            break;
        }
    if (!strcmp(p, "logprobs") && kind == ROUTER_HTTP_CHAT) p = "top_logprobs";
    snprintf(out, cap, "%s", p);
}

/* A relay's end status as an HTTP error. */
static void herr_from_grpc(router_http_error *e, int code, const char *msg, router_http_kind kind)
{
    char param[96] = "";
    switch (code) {
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE:
    case GRPC_STATUS_FAILED_PRECONDITION:
        param_of(msg, kind, param, sizeof param);
        router_http_parse_fail(e, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
        break;
    case GRPC_STATUS_UNAUTHENTICATED:
        router_http_parse_fail(e, 401, "authentication_error", "invalid_api_key", NULL, "%s", msg);
        break;
    case GRPC_STATUS_NOT_FOUND:
        router_http_parse_fail(e, 404, "not_found_error", "not_found", NULL, "%s", msg);
        break;
    case GRPC_STATUS_RESOURCE_EXHAUSTED:
        router_http_parse_fail(e, 429, "rate_limit_error", "resource_exhausted", NULL, "%s", msg);
        break;
    case GRPC_STATUS_UNAVAILABLE:
        router_http_parse_fail(e, 503, "service_unavailable", "unavailable", NULL, "%s", msg);
        break;
    case GRPC_STATUS_DEADLINE_EXCEEDED:
        router_http_parse_fail(e, 504, "timeout", "deadline_exceeded", NULL, "%s", msg);
        break;
    case GRPC_STATUS_CANCELLED:
        router_http_parse_fail(e, 499, "cancelled", "cancelled", NULL, "%s", msg);
        break;
    default:
        router_http_parse_fail(e, 500, "server_error", "internal", NULL, "%s", msg);
    }
}

static void write_error_obj(router_json *b, const router_http_error *e)
{
    router_json_lit(b, "{\"error\":{\"message\":");
    router_json_str(b, e->msg, strlen(e->msg));
    router_json_lit(b, ",\"type\":");
    router_json_str(b, e->type, strlen(e->type));
    router_json_lit(b, ",\"param\":");
    if (e->param[0])
        router_json_str(b, e->param, strlen(e->param));
    else
        router_json_lit(b, "null");
    router_json_lit(b, ",\"code\":");
    if (e->code)
        router_json_str(b, e->code, strlen(e->code));
    else
        router_json_lit(b, "null");
    router_json_lit(b, "}}");
}

static enum MHD_Result reply_json(struct MHD_Connection *conn, unsigned http, router_json *b)
{
    if (b->oom) return MHD_NO;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(b->len, b->p ? b->p : (void *)"", MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    enum MHD_Result rc = MHD_queue_response(conn, http, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result reply_error(struct MHD_Connection *conn, const router_http_error *e)
{
    router_json b = {0};
    write_error_obj(&b, e);
    struct MHD_Response *resp =
        b.oom ? NULL : MHD_create_response_from_buffer(b.len, b.p, MHD_RESPMEM_MUST_COPY);
    router_json_free(&b);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (e->http == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    if (e->http == 405) MHD_add_response_header(resp, "Allow", e->param[0] ? "GET" : "POST");
    enum MHD_Result rc = MHD_queue_response(conn, e->http, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* ---- request lifetime ---- */

static void choice_free(http_choice *c)
{
    router_json *bufs[] = {&c->chunk, &c->lp_a,    &c->lp_b,      &c->lp_c,
                           &c->lp_d,  &c->content, &c->reasoning, &c->tools};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        router_json_free(bufs[i]);
    if (c->q) router_relay_unref(c->q);
}

static void http_req_unref(http_req *h)
{
    if (atomic_fetch_sub(&h->refs, 1) != 1) return;
    router_http *d = h->d;
    router *r = d->r;
    pthread_mutex_lock(&d->mu);
    if (h->prev)
        h->prev->next = h->next;
    else
        d->live = h->next;
    if (h->next) h->next->prev = h->prev;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu); /* d may be freed from here (router_http_stop) */
    for (int i = 0; i < h->n; i++)
        choice_free(&h->c[i]);
    router_json_free(&h->out);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
    pthread_mutex_lock(&r->mu);
    r->inflight--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The client is gone (or the door stops): every relay is cancelled. */
static void http_req_cancel(http_req *h)
{
    pthread_mutex_lock(&h->mu);
    h->gone = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    for (int i = 0; i < h->n; i++)
        if (h->c[i].q) router_relay_cancel(h->c[i].q);
}

/* ---- output: chunks and bodies ---- */

/* OpenAI's finish_reason. A chat answer that called a tool ends with "tool_calls" whether the
 * model then stopped or hit max_tokens (the calls are complete; vLLM does the same). */
static const char *finish_name(const http_choice *c)
{
    int tools = c->h->kind == ROUTER_HTTP_CHAT && c->n_tool_calls;
    switch (c->finish) {
    case DELTASERVE__V1__FINISH_REASON__FINISH_REASON_STOP:
        return tools ? "tool_calls" : "stop";
    case DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH:
        return tools ? "tool_calls" : "length";
    case DELTASERVE__V1__FINISH_REASON__FINISH_REASON_CANCELLED:
        return "abort";
    default:
        return "error";
    }
}

static void write_token(router_json *b, const tokenizer *tok, int32_t id, int with_bytes)
{
    size_t n = 0;
    const uint8_t *p = tok ? tokenizer_token_bytes(tok, id, &n) : NULL;
    router_json_lit(b, "\"token\":");
    router_json_str(b, p ? (const char *)p : "", p ? n : 0);
    if (!with_bytes) return;
    router_json_lit(b, ",\"bytes\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) router_json_raw(b, ",", 1);
        router_json_i64(b, p[i]);
    }
    router_json_raw(b, "]", 1);
}

/* Chat logprob entries of m's tokens, comma-separated, appended to b (after existing ones). */
static void write_lp_chat(router_json *b, const http_choice *c,
                          const Deltaserve__V1__GenerateResponse *m)
{
    const tokenizer *tok = c->h->d->r->tok;
    size_t n = m->n_logprobs < m->n_token_ids ? m->n_logprobs : m->n_token_ids;
    for (size_t i = 0; i < n; i++) {
        const Deltaserve__V1__TokenLogprob *lp = m->logprobs[i];
        if (b->len) router_json_raw(b, ",", 1);
        router_json_raw(b, "{", 1);
        write_token(b, tok, m->token_ids[i], 1);
        router_json_lit(b, ",\"logprob\":");
        router_json_f(b, lp->logprob);
        router_json_lit(b, ",\"top_logprobs\":[");
        for (size_t j = 0; j < lp->n_top && (int)j < c->h->lp_top; j++) {
            if (j) router_json_raw(b, ",", 1);
            router_json_raw(b, "{", 1);
            write_token(b, tok, lp->top[j]->token_id, 1);
            router_json_lit(b, ",\"logprob\":");
            router_json_f(b, lp->top[j]->logprob);
            router_json_raw(b, "}", 1);
        }
        router_json_lit(b, "]}");
    }
}

/* Completions logprobs of m's tokens: a tokens, b token_logprobs, cc top_logprobs, dd
 * text_offset (comma-separated elements, appended). base: text bytes before m. */
static void write_lp_cmpl(http_choice *c, const Deltaserve__V1__GenerateResponse *m, int64_t base)
{
    const tokenizer *tok = c->h->d->r->tok;
    size_t n = m->n_logprobs < m->n_token_ids ? m->n_logprobs : m->n_token_ids;
    int64_t off = base;
    for (size_t i = 0; i < n; i++) {
        const Deltaserve__V1__TokenLogprob *lp = m->logprobs[i];
        size_t nb = 0;
        const uint8_t *p = tok ? tokenizer_token_bytes(tok, m->token_ids[i], &nb) : NULL;
        if (c->lp_a.len) {
            router_json_raw(&c->lp_a, ",", 1);
            router_json_raw(&c->lp_b, ",", 1);
            router_json_raw(&c->lp_c, ",", 1);
            router_json_raw(&c->lp_d, ",", 1);
        }
        router_json_str(&c->lp_a, p ? (const char *)p : "", p ? nb : 0);
        router_json_f(&c->lp_b, lp->logprob);
        router_json_raw(&c->lp_c, "{", 1);
        for (size_t j = 0; j < lp->n_top && (int)j < c->h->lp_top; j++) {
            size_t tn = 0;
            const uint8_t *tp = tok ? tokenizer_token_bytes(tok, lp->top[j]->token_id, &tn) : NULL;
            if (j) router_json_raw(&c->lp_c, ",", 1);
            router_json_str(&c->lp_c, tp ? (const char *)tp : "", tp ? tn : 0);
            router_json_raw(&c->lp_c, ":", 1);
            router_json_f(&c->lp_c, lp->top[j]->logprob);
        }
        router_json_raw(&c->lp_c, "}", 1);
        router_json_i64(&c->lp_d, off);
        off += (int64_t)nb;
    }
}

static void write_lp_cmpl_obj(router_json *b, const http_choice *c)
{
    router_json_lit(b, "{\"tokens\":[");
    router_json_raw(b, c->lp_a.p ? c->lp_a.p : "", c->lp_a.len);
    router_json_lit(b, "],\"token_logprobs\":[");
    router_json_raw(b, c->lp_b.p ? c->lp_b.p : "", c->lp_b.len);
    router_json_lit(b, "],\"top_logprobs\":[");
    router_json_raw(b, c->lp_c.p ? c->lp_c.p : "", c->lp_c.len);
    router_json_lit(b, "],\"text_offset\":[");
    router_json_raw(b, c->lp_d.p ? c->lp_d.p : "", c->lp_d.len);
    router_json_lit(b, "]}");
}

static void write_tool_calls(router_json *b, const Deltaserve__V1__GenerateResponse *m, int first,
                             int with_index)
{
    for (size_t i = 0; i < m->n_tool_calls; i++) {
        const Deltaserve__V1__ToolCall *t = m->tool_calls[i];
        if (i || b->len > 0) router_json_raw(b, ",", 1);
        router_json_raw(b, "{", 1);
        if (with_index) {
            router_json_lit(b, "\"index\":");
            router_json_i64(b, first + (int)i);
            router_json_raw(b, ",", 1);
        }
        router_json_lit(b, "\"id\":");
        router_json_str(b, t->id, strlen(t->id));
        router_json_lit(b, ",\"type\":\"function\",\"function\":{\"name\":");
        router_json_str(b, t->name, strlen(t->name));
        router_json_lit(b, ",\"arguments\":");
        router_json_str(b, t->arguments, strlen(t->arguments));
        router_json_lit(b, "}}");
    }
}

static void write_usage(router_json *b, const http_req *h)
{
    uint32_t prompt = 0, completion = 0, cached = 0, reasoning = 0;
    for (int i = 0; i < h->n; i++) {
        const http_choice *c = &h->c[i];
        if (c->prompt_tokens > prompt) prompt = c->prompt_tokens;
        if (c->cached_tokens > cached) cached = c->cached_tokens;
        completion += c->completion_tokens;
        reasoning += c->reasoning_tokens;
    }
    router_json_lit(b, "{\"prompt_tokens\":");
    router_json_i64(b, prompt);
    router_json_lit(b, ",\"completion_tokens\":");
    router_json_i64(b, completion);
    router_json_lit(b, ",\"total_tokens\":");
    router_json_i64(b, (int64_t)prompt + completion);
    router_json_lit(b, ",\"prompt_tokens_details\":{\"cached_tokens\":");
    router_json_i64(b, cached);
    router_json_lit(b, "},\"completion_tokens_details\":{\"reasoning_tokens\":");
    router_json_i64(b, reasoning);
    router_json_lit(b, "}}");
}

static void write_head(router_json *b, const http_req *h, const char *object)
{
    router_json_lit(b, "{\"id\":");
    router_json_str(b, h->id, strlen(h->id));
    router_json_lit(b, ",\"object\":\"");
    router_json_lit(b, object);
    router_json_lit(b, "\",\"created\":");
    router_json_i64(b, h->created);
    router_json_lit(b, ",\"model\":");
    router_json_str(b, h->d->r->model_id, strlen(h->d->r->model_id));
}

/* One SSE event for message m of choice c, into c->chunk. */
static void write_chunk(http_choice *c, const Deltaserve__V1__GenerateResponse *m, int64_t base)
{
    http_req *h = c->h;
    router_json *b = &c->chunk;
    router_json_reset(b);
    router_json_lit(b, "data: ");
    write_head(b, h, h->kind == ROUTER_HTTP_CHAT ? "chat.completion.chunk" : "text_completion");
    router_json_lit(b, ",\"choices\":[{\"index\":");
    router_json_i64(b, c->index);
    if (h->kind == ROUTER_HTTP_CHAT) {
        router_json_lit(b, ",\"delta\":{");
        int any = 0;
        if (c->sent == 1) {
            router_json_lit(b, "\"role\":\"assistant\"");
            any = 1;
        }
        if (m->text[0] || c->sent == 1) {
            router_json_lit(b, any ? ",\"content\":" : "\"content\":");
            router_json_str(b, m->text, strlen(m->text));
            any = 1;
        }
        if (m->reasoning && m->reasoning[0]) {
            router_json_lit(b, any ? ",\"reasoning_content\":" : "\"reasoning_content\":");
            router_json_str(b, m->reasoning, strlen(m->reasoning));
            any = 1;
        }
        if (m->n_tool_calls) {
            router_json_lit(b, any ? ",\"tool_calls\":[" : "\"tool_calls\":[");
            for (size_t i = 0; i < m->n_tool_calls; i++) {
                if (i) router_json_raw(b, ",", 1);
                router_json_lit(b, "{\"index\":");
                router_json_i64(b, c->n_tool_calls - (int)m->n_tool_calls + (int)i);
                router_json_lit(b, ",\"id\":");
                router_json_str(b, m->tool_calls[i]->id, strlen(m->tool_calls[i]->id));
                router_json_lit(b, ",\"type\":\"function\",\"function\":{\"name\":");
                router_json_str(b, m->tool_calls[i]->name, strlen(m->tool_calls[i]->name));
                router_json_lit(b, ",\"arguments\":");
                router_json_str(b, m->tool_calls[i]->arguments,
                                strlen(m->tool_calls[i]->arguments));
                router_json_lit(b, "}}");
            }
            router_json_raw(b, "]", 1);
        }
        router_json_lit(b, "},\"logprobs\":");
        if (h->lp_top >= 0 && m->n_logprobs) {
            router_json_reset(&c->lp_a);
            write_lp_chat(&c->lp_a, c, m);
            router_json_lit(b, "{\"content\":[");
            router_json_raw(b, c->lp_a.p ? c->lp_a.p : "", c->lp_a.len);
            router_json_lit(b, "]}");
        } else {
            router_json_lit(b, "null");
        }
    } else {
        router_json_lit(b, ",\"text\":");
        router_json_str(b, m->text, strlen(m->text));
        router_json_lit(b, ",\"logprobs\":");
        if (h->lp_top >= 0 && m->n_logprobs) {
            router_json_reset(&c->lp_a);
            router_json_reset(&c->lp_b);
            router_json_reset(&c->lp_c);
            router_json_reset(&c->lp_d);
            write_lp_cmpl(c, m, base);
            write_lp_cmpl_obj(b, c);
        } else {
            router_json_lit(b, "null");
        }
    }
    router_json_lit(b, ",\"finish_reason\":");
    if (m->finish_reason) {
        router_json_raw(b, "\"", 1);
        router_json_lit(b, finish_name(c));
        router_json_raw(b, "\"", 1);
    } else {
        router_json_lit(b, "null");
    }
    router_json_lit(b, "}]");
    if (h->include_usage) router_json_lit(b, ",\"usage\":null");
    router_json_lit(b, "}\n\n");
}

/* The end of the stream, into h->out (h->mu held): the usage chunk when asked, [DONE]. */
static void write_tail(http_req *h)
{
    if (h->include_usage) {
        router_json_lit(&h->out, "data: ");
        write_head(&h->out, h,
                   h->kind == ROUTER_HTTP_CHAT ? "chat.completion.chunk" : "text_completion");
        router_json_lit(&h->out, ",\"choices\":[],\"usage\":");
        write_usage(&h->out, h);
        router_json_lit(&h->out, "}\n\n");
    }
    router_json_lit(&h->out, "data: [DONE]\n\n");
    h->done = 1;
}

/* ---- the sink (the relay's steps, under its mutex) ---- */

static int sink_send(void *ctx, const Deltaserve__V1__GenerateResponse *m)
{
    http_choice *c = ctx;
    http_req *h = c->h;
    c->sent++;
    c->completion_tokens += (uint32_t)m->n_token_ids;
    c->n_tool_calls += (int)m->n_tool_calls;
    if (m->finish_reason) {
        c->finish = m->finish_reason;
        if (m->usage) {
            c->prompt_tokens = m->usage->prompt_tokens;
            c->completion_tokens = m->usage->completion_tokens;
            c->cached_tokens = m->usage->cached_tokens;
            c->reasoning_tokens = m->usage->reasoning_tokens;
        }
    }
    int64_t base = c->text_bytes;
    c->text_bytes += (int64_t)strlen(m->text);
    int oom;
    if (h->stream) {
        write_chunk(c, m, base);
        oom = c->chunk.oom;
    } else {
        router_json_raw(&c->content, m->text, strlen(m->text));
        if (m->reasoning) router_json_raw(&c->reasoning, m->reasoning, strlen(m->reasoning));
        if (m->n_tool_calls) write_tool_calls(&c->tools, m, 0, 0);
        if (h->lp_top >= 0) {
            if (h->kind == ROUTER_HTTP_CHAT)
                write_lp_chat(&c->lp_a, c, m);
            else
                write_lp_cmpl(c, m, base);
        }
        oom = c->content.oom || c->reasoning.oom || c->tools.oom || c->lp_a.oom || c->lp_b.oom ||
              c->lp_c.oom || c->lp_d.oom;
    }
    pthread_mutex_lock(&h->mu);
    int gone = h->gone;
    if (!gone && h->stream && !oom) {
        router_json_raw(&h->out, c->chunk.p, c->chunk.len);
        oom = h->out.oom;
    }
    if (!c->started) {
        c->started = 1;
        h->n_started++;
    }
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return gone ? STATUS_CANCELLED : oom ? STATUS_NOMEM : STATUS_OK;
}

static void sink_end(void *ctx, int code, const char *msg)
{
    http_choice *c = ctx;
    http_req *h = c->h;
    pthread_mutex_lock(&h->mu);
    c->ended = 1;
    c->code = code;
    snprintf(c->msg, sizeof c->msg, "%s", msg ? msg : "");
    if (!c->started) {
        c->started = 1;
        h->n_started++;
    }
    h->n_ended++;
    if (h->streaming && !h->gone) {
        if (code != GRPC_STATUS_OK) { /* mid-stream: an error event, then the stream ends */
            router_http_error e;
            herr_from_grpc(&e, code, c->msg, h->kind);
            router_json_lit(&h->out, "data: ");
            write_error_obj(&h->out, &e);
            router_json_lit(&h->out, "\n\n");
        }
        if (h->n_ended == h->n) write_tail(h);
    }
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    http_req_unref(h);
}

/* ---- the generation endpoints ---- */

/* Deadline from "X-Request-Timeout" (seconds), else OpenAI clients' "X-Stainless-Timeout". */
static int64_t request_deadline(struct MHD_Connection *conn)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Request-Timeout");
    if (!v) v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "X-Stainless-Timeout");
    if (!v) return CLOCK_NO_DEADLINE;
    char *end;
    errno = 0;
    double s = strtod(v, &end);
    if (errno || end == v || !(s > 0) || s > 1e7) return CLOCK_NO_DEADLINE;
    return clock_deadline_ms((int64_t)ceil(s * 1000.0));
}

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    http_req *h = cls;
    (void)pos;
    pthread_mutex_lock(&h->mu);
    while (h->out_pos == h->out.len && !h->done && !h->gone)
        pthread_cond_wait(&h->cv, &h->mu);
    size_t avail = h->out.len - h->out_pos;
    if (avail == 0) {
        int err = h->gone && !h->done;
        pthread_mutex_unlock(&h->mu);
        return err ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
    }
    size_t n = avail < max ? avail : max;
    memcpy(buf, h->out.p + h->out_pos, n);
    h->out_pos += n;
    if (h->out_pos == h->out.len) { /* drained: the buffer is reused from its start */
        h->out.len = 0;
        h->out_pos = 0;
    }
    pthread_mutex_unlock(&h->mu);
    return (ssize_t)n;
}

/* The first error among the ended choices, or NULL. */
static const http_choice *first_error(const http_req *h, int only_unsent)
{
    for (int i = 0; i < h->n; i++)
        if (h->c[i].ended && h->c[i].code != GRPC_STATUS_OK && (!only_unsent || !h->c[i].sent))
            return &h->c[i];
    return NULL;
}

static enum MHD_Result reply_body(struct MHD_Connection *conn, http_req *h)
{
    router_json b = {0};
    write_head(&b, h, h->kind == ROUTER_HTTP_CHAT ? "chat.completion" : "text_completion");
    router_json_lit(&b, ",\"choices\":[");
    for (int i = 0; i < h->n; i++) {
        http_choice *c = &h->c[i];
        if (i) router_json_raw(&b, ",", 1);
        router_json_lit(&b, "{\"index\":");
        router_json_i64(&b, i);
        if (h->kind == ROUTER_HTTP_CHAT) {
            router_json_lit(&b, ",\"message\":{\"role\":\"assistant\",\"content\":");
            if (c->content.len || !c->n_tool_calls)
                router_json_str(&b, c->content.p ? c->content.p : "", c->content.len);
            else
                router_json_lit(&b, "null");
            if (c->reasoning.len) {
                router_json_lit(&b, ",\"reasoning_content\":");
                router_json_str(&b, c->reasoning.p, c->reasoning.len);
            }
            if (c->tools.len) {
                router_json_lit(&b, ",\"tool_calls\":[");
                router_json_raw(&b, c->tools.p, c->tools.len);
                router_json_raw(&b, "]", 1);
            }
            router_json_lit(&b, "},\"logprobs\":");
            if (h->lp_top >= 0) {
                router_json_lit(&b, "{\"content\":[");
                router_json_raw(&b, c->lp_a.p ? c->lp_a.p : "", c->lp_a.len);
                router_json_lit(&b, "]}");
            } else {
                router_json_lit(&b, "null");
            }
        } else {
            router_json_lit(&b, ",\"text\":");
            router_json_str(&b, c->content.p ? c->content.p : "", c->content.len);
            router_json_lit(&b, ",\"logprobs\":");
            if (h->lp_top >= 0)
                write_lp_cmpl_obj(&b, c);
            else
                router_json_lit(&b, "null");
        }
        router_json_lit(&b, ",\"finish_reason\":\"");
        router_json_lit(&b, finish_name(c));
        router_json_lit(&b, "\"}");
    }
    router_json_lit(&b, "],\"usage\":");
    write_usage(&b, h);
    router_json_raw(&b, "}", 1);
    enum MHD_Result rc = reply_json(conn, 200, &b);
    router_json_free(&b);
    return rc;
}

/* Admission, the relays, and the response. */
static enum MHD_Result serve_generate(router_http *d, struct MHD_Connection *conn, http_conn *hc,
                                      router_http_kind kind)
{
    router *r = d->r;
    router_http_error e;
    memset(&e, 0, sizeof e);
    if (hc->too_big) {
        router_http_parse_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                               "request body larger than %u bytes", ROUTER_HTTP_MAX_BODY);
        return reply_error(conn, &e);
    }
    struct json_tokener *tk = json_tokener_new();
    if (!tk) return MHD_NO;
    json_object *req = json_tokener_parse_ex(tk, hc->body ? hc->body : "", (int)hc->len);
    enum json_tokener_error jerr = json_tokener_get_error(tk);
    size_t used = json_tokener_get_parse_end(tk);
    json_tokener_free(tk);
    while (used < hc->len && hc->body[used] && strchr(" \t\r\n", hc->body[used]))
        used++; /* trailing white space */
    if (!req || jerr != json_tokener_success || used != hc->len) {
        json_object_put(req);
        router_http_parse_fail(&e, 400, "invalid_request_error", "invalid_json", NULL,
                               "the body is not valid JSON: %s",
                               jerr == json_tokener_continue  ? "it ends in the middle of a value"
                               : jerr != json_tokener_success ? json_tokener_error_desc(jerr)
                                                              : "unexpected data after the value");
        return reply_error(conn, &e);
    }
    router_http_params hp;
    http_req *h = NULL;
    Deltaserve__V1__GenerateRequest *gs[ROUTER_HTTP_MAX_N] = {0};
    if (!json_object_is_type(req, json_type_object)) {
        (void)router_http_parse_fail(&e, 400, "invalid_request_error", "invalid_value", NULL,
                                     "the body must be a JSON object");
        goto fail;
    }
    if (router_http_parse_params(req, kind, d->r->model_id, &hp, &e)) goto fail;
    for (int i = 0; i < hp.n; i++)
        if (!(gs[i] = router_http_parse_request(req, &hp, "x", i, &e))) goto fail;

    /* admission: the gRPC side's */
    atomic_fetch_add(&r->n_requests, 1);
    pthread_mutex_lock(&r->mu);
    if (r->draining) {
        pthread_mutex_unlock(&r->mu);
        router_http_parse_fail(&e, 503, "service_unavailable", "unavailable", NULL,
                               "router is draining");
        goto fail;
    }
    if (r->inflight >= r->opts.max_inflight) {
        pthread_mutex_unlock(&r->mu);
        router_http_parse_fail(&e, 429, "rate_limit_error", "resource_exhausted", NULL,
                               "router: %d requests in flight (--max-inflight)",
                               r->opts.max_inflight);
        goto fail;
    }
    r->inflight++; /* until the request is freed */
    pthread_mutex_unlock(&r->mu);

    h = calloc(1, sizeof *h + (size_t)hp.n * sizeof h->c[0]);
    if (!h) {
        pthread_mutex_lock(&r->mu);
        r->inflight--;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        router_http_parse_fail(&e, 500, "server_error", "internal", NULL, "router: out of memory");
        goto fail;
    }
    h->d = d;
    h->kind = kind;
    h->stream = hp.stream;
    h->include_usage = hp.stream && hp.include_usage;
    h->n = hp.n;
    h->lp_top = hp.lp_top;
    h->created = (int64_t)time(NULL);
    uint64_t seq = atomic_fetch_add(&r->next_id, 1);
    snprintf(h->id, sizeof h->id, "%s-%012llx%llu", kind == ROUTER_HTTP_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)(r->id_base & 0xffffffffffffULL), (unsigned long long)seq);
    pthread_mutex_init(&h->mu, NULL);
    clock_cond_init(&h->cv);
    atomic_init(&h->refs, 1 + hp.n);
    for (int i = 0; i < hp.n; i++) {
        h->c[i].h = h;
        h->c[i].index = i;
        char rid[96];
        snprintf(rid, sizeof rid, "%s-%d", h->id, i);
        free(gs[i]->request_id);
        gs[i]->request_id = strdup(rid);
    }
    pthread_mutex_lock(&d->mu);
    int stopping = d->stopping;
    h->next = d->live;
    if (d->live) d->live->prev = h;
    d->live = h;
    pthread_mutex_unlock(&d->mu);
    hc->h = h;
    int64_t deadline = request_deadline(conn);
    for (int i = 0; i < hp.n; i++) {
        http_choice *c = &h->c[i];
        /* token bytes from the tokenizer; unpaced: each worker message is a chunk at once */
        router_sink sink = {.send = sink_send, .end = sink_end, .ctx = c, .top_text = 0};
        status st;
        Deltaserve__V1__GenerateRequest *g = gs[i];
        gs[i] = NULL;
        int rc = stopping ? status_fail(&st, STATUS_UNAVAILABLE, "router is stopping")
                          : router_relay_create(r, g, &sink, deadline, &c->q, &st);
        if (stopping) protobuf_c_message_free_unpacked(&g->base, NULL);
        if (!rc) rc = router_relay_start(c->q, &st);
        if (rc) { /* never ran: its end is ours to write */
            sink_end(c, rpc_status_to_grpc(st.code), st.msg);
        }
    }
    json_object_put(req);
    req = NULL;

    pthread_mutex_lock(&h->mu);
    if (h->stream) {
        while (h->n_started < h->n)
            pthread_cond_wait(&h->cv, &h->mu);
    } else {
        while (h->n_ended < h->n)
            pthread_cond_wait(&h->cv, &h->mu);
    }
    const http_choice *bad = first_error(h, h->stream);
    if (!bad && h->stream) {
        h->streaming = 1;
        if (h->n_ended == h->n) write_tail(h);
    }
    pthread_mutex_unlock(&h->mu);
    if (bad) {
        herr_from_grpc(&e, bad->code, bad->msg, kind);
        http_req_cancel(h);
        return reply_error(conn, &e);
    }
    if (!h->stream) return reply_body(conn, h);
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_read, h, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    enum MHD_Result rc = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return rc;
fail:
    for (int i = 0; i < ROUTER_HTTP_MAX_N; i++)
        if (gs[i]) protobuf_c_message_free_unpacked(&gs[i]->base, NULL);
    json_object_put(req);
    return reply_error(conn, &e);
}

/* ---- the other endpoints and routing ---- */

static enum MHD_Result serve_models(router_http *d, struct MHD_Connection *conn)
{
    router_json b = {0};
    router_json_lit(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    router_json_str(&b, d->r->model_id, strlen(d->r->model_id));
    router_json_lit(&b, ",\"object\":\"model\",\"created\":");
    router_json_i64(&b, d->r->t_start);
    router_json_lit(&b, ",\"owned_by\":\"deltaserve\"");
    pthread_mutex_lock(&d->r->mu);
    uint32_t ctx = d->r->model_info ? d->r->model_info->max_context : 0;
    pthread_mutex_unlock(&d->r->mu);
    if (ctx) { /* the workers' context per sequence, once one reported it (as vLLM) */
        router_json_lit(&b, ",\"max_model_len\":");
        router_json_i64(&b, ctx);
    }
    router_json_lit(&b, "}]}");
    enum MHD_Result rc = reply_json(conn, 200, &b);
    router_json_free(&b);
    return rc;
}

static enum MHD_Result serve_health(router_http *d, struct MHD_Connection *conn)
{
    router *r = d->r;
    pthread_mutex_lock(&r->mu);
    int draining = r->draining;
    pthread_mutex_unlock(&r->mu);
    int healthy = router_pool_n_healthy(r->pool);
    router_json b = {0};
    router_json_lit(&b, "{\"status\":");
    router_json_lit(&b, draining ? "\"draining\"" : healthy ? "\"ok\"" : "\"no healthy worker\"");
    router_json_lit(&b, ",\"healthy_workers\":");
    router_json_i64(&b, healthy);
    router_json_raw(&b, "}", 1);
    enum MHD_Result rc = reply_json(conn, !draining && healthy ? 200 : 503, &b);
    router_json_free(&b);
    return rc;
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    router_http *d = cls;
    (void)version;
    http_conn *hc = *con_cls;
    if (!hc) {
        if (!(hc = calloc(1, sizeof *hc))) return MHD_NO;
        *con_cls = hc;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (hc->too_big || hc->len + n > ROUTER_HTTP_MAX_BODY) {
            hc->too_big = 1;
            return MHD_YES;
        }
        if (hc->len + n + 1 > hc->cap) {
            size_t cap = hc->cap ? hc->cap : 4096;
            while (cap < hc->len + n + 1)
                cap *= 2;
            char *p = realloc(hc->body, cap);
            if (!p) return MHD_NO;
            hc->body = p;
            hc->cap = cap;
        }
        memcpy(hc->body + hc->len, upload, n);
        hc->len += n;
        hc->body[hc->len] = 0;
        return MHD_YES;
    }
    router_http_error e;
    memset(&e, 0, sizeof e);
    int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    int gen = !strcmp(url, "/v1/chat/completions") ? 1 : !strcmp(url, "/v1/completions") ? 2 : 0;
    int models = !strcmp(url, "/v1/models"), health = !strcmp(url, "/health");
    if (health && is_get) return serve_health(d, conn);
    if (!gen && !models && !health) {
        router_http_parse_fail(&e, 404, "invalid_request_error", "unknown_url", NULL,
                               "no such endpoint: %s %s (served: POST /v1/chat/completions, POST "
                               "/v1/completions, GET /v1/models, GET /health)",
                               method, url);
        return reply_error(conn, &e);
    }
    if ((gen && !is_post) || ((models || health) && !is_get)) {
        router_http_parse_fail(&e, 405, "invalid_request_error", "method_not_allowed",
                               gen ? NULL : "GET", "%s %s: use %s", method, url,
                               gen ? "POST" : "GET");
        return reply_error(conn, &e);
    }
    rpc_auth *auth = d->r->auth;
    if (auth) {
        const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
        if (!rpc_auth_check(auth, v, v ? strlen(v) : 0)) {
            router_http_parse_fail(&e, 401, "authentication_error", "invalid_api_key", NULL,
                                   v ? "the bearer token is wrong"
                                     : "missing 'Authorization: Bearer <token>'");
            return reply_error(conn, &e);
        }
    }
    if (models) return serve_models(d, conn);
    return serve_generate(d, conn, hc, gen == 1 ? ROUTER_HTTP_CHAT : ROUTER_HTTP_COMPLETION);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    http_conn *hc = *con_cls;
    if (!hc) return;
    *con_cls = NULL;
    if (hc->h) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
            http_req_cancel(hc->h);
        else { /* relays of an error reply may still run: they were cancelled already */
        }
        http_req_unref(hc->h);
    }
    free(hc->body);
    free(hc);
}

/* ---- start / stop ---- */

int router_http_start(router *r, const char *listen, router_http **out, status *st)
{
    *out = NULL;
    struct addrinfo *ai = NULL;
    int port_num;
    int rc = http_listen_resolve(listen, "--http-listen", &ai, &port_num, st);
    if (rc) return rc;
    router_http *d = calloc(1, sizeof *d);
    if (!d) {
        freeaddrinfo(ai);
        return status_fail(st, STATUS_NOMEM, "--http-listen: out of memory");
    }
    d->r = r;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if (r->opts.tls) {
        if (!MHD_is_feature_supported(MHD_FEATURE_TLS)) {
            rc = status_fail(st, STATUS_UNSUPPORTED,
                             "--http-listen with --tls-cert: libmicrohttpd has no TLS support");
            goto fail;
        }
        if ((rc = rpc_tls_read_pem(r->opts.tls->cert_file, "--tls-cert", &d->tls_cert, st)) ||
            (rc = rpc_tls_read_pem(r->opts.tls->key_file, "--tls-key", &d->tls_key, st)))
            goto fail;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (d->tls_cert) flags |= MHD_USE_TLS;
    /* a thread per connection: bounded (idle keep-alive connections count too) */
    unsigned climit = (unsigned)r->opts.max_inflight + 64;
    if (d->tls_cert)
        d->daemon = MHD_start_daemon(
            flags, (uint16_t)port_num, NULL, NULL, on_http, d, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
            d, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(256 * 1024), MHD_OPTION_CONNECTION_LIMIT,
            climit, MHD_OPTION_HTTPS_MEM_CERT, d->tls_cert, MHD_OPTION_HTTPS_MEM_KEY, d->tls_key,
            MHD_OPTION_END);
    else
        d->daemon = MHD_start_daemon(
            flags, (uint16_t)port_num, NULL, NULL, on_http, d, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
            d, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(256 * 1024), MHD_OPTION_CONNECTION_LIMIT,
            climit, MHD_OPTION_END);
    freeaddrinfo(ai);
    ai = NULL;
    if (!d->daemon) {
        rc = status_fail(st, STATUS_IO, "--http-listen: cannot listen on %s (port in use?%s)",
                         listen, d->tls_cert ? " a bad --tls-cert/--tls-key?" : "");
        goto fail;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d->daemon, MHD_DAEMON_INFO_BIND_PORT);
    d->port = info ? info->port : port_num;
    *out = d;
    return 0;
fail:
    if (ai) freeaddrinfo(ai);
    free(d->tls_cert);
    free(d->tls_key);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
    return rc;
}

int router_http_port(const router_http *d)
{
    return d->port;
}

void router_http_stop(router_http *d)
{
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->stopping = 1;
    for (http_req *h = d->live; h; h = h->next)
        http_req_cancel(h);
    pthread_mutex_unlock(&d->mu);
    MHD_stop_daemon(d->daemon); /* joins the connection threads */
    pthread_mutex_lock(&d->mu); /* relays cancelled above may still be ending */
    while (d->live)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d->tls_cert);
    free(d->tls_key);
    pthread_mutex_destroy(&d->mu);
    free(d);
}
