#include "tests/gguf/gguf_craft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/status.h"
#include "tests/testutil/testutil.h"

void gguf_craft_bytes(gguf_craft *c, const void *data, size_t n)
{
    if (c->n + n > c->cap) {
        size_t cap = c->cap ? c->cap : 256;
        while (cap < c->n + n) cap *= 2;
        c->p = realloc(c->p, cap);
        DS_ASSERT(c->p);
        c->cap = cap;
    }
    if (n) memcpy(c->p + c->n, data, n);
    c->n += n;
}

void gguf_craft_u32(gguf_craft *c, uint32_t v) { gguf_craft_bytes(c, &v, 4); }
void gguf_craft_u64(gguf_craft *c, uint64_t v) { gguf_craft_bytes(c, &v, 8); }

void gguf_craft_str(gguf_craft *c, const char *s)
{
    gguf_craft_u64(c, strlen(s));
    gguf_craft_bytes(c, s, strlen(s));
}

void gguf_craft_header(gguf_craft *c, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    gguf_craft_bytes(c, "GGUF", 4);
    gguf_craft_u32(c, version);
    gguf_craft_u64(c, n_tensors);
    gguf_craft_u64(c, n_kv);
}

void gguf_craft_kv_u32(gguf_craft *c, const char *key, uint32_t v)
{
    gguf_craft_str(c, key);
    gguf_craft_u32(c, 4); /* GGUF_VTYPE_UINT32 */
    gguf_craft_u32(c, v);
}

void gguf_craft_kv_str(gguf_craft *c, const char *key, const char *v)
{
    gguf_craft_str(c, key);
    gguf_craft_u32(c, 8); /* GGUF_VTYPE_STRING */
    gguf_craft_str(c, v);
}

void gguf_craft_tensor(gguf_craft *c, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset)
{
    gguf_craft_str(c, name);
    gguf_craft_u32(c, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gguf_craft_u64(c, ne[d]);
    gguf_craft_u32(c, type);
    gguf_craft_u64(c, offset);
}

void gguf_craft_zeros(gguf_craft *c, size_t n)
{
    static const uint8_t z[64];
    while (n) {
        size_t k = n < sizeof z ? n : sizeof z;
        gguf_craft_bytes(c, z, k);
        n -= k;
    }
}

void gguf_craft_pad(gguf_craft *c, size_t alignment)
{
    gguf_craft_zeros(c, (alignment - c->n % alignment) % alignment);
}

void gguf_craft_free(gguf_craft *c)
{
    free(c->p);
    c->p = NULL;
    c->n = c->cap = 0;
}

void gguf_craft_tmp_path(char *out, size_t cap, const char *suffix)
{
    static int counter;
    snprintf(out, cap, "%s/gguf_test_%d_%d%s", testutil_tmp_dir(), (int)getpid(), counter++,
             suffix);
}
