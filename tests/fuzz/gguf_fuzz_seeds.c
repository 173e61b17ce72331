/* Writes the seed corpus of the GGUF reader fuzzer into DIR:
 *   gguf_fuzz_seeds DIR [REFERENCE_DIR]
 * valid small files from our writer (every KV type, every supported tensor type, alignment 32
 * and 64, v2, empty), the header region of each reference model, and broken variants:
 * truncations, bit flips, huge counts, misaligned and overlapping tensor offsets, duplicate
 * keys and tensor names, bad alignment, n_dims 5, unknown types, v1, arrays of arrays. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/gguf_writer.h"
#include "gguf/quant.h"
#include "tests/gguf/gguf_craft.h"
#include "tests/testutil/testutil.h"

static const char *g_dir;
static int g_count;

static void save(const char *name, const uint8_t *p, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "gguf_fuzz_seeds: cannot write %s\n", path);
        exit(1);
    }
    g_count++;
}

/* A small valid file from our writer, read back into memory. */
static uint8_t *writer_file(uint32_t alignment, bool with_tensors, size_t *n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/.tmp.gguf", g_dir);
    gguf_writer *w;
    status st;
    if (gguf_writer_create(&w, path, &st)) goto fail;
    static const int32_t sec[4] = {3, 3, 2, 0};
    static const double f64s[2] = {1.5, -2.0};
    static const char *const toks[4] = {"a", "", "\xc4\xa0the", "<|im_end|>"};
    uint8_t u8 = 9;
    int16_t i16 = -3;
    int64_t i64 = -5;
    gguf_writer_set_str(w, "general.architecture", "qwen35");
    gguf_writer_set_u32(w, "general.file_type", 15);
    if (alignment) gguf_writer_set_u32(w, "general.alignment", alignment);
    gguf_writer_set_u32(w, "qwen35.block_count", 4);
    gguf_writer_set_f32(w, "qwen35.rope.freq_base", 1e7f);
    gguf_writer_set_arr(w, "qwen35.rope.dimension_sections", GGUF_VTYPE_INT32, sec, 4);
    gguf_writer_set_val(w, "x.u8", GGUF_VTYPE_UINT8, &u8);
    gguf_writer_set_val(w, "x.i16", GGUF_VTYPE_INT16, &i16);
    gguf_writer_set_val(w, "x.i64", GGUF_VTYPE_INT64, &i64);
    gguf_writer_set_u64(w, "x.u64", 1ull << 40);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    gguf_writer_set_arr(w, "x.f64s", GGUF_VTYPE_FLOAT64, f64s, 2);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
    static const struct { const char *name; uint32_t type; uint32_t n_dims; uint64_t ne[2]; } ts[] = {
        {"token_embd.weight", GGML_TYPE_F32, 2, {4, 4}}, {"a.f16", GGML_TYPE_F16, 1, {3}},
        {"a.bf16", GGML_TYPE_BF16, 1, {2}},              {"a.q8_0", GGML_TYPE_Q8_0, 1, {32}},
        {"a.q4_K", GGML_TYPE_Q4_K, 1, {256}},            {"a.q5_K", GGML_TYPE_Q5_K, 1, {256}},
        {"a.q6_K", GGML_TYPE_Q6_K, 1, {256}},
    };
    size_t n_t = with_tensors ? sizeof ts / sizeof ts[0] : 0;
    for (size_t i = 0; i < n_t; i++) gguf_writer_add_tensor(w, ts[i].name, ts[i].n_dims, ts[i].ne, ts[i].type);
    if (gguf_writer_begin_data(w, &st)) goto fail;
    for (size_t i = 0; i < n_t; i++) {
        uint64_t nb = gguf_writer_tensor_bytes(w, (int)i);
        uint8_t *d = calloc(nb, 1);
        for (uint64_t k = 0; k < nb; k++) d[k] = (uint8_t)(k * 13 + i);
        int rc = gguf_writer_write_data(w, d, nb, &st);
        free(d);
        if (rc) goto fail;
    }
    if (gguf_writer_finish(w, &st)) goto fail;
    gguf_writer_destroy(w);
    uint8_t *p = (uint8_t *)testutil_read_file(path, n);
    unlink(path);
    if (p) return p;
fail:
    fprintf(stderr, "gguf_fuzz_seeds: writer: %s\n", st.msg);
    exit(1);
}

/* Crafted files with one thing broken. kind selects what. */
static void crafted(const char *name, int kind)
{
    gguf_craft c = {0};
    uint64_t ne2[2] = {8, 2}, ne1[1] = {32}, ne5[5] = {32, 1, 1, 1, 1};
    int n_kv = 3 + (kind == 1) + (kind == 4 || kind == 5 || kind == 9);
    gguf_craft_header(&c, kind == 8 ? 1 : 3, kind == 2 ? 3 : 2, (uint64_t)n_kv);
    gguf_craft_kv_u32(&c, "general.alignment", kind == 5 ? 48 : 32);
    gguf_craft_kv_str(&c, "general.architecture", "qwen35");
    gguf_craft_kv_u32(&c, "qwen35.block_count", 4);
    if (kind == 1) gguf_craft_kv_u32(&c, "qwen35.block_count", 5); /* duplicate key */
    if (kind == 4) {                                                /* array of arrays */
        gguf_craft_str(&c, "nested");
        gguf_craft_u32(&c, GGUF_VTYPE_ARRAY);
        gguf_craft_u32(&c, GGUF_VTYPE_ARRAY);
        gguf_craft_u64(&c, 0);
    }
    if (kind == 5 || kind == 9) {                                   /* huge string array */
        gguf_craft_str(&c, "tokenizer.ggml.merges");
        gguf_craft_u32(&c, GGUF_VTYPE_ARRAY);
        gguf_craft_u32(&c, GGUF_VTYPE_STRING);
        gguf_craft_u64(&c, kind == 9 ? (1ull << 62) : 1);
        gguf_craft_str(&c, "a b");
    }
    gguf_craft_tensor(&c, "w.f32", 2, ne2, GGML_TYPE_F32, 0);
    uint64_t off1 = kind == 6 ? 68 : kind == 7 ? 32 : 64; /* misaligned / overlapping */
    if (kind == 3)
        gguf_craft_tensor(&c, "w.f32", 1, ne1, GGML_TYPE_Q8_0, off1); /* duplicate name */
    else if (kind == 10)
        gguf_craft_tensor(&c, "w.q8", 5, ne5, GGML_TYPE_Q8_0, off1);  /* n_dims 5 */
    else
        gguf_craft_tensor(&c, "w.q8", 1, ne1, kind == 11 ? 99 : GGML_TYPE_Q8_0, off1);
    if (kind == 2) gguf_craft_tensor(&c, "w.extra", 1, ne1, GGML_TYPE_F32, 128);
    gguf_craft_pad(&c, 32);
    for (int i = 0; i < 64 + 34 + (kind == 2 ? 128 : 0); i++) {
        uint8_t b = (uint8_t)(i * 5);
        gguf_craft_bytes(&c, &b, 1);
    }
    save(name, c.p, c.n);
    gguf_craft_free(&c);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: gguf_fuzz_seeds DIR [REFERENCE_DIR]\n");
        return 2;
    }
    g_dir = argv[1];
    size_t n;
    uint8_t *p;

    p = writer_file(0, true, &n);
    save("valid_all_types.gguf", p, n);
    for (int k = 1; k < 8; k++) { /* truncations */
        char name[64];
        snprintf(name, sizeof name, "trunc_%d.gguf", k);
        save(name, p, n * (size_t)k / 8);
    }
    srand(12345);
    for (int k = 0; k < 16; k++) { /* bit flips in the header region */
        char name[64];
        uint8_t *m = malloc(n);
        memcpy(m, p, n);
        size_t at = (size_t)rand() % (n / 2);
        m[at] ^= (uint8_t)(1u << (rand() % 8));
        snprintf(name, sizeof name, "flip_%02d.gguf", k);
        save(name, m, n);
        free(m);
    }
    { /* huge counts */
        uint8_t *m = malloc(n);
        memcpy(m, p, n);
        memset(m + 8, 0xff, 8);
        save("huge_tensor_count.gguf", m, n);
        memcpy(m, p, n);
        memset(m + 16, 0xff, 8);
        save("huge_kv_count.gguf", m, n);
        memcpy(m, p, n);
        m[4] = 2; /* v2: same layout */
        save("valid_v2.gguf", m, n);
        free(m);
    }
    free(p);
    p = writer_file(64, true, &n);
    save("valid_align64.gguf", p, n);
    free(p);
    p = writer_file(0, false, &n);
    save("valid_no_tensors.gguf", p, n);
    free(p);

    static const char *const kinds[] = {
        "crafted_ok.gguf", "dup_key.gguf", "three_tensors.gguf", "dup_tensor.gguf",
        "array_of_arrays.gguf", "bad_alignment.gguf", "misaligned.gguf", "overlap.gguf",
        "v1.gguf", "huge_string_array.gguf", "n_dims_5.gguf", "unknown_type.gguf",
    };
    for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++) crafted(kinds[k], k);

    /* the header region (KVs, tokenizer arrays, tensor infos) of each reference model */
    char ref[4096];
    if (argc > 2)
        snprintf(ref, sizeof ref, "%s", argv[2]);
    else
        testutil_reference_dir(ref, sizeof ref);
    static const char *const models[] = {"tiny-r1-untied", "tiny-r2-tied"};
    for (int m = 0; m < 2; m++) {
        char path[4200], name[128];
        snprintf(path, sizeof path, "%s/%s.gguf", ref, models[m]);
        gguf_file *f;
        status st;
        if (gguf_open(&f, path, &st) != STATUS_OK) {
            fprintf(stderr, "gguf_fuzz_seeds: skipping %s (%s)\n", models[m], st.msg);
            continue;
        }
        snprintf(name, sizeof name, "ref_header_%s.gguf", models[m]);
        save(name, f->map, (size_t)f->data_offset);
        gguf_close(f);
    }
    printf("gguf_fuzz_seeds: %d seeds in %s\n", g_count, g_dir);
    return 0;
}
