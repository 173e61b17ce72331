/* The one mapping between common/status.h codes and gRPC status codes (docs/STYLE.md: "Status maps
 * to a gRPC code in one place per service"). Used by every server in rpc/, worker/ and router/
 * and by the streaming client to turn a worker's gRPC status back into a status. */
#ifndef DS_RPC_RPC_STATUS_H
#define DS_RPC_RPC_STATUS_H

#include <grpc/status.h>

#include "common/status.h"

/* INVALID/RANGE -> INVALID_ARGUMENT, EXHAUSTED -> RESOURCE_EXHAUSTED, NOT_FOUND -> NOT_FOUND,
 * UNAVAILABLE/IO -> UNAVAILABLE, CANCELLED -> CANCELLED, DEADLINE -> DEADLINE_EXCEEDED,
 * UNSUPPORTED -> UNIMPLEMENTED, FORMAT -> INVALID_ARGUMENT, NOMEM -> RESOURCE_EXHAUSTED,
 * DEVICE/INTERNAL -> INTERNAL, OK -> OK. */
grpc_status_code rpc_status_to_grpc(status_code code);

/* The inverse, for statuses received from a peer: OK -> OK, INVALID_ARGUMENT/OUT_OF_RANGE/
 * FAILED_PRECONDITION -> INVALID, RESOURCE_EXHAUSTED -> EXHAUSTED, NOT_FOUND -> NOT_FOUND,
 * UNAVAILABLE -> UNAVAILABLE, CANCELLED -> CANCELLED, DEADLINE_EXCEEDED -> DEADLINE,
 * UNIMPLEMENTED -> UNSUPPORTED, everything else -> INTERNAL. */
status_code rpc_status_from_grpc(grpc_status_code code);

/* "OK", "CANCELLED", "INVALID_ARGUMENT", ... (the canonical upper-case gRPC names). */
const char *rpc_status_grpc_name(grpc_status_code code);

#endif
