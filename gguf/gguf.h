/* GGUF v3 (and v2) reader: mmap, every length/count/offset checked against the file size.
 *
 * The file is hostile input: gguf_open never crashes or aborts on bad bytes; it returns
 * STATUS_FORMAT / STATUS_UNSUPPORTED with a message naming the byte offset and the key or
 * tensor. All pointers handed out point into the mapping and live until gguf_close. */
#ifndef DS_GGUF_GGUF_H
#define DS_GGUF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef enum gguf_vtype {
    GGUF_VTYPE_UINT8 = 0,
    GGUF_VTYPE_INT8 = 1,
    GGUF_VTYPE_UINT16 = 2,
    GGUF_VTYPE_INT16 = 3,
    GGUF_VTYPE_UINT32 = 4,
    GGUF_VTYPE_INT32 = 5,
    GGUF_VTYPE_FLOAT32 = 6,
    GGUF_VTYPE_BOOL = 7,
    GGUF_VTYPE_STRING = 8,
    GGUF_VTYPE_ARRAY = 9,
    GGUF_VTYPE_UINT64 = 10,
    GGUF_VTYPE_INT64 = 11,
    GGUF_VTYPE_FLOAT64 = 12,
    GGUF_VTYPE_COUNT
} gguf_vtype;

/* A string inside the mapping: not NUL-terminated. */
typedef struct gguf_str {
    uint64_t len;
    const char *ptr;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    gguf_vtype type;      /* value type; ARRAY for arrays */
    gguf_vtype arr_type;  /* element type when type == ARRAY */
    uint64_t n;           /* element count (1 for scalars) */
    const uint8_t *data;  /* scalar value or first array element, in the mapping (unaligned);
                           * for strings it points at the u64 length prefix: use strs */
    gguf_str *strs;       /* owned: n entries when the value is a string or an array of strings */
    uint64_t file_offset; /* byte offset of the KV record, for messages */
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS]; /* ggml order: ne[0] is contiguous; unused dims are 1 */
    uint32_t type;              /* ggml type id (quant.h) */
    uint64_t offset;            /* relative to the data section */
    uint64_t n_bytes;
    const void *data;           /* in the mapping */
} gguf_tensor;

typedef struct gguf_file {
    const char *path;      /* owned copy */
    const uint8_t *map;    /* owned mmap of the whole file */
    uint64_t size;
    uint32_t version;
    uint64_t n_kv;
    gguf_kv *kv;           /* owned, [n_kv] */
    uint64_t n_tensors;
    gguf_tensor *tensors;  /* owned, [n_tensors] */
    uint64_t alignment;
    uint64_t data_offset;  /* start of the data section */
} gguf_file;

/* Parses and validates PATH. On success *out owns the mapping; free it with gguf_close. */
int gguf_open(gguf_file **out, const char *path, status *st);
/* Same over a caller-owned buffer (used by the fuzzer and tests); buf must outlive the file. */
int gguf_open_buffer(gguf_file **out, const void *buf, uint64_t size, const char *name,
                     status *st);
void gguf_close(gguf_file *f);

/* Lookup; NULL if absent. key/name are NUL-terminated C strings. */
const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: return STATUS_OK, STATUS_NOT_FOUND if absent, STATUS_FORMAT if the type does
 * not fit (any unsigned/signed integer type that fits the range is accepted). */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, status *st);
int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, status *st);
int gguf_get_f32(const gguf_file *f, const char *key, float *out, status *st);
int gguf_get_bool(const gguf_file *f, const char *key, bool *out, status *st);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, status *st);
/* Integer array element i (any integer element type, or BOOL) as int64. */
int gguf_kv_get_int(const gguf_kv *kv, uint64_t i, int64_t *out);
/* Float array element i (FLOAT32/FLOAT64). */
int gguf_kv_get_float(const gguf_kv *kv, uint64_t i, double *out);

/* Bytes of one value of a scalar type (0 for STRING/ARRAY). */
size_t gguf_vtype_size(gguf_vtype t);
const char *gguf_vtype_name(gguf_vtype t);

/* Compare a gguf_str with a C string. */
bool gguf_str_eq(gguf_str s, const char *c);

#endif
