#include "rpc/rpc_codec.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <stdio.h>
#include <stdlib.h>

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

ProtobufCMessage *rpc_codec_unpack_with(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                        size_t max_bytes, ProtobufCAllocator *alloc)
{
    if (bb->type == GRPC_BB_RAW && bb->data.raw.compression == GRPC_COMPRESS_NONE &&
        bb->data.raw.slice_buffer.count == 1) {
        const grpc_slice sl = bb->data.raw.slice_buffer.slices[0];
        const size_t n = GRPC_SLICE_LENGTH(sl);
        if (max_bytes && n > max_bytes) return NULL;
        return protobuf_c_message_unpack(desc, alloc, n, GRPC_SLICE_START_PTR(sl));
    }
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) return NULL;
    grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    const size_t n = GRPC_SLICE_LENGTH(sl);
    ProtobufCMessage *m = NULL;
    if (max_bytes == 0 || n <= max_bytes)
        m = protobuf_c_message_unpack(desc, alloc, n, GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    return m;
}

static void *arena_alloc(void *data, size_t size)
{
    rpc_arena *a = data;
    const size_t at = (a->used + 15) & ~(size_t)15;
    if (size <= a->cap && at <= a->cap - size) {
        a->used = at + size;
        return a->buf + at;
    }
    a->spilled = 1;
    return malloc(size);
}

static void arena_free(void *data, void *p)
{
    rpc_arena *a = data;
    const unsigned char *c = p;
    if (!a->buf || c < a->buf || c >= a->buf + a->cap) free(p);
}

int rpc_arena_init(rpc_arena *a, size_t bytes)
{
    a->alloc = (ProtobufCAllocator){arena_alloc, arena_free, a};
    a->used = 0;
    a->spilled = 0;
    a->buf = malloc(bytes);
    a->cap = a->buf ? bytes : 0;
    return a->buf ? 0 : -1;
}

void rpc_arena_reset(rpc_arena *a)
{
    a->used = 0;
    if (!a->spilled) return;
    a->spilled = 0;
    if (a->cap >= RPC_ARENA_MAX_BYTES) return;
    const size_t cap = a->cap ? 2 * a->cap : 4096;
    unsigned char *b = malloc(cap); /* nothing lives in the old one: no copy */
    if (!b) return;
    free(a->buf);
    a->buf = b;
    a->cap = cap;
}

void rpc_arena_free(rpc_arena *a)
{
    free(a->buf);
    a->buf = NULL;
    a->cap = a->used = 0;
}

ProtobufCMessage *rpc_codec_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *desc,
                                   size_t max_bytes)
{
    return rpc_codec_unpack_with(bb, desc, max_bytes, NULL);
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
