/* Helper for gguf_py_crosscheck.py (gguf-py, llama.cpp's reference implementation):
 *
 *   gguf_py_helper write PATH   writes PATH with our writer (every KV type, tensors of
 *                               F32/F16/BF16/Q8_0/Q4_K/Q5_K/Q6_K) and prints, as JSON, what it
 *                               meant to write: built from its own values, not read back.
 *   gguf_py_helper dump PATH    reads PATH with our reader and prints the same JSON shape.
 *
 * JSON: {"version", "alignment", "kv": [{"key", "type", "arr_type", "value"}],
 *        "tensors": [{"name", "type", "ne", "n_bytes", "data_offset", "hex"}]}
 * Types use gguf_vtype_name ("u8", "f32", "str", "arr", ...); f32 values print with 9
 * significant digits and f64 with 17, so they read back exactly. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf/quant.h"

/* ---- JSON output ------------------------------------------------------------------------ */

static void json_str(FILE *o, const char *p, uint64_t n)
{
    fputc('"', o);
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c < 0x20)
            fprintf(o, "\\u%04x", c);
        else
            fputc(c, o);
    }
    fputc('"', o);
}

static void json_double(FILE *o, double d, int digits)
{
    if (isnan(d))
        fputs("NaN", o);
    else if (isinf(d))
        fputs(d > 0 ? "Infinity" : "-Infinity", o);
    else
        fprintf(o, "%.*g", digits, d);
}

/* One scalar of type t at p (unaligned). */
static void json_scalar(FILE *o, gguf_vtype t, const uint8_t *p)
{
    switch (t) {
    case GGUF_VTYPE_UINT8: fprintf(o, "%u", p[0]); break;
    case GGUF_VTYPE_INT8: fprintf(o, "%d", (int8_t)p[0]); break;
    case GGUF_VTYPE_BOOL: fputs(p[0] ? "true" : "false", o); break;
    case GGUF_VTYPE_UINT16: { uint16_t v; memcpy(&v, p, 2); fprintf(o, "%u", v); break; }
    case GGUF_VTYPE_INT16: { int16_t v; memcpy(&v, p, 2); fprintf(o, "%d", v); break; }
    case GGUF_VTYPE_UINT32: { uint32_t v; memcpy(&v, p, 4); fprintf(o, "%u", v); break; }
    case GGUF_VTYPE_INT32: { int32_t v; memcpy(&v, p, 4); fprintf(o, "%d", v); break; }
    case GGUF_VTYPE_UINT64: { uint64_t v; memcpy(&v, p, 8); fprintf(o, "%llu", (unsigned long long)v); break; }
    case GGUF_VTYPE_INT64: { int64_t v; memcpy(&v, p, 8); fprintf(o, "%lld", (long long)v); break; }
    case GGUF_VTYPE_FLOAT32: { float v; memcpy(&v, p, 4); json_double(o, v, 9); break; }
    case GGUF_VTYPE_FLOAT64: { double v; memcpy(&v, p, 8); json_double(o, v, 17); break; }
    default: fputs("null", o); break;
    }
}

/* A KV given as type/arr_type, n values at data (packed) or strs. */
static void json_kv(FILE *o, bool first, const char *key, uint64_t key_len, gguf_vtype type,
                    gguf_vtype arr_type, uint64_t n, const uint8_t *data, const gguf_str *strs)
{
    fprintf(o, "%s\n    {\"key\": ", first ? "" : ",");
    json_str(o, key, key_len);
    fprintf(o, ", \"type\": \"%s\", \"arr_type\": ", gguf_vtype_name(type));
    if (type == GGUF_VTYPE_ARRAY)
        fprintf(o, "\"%s\"", gguf_vtype_name(arr_type));
    else
        fputs("null", o);
    fputs(", \"value\": ", o);
    gguf_vtype et = type == GGUF_VTYPE_ARRAY ? arr_type : type;
    if (type == GGUF_VTYPE_ARRAY) fputc('[', o);
    for (uint64_t i = 0; i < n; i++) {
        if (i) fputs(", ", o);
        if (et == GGUF_VTYPE_STRING)
            json_str(o, strs[i].ptr, strs[i].len);
        else
            json_scalar(o, et, data + i * gguf_vtype_size(et));
    }
    if (type == GGUF_VTYPE_ARRAY) fputc(']', o);
    fputc('}', o);
}

static void json_tensor(FILE *o, bool first, const char *name, uint64_t name_len, uint32_t type,
                        uint32_t n_dims, const uint64_t *ne, uint64_t n_bytes,
                        uint64_t data_offset, const uint8_t *data)
{
    fprintf(o, "%s\n    {\"name\": ", first ? "" : ",");
    json_str(o, name, name_len);
    fprintf(o, ", \"type\": %u, \"ne\": [", type);
    for (uint32_t d = 0; d < n_dims; d++) fprintf(o, "%s%llu", d ? ", " : "", (unsigned long long)ne[d]);
    fprintf(o, "], \"n_bytes\": %llu, \"data_offset\": %llu, \"hex\": \"",
            (unsigned long long)n_bytes, (unsigned long long)data_offset);
    for (uint64_t i = 0; i < n_bytes; i++) fprintf(o, "%02x", data[i]);
    fputs("\"}", o);
}

/* ---- dump ------------------------------------------------------------------------------- */

static int dump(const char *path)
{
    gguf_file *f;
    status st;
    if (gguf_open(&f, path, &st) != STATUS_OK) {
        fprintf(stderr, "gguf_py_helper: %s\n", st.msg);
        return 1;
    }
    FILE *o = stdout;
    fprintf(o, "{\"version\": %u, \"alignment\": %llu, \"kv\": [", f->version,
            (unsigned long long)f->alignment);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gguf_kv *kv = &f->kv[i];
        json_kv(o, i == 0, kv->key.ptr, kv->key.len, kv->type, kv->arr_type, kv->n, kv->data,
                kv->strs);
    }
    fputs("\n  ],\n  \"tensors\": [", o);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        json_tensor(o, i == 0, t->name.ptr, t->name.len, t->type, t->n_dims, t->ne, t->n_bytes,
                    f->data_offset + t->offset, t->data);
    }
    fputs("\n  ]\n}\n", o);
    gguf_close(f);
    return 0;
}

/* ---- write ------------------------------------------------------------------------------ */

typedef struct wkv_spec {
    const char *key;
    gguf_vtype type, arr_type;
    uint64_t n;
    const void *data;          /* packed scalars */
    const char *const *strs;   /* strings */
} wkv_spec;

static const uint8_t s_u8 = 7;
static const int8_t s_i8 = -7;
static const uint16_t s_u16 = 65535;
static const int16_t s_i16 = -32768;
static const uint32_t s_u32 = 4294967295u;
static const int32_t s_i32 = INT32_MIN;
static const float s_f32 = 0.1f;
static const uint8_t s_true = 1, s_false = 0;
static const uint64_t s_u64 = UINT64_MAX;
static const int64_t s_i64 = INT64_MIN;
static const double s_f64 = -1.0 / 3.0;
static const uint32_t s_align = 64;
static const char *const s_str[] = {"qwen35 \xc3\xbcn\xc3\xaf\x63ode \"quoted\" back\\slash\n\ttab"};
static const char *const s_arch[] = {"crosscheck"};

static const uint8_t a_u8[] = {0, 1, 128, 255};
static const int8_t a_i8[] = {-128, -1, 0, 127};
static const uint16_t a_u16[] = {0, 65535, 300};
static const int16_t a_i16[] = {-32768, 32767};
static const uint32_t a_u32[] = {3, 3, 2, 0, 4000000000u};
static const int32_t a_i32[] = {-5, 0, 2147483647};
static const float a_f32[] = {1e-6f, -2.5f, 3.4028235e38f, 1.17549435e-38f};
static const uint8_t a_bool[] = {1, 0, 0, 1};
static const uint64_t a_u64[] = {0, 1, UINT64_MAX};
static const int64_t a_i64[] = {INT64_MIN, -1, INT64_MAX};
static const double a_f64[] = {3.141592653589793, 1e-300, -1e300};
static const char *const a_str[] = {"<|endoftext|>", "", "\xc4\xa0the", "a b", "\xe2\x80\x9c"};

static const wkv_spec k_kvs[] = {
    {"general.architecture", GGUF_VTYPE_STRING, 0, 1, NULL, s_arch},
    {"general.alignment", GGUF_VTYPE_UINT32, 0, 1, &s_align, NULL},
    {"x.u8", GGUF_VTYPE_UINT8, 0, 1, &s_u8, NULL},
    {"x.i8", GGUF_VTYPE_INT8, 0, 1, &s_i8, NULL},
    {"x.u16", GGUF_VTYPE_UINT16, 0, 1, &s_u16, NULL},
    {"x.i16", GGUF_VTYPE_INT16, 0, 1, &s_i16, NULL},
    {"x.u32", GGUF_VTYPE_UINT32, 0, 1, &s_u32, NULL},
    {"x.i32", GGUF_VTYPE_INT32, 0, 1, &s_i32, NULL},
    {"x.f32", GGUF_VTYPE_FLOAT32, 0, 1, &s_f32, NULL},
    {"x.bool.true", GGUF_VTYPE_BOOL, 0, 1, &s_true, NULL},
    {"x.bool.false", GGUF_VTYPE_BOOL, 0, 1, &s_false, NULL},
    {"x.str", GGUF_VTYPE_STRING, 0, 1, NULL, s_str},
    {"x.u64", GGUF_VTYPE_UINT64, 0, 1, &s_u64, NULL},
    {"x.i64", GGUF_VTYPE_INT64, 0, 1, &s_i64, NULL},
    {"x.f64", GGUF_VTYPE_FLOAT64, 0, 1, &s_f64, NULL},
    {"x.arr.u8", GGUF_VTYPE_ARRAY, GGUF_VTYPE_UINT8, 4, a_u8, NULL},
    {"x.arr.i8", GGUF_VTYPE_ARRAY, GGUF_VTYPE_INT8, 4, a_i8, NULL},
    {"x.arr.u16", GGUF_VTYPE_ARRAY, GGUF_VTYPE_UINT16, 3, a_u16, NULL},
    {"x.arr.i16", GGUF_VTYPE_ARRAY, GGUF_VTYPE_INT16, 2, a_i16, NULL},
    {"x.arr.u32", GGUF_VTYPE_ARRAY, GGUF_VTYPE_UINT32, 5, a_u32, NULL},
    {"x.arr.i32", GGUF_VTYPE_ARRAY, GGUF_VTYPE_INT32, 3, a_i32, NULL},
    {"x.arr.f32", GGUF_VTYPE_ARRAY, GGUF_VTYPE_FLOAT32, 4, a_f32, NULL},
    {"x.arr.bool", GGUF_VTYPE_ARRAY, GGUF_VTYPE_BOOL, 4, a_bool, NULL},
    {"x.arr.u64", GGUF_VTYPE_ARRAY, GGUF_VTYPE_UINT64, 3, a_u64, NULL},
    {"x.arr.i64", GGUF_VTYPE_ARRAY, GGUF_VTYPE_INT64, 3, a_i64, NULL},
    {"x.arr.f64", GGUF_VTYPE_ARRAY, GGUF_VTYPE_FLOAT64, 3, a_f64, NULL},
    {"x.arr.str", GGUF_VTYPE_ARRAY, GGUF_VTYPE_STRING, 5, NULL, a_str},
    {"x.arr.empty", GGUF_VTYPE_ARRAY, GGUF_VTYPE_UINT32, 0, a_u32, NULL},
    {"x.arr.str.empty", GGUF_VTYPE_ARRAY, GGUF_VTYPE_STRING, 0, NULL, a_str},
};
#define N_KVS (sizeof k_kvs / sizeof k_kvs[0])

typedef struct wtensor_spec {
    const char *name;
    uint32_t type, n_dims;
    uint64_t ne[4];
} wtensor_spec;

static const wtensor_spec k_tensors[] = {
    {"t.f32", GGML_TYPE_F32, 2, {16, 3}},       {"t.f16", GGML_TYPE_F16, 2, {32, 2}},
    {"t.bf16", GGML_TYPE_BF16, 1, {8}},         {"t.q8_0", GGML_TYPE_Q8_0, 2, {64, 2}},
    {"t.q4_K", GGML_TYPE_Q4_K, 2, {256, 2}},    {"t.q5_K", GGML_TYPE_Q5_K, 1, {512}},
    {"t.q6_K", GGML_TYPE_Q6_K, 3, {256, 1, 2}},
};
#define N_TENSORS (sizeof k_tensors / sizeof k_tensors[0])

/* Real blocks: rows of smooth values quantised with the type's own quantiser. */
static uint8_t *make_tensor(const wtensor_spec *t, uint64_t *n_bytes)
{
    uint64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->ne[d];
    uint64_t row_bytes = quant_row_bytes(t->type, t->ne[0]);
    const quant_traits *qt = quant_get(t->type);
    *n_bytes = row_bytes * rows;
    uint8_t *out = malloc(*n_bytes);
    float *x = malloc(t->ne[0] * sizeof *x);
    if (!out || !x || !qt || !qt->quantize) {
        free(out);
        free(x);
        return NULL;
    }
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t i = 0; i < t->ne[0]; i++)
            x[i] = sinf(0.37f * (float)i + 1.3f * (float)r + (float)t->type) * (1.0f + (float)(i % 7));
        qt->quantize(x, out + r * row_bytes, (int64_t)t->ne[0]);
    }
    free(x);
    return out;
}

static int write_file(const char *path)
{
    gguf_writer *w;
    status st;
    uint8_t *data[N_TENSORS] = {0};
    uint64_t n_bytes[N_TENSORS];
    int rc = gguf_writer_create(&w, path, &st);
    if (rc) goto fail_msg;
    for (size_t i = 0; i < N_KVS; i++) {
        const wkv_spec *k = &k_kvs[i];
        if (k->type == GGUF_VTYPE_STRING)
            gguf_writer_set_str(w, k->key, k->strs[0]);
        else if (k->type == GGUF_VTYPE_ARRAY && k->arr_type == GGUF_VTYPE_STRING)
            gguf_writer_set_arr_str(w, k->key, k->strs, k->n);
        else if (k->type == GGUF_VTYPE_ARRAY)
            gguf_writer_set_arr(w, k->key, k->arr_type, k->data, k->n);
        else
            gguf_writer_set_val(w, k->key, k->type, k->data);
    }
    for (size_t i = 0; i < N_TENSORS; i++) {
        data[i] = make_tensor(&k_tensors[i], &n_bytes[i]);
        if (!data[i]) {
            fprintf(stderr, "gguf_py_helper: cannot make tensor %s\n", k_tensors[i].name);
            rc = 1;
            goto out;
        }
        gguf_writer_add_tensor(w, k_tensors[i].name, k_tensors[i].n_dims, k_tensors[i].ne,
                               k_tensors[i].type);
    }
    if ((rc = gguf_writer_begin_data(w, &st))) goto fail_msg;
    for (size_t i = 0; i < N_TENSORS; i++)
        if ((rc = gguf_writer_write_data(w, data[i], n_bytes[i], &st))) goto fail_msg;
    if ((rc = gguf_writer_finish(w, &st))) goto fail_msg;

    /* what was meant, as JSON */
    FILE *o = stdout;
    fprintf(o, "{\"version\": 3, \"alignment\": %u, \"kv\": [", s_align);
    for (size_t i = 0; i < N_KVS; i++) {
        const wkv_spec *k = &k_kvs[i];
        gguf_str strs[8];
        for (uint64_t j = 0; k->strs && j < k->n; j++) strs[j] = (gguf_str){strlen(k->strs[j]), k->strs[j]};
        json_kv(o, i == 0, k->key, strlen(k->key), k->type, k->arr_type, k->n, k->data, strs);
    }
    fputs("\n  ],\n  \"tensors\": [", o);
    for (size_t i = 0; i < N_TENSORS; i++)
        json_tensor(o, i == 0, k_tensors[i].name, strlen(k_tensors[i].name), k_tensors[i].type,
                    k_tensors[i].n_dims, k_tensors[i].ne, n_bytes[i],
                    gguf_writer_tensor_offset(w, (int)i), data[i]);
    fputs("\n  ]\n}\n", o);
    rc = 0;
    goto out;
fail_msg:
    fprintf(stderr, "gguf_py_helper: %s\n", st.msg);
out:
    for (size_t i = 0; i < N_TENSORS; i++) free(data[i]);
    gguf_writer_destroy(w);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "write")) return write_file(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "dump")) return dump(argv[2]);
    fprintf(stderr, "usage: gguf_py_helper write|dump PATH\n");
    return 2;
}
