/* Vector math for the training loops (AVX2, part of the x86-64-v3 baseline).
 *
 * nv_exp256: e^x on 8 lanes, within 2 ulp of expf over the whole range: the classic reduction
 * x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n ln2 is exact), a degree-6 polynomial
 * for e^r, and 2^n built in the exponent bits. Below about -87.7 the result is 0 (expf gives
 * subnormals down to -103), above 88.72 +inf; NaN stays NaN. Not for inference: the forward pass and
 * the sampler keep libm's expf so their output matches llama2.c bit for bit. */
#ifndef NV_VMATH_H
#define NV_VMATH_H

#include <immintrin.h>

static inline __m256 nv_exp256(__m256 x) {
    /* max/min return their second operand for a NaN first one: NaN goes through */
    x = _mm256_min_ps(_mm256_set1_ps(88.75f), _mm256_max_ps(_mm256_set1_ps(-88.0f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    /* 2^n for n in [-126, 128]: n = 128 (x near the top) is split as 2^127 * 2 to stay finite
     * until the product overflows on its own */
    __m256i ni = _mm256_cvtps_epi32(n);
    __m256i top = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
    ni = _mm256_sub_epi32(ni, _mm256_and_si256(top, _mm256_set1_epi32(1)));
    __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
    p = _mm256_mul_ps(p, scale);
    return _mm256_blendv_ps(p, _mm256_add_ps(p, p), _mm256_castsi256_ps(top));
}

/* The sum of the 8 lanes. */
static inline float nv_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The largest of the 8 lanes. */
static inline float nv_hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
