/* Tokenizer tests: every reference `tokenizer` entry of both reference models (ids and decoded
 * text), special tokens, NFC, empty and invalid input, BPE rank order on a hand-made
 * vocabulary, the streaming detokenizer against the whole-sequence decode, concurrent encodes,
 * and GGUF loading errors. */
#include <CUnit/Basic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "gguf/gguf_writer.h"
#include "model/tokenizer.h"
#include "tests/model/ref_cases.h"
#include "tests/model/tokenizer_test_util.h"
#include "tests/testutil/testutil.h"

/* Every reference case (ref_cases.h: shared/reference when present, then tests/reference);
 * ref_tok[0] is tiny-r2-tied (else own-r2-tied: ref_case_resolve; the same special ids
 * 1024-1028), which the tests below that name no model use. */
static ref_case case_list[REF_CASES_MAX];
static const char *models[REF_CASES_MAX];
static tokenizer *ref_tok[REF_CASES_MAX]; /* loaded once by the suite init */
static int n_models;

static int suite_init(void)
{
    char path[4400];
    n_models = ref_cases_list(case_list, REF_CASES_MAX);
    ref_case want;
    if (ref_case_resolve("tiny-r2-tied", &want)) return -1;
    int r2 = ref_cases_find(case_list, n_models, want.name);
    if (r2 < 0) {
        fprintf(stderr, "%s not found in the case list\n", want.name);
        return -1;
    }
    ref_case t = case_list[0];
    case_list[0] = case_list[r2];
    case_list[r2] = t;
    for (int m = 0; m < n_models; m++) {
        status st = {0};
        models[m] = case_list[m].name;
        ref_case_path(&case_list[m], ".gguf", path, sizeof path);
        if (tokenizer_load_path(&ref_tok[m], path, &st)) {
            fprintf(stderr, "load %s: %s\n", path, st.msg);
            return -1;
        }
    }
    return 0;
}

static int suite_clean(void)
{
    for (int m = 0; m < n_models; m++) tokenizer_destroy(ref_tok[m]);
    return 0;
}

/* Valid UTF-8 by utf8proc's decoder (independent of the tokenizer's own check). */
static int valid_utf8(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* Decodes ids through the streaming detokenizer; returns malloc'd text, *ok = 0 when a piece
 * was not valid UTF-8. */
static char *stream_decode(const tokenizer *t, const int32_t *ids, size_t n, size_t *len, int *ok)
{
    size_t cap = tokenizer_detok_max_out(t);
    char *piece = malloc(cap);
    char *all = malloc(n * cap + 4);
    tokenizer_detok d;
    tokenizer_detok_init(&d, t);
    size_t w = 0;
    *ok = 1;
    for (size_t i = 0; i < n; i++) {
        size_t k;
        status st = {0};
        CU_ASSERT_EQUAL_FATAL(tokenizer_detok_push(&d, ids[i], piece, cap, &k, &st), STATUS_OK);
        if (!valid_utf8(piece, k)) *ok = 0;
        memcpy(all + w, piece, k);
        w += k;
    }
    size_t k = tokenizer_detok_flush(&d, piece, cap);
    if (!valid_utf8(piece, k)) *ok = 0;
    memcpy(all + w, piece, k);
    w += k;
    all[w] = 0;
    *len = w;
    free(piece);
    return all;
}

static void test_reference_cases(void)
{
    char path[4400];
    for (int m = 0; m < n_models; m++) {
        tokenizer_test_case *cs;
        ref_case_path(&case_list[m], ".json", path, sizeof path);
        int n = tokenizer_test_read_cases(path, &cs);
        CU_ASSERT_FATAL(n >= 8);
        for (int i = 0; i < n; i++) {
            status st = {0};
            int32_t *ids;
            size_t n_ids;
            CU_ASSERT_EQUAL_FATAL(
                tokenizer_encode(ref_tok[m], cs[i].text, cs[i].text_len, &ids, &n_ids, &st),
                STATUS_OK);
            int same = n_ids == cs[i].n_ids && !memcmp(ids, cs[i].ids, n_ids * sizeof *ids);
            if (!same) {
                fprintf(stderr, "%s case %d '%s': ids differ:", models[m], i, cs[i].text);
                for (size_t k = 0; k < n_ids; k++) fprintf(stderr, " %d", ids[k]);
                fprintf(stderr, "\n");
            }
            CU_ASSERT(same);
            free(ids);

            char *text;
            size_t len;
            CU_ASSERT_EQUAL_FATAL(
                tokenizer_decode(ref_tok[m], cs[i].ids, cs[i].n_ids, &text, &len, &st),
                STATUS_OK);
            CU_ASSERT(len == cs[i].decoded_len && !memcmp(text, cs[i].decoded, len));
            CU_ASSERT_EQUAL(strlen(text), len);
            free(text);

            int ok;
            text = stream_decode(ref_tok[m], cs[i].ids, cs[i].n_ids, &len, &ok);
            CU_ASSERT(ok);
            CU_ASSERT(len == cs[i].decoded_len && !memcmp(text, cs[i].decoded, len));
            free(text);
        }
        tokenizer_test_free_cases(cs, n);
    }
}

static void test_special_ids(void)
{
    for (int m = 0; m < n_models; m++) {
        const tokenizer *t = ref_tok[m];
        size_t V = tokenizer_n_vocab(t);
        CU_ASSERT_EQUAL(tokenizer_endoftext_id(t), (int32_t)V - 5);
        CU_ASSERT_EQUAL(tokenizer_im_start_id(t), (int32_t)V - 4);
        CU_ASSERT_EQUAL(tokenizer_im_end_id(t), (int32_t)V - 3);
        CU_ASSERT_EQUAL(tokenizer_eos_id(t), (int32_t)V - 3);
        CU_ASSERT_EQUAL(tokenizer_find_token(t, "<think>"), (int32_t)V - 2);
        CU_ASSERT_EQUAL(tokenizer_find_token(t, "</think>"), (int32_t)V - 1);
        CU_ASSERT_EQUAL(tokenizer_find_token(t, "<nope>"), -1);
        CU_ASSERT(tokenizer_is_eog(t, (int32_t)V - 3));
        CU_ASSERT(tokenizer_is_eog(t, (int32_t)V - 5));
        CU_ASSERT(!tokenizer_is_eog(t, (int32_t)V - 4));
        CU_ASSERT(!tokenizer_is_eog(t, 0));
        CU_ASSERT(!tokenizer_is_eog(t, -1));
        int32_t eog[3];
        CU_ASSERT_EQUAL(tokenizer_eog_ids(t, eog), 2);
        CU_ASSERT_EQUAL(tokenizer_token_type(t, (int32_t)V - 3), TOKENIZER_TYPE_CONTROL);
        CU_ASSERT_EQUAL(tokenizer_token_type(t, 0), TOKENIZER_TYPE_NORMAL);
        CU_ASSERT_EQUAL(tokenizer_token_type(t, (int32_t)V), -1);
        size_t len;
        if (!strcmp(models[m], "tiny-r2-tied") || !strcmp(models[m], "tiny-r1-untied")) {
            CU_ASSERT_STRING_EQUAL(tokenizer_token_text(t, 256, &len), "Ġa");
            const uint8_t *b = tokenizer_token_bytes(t, 256, &len);
            CU_ASSERT(len == 2 && b[0] == ' ' && b[1] == 'a');
        } else { /* id 256: the first merge, two bytes at least */
            CU_ASSERT(tokenizer_token_bytes(t, 256, &len) != NULL && len >= 2);
        }
        CU_ASSERT_PTR_NULL(tokenizer_token_text(t, -1, &len));
    }
}

/* Encodes s (NUL-terminated) with the r2 model. */
static size_t enc(const char *s, int32_t **ids)
{
    status st = {0};
    size_t n;
    CU_ASSERT_EQUAL_FATAL(tokenizer_encode(ref_tok[0], s, strlen(s), ids, &n, &st), STATUS_OK);
    return n;
}

static void test_special_in_text(void)
{
    int32_t *a, *b;
    size_t n = enc("<|im_start|>", &a);
    CU_ASSERT(n == 1 && a[0] == 1025);
    free(a);
    n = enc("<|im_end|><|im_end|><think></think>", &a);
    CU_ASSERT(n == 4 && a[0] == 1026 && a[1] == 1026 && a[2] == 1027 && a[3] == 1028);
    free(a);
    /* A near miss is ordinary text: no special id in it. */
    n = enc("<|im_end|", &a);
    CU_ASSERT(n > 1);
    for (size_t i = 0; i < n; i++) CU_ASSERT(a[i] < 1024);
    free(a);
    /* Text around a special token encodes as if the special token split it. */
    n = enc("x <|endoftext|> y", &a);
    size_t na = enc("x ", &b);
    CU_ASSERT(n == na + 2 && !memcmp(a, b, na * sizeof *a) && a[na] == 1024);
    free(b);
    size_t nb = enc(" y", &b);
    CU_ASSERT(nb == 1 && a[na + 1] == b[0]);
    free(a);
    free(b);
    /* Specials are split out of the raw text before NFC (HF: normalized=false): the '>' that
     * ends "<|im_end|>" does not compose with a following U+0338 into U+226F, while a plain
     * '>' does. Found by tools/fuzz. */
    char *out;
    size_t ol;
    status st = {0};
    n = enc("<|im_end|>\xCC\xB8", &a);
    CU_ASSERT(n >= 2 && a[0] == 1026);
    CU_ASSERT_EQUAL_FATAL(tokenizer_decode(ref_tok[0], a, n, &out, &ol, &st), STATUS_OK);
    CU_ASSERT(ol == 12 && !memcmp(out, "<|im_end|>\xCC\xB8", 12));
    free(out);
    free(a);
    n = enc("x>\xCC\xB8", &a);
    CU_ASSERT_EQUAL_FATAL(tokenizer_decode(ref_tok[0], a, n, &out, &ol, &st), STATUS_OK);
    CU_ASSERT(ol == 4 && !memcmp(out, "x\xE2\x89\xAF", 4));
    free(out);
    free(a);
}

static void test_empty_and_invalid(void)
{
    status st = {0};
    int32_t *ids = (int32_t *)1;
    size_t n = 99;
    CU_ASSERT_EQUAL(tokenizer_encode(ref_tok[0], "", 0, &ids, &n, &st), STATUS_OK);
    CU_ASSERT_EQUAL(n, 0);
    free(ids);
    /* Invalid UTF-8: a lone continuation byte, an overlong, a surrogate, a truncated tail. */
    const char *bad[] = {"ab\x80", "\xC0\xAF", "x\xED\xA0\x80", "ok \xE6\x97"};
    const size_t at[] = {2, 0, 1, 3};
    for (int i = 0; i < 4; i++) {
        char want[64];
        snprintf(want, sizeof want, "at byte %zu", at[i]);
        CU_ASSERT_EQUAL(tokenizer_encode(ref_tok[0], bad[i], strlen(bad[i]), &ids, &n, &st),
                        STATUS_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, want));
        CU_ASSERT_PTR_NULL(ids);
    }
    /* An embedded NUL is ordinary text. */
    CU_ASSERT_EQUAL(tokenizer_encode(ref_tok[0], "a\0b", 3, &ids, &n, &st), STATUS_OK);
    char *text;
    size_t len;
    CU_ASSERT_EQUAL(tokenizer_decode(ref_tok[0], ids, n, &text, &len, &st), STATUS_OK);
    CU_ASSERT(len == 3 && !memcmp(text, "a\0b", 3));
    free(text);
    free(ids);
    /* Unknown ids. */
    int32_t badids[] = {5, 1029};
    CU_ASSERT_EQUAL(tokenizer_decode(ref_tok[0], badids, 2, &text, &len, &st), STATUS_RANGE);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "index 1"));
    badids[1] = -3;
    CU_ASSERT_EQUAL(tokenizer_decode(ref_tok[0], badids, 2, &text, &len, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(tokenizer_decode(ref_tok[0], NULL, 0, &text, &len, &st), STATUS_OK);
    CU_ASSERT(len == 0 && text && text[0] == 0);
    free(text);
}

static void test_nfc(void)
{
    int32_t *a, *b;
    /* e + COMBINING ACUTE ACCENT encodes exactly as the precomposed é. */
    size_t na = enc("caf\x65\xCC\x81", &a), nb = enc("caf\xC3\xA9", &b);
    CU_ASSERT(na == nb && !memcmp(a, b, na * sizeof *a));
    free(a);
    free(b);
    /* ANGSTROM SIGN U+212B is NFC-equivalent to U+00C5. */
    na = enc("\xE2\x84\xAB", &a);
    nb = enc("\xC3\x85", &b);
    CU_ASSERT(na == nb && !memcmp(a, b, na * sizeof *a));
    free(a);
    free(b);
    /* Composition across the run boundaries the encoder uses (kana, Hangul, Latin), in the
     * middle of longer text, and canonical reordering (dot below before dot above). */
    static const char *const pairs[][2] = {
        {"xx \xE3\x81\x8B\xE3\x82\x99 yy", "xx \xE3\x81\x8C yy"},           /* ka + voiced */
        {"\xEA\xB0\x80\xE1\x86\xA8!", "\xEA\xB0\x81!"},                     /* ga + T jamo */
        {"\xE1\x84\x80\xE1\x85\xA1 z", "\xEA\xB0\x80 z"},                   /* L + V jamo */
        {"Qa\xCC\x87\xCC\xA3 ok", "Q\xE1\xBA\xA1\xCC\x87 ok"},             /* reordered */
        {"\xE4\xB8\x80\xCC\x81\xE4\xB8\x80", "\xE4\xB8\x80\xCC\x81\xE4\xB8\x80"}, /* no-op */
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        na = enc(pairs[i][0], &a);
        nb = enc(pairs[i][1], &b);
        CU_ASSERT(na == nb && !memcmp(a, b, na * sizeof *a));
        char *text;
        size_t len;
        status st = {0};
        CU_ASSERT_EQUAL(tokenizer_decode(ref_tok[0], a, na, &text, &len, &st), STATUS_OK);
        CU_ASSERT(len == strlen(pairs[i][1]) && !memcmp(text, pairs[i][1], len));
        free(text);
        free(a);
        free(b);
    }
    /* NFC is not NFKC: the ligature ﬁ stays itself (not "fi"). */
    na = enc("\xEF\xAC\x81", &a);
    nb = enc("fi", &b);
    CU_ASSERT(na != nb || memcmp(a, b, na * sizeof *a));
    free(a);
    free(b);
}

/* A hand-made vocabulary: the 256 byte tokens (id = byte value), then merge results; specials at the end. */
static int make_plain(tokenizer **t, const char *const *extra, size_t n_extra,
                      const char *const *merges, size_t n_merges, const int32_t *extra_types,
                      status *st)
{
    static char bytes[256][3];
    tokenizer_text toks[300];
    int32_t types[300];
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        static int next;
        if (b == 0) next = 0;
        unsigned cp = self ? (unsigned)b : 256u + (unsigned)next++;
        if (cp < 0x80) {
            bytes[b][0] = (char)cp;
            toks[n] = (tokenizer_text){bytes[b], 1};
        } else {
            bytes[b][0] = (char)(0xC0 | cp >> 6);
            bytes[b][1] = (char)(0x80 | (cp & 0x3F));
            toks[n] = (tokenizer_text){bytes[b], 2};
        }
        types[n++] = TOKENIZER_TYPE_NORMAL;
    }
    for (size_t i = 0; i < n_extra; i++) {
        toks[n] = (tokenizer_text){extra[i], strlen(extra[i])};
        types[n++] = extra_types ? extra_types[i] : TOKENIZER_TYPE_NORMAL;
    }
    tokenizer_text ms[32];
    for (size_t i = 0; i < n_merges; i++) ms[i] = (tokenizer_text){merges[i], strlen(merges[i])};
    tokenizer_spec spec = {.n_tokens = (size_t)n, .tokens = toks, .token_types = types,
                           .n_merges = n_merges, .merges = ms, .eos_id = -1, .bos_id = -1,
                           .pre = TOKENIZER_PRE_QWEN35};
    return tokenizer_create(t, &spec, st);
}

static size_t enc_t(const tokenizer *t, const char *s, int32_t **ids)
{
    status st = {0};
    size_t n;
    CU_ASSERT_EQUAL_FATAL(tokenizer_encode(t, s, strlen(s), ids, &n, &st), STATUS_OK);
    return n;
}

static void test_bpe_rank_order(void)
{
    status st = {0};
    tokenizer *t;
    /* ids: ab 256, bc 257, abc 258, aa 259 */
    const char *extra[] = {"ab", "bc", "abc", "aa"};
    const char *m1[] = {"a b", "ab c", "b c", "a a"};
    CU_ASSERT_EQUAL_FATAL(make_plain(&t, extra, 4, m1, 4, NULL, &st), STATUS_OK);
    int32_t *ids;
    size_t n = enc_t(t, "abc", &ids);
    CU_ASSERT(n == 1 && ids[0] == 258);
    free(ids);
    n = enc_t(t, "bc", &ids);
    CU_ASSERT(n == 1 && ids[0] == 257);
    free(ids);
    /* Equal ranks: leftmost first, so "aaa" is aa + a. */
    n = enc_t(t, "aaa", &ids);
    CU_ASSERT(n == 2 && ids[0] == 259 && ids[1] == 'a');
    free(ids);
    tokenizer_destroy(t);

    /* With "b c" ranked first, "abc" becomes a + bc and "ab c" never applies. */
    const char *m2[] = {"b c", "a b", "ab c"};
    CU_ASSERT_EQUAL_FATAL(make_plain(&t, extra, 4, m2, 3, NULL, &st), STATUS_OK);
    n = enc_t(t, "abc", &ids);
    CU_ASSERT(n == 2 && ids[1] == 257);
    free(ids);
    /* A long word stays fast (heap-based merging): 200000 bytes of "ab". */
    size_t L = 200000;
    char *big = malloc(L + 1);
    for (size_t i = 0; i < L; i++) big[i] = i % 2 ? 'b' : 'a';
    big[L] = 0;
    n = enc_t(t, big, &ids);
    CU_ASSERT_EQUAL(n, L / 2);
    CU_ASSERT(ids[0] == 256 && ids[n - 1] == 256);
    free(ids);
    free(big);
    tokenizer_destroy(t);
}

static void test_specials_longest_first(void)
{
    status st = {0};
    tokenizer *t;
    const char *extra[] = {"<a>", "<a>b", "[u]"};
    const int32_t types[] = {TOKENIZER_TYPE_CONTROL, TOKENIZER_TYPE_CONTROL,
                             TOKENIZER_TYPE_USER_DEFINED};
    CU_ASSERT_EQUAL_FATAL(make_plain(&t, extra, 3, NULL, 0, types, &st), STATUS_OK);
    int32_t *ids;
    size_t n = enc_t(t, "<a>bc<a>[u]", &ids);
    CU_ASSERT(n == 4 && ids[0] == 257 && ids[1] == 'c' && ids[2] == 256 && ids[3] == 258);
    free(ids);
    tokenizer_destroy(t);
}

static void test_create_errors(void)
{
    status st = {0};
    tokenizer *t = (tokenizer *)1;
    const char *bad_merge[] = {"ab"};
    CU_ASSERT_EQUAL(make_plain(&t, NULL, 0, bad_merge, 1, NULL, &st), STATUS_FORMAT);
    CU_ASSERT_PTR_NULL(t);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "merge 0"));
    /* A vocabulary without byte tokens is not byte-level BPE. */
    tokenizer_text toks[] = {{"a", 1}, {"b", 1}};
    tokenizer_spec spec = {.n_tokens = 2, .tokens = toks, .eos_id = -1, .bos_id = -1};
    CU_ASSERT_EQUAL(tokenizer_create(&t, &spec, &st), STATUS_FORMAT);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "byte"));
    spec.n_tokens = 0;
    CU_ASSERT_EQUAL(tokenizer_create(&t, &spec, &st), STATUS_FORMAT);
    /* Merges naming unknown tokens are skipped, not fatal. */
    const char *m[] = {"q z"};
    CU_ASSERT_EQUAL(make_plain(&t, NULL, 0, m, 1, NULL, &st), STATUS_OK);
    tokenizer_destroy(t);
}

/* Random ids (whole vocabulary, or only byte tokens >= 0x80 to stress partial sequences):
 * every streamed piece is valid UTF-8 and the concatenation equals tokenizer_decode. */
static void test_detok_random(void)
{
    unsigned seed = 12345;
    for (int m = 0; m < n_models; m++) {
        const tokenizer *t = ref_tok[m];
        size_t V = tokenizer_n_vocab(t);
        /* the ids of the byte tokens 0x80..0xFF */
        int32_t hi_bytes[128];
        int nh = 0;
        for (int32_t id = 0; id < (int32_t)V && nh < 128; id++) {
            size_t len;
            const uint8_t *b = tokenizer_token_bytes(t, id, &len);
            if (len == 1 && b[0] >= 0x80) hi_bytes[nh++] = id;
        }
        CU_ASSERT_EQUAL_FATAL(nh, 128);
        for (int iter = 0; iter < 3000; iter++) {
            int32_t ids[24];
            size_t n = (size_t)(rand_r(&seed) % 24);
            for (size_t i = 0; i < n; i++)
                ids[i] = iter % 2 ? hi_bytes[rand_r(&seed) % 128]
                                  : (int32_t)(rand_r(&seed) % V);
            status st = {0};
            char *full, *streamed;
            size_t lf, ls;
            int ok;
            CU_ASSERT_EQUAL_FATAL(tokenizer_decode(t, ids, n, &full, &lf, &st), STATUS_OK);
            CU_ASSERT(valid_utf8(full, lf));
            streamed = stream_decode(t, ids, n, &ls, &ok);
            CU_ASSERT(ok);
            CU_ASSERT(lf == ls && !memcmp(full, streamed, lf));
            free(full);
            free(streamed);
        }
    }
}

static void test_detok_holds_back(void)
{
    const tokenizer *t = ref_tok[0];
    /* 🙂 = F0 9F 99 82, pushed as four byte tokens. */
    static const uint8_t smile[4] = {0xF0, 0x9F, 0x99, 0x82};
    int32_t ids[4];
    for (int k = 0; k < 4; k++) {
        ids[k] = -1;
        for (int32_t id = 0; id < 256; id++) {
            size_t len;
            const uint8_t *b = tokenizer_token_bytes(t, id, &len);
            if (len == 1 && b[0] == smile[k]) ids[k] = id;
        }
        CU_ASSERT_FATAL(ids[k] >= 0);
    }
    size_t cap = tokenizer_detok_max_out(t), n;
    char *out = malloc(cap);
    tokenizer_detok d;
    tokenizer_detok_init(&d, t);
    status st = {0};
    for (int k = 0; k < 3; k++) {
        CU_ASSERT_EQUAL(tokenizer_detok_push(&d, ids[k], out, cap, &n, &st), STATUS_OK);
        CU_ASSERT_EQUAL(n, 0);
    }
    /* An unknown id fails and leaves the pending bytes alone. */
    CU_ASSERT_EQUAL(tokenizer_detok_push(&d, 100000, out, cap, &n, &st), STATUS_RANGE);
    CU_ASSERT_EQUAL(tokenizer_detok_push(&d, ids[3], out, cap, &n, &st), STATUS_OK);
    CU_ASSERT(n == 4 && !memcmp(out, smile, 4));
    CU_ASSERT_EQUAL(tokenizer_detok_flush(&d, out, cap), 0);
    /* An incomplete tail is flushed as one U+FFFD; the struct is then reusable. */
    tokenizer_detok_push(&d, ids[0], out, cap, &n, &st);
    tokenizer_detok_push(&d, ids[1], out, cap, &n, &st);
    CU_ASSERT_EQUAL(n, 0);
    CU_ASSERT(tokenizer_detok_flush(&d, out, cap) == 3 && !memcmp(out, "\xEF\xBF\xBD", 3));
    /* A broken prefix followed by ASCII: U+FFFD then the ASCII, at once. */
    tokenizer_detok_push(&d, ids[0], out, cap, &n, &st);
    int32_t *a;
    size_t na = enc("A", &a);
    CU_ASSERT_FATAL(na == 1);
    CU_ASSERT_EQUAL(tokenizer_detok_push(&d, a[0], out, cap, &n, &st), STATUS_OK);
    CU_ASSERT(n == 4 && !memcmp(out, "\xEF\xBF\xBD" "A", 4));
    CU_ASSERT_EQUAL(tokenizer_detok_flush(&d, out, cap), 0);
    free(a);
    free(out);
}

/* Valid sequences: encode random reference-like text, stream-decode, get the text back. */
static void test_detok_roundtrip(void)
{
    const char *parts[] = {"Hello", ", ", "wörld", "日本語", "🙂🚀", "\n", "  ", "Café",
                           "<|im_end|>", "3.14", "naïve", "\t", "ß", "ǅ"};
    unsigned seed = 99;
    for (int iter = 0; iter < 500; iter++) {
        char text[512];
        size_t len = 0;
        int k = rand_r(&seed) % 12;
        for (int i = 0; i < k; i++) {
            const char *p = parts[rand_r(&seed) % (sizeof parts / sizeof *parts)];
            memcpy(text + len, p, strlen(p));
            len += strlen(p);
        }
        text[len] = 0;
        int32_t *ids;
        size_t n = enc(text, &ids), ls;
        int ok;
        char *s = stream_decode(ref_tok[0], ids, n, &ls, &ok);
        CU_ASSERT(ok && ls == len && !memcmp(s, text, len));
        free(s);
        free(ids);
    }
}

/* Random texts from awkward pieces (combining marks in every order, jamo, kana with voicing
 * marks, CJK, emoji, invalid bytes, special-token fragments): encode never crashes, rejects
 * exactly the invalid UTF-8, and decode(encode(x)) equals utf8proc's NFC of the whole of x (an
 * independent check of the encoder's run-wise NFC). */
static void test_roundtrip_nfc_random(void)
{
    static const char *const pieces[] = {
        "a", "e", "Q", " ", "\n", "<|im_end|>", "<|im_", "|>", "7", "!",
        "\xCC\x81", "\xCC\x87", "\xCC\xA3", "\xCC\x88", "\xCD\x85", "\xE1\x9C\x94",
        "\xE1\x84\x80", "\xE1\x85\xA1", "\xE1\x86\xA8", "\xEA\xB0\x80",
        "\xE3\x81\x8B", "\xE3\x82\x99", "\xE3\x82\x9A", "\xE3\x83\x8F", "\xE4\xB8\x80",
        "\xE2\x84\xAB", "\xE0\xAD\x87", "\xE0\xAC\xBE", "\xE0\xA5\x98", "\xC3\xA9",
        "\xF0\x9F\x99\x82", "\xEF\xAC\x81", "\x80", "\xC3", "\xED\xA0\x80",
    };
    unsigned seed = 2024;
    int n_valid = 0, n_invalid = 0;
    for (int iter = 0; iter < 4000; iter++) {
        char text[256];
        size_t len = 0;
        int k = rand_r(&seed) % 16;
        for (int i = 0; i < k; i++) {
            const char *p = pieces[rand_r(&seed) % (sizeof pieces / sizeof *pieces)];
            memcpy(text + len, p, strlen(p));
            len += strlen(p);
        }
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t nl = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len,
                                           &nfc, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        status st = {0};
        int32_t *ids;
        size_t n;
        int rc = tokenizer_encode(ref_tok[0], text, len, &ids, &n, &st);
        if (nl < 0) { /* invalid UTF-8 by utf8proc: the tokenizer must say so too */
            CU_ASSERT_EQUAL(rc, STATUS_INVALID);
            n_invalid++;
            continue;
        }
        CU_ASSERT_EQUAL_FATAL(rc, STATUS_OK);
        n_valid++;
        char *out;
        size_t ol;
        CU_ASSERT_EQUAL_FATAL(tokenizer_decode(ref_tok[0], ids, n, &out, &ol, &st), STATUS_OK);
        int same = ol == (size_t)nl && !memcmp(out, nfc, ol);
        if (!same) fprintf(stderr, "NFC round trip differs for '%s'\n", text);
        CU_ASSERT(same);
        free(out);
        free(ids);
        free(nfc);
    }
    CU_ASSERT(n_valid > 500 && n_invalid > 500);
}

typedef struct job {
    const char *const *texts;
    int n_texts;
    int32_t **want;
    size_t *n_want;
    int mismatches;
} job;

static void *encode_worker(void *arg)
{
    job *j = arg;
    for (int rep = 0; rep < 40; rep++)
        for (int i = 0; i < j->n_texts; i++) {
            status st = {0};
            int32_t *ids;
            size_t n;
            if (tokenizer_encode(ref_tok[0], j->texts[i], strlen(j->texts[i]), &ids, &n, &st) ||
                n != j->n_want[i] || memcmp(ids, j->want[i], n * sizeof *ids))
                j->mismatches++;
            free(ids);
        }
    return NULL;
}

static void test_concurrent_encode(void)
{
    static const char *const texts[] = {
        "The quick brown fox jumps over the lazy dog.", "e\xCC\x81 versus \xC3\xA9",
        "<|im_start|>user\nHi there<|im_end|>\n", "  leading and   multiple spaces ",
        "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", "I'm sure you're right; they've said it's theirs."};
    int n = (int)(sizeof texts / sizeof *texts);
    int32_t *want[6];
    size_t n_want[6];
    for (int i = 0; i < n; i++) n_want[i] = enc(texts[i], &want[i]);
    pthread_t th[4];
    job jobs[4];
    for (int k = 0; k < 4; k++) {
        jobs[k] = (job){texts, n, want, n_want, 0};
        CU_ASSERT_EQUAL_FATAL(pthread_create(&th[k], NULL, encode_worker, &jobs[k]), 0);
    }
    for (int k = 0; k < 4; k++) {
        pthread_join(th[k], NULL);
        CU_ASSERT_EQUAL(jobs[k].mismatches, 0);
    }
    for (int i = 0; i < n; i++) free(want[i]);
}

/* Writes a GGUF with the r2 model's tokenizer KVs, with one KV changed or left out. */
static int write_gguf(const char *path, const char *model, const char *pre, int with_merges)
{
    status st = {0};
    const tokenizer *r = ref_tok[0];
    size_t V = tokenizer_n_vocab(r);
    const char **toks = malloc(V * sizeof *toks);
    int32_t *types = malloc(V * sizeof *types);
    for (size_t i = 0; i < V; i++) {
        toks[i] = tokenizer_token_text(r, (int32_t)i, NULL);
        types[i] = tokenizer_token_type(r, (int32_t)i);
    }
    const char *merges[] = {"Ġ a", "h e"};
    gguf_writer *w;
    if (gguf_writer_create(&w, path, &st)) return -1;
    gguf_writer_set_str(w, "general.architecture", "qwen35");
    gguf_writer_set_str(w, "tokenizer.ggml.model", model);
    if (pre) gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, V);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_VTYPE_INT32, types, V);
    if (with_merges) gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)V - 3);
    int rc = gguf_writer_begin_data(w, &st) || gguf_writer_finish(w, &st);
    if (rc) fprintf(stderr, "write %s: %s\n", path, st.msg);
    gguf_writer_destroy(w);
    free(toks);
    free(types);
    return rc;
}

static void test_gguf_load(void)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_test_%d.gguf", testutil_tmp_dir(), (int)getpid());
    status st = {0};
    tokenizer *t;

    CU_ASSERT_EQUAL_FATAL(write_gguf(path, "gpt2", NULL, 1), 0);
    CU_ASSERT_EQUAL(tokenizer_load_path(&t, path, &st), STATUS_OK);
    if (t) {
        int32_t *ids;
        size_t n = enc_t(t, " a<|im_end|>", &ids);
        int32_t ga = -1; /* the id of "Ġa": 256 in tiny-r2-tied, 258 in own-r2-tied */
        for (int32_t i = 0; i < (int32_t)tokenizer_n_vocab(t) && ga < 0; i++) {
            const char *tx = tokenizer_token_text(t, i, NULL);
            if (tx && !strcmp(tx, "\xC4\xA0" "a")) ga = i;
        }
        CU_ASSERT(ga >= 256);
        CU_ASSERT(n == 2 && ids[0] == ga && ids[1] == 1026);
        CU_ASSERT_EQUAL(tokenizer_eos_id(t), 1026);
        CU_ASSERT_EQUAL(tokenizer_bos_id(t), -1);
        free(ids);
        tokenizer_destroy(t);
    }
    CU_ASSERT_EQUAL_FATAL(write_gguf(path, "llama", "qwen35", 1), 0);
    CU_ASSERT_EQUAL(tokenizer_load_path(&t, path, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "llama"));
    CU_ASSERT_EQUAL_FATAL(write_gguf(path, "gpt2", "llama-bpe", 1), 0);
    CU_ASSERT_EQUAL(tokenizer_load_path(&t, path, &st), STATUS_UNSUPPORTED);
    CU_ASSERT_EQUAL_FATAL(write_gguf(path, "gpt2", "qwen35", 0), 0);
    CU_ASSERT_EQUAL(tokenizer_load_path(&t, path, &st), STATUS_NOT_FOUND);
    CU_ASSERT_PTR_NOT_NULL(strstr(st.msg, "tokenizer.ggml.merges"));
    remove(path);
    CU_ASSERT_NOT_EQUAL(tokenizer_load_path(&t, path, &st), STATUS_OK);
    CU_ASSERT_PTR_NULL(t);
}

int main(void)
{
    if (CU_initialize_registry() != CUE_SUCCESS) return 1;
    CU_pSuite s = CU_add_suite("tokenizer", suite_init, suite_clean);
    CU_add_test(s, "reference cases (ids, decode, stream)", test_reference_cases);
    CU_add_test(s, "special ids and lookups", test_special_ids);
    CU_add_test(s, "special tokens in text", test_special_in_text);
    CU_add_test(s, "empty and invalid input", test_empty_and_invalid);
    CU_add_test(s, "NFC", test_nfc);
    CU_add_test(s, "BPE rank order", test_bpe_rank_order);
    CU_add_test(s, "specials longest first", test_specials_longest_first);
    CU_add_test(s, "create errors", test_create_errors);
    CU_add_test(s, "detok random ids", test_detok_random);
    CU_add_test(s, "detok holds back", test_detok_holds_back);
    CU_add_test(s, "detok roundtrip", test_detok_roundtrip);
    CU_add_test(s, "round trip = NFC (random)", test_roundtrip_nfc_random);
    CU_add_test(s, "concurrent encode", test_concurrent_encode);
    CU_add_test(s, "gguf load", test_gguf_load);
    return testutil_cunit_run();
}
