/* Streaming GGUF v3 writer. KVs are serialised as they are set (so the caller's buffers may go
 * away), tensors are declared, then begin_data writes the header and the tensor infos and
 * tensor bytes follow in declaration order (write_data) or at their offsets from any thread
 * (pwrite). Only the header is ever held in memory. */
#include "gguf/gguf_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/quant.h"

#define GGUF_WRITER_MAX_NAME 63        /* llama.cpp: GGML_MAX_NAME 64 with the NUL */
#define GGUF_WRITER_BUF_BYTES (1u << 20) /* write_data coalescing buffer */

/* A growable byte buffer. */
typedef struct bytes {
    uint8_t *p; /* owned, [cap] */
    size_t n, cap;
} bytes;

typedef struct wkv {
    char *key;   /* owned */
    bytes rec;   /* owned: the whole serialised KV record (key, type, value) */
} wkv;

typedef struct wtensor {
    char *name; /* owned */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint32_t type;
    uint64_t n_bytes;
    uint64_t rel_off; /* relative to the data section, set by begin_data */
} wtensor;

struct gguf_writer {
    char *path; /* owned */
    int fd;     /* -1 once closed */
    wkv *kv;    /* owned, [n_kv] of cap_kv */
    size_t n_kv, cap_kv;
    wtensor *t; /* owned, [n_t] of cap_t */
    size_t n_t, cap_t;
    uint32_t alignment;
    status err; /* first error of a setter / add_tensor (sticky) */
    bool began, finished;
    uint64_t data_offset; /* absolute start of the data section */
    uint64_t end_offset;  /* absolute final file size (padded) */
    uint64_t total_bytes; /* sum of tensor n_bytes */
    /* write_data state */
    size_t cur;           /* tensor being streamed */
    uint64_t cur_written; /* bytes of it written */
    uint64_t out_pos;     /* absolute file offset of out.p[0] */
    bytes out;            /* owned coalescing buffer */
    bool streamed;
    _Atomic uint64_t pwritten; /* bytes written by gguf_writer_pwrite */
};

/* ---------------------------------------------------------------------------------------- */
/* buffers and errors */

static bool bytes_reserve(bytes *b, size_t extra)
{
    if (extra <= b->cap - b->n) return true;
    size_t need;
    if (__builtin_add_overflow(b->n, extra, &need)) return false;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (__builtin_mul_overflow(cap, 2, &cap)) return false;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

static bool bytes_put(bytes *b, const void *data, size_t n)
{
    if (!bytes_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->n, data, n);
    b->n += n;
    return true;
}

static bool bytes_u32(bytes *b, uint32_t v) { return bytes_put(b, &v, 4); }
static bool bytes_u64(bytes *b, uint64_t v) { return bytes_put(b, &v, 8); }

static bool bytes_str(bytes *b, const char *s, size_t n)
{
    return bytes_u64(b, n) && bytes_put(b, s, n);
}

static int werr(gguf_writer *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records the first error (later ones are consequences) and returns code. */
static int werr(gguf_writer *w, int code, const char *fmt, ...)
{
    if (w->err.code == STATUS_OK) {
        char m[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m, sizeof m, fmt, ap);
        va_end(ap);
        status_fail(&w->err, (status_code)code, "%s: %s", w->path, m);
    }
    return code;
}

/* Writes all of [data, +n) at the file offset; EINTR and short writes retried. */
static int write_all_at(int fd, const void *data, uint64_t n, uint64_t off, const char *path,
                        status *st)
{
    const uint8_t *p = data;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t k = pwrite(fd, p, chunk, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return status_fail(st, STATUS_IO, "%s: write at offset %llu: %s", path,
                               (unsigned long long)off, k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (uint64_t)k;
        off += (uint64_t)k;
    }
    return STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* create / destroy */

int gguf_writer_create(gguf_writer **out, const char *path, status *st)
{
    *out = NULL;
    gguf_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return status_fail(st, STATUS_NOMEM, "%s: no memory for the writer", path);
    }
    w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(w->path);
        free(w);
        return status_fail(st, STATUS_IO, "%s: create: %s", path, strerror(e));
    }
    w->alignment = GGUF_DEFAULT_ALIGNMENT;
    atomic_init(&w->pwritten, 0);
    *out = w;
    return STATUS_OK;
}

void gguf_writer_destroy(gguf_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kv[i].key);
        free(w->kv[i].rec.p);
    }
    free(w->kv);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w->out.p);
    free(w->path);
    free(w);
}

/* ---------------------------------------------------------------------------------------- */
/* KVs */

/* Starts a KV record for key (replacing an earlier one). On success *rec is an empty record
 * owned by the writer holding the key, to which the caller appends type and value. */
static int kv_begin(gguf_writer *w, const char *key, bytes **rec)
{
    if (w->began) return werr(w, STATUS_INVALID, "key '%s' set after begin_data", key);
    size_t len = key ? strlen(key) : 0;
    if (len == 0 || len > 65535) return werr(w, STATUS_INVALID, "bad key (empty or too long)");
    wkv *kv = NULL;
    for (size_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kv[i].key, key)) kv = &w->kv[i];
    if (!kv) {
        if (w->n_kv == w->cap_kv) {
            size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
            wkv *p = realloc(w->kv, cap * sizeof *p);
            if (!p) return werr(w, STATUS_NOMEM, "key '%s': no memory", key);
            w->kv = p;
            w->cap_kv = cap;
        }
        kv = &w->kv[w->n_kv];
        memset(kv, 0, sizeof *kv);
        if (!(kv->key = strdup(key))) return werr(w, STATUS_NOMEM, "key '%s': no memory", key);
        w->n_kv++;
    }
    kv->rec.n = 0;
    if (!bytes_str(&kv->rec, key, len)) return werr(w, STATUS_NOMEM, "key '%s': no memory", key);
    *rec = &kv->rec;
    return STATUS_OK;
}

/* general.alignment sets the writer's alignment; it must be a u32 power of two. */
static int check_alignment(gguf_writer *w, const char *key, gguf_vtype type, const void *value)
{
    if (strcmp(key, "general.alignment") != 0) return STATUS_OK;
    uint32_t a;
    if (type != GGUF_VTYPE_UINT32)
        return werr(w, STATUS_INVALID, "general.alignment must be u32, not %s",
                    gguf_vtype_name(type));
    memcpy(&a, value, 4);
    if (a == 0 || (a & (a - 1)) != 0)
        return werr(w, STATUS_INVALID, "general.alignment %u is not a power of two", a);
    w->alignment = a;
    return STATUS_OK;
}

int gguf_writer_set_val(gguf_writer *w, const char *key, gguf_vtype type, const void *value)
{
    size_t sz = gguf_vtype_size(type);
    if (sz == 0)
        return werr(w, STATUS_INVALID, "key '%s': set_val needs a scalar type, not %s",
                    key ? key : "", gguf_vtype_name(type));
    bytes *rec;
    int rc = kv_begin(w, key, &rec);
    if (rc) return rc;
    if ((rc = check_alignment(w, key, type, value))) return rc;
    if (!bytes_u32(rec, (uint32_t)type) || !bytes_put(rec, value, sz))
        return werr(w, STATUS_NOMEM, "key '%s': no memory", key);
    return STATUS_OK;
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    return gguf_writer_set_val(w, key, GGUF_VTYPE_UINT32, &v);
}

int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    return gguf_writer_set_val(w, key, GGUF_VTYPE_INT32, &v);
}

int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v)
{
    return gguf_writer_set_val(w, key, GGUF_VTYPE_UINT64, &v);
}

int gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    return gguf_writer_set_val(w, key, GGUF_VTYPE_FLOAT32, &v);
}

int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    uint8_t b = v ? 1 : 0;
    return gguf_writer_set_val(w, key, GGUF_VTYPE_BOOL, &b);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    bytes *rec;
    if (!v) return werr(w, STATUS_INVALID, "key '%s': NULL string", key ? key : "");
    int rc = kv_begin(w, key, &rec);
    if (rc) return rc;
    if ((rc = check_alignment(w, key, GGUF_VTYPE_STRING, NULL))) return rc;
    if (!bytes_u32(rec, GGUF_VTYPE_STRING) || !bytes_str(rec, v, strlen(v)))
        return werr(w, STATUS_NOMEM, "key '%s': no memory", key);
    return STATUS_OK;
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data,
                        uint64_t n)
{
    size_t sz = gguf_vtype_size(elem_type);
    uint64_t nb;
    if (sz == 0)
        return werr(w, STATUS_INVALID, "key '%s': array element type %s is not a scalar type",
                    key ? key : "", gguf_vtype_name(elem_type));
    if (__builtin_mul_overflow(n, sz, &nb) || nb > SIZE_MAX || (n && !data))
        return werr(w, STATUS_INVALID, "key '%s': bad array (%llu elements)", key ? key : "",
                    (unsigned long long)n);
    bytes *rec;
    int rc = kv_begin(w, key, &rec);
    if (rc) return rc;
    if ((rc = check_alignment(w, key, GGUF_VTYPE_ARRAY, NULL))) return rc;
    if (!bytes_u32(rec, GGUF_VTYPE_ARRAY) || !bytes_u32(rec, (uint32_t)elem_type) ||
        !bytes_u64(rec, n) || !bytes_put(rec, data, (size_t)nb))
        return werr(w, STATUS_NOMEM, "key '%s': no memory", key);
    return STATUS_OK;
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                            uint64_t n)
{
    bytes *rec;
    if (n && !strs) return werr(w, STATUS_INVALID, "key '%s': NULL string array", key ? key : "");
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i])
            return werr(w, STATUS_INVALID, "key '%s': string %llu is NULL", key ? key : "",
                        (unsigned long long)i);
    int rc = kv_begin(w, key, &rec);
    if (rc) return rc;
    if ((rc = check_alignment(w, key, GGUF_VTYPE_ARRAY, NULL))) return rc;
    if (!bytes_u32(rec, GGUF_VTYPE_ARRAY) || !bytes_u32(rec, GGUF_VTYPE_STRING) ||
        !bytes_u64(rec, n))
        return werr(w, STATUS_NOMEM, "key '%s': no memory", key);
    for (uint64_t i = 0; i < n; i++)
        if (!bytes_str(rec, strs[i], strlen(strs[i])))
            return werr(w, STATUS_NOMEM, "key '%s': no memory", key);
    return STATUS_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* tensors */

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t n_dims,
                           const uint64_t *ne, uint32_t type)
{
    size_t len = name ? strlen(name) : 0;
    const char *nm = name ? name : "";
    if (w->began) return werr(w, STATUS_INVALID, "tensor '%s' added after begin_data", nm), -1;
    if (len == 0 || len > GGUF_WRITER_MAX_NAME)
        return werr(w, STATUS_INVALID, "tensor name '%s' is empty or longer than %d bytes", nm,
                    GGUF_WRITER_MAX_NAME), -1;
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return werr(w, STATUS_INVALID, "tensor '%s': n_dims %u not in 1..4", nm, n_dims), -1;
    const quant_traits *qt = quant_get(type);
    if (!qt || qt->block_size == 0)
        return werr(w, STATUS_INVALID, "tensor '%s': unknown ggml type %u", nm, type), -1;

    wtensor t = {.n_dims = n_dims, .type = type};
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] == 0 || t.ne[d] > (uint64_t)INT64_MAX ||
            __builtin_mul_overflow(n_el, t.ne[d], &n_el) || n_el > (uint64_t)INT64_MAX)
            return werr(w, STATUS_INVALID, "tensor '%s': bad ne[%u] = %llu", nm, d,
                        (unsigned long long)t.ne[d]), -1;
    }
    uint64_t row;
    if (__builtin_mul_overflow(t.ne[0] / qt->block_size, (uint64_t)qt->type_size, &row))
        return werr(w, STATUS_INVALID, "tensor '%s': row size overflows", nm), -1;
    if (t.ne[0] % qt->block_size != 0)
        return werr(w, STATUS_INVALID, "tensor '%s': ne[0] = %llu is not a multiple of %s's "
                    "block size %u", nm, (unsigned long long)t.ne[0], qt->name, qt->block_size), -1;
    if (__builtin_mul_overflow(row, n_el / t.ne[0], &t.n_bytes))
        return werr(w, STATUS_INVALID, "tensor '%s': byte size overflows", nm), -1;

    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *p = realloc(w->t, cap * sizeof *p);
        if (!p) return werr(w, STATUS_NOMEM, "tensor '%s': no memory", nm), -1;
        w->t = p;
        w->cap_t = cap;
    }
    if (w->n_t >= (size_t)INT32_MAX) return werr(w, STATUS_INVALID, "too many tensors"), -1;
    if (!(t.name = strdup(name))) return werr(w, STATUS_NOMEM, "tensor '%s': no memory", nm), -1;
    w->t[w->n_t] = t;
    return (int)w->n_t++;
}

static int name_ptr_cmp(const void *a, const void *b)
{
    return strcmp((*(const wtensor *const *)a)->name, (*(const wtensor *const *)b)->name);
}

/* Rejects duplicate tensor names. */
static int check_unique_names(gguf_writer *w, status *st)
{
    if (w->n_t < 2) return STATUS_OK;
    const wtensor **s = malloc(w->n_t * sizeof *s);
    if (!s) return status_fail(st, STATUS_NOMEM, "%s: no memory", w->path);
    for (size_t i = 0; i < w->n_t; i++) s[i] = &w->t[i];
    qsort(s, w->n_t, sizeof *s, name_ptr_cmp);
    int rc = STATUS_OK;
    for (size_t i = 1; i < w->n_t && !rc; i++)
        if (!strcmp(s[i - 1]->name, s[i]->name))
            rc = status_fail(st, STATUS_INVALID, "%s: duplicate tensor name '%s'", w->path,
                             s[i]->name);
    free(s);
    return rc;
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

int gguf_writer_begin_data(gguf_writer *w, status *st)
{
    if (w->err.code != STATUS_OK) {
        if (st) *st = w->err;
        return w->err.code;
    }
    if (w->began) return status_fail(st, STATUS_INVALID, "%s: begin_data called twice", w->path);
    int rc = check_unique_names(w, st);
    if (rc) return rc;

    bytes h = {0};
    bool ok = bytes_put(&h, "GGUF", 4) && bytes_u32(&h, 3) && bytes_u64(&h, w->n_t) &&
              bytes_u64(&h, w->n_kv);
    for (size_t i = 0; ok && i < w->n_kv; i++) ok = bytes_put(&h, w->kv[i].rec.p, w->kv[i].rec.n);
    uint64_t rel = 0;
    for (size_t i = 0; ok && i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->rel_off = rel;
        ok = bytes_str(&h, t->name, strlen(t->name)) && bytes_u32(&h, t->n_dims);
        for (uint32_t d = 0; ok && d < t->n_dims; d++) ok = bytes_u64(&h, t->ne[d]);
        ok = ok && bytes_u32(&h, t->type) && bytes_u64(&h, t->rel_off);
        if (__builtin_add_overflow(rel, t->n_bytes, &rel) || rel > UINT64_MAX - w->alignment) {
            free(h.p);
            return status_fail(st, STATUS_INVALID, "%s: total tensor bytes overflow", w->path);
        }
        w->total_bytes += t->n_bytes;
        rel = align_up(rel, w->alignment);
    }
    if (!ok) {
        free(h.p);
        return status_fail(st, STATUS_NOMEM, "%s: no memory for the header", w->path);
    }
    w->data_offset = align_up(h.n, w->alignment);
    w->end_offset = w->data_offset + rel;
    size_t pad = (size_t)(w->data_offset - h.n);
    ok = bytes_reserve(&h, pad);
    if (ok) {
        memset(h.p + h.n, 0, pad);
        h.n += pad;
    }
    rc = ok ? write_all_at(w->fd, h.p, h.n, 0, w->path, st)
            : status_fail(st, STATUS_NOMEM, "%s: no memory for the header", w->path);
    free(h.p);
    if (rc) return rc;
    w->began = true;
    w->out_pos = w->data_offset;
    return STATUS_OK;
}

uint64_t gguf_writer_tensor_offset(const gguf_writer *w, int index)
{
    DS_ASSERT(w->began && index >= 0 && (size_t)index < w->n_t);
    return w->data_offset + w->t[index].rel_off;
}

uint64_t gguf_writer_tensor_bytes(const gguf_writer *w, int index)
{
    DS_ASSERT(index >= 0 && (size_t)index < w->n_t);
    return w->t[index].n_bytes;
}

/* ---------------------------------------------------------------------------------------- */
/* data */

static int out_flush(gguf_writer *w, status *st)
{
    if (w->out.n == 0) return STATUS_OK;
    int rc = write_all_at(w->fd, w->out.p, w->out.n, w->out_pos, w->path, st);
    w->out_pos += w->out.n;
    w->out.n = 0;
    return rc;
}

/* Appends to the sequential stream: through the buffer when small, directly when large. */
static int out_put(gguf_writer *w, const void *data, uint64_t n, status *st)
{
    if (!w->out.p && !bytes_reserve(&w->out, GGUF_WRITER_BUF_BYTES))
        return status_fail(st, STATUS_NOMEM, "%s: no memory for the write buffer", w->path);
    if (n <= w->out.cap - w->out.n) {
        memcpy(w->out.p + w->out.n, data, (size_t)n);
        w->out.n += (size_t)n;
        return STATUS_OK;
    }
    int rc = out_flush(w, st);
    if (rc) return rc;
    if (n < w->out.cap) return out_put(w, data, n, st);
    rc = write_all_at(w->fd, data, n, w->out_pos, w->path, st);
    w->out_pos += n;
    return rc;
}

int gguf_writer_write_data(gguf_writer *w, const void *data, uint64_t n, status *st)
{
    static const uint8_t zeros[256];
    const uint8_t *p = data;
    if (!w->began || w->finished)
        return status_fail(st, STATUS_INVALID, "%s: write_data outside begin_data..finish",
                           w->path);
    w->streamed = true;
    while (n > 0) {
        if (w->cur >= w->n_t)
            return status_fail(st, STATUS_INVALID, "%s: %llu bytes written past the last tensor",
                               w->path, (unsigned long long)n);
        wtensor *t = &w->t[w->cur];
        uint64_t take = t->n_bytes - w->cur_written;
        if (take > n) take = n;
        int rc = out_put(w, p, take, st);
        if (rc) return rc;
        p += take;
        n -= take;
        w->cur_written += take;
        if (w->cur_written == t->n_bytes) { /* pad up to the next tensor */
            uint64_t next = w->cur + 1 < w->n_t ? w->t[w->cur + 1].rel_off : t->rel_off + t->n_bytes;
            uint64_t pad = next - (t->rel_off + t->n_bytes);
            DS_ASSERT(pad < w->alignment);
            while (pad > 0) {
                uint64_t k = pad < sizeof zeros ? pad : sizeof zeros;
                if ((rc = out_put(w, zeros, k, st))) return rc;
                pad -= k;
            }
            w->cur++;
            w->cur_written = 0;
        }
    }
    return STATUS_OK;
}

int gguf_writer_pwrite(gguf_writer *w, const void *data, uint64_t n, uint64_t file_offset,
                       status *st)
{
    if (!w->began || w->finished)
        return status_fail(st, STATUS_INVALID, "%s: pwrite outside begin_data..finish", w->path);
    /* the tensor whose data starts at or before file_offset (binary search, offsets ascend) */
    size_t lo = 0, hi = w->n_t;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (w->data_offset + w->t[mid].rel_off <= file_offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t end;
    if (lo == 0 || __builtin_add_overflow(file_offset, n, &end) ||
        end > w->data_offset + w->t[lo - 1].rel_off + w->t[lo - 1].n_bytes)
        return status_fail(st, STATUS_INVALID,
                           "%s: pwrite [%llu, +%llu) does not lie inside one tensor's data",
                           w->path, (unsigned long long)file_offset, (unsigned long long)n);
    int rc = write_all_at(w->fd, data, n, file_offset, w->path, st);
    if (rc == STATUS_OK) atomic_fetch_add(&w->pwritten, n);
    return rc;
}

int gguf_writer_finish(gguf_writer *w, status *st)
{
    if (!w->began || w->finished)
        return status_fail(st, STATUS_INVALID, "%s: finish without begin_data, or twice", w->path);
    int rc = out_flush(w, st);
    if (rc) return rc;
    uint64_t pw = atomic_load(&w->pwritten);
    if (w->streamed && pw)
        return status_fail(st, STATUS_INVALID, "%s: write_data and pwrite mixed", w->path);
    if (w->streamed && w->cur < w->n_t)
        return status_fail(st, STATUS_INVALID, "%s: tensor '%s': %llu of %llu bytes written",
                           w->path, w->t[w->cur].name, (unsigned long long)w->cur_written,
                           (unsigned long long)w->t[w->cur].n_bytes);
    if (!w->streamed && pw != w->total_bytes)
        return status_fail(st, STATUS_INVALID, "%s: pwrite wrote %llu of %llu tensor bytes",
                           w->path, (unsigned long long)pw, (unsigned long long)w->total_bytes);
    if (ftruncate(w->fd, (off_t)w->end_offset) != 0)
        return status_fail(st, STATUS_IO, "%s: ftruncate: %s", w->path, strerror(errno));
    w->finished = true;
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) return status_fail(st, STATUS_IO, "%s: close: %s", w->path, strerror(errno));
    return STATUS_OK;
}
