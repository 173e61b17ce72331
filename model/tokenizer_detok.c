/* Decoding: token bytes, then UTF-8 repair with U+FFFD per maximal subpart (Unicode §3.9,
 * what Rust's String::from_utf8_lossy and Python's errors="replace" do; HF's ByteLevel decoder
 * uses the former). One byte-at-a-time state machine serves the whole-sequence decode and the
 * streaming detokenizer, so the two agree byte for byte. */
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer_internal.h"

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */

static size_t emit_fffd(char *out)
{
    memcpy(out, replacement, 3);
    return 3;
}

/* Feeds one byte; writes completed text to out (at most 3 + 3 bytes: a replaced pending prefix
 * then a replaced byte). Returns the bytes written. */
static size_t detok_byte(tokenizer_detok *d, uint8_t b, char *out)
{
    size_t w = 0;
    if (d->need) {
        if (b >= d->lo && b <= d->hi) {
            d->pend[d->n_pend++] = b;
            d->lo = 0x80;
            d->hi = 0xBF;
            if (d->n_pend == d->need) {
                memcpy(out, d->pend, d->n_pend);
                w = d->n_pend;
                d->n_pend = d->need = 0;
            }
            return w;
        }
        /* The pending prefix can never complete: it is one maximal subpart. */
        w = emit_fffd(out);
        d->n_pend = d->need = 0;
    }
    if (b < 0x80) {
        out[w] = (char)b;
        return w + 1;
    }
    uint8_t need = 0, lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    }
    if (!need) return w + emit_fffd(out + w);
    d->pend[0] = b;
    d->n_pend = 1;
    d->need = need;
    d->lo = lo;
    d->hi = hi;
    return w;
}

/* Feeds b[0..n); returns the bytes written to out (at most 3 * (n + 3)). ASCII bytes with
 * nothing pending are copied in runs. */
static size_t detok_bytes(tokenizer_detok *d, const uint8_t *b, size_t n, char *out)
{
    size_t w = 0, i = 0;
    while (i < n) {
        if (!d->need && b[i] < 0x80) {
            size_t j = i + 1;
            while (j < n && b[j] < 0x80) j++;
            memcpy(out + w, b + i, j - i);
            w += j - i;
            i = j;
            continue;
        }
        w += detok_byte(d, b[i++], out + w);
    }
    return w;
}

void tokenizer_detok_init(tokenizer_detok *d, const tokenizer *t)
{
    memset(d, 0, sizeof *d);
    d->t = t;
}

size_t tokenizer_detok_max_out(const tokenizer *t)
{
    return 3 * (t->max_token_bytes + 3);
}

int tokenizer_detok_push(tokenizer_detok *d, int32_t id, char *out, size_t cap, size_t *n_out,
                         status *st)
{
    const tokenizer *t = d->t;
    *n_out = 0;
    if (id < 0 || (size_t)id >= t->n_vocab)
        return status_fail(st, STATUS_RANGE, "tokenizer: token id %d out of range [0, %zu)", id,
                           t->n_vocab);
    size_t len = t->bytes_len[id];
    DS_ASSERT(cap >= 3 * (len + 3));
    *n_out = detok_bytes(d, t->bytes + t->bytes_off[id], len, out);
    return STATUS_OK;
}

size_t tokenizer_detok_flush(tokenizer_detok *d, char *out, size_t cap)
{
    if (!d->need) return 0;
    DS_ASSERT(cap >= 3);
    d->n_pend = d->need = 0;
    return emit_fffd(out);
}

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n_ids, char **text,
                     size_t *len, status *st)
{
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        if (ids[i] < 0 || (size_t)ids[i] >= t->n_vocab)
            return status_fail(st, STATUS_RANGE,
                               "tokenizer: id %d at index %zu out of range [0, %zu)", ids[i], i,
                               t->n_vocab);
        total += t->bytes_len[ids[i]];
    }
    /* Worst case every byte becomes U+FFFD (3 bytes), plus a final one and the NUL. */
    char *out = malloc(3 * total + 4);
    if (!out) return status_fail(st, STATUS_NOMEM, "tokenizer: decode of %zu bytes", total);
    tokenizer_detok d;
    tokenizer_detok_init(&d, t);
    size_t w = 0;
    for (size_t i = 0; i < n_ids; i++)
        w += detok_bytes(&d, t->bytes + t->bytes_off[ids[i]], t->bytes_len[ids[i]], out + w);
    w += tokenizer_detok_flush(&d, out + w, 3);
    out[w] = 0;
    *text = out;
    *len = w;
    return STATUS_OK;
}
