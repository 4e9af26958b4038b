/* The avx512-bf16 engine's kernel: VDPBF16PS (AVX512_BF16: AMD Zen 4 and later, Intel Cooper Lake
 * and Sapphire Rapids) over the AMX engine's bf16 VNNI tiles, 32 multiply-adds per instruction
 * against the 16 of an fp32 FMA. This file alone is compiled for AVX512_BF16 (the target pragma
 * below); engine.c calls it only after the run-time probe found AVX-512F/BW/VL and AVX512_BF16
 * enabled by the OS and its self-test passed. The same loop runs through kern_vdot_emu.c on
 * AVX2 (tests). */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#include <immintrin.h>
#include <string.h>

#include "engine/kern.h"

#include "engine/kern_zmm.h"

#define VB(name) vbf16_##name
#define VB_ELEM uint16_t
#define VB_GROUP 2
#define VACC __m512
#define VBT __m512i
#define vloadb(p) _mm512_loadu_si512((const void *)(p))
static inline __m512 vdp(__m512 acc, uint32_t pair, __m512i b) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32((int)pair), (__m512bh)b);
}
#define vinit(o, t) _mm512_setzero_ps()
#define vout(o, c, r, t, acc, n) vstore_n(c, (o)->accumulate ? _mm512_add_ps(vload_n(c, n), acc) : (acc), n)

#include "engine/kern_vdot_tmpl.h"

const nv_kern_amx nv_kern_avx512bf16 = {"avx512-bf16", vbf16_bf16_gemm, NULL, 0, NULL, 1};
