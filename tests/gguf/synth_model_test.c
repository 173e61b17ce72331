/* Synthetic models are usable: the tokenizer of a synth file round-trips text (model/tokenizer)
 * and compresses English, and the CPU reference forward over the tiny preset in every quant
 * gives finite, non-degenerate logits (model/forward). */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/synth.h"
#include "gguf/synth_vocab.h"
#include "model/forward.h"
#include "model/qwen35.h"
#include "model/tokenizer.h"
#include "tests/testutil/testutil.h"

static void tmp_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/synth_model_test_%d_%s", testutil_tmp_dir(), (int)getpid(), name);
}

static const char *const texts[] = {
    "Hello world! The model said that it would go back to the house.",
    "  indented\n\n\tcode(); // comment\nreturn x == 1 ? 'a' : \"b\";\n",
    "h\xC3\xA9llo \xE2\x80\x94 w\xC3\xB6rld \xE4\xBD\xA0\xE5\xA5\xBD 12345 \xF0\x9F\x98\x80",
    "<|im_start|>user\nWhat is the time?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>",
};

/* Encodes and decodes every text; returns how many ids English text 0 took. */
static size_t round_trip(const tokenizer *tk)
{
    size_t n_english = 0;
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids = NULL;
        size_t n = 0, len = 0;
        char *back = NULL;
        status st;
        CU_ASSERT_EQUAL_FATAL(tokenizer_encode(tk, texts[i], strlen(texts[i]), &ids, &n, &st),
                              0);
        CU_ASSERT_EQUAL(tokenizer_decode(tk, ids, n, &back, &len, &st), 0);
        CU_ASSERT_TRUE(back && len == strlen(texts[i]) && !memcmp(back, texts[i], len));
        if (i == 0) n_english = n;
        if (i == 3) { /* special tokens matched as themselves */
            CU_ASSERT_TRUE(n > 0 && ids[0] == tokenizer_im_start_id(tk));
        }
        free(ids);
        free(back);
    }
    return n_english;
}

/* The tiny file's tokenizer as the engine loads it. */
static void test_tokenizer_tiny_file(void)
{
    char path[512];
    tmp_path(path, sizeof path, "tok.gguf");
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_Q8_0,
                       .seed = 1};
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_write(path, &o, NULL, &st), 0);
    tokenizer *tk = NULL;
    int rc = tokenizer_load_path(&tk, path, &st);
    if (rc) printf("\n  %s\n", st.msg);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(tokenizer_n_vocab(tk), 2048u);
    CU_ASSERT_EQUAL(tokenizer_eos_id(tk), tokenizer_im_end_id(tk));
    CU_ASSERT_TRUE(tokenizer_is_eog(tk, tokenizer_endoftext_id(tk)));
    size_t n = round_trip(tk);
    /* merges of common words: clearly fewer ids than bytes */
    CU_ASSERT_TRUE(n > 0 && n < strlen(texts[0]) * 2 / 3);
    tokenizer_destroy(tk);
    unlink(path);
}

/* The 248320-token vocabulary of the real presets, without writing a file. */
static void test_tokenizer_real_vocab(void)
{
    synth_vocab v;
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_vocab_build(&v, 248320, &st), 0);
    tokenizer_text *toks = malloc(sizeof *toks * v.n_tokens);
    tokenizer_text *merges = malloc(sizeof *merges * v.n_merges);
    for (uint32_t i = 0; i < v.n_tokens; i++) toks[i] = (tokenizer_text){v.tokens[i], strlen(v.tokens[i])};
    for (uint32_t i = 0; i < v.n_merges; i++)
        merges[i] = (tokenizer_text){v.merges[i], strlen(v.merges[i])};
    tokenizer_spec spec = {.n_tokens = v.n_tokens, .tokens = toks, .token_types = v.types,
                           .n_merges = v.n_merges, .merges = merges,
                           .eos_id = (int32_t)v.im_end_id, .bos_id = (int32_t)v.endoftext_id,
                           .pre = TOKENIZER_PRE_QWEN35};
    tokenizer *tk = NULL;
    int rc = tokenizer_create(&tk, &spec, &st);
    if (rc) printf("\n  %s\n", st.msg);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(tokenizer_im_end_id(tk), 248046);
    CU_ASSERT_EQUAL(tokenizer_endoftext_id(tk), 248044);
    size_t n = round_trip(tk);
    CU_ASSERT_TRUE(n > 0 && n < strlen(texts[0]) / 2);
    tokenizer_destroy(tk);
    free(toks);
    free(merges);
    synth_vocab_free(&v);
}

/* Prefill a prompt and decode a few tokens greedily; logits must be finite and spread.
 * Returns the prompt's last logits (malloc'ed, [V]) when first != NULL. */
static void check_forward(synth_quant q, float **first)
{
    char path[512], name[32];
    snprintf(name, sizeof name, "fwd_%s.gguf", synth_quant_name(q));
    tmp_path(path, sizeof path, name);
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = q, .seed = 5};
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_write(path, &o, NULL, &st), 0);
    qwen35_model *m = NULL;
    int rc = qwen35_model_load(&m, path, &st);
    if (rc) printf("\n  %s: %s\n", synth_quant_name(q), st.msg);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(m->cfg.n_gdn_layers, 3);
    CU_ASSERT_EQUAL(m->cfg.n_attn_layers, 1);
    CU_ASSERT_TRUE(m->cfg.tied);
    qwen35_ctx *ctx = NULL;
    qwen35_state *s = NULL;
    qwen35_ctx_opts co = {.max_batch = 1, .n_threads = 2};
    CU_ASSERT_EQUAL_FATAL(qwen35_ctx_create(m, &co, &ctx, &st), 0);
    CU_ASSERT_EQUAL_FATAL(qwen35_state_create(m, 128, &s, &st), 0);
    int V = m->cfg.V;
    float *logits = malloc(sizeof *logits * (size_t)V);
    int32_t prompt[24];
    for (int i = 0; i < 24; i++) prompt[i] = (int32_t)((i * 263 + 11) % 2000);
    CU_ASSERT_EQUAL_FATAL(qwen35_prefill(ctx, s, prompt, 24, logits, false, &st), 0);
    if (first) {
        *first = malloc(sizeof **first * (size_t)V);
        memcpy(*first, logits, sizeof **first * (size_t)V);
    }
    int32_t prev_top = -1, n_distinct = 0;
    for (int step = 0; step < 8; step++) {
        double sum = 0, sum2 = 0, mx = -INFINITY, z = 0;
        int32_t top = 0;
        bool finite = true;
        for (int v = 0; v < V; v++) {
            finite &= isfinite(logits[v]) != 0;
            sum += logits[v];
            sum2 += (double)logits[v] * logits[v];
            if (logits[v] > mx) mx = logits[v], top = v;
        }
        for (int v = 0; v < V; v++) z += exp(logits[v] - mx);
        double mean = sum / V, sd = sqrt(sum2 / V - mean * mean), p_top = 1.0 / z;
        bool ok = finite && sd > 0.2 && sd < 50 && p_top < 0.99;
        CU_ASSERT(ok);
        if (!ok || step == 0)
            printf("\n  %s step %d: logits mean %.3f sd %.3f p_top %.4f finite %d",
                   synth_quant_name(q), step, mean, sd, p_top, finite);
        n_distinct += top != prev_top;
        prev_top = top;
        qwen35_state *states[1] = {s};
        CU_ASSERT_EQUAL_FATAL(qwen35_decode_batch(ctx, states, &top, 1, logits, &st), 0);
    }
    CU_ASSERT_TRUE(n_distinct >= 2); /* greedy decoding does not lock onto one token at once */
    free(logits);
    qwen35_state_destroy(s);
    qwen35_ctx_destroy(ctx);
    qwen35_model_free(m);
    unlink(path);
}

static void test_forward_q8_0(void) { check_forward(SYNTH_QUANT_Q8_0, NULL); }
static void test_forward_q4_k_m(void) { check_forward(SYNTH_QUANT_Q4_K_M, NULL); }

/* max |a - b| / max |a| */
static double rel_diff(const float *a, const float *b, int n)
{
    double d = 0, m = 0;
    for (int i = 0; i < n; i++) {
        if (fabs(a[i] - b[i]) > d) d = fabs(a[i] - b[i]);
        if (fabs(a[i]) > m) m = fabs(a[i]);
    }
    return m > 0 ? d / m : INFINITY;
}

/* f32, f16 and bf16 files hold the same values (rounded): their logits agree to the rounding,
 * which checks the conversions end to end; q8_0's are different random blocks and do not. */
static void test_forward_plain_types_agree(void)
{
    float *f32 = NULL, *f16 = NULL, *bf16 = NULL, *q8 = NULL;
    check_forward(SYNTH_QUANT_F32, &f32);
    check_forward(SYNTH_QUANT_F16, &f16);
    check_forward(SYNTH_QUANT_BF16, &bf16);
    check_forward(SYNTH_QUANT_Q8_0, &q8);
    CU_ASSERT_TRUE_FATAL(f32 && f16 && bf16 && q8);
    int V = synth_preset_find("tiny")->V;
    double d16 = rel_diff(f32, f16, V), dbf = rel_diff(f32, bf16, V), dq8 = rel_diff(f32, q8, V);
    printf("\n  max |dlogit| / max |logit| vs f32: f16 %.2e bf16 %.2e (q8_0 %.2e)", d16, dbf,
           dq8);
    CU_ASSERT(d16 < 1e-2);
    CU_ASSERT(dbf < 6e-2);
    CU_ASSERT(dq8 > 0.1); /* the comparison can fail: unrelated weights are far apart */
    free(f32);
    free(f16);
    free(bf16);
    free(q8);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("gguf/synth model", NULL, NULL);
    CU_add_test(s, "tiny file tokenizer round trip", test_tokenizer_tiny_file);
    CU_add_test(s, "248320 vocab tokenizer round trip", test_tokenizer_real_vocab);
    CU_add_test(s, "forward tiny f32/f16/bf16 agree", test_forward_plain_types_agree);
    CU_add_test(s, "forward tiny q8_0", test_forward_q8_0);
    CU_add_test(s, "forward tiny q4_k_m", test_forward_q4_k_m);
    return testutil_cunit_run();
}
