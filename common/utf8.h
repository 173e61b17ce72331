/* UTF-8 validation (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF, no
 * truncated sequence. One copy for the tokenizer and the router. */
#ifndef DS_COMMON_UTF8_H
#define DS_COMMON_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* The length of the longest valid prefix of p[0, n): n when all of it is valid. */
size_t utf8_valid_prefix(const void *p, size_t n);

/* true when p[0, n) is valid UTF-8. */
static inline bool utf8_valid(const void *p, size_t n) { return utf8_valid_prefix(p, n) == n; }

#endif
