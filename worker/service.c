/* deltaserve.v1.Worker over rpc_server: see service.h. */
#include "worker/service.h"

#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/splitmix64.h"
#include "gguf/quant.h"
#include "model/chat_template.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "proto/proto_descriptors.h"
#include "rpc/rpc_auth.h"
#include "rpc/rpc_health.h"
#include "rpc/rpc_reflection.h"
#include "rpc/rpc_server.h"
#include "worker/request.h"

#define READY_SERVICE "deltaserve.v1.Worker"

typedef enum ws_state { WS_LOADING, WS_READY, WS_DRAINING } ws_state;

typedef struct ws_stream ws_stream;
typedef struct ws_feed ws_feed;

struct worker_service {
    rpc_server *srv;        /* owned */
    rpc_health *health;     /* owned */
    rpc_reflection *refl;   /* owned */
    rpc_auth *auth;         /* owned, or NULL: no auth_token_file */
    metrics_series *rejected_invalid; /* in the caller's registry, or NULL */
    char name[160];

    pthread_mutex_t mu; /* guards state and the attached pointers */
    ws_state state;
    const qwen35_model *model; /* borrowed */
    worker_backend *backend;   /* borrowed */
    engine *engine;            /* borrowed */
    worker_model_desc desc;
    char path[512];
    char quantization[32];
    char arch[64];
    char model_name[128];
    uint64_t n_params;
    bool has_chat_template; /* the GGUF has a non-empty tokenizer.chat_template */
    bool thinking_default;  /* that template reasons when not told */

    engine_sink sink;           /* the streams' sink (step_arg = this service) */
    pthread_mutex_t smu;        /* the streams' hand-off: guards their n_ready, writing, final,
                                   closing (one lock per engine step for all streams) */
    struct ws_stream *dirty;    /* engine thread only: streams with tokens stored this step */
    struct ws_feed *feeds;      /* under smu: the open feeds (Worker/Feed) */

    atomic_uint_fast64_t n_requests; /* for made-up request ids and seeds */
    uint64_t seed_base;
};

/* ---- the streams: engine thread -> one hand-off per step -> the writer of each call ----
 *
 * Each Generate call has a ws_stream (its rpc_call's data). The engine thread stores every token
 * in the stream's own arrays (sink_token: no lock, no allocation, no formatting) and, once per
 * step (sink_step_end), publishes the step's tokens of all its streams under one lock,
 * ws->smu. One thread at a time holds a stream's writer role (`writing`): it packs the tokens
 * published and not yet sent into one GenerateResponse and sends it, then the role rides with
 * that message until gRPC has taken it (on_writable, CQ thread), where what was published
 * meanwhile goes out in the next message. So a lone stream's token is written at once by the
 * engine thread; tokens that arrive while a write is outstanding travel together. The final
 * message carries whatever is left, and the writer ends the call.
 *
 * A stream whose request named an open feed (WorkerGenerateRequest.feed_id; no logprobs)
 * publishes the same way but queues itself on the feed instead of writing: the feed has one
 * writer role, and its holder packs one FeedItem per queued stream (its tokens not yet sent,
 * WS_MSG_TOKENS at most; the final message once they are all out) into one FeedBatch, so an
 * engine step's messages of all the feed's streams leave as one gRPC message. A stream whose
 * final message was packed has its call finished with the status right after that batch was
 * handed to gRPC. A feed that ends (its caller cancelled it, the connection dropped) ends its
 * streams: the engine sees them cancelled, and their calls end UNAVAILABLE. */

#define WS_MSG_TOKENS 64 /* most tokens one message carries (its logprobs are built on the stack) */

typedef struct ws_stream {
    worker_service *ws;
    rpc_call *call;
    int cap;  /* tokens the request may generate (max_new_tokens) */
    int n_lp; /* top alternatives per token when logprobs were asked, else 0 */
    int interval; /* WorkerGenerateRequest.stream_interval (checked by worker_request_parse), at
                     least 1 */
    /* engine thread only */
    int n_gen;                    /* tokens stored */
    bool dirty;                   /* on ws->dirty: tokens stored this step */
    bool start;                   /* sink_step_end gave it the writer role */
    struct ws_stream *dirty_next;
    /* under ws->smu */
    int n_ready;   /* tokens published to the writer */
    bool writing;  /* a thread holds the writer role (a message of it in flight, or being built) */
    bool final;    /* the request ended: fin* below are set */
    bool closing;  /* the writer is sending the final message: on_writable has nothing to do */
    /* the writer role's holder only (with a feed: the feed's) */
    int n_sent;
    ws_feed *feed;     /* the feed it rides on (attached: counted in feed->n_streams), or NULL */
    uint64_t feed_tag; /* its FeedItems' tag */
    bool queued;       /* under smu: on feed's queue */
    struct ws_stream *queue_next;
    /* set by the engine thread before it publishes them (first token; the end) */
    uint32_t n_prompt, n_cached;
    float queue_ms, prefill_ms, ttft_ms;
    finish_reason fin_reason;
    int32_t fin_stop_token;
    uint32_t fin_generated, fin_cached;
    float fin_decode_ms, fin_total_ms;
    uint32_t fin_spec_steps, fin_spec_drafted, fin_spec_accepted;
    uint64_t fin_seed;
    char fin_id[ENGINE_REQUEST_ID_MAX + 1];
    status fin_result;
    /* owned, one allocation with the struct */
    int32_t *ids;    /* [cap] */
    float *lp;       /* [cap] when n_lp, else NULL */
    uint8_t *n_top;  /* [cap] when n_lp */
    int32_t *top_id; /* [cap][n_lp] */
    float *top_lp;   /* [cap][n_lp] */
} ws_stream;

static float ms_between(int64_t a_us, int64_t b_us) { return a_us && b_us ? (float)(b_us - a_us) / 1000.0f : 0; }

/* One allocation per request (on_generate, CQ thread), freed at on_release. */
static ws_stream *stream_create(worker_service *ws, rpc_call *call, const engine_params *p)
{
    size_t cap = (size_t)p->max_new_tokens, n_lp = (size_t)p->sampling.n_logprobs;
    size_t bytes = sizeof(ws_stream) + cap * sizeof(int32_t);
    if (n_lp) bytes += cap * (sizeof(float) + 1 + n_lp * (sizeof(int32_t) + sizeof(float))) + 8;
    ws_stream *s = calloc(1, bytes);
    if (!s) return NULL;
    s->ws = ws;
    s->call = call;
    s->cap = (int)cap;
    s->n_lp = (int)n_lp;
    char *q = (char *)(s + 1);
    s->ids = (int32_t *)q;
    q += cap * sizeof(int32_t);
    if (n_lp) { /* floats and int32s first (4-byte aligned), the bytes last */
        s->lp = (float *)q;
        q += cap * sizeof(float);
        s->top_id = (int32_t *)q;
        q += cap * n_lp * sizeof(int32_t);
        s->top_lp = (float *)q;
        q += cap * n_lp * sizeof(float);
        s->n_top = (uint8_t *)q;
    }
    return s;
}

static bool feed_closed(const ws_feed *f);
static void feed_detach(ws_stream *s);
static bool sink_cancelled(void *arg)
{
    const ws_stream *s = arg;
    return rpc_call_cancelled(s->call) || (s->feed && feed_closed(s->feed));
}

/* Engine thread, per token: stored, and the stream marked for this step's hand-off. */
static void sink_token(void *arg, const engine_request *r, const worker_batch_item *it)
{
    ws_stream *s = arg;
    DS_ASSERT(s->n_gen < s->cap); /* n_generated <= max_new_tokens */
    const int i = s->n_gen++;
    s->ids[i] = it->out.token;
    if (s->n_lp) {
        const int nt = it->out.n_top < s->n_lp ? it->out.n_top : s->n_lp;
        s->lp[i] = it->out.logprob;
        s->n_top[i] = (uint8_t)nt;
        memcpy(&s->top_id[(size_t)i * s->n_lp], it->out.top_id, (size_t)nt * sizeof(int32_t));
        memcpy(&s->top_lp[(size_t)i * s->n_lp], it->out.top_logprob, (size_t)nt * sizeof(float));
    }
    /* the first message also says what the prompt cost, where its time went and who serves
     * it (see the proto's conventions): the router reports them when it ends a stream itself */
    if (r->n_generated == 1) {
        s->n_prompt = (uint32_t)r->p.n_prompt;
        s->n_cached = (uint32_t)r->n_cached;
        s->queue_ms = ms_between(r->t_arrival, r->t_admit);
        s->prefill_ms = ms_between(r->t_admit, r->t_first);
        s->ttft_ms = ms_between(r->t_arrival, r->t_first);
    }
    if (!s->dirty) {
        s->dirty = true;
        s->dirty_next = s->ws->dirty;
        s->ws->dirty = s;
    }
}

/* The prompt's usage (cached: its cached tokens) and timings, and the worker's name, into m
 * (the first message and the final one carry them). */
static void prompt_fields(const ws_stream *s, uint32_t cached, Deltaserve__V1__GenerateResponse *m,
                          Deltaserve__V1__Usage *u, Deltaserve__V1__Timings *t)
{
    u->prompt_tokens = s->n_prompt;
    u->cached_tokens = cached;
    m->usage = u;
    t->queue_ms = s->queue_ms;
    t->prefill_ms = s->prefill_ms;
    t->ttft_ms = s->ttft_ms;
    m->timings = t;
    m->served_by = s->ws->name;
}

/* The message of tokens [from, from + n) of s (the first one with the prompt's usage and
 * timings). lps/tops: the caller's room for n entries. */
static void tokens_message(ws_stream *s, int from, int n, Deltaserve__V1__GenerateResponse *m,
                           Deltaserve__V1__Usage *u, Deltaserve__V1__Timings *t,
                           Deltaserve__V1__TokenLogprob *lp, Deltaserve__V1__TokenLogprob **lps,
                           Deltaserve__V1__TopLogprob *top, Deltaserve__V1__TopLogprob **tops)
{
    m->n_token_ids = (size_t)n;
    m->token_ids = &s->ids[from];
    if (s->n_lp) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            const int j = from + i;
            lp[i] = (Deltaserve__V1__TokenLogprob)DELTASERVE__V1__TOKEN_LOGPROB__INIT;
            lp[i].token_id = s->ids[j];
            lp[i].logprob = s->lp[j];
            lp[i].n_top = s->n_top[j];
            lp[i].top = &tops[k];
            for (int a = 0; a < s->n_top[j]; a++, k++) {
                top[k] = (Deltaserve__V1__TopLogprob)DELTASERVE__V1__TOP_LOGPROB__INIT;
                top[k].token_id = s->top_id[(size_t)j * s->n_lp + a];
                top[k].logprob = s->top_lp[(size_t)j * s->n_lp + a];
                tops[k] = &top[k];
            }
            lps[i] = &lp[i];
        }
        m->n_logprobs = (size_t)n;
        m->logprobs = lps;
    }
    if (from == 0 && n > 0) prompt_fields(s, s->n_cached, m, u, t);
}

/* The final message's fields of s (its last tokens, if any, are tokens_message's). */
static void final_message(ws_stream *s, Deltaserve__V1__GenerateResponse *m,
                          Deltaserve__V1__Usage *u, Deltaserve__V1__Timings *t)
{
    switch (s->fin_reason) {
    case FINISH_STOP: m->finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_STOP; break;
    case FINISH_LENGTH: m->finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_LENGTH; break;
    case FINISH_CANCELLED: m->finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_CANCELLED; break;
    default: m->finish_reason = DELTASERVE__V1__FINISH_REASON__FINISH_REASON_ERROR; break;
    }
    if (s->fin_reason == FINISH_STOP && s->fin_stop_token >= 0) {
        m->matched_stop_case = DELTASERVE__V1__GENERATE_RESPONSE__MATCHED_STOP_STOP_TOKEN_ID;
        m->stop_token_id = s->fin_stop_token;
    }
    prompt_fields(s, s->fin_cached, m, u, t);
    u->completion_tokens = s->fin_generated;
    t->decode_ms = s->fin_decode_ms;
    t->total_ms = s->fin_total_ms;
    t->mean_itl_ms = s->fin_generated > 1 ? t->decode_ms / (float)(s->fin_generated - 1) : 0;
    t->spec_verify_runs = s->fin_spec_steps;
    t->spec_drafted = s->fin_spec_drafted;
    t->spec_accepted = s->fin_spec_accepted;
    m->request_id = s->fin_id;
    m->seed = s->fin_seed;
}

/* Sends tokens [from, from + n), n <= WS_MSG_TOKENS; with fin, the final message (which
 * carries them). rpc_call_send's code. */
static int send_tokens(ws_stream *s, int from, int n, bool fin)
{
    Deltaserve__V1__GenerateResponse m = DELTASERVE__V1__GENERATE_RESPONSE__INIT;
    Deltaserve__V1__Usage u = DELTASERVE__V1__USAGE__INIT;
    Deltaserve__V1__Timings t = DELTASERVE__V1__TIMINGS__INIT;
    Deltaserve__V1__TokenLogprob lp[WS_MSG_TOKENS];
    Deltaserve__V1__TokenLogprob *lps[WS_MSG_TOKENS];
    Deltaserve__V1__TopLogprob top[WS_MSG_TOKENS * SAMPLING_MAX_LOGPROBS];
    Deltaserve__V1__TopLogprob *tops[WS_MSG_TOKENS * SAMPLING_MAX_LOGPROBS];
    DS_ASSERT(n <= WS_MSG_TOKENS);
    tokens_message(s, from, n, &m, &u, &t, lp, lps, top, tops);
    if (fin) final_message(s, &m, &u, &t);
    return rpc_call_send(s->call, &m.base);
}

/* ---- feeds (Worker/Feed): one stream carrying the messages of many Generate calls ---- */

#define FEED_MAX_ITEMS 512 /* items a batch carries at most (the rest go in the next one) */

struct ws_feed {
    worker_service *ws;
    rpc_call *call;
    uint64_t id;
    /* under ws->smu */
    ws_stream *head, *tail; /* streams with messages to send, in the order they came */
    int n_streams;          /* streams attached (each holds f until it is detached) */
    bool writing;           /* a thread holds the writer role (or a batch of it is in flight) */
    atomic_bool closed;     /* the call is over (cancelled, or a send failed); set under smu,
                            read without it by sink_cancelled (no lock a stream and step) */
    bool drain;             /* the worker drains: end the feed once its streams are done */
    bool ended;             /* rpc_call_finish was called */
    bool released;          /* on_release ran: freed once no stream holds it and no writer */
    struct ws_feed *next;   /* on ws->feeds while open */
    struct ws_feed *kick;   /* a list of feeds whose writer role one thread took (feed_claim) */
    /* the writer role's holder only: a batch's parts, one allocation with the struct */
    Deltaserve__V1__FeedItem *items;
    Deltaserve__V1__FeedItem **itemp;
    Deltaserve__V1__GenerateResponse *resp;
    Deltaserve__V1__Usage *usage;
    Deltaserve__V1__Timings *timings;
};

static bool feed_closed(const ws_feed *f) { return atomic_load(&f->closed); }

/* Under smu: s onto f's queue, unless it is there. */
static void feed_enqueue(ws_feed *f, ws_stream *s)
{
    if (s->queued) return;
    s->queued = true;
    s->queue_next = NULL;
    if (f->tail) f->tail->queue_next = s;
    else f->head = s;
    f->tail = s;
}

/* The feed's writer: packs the queued streams' messages into one FeedBatch and sends it, after
 * which the role rides with it to on_feed_writable; finishes the calls whose final message it
 * carried; with nothing queued it gives the role up (and ends a draining feed without streams,
 * or a closed one). A closed feed's queued streams that are final end UNAVAILABLE (their
 * messages are lost); the others see it in sink_cancelled. Frees f when it was released and
 * nothing holds it. */
static void feed_write(ws_feed *f)
{
    worker_service *ws = f->ws;
    ws_stream *take[FEED_MAX_ITEMS];
    int from[FEED_MAX_ITEMS], cnt[FEED_MAX_ITEMS];
    bool fin[FEED_MAX_ITEMS], fnl[FEED_MAX_ITEMS];
    for (;;) {
        int n = 0;
        pthread_mutex_lock(&ws->smu);
        const bool closed = f->closed;
        while (f->head && n < FEED_MAX_ITEMS) {
            ws_stream *s = f->head;
            f->head = s->queue_next;
            if (!f->head) f->tail = NULL;
            s->queued = false;
            from[n] = s->n_sent;
            cnt[n] = s->n_ready - s->n_sent < WS_MSG_TOKENS ? s->n_ready - s->n_sent : WS_MSG_TOKENS;
            fnl[n] = s->final;
            fin[n] = s->final && s->n_sent + cnt[n] == s->n_ready;
            take[n++] = s;
        }
        if (n == 0) {
            f->writing = false;
            const bool end = !f->ended && (closed || (f->drain && f->n_streams == 0));
            if (end) f->ended = true;
            const bool free_now = f->released && f->n_streams == 0;
            pthread_mutex_unlock(&ws->smu);
            if (end) rpc_call_finish(f->call, closed ? GRPC_STATUS_CANCELLED : GRPC_STATUS_OK,
                                     closed ? "feed closed" : NULL);
            if (free_now) free(f);
            return;
        }
        pthread_mutex_unlock(&ws->smu);
        int k = 0;
        for (int i = 0; i < n && !closed; i++) {
            ws_stream *s = take[i];
            if (fin[i] && s->fin_result.code == STATUS_CANCELLED) continue; /* nobody reads it */
            Deltaserve__V1__GenerateResponse *m = &f->resp[k];
            *m = (Deltaserve__V1__GenerateResponse)DELTASERVE__V1__GENERATE_RESPONSE__INIT;
            f->usage[k] = (Deltaserve__V1__Usage)DELTASERVE__V1__USAGE__INIT;
            f->timings[k] = (Deltaserve__V1__Timings)DELTASERVE__V1__TIMINGS__INIT;
            tokens_message(s, from[i], cnt[i], m, &f->usage[k], &f->timings[k], NULL, NULL, NULL,
                           NULL); /* no logprobs on a feed */
            if (fin[i]) final_message(s, m, &f->usage[k], &f->timings[k]);
            f->items[k] = (Deltaserve__V1__FeedItem)DELTASERVE__V1__FEED_ITEM__INIT;
            f->items[k].tag = s->feed_tag;
            f->items[k].response = m;
            f->itemp[k] = &f->items[k];
            k++;
        }
        int rc = STATUS_OK;
        if (k > 0) {
            Deltaserve__V1__FeedBatch b = DELTASERVE__V1__FEED_BATCH__INIT;
            b.n_items = (size_t)k;
            b.items = f->itemp;
            rc = rpc_call_send(f->call, &b.base);
        }
        /* lost: the batch did not go (the feed is over); its streams that were final end
         * here, the others when the engine has ended them (sink_cancelled) */
        const bool lost = closed || rc != STATUS_OK;
        int detached = 0;
        pthread_mutex_lock(&ws->smu);
        if (rc != STATUS_OK) f->closed = true;
        for (int i = 0; i < n; i++) {
            ws_stream *s = take[i];
            if (lost) {
                detached += fnl[i];
                continue;
            }
            s->n_sent = from[i] + cnt[i];
            if (fin[i]) detached++;
            else if (s->n_ready > s->n_sent || s->final) feed_enqueue(f, s);
        }
        f->n_streams -= detached;
        pthread_mutex_unlock(&ws->smu);
        for (int i = 0; i < n; i++) { /* the calls end after the batch that ended them */
            ws_stream *s = take[i];
            if (lost && fnl[i]) {
                status st = s->fin_result; /* the engine saw the feed's end as a cancel */
                if (st.code == STATUS_OK ||
                    (st.code == STATUS_CANCELLED && !rpc_call_cancelled(s->call)))
                    status_fail(&st, STATUS_UNAVAILABLE, "worker: its token feed closed");
                rpc_call_finish_status(s->call, &st);
            } else if (!lost && fin[i]) {
                rpc_call_finish_status(s->call, &s->fin_result);
            }
        }
        if (!lost && k > 0) return; /* the role rides with the batch to on_feed_writable */
    }
}

/* Under smu: f onto the list of feeds whose writer role the caller takes (unless a writer
 * holds it); returns the list. */
static ws_feed *feed_claim(ws_feed *f, ws_feed *list)
{
    if (f->writing) return list;
    f->writing = true;
    f->kick = list;
    return f;
}

/* Outside smu: each claimed feed's writer runs. */
static void feed_write_claimed(ws_feed *list)
{
    for (ws_feed *f = list, *fn; f; f = fn) {
        fn = f->kick; /* read before: the writer may free a released feed */
        feed_write(f);
    }
}

/* The end, by the writer role's holder: the tokens left (the last ones in the final message),
 * the final message (none when the client is gone) and the status. The call is finished: s
 * must not be touched after (on_release frees it). */
static void stream_close(ws_stream *s, int n_ready)
{
    pthread_mutex_lock(&s->ws->smu);
    s->closing = true; /* the messages below complete into on_writable: nothing to do there */
    pthread_mutex_unlock(&s->ws->smu);
    if (s->fin_result.code != STATUS_CANCELLED) { /* the client is gone: nobody reads them */
        while (n_ready - s->n_sent > WS_MSG_TOKENS) {
            send_tokens(s, s->n_sent, WS_MSG_TOKENS, false); /* queued in order */
            s->n_sent += WS_MSG_TOKENS;
        }
        send_tokens(s, s->n_sent, n_ready - s->n_sent, true);
    }
    rpc_call_finish_status(s->call, &s->fin_result);
}

/* The writer role's holder sends what is published and not sent: one message, after which the
 * role rides with it to on_writable; or, at the end, everything and the status; or, with
 * nothing to send, it gives the role up. */
static void stream_write(ws_stream *s)
{
    worker_service *ws = s->ws;
    for (;;) {
        pthread_mutex_lock(&ws->smu);
        const int n_ready = s->n_ready;
        const bool fin = s->final;
        if (n_ready == s->n_sent && !fin) s->writing = false;
        pthread_mutex_unlock(&ws->smu);
        if (fin) {
            stream_close(s, n_ready);
            return;
        }
        if (n_ready == s->n_sent) return;
        const int from = s->n_sent, n = n_ready - from < WS_MSG_TOKENS ? n_ready - from : WS_MSG_TOKENS;
        s->n_sent = from + n; /* before the send: its completion may run on_writable at once */
        if (send_tokens(s, from, n, false) == STATUS_OK) return;
        s->n_sent = n_ready; /* the call is over on the wire: the engine ends the request */
    }
}

/* CQ thread: the stream's message in flight has left; send what came meanwhile. */
static void on_generate_writable(rpc_call *call, void *user)
{
    ws_stream *s = rpc_call_data(call);
    worker_service *ws = user;
    pthread_mutex_lock(&ws->smu);
    const bool closing = s->closing;
    pthread_mutex_unlock(&ws->smu);
    if (!closing) stream_write(s);
}

/* Engine thread, once per step: the step's tokens of every stream published under one lock;
 * the streams with no writer get one (this thread, which writes them at once). */
static void sink_step_end(void *arg)
{
    worker_service *ws = arg;
    if (!ws->dirty) return;
    ws_feed *kick = NULL; /* feeds whose writer role this thread took */
    pthread_mutex_lock(&ws->smu);
    for (ws_stream *s = ws->dirty; s; s = s->dirty_next) {
        /* the first token at once, then --stream-interval tokens at a time (the end: sink_finish) */
        s->start = false;
        if (s->n_ready > 0 && s->n_gen - s->n_ready < s->interval) continue;
        s->n_ready = s->n_gen;
        if (s->feed) {
            ws_feed *f = s->feed;
            if (s->final) continue;
            feed_enqueue(f, s);
            kick = feed_claim(f, kick);
            continue;
        }
        s->start = !s->writing && !s->final;
        if (s->start) s->writing = true;
    }
    pthread_mutex_unlock(&ws->smu);
    ws_stream *next;
    rpc_cork_begin(); /* the step's messages to one connection leave together (rpc_server.h) */
    for (ws_stream *s = ws->dirty; s; s = next) {
        next = s->dirty_next;
        s->dirty = false;
        if (s->start) stream_write(s); /* its send may complete (on the CQ thread) at once */
    }
    rpc_cork_end();
    ws->dirty = NULL;
    feed_write_claimed(kick);
}

static void sink_finish(void *arg, const engine_request *r)
{
    ws_stream *s = arg;
    worker_service *ws = s->ws;
    if (s->dirty) sink_step_end(ws); /* its last tokens first, with the step's others */
    s->fin_reason = r->finish;
    s->fin_stop_token = r->stop_token;
    s->fin_generated = (uint32_t)r->n_generated;
    s->fin_cached = (uint32_t)r->n_cached;
    if (s->n_gen == 0) { /* else set at the first token (and maybe being read by its writer) */
        s->n_prompt = (uint32_t)r->p.n_prompt;
        s->queue_ms = ms_between(r->t_arrival, r->t_admit);
        s->prefill_ms = ms_between(r->t_admit, r->t_first);
        s->ttft_ms = ms_between(r->t_arrival, r->t_first);
    }
    s->fin_decode_ms = ms_between(r->t_first, r->t_last);
    s->fin_total_ms = ms_between(r->t_arrival, r->t_end);
    s->fin_spec_steps = (uint32_t)r->spec_steps;
    s->fin_spec_drafted = (uint32_t)r->spec_drafted;
    s->fin_spec_accepted = (uint32_t)r->spec_accepted;
    s->fin_seed = r->p.sampling.seed;
    memcpy(s->fin_id, r->p.id, sizeof s->fin_id);
    s->fin_result = r->result;
    pthread_mutex_lock(&ws->smu);
    s->n_ready = s->n_gen;
    s->final = true;
    ws_feed *f = s->feed;
    bool mine;
    if (f) {
        feed_enqueue(f, s);
        mine = !f->writing;
        f->writing = true;
    } else {
        mine = !s->writing;
        s->writing = true;
    }
    pthread_mutex_unlock(&ws->smu);
    if (f && mine) feed_write(f); /* s may be gone after */
    else if (mine) stream_write(s); /* else the writer sends the final after its message */
}

static void on_generate_release(rpc_call *call, void *user) { free(rpc_call_data(call)); }

/* ---- handlers (CQ thread: nothing here blocks) ---- */

/* The attached engine and limits, or an UNAVAILABLE status. */
static engine *attached(worker_service *ws, worker_limits *lim, status *st)
{
    pthread_mutex_lock(&ws->mu);
    engine *e = ws->state == WS_READY ? ws->engine : NULL;
    if (ws->state == WS_LOADING) status_fail(st, STATUS_UNAVAILABLE, "worker is loading the model");
    else if (ws->state == WS_DRAINING) status_fail(st, STATUS_UNAVAILABLE, "worker is draining");
    if (e && lim) {
        lim->vocab = ws->backend->vocab;
        lim->n_ctx = ws->backend->n_ctx;
    }
    pthread_mutex_unlock(&ws->mu);
    return e;
}

static void on_generate(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    const Deltaserve__V1__WorkerGenerateRequest *req = (const void *)msg;
    status st;
    worker_limits lim;
    engine *e = attached(ws, &lim, &st);
    if (!e) {
        rpc_call_finish_status(call, &st);
        return;
    }
    uint64_t n = atomic_fetch_add(&ws->n_requests, 1);
    char fallback[32];
    snprintf(fallback, sizeof fallback, "w%llu", (unsigned long long)n);
    uint64_t seed = splitmix64(ws->seed_base ^ (n * 0x2545f4914f6cdd1dull));
    if (seed == 0) seed = 1;
    engine_params p;
    if (worker_request_parse(req, &lim, seed, fallback, &p, &st)) {
        if (ws->rejected_invalid) metrics_inc(ws->rejected_invalid, 1);
        LOG_INFO("request %s: rejected: %s", p.id[0] ? p.id : fallback, st.msg);
        rpc_call_finish_status(call, &st);
        return;
    }
    ws_stream *s = stream_create(ws, call, &p);
    if (!s) {
        status_fail(&st, STATUS_NOMEM, "request %s: out of memory for its stream", p.id);
        rpc_call_finish_status(call, &st);
        return;
    }
    s->interval = req->stream_interval > 1 ? (int)req->stream_interval : 1;
    rpc_call_set_data(call, s); /* freed at on_release */
    if (req->feed_id && !s->n_lp) { /* its messages on that feed, when it is open */
        pthread_mutex_lock(&ws->smu);
        for (ws_feed *f = ws->feeds; f; f = f->next)
            if (f->id == req->feed_id && !f->closed && !f->drain) {
                s->feed = f;
                s->feed_tag = req->feed_tag;
                f->n_streams++;
                break;
            }
        pthread_mutex_unlock(&ws->smu);
    }
    if (engine_submit(e, &p, &ws->sink, s, &st)) {
        if (s->feed) feed_detach(s);
        /* refusals come in floods under overload: one line a second, with counts */
        static log_limit refused_log;
        long more;
        double since;
        if (LOG_LEVEL_INFO >= log_threshold && log_limit_pass(&refused_log, &more, &since)) {
            if (more)
                LOG_INFO("request %s: rejected: %s (%ld more rejected in the last %.1f s)", p.id,
                         st.msg, more, since);
            else
                LOG_INFO("request %s: rejected: %s", p.id, st.msg);
        }
        rpc_call_finish_status(call, &st);
    }
}

/* s leaves its feed without having sent anything on it (refused at submission). */
static void feed_detach(ws_stream *s)
{
    ws_feed *f = s->feed;
    pthread_mutex_lock(&s->ws->smu);
    f->n_streams--;
    const bool kick = !f->writing && f->n_streams == 0 && (f->closed || f->drain);
    if (kick) f->writing = true;
    pthread_mutex_unlock(&s->ws->smu);
    s->feed = NULL;
    if (kick) feed_write(f); /* ends it, or frees it when released */
}

/* Worker/Feed: registers the feed and sends the empty batch that says so. */
static void on_feed(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    const Deltaserve__V1__FeedRequest *req = (const void *)msg;
    status st;
    if (!attached(ws, NULL, &st)) {
        rpc_call_finish_status(call, &st);
        return;
    }
    if (req->feed_id == 0) {
        rpc_call_finish(call, GRPC_STATUS_INVALID_ARGUMENT, "feed_id: must not be 0");
        return;
    }
    const size_t per = sizeof(Deltaserve__V1__FeedItem) + sizeof(Deltaserve__V1__FeedItem *) +
                       sizeof(Deltaserve__V1__GenerateResponse) + sizeof(Deltaserve__V1__Usage) +
                       sizeof(Deltaserve__V1__Timings);
    ws_feed *f = calloc(1, sizeof *f + FEED_MAX_ITEMS * per);
    if (!f) {
        rpc_call_finish(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "worker: out of memory for a feed");
        return;
    }
    f->ws = ws;
    f->call = call;
    f->id = req->feed_id;
    f->items = (Deltaserve__V1__FeedItem *)(f + 1);
    f->itemp = (Deltaserve__V1__FeedItem **)(f->items + FEED_MAX_ITEMS);
    f->resp = (Deltaserve__V1__GenerateResponse *)(f->itemp + FEED_MAX_ITEMS);
    f->usage = (Deltaserve__V1__Usage *)(f->resp + FEED_MAX_ITEMS);
    f->timings = (Deltaserve__V1__Timings *)(f->usage + FEED_MAX_ITEMS);
    bool taken = false;
    pthread_mutex_lock(&ws->smu);
    for (ws_feed *o = ws->feeds; o; o = o->next) taken |= o->id == f->id;
    if (!taken) {
        f->next = ws->feeds;
        ws->feeds = f;
        f->writing = true; /* the role rides with the first (empty) batch */
    }
    pthread_mutex_unlock(&ws->smu);
    if (taken) {
        free(f);
        rpc_call_finish(call, GRPC_STATUS_ALREADY_EXISTS, "feed_id: a feed of that id is open");
        return;
    }
    rpc_call_set_data(call, f);
    Deltaserve__V1__FeedBatch b = DELTASERVE__V1__FEED_BATCH__INIT;
    if (rpc_call_send(call, &b.base) != STATUS_OK) { /* over already: on_cancel follows */
        pthread_mutex_lock(&ws->smu);
        f->closed = true;
        pthread_mutex_unlock(&ws->smu);
        feed_write(f);
    }
}

/* Under smu: f off ws->feeds (no new stream attaches). */
static void feed_unlist(worker_service *ws, ws_feed *f)
{
    for (ws_feed **pp = &ws->feeds; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            break;
        }
}

static void on_feed_writable(rpc_call *call, void *user)
{
    (void)user;
    feed_write(rpc_call_data(call));
}

/* The caller cancelled the feed, or the connection dropped: its streams end. */
static void on_feed_cancel(rpc_call *call, void *user)
{
    worker_service *ws = user;
    ws_feed *f = rpc_call_data(call);
    if (!f) return;
    pthread_mutex_lock(&ws->smu);
    f->closed = true;
    feed_unlist(ws, f);
    const bool mine = !f->writing;
    f->writing = true;
    pthread_mutex_unlock(&ws->smu);
    if (mine) feed_write(f);
}

static void on_feed_release(rpc_call *call, void *user)
{
    worker_service *ws = user;
    ws_feed *f = rpc_call_data(call);
    if (!f) return;
    pthread_mutex_lock(&ws->smu);
    feed_unlist(ws, f);
    f->released = true;
    const bool free_now = f->n_streams == 0 && !f->writing;
    pthread_mutex_unlock(&ws->smu);
    if (free_now) free(f);
}

static void on_abort(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    const Deltaserve__V1__AbortRequest *req = (const void *)msg;
    status st;
    engine *e = attached(ws, NULL, &st);
    Deltaserve__V1__AbortResponse r = DELTASERVE__V1__ABORT_RESPONSE__INIT;
    r.found = e && req->request_id[0] && engine_abort(e, req->request_id);
    rpc_call_reply(call, &r.base);
}

static void on_get_load(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    const Deltaserve__V1__GetLoadRequest *req = (const void *)msg;
    Deltaserve__V1__Load l = DELTASERVE__V1__LOAD__INIT;
    uint64_t heads[WORKER_SERVICE_MAX_HEADS];
    pthread_mutex_lock(&ws->mu);
    engine *e = ws->engine;
    bool draining = ws->state == WS_DRAINING;
    pthread_mutex_unlock(&ws->mu);
    if (e) {
        engine_load el = {0};
        engine_get_load(e, &el);
        l.running = (uint32_t)el.running;
        l.waiting = (uint32_t)el.waiting;
        l.free_slots = (uint32_t)el.free_slots;
        l.total_slots = (uint32_t)el.total_slots;
        l.outstanding_tokens = el.outstanding_tokens;
        l.free_kv_blocks = el.free_kv_blocks;
        l.total_kv_blocks = el.total_kv_blocks;
        l.tokens_per_second = (float)el.tokens_per_second;
        l.queue_capacity = (uint32_t)el.queue_capacity;
        draining = draining || el.draining;
        l.prefix_cache = el.prefix_cache;
        l.prefix_queries = el.prefix_queries;
        l.prefix_hits = el.prefix_hits;
        l.prefix_queried_tokens = el.prefix_queried_tokens;
        l.prefix_cached_tokens = el.prefix_cached_tokens;
        l.prefix_evictions = el.prefix_evictions;
        l.prefix_snapshots = el.prefix_snapshots;
        l.prefix_blocks = el.prefix_blocks;
        l.prefix_snapshot_bytes = el.prefix_snapshot_bytes;
        l.speculative = el.speculative;
        l.spec_verify_runs = el.spec_steps;
        l.spec_drafted = el.spec_drafted;
        l.spec_accepted = el.spec_accepted;
        l.spec_switched_off = el.spec_switched_off;
        if (req->prefix_tokens > 0) {
            int nt = req->prefix_tokens < INT32_MAX ? (int)req->prefix_tokens : INT32_MAX;
            int n = engine_prefix_heads(e, nt, heads,
                                        WORKER_SERVICE_MAX_HEADS);
            l.n_prefix_heads = n > 0 ? (size_t)n : 0;
            l.prefix_heads = heads;
        }
    }
    l.draining = draining;
    rpc_call_reply(call, &l.base);
}

static void on_get_model_info(rpc_call *call, const ProtobufCMessage *msg, void *user)
{
    worker_service *ws = user;
    status st;
    pthread_mutex_lock(&ws->mu);
    if (!ws->model) {
        pthread_mutex_unlock(&ws->mu);
        status_fail(&st, STATUS_UNAVAILABLE, "worker is loading the model");
        rpc_call_finish_status(call, &st);
        return;
    }
    const qwen35_config *c = &ws->model->cfg;
    Deltaserve__V1__ModelInfo mi = DELTASERVE__V1__MODEL_INFO__INIT;
    mi.architecture = ws->arch;
    mi.name = ws->model_name;
    mi.n_params = ws->n_params;
    mi.n_layers = (uint32_t)c->n_layer;
    mi.n_deltanet_layers = (uint32_t)c->n_gdn_layers;
    mi.n_attention_layers = (uint32_t)c->n_attn_layers;
    mi.hidden_size = (uint32_t)c->H;
    mi.vocab_size = (uint32_t)c->V;
    mi.n_eos_token_ids = (size_t)ws->desc.n_eos_ids;
    mi.eos_token_ids = ws->desc.eos_ids;
    mi.max_context = (uint32_t)ws->backend->n_ctx;
    mi.quantization = ws->quantization;
    mi.device = ws->backend->device;
    mi.max_running = (uint32_t)ws->backend->n_slots;
    mi.path = ws->path;
    mi.bos_token_id = ws->desc.bos_id;
    mi.has_chat_template = ws->has_chat_template;
    mi.thinking_default = ws->thinking_default;
    pthread_mutex_unlock(&ws->mu);
    rpc_call_reply(call, &mi.base); /* packed (copied) before return: pointers may go after */
}

/* ---- model description ---- */

static void upper(char *s)
{
    for (; *s; s++) *s = (char)toupper((unsigned char)*s);
}

/* general.file_type (llama_ftype) name, else the weight type holding the most bytes. */
static void describe_quantization(const gguf_file *f, char *out, size_t cap)
{
    static const struct { uint32_t ft; const char *name; } ftypes[] = {
        {0, "F32"}, {1, "F16"}, {2, "Q4_0"}, {3, "Q4_1"}, {7, "Q8_0"}, {8, "Q5_0"}, {9, "Q5_1"},
        {10, "Q2_K"}, {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
        {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"}, {18, "Q6_K"}, {32, "BF16"},
    };
    uint32_t ft;
    if (gguf_get_u32(f, "general.file_type", &ft, NULL) == STATUS_OK)
        for (size_t i = 0; i < sizeof ftypes / sizeof *ftypes; i++)
            if (ftypes[i].ft == ft) {
                snprintf(out, cap, "%s", ftypes[i].name);
                return;
            }
    uint64_t bytes[64] = {0};
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].n_dims >= 2 && f->tensors[i].type < 64)
            bytes[f->tensors[i].type] += f->tensors[i].n_bytes;
    uint32_t best = 0;
    for (uint32_t t = 1; t < 64; t++)
        if (bytes[t] > bytes[best]) best = t;
    const quant_traits *q = quant_get(best);
    snprintf(out, cap, "%s", q && q->name ? q->name : "unknown");
    upper(out);
}

static void copy_gguf_str(const gguf_file *f, const char *key, char *out, size_t cap, const char *def)
{
    gguf_str s;
    if (gguf_get_str(f, key, &s, NULL) == STATUS_OK && s.len > 0)
        snprintf(out, cap, "%.*s", (int)(s.len < cap ? s.len : cap - 1), s.ptr);
    else
        snprintf(out, cap, "%s", def);
}

void worker_service_attach(worker_service *ws, const qwen35_model *m, worker_backend *b,
                           engine *e, const worker_model_desc *desc)
{
    const gguf_file *f = m->file;
    uint64_t n_params = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        uint64_t n = 1;
        for (uint32_t d = 0; d < f->tensors[i].n_dims; d++) n *= f->tensors[i].ne[d];
        n_params += n;
    }
    const char *base = strrchr(desc->path, '/');
    base = base ? base + 1 : desc->path;
    pthread_mutex_lock(&ws->mu);
    ws->model = m;
    ws->backend = b;
    ws->engine = e;
    ws->desc = *desc;
    snprintf(ws->path, sizeof ws->path, "%s", desc->path);
    ws->desc.path = ws->path;
    ws->n_params = n_params;
    describe_quantization(f, ws->quantization, sizeof ws->quantization);
    copy_gguf_str(f, "general.architecture", ws->arch, sizeof ws->arch, "qwen35");
    copy_gguf_str(f, "general.name", ws->model_name, sizeof ws->model_name, base);
    gguf_str tmpl;
    chat_template *ct = NULL;
    char ct_err[200];
    /* has_chat_template: a template the renderer (the router's, the same code) can run */
    ws->has_chat_template = gguf_get_str(f, "tokenizer.chat_template", &tmpl, NULL) == STATUS_OK &&
                            tmpl.len > 0 &&
                            chat_template_parse(tmpl.ptr, (size_t)tmpl.len, &ct, ct_err,
                                                sizeof ct_err) == 0;
    ws->thinking_default = ct && chat_template_thinking_default(ct);
    chat_template_free(ct);
    if (ws->state == WS_LOADING) ws->state = WS_READY;
    bool ready = ws->state == WS_READY;
    pthread_mutex_unlock(&ws->mu);
    rpc_health_set_ready(ws->health, ready);
}

/* ---- lifecycle ---- */

int worker_service_create(const worker_service_opts *o, worker_service **out, status *st)
{
    static const char *ready[] = {READY_SERVICE};
    static const char *services[] = {READY_SERVICE, "grpc.health.v1.Health",
                                     "grpc.reflection.v1alpha.ServerReflection",
                                     "grpc.reflection.v1.ServerReflection"};
    *out = NULL;
    worker_service *ws = calloc(1, sizeof *ws);
    if (!ws) return status_fail(st, STATUS_NOMEM, "worker service: out of memory");
    pthread_mutex_init(&ws->mu, NULL);
    pthread_mutex_init(&ws->smu, NULL);
    ws->sink = (engine_sink){sink_cancelled, sink_token, sink_finish, sink_step_end, ws};
    ws->state = WS_LOADING;
    ws->seed_base = splitmix64((uint64_t)clock_now_us() ^ ((uint64_t)(uintptr_t)ws << 16));
    if (o->metrics)
        ws->rejected_invalid = metrics_counter(o->metrics, "deltaserve:request_rejected_total",
                                               "reason=\"invalid\"", "Requests refused at admission.");
    const rpc_method methods[] = {
        {"/deltaserve.v1.Worker/Generate", &deltaserve__v1__worker_generate_request__descriptor,
         RPC_METHOD_SERVER_STREAM, on_generate, NULL, on_generate_release, ws, false,
         on_generate_writable, false},
        {"/deltaserve.v1.Worker/Abort", &deltaserve__v1__abort_request__descriptor,
         RPC_METHOD_UNARY, on_abort, NULL, NULL, ws, false, NULL, false},
        {"/deltaserve.v1.Worker/GetLoad", &deltaserve__v1__get_load_request__descriptor,
         RPC_METHOD_UNARY, on_get_load, NULL, NULL, ws, false, NULL, false},
        {"/deltaserve.v1.Worker/GetModelInfo", &deltaserve__v1__get_model_info_request__descriptor,
         RPC_METHOD_UNARY, on_get_model_info, NULL, NULL, ws, false, NULL, false},
        {"/deltaserve.v1.Worker/Feed", &deltaserve__v1__feed_request__descriptor,
         RPC_METHOD_SERVER_STREAM, on_feed, on_feed_cancel, on_feed_release, ws, true,
         on_feed_writable, false},
    };
    if (o->auth_token_file && rpc_auth_create(o->auth_token_file, &ws->auth, st)) goto fail;
    if (rpc_server_create(&(rpc_server_opts){.listen = o->listen, .max_calls = o->max_calls,
                                             .tls = o->tls, .health_listen = o->health_listen,
                                             .auth = ws->auth},
                          &ws->srv, st))
        goto fail;
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++)
        if (rpc_server_add_method(ws->srv, &methods[i], st)) goto fail;
    /* with a token: deltaserve.v1.Worker needs it; health (probes) and reflection stay open */
    rpc_server_require_auth(ws->srv, "/deltaserve.v1.Worker/");
    if (rpc_health_create(ready, 1, &ws->health, st) || rpc_health_add_methods(ws->health, ws->srv, st) ||
        rpc_reflection_create(proto_descriptors_data, proto_descriptors_bytes, services, 4,
                              &ws->refl, st) ||
        rpc_reflection_add_methods(ws->refl, ws->srv, st))
        goto fail;
    if (o->name && o->name[0]) {
        snprintf(ws->name, sizeof ws->name, "%s", o->name);
    } else {
        const char *colon = strrchr(o->listen, ':');
        int hn = colon ? (int)(colon - o->listen) : (int)strlen(o->listen);
        snprintf(ws->name, sizeof ws->name, "%.*s:%d", hn, o->listen, rpc_server_port(ws->srv));
    }
    if (rpc_server_start(ws->srv, st)) goto fail;
    *out = ws;
    return STATUS_OK;
fail:
    worker_service_destroy(ws);
    return st->code;
}

int worker_service_port(const worker_service *ws) { return rpc_server_port(ws->srv); }
int worker_service_health_port(const worker_service *ws) { return rpc_server_health_port(ws->srv); }
const char *worker_service_name(const worker_service *ws) { return ws->name; }

void worker_service_begin_drain(worker_service *ws)
{
    pthread_mutex_lock(&ws->mu);
    ws->state = WS_DRAINING;
    pthread_mutex_unlock(&ws->mu);
    rpc_health_set_ready(ws->health, false);
    /* each feed ends once its streams are done (at once without any) */
    ws_feed *kick = NULL;
    pthread_mutex_lock(&ws->smu);
    for (ws_feed *f = ws->feeds; f; f = f->next) {
        f->drain = true;
        kick = feed_claim(f, kick);
    }
    pthread_mutex_unlock(&ws->smu);
    feed_write_claimed(kick);
}

int worker_service_drain(worker_service *ws, int64_t grace_ms)
{
    worker_service_begin_drain(ws);
    pthread_mutex_lock(&ws->mu);
    engine *e = ws->engine;
    pthread_mutex_unlock(&ws->mu);
    return e ? engine_drain(e, grace_ms) : 0;
}

bool worker_service_shutdown(worker_service *ws, int64_t flush_ms)
{
    return !ws->srv || rpc_server_shutdown_grace(ws->srv, flush_ms);
}

void worker_service_destroy(worker_service *ws)
{
    if (!ws) return;
    /* a no-op after worker_service_shutdown; every call ended: no handler runs after */
    if (ws->srv) worker_service_shutdown(ws, WORKER_SERVICE_FLUSH_MS);
    rpc_health_destroy(ws->health);
    rpc_reflection_destroy(ws->refl);
    rpc_server_destroy(ws->srv);
    rpc_auth_destroy(ws->auth); /* after the server: no check runs any more */
    pthread_mutex_destroy(&ws->mu);
    pthread_mutex_destroy(&ws->smu);
    free(ws);
}
