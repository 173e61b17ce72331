/* Shared between router.c, router_generate.c and router_poll.c; not a public header. */
#ifndef DS_ROUTER_ROUTER_INTERNAL_H
#define DS_ROUTER_ROUTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/clock.h"
#include "model/tokenizer.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
#include "router/router.h"
#include "router/router_dns.h"
#include "router/router_ids.h"
#include "router/router_pool.h"
#include "router/router_request.h"
#include "rpc/metrics_http.h"
#include "rpc/rpc_auth.h"
#include "rpc/rpc_health.h"
#include "rpc/rpc_reflection.h"
#include "rpc/rpc_server.h"

#define ROUTER_SERVICE "deltaserve.v1.Generation"
#define ROUTER_WORKER_SERVICE "deltaserve.v1.Worker"
typedef struct router_feed router_feed;   /* router_feed.c, "Feeds" below */
typedef struct router_feeds router_feeds;

struct router {
    router_opts opts;        /* copy; strings borrowed from the caller */
    tokenizer *tok;          /* owned, NULL without --model */
    router_request_template chat_tmpl; /* owned: the model's chat template (tmpl.tmpl NULL: why says why) */
    router_pool *pool;       /* owned */
    rpc_server *srv;         /* owned */
    rpc_auth *auth;          /* owned, or NULL: no --auth-token-file */
    rpc_auth *worker_auth;   /* owned, or NULL: no --worker-token-file */
    rpc_tls_client worker_tls; /* copy of *opts.worker_tls with the target name filled in */
    char worker_tls_name[ROUTER_ADDR_MAX]; /* the default target name: --workers-dns's NAME */
    rpc_health *health;      /* owned */
    rpc_reflection *refl;    /* owned */
    metrics *metrics;        /* owned */
    metrics_http *metrics_http; /* owned, NULL without --metrics-listen */
    struct router_http *http; /* owned, NULL without --http-listen (router_http.h) */
    char model_id[256];      /* the model's name on the HTTP door: --served-model-name, the
                                GGUF's general.name, or the file's base name */
    int64_t t_start;         /* unix seconds at router_create (GET /v1/models' created) */
    struct {                 /* borrowed from metrics */
        metrics_series *ok[4];   /* request_success_total by finished_reason, FINISH_STOP .. FINISH_ERROR */
        metrics_series *failed;  /* request_failure_total: non-OK status */
        metrics_series *retries, *prompt_tokens, *generation_tokens;
        metrics_series *feed_batches, *feed_items; /* the workers' feeds (router_feed.c) */
        metrics_series *running, *healthy, *workers;
        metrics_series *ttft, *itl, *e2e;
    } m;
    router_ids *ids;         /* owned: live requests by id, for Abort */
    router_feeds *feeds;     /* owned: the workers' token feeds; NULL with --worker-feed=false */
    router_dns_list *dns;    /* owned scratch for the poller's re-resolution */
    uint64_t id_base;        /* random, for made-up request ids */
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t seed_rng; /* splitmix state for routing draws and made-up seeds */

    pthread_mutex_t mu;      /* guards the fields below */
    pthread_cond_t cv;       /* poller sleep, drain wait */
    int inflight;            /* Generate calls from on_request to on_release (status sent), and
                                HTTP generation requests from admission to their end */
    int relays;              /* relays not yet ended and abort threads running */
    Deltaserve__V1__ModelInfo *model_info; /* owned (unpacked), the first a worker reported;
                                              NULL until one answered GetModelInfo */
    int draining;
    int stopping;            /* the poller exits */
    int started;
    pthread_t poller;

    /* counters for logs and metrics */
    atomic_int_fast64_t n_requests, n_ok, n_failed, n_retries;
};

/* Where a relay's output goes: the gRPC call (router_generate.c) or an HTTP request
 * (router_http.c). Called under the relay's mutex, from whichever thread runs its step (never
 * two at once). */
typedef struct router_sink {
    /* One response message, as the public gRPC stream carries it (text, token ids, logprobs
     * with the alternatives' text; the final one with finish_reason, usage, timings). m and
     * what it points to are valid during the call only. STATUS_OK, or a status (common/status.h:
     * STATUS_CANCELLED, the client is gone; STATUS_NOMEM) after which the relay ends with
     * CANCELLED. Must not allocate in steady state. */
    int (*send)(void *ctx, const Deltaserve__V1__GenerateResponse *m);
    /* send for a message of token ids and text only, given as its wire bytes b[0, n) (what m
     * packs to: router_wire.h), valid during the call only; same outcome as send. NULL: the
     * sink takes only send. */
    int (*send_wire)(void *ctx, const uint8_t *b, size_t n);
    /* The end, exactly once: a gRPC status code and message (NULL or "" with OK). */
    void (*end)(void *ctx, int grpc_code, const char *msg);
    void *ctx;
    int top_text; /* the relay fills in each top-logprob alternative's text (a decode each);
                     0 for a sink that reads the token's bytes itself */
    void *cq;     /* the completion queue the relay's worker calls run on (the gRPC call's own,
                     rpc_call_cq), or NULL: one of the server's, in turn */
    int paced;    /* 1: after each send the door calls router_relay_writable once the message
                     left; until then what the worker sends is gathered into the next message.
                     0: every worker message is sent at once */
} router_sink;

/* One request being relayed: validation, prompt, worker choice, retries, stop strings,
 * detokenization, logprob text, metrics and the log line (router_generate.c). */
typedef struct router_req router_req;

/* A relay for g (owned by it from here on, also on failure; freed with
 * protobuf_c_message_free_unpacked, so a door that builds g must allocate every part with
 * malloc). deadline_ms is clock_now_ms-based or CLOCK_NO_DEADLINE. The caller holds one
 * reference (router_relay_unref). Admission (draining, --max-inflight) is the door's. */
int router_relay_create(router *r, Deltaserve__V1__GenerateRequest *g, const router_sink *sink,
                        int64_t deadline_ms, router_req **out, status *st);
/* Runs the relay's first step on the caller's thread (validation, the prompt, the first worker
 * call) and leaves the rest to the events of its calls; it holds its own reference until it
 * ended. Returns STATUS_OK: whatever happens is told through the sink. */
int router_relay_start(router_req *q, status *st);
/* The client is gone: the relay stops (the worker call is cancelled) and ends with CANCELLED
 * (or DEADLINE_EXCEEDED when its deadline passed). Any thread, any time. */
void router_relay_cancel(router_req *q);
/* A paced sink's last message left: what was gathered meanwhile goes out in one message. */
void router_relay_writable(router_req *q);
void router_relay_unref(router_req *q);

void router_relay_ref(router_req *q);
/* Feeds (router_feed.c): one Worker/Feed call per healthy worker carries the messages of every
 * Generate call of this router that named it (WorkerGenerateRequest.feed_id / feed_tag), an
 * engine step's messages of all of them in one FeedBatch: one receive a step instead of one a
 * stream. A relay's attempt rides on the worker's feed when it is open and the request asks for
 * no logprobs; its call then carries the request and the status only. */
int router_feeds_create(router *r, router_feeds **out, status *st);
/* Cancels every feed; none opens after. */
void router_feeds_close(router_feeds *fs);
void router_feeds_destroy(router_feeds *fs);
/* The poller, after a round over the workers ws[0, n): a feed opens to each healthy worker
 * without one; those of workers not healthy or gone are cancelled. */
void router_feeds_maintain(router_feeds *fs, router_worker *const *ws, int n);
/* The open feed to w with q attached under a new tag (*feed_id, *tag set), referenced until
 * router_feed_detach; NULL when w has no open feed. */
router_feed *router_feed_attach(router_feeds *fs, router_worker *w, router_req *q,
                                uint64_t *feed_id, uint64_t *tag);
/* q's tag leaves the feed (if the feed has not ended) and the reference goes. */
void router_feed_detach(router_feed *f, uint64_t tag);
/* The feed's CQ thread: an item for q's attempt tagged tag (m lives in the feed's batch), and
 * the feed's end while tag was attached. */
void router_relay_feed_message(router_req *q, uint64_t tag, Deltaserve__V1__GenerateResponse *m);
void router_relay_feed_lost(router_req *q, uint64_t tag);
/* Adds /deltaserve.v1.Generation/Generate to r->srv. */
int router_generate_add_method(router *r, status *st);

/* Adds /deltaserve.v1.Generation/Abort and /GetModelInfo to r->srv (router_api.c). */
int router_api_add_methods(router *r, status *st);

/* The poller, for a healthy worker: asks it for its ModelInfo while the router has none
 * (blocks up to a poll timeout). */
int router_api_model_known(router *r);
void router_api_learn_model(router *r, router_worker *w, Deltaserve__V1__ModelInfo *mi);

/* Poller thread body (arg: router *); exits when r->stopping. */
void *router_poll_main(void *arg);
/* One round: DNS (if due), then health + load of every worker; updates readiness. */
void router_poll_once(router *r, int resolve_dns);

/* Readiness from the pool and the drain state. */
void router_update_readiness(router *r);

#endif
