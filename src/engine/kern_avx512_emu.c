/* Test-only: the avx512 kernel (16 lanes, 8 x 32 micro-kernel, 16-lane masks) executed on pairs of
 * AVX2 vectors, so the logic shared with kern_avx512.c is exercised on machines without AVX-512.
 * Only the vector primitives differ from the real kernel. */
#include <immintrin.h>

#include "base/vmath.h"
#include "engine/kern.h"

typedef struct {
    __m256 lo, hi;
} v16;

static inline v16 vzero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline v16 vloadu(const float *p) { return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static int emu_inject; /* nv_kern_avx512_emu_inject(): every A value off by 2^-12 relative */
static inline v16 vbcast(float f) {
    if (emu_inject) f *= 1.0f + 1.0f / 4096;
    return (v16){_mm256_set1_ps(f), _mm256_set1_ps(f)};
}
static inline v16 vfma(v16 a, v16 b, v16 c) { return (v16){_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
static inline void vstoreu(float *p, v16 v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
}
static inline v16 vmul(v16 a, v16 b) { return (v16){_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline v16 vadd(v16 a, v16 b) { return (v16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline v16 vload_q8(const int8_t *p) {
    return (v16){_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))),
                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8))))};
}
static inline void vload_q4_emu(const int8_t *p, v16 *lo, v16 *hi) {
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
    const __m256i f = _mm256_set1_epi32(15);
    *lo = (v16){_mm256_cvtepi32_ps(_mm256_and_si256(a, f)), _mm256_cvtepi32_ps(_mm256_and_si256(b, f))};
    *hi = (v16){_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4))};
}
#define vload_q4(p, lo, hi) vload_q4_emu(p, &(lo), &(hi))
/* The 16 floats at t looked up by the indices 0..15 in i's lanes: two in-register tables of 8, the
 * one picked by each index's bit 3 (avx512's VPERMPS over 16 lanes, on AVX2). */
static inline __m256 lut16_8(const float *t, __m256i i) {
    const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), i), hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t + 8), i);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(i, 28)));
}
static inline void vload_q4t_emu(const int8_t *p, const float *t, v16 *lo, v16 *hi) {
    const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p + 8)));
    const __m256i f = _mm256_set1_epi32(15);
    *lo = (v16){lut16_8(t, _mm256_and_si256(a, f)), lut16_8(t, _mm256_and_si256(b, f))};
    *hi = (v16){lut16_8(t, _mm256_srli_epi32(a, 4)), lut16_8(t, _mm256_srli_epi32(b, 4))};
}
#define vload_q4t(p, t, lo, hi) vload_q4t_emu(p, t, &(lo), &(hi))
static inline v16 vload_h(const int8_t *p) {
    return (v16){_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))};
}
static inline __m256 bf16x8(const int8_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline v16 vload_bf(const int8_t *p) { return (v16){bf16x8(p), bf16x8(p + 16)}; }
static inline v16 vload_n(const float *p, int n) {
    if (n >= 16) return vloadu(p);
    if (n <= 0) return vzero();
    /* like a 16-lane mask: nothing at or past p+n is touched */
    return (v16){nv_load8_n(p, n), n > 8 ? nv_load8_n(p + 8, n - 8) : _mm256_setzero_ps()};
}
static inline void vstore_n(float *p, v16 v, int n) {
    if (n >= 16) {
        vstoreu(p, v);
        return;
    }
    nv_store8_n(p, v.lo, n);
    if (n > 8) nv_store8_n(p + 8, v.hi, n - 8);
}

#define KP(name) avx512emu_##name
#define VF v16
#define VW 16
#define MR 8

#include "engine/kern_fp32_tmpl.h"

const nv_kern_fp32 nv_kern_avx512_emu = {"avx512 (emulated)", 2 * VW, MR, NV_KERN_FP32_KC, avx512emu_gemm, avx512emu_gemm_q8, 1};

void nv_kern_avx512_emu_inject(int on) { emu_inject = on; }
