/* The run-time check behind nv_expf256_libm (base/vmath.h). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "base/vmath.h"

/* 2^(i/32) as a double, less i << 47 in its bits (the exponent nv_expf4_core adds back). */
const uint64_t nv_exp2f_tab[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int matches;

/* Every 8191st float bit pattern of both signs (about 524,000 inputs over the whole range) and the
 * edges; special lanes are left out (callers take expf for them). */
static void check(void) {
    int ok = 1;
    float in[8], out[8];
    int n = 0;
    for (uint64_t b = 0; b < (1ull << 32) && ok; b += 8191) {
        uint32_t u = (uint32_t)b;
        memcpy(&in[n++], &u, 4);
        if (n < 8) continue;
        n = 0;
        int special;
        _mm256_storeu_ps(out, nv_expf256_libm(_mm256_loadu_ps(in), &special));
        for (int i = 0; i < 8; i++)
            if (!(special >> i & 1)) {
                const float want = expf(in[i]);
                ok &= memcmp(&want, &out[i], 4) == 0;
            }
    }
    matches = ok;
}

int nv_expf_libm_matches(void) {
    pthread_once(&once, check);
    return matches;
}
