/* The relay of one Generate request (router.h) as a state machine on the router's completion
 * queues, and the public gRPC Generate.
 *
 * No thread is a request's: every step of a relay runs on the thread of an event, under the
 * relay's mutex: the door's start (the gRPC server's CQ thread in on_generate, or the HTTP
 * door's connection thread), a worker call's message or end (rpc_client_async on a CQ thread of
 * the router's server: the public call's own queue for the gRPC door, so a stream and its
 * worker call share one thread), a client cancel, an Abort, and the public call becoming
 * writable (on_writable). The relay writes to a router_sink (router_internal.h): the gRPC call
 * here, an HTTP request in router_http.c.
 *
 * Output is coalesced: what a worker message brings (several tokens when the worker coalesced a
 * step) goes out in one GenerateResponse at once when no message to the client is in flight;
 * while one is (a paced sink), what the worker sends meanwhile is gathered and leaves in one
 * message when the client's side is writable again. A lone stream never waits. */
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
#include "router/router_wire.h"
#include "rpc/rpc_client.h"
#include "rpc/rpc_codec.h"
#include "rpc/rpc_status.h"

#define GEN_PATH "/deltaserve.v1.Generation/Generate"
#define WORKER_GEN_PATH "/deltaserve.v1.Worker/Generate"
#define FULL_MSG "every worker is full (its slots and queue taken)"
#define RELAY_MAX_TRIED 16 /* workers one request may try (--max-attempts is capped to it) */
#define RELAY_ARENA_BYTES 4096 /* the worker messages' arena to start with (rpc_codec.h) */

/* Per-request relay state: prompt, detokenizer, stop strings, chat splitter, the output being
 * built, and the outcome. */
typedef struct relay {
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
    uint64_t out_bytes; /* bytes the detokenizer gave so far (before stop strings) */
    router_chat chat; /* chat prompts: the answer / reasoning / tool-call splitter */
    int chat_ready;
    /* the output being built: what arrived since the last message to the client */
    int building;     /* begun (text emptied, the splitter's message begun) */
    char *text;       /* owned, [text_cap] its text */
    size_t text_cap, text_len;
    int32_t *pend_ids; /* owned, [pend_cap] its token ids, [n_pend] */
    size_t n_pend, pend_cap;
    Deltaserve__V1__TokenLogprob **pend_lp; /* owned array, [pend_lp_cap] its logprobs,
                                               [n_pend_lp], pointing into held messages */
    size_t n_pend_lp, pend_lp_cap;
    ProtobufCMessage **held; /* owned, [held_cap] worker messages its logprobs point into */
    size_t n_held, held_cap;
    rpc_arena arena;  /* owned: the worker messages' memory (allocation-free unpacking), reset
                         once none is alive (on_worker_event) */
    uint8_t *wire;    /* owned, [wire_cap] a message of ids and text packed by hand (emit) */
    size_t wire_cap;
    /* outcome */
    int64_t n_tokens;      /* tokens taken into the output (sent or being built) */
    int64_t n_msgs;        /* messages sent to the client */
    int64_t t_first_us;    /* first token taken (clock_now_us), 0 if none */
    int64_t t_last_us;     /* last token taken */
    uint32_t cached_tokens; /* the worker's usage.cached_tokens (first token or final message) */
    int attempts;
    int accepted;          /* a worker sent a message: it took the prompt (a refusal has none) */
    int64_t cost;          /* tokens acquired from the pool per attempt: prompt + max new */
    int64_t attempt_done;  /* of which reported done in the current attempt */
    int prompt_done;       /* the current attempt's prompt reported done */
    finish_reason finish;  /* of the final message; FINISH_NONE before it */
    char worker[ROUTER_ADDR_MAX];
    char served_by[ROUTER_ADDR_MAX]; /* the worker's name, from its first message ("" if none) */
    float queue_ms, prefill_ms;      /* the worker's, from its first message */
    router_live live;      /* in r->ids while live_on: Abort finds the request by its id */
    int live_on;
} relay;

struct router_req {
    router *r;
    router_sink sink;                   /* where the relay's messages and status go */
    Deltaserve__V1__GenerateRequest *g; /* owned: the request as received (or built by a door) */
    int64_t t0_us;                      /* arrival, clock_now_us */
    int64_t deadline_ms;                /* clock_now_ms, CLOCK_NO_DEADLINE if none */
    void *cq;                           /* the completion queue of its worker calls */
    atomic_int refs;                    /* the door's handle + the relay's own until finalized */
    pthread_mutex_t mu;                 /* every step of the relay runs under it */
    rpc_client_async *call;             /* owned: the worker call of each attempt in turn */
    int call_running;                   /* started, its END not yet seen */
    int cancelled;                      /* the client cancelled / deadline / shutdown */
    int busy;                           /* a message to a paced sink has not left yet */
    int done;                           /* the public call ended (sink.end ran) */
    int finalized;                      /* resources returned, the relay's reference dropped */
    int worker_error;                   /* the attempt's final message said FINISH_REASON_ERROR */
    router_worker *w;                   /* the running attempt's worker (also in tried) */
    router_feed *feed;                  /* the attempt's messages come on this feed, tagged
                                           wr.feed_tag (NULL: on its call) */
    int feed_final;                     /* the feed brought the attempt's final message */
    int feed_lost;                      /* the feed ended before it did */
    int end_pending;                    /* the call ended OK before the feed brought the final
                                           message: its end waits for it (or the feed's end) */
    router_worker *tried[RELAY_MAX_TRIED]; /* referenced until the relay ends */
    int n_tried;
    int last_code;                      /* why the last attempt failed (retries) */
    char last_msg[600];
    uint64_t prefix, rng;               /* routing: prompt prefix hash, the draw's state */
    Deltaserve__V1__WorkerGenerateRequest wr; /* the worker request: views into g and s */
    Deltaserve__V1__SamplingParams samp;      /* g's, seed filled in, no unknown fields */
    Deltaserve__V1__StoppingCriteria stopping; /* g's, no unknown fields */
    relay s;
};

static uint64_t next_rand(router *r)
{
    uint64_t x = atomic_fetch_add(&r->seed_rng, 0x9e3779b97f4a7c15ULL);
    return router_policy_rand(&x);
}

void router_relay_ref(router_req *q) { atomic_fetch_add(&q->refs, 1); }

void router_relay_unref(router_req *q)
{
    if (atomic_fetch_sub(&q->refs, 1) != 1) return;
    if (q->g) protobuf_c_message_free_unpacked(&q->g->base, NULL);
    rpc_arena_free(&q->s.arena); /* finalize did, once the relay started */
    rpc_client_async_destroy(q->call);
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

/* Ends the public call (once) and writes the request's one log line; a worker call still
 * running is cancelled (its END then finalizes the relay). */
static void relay_end(router_req *q, grpc_status_code code, const char *msg)
{
    relay *s = &q->s;
    router *r = q->r;
    DS_ASSERT(!q->done);
    q->done = 1;
    if (q->call_running) rpc_client_async_cancel(q->call);
    if (s->live_on) {
        router_ids_unregister(r->ids, &s->live);
        s->live_on = 0;
    }
    q->sink.end(q->sink.ctx, code, msg);
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
    if (s->t_first_us) metrics_observe(r->m.ttft, (double)(s->t_first_us - q->t0_us) / 1e6);
    if (s->n_tokens > 1)
        metrics_observe(r->m.itl, (double)(s->t_last_us - s->t_first_us) / 1e6 /
                                      (double)(s->n_tokens - 1));
    metrics_observe(r->m.e2e, (double)(now - q->t0_us) / 1e6);
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
             s->t_first_us ? (double)(s->t_first_us - q->t0_us) / 1e3 : -1.0,
             (double)(now - q->t0_us) / 1e3, tail);
}

/* Grows an array to hold need elements of elem bytes (doubling; steady state: never). */
static int grow(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return STATUS_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *b = realloc(*buf, c * elem);
    if (!b) return STATUS_NOMEM;
    *buf = b;
    *cap = c;
    return STATUS_OK;
}

static int text_append(relay *s, const char *p, size_t n)
{
    if (grow((void **)&s->text, &s->text_cap, s->text_len + n + 1, 1)) return STATUS_NOMEM;
    memcpy(s->text + s->text_len, p, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return STATUS_OK;
}

/* Pushes a decoded piece through the stop matcher into the output's text and, for a chat, the
 * splitter. *matched: the index of the stop string that matched, or -1. NUL bytes (a token of
 * byte 0) are dropped: a message's text is a C string (protobuf-c), and one NUL would cut off
 * the text of every token gathered after it into the same message. */
static int push_text(relay *s, char *p, size_t n, int *matched)
{
    const char *out;
    size_t n_out;
    status st;
    if (memchr(p, 0, n)) {
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (p[i]) p[k++] = p[i];
        n = k;
    }
    s->out_bytes += n;
    *matched = router_stop_push(&s->stop, p, n, &out, &n_out, &st);
    if (*matched == -2 || text_append(s, out, n_out)) return STATUS_NOMEM;
    if (s->chat_ready && router_chat_feed(&s->chat, out, n_out)) return STATUS_NOMEM;
    return STATUS_OK;
}

/* The held-back text at the end of the output (no stop string matched) into the output's text
 * and the splitter. */
static int flush_stop(relay *s)
{
    const char *out;
    size_t n_out;
    router_stop_flush(&s->stop, &out, &n_out);
    if (text_append(s, out, n_out)) return STATUS_NOMEM;
    if (s->chat_ready && router_chat_feed(&s->chat, out, n_out)) return STATUS_NOMEM;
    return STATUS_OK;
}

static void begin_output(relay *s)
{
    s->building = 1;
    s->text_len = 0;
    if (s->text) s->text[0] = 0;
    if (s->chat_ready) router_chat_begin(&s->chat);
}

/* The output was sent (or said nothing): its parts are dropped. */
static void end_output(relay *s)
{
    s->building = 0;
    s->n_pend = 0;
    s->n_pend_lp = 0;
    for (size_t i = 0; i < s->n_held; i++)
        protobuf_c_message_free_unpacked(s->held[i], &s->arena.alloc);
    s->n_held = 0;
}

/* Fills in the text of each top-logprob alternative (Generation only). The strings are
 * malloc'd and owned by the worker message they are in from then on
 * (protobuf_c_message_free_unpacked frees non-default strings with free()). */
static void fill_logprob_text(const tokenizer *tok, Deltaserve__V1__TokenLogprob **lp, size_t n)
{
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

/* Sends the output built so far as one message: out holds the final message's fields when it
 * is the last one (out->finish_reason set; the call then ends OK), else nothing. last: the
 * output ends here (the splitter flushes what it holds). A message that would say nothing is
 * not sent. Ends the call when the client is gone or memory ran out. */
static void emit(router_req *q, Deltaserve__V1__GenerateResponse *out, bool last)
{
    relay *s = &q->s;
    out->n_token_ids = s->n_pend;
    out->token_ids = s->pend_ids;
    if (s->text) out->text = s->text;
    if (s->chat_ready && router_chat_end(&s->chat, last, out)) {
        end_output(s);
        relay_end(q, GRPC_STATUS_RESOURCE_EXHAUSTED, "router out of memory");
        return;
    }
    out->n_logprobs = s->n_pend_lp;
    out->logprobs = s->pend_lp;
    const bool final = out->finish_reason != 0;
    if (final && out->usage && s->chat_ready)
        out->usage->reasoning_tokens = router_chat_reasoning_tokens(&s->chat);
    if (!final && s->n_pend == 0 && out->text[0] == 0 && out->reasoning[0] == 0 &&
        !out->n_tool_calls) {
        end_output(s); /* nothing to say */
        return;
    }
    int rc;
    if (q->sink.send_wire && !final && !s->n_pend_lp && !out->reasoning[0] &&
        !out->n_tool_calls && !out->usage && !out->timings && !out->request_id[0] &&
        !out->served_by[0] && !out->seed && !out->matched_stop_case) {
        /* the common message: ids and text, packed here (router_wire.h) */
        const size_t text_len = strlen(out->text);
        if (grow((void **)&s->wire, &s->wire_cap,
                 router_wire_tokens_max(out->n_token_ids, text_len), 1)) {
            end_output(s);
            relay_end(q, GRPC_STATUS_RESOURCE_EXHAUSTED, "router out of memory");
            return;
        }
        const size_t n = router_wire_encode_tokens(out->token_ids, out->n_token_ids, out->text,
                                                   text_len, s->wire);
        rc = q->sink.send_wire(q->sink.ctx, s->wire, n);
    } else {
        rc = q->sink.send(q->sink.ctx, out);
    }
    end_output(s);
    if (rc != STATUS_OK) {
        relay_end(q, GRPC_STATUS_CANCELLED, "client gone");
        return;
    }
    s->n_msgs++;
    if (q->sink.paced) q->busy = 1;
    if (final) relay_end(q, GRPC_STATUS_OK, NULL);
}

/* Whether the output gathered may leave before the stream's end: the first message at once,
 * then every --stream-interval tokens. */
static bool interval_due(const router_req *q)
{
    return q->s.n_msgs == 0 || q->s.n_pend >= (size_t)q->r->opts.stream_interval;
}

/* Takes one worker message into the output (detokenized, through the stop strings and the
 * splitter) and sends it at once unless a message to the client is in flight (then
 * router_relay_writable sends it). Ends the public call when the stream is complete, the
 * client is gone or on an internal error. Sets q->worker_error when the worker's final message
 * says FINISH_REASON_ERROR (the worker's status then decides the outcome). Takes m, from alloc
 * (the relay's arena), or leaves it (alloc NULL: a feed's, without logprobs). */
static void relay_message(router_req *q, Deltaserve__V1__GenerateResponse *m,
                          ProtobufCAllocator *alloc)
{
    router *r = q->r;
    relay *s = &q->s;
    const Deltaserve__V1__GenerateRequest *g = q->g;
    size_t n = m->n_token_ids, kept = n;
    int matched = -1;
    status st;
    s->accepted = 1;
    if (!s->building) begin_output(s);
    if (r->tok) {
        for (size_t i = 0; i < n && matched < 0; i++) {
            size_t np;
            if (s->chat_ready) router_chat_token(&s->chat, s->out_bytes);
            if (tokenizer_detok_push(&s->detok, m->token_ids[i], s->piece, s->piece_cap, &np,
                                     &st)) {
                /* the worker returned an id outside our vocabulary: models differ */
                if (alloc) protobuf_c_message_free_unpacked(&m->base, alloc);
                relay_end(q, GRPC_STATUS_INTERNAL, "worker returned a token id outside the "
                                                   "router's vocabulary (different models?)");
                return;
            }
            if (push_text(s, s->piece, np, &matched)) goto nomem;
            if (matched >= 0) kept = i + 1;
        }
        if (matched < 0 && m->finish_reason) {
            size_t np = tokenizer_detok_flush(&s->detok, s->piece, s->piece_cap);
            if (push_text(s, s->piece, np, &matched)) goto nomem;
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

    /* the tokens (and their logprobs: m is then held until they are sent) into the output */
    const size_t n_lp = m->n_logprobs < kept ? m->n_logprobs : kept;
    if (grow((void **)&s->pend_ids, &s->pend_cap, s->n_pend + kept, sizeof *s->pend_ids) ||
        (n_lp && (grow((void **)&s->pend_lp, &s->pend_lp_cap, s->n_pend_lp + n_lp,
                       sizeof *s->pend_lp) ||
                  grow((void **)&s->held, &s->held_cap, s->n_held + 1, sizeof *s->held))))
        goto nomem;
    memcpy(s->pend_ids + s->n_pend, m->token_ids, kept * sizeof *s->pend_ids);
    s->n_pend += kept;
    if (n_lp) {
        if (q->sink.top_text) fill_logprob_text(r->tok, m->logprobs, n_lp);
        memcpy(s->pend_lp + s->n_pend_lp, m->logprobs, n_lp * sizeof *s->pend_lp);
        s->n_pend_lp += n_lp;
        s->held[s->n_held++] = &m->base;
    }
    /* the pool: the prompt (with the first message) and the tokens are done */
    int64_t done = (int64_t)kept + (s->prompt_done ? 0 : (int64_t)s->n_ids);
    s->prompt_done = 1;
    if (done > s->cost - s->attempt_done) done = s->cost - s->attempt_done;
    router_pool_progress(r->pool, q->w, done);
    s->attempt_done += done;
    s->n_tokens += (int64_t)kept;

    Deltaserve__V1__GenerateResponse out = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    Deltaserve__V1__Usage usage = DELTASERVE__V1__USAGE__INIT;
    Deltaserve__V1__Timings tm = DELTASERVE__V1__TIMINGS__INIT;
    int final = 0;
    if (matched >= 0) {
        final = 1;
        out.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_STOP;
        out.matched_stop_case = DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_STRING;
        out.stop_string = g->stop[matched];
        usage.prompt_tokens = (uint32_t)s->n_ids;
        usage.completion_tokens = (uint32_t)s->n_tokens;
        usage.cached_tokens = s->cached_tokens;
        out.usage = &usage;
        tm.queue_ms = s->queue_ms;
        tm.prefill_ms = s->prefill_ms;
        tm.decode_ms = ms_between(s->t_first_us, now);
        if (usage.completion_tokens > 1)
            tm.mean_itl_ms = tm.decode_ms / (float)(usage.completion_tokens - 1);
    } else if (m->finish_reason) {
        if (m->finish_reason == DELTASERVE__V1__FINISH_REASON__FINISH_REASON_ERROR) {
            q->worker_error = 1;
        } else {
            final = 1;
            out.finish_reason = m->finish_reason;
            out.matched_stop_case = m->matched_stop_case;
            if (m->matched_stop_case ==
                DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_TOKEN_ID)
                out.stop_token_id = m->stop_token_id;
            if (m->usage) {
                usage = *m->usage;
                usage.base.n_unknown_fields = 0;
                out.usage = &usage;
            }
            if (m->timings) {
                tm = *m->timings;
                tm.base.n_unknown_fields = 0;
            }
        }
    }
    if (final) {
        tm.ttft_ms = ms_between(q->t0_us, s->t_first_us ? s->t_first_us : q->t0_us);
        tm.total_ms = ms_between(q->t0_us, now);
        out.timings = &tm;
        out.request_id = s->rid;
        out.seed = m->finish_reason && m->seed ? m->seed : s->seed;
        out.served_by = m->served_by && m->served_by[0] ? m->served_by
                        : s->served_by[0]                ? s->served_by
                                                         : (char *)router_pool_worker_addr(q->w);
        s->finish = (finish_reason)out.finish_reason;
    }
    /* a final message (or the worker's error) goes now, queued behind one in flight */
    if (final || q->worker_error || (!q->busy && interval_due(q)))
        emit(q, &out, matched >= 0 || m->finish_reason);
    if (!n_lp && alloc) protobuf_c_message_free_unpacked(&m->base, alloc);
    return;
nomem:
    if (alloc) protobuf_c_message_free_unpacked(&m->base, alloc);
    relay_end(q, GRPC_STATUS_RESOURCE_EXHAUSTED, "router out of memory");
}

/* Worker failures worth another worker: it is gone or busy. Not INTERNAL (a bug that the
 * same request would hit anywhere) nor the request's own errors. */
static bool retryable(int code)
{
    return code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_RESOURCE_EXHAUSTED ||
           code == GRPC_STATUS_UNKNOWN || code == GRPC_STATUS_ABORTED;
}

/* Ends the call after the client went away or its deadline passed. */
static void end_cancelled(router_req *q)
{
    if (clock_expired(q->deadline_ms))
        relay_end(q, GRPC_STATUS_DEADLINE_EXCEEDED, "deadline exceeded");
    else
        relay_end(q, GRPC_STATUS_CANCELLED, "cancelled by the client");
}

/* Ends a request Abort reached before its worker ended it (waiting for a worker, between
 * retries, or its worker call cancelled): the output held back, then a final message with
 * FINISH_REASON_CANCELLED and status OK. w: the worker of the last attempt, or NULL. */
static void relay_aborted(router_req *q, router_worker *w)
{
    relay *s = &q->s;
    if (!s->building) begin_output(s);
    if (q->r->tok) {
        int matched;
        size_t np = tokenizer_detok_flush(&s->detok, s->piece, s->piece_cap);
        if (push_text(s, s->piece, np, &matched) == STATUS_OK && matched < 0) flush_stop(s);
    }
    int64_t now = clock_now_us();
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    Deltaserve__V1__Usage usage = DELTASERVE__V1__USAGE__INIT;
    Deltaserve__V1__Timings tm = DELTASERVE__V1__TIMINGS__INIT;
    m.finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
    usage.prompt_tokens = (uint32_t)s->n_ids;
    usage.completion_tokens = (uint32_t)s->n_tokens;
    usage.cached_tokens = s->cached_tokens;
    m.usage = &usage;
    tm.ttft_ms = ms_between(q->t0_us, s->t_first_us ? s->t_first_us : now);
    tm.decode_ms = ms_between(s->t_first_us, s->t_last_us);
    if (s->n_tokens > 1) tm.mean_itl_ms = tm.decode_ms / (float)(s->n_tokens - 1);
    tm.total_ms = ms_between(q->t0_us, now);
    tm.queue_ms = s->queue_ms;
    tm.prefill_ms = s->prefill_ms;
    m.timings = &tm;
    m.request_id = s->rid;
    m.seed = s->seed;
    if (w) m.served_by = s->served_by[0] ? s->served_by : (char *)router_pool_worker_addr(w);
    s->finish = FINISH_CANCELLED;
    emit(q, &m, true);
}

/* The prompt (and an explicit max_new_tokens) against the workers' context, max_context (0:
 * not known yet: the worker checks alone): INVALID_ARGUMENT naming the field and the limit, as
 * the worker would (worker/request.c), before any worker is tried. */
static int check_context(const router_req *q, int max_context, status *st)
{
    if (max_context <= 0) return STATUS_OK;
    const relay *s = &q->s;
    const Deltaserve__V1__GenerateRequest *g = q->g;
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

/* Logs a retry (rate-limited, with counts). */
static void log_retry(router_req *q, router_worker *w)
{
    router *r = q->r;
    atomic_fetch_add(&r->n_retries, 1);
    metrics_inc(r->m.retries, 1);
    long more;
    double since;
    if (LOG_LEVEL_WARN >= log_threshold && log_limit_pass(&retry_log, &more, &since)) {
        char tail[64] = "";
        if (more)
            snprintf(tail, sizeof tail, " (%ld more retries in the last %.1f s)", more, since);
        LOG_WARN("request %s: retrying on %s: %s%s", q->s.rid, router_pool_worker_addr(w),
                 q->last_msg, tail);
    }
}

/* An attempt on q->w is over (its call never started, or ended): what it did not report done
 * is no longer outstanding there; the worker stays referenced in tried until the relay ends. */
static void attempt_over(router_req *q)
{
    if (q->feed) router_feed_detach(q->feed, q->wr.feed_tag);
    q->feed = NULL;
    q->wr.feed_id = q->wr.feed_tag = 0;
    router_pool_progress(q->r->pool, q->w, q->s.cost - q->s.attempt_done);
    q->tried[q->n_tried++] = q->w;
    q->w = NULL;
}

/* Picks a worker and starts the worker call on it, trying others while a call cannot start;
 * or ends the public call (cancelled, aborted, no worker left, deadline passed). */
static void route(router_req *q)
{
    router *r = q->r;
    relay *s = &q->s;
    const int max_attempts = r->opts.max_attempts < RELAY_MAX_TRIED ? r->opts.max_attempts
                                                                     : RELAY_MAX_TRIED;
    for (;;) {
        if (q->cancelled) {
            end_cancelled(q);
            return;
        }
        if (router_ids_aborted(r->ids, &s->live)) {
            relay_aborted(q, q->n_tried ? q->tried[q->n_tried - 1] : NULL);
            return;
        }
        router_worker *w = NULL;
        if (q->n_tried < max_attempts)
            w = router_pool_acquire(r->pool, q->prefix, s->cost, q->tried, q->n_tried, &q->rng);
        if (!w) {
            char m[700];
            int code = q->last_code;
            if (q->n_tried == 0 && router_pool_full(r->pool)) {
                code = GRPC_STATUS_RESOURCE_EXHAUSTED;
                snprintf(m, sizeof m, "%s", FULL_MSG);
            } else if (q->n_tried == 0)
                snprintf(m, sizeof m, "no healthy worker (%d known)",
                         router_pool_n_workers(r->pool));
            else
                snprintf(m, sizeof m, "%d worker%s tried; last: %s", q->n_tried,
                         q->n_tried > 1 ? "s" : "", q->last_msg);
            relay_end(q, (grpc_status_code)code, m);
            return;
        }
        if (q->n_tried) log_retry(q, w); /* a retry follows: say so */
        q->w = w;
        s->attempts++;
        snprintf(s->worker, sizeof s->worker, "%s", router_pool_worker_addr(w));
        s->served_by[0] = 0;
        s->attempt_done = 0;
        s->prompt_done = 0;
        q->worker_error = 0;
        if (q->deadline_ms != CLOCK_NO_DEADLINE && clock_left_ms(q->deadline_ms) <= 0) {
            attempt_over(q);
            relay_end(q, GRPC_STATUS_DEADLINE_EXCEEDED, "deadline exceeded before routing");
            return;
        }
        q->feed_final = q->feed_lost = q->end_pending = 0;
        if (r->feeds && !q->g->logprobs)
            q->feed = router_feed_attach(r->feeds, w, q, &q->wr.feed_id, &q->wr.feed_tag);
        status st;
        if (rpc_client_async_start(q->call, q->cq, router_pool_worker_conn(w), WORKER_GEN_PATH,
                                   &q->wr.base, q->deadline_ms, &st)) {
            q->last_code = GRPC_STATUS_INTERNAL;
            snprintf(q->last_msg, sizeof q->last_msg, "worker %s: %s",
                     router_pool_worker_addr(w), st.msg);
            attempt_over(q);
            continue;
        }
        q->call_running = 1;
        if (router_ids_attach(r->ids, &s->live, w, q->call))
            rpc_client_async_cancel(q->call); /* aborted meanwhile */
        return;
    }
}

/* The attempt's worker call ended before the public call did: retry, or end the public call
 * with what the worker said. */
static void attempt_ended(router_req *q, router_worker *w, const rpc_client_result *res)
{
    router *r = q->r;
    relay *s = &q->s;
    if (q->cancelled) {
        end_cancelled(q);
        return;
    }
    if (router_ids_aborted(r->ids, &s->live)) {
        relay_aborted(q, w);
        return;
    }
    int code = res->code;
    const char *why = res->message;
    if (q->feed_lost && (code == GRPC_STATUS_OK || code == GRPC_STATUS_CANCELLED)) {
        code = GRPC_STATUS_UNAVAILABLE; /* its messages were on the feed (or the call was ours to end) */
        why = "the worker's token feed ended";
    }
    if (code == GRPC_STATUS_OK) {
        code = GRPC_STATUS_INTERNAL;
        why = q->worker_error ? "worker reported an error" : "stream ended without a final message";
    }
    if (code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_UNKNOWN)
        router_pool_report_failure(r->pool, w);
    if (s->n_msgs == 0 && retryable(code)) {
        q->last_code = code;
        snprintf(q->last_msg, sizeof q->last_msg, "worker %s: %s: %s",
                 router_pool_worker_addr(w), rpc_status_grpc_name(code), why);
        route(q);
        return;
    }
    if (s->building) { /* what was gathered while a message was in flight goes first */
        Deltaserve__V1__GenerateResponse out = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
        emit(q, &out, false);
        if (q->done) return;
    }
    if (s->n_msgs == 0 || code == GRPC_STATUS_DEADLINE_EXCEEDED ||
        code == GRPC_STATUS_CANCELLED) { /* not retryable: the worker's answer is the answer */
        relay_end(q, (grpc_status_code)code, why);
        return;
    }
    char m2[700];
    snprintf(m2, sizeof m2, "worker %s failed after %lld tokens were sent: %s: %s",
             router_pool_worker_addr(w), (long long)s->n_tokens, rpc_status_grpc_name(code),
             why);
    relay_end(q, GRPC_STATUS_UNAVAILABLE, m2);
}

/* Returns what the relay holds once the public call ended and no worker call runs. Called with
 * q->mu held; returns with it released (the relay's reference may have been the last). */
static void unlock_maybe_finalize(router_req *q)
{
    router *r = q->r;
    relay *s = &q->s;
    const bool fin = q->done && !q->call_running && !q->finalized;
    if (fin) {
        q->finalized = 1;
        for (int i = 0; i < q->n_tried; i++) router_pool_release(r->pool, q->tried[i], 0);
        q->n_tried = 0;
        if (s->live_on) router_ids_unregister(r->ids, &s->live); /* relay_end did, normally */
        s->live_on = 0;
        end_output(s);
        if (s->stop_ready) router_stop_free(&s->stop);
        if (s->chat_ready) router_chat_free(&s->chat);
        s->stop_ready = s->chat_ready = 0;
        free(s->ids);
        free(s->piece);
        free(s->text);
        free(s->pend_ids);
        free(s->pend_lp);
        free(s->held);
        free(s->wire);
        s->wire = NULL;
        rpc_arena_free(&s->arena);
        s->ids = NULL;
        s->piece = s->text = NULL;
        s->pend_ids = NULL;
        s->pend_lp = NULL;
        s->held = NULL;
    }
    pthread_mutex_unlock(&q->mu);
    if (!fin) return;
    rpc_server_unhold(r->srv);
    pthread_mutex_lock(&r->mu);
    r->relays--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    router_relay_unref(q);
}

/* The attempt's worker call is over (its END, or with a feed the final message after it):
 * retry or end. Called with q->mu held; returns with it released. */
static void worker_call_over(router_req *q)
{
    q->call_running = 0;
    router_ids_detach(q->r->ids, &q->s.live);
    router_worker *w = q->w;
    attempt_over(q);
    if (!q->done) attempt_ended(q, w, rpc_client_async_result(q->call));
    unlock_maybe_finalize(q);
}

/* The call's end waited for the feed's final message (end_pending): it runs now. True when it
 * ran (q->mu released), false when nothing waited. */
static bool run_pending_end(router_req *q)
{
    if (!q->end_pending) return false;
    q->end_pending = 0;
    worker_call_over(q);
    return true;
}

/* A worker call's event (the queue's thread). */
static void on_worker_event(void *user, rpc_client_async_event ev)
{
    router_req *q = user;
    pthread_mutex_lock(&q->mu);
    if (ev == RPC_CLIENT_ASYNC_MESSAGE) {
        relay *s = &q->s;
        /* a message of token ids only (all but a stream's first and last, as a rule) is read
         * here; others, and anything this does not read, by protobuf-c */
        size_t nb;
        const uint8_t *b = rpc_client_async_peek(q->call, &nb);
        ProtobufCMessage *m = NULL;
        Deltaserve__V1__GenerateResponse *fast =
            b ? router_wire_decode_tokens(b, nb, &s->arena.alloc) : NULL;
        if (fast) {
            rpc_client_async_consume(q->call);
            m = &fast->base;
        } else {
            m = rpc_client_async_take_with(q->call, &deltaserve__v1__generate_response__descriptor,
                                           &s->arena.alloc);
        }
        if (m && q->done) {
            protobuf_c_message_free_unpacked(m, &s->arena.alloc);
        } else if (m) {
            relay_message(q, (Deltaserve__V1__GenerateResponse *)m, &s->arena.alloc);
            if (!q->done) rpc_client_async_read(q->call);
        }
        if (s->n_held == 0) rpc_arena_reset(&s->arena); /* no worker message is alive */
        pthread_mutex_unlock(&q->mu); /* a message never ends the call: its END follows */
        return;
    }
    if (q->feed && !q->done && !q->feed_final && !q->feed_lost && !q->cancelled &&
        rpc_client_async_result(q->call)->code == GRPC_STATUS_OK) {
        q->end_pending = 1; /* the final message is still on its way on the feed */
        pthread_mutex_unlock(&q->mu);
        return;
    }
    worker_call_over(q);
}

/* A feed item of q's attempt (router_internal.h). */
void router_relay_feed_message(router_req *q, uint64_t tag, Deltaserve__V1__GenerateResponse *m)
{
    pthread_mutex_lock(&q->mu);
    if (!q->feed || q->wr.feed_tag != tag || q->done) {
        pthread_mutex_unlock(&q->mu);
        return;
    }
    if (m->finish_reason) q->feed_final = 1;
    relay_message(q, m, NULL);
    if ((q->feed_final || q->done) && run_pending_end(q)) return;
    pthread_mutex_unlock(&q->mu);
}

/* q's attempt lost its feed: the attempt ends (UNAVAILABLE: retried when nothing was sent). */
void router_relay_feed_lost(router_req *q, uint64_t tag)
{
    pthread_mutex_lock(&q->mu);
    if (!q->feed || q->wr.feed_tag != tag) {
        pthread_mutex_unlock(&q->mu);
        return;
    }
    q->feed_lost = 1;
    if (run_pending_end(q)) return;
    if (q->call_running) rpc_client_async_cancel(q->call);
    pthread_mutex_unlock(&q->mu);
}

/* Validation, the prompt's ids, the stop strings, the detokenizer, the splitter and the worker
 * request; then the first worker. Ends the public call on a bad request. */
static void relay_begin(router_req *q)
{
    router *r = q->r;
    relay *s = &q->s;
    const Deltaserve__V1__GenerateRequest *g = q->g;
    status st;
    status_clear(&st);
    if (g->request_id[0])
        snprintf(s->rid, sizeof s->rid, "%s", g->request_id);
    else
        snprintf(s->rid, sizeof s->rid, "%012llx-%llu",
                 (unsigned long long)(r->id_base & 0xffffffffffffULL),
                 (unsigned long long)atomic_fetch_add(&r->next_id, 1));
    router_ids_register(r->ids, &s->live, s->rid);
    s->live_on = 1;
    if (router_request_validate(g, r->tok, &st) ||
        router_request_prompt_ids(g, r->tok, &r->chat_tmpl, &s->ids, &s->n_ids, &s->in_reasoning,
                                  &st) ||
        check_context(q, router_pool_max_context(r->pool), &st) ||
        router_stop_init(&s->stop, (const char *const *)g->stop, (int)g->n_stop, &st)) {
        relay_end(q, rpc_status_to_grpc(st.code), st.msg);
        return;
    }
    s->stop_ready = 1;
    if (r->tok) {
        tokenizer_detok_init(&s->detok, r->tok);
        s->piece_cap = tokenizer_detok_max_out(r->tok);
        s->piece = malloc(s->piece_cap);
        if (!s->piece || grow((void **)&s->text, &s->text_cap,
                              4 * s->piece_cap + 2 * ROUTER_STOP_MAX_BYTES, 1)) {
            relay_end(q, GRPC_STATUS_RESOURCE_EXHAUSTED, "router out of memory");
            return;
        }
    }
    if (g->prompt_case == DELTASERVE__V1__GENERATE_REQUEST__PROMPT_CHAT) {
        if (router_chat_init(&s->chat, g->chat, s->in_reasoning, s->text_cap, next_rand(r),
                             &st)) {
            relay_end(q, rpc_status_to_grpc(st.code), st.msg);
            return;
        }
        s->chat_ready = 1;
    }

    /* the worker request: views into the request as received; the same sampling with a seed
     * picked here when 0 so it can be reported; fields this router does not know are not
     * forwarded (a field numbered 0 does not survive re-encoding: docs/FUZZ.md, 1) */
    Deltaserve__V1__SamplingParams samp = DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    q->samp = g->sampling ? *g->sampling : samp;
    q->samp.base.n_unknown_fields = 0;
    q->samp.base.unknown_fields = NULL;
    if (!q->samp.seed) q->samp.seed = next_rand(r) | 1;
    s->seed = q->samp.seed;
    Deltaserve__V1__WorkerGenerateRequest wr = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    q->wr = wr;
    q->wr.request_id = s->rid;
    q->wr.n_prompt_token_ids = s->n_ids;
    q->wr.prompt_token_ids = s->ids;
    q->wr.sampling = &q->samp;
    if (g->stopping) {
        q->stopping = *g->stopping;
        q->stopping.base.n_unknown_fields = 0;
        q->stopping.base.unknown_fields = NULL;
        q->wr.stopping = &q->stopping;
    }
    q->wr.logprobs = g->logprobs;
    q->wr.no_speculation = g->no_speculation;
    q->wr.stream_interval = (uint32_t)r->opts.stream_interval;

    int64_t max_new = g->stopping && g->stopping->max_new_tokens ? g->stopping->max_new_tokens
                                                                 : ROUTER_REQUEST_DEFAULT_MAX_NEW;
    s->cost = (int64_t)s->n_ids + max_new;
    q->prefix = router_policy_prefix_hash(s->ids, s->n_ids, r->opts.policy.prefix_tokens);
    q->rng = next_rand(r);
    q->last_code = GRPC_STATUS_UNAVAILABLE;
    route(q);
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
    rpc_arena_init(&q->s.arena, RELAY_ARENA_BYTES); /* out of memory: messages use malloc */
    int rc = rpc_client_async_create(&q->call, on_worker_event, q, st);
    if (rc) {
        router_relay_unref(q);
        return rc;
    }
    static atomic_uint next_cq;
    q->cq = sink->cq ? sink->cq : rpc_server_cq(r->srv, (int)(atomic_fetch_add(&next_cq, 1) & 0xffff));
    *out = q;
    return STATUS_OK;
}

int router_relay_start(router_req *q, status *st)
{
    (void)st;
    router *r = q->r;
    pthread_mutex_lock(&r->mu);
    r->relays++; /* router_drain waits for it */
    pthread_mutex_unlock(&r->mu);
    rpc_server_hold(r->srv); /* the CQ threads run until its worker calls ended */
    atomic_fetch_add(&q->refs, 1); /* the relay's own, dropped when it is finalized */
    pthread_mutex_lock(&q->mu);
    relay_begin(q);
    unlock_maybe_finalize(q);
    return STATUS_OK;
}

void router_relay_cancel(router_req *q)
{
    pthread_mutex_lock(&q->mu);
    q->cancelled = 1;
    if (run_pending_end(q)) return; /* the client does not wait for the final message */
    if (q->call_running) rpc_client_async_cancel(q->call);
    pthread_mutex_unlock(&q->mu);
}

void router_relay_writable(router_req *q)
{
    pthread_mutex_lock(&q->mu);
    q->busy = 0;
    if (!q->done && q->s.building && interval_due(q)) {
        Deltaserve__V1__GenerateResponse out = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
        emit(q, &out, false);
    }
    pthread_mutex_unlock(&q->mu);
}

/* The gRPC sink: the relay's messages and status go to the call; the call's on_writable paces
 * it. */
static int grpc_sink_send(void *ctx, const Deltaserve__V1__GenerateResponse *m)
{
    return rpc_call_send(ctx, &m->base);
}

static int grpc_sink_send_wire(void *ctx, const uint8_t *b, size_t n)
{
    return rpc_call_send_bytes(ctx, b, n);
}

static void grpc_sink_end(void *ctx, int code, const char *msg)
{
    rpc_call_finish(ctx, (grpc_status_code)code, msg);
}

/* A refusal at the door, before any relay: one log line a second per code, with counts. */
static void refuse(router *r, rpc_call *call, grpc_status_code code, const char *msg,
                   const Deltaserve__V1__GenerateRequest *g)
{
    atomic_fetch_add(&r->n_failed, 1);
    metrics_inc(r->m.failed, 1);
    rpc_call_finish(call, code, msg);
    long more;
    double since;
    if (LOG_LEVEL_INFO >= log_threshold && log_limit_pass(&refused_log[code], &more, &since)) {
        char tail[64] = "";
        if (more)
            snprintf(tail, sizeof tail, " (%ld more %s in the last %.1f s)", more,
                     rpc_status_grpc_name(code), since);
        LOG_INFO("request %s: %s %s%s", g->request_id[0] ? g->request_id : "-",
                 rpc_status_grpc_name(code), msg, tail);
    }
}

/* The request is kept as received (owns_request): the relay owns it from here on. */
static void on_generate(rpc_call *call, const ProtobufCMessage *req, void *user)
{
    router *r = user;
    Deltaserve__V1__GenerateRequest *g = (Deltaserve__V1__GenerateRequest *)req;
    atomic_fetch_add(&r->n_requests, 1);
    pthread_mutex_lock(&r->mu);
    r->inflight++; /* until on_release, whatever happens below */
    const int draining = r->draining, over = r->inflight > r->opts.max_inflight;
    pthread_mutex_unlock(&r->mu);
    if (draining || over) {
        char m[128];
        if (draining)
            snprintf(m, sizeof m, "router is draining");
        else
            snprintf(m, sizeof m, "router: %d requests in flight (--max-inflight)",
                     r->opts.max_inflight);
        rpc_call_finish(call, draining ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_RESOURCE_EXHAUSTED,
                        m);
        protobuf_c_message_free_unpacked(&g->base, NULL);
        return;
    }
    if (router_pool_full(r->pool)) { /* overload: refused before any relay or worker call */
        refuse(r, call, GRPC_STATUS_RESOURCE_EXHAUSTED, FULL_MSG, g);
        protobuf_c_message_free_unpacked(&g->base, NULL);
        return;
    }
    router_sink sink = {.send = grpc_sink_send, .send_wire = grpc_sink_send_wire,
                        .end = grpc_sink_end, .ctx = call,
                        .top_text = 1, .cq = rpc_call_cq(call), .paced = 1};
    router_req *q;
    status st;
    if (router_relay_create(r, g, &sink, rpc_call_deadline_ms(call), &q, &st)) {
        rpc_call_finish(call, rpc_status_to_grpc(st.code), st.msg);
        return;
    }
    rpc_call_set_data(call, q); /* the call's reference, dropped by on_release */
    router_relay_start(q, &st);
}

static void on_cancel(rpc_call *call, void *user)
{
    (void)user;
    router_req *q = rpc_call_data(call);
    if (q) router_relay_cancel(q);
}

static void on_writable(rpc_call *call, void *user)
{
    (void)user;
    router_req *q = rpc_call_data(call);
    if (q) router_relay_writable(q);
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
        .on_writable = on_writable,
        .owns_request = true,
        .user = r,
    };
    return rpc_server_add_method(r->srv, &m, st);
}
