/* UTF-8 code points: writing one, and reading one strictly (no overlong forms, surrogates or
 * values past U+10FFFF), for the grammar compilers that turn characters into bytes. */
#ifndef NV_BASE_UTF8_H
#define NV_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* cp (at most U+10FFFF) into out; returns its length, 1 to 4. */
static inline size_t nv_utf8_put(uint32_t cp, char out[4]) {
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xC0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3F)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xE0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 0x3F)), out[2] = (char)(0x80 | (cp & 0x3F)), 3;
    out[0] = (char)(0xF0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F)), out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* The code point at s (before end) into *cp; returns its length, or 0 when s does not start with
 * a well-formed one (a NUL byte included when end is NULL: the text is NUL-terminated). */
static inline size_t nv_utf8_get(const char *s, const char *end, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    const size_t n = u[0] < 0x80 ? 1 : u[0] >= 0xF5 ? 0 : u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC2 ? 2 : 0;
    if (!n || (end ? (size_t)(end - s) < n : !u[0])) return 0;
    uint32_t v = n == 1 ? u[0] : u[0] & (0x7Fu >> n);
    for (size_t i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (u[i] & 0x3F);
    }
    if ((n == 3 && v < 0x800) || (n == 4 && (v < 0x10000 || v > 0x10FFFF)) || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return n;
}

/* 1 when the n bytes at s are well-formed UTF-8 throughout. */
static inline int nv_utf8_valid(const char *s, size_t n) {
    uint32_t cp;
    for (size_t i = 0, k; i < n; i += k)
        if (!(k = nv_utf8_get(s + i, s + n, &cp))) return 0;
    return 1;
}

#endif
