/* gRPC server reflection (grpc.reflection.v1alpha and v1 ServerReflection/ServerReflectionInfo)
 * from an embedded, serialized FileDescriptorSet (proto/proto_descriptors.h), so ghz and
 * grpcurl-style tools need no .proto file. Answers ListServices (the names given at
 * creation), FileByFilename and FileContainingSymbol (the file and its transitive
 * dependencies, the asked file first); extension queries get an error response
 * (NOT_FOUND / UNIMPLEMENTED: our protos have no extensions). It describes only the services
 * given: a file's other services are cut out of the descriptors it sends, and their names and
 * methods are not found (the router's copy of deltaserve.proto has Generation, not Worker).
 *
 * v1 and v1alpha messages are wire-identical, so both paths use the v1alpha protoc-c code. */
#ifndef DS_RPC_RPC_REFLECTION_H
#define DS_RPC_RPC_REFLECTION_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "rpc/rpc_server.h"

typedef struct rpc_reflection rpc_reflection;

/* Parses the FileDescriptorSet (borrowed: must outlive the reflection object) and indexes every
 * file name and fully-qualified symbol (messages, nested messages, enums, services, methods).
 * services: the names ListServices reports and the only services described (copied); the
 * set's other services are left out. STATUS_FORMAT if the set is malformed. */
int rpc_reflection_create(const uint8_t *fds, size_t fds_bytes, const char *const *services,
                          int n_services, rpc_reflection **out, status *st);

/* Adds both ServerReflectionInfo methods (v1alpha, v1) to srv (before rpc_server_start). */
int rpc_reflection_add_methods(rpc_reflection *r, rpc_server *srv, status *st);

void rpc_reflection_destroy(rpc_reflection *r);

/* Lookups (for tests and the handlers). Index of a file by name or by a symbol it declares,
 * or -1. */
int rpc_reflection_n_files(const rpc_reflection *r);
const char *rpc_reflection_file_name(const rpc_reflection *r, int i);
int rpc_reflection_find_file(const rpc_reflection *r, const char *name);
int rpc_reflection_find_symbol(const rpc_reflection *r, const char *symbol);

/* The files to send for file i: i first, then its transitive dependencies, each once.
 * Writes up to cap indices to out; returns how many. */
int rpc_reflection_closure(const rpc_reflection *r, int i, int *out, int cap);

#endif
