/* Test helpers: hand-craft GGUF bytes (valid or deliberately broken), name temporary files
 * (file reads and the reference folder: tests/testutil/testutil.h). Test code: allocation
 * failures abort. */
#ifndef DS_TESTS_GGUF_GGUF_CRAFT_H
#define DS_TESTS_GGUF_GGUF_CRAFT_H

#include <stddef.h>
#include <stdint.h>

typedef struct gguf_craft {
    uint8_t *p; /* owned, [cap] */
    size_t n, cap;
} gguf_craft;

void gguf_craft_bytes(gguf_craft *c, const void *data, size_t n);
void gguf_craft_u32(gguf_craft *c, uint32_t v);
void gguf_craft_u64(gguf_craft *c, uint64_t v);
void gguf_craft_str(gguf_craft *c, const char *s); /* u64 length + bytes */
void gguf_craft_header(gguf_craft *c, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
void gguf_craft_kv_u32(gguf_craft *c, const char *key, uint32_t v);
void gguf_craft_kv_str(gguf_craft *c, const char *key, const char *v);
void gguf_craft_tensor(gguf_craft *c, const char *name, uint32_t n_dims, const uint64_t *ne,
                       uint32_t type, uint64_t offset);
void gguf_craft_pad(gguf_craft *c, size_t alignment); /* zeros up to a multiple */
void gguf_craft_zeros(gguf_craft *c, size_t n);
void gguf_craft_free(gguf_craft *c);

/* A fresh temporary path (under $TEST_TMPDIR or /tmp) with the given suffix. */
void gguf_craft_tmp_path(char *out, size_t cap, const char *suffix);

#endif
