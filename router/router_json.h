/* A small JSON writer for OUTPUT only (the HTTP door's responses and SSE chunks): appends to a
 * growable buffer that is kept per request, so a token's chunk costs no allocation once the
 * buffer is as large as the largest chunk seen. Parsing is json-c's (router_http.c).
 *
 * Strings are escaped per RFC 8259: '"', '\\' and control characters escaped, valid UTF-8
 * copied through, each byte of an invalid sequence written as U+FFFD (a token's bytes may be
 * part of a character). Numbers are written without printf. A failed allocation sets
 * b->oom and drops the rest; the caller checks it once per message. */
#ifndef DS_ROUTER_ROUTER_JSON_H
#define DS_ROUTER_ROUTER_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef struct router_json {
    char *p; /* owned, [cap] bytes; p[len] == 0 when len > 0 */
    size_t len;
    size_t cap;
    int oom; /* an append failed: the content is incomplete */
} router_json;

void router_json_free(router_json *b);
void router_json_reset(router_json *b); /* len 0, keeps the memory */
int router_json_reserve(router_json *b, size_t cap);

void router_json_raw(router_json *b, const char *s, size_t n);
void router_json_lit(router_json *b, const char *s); /* raw, NUL-terminated */
/* A quoted, escaped string of n bytes. */
void router_json_str(router_json *b, const char *s, size_t n);
/* The escaped bytes only, no quotes (to build one string from several pieces). */
void router_json_esc(router_json *b, const char *s, size_t n);
void router_json_i64(router_json *b, int64_t v);
/* A float with up to 6 decimals ("-0.125", "3.0"); NaN and -inf as -9999.0 (OpenAI's floor
 * for a token with no probability), +inf as 9999.0. */
void router_json_f(router_json *b, double v);

#endif
