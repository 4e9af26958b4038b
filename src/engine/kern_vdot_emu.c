/* The vector dot-product engines' loop (kern_vdot_tmpl.h) on AVX2, with their instructions
 * emulated as the SDM writes them, so that the avx512-bf16 and avx512-int8 engines' packing, tiling
 * and remainder logic is tested on machines without AVX512_BF16 or AVX512_VNNI. Besides tests:
 * the int8 loop is the avx2-int8 engine (amx-int8's bits on any AVX2 CPU: int8 weights stream a
 * quarter of fp32's bytes), and the bf16 loop runs the int8 engines' training products on a CPU
 * without AVX512_BF16: the same bits as VDPBF16PS, several times slower.
 *   VDPBF16PS: the odd depth's product added first, then the even one's (products of two bf16 are
 *     exact in fp32, so fused or not gives the same bits), denormal inputs read as zero and
 *     denormal results flushed to zero (the instruction's DAZ and FTZ, whatever MXCSR says).
 *   VPDPBUSD: four products of an unsigned and a signed byte added to the 32-bit lane, wrapping
 *     (VPMADDWD on the bytes widened to 16 bits: exact, where VPMADDUBSW would saturate). */
#include <immintrin.h>
#include <string.h>

#include "engine/kern.h"
#include "engine/kern_ymm.h"

/* ---------------------------------------------------------------- VDPBF16PS */

typedef struct {
    __m256 even_lo, odd_lo, even_hi, odd_hi; /* lanes 0-7 and 8-15: depth 2i and 2i + 1 as fp32 */
} vb32;

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
static inline vb32 vloadb_bf16(const uint16_t *p) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)p), hi = _mm256_loadu_si256((const __m256i *)(p + 16));
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    return (vb32){daz(_mm256_slli_epi32(lo, 16)), daz(_mm256_and_si256(lo, top)), daz(_mm256_slli_epi32(hi, 16)),
                  daz(_mm256_and_si256(hi, top))};
}
static int bf16_inject;                  /* nv_kern_avx512bf16_emu_inject() */
static _Thread_local unsigned bf16_calls; /* which instruction is the eighth */
static inline v16 vdp_bf16(v16 acc, uint32_t pair, vb32 b) {
    if (bf16_inject && ++bf16_calls % 8 == 0) pair &= 0xffff0000u; /* the even depth's product lost */
    const __m256 a0 = daz(_mm256_set1_epi32((int)(pair << 16)));
    const __m256 a1 = daz(_mm256_set1_epi32((int)(pair & 0xffff0000u)));
    acc.lo = ftz(_mm256_fmadd_ps(a0, b.even_lo, ftz(_mm256_fmadd_ps(a1, b.odd_lo, acc.lo))));
    acc.hi = ftz(_mm256_fmadd_ps(a0, b.even_hi, ftz(_mm256_fmadd_ps(a1, b.odd_hi, acc.hi))));
    return acc;
}

/* a B operand is 4 ymm registers here: 4 rows x 1 tile (8 accumulators) fit the 16 */
#define VB_MR 4
#define VB_NT 1
#define VB_NT_FEW 2
#define VB(name) vbf16emu_##name
#define VB_ELEM uint16_t
#define VB_GROUP 2
#define VACC v16
#define VBT vb32
#define vloadb(p) vloadb_bf16(p)
#define vdp(acc, group, b) vdp_bf16(acc, group, b)
#define vinit(o, t) ((v16){_mm256_setzero_ps(), _mm256_setzero_ps()})
static inline void vout_bf16(int accumulate, float *c, v16 acc, int n) {
    if (accumulate) {
        const v16 old = vload_n(c, n);
        acc = (v16){_mm256_add_ps(old.lo, acc.lo), _mm256_add_ps(old.hi, acc.hi)};
    }
    vstore_n(c, acc, n);
}
#define vout(o, c, r, t, acc, n) vout_bf16((o)->accumulate, c, acc, n)

#include "engine/kern_vdot_tmpl.h"

#undef VB
#undef VB_ELEM
#undef VB_GROUP
#undef VACC
#undef VBT
#undef vloadb
#undef vdp
#undef vinit
#undef vout

const nv_kern_amx nv_kern_avx512bf16_emu = {"avx512-bf16 (emulated)", vbf16emu_bf16_gemm, NULL, 0, NULL, 1};

void nv_kern_avx512bf16_emu_inject(int on) { bf16_inject = on; }

/* ---------------------------------------------------------------- VPDPBUSD */

typedef struct {
    __m256i even_lo, odd_lo, even_hi, odd_hi; /* lanes 0-7 and 8-15: bytes 0, 2 and 1, 3 of each as int16 */
} vq32;

static inline vq32 widen_int8(__m256i lo, __m256i hi) {
    return (vq32){_mm256_srai_epi16(_mm256_slli_epi16(lo, 8), 8), _mm256_srai_epi16(lo, 8),
                  _mm256_srai_epi16(_mm256_slli_epi16(hi, 8), 8), _mm256_srai_epi16(hi, 8)};
}
static inline vq32 vloadb_int8(const uint8_t *p) {
    return widen_int8(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32)));
}
/* The block-quantized loop's B: unsigned bytes widened (zero-extended) to int16. */
static inline vq32 widen_u8(__m256i lo, __m256i hi) {
    const __m256i m = _mm256_set1_epi16(0xff);
    return (vq32){_mm256_and_si256(lo, m), _mm256_srli_epi16(lo, 8), _mm256_and_si256(hi, m), _mm256_srli_epi16(hi, 8)};
}
static inline vq32 vloadb_u8(const uint8_t *p) {
    return widen_u8(_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32)));
}
static inline void vloadb4_u8(const uint8_t *p, const uint8_t *tab, vq32 *lo, vq32 *hi) {
    __m256i l0, l1, h0, h1;
    nibbles_q(p, tab, &l0, &l1, &h0, &h1);
    *lo = widen_u8(l0, l1);
    *hi = widen_u8(h0, h1);
}
static int int8_inject;                  /* nv_kern_avx512int8_emu_inject() */
static _Thread_local unsigned int8_calls; /* which instruction is the eighth */
/* acc + per 32-bit lane the four products of a's and b's bytes, a's given widened: ae its bytes 0 and
 * 2, ao its bytes 1 and 3, as int16 */
static inline v16i madd_quads(v16i acc, __m256i ae, __m256i ao, vq32 b) {
    acc.lo = _mm256_add_epi32(acc.lo, _mm256_add_epi32(_mm256_madd_epi16(ae, b.even_lo), _mm256_madd_epi16(ao, b.odd_lo)));
    acc.hi = _mm256_add_epi32(acc.hi, _mm256_add_epi32(_mm256_madd_epi16(ae, b.even_hi), _mm256_madd_epi16(ao, b.odd_hi)));
    return acc;
}
/* inject: the test instance, which fault injection reaches; the engine's instance has no check */
static inline v16i vdp_int8(v16i acc, uint32_t quad, vq32 b, const int inject) {
    if (inject && int8_inject && ++int8_calls % 8 == 0) quad &= 0x00ffffffu; /* the last depth's product lost */
    const __m256i a = _mm256_set1_epi32((int)quad);
    return madd_quads(acc, _mm256_and_si256(a, _mm256_set1_epi16(0xff)), _mm256_srli_epi16(a, 8), b); /* u8 -> int16 */
}
/* The same with the operands' roles swapped, for the block-quantized loop: b's bytes unsigned (widened
 * so by vloadb_u8), the broadcast group's signed. */
static inline v16i vdq_int8(v16i acc, uint32_t quad, vq32 b, const int inject) {
    if (inject && int8_inject && ++int8_calls % 8 == 0) quad &= 0x00ffffffu;
    const __m256i a = _mm256_set1_epi32((int)quad);
    return madd_quads(acc, _mm256_srai_epi16(_mm256_slli_epi16(a, 8), 8), _mm256_srai_epi16(a, 8), b); /* s8 -> int16 */
}

#define VB_MR 4
#define VB_NT 1
#define VB_NT_FEW 2
#define VB(name) vint8emu_##name
#define VB_ELEM uint8_t
#define VB_GROUP 4
#define VACC v16i
#define VBT vq32
#define vloadb(p) vloadb_int8(p)
#define vdp(acc, group, b) vdp_int8(acc, group, b, 1)
#define vinit(o, t) vinit_int8((o)->wc + (t) * 16)
#define vout(o, c, r, t, acc, n) vout_int8((o)->xs[r], (o)->ws + (t) * 16, c, acc, n)

#include "engine/kern_vdot_tmpl.h"

/* the block-quantized product (kern_qdot_tmpl.h) on the same emulated instruction */
#define QD(name) vqdotemu_##name
#define QD_MR 2
#define QD_NT 1
#define QD_NT_FEW 1
#define VF v16
#define vqload(p) vloadb_u8(p)
#define vqload4(p, tab, lo, hi) vloadb4_u8(p, tab, lo, hi)
#define vdq(acc, group, b) vdq_int8(acc, group, b, 1)
#define vset(v) vset_q(v)
#define vzero() vzero_q()
#define vblock(y, acc, s, xs) vblock_q(y, acc, s, xs)
#define voff(y, o, xsum) voff_q(y, o, xsum)
#define vsc(p) vsc_q(p)
#define vmla(acc, u, v) vmla_q(acc, u, v)
#define vfload(p) vfload_q(p)
#define vfstore(p, y) vfstore_q(p, y)
#define vqout(c, y, n) vstore_n(c, y, n)

#include "engine/kern_qdot_tmpl.h"

const nv_kern_amx nv_kern_avx512int8_emu = {"avx512-int8 (emulated)", NULL, vint8emu_int8_gemm, 1, vqdotemu_qdot_gemm, 0};

/* The same loop without the fault-injection check: the avx2-int8 engine. */
#undef VB
#undef vdp
#define VB_MR 4
#define VB_NT 1
#define VB_NT_FEW 2
#define VB(name) vint8avx2_##name
#define vdp(acc, group, b) vdp_int8(acc, group, b, 0)

#include "engine/kern_vdot_tmpl.h"

/* No block-quantized loop here: four instructions per VPDPBUSD make it slower than avx2's exact
   path over the same values (prefill of a stories110M-shaped Q4_K_M file 520 against 880 tok/s),
   so such plans go there (the AVX-VNNI instance has one). */
const nv_kern_amx nv_kern_avx2int8 = {"avx2-int8", NULL, vint8avx2_int8_gemm, 1, NULL, 0};

void nv_kern_avx512int8_emu_inject(int on) { int8_inject = on; }
