/* The avx2-int8 engine's loop where the CPU has AVX-VNNI (the VEX, 256-bit VPDPBUSD of Alder Lake
 * and later, and of Zen 5): the vector int8 loop (kern_vdot_tmpl.h) on pairs of ymm registers, one
 * VPDPBUSD per 8 lanes x 4 depths where the plain AVX2 instance (kern_vdot_emu.c) needs four
 * instructions; the int32 sums, and so the outputs, are the same bits. This file alone is compiled
 * for AVX-VNNI (the target pragma below); engine.c calls it only after the run-time probe found
 * AVX-VNNI with the AVX state enabled, and the avx2-int8 self-test ran on it. */
#pragma GCC target("avx2,fma,avxvnni")
#include <immintrin.h>
#include <string.h>

#include "engine/kern.h"
#include "engine/kern_ymm.h"

typedef struct {
    __m256i lo, hi; /* 8 outputs x 4 depths each */
} vq16;

static inline vq16 vloadb_vnni(const uint8_t *p) {
    return (vq16){_mm256_loadu_si256((const __m256i *)p), _mm256_loadu_si256((const __m256i *)(p + 32))};
}
static inline v16i vdp_vnni(v16i acc, uint32_t quad, vq16 b) {
    const __m256i a = _mm256_set1_epi32((int)quad);
    return (v16i){_mm256_dpbusd_avx_epi32(acc.lo, a, b.lo), _mm256_dpbusd_avx_epi32(acc.hi, a, b.hi)};
}

#define VB(name) vint8vnni_##name
#define VB_MR 6 /* 12 accumulator registers, 2 for B, 1 for A: the 16 ymm registers */
#define VB_NT 1
#define VB_NT_FEW 3
#define VB_ELEM uint8_t
#define VB_GROUP 4
#define VACC v16i
#define VBT vq16
#define vloadb(p) vloadb_vnni(p)
#define vdp(acc, group, b) vdp_vnni(acc, group, b)
#define vinit(o, t) vinit_int8((o)->wc + (t) * 16)
#define vout(o, c, r, t, acc, n) vout_int8((o)->xs[r], (o)->ws + (t) * 16, c, acc, n)

#include "engine/kern_vdot_tmpl.h"

/* the block-quantized product (kern_qdot_tmpl.h): the weights unsigned, the activations signed */
static inline void vloadb4_vnni(const uint8_t *p, const uint8_t *tab, vq16 *lo, vq16 *hi) {
    nibbles_q(p, tab, &lo->lo, &lo->hi, &hi->lo, &hi->hi);
}
static inline v16i vdq_vnni(v16i acc, uint32_t quad, vq16 b) {
    const __m256i a = _mm256_set1_epi32((int)quad);
    return (v16i){_mm256_dpbusd_avx_epi32(acc.lo, b.lo, a), _mm256_dpbusd_avx_epi32(acc.hi, b.hi, a)};
}
#define QD(name) vqdotvnni_##name
#define QD_MR 3
#define QD_NT 1
#define QD_NT_FEW 2
#define VF v16
#define vqload(p) vloadb_vnni(p)
#define vqload4(p, tab, lo, hi) vloadb4_vnni(p, tab, lo, hi)
#define vdq(acc, group, b) vdq_vnni(acc, group, b)
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

const nv_kern_amx nv_kern_avxvnni_int8 = {"avx2-int8 (AVX-VNNI)", NULL, vint8vnni_int8_gemm, 1, vqdotvnni_qdot_gemm, 0};
