#include "base/rng.h"

#include <string.h>

/* A linear map on 64-bit states: col[i] is the image of bit i. */
typedef struct {
    uint64_t col[64];
} gf2_mat;

static uint64_t mat_apply(const gf2_mat *a, uint64_t v) {
    uint64_t out = 0;
    for (int i = 0; v; i++, v >>= 1)
        if (v & 1) out ^= a->col[i];
    return out;
}

/* a then b: (b . a) */
static void mat_then(const gf2_mat *a, const gf2_mat *b, gf2_mat *out) {
    gf2_mat t;
    for (int i = 0; i < 64; i++) t.col[i] = mat_apply(b, a->col[i]);
    *out = t;
}

static uint64_t xorshift_step(uint64_t s) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s;
}

void nv_rng_jump(nv_rng *r, uint64_t n) {
    gf2_mat step, acc;
    for (int i = 0; i < 64; i++) {
        step.col[i] = xorshift_step((uint64_t)1 << i);
        acc.col[i] = (uint64_t)1 << i; /* the identity */
    }
    for (; n; n >>= 1) {
        if (n & 1) mat_then(&acc, &step, &acc);
        mat_then(&step, &step, &step);
    }
    r->state = mat_apply(&acc, r->state);
}
