/* The relay (one thread per request, see router.h) and the public gRPC Generate. The relay
 * writes to a router_sink (router_internal.h): a gRPC call here, an HTTP request in
 * router_http.c. The CQ thread only copies the request and starts the thread (on_request), and
 * forwards a client cancel to the running worker call (on_cancel). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/status.h>

#include "common/finish.h"
#include "common/log.h"
#include "router/router_chat.h"
#include "router/router_internal.h"
#include "router/router_request.h"
#include "router/router_stop.h"
#include "rpc/rpc_client.h"
#include "rpc/rpc_status.h"

#define GEN_PATH "/deltaserve.v1.Generation/Generate"
#define WORKER_GEN_PATH "/deltaserve.v1.Worker/Generate"
#define FULL_MSG "every worker is full (its slots and queue taken)"

struct router_req {
    router *r;
    router_sink sink;                   /* where the relay's messages and status go */
    Deltaserve__V1__GenerateRequest *g; /* owned: the request (unpacked copy or built by a door) */
    int64_t t0_us;                      /* arrival, clock_now_us */
    int64_t deadline_ms;                /* clock_now_ms, CLOCK_NO_DEADLINE if none */
    pthread_mutex_t mu;                 /* guards stream and cancelled */
    rpc_client_stream *stream;          /* borrowed: the worker call while it runs */
    int cancelled;                      /* the client cancelled / deadline / shutdown */
    atomic_int refs;                    /* the relay thread + the door's handle */
};

/* Per-request relay state. */
typedef struct relay {
    router_req *q;
    char rid[ROUTER_REQUEST_ID_MAX + 1];
    int32_t *ids; /* owned, [n_ids] prompt */
    size_t n_ids;
    bool in_reasoning; /* the chat prompt ends inside an open <think> block: the output starts
                          as reasoning (router_request_prompt_ids) */
    uint64_t seed;
    router_stop stop;
    int stop_ready;
    tokenizer_detok detok;
    char *piece;      /* owned, [piece_cap] one detok push */
    size_t piece_cap;
    char *text;       /* owned, [text_cap] text of the message being built */
    size_t text_cap, text_len;
    uint64_t out_bytes; /* bytes the detokenizer gave so far (before stop strings) */
    router_chat chat; /* chat prompts: the answer / reasoning / tool-call splitter */
    int chat_ready;
    /* outcome */
    int64_t n_tokens;      /* tokens sent to the client */
    int64_t n_msgs;        /* messages sent to the client */
    int64_t t_first_us;    /* first token sent (clock_now_us), 0 if none */
    int64_t t_last_us;     /* last token sent */
    uint32_t cached_tokens; /* the worker's usage.cached_tokens (first token or final message) */
    int attempts;
    int accepted;          /* a worker sent a message: it took the prompt (a refusal has none) */
    int64_t cost;          /* tokens acquired from the pool per attempt: prompt + max new */
    int64_t attempt_done;  /* of which reported done in the current attempt */
    finish_reason finish;  /* of the final message; FINISH_NONE before it */
    char worker[ROUTER_ADDR_MAX];
    char served_by[ROUTER_ADDR_MAX]; /* the worker's name, from its first message ("" if none) */
    float queue_ms, prefill_ms;      /* the worker's, from its first message */
    router_live live;      /* in r->ids while live_on: Abort finds the request by its id */
    int live_on;
} relay;

/* What one attempt on one worker ended with. */
enum { ATTEMPT_DONE, ATTEMPT_RETRY };

static uint64_t next_rand(router *r)
{
    uint64_t x = atomic_fetch_add(&r->seed_rng, 0x9e3779b97f4a7c15ULL);
    return router_policy_rand(&x);
}

void router_relay_unref(router_req *q)
{
    if (atomic_fetch_sub(&q->refs, 1) != 1) return;
    if (q->g) protobuf_c_message_free_unpacked(&q->g->base, NULL);
    pthread_mutex_destroy(&q->mu);
    free(q);
}

_Static_assert((int)DELTASERVE__V1__FINISH_REASON__FINISH_REASON_STOP == (int)FINISH_STOP &&
                   (int)DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH == (int)FINISH_LENGTH &&
                   (int)DELTASERVE__V1__FINISH_REASON__FINISH_REASON_CANCELLED == (int)FINISH_CANCELLED &&
                   (int)DELTASERVE__V1__FINISH_REASON__FINISH_REASON_ERROR == (int)FINISH_ERROR,
               "the wire's FinishReason numbers are common/finish.h's");

/* Rate limits of the lines of refused requests (by gRPC code) and of retries. */
static log_limit refused_log[GRPC_STATUS_UNAUTHENTICATED + 1];
static log_limit retry_log;

/* Ends the public call and writes the request's one log line. */
static void relay_end(relay *s, grpc_status_code code, const char *msg)
{
    router *r = s->q->r;
    if (s->live_on) {
        router_ids_unregister(r->ids, &s->live);
        s->live_on = 0;
    }
    s->q->sink.end(s->q->sink.ctx, code, msg);
    int64_t now = clock_now_us();
    if (code == GRPC_STATUS_OK) {
        atomic_fetch_add(&r->n_ok, 1);
        if (s->finish >= FINISH_STOP && s->finish <= FINISH_ERROR)
            metrics_inc(r->m.ok[s->finish - FINISH_STOP], 1);
    } else {
        atomic_fetch_add(&r->n_failed, 1);
        metrics_inc(r->m.failed, 1);
    }
    if (s->accepted) metrics_inc(r->m.prompt_tokens, (double)s->n_ids);
    metrics_inc(r->m.generation_tokens, (double)s->n_tokens);
    if (s->t_first_us) metrics_observe(r->m.ttft, (double)(s->t_first_us - s->q->t0_us) / 1e6);
    if (s->n_tokens > 1)
        metrics_observe(r->m.itl, (double)(s->t_last_us - s->t_first_us) / 1e6 /
                                      (double)(s->n_tokens - 1));
    metrics_observe(r->m.e2e, (double)(now - s->q->t0_us) / 1e6);
    if (LOG_LEVEL_INFO < log_threshold) return;
    /* refusals (overload, no worker) come in floods: one line a second per code, with counts */
    long more = 0;
    double since = 0;
    char tail[64] = "";
    if ((code == GRPC_STATUS_RESOURCE_EXHAUSTED || code == GRPC_STATUS_UNAVAILABLE) &&
        !s->n_tokens) {
        if (!log_limit_pass(&refused_log[code], &more, &since)) return;
        if (more)
            snprintf(tail, sizeof tail, " (%ld more %s in the last %.1f s)", more,
                     rpc_status_grpc_name(code), since);
    }
    LOG_INFO("request %s: %s%s%s worker=%s attempts=%d prompt=%zu cached=%u completion=%lld "
             "finish=%s ttft_ms=%.1f total_ms=%.1f%s",
             s->rid, rpc_status_grpc_name(code), msg && msg[0] ? " " : "", msg ? msg : "",
             s->worker[0] ? s->worker : "-", s->attempts, s->n_ids, s->cached_tokens,
             (long long)s->n_tokens,
             s->finish != FINISH_NONE ? finish_reason_name(s->finish) : "-",
             s->t_first_us ? (double)(s->t_first_us - s->q->t0_us) / 1e3 : -1.0,
             (double)(now - s->q->t0_us) / 1e3, tail);
}

static int grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    char *b = realloc(*buf, c);
    if (!b) return -1;
    *buf = b;
    *cap = c;
    return 0;
}

static int text_append(relay *s, const char *p, size_t n)
{
    if (grow(&s->text, &s->text_cap, s->text_len + n + 1)) return -1;
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return 0;
}

/* Pushes a decoded piece through the stop matcher into the message text and, for a chat, the
 * splitter. Returns the matched stop index, -1, or -2 on allocation failure. */
static int push_text(relay *s, const char *p, size_t n)
{
    const char *out;
    size_t n_out;
    status st;
    s->out_bytes += n;
    int m = router_stop_push(&s->stop, p, n, &out, &n_out, &st);
    if (m == -2 || text_append(s, out, n_out)) return -2;
    if (s->chat_ready && router_chat_feed(&s->chat, out, n_out)) return -2;
    return m;
}

/* The held-back text at the end of the output (no stop string matched) into the message text
 * and the splitter. Returns 0 or -2 on allocation failure. */
static int flush_stop(relay *s)
{
    const char *out;
    size_t n_out;
    router_stop_flush(&s->stop, &out, &n_out);
    if (text_append(s, out, n_out)) return -2;
    if (s->chat_ready && router_chat_feed(&s->chat, out, n_out)) return -2;
    return 0;
}

/* Fills in the text of each top-logprob alternative (Generation only). The strings are
 * malloc'd and owned by the worker message m from then on (protobuf_c_message_free_unpacked
 * frees non-default strings with the default allocator, i.e. free()). */
static void fill_logprob_text(relay *s, Deltaserve__V1__TokenLogprob **lp, size_t n)
{
    const tokenizer *tok = s->q->r->tok;
    if (!tok) return;
    for (size_t i = 0; i < n; i++)
        for (size_t j = 0; j < lp[i]->n_top; j++) {
            char *t;
            size_t len;
            status st;
            if (tokenizer_decode(tok, &lp[i]->top[j]->token_id, 1, &t, &len, &st) == 0)
                lp[i]->top[j]->text = t;
        }
}

static float ms_between(int64_t from_us, int64_t to_us)
{
    return from_us ? (float)(to_us - from_us) / 1e3f : 0.0f;
}

/* Relays one worker message. Returns 1 when the public stream is complete (the final message
 * was sent and the call finished), 0 to continue, -1 when the client is gone (call finished),
 * -2 on an internal error (call finished). *worker_error is set when the worker's final message
 * says FINISH_REASON_ERROR (the worker's status then decides the outcome). */
static int relay_message(relay *s, router_worker *w, Deltaserve__V1__GenerateResponse *m,
                         int *worker_error)
{
    router *r = s->q->r;
    const Deltaserve__V1__GenerateRequest *g = s->q->g;
    size_t n = m->n_token_ids, kept = n;
    int matched = -1;
    status st;
    s->accepted = 1;
    s->text_len = 0;
    if (s->text) s->text[0] = 0;
    if (s->chat_ready) router_chat_begin(&s->chat);
    if (r->tok) {
        for (size_t i = 0; i < n && matched < 0; i++) {
            size_t np;
            if (s->chat_ready) router_chat_token(&s->chat, s->out_bytes);
            if (tokenizer_detok_push(&s->detok, m->token_ids[i], s->piece, s->piece_cap, &np,
                                     &st)) {
                /* the worker returned an id outside our vocabulary: models differ */
                relay_end(s, GRPC_STATUS_INTERNAL, "worker returned a token id outside the "
                                                   "router's vocabulary (different models?)");
                return -2;
            }
            matched = push_text(s, s->piece, np);
            if (matched == -2) goto nomem;
            if (matched >= 0) kept = i + 1;
        }
        if (matched < 0 && m->finish_reason) {
            size_t np = tokenizer_detok_flush(&s->detok, s->piece, s->piece_cap);
            matched = push_text(s, s->piece, np);
            if (matched == -2) goto nomem;
            if (matched < 0 && flush_stop(s)) goto nomem;
        }
    }
    if (m->usage) s->cached_tokens = m->usage->cached_tokens;
    if (m->served_by && m->served_by[0] && !s->served_by[0]) /* first message: who, and when */
        snprintf(s->served_by, sizeof s->served_by, "%s", m->served_by);
    if (m->timings && !m->finish_reason) {
        s->queue_ms = m->timings->queue_ms;
        s->prefill_ms = m->timings->prefill_ms;
    }
    int64_t now = clock_now_us();
    if (kept > 0 && !s->t_first_us) s->t_first_us = now;
    if (kept > 0) s->t_last_us = now;

    Deltaserve__V1__GenerateResponse out = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    Deltaserve__V1__Usage usage = DELTASERVE__V1__USAGE__INIT;
    Deltaserve__V1__Timings tm = DELTASERVE__V1__TIMINGS__INIT;
    out.n_token_ids = kept;
    out.token_ids = m->token_ids;
    if (s->text) out.text = s->text;
    if (s->chat_ready && router_chat_end(&s->chat, matched >= 0 || m->finish_reason, &out))
        goto nomem;
    if (m->n_logprobs) {
        out.n_logprobs = m->n_logprobs < kept ? m->n_logprobs : kept;
        out.logprobs = m->logprobs;
        if (s->q->sink.top_text) fill_logprob_text(s, m->logprobs, out.n_logprobs);
    }
    int final = 0;
    if (matched >= 0) {
        final = 1;
        out.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_STOP;
        out.matched_stop_case = DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_STRING;
        out.stop_string = g->stop[matched];
        usage.prompt_tokens = (uint32_t)s->n_ids;
        usage.completion_tokens = (uint32_t)(s->n_tokens + (int64_t)kept);
        usage.cached_tokens = s->cached_tokens;
        out.usage = &usage;
        tm.queue_ms = s->queue_ms;
        tm.prefill_ms = s->prefill_ms;
        tm.decode_ms = ms_between(s->t_first_us, now);
        if (usage.completion_tokens > 1)
            tm.mean_itl_ms = tm.decode_ms / (float)(usage.completion_tokens - 1);
    } else if (m->finish_reason) {
        if (m->finish_reason == DELTASERVE__V1__FINISH_REASON__FINISH_REASON_ERROR) {
            *worker_error = 1;
        } else {
            final = 1;
            out.finish_reason = m->finish_reason;
            out.matched_stop_case = m->matched_stop_case;
            if (m->matched_stop_case ==
                DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_TOKEN_ID)
                out.stop_token_id = m->stop_token_id;
            if (m->usage) {
                usage = *m->usage;
                out.usage = &usage;
            }
            if (m->timings) tm = *m->timings;
        }
    }
    if (final) {
        if (out.usage == &usage && s->chat_ready)
            usage.reasoning_tokens = router_chat_reasoning_tokens(&s->chat);
        tm.ttft_ms = ms_between(s->q->t0_us, s->t_first_us ? s->t_first_us : s->q->t0_us);
        tm.total_ms = ms_between(s->q->t0_us, now);
        out.timings = &tm;
        out.request_id = s->rid;
        out.seed = m->finish_reason && m->seed ? m->seed : s->seed;
        out.served_by = m->served_by && m->served_by[0] ? m->served_by
                        : s->served_by[0]                ? s->served_by
                                                         : (char *)router_pool_worker_addr(w);
        s->finish = (finish_reason)out.finish_reason;
    }
    if (kept == 0 && !final && out.text[0] == 0 && out.reasoning[0] == 0 && !out.n_tool_calls)
        return 0; /* nothing to say */
    if (s->q->sink.send(s->q->sink.ctx, &out)) {
        relay_end(s, GRPC_STATUS_CANCELLED, "client gone");
        return -1;
    }
    int64_t done = (int64_t)kept + (s->n_msgs == 0 ? (int64_t)s->n_ids : 0);
    if (done > s->cost - s->attempt_done) done = s->cost - s->attempt_done;
    router_pool_progress(r->pool, w, done);
    s->attempt_done += done;
    s->n_msgs++;
    s->n_tokens += (int64_t)kept;
    if (final) {
        relay_end(s, GRPC_STATUS_OK, NULL);
        return 1;
    }
    return 0;
nomem:
    relay_end(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "router out of memory");
    return -2;
}

/* Worker failures worth another worker: it is gone or busy. Not INTERNAL (a bug that the
 * same request would hit anywhere) nor the request's own errors. */
static int retryable(int code)
{
    return code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_RESOURCE_EXHAUSTED ||
           code == GRPC_STATUS_UNKNOWN || code == GRPC_STATUS_ABORTED;
}

/* Ends the call after the client went away or its deadline passed. */
static void end_cancelled(relay *s)
{
    if (clock_expired(s->q->deadline_ms))
        relay_end(s, GRPC_STATUS_DEADLINE_EXCEEDED, "deadline exceeded");
    else
        relay_end(s, GRPC_STATUS_CANCELLED, "cancelled by the client");
}

/* Ends a request Abort reached before its worker ended it (waiting for a worker, between
 * retries, or its worker call cancelled): the text held back, then a final message with
 * FINISH_REASON_CANCELLED and status OK. w: the worker of the last attempt, or NULL. */
static void relay_aborted(relay *s, router_worker *w)
{
    s->text_len = 0;
    if (s->text) s->text[0] = 0;
    if (s->chat_ready) router_chat_begin(&s->chat);
    if (s->q->r->tok) {
        size_t np = tokenizer_detok_flush(&s->detok, s->piece, s->piece_cap);
        if (push_text(s, s->piece, np) == -1) flush_stop(s);
    }
    int64_t now = clock_now_us();
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    Deltaserve__V1__Usage usage = DELTASERVE__V1__USAGE__INIT;
    Deltaserve__V1__Timings tm = DELTASERVE__V1__TIMINGS__INIT;
    if (s->text) m.text = s->text;
    /* a chat's held text split as the end of the output (out of memory: the text unsplit) */
    if (s->chat_ready && router_chat_end(&s->chat, true, &m) == 0)
        usage.reasoning_tokens = router_chat_reasoning_tokens(&s->chat);
    m.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
    usage.prompt_tokens = (uint32_t)s->n_ids;
    usage.completion_tokens = (uint32_t)s->n_tokens;
    usage.cached_tokens = s->cached_tokens;
    m.usage = &usage;
    tm.ttft_ms = ms_between(s->q->t0_us, s->t_first_us ? s->t_first_us : now);
    tm.decode_ms = ms_between(s->t_first_us, s->t_last_us);
    if (s->n_tokens > 1) tm.mean_itl_ms = tm.decode_ms / (float)(s->n_tokens - 1);
    tm.total_ms = ms_between(s->q->t0_us, now);
    m.timings = &tm;
    m.request_id = s->rid;
    m.seed = s->seed;
    if (w) m.served_by = s->served_by[0] ? s->served_by : (char *)router_pool_worker_addr(w);
    tm.queue_ms = s->queue_ms;
    tm.prefill_ms = s->prefill_ms;
    s->finish = FINISH_CANCELLED;
    if (s->q->sink.send(s->q->sink.ctx, &m)) {
        relay_end(s, GRPC_STATUS_CANCELLED, "client gone");
        return;
    }
    relay_end(s, GRPC_STATUS_OK, NULL);
}

/* One attempt on worker w. ATTEMPT_DONE: the public call was finished. ATTEMPT_RETRY: nothing
 * reached the client; *code / msg say why the worker failed. */
static int relay_attempt(relay *s, router_worker *w, const Deltaserve__V1__WorkerGenerateRequest *wr,
                         int *code, char *msg, size_t msg_cap)
{
    router *r = s->q->r;
    router_req *q = s->q;
    status st;
    int64_t timeout = 0;
    if (q->deadline_ms != CLOCK_NO_DEADLINE) {
        timeout = clock_left_ms(q->deadline_ms);
        if (timeout <= 0) {
            relay_end(s, GRPC_STATUS_DEADLINE_EXCEEDED, "deadline exceeded before routing");
            return ATTEMPT_DONE;
        }
    }
    rpc_client_stream *cs;
    if (rpc_client_stream_start(&cs, router_pool_worker_conn(w), WORKER_GEN_PATH, &wr->base,
                                timeout, NULL, &st)) {
        *code = GRPC_STATUS_INTERNAL;
        snprintf(msg, msg_cap, "worker %s: %s", router_pool_worker_addr(w), st.msg);
        return ATTEMPT_RETRY;
    }
    pthread_mutex_lock(&q->mu);
    q->stream = cs;
    if (q->cancelled) rpc_client_stream_cancel(cs);
    pthread_mutex_unlock(&q->mu);
    if (router_ids_attach(r->ids, &s->live, w, cs)) rpc_client_stream_cancel(cs); /* aborted */

    int done = 0, worker_error = 0;
    ProtobufCMessage *m;
    rpc_client_result res;
    while (!done && rpc_client_stream_next(cs, &deltaserve__v1__generate_response__descriptor, &m,
                                           &res)) {
        int rc = relay_message(s, w, (Deltaserve__V1__GenerateResponse *)m, &worker_error);
        protobuf_c_message_free_unpacked(m, NULL);
        if (rc) done = 1;
    }
    router_ids_detach(r->ids, &s->live);
    pthread_mutex_lock(&q->mu);
    q->stream = NULL;
    int cancelled = q->cancelled;
    pthread_mutex_unlock(&q->mu);
    if (done) { /* finished (ok, client gone, or internal): stop the worker if still running */
        rpc_client_stream_destroy(cs);
        return ATTEMPT_DONE;
    }
    rpc_client_stream_destroy(cs);
    if (cancelled) {
        end_cancelled(s);
        return ATTEMPT_DONE;
    }
    if (router_ids_aborted(r->ids, &s->live)) {
        relay_aborted(s, w);
        return ATTEMPT_DONE;
    }
    if (res.code == GRPC_STATUS_OK) {
        res.code = GRPC_STATUS_INTERNAL;
        snprintf(res.message, sizeof res.message, "%s",
                 worker_error ? "worker reported an error" : "stream ended without a final message");
    }
    if (res.code == GRPC_STATUS_UNAVAILABLE || res.code == GRPC_STATUS_UNKNOWN)
        router_pool_report_failure(r->pool, w);
    if (s->n_msgs == 0 && retryable(res.code)) {
        *code = res.code;
        snprintf(msg, msg_cap, "worker %s: %s: %s", router_pool_worker_addr(w),
                 rpc_status_grpc_name(res.code), res.message);
        return ATTEMPT_RETRY;
    }
    char m2[700];
    if (s->n_msgs == 0) { /* not retryable: the worker's answer is the answer */
        relay_end(s, (grpc_status_code)res.code, res.message);
    } else if (res.code == GRPC_STATUS_DEADLINE_EXCEEDED || res.code == GRPC_STATUS_CANCELLED) {
        relay_end(s, (grpc_status_code)res.code, res.message);
    } else {
        snprintf(m2, sizeof m2, "worker %s failed after %lld tokens were sent: %s: %s",
                 router_pool_worker_addr(w), (long long)s->n_tokens,
                 rpc_status_grpc_name(res.code), res.message);
        relay_end(s, GRPC_STATUS_UNAVAILABLE, m2);
    }
    return ATTEMPT_DONE;
}

/* The prompt (and an explicit max_new_tokens) against the workers' context, max_context (0:
 * not known yet: the worker checks alone): INVALID_ARGUMENT naming the field and the limit, as
 * the worker would (worker/request.c), before any worker is tried. */
static int check_context(const relay *s, int max_context, status *st)
{
    if (max_context <= 0) return STATUS_OK;
    const Deltaserve__V1__GenerateRequest *g = s->q->g;
    if (s->n_ids + 1 > (size_t)max_context)
        return status_fail(st, STATUS_INVALID, "request %s: prompt: %zu tokens do not fit the "
                           "context of %d (at most %d, leaving room for one generated token)",
                           s->rid, s->n_ids, max_context, max_context - 1);
    const uint32_t room = (uint32_t)(max_context - (int)s->n_ids);
    if (g->stopping && g->stopping->max_new_tokens > room)
        return status_fail(st, STATUS_INVALID, "request %s: stopping.max_new_tokens: %u exceeds "
                           "the context left after the %zu-token prompt (%u of %d)", s->rid,
                           g->stopping->max_new_tokens, s->n_ids, room, max_context);
    return STATUS_OK;
}

static void relay_run(router_req *q)
{
    router *r = q->r;
    const Deltaserve__V1__GenerateRequest *g = q->g;
    relay s;
    memset(&s, 0, sizeof s);
    s.q = q;
    status st;
    status_clear(&st);
    if (g->request_id[0])
        snprintf(s.rid, sizeof s.rid, "%s", g->request_id);
    else
        snprintf(s.rid, sizeof s.rid, "%012llx-%llu", (unsigned long long)(r->id_base & 0xffffffffffffULL),
                 (unsigned long long)atomic_fetch_add(&r->next_id, 1));
    router_ids_register(r->ids, &s.live, s.rid);
    s.live_on = 1;
    if (router_request_validate(g, r->tok, &st) ||
        router_request_prompt_ids(g, r->tok, &r->chat_tmpl, &s.ids, &s.n_ids, &s.in_reasoning,
                                  &st)) {
        relay_end(&s, rpc_status_to_grpc(st.code), st.msg);
        goto out;
    }
    if (check_context(&s, router_pool_max_context(r->pool), &st)) {
        relay_end(&s, rpc_status_to_grpc(st.code), st.msg);
        goto out;
    }
    if (router_stop_init(&s.stop, (const char *const *)g->stop, (int)g->n_stop, &st)) {
        relay_end(&s, rpc_status_to_grpc(st.code), st.msg);
        goto out;
    }
    s.stop_ready = 1;
    if (r->tok) {
        tokenizer_detok_init(&s.detok, r->tok);
        s.piece_cap = tokenizer_detok_max_out(r->tok);
        s.piece = malloc(s.piece_cap);
        if (!s.piece || grow(&s.text, &s.text_cap, 4 * s.piece_cap + 2 * ROUTER_STOP_MAX_BYTES)) {
            relay_end(&s, GRPC_STATUS_RESOURCE_EXHAUSTED, "router out of memory");
            goto out;
        }
    }

    if (g->prompt_case == DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT) {
        if (router_chat_init(&s.chat, g->chat, s.in_reasoning, s.text_cap, next_rand(r),
                             &st)) {
            relay_end(&s, rpc_status_to_grpc(st.code), st.msg);
            goto out;
        }
        s.chat_ready = 1;
    }

    /* the worker request: same sampling, a seed picked here when 0 so it can be reported */
    Deltaserve__V1__SamplingParams samp = DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    if (g->sampling) samp = *g->sampling;
    if (!samp.seed) samp.seed = next_rand(r) | 1;
    s.seed = samp.seed;
    Deltaserve__V1__WorkerGenerateRequest wr = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    wr.request_id = s.rid;
    wr.n_prompt_token_ids = s.n_ids;
    wr.prompt_token_ids = s.ids;
    wr.sampling = &samp;
    wr.stopping = g->stopping;
    wr.logprobs = g->logprobs;
    wr.no_speculation = g->no_speculation;

    int64_t max_new = g->stopping && g->stopping->max_new_tokens ? g->stopping->max_new_tokens
                                                                 : ROUTER_REQUEST_DEFAULT_MAX_NEW;
    s.cost = (int64_t)s.n_ids + max_new;
    uint64_t prefix = router_policy_prefix_hash(s.ids, s.n_ids, r->opts.policy.prefix_tokens);
    uint64_t rng = next_rand(r);
    router_worker *tried[16];
    int n_tried = 0;
    int last_code = GRPC_STATUS_UNAVAILABLE;
    char last_msg[600] = "";
    int max_attempts = r->opts.max_attempts < 16 ? r->opts.max_attempts : 16;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        int cancelled = q->cancelled;
        pthread_mutex_unlock(&q->mu);
        if (cancelled) {
            end_cancelled(&s);
            break;
        }
        if (router_ids_aborted(r->ids, &s.live)) {
            relay_aborted(&s, n_tried ? tried[n_tried - 1] : NULL);
            break;
        }
        router_worker *w = NULL;
        if (n_tried < max_attempts)
            w = router_pool_acquire(r->pool, prefix, s.cost, tried, n_tried, &rng);
        if (!w) {
            char m[700];
            if (n_tried == 0 && router_pool_full(r->pool)) {
                last_code = GRPC_STATUS_RESOURCE_EXHAUSTED;
                snprintf(m, sizeof m, "%s", FULL_MSG);
            } else if (n_tried == 0)
                snprintf(m, sizeof m, "no healthy worker (%d known)", router_pool_n_workers(r->pool));
            else
                snprintf(m, sizeof m, "%d worker%s tried; last: %s", n_tried, n_tried > 1 ? "s" : "",
                         last_msg);
            relay_end(&s, (grpc_status_code)last_code, m);
            break;
        }
        if (n_tried) { /* a retry follows: say so (rate-limited) */
            atomic_fetch_add(&r->n_retries, 1);
            metrics_inc(r->m.retries, 1);
            long more;
            double since;
            if (LOG_LEVEL_WARN >= log_threshold && log_limit_pass(&retry_log, &more, &since)) {
                char tail[64] = "";
                if (more)
                    snprintf(tail, sizeof tail, " (%ld more retries in the last %.1f s)", more,
                             since);
                LOG_WARN("request %s: retrying on %s: %s%s", s.rid, router_pool_worker_addr(w),
                         last_msg, tail);
            }
        }
        s.attempts++;
        snprintf(s.worker, sizeof s.worker, "%s", router_pool_worker_addr(w));
        s.served_by[0] = 0;
        s.attempt_done = 0;
        int rc = relay_attempt(&s, w, &wr, &last_code, last_msg, sizeof last_msg);
        /* what the attempt did not report done is no longer outstanding there */
        router_pool_progress(r->pool, w, s.cost - s.attempt_done);
        tried[n_tried++] = w; /* keeps its reference until the request ends */
        if (rc == ATTEMPT_DONE) break;
    }
    for (int i = 0; i < n_tried; i++) router_pool_release(r->pool, tried[i], 0);
out:
    if (s.live_on) router_ids_unregister(r->ids, &s.live); /* every path ends in relay_end */
    if (s.stop_ready) router_stop_free(&s.stop);
    if (s.chat_ready) router_chat_free(&s.chat);
    free(s.ids);
    free(s.piece);
    free(s.text);
}

static void *relay_main(void *arg)
{
    router_req *q = arg;
    router *r = q->r;
    relay_run(q);
    router_relay_unref(q);
    pthread_mutex_lock(&r->mu);
    r->relays--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int router_relay_create(router *r, Deltaserve__V1__GenerateRequest *g, const router_sink *sink,
                        int64_t deadline_ms, router_req **out, status *st)
{
    *out = NULL;
    router_req *q = calloc(1, sizeof *q);
    if (!q) {
        protobuf_c_message_free_unpacked(&g->base, NULL);
        return status_fail(st, STATUS_NOMEM, "router: out of memory");
    }
    q->r = r;
    q->sink = *sink;
    q->g = g;
    q->t0_us = clock_now_us();
    q->deadline_ms = deadline_ms;
    pthread_mutex_init(&q->mu, NULL);
    atomic_init(&q->refs, 1);
    *out = q;
    return 0;
}

int router_relay_start(router_req *q, status *st)
{
    router *r = q->r;
    pthread_mutex_lock(&r->mu);
    r->relays++; /* undone below if the thread does not start */
    pthread_mutex_unlock(&r->mu);
    atomic_fetch_add(&q->refs, 1); /* the thread's */
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    int ok = pthread_create(&th, &attr, relay_main, q) == 0;
    pthread_attr_destroy(&attr);
    if (ok) return 0;
    atomic_fetch_sub(&q->refs, 1);
    pthread_mutex_lock(&r->mu);
    r->relays--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return status_fail(st, STATUS_EXHAUSTED, "router: cannot start a relay");
}

void router_relay_cancel(router_req *q)
{
    pthread_mutex_lock(&q->mu);
    q->cancelled = 1;
    if (q->stream) rpc_client_stream_cancel(q->stream);
    pthread_mutex_unlock(&q->mu);
}

/* The gRPC sink: the relay's messages and status go to the call. */
static int grpc_sink_send(void *ctx, const Deltaserve__V1__GenerateResponse *m)
{
    return rpc_call_send(ctx, &m->base);
}

static void grpc_sink_end(void *ctx, int code, const char *msg)
{
    rpc_call_finish(ctx, (grpc_status_code)code, msg);
}

static void on_generate(rpc_call *call, const ProtobufCMessage *req, void *user)
{
    router *r = user;
    atomic_fetch_add(&r->n_requests, 1);
    pthread_mutex_lock(&r->mu);
    r->inflight++; /* until on_release, whatever happens below */
    if (r->draining) {
        pthread_mutex_unlock(&r->mu);
        rpc_call_finish(call, GRPC_STATUS_UNAVAILABLE, "router is draining");
        return;
    }
    if (r->inflight > r->opts.max_inflight) {
        pthread_mutex_unlock(&r->mu);
        char m[128];
        snprintf(m, sizeof m, "router: %d requests in flight (--max-inflight)", r->opts.max_inflight);
        rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, m);
        return;
    }
    pthread_mutex_unlock(&r->mu);
    if (router_pool_full(r->pool)) { /* overload: refused before any copy, thread or worker call */
        pthread_mutex_lock(&r->mu);
        r->relays--;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        atomic_fetch_add(&r->n_failed, 1);
        metrics_inc(r->m.failed, 1);
        rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, FULL_MSG);
        long more;
        double since;
        if (LOG_LEVEL_INFO >= log_threshold &&
            log_limit_pass(&refused_log[GRPC_STATUS_RESOURCE_EXHAUSTED], &more, &since)) {
            const char *rid = ((const Deltaserve__V1__GenerateRequest *)req)->request_id;
            char tail[64] = "";
            if (more)
                snprintf(tail, sizeof tail, " (%ld more RESOURCE_EXHAUSTED in the last %.1f s)",
                         more, since);
            LOG_INFO("request %s: RESOURCE_EXHAUSTED %s%s", rid && rid[0] ? rid : "-", FULL_MSG,
                     tail);
        }
        return;
    }

    Deltaserve__V1__GenerateRequest *g = NULL;
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) {
        rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "router out of memory");
        return;
    }
    protobuf_c_message_pack(req, buf);
    g = (Deltaserve__V1__GenerateRequest *)protobuf_c_message_unpack(
        &deltaserve__v1__generate_request__descriptor, NULL, n, buf);
    free(buf);
    if (!g) { /* packed, yet not readable back: a malformed field (e.g. an unknown field
                 numbered 0), not an overload (docs/FUZZ.md, 1) */
        rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT,
                        "request: malformed (it does not survive re-encoding)");
        return;
    }
    router_sink sink = {grpc_sink_send, grpc_sink_end, call, 1};
    router_req *q;
    status st;
    if (router_relay_create(r, g, &sink, rpc_call_deadline_ms(call), &q, &st)) {
        rpc_call_finish(call, rpc_status_to_grpc(st.code), st.msg);
        return;
    }
    rpc_call_set_data(call, q); /* the call's reference, dropped by on_release */
    if (router_relay_start(q, &st)) rpc_call_finish(call, rpc_status_to_grpc(st.code), st.msg);
}

static void on_cancel(rpc_call *call, void *user)
{
    router_req *q = rpc_call_data(call);
    if (q) router_relay_cancel(q);
}

static void on_release(rpc_call *call, void *user)
{
    router *r = user;
    router_req *q = rpc_call_data(call);
    if (q) router_relay_unref(q);
    pthread_mutex_lock(&r->mu);
    r->inflight--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

int router_generate_add_method(router *r, status *st)
{
    rpc_method m = {
        .path = GEN_PATH,
        .request_desc = &deltaserve__v1__generate_request__descriptor,
        .kind = RPC_METHOD_SERVER_STREAM,
        .on_request = on_generate,
        .on_cancel = on_cancel,
        .on_release = on_release,
        .user = r,
    };
    return rpc_server_add_method(r->srv, &m, st);
}
