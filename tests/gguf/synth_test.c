/* gguf/synth: presets, tensor table and type mix against docs/QWEN35.md §1.4/§4/§5.3, the
 * vocabulary's invariants, the tiny preset in every quant read back with our reader, value
 * magnitudes, and byte-identical output for one seed whatever the threads and chunking. */
#include <CUnit/Basic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf/gguf.h"
#include "gguf/quant.h"
#include "gguf/synth.h"
#include "gguf/synth_vocab.h"
#include "tests/gguf/gguf_craft.h"
#include "tests/testutil/testutil.h"

static const char *const real_presets[] = {"0.8b", "2b", "4b", "9b", "27b"};

/* ---- presets and plan ------------------------------------------------------------- */

static void test_presets_match_spec(void)
{
    /* docs/QWEN35.md §4.2: H, L, F, n_h, n_kv, n_v, tied */
    static const struct {
        const char *name;
        int H, L, F, n_h, n_kv, n_v, tied;
    } want[] = {
        {"0.8b", 1024, 24, 3584, 8, 2, 16, 1}, {"2b", 2048, 24, 6144, 8, 2, 16, 1},
        {"4b", 2560, 32, 9216, 16, 4, 32, 1},  {"9b", 4096, 32, 12288, 16, 4, 32, 0},
        {"27b", 5120, 64, 17408, 24, 4, 48, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const synth_preset *p = synth_preset_find(want[i].name);
        CU_ASSERT_PTR_NOT_NULL_FATAL(p);
        CU_ASSERT_EQUAL(p->H, want[i].H);
        CU_ASSERT_EQUAL(p->n_layer, want[i].L);
        CU_ASSERT_EQUAL(p->F, want[i].F);
        CU_ASSERT_EQUAL(p->n_h, want[i].n_h);
        CU_ASSERT_EQUAL(p->n_kv, want[i].n_kv);
        CU_ASSERT_EQUAL(p->n_v, want[i].n_v);
        CU_ASSERT_EQUAL(p->tied, want[i].tied);
        CU_ASSERT_EQUAL(p->V, 248320);
        CU_ASSERT_EQUAL(p->d_h, 256);
        CU_ASSERT_EQUAL(p->n_k, 16);
        CU_ASSERT_EQUAL(p->d_k, 128);
        CU_ASSERT_EQUAL(p->d_v, 128);
        CU_ASSERT_EQUAL(p->n_rot, 64);
        CU_ASSERT_EQUAL(p->n_ctx_train, 262144u);
        CU_ASSERT_EQUAL(p->rope_sections[0], 11);
        CU_ASSERT_EQUAL(p->rope_sections[2], 10);
        CU_ASSERT_EQUAL(p->rope_sections[3], 0);
    }
    CU_ASSERT_PTR_NOT_NULL(synth_preset_find("tiny"));
    CU_ASSERT_PTR_NULL(synth_preset_find("3b"));
    CU_ASSERT_PTR_NULL(synth_preset_find(NULL));
    CU_ASSERT_EQUAL(synth_quant_parse("q4_k_m"), SYNTH_QUANT_Q4_K_M);
    CU_ASSERT_EQUAL(synth_quant_parse("Q4_K_M"), -1);
    CU_ASSERT_EQUAL(synth_quant_file_type(SYNTH_QUANT_Q4_K_M), 15u);
    CU_ASSERT_EQUAL(synth_quant_file_type(SYNTH_QUANT_BF16), 32u);
    CU_ASSERT_EQUAL(synth_quant_file_type(SYNTH_QUANT_Q8_0), 7u);
}

/* docs/QWEN35.md §1.4: 14 tensors per DeltaNet layer, 11 per attention layer, +2 (tied) or +3. */
static void test_plan_counts(void)
{
    static const int want[] = {320, 320, 426, 427, 851};
    for (int i = 0; i < 5; i++) {
        const synth_preset *p = synth_preset_find(real_presets[i]);
        int n_attn = 0, n_gdn = 0;
        for (int l = 0; l < p->n_layer; l++) {
            if (synth_layer_is_recurrent(p, l))
                n_gdn++;
            else
                n_attn++;
        }
        CU_ASSERT_EQUAL(n_attn, p->n_layer / 4);
        CU_ASSERT_FALSE(synth_layer_is_recurrent(p, 3));
        CU_ASSERT_TRUE(synth_layer_is_recurrent(p, 4));
        synth_tensor *t;
        int n;
        status st;
        CU_ASSERT_EQUAL_FATAL(synth_plan(p, SYNTH_QUANT_Q4_K_M, &t, &n, &st), 0);
        CU_ASSERT_EQUAL(n, 14 * n_gdn + 11 * n_attn + (p->tied ? 2 : 3));
        CU_ASSERT_EQUAL(n, want[i]);
        bool has_output = false;
        for (int k = 0; k < n; k++) has_output |= !strcmp(t[k].name, "output.weight");
        CU_ASSERT_EQUAL(has_output, !p->tied);
        free(t);
    }
}

/* Parameter counts of docs/QWEN35.md §4.2 (text only, no MTP): 0.752/1.882/4.206/8.954/26.896 B. */
static void test_plan_param_counts(void)
{
    static const double want[] = {0.752e9, 1.882e9, 4.206e9, 8.954e9, 26.896e9};
    for (int i = 0; i < 5; i++) {
        synth_tensor *t;
        int n;
        status st;
        CU_ASSERT_EQUAL_FATAL(
            synth_plan(synth_preset_find(real_presets[i]), SYNTH_QUANT_F32, &t, &n, &st), 0);
        double params = 0;
        for (int k = 0; k < n; k++) params += (double)t[k].ne[0] * (double)t[k].ne[1];
        CU_ASSERT(fabs(params - want[i]) < 0.0006e9);
        if (fabs(params - want[i]) >= 0.0006e9)
            printf("\n  %s: %.4f B params, spec %.3f B\n", real_presets[i], params / 1e9,
                   want[i] / 1e9);
        free(t);
    }
}

/* The MTP block (--mtp) of each real size: 15 tensors more, every one named blk.L.*, and the
 * parameter counts of docs/QWEN35.md §4.2's "MTP block" row (20.5/60.8/120.6/243.3/424.7 M). */
static void test_plan_mtp(void)
{
    static const double want[] = {20.5e6, 60.8e6, 120.6e6, 243.3e6, 424.7e6};
    for (int i = 0; i < 5; i++) {
        const synth_preset *p = synth_preset_find(real_presets[i]);
        synth_tensor *t, *tm;
        int n, nm;
        status st;
        CU_ASSERT_EQUAL_FATAL(synth_plan(p, SYNTH_QUANT_Q4_K_M, &t, &n, &st), 0);
        CU_ASSERT_EQUAL_FATAL(synth_plan_mtp(p, SYNTH_QUANT_Q4_K_M, true, &tm, &nm, &st), 0);
        CU_ASSERT_EQUAL(nm, n + 15);
        double params = 0;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "blk.%d.", p->n_layer);
        for (int k = n; k < nm; k++) {
            CU_ASSERT(!strncmp(tm[k].name, prefix, strlen(prefix)));
            params += (double)tm[k].ne[0] * (double)tm[k].ne[1];
        }
        CU_ASSERT(fabs(params - want[i]) < 0.06e6);
        if (fabs(params - want[i]) >= 0.06e6)
            printf("\n  %s: MTP %.2f M params, spec %.1f M\n", p->name, params / 1e6, want[i] / 1e6);
        CU_ASSERT_EQUAL(tm[nm - 4].kind, SYNTH_KIND_NEXTN_EH_PROJ);
        CU_ASSERT_EQUAL(tm[nm - 4].ne[0], 2 * (uint64_t)p->H);
        CU_ASSERT_EQUAL(tm[nm - 4].ne[1], (uint64_t)p->H);
        free(t), free(tm);
    }
}

/* Tensor data sizes against docs/QWEN35.md §4.3 (GB = 1e9, quoted to 2 decimals). */
static void test_plan_sizes(void)
{
    static const struct {
        synth_quant q;
        double gb[5];
    } want[] = {
        {SYNTH_QUANT_BF16, {1.51, 3.76, 8.41, 17.91, 53.80}},
        {SYNTH_QUANT_Q8_0, {0.80, 2.00, 4.47, 9.52, 28.58}},
        {SYNTH_QUANT_Q4_K_M, {0.52, 1.26, 2.70, 5.62, 16.54}},
    };
    for (size_t w = 0; w < 3; w++)
        for (int i = 0; i < 5; i++) {
            synth_tensor *t;
            int n;
            status st;
            CU_ASSERT_EQUAL_FATAL(
                synth_plan(synth_preset_find(real_presets[i]), want[w].q, &t, &n, &st), 0);
            double bytes = 0;
            for (int k = 0; k < n; k++) bytes += (double)t[k].n_bytes;
            double gb = bytes / 1e9;
            CU_ASSERT(fabs(gb - want[w].gb[i]) <= 0.0051 + 0.001 * want[w].gb[i]);
            if (fabs(gb - want[w].gb[i]) > 0.0051 + 0.001 * want[w].gb[i])
                printf("\n  %s %s: %.4f GB, spec %.2f GB\n", real_presets[i],
                       synth_quant_name(want[w].q), gb, want[w].gb[i]);
            free(t);
        }
}

/* ---- type mix (docs/QWEN35.md §5.3), checked per tensor from independent literal lists ---- */

static bool in_list(int x, const int *list, int n)
{
    for (int i = 0; i < n; i++)
        if (list[i] == x) return true;
    return false;
}

static bool is_1d_or_f32_kind(synth_kind k)
{
    return k == SYNTH_KIND_OUTPUT_NORM || k == SYNTH_KIND_ATTN_NORM ||
           k == SYNTH_KIND_POST_ATTN_NORM || k == SYNTH_KIND_SSM_CONV1D ||
           k == SYNTH_KIND_SSM_DT_BIAS || k == SYNTH_KIND_SSM_A || k == SYNTH_KIND_SSM_NORM ||
           k == SYNTH_KIND_ATTN_Q_NORM || k == SYNTH_KIND_ATTN_K_NORM;
}

/* more_bits: the layers whose attn_v/attn_qkv and ffn_down are Q6_K. */
static void check_q4_k_m_mix(const char *preset, const int *more_bits, int n_more,
                             int want_q6, int want_q4, int want_f32)
{
    const synth_preset *p = synth_preset_find(preset);
    synth_tensor *t;
    int n;
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_plan(p, SYNTH_QUANT_Q4_K_M, &t, &n, &st), 0);
    int n_q6 = 0, n_q4 = 0, n_f32 = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        uint32_t want;
        const char *nm = t[i].name;
        if (is_1d_or_f32_kind(t[i].kind))
            want = GGML_TYPE_F32;
        else if (!strcmp(nm, "output.weight"))
            want = GGML_TYPE_Q6_K;
        else if (!strcmp(nm, "token_embd.weight"))
            want = p->tied ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
        else if (strstr(nm, ".attn_v.weight") || strstr(nm, ".attn_qkv.weight") ||
                 strstr(nm, ".ffn_down.weight"))
            want = in_list(t[i].layer, more_bits, n_more) ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
        else
            want = GGML_TYPE_Q4_K;
        if (t[i].type != want) {
            if (bad++ < 5) printf("\n  %s %s: type %u, want %u\n", preset, nm, t[i].type, want);
        }
        n_q6 += t[i].type == GGML_TYPE_Q6_K;
        n_q4 += t[i].type == GGML_TYPE_Q4_K;
        n_f32 += t[i].type == GGML_TYPE_F32;
        /* the type-choosing function agrees with the plan */
        CU_ASSERT_EQUAL(synth_tensor_type(p, SYNTH_QUANT_Q4_K_M, t[i].kind, t[i].layer),
                        t[i].type);
    }
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT_EQUAL(n_q6, want_q6);
    CU_ASSERT_EQUAL(n_q4, want_q4);
    CU_ASSERT_EQUAL(n_f32, want_f32);
    free(t);
}

static void test_type_mix_0_8b(void)
{
    /* use_more_bits(i, 24): i < 3, i >= 21, (i - 3) % 3 == 2 */
    static const int more[] = {0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23};
    /* Q6_K: token_embd (tied) + 2 per listed layer. F32: 18*6 + 6*4 + 1. */
    check_q4_k_m_mix("0.8b", more, 12, 1 + 24, 320 - 25 - 133, 133);
}

static void test_type_mix_27b(void)
{
    /* use_more_bits(i, 64): i < 8, i >= 56, (i - 8) % 3 == 2 */
    static const int more[] = {0,  1,  2,  3,  4,  5,  6,  7,  10, 13, 16, 19, 22, 25,
                               28, 31, 34, 37, 40, 43, 46, 49, 52, 55, 56, 57, 58, 59,
                               60, 61, 62, 63};
    /* Q6_K: output + 2 per listed layer (token_embd stays Q4_K: untied). F32: 48*6+16*4+1 */
    check_q4_k_m_mix("27b", more, 32, 1 + 64, 851 - 65 - 353, 353);
}

static void test_type_mix_plain(void)
{
    const synth_preset *p = synth_preset_find("9b");
    static const struct {
        synth_quant q;
        uint32_t type;
    } qs[] = {{SYNTH_QUANT_F32, GGML_TYPE_F32},
              {SYNTH_QUANT_F16, GGML_TYPE_F16},
              {SYNTH_QUANT_BF16, GGML_TYPE_BF16},
              {SYNTH_QUANT_Q8_0, GGML_TYPE_Q8_0}};
    for (int j = 0; j < 4; j++) {
        synth_tensor *t;
        int n;
        status st;
        CU_ASSERT_EQUAL_FATAL(synth_plan(p, qs[j].q, &t, &n, &st), 0);
        int bad = 0;
        for (int i = 0; i < n; i++) {
            uint32_t want = is_1d_or_f32_kind(t[i].kind) ? GGML_TYPE_F32 : qs[j].type;
            bad += t[i].type != want;
        }
        CU_ASSERT_EQUAL(bad, 0);
        free(t);
    }
    CU_ASSERT_EQUAL(synth_tensor_type(p, SYNTH_QUANT_BF16, SYNTH_KIND_SSM_CONV1D, 0),
                    GGML_TYPE_F32);
    CU_ASSERT_EQUAL(synth_tensor_type(p, SYNTH_QUANT_Q8_0, SYNTH_KIND_SSM_ALPHA, 0),
                    GGML_TYPE_Q8_0);
    CU_ASSERT_TRUE(synth_use_more_bits(0, 24));
    CU_ASSERT_FALSE(synth_use_more_bits(3, 24));
    CU_ASSERT_TRUE(synth_use_more_bits(5, 24));
    CU_ASSERT_FALSE(synth_use_more_bits(6, 24));
}

/* ---- vocabulary ----------------------------------------------------------------------- */

typedef struct tok_ref {
    const char *s;
    uint32_t id;
} tok_ref;

static int tok_ref_cmp(const void *a, const void *b)
{
    return strcmp(((const tok_ref *)a)->s, ((const tok_ref *)b)->s);
}

static int64_t find_id(const tok_ref *sorted, uint32_t n, const char *s)
{
    tok_ref key = {s, 0};
    const tok_ref *r = bsearch(&key, sorted, n, sizeof key, tok_ref_cmp);
    return r ? (int64_t)r->id : -1;
}

/* Returns the number of broken invariants (printing the first few). */
static int check_vocab(const synth_vocab *v, uint32_t n_vocab)
{
    int bad = 0;
    if (v->n_tokens != n_vocab) return 1;
    tok_ref *s = malloc(sizeof *s * n_vocab);
    for (uint32_t i = 0; i < n_vocab; i++) s[i] = (tok_ref){v->tokens[i], i};
    qsort(s, n_vocab, sizeof *s, tok_ref_cmp);
    for (uint32_t i = 1; i < n_vocab; i++)
        if (!strcmp(s[i - 1].s, s[i].s) && bad++ < 3) printf("\n  duplicate token '%s'", s[i].s);
    if (v->n_merges != v->first_special - 256) bad++;
    char buf[512];
    for (uint32_t k = 0; k < v->n_merges; k++) {
        const char *m = v->merges[k];
        const char *sp = strchr(m, ' ');
        if (!sp || strchr(sp + 1, ' ') || strlen(m) >= sizeof buf) {
            if (bad++ < 3) printf("\n  merge %u '%s' is not 'a b'", k, m);
            continue;
        }
        size_t nl = (size_t)(sp - m);
        memcpy(buf, m, nl);
        buf[nl] = 0;
        int64_t left = find_id(s, n_vocab, buf);
        int64_t right = find_id(s, n_vocab, sp + 1);
        memcpy(buf, m, nl);
        strcpy(buf + nl, sp + 1);
        int64_t merged = find_id(s, n_vocab, buf);
        uint32_t want = 256 + k;
        if (merged != want || left < 0 || left >= want || right < 0 || right >= want)
            if (bad++ < 3)
                printf("\n  merge %u '%s': result id %lld, parts %lld %lld", k, m,
                       (long long)merged, (long long)left, (long long)right);
    }
    for (uint32_t i = 0; i < n_vocab; i++) {
        int32_t want = i < v->first_special                  ? SYNTH_TOKEN_NORMAL
                       : i < v->first_special + v->n_special ? SYNTH_TOKEN_CONTROL
                                                             : SYNTH_TOKEN_UNUSED;
        if (v->types[i] != want && bad++ < 3) printf("\n  token %u type %d", i, v->types[i]);
    }
    if (strcmp(v->tokens[v->endoftext_id], "<|endoftext|>") ||
        strcmp(v->tokens[v->im_start_id], "<|im_start|>") ||
        strcmp(v->tokens[v->im_end_id], "<|im_end|>") ||
        strcmp(v->tokens[v->think_id], "<think>") ||
        strcmp(v->tokens[v->think_end_id], "</think>"))
        bad++;
    free(s);
    return bad;
}

static void test_vocab_real(void)
{
    synth_vocab v;
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_vocab_build(&v, 248320, &st), 0);
    CU_ASSERT_EQUAL(check_vocab(&v, 248320), 0);
    /* Qwen's own special ids and the [PADn] fillers (docs/QWEN35.md §1.6) */
    CU_ASSERT_EQUAL(v.endoftext_id, 248044u);
    CU_ASSERT_EQUAL(v.im_start_id, 248045u);
    CU_ASSERT_EQUAL(v.im_end_id, 248046u);
    CU_ASSERT_EQUAL(v.think_id, 248068u);
    CU_ASSERT_EQUAL(v.think_end_id, 248069u);
    CU_ASSERT_STRING_EQUAL(v.tokens[248076], "<|audio_pad|>");
    CU_ASSERT_STRING_EQUAL(v.tokens[248077], "[PAD248077]");
    CU_ASSERT_EQUAL(v.types[248319], SYNTH_TOKEN_UNUSED);
    /* GPT-2 byte order: '!' is id 0, 'Ġ' (space) is id 220, 'Ċ' (newline) is id 198 */
    CU_ASSERT_STRING_EQUAL(v.tokens[0], "!");
    CU_ASSERT_STRING_EQUAL(v.tokens[220], "\xC4\xA0");
    CU_ASSERT_STRING_EQUAL(v.tokens[198], "\xC4\x8A");
    synth_vocab_free(&v);
}

static void test_vocab_small(void)
{
    static const uint32_t sizes[] = {SYNTH_VOCAB_MIN, 544, 545, 2048};
    for (int i = 0; i < 4; i++) {
        synth_vocab v;
        status st;
        CU_ASSERT_EQUAL_FATAL(synth_vocab_build(&v, sizes[i], &st), 0);
        CU_ASSERT_EQUAL(check_vocab(&v, sizes[i]), 0);
        CU_ASSERT_EQUAL(v.first_special + v.n_special, sizes[i]); /* specials last */
        synth_vocab_free(&v);
    }
    synth_vocab v;
    status st;
    CU_ASSERT_EQUAL(synth_vocab_build(&v, SYNTH_VOCAB_MIN - 1, &st), STATUS_RANGE);
}

/* The check itself can fail: a broken merge and a duplicate are caught. */
static void test_vocab_check_can_fail(void)
{
    synth_vocab v;
    status st;
    CU_ASSERT_EQUAL_FATAL(synth_vocab_build(&v, 2048, &st), 0);
    const char *saved = v.merges[10];
    v.merges[10] = "x y";
    CU_ASSERT_NOT_EQUAL(check_vocab(&v, 2048), 0);
    v.merges[10] = saved;
    saved = v.tokens[300];
    v.tokens[300] = v.tokens[301];
    CU_ASSERT_NOT_EQUAL(check_vocab(&v, 2048), 0);
    v.tokens[300] = saved;
    CU_ASSERT_EQUAL(check_vocab(&v, 2048), 0);
    synth_vocab_free(&v);
}

/* ---- tiny files read back ------------------------------------------------------------ */

static uint32_t kv_u32(const gguf_file *f, const char *key)
{
    uint32_t x = 0xFFFFFFFFu;
    status st;
    CU_ASSERT_EQUAL(gguf_get_u32(f, key, &x, &st), 0);
    return x;
}

static bool kv_str_is(const gguf_file *f, const char *key, const char *want)
{
    gguf_str s;
    status st;
    return gguf_get_str(f, key, &s, &st) == 0 && gguf_str_eq(s, want);
}

/* Dequantises every tensor and checks finiteness and the intended magnitudes. */
static void check_values(const gguf_file *f, const synth_tensor *plan, int n)
{
    for (int i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_find_tensor(f, plan[i].name);
        CU_ASSERT_PTR_NOT_NULL_FATAL(t);
        const quant_traits *qt = quant_get(t->type);
        CU_ASSERT_PTR_NOT_NULL_FATAL(qt);
        uint64_t n_in = t->ne[0], n_rows = t->ne[1];
        uint64_t row_bytes = quant_row_bytes(t->type, n_in);
        float *row = malloc(sizeof *row * n_in);
        double sum = 0, sum2 = 0, mn = INFINITY, mx = -INFINITY;
        bool finite = true;
        for (uint64_t r = 0; r < n_rows; r++) {
            qt->dequant((const uint8_t *)t->data + r * row_bytes, row, (int64_t)n_in);
            for (uint64_t j = 0; j < n_in; j++) {
                finite &= isfinite(row[j]) != 0;
                sum += row[j];
                sum2 += (double)row[j] * row[j];
                if (row[j] < mn) mn = row[j];
                if (row[j] > mx) mx = row[j];
            }
        }
        free(row);
        double cnt = (double)(n_in * n_rows), mean = sum / cnt;
        double sd = sqrt(sum2 / cnt - mean * mean);
        bool ok = finite;
        switch (synth_kind_values(plan[i].kind)) {
        case SYNTH_VALUES_MATMUL: {
            double sigma = 1.0 / sqrt((double)n_in);
            ok &= sd > 0.85 * sigma && sd < 1.2 * sigma && fabs(mean) < 0.1 * sigma &&
                  mx - mn > 2 * sigma;
            break;
        }
        case SYNTH_VALUES_NORM: ok &= fabs(mean - 1) < 0.05 && sd > 0.01 && sd < 0.2; break;
        case SYNTH_VALUES_CONV: ok &= fabs(mean) < 0.1 && sd > 0.05 && sd < 0.5; break;
        case SYNTH_VALUES_DT_BIAS: ok &= mx < 1 && mn > -1 && mx > mn; break;
        case SYNTH_VALUES_SSM_A: ok &= mx < 0 && mn > -40 && mx > mn; break;
        }
        CU_ASSERT(ok);
        if (!ok)
            printf("\n  %s (type %u): mean %g sd %g min %g max %g finite %d\n", plan[i].name,
                   t->type, mean, sd, mn, mx, finite);
    }
}

static void check_tiny_file(synth_quant q)
{
    char path[512];
    char name[32];
    snprintf(name, sizeof name, "tiny_%s.gguf", synth_quant_name(q));
    gguf_craft_tmp_path(path, sizeof path, name);
    const synth_preset *p = synth_preset_find("tiny");
    synth_options o = {.preset = p, .quant = q, .seed = 42, .n_threads = 2};
    synth_stats s;
    status st;
    int rc = synth_write(path, &o, &s, &st);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    if (rc) printf("\n  %s\n", st.msg);

    synth_tensor *plan;
    int n;
    CU_ASSERT_EQUAL_FATAL(synth_plan(p, q, &plan, &n, &st), 0);
    CU_ASSERT_EQUAL(s.n_tensors, n);
    gguf_file *f;
    rc = gguf_open(&f, path, &st);
    CU_ASSERT_EQUAL_FATAL(rc, 0);
    CU_ASSERT_EQUAL(f->size, s.n_bytes);
    /* 3 DeltaNet layers (14) + 1 attention layer (11) + token_embd + output_norm (tied) */
    CU_ASSERT_EQUAL(f->n_tensors, 3 * 14 + 11 + 2);
    CU_ASSERT_EQUAL(f->n_tensors, (uint64_t)n);
    for (int i = 0; i < n && i < (int)f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        CU_ASSERT_TRUE(gguf_str_eq(t->name, plan[i].name));
        CU_ASSERT_EQUAL(t->n_dims, plan[i].n_dims);
        CU_ASSERT_EQUAL(t->ne[0], plan[i].ne[0]);
        CU_ASSERT_EQUAL(t->ne[1], plan[i].ne[1]);
        CU_ASSERT_EQUAL(t->type, plan[i].type);
        CU_ASSERT_EQUAL(t->n_bytes, plan[i].n_bytes);
    }
    /* a few shapes written out (docs/QWEN35.md §1.4 with H 256, C 512, n_v 4, d_h 64, F 512) */
    const gguf_tensor *t = gguf_find_tensor(f, "blk.0.ssm_conv1d.weight");
    CU_ASSERT_TRUE(t && t->ne[0] == 4 && t->ne[1] == 512 && t->type == GGML_TYPE_F32);
    t = gguf_find_tensor(f, "blk.3.attn_q.weight");
    CU_ASSERT_TRUE(t && t->ne[0] == 256 && t->ne[1] == 512);
    t = gguf_find_tensor(f, "blk.0.ssm_a");
    CU_ASSERT_TRUE(t && t->n_dims == 1 && t->ne[0] == 4 && t->type == GGML_TYPE_F32);
    t = gguf_find_tensor(f, "blk.2.ffn_down.weight");
    CU_ASSERT_TRUE(t && t->ne[0] == 512 && t->ne[1] == 256);
    CU_ASSERT_PTR_NULL(gguf_find_tensor(f, "output.weight"));
    CU_ASSERT_PTR_NULL(gguf_find_tensor(f, "blk.3.attn_qkv.weight"));

    /* metadata */
    CU_ASSERT_TRUE(kv_str_is(f, "general.architecture", "qwen35"));
    CU_ASSERT_EQUAL(kv_u32(f, "general.file_type"), synth_quant_file_type(q));
    CU_ASSERT_EQUAL(kv_u32(f, "general.quantization_version"), 2u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.block_count"), 4u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.embedding_length"), 256u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.feed_forward_length"), 512u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.context_length"), 262144u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.attention.head_count"), 4u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.attention.head_count_kv"), 2u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.attention.key_length"), 64u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.attention.value_length"), 64u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.rope.dimension_count"), 16u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.ssm.conv_kernel"), 4u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.ssm.state_size"), 64u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.ssm.group_count"), 2u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.ssm.time_step_rank"), 4u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.ssm.inner_size"), 256u);
    CU_ASSERT_EQUAL(kv_u32(f, "qwen35.full_attention_interval"), 4u);
    float eps = 0, base = 0;
    CU_ASSERT_EQUAL(gguf_get_f32(f, "qwen35.attention.layer_norm_rms_epsilon", &eps, &st), 0);
    CU_ASSERT_EQUAL(gguf_get_f32(f, "qwen35.rope.freq_base", &base, &st), 0);
    CU_ASSERT_EQUAL(eps, 1e-6f);
    CU_ASSERT_EQUAL(base, 1e7f);
    const gguf_kv *sec = gguf_find_kv(f, "qwen35.rope.dimension_sections");
    CU_ASSERT_TRUE_FATAL(sec && sec->type == GGUF_VTYPE_ARRAY &&
                         sec->arr_type == GGUF_VTYPE_INT32 && sec->n == 4);
    static const int64_t want_sec[4] = {3, 3, 2, 0};
    for (uint64_t i = 0; i < 4; i++) {
        int64_t x = -1;
        CU_ASSERT_EQUAL(gguf_kv_get_int(sec, i, &x), 0);
        CU_ASSERT_EQUAL(x, want_sec[i]);
    }
    /* tokenizer */
    CU_ASSERT_TRUE(kv_str_is(f, "tokenizer.ggml.model", "gpt2"));
    CU_ASSERT_TRUE(kv_str_is(f, "tokenizer.ggml.pre", "qwen35"));
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    const gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    CU_ASSERT_TRUE_FATAL(toks && types && merges);
    CU_ASSERT_EQUAL(toks->n, 2048u);
    CU_ASSERT_EQUAL(types->n, 2048u);
    CU_ASSERT_EQUAL(merges->n, 2048u - 33 - 256);
    uint32_t eos = kv_u32(f, "tokenizer.ggml.eos_token_id");
    CU_ASSERT_TRUE_FATAL(eos < toks->n);
    CU_ASSERT_TRUE(gguf_str_eq(toks->strs[eos], "<|im_end|>"));
    int64_t eos_type = 0;
    CU_ASSERT_EQUAL(gguf_kv_get_int(types, eos, &eos_type), 0);
    CU_ASSERT_EQUAL(eos_type, SYNTH_TOKEN_CONTROL);
    uint32_t pad = kv_u32(f, "tokenizer.ggml.padding_token_id");
    CU_ASSERT_TRUE(pad < toks->n && gguf_str_eq(toks->strs[pad], "<|endoftext|>"));
    bool add_bos = true;
    CU_ASSERT_EQUAL(gguf_get_bool(f, "tokenizer.ggml.add_bos_token", &add_bos, &st), 0);
    CU_ASSERT_FALSE(add_bos);
    gguf_str tmpl;
    CU_ASSERT_EQUAL(gguf_get_str(f, "tokenizer.chat_template", &tmpl, &st), 0);
    CU_ASSERT_TRUE(tmpl.len > 20 && memmem(tmpl.ptr, tmpl.len, "<|im_start|>", 12) != NULL);
    /* the default: Qwen3.5's template, its thinking switch and tool format included */
    CU_ASSERT_TRUE(tmpl.len == strlen(synth_vocab_chat_template(SYNTH_TEMPLATE_QWEN35)) &&
                   memmem(tmpl.ptr, tmpl.len, "enable_thinking", 15) != NULL &&
                   memmem(tmpl.ptr, tmpl.len, "<tool_call>", 11) != NULL);

    check_values(f, plan, n);
    gguf_close(f);
    free(plan);
    unlink(path);
}

/* The templates by name; ChatML is the short one, without the thinking switch. */
static void test_chat_templates(void)
{
    CU_ASSERT_EQUAL(synth_template_parse("qwen35"), SYNTH_TEMPLATE_QWEN35);
    CU_ASSERT_EQUAL(synth_template_parse("chatml"), SYNTH_TEMPLATE_CHATML);
    CU_ASSERT_EQUAL(synth_template_parse("qwen3"), -1);
    CU_ASSERT_EQUAL(synth_template_parse(NULL), -1);
    const char *q = synth_vocab_chat_template(SYNTH_TEMPLATE_QWEN35);
    const char *c = synth_vocab_chat_template(SYNTH_TEMPLATE_CHATML);
    CU_ASSERT_TRUE(strlen(q) > 7000 && strstr(q, "enable_thinking") && strstr(q, "<think>"));
    CU_ASSERT_TRUE(strlen(c) < 200 && strstr(c, "<|im_start|>") && !strstr(c, "think"));
}

static void test_tiny_f32(void) { check_tiny_file(SYNTH_QUANT_F32); }
static void test_tiny_f16(void) { check_tiny_file(SYNTH_QUANT_F16); }
static void test_tiny_bf16(void) { check_tiny_file(SYNTH_QUANT_BF16); }
static void test_tiny_q8_0(void) { check_tiny_file(SYNTH_QUANT_Q8_0); }
static void test_tiny_q4_k_m(void) { check_tiny_file(SYNTH_QUANT_Q4_K_M); }

/* ---- determinism ------------------------------------------------------------------------ */

static uint64_t fnv64(const uint8_t *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Writes preset/quant with the given seed, threads and chunk size; returns the file's hash. */
static uint64_t write_hash(const char *preset, synth_quant q, uint64_t seed, int threads,
                           uint64_t chunk, const char *tag, uint8_t **bytes, size_t *n_bytes)
{
    char path[512];
    gguf_craft_tmp_path(path, sizeof path, tag);
    synth_options o = {.preset = synth_preset_find(preset), .quant = q, .seed = seed,
                       .n_threads = threads, .chunk_bytes = chunk};
    status st;
    int rc = synth_write(path, &o, NULL, &st);
    CU_ASSERT_EQUAL(rc, 0);
    if (rc) printf("\n  %s\n", st.msg);
    size_t n = 0;
    uint8_t *p = (uint8_t *)testutil_read_file(path, &n);
    CU_ASSERT_PTR_NOT_NULL(p);
    unlink(path);
    uint64_t h = p ? fnv64(p, n) : 0;
    if (bytes) {
        *bytes = p;
        *n_bytes = n;
    } else {
        free(p);
    }
    return h;
}

static void test_deterministic(void)
{
    for (int q = 0; q < SYNTH_QUANT_COUNT; q++) {
        uint8_t *a, *b;
        size_t na, nb;
        uint64_t h1 = write_hash("tiny", (synth_quant)q, 7, 1, 0, "det_a.gguf", &a, &na);
        /* many threads, tiny chunks: rows split across threads in a different order */
        uint64_t h2 = write_hash("tiny", (synth_quant)q, 7, 8, 4096, "det_b.gguf", &b, &nb);
        uint64_t h3 = write_hash("tiny", (synth_quant)q, 8, 2, 0, "det_c.gguf", NULL, NULL);
        CU_ASSERT_EQUAL(h1, h2);
        CU_ASSERT_TRUE(na == nb && !memcmp(a, b, na));
        CU_ASSERT_NOT_EQUAL(h1, h3); /* the seed matters */
        /* the comparison can fail: one flipped byte in the data section is seen */
        b[nb - 100] ^= 1;
        CU_ASSERT_NOT_EQUAL(fnv64(b, nb), h1);
        CU_ASSERT_NOT_EQUAL(memcmp(a, b, na), 0);
        free(a);
        free(b);
    }
}

/* Row ranges generated separately equal the whole tensor generated at once. */
static void test_fill_rows_independent(void)
{
    const synth_preset *p = synth_preset_find("tiny");
    for (int q = 0; q < SYNTH_QUANT_COUNT; q++) {
        synth_tensor *t;
        int n;
        status st;
        CU_ASSERT_EQUAL_FATAL(synth_plan(p, (synth_quant)q, &t, &n, &st), 0);
        for (int i = 0; i < n; i++) {
            uint64_t key = synth_fill_key(3, t[i].name);
            uint8_t *whole = malloc(t[i].n_bytes), *parts = malloc(t[i].n_bytes);
            synth_fill_rows(&t[i], key, 0, t[i].ne[1], whole);
            for (uint64_t r = 0; r < t[i].ne[1]; r += 3) {
                uint64_t nr = t[i].ne[1] - r < 3 ? t[i].ne[1] - r : 3;
                synth_fill_rows(&t[i], key, r, nr, parts + r * t[i].row_bytes);
            }
            CU_ASSERT_EQUAL(memcmp(whole, parts, t[i].n_bytes), 0);
            free(whole);
            free(parts);
        }
        free(t);
    }
}

static void test_write_errors(void)
{
    status st;
    synth_options o = {.preset = synth_preset_find("tiny"), .quant = SYNTH_QUANT_F32};
    CU_ASSERT_EQUAL(synth_write("/nonexistent-dir/x.gguf", &o, NULL, &st), STATUS_IO);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "/nonexistent-dir/x.gguf"));
    o.preset = NULL;
    CU_ASSERT_EQUAL(synth_write("/tmp/never.gguf", &o, NULL, &st), STATUS_INVALID);
    o.preset = synth_preset_find("tiny");
    o.quant = SYNTH_QUANT_COUNT;
    CU_ASSERT_EQUAL(synth_write("/tmp/never.gguf", &o, NULL, &st), STATUS_INVALID);
}

int main(void)
{
    CU_initialize_registry();
    CU_pSuite s = CU_add_suite("gguf/synth", NULL, NULL);
    CU_add_test(s, "presets match docs/QWEN35.md 4.2", test_presets_match_spec);
    CU_add_test(s, "tensor counts per size", test_plan_counts);
    CU_add_test(s, "parameter counts per size", test_plan_param_counts);
    CU_add_test(s, "MTP block per size", test_plan_mtp);
    CU_add_test(s, "data sizes match docs/QWEN35.md 4.3", test_plan_sizes);
    CU_add_test(s, "chat templates", test_chat_templates);
    CU_add_test(s, "q4_k_m mix 0.8b", test_type_mix_0_8b);
    CU_add_test(s, "q4_k_m mix 27b", test_type_mix_27b);
    CU_add_test(s, "f32/f16/bf16/q8_0 mix", test_type_mix_plain);
    CU_add_test(s, "vocab 248320 invariants", test_vocab_real);
    CU_add_test(s, "small vocab invariants", test_vocab_small);
    CU_add_test(s, "vocab check can fail", test_vocab_check_can_fail);
    CU_add_test(s, "tiny f32 reads back", test_tiny_f32);
    CU_add_test(s, "tiny f16 reads back", test_tiny_f16);
    CU_add_test(s, "tiny bf16 reads back", test_tiny_bf16);
    CU_add_test(s, "tiny q8_0 reads back", test_tiny_q8_0);
    CU_add_test(s, "tiny q4_k_m reads back", test_tiny_q4_k_m);
    CU_add_test(s, "same seed same bytes, any threads", test_deterministic);
    CU_add_test(s, "row ranges independent", test_fill_rows_independent);
    CU_add_test(s, "write errors", test_write_errors);
    return testutil_cunit_run();
}
