/* A real-size synthetic file: 0.8b q4_k_m written to $TEST_TMPDIR, read back with our reader,
 * its size checked against docs/QWEN35.md §4.3 (0.52 GB of tensors + the tokenizer), then deleted. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "gguf/synth.h"
#include "tests/testutil/testutil.h"

static void test_0_8b_q4_k_m(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/synth_file_test_%d.gguf", testutil_tmp_dir(), (int)getpid());
    synth_options o = {.preset = synth_preset_find("0.8b"), .quant = SYNTH_QUANT_Q4_K_M,
                       .seed = 1};
    synth_stats s;
    status st;
    int rc = synth_write(path, &o, &s, &st);
    if (rc) printf("\n  %s\n", st.msg);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    printf("\n  0.8b q4_k_m: %llu bytes in %.2f s (%.2f GB/s, %d threads)",
           (unsigned long long)s.n_bytes, s.seconds, (double)s.n_bytes / s.seconds / 1e9,
           s.n_threads);

    gguf_file *f = NULL;
    rc = gguf_open(&f, path, &st);
    if (rc) printf("\n  %s\n", st.msg);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(f->n_tensors, 320u);
    CU_ASSERT_EQUAL(f->size, s.n_bytes);
    double data_gb = (double)(f->size - f->data_offset) / 1e9;
    CU_ASSERT(fabs(data_gb - 0.52) < 0.52 * 0.02);   /* §4.3: 0.52 GB of tensors */
    CU_ASSERT(f->data_offset > 4000000);             /* the 248320-token tokenizer is there */
    CU_ASSERT(f->data_offset < 12000000);            /* §4.3: metadata about 10 MB */
    CU_ASSERT((double)f->size / 1e9 < 0.52 * 1.03 + 0.012);
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    CU_ASSERT_TRUE(toks && toks->n == 248320);
    const gguf_tensor *e = gguf_find_tensor(f, "token_embd.weight");
    CU_ASSERT_TRUE_FATAL(e != NULL);
    CU_ASSERT_EQUAL(e->type, GGML_TYPE_Q6_K);
    CU_ASSERT_EQUAL(e->ne[0], 1024u);
    CU_ASSERT_EQUAL(e->ne[1], 248320u);
    /* the last row of the last tensor and of the embedding are real data, not a hole */
    const quant_traits *qt = quant_get(e->type);
    float row[1024];
    qt->dequant((const uint8_t *)e->data + e->n_bytes - quant_row_bytes(e->type, 1024), row,
                1024);
    double s2 = 0;
    for (int i = 0; i < 1024; i++) s2 += (double)row[i] * row[i];
    CU_ASSERT(sqrt(s2 / 1024) > 0.02 && sqrt(s2 / 1024) < 0.05); /* sigma = 1/32 */
    const gguf_tensor *last = &f->tensors[f->n_tensors - 1];
    const uint8_t *tail = (const uint8_t *)last->data + last->n_bytes - 64;
    int nonzero = 0;
    for (int i = 0; i < 64; i++) nonzero += tail[i] != 0;
    CU_ASSERT(nonzero > 32);
    gguf_close(f);
    unlink(path);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("gguf/synth 0.8b file", NULL, NULL);
    CU_add_test(s, "0.8b q4_k_m size and read back", test_0_8b_q4_k_m);
    return testutil_cunit_run();
}
