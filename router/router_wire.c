#include "router/router_wire.h"

#include <string.h>

/* Reads a varint of at most 10 bytes; 0 when cut short or longer. */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int i = 0; i < 10 && *p < end; i++) {
        const uint8_t c = *(*p)++;
        x |= (uint64_t)(c & 0x7f) << (7 * i);
        if (!(c & 0x80)) {
            *v = x;
            return 1;
        }
    }
    return 0;
}

static size_t put_varint(uint64_t v, uint8_t *out)
{
    size_t k = 0;
    while (v >= 0x80) {
        out[k++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[k++] = (uint8_t)v;
    return k;
}

static size_t varint_size(uint64_t v)
{
    size_t k = 1;
    while (v >= 0x80) {
        v >>= 7;
        k++;
    }
    return k;
}

/* Walks b[0, n) (token_ids only): counts the ids, or stores them into ids when not NULL.
 * -1 when another field or malformed input is met. */
static long walk_ids(const uint8_t *b, size_t n, int32_t *ids)
{
    const uint8_t *p = b, *end = b + n;
    long k = 0;
    while (p < end) {
        uint64_t key, v;
        if (!get_varint(&p, end, &key)) return -1;
        if (key == (1 << 3 | 0)) { /* one id, not packed */
            if (!get_varint(&p, end, &v)) return -1;
            if (ids) ids[k] = (int32_t)(uint32_t)v;
            k++;
        } else if (key == (1 << 3 | 2)) { /* packed ids */
            if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p)) return -1;
            const uint8_t *q = p, *qend = p + v;
            while (q < qend) {
                uint64_t x;
                if (!get_varint(&q, qend, &x)) return -1;
                if (ids) ids[k] = (int32_t)(uint32_t)x; /* int32: the low 32 bits */
                k++;
            }
            p = qend;
        } else {
            return -1;
        }
    }
    return k;
}

Deltaserve__V1__GenerateResponse *router_wire_decode_tokens(const uint8_t *b, size_t n,
                                                             ProtobufCAllocator *alloc)
{
    const long k = n ? walk_ids(b, n, NULL) : -1;
    if (k <= 0) return NULL;
    Deltaserve__V1__GenerateResponse *m = alloc->alloc(alloc->allocator_data, sizeof *m);
    if (!m) return NULL;
    int32_t *ids = alloc->alloc(alloc->allocator_data, (size_t)k * sizeof *ids);
    if (!ids) {
        alloc->free(alloc->allocator_data, m);
        return NULL;
    }
    deltaserve__v1__generate_response__init(m);
    walk_ids(b, n, ids);
    m->token_ids = ids;
    m->n_token_ids = (size_t)k;
    return m;
}

size_t router_wire_tokens_max(size_t n_ids, size_t text_len)
{
    return 2 * 11 + 10 * n_ids + text_len;
}

size_t router_wire_encode_tokens(const int32_t *ids, size_t n_ids, const char *text,
                                 size_t text_len, uint8_t *out)
{
    size_t k = 0;
    if (n_ids) {
        size_t len = 0;
        for (size_t i = 0; i < n_ids; i++) len += varint_size((uint64_t)(int64_t)ids[i]);
        out[k++] = 1 << 3 | 2;
        k += put_varint(len, out + k);
        for (size_t i = 0; i < n_ids; i++) k += put_varint((uint64_t)(int64_t)ids[i], out + k);
    }
    if (text_len) {
        out[k++] = 2 << 3 | 2;
        k += put_varint(text_len, out + k);
        memcpy(out + k, text, text_len);
        k += text_len;
    }
    return k;
}
