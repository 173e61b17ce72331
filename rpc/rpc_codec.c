#include "rpc/rpc_codec.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdio.h>

#include "rpc/rpc_wire.h"

grpc_byte_buffer *rpc_codec_pack(const ProtobufCMessage *msg)
{
    const size_t n = protobuf_c_message_get_packed_size(msg);
    grpc_slice sl = grpc_slice_malloc(n);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

ProtobufCMessage *rpc_codec_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                   size_t max_bytes)
{
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return NULL;
    grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    const size_t n = GRPC_SLICE_LENGTH(sl);
    ProtobufCMessage *m = NULL;
    if (max_bytes == 0 || n <= max_bytes)
        m = protobuf_c_message_unpack(desc, NULL, n, GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    return m;
}

ProtobufCMessage *rpc_codec_unpack_request(grpc_byte_buffer *bb,
                                           const ProtobufCMessageDescriptor *desc,
                                           size_t max_bytes, char *why, size_t why_cap)
{
    if (why_cap) why[0] = 0;
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return NULL;
    grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    const size_t n = GRPC_SLICE_LENGTH(sl);
    const uint8_t *data = GRPC_SLICE_START_PTR(sl);
    ProtobufCMessage *m = NULL;
    char path[RPC_WIRE_PATH_MAX];
    size_t off;
    if (max_bytes && n > max_bytes) {
        /* too large: refused below as unparsable */
    } else if (rpc_wire_find_nul(desc, data, n, path, &off)) {
        if (why_cap) snprintf(why, why_cap, "%s: contains a NUL byte at offset %zu", path, off);
    } else {
        m = protobuf_c_message_unpack(desc, NULL, n, data);
    }
    grpc_slice_unref(sl);
    return m;
}
