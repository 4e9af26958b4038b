/* 16 lanes as pairs of ymm registers, for the AVX2 instances of the vector dot-product loop
 * (kern_vdot_tmpl.h): masked fp32 loads and stores, and the int8 loop's start and end (sums
 * started at the weights' offset correction, left scaled as amx-int8 writes its tiles). Included
 * by the files that instantiate those loops. */
#ifndef NV_KERN_YMM_H
#define NV_KERN_YMM_H

#include <immintrin.h>

#include "base/vmath.h"

typedef struct {
    __m256 lo, hi;
} v16;
typedef struct {
    __m256i lo, hi;
} v16i;

/* Lanes 0..n-1 of p (the rest 0; nothing at or past p + n is touched). */
static inline v16 vload_n(const float *p, int n) {
    if (n >= 16) return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    if (n <= 0) return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()};
    return (v16){nv_load8_n(p, n), n > 8 ? nv_load8_n(p + 8, n - 8) : _mm256_setzero_ps()};
}
/* Lanes 0..n-1 only. */
static inline void vstore_n(float *p, v16 v, int n) {
    nv_store8_n(p, v.lo, n);
    if (n > 8) nv_store8_n(p + 8, v.hi, n - 8);
}

/* The int8 loop's sums start at wc (16 int32) ... */
static inline v16i vinit_int8(const int32_t *wc) {
    return (v16i){_mm256_loadu_si256((const __m256i *)wc), _mm256_loadu_si256((const __m256i *)(wc + 8))};
}
/* ... and leave as ((float)acc * xs) * ws lane by lane, as amx-int8 writes its tiles. */
static inline void vout_int8(float xs, const float *ws, float *c, v16i acc, int n) {
    const __m256 x = _mm256_set1_ps(xs);
    vstore_n(c, (v16){_mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc.lo), x), _mm256_loadu_ps(ws)),
                      _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(acc.hi), x), _mm256_loadu_ps(ws + 8))},
             n);
}

#endif
