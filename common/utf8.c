#include "common/utf8.h"

#include <stdint.h>

size_t utf8_valid_prefix(const void *data, size_t n)
{
    const uint8_t *p = data;
    size_t i = 0;
    while (i < n) {
        uint8_t b = p[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        /* the lead byte fixes the length and the range of the second byte (which is what
         * excludes overlong forms, surrogates and code points above U+10FFFF) */
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) len = 2;
        else if (b >= 0xE0 && b <= 0xEF) {
            len = 3;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            len = 4;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        } else
            return i;
        if (i + len > n) return i;
        if (p[i + 1] < lo || p[i + 1] > hi) return i;
        for (size_t k = 2; k < len; k++)
            if ((p[i + k] & 0xC0) != 0x80) return i;
        i += len;
    }
    return n;
}
