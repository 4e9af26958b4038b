/* Vector math for the training loops (AVX2, part of the x86-64-v3 baseline).
 *
 * nv_exp256: e^x on 8 lanes, within 2 ulp of expf over the whole range: the classic reduction
 * x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n ln2 is exact), a degree-6 polynomial
 * for e^r, and 2^n built in the exponent bits. Below about -87.7 the result is 0 (expf gives
 * subnormals down to -103), above 88.72 +inf; NaN stays NaN. Not for inference: the forward pass and
 * the sampler need llama2.c's values bit for bit (nv_expf256_libm below).
 * Also lane helpers: an in-register 8 x 8 transpose, horizontal sum and maximum. */
#ifndef NV_VMATH_H
#define NV_VMATH_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

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

/* tanh on 8 lanes for the training loops' soft caps: sign(x) (1 - e) / (1 + e), e = e^-2|x| by
 * nv_exp256 (exact at 0, +-1 far out; within about 1e-7 absolute of tanhf). */
static inline __m256 nv_tanh256(__m256 x) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 e = nv_exp256(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, x)));
    const __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_or_ps(t, _mm256_and_ps(sign, x));
}

/* nv_expf256_libm: e^x on 8 lanes, bit for bit the expf of glibc 2.27 and later in the FMA build
 * that x86-64-v3 machines run (what llama2.c calls), so the forward pass and the sampler can take
 * 8 lanes at a time and keep llama2.c's exact values. The same steps in double precision: with
 * N = 32, z = x N/ln2 rounded to an integer k by adding 1.5*2^52 (fused), r = x N/ln2 - k (fused),
 * s = 2^(k/N) from a 32-entry table of 2^(i/N) (bits less i << 47) with k/N's integer part added
 * to the exponent, p(r) = (c0 r + c1) r^2 + (c2 r + 1), rounded once to float from p*s. Lanes with
 * |x| >= 88 or NaN take expf's slow path there: their bits are set in *special and their values
 * must be taken from expf by the caller. Whether this process's expf is that one is checked once
 * at run time by nv_expf_libm_matches() (base/vmath.c). */
extern const uint64_t nv_exp2f_tab[32];

static inline __m256d nv_expf4_core(__m128 x) {
    const __m256d xd = _mm256_cvtps_pd(x);
    const __m256d invln2n = _mm256_castsi256_pd(_mm256_set1_epi64x(0x40471547652b82feLL));
    const __m256d shift = _mm256_castsi256_pd(_mm256_set1_epi64x(0x4338000000000000LL));
    const __m256d z = _mm256_fmadd_pd(invln2n, xd, shift);
    const __m256i ki = _mm256_castpd_si256(z);
    const __m256d r = _mm256_fmsub_pd(invln2n, xd, _mm256_sub_pd(z, shift));
    __m256i t = _mm256_i64gather_epi64((const long long *)nv_exp2f_tab, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    const __m256d c0 = _mm256_castsi256_pd(_mm256_set1_epi64x(0x3ebc6af84b912394LL));
    const __m256d c1 = _mm256_castsi256_pd(_mm256_set1_epi64x(0x3f2ebfce50fac4f3LL));
    const __m256d c2 = _mm256_castsi256_pd(_mm256_set1_epi64x(0x3f962e42ff0c52d6LL));
    const __m256d p = _mm256_fmadd_pd(_mm256_fmadd_pd(c0, r, c1), _mm256_mul_pd(r, r), _mm256_fmadd_pd(c2, r, _mm256_set1_pd(1.0)));
    return _mm256_mul_pd(p, _mm256_castsi256_pd(t));
}

static inline __m256 nv_expf256_libm(__m256 x, int *special) {
    /* |x| >= 88 or not finite: the top 12 bits of the magnitude above 0x42a, as expf tests them */
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
    *special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a))));
    const __m128 lo = _mm256_cvtpd_ps(nv_expf4_core(_mm256_castps256_ps128(x)));
    const __m128 hi = _mm256_cvtpd_ps(nv_expf4_core(_mm256_extractf128_ps(x, 1)));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
}

/* 1 when nv_expf256_libm gives this process's expf bit for bit (checked once, on a spread of
 * inputs); else callers use expf. */
int nv_expf_libm_matches(void);

/* expf of 8 lanes, every lane bit for bit (the special lanes from expf itself); only where
 * nv_expf_libm_matches(). */
static inline __m256 nv_expf256_exact(__m256 x) {
    int special;
    __m256 e = nv_expf256_libm(x, &special);
    if (special) {
        float xl[8], el[8];
        _mm256_storeu_ps(xl, x);
        _mm256_storeu_ps(el, e);
        for (int l = 0; l < 8; l++)
            if (special >> l & 1) el[l] = expf(xl[l]);
        e = _mm256_loadu_ps(el);
    }
    return e;
}

/* Transposes the 8 x 8 block held in r[0..7] (row i in r[i]) in place: afterwards r[j] holds
 * column j. Pure data movement (unpack, shuffle, lane permute). */
static inline void nv_tr8x8_ps(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]), t2 = _mm256_unpacklo_ps(r[2], r[3]),
           t3 = _mm256_unpackhi_ps(r[2], r[3]), t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]),
           t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee), u2 = _mm256_shuffle_ps(t1, t3, 0x44),
           u3 = _mm256_shuffle_ps(t1, t3, 0xee), u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee),
           u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* dst[c*ldd + r] = src[r*lss + c] for r < rows, c < cols: 8 x 8 blocks in registers, the edges one
 * by one; nothing outside those rows and columns is read or written. Used by plan packing (every
 * optimizer step refreshes), the backward products and attention's transposed keys and values. */
static inline void nv_transpose(const float *src, size_t lss, int rows, int cols, float *dst, size_t ldd) {
    const int r8 = rows & ~7, c8 = cols & ~7;
    for (int r = 0; r < r8; r += 8) {
        for (int c = 0; c < c8; c += 8) {
            __m256 t[8];
            for (int i = 0; i < 8; i++) t[i] = _mm256_loadu_ps(src + (size_t)(r + i) * lss + c);
            nv_tr8x8_ps(t);
            for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + (size_t)(c + i) * ldd + r, t[i]);
        }
        for (int c = c8; c < cols; c++)
            for (int i = r; i < r + 8; i++) dst[(size_t)c * ldd + i] = src[(size_t)i * lss + c];
    }
    for (int r = r8; r < rows; r++)
        for (int c = 0; c < cols; c++) dst[(size_t)c * ldd + r] = src[(size_t)r * lss + c];
}

/* A mask of lanes 0..n-1 for maskload/maskstore (0 < n < 8). */
static inline __m256i nv_lane_mask8(int n) {
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - n));
}

/* Lanes 0..n-1 of p (the rest 0; nothing at or past p + n is touched, n may be <= 0 or >= 8), and
 * the store of lanes 0..n-1 only. */
static inline __m256 nv_load8_n(const float *p, int n) {
    if (n >= 8) return _mm256_loadu_ps(p);
    if (n <= 0) return _mm256_setzero_ps();
    return _mm256_maskload_ps(p, nv_lane_mask8(n));
}
static inline void nv_store8_n(float *p, __m256 v, int n) {
    if (n >= 8) _mm256_storeu_ps(p, v);
    else if (n > 0) _mm256_maskstore_ps(p, nv_lane_mask8(n), v);
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
