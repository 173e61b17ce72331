/* A walk over a protobuf message's wire bytes, driven by its protobuf-c descriptor, for what
 * protobuf-c loses on unpack: it decodes a string field as a NUL-terminated char *, so a string
 * holding U+0000 would reach every strlen-based reader cut at the NUL. The server refuses such
 * a request before unpacking it (rpc_codec_unpack_request), naming the field. */
#ifndef DS_RPC_RPC_WIRE_H
#define DS_RPC_RPC_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Longest field path rpc_wire_find_nul writes, with its NUL. */
#define RPC_WIRE_PATH_MAX 256

/* Looks through the string fields of the message of type desc in data[0, n), nested messages
 * included, for a NUL byte. Returns 1 at the first one found, with path set to the field's
 * path in proto field names ("request_id", "chat.messages[2].content", "stop[1]"; a repeated
 * field's index counts its occurrences on the wire) and *offset to the NUL's byte offset
 * inside the string; 0 when there is none. Malformed bytes end the walk with 0: the unpack
 * that follows refuses them. Unknown fields and bytes fields are skipped. */
int rpc_wire_find_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t n,
                      char path[RPC_WIRE_PATH_MAX], size_t *offset);

#endif
