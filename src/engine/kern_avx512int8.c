/* The avx512-int8 engine's kernel: VPDPBUSD (AVX512_VNNI: Intel Cascade Lake and later, AMD Zen 4
 * and later) over the amx-int8 engine's int8 VNNI tiles, 64 multiply-adds per instruction against
 * the 32 of VDPBF16PS and the 16 of an fp32 FMA, on weights of one byte. VPDPBUSD multiplies
 * unsigned by signed bytes, so A arrives as q + 128 (u8) and every output's sum starts at
 * -128 * sum(q_w) (wc): the int32 sums, which wrap exactly as the instruction's do, are then
 * amx-int8's (tdpbssd, signed by signed), and so are the outputs, bit for bit. This file alone is
 * compiled for AVX512_VNNI (the target pragma below); engine.c calls it only after the run-time
 * probe found AVX-512F/BW/VL and AVX512_VNNI enabled by the OS and its self-test passed. The same
 * loop runs through kern_vdot_emu.c on AVX2 (tests). */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni")
#include <immintrin.h>
#include <string.h>

#include "engine/kern.h"
#include "engine/kern_zmm.h"

#define VB(name) vint8_##name
#define VB_ELEM uint8_t
#define VB_GROUP 4
#define VACC __m512i
#define VBT __m512i
#define vloadb(p) _mm512_loadu_si512((const void *)(p))
static inline __m512i vdp(__m512i acc, uint32_t quad, __m512i b) {
    return _mm512_dpbusd_epi32(acc, _mm512_set1_epi32((int)quad), b);
}
#define vinit(o, t) _mm512_loadu_si512((const void *)((o)->wc + (t) * 16))
/* ((float)acc * xs) * ws lane by lane, as amx-int8 writes its tiles */
#define vout(o, c, r, t, acc, n)                                                                                       \
    vstore_n(c, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps((o)->xs[r])),                     \
                              _mm512_loadu_ps((o)->ws + (t) * 16)),                                                    \
             n)

#include "engine/kern_vdot_tmpl.h"

/* the block-quantized product (kern_qdot_tmpl.h): the weights unsigned, the activations' four
   signed bytes broadcast (an operand VPDPBUSD can take from memory) */
#define QD(name) vqdot_##name
#define VF __m512
/* 4-bit rows: nibbles to bytes, low ones and high ones; with tab, each an index into its 16 bytes */
static inline void vqload4(const uint8_t *p, const uint8_t *tab, __m512i *lo, __m512i *hi) {
    const __m512i v = _mm512_loadu_si512((const void *)p), m = _mm512_set1_epi8(0x0f);
    *lo = _mm512_and_si512(v, m);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
    if (tab) {
        const __m512i t = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)tab));
        *lo = _mm512_shuffle_epi8(t, *lo);
        *hi = _mm512_shuffle_epi8(t, *hi);
    }
}
static inline __m512i vdq(__m512i acc, uint32_t quad, __m512i b) {
    return _mm512_dpbusd_epi32(acc, b, _mm512_set1_epi32((int)quad));
}
#define vset(v) _mm512_set1_epi32(v)
#define vzero() _mm512_setzero_ps()
#define vblock(y, acc, s, xs) _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(_mm512_loadu_ps(s), _mm512_set1_ps(xs)), y)
#define voff(y, o, xsum) _mm512_fmadd_ps(_mm512_loadu_ps(o), _mm512_set1_ps(xsum), y)
#define vsc(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define vmla(acc, u, v) _mm512_add_epi32(acc, _mm512_mullo_epi32(u, v))
#define vfload(p) _mm512_load_ps(p)
#define vfstore(p, y) _mm512_store_ps(p, y)
#define vqload(p) vloadb(p)
#define vqout(c, y, n) vstore_n(c, y, n)

#include "engine/kern_qdot_tmpl.h"

/* bf16_gemm (the training products) is set by the probe: VDPBF16PS where the CPU has it, else its
 * emulation (the same bits, slower). */
const nv_kern_amx nv_kern_avx512int8 = {"avx512-int8", NULL, vint8_int8_gemm, 1, vqdot_qdot_gemm, 0};
