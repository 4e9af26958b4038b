/* Test-only: the avx512-bf16 kernel's loop (kern_vbf16_tmpl.h) on AVX2, VDPBF16PS emulated as the
 * SDM writes it: the odd depth's product added first, then the even one's (products of two bf16
 * are exact in fp32, so fused or not gives the same bits), denormal inputs read as zero and
 * denormal results flushed to zero (the instruction's DAZ and FTZ, whatever MXCSR says); so the
 * engine's packing, tiling and remainder logic is tested on machines without AVX512_BF16. */
#include <immintrin.h>
#include <string.h>

#include "base/vmath.h"
#include "engine/kern.h"

typedef struct {
    __m256 lo, hi;
} v16;
typedef struct {
    __m256 even_lo, odd_lo, even_hi, odd_hi; /* lanes 0-7 and 8-15: depth 2i and 2i + 1 as fp32 */
} vb32;

static inline v16 vzero(void) { return (v16){_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline v16 vadd(v16 a, v16 b) { return (v16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
/* DAZ: an fp32 (made from a bf16) whose exponent is zero is read as a zero of its sign. */
static inline __m256 daz(__m256i v) {
    const __m256i exp = _mm256_set1_epi32(0x7f800000), sign = _mm256_set1_epi32((int)0x80000000u);
    const __m256i denormal = _mm256_cmpeq_epi32(_mm256_and_si256(v, exp), _mm256_setzero_si256());
    return _mm256_castsi256_ps(_mm256_blendv_epi8(v, _mm256_and_si256(v, sign), denormal));
}
/* FTZ: a result below the smallest normal in magnitude becomes a zero of its sign (NaN stays). */
static inline __m256 ftz(__m256 v) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
    return _mm256_blendv_ps(v, _mm256_and_ps(v, sign), tiny);
}
static inline vb32 vloadb(const uint16_t *p) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)p), hi = _mm256_loadu_si256((const __m256i *)(p + 16));
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    return (vb32){daz(_mm256_slli_epi32(lo, 16)), daz(_mm256_and_si256(lo, top)), daz(_mm256_slli_epi32(hi, 16)),
                  daz(_mm256_and_si256(hi, top))};
}
static int emu_inject;                  /* nv_kern_avx512bf16_emu_inject() */
static _Thread_local unsigned emu_calls; /* which instruction is the eighth */
static inline v16 vdp(v16 acc, uint32_t pair, vb32 b) {
    if (emu_inject && ++emu_calls % 8 == 0) pair &= 0xffff0000u; /* the even depth's product lost */
    const __m256 a0 = daz(_mm256_set1_epi32((int)(pair << 16)));
    const __m256 a1 = daz(_mm256_set1_epi32((int)(pair & 0xffff0000u)));
    acc.lo = ftz(_mm256_fmadd_ps(a0, b.even_lo, ftz(_mm256_fmadd_ps(a1, b.odd_lo, acc.lo))));
    acc.hi = ftz(_mm256_fmadd_ps(a0, b.even_hi, ftz(_mm256_fmadd_ps(a1, b.odd_hi, acc.hi))));
    return acc;
}
static inline v16 vload_n(const float *p, int n) {
    if (n >= 16) return (v16){_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    if (n <= 0) return vzero();
    return (v16){nv_load8_n(p, n), n > 8 ? nv_load8_n(p + 8, n - 8) : _mm256_setzero_ps()};
}
static inline void vstore_n(float *p, v16 v, int n) {
    nv_store8_n(p, v.lo, n);
    if (n > 8) nv_store8_n(p + 8, v.hi, n - 8);
}

#define VB(name) vbf16emu_##name
#define VF v16
#define VBT vb32

#include "engine/kern_vbf16_tmpl.h"

const nv_kern_amx nv_kern_avx512bf16_emu = {"avx512-bf16 (emulated)", vbf16emu_bf16_gemm, NULL};

void nv_kern_avx512bf16_emu_inject(int on) { emu_inject = on; }
