/* GGUF v3/v2 reader. The file is hostile: every read goes through a bounds-checked cursor,
 * every count is bounded by the bytes left before anything is allocated, and every size and
 * offset is computed with overflow checks. Layout: docs/QWEN35.md §1.8 (ggml docs/gguf.md).
 *
 * Errors read "<path>: offset <byte>: <what> [key/tensor '<name>']" so a user can open the
 * file in a hex editor at that byte. */
#include "gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf/quant.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c reads little-endian GGUF files by memcpy: a big-endian host needs byte swaps"
#endif

#define GGUF_MAGIC "GGUF"
/* Smallest possible records, used to bound counts by the bytes left before allocating. */
#define GGUF_MIN_KV_BYTES 13     /* u64 key len + u32 type + 1-byte value */
#define GGUF_MIN_TENSOR_BYTES 32 /* u64 name len + u32 n_dims + 1 × u64 ne + u32 type + u64 off */

/* The public struct plus what only the reader needs. */
typedef struct gguf_impl {
    gguf_file pub;
    bool mapped;               /* pub.map is an mmap we must munmap */
    const gguf_kv **kv_sorted; /* owned, [n_kv], sorted by key, for lookups */
    const gguf_tensor **t_sorted; /* owned, [n_tensors], sorted by name */
} gguf_impl;

/* Bounds-checked reader over [buf, buf + size). */
typedef struct cursor {
    const uint8_t *buf;
    uint64_t size;
    uint64_t pos;
    const char *path;
    status *st;
} cursor;

/* ---------------------------------------------------------------------------------------- */
/* helpers */

/* Writes s into out as printable ASCII (others as \xNN), truncated with "..." at cap bytes. */
static const char *str_printable(gguf_str s, char *out, size_t cap)
{
    size_t o = 0;
    for (uint64_t i = 0; i < s.len; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (o + 8 >= cap) {
            memcpy(out + o, "...", 4);
            return out;
        }
        if (c >= 0x20 && c < 0x7f && c != '\'')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    out[o] = '\0';
    return out;
}

static int fail_at(cursor *c, uint64_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* One-line FORMAT failure naming the path and offset. */
static int fail_at(cursor *c, uint64_t off, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return status_fail(c->st, STATUS_FORMAT, "%s: offset %llu: %s", c->path,
                       (unsigned long long)off, what);
}

static uint64_t cur_left(const cursor *c)
{
    return c->size - c->pos;
}

static int cur_bytes(cursor *c, uint64_t n, const uint8_t **out, const char *what)
{
    if (n > cur_left(c))
        return fail_at(c, c->pos, "%s: need %llu bytes, %llu left in the file", what,
                       (unsigned long long)n, (unsigned long long)cur_left(c));
    *out = c->buf + c->pos;
    c->pos += n;
    return STATUS_OK;
}

static int cur_u32(cursor *c, uint32_t *v, const char *what)
{
    const uint8_t *p = NULL;
    int rc = cur_bytes(c, 4, &p, what);
    if (rc) return rc;
    memcpy(v, p, 4);
    return STATUS_OK;
}

static int cur_u64(cursor *c, uint64_t *v, const char *what)
{
    const uint8_t *p = NULL;
    int rc = cur_bytes(c, 8, &p, what);
    if (rc) return rc;
    memcpy(v, p, 8);
    return STATUS_OK;
}

static int cur_str(cursor *c, gguf_str *s, const char *what)
{
    uint64_t start = c->pos, len;
    const uint8_t *p = NULL;
    int rc = cur_u64(c, &len, what);
    if (rc) return rc;
    if (len > cur_left(c))
        return fail_at(c, start, "%s: string length %llu exceeds the %llu bytes left", what,
                       (unsigned long long)len, (unsigned long long)cur_left(c));
    rc = cur_bytes(c, len, &p, what);
    if (rc) return rc;
    s->len = len;
    s->ptr = (const char *)p;
    return STATUS_OK;
}

static int str_cmp(gguf_str a, gguf_str b)
{
    uint64_t n = a.len < b.len ? a.len : b.len;
    int r = n ? memcmp(a.ptr, b.ptr, (size_t)n) : 0;
    if (r) return r;
    return a.len < b.len ? -1 : a.len > b.len;
}

bool gguf_str_eq(gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

size_t gguf_vtype_size(gguf_vtype t)
{
    switch (t) {
    case GGUF_VTYPE_UINT8: case GGUF_VTYPE_INT8: case GGUF_VTYPE_BOOL: return 1;
    case GGUF_VTYPE_UINT16: case GGUF_VTYPE_INT16: return 2;
    case GGUF_VTYPE_UINT32: case GGUF_VTYPE_INT32: case GGUF_VTYPE_FLOAT32: return 4;
    case GGUF_VTYPE_UINT64: case GGUF_VTYPE_INT64: case GGUF_VTYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *gguf_vtype_name(gguf_vtype t)
{
    static const char *const names[GGUF_VTYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
    };
    return (unsigned)t < GGUF_VTYPE_COUNT ? names[t] : "?";
}

static bool vtype_is_int(gguf_vtype t)
{
    switch (t) {
    case GGUF_VTYPE_UINT8: case GGUF_VTYPE_INT8: case GGUF_VTYPE_UINT16: case GGUF_VTYPE_INT16:
    case GGUF_VTYPE_UINT32: case GGUF_VTYPE_INT32: case GGUF_VTYPE_UINT64: case GGUF_VTYPE_INT64:
        return true;
    default:
        return false;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* KVs */

/* Reads n strings at the cursor into kv->strs (allocated here; n already bounded). */
static int parse_strings(cursor *c, gguf_kv *kv, uint64_t n, const char *key)
{
    if (n > cur_left(c) / 8)
        return fail_at(c, c->pos, "key '%s': %llu strings cannot fit in the %llu bytes left", key,
                       (unsigned long long)n, (unsigned long long)cur_left(c));
    kv->strs = calloc(n ? n : 1, sizeof *kv->strs);
    if (!kv->strs)
        return status_fail(c->st, STATUS_NOMEM, "%s: key '%s': no memory for %llu strings",
                           c->path, key, (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t at = c->pos, len;
        const uint8_t *p = NULL;
        if (cur_left(c) < 8)
            return fail_at(c, at, "key '%s': string %llu of %llu: length cut off by the end of "
                           "the file", key, (unsigned long long)i, (unsigned long long)n);
        memcpy(&len, c->buf + c->pos, 8);
        c->pos += 8;
        if (len > cur_left(c))
            return fail_at(c, at, "key '%s': string %llu of %llu: string length %llu exceeds "
                           "the %llu bytes left", key, (unsigned long long)i,
                           (unsigned long long)n, (unsigned long long)len,
                           (unsigned long long)cur_left(c));
        int rc = cur_bytes(c, len, &p, "string value");
        if (rc) return rc;
        kv->strs[i].len = len;
        kv->strs[i].ptr = (const char *)p;
    }
    return STATUS_OK;
}

static int parse_kv(cursor *c, gguf_kv *kv)
{
    char kbuf[96];
    uint32_t t;
    int rc;

    kv->file_offset = c->pos;
    rc = cur_str(c, &kv->key, "KV key");
    if (rc) return rc;
    if (kv->key.len == 0) return fail_at(c, kv->file_offset, "empty KV key");
    const char *key = str_printable(kv->key, kbuf, sizeof kbuf);

    uint64_t at = c->pos;
    if ((rc = cur_u32(c, &t, "KV value type"))) return rc;
    if (t >= GGUF_VTYPE_COUNT)
        return fail_at(c, at, "key '%s': unknown value type %u", key, t);
    kv->type = (gguf_vtype)t;
    kv->n = 1;
    kv->data = c->buf + c->pos;

    if (kv->type == GGUF_VTYPE_STRING) return parse_strings(c, kv, 1, key);

    if (kv->type != GGUF_VTYPE_ARRAY) {
        const uint8_t *p;
        return cur_bytes(c, gguf_vtype_size(kv->type), &p, "KV value");
    }

    at = c->pos;
    if ((rc = cur_u32(c, &t, "array element type"))) return rc;
    if (t >= GGUF_VTYPE_COUNT)
        return fail_at(c, at, "key '%s': unknown array element type %u", key, t);
    if (t == GGUF_VTYPE_ARRAY)
        return fail_at(c, at, "key '%s': arrays of arrays are not supported", key);
    kv->arr_type = (gguf_vtype)t;
    at = c->pos;
    if ((rc = cur_u64(c, &kv->n, "array length"))) return rc;
    kv->data = c->buf + c->pos;
    if (kv->arr_type == GGUF_VTYPE_STRING) return parse_strings(c, kv, kv->n, key);

    uint64_t esz = gguf_vtype_size(kv->arr_type), bytes;
    if (__builtin_mul_overflow(kv->n, esz, &bytes) || bytes > cur_left(c))
        return fail_at(c, at, "key '%s': array of %llu %s exceeds the %llu bytes left", key,
                       (unsigned long long)kv->n, gguf_vtype_name(kv->arr_type),
                       (unsigned long long)cur_left(c));
    const uint8_t *p = NULL;
    return cur_bytes(c, bytes, &p, "array data");
}

/* ---------------------------------------------------------------------------------------- */
/* tensor infos */

static int parse_tensor_info(cursor *c, gguf_tensor *t, uint64_t alignment)
{
    char nbuf[96];
    uint64_t start = c->pos, at;
    int rc;

    if ((rc = cur_str(c, &t->name, "tensor name"))) return rc;
    if (t->name.len == 0) return fail_at(c, start, "empty tensor name");
    const char *name = str_printable(t->name, nbuf, sizeof nbuf);

    at = c->pos;
    if ((rc = cur_u32(c, &t->n_dims, "tensor n_dims"))) return rc;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return fail_at(c, at, "tensor '%s': n_dims %u is not in 1..%d", name, t->n_dims,
                       GGUF_MAX_DIMS);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        at = c->pos;
        if ((rc = cur_u64(c, &t->ne[d], "tensor dimension"))) return rc;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)INT64_MAX)
            return fail_at(c, at, "tensor '%s': ne[%u] = %llu is not a positive int64", name, d,
                           (unsigned long long)t->ne[d]);
        if (__builtin_mul_overflow(n_el, t->ne[d], &n_el) || n_el > (uint64_t)INT64_MAX)
            return fail_at(c, at, "tensor '%s': element count overflows int64", name);
    }

    at = c->pos;
    if ((rc = cur_u32(c, &t->type, "tensor type"))) return rc;
    const quant_traits *qt = quant_get(t->type);
    if (!qt || qt->block_size == 0 || qt->type_size == 0)
        return fail_at(c, at, "tensor '%s': unknown ggml type id %u", name, t->type);
    if (t->ne[0] % qt->block_size != 0)
        return fail_at(c, at, "tensor '%s': ne[0] = %llu is not a multiple of %s's block size %u",
                       name, (unsigned long long)t->ne[0], qt->name, qt->block_size);
    uint64_t row, rows = n_el / t->ne[0];
    if (__builtin_mul_overflow(t->ne[0] / qt->block_size, (uint64_t)qt->type_size, &row) ||
        __builtin_mul_overflow(row, rows, &t->n_bytes))
        return fail_at(c, at, "tensor '%s': byte size overflows", name);

    at = c->pos;
    if ((rc = cur_u64(c, &t->offset, "tensor data offset"))) return rc;
    if (t->offset % alignment != 0)
        return fail_at(c, at, "tensor '%s': data offset %llu is not a multiple of the alignment %llu",
                       name, (unsigned long long)t->offset, (unsigned long long)alignment);
    return STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* sorting and lookup */

static int kv_ptr_cmp(const void *a, const void *b)
{
    return str_cmp((*(const gguf_kv *const *)a)->key, (*(const gguf_kv *const *)b)->key);
}

static int tensor_name_cmp(const void *a, const void *b)
{
    return str_cmp((*(const gguf_tensor *const *)a)->name, (*(const gguf_tensor *const *)b)->name);
}

static int tensor_off_cmp(const void *a, const void *b)
{
    uint64_t x = (*(const gguf_tensor *const *)a)->offset;
    uint64_t y = (*(const gguf_tensor *const *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Compares a gguf_str with a C string in str_cmp order. */
static int str_cmp_c(gguf_str s, const char *c)
{
    gguf_str k = {strlen(c), c};
    return str_cmp(s, k);
}

/* Index of key in the sorted array, or -1. Items are pointers whose first field is a gguf_str
 * at byte offset str_off. */
static const void *bsearch_str(const void *const *sorted, uint64_t n, size_t str_off,
                               const char *key)
{
    uint64_t lo = 0, hi = n;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        gguf_str s;
        memcpy(&s, (const char *)sorted[mid] + str_off, sizeof s);
        int r = str_cmp_c(s, key);
        if (r == 0) return sorted[mid];
        if (r < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key)
{
    const gguf_impl *im = (const gguf_impl *)f;
    return bsearch_str((const void *const *)im->kv_sorted, f->n_kv, offsetof(gguf_kv, key), key);
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name)
{
    const gguf_impl *im = (const gguf_impl *)f;
    return bsearch_str((const void *const *)im->t_sorted, f->n_tensors,
                       offsetof(gguf_tensor, name), name);
}

/* ---------------------------------------------------------------------------------------- */
/* whole file */

/* Sorts the KVs by key, rejects duplicates. */
static int index_kvs(gguf_impl *im, cursor *c)
{
    gguf_file *f = &im->pub;
    char kbuf[96];
    im->kv_sorted = malloc((f->n_kv ? f->n_kv : 1) * sizeof *im->kv_sorted);
    if (!im->kv_sorted) return status_fail(c->st, STATUS_NOMEM, "%s: no memory", c->path);
    for (uint64_t i = 0; i < f->n_kv; i++) im->kv_sorted[i] = &f->kv[i];
    qsort(im->kv_sorted, f->n_kv, sizeof *im->kv_sorted, kv_ptr_cmp);
    for (uint64_t i = 1; i < f->n_kv; i++)
        if (str_cmp(im->kv_sorted[i - 1]->key, im->kv_sorted[i]->key) == 0) {
            const gguf_kv *a = im->kv_sorted[i - 1], *b = im->kv_sorted[i];
            const gguf_kv *later = a->file_offset > b->file_offset ? a : b;
            return fail_at(c, later->file_offset, "duplicate key '%s'",
                           str_printable(later->key, kbuf, sizeof kbuf));
        }
    return STATUS_OK;
}

/* Sorts the tensors by name (rejects duplicates) and by offset (rejects overlaps); checks every
 * data range lies inside the file. */
static int index_tensors(gguf_impl *im, cursor *c, const uint64_t *info_off)
{
    gguf_file *f = &im->pub;
    char nbuf[96], nbuf2[96];
    uint64_t n = f->n_tensors;
    int rc = STATUS_OK;

    im->t_sorted = malloc((n ? n : 1) * sizeof *im->t_sorted);
    if (!im->t_sorted) return status_fail(c->st, STATUS_NOMEM, "%s: no memory", c->path);
    for (uint64_t i = 0; i < n; i++) im->t_sorted[i] = &f->tensors[i];
    qsort(im->t_sorted, n, sizeof *im->t_sorted, tensor_name_cmp);
    for (uint64_t i = 1; i < n; i++)
        if (str_cmp(im->t_sorted[i - 1]->name, im->t_sorted[i]->name) == 0) {
            const gguf_tensor *later = im->t_sorted[i - 1] > im->t_sorted[i] ? im->t_sorted[i - 1]
                                                                            : im->t_sorted[i];
            return fail_at(c, info_off[later - f->tensors], "duplicate tensor name '%s'",
                           str_printable(later->name, nbuf, sizeof nbuf));
        }

    for (uint64_t i = 0; i < n; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t start, end;
        if (__builtin_add_overflow(f->data_offset, t->offset, &start) ||
            __builtin_add_overflow(start, t->n_bytes, &end) || end > f->size)
            return fail_at(c, info_off[i],
                           "tensor '%s': data [%llu, +%llu) past the data section start %llu "
                           "runs beyond the end of the file (%llu bytes)",
                           str_printable(t->name, nbuf, sizeof nbuf),
                           (unsigned long long)t->offset, (unsigned long long)t->n_bytes,
                           (unsigned long long)f->data_offset, (unsigned long long)f->size);
        t->data = f->map + start;
    }

    /* Overlaps: sort a scratch copy by offset; the name-sorted index stays for lookups. */
    const gguf_tensor **by_off = malloc((n ? n : 1) * sizeof *by_off);
    if (!by_off) return status_fail(c->st, STATUS_NOMEM, "%s: no memory", c->path);
    memcpy(by_off, im->t_sorted, n * sizeof *by_off);
    qsort(by_off, n, sizeof *by_off, tensor_off_cmp);
    for (uint64_t i = 1; i < n; i++) {
        const gguf_tensor *a = by_off[i - 1], *b = by_off[i];
        if (a->offset + a->n_bytes > b->offset) { /* no overflow: both end inside the file */
            rc = fail_at(c, info_off[b - f->tensors],
                         "tensor '%s' data at %llu overlaps tensor '%s' [%llu, %llu)",
                         str_printable(b->name, nbuf, sizeof nbuf), (unsigned long long)b->offset,
                         str_printable(a->name, nbuf2, sizeof nbuf2),
                         (unsigned long long)a->offset,
                         (unsigned long long)(a->offset + a->n_bytes));
            break;
        }
    }
    free(by_off);
    return rc;
}

/* Reads general.alignment if present: must be a u32, a non-zero power of two. */
static int read_alignment(gguf_file *f, cursor *c)
{
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_find_kv(f, "general.alignment");
    if (!kv) return STATUS_OK;
    if (kv->type != GGUF_VTYPE_UINT32)
        return fail_at(c, kv->file_offset, "key 'general.alignment' has type %s, expected u32",
                       gguf_vtype_name(kv->type));
    uint32_t a;
    memcpy(&a, kv->data, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return fail_at(c, kv->file_offset,
                       "key 'general.alignment' = %u is not a non-zero power of two", a);
    f->alignment = a;
    return STATUS_OK;
}

static int parse(gguf_impl *im, status *st)
{
    gguf_file *f = &im->pub;
    cursor c = {f->map, f->size, 0, f->path, st};
    uint64_t at;
    uint64_t *info_off = NULL;
    int rc;

    if (f->size < 4 || memcmp(f->map, GGUF_MAGIC, 4) != 0)
        return fail_at(&c, 0, "not a GGUF file (bad magic)");
    c.pos = 4;
    if ((rc = cur_u32(&c, &f->version, "version"))) return rc;
    if (f->version != 2 && f->version != 3)
        return status_fail(st, STATUS_UNSUPPORTED, "%s: offset 4: GGUF version %u (only 2 and 3)",
                           f->path, f->version);
    if ((rc = cur_u64(&c, &f->n_tensors, "tensor count"))) return rc;
    at = c.pos;
    uint64_t n_kv;
    if ((rc = cur_u64(&c, &n_kv, "KV count"))) return rc;
    if (n_kv > cur_left(&c) / GGUF_MIN_KV_BYTES)
        return fail_at(&c, at, "KV count %llu cannot fit in the %llu bytes left",
                       (unsigned long long)n_kv, (unsigned long long)cur_left(&c));
    if (f->n_tensors > cur_left(&c) / GGUF_MIN_TENSOR_BYTES)
        return fail_at(&c, 8, "tensor count %llu cannot fit in the %llu bytes left",
                       (unsigned long long)f->n_tensors, (unsigned long long)cur_left(&c));

    f->kv = calloc(n_kv ? n_kv : 1, sizeof *f->kv);
    if (!f->kv) return status_fail(st, STATUS_NOMEM, "%s: no memory for %llu KVs", f->path,
                                   (unsigned long long)n_kv);
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = i + 1; /* so gguf_close frees the strings of a partly parsed KV */
        if ((rc = parse_kv(&c, &f->kv[i]))) return rc;
    }
    if ((rc = index_kvs(im, &c))) return rc;
    if ((rc = read_alignment(f, &c))) return rc;

    /* Re-check the tensor count against what is left now that the KVs are read. */
    uint64_t n_t = f->n_tensors;
    f->n_tensors = 0;
    if (n_t > cur_left(&c) / GGUF_MIN_TENSOR_BYTES)
        return fail_at(&c, 8, "tensor count %llu cannot fit in the %llu bytes left after the KVs",
                       (unsigned long long)n_t, (unsigned long long)cur_left(&c));
    f->tensors = calloc(n_t ? n_t : 1, sizeof *f->tensors);
    info_off = malloc((n_t ? n_t : 1) * sizeof *info_off);
    if (!f->tensors || !info_off) {
        free(info_off);
        return status_fail(st, STATUS_NOMEM, "%s: no memory for %llu tensors", f->path,
                           (unsigned long long)n_t);
    }
    for (uint64_t i = 0; i < n_t; i++) {
        info_off[i] = c.pos;
        if ((rc = parse_tensor_info(&c, &f->tensors[i], f->alignment))) goto out;
    }
    f->n_tensors = n_t;

    /* The data section starts at the next multiple of the alignment. */
    uint64_t pad = (f->alignment - c.pos % f->alignment) % f->alignment;
    f->data_offset = c.pos + pad; /* c.pos ≤ size < 2^64 - alignment in practice; checked: */
    if (f->data_offset < c.pos) {
        rc = fail_at(&c, c.pos, "data section offset overflows");
        goto out;
    }
    if (n_t > 0 && f->data_offset > f->size) {
        rc = fail_at(&c, c.pos, "data section at %llu starts past the end of the file (%llu bytes)",
                     (unsigned long long)f->data_offset, (unsigned long long)f->size);
        goto out;
    }
    rc = index_tensors(im, &c, info_off);
out:
    free(info_off);
    return rc;
}

static int open_common(gguf_file **out, gguf_impl *im, status *st)
{
    int rc = parse(im, st);
    if (rc) {
        gguf_close(&im->pub);
        return rc;
    }
    *out = &im->pub;
    return STATUS_OK;
}

static gguf_impl *impl_new(const char *name, status *st)
{
    gguf_impl *im = calloc(1, sizeof *im);
    char *path = strdup(name ? name : "(buffer)");
    if (!im || !path) {
        free(im);
        free(path);
        status_fail(st, STATUS_NOMEM, "%s: no memory", name ? name : "(buffer)");
        return NULL;
    }
    im->pub.path = path;
    return im;
}

int gguf_open(gguf_file **out, const char *path, status *st)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return status_fail(st, errno == ENOENT ? STATUS_NOT_FOUND : STATUS_IO, "%s: open: %s",
                           path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return status_fail(st, STATUS_IO, "%s: fstat: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return status_fail(st, STATUS_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 4) {
        close(fd);
        return status_fail(st, STATUS_FORMAT, "%s: offset 0: file of %lld bytes is too short",
                           path, (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return status_fail(st, STATUS_IO, "%s: mmap: %s", path, strerror(e));

    gguf_impl *im = impl_new(path, st);
    if (!im) {
        munmap(map, (size_t)sb.st_size);
        return STATUS_NOMEM;
    }
    im->pub.map = map;
    im->pub.size = (uint64_t)sb.st_size;
    im->mapped = true;
    return open_common(out, im, st);
}

int gguf_open_buffer(gguf_file **out, const void *buf, uint64_t size, const char *name,
                     status *st)
{
    *out = NULL;
    DS_ASSERT(buf || size == 0);
    gguf_impl *im = impl_new(name, st);
    if (!im) return STATUS_NOMEM;
    static const uint8_t empty[1];
    im->pub.map = buf ? buf : empty;
    im->pub.size = size;
    return open_common(out, im, st);
}

void gguf_close(gguf_file *f)
{
    if (!f) return;
    gguf_impl *im = (gguf_impl *)f;
    for (uint64_t i = 0; i < f->n_kv; i++) free(f->kv[i].strs);
    free(f->kv);
    free(f->tensors);
    free(im->kv_sorted);
    free(im->t_sorted);
    if (im->mapped) munmap((void *)f->map, (size_t)f->size);
    free((void *)f->path);
    free(im);
}

/* ---------------------------------------------------------------------------------------- */
/* typed getters */

/* Reads element i of an integer-typed value as a wide integer; is_neg set for negative. */
static bool read_int(gguf_vtype t, const uint8_t *p, int64_t *s, uint64_t *u, bool *neg)
{
    *neg = false;
    switch (t) {
    case GGUF_VTYPE_UINT8: { uint8_t v; memcpy(&v, p, 1); *u = v; break; }
    case GGUF_VTYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); *u = v; break; }
    case GGUF_VTYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); *u = v; break; }
    case GGUF_VTYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); *u = v; break; }
    case GGUF_VTYPE_BOOL: { uint8_t v; memcpy(&v, p, 1); *u = v != 0; break; }
    case GGUF_VTYPE_INT8: { int8_t v; memcpy(&v, p, 1); *s = v; goto sgn; }
    case GGUF_VTYPE_INT16: { int16_t v; memcpy(&v, p, 2); *s = v; goto sgn; }
    case GGUF_VTYPE_INT32: { int32_t v; memcpy(&v, p, 4); *s = v; goto sgn; }
    case GGUF_VTYPE_INT64: { int64_t v; memcpy(&v, p, 8); *s = v; goto sgn; }
    default: return false;
    }
    *s = *u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)*u;
    return true;
sgn:
    *neg = *s < 0;
    *u = *neg ? 0 : (uint64_t)*s;
    return true;
}

static const gguf_kv *find_scalar(const gguf_file *f, const char *key, status *st, int *rc)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) {
        *rc = status_fail(st, STATUS_NOT_FOUND, "%s: key '%s' not found", f->path, key);
        return NULL;
    }
    *rc = STATUS_OK;
    return kv;
}

static int get_uint(const gguf_file *f, const char *key, uint64_t max, uint64_t *out, status *st)
{
    int rc;
    const gguf_kv *kv = find_scalar(f, key, st, &rc);
    if (!kv) return rc;
    int64_t s;
    uint64_t u;
    bool neg;
    if (kv->type == GGUF_VTYPE_BOOL || !read_int(kv->type, kv->data, &s, &u, &neg))
        return status_fail(st, STATUS_FORMAT, "%s: offset %llu: key '%s' has type %s, expected an integer",
                           f->path, (unsigned long long)kv->file_offset, key,
                           gguf_vtype_name(kv->type));
    if (neg)
        return status_fail(st, STATUS_FORMAT, "%s: offset %llu: key '%s' = %lld is negative",
                           f->path, (unsigned long long)kv->file_offset, key, (long long)s);
    if (u > max)
        return status_fail(st, STATUS_FORMAT, "%s: offset %llu: key '%s' = %llu is out of range",
                           f->path, (unsigned long long)kv->file_offset, key,
                           (unsigned long long)u);
    *out = u;
    return STATUS_OK;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, status *st)
{
    uint64_t v;
    int rc = get_uint(f, key, UINT32_MAX, &v, st);
    if (rc == STATUS_OK) *out = (uint32_t)v;
    return rc;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, status *st)
{
    return get_uint(f, key, UINT64_MAX, out, st);
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out, status *st)
{
    int rc;
    const gguf_kv *kv = find_scalar(f, key, st, &rc);
    if (!kv) return rc;
    if (kv->type == GGUF_VTYPE_FLOAT32) {
        memcpy(out, kv->data, 4);
        return STATUS_OK;
    }
    if (kv->type == GGUF_VTYPE_FLOAT64) {
        double d;
        memcpy(&d, kv->data, 8);
        *out = (float)d;
        return STATUS_OK;
    }
    return status_fail(st, STATUS_FORMAT, "%s: offset %llu: key '%s' has type %s, expected f32",
                       f->path, (unsigned long long)kv->file_offset, key,
                       gguf_vtype_name(kv->type));
}

int gguf_get_bool(const gguf_file *f, const char *key, bool *out, status *st)
{
    int rc;
    const gguf_kv *kv = find_scalar(f, key, st, &rc);
    if (!kv) return rc;
    if (kv->type != GGUF_VTYPE_BOOL)
        return status_fail(st, STATUS_FORMAT, "%s: offset %llu: key '%s' has type %s, expected bool",
                           f->path, (unsigned long long)kv->file_offset, key,
                           gguf_vtype_name(kv->type));
    *out = kv->data[0] != 0;
    return STATUS_OK;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out, status *st)
{
    int rc;
    const gguf_kv *kv = find_scalar(f, key, st, &rc);
    if (!kv) return rc;
    if (kv->type != GGUF_VTYPE_STRING)
        return status_fail(st, STATUS_FORMAT, "%s: offset %llu: key '%s' has type %s, expected str",
                           f->path, (unsigned long long)kv->file_offset, key,
                           gguf_vtype_name(kv->type));
    *out = kv->strs[0];
    return STATUS_OK;
}

/* Element type and pointer of element i of a scalar or array value. */
static int kv_elem(const gguf_kv *kv, uint64_t i, gguf_vtype *t, const uint8_t **p)
{
    *t = kv->type == GGUF_VTYPE_ARRAY ? kv->arr_type : kv->type;
    if (i >= kv->n) return STATUS_RANGE;
    size_t esz = gguf_vtype_size(*t);
    if (esz == 0) return STATUS_FORMAT;
    *p = kv->data + i * esz;
    return STATUS_OK;
}

int gguf_kv_get_int(const gguf_kv *kv, uint64_t i, int64_t *out)
{
    gguf_vtype t;
    const uint8_t *p = NULL;
    int rc = kv_elem(kv, i, &t, &p);
    if (rc) return rc;
    int64_t s;
    uint64_t u;
    bool neg;
    if (!(vtype_is_int(t) || t == GGUF_VTYPE_BOOL) || !read_int(t, p, &s, &u, &neg))
        return STATUS_FORMAT;
    if (!neg && u > (uint64_t)INT64_MAX) return STATUS_RANGE;
    *out = s;
    return STATUS_OK;
}

int gguf_kv_get_float(const gguf_kv *kv, uint64_t i, double *out)
{
    gguf_vtype t;
    const uint8_t *p = NULL;
    int rc = kv_elem(kv, i, &t, &p);
    if (rc) return rc;
    if (t == GGUF_VTYPE_FLOAT32) {
        float v;
        memcpy(&v, p, 4);
        *out = v;
        return STATUS_OK;
    }
    if (t == GGUF_VTYPE_FLOAT64) {
        memcpy(out, p, 8);
        return STATUS_OK;
    }
    return STATUS_FORMAT;
}
