/* Shared between router.c, router_generate.c and router_poll.c; not a public header. */
#ifndef DS_ROUTER_ROUTER_INTERNAL_H
#define DS_ROUTER_ROUTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/clock.h"
#include "model/tokenizer.h"
#include "router/router.h"
#include "proto/deltaserve/v1/deltaserve.pb-c.h"
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
    struct {                 /* borrowed from metrics */
        metrics_series *ok[4];   /* request_success_total by finished_reason, FINISH_STOP .. FINISH_ERROR */
        metrics_series *failed;  /* request_failure_total: non-OK status */
        metrics_series *retries, *prompt_tokens, *generation_tokens;
        metrics_series *running, *healthy, *workers;
        metrics_series *ttft, *itl, *e2e;
    } m;
    router_ids *ids;         /* owned: live requests by id, for Abort */
    router_dns_list *dns;    /* owned scratch for the poller's re-resolution */
    uint64_t id_base;        /* random, for made-up request ids */
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t seed_rng; /* splitmix state for routing draws and made-up seeds */

    pthread_mutex_t mu;      /* guards the fields below */
    pthread_cond_t cv;       /* poller sleep, drain wait */
    int inflight;            /* Generate calls from on_request to on_release (status sent) */
    int relays;              /* relay and abort threads running */
    Deltaserve__V1__ModelInfo *model_info; /* owned (unpacked), the first a worker reported;
                                              NULL until one answered GetModelInfo */
    int draining;
    int stopping;            /* the poller exits */
    int started;
    pthread_t poller;

    /* counters for logs and metrics */
    atomic_int_fast64_t n_requests, n_ok, n_failed, n_retries;
};

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
