/* Tokenizer tables: creation from plain arrays or GGUF, lookups, special ids.
 * Encoding lives in tokenizer_encode.c, decoding in tokenizer_detok.c. */
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_internal.h"

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 byte values
 * to U+0100 + n in byte order. The inverse covers code points < 324. */
static void byte_map_build(uint32_t byte_cp[256], int16_t cp_byte[324])
{
    for (int i = 0; i < 324; i++) cp_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_cp[b] = self ? (uint32_t)b : (uint32_t)(256 + n++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

/* Decodes one UTF-8 code point at p[0..n) (already validated); returns its length. */
static size_t utf8_next(const uint8_t *p, size_t n, uint32_t *cp)
{
    uint8_t b = p[0];
    size_t len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    DS_ASSERT(len <= n);
    uint32_t c = len == 1 ? b : len == 2 ? (b & 0x1Fu) : len == 3 ? (b & 0x0Fu) : (b & 0x07u);
    for (size_t i = 1; i < len; i++) c = (c << 6) | (p[i] & 0x3Fu);
    *cp = c;
    return len;
}

uint64_t tokenizer_hash_bytes(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return tokenizer_hash_u64(h);
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 16;
    while (p < n) p <<= 1;
    return p;
}

int32_t tokenizer_text_find(const tokenizer *t, const char *p, size_t n)
{
    uint64_t h = tokenizer_hash_bytes(p, n);
    uint32_t hi = (uint32_t)(h >> 32);
    for (size_t i = h & t->text_map_mask;; i = (i + 1) & t->text_map_mask) {
        int32_t id = t->text_map[i].id;
        if (id < 0) return -1;
        if (t->text_map[i].hash == hi && t->text_len[id] == n &&
            !memcmp(t->text + t->text_off[id], p, n))
            return id;
    }
}

/* Inserts (left, right) -> (rank, id) unless the pair is already there (first rank wins). */
static void pair_insert(tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t id)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t i = tokenizer_hash_u64(key) & t->pair_mask;
    for (;; i = (i + 1) & t->pair_mask) {
        tokenizer_pair *p = &t->pairs[i];
        if (p->key == key) return;
        if (p->key == TOKENIZER_PAIR_EMPTY) {
            *p = (tokenizer_pair){key, rank, id};
            t->n_merges++;
            return;
        }
    }
}

/* Copies texts and types, computes each token's bytes, fills the text map. */
static int vocab_build(tokenizer *t, const tokenizer_spec *spec, status *st)
{
    size_t n = spec->n_tokens, total = 0;
    for (size_t i = 0; i < n; i++) {
        if (spec->tokens[i].len > UINT32_MAX / 4)
            return status_fail(st, STATUS_FORMAT, "tokenizer: token %zu is %zu bytes long", i,
                               spec->tokens[i].len);
        total += spec->tokens[i].len + 1;
    }
    t->n_vocab = n;
    t->types = malloc(n * sizeof *t->types);
    t->text = malloc(total);
    t->text_off = malloc(n * sizeof *t->text_off);
    t->text_len = malloc(n * sizeof *t->text_len);
    t->bytes = malloc(total);
    t->bytes_off = malloc(n * sizeof *t->bytes_off);
    t->bytes_len = malloc(n * sizeof *t->bytes_len);
    t->text_map_mask = pow2_at_least(2 * n) - 1;
    t->text_map = malloc((t->text_map_mask + 1) * sizeof *t->text_map);
    if (!t->types || !t->text || !t->text_off || !t->text_len || !t->bytes || !t->bytes_off ||
        !t->bytes_len || !t->text_map)
        return status_fail(st, STATUS_NOMEM, "tokenizer: out of memory for %zu tokens", n);
    memset(t->text_map, 0xff, (t->text_map_mask + 1) * sizeof *t->text_map);

    uint32_t byte_cp[256];
    int16_t cp_byte[324];
    byte_map_build(byte_cp, cp_byte);

    size_t off = 0, boff = 0;
    for (size_t i = 0; i < n; i++) {
        const tokenizer_text *s = &spec->tokens[i];
        int32_t type = spec->token_types ? spec->token_types[i] : TOKENIZER_TYPE_NORMAL;
        t->types[i] = type;
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)s->len;
        if (s->len) memcpy(t->text + off, s->ptr, s->len);
        t->text[off + s->len] = 0;

        /* Bytes: reverse byte mapping when every character is in the mapping (HF's ByteLevel
         * decoder), else the text itself (special tokens such as "<|im_end|>" map to
         * themselves either way). */
        const uint8_t *u = (const uint8_t *)t->text + off;
        size_t nb = 0;
        bool mapped = tokenizer_utf8_check(u, s->len) == s->len;
        for (size_t j = 0; mapped && j < s->len;) {
            uint32_t cp;
            j += utf8_next(u + j, s->len - j, &cp);
            if (cp >= 324 || cp_byte[cp] < 0) mapped = false;
            else t->bytes[boff + nb++] = (uint8_t)cp_byte[cp];
        }
        if (!mapped) {
            memcpy(t->bytes + boff, u, s->len);
            nb = s->len;
        }
        t->bytes_off[i] = boff;
        t->bytes_len[i] = (uint32_t)nb;
        if (nb > t->max_token_bytes) t->max_token_bytes = nb;
        off += s->len + 1;
        boff += nb;

        uint64_t hash = tokenizer_hash_bytes(s->ptr, s->len);
        uint32_t hi = (uint32_t)(hash >> 32);
        for (size_t h = hash & t->text_map_mask;; h = (h + 1) & t->text_map_mask) {
            int32_t id = t->text_map[h].id;
            if (id < 0) {
                t->text_map[h] = (struct tokenizer_slot){hi, (int32_t)i};
                break;
            }
            if (t->text_map[h].hash == hi && t->text_len[id] == s->len &&
                !memcmp(t->text + t->text_off[id], s->ptr, s->len))
                break; /* duplicate text: the first id wins */
        }
    }

    for (int b = 0; b < 256; b++) {
        char u[2];
        size_t ul = 1;
        if (byte_cp[b] < 0x80) {
            u[0] = (char)byte_cp[b];
        } else {
            u[0] = (char)(0xC0 | (byte_cp[b] >> 6));
            u[1] = (char)(0x80 | (byte_cp[b] & 0x3F));
            ul = 2;
        }
        t->byte_id[b] = tokenizer_text_find(t, u, ul);
        if (t->byte_id[b] < 0)
            return status_fail(st, STATUS_FORMAT,
                               "tokenizer: no token for byte 0x%02x (text U+%04X): not a "
                               "byte-level BPE vocabulary",
                               b, byte_cp[b]);
    }
    return STATUS_OK;
}

/* Resolves "left right" merges to id pairs; merges naming unknown tokens are skipped, as a
 * merge whose result is not in the vocabulary could never produce a token. */
static int merges_build(tokenizer *t, const tokenizer_spec *spec, status *st)
{
    size_t max_len = 0;
    for (size_t i = 0; i < spec->n_merges; i++)
        if (spec->merges[i].len > max_len) max_len = spec->merges[i].len;
    if (spec->n_merges > INT32_MAX)
        return status_fail(st, STATUS_FORMAT, "tokenizer: %zu merges", spec->n_merges);
    t->pair_mask = pow2_at_least(2 * spec->n_merges) - 1;
    t->pairs = malloc((t->pair_mask + 1) * sizeof *t->pairs);
    char *cat = malloc(max_len + 1);
    if (!t->pairs || !cat) {
        free(cat);
        return status_fail(st, STATUS_NOMEM, "tokenizer: out of memory for %zu merges",
                           spec->n_merges);
    }
    for (size_t i = 0; i <= t->pair_mask; i++) t->pairs[i].key = TOKENIZER_PAIR_EMPTY;

    for (size_t i = 0; i < spec->n_merges; i++) {
        const char *m = spec->merges[i].ptr;
        size_t len = spec->merges[i].len;
        const char *sp = len ? memchr(m, ' ', len) : NULL;
        if (!sp || sp == m || sp == m + len - 1) {
            free(cat);
            return status_fail(st, STATUS_FORMAT,
                               "tokenizer: merge %zu '%.*s' is not 'left right'", i,
                               (int)(len > 64 ? 64 : len), m);
        }
        size_t nl = (size_t)(sp - m), nr = len - nl - 1;
        int32_t left = tokenizer_text_find(t, m, nl);
        int32_t right = tokenizer_text_find(t, sp + 1, nr);
        memcpy(cat, m, nl);
        memcpy(cat + nl, sp + 1, nr);
        int32_t id = tokenizer_text_find(t, cat, nl + nr);
        if (left < 0 || right < 0 || id < 0) continue;
        pair_insert(t, left, right, (int32_t)i, id);
    }
    free(cat);
    return STATUS_OK;
}

static int special_cmp(const void *a, const void *b, void *arg)
{
    const tokenizer *t = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint8_t fx = (uint8_t)t->text[t->text_off[x]], fy = (uint8_t)t->text[t->text_off[y]];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (t->text_len[x] != t->text_len[y]) return t->text_len[x] > t->text_len[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Special tokens matched in text: CONTROL and USER_DEFINED, grouped by first byte, longest
 * first, so the first hit at a position is the longest. */
static int specials_build(tokenizer *t, status *st)
{
    size_t n = 0;
    for (size_t i = 0; i < t->n_vocab; i++)
        if ((t->types[i] == TOKENIZER_TYPE_CONTROL || t->types[i] == TOKENIZER_TYPE_USER_DEFINED) &&
            t->text_len[i] > 0 && tokenizer_text_find(t, t->text + t->text_off[i],
                                                      t->text_len[i]) == (int32_t)i)
            n++;
    t->special_ids = malloc((n ? n : 1) * sizeof *t->special_ids);
    if (!t->special_ids) return status_fail(st, STATUS_NOMEM, "tokenizer: out of memory");
    n = 0;
    for (size_t i = 0; i < t->n_vocab; i++)
        if ((t->types[i] == TOKENIZER_TYPE_CONTROL || t->types[i] == TOKENIZER_TYPE_USER_DEFINED) &&
            t->text_len[i] > 0 && tokenizer_text_find(t, t->text + t->text_off[i],
                                                      t->text_len[i]) == (int32_t)i)
            t->special_ids[n++] = (int32_t)i;
    t->n_special = n;
    qsort_r(t->special_ids, n, sizeof *t->special_ids, special_cmp, t);
    size_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < n && (uint8_t)t->text[t->text_off[t->special_ids[k]]] < b) k++;
        t->special_start[b] = (uint32_t)k;
    }
    return STATUS_OK;
}

int tokenizer_create(tokenizer **out, const tokenizer_spec *spec, status *st)
{
    *out = NULL;
    if (spec->n_tokens == 0 || spec->n_tokens > INT32_MAX)
        return status_fail(st, STATUS_FORMAT, "tokenizer: %zu tokens", spec->n_tokens);
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) return status_fail(st, STATUS_NOMEM, "tokenizer: out of memory");
    int rc;
    if ((rc = vocab_build(t, spec, st)) || (rc = merges_build(t, spec, st)) ||
        (rc = specials_build(t, st)) || (rc = tokenizer_regex_compile(t, spec->pre, st)))
        goto fail;
    if (spec->eos_id >= (int64_t)spec->n_tokens || spec->bos_id >= (int64_t)spec->n_tokens) {
        rc = status_fail(st, STATUS_FORMAT, "tokenizer: eos id %d / bos id %d out of range %zu",
                         spec->eos_id, spec->bos_id, spec->n_tokens);
        goto fail;
    }
    t->eos = spec->eos_id < 0 ? -1 : spec->eos_id;
    t->bos = spec->bos_id < 0 ? -1 : spec->bos_id;
    t->im_start = tokenizer_find_token(t, "<|im_start|>");
    t->im_end = tokenizer_find_token(t, "<|im_end|>");
    t->endoftext = tokenizer_find_token(t, "<|endoftext|>");
    if (spec->chat_template.ptr) {
        t->chat_template = malloc(spec->chat_template.len + 1);
        if (!t->chat_template) {
            rc = status_fail(st, STATUS_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
        memcpy(t->chat_template, spec->chat_template.ptr, spec->chat_template.len);
        t->chat_template[spec->chat_template.len] = 0;
        t->chat_template_len = spec->chat_template.len;
    }
    *out = t;
    return STATUS_OK;
fail:
    tokenizer_destroy(t);
    return rc;
}

void tokenizer_destroy(tokenizer *t)
{
    if (!t) return;
    if (t->re) pcre2_code_free(t->re);
    free(t->chat_template);
    free(t->special_ids);
    free(t->pairs);
    free(t->text_map);
    free(t->bytes_len);
    free(t->bytes_off);
    free(t->bytes);
    free(t->text_len);
    free(t->text_off);
    free(t->text);
    free(t->types);
    free(t);
}

/* A string-array KV as tokenizer_text[] (malloc'd). */
static int kv_texts(const gguf_file *f, const char *key, tokenizer_text **out, size_t *n,
                    status *st)
{
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return status_fail(st, STATUS_NOT_FOUND, "%s: no %s", f->path, key);
    if (kv->type != GGUF_VTYPE_ARRAY || kv->arr_type != GGUF_VTYPE_STRING)
        return status_fail(st, STATUS_FORMAT, "%s: %s at byte %llu is not an array of strings",
                           f->path, key, (unsigned long long)kv->file_offset);
    if (kv->n > INT32_MAX)
        return status_fail(st, STATUS_FORMAT, "%s: %s has %llu entries", f->path, key,
                           (unsigned long long)kv->n);
    *out = malloc((kv->n ? kv->n : 1) * sizeof **out);
    if (!*out) return status_fail(st, STATUS_NOMEM, "%s: out of memory reading %s", f->path, key);
    for (uint64_t i = 0; i < kv->n; i++)
        (*out)[i] = (tokenizer_text){kv->strs[i].ptr, (size_t)kv->strs[i].len};
    *n = (size_t)kv->n;
    return STATUS_OK;
}

/* Optional u32 id key: -1 when absent. */
static int kv_id(const gguf_file *f, const char *key, int32_t *out, status *st)
{
    uint32_t v;
    int rc = gguf_get_u32(f, key, &v, st);
    if (rc == STATUS_NOT_FOUND) {
        status_clear(st);
        *out = -1;
        return STATUS_OK;
    }
    if (rc) return rc;
    *out = v > INT32_MAX ? INT32_MAX : (int32_t)v;
    return STATUS_OK;
}

int tokenizer_load(tokenizer **out, const gguf_file *f, status *st)
{
    *out = NULL;
    tokenizer_spec spec = {0};
    int32_t *types = NULL;
    tokenizer_text *tokens = NULL, *merges = NULL;
    gguf_str s;
    int rc = gguf_get_str(f, "tokenizer.ggml.model", &s, st);
    if (rc) return rc;
    if (!gguf_str_eq(s, "gpt2"))
        return status_fail(st, STATUS_UNSUPPORTED,
                           "%s: tokenizer.ggml.model '%.*s': only 'gpt2' (byte-level BPE) is "
                           "supported", f->path, (int)(s.len > 64 ? 64 : s.len), s.ptr);
    spec.pre = TOKENIZER_PRE_QWEN35;
    rc = gguf_get_str(f, "tokenizer.ggml.pre", &s, st);
    if (rc == STATUS_OK) {
        if (gguf_str_eq(s, "qwen2")) spec.pre = TOKENIZER_PRE_QWEN2;
        else if (!gguf_str_eq(s, "qwen35"))
            return status_fail(st, STATUS_UNSUPPORTED,
                               "%s: tokenizer.ggml.pre '%.*s': only 'qwen35' and 'qwen2' are "
                               "supported", f->path, (int)(s.len > 64 ? 64 : s.len), s.ptr);
    } else if (rc != STATUS_NOT_FOUND) {
        return rc;
    }
    status_clear(st);

    if ((rc = kv_texts(f, "tokenizer.ggml.tokens", &tokens, &spec.n_tokens, st)) ||
        (rc = kv_texts(f, "tokenizer.ggml.merges", &merges, &spec.n_merges, st)))
        goto done;
    spec.tokens = tokens;
    spec.merges = merges;

    const gguf_kv *tkv = gguf_find_kv(f, "tokenizer.ggml.token_type");
    if (tkv) {
        if (tkv->type != GGUF_VTYPE_ARRAY || tkv->n != spec.n_tokens) {
            rc = status_fail(st, STATUS_FORMAT,
                             "%s: tokenizer.ggml.token_type at byte %llu: %llu entries for "
                             "%zu tokens", f->path, (unsigned long long)tkv->file_offset,
                             (unsigned long long)tkv->n, spec.n_tokens);
            goto done;
        }
        types = malloc(spec.n_tokens * sizeof *types);
        if (!types) {
            rc = status_fail(st, STATUS_NOMEM, "%s: out of memory", f->path);
            goto done;
        }
        for (size_t i = 0; i < spec.n_tokens; i++) {
            int64_t v;
            if (gguf_kv_get_int(tkv, i, &v)) {
                rc = status_fail(st, STATUS_FORMAT,
                                 "%s: tokenizer.ggml.token_type is not an integer array",
                                 f->path);
                goto done;
            }
            types[i] = (int32_t)v;
        }
        spec.token_types = types;
    }
    if ((rc = kv_id(f, "tokenizer.ggml.eos_token_id", &spec.eos_id, st)) ||
        (rc = kv_id(f, "tokenizer.ggml.bos_token_id", &spec.bos_id, st)))
        goto done;
    rc = gguf_get_str(f, "tokenizer.chat_template", &s, st);
    if (rc == STATUS_OK) {
        spec.chat_template = (tokenizer_text){s.ptr, (size_t)s.len};
    } else if (rc != STATUS_NOT_FOUND) {
        goto done;
    }
    status_clear(st);
    rc = tokenizer_create(out, &spec, st);
    if (rc) {
        /* Name the file in the message. */
        char msg[sizeof st->msg];
        snprintf(msg, sizeof msg, "%s", st->msg);
        status_fail(st, (status_code)rc, "%s: %s", f->path, msg);
    }
done:
    free(types);
    free(merges);
    free(tokens);
    return rc;
}

int tokenizer_load_path(tokenizer **out, const char *path, status *st)
{
    gguf_file *f;
    *out = NULL;
    int rc = gguf_open(&f, path, st);
    if (rc) return rc;
    rc = tokenizer_load(out, f, st);
    gguf_close(f);
    return rc;
}

size_t tokenizer_n_vocab(const tokenizer *t) { return t->n_vocab; }

const char *tokenizer_chat_template(const tokenizer *t, size_t *len)
{
    if (len) *len = t->chat_template_len;
    return t->chat_template;
}

const char *tokenizer_token_text(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_vocab) return NULL;
    if (len) *len = t->text_len[id];
    return t->text + t->text_off[id];
}

const uint8_t *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->n_vocab) return NULL;
    if (len) *len = t->bytes_len[id];
    return t->bytes + t->bytes_off[id];
}

int32_t tokenizer_token_type(const tokenizer *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n_vocab) return -1;
    return t->types[id];
}

int32_t tokenizer_find_token(const tokenizer *t, const char *text)
{
    return tokenizer_text_find(t, text, strlen(text));
}

int32_t tokenizer_eos_id(const tokenizer *t) { return t->eos; }
int32_t tokenizer_bos_id(const tokenizer *t) { return t->bos; }
int32_t tokenizer_im_start_id(const tokenizer *t) { return t->im_start; }
int32_t tokenizer_im_end_id(const tokenizer *t) { return t->im_end; }
int32_t tokenizer_endoftext_id(const tokenizer *t) { return t->endoftext; }

bool tokenizer_is_eog(const tokenizer *t, int32_t id)
{
    return id >= 0 && (id == t->eos || id == t->im_end || id == t->endoftext);
}

size_t tokenizer_eog_ids(const tokenizer *t, int32_t out[3])
{
    int32_t c[3] = {t->eos, t->im_end, t->endoftext};
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        bool dup = c[i] < 0;
        for (size_t j = 0; j < n && !dup; j++) dup = out[j] == c[i];
        if (!dup) out[n++] = c[i];
    }
    return n;
}
