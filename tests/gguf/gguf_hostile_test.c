/* Hand-crafted bad GGUF files: each must fail cleanly (no crash, no leak: run under ASan) with
 * STATUS_FORMAT or STATUS_UNSUPPORTED and a message naming the byte offset. Every buffer handed
 * to the reader is an exact-size heap copy so ASan sees any read past its end. */
#include <CUnit/Basic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "tests/gguf/gguf_craft.h"
#include "tests/testutil/testutil.h"

typedef struct spec_tensor {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[5];
    uint32_t type;
    uint64_t offset;
} spec_tensor;

/* A small file described by fields a case can break one at a time. */
typedef struct spec {
    uint32_t version;
    bool override_counts;
    uint64_t n_tensors, n_kv; /* used when override_counts */
    bool alignment_kv;        /* write general.alignment as u32 */
    uint32_t alignment;
    int n_t;
    spec_tensor t[4];
    uint64_t data_bytes;                 /* size of the data section written */
    void (*extra_kvs)(gguf_craft *c);    /* appended after the standard KVs */
    int n_extra_kvs;
    bool no_pad; /* end the file right after the tensor infos */
} spec;

static spec baseline(void)
{
    spec s = {
        .version = 3,
        .alignment_kv = true,
        .alignment = 32,
        .n_t = 2,
        .t = {{"w.f32", 2, {8, 2}, GGML_TYPE_F32, 0}, {"w.q8", 1, {32}, GGML_TYPE_Q8_0, 64}},
        .data_bytes = 64 + 34,
    };
    return s;
}

static void build(const spec *s, gguf_craft *c)
{
    uint64_t n_kv = 3 + (s->alignment_kv ? 1 : 0) + (uint64_t)s->n_extra_kvs;
    gguf_craft_header(c, s->version, s->override_counts ? s->n_tensors : (uint64_t)s->n_t,
                      s->override_counts ? s->n_kv : n_kv);
    if (s->alignment_kv) gguf_craft_kv_u32(c, "general.alignment", s->alignment);
    gguf_craft_kv_str(c, "general.architecture", "qwen35");
    gguf_craft_kv_u32(c, "qwen35.block_count", 4);
    gguf_craft_str(c, "tokenizer.ggml.tokens");
    gguf_craft_u32(c, GGUF_VTYPE_ARRAY);
    gguf_craft_u32(c, GGUF_VTYPE_STRING);
    gguf_craft_u64(c, 3);
    gguf_craft_str(c, "a");
    gguf_craft_str(c, "bc");
    gguf_craft_str(c, "");
    if (s->extra_kvs) s->extra_kvs(c);
    for (int i = 0; i < s->n_t; i++)
        gguf_craft_tensor(c, s->t[i].name, s->t[i].n_dims, s->t[i].ne, s->t[i].type,
                          s->t[i].offset);
    if (s->no_pad) return;
    gguf_craft_pad(c, s->alignment_kv && s->alignment && !(s->alignment & (s->alignment - 1))
                          ? s->alignment : 32);
    for (uint64_t i = 0; i < s->data_bytes; i++) {
        uint8_t b = (uint8_t)(i * 7);
        gguf_craft_bytes(c, &b, 1);
    }
}

/* Opens an exact-size copy of [p, +n). */
static int open_copy(const uint8_t *p, size_t n, gguf_file **f, status *st)
{
    uint8_t *copy = malloc(n ? n : 1);
    DS_ASSERT(copy);
    memcpy(copy, p, n);
    int rc = gguf_open_buffer(f, copy, n, "crafted.gguf", st);
    if (rc == STATUS_OK) {
        /* touch everything the reader hands out, then close before freeing the bytes */
        volatile uint8_t sink = 0;
        for (uint64_t i = 0; i < (*f)->n_kv; i++) {
            const gguf_kv *kv = &(*f)->kv[i];
            for (uint64_t k = 0; k < kv->key.len; k++) sink ^= (uint8_t)kv->key.ptr[k];
            if (kv->strs)
                for (uint64_t j = 0; j < kv->n; j++)
                    for (uint64_t k = 0; k < kv->strs[j].len; k++)
                        sink ^= (uint8_t)kv->strs[j].ptr[k];
            else if (kv->n)
                sink ^= kv->data[kv->n * gguf_vtype_size(kv->type == GGUF_VTYPE_ARRAY
                                                             ? kv->arr_type : kv->type) - 1];
        }
        for (uint64_t i = 0; i < (*f)->n_tensors; i++) {
            const gguf_tensor *t = &(*f)->tensors[i];
            const uint8_t *d = t->data;
            sink ^= d[0] ^ d[t->n_bytes - 1];
        }
        (void)sink;
        gguf_close(*f);
    }
    *f = NULL;
    free(copy);
    return rc;
}

/* The file must fail with code, a message with "offset" and needle. */
static void expect_fail_bytes(const uint8_t *p, size_t n, int code, const char *needle,
                              const char *what)
{
    gguf_file *f = (gguf_file *)1;
    status st;
    status_clear(&st);
    int rc = open_copy(p, n, &f, &st);
    if (rc != code || !strstr(st.msg, "offset") || (needle && !strstr(st.msg, needle)))
        fprintf(stderr, "\n  case '%s': rc %d (want %d), message '%s' (want '%s')\n", what, rc,
                code, st.msg, needle ? needle : "");
    CU_ASSERT_EQUAL(rc, code);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "offset"));
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "crafted.gguf"));
    if (needle) CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, needle));
}

static void expect_fail(const spec *s, int code, const char *needle, const char *what)
{
    gguf_craft c = {0};
    build(s, &c);
    expect_fail_bytes(c.p, c.n, code, needle, what);
    gguf_craft_free(&c);
}

static void test_baseline_is_valid(void)
{
    spec s = baseline();
    gguf_craft c = {0};
    build(&s, &c);
    gguf_file *f;
    status st;
    uint8_t *copy = malloc(c.n);
    memcpy(copy, c.p, c.n);
    int rc = gguf_open_buffer(&f, copy, c.n, "crafted.gguf", &st);
    if (rc) fprintf(stderr, "baseline: %s\n", st.msg);
    CU_ASSERT_EQUAL_FATAL(rc, STATUS_OK);
    CU_ASSERT_EQUAL(f->n_tensors, 2);
    CU_ASSERT_EQUAL(f->n_kv, 4);
    const gguf_kv *kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
    CU_ASSERT_EQUAL(kv->n, 3);
    CU_ASSERT_TRUE(gguf_str_eq(kv->strs[1], "bc"));
    CU_ASSERT_EQUAL(gguf_find_tensor(f, "w.q8")->n_bytes, 34);
    CU_ASSERT_EQUAL(f->data_offset + 64 + 34, f->size);
    gguf_close(f);
    free(copy);

    /* v2 has the same layout and is accepted */
    s.version = 2;
    gguf_craft_free(&c);
    build(&s, &c);
    CU_ASSERT_EQUAL(open_copy(c.p, c.n, &f, &st), STATUS_OK);
    gguf_craft_free(&c);
}

/* Truncated at every byte: fails with FORMAT until the last tensor's data is complete. */
static void test_truncated_everywhere(void)
{
    spec s = baseline();
    gguf_craft c = {0};
    build(&s, &c);
    size_t complete = c.n; /* the baseline ends right after the last tensor */
    gguf_file *f;
    status st;
    int n_fail = 0;
    for (size_t len = 0; len < complete; len++) {
        int rc = open_copy(c.p, len, &f, &st);
        if (rc != STATUS_FORMAT || !strstr(st.msg, "offset")) {
            fprintf(stderr, "\n  truncated to %zu: rc %d '%s'\n", len, rc, st.msg);
            n_fail++;
        }
    }
    CU_ASSERT_EQUAL(n_fail, 0);
    CU_ASSERT_EQUAL(open_copy(c.p, complete, &f, &st), STATUS_OK);
    gguf_craft_free(&c);
}

/* Every single-bit flip of the header and infos: OK or a clean FORMAT/UNSUPPORTED. */
static void test_bit_flips(void)
{
    spec s = baseline();
    gguf_craft c = {0};
    build(&s, &c);
    gguf_file *f;
    status st;
    int n_bad = 0, n_rejected = 0, n_ok = 0;
    uint8_t *mut = malloc(c.n);
    for (size_t i = 0; i < c.n - s.data_bytes; i++)
        for (int bit = 0; bit < 8; bit++) {
            memcpy(mut, c.p, c.n);
            mut[i] ^= (uint8_t)(1u << bit);
            status_clear(&st);
            int rc = open_copy(mut, c.n, &f, &st);
            if (rc == STATUS_OK) {
                n_ok++;
            } else if ((rc == STATUS_FORMAT || rc == STATUS_UNSUPPORTED) && strstr(st.msg, "offset")) {
                n_rejected++;
            } else {
                fprintf(stderr, "\n  flip byte %zu bit %d: rc %d '%s'\n", i, bit, rc, st.msg);
                n_bad++;
            }
        }
    free(mut);
    CU_ASSERT_EQUAL(n_bad, 0);
    CU_ASSERT_TRUE(n_rejected > 100); /* most flips in lengths, counts, types are caught */
    CU_ASSERT_TRUE(n_ok > 10);        /* flips inside string bytes are still valid files */
    gguf_craft_free(&c);
}

static void test_magic_and_version(void)
{
    spec s = baseline();
    gguf_craft c = {0};
    build(&s, &c);
    c.p[0] = 'X';
    expect_fail_bytes(c.p, c.n, STATUS_FORMAT, "magic", "bad magic");
    gguf_craft_free(&c);

    s.version = 1;
    expect_fail(&s, STATUS_UNSUPPORTED, "version 1", "v1");
    s.version = 4;
    expect_fail(&s, STATUS_UNSUPPORTED, "version 4", "v4");
    s.version = 0x03000000; /* a big-endian v3 file */
    expect_fail(&s, STATUS_UNSUPPORTED, "version", "big-endian");
    expect_fail_bytes((const uint8_t *)"GGU", 3, STATUS_FORMAT, "magic", "3 bytes");
    expect_fail_bytes((const uint8_t *)"", 0, STATUS_FORMAT, "magic", "empty");
}

static void test_huge_counts(void)
{
    spec s = baseline();
    s.override_counts = true;
    s.n_tensors = 2;
    s.n_kv = UINT64_MAX;
    expect_fail(&s, STATUS_FORMAT, "KV count", "n_kv = 2^64-1");
    s.n_kv = 1ull << 40;
    expect_fail(&s, STATUS_FORMAT, "KV count", "n_kv = 2^40");
    s.n_kv = 4;
    s.n_tensors = UINT64_MAX;
    expect_fail(&s, STATUS_FORMAT, "tensor count", "n_tensors = 2^64-1");
    s.n_tensors = 3; /* one more than present: the third info runs into the data */
    expect_fail(&s, STATUS_FORMAT, NULL, "n_tensors + 1");
    s.n_tensors = 2;
    s.n_kv = 5; /* one more KV than present: tensor infos are read as a KV */
    expect_fail(&s, STATUS_FORMAT, NULL, "n_kv + 1");
}

static void kv_huge_string(gguf_craft *c)
{
    gguf_craft_str(c, "huge.str");
    gguf_craft_u32(c, GGUF_VTYPE_STRING);
    gguf_craft_u64(c, UINT64_MAX - 3);
}

static void kv_huge_array(gguf_craft *c)
{
    gguf_craft_str(c, "huge.arr");
    gguf_craft_u32(c, GGUF_VTYPE_ARRAY);
    gguf_craft_u32(c, GGUF_VTYPE_UINT64);
    gguf_craft_u64(c, (1ull << 61) + 1); /* × 8 bytes overflows u64 */
}

static void kv_huge_str_array(gguf_craft *c)
{
    gguf_craft_str(c, "huge.strs");
    gguf_craft_u32(c, GGUF_VTYPE_ARRAY);
    gguf_craft_u32(c, GGUF_VTYPE_STRING);
    gguf_craft_u64(c, 1ull << 59);
}

static void kv_huge_key(gguf_craft *c)
{
    gguf_craft_u64(c, 1ull << 63);
}

static void kv_array_of_arrays(gguf_craft *c)
{
    gguf_craft_str(c, "nested");
    gguf_craft_u32(c, GGUF_VTYPE_ARRAY);
    gguf_craft_u32(c, GGUF_VTYPE_ARRAY);
    gguf_craft_u64(c, 1);
    gguf_craft_u32(c, GGUF_VTYPE_UINT8);
    gguf_craft_u64(c, 1);
    gguf_craft_bytes(c, "x", 1);
}

static void kv_unknown_type(gguf_craft *c)
{
    gguf_craft_str(c, "weird");
    gguf_craft_u32(c, 13);
    gguf_craft_u32(c, 0);
}

static void kv_unknown_elem_type(gguf_craft *c)
{
    gguf_craft_str(c, "weird.arr");
    gguf_craft_u32(c, GGUF_VTYPE_ARRAY);
    gguf_craft_u32(c, 0xffffffffu);
    gguf_craft_u64(c, 0);
}

static void kv_dup_key(gguf_craft *c)
{
    gguf_craft_kv_u32(c, "qwen35.block_count", 8);
}

static void kv_empty_key(gguf_craft *c)
{
    gguf_craft_kv_u32(c, "", 8);
}

static void kv_alignment_u64(gguf_craft *c)
{
    gguf_craft_str(c, "general.alignment");
    gguf_craft_u32(c, GGUF_VTYPE_UINT64);
    gguf_craft_u64(c, 32);
}

static void test_bad_kvs(void)
{
    struct {
        void (*fn)(gguf_craft *);
        const char *needle;
    } cases[] = {
        {kv_huge_string, "string length"},  {kv_huge_array, "huge.arr"},
        {kv_huge_str_array, "huge.strs"},   {kv_huge_key, "string length"},
        {kv_array_of_arrays, "nested"},     {kv_unknown_type, "unknown value type 13"},
        {kv_unknown_elem_type, "weird.arr"}, {kv_dup_key, "duplicate key 'qwen35.block_count'"},
        {kv_empty_key, "empty KV key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        spec s = baseline();
        s.extra_kvs = cases[i].fn;
        s.n_extra_kvs = 1;
        expect_fail(&s, STATUS_FORMAT, cases[i].needle, cases[i].needle);
    }
}

static void test_bad_alignment(void)
{
    spec s = baseline();
    s.alignment = 0;
    expect_fail(&s, STATUS_FORMAT, "power of two", "alignment 0");
    s.alignment = 48;
    expect_fail(&s, STATUS_FORMAT, "power of two", "alignment 48");
    s = baseline();
    s.alignment_kv = false;
    s.extra_kvs = kv_alignment_u64;
    s.n_extra_kvs = 1;
    expect_fail(&s, STATUS_FORMAT, "expected u32", "alignment as u64");

    /* a valid alignment of 64 makes the baseline's offset 64 fine but 32 misaligned */
    s = baseline();
    s.alignment = 64;
    s.data_bytes = 64 + 34;
    gguf_craft c = {0};
    build(&s, &c);
    gguf_file *f;
    status st;
    CU_ASSERT_EQUAL(open_copy(c.p, c.n, &f, &st), STATUS_OK);
    gguf_craft_free(&c);
    s.t[1].offset = 32;
    expect_fail(&s, STATUS_FORMAT, "not a multiple of the alignment 64", "offset 32 at align 64");
}

static void test_bad_tensor_infos(void)
{
    spec s = baseline();
    s.t[1].n_dims = 5;
    s.t[1].ne[1] = s.t[1].ne[2] = s.t[1].ne[3] = s.t[1].ne[4] = 1;
    expect_fail(&s, STATUS_FORMAT, "n_dims 5", "n_dims 5");

    s = baseline();
    s.t[0].n_dims = 0;
    expect_fail(&s, STATUS_FORMAT, "n_dims 0", "n_dims 0");

    s = baseline();
    s.t[0].ne[1] = 0;
    expect_fail(&s, STATUS_FORMAT, "ne[1] = 0", "ne 0");

    s = baseline();
    s.t[0].ne[0] = 1ull << 63;
    expect_fail(&s, STATUS_FORMAT, "positive int64", "ne > INT64_MAX");

    s = baseline();
    s.t[0].ne[0] = 1ull << 32;
    s.t[0].ne[1] = 1ull << 32;
    expect_fail(&s, STATUS_FORMAT, "overflows", "element count overflow");

    s = baseline();
    s.t[1].type = 99;
    expect_fail(&s, STATUS_FORMAT, "unknown ggml type id 99", "type 99");
    s.t[1].type = 4; /* removed Q4_2 */
    expect_fail(&s, STATUS_FORMAT, "unknown ggml type id 4", "type 4");
    s.t[1].type = GGML_TYPE_MAX_ID;
    expect_fail(&s, STATUS_FORMAT, "unknown ggml type", "type MAX_ID");

    s = baseline();
    s.t[1].ne[0] = 33; /* Q8_0 blocks are 32 */
    expect_fail(&s, STATUS_FORMAT, "block size", "ne0 % block");

    s = baseline();
    s.t[1].offset = 68; /* misaligned */
    expect_fail(&s, STATUS_FORMAT, "w.q8': data offset 68 is not a multiple", "misaligned");

    s = baseline();
    s.t[1].offset = 32; /* overlaps w.f32 [0, 64) */
    s.data_bytes = 64 + 34;
    expect_fail(&s, STATUS_FORMAT, "overlaps", "overlap");

    s = baseline();
    s.t[0].offset = 64; /* both at 64: overlap regardless of order */
    s.t[1].offset = 64;
    s.data_bytes = 128 + 34;
    expect_fail(&s, STATUS_FORMAT, "overlaps", "same offset");

    s = baseline();
    s.t[1].name = "w.f32";
    expect_fail(&s, STATUS_FORMAT, "duplicate tensor name 'w.f32'", "dup tensor");

    s = baseline();
    s.t[0].name = "";
    expect_fail(&s, STATUS_FORMAT, "empty tensor name", "empty name");

    s = baseline();
    s.data_bytes = 64 + 33; /* last tensor one byte short */
    expect_fail(&s, STATUS_FORMAT, "w.q8", "data past end");

    s = baseline();
    s.t[1].offset = 1ull << 63; /* start overflows with the data offset added */
    expect_fail(&s, STATUS_FORMAT, "beyond the end", "offset 2^63");
    s.t[1].offset = UINT64_MAX - 31;
    expect_fail(&s, STATUS_FORMAT, "beyond the end", "offset 2^64-32");

    s = baseline();
    s.t[0].ne[0] = 1ull << 62;  /* 2^62 × 4 bytes overflows u64 */
    s.t[0].ne[1] = 1;
    expect_fail(&s, STATUS_FORMAT, "byte size overflows", "n_bytes overflow");

    /* the data section must exist when there are tensors */
    s = baseline();
    s.no_pad = true;
    expect_fail(&s, STATUS_FORMAT, "past the end", "no data section");
}

static void test_open_errors(void)
{
    gguf_file *f;
    status st;
    CU_ASSERT_EQUAL(gguf_open(&f, "/nonexistent/x.gguf", &st), STATUS_NOT_FOUND);
    CU_ASSERT_PTR_NULL(f);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "/nonexistent/x.gguf"));
    CU_ASSERT_EQUAL(gguf_open(&f, "/", &st), STATUS_IO);
    CU_ASSERT_PTR_NULL(f);

    /* a file on disk that is bad: FORMAT with the path, through the mmap path */
    char path[512];
    gguf_craft_tmp_path(path, sizeof path, ".gguf");
    FILE *fp = fopen(path, "wb");
    CU_ASSERT_PTR_NOT_NULL_FATAL(fp);
    fwrite("GGUF\x03\0\0\0", 1, 8, fp);
    fclose(fp);
    CU_ASSERT_EQUAL(gguf_open(&f, path, &st), STATUS_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, path));
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "offset 8"));
    remove(path);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("gguf_hostile", NULL, NULL);
    CU_add_test(s, "baseline is valid (v3 and v2)", test_baseline_is_valid);
    CU_add_test(s, "truncated at every byte", test_truncated_everywhere);
    CU_add_test(s, "every bit flip of the header", test_bit_flips);
    CU_add_test(s, "magic and version (v1 rejected)", test_magic_and_version);
    CU_add_test(s, "huge counts", test_huge_counts);
    CU_add_test(s, "bad KVs", test_bad_kvs);
    CU_add_test(s, "bad alignment", test_bad_alignment);
    CU_add_test(s, "bad tensor infos", test_bad_tensor_infos);
    CU_add_test(s, "open errors", test_open_errors);
    return testutil_cunit_run();
}
