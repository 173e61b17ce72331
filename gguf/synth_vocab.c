/* Deterministic byte-level BPE vocabulary for synthetic qwen35 files (synth_vocab.h). */
#include "gguf/synth_vocab.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QWEN_REAL_VOCAB 248320u
#define QWEN_FIRST_SPECIAL 248044u
#define MAX_VOCAB (1u << 20)
#define MAX_TOKEN_RAW 64 /* longest raw (byte) string of a merged token */

/* Qwen3.5's special tokens in id order from 248044 (docs/QWEN35.md §1.6). The seven audio/tts
 * names (248070..248076) follow Qwen's omni tokenizers; the text models never emit them. */
static const char *const qwen_specials[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>",
    "<tts_text_eod>", "<tts_text_bos_single>", "<|audio_pad|>",
};
#define N_QWEN_SPECIALS ((uint32_t)(sizeof qwen_specials / sizeof qwen_specials[0]))
/* The core set for very small vocabularies, in this order. */
static const char *const core_specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                            "<think>", "</think>"};
#define N_CORE_SPECIALS 5u

/* Whitespace, punctuation and code pieces the qwen35 pre-tokenizer keeps together. */
static const char *const pieces[] = {
    "  ", "    ", "        ", "\n\n", "\n\n\n", "\t", "\t\t", " \n", ".\n", ".\n\n", ",\n",
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", " (", " \"", " '", "()", "();", ");", "{\n",
    "},", "}\n", "...", "--", "==", "->", "//", "/*", "*/", "\":", "\",", " =", " ==", " +",
    " -", " *", " /", " {", " }", " [", " ]", " <", " >", " #", " $", " %", " &", " |",
};

/* Common English and code words; each goes in as " word", "word" and " Word". */
static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "it", "you", "that", "he", "was", "for", "on",
    "are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or",
    "had", "by", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all",
    "there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do",
    "their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would",
    "like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has",
    "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most",
    "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down",
    "side", "been", "now", "find", "any", "new", "work", "part", "take", "get", "place",
    "made", "live", "where", "after", "back", "little", "only", "round", "man", "year",
    "came", "show", "every", "good", "me", "give", "our", "under", "name", "very",
    "through", "just", "form", "sentence", "great", "think", "say", "help", "low", "line",
    "turn", "cause", "much", "mean", "before", "move", "right", "old", "too", "same",
    "tell", "does", "set", "three", "want", "air", "well", "also", "play", "small", "end",
    "put", "home", "read", "hand", "large", "add", "even", "land", "here", "must", "big",
    "high", "such", "follow", "why", "ask", "change", "went", "light", "kind", "off",
    "need", "house", "try", "again", "point", "world", "near", "build", "self", "earth",
    "head", "stand", "own", "page", "should", "country", "found", "answer", "school",
    "still", "learn", "food", "between", "state", "keep", "never", "last", "let", "thought",
    "city", "tree", "start", "might", "story", "far", "left", "run", "while", "close",
    "night", "real", "life", "few", "question", "model", "token", "data", "value", "return",
    "function", "import", "class", "def", "int", "void", "const", "struct", "include",
    "print", "true", "false", "null", "string", "list", "error", "file", "user",
    "assistant", "system", "hello", "thank", "please", "because", "example", "however",
    "information", "important", "different", "following", "problem", "result",
};

/* Letters by English frequency: the fill enumerates letter strings in this rank order. */
static const char freq_letters[] = "etaoinshrdlcumwfgypbvkjxqz";

/* ---- GPT-2 byte-to-unicode ---------------------------------------------------------- */

typedef struct byte_map {
    uint32_t cp[256];      /* byte -> code point */
    uint8_t byte_of[256];  /* token id (0..255) -> byte */
    uint32_t id_of[256];   /* byte -> token id */
} byte_map;

static void byte_map_init(byte_map *m)
{
    bool printable[256] = {false};
    for (int b = 33; b <= 126; b++) printable[b] = true;
    for (int b = 161; b <= 172; b++) printable[b] = true;
    for (int b = 174; b <= 255; b++) printable[b] = true;
    uint32_t id = 0, extra = 0;
    for (int b = 0; b < 256; b++)
        if (printable[b]) {
            m->cp[b] = (uint32_t)b;
            m->byte_of[id] = (uint8_t)b;
            m->id_of[b] = id++;
        }
    for (int b = 0; b < 256; b++)
        if (!printable[b]) {
            m->cp[b] = 256 + extra++;
            m->byte_of[id] = (uint8_t)b;
            m->id_of[b] = id++;
        }
    DS_ASSERT(id == 256);
}

/* Writes the UTF-8 of code point cp (< 0x800 here) to out; returns the byte count. */
static int utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    DS_ASSERT(cp < 0x800);
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

/* ---- builder ----------------------------------------------------------------------- */

typedef struct builder {
    byte_map bm;
    uint32_t limit;   /* ids [0, limit) are byte or merged tokens */
    uint32_t n;       /* tokens so far */
    uint32_t n_merge; /* merges so far */
    char *text;       /* owned, arena of mapped strings (NUL-terminated) */
    uint64_t text_len, text_cap;
    uint64_t *tok_off;   /* owned, [n_vocab] offset of each token string in text */
    uint64_t *merge_off; /* owned, [limit] offset of each merge string in text */
    uint8_t *raw;        /* owned, [limit * MAX_TOKEN_RAW] raw bytes of each token */
    uint8_t *raw_len;    /* owned, [limit] */
    uint32_t *slots;     /* owned, [n_slots] hash of raw strings: id + 1, 0 empty */
    uint32_t n_slots;
    bool oom;
} builder;

static uint64_t fnv1a(const uint8_t *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 1099511628211ull;
    return h;
}

/* Appends n bytes (plus a NUL when nul) to the text arena; returns the start offset. */
static uint64_t text_put(builder *b, const char *s, size_t n, bool nul)
{
    if (b->text_len + n + 1 > b->text_cap) {
        uint64_t cap = b->text_cap ? b->text_cap * 2 : 1 << 16;
        while (cap < b->text_len + n + 1) cap *= 2;
        char *t = realloc(b->text, cap);
        if (!t) {
            b->oom = true;
            return 0;
        }
        b->text = t;
        b->text_cap = cap;
    }
    uint64_t off = b->text_len;
    memcpy(b->text + off, s, n);
    b->text_len += n;
    if (nul) b->text[b->text_len++] = '\0';
    return off;
}

/* Appends the mapped form of raw bytes (no NUL). */
static void text_put_mapped(builder *b, const uint8_t *raw, size_t n)
{
    char buf[2 * MAX_TOKEN_RAW];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (size_t)utf8_put(b->bm.cp[raw[i]], buf + k);
    text_put(b, buf, k, false);
}

static uint32_t *slot_of(builder *b, const uint8_t *raw, size_t n)
{
    uint32_t mask = b->n_slots - 1;
    for (uint32_t i = (uint32_t)fnv1a(raw, n) & mask;; i = (i + 1) & mask) {
        uint32_t v = b->slots[i];
        if (!v) return &b->slots[i];
        const uint8_t *r = b->raw + (uint64_t)(v - 1) * MAX_TOKEN_RAW;
        if (b->raw_len[v - 1] == n && !memcmp(r, raw, n)) return &b->slots[i];
    }
}

/* Registers token id n with raw bytes; its mapped string must already be at text_len. */
static void add_raw(builder *b, const uint8_t *raw, size_t n)
{
    memcpy(b->raw + (uint64_t)b->n * MAX_TOKEN_RAW, raw, n);
    b->raw_len[b->n] = (uint8_t)n;
    *slot_of(b, raw, n) = b->n + 1;
    b->n++;
}

/* Makes sure the token of raw bytes exists, adding its prefix first (merge = prefix + last
 * byte). Returns its id, or -1 when the budget of merged tokens ran out. */
static int64_t ensure(builder *b, const uint8_t *raw, size_t n)
{
    DS_ASSERT(n >= 1 && n <= MAX_TOKEN_RAW);
    if (n == 1) return b->bm.id_of[raw[0]];
    uint32_t v = *slot_of(b, raw, n);
    if (v) return v - 1;
    int64_t left = ensure(b, raw, n - 1);
    if (left < 0 || b->n >= b->limit || b->oom) return -1;
    uint32_t right = b->bm.id_of[raw[n - 1]];
    /* merge "left right" (copied out first: text_put may move the arena) */
    char m[4 * MAX_TOKEN_RAW + 2];
    size_t nl = strlen(b->text + b->tok_off[left]), nr = strlen(b->text + b->tok_off[right]);
    DS_ASSERT(nl + nr + 1 < sizeof m);
    memcpy(m, b->text + b->tok_off[left], nl);
    m[nl] = ' ';
    memcpy(m + nl + 1, b->text + b->tok_off[right], nr);
    b->merge_off[b->n_merge++] = text_put(b, m, nl + 1 + nr, true);
    /* token "leftright" */
    b->tok_off[b->n] = b->text_len;
    text_put_mapped(b, raw, n);
    text_put(b, "", 0, true);
    if (b->oom) return -1;
    add_raw(b, raw, n);
    return b->n - 1;
}

static bool full(const builder *b) { return b->n >= b->limit || b->oom; }

static void ensure_str(builder *b, const char *s)
{
    size_t n = strlen(s);
    if (n <= MAX_TOKEN_RAW && !full(b)) ensure(b, (const uint8_t *)s, n);
}

static void add_words(builder *b)
{
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) ensure_str(b, pieces[i]);
    char buf[MAX_TOKEN_RAW + 2];
    for (size_t i = 0; i < sizeof words / sizeof words[0] && !full(b); i++) {
        snprintf(buf, sizeof buf, " %s", words[i]);
        ensure_str(b, buf);
    }
    for (size_t i = 0; i < sizeof words / sizeof words[0] && !full(b); i++) {
        ensure_str(b, words[i]);
        snprintf(buf, sizeof buf, " %s", words[i]);
        if (buf[1] >= 'a' && buf[1] <= 'z') buf[1] = (char)(buf[1] - 'a' + 'A');
        ensure_str(b, buf);
    }
    /* Latin-1 letters (UTF-8 C3 80..BF) and typographic punctuation as whole tokens. */
    for (int c = 0x80; c <= 0xBF && !full(b); c++) {
        uint8_t r[2] = {0xC3, (uint8_t)c};
        ensure(b, r, 2);
    }
    static const uint8_t typo[] = {0x94, 0x99, 0x9C, 0x9D, 0xA6}; /* — ’ “ ” … */
    for (size_t i = 0; i < sizeof typo && !full(b); i++) {
        uint8_t r[3] = {0xE2, 0x80, typo[i]};
        ensure(b, r, 3);
    }
}

/* Letter strings of length k (with and without a leading space) in order of increasing
 * letter-frequency rank sum, space-prefixed first on ties (a counting sort by score). */
static int add_level(builder *b, int k)
{
    uint32_t n_words = 1;
    for (int i = 0; i < k; i++) n_words *= 26;
    uint32_t n_cand = 2 * n_words, max_score = 25u * (uint32_t)k + 1;
    uint32_t *order = malloc(sizeof *order * n_cand);
    uint32_t *start = calloc(max_score + 2, sizeof *start);
    if (!order || !start) {
        free(order);
        free(start);
        return -1;
    }
    /* candidate c: letters index c >> 1 (base-26 digits = ranks, most significant first),
     * c & 1 set: no leading space. score = rank sum + (c & 1). */
#define SCORE(c, s)                                                       \
    do {                                                                  \
        uint32_t w_ = (c) >> 1;                                           \
        (s) = (c) & 1;                                                    \
        for (int j_ = 0; j_ < k; j_++, w_ /= 26) (s) += w_ % 26;          \
    } while (0)
    for (uint32_t c = 0; c < n_cand; c++) {
        uint32_t s;
        SCORE(c, s);
        start[s + 1]++;
    }
    for (uint32_t s = 1; s <= max_score + 1; s++) start[s] += start[s - 1];
    for (uint32_t c = 0; c < n_cand; c++) {
        uint32_t s;
        SCORE(c, s);
        order[start[s]++] = c;
    }
#undef SCORE
    for (uint32_t i = 0; i < n_cand && !full(b); i++) {
        uint32_t c = order[i];
        uint8_t raw[8];
        int n = 0;
        if (!(c & 1)) raw[n++] = ' ';
        uint32_t w = c >> 1;
        for (int j = k - 1; j >= 0; j--, w /= 26) raw[n + j] = (uint8_t)freq_letters[w % 26];
        n += k;
        if (n >= 2) ensure(b, raw, (size_t)n);
    }
    free(order);
    free(start);
    return 0;
}

static void builder_free(builder *b)
{
    free(b->text);
    free(b->tok_off);
    free(b->merge_off);
    free(b->raw);
    free(b->raw_len);
    free(b->slots);
}

int synth_vocab_build(synth_vocab *v, uint32_t n_vocab, status *st)
{
    memset(v, 0, sizeof *v);
    if (n_vocab < SYNTH_VOCAB_MIN || n_vocab > MAX_VOCAB)
        return status_fail(st, STATUS_RANGE, "synth vocab: size %u outside [%u, %u]", n_vocab,
                           SYNTH_VOCAB_MIN, MAX_VOCAB);
    const char *const *specials;
    uint32_t n_special, first_special;
    if (n_vocab >= QWEN_FIRST_SPECIAL + N_QWEN_SPECIALS) {
        specials = qwen_specials;
        n_special = N_QWEN_SPECIALS;
        first_special = QWEN_FIRST_SPECIAL;
    } else if (n_vocab >= 512 + N_QWEN_SPECIALS) {
        specials = qwen_specials;
        n_special = N_QWEN_SPECIALS;
        first_special = n_vocab - n_special;
    } else {
        specials = core_specials;
        n_special = N_CORE_SPECIALS;
        first_special = n_vocab - n_special;
    }

    builder b = {0};
    byte_map_init(&b.bm);
    b.limit = first_special;
    b.n_slots = 1;
    while (b.n_slots < 2 * first_special) b.n_slots <<= 1;
    b.tok_off = malloc(sizeof *b.tok_off * n_vocab);
    b.merge_off = malloc(sizeof *b.merge_off * first_special);
    b.raw = malloc((uint64_t)first_special * MAX_TOKEN_RAW);
    b.raw_len = malloc(first_special);
    b.slots = calloc(b.n_slots, sizeof *b.slots);
    v->tokens = malloc(sizeof *v->tokens * n_vocab);
    v->types = malloc(sizeof *v->types * n_vocab);
    if (!b.tok_off || !b.merge_off || !b.raw || !b.raw_len || !b.slots || !v->tokens ||
        !v->types)
        goto nomem;

    for (uint32_t id = 0; id < 256; id++) {
        uint8_t byte = b.bm.byte_of[id];
        char u[2];
        int k = utf8_put(b.bm.cp[byte], u);
        b.tok_off[id] = text_put(&b, u, (size_t)k, true);
        add_raw(&b, &byte, 1);
    }
    add_words(&b);
    for (int k = 1; k <= 4 && !full(&b); k++)
        if (add_level(&b, k)) goto nomem;
    if (b.oom) goto nomem;
    if (b.n != first_special) {
        builder_free(&b);
        synth_vocab_free(v);
        return status_fail(st, STATUS_RANGE, "synth vocab: only %u of %u merged tokens", b.n,
                           first_special);
    }
    for (uint32_t i = 0; i < n_special; i++)
        b.tok_off[first_special + i] = text_put(&b, specials[i], strlen(specials[i]), true);
    for (uint32_t id = first_special + n_special; id < n_vocab; id++) {
        char pad[32];
        int k = snprintf(pad, sizeof pad, "[PAD%u]", id);
        b.tok_off[id] = text_put(&b, pad, (size_t)k, true);
    }
    if (b.oom) goto nomem;
    v->merges = malloc(sizeof *v->merges * (b.n_merge ? b.n_merge : 1));
    if (!v->merges) goto nomem;

    /* The arena is final: turn offsets into pointers. */
    v->arena = b.text;
    b.text = NULL;
    v->n_tokens = n_vocab;
    for (uint32_t id = 0; id < n_vocab; id++) {
        v->tokens[id] = v->arena + b.tok_off[id];
        v->types[id] = id < first_special                  ? SYNTH_TOKEN_NORMAL
                       : id < first_special + n_special ? SYNTH_TOKEN_CONTROL
                                                          : SYNTH_TOKEN_UNUSED;
    }
    v->n_merges = b.n_merge;
    for (uint32_t i = 0; i < b.n_merge; i++) v->merges[i] = v->arena + b.merge_off[i];
    v->first_special = first_special;
    v->n_special = n_special;
    v->endoftext_id = first_special;
    v->im_start_id = first_special + 1;
    v->im_end_id = first_special + 2;
    for (uint32_t i = 0; i < n_special; i++) {
        if (!strcmp(specials[i], "<think>")) v->think_id = first_special + i;
        if (!strcmp(specials[i], "</think>")) v->think_end_id = first_special + i;
    }
    builder_free(&b);
    return 0;

nomem:
    builder_free(&b);
    synth_vocab_free(v);
    return status_fail(st, STATUS_NOMEM, "synth vocab: out of memory building %u tokens",
                       n_vocab);
}

void synth_vocab_free(synth_vocab *v)
{
    free((void *)v->tokens);
    free(v->types);
    free((void *)v->merges);
    free(v->arena);
    memset(v, 0, sizeof *v);
}

/* gguf/synth_qwen35_chat_template.jinja as bytes, NUL-terminated (//gguf:synth_template_gen). */
extern const char synth_qwen35_chat_template[];

const char *synth_vocab_chat_template(synth_template t)
{
    if (t == SYNTH_TEMPLATE_QWEN35) return synth_qwen35_chat_template;
    return "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
}

int synth_template_parse(const char *name)
{
    if (name && !strcmp(name, "qwen35")) return SYNTH_TEMPLATE_QWEN35;
    if (name && !strcmp(name, "chatml")) return SYNTH_TEMPLATE_CHATML;
    return -1;
}
