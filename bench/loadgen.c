/* Closed-loop load generator over the public API (deltaserve.v1.Generation/Generate), or a
 * worker's (--worker). --concurrency threads, each with its own completion queue, each running
 * one stream after another until --requests streams have finished (or --duration-s passed).
 *
 * Prints streams/s, tokens/s, and TTFT and inter-token latency p50/p90/p99: as the server
 * reports them in each stream's final message (timings.ttft_ms, timings.mean_itl_ms), and as
 * this client sees them (first message; gaps between messages, per token).
 *
 *   bazel-bin/bench/loadgen --addr 127.0.0.1:50051 --concurrency 8 --requests 400 \
 *       --ids 1,2,3,4 --max-tokens 32 --ignore-eos
 *
 * --steady: the --warmup streams run in the same threads just ahead of the counted ones, with no
 * barrier between them, so the counted streams arrive as earlier ones end (the spread the server
 * itself gave the first wave) instead of all at once; tokens/s is then every stream's tokens
 * received between the first counted stream's start and the moment the first thread finds no
 * stream left (before the tail, where fewer streams run). Without it the warm-up is a phase of
 * its own and the counted streams start together.
 *
 * --backoff-ms N: a thread whose stream failed (refused under overload, say) waits N ms before
 * its next stream, as a client that backs off; without it a refused thread asks again at once.
 *
 * Cancellation churn: --cancel-after N cancels each counted stream after k tokens, k from 0 to
 * N spread over the streams (k = 0: before the first token); those end CANCELLED and count as
 * cancelled, not failed. --load-addr A,B,...: the workers' GetLoad after the warm-up and again
 * once the run is over and they are idle (30 s at most): exit 1 unless every worker has the
 * same free slots and KV blocks after as before, with nothing running or waiting (blocks held
 * only by a worker's prefix cache count as free: Load.prefix_blocks).
 *
 * Prefix-reuse modes (token ids only; ids drawn from --id-range LO,HI by --id-seed):
 *   --users N --turns T --system-tokens S --user-tokens U   multi-turn: N conversations of T
 *       turns, --concurrency of them at once; turn t's prompt is the S-token system prompt
 *       (one for all users) + every earlier turn's user tokens and the tokens generated for it
 *       + U new user tokens; G = --max-tokens generated per turn.
 *   --shared-prefix P --suffix-tokens U   --requests R prompts of one P-token prefix and a
 *       distinct U-token suffix each.
 * Each reports TTFT (client) p50/p99 of the turns >= 2 (shared-prefix: the requests after the
 * first) and of turn 1, the prompt tokens sent, the usage.cached_tokens reported, the reusable
 * tokens (the longest prefix a prompt shares with a prompt sent before it or with a finished
 * request's prompt + generated tokens, less the prompt's last token: its logits are always
 * computed), cached / reusable, the computed tokens (prompt - cached) over the unique ones
 * (prompt - reusable), and throughput; then one line "loadgen-summary mode=... key=value ..."
 * (every mode) for scripts.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/flags.h"
#include "common/splitmix64.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "router/router_dns.h"
#include "rpc/rpc_client.h"
#include "rpc/rpc_status.h"

typedef struct loadgen_opts {
    const char *addr, *ids, *prompt, *load_addr, *id_range;
    int concurrency, requests, warmup, steady, max_tokens, ignore_eos, worker, cancel_after;
    int users, turns, system_tokens, user_tokens, shared_prefix, suffix_tokens;
    int64_t id_seed;
    float duration_s, temperature;
    int64_t timeout_ms;
    int backoff_ms;
} loadgen_opts;

static const flag_spec specs[] = {
    {"addr", "DS_ADDR", "127.0.0.1:50051", FLAG_STR, offsetof(loadgen_opts, addr),
     "router (or --worker) address"},
    {"concurrency", NULL, "8", FLAG_INT, offsetof(loadgen_opts, concurrency),
     "streams in flight (one thread and one completion queue each)"},
    {"requests", NULL, "200", FLAG_INT, offsetof(loadgen_opts, requests),
     "streams to complete (after the warm-up)"},
    {"duration-s", NULL, "0", FLAG_FLOAT, offsetof(loadgen_opts, duration_s),
     "stop after this long instead (0 = use --requests)"},
    {"warmup", NULL, "0", FLAG_INT, offsetof(loadgen_opts, warmup),
     "streams run first and not counted"},
    {"steady", NULL, NULL, FLAG_BOOL, offsetof(loadgen_opts, steady),
     "the warm-up flows into the counted streams in the same threads (no barrier): latencies "
     "and tokens/s of the steady state, not of STREAMS prompts at once"},
    {"ids", NULL, "1,2,3,4,5,6,7,8", FLAG_STR, offsetof(loadgen_opts, ids), "prompt token ids"},
    {"prompt", NULL, NULL, FLAG_STR, offsetof(loadgen_opts, prompt),
     "prompt text instead of --ids (router with --model)"},
    {"max-tokens", NULL, "32", FLAG_INT, offsetof(loadgen_opts, max_tokens),
     "tokens per stream"},
    {"ignore-eos", NULL, NULL, FLAG_BOOL, offsetof(loadgen_opts, ignore_eos),
     "generate exactly --max-tokens"},
    {"temperature", NULL, "0", FLAG_FLOAT, offsetof(loadgen_opts, temperature), "0 = greedy"},
    {"timeout-ms", NULL, "60000", FLAG_I64, offsetof(loadgen_opts, timeout_ms),
     "deadline per stream"},
    {"backoff-ms", NULL, "0", FLAG_INT, offsetof(loadgen_opts, backoff_ms),
     "after a failed stream, wait this long before the thread's next one (a client that backs "
     "off when refused; 0: at once)"},
    {"worker", NULL, NULL, FLAG_BOOL, offsetof(loadgen_opts, worker),
     "--addr is a worker: deltaserve.v1.Worker/Generate"},
    {"cancel-after", NULL, "-1", FLAG_INT, offsetof(loadgen_opts, cancel_after),
     "cancel each counted stream after 0..N tokens (spread over the streams); -1: never"},
    {"load-addr", NULL, NULL, FLAG_STR, offsetof(loadgen_opts, load_addr),
     "workers (A,B,...) whose GetLoad must be the same after the run as before it"},
    {"users", NULL, "0", FLAG_INT, offsetof(loadgen_opts, users),
     "multi-turn mode: conversations (0: off)"},
    {"turns", NULL, "4", FLAG_INT, offsetof(loadgen_opts, turns), "multi-turn: turns per user"},
    {"system-tokens", NULL, "64", FLAG_INT, offsetof(loadgen_opts, system_tokens),
     "multi-turn: tokens of the system prompt every conversation starts with"},
    {"user-tokens", NULL, "16", FLAG_INT, offsetof(loadgen_opts, user_tokens),
     "multi-turn: new user tokens per turn"},
    {"shared-prefix", NULL, "0", FLAG_INT, offsetof(loadgen_opts, shared_prefix),
     "shared-prefix mode: tokens of the prefix every request shares (0: off)"},
    {"suffix-tokens", NULL, "16", FLAG_INT, offsetof(loadgen_opts, suffix_tokens),
     "shared-prefix: distinct tokens after the prefix"},
    {"id-range", NULL, "100,999", FLAG_STR, offsetof(loadgen_opts, id_range),
     "multi-turn and shared-prefix: token ids drawn from LO,HI"},
    {"id-seed", NULL, "1", FLAG_I64, offsetof(loadgen_opts, id_seed),
     "multi-turn and shared-prefix: seed of the drawn ids"},
    {0},
};

/* --steady: the window of the steady state, shared by the threads */
typedef struct loadgen_window {
    atomic_llong tokens; /* every stream's tokens so far */
    atomic_int ended;
    double t_a, t_b;     /* first counted stream's start; first thread out of streams */
    long long tok_a, tok_b;
} loadgen_window;

/* A growable array of doubles. */
typedef struct loadgen_vec {
    double *v;
    size_t n, cap;
} loadgen_vec;

static void vec_push(loadgen_vec *a, double x)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 1024;
        double *v = realloc(a->v, cap * sizeof *v);
        if (!v) return; /* drop the sample rather than abort the run */
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
}

static void vec_append(loadgen_vec *a, const loadgen_vec *b)
{
    for (size_t i = 0; i < b->n; i++) vec_push(a, b->v[i]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(const loadgen_vec *a, double p)
{
    if (!a->n) return 0;
    size_t i = (size_t)(p / 100.0 * (double)(a->n - 1) + 0.5);
    return a->v[i];
}

typedef struct loadgen_thread {
    const loadgen_opts *o;
    rpc_client_channel *ch;
    const ProtobufCMessage *req;
    const char *path;
    atomic_int *next;     /* shared: streams claimed */
    loadgen_window *win;  /* --steady: shared, else NULL */
    int total;            /* warmup + requests, or INT32_MAX with a duration */
    double end_s;         /* monotonic deadline with --duration-s, else 0 */
    pthread_t th;
    /* results (counted streams only) */
    int64_t ok, tokens, msgs, errors[17], cancelled;
    loadgen_vec ttft_srv, itl_srv, ttft_cli, itl_cli;
} loadgen_thread;

static void *run_thread(void *arg)
{
    loadgen_thread *t = arg;
    rpc_client_cq *cq = rpc_client_cq_create();
    for (;;) {
        int k = atomic_fetch_add(t->next, 1);
        if (k >= t->total || (t->end_s && clock_now_s() >= t->end_s)) {
            if (t->win && !atomic_exchange(&t->win->ended, 1)) {
                t->win->tok_b = atomic_load(&t->win->tokens);
                t->win->t_b = clock_now_s();
            }
            break;
        }
        int counted = k >= t->o->warmup;
        if (t->win && k == t->o->warmup) {
            t->win->tok_a = atomic_load(&t->win->tokens);
            t->win->t_a = clock_now_s();
        }
        rpc_client_stream *s;
        status st;
        double t0 = clock_now_s(), last = t0, first = 0;
        if (rpc_client_stream_start_on(&s, cq, t->ch, t->path, t->req, t->o->timeout_ms, NULL,
                                       &st)) {
            if (counted) t->errors[GRPC_STATUS_INTERNAL]++;
            continue;
        }
        ProtobufCMessage *pm;
        rpc_client_result res;
        int64_t n_tok = 0, n_msg = 0;
        /* --cancel-after: this stream's cancel point, spread over 0..N by the stream's index */
        const int64_t cut = counted && t->o->cancel_after >= 0
                                ? (int64_t)((uint64_t)k * 2654435761u % (uint64_t)(t->o->cancel_after + 1))
                                : -1;
        bool cut_done = cut == 0;
        if (cut_done) rpc_client_stream_cancel(s);
        loadgen_vec gaps = {0};
        float srv_ttft = -1, srv_itl = -1;
        while (rpc_client_stream_next(s, &deltaserve__v1__generate_response__descriptor, &pm,
                                      &res)) {
            Deltaserve__V1__GenerateResponse *m = (Deltaserve__V1__GenerateResponse *)pm;
            double now = clock_now_s();
            n_msg++;
            if (m->n_token_ids) {
                if (!first) first = now;
                else
                    for (size_t i = 0; i < m->n_token_ids; i++)
                        vec_push(&gaps, (now - last) * 1e3 / (double)m->n_token_ids);
                last = now;
                n_tok += (int64_t)m->n_token_ids;
                if (t->win) atomic_fetch_add(&t->win->tokens, (long long)m->n_token_ids);
                if (cut > 0 && !cut_done && n_tok >= cut) {
                    rpc_client_stream_cancel(s);
                    cut_done = true;
                }
            }
            if (m->finish_reason && m->timings) {
                srv_ttft = m->timings->ttft_ms;
                srv_itl = m->timings->mean_itl_ms;
            }
            protobuf_c_message_free_unpacked(pm, NULL);
        }
        rpc_client_stream_destroy(s);
        if (counted) {
            if (cut_done && res.code == GRPC_STATUS_CANCELLED) {
                t->cancelled++;
            } else if (res.code == 0) {
                t->ok++;
                t->tokens += n_tok;
                t->msgs += n_msg;
                if (srv_ttft >= 0) vec_push(&t->ttft_srv, srv_ttft);
                if (srv_itl > 0) vec_push(&t->itl_srv, srv_itl);
                if (first) vec_push(&t->ttft_cli, (first - t0) * 1e3);
                vec_append(&t->itl_cli, &gaps);
            } else {
                t->errors[res.code >= 0 && res.code < 17 ? res.code : 2]++;
            }
        }
        free(gaps.v);
        if (res.code != 0 && !cut_done && t->o->backoff_ms > 0) {
            struct timespec pause = {t->o->backoff_ms / 1000, (long)(t->o->backoff_ms % 1000) * 1000000L};
            nanosleep(&pause, NULL);
        }
    }
    rpc_client_cq_destroy(cq);
    return NULL;
}

static int parse_ids(const char *s, int32_t **out, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof *v);
    while (v && *s) {
        while (*s == ',' || *s == ' ') s++;
        if (!*s) break;
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s) { free(v); return -1; }
        if (k == cap) {
            int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
            if (!nv) { free(v); return -1; }
            v = nv;
        }
        v[k++] = (int32_t)x;
        s = end;
    }
    if (!v || !k) { free(v); return -1; }
    *out = v;
    *n = k;
    return 0;
}

static void print_pcts(const char *what, loadgen_vec *a)
{
    qsort(a->v, a->n, sizeof *a->v, cmp_double);
    printf("  %-36s p50 %8.2f   p90 %8.2f   p99 %8.2f   (n=%zu)\n", what, pct(a, 50), pct(a, 90),
           pct(a, 99), a->n);
}

/* Worker/GetLoad of `addr`; 0 on success */
static int get_load(const char *addr, Deltaserve__V1__Load *out, char *why, size_t why_size)
{
    rpc_client_channel *ch;
    status st;
    if (rpc_client_channel_create(&ch, addr, &st)) {
        snprintf(why, why_size, "%s", st.msg);
        return -1;
    }
    Deltaserve__V1__GetLoadRequest req = DELTASERVE__V1__GET_LOAD_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    rpc_client_result r;
    const int code = rpc_client_unary(ch, "/deltaserve.v1.Worker/GetLoad", &req.base,
                                      &deltaserve__v1__load__descriptor, &resp, 5000, &r);
    rpc_client_channel_destroy(ch);
    if (code) {
        snprintf(why, why_size, "GetLoad: %s (%s)", rpc_status_grpc_name((grpc_status_code)code),
                 r.message);
        return -1;
    }
    *out = *(Deltaserve__V1__Load *)resp;
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

/* the loads of the workers w->addr[0 .. w->n) into loads[]; 0, or -1 on an error (printed) */
static int get_loads(const router_dns_list *w, Deltaserve__V1__Load *loads)
{
    for (int i = 0; i < w->n; i++) {
        char why[600];
        if (get_load(w->addr[i], &loads[i], why, sizeof why)) {
            fprintf(stderr, "loadgen: --load-addr %s: %s\n", w->addr[i], why);
            return -1;
        }
    }
    return 0;
}

/* ---- the prefix-reuse modes: --users (multi-turn) and --shared-prefix ---- */

/* One request of these modes, kept for the report. */
typedef struct conv_req {
    int32_t *tokens;    /* owned, [n_prompt + max_tokens]: the prompt, then the tokens returned */
    int n_prompt, n_gen;
    bool sent, ok;
    bool later;         /* a turn >= 2 (shared-prefix: not the first request) */
    uint32_t cached;    /* usage.cached_tokens of the final message */
    double t_send, t_end, ttft_ms; /* clock_now_s; ttft: the first message, client side */
} conv_req;

typedef struct conv_run {
    const loadgen_opts *o;
    rpc_client_channel *ch;
    int32_t lo;         /* ids in [lo, lo + span) */
    uint32_t span;
    conv_req *reqs;     /* owned, [n_reqs]: multi-turn user u's turn t is [u * turns + t] */
    int n_reqs;
    atomic_int next;    /* users / requests claimed */
} conv_run;

/* Token i of the stream of ids `stream` (0: the system prompt / the shared prefix). */
static int32_t conv_id(const conv_run *c, uint64_t stream, uint64_t i)
{
    uint64_t h = splitmix64((uint64_t)c->o->id_seed ^ splitmix64(stream * 0x100000001b3ull + i));
    return c->lo + (int32_t)(h % c->span);
}

/* Runs one stream of prompt ids[0, n) into q (its tokens, timings, cached tokens). */
static void conv_stream(conv_run *c, rpc_client_cq *cq, conv_req *q, const int32_t *ids, int n)
{
    const loadgen_opts *o = c->o;
    Deltaserve__V1__SamplingParams samp = DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    samp.temperature = o->temperature;
    samp.seed = 1;
    Deltaserve__V1__StoppingCriteria stopc = DELTASERVE__V1__STOPPING_CRITERIA__INIT;
    stopc.max_new_tokens = (uint32_t)o->max_tokens;
    stopc.ignore_eos = o->ignore_eos;
    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    Deltaserve__V1__TokenIds tids = DELTASERVE__V1__TOKEN_IDS__INIT;
    Deltaserve__V1__WorkerGenerateRequest wg = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    memcpy(q->tokens, ids, (size_t)n * sizeof *ids);
    q->n_prompt = n;
    tids.ids = wg.prompt_token_ids = q->tokens;
    tids.n_ids = wg.n_prompt_token_ids = (size_t)n;
    g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
    g.token_ids = &tids;
    g.sampling = wg.sampling = &samp;
    g.stopping = wg.stopping = &stopc;
    rpc_client_stream *s;
    status st;
    q->sent = true;
    q->t_send = clock_now_s();
    if (rpc_client_stream_start_on(&s, cq, c->ch,
                                   o->worker ? "/deltaserve.v1.Worker/Generate"
                                             : "/deltaserve.v1.Generation/Generate",
                                   o->worker ? &wg.base : &g.base, o->timeout_ms, NULL, &st)) {
        q->t_end = clock_now_s();
        return;
    }
    ProtobufCMessage *pm;
    rpc_client_result res;
    while (rpc_client_stream_next(s, &deltaserve__v1__generate_response__descriptor, &pm, &res)) {
        Deltaserve__V1__GenerateResponse *m = (Deltaserve__V1__GenerateResponse *)pm;
        if (m->n_token_ids && !q->n_gen) q->ttft_ms = (clock_now_s() - q->t_send) * 1e3;
        for (size_t i = 0; i < m->n_token_ids && q->n_gen < o->max_tokens; i++)
            q->tokens[n + q->n_gen++] = m->token_ids[i];
        if (m->finish_reason && m->usage) q->cached = m->usage->cached_tokens;
        protobuf_c_message_free_unpacked(pm, NULL);
    }
    rpc_client_stream_destroy(s);
    q->t_end = clock_now_s();
    q->ok = res.code == 0;
}

static void *conv_thread(void *arg)
{
    conv_run *c = arg;
    const loadgen_opts *o = c->o;
    rpc_client_cq *cq = rpc_client_cq_create();
    int32_t *buf = NULL; /* the conversation so far / the prompt */
    if (o->users > 0) {
        const int cap = o->system_tokens + o->turns * (o->user_tokens + o->max_tokens);
        buf = malloc((size_t)cap * sizeof *buf);
        for (int u; buf && (u = atomic_fetch_add(&c->next, 1)) < o->users;) {
            int n = 0;
            for (int i = 0; i < o->system_tokens; i++) buf[n++] = conv_id(c, 0, (uint64_t)i);
            for (int t = 0; t < o->turns; t++) {
                const uint64_t stream = 1 + (uint64_t)u * (uint64_t)o->turns + (uint64_t)t;
                for (int i = 0; i < o->user_tokens; i++) buf[n++] = conv_id(c, stream, (uint64_t)i);
                conv_req *q = &c->reqs[u * o->turns + t];
                q->later = t > 0;
                conv_stream(c, cq, q, buf, n);
                if (!q->ok) break; /* the conversation ends with its failed turn */
                memcpy(buf + n, q->tokens + n, (size_t)q->n_gen * sizeof *buf);
                n += q->n_gen;
            }
        }
    } else {
        const int n = o->shared_prefix + o->suffix_tokens;
        buf = malloc((size_t)n * sizeof *buf);
        for (int r; buf && (r = atomic_fetch_add(&c->next, 1)) < o->requests;) {
            for (int i = 0; i < o->shared_prefix; i++) buf[i] = conv_id(c, 0, (uint64_t)i);
            for (int i = 0; i < o->suffix_tokens; i++)
                buf[o->shared_prefix + i] = conv_id(c, 1 + (uint64_t)r, (uint64_t)i);
            c->reqs[r].later = r > 0;
            conv_stream(c, cq, &c->reqs[r], buf, n);
        }
    }
    free(buf);
    rpc_client_cq_destroy(cq);
    return NULL;
}

/* An open-addressing set of 64-bit prefix hashes (0 is the empty slot). */
typedef struct hash_set {
    uint64_t *v; /* owned, [mask + 1] */
    uint64_t mask;
} hash_set;

static uint64_t *set_slot(hash_set *h, uint64_t x)
{
    uint64_t i = splitmix64_mix(x) & h->mask;
    while (h->v[i] && h->v[i] != x) i = (i + 1) & h->mask;
    return &h->v[i];
}

/* Every prefix of ids[0, n) into the set. */
static void set_add_prefixes(hash_set *h, const int32_t *ids, int n)
{
    uint64_t x = SPLITMIX64_GOLDEN;
    for (int i = 0; i < n; i++) {
        x = splitmix64_mix(x ^ (uint32_t)ids[i]);
        *set_slot(h, x ? x : 1) = x ? x : 1;
    }
}

/* The longest prefix of ids[0, n) in the set. */
static int set_longest(hash_set *h, const int32_t *ids, int n)
{
    uint64_t x = SPLITMIX64_GOLDEN;
    int k = 0;
    for (; k < n; k++) {
        x = splitmix64_mix(x ^ (uint32_t)ids[k]);
        if (!*set_slot(h, x ? x : 1)) break;
    }
    return k;
}

/* A send or an end of one request, for replaying the run in time order. */
typedef struct conv_event {
    double t;
    int end; /* 1: the request finished (its prompt + generated tokens are known) */
    int i;
} conv_event;

static int cmp_event(const void *a, const void *b)
{
    const conv_event *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return y->end - x->end; /* an end at the same moment comes before a send */
}

/* reusable[i]: request i's longest prompt prefix sent before it (a prompt sent earlier, or a
 * finished request's prompt + generated tokens), at most its prompt less one token. */
static int conv_reusable(const conv_run *c, int *reusable)
{
    int n_ev = 0;
    uint64_t total = 0;
    conv_event *ev = malloc(2 * (size_t)c->n_reqs * sizeof *ev);
    if (!ev) return -1;
    for (int i = 0; i < c->n_reqs; i++) {
        const conv_req *q = &c->reqs[i];
        reusable[i] = 0;
        if (!q->sent) continue;
        ev[n_ev++] = (conv_event){q->t_send, 0, i};
        ev[n_ev++] = (conv_event){q->t_end, 1, i};
        total += (uint64_t)(q->n_prompt + q->n_gen);
    }
    qsort(ev, (size_t)n_ev, sizeof *ev, cmp_event);
    hash_set h = {0};
    uint64_t cap = 1024;
    while (cap < 2 * total) cap *= 2;
    h.v = calloc(cap, sizeof *h.v);
    h.mask = cap - 1;
    if (!h.v) {
        free(ev);
        return -1;
    }
    for (int e = 0; e < n_ev; e++) {
        const conv_req *q = &c->reqs[ev[e].i];
        if (ev[e].end) {
            set_add_prefixes(&h, q->tokens, q->n_prompt + q->n_gen);
        } else {
            int k = set_longest(&h, q->tokens, q->n_prompt);
            reusable[ev[e].i] = k < q->n_prompt ? k : q->n_prompt - 1;
            set_add_prefixes(&h, q->tokens, q->n_prompt);
        }
    }
    free(h.v);
    free(ev);
    return 0;
}

/* Runs the multi-turn or shared-prefix mode and prints its report; 0, or 1 when a stream
 * failed. */
static int conv_main(const loadgen_opts *o, rpc_client_channel *ch)
{
    const bool multi = o->users > 0;
    conv_run c = {.o = o, .ch = ch};
    int lo, hi;
    if (sscanf(o->id_range, "%d,%d", &lo, &hi) != 2 || lo < 0 || hi < lo) {
        fprintf(stderr, "loadgen: --id-range: '%s' is not LO,HI with 0 <= LO <= HI\n", o->id_range);
        return 2;
    }
    c.lo = lo;
    c.span = (uint32_t)(hi - lo) + 1;
    c.n_reqs = multi ? o->users * o->turns : o->requests;
    const int cap = multi ? o->system_tokens + o->turns * (o->user_tokens + o->max_tokens)
                          : o->shared_prefix + o->suffix_tokens + o->max_tokens;
    c.reqs = calloc((size_t)c.n_reqs, sizeof *c.reqs);
    int *reusable = calloc((size_t)c.n_reqs, sizeof *reusable);
    pthread_t *th = calloc((size_t)o->concurrency, sizeof *th);
    if (!c.reqs || !reusable || !th) return 1;
    for (int i = 0; i < c.n_reqs; i++)
        if (!(c.reqs[i].tokens = malloc((size_t)cap * sizeof(int32_t)))) return 1;
    atomic_init(&c.next, 0);
    const double t0 = clock_now_s();
    int n_th = 0;
    for (; n_th < o->concurrency; n_th++)
        if (pthread_create(&th[n_th], NULL, conv_thread, &c)) break;
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    const double elapsed = clock_now_s() - t0;
    if (conv_reusable(&c, reusable)) return 1;

    int64_t ok = 0, failed = 0, prompt = 0, cached = 0, reuse = 0, gen = 0;
    loadgen_vec first = {0}, later = {0};
    for (int i = 0; i < c.n_reqs; i++) {
        const conv_req *q = &c.reqs[i];
        if (!q->sent) continue;
        if (!q->ok) {
            failed++;
            continue;
        }
        ok++;
        prompt += q->n_prompt;
        cached += q->cached;
        reuse += reusable[i];
        gen += q->n_gen;
        vec_push(q->later ? &later : &first, q->ttft_ms);
    }
    const int64_t unique = prompt - reuse, computed = prompt - cached;
    const double cached_ratio = reuse ? (double)cached / (double)reuse : 0.0;
    const double computed_ratio = unique ? (double)computed / (double)unique : 0.0;
    const char *mode = multi ? "multi-turn" : "shared-prefix";
    if (multi)
        printf("loadgen: %s %s, multi-turn: %d users x %d turns (system %d, user %d, generated "
               "%d tokens), concurrency %d, %lld streams ok, %lld failed, %.2f s\n",
               o->addr, o->worker ? "Worker/Generate" : "Generation/Generate", o->users,
               o->turns, o->system_tokens, o->user_tokens, o->max_tokens, o->concurrency,
               (long long)ok, (long long)failed, elapsed);
    else
        printf("loadgen: %s %s, shared-prefix: %d requests of a %d-token prefix + %d distinct "
               "tokens, concurrency %d, %lld streams ok, %lld failed, %.2f s\n",
               o->addr, o->worker ? "Worker/Generate" : "Generation/Generate", o->requests,
               o->shared_prefix, o->suffix_tokens, o->concurrency, (long long)ok,
               (long long)failed, elapsed);
    printf("  streams/s %.1f   tokens/s %.1f   prompt tokens/s %.1f\n", (double)ok / elapsed,
           (double)gen / elapsed, (double)prompt / elapsed);
    printf("  prompt tokens %lld   cached (usage.cached_tokens) %lld   reusable %lld   "
           "cached/reusable %.3f\n",
           (long long)prompt, (long long)cached, (long long)reuse, cached_ratio);
    printf("  computed tokens (prompt - cached) %lld   unique (prompt - reusable) %lld   "
           "computed/unique %.3f\n",
           (long long)computed, (long long)unique, computed_ratio);
    printf("  latency in ms:\n");
    print_pcts(multi ? "TTFT (client), turn 1" : "TTFT (client), first request", &first);
    print_pcts(multi ? "TTFT (client), turns >= 2" : "TTFT (client), later requests", &later);
    printf("loadgen-summary mode=%s ok=%lld failed=%lld prompt_tokens=%lld cached_tokens=%lld "
           "reusable_tokens=%lld cached_ratio=%.4f computed_tokens=%lld unique_tokens=%lld "
           "computed_ratio=%.4f ttft_first_p50_ms=%.2f ttft_first_p99_ms=%.2f "
           "ttft_later_p50_ms=%.2f ttft_later_p99_ms=%.2f streams_per_s=%.2f tokens_per_s=%.1f "
           "elapsed_s=%.3f\n",
           mode, (long long)ok, (long long)failed, (long long)prompt, (long long)cached,
           (long long)reuse, cached_ratio, (long long)computed, (long long)unique,
           computed_ratio, pct(&first, 50), pct(&first, 99), pct(&later, 50), pct(&later, 99),
           (double)ok / elapsed, (double)gen / elapsed, elapsed);
    free(first.v);
    free(later.v);
    for (int i = 0; i < c.n_reqs; i++) free(c.reqs[i].tokens);
    free(c.reqs);
    free(reusable);
    free(th);
    return failed || ok == 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
    loadgen_opts o;
    memset(&o, 0, sizeof o);
    status st;
    int rc = flags_parse(specs, &o, argc, argv, "loadgen", &st);
    if (rc == STATUS_CANCELLED) return 0;
    if (rc) {
        fprintf(stderr, "loadgen: %s\n", st.msg);
        return 2;
    }
    if (o.concurrency < 1 || o.requests < 1) {
        fprintf(stderr, "loadgen: --concurrency and --requests must be >= 1\n");
        return 2;
    }
    if (o.backoff_ms < 0) {
        fprintf(stderr, "loadgen: --backoff-ms must be >= 0\n");
        return 2;
    }
    const bool conv = o.users > 0 || o.shared_prefix > 0;
    if (conv && ((o.users > 0 && o.shared_prefix > 0) || o.prompt || o.warmup > 0 || o.steady ||
                 o.duration_s > 0 || o.cancel_after >= 0 || o.max_tokens < 1 || o.turns < 1 ||
                 o.system_tokens < 0 || o.user_tokens < 1 || o.suffix_tokens < 1)) {
        fprintf(stderr, "loadgen: --users and --shared-prefix are two modes, neither with "
                        "--prompt, --warmup, --steady, --duration-s or --cancel-after; they need "
                        "--max-tokens, --turns, --user-tokens and --suffix-tokens >= 1\n");
        return 2;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!conv && !o.prompt && parse_ids(o.ids, &ids, &n_ids)) {
        fprintf(stderr, "loadgen: --ids: '%s' is not a list of ids\n", o.ids);
        return 2;
    }
    Deltaserve__V1__SamplingParams samp = DELTASERVE__V1__SAMPLING_PARAMS__INIT;
    samp.temperature = o.temperature;
    samp.seed = 1;
    Deltaserve__V1__StoppingCriteria stopc = DELTASERVE__V1__STOPPING_CRITERIA__INIT;
    stopc.max_new_tokens = (uint32_t)o.max_tokens;
    stopc.ignore_eos = o.ignore_eos;
    Deltaserve__V1__GenerateRequest g = DELTASERVE__V1__GENERATE_REQUEST__INIT;
    Deltaserve__V1__TokenIds tids = DELTASERVE__V1__TOKEN_IDS__INIT;
    Deltaserve__V1__WorkerGenerateRequest wg = DELTASERVE__V1__WORKER_GENERATE_REQUEST__INIT;
    g.sampling = wg.sampling = &samp;
    g.stopping = wg.stopping = &stopc;
    if (o.prompt) {
        g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TEXT;
        g.text = (char *)o.prompt;
    } else {
        tids.ids = ids;
        tids.n_ids = n_ids;
        g.prompt_case = DELTASERVE__V1__GENERATE_REQUEST__PROMPT_TOKEN_IDS;
        g.token_ids = &tids;
        wg.prompt_token_ids = ids;
        wg.n_prompt_token_ids = n_ids;
    }
    if (o.worker && o.prompt) {
        fprintf(stderr, "loadgen: --worker takes --ids only\n");
        return 2;
    }
    rpc_client_channel *ch;
    if (rpc_client_channel_create(&ch, o.addr, &st)) {
        fprintf(stderr, "loadgen: %s\n", st.msg);
        return 1;
    }
    atomic_int next;
    atomic_init(&next, 0);
    loadgen_thread *ts = calloc((size_t)o.concurrency, sizeof *ts);
    double t_start = clock_now_s();
    /* warm-up phase first (uncounted), then the measured window; --steady: one phase */
    loadgen_window win;
    memset(&win, 0, sizeof win);
    atomic_init(&win.tokens, 0);
    atomic_init(&win.ended, 0);
    if (o.warmup > 0 && !o.steady) {
        loadgen_opts wo = o;
        atomic_int wnext;
        atomic_init(&wnext, 0);
        for (int i = 0; i < o.concurrency; i++) {
            ts[i] = (loadgen_thread){.o = &wo, .ch = ch,
                                     .req = o.worker ? &wg.base : &g.base,
                                     .path = o.worker ? "/deltaserve.v1.Worker/Generate"
                                                      : "/deltaserve.v1.Generation/Generate",
                                     .next = &wnext, .total = o.warmup};
            pthread_create(&ts[i].th, NULL, run_thread, &ts[i]);
        }
        for (int i = 0; i < o.concurrency; i++) pthread_join(ts[i].th, NULL);
        memset(ts, 0, (size_t)o.concurrency * sizeof *ts);
        t_start = clock_now_s();
    }
    /* --load-addr: every worker's load before the counted streams */
    router_dns_list *lw = calloc(1, sizeof *lw);
    Deltaserve__V1__Load *load0 = NULL;
    if (!lw) return 1;
    if (o.load_addr && router_dns_parse_list(o.load_addr, lw, &st)) {
        fprintf(stderr, "loadgen: --load-addr: %s\n", st.msg);
        return 2;
    }
    if (lw->n && (!(load0 = calloc((size_t)lw->n, sizeof *load0)) || get_loads(lw, load0)))
        return 1;
    const int n_load = lw->n;
    int run_rc = 0;
    if (conv) {
        run_rc = conv_main(&o, ch);
        if (run_rc == 2) return 2;
        goto loads;
    }
    loadgen_opts mo = o;
    if (!o.steady) mo.warmup = 0;
    for (int i = 0; i < o.concurrency; i++) {
        ts[i] = (loadgen_thread){.o = &mo, .ch = ch, .req = o.worker ? &wg.base : &g.base,
                                 .path = o.worker ? "/deltaserve.v1.Worker/Generate"
                                                  : "/deltaserve.v1.Generation/Generate",
                                 .next = &next, .win = o.steady ? &win : NULL,
                                 .total = o.duration_s > 0 ? INT32_MAX : mo.warmup + o.requests,
                                 .end_s = o.duration_s > 0 ? t_start + o.duration_s : 0};
        if (pthread_create(&ts[i].th, NULL, run_thread, &ts[i])) {
            fprintf(stderr, "loadgen: cannot start thread %d\n", i);
            return 1;
        }
    }
    for (int i = 0; i < o.concurrency; i++) pthread_join(ts[i].th, NULL);
    double elapsed = clock_now_s() - t_start;

    int64_t ok = 0, tokens = 0, msgs = 0, errors[17] = {0}, n_err = 0, cancelled = 0;
    loadgen_vec ttft_srv = {0}, itl_srv = {0}, ttft_cli = {0}, itl_cli = {0};
    for (int i = 0; i < o.concurrency; i++) {
        ok += ts[i].ok;
        tokens += ts[i].tokens;
        msgs += ts[i].msgs;
        cancelled += ts[i].cancelled;
        for (int c = 0; c < 17; c++) {
            errors[c] += ts[i].errors[c];
            n_err += ts[i].errors[c];
        }
        vec_append(&ttft_srv, &ts[i].ttft_srv);
        vec_append(&itl_srv, &ts[i].itl_srv);
        vec_append(&ttft_cli, &ts[i].ttft_cli);
        vec_append(&itl_cli, &ts[i].itl_cli);
        free(ts[i].ttft_srv.v);
        free(ts[i].itl_srv.v);
        free(ts[i].ttft_cli.v);
        free(ts[i].itl_cli.v);
    }
    printf("loadgen: %s %s, concurrency %d, %lld streams ok, %lld failed, %.2f s\n", o.addr,
           o.worker ? "Worker/Generate" : "Generation/Generate", o.concurrency, (long long)ok,
           (long long)n_err, elapsed);
    if (o.cancel_after >= 0)
        printf("  cancelled by this client: %lld (after 0..%d tokens)\n", (long long)cancelled,
               o.cancel_after);
    for (int c = 0; c < 17; c++)
        if (errors[c])
            printf("  errors %s: %lld\n", rpc_status_grpc_name((grpc_status_code)c),
                   (long long)errors[c]);
    /* --steady: tokens/s over the steady window; streams/s over the counted streams' span */
    double tok_s = (double)tokens / elapsed, str_s = (double)ok / elapsed;
    if (o.steady) {
        const double span = clock_now_s() - win.t_a, w = win.t_b - win.t_a;
        tok_s = w > 0 ? (double)(win.tok_b - win.tok_a) / w : 0;
        str_s = span > 0 ? (double)ok / span : 0;
        printf("  steady window %.4f s (the first counted stream's start to the first thread out of "
               "streams): %lld tokens of every stream\n", w, win.tok_b - win.tok_a);
    }
    printf("  streams/s %.1f   tokens/s %.1f   tokens/stream %.1f\n", str_s, tok_s,
           ok ? (double)tokens / (double)ok : 0.0);
    printf("  latency in ms:\n");
    print_pcts("TTFT (final message timings)", &ttft_srv);
    print_pcts("inter-token (final message mean_itl)", &itl_srv);
    print_pcts("TTFT (client, first message)", &ttft_cli);
    print_pcts("inter-token (client, per token)", &itl_cli);
    printf("loadgen-summary mode=%s ok=%lld failed=%lld cancelled=%lld tokens=%lld messages=%lld "
           "ttft_p50_ms=%.2f ttft_p99_ms=%.2f itl_p50_ms=%.2f itl_p99_ms=%.2f streams_per_s=%.2f "
           "tokens_per_s=%.1f elapsed_s=%.3f\n",
           o.steady ? "steady" : "fixed", (long long)ok, (long long)n_err, (long long)cancelled, (long long)tokens,
           (long long)msgs, pct(&ttft_cli, 50), pct(&ttft_cli, 99), pct(&itl_cli, 50), pct(&itl_cli, 99),
           str_s, tok_s, elapsed);
    run_rc = n_err ? 1 : 0;
    free(ttft_srv.v);
    free(itl_srv.v);
    free(ttft_cli.v);
    free(itl_cli.v);
loads:;
    /* --load-addr: the same loads once the workers are idle again */
    int load_bad = 0;
    for (int w = 0; w < n_load; w++) {
        Deltaserve__V1__Load l1;
        char why[600];
        const double until = clock_now_s() + 30.0;
        int rc1;
        while ((rc1 = get_load(lw->addr[w], &l1, why, sizeof why)) == 0 &&
               (l1.running || l1.waiting) && clock_now_s() < until) {
            struct timespec pause = {0, 100 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        if (rc1) {
            fprintf(stderr, "loadgen: --load-addr %s: %s\n", lw->addr[w], why);
            load_bad = 1;
            continue;
        }
        const Deltaserve__V1__Load *l0 = &load0[w];
        /* idle, the blocks the prefix cache holds are held by it alone: free for this check */
        const uint32_t free0 = l0->free_kv_blocks + l0->prefix_blocks,
                       free1 = l1.free_kv_blocks + l1.prefix_blocks;
        const bool same = !l1.running && !l1.waiting && l1.free_slots == l0->free_slots &&
                          l1.total_slots == l0->total_slots && free1 == free0 &&
                          l1.total_kv_blocks == l0->total_kv_blocks;
        printf("  load of %s: free slots %u -> %u of %u, free KV blocks (with the prefix "
               "cache's) %u -> %u of %u, running %u, waiting %u: %s\n",
               lw->addr[w], l0->free_slots, l1.free_slots, l1.total_slots, free0, free1,
               l1.total_kv_blocks, l1.running, l1.waiting, same ? "the same" : "CHANGED");
        load_bad |= !same;
    }
    free(ts);
    free(ids);
    free(load0);
    free(lw);
    rpc_client_channel_destroy(ch);
    return run_rc || load_bad ? 1 : 0;
}
