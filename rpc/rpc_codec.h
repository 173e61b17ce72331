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

/* rpc_codec_unpack with the message's memory from alloc (NULL: malloc; free it then with
 * protobuf_c_message_free_unpacked(m, alloc)); read in place, without a copy, when bb is one
 * uncompressed slice (a received message, as a rule). */
ProtobufCMessage *rpc_codec_unpack_with(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                        size_t max_bytes, ProtobufCAllocator *alloc);

/* A bump allocator for unpacked messages that live a short while (a relay's worker messages
 * until they are relayed): taking memory is a pointer bump, giving it back does nothing, and
 * rpc_arena_reset makes all of it free again once no message in it is alive. When full it
 * takes from malloc (and gives back with free); the next reset doubles it, up to
 * RPC_ARENA_MAX_BYTES, so the steady state allocates nothing. */
#define RPC_ARENA_MAX_BYTES (256 * 1024)
typedef struct rpc_arena {
    ProtobufCAllocator alloc; /* pass &arena->alloc to protobuf-c; allocator_data is the arena */
    unsigned char *buf;       /* owned, [cap] */
    size_t cap, used;
    int spilled;              /* a request went to malloc since the last reset */
} rpc_arena;

/* 0, or -1 when out of memory (the arena is then empty, every request goes to malloc). */
int rpc_arena_init(rpc_arena *a, size_t bytes);
void rpc_arena_reset(rpc_arena *a);
void rpc_arena_free(rpc_arena *a);

/* rpc_codec_unpack for a request a server received, which first refuses a string field holding
 * a NUL byte (protobuf-c would cut it there): then NULL with why = "FIELD: contains a NUL byte
 * at offset K" (rpc/rpc_wire.h). Any other failure: NULL with why = "". */
ProtobufCMessage *rpc_codec_unpack_request(grpc_byte_buffer *bb,
                                           const ProtobufCMessageDescriptor *desc,
                                           size_t max_bytes, char *why, size_t why_cap);

#endif
