/* deltaserve router: serves the public deltaserve.v1.Generation API (plus grpc.health.v1 and
 * reflection, and Prometheus metrics) over a set of workers (deltaserve.v1.Worker).
 *
 * For each Generate call a relay (an event-driven state machine on a few completion-queue
 * threads, --cq-threads; no thread per call) validates the request, turns the prompt into token ids
 * (the model's tokenizer; chat messages rendered with the model's own chat template), picks a worker (router_policy.h), streams
 * Worker/Generate back to the client with text pieces (streaming detokenizer, stop strings),
 * and ends the call. A worker that fails before the first token reached the client is
 * retried on another worker; after that the stream ends with UNAVAILABLE. The client's
 * deadline is passed to the worker and a client cancel cancels the worker call.
 *
 * A poller thread health-checks (grpc.health.v1 Check "deltaserve.v1.Worker") and load-polls
 * (Worker/GetLoad) every worker each poll interval, and re-resolves --workers-dns. Readiness
 * ("deltaserve.v1.Generation") is SERVING while at least one worker is healthy and the router
 * is not draining. Never links CUDA. */
#ifndef DS_ROUTER_ROUTER_H
#define DS_ROUTER_ROUTER_H

#include "common/status.h"
#include "router/router_policy.h"
#include "rpc/rpc_tls.h"

typedef struct router_opts {
    const char *listen;         /* HOST:PORT, port 0 = pick one */
    const char *workers;        /* "h1:p1,h2:p2", or NULL */
    const char *workers_dns;    /* NAME:PORT re-resolved every dns_refresh_ms, or NULL */
    const char *model;          /* GGUF whose tokenizer is used, or NULL (token-id prompts only) */
    const char *metrics_listen; /* HOST:PORT of the Prometheus endpoint, or NULL */
    router_policy policy;       /* routing mode and prefix-affinity parameters */
    int poll_ms;                /* health and load poll interval; 0 -> 500 */
    int dns_refresh_ms;         /* 0 -> 5000 */
    int max_inflight;           /* Generate calls at once before RESOURCE_EXHAUSTED; 0 -> 1024 */
    int max_attempts;           /* workers tried per request before the first token; 0 -> 3 */
    int stream_interval;        /* tokens a client message gathers before it leaves, but the
                                   first and the last, which leave at once; 0 -> 1 (each
                                   token as it comes) */
    int worker_feed_off;        /* 1: each worker call carries its own messages (no Worker/Feed,
                                   router_internal.h "Feeds") */
    int cq_threads;             /* completion-queue threads serving every call and worker
                                   call; 0 -> 1 (gRPC's one epoll set: more threads hand
                                   events to each other, docs/BENCH.md 3.11) */
    const rpc_tls_server *tls;  /* TLS on listen (NULL: plaintext) */
    const rpc_tls_client *worker_tls; /* TLS to the workers (NULL: plaintext); its target_name
                                         NULL with workers_dns: the NAME of NAME:PORT, so the
                                         workers, dialled by IP, are verified under the DNS name */
    const char *worker_token_file; /* token sent on every call to a worker, or NULL */
    const char *health_listen;  /* plaintext grpc.health.v1-only HOST:PORT, or NULL */
    const char *auth_token_file; /* Generation calls need "authorization: Bearer <token>" */
    int reflection_auth;        /* with a token: reflection needs it too */
    const char *http_listen;    /* HOST:PORT of the OpenAI-compatible HTTP door, or NULL
                                   (same TLS files and token as listen; router_http.h) */
    const char *served_model_name; /* the model id on the HTTP door, or NULL: the GGUF's
                                      general.name, else its file's base name */
} router_opts;

typedef struct router router;

/* Loads the tokenizer (if any), reads the worker TLS files and token (errors name the flag and
 * the file), resolves the workers, binds the port. Nothing runs yet. */
int router_create(router **out, const router_opts *opts, status *st);

/* Starts the gRPC server, the metrics endpoint and the poller. */
int router_start(router *r, status *st);

/* The bound gRPC port, and the metrics port (0 without metrics). */
int router_port(const router *r);
int router_metrics_port(const router *r);
int router_health_port(const router *r); /* 0 without health_listen */
int router_http_port_of(const router *r);  /* 0 without http_listen */

/* Readiness NOT_SERVING; new Generate calls are refused with UNAVAILABLE "router is draining"
 * from the moment it returns (router_drain does it too; this is for logging "draining" only
 * once it is true). */
void router_begin_drain(router *r);

/* After the Generate calls of a drain ended: how long the other calls still open (refusals,
 * health checks in flight) get to end before they are cancelled (rpc_server_shutdown_grace). */
#define ROUTER_DRAIN_FLUSH_MS 10000

/* Drains: readiness NOT_SERVING, new calls are refused with UNAVAILABLE, in-flight calls run
 * until they end or grace_ms passes; then stops the server gracefully (the calls left are
 * ended with UNAVAILABLE; the others' final frames are written before their connections
 * close) and the poller. Blocks. Returns the number of calls that had to be cancelled. */
int router_drain(router *r, int grace_ms);

/* After router_drain (or if never started). */
void router_destroy(router *r);

#endif
