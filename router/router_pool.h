/* The router's worker set: addresses, connections, health, load, and the per-request
 * acquire/release that feeds the routing policy (router_policy.h).
 *
 * Workers come from --workers (fixed) or a DNS answer (router_dns.h) through router_pool_set,
 * which adds new addresses and retires missing ones. A new worker is not eligible until its
 * first successful health check (router_pool_report_health). A failed call
 * (router_pool_report_failure) makes it ineligible at once, until a later check succeeds.
 * Workers are reference counted: a retired worker's connection is closed when the last request
 * using it releases it.
 *
 * Load of a worker = outstanding tokens this router has routed there and not yet seen finish
 * (exact and current) + the traffic of other router replicas, estimated at each poll as the
 * worker's reported outstanding tokens minus ours at that moment, the smaller of the last two
 * such estimates (so a poll that still sees our just-cancelled requests adds nothing).
 * All functions are thread-safe (one mutex). */
#ifndef DS_ROUTER_ROUTER_POOL_H
#define DS_ROUTER_ROUTER_POOL_H

#include <stdint.h>

#include "common/status.h"
#include "router/router_policy.h"

#define ROUTER_POOL_MAX_WORKERS 1024
#define ROUTER_ADDR_MAX 256

typedef enum router_worker_state {
    ROUTER_WORKER_UNKNOWN = 0, /* never checked */
    ROUTER_WORKER_HEALTHY,
    ROUTER_WORKER_UNHEALTHY,   /* failed check or call */
} router_worker_state;

typedef struct router_worker router_worker;

/* What the pool needs from the transport: open / close a connection to an address. The router
 * passes rpc_client_channel_create_tls / rpc_client_channel_destroy (router.c); unit tests pass
 * fakes. */
typedef struct router_pool_ops {
    void *(*connect)(const char *addr, void *ctx); /* NULL on failure */
    void (*disconnect)(void *conn, void *ctx);
    void *ctx;
} router_pool_ops;

#define ROUTER_POOL_MAX_HEADS 256

/* Load as reported by a worker's GetLoad. */
typedef struct router_worker_load {
    int64_t outstanding_tokens;
    int running, waiting, free_slots, total_slots;
    uint64_t prefix_heads[ROUTER_POOL_MAX_HEADS]; /* the heads its prefix cache holds
                                                     (Load.prefix_heads), [n_prefix_heads] */
    int n_prefix_heads;
} router_worker_load;

typedef struct router_pool router_pool;

int router_pool_create(router_pool **out, const router_policy *policy, const router_pool_ops *ops,
                       status *st);
/* All requests must have released their workers. */
void router_pool_destroy(router_pool *p);

/* Makes the set of addresses exactly addrs[0, n) (duplicates ignored). Returns the number of
 * workers added; STATUS_INVALID for an empty or over-long address, STATUS_EXHAUSTED beyond
 * ROUTER_POOL_MAX_WORKERS, STATUS_UNAVAILABLE when a connection cannot be opened. */
int router_pool_set(router_pool *p, const char *const *addrs, int n, status *st);

/* Snapshot of the current workers with a reference taken on each (release with
 * router_pool_unref). Returns the count (<= max). For the health/load poller. */
int router_pool_snapshot(router_pool *p, router_worker **out, int max);
void router_pool_unref(router_pool *p, router_worker *w);
/* Another reference on a worker the caller already holds one on (release: router_pool_unref). */
void router_pool_ref(router_pool *p, router_worker *w);

void router_pool_report_health(router_pool *p, router_worker *w, int serving);
void router_pool_report_load(router_pool *p, router_worker *w, const router_worker_load *load);
void router_pool_report_failure(router_pool *p, router_worker *w);
/* The worker's context (ModelInfo.max_context, from Worker/GetModelInfo); forgotten when it
 * turns unhealthy. router_pool_worker_context: the worker's (0: not known);
 * router_pool_max_context: the longest of the healthy workers' (0: none known), the bound the
 * router checks a prompt against before routing it. */
void router_pool_report_context(router_pool *p, router_worker *w, int max_context);
int router_pool_worker_context(router_pool *p, const router_worker *w);
int router_pool_max_context(router_pool *p);

/* Picks a worker for a request that will cost `cost` tokens (prompt + max new), skipping the
 * workers in exclude[0, n_exclude) (those already tried); a worker whose last load listed
 * prefix_hash among its prefix heads is a candidate that holds the prefix. Takes a reference and adds cost to
 * the worker's outstanding tokens. NULL when no worker is eligible. */
router_worker *router_pool_acquire(router_pool *p, uint64_t prefix_hash, int64_t cost,
                                   router_worker *const *exclude, int n_exclude, uint64_t *rng);
/* `done` more of the acquired cost is finished (a token arrived, or the prompt was prefilled). */
void router_pool_progress(router_pool *p, router_worker *w, int64_t done);
/* The request is over: subtracts the cost still outstanding and drops the reference. */
void router_pool_release(router_pool *p, router_worker *w, int64_t remaining);

int router_pool_n_healthy(router_pool *p);
int router_pool_n_workers(router_pool *p);

/* Stable for the worker's lifetime (while a reference is held). */
const char *router_pool_worker_addr(const router_worker *w);
void *router_pool_worker_conn(const router_worker *w);
/* Locked reads, for logs and tests. */
router_worker_state router_pool_worker_state(router_pool *p, const router_worker *w);
int64_t router_pool_worker_load(router_pool *p, const router_worker *w);

#endif
