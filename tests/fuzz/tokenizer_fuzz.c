/* libFuzzer target for the tokenizer (built by tools/fuzz with clang
 * -fsanitize=fuzzer,address,undefined), on the reference model's vocabulary ($DS_FUZZ_TOKENIZER,
 * else tiny-r2-tied.gguf in $DS_REFERENCE_DIR or ../shared/reference). The first input byte
 * picks the mode, the rest is the payload:
 *   text  encode: either STATUS_INVALID exactly when utf8proc rejects the bytes, or ids in the
 *         vocabulary whose decode is the text with each piece between special tokens put
 *         through utf8proc's NFC on its own (specials are matched in the raw text first, as
 *         Hugging Face does, so "<|im_end|>" + U+0338 keeps its '>' and does not become
 *         U+226F), and whose streaming decode (push each id, then flush) is the same bytes;
 *   ids   the payload as int32s: decode fails with STATUS_RANGE exactly when an id is outside
 *         the vocabulary, else gives valid UTF-8 that the streaming decode reproduces; a push
 *         of a bad id fails and leaves the stream as it was.
 * Any check that fails aborts with the line, so libFuzzer keeps the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/status.h"
#include "model/tokenizer.h"

#define FUZZ_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "tokenizer_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static tokenizer *g_tok;
static char *g_buf; /* streaming output, room for every push of the longest input */
static size_t g_cap, g_max_out;
static tokenizer_text *g_specials; /* CONTROL and USER_DEFINED tokens' text */
static size_t g_n_specials;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    const char *path = getenv("DS_FUZZ_TOKENIZER");
    char buf[4096];
    if (!path) {
        const char *dir = getenv("DS_REFERENCE_DIR");
        snprintf(buf, sizeof buf, "%s/tiny-r2-tied.gguf", dir ? dir : "../shared/reference");
        path = buf;
    }
    status st = {0};
    if (tokenizer_load_path(&g_tok, path, &st)) {
        fprintf(stderr, "tokenizer_fuzz: %s\n", st.msg);
        exit(2);
    }
    g_max_out = tokenizer_detok_max_out(g_tok);
    const size_t V = tokenizer_n_vocab(g_tok);
    g_specials = calloc(V, sizeof *g_specials);
    FUZZ_CHECK(g_specials);
    for (size_t i = 0; i < V; i++) {
        const int32_t ty = tokenizer_token_type(g_tok, (int32_t)i);
        if (ty != TOKENIZER_TYPE_CONTROL && ty != TOKENIZER_TYPE_USER_DEFINED) continue;
        tokenizer_text *sp = &g_specials[g_n_specials++];
        sp->ptr = tokenizer_token_text(g_tok, (int32_t)i, &sp->len);
        FUZZ_CHECK(sp->ptr && sp->len);
    }
    return 0;
}

/* The expected decode of encode(text): the text split at special tokens (leftmost, then
 * longest, by a plain scan over every special), each piece between them NFC'd by utf8proc on
 * its own, the specials verbatim. malloc'd into *out; returns its length, or -1 when utf8proc
 * rejects a piece. */
static utf8proc_ssize_t expected_decode(const char *text, size_t len, char **out)
{
    char *e = malloc(len * 3 + 1); /* NFC grows a piece by at most 3x (Unicode's bound) */
    FUZZ_CHECK(e);
    size_t el = 0, piece = 0, i = 0;
    while (i <= len) {
        size_t best = 0;
        for (size_t k = 0; i < len && k < g_n_specials; k++) {
            const tokenizer_text *sp = &g_specials[k];
            if (sp->len > best && sp->len <= len - i && !memcmp(text + i, sp->ptr, sp->len))
                best = sp->len;
        }
        if (!best && i < len) {
            i++;
            continue;
        }
        if (i > piece) {
            utf8proc_uint8_t *m = NULL;
            const utf8proc_ssize_t ml = utf8proc_map((const utf8proc_uint8_t *)text + piece,
                                                     (utf8proc_ssize_t)(i - piece), &m,
                                                     UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            if (ml < 0) {
                free(e);
                return ml;
            }
            FUZZ_CHECK(el + (size_t)ml <= len * 3);
            memcpy(e + el, m, (size_t)ml);
            el += (size_t)ml;
            free(m);
        }
        if (i == len) break;
        memcpy(e + el, text + i, best);
        el += best;
        i += best;
        piece = i;
    }
    *out = e;
    return (utf8proc_ssize_t)el;
}

/* The streaming decode of ids into g_buf (grown as needed); returns its length. A push of an
 * id outside the vocabulary must fail with STATUS_RANGE, write nothing and change nothing. */
static size_t stream(const int32_t *ids, size_t n)
{
    const size_t V = tokenizer_n_vocab(g_tok);
    const size_t need = (n + 1) * g_max_out + 4;
    if (need > g_cap) {
        free(g_buf);
        g_buf = malloc(need);
        FUZZ_CHECK(g_buf);
        g_cap = need;
    }
    tokenizer_detok d;
    tokenizer_detok_init(&d, g_tok);
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        size_t w = 0;
        status st = {0};
        const tokenizer_detok before = d;
        const int rc = tokenizer_detok_push(&d, ids[i], g_buf + len, g_max_out, &w, &st);
        if (ids[i] < 0 || (size_t)ids[i] >= V) {
            FUZZ_CHECK(rc == STATUS_RANGE && w == 0 && !memcmp(&before, &d, sizeof d));
            continue;
        }
        FUZZ_CHECK(rc == STATUS_OK && w <= g_max_out);
        len += w;
    }
    len += tokenizer_detok_flush(&d, g_buf + len, 3);
    return len;
}

static bool valid_utf8(const char *s, size_t n)
{
    utf8proc_int32_t cp;
    for (size_t i = 0; i < n;) {
        const utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
                                                    (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0) return false;
        i += (size_t)k;
    }
    return true;
}

static void fuzz_text(const char *text, size_t len)
{
    char *nfc = NULL;
    const utf8proc_ssize_t nl = expected_decode(text, len, &nfc);
    int32_t *ids = NULL;
    size_t n = 0;
    status st = {0};
    const int rc = tokenizer_encode(g_tok, text, len, &ids, &n, &st);
    if (nl < 0) { /* utf8proc rejects it: so must the tokenizer, with a message */
        FUZZ_CHECK(rc == STATUS_INVALID && st.msg[0]);
        free(ids);
        return;
    }
    FUZZ_CHECK(rc == STATUS_OK);
    const size_t V = tokenizer_n_vocab(g_tok);
    for (size_t i = 0; i < n; i++) FUZZ_CHECK(ids[i] >= 0 && (size_t)ids[i] < V);
    char *out = NULL;
    size_t ol = 0;
    FUZZ_CHECK(tokenizer_decode(g_tok, ids, n, &out, &ol, &st) == STATUS_OK);
    FUZZ_CHECK(ol == (size_t)nl && !memcmp(out, nfc, ol)); /* decode(encode(x)) = NFC per piece */
    const size_t sl = stream(ids, n);
    FUZZ_CHECK(sl == ol && !memcmp(g_buf, out, ol));
    free(out);
    free(ids);
    free(nfc);
}

static void fuzz_ids(const uint8_t *p, size_t size)
{
    const size_t n = size / 4, V = tokenizer_n_vocab(g_tok);
    int32_t *ids = malloc(n * 4 + 4);
    FUZZ_CHECK(ids);
    memcpy(ids, p, n * 4);
    bool all_in = true;
    for (size_t i = 0; i < n; i++) {
        /* mostly in range: small values index the vocabulary, the high bit keeps some out */
        if (ids[i] >= 0) ids[i] %= (int32_t)(V + V / 64 + 1);
        all_in &= ids[i] >= 0 && (size_t)ids[i] < V;
    }
    char *out = NULL;
    size_t ol = 0;
    status st = {0};
    const int rc = tokenizer_decode(g_tok, ids, n, &out, &ol, &st);
    if (!all_in) {
        FUZZ_CHECK(rc == STATUS_RANGE && st.msg[0]);
    } else {
        FUZZ_CHECK(rc == STATUS_OK && out && out[ol] == '\0' && valid_utf8(out, ol));
        const size_t sl = stream(ids, n);
        FUZZ_CHECK(sl == ol && !memcmp(g_buf, out, ol));
    }
    stream(ids, n); /* bad ids in the stream: refused, the rest unchanged */
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0 || size > (1u << 16)) return 0;
    if (data[0] & 1)
        fuzz_ids(data + 1, size - 1);
    else
        fuzz_text((const char *)data + 1, size - 1);
    return 0;
}
