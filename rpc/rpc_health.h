/* grpc.health.v1.Health for an rpc_server: Check (unary) and Watch (server stream).
 *
 * Service "" is liveness: SERVING while the process runs. Each named service (for example
 * "deltaserve.v1.Worker") is readiness: NOT_SERVING until rpc_health_set says otherwise, and
 * again while loading or draining. Check of an unknown name is status NOT_FOUND; Watch of an
 * unknown name streams SERVICE_UNKNOWN (per the gRPC health spec) and stays open. Watch sends
 * the current status at once and then every change, until the client cancels or the server
 * shuts down. */
#ifndef DS_RPC_RPC_HEALTH_H
#define DS_RPC_RPC_HEALTH_H

#include <stdbool.h>

#include "common/status.h"
#include "rpc/rpc_server.h"

#define RPC_HEALTH_MAX_SERVICES 8

typedef struct rpc_health rpc_health;

/* services: the readiness names (copied), all NOT_SERVING at first; "" is added (SERVING). */
int rpc_health_create(const char *const *services, int n_services, rpc_health **out, status *st);

/* Adds /grpc.health.v1.Health/Check and /Watch to srv (before rpc_server_start). */
int rpc_health_add_methods(rpc_health *h, rpc_server *srv, status *st);

/* Sets one service's status ("" = liveness); notifies its watchers if it changed.
 * The name must be one given at creation (a caller bug otherwise). Thread-safe. */
void rpc_health_set(rpc_health *h, const char *service, bool serving);

/* Sets every named service (not ""): readiness of the whole process. */
void rpc_health_set_ready(rpc_health *h, bool serving);

/* Watch streams open right now. */
int rpc_health_n_watchers(rpc_health *h);

/* After rpc_server_shutdown[_grace] (which ends every Watch with UNAVAILABLE at once). */
void rpc_health_destroy(rpc_health *h);

#endif
