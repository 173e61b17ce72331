/* Writer -> reader round trip: every KV type (scalars, arrays of every scalar type, strings,
 * string arrays, empty arrays), tensors of F32/F16/BF16/Q8_0/Q4_K/Q5_K/Q6_K of 1-4 dims,
 * streamed in odd-sized chunks or pwritten from threads, default and explicit alignment;
 * typed getters; the writer's error paths. */
#include <CUnit/Basic.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf/quant.h"
#include "tests/gguf/gguf_craft.h"
#include "tests/testutil/testutil.h"

typedef struct test_tensor {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[4];
} test_tensor;

static const test_tensor k_tensors[] = {
    {"a.f32", GGML_TYPE_F32, 2, {7, 3}},
    {"b.f16", GGML_TYPE_F16, 1, {5}},
    {"c.bf16", GGML_TYPE_BF16, 3, {3, 2, 2}},
    {"d.q8_0", GGML_TYPE_Q8_0, 2, {64, 3}},
    {"e.q4_K", GGML_TYPE_Q4_K, 2, {256, 2}},
    {"f.q5_K", GGML_TYPE_Q5_K, 4, {512, 1, 2, 1}},
    {"g.q6_K", GGML_TYPE_Q6_K, 1, {256}},
    {"h.f32.last", GGML_TYPE_F32, 1, {1}},
};
#define N_TENSORS (sizeof k_tensors / sizeof k_tensors[0])

static uint64_t tensor_bytes(const test_tensor *t)
{
    uint64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->ne[d];
    return quant_row_bytes(t->type, t->ne[0]) * rows;
}

static uint8_t pattern(size_t tensor, uint64_t i)
{
    return (uint8_t)(i * 131u + tensor * 7u + 1u);
}

static uint8_t *tensor_data(size_t k)
{
    uint64_t n = tensor_bytes(&k_tensors[k]);
    uint8_t *p = malloc(n);
    DS_ASSERT(p);
    for (uint64_t i = 0; i < n; i++) p[i] = pattern(k, i);
    return p;
}

/* Scalar values of every type */
static const uint8_t v_u8 = 200;
static const int8_t v_i8 = -100;
static const uint16_t v_u16 = 60000;
static const int16_t v_i16 = -30000;
static const uint32_t v_u32 = 4000000000u;
static const int32_t v_i32 = -2000000000;
static const float v_f32 = 3.25f;
static const uint64_t v_u64 = (1ull << 63) + 5;
static const int64_t v_i64 = -(1ll << 62);
static const double v_f64 = 1e300;
static const char *const v_str = "h\xc3\xa9llo\nworld";

static const uint8_t a_u8[] = {0, 1, 255};
static const int8_t a_i8[] = {-128, 0, 127};
static const uint16_t a_u16[] = {1, 65535};
static const int16_t a_i16[] = {-32768, 5, 32767};
static const uint32_t a_u32[] = {0, 4294967295u, 7, 9};
static const int32_t a_i32[] = {3, 3, 2, 0};
static const float a_f32[] = {1.5f, -0.0f, 1e-6f};
static const uint8_t a_bool[] = {1, 0, 1, 1};
static const uint64_t a_u64[] = {UINT64_MAX, 0};
static const int64_t a_i64[] = {INT64_MIN, INT64_MAX, -1};
static const double a_f64[] = {3.141592653589793, -2.5e-300};
static const char *const a_str[] = {"a", "", "\xc3\xbcn\xc3\xaf", "<|im_end|>"};

typedef struct arr_case {
    const char *key;
    gguf_vtype type;
    const void *data;
    uint64_t n;
} arr_case;

static const arr_case k_arrs[] = {
    {"t.arr.u8", GGUF_VTYPE_UINT8, a_u8, 3},     {"t.arr.i8", GGUF_VTYPE_INT8, a_i8, 3},
    {"t.arr.u16", GGUF_VTYPE_UINT16, a_u16, 2},  {"t.arr.i16", GGUF_VTYPE_INT16, a_i16, 3},
    {"t.arr.u32", GGUF_VTYPE_UINT32, a_u32, 4},  {"t.arr.i32", GGUF_VTYPE_INT32, a_i32, 4},
    {"t.arr.f32", GGUF_VTYPE_FLOAT32, a_f32, 3}, {"t.arr.bool", GGUF_VTYPE_BOOL, a_bool, 4},
    {"t.arr.u64", GGUF_VTYPE_UINT64, a_u64, 2},  {"t.arr.i64", GGUF_VTYPE_INT64, a_i64, 3},
    {"t.arr.f64", GGUF_VTYPE_FLOAT64, a_f64, 2}, {"t.arr.empty", GGUF_VTYPE_UINT32, a_u32, 0},
};
#define N_ARRS (sizeof k_arrs / sizeof k_arrs[0])

enum { MODE_STREAM, MODE_PWRITE };

typedef struct pw_job {
    gguf_writer *w;
    int thread, n_threads;
    int rc;
    status st;
} pw_job;

/* Thread body: pwrites every n_threads-th tensor, in two pieces, back half first. */
static void *pw_thread(void *arg)
{
    pw_job *j = arg;
    for (size_t k = (size_t)j->thread; k < N_TENSORS && !j->rc; k += (size_t)j->n_threads) {
        uint8_t *d = tensor_data(k);
        uint64_t n = tensor_bytes(&k_tensors[k]), half = n / 2;
        uint64_t off = gguf_writer_tensor_offset(j->w, (int)k);
        j->rc = gguf_writer_pwrite(j->w, d + half, n - half, off + half, &j->st);
        if (!j->rc && half) j->rc = gguf_writer_pwrite(j->w, d, half, off, &j->st);
        free(d);
    }
    return NULL;
}

static void set_all_kvs(gguf_writer *w)
{
    CU_ASSERT_EQUAL(gguf_writer_set_val(w, "t.u8", GGUF_VTYPE_UINT8, &v_u8), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_val(w, "t.i8", GGUF_VTYPE_INT8, &v_i8), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_val(w, "t.u16", GGUF_VTYPE_UINT16, &v_u16), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_val(w, "t.i16", GGUF_VTYPE_INT16, &v_i16), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_u32(w, "t.u32", v_u32), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_i32(w, "t.i32", v_i32), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_f32(w, "t.f32", v_f32), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_bool(w, "t.bool", true), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_str(w, "t.str", v_str), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_str(w, "t.str.empty", ""), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_u64(w, "t.u64", v_u64), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_val(w, "t.i64", GGUF_VTYPE_INT64, &v_i64), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_val(w, "t.f64", GGUF_VTYPE_FLOAT64, &v_f64), STATUS_OK);
    for (size_t i = 0; i < N_ARRS; i++)
        CU_ASSERT_EQUAL(gguf_writer_set_arr(w, k_arrs[i].key, k_arrs[i].type, k_arrs[i].data,
                                            k_arrs[i].n), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_arr_str(w, "t.arr.str", a_str, 4), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_arr_str(w, "t.arr.str.empty", a_str, 0), STATUS_OK);
    /* set twice: the second value (another type) replaces the first */
    CU_ASSERT_EQUAL(gguf_writer_set_u32(w, "t.replaced", 1), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_str(w, "t.replaced", "second"), STATUS_OK);
}
#define N_KVS_WRITTEN (13 + N_ARRS + 3)

/* Writes the test file; alignment 0 = default (key not written). */
static void write_file(const char *path, uint32_t alignment, int mode)
{
    gguf_writer *w;
    status st;
    CU_ASSERT_FATAL(gguf_writer_create(&w, path, &st) == STATUS_OK);
    set_all_kvs(w);
    if (alignment) CU_ASSERT_EQUAL(gguf_writer_set_u32(w, "general.alignment", alignment), 0);
    for (size_t k = 0; k < N_TENSORS; k++)
        CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, k_tensors[k].name, k_tensors[k].n_dims,
                                               k_tensors[k].ne, k_tensors[k].type), (int)k);
    CU_ASSERT_FATAL(gguf_writer_begin_data(w, &st) == STATUS_OK);
    for (size_t k = 0; k < N_TENSORS; k++)
        CU_ASSERT_EQUAL(gguf_writer_tensor_bytes(w, (int)k), tensor_bytes(&k_tensors[k]));

    if (mode == MODE_STREAM) {
        /* all tensors as one byte stream cut into odd chunks that straddle tensors */
        size_t total = 0;
        for (size_t k = 0; k < N_TENSORS; k++) total += tensor_bytes(&k_tensors[k]);
        uint8_t *all = malloc(total), *p = all;
        for (size_t k = 0; k < N_TENSORS; k++) {
            uint8_t *d = tensor_data(k);
            memcpy(p, d, tensor_bytes(&k_tensors[k]));
            p += tensor_bytes(&k_tensors[k]);
            free(d);
        }
        size_t done = 0, step = 1;
        while (done < total) {
            size_t n = total - done < step ? total - done : step;
            CU_ASSERT_EQUAL_FATAL(gguf_writer_write_data(w, all + done, n, &st), STATUS_OK);
            done += n;
            step = step * 3 + 1;
        }
        free(all);
    } else {
        enum { N_THREADS = 3 };
        pthread_t th[N_THREADS];
        pw_job jobs[N_THREADS];
        for (int i = 0; i < N_THREADS; i++) {
            jobs[i] = (pw_job){.w = w, .thread = i, .n_threads = N_THREADS};
            CU_ASSERT_FATAL(pthread_create(&th[i], NULL, pw_thread, &jobs[i]) == 0);
        }
        for (int i = 0; i < N_THREADS; i++) {
            pthread_join(th[i], NULL);
            CU_ASSERT_EQUAL(jobs[i].rc, STATUS_OK);
        }
    }
    int rc = gguf_writer_finish(w, &st);
    if (rc) fprintf(stderr, "finish: %s\n", st.msg);
    CU_ASSERT_EQUAL(rc, STATUS_OK);
    gguf_writer_destroy(w);
}

static void check_kv_bytes(const gguf_file *f, const char *key, gguf_vtype type, const void *v)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
    CU_ASSERT_EQUAL(kv->type, type);
    CU_ASSERT_EQUAL(kv->n, 1);
    CU_ASSERT_EQUAL(memcmp(kv->data, v, gguf_vtype_size(type)), 0);
}

static void check_file(const char *path, uint32_t alignment)
{
    gguf_file *f;
    status st;
    int rc = gguf_open(&f, path, &st);
    if (rc) fprintf(stderr, "open: %s\n", st.msg);
    CU_ASSERT_FATAL(rc == STATUS_OK);
    CU_ASSERT_EQUAL(f->version, 3);
    CU_ASSERT_EQUAL(f->n_kv, N_KVS_WRITTEN + (alignment ? 1 : 0));
    CU_ASSERT_EQUAL(f->alignment, alignment ? alignment : GGUF_DEFAULT_ALIGNMENT);
    CU_ASSERT_EQUAL(f->data_offset % f->alignment, 0);
    CU_ASSERT_EQUAL(f->size % f->alignment, 0);

    check_kv_bytes(f, "t.u8", GGUF_VTYPE_UINT8, &v_u8);
    check_kv_bytes(f, "t.i8", GGUF_VTYPE_INT8, &v_i8);
    check_kv_bytes(f, "t.u16", GGUF_VTYPE_UINT16, &v_u16);
    check_kv_bytes(f, "t.i16", GGUF_VTYPE_INT16, &v_i16);
    check_kv_bytes(f, "t.u32", GGUF_VTYPE_UINT32, &v_u32);
    check_kv_bytes(f, "t.i32", GGUF_VTYPE_INT32, &v_i32);
    check_kv_bytes(f, "t.f32", GGUF_VTYPE_FLOAT32, &v_f32);
    check_kv_bytes(f, "t.u64", GGUF_VTYPE_UINT64, &v_u64);
    check_kv_bytes(f, "t.i64", GGUF_VTYPE_INT64, &v_i64);
    check_kv_bytes(f, "t.f64", GGUF_VTYPE_FLOAT64, &v_f64);
    uint8_t one = 1;
    check_kv_bytes(f, "t.bool", GGUF_VTYPE_BOOL, &one);

    gguf_str s;
    CU_ASSERT_EQUAL(gguf_get_str(f, "t.str", &s, &st), STATUS_OK);
    CU_ASSERT_TRUE(gguf_str_eq(s, v_str));
    CU_ASSERT_EQUAL(gguf_get_str(f, "t.str.empty", &s, &st), STATUS_OK);
    CU_ASSERT_EQUAL(s.len, 0);
    CU_ASSERT_EQUAL(gguf_get_str(f, "t.replaced", &s, &st), STATUS_OK);
    CU_ASSERT_TRUE(gguf_str_eq(s, "second"));

    for (size_t i = 0; i < N_ARRS; i++) {
        const gguf_kv *kv = gguf_find_kv(f, k_arrs[i].key);
        CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
        CU_ASSERT_EQUAL(kv->type, GGUF_VTYPE_ARRAY);
        CU_ASSERT_EQUAL(kv->arr_type, k_arrs[i].type);
        CU_ASSERT_EQUAL(kv->n, k_arrs[i].n);
        CU_ASSERT_EQUAL(memcmp(kv->data, k_arrs[i].data,
                               (size_t)k_arrs[i].n * gguf_vtype_size(k_arrs[i].type)), 0);
    }
    const gguf_kv *kv = gguf_find_kv(f, "t.arr.str");
    CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
    CU_ASSERT_EQUAL(kv->arr_type, GGUF_VTYPE_STRING);
    CU_ASSERT_EQUAL_FATAL(kv->n, 4);
    for (int i = 0; i < 4; i++) CU_ASSERT_TRUE(gguf_str_eq(kv->strs[i], a_str[i]));
    kv = gguf_find_kv(f, "t.arr.str.empty");
    CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
    CU_ASSERT_EQUAL(kv->n, 0);

    for (size_t k = 0; k < N_TENSORS; k++) {
        const test_tensor *e = &k_tensors[k];
        const gguf_tensor *t = gguf_find_tensor(f, e->name);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        CU_ASSERT_PTR_EQUAL(t, &f->tensors[k]); /* file order = declaration order */
        CU_ASSERT_EQUAL(t->type, e->type);
        CU_ASSERT_EQUAL(t->n_dims, e->n_dims);
        for (uint32_t d = 0; d < 4; d++) CU_ASSERT_EQUAL(t->ne[d], d < e->n_dims ? e->ne[d] : 1);
        CU_ASSERT_EQUAL(t->n_bytes, tensor_bytes(e));
        CU_ASSERT_EQUAL(t->offset % f->alignment, 0);
        CU_ASSERT_EQUAL(((const uint8_t *)t->data - f->map) % f->alignment, 0);
        uint8_t *d = tensor_data(k);
        CU_ASSERT_EQUAL(memcmp(t->data, d, t->n_bytes), 0);
        free(d);
    }
    CU_ASSERT_PTR_NULL(gguf_find_tensor(f, "a.f3"));
    CU_ASSERT_PTR_NULL(gguf_find_tensor(f, "zzz"));
    CU_ASSERT_PTR_NULL(gguf_find_kv(f, "t.u"));
    gguf_close(f);
}

static void roundtrip(uint32_t alignment, int mode)
{
    char path[512];
    gguf_craft_tmp_path(path, sizeof path, ".gguf");
    write_file(path, alignment, mode);
    check_file(path, alignment);
    unlink(path);
}

static void test_roundtrip_stream_default_alignment(void) { roundtrip(0, MODE_STREAM); }
static void test_roundtrip_stream_alignment_64(void) { roundtrip(64, MODE_STREAM); }
static void test_roundtrip_pwrite_threads(void) { roundtrip(0, MODE_PWRITE); }
static void test_roundtrip_pwrite_alignment_128(void) { roundtrip(128, MODE_PWRITE); }

/* The two data paths lay the file out identically, byte for byte. */
static void test_stream_and_pwrite_identical(void)
{
    char a[512], b[512];
    size_t na, nb;
    gguf_craft_tmp_path(a, sizeof a, ".gguf");
    gguf_craft_tmp_path(b, sizeof b, ".gguf");
    write_file(a, 0, MODE_STREAM);
    write_file(b, 0, MODE_PWRITE);
    uint8_t *pa = (uint8_t *)testutil_read_file(a, &na);
    uint8_t *pb = (uint8_t *)testutil_read_file(b, &nb);
    CU_ASSERT_FATAL(pa && pb);
    CU_ASSERT_EQUAL(na, nb);
    CU_ASSERT_EQUAL(memcmp(pa, pb, na < nb ? na : nb), 0);
    free(pa);
    free(pb);
    unlink(a);
    unlink(b);
}

static void test_getters(void)
{
    char path[512];
    gguf_file *f;
    status st;
    gguf_craft_tmp_path(path, sizeof path, ".gguf");
    write_file(path, 0, MODE_STREAM);
    CU_ASSERT_FATAL(gguf_open(&f, path, &st) == STATUS_OK);

    uint32_t u32;
    uint64_t u64;
    float f32;
    bool b;
    gguf_str s;
    CU_ASSERT_EQUAL(gguf_get_u32(f, "t.u8", &u32, &st), STATUS_OK);
    CU_ASSERT_EQUAL(u32, 200);
    CU_ASSERT_EQUAL(gguf_get_u32(f, "t.u16", &u32, &st), STATUS_OK);
    CU_ASSERT_EQUAL(u32, 60000);
    CU_ASSERT_EQUAL(gguf_get_u32(f, "t.u32", &u32, &st), STATUS_OK);
    CU_ASSERT_EQUAL(u32, v_u32);
    CU_ASSERT_EQUAL(gguf_get_u32(f, "t.i8", &u32, &st), STATUS_FORMAT); /* negative */
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "t.i8"));
    CU_ASSERT_EQUAL(gguf_get_u32(f, "t.u64", &u32, &st), STATUS_FORMAT); /* > u32 */
    CU_ASSERT_EQUAL(gguf_get_u64(f, "t.u64", &u64, &st), STATUS_OK);
    CU_ASSERT_EQUAL(u64, v_u64);
    CU_ASSERT_EQUAL(gguf_get_u64(f, "t.i64", &u64, &st), STATUS_FORMAT);
    CU_ASSERT_EQUAL(gguf_get_u32(f, "t.str", &u32, &st), STATUS_FORMAT);
    CU_ASSERT_EQUAL(gguf_get_u32(f, "t.bool", &u32, &st), STATUS_FORMAT);
    CU_ASSERT_EQUAL(gguf_get_u32(f, "t.arr.u32", &u32, &st), STATUS_FORMAT);
    CU_ASSERT_EQUAL(gguf_get_u32(f, "no.such.key", &u32, &st), STATUS_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "no.such.key"));
    CU_ASSERT_EQUAL(gguf_get_f32(f, "t.f32", &f32, &st), STATUS_OK);
    CU_ASSERT_EQUAL(f32, 3.25f);
    CU_ASSERT_EQUAL(gguf_get_f32(f, "t.f64", &f32, &st), STATUS_OK);
    CU_ASSERT_TRUE(isinf(f32)); /* 1e300 does not fit a float */
    CU_ASSERT_EQUAL(gguf_get_f32(f, "t.u32", &f32, &st), STATUS_FORMAT);
    CU_ASSERT_EQUAL(gguf_get_bool(f, "t.bool", &b, &st), STATUS_OK);
    CU_ASSERT_TRUE(b);
    CU_ASSERT_EQUAL(gguf_get_bool(f, "t.u8", &b, &st), STATUS_FORMAT);
    CU_ASSERT_EQUAL(gguf_get_str(f, "t.u8", &s, &st), STATUS_FORMAT);
    CU_ASSERT_EQUAL(gguf_get_str(f, "t.arr.str", &s, &st), STATUS_FORMAT);

    int64_t i64;
    double d;
    const gguf_kv *kv = gguf_find_kv(f, "t.arr.i16");
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 0, &i64), STATUS_OK);
    CU_ASSERT_EQUAL(i64, -32768);
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 2, &i64), STATUS_OK);
    CU_ASSERT_EQUAL(i64, 32767);
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 3, &i64), STATUS_RANGE);
    CU_ASSERT_EQUAL(gguf_kv_get_float(kv, 0, &d), STATUS_FORMAT);
    kv = gguf_find_kv(f, "t.arr.u64");
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 0, &i64), STATUS_RANGE); /* UINT64_MAX */
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 1, &i64), STATUS_OK);
    kv = gguf_find_kv(f, "t.arr.i64");
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 0, &i64), STATUS_OK);
    CU_ASSERT_EQUAL(i64, INT64_MIN);
    kv = gguf_find_kv(f, "t.arr.bool");
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 1, &i64), STATUS_OK);
    CU_ASSERT_EQUAL(i64, 0);
    kv = gguf_find_kv(f, "t.arr.f64");
    CU_ASSERT_EQUAL(gguf_kv_get_float(kv, 1, &d), STATUS_OK);
    CU_ASSERT_EQUAL(d, -2.5e-300);
    kv = gguf_find_kv(f, "t.arr.f32");
    CU_ASSERT_EQUAL(gguf_kv_get_float(kv, 2, &d), STATUS_OK);
    CU_ASSERT_EQUAL((float)d, 1e-6f);
    kv = gguf_find_kv(f, "t.u16"); /* scalars are element 0 */
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 0, &i64), STATUS_OK);
    CU_ASSERT_EQUAL(i64, 60000);
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 1, &i64), STATUS_RANGE);
    kv = gguf_find_kv(f, "t.arr.str");
    CU_ASSERT_EQUAL(gguf_kv_get_int(kv, 0, &i64), STATUS_FORMAT);

    CU_ASSERT_STRING_EQUAL(gguf_vtype_name(GGUF_VTYPE_FLOAT64), "f64");
    CU_ASSERT_EQUAL(gguf_vtype_size(GGUF_VTYPE_INT16), 2);
    CU_ASSERT_EQUAL(gguf_vtype_size(GGUF_VTYPE_STRING), 0);
    gguf_close(f);
    unlink(path);
}

/* ---- writer errors ------------------------------------------------------------------------ */

/* Creates a writer on a temp path; returns it with the path in path. */
static gguf_writer *new_writer(char *path, size_t cap)
{
    gguf_writer *w;
    status st;
    gguf_craft_tmp_path(path, cap, ".gguf");
    CU_ASSERT_FATAL(gguf_writer_create(&w, path, &st) == STATUS_OK);
    return w;
}

/* begin_data must fail with INVALID and a message containing needle. */
static void expect_begin_fails(gguf_writer *w, const char *path, const char *needle)
{
    status st;
    CU_ASSERT_EQUAL(gguf_writer_begin_data(w, &st), STATUS_INVALID);
    if (!strstr(st.msg, needle)) fprintf(stderr, "message '%s' lacks '%s'\n", st.msg, needle);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, needle));
    gguf_writer_destroy(w);
    unlink(path);
}

static void test_writer_rejects_bad_tensors(void)
{
    char path[512];
    uint64_t ne[5] = {100, 2, 1, 1, 1};
    gguf_writer *w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "q4k.bad", 2, ne, GGML_TYPE_Q4_K), -1);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "later.ok", 1, ne, GGML_TYPE_F32), 0);
    expect_begin_fails(w, path, "q4k.bad"); /* the first error is the one reported */

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "five", 5, ne, GGML_TYPE_F32), -1);
    expect_begin_fails(w, path, "n_dims");

    w = new_writer(path, sizeof path);
    ne[1] = 0;
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "zero", 2, ne, GGML_TYPE_F32), -1);
    expect_begin_fails(w, path, "zero");

    w = new_writer(path, sizeof path);
    uint64_t big[1] = {1ull << 62}; /* 2^62 f32 = 2^64 bytes */
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "big", 1, big, GGML_TYPE_F32), -1);
    expect_begin_fails(w, path, "overflows");

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "unknown", 1, ne, 4 /* removed Q4_2 */), -1);
    expect_begin_fails(w, path, "unknown ggml type");

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "0123456789012345678901234567890123456789012345678"
                                              "901234567890123", 1, ne, GGML_TYPE_F32), -1);
    expect_begin_fails(w, path, "longer than");

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "twice", 1, ne, GGML_TYPE_F32), 0);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "other", 1, ne, GGML_TYPE_F32), 1);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "twice", 1, ne, GGML_TYPE_F32), 2);
    expect_begin_fails(w, path, "duplicate tensor name 'twice'");
}

static void test_writer_rejects_bad_kvs(void)
{
    char path[512];
    uint64_t v = 64;
    gguf_writer *w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_set_u32(w, "general.alignment", 48), STATUS_INVALID);
    expect_begin_fails(w, path, "power of two");

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_set_u32(w, "general.alignment", 0), STATUS_INVALID);
    expect_begin_fails(w, path, "alignment");

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_set_val(w, "general.alignment", GGUF_VTYPE_UINT64, &v),
                    STATUS_INVALID);
    expect_begin_fails(w, path, "must be u32");

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_set_u32(w, "", 1), STATUS_INVALID);
    expect_begin_fails(w, path, "key");

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_set_val(w, "k", GGUF_VTYPE_STRING, "x"), STATUS_INVALID);
    expect_begin_fails(w, path, "scalar");

    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_set_arr(w, "k", GGUF_VTYPE_ARRAY, &v, 1), STATUS_INVALID);
    expect_begin_fails(w, path, "array element type");
}

static void test_writer_data_errors(void)
{
    char path[512];
    status st;
    uint64_t ne[2] = {8, 2};
    uint8_t buf[256] = {0};

    /* too little data */
    gguf_writer *w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "t0", 2, ne, GGML_TYPE_F32), 0);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "t1", 1, ne, GGML_TYPE_F16), 1);
    CU_ASSERT_EQUAL(gguf_writer_write_data(w, buf, 1, &st), STATUS_INVALID); /* before begin */
    CU_ASSERT_FATAL(gguf_writer_begin_data(w, &st) == STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_set_u32(w, "late", 1), STATUS_INVALID);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "late", 1, ne, GGML_TYPE_F32), -1);
    CU_ASSERT_EQUAL(gguf_writer_begin_data(w, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(gguf_writer_write_data(w, buf, 64 + 3, &st), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_finish(w, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "t1"));
    gguf_writer_destroy(w);
    unlink(path);

    /* too much data */
    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "t0", 2, ne, GGML_TYPE_F32), 0);
    CU_ASSERT_FATAL(gguf_writer_begin_data(w, &st) == STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_write_data(w, buf, 65, &st), STATUS_INVALID);
    gguf_writer_destroy(w);
    unlink(path);

    /* pwrite: ranges must lie inside one tensor, and every byte must be written */
    w = new_writer(path, sizeof path);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "t0", 2, ne, GGML_TYPE_F32), 0);
    CU_ASSERT_EQUAL(gguf_writer_add_tensor(w, "t1", 1, ne, GGML_TYPE_F16), 1);
    CU_ASSERT_FATAL(gguf_writer_begin_data(w, &st) == STATUS_OK);
    uint64_t o0 = gguf_writer_tensor_offset(w, 0), o1 = gguf_writer_tensor_offset(w, 1);
    CU_ASSERT_EQUAL(o0 % 32, 0);
    CU_ASSERT_EQUAL(o1, o0 + 64); /* 64 bytes, already aligned */
    CU_ASSERT_EQUAL(gguf_writer_pwrite(w, buf, 65, o0, &st), STATUS_INVALID); /* straddles */
    CU_ASSERT_EQUAL(gguf_writer_pwrite(w, buf, 1, o0 - 1, &st), STATUS_INVALID); /* header */
    CU_ASSERT_EQUAL(gguf_writer_pwrite(w, buf, 1, o1 + 16, &st), STATUS_INVALID); /* past end */
    CU_ASSERT_EQUAL(gguf_writer_pwrite(w, buf, 64, o0, &st), STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_finish(w, &st), STATUS_INVALID); /* t1 missing */
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "64 of 80"));
    gguf_writer_destroy(w);
    unlink(path);

    /* an empty file (no tensors, no KVs) is valid */
    w = new_writer(path, sizeof path);
    CU_ASSERT_FATAL(gguf_writer_begin_data(w, &st) == STATUS_OK);
    CU_ASSERT_EQUAL(gguf_writer_finish(w, &st), STATUS_OK);
    gguf_writer_destroy(w);
    gguf_file *f;
    CU_ASSERT_EQUAL_FATAL(gguf_open(&f, path, &st), STATUS_OK);
    CU_ASSERT_EQUAL(f->n_kv, 0);
    CU_ASSERT_EQUAL(f->n_tensors, 0);
    gguf_close(f);
    unlink(path);

    /* a folder that does not exist */
    CU_ASSERT_EQUAL(gguf_writer_create(&w, "/nonexistent-dir/x.gguf", &st), STATUS_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "/nonexistent-dir/x.gguf"));
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("gguf_roundtrip", NULL, NULL);
    CU_add_test(s, "stream, default alignment", test_roundtrip_stream_default_alignment);
    CU_add_test(s, "stream, alignment 64", test_roundtrip_stream_alignment_64);
    CU_add_test(s, "pwrite from threads", test_roundtrip_pwrite_threads);
    CU_add_test(s, "pwrite, alignment 128", test_roundtrip_pwrite_alignment_128);
    CU_add_test(s, "stream and pwrite identical", test_stream_and_pwrite_identical);
    CU_add_test(s, "typed getters", test_getters);
    CU_add_test(s, "writer rejects bad tensors", test_writer_rejects_bad_tensors);
    CU_add_test(s, "writer rejects bad KVs", test_writer_rejects_bad_kvs);
    CU_add_test(s, "writer data errors", test_writer_data_errors);
    return testutil_cunit_run();
}
