/* Tokenizer helpers shared by the tokenizer and API tests. Header-only like t.h (include after it). */
#ifndef NV_TEST_TOK_UTIL_H
#define NV_TEST_TOK_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"

/* decode(prev, tok) concatenated over ids[1..n) (ids[0] is BOS), as run.c prints a sequence;
 * the caller frees the result. */
static inline char *decode_all(const nv_tokenizer *t, const int *ids, int n) {
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    out[0] = '\0';
    for (int i = 1; i < n; i++) {
        const char *p = nv_tokenizer_decode(t, ids[i - 1], ids[i]);
        if (!p) continue;
        size_t pl = strlen(p);
        while (len + pl + 1 > cap) {
            cap *= 2;
            out = realloc(out, cap);
        }
        memcpy(out + len, p, pl + 1);
        len += pl;
    }
    return out;
}

/* 1 when two id lists are equal. */
static inline int same_ids(const int *a, int na, const int *b, int nb) { return na == nb && !memcmp(a, b, (size_t)na * sizeof(int)); }

#ifdef NV_TEST_H
/* The shared data's 512-token vocabulary (stories260K's); NULL, with the case skipped or failed,
 * when it is missing or does not load. */
static inline nv_tokenizer *tok512(void) {
    const char *zp = t_data("models/tok512.bin");
    if (!zp) return NULL;
    nv_tokenizer *tok = NULL;
    T_CHECK(nv_tokenizer_load(zp, 0, &tok) == NV_OK, "%s", nv_errmsg());
    return tok;
}
#endif

#endif
