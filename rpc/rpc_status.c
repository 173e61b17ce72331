#include "rpc/rpc_status.h"

grpc_status_code rpc_status_to_grpc(status_code code)
{
    switch (code) {
    case STATUS_OK: return GRPC_STATUS_OK;
    case STATUS_INVALID:
    case STATUS_RANGE:
    case STATUS_FORMAT: return GRPC_STATUS_INVALID_ARGUMENT;
    case STATUS_EXHAUSTED:
    case STATUS_NOMEM: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case STATUS_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case STATUS_IO:
    case STATUS_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
    case STATUS_CANCELLED: return GRPC_STATUS_CANCELLED;
    case STATUS_DEADLINE: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case STATUS_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    case STATUS_DEVICE:
    case STATUS_INTERNAL: return GRPC_STATUS_INTERNAL;
    case STATUS_UNAUTHENTICATED: return GRPC_STATUS_UNAUTHENTICATED;
    case STATUS_PRECONDITION: return GRPC_STATUS_FAILED_PRECONDITION;
    }
    return GRPC_STATUS_INTERNAL;
}

status_code rpc_status_from_grpc(grpc_status_code code)
{
    switch (code) {
    case GRPC_STATUS_OK: return STATUS_OK;
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_OUT_OF_RANGE:
    case GRPC_STATUS_FAILED_PRECONDITION: return STATUS_INVALID;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: return STATUS_EXHAUSTED;
    case GRPC_STATUS_NOT_FOUND: return STATUS_NOT_FOUND;
    case GRPC_STATUS_UNAVAILABLE: return STATUS_UNAVAILABLE;
    case GRPC_STATUS_CANCELLED: return STATUS_CANCELLED;
    case GRPC_STATUS_DEADLINE_EXCEEDED: return STATUS_DEADLINE;
    case GRPC_STATUS_UNIMPLEMENTED: return STATUS_UNSUPPORTED;
    case GRPC_STATUS_UNAUTHENTICATED: return STATUS_UNAUTHENTICATED;
    default: return STATUS_INTERNAL;
    }
}

const char *rpc_status_grpc_name(grpc_status_code code)
{
    static const char *names[] = {
        "OK",        "CANCELLED",         "UNKNOWN",           "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",    "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
        "UNIMPLEMENTED", "INTERNAL",      "UNAVAILABLE",       "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if ((unsigned)code < sizeof names / sizeof names[0]) return names[code];
    return "UNKNOWN";
}
