/* Reads the shared reference models (shared/reference, Hugging Face exports in llama.cpp's
 * qwen35 layout; without the shared folder the repository's own equivalents own-r1-untied and
 * own-r2-tied of tests/reference, same shapes and counts: ref_case_resolve): architecture, hyperparameters, tokenizer arrays, every tensor's size and
 * place; and a truncation sweep over the real header region (every byte offset). */
#include <CUnit/Basic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "tests/gguf/gguf_craft.h"
#include "tests/model/ref_cases.h"
#include "tests/testutil/testutil.h"

typedef struct ref_expect {
    const char *name;
    uint64_t n_tensors;
    uint32_t n_layer, vocab, n_merges;
    bool tied;
} ref_expect;

/* From shared/reference/README.md (and the files' own metadata). */
static const ref_expect k_refs[] = {
    {"tiny-r1-untied", 109, 8, 773, 512, false},
    {"tiny-r2-tied", 55, 4, 1029, 768, true},
};

static void ref_path(char *out, size_t cap, const char *name)
{
    ref_case_resolve_path(name, ".gguf", out, cap);
}

static void check_model(const ref_expect *rc)
{
    char path[PATH_MAX + 64];
    gguf_file *f;
    status st;
    ref_path(path, sizeof path, rc->name);
    int r = gguf_open(&f, path, &st);
    if (r) fprintf(stderr, "\n  %s (set DS_REFERENCE_DIR?)\n", st.msg);
    CU_ASSERT_EQUAL_FATAL(r, STATUS_OK);

    gguf_str s;
    uint32_t u;
    float eps;
    CU_ASSERT_EQUAL(f->version, 3);
    CU_ASSERT_EQUAL(f->n_tensors, rc->n_tensors);
    CU_ASSERT_EQUAL(gguf_get_str(f, "general.architecture", &s, &st), STATUS_OK);
    CU_ASSERT_TRUE(gguf_str_eq(s, "qwen35"));
    CU_ASSERT_EQUAL(gguf_get_u32(f, "qwen35.block_count", &u, &st), STATUS_OK);
    CU_ASSERT_EQUAL(u, rc->n_layer);
    CU_ASSERT_EQUAL(gguf_get_u32(f, "qwen35.embedding_length", &u, &st), STATUS_OK);
    CU_ASSERT_EQUAL(u, 256);
    CU_ASSERT_EQUAL(gguf_get_f32(f, "qwen35.attention.layer_norm_rms_epsilon", &eps, &st), 0);
    CU_ASSERT_TRUE(eps > 0 && eps < 1e-3f);
    CU_ASSERT_EQUAL(gguf_get_str(f, "tokenizer.ggml.pre", &s, &st), STATUS_OK);
    CU_ASSERT_TRUE(gguf_str_eq(s, "qwen35"));

    const gguf_kv *kv = gguf_find_kv(f, "qwen35.rope.dimension_sections");
    CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
    int64_t sec[4];
    for (int i = 0; i < 4; i++) CU_ASSERT_EQUAL(gguf_kv_get_int(kv, (uint64_t)i, &sec[i]), 0);
    CU_ASSERT_TRUE(sec[0] == 3 && sec[1] == 3 && sec[2] == 2 && sec[3] == 0);

    kv = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
    CU_ASSERT_EQUAL(kv->arr_type, GGUF_VTYPE_STRING);
    CU_ASSERT_EQUAL(kv->n, rc->vocab);
    CU_ASSERT_TRUE(gguf_str_eq(kv->strs[kv->n - 1], "</think>")); /* specials at the end */
    kv = gguf_find_kv(f, "tokenizer.ggml.merges");
    CU_ASSERT_PTR_NOT_NULL_FATAL(kv);
    CU_ASSERT_EQUAL(kv->n, rc->n_merges);

    const gguf_tensor *t = gguf_find_tensor(f, "token_embd.weight");
    CU_ASSERT_PTR_NOT_NULL_FATAL(t);
    CU_ASSERT_EQUAL(t->n_dims, 2);
    CU_ASSERT_EQUAL(t->ne[0], 256);
    CU_ASSERT_EQUAL(t->ne[1], rc->vocab);
    CU_ASSERT_EQUAL(t->type, GGML_TYPE_F32);
    CU_ASSERT_EQUAL(gguf_find_tensor(f, "output.weight") == NULL, rc->tied);
    CU_ASSERT_PTR_NOT_NULL(gguf_find_tensor(f, "blk.3.attn_q.weight"));
    CU_ASSERT_PTR_NOT_NULL(gguf_find_tensor(f, "blk.0.ssm_a"));

    /* every tensor is found by its name, lies inside the file, and the total adds up */
    uint64_t total = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *ti = &f->tensors[i];
        char name[128];
        CU_ASSERT_FATAL(ti->name.len < sizeof name);
        memcpy(name, ti->name.ptr, ti->name.len);
        name[ti->name.len] = '\0';
        CU_ASSERT_PTR_EQUAL(gguf_find_tensor(f, name), ti);
        CU_ASSERT_TRUE((const uint8_t *)ti->data + ti->n_bytes <= f->map + f->size);
        CU_ASSERT_EQUAL(ti->type, GGML_TYPE_F32);
        total += ti->n_bytes;
    }
    CU_ASSERT_TRUE(f->data_offset + total <= f->size);
    CU_ASSERT_TRUE(f->size - (f->data_offset + total) < 32 * f->n_tensors); /* only padding */

    /* ssm_a = -exp(A_log) < 0: the data pointer really points at the values */
    t = gguf_find_tensor(f, "blk.0.ssm_a");
    float a0;
    memcpy(&a0, t->data, 4);
    CU_ASSERT_TRUE(a0 < 0);
    gguf_close(f);
}

static void test_tiny_r1_untied(void) { check_model(&k_refs[0]); }
static void test_tiny_r2_tied(void) { check_model(&k_refs[1]); }

/* Every truncation of the real header region fails cleanly with an offset. The buffer is the
 * whole file; only the size passed to the reader shrinks. */
static void test_reference_truncations(void)
{
    char path[PATH_MAX + 64];
    size_t n;
    ref_path(path, sizeof path, k_refs[1].name);
    uint8_t *buf = (uint8_t *)testutil_read_file(path, &n);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    gguf_file *f;
    status st;
    CU_ASSERT_EQUAL_FATAL(gguf_open_buffer(&f, buf, n, "ref", &st), STATUS_OK);
    uint64_t header_end = f->data_offset;
    gguf_close(f);
    int bad = 0;
    for (uint64_t len = 0; len < header_end; len += 1) {
        int rc = gguf_open_buffer(&f, buf, len, "ref", &st);
        if (rc != STATUS_FORMAT || !strstr(st.msg, "offset")) {
            if (bad++ < 5) fprintf(stderr, "\n  truncated at %llu: rc %d '%s'\n",
                                   (unsigned long long)len, rc, st.msg);
        }
    }
    CU_ASSERT_EQUAL(bad, 0);
    free(buf);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 2;
    CU_pSuite s = CU_add_suite("gguf_reference", NULL, NULL);
    CU_add_test(s, "tiny-r1-untied", test_tiny_r1_untied);
    CU_add_test(s, "tiny-r2-tied", test_tiny_r2_tied);
    CU_add_test(s, "truncations of a reference header", test_reference_truncations);
    return testutil_cunit_run();
}
