#include "router/router_json.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void router_json_free(router_json *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

void router_json_reset(router_json *b)
{
    b->len = 0;
    b->oom = 0;
    if (b->p) b->p[0] = 0;
}

int router_json_reserve(router_json *b, size_t cap)
{
    if (cap <= b->cap) return 0;
    size_t c = b->cap ? b->cap : 256;
    while (c < cap)
        c *= 2;
    char *p = realloc(b->p, c);
    if (!p) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = c;
    return 0;
}

void router_json_raw(router_json *b, const char *s, size_t n)
{
    if (b->oom || router_json_reserve(b, b->len + n + 1)) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void router_json_lit(router_json *b, const char *s)
{
    router_json_raw(b, s, strlen(s));
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t k;
    unsigned lo = 0x80, hi = 0xbf;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        k = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        k = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        k = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 0;
    if (n < k) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < k; i++)
        if ((s[i] & 0xc0) != 0x80) return 0;
    return k;
}

void router_json_esc(router_json *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    /* worst case 6 output bytes per input byte */
    if (b->oom || router_json_reserve(b, b->len + 6 * n + 1)) return;
    char *o = b->p + b->len;
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
            i++;
        } else if (c < 0x20) {
            *o++ = '\\';
            switch (c) {
            case '\n':
                *o++ = 'n';
                break;
            case '\r':
                *o++ = 'r';
                break;
            case '\t':
                *o++ = 't';
                break;
            case '\b':
                *o++ = 'b';
                break;
            case '\f':
                *o++ = 'f';
                break;
            default:
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
            i++;
        } else if (c < 0x80) {
            *o++ = (char)c;
            i++;
        } else {
            size_t k = utf8_seq(u + i, n - i);
            if (k) {
                memcpy(o, u + i, k);
                o += k;
                i += k;
            } else {
                memcpy(o, "\\ufffd", 6);
                o += 6;
                i++;
            }
        }
    }
    b->len = (size_t)(o - b->p);
    b->p[b->len] = 0;
}

void router_json_str(router_json *b, const char *s, size_t n)
{
    router_json_raw(b, "\"", 1);
    router_json_esc(b, s, n);
    router_json_raw(b, "\"", 1);
}

void router_json_i64(router_json *b, int64_t v)
{
    char tmp[24];
    size_t i = sizeof tmp;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[--i] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) tmp[--i] = '-';
    router_json_raw(b, tmp + i, sizeof tmp - i);
}

void router_json_f(router_json *b, double v)
{
    if (isnan(v) || v < -9999.0) v = -9999.0;
    if (v > 9999.0) v = 9999.0;
    int neg = v < 0;
    double a = neg ? -v : v;
    uint64_t ip = (uint64_t)a;
    uint64_t frac = (uint64_t)llround((a - (double)ip) * 1e6);
    if (frac >= 1000000) {
        ip++;
        frac -= 1000000;
    }
    char tmp[40];
    size_t i = sizeof tmp;
    int digits = 6;
    while (digits > 1 && frac % 10 == 0) { /* trailing zeros, one decimal kept */
        frac /= 10;
        digits--;
    }
    for (int d = 0; d < digits; d++) {
        tmp[--i] = (char)('0' + frac % 10);
        frac /= 10;
    }
    tmp[--i] = '.';
    do {
        tmp[--i] = (char)('0' + ip % 10);
        ip /= 10;
    } while (ip);
    if (neg) tmp[--i] = '-';
    router_json_raw(b, tmp + i, sizeof tmp - i);
}
