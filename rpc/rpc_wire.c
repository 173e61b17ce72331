#include "rpc/rpc_wire.h"

#include <stdio.h>
#include <string.h>

/* Nested messages deeper than this are not looked into (our protos nest 4 deep). */
#define WIRE_MAX_DEPTH 32

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return 1;
    }
    return 0;
}

/* The occurrence index of field number `num` among the fields before `at` in [start, at):
 * a repeated field's element index. Counted only when a NUL was found, so the walk itself
 * stays one pass. */
static size_t occurrence(const uint8_t *start, const uint8_t *at, uint32_t num)
{
    size_t k = 0;
    const uint8_t *p = start;
    while (p < at) {
        uint64_t key, v;
        if (!read_varint(&p, at, &key)) break;
        switch (key & 7) {
        case 0: if (!read_varint(&p, at, &v)) return k; break;
        case 1: if (at - p < 8) return k; p += 8; break;
        case 5: if (at - p < 4) return k; p += 4; break;
        case 2:
            if (!read_varint(&p, at, &v) || v > (uint64_t)(at - p)) return k;
            p += v;
            break;
        default: return k;
        }
        if ((uint32_t)(key >> 3) == num && (key & 7) == 2) k++;
    }
    return k;
}

static int walk(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t n,
                char *path, size_t path_len, size_t *offset, int depth)
{
    const uint8_t *p = data, *end = data + n;
    while (p < end) {
        const uint8_t *field_start = p;
        uint64_t key, v;
        if (!read_varint(&p, end, &key)) return 0;
        switch (key & 7) {
        case 0: if (!read_varint(&p, end, &v)) return 0; continue;
        case 1: if (end - p < 8) return 0; p += 8; continue;
        case 5: if (end - p < 4) return 0; p += 4; continue;
        case 2: break;
        default: return 0;
        }
        if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p)) return 0;
        const uint8_t *val = p;
        size_t len = (size_t)v;
        p += len;
        uint32_t num = (uint32_t)(key >> 3);
        const ProtobufCFieldDescriptor *f =
            num <= (uint32_t)INT32_MAX ? protobuf_c_message_descriptor_get_field(desc, num) : NULL;
        if (!f) continue;
        const int is_msg = f->type == PROTOBUF_C_TYPE_MESSAGE && depth < WIRE_MAX_DEPTH;
        const uint8_t *nul = NULL;
        if (f->type == PROTOBUF_C_TYPE_STRING) nul = memchr(val, 0, len);
        if (!nul && !is_msg) continue;
        /* this field's name (and index) on the path */
        size_t k = path_len;
        int w;
        if (f->label == PROTOBUF_C_LABEL_REPEATED)
            w = snprintf(path + k, RPC_WIRE_PATH_MAX - k, "%s%s[%zu]", k ? "." : "", f->name,
                         occurrence(data, field_start, num));
        else
            w = snprintf(path + k, RPC_WIRE_PATH_MAX - k, "%s%s", k ? "." : "", f->name);
        size_t nk = w < 0 ? k : k + (size_t)w;
        if (nk >= RPC_WIRE_PATH_MAX) nk = RPC_WIRE_PATH_MAX - 1;
        if (nul) {
            *offset = (size_t)(nul - val);
            return 1;
        }
        if (walk((const ProtobufCMessageDescriptor *)f->descriptor, val, len, path, nk, offset,
                 depth + 1))
            return 1;
        path[k] = 0;
    }
    return 0;
}

int rpc_wire_find_nul(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t n,
                      char path[RPC_WIRE_PATH_MAX], size_t *offset)
{
    path[0] = 0;
    *offset = 0;
    return walk(desc, data, n, path, 0, offset, 0);
}
