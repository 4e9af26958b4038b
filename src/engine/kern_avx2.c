/* The avx2 engine's kernel: 8-wide fp32 FMA, 6 rows x 16 outputs per micro-kernel (12 accumulators).
 * Compiled for the project's baseline (x86-64-v3 includes AVX2 and FMA). */
#include <immintrin.h>

#include "base/vmath.h"
#include "engine/kern.h"


#define KP(name) avx2_##name
#define VF __m256
#define VW 8
#define MR 6
#define vzero() _mm256_setzero_ps()
#define vloadu(p) _mm256_loadu_ps(p)
#define vbcast(f) _mm256_set1_ps(f)
#define vfma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vstoreu(p, v) _mm256_storeu_ps(p, v)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vload_q8(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#define vload_h(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define vload_bf(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16))
/* one widening load, each byte in a 32-bit lane: its low nibble is an and, its high one a shift */
#define vload_q4(p, lo, hi)                                                                                            \
    do {                                                                                                               \
        const __m256i b_ = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(p)));                               \
        lo = _mm256_cvtepi32_ps(_mm256_and_si256(b_, _mm256_set1_epi32(15)));                                          \
        hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(b_, 4));                                                             \
    } while (0)
/* no vload_q4t: a table's lookup in 8 lanes (two permutes and a blend a vector) cost more than the
   bytes it saves (IQ4_XS, stories110M shape, 2 threads: decode 86-134 tok/s against 128-156 with
   8-bit values, prefill 804-874 against 929-1033), so engine.c gives this kernel the values */
#define vload_n(p, n) nv_load8_n(p, n)
#define vstore_n(p, v, n) nv_store8_n(p, v, n)

#include "engine/kern_fp32_tmpl.h"

const nv_kern_fp32 nv_kern_avx2 = {"avx2", 2 * VW, MR, NV_KERN_FP32_KC, avx2_gemm, avx2_gemm_q8, 0};
