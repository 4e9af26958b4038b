/* Masked 16-lane fp32 loads and stores for the AVX-512 kernels; included after the including
 * file's AVX-512 target pragma. */
#ifndef NV_KERN_ZMM_H
#define NV_KERN_ZMM_H

#include <immintrin.h>

static inline __mmask16 lane_mask(int n) { return (__mmask16)((1u << n) - 1u); }
/* Lanes 0..n-1 of p (the rest 0; nothing at or past p + n is touched, n may be <= 0 or >= 16). */
static inline __m512 vload_n(const float *p, int n) {
    if (n >= 16) return _mm512_loadu_ps(p);
    if (n <= 0) return _mm512_setzero_ps();
    return _mm512_maskz_loadu_ps(lane_mask(n), p);
}
/* Lanes 0..n-1 only. */
static inline void vstore_n(float *p, __m512 v, int n) {
    if (n >= 16) _mm512_storeu_ps(p, v);
    else if (n > 0) _mm512_mask_storeu_ps(p, lane_mask(n), v);
}

#endif
