/* The avx512 engine's kernel: 16-wide fp32 FMA, 8 rows x 32 outputs per micro-kernel (16 zmm
 * accumulators). This file alone is compiled for AVX-512 (the target pragma below); engine.c calls
 * it only after the run-time probe found AVX-512F/BW/VL enabled by the OS and its self-test passed.
 * The same kernel logic runs on this machine through kern_avx512_emu.c (pairs of AVX2 vectors). */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include <immintrin.h>

#include "engine/kern.h"

#define KP(name) avx512_##name
#define VF __m512
#define VW 16
#define MR 8
#define vzero() _mm512_setzero_ps()
#define vloadu(p) _mm512_loadu_ps(p)
#define vbcast(f) _mm512_set1_ps(f)
#define vfma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vstoreu(p, v) _mm512_storeu_ps(p, v)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vload_q8(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#define vload_h(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define vload_bf(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(p))), 16))
#define vload_q4(p, lo, hi)                                                                                            \
    do {                                                                                                               \
        const __m512i b_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)));                                \
        lo = _mm512_cvtepi32_ps(_mm512_and_si512(b_, _mm512_set1_epi32(15)));                                          \
        hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b_, 4));                                                             \
    } while (0)
/* the same nibbles as indices: one in-register table of 16 floats */
#define vload_q4t(p, t, lo, hi)                                                                                        \
    do {                                                                                                               \
        const __m512i b_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p)));                                \
        const __m512 t_ = _mm512_loadu_ps(t);                                                                          \
        lo = _mm512_permutexvar_ps(_mm512_and_si512(b_, _mm512_set1_epi32(15)), t_);                                   \
        hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b_, 4), t_);                                                      \
    } while (0)
#include "engine/kern_zmm.h"

#include "engine/kern_fp32_tmpl.h"

const nv_kern_fp32 nv_kern_avx512 = {"avx512", 2 * VW, MR, NV_KERN_FP32_KC, avx512_gemm, avx512_gemm_q8, 1};

/* ---- fp32 -> bf16 conversions, 16 at a time: the same bits as nv_bf16_from_f32 (round to nearest
 * even by integer arithmetic, subnormals kept, NaN made quiet), which VCVTNEPS2BF16 is not (it takes
 * subnormal inputs as zero). engine.c takes these over its 8-wide ones where AVX-512 is on. */

static inline __m256i bf16x16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

void nv_avx512_row_to_bf16(const float *src, const float *colscale, uint16_t *dst, int k) {
    int j = 0;
    for (; j + 16 <= k; j += 16) {
        __m512 v = _mm512_loadu_ps(src + j);
        if (colscale) v = _mm512_mul_ps(v, _mm512_loadu_ps(colscale + j));
        _mm256_storeu_si256((__m256i *)(dst + j), bf16x16(v));
    }
    if (j < k) { /* the tail through masks: the lanes past k neither read nor written */
        const __mmask16 m = (__mmask16)((1u << (k - j)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, src + j);
        if (colscale) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, colscale + j));
        _mm256_mask_storeu_epi16(dst + j, m, bf16x16(v));
    }
}

void nv_avx512_vnni_pair16(const float *r0, const float *r1, uint16_t *out) {
    const __m256i a = bf16x16(_mm512_loadu_ps(r0)), b = bf16x16(_mm512_loadu_ps(r1));
    const __m256i lo = _mm256_unpacklo_epi16(a, b), hi = _mm256_unpackhi_epi16(a, b); /* pairs 0-3 | 8-11, 4-7 | 12-15 */
    _mm256_storeu_si256((__m256i *)out, _mm256_permute2x128_si256(lo, hi, 0x20));
    _mm256_storeu_si256((__m256i *)(out + 16), _mm256_permute2x128_si256(lo, hi, 0x31));
}
