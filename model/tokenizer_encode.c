/* Encoding: special tokens, NFC, the split regex, BPE merges by rank.
 *
 * Thread safety: the tokenizer is read-only here; each call owns its PCRE2 match data and its
 * scratch (one allocation set per call, grown as needed, never per word). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/utf8.h"
#include "model/tokenizer_internal.h"

/* docs/QWEN35.md §1.6. The contraction group is HF's case-insensitive form, which PCRE2 (UTF + UCP)
 * folds exactly as the HF tokenizer's regex engine does. */
static const char *const split_regex[] = {
    [TOKENIZER_PRE_QWEN35] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}|"
        " ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    [TOKENIZER_PRE_QWEN2] =
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
        " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
};

int tokenizer_regex_compile(tokenizer *t, tokenizer_pre pre, status *st)
{
    if ((unsigned)pre > TOKENIZER_PRE_QWEN2)
        return status_fail(st, STATUS_UNSUPPORTED, "tokenizer: pre-tokenizer %d", (int)pre);
    int err;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)split_regex[pre], PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return status_fail(st, STATUS_INTERNAL, "tokenizer: split regex at %zu: %s", (size_t)at,
                           (const char *)msg);
    }
    t->re_jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    return STATUS_OK;
}

/* The validator is common/utf8.h; this name stays for tokenizer_internal.h's callers. */
size_t tokenizer_utf8_check(const uint8_t *p, size_t n) { return utf8_valid_prefix(p, n); }

/* Per-call scratch: the output ids and the BPE work arrays. */
typedef struct enc {
    const tokenizer *t;
    int32_t *ids; /* owned until handed to the caller, [cap] */
    size_t n, cap;
    struct sym {
        int32_t id, prev, next, len; /* len 0: merged away */
    } *sym;                          /* owned, [sym_cap] */
    struct cand {
        int32_t rank, pos, id;  /* merge rank, left symbol, merged id */
        int32_t left, right;    /* the pair's ids when queued */
    } *heap;                         /* owned, [3 * sym_cap] */
    size_t sym_cap;
    pcre2_match_data *md; /* owned */
} enc;

static int enc_push(enc *e, int32_t id, status *st)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? 2 * e->cap : 256;
        int32_t *p = realloc(e->ids, cap * sizeof *p);
        if (!p) return status_fail(st, STATUS_NOMEM, "tokenizer: out of memory (%zu ids)", cap);
        e->ids = p;
        e->cap = cap;
    }
    e->ids[e->n++] = id;
    return STATUS_OK;
}

static bool cand_less(const struct cand *a, const struct cand *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct cand *h, size_t *n, struct cand c)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct cand heap_pop(struct cand *h, size_t *n)
{
    struct cand top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* Queues the merge of symbol pos with its right neighbour, if that pair is a merge. */
static void cand_add(enc *e, size_t *nh, int32_t pos)
{
    int32_t next = e->sym[pos].next, rank, id;
    if (next < 0) return;
    int32_t left = e->sym[pos].id, right = e->sym[next].id;
    if (tokenizer_pair_find(e->t, left, right, &rank, &id))
        heap_push(e->heap, nh, (struct cand){rank, pos, id, left, right});
}

/* BPE of one pre-token w[0..n): the HF word.merge_all loop. Lowest rank first, leftmost on
 * ties; a queued candidate is stale when its left symbol was merged away or the pair at its
 * position no longer merges into the same id. O(n log n) per word. */
static int bpe_word(enc *e, const uint8_t *w, size_t n, status *st)
{
    const tokenizer *t = e->t;
    if (n == 1) return enc_push(e, t->byte_id[w[0]], st);
    if (n > e->sym_cap) {
        size_t cap = n < 64 ? 64 : n;
        free(e->sym);
        free(e->heap);
        e->sym = malloc(cap * sizeof *e->sym);
        e->heap = malloc(3 * cap * sizeof *e->heap);
        e->sym_cap = e->sym && e->heap ? cap : 0;
        if (!e->sym_cap) return status_fail(st, STATUS_NOMEM, "tokenizer: word of %zu bytes", n);
    }
    for (size_t i = 0; i < n; i++)
        e->sym[i] = (struct sym){t->byte_id[w[i]], (int32_t)i - 1,
                                 i + 1 < n ? (int32_t)i + 1 : -1, 1};
    size_t nh = 0;
    for (size_t i = 0; i + 1 < n; i++) cand_add(e, &nh, (int32_t)i);
    while (nh) {
        struct cand c = heap_pop(e->heap, &nh);
        struct sym *s = &e->sym[c.pos];
        if (s->len == 0 || s->next < 0) continue;
        struct sym *r = &e->sym[s->next];
        int32_t rank, id;
        if ((s->id != c.left || r->id != c.right) && /* changed: still the same merge? */
            (!tokenizer_pair_find(t, s->id, r->id, &rank, &id) || id != c.id))
            continue;
        s->id = c.id;
        s->len += r->len;
        r->len = 0;
        s->next = r->next;
        if (s->next >= 0) e->sym[s->next].prev = c.pos;
        if (s->prev >= 0) cand_add(e, &nh, s->prev);
        cand_add(e, &nh, c.pos);
    }
    for (int32_t i = 0; i >= 0; i = e->sym[i].next) {
        int rc = enc_push(e, e->sym[i].id, st);
        if (rc) return rc;
    }
    return STATUS_OK;
}

/* Splits s[0..n) (valid, NFC) with the regex and BPE-encodes each piece. Text the regex does
 * not cover (none with these patterns) is encoded as its own piece, as HF's Split keeps it. */
static int split_encode(enc *e, const uint8_t *s, size_t n, status *st)
{
    const tokenizer *t = e->t;
    size_t pos = 0;
    while (pos < n) {
        int m = pcre2_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT) /* deep backtracking: the interpreter copes */
            m = pcre2_match(t->re, s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, e->md, NULL);
        size_t ms = n, me = n;
        if (m >= 0) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            ms = ov[0];
            me = ov[1];
        } else if (m != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(m, msg, sizeof msg);
            return status_fail(st, STATUS_INTERNAL, "tokenizer: split regex at byte %zu: %s",
                               pos, (const char *)msg);
        }
        int rc;
        if (ms > pos && (rc = bpe_word(e, s + pos, ms - pos, st))) return rc;
        if (me > ms && (rc = bpe_word(e, s + ms, me - ms, st))) return rc;
        if (me == ms && ms < n) { /* an empty match cannot happen here; never loop on one */
            size_t step = 1;
            while (ms + step < n && (s[ms + step] & 0xC0) == 0x80) step++;
            if ((rc = bpe_word(e, s + ms, step, st))) return rc;
            me = ms + step;
        }
        pos = me;
    }
    return STATUS_OK;
}

/* Decodes the (valid) code point at s[i]; returns its length. */
static size_t cp_at(const uint8_t *s, size_t i, uint32_t *cp)
{
    uint8_t b = s[i];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b < 0xE0) {
        *cp = (uint32_t)(b & 0x1F) << 6 | (s[i + 1] & 0x3F);
        return 2;
    }
    if (b < 0xF0) {
        *cp = (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F);
        return 3;
    }
    *cp = (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
          (uint32_t)(s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
    return 4;
}

/* A normalisation boundary: a starter (ccc 0) with NFC_QC = Yes, so it neither reorders nor
 * composes with what precedes it, and NFC(x + y) = NFC(x) + NFC(y) when y starts with one.
 * Conservative ranges only: everything below U+0300 (the combining marks start there), kana
 * letters, CJK unified ideographs, Hangul syllables. Other characters are just normalised. */
static bool nfc_boundary(uint32_t cp)
{
    return cp < 0x300 || (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA) ||
           (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3);
}

/* Appends s[0..n) to the growing buffer *buf. */
static int buf_append(uint8_t **buf, size_t *len, size_t *cap, const uint8_t *s, size_t n,
                      status *st)
{
    if (n == 0) return STATUS_OK;
    if (*len + n > *cap) {
        size_t c = 2 * (*len + n);
        uint8_t *p = realloc(*buf, c);
        if (!p) return status_fail(st, STATUS_NOMEM, "tokenizer: out of memory (NFC)");
        *buf = p;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    return STATUS_OK;
}

/* NFC of s[0..n). Runs between boundaries that hold only boundary characters are copied; each
 * run from the last boundary before a non-boundary character up to the next boundary goes
 * through utf8proc. *out is NULL when the text is already NFC-stable by that test (use s). */
static int nfc(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len, status *st)
{
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, copied = 0, last_boundary = 0, i = 0;
    int rc = STATUS_OK;
    *out = NULL;
    while (i < n) {
        if (s[i] < 0x80) {
            last_boundary = i++;
            continue;
        }
        uint32_t cp;
        size_t k = cp_at(s, i, &cp);
        if (nfc_boundary(cp)) {
            last_boundary = i;
            i += k;
            continue;
        }
        /* [start, end): from the starter this character may attach to, to the next boundary. */
        size_t start = last_boundary < copied ? copied : last_boundary, end = i + k;
        while (end < n) {
            uint32_t c;
            size_t kk = cp_at(s, end, &c);
            if (nfc_boundary(c)) break;
            end += kk;
        }
        utf8proc_uint8_t *m = NULL;
        utf8proc_ssize_t ml = utf8proc_map(s + start, (utf8proc_ssize_t)(end - start), &m,
                                           UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (ml < 0) {
            rc = status_fail(st, ml == UTF8PROC_ERROR_NOMEM ? STATUS_NOMEM : STATUS_INVALID,
                             "tokenizer: NFC: %s", utf8proc_errmsg(ml));
            goto fail;
        }
        rc = buf_append(&buf, &len, &cap, s + copied, start - copied, st);
        if (!rc) rc = buf_append(&buf, &len, &cap, m, (size_t)ml, st);
        free(m);
        if (rc) goto fail;
        copied = i = last_boundary = end;
    }
    if (buf && (rc = buf_append(&buf, &len, &cap, s + copied, n - copied, st))) goto fail;
    *out = buf;
    *out_len = len;
    return STATUS_OK;
fail:
    free(buf);
    return rc;
}

/* Text between special tokens: NFC, then split. */
static int plain_encode(enc *e, const uint8_t *s, size_t n, status *st)
{
    if (n == 0) return STATUS_OK;
    uint8_t *norm;
    size_t norm_len;
    int rc = nfc(s, n, &norm, &norm_len, st);
    if (rc) return rc;
    rc = norm ? split_encode(e, norm, norm_len, st) : split_encode(e, s, n, st);
    free(norm);
    return rc;
}

/* Longest special token starting at s[0..n), or -1. */
static int32_t special_at(const tokenizer *t, const uint8_t *s, size_t n)
{
    for (uint32_t k = t->special_start[s[0]]; k < t->special_start[s[0] + 1]; k++) {
        int32_t id = t->special_ids[k];
        size_t len = t->text_len[id];
        if (len <= n && !memcmp(t->text + t->text_off[id], s, len)) return id;
    }
    return -1;
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids,
                     size_t *n_ids, status *st)
{
    *ids = NULL;
    *n_ids = 0;
    const uint8_t *s = (const uint8_t *)text;
    size_t bad = tokenizer_utf8_check(s, len);
    if (bad != len)
        return status_fail(st, STATUS_INVALID, "tokenizer: text is not valid UTF-8 at byte %zu",
                           bad);
    enc e = {.t = t};
    e.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!e.md) return status_fail(st, STATUS_NOMEM, "tokenizer: out of memory");
    int rc = STATUS_OK;
    size_t seg = 0;
    for (size_t i = 0; i < len;) {
        int32_t id = t->special_start[s[i]] < t->special_start[s[i] + 1]
                         ? special_at(t, s + i, len - i)
                         : -1;
        if (id < 0) {
            i++;
            continue;
        }
        if ((rc = plain_encode(&e, s + seg, i - seg, st)) || (rc = enc_push(&e, id, st)))
            goto done;
        i += t->text_len[id];
        seg = i;
    }
    rc = plain_encode(&e, s + seg, len - seg, st);
done:
    pcre2_match_data_free(e.md);
    free(e.sym);
    free(e.heap);
    if (rc) {
        free(e.ids);
        return rc;
    }
    *ids = e.ids;
    *n_ids = e.n;
    return STATUS_OK;
}
