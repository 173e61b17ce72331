/* protobuf-c messages <-> gRPC byte buffers: the one pack and unpack of the server and the
 * client. */
#ifndef DS_RPC_RPC_CODEC_H
#define DS_RPC_RPC_CODEC_H

#include <stddef.h>

#include <grpc/byte_buffer.h>
#include <protobuf-c/protobuf-c.h>

/* msg packed into a new byte buffer (the caller owns it); NULL when out of memory. */
grpc_byte_buffer *rpc_codec_pack(const ProtobufCMessage *msg);

/* The message of type desc in bb (not consumed), or NULL when bb cannot be read, is larger
 * than max_bytes (0: no limit) or does not parse. Free it with
 * protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *rpc_codec_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                   size_t max_bytes);

/* rpc_codec_unpack for a request a server received, which first refuses a string field holding
 * a NUL byte (protobuf-c would cut it there): then NULL with why = "FIELD: contains a NUL byte
 * at offset K" (rpc/rpc_wire.h). Any other failure: NULL with why = "". */
ProtobufCMessage *rpc_codec_unpack_request(grpc_byte_buffer *bb,
                                           const ProtobufCMessageDescriptor *desc,
                                           size_t max_bytes, char *why, size_t why_cap);

#endif
