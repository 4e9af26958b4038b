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
