/* libFuzzer target for the GGUF reader (built by tools/fuzz with clang
 * -fsanitize=fuzzer,address,undefined). Each input is an exact-size buffer, so any read past
 * its end is an ASan report. Beyond "no crash, no leak" it checks the reader's contract:
 *   - a rejection is FORMAT or UNSUPPORTED (or NOMEM) with a message naming an offset;
 *   - on success every key, string, scalar, array element and tensor byte handed out lies in
 *     the buffer, lookups by name find the same records, and getters agree with the types. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"

#define FUZZ_CHECK(cond)                                                                    \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "gguf_fuzz: check failed: %s (line %d)\n", #cond, __LINE__);    \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

static const uint8_t *g_lo, *g_hi; /* the input buffer */

static void in_buffer(const void *p, uint64_t n)
{
    const uint8_t *b = p;
    FUZZ_CHECK(n == 0 || (b >= g_lo && b <= g_hi && n <= (uint64_t)(g_hi - b)));
}

/* The name as a C string if it has no NUL bytes (else NULL); caller frees. */
static char *cstr(gguf_str s)
{
    if (s.len > 4096 || (s.len && memchr(s.ptr, 0, s.len))) return NULL;
    char *c = malloc(s.len + 1);
    if (!c) return NULL;
    memcpy(c, s.ptr, s.len);
    c[s.len] = '\0';
    return c;
}

static volatile uint64_t g_sink;

static void walk_kv(const gguf_file *f, const gguf_kv *kv)
{
    status st;
    in_buffer(kv->key.ptr, kv->key.len);
    FUZZ_CHECK(kv->type < GGUF_VTYPE_COUNT);
    gguf_vtype et = kv->type == GGUF_VTYPE_ARRAY ? kv->arr_type : kv->type;
    FUZZ_CHECK(et < GGUF_VTYPE_COUNT && et != GGUF_VTYPE_ARRAY);
    if (kv->type != GGUF_VTYPE_ARRAY) FUZZ_CHECK(kv->n == 1);
    if (et == GGUF_VTYPE_STRING) {
        FUZZ_CHECK(kv->strs != NULL);
        for (uint64_t i = 0; i < kv->n; i++) {
            in_buffer(kv->strs[i].ptr, kv->strs[i].len);
            if (kv->strs[i].len) g_sink += (uint8_t)kv->strs[i].ptr[kv->strs[i].len - 1];
        }
    } else {
        in_buffer(kv->data, kv->n * gguf_vtype_size(et));
        for (uint64_t i = 0; i < kv->n && i < 64; i++) {
            int64_t v;
            double d;
            int ri = gguf_kv_get_int(kv, i, &v), rf = gguf_kv_get_float(kv, i, &d);
            FUZZ_CHECK(ri == STATUS_OK || ri == STATUS_FORMAT || ri == STATUS_RANGE);
            FUZZ_CHECK((rf == STATUS_OK) == (et == GGUF_VTYPE_FLOAT32 || et == GGUF_VTYPE_FLOAT64));
            g_sink += (uint64_t)v;
        }
        int64_t v;
        FUZZ_CHECK(gguf_kv_get_int(kv, kv->n, &v) == STATUS_RANGE);
    }
    char *key = cstr(kv->key);
    if (!key) return;
    FUZZ_CHECK(gguf_find_kv(f, key) == kv);
    uint32_t u32;
    uint64_t u64;
    float f32;
    bool b;
    gguf_str s;
    int rc = gguf_get_u32(f, key, &u32, &st);
    FUZZ_CHECK(rc == STATUS_OK || rc == STATUS_FORMAT);
    rc = gguf_get_u64(f, key, &u64, &st);
    FUZZ_CHECK(rc == STATUS_OK || rc == STATUS_FORMAT);
    rc = gguf_get_f32(f, key, &f32, &st);
    FUZZ_CHECK((rc == STATUS_OK) == (kv->type == GGUF_VTYPE_FLOAT32 || kv->type == GGUF_VTYPE_FLOAT64));
    rc = gguf_get_bool(f, key, &b, &st);
    FUZZ_CHECK((rc == STATUS_OK) == (kv->type == GGUF_VTYPE_BOOL));
    rc = gguf_get_str(f, key, &s, &st);
    FUZZ_CHECK((rc == STATUS_OK) == (kv->type == GGUF_VTYPE_STRING));
    if (rc == STATUS_OK) in_buffer(s.ptr, s.len);
    free(key);
}

static void walk_tensor(const gguf_file *f, const gguf_tensor *t)
{
    in_buffer(t->name.ptr, t->name.len);
    FUZZ_CHECK(t->n_dims >= 1 && t->n_dims <= GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) FUZZ_CHECK(t->ne[d] >= 1);
    FUZZ_CHECK(t->offset % f->alignment == 0);
    FUZZ_CHECK(t->n_bytes > 0);
    in_buffer(t->data, t->n_bytes);
    FUZZ_CHECK((const uint8_t *)t->data == f->map + f->data_offset + t->offset);
    const uint8_t *d = t->data;
    g_sink += d[0] + d[t->n_bytes - 1];
    char *name = cstr(t->name);
    if (name) FUZZ_CHECK(gguf_find_tensor(f, name) == t);
    free(name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *f = NULL;
    status st;
    status_clear(&st);
    g_lo = data;
    g_hi = data + size;
    int rc = gguf_open_buffer(&f, size ? data : NULL, size, "fuzz.gguf", &st);
    if (rc != STATUS_OK) {
        FUZZ_CHECK(f == NULL);
        FUZZ_CHECK(rc == STATUS_FORMAT || rc == STATUS_UNSUPPORTED || rc == STATUS_NOMEM);
        FUZZ_CHECK(rc == STATUS_NOMEM || strstr(st.msg, "offset") != NULL);
        FUZZ_CHECK(strncmp(st.msg, "fuzz.gguf: ", 11) == 0);
        FUZZ_CHECK(strchr(st.msg, '\n') == NULL);
        return 0;
    }
    FUZZ_CHECK(f->version == 2 || f->version == 3);
    FUZZ_CHECK(f->alignment && (f->alignment & (f->alignment - 1)) == 0);
    FUZZ_CHECK(f->data_offset % f->alignment == 0);
    FUZZ_CHECK(f->n_tensors == 0 || f->data_offset <= size);
    for (uint64_t i = 0; i < f->n_kv; i++) walk_kv(f, &f->kv[i]);
    for (uint64_t i = 0; i < f->n_tensors; i++) walk_tensor(f, &f->tensors[i]);
    gguf_close(f);
    return 0;
}
