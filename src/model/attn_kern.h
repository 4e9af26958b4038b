/* Attention kernels shared by the single-sequence forward (forward.c) and the batched one
 * (batch.c). Every sum runs in the order of llama2.c's scalar loops — lanes hold different
 * positions or different dimensions, never parts of one sum, and multiply and add stay separate —
 * so any grouping of rows gives the same values. */
#ifndef NV_ATTN_KERN_H
#define NV_ATTN_KERN_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "base/vmath.h"

/* Element types of stored keys and values: fp32, fp16, or int8 whose scales are applied outside
 * these loads (to the scores and the attention weights: model/batch.c). DT is a constant in each
 * instance of the kernels below. */
enum { KV_F32 = 0, KV_F16 = 1, KV_Q8 = 2 };

/* Loads of elements as fp32 (int8 converts exactly). */
static inline __attribute__((always_inline)) __m256 kv_load8(const void *base, size_t i, const int DT) {
    return DT == KV_F16  ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)))
           : DT == KV_Q8 ? _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)base + i))))
                         : _mm256_loadu_ps((const float *)base + i);
}
static inline __attribute__((always_inline)) float kv_load1(const void *base, size_t i, const int DT) {
    return DT == KV_F16 ? _cvtsh_ss(((const uint16_t *)base)[i])
           : DT == KV_Q8 ? (float)((const int8_t *)base)[i]
                         : ((const float *)base)[i];
}

/* Scores of R rows (queries q[r], row r seeing cnt[r] positions of the block, cnt[r] <= 0: none)
 * against 8*NZ positions z0.. of a block of keys stored transposed ([hd][B] at element kt of base):
 * R*NZ independent sums, each lane summing q[i] k[i] over i in order — multiply then add, as
 * llama2.c's loops, or with FUSED one fused multiply-add per step (training) — then divided by
 * scale (1 is exact); att[r][z] gets position z's score (z < cnt[r]). */
static inline __attribute__((always_inline)) void scores_rows(const int R, const int NZ, const int FUSED,
                                                              const float *const *q, int hd, const void *base, size_t kt,
                                                              int B, int z0, const int *cnt, float scale,
                                                              float *const *att, const int DT) {
    __m256 acc[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NZ; c++) acc[r][c] = _mm256_setzero_ps();
    for (int i = 0; i < hd; i++) {
        __m256 k[2];
#pragma GCC unroll 4
        for (int c = 0; c < NZ; c++) k[c] = kv_load8(base, kt + (size_t)i * B + z0 + 8 * c, DT);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m256 qi = _mm256_set1_ps(q[r][i]);
#pragma GCC unroll 4
            for (int c = 0; c < NZ; c++)
                acc[r][c] = FUSED ? _mm256_fmadd_ps(qi, k[c], acc[r][c]) : _mm256_add_ps(acc[r][c], _mm256_mul_ps(qi, k[c]));
        }
    }
    const __m256 vscale = _mm256_set1_ps(scale);
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < NZ; c++) { /* the lanes past the row's count are not stored */
            const int n = cnt[r] - z0 - 8 * c;
            const __m256 v = _mm256_div_ps(acc[r][c], vscale);
            if (n >= 8) _mm256_storeu_ps(att[r] + z0 + 8 * c, v);
            else if (n > 0) _mm256_maskstore_ps(att[r] + z0 + 8 * c, nv_lane_mask8(n), v);
        }
}

static inline __attribute__((always_inline)) void scores_rows_any(int R, int NZ, const int FUSED, const float *const *q,
                                                                  int hd, const void *base, size_t kt, int B, int z0,
                                                                  const int *cnt, float scale, float *const *att,
                                                                  const int DT) {
#define SR(r, nz) scores_rows(r, nz, FUSED, q, hd, base, kt, B, z0, cnt, scale, att, DT)
    switch (R * 2 + NZ - 1) {
    case 2: SR(1, 1); break;
    case 3: SR(1, 2); break;
    case 4: SR(2, 1); break;
    case 5: SR(2, 2); break;
    case 6: SR(3, 1); break;
    case 7: SR(3, 2); break;
    case 8: SR(4, 1); break;
    default: SR(4, 2); break;
    }
#undef SR
}

/* out[0 .. 8*NV) += att[z] v[z][0 .. 8*NV) for z < cnt in order (v rows vld floats apart): a row's
 * NV sums held in registers over the positions, loaded from and stored back to out (exact). */
static inline __attribute__((always_inline)) void values_rows_add(const int NV, const float *att, const float *v,
                                                                  size_t vld, int cnt, float *out) {
    __m256 o[8];
#pragma GCC unroll 8
    for (int c = 0; c < NV; c++) o[c] = _mm256_loadu_ps(out + 8 * c);
    for (int z = 0; z < cnt; z++) {
        const __m256 a = _mm256_set1_ps(att[z]);
#pragma GCC unroll 8
        for (int c = 0; c < NV; c++) o[c] = _mm256_add_ps(o[c], _mm256_mul_ps(a, _mm256_loadu_ps(v + (size_t)z * vld + 8 * c)));
    }
#pragma GCC unroll 8
    for (int c = 0; c < NV; c++) _mm256_storeu_ps(out + 8 * c, o[c]);
}

static inline void values_rows_add_any(int NV, const float *att, const float *v, size_t vld, int cnt, float *out) {
    switch (NV) {
    case 1: values_rows_add(1, att, v, vld, cnt, out); break;
    case 2: values_rows_add(2, att, v, vld, cnt, out); break;
    case 3: values_rows_add(3, att, v, vld, cnt, out); break;
    case 4: values_rows_add(4, att, v, vld, cnt, out); break;
    case 5: values_rows_add(5, att, v, vld, cnt, out); break;
    case 6: values_rows_add(6, att, v, vld, cnt, out); break;
    case 7: values_rows_add(7, att, v, vld, cnt, out); break;
    default: values_rows_add(8, att, v, vld, cnt, out); break;
    }
}

#endif
