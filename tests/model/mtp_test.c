/* The MTP head on the CPU (model/mtp.h) over synthetic tiny models with an MTP block
 * (gguf synth --mtp): shapes and finiteness, determinism, rows giving the same bits however they
 * are split into calls, drafting as the chain of single rows (docs/QWEN35.md §2.8), rollback
 * redoing the same drafts, every weight type of the synth (f32, f16, q8_0, q4_k_m), argument
 * errors, and no allocation while drafting. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/quant.h"
#include "gguf/synth.h"
#include "model/forward.h"
#include "model/mtp.h"
#include "tests/testutil/alloc_count.h"
#include "tests/testutil/testutil.h"

#define T 12
#define K 4

static char path_f32[512], path_plain[512];

static void write_synth(char *path, size_t cap, const char *name, synth_quant q, bool mtp)
{
    snprintf(path, cap, "%s/mtp_test_%d_%s.gguf", testutil_tmp_dir(), (int)getpid(), name);
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = q, .seed = 7, .mtp = mtp,
                       .n_threads = 2};
    status st;
    if (synth_write(path, &o, NULL, &st)) fprintf(stderr, "synth: %s\n", st.msg);
}

static int setup(void)
{
    write_synth(path_f32, sizeof path_f32, "f32", SYNTH_QUANT_F32, true);
    write_synth(path_plain, sizeof path_plain, "plain", SYNTH_QUANT_F32, false);
    return 0;
}

static int teardown(void)
{
    unlink(path_f32);
    unlink(path_plain);
    return 0;
}

static int32_t argmax(const float *x, int n)
{
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* A model, ctx and the main pass over a fixed prompt: h [T][H] and the pair tokens
 * prompt[1..T-1], next (the greedy token after the prompt). */
typedef struct fixture {
    qwen35_model *m;
    qwen35_ctx *ctx;
    int H, V;
    float *h, *lg;
    int32_t prompt[T], pairs[T];
} fixture;

static void fixture_open(fixture *f, const char *path, int max_tokens)
{
    memset(f, 0, sizeof *f);
    status st;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&f->m, path, &st), 0);
    CU_ASSERT_FATAL(f->m->mtp.present);
    CU_ASSERT_EQUAL_FATAL(qwen35_ctx_create(f->m, &(qwen35_ctx_opts){.max_tokens = max_tokens, .n_threads = 2,
                                                                      .gdn_mode = QWEN35_GDN_RECURRENT},
                                            &f->ctx, &st), 0);
    f->H = f->m->cfg.H, f->V = f->m->cfg.V;
    f->h = malloc(sizeof(float) * T * f->H);
    f->lg = malloc(sizeof(float) * f->V);
    for (int i = 0; i < T; i++) f->prompt[i] = (int32_t)((i * 37 + 11) % f->V);
    qwen35_state *s;
    CU_ASSERT_EQUAL_FATAL(qwen35_state_create(f->m, 64, &s, &st), 0);
    CU_ASSERT_EQUAL_FATAL(qwen35_prefill_hidden(f->ctx, s, f->prompt, T, f->lg, false, f->h, &st), 0);
    qwen35_state_destroy(s);
    for (int i = 0; i + 1 < T; i++) f->pairs[i] = f->prompt[i + 1];
    f->pairs[T - 1] = argmax(f->lg, f->V);
}

static void fixture_close(fixture *f)
{
    qwen35_ctx_destroy(f->ctx);
    qwen35_model_free(f->m);
    free(f->h), free(f->lg);
}

/* The h of qwen35_prefill_hidden is the lm_head's input: W_out · h gives the logits. */
static void test_hidden_is_head_input(void)
{
    fixture f;
    fixture_open(&f, path_f32, 0);
    const qwen35_mat *w = &f.m->output;
    const float *row = f.h + (long)(T - 1) * f.H;
    float maxdiff = 0;
    for (int v = 0; v < f.V; v++) {
        const float *wr = (const float *)((const uint8_t *)w->data + (uint64_t)v * w->row_bytes);
        double acc = 0;
        for (int i = 0; i < f.H; i++) acc += (double)wr[i] * row[i];
        float d = fabsf((float)acc - f.lg[v]);
        if (d > maxdiff) maxdiff = d;
    }
    CU_ASSERT(maxdiff < 1e-3f);
    fixture_close(&f);
}

/* All T rows in one call: finite logits and g, n_past T; a second state gives the same bits;
 * the rows one call each, and in chunks of 5 (max_tokens), give the same bits. */
static void test_rows_split_and_determinism(void)
{
    fixture f;
    fixture_open(&f, path_f32, 5);
    status st;
    qwen35_mtp_state *a, *b;
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_state_create(f.m, 64, &a, &st), 0);
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_state_create(f.m, 64, &b, &st), 0);
    float *la = malloc(sizeof(float) * T * f.V), *lb = malloc(sizeof(float) * T * f.V);
    float *ga = malloc(sizeof(float) * T * f.H), *gb = malloc(sizeof(float) * T * f.H);
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_step(f.ctx, a, f.h, f.pairs, T, la, ga, &st), 0);
    CU_ASSERT_EQUAL(a->n_past, T);
    bool finite = true;
    for (long i = 0; i < (long)T * f.V; i++) finite &= isfinite(la[i]) != 0;
    for (long i = 0; i < (long)T * f.H; i++) finite &= isfinite(ga[i]) != 0;
    CU_ASSERT(finite);
    /* rows differ from each other (not a constant output) */
    CU_ASSERT(memcmp(la, la + f.V, sizeof(float) * f.V) != 0);
    for (int r = 0; r < T; r++)
        CU_ASSERT_EQUAL_FATAL(qwen35_mtp_step(f.ctx, b, f.h + (long)r * f.H, f.pairs + r, 1,
                                              lb + (long)r * f.V, gb + (long)r * f.H, &st), 0);
    CU_ASSERT_EQUAL(memcmp(la, lb, sizeof(float) * T * f.V), 0);
    CU_ASSERT_EQUAL(memcmp(ga, gb, sizeof(float) * T * f.H), 0);
    qwen35_mtp_state_reset(b);
    memset(lb, 0, sizeof(float) * T * f.V);
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_step(f.ctx, b, f.h, f.pairs, T, lb, NULL, &st), 0);
    CU_ASSERT_EQUAL(memcmp(la, lb, sizeof(float) * T * f.V), 0);
    free(la), free(lb), free(ga), free(gb);
    qwen35_mtp_state_destroy(a);
    qwen35_mtp_state_destroy(b);
    fixture_close(&f);
}

/* Drafting k tokens is the chain of single rows: (h, next) then (g, draft) at the next
 * positions; truncating back and drafting again gives the same drafts; no allocation. */
static void test_draft_chain_and_rollback(void)
{
    fixture f;
    fixture_open(&f, path_f32, 0);
    status st;
    qwen35_mtp_state *a, *b;
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_state_create(f.m, 64, &a, &st), 0);
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_state_create(f.m, 64, &b, &st), 0);
    /* the prompt's first T-1 pairs, then the drafts from (h_{T-1}, next) */
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_step(f.ctx, a, f.h, f.pairs, T - 1, NULL, NULL, &st), 0);
    int32_t d[K], d2[K];
    long before = testutil_allocs();
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_draft(f.ctx, a, f.h + (long)(T - 1) * f.H, f.pairs[T - 1], K, d, &st), 0);
    CU_ASSERT_EQUAL(testutil_allocs(), before);
    CU_ASSERT_EQUAL(a->n_past, T - 1 + K);
    for (int i = 0; i < K; i++) CU_ASSERT(d[i] >= 0 && d[i] < f.V);
    /* by hand on b */
    float *lg = malloc(sizeof(float) * f.V), *g = malloc(sizeof(float) * f.H * 2);
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_step(f.ctx, b, f.h, f.pairs, T - 1, NULL, NULL, &st), 0);
    const float *hin = f.h + (long)(T - 1) * f.H;
    int32_t tok = f.pairs[T - 1];
    for (int i = 0; i < K; i++) {
        float *gi = g + (i & 1) * f.H;
        CU_ASSERT_EQUAL_FATAL(qwen35_mtp_step(f.ctx, b, hin, &tok, 1, lg, gi, &st), 0);
        tok = argmax(lg, f.V);
        CU_ASSERT_EQUAL(tok, d[i]);
        hin = gi;
    }
    /* rollback to the prompt's pairs and draft again */
    qwen35_mtp_truncate(a, T - 1);
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_draft(f.ctx, a, f.h + (long)(T - 1) * f.H, f.pairs[T - 1], K, d2, &st), 0);
    CU_ASSERT_EQUAL(memcmp(d, d2, sizeof d), 0);
    free(lg), free(g);
    qwen35_mtp_state_destroy(a);
    qwen35_mtp_state_destroy(b);
    fixture_close(&f);
}

/* Every weight type of the synth: loads, runs, finite logits; the quantised heads stay near
 * the F32 one's ranking in the sense that logits are finite and not constant. */
static void test_weight_types(void)
{
    const synth_quant qs[] = {SYNTH_QUANT_F16, SYNTH_QUANT_Q8_0, SYNTH_QUANT_Q4_K_M};
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++) {
        char path[512];
        write_synth(path, sizeof path, synth_quant_name(qs[i]), qs[i], true);
        fixture f;
        fixture_open(&f, path, 0);
        if (qs[i] == SYNTH_QUANT_Q4_K_M) CU_ASSERT_EQUAL(f.m->mtp.eh_proj.type, GGML_TYPE_Q4_K);
        if (qs[i] == SYNTH_QUANT_Q8_0) CU_ASSERT_EQUAL(f.m->mtp.layer.q.type, GGML_TYPE_Q8_0);
        status st;
        qwen35_mtp_state *a;
        CU_ASSERT_EQUAL_FATAL(qwen35_mtp_state_create(f.m, 64, &a, &st), 0);
        float *lg = malloc(sizeof(float) * T * f.V);
        CU_ASSERT_EQUAL(qwen35_mtp_step(f.ctx, a, f.h, f.pairs, T, lg, NULL, &st), 0);
        bool finite = true, varied = false;
        for (long j = 0; j < (long)T * f.V; j++) finite &= isfinite(lg[j]) != 0, varied |= lg[j] != lg[0];
        CU_ASSERT(finite && varied);
        free(lg);
        qwen35_mtp_state_destroy(a);
        fixture_close(&f);
        unlink(path);
    }
}

static void test_errors(void)
{
    fixture f;
    fixture_open(&f, path_f32, 0);
    status st;
    qwen35_mtp_state *a;
    CU_ASSERT_EQUAL_FATAL(qwen35_mtp_state_create(f.m, T, &a, &st), 0);
    int32_t bad[2] = {1, f.V};
    CU_ASSERT_EQUAL(qwen35_mtp_step(f.ctx, a, f.h, bad, 2, NULL, NULL, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "index 1"));
    CU_ASSERT_EQUAL(qwen35_mtp_step(f.ctx, a, f.h, bad, 0, NULL, NULL, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(a->n_past, 0);
    CU_ASSERT_EQUAL(qwen35_mtp_step(f.ctx, a, f.h, f.pairs, T - 1, NULL, NULL, &st), 0);
    int32_t d[K];
    CU_ASSERT_EQUAL(qwen35_mtp_draft(f.ctx, a, f.h, 1, K, d, &st), STATUS_RANGE); /* 11 + 4 > 12 */
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "context of 12"));
    CU_ASSERT_EQUAL(qwen35_mtp_draft(f.ctx, a, f.h, -1, 1, d, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(qwen35_mtp_draft(f.ctx, a, f.h, 1, 0, d, &st), STATUS_INVALID);
    CU_ASSERT_EQUAL(a->n_past, T - 1);
    qwen35_mtp_state *zero = NULL;
    CU_ASSERT_EQUAL(qwen35_mtp_state_create(f.m, 0, &zero, &st), STATUS_INVALID);
    CU_ASSERT_PTR_NULL(zero);
    qwen35_mtp_state_destroy(a);
    fixture_close(&f);
    /* a model without an MTP head */
    qwen35_model *m;
    CU_ASSERT_EQUAL_FATAL(qwen35_model_load(&m, path_plain, &st), 0);
    CU_ASSERT(!m->mtp.present);
    qwen35_mtp_state *none = NULL;
    CU_ASSERT_EQUAL(qwen35_mtp_state_create(m, 16, &none, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "no MTP head"));
    CU_ASSERT_PTR_NULL(none);
    qwen35_model_free(m);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("mtp", setup, teardown);
    CU_add_test(s, "hidden_is_head_input", test_hidden_is_head_input);
    CU_add_test(s, "rows_split_and_determinism", test_rows_split_and_determinism);
    CU_add_test(s, "draft_chain_and_rollback", test_draft_chain_and_rollback);
    CU_add_test(s, "weight_types", test_weight_types);
    CU_add_test(s, "errors", test_errors);
    return testutil_cunit_run();
}
