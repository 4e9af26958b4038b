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

/* The block-quantized product's pieces (kern_qdot_tmpl.h): a block's sums into the fp32 chain,
 * fma((float)acc, s * xs, y), and its offset's term, fma(o, xsum, y), lane by lane. */
static inline v16 vzero_q(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline v16 vblock_q(v16 y, v16i acc, const float *s, float xs) {
    const __m256 x = _mm256_set1_ps(xs);
    return (v16){_mm256_fmadd_ps(_mm256_cvtepi32_ps(acc.lo), _mm256_mul_ps(_mm256_loadu_ps(s), x), y.lo),
                 _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc.hi), _mm256_mul_ps(_mm256_loadu_ps(s + 8), x), y.hi)};
}
static inline v16 voff_q(v16 y, const float *o, float xsum) {
    const __m256 x = _mm256_set1_ps(xsum);
    return (v16){_mm256_fmadd_ps(_mm256_loadu_ps(o), x, y.lo), _mm256_fmadd_ps(_mm256_loadu_ps(o + 8), x, y.hi)};
}
static inline v16i vset_q(int32_t v) { return (v16i){_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
static inline v16i vsc_q(const uint8_t *p) {
    return (v16i){_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)),
                  _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)))};
}
static inline v16i vmla_q(v16i acc, v16i u, v16i v) {
    return (v16i){_mm256_add_epi32(acc.lo, _mm256_mullo_epi32(u.lo, v.lo)), _mm256_add_epi32(acc.hi, _mm256_mullo_epi32(u.hi, v.hi))};
}
static inline v16 vfload_q(const float *p) { return (v16){_mm256_load_ps(p), _mm256_load_ps(p + 8)}; }
static inline void vfstore_q(float *p, v16 y) { _mm256_store_ps(p, y.lo), _mm256_store_ps(p + 8, y.hi); }
/* A 64-byte row of nibbles as its low nibbles' bytes and its high nibbles' bytes (two ymm each);
 * with tab (16 bytes), each nibble then an index into it (VPSHUFB). */
static inline void nibbles_q(const uint8_t *p, const uint8_t *tab, __m256i *lo0, __m256i *lo1, __m256i *hi0, __m256i *hi1) {
    const __m256i a = _mm256_loadu_si256((const __m256i *)p), b = _mm256_loadu_si256((const __m256i *)(p + 32));
    const __m256i m = _mm256_set1_epi8(0x0f);
    *lo0 = _mm256_and_si256(a, m);
    *lo1 = _mm256_and_si256(b, m);
    *hi0 = _mm256_and_si256(_mm256_srli_epi16(a, 4), m);
    *hi1 = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
    if (tab) {
        const __m256i t = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tab));
        *lo0 = _mm256_shuffle_epi8(t, *lo0);
        *lo1 = _mm256_shuffle_epi8(t, *lo1);
        *hi0 = _mm256_shuffle_epi8(t, *hi0);
        *hi1 = _mm256_shuffle_epi8(t, *hi1);
    }
}

#endif
