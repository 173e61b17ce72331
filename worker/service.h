/* The deltaserve.v1.Worker gRPC service over an engine: Generate (validated, queued, its tokens
 * handed on once per engine step and written coalesced: one message on its way per stream, the
 * tokens that come meanwhile in the next), Abort, GetModelInfo, GetLoad, plus
 * grpc.health.v1.Health and server reflection.
 *
 * Lifecycle (cli/cmd_worker.c):
 *   worker_service_create   binds and serves at once: liveness SERVING, readiness
 *                           ("deltaserve.v1.Worker") NOT_SERVING, Generate UNAVAILABLE "loading";
 *   worker_service_attach   after the model, backend and engine exist: readiness SERVING;
 *   worker_service_drain    readiness NOT_SERVING, new Generate UNAVAILABLE, in-flight streams
 *                           get grace_ms to finish, the rest end UNAVAILABLE; when it returns
 *                           every stream has its final message and status queued, or handed
 *                           to its writer, which queues them as soon as the message it has
 *                           on its way leaves (see "Streaming" in worker/README.md);
 *   worker_service_shutdown stops the gRPC server gracefully: the queued messages and statuses
 *                           get up to flush_ms to be written, then the connections close;
 *   worker_service_destroy  shuts the server down (as above with WORKER_SERVICE_FLUSH_MS if not
 *                           done yet) and frees it; the engine and backend are the caller's and
 *                           are destroyed after. */
#ifndef DS_WORKER_SERVICE_H
#define DS_WORKER_SERVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/status.h"
#include "model/qwen35.h"
#include "common/metrics.h"
#include "worker/backend.h"
#include "worker/engine.h"

typedef struct worker_service worker_service;

typedef struct worker_service_opts {
    const char *listen; /* "HOST:PORT" (port 0 = pick one) */
    const char *name;   /* served_by in final messages; NULL = "HOST:PORT" as bound */
    int max_calls;      /* concurrent gRPC calls; 0 -> 4096 */
    metrics *metrics;   /* optional */
    const struct rpc_tls_server *tls; /* TLS (mTLS with a client CA) on listen; NULL: plaintext */
    const char *health_listen; /* plaintext grpc.health.v1-only HOST:PORT, or NULL */
    const char *auth_token_file; /* deltaserve.v1.Worker calls need "authorization: Bearer
                                    <token>" (rpc/rpc_auth.h; health and reflection stay open),
                                    or NULL */
} worker_service_opts;

/* What GetModelInfo reports besides the model config. */
typedef struct worker_model_desc {
    const char *path;
    int32_t eos_ids[ENGINE_MAX_EOS_IDS];
    int n_eos_ids;
    int32_t bos_id; /* -1 if none */
} worker_model_desc;

int worker_service_create(const worker_service_opts *o, worker_service **out, status *st);
int worker_service_port(const worker_service *ws);
int worker_service_health_port(const worker_service *ws); /* 0 without health_listen */
/* The served_by name ("127.0.0.1:5555" or --name). */
const char *worker_service_name(const worker_service *ws);

/* Borrowed: model, backend and engine must outlive the service's serving (until destroy). */
void worker_service_attach(worker_service *ws, const qwen35_model *m, worker_backend *b,
                           engine *e, const worker_model_desc *desc);

/* Most prefix heads one GetLoad answer lists (Load.prefix_heads). */
#define WORKER_SERVICE_MAX_HEADS 256

/* How long the final messages and statuses get to reach their clients after the engine ended
 * every request, when the caller does not say (worker_service_destroy). */
#define WORKER_SERVICE_FLUSH_MS 10000

/* Readiness NOT_SERVING, new Generate UNAVAILABLE "worker is draining" from the moment it
 * returns (worker_service_drain does it too; this is for logging "draining" only once true). */
void worker_service_begin_drain(worker_service *ws);

/* Returns the number of requests cancelled when the grace period ran out. */
int worker_service_drain(worker_service *ws, int64_t grace_ms);

/* Graceful stop of the gRPC server (after worker_service_drain): no new calls, every call's
 * final message and status written within flush_ms (then the rest are cancelled). Returns
 * false when some had to be cancelled. Idempotent. */
bool worker_service_shutdown(worker_service *ws, int64_t flush_ms);

void worker_service_destroy(worker_service *ws);

#endif
