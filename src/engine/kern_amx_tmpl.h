/* AMX tile loops, written once (see kern.h for the operand layouts). The including file defines:
 *   AP(name)                      function-name prefix
 *   TCFG(cfg)                     load a 64-byte nv_amx_cfg (ldtilecfg)
 *   TZERO(t)  TLOAD(t,p,stride)  TSTORE(t,p,stride)  (stride in bytes, tile numbers are constants)
 *   TDPBF16(c,a,b)  TDPBSSD(c,a,b)  TRELEASE()
 * Tiles: C00=0 C01=1 C10=2 C11=3 (16 x 16 fp32 / int32), A0=4 A1=5 (rows x 64 bytes), B0=6 B1=7
 * (16 x 64 bytes). A block is up to 32 rows x 32 columns: 2 A tiles x 2 B tiles, 4 products per
 * depth step. With fewer than 16 rows the A and C tiles are configured with exactly that many rows
 * (decode streams the weight tiles with a 1-row A tile); otherwise 16 rows and the last partial
 * block reads zero rows of the padded A buffer and writes only the valid rows.
 * Results: a C tile that covers whole rows of 16 valid outputs is stored by the tile unit straight
 * into C (or, when C accumulates, into a buffer added to C 8 lanes at a time); only the edge tiles
 * go through the element loops. A 32 x 32 block at K = 768 is 96 products of 16 cycles each, and
 * copying its 1,024 results one float at a time would cost about half as much again.
 * Needs AVX2 (the project's baseline) besides the tile unit. */
#include <immintrin.h>

#define ALWAYS_INLINE inline __attribute__((always_inline))

static void AP(configure)(int R) {
    nv_amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 6; t++) { /* C00..C11, A0, A1: R rows of 64 bytes */
        cfg.rows[t] = (uint8_t)R;
        cfg.colsb[t] = 64;
    }
    for (int t = 6; t < 8; t++) { /* B0, B1: 16 rows of 64 bytes */
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    TCFG(&cfg);
}

/* Copies the valid part of the stored C tiles (nr rows x 16, row stride 16) to C. */
static ALWAYS_INLINE void AP(put_f32)(const float *tile, int nr, int nc, float *C, size_t ldc, int accumulate) {
    if (nc >= 16) { /* whole rows: c + t lane by lane, the same sums as the loop below */
        for (int i = 0; i < nr; i++) {
            float *c = C + (size_t)i * ldc;
            __m256 t0 = _mm256_load_ps(tile + i * 16), t1 = _mm256_load_ps(tile + i * 16 + 8);
            if (accumulate) t0 = _mm256_add_ps(_mm256_loadu_ps(c), t0), t1 = _mm256_add_ps(_mm256_loadu_ps(c + 8), t1);
            _mm256_storeu_ps(c, t0);
            _mm256_storeu_ps(c + 8, t1);
        }
        return;
    }
    for (int i = 0; i < nr; i++) {
        float *c = C + (size_t)i * ldc;
        const float *t = tile + i * 16;
        if (accumulate)
            for (int j = 0; j < nc; j++) c[j] += t[j];
        else
            for (int j = 0; j < nc; j++) c[j] = t[j];
    }
}

static ALWAYS_INLINE void AP(put_i32)(const int32_t *tile, int nr, int nc, const float *xs, const float *ws, float *C,
                                      size_t ldc) {
    if (nc >= 16) { /* whole rows: ((float)t * xs) * ws lane by lane, as the loop below */
        const __m256 w0 = _mm256_loadu_ps(ws), w1 = _mm256_loadu_ps(ws + 8);
        for (int i = 0; i < nr; i++) {
            float *c = C + (size_t)i * ldc;
            const __m256 x = _mm256_set1_ps(xs[i]);
            const __m256 t0 = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(tile + i * 16)));
            const __m256 t1 = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(tile + i * 16 + 8)));
            _mm256_storeu_ps(c, _mm256_mul_ps(_mm256_mul_ps(t0, x), w0));
            _mm256_storeu_ps(c + 8, _mm256_mul_ps(_mm256_mul_ps(t1, x), w1));
        }
        return;
    }
    for (int i = 0; i < nr; i++) {
        float *c = C + (size_t)i * ldc;
        const int32_t *t = tile + i * 16;
        for (int j = 0; j < nc; j++) c[j] = (float)t[j] * xs[i] * ws[j];
    }
}

/* dst[i], dstride[i]: where C tile i is stored (C itself, or a 16 x 16 buffer), row stride in bytes */
static ALWAYS_INLINE void AP(bf16_block)(const int na, const int nb, const uint16_t *a0, size_t lda, int KB,
                                         const uint16_t *b0, size_t tstride, float *const dst[4], const long dstride[4]) {
    const uint16_t *a1 = a0 + 16 * lda, *b1 = b0 + tstride;
    const long sa = (long)(lda * 2);
    TZERO(0);
    if (nb > 1) TZERO(1);
    if (na > 1) TZERO(2);
    if (na > 1 && nb > 1) TZERO(3);
    for (int kb = 0; kb < KB; kb++) {
        TLOAD(4, a0 + kb * 32, sa);
        if (na > 1) TLOAD(5, a1 + kb * 32, sa);
        TLOAD(6, b0 + (size_t)kb * 512, 64);
        if (nb > 1) TLOAD(7, b1 + (size_t)kb * 512, 64);
        TDPBF16(0, 4, 6);
        if (nb > 1) TDPBF16(1, 4, 7);
        if (na > 1) TDPBF16(2, 5, 6);
        if (na > 1 && nb > 1) TDPBF16(3, 5, 7);
    }
    TSTORE(0, dst[0], dstride[0]);
    if (nb > 1) TSTORE(1, dst[1], dstride[1]);
    if (na > 1) TSTORE(2, dst[2], dstride[2]);
    if (na > 1 && nb > 1) TSTORE(3, dst[3], dstride[3]);
}

/* Destinations of the 2 x 2 C tiles of a block at c: C itself (row stride ldc floats) for a tile
 * that is whole (full0: the first tile row's tiles hold all their configured rows; full1: the
 * second's; at least 16 valid outputs in the tile's columns) when C does not accumulate, else the
 * tile's 16 x 16 buffer in tmp (tmp + 256 * i). */
static ALWAYS_INLINE void AP(tile_dst)(float *c, size_t ldc, int full0, int full1, int nvalid, int accumulate, float *tmp,
                                       int direct[4], float *dst[4], long dstride[4]) {
    for (int i = 0; i < 4; i++) {
        const int full = (i < 2 ? full0 : full1) && nvalid - (i & 1) * 16 >= 16;
        direct[i] = full && !accumulate;
        dst[i] = direct[i] ? c + (size_t)(i >> 1) * 16 * ldc + (i & 1) * 16 : tmp + 256 * i;
        dstride[i] = direct[i] ? (long)(ldc * sizeof(float)) : 64;
    }
}

static void AP(bf16_gemm)(const uint16_t *A, size_t lda, int rows, int Kp, const uint16_t *B, size_t bstride, int ntiles,
                          float *C, size_t ldc, int ncols, int accumulate) {
    if (rows <= 0 || ntiles <= 0) return;
    const int R = rows < 16 ? rows : 16, KB = Kp / 32;
    const size_t tstride = bstride ? bstride : (size_t)KB * 512; /* bf16 elements per column tile */
    float tmp[4][256] __attribute__((aligned(64)));
    AP(configure)(R);
    __asm__ volatile("" ::: "memory"); /* A and B were written by ordinary stores: make them visible */
    for (int t = 0; t < ntiles; t += 2) {
        const int two_c = t + 1 < ntiles;
        const uint16_t *b0 = B + (size_t)t * tstride;
        for (int r = 0; r < rows; r += 32) {
            const int two_r = R == 16 && r + 16 < rows;
            const uint16_t *a0 = A + (size_t)r * lda;
            const int nr0 = rows - r < R ? rows - r : R, nr1 = rows - r - 16 < 16 ? rows - r - 16 : 16;
            float *c = C + (size_t)r * ldc + (size_t)t * 16;
            /* tile i is direct when C does not accumulate and it holds all its configured rows of 16
             * valid outputs */
            int direct[4];
            float *dst[4];
            long dstride[4];
            AP(tile_dst)(c, ldc, nr0 == R, nr1 == 16, ncols - t * 16, accumulate, tmp[0], direct, dst, dstride);
            if (two_r && two_c) AP(bf16_block)(2, 2, a0, lda, KB, b0, tstride, dst, dstride);
            else if (two_r) AP(bf16_block)(2, 1, a0, lda, KB, b0, tstride, dst, dstride);
            else if (two_c) AP(bf16_block)(1, 2, a0, lda, KB, b0, tstride, dst, dstride);
            else AP(bf16_block)(1, 1, a0, lda, KB, b0, tstride, dst, dstride);
            if (!direct[0]) AP(put_f32)(tmp[0], nr0, ncols - t * 16, c, ldc, accumulate);
            if (two_c && !direct[1]) AP(put_f32)(tmp[1], nr0, ncols - t * 16 - 16, c + 16, ldc, accumulate);
            if (two_r && !direct[2]) AP(put_f32)(tmp[2], nr1, ncols - t * 16, c + 16 * ldc, ldc, accumulate);
            if (two_r && two_c && !direct[3])
                AP(put_f32)(tmp[3], nr1, ncols - t * 16 - 16, c + 16 * ldc + 16, ldc, accumulate);
        }
    }
    TRELEASE();
}

static ALWAYS_INLINE void AP(int8_block)(const int na, const int nb, const int8_t *a0, size_t lda, int KB,
                                         const int8_t *b0, size_t tstride, int32_t *const dst[4], const long dstride[4]) {
    const int8_t *a1 = a0 + 16 * lda, *b1 = b0 + tstride;
    const long sa = (long)lda;
    TZERO(0);
    if (nb > 1) TZERO(1);
    if (na > 1) TZERO(2);
    if (na > 1 && nb > 1) TZERO(3);
    for (int kb = 0; kb < KB; kb++) {
        TLOAD(4, a0 + kb * 64, sa);
        if (na > 1) TLOAD(5, a1 + kb * 64, sa);
        TLOAD(6, b0 + (size_t)kb * 1024, 64);
        if (nb > 1) TLOAD(7, b1 + (size_t)kb * 1024, 64);
        TDPBSSD(0, 4, 6);
        if (nb > 1) TDPBSSD(1, 4, 7);
        if (na > 1) TDPBSSD(2, 5, 6);
        if (na > 1 && nb > 1) TDPBSSD(3, 5, 7);
    }
    TSTORE(0, dst[0], dstride[0]);
    if (nb > 1) TSTORE(1, dst[1], dstride[1]);
    if (na > 1) TSTORE(2, dst[2], dstride[2]);
    if (na > 1 && nb > 1) TSTORE(3, dst[3], dstride[3]);
}

static void AP(int8_gemm)(const int8_t *A, size_t lda, int rows, int Kp, const int8_t *B, int ntiles, const float *xs,
                          const float *ws, const int32_t *wcomp, float *C, size_t ldc, int ncols) {
    (void)wcomp; /* tdpbssd multiplies signed by signed: A is q itself */
    if (rows <= 0 || ntiles <= 0) return;
    const int R = rows < 16 ? rows : 16, KB = Kp / 64;
    const size_t tstride = (size_t)KB * 1024; /* bytes per column tile */
    int32_t tmp[4][256] __attribute__((aligned(64)));
    AP(configure)(R);
    __asm__ volatile("" ::: "memory");
    for (int t = 0; t < ntiles; t += 2) {
        const int two_c = t + 1 < ntiles;
        const int8_t *b0 = B + (size_t)t * tstride;
        for (int r = 0; r < rows; r += 32) {
            const int two_r = R == 16 && r + 16 < rows;
            const int8_t *a0 = A + (size_t)r * lda;
            /* int32 sums are scaled on the way out: always through the buffer */
            int32_t *const dst[4] = {tmp[0], tmp[1], tmp[2], tmp[3]};
            const long dstride[4] = {64, 64, 64, 64};
            if (two_r && two_c) AP(int8_block)(2, 2, a0, lda, KB, b0, tstride, dst, dstride);
            else if (two_r) AP(int8_block)(2, 1, a0, lda, KB, b0, tstride, dst, dstride);
            else if (two_c) AP(int8_block)(1, 2, a0, lda, KB, b0, tstride, dst, dstride);
            else AP(int8_block)(1, 1, a0, lda, KB, b0, tstride, dst, dstride);
            const int nr0 = rows - r < R ? rows - r : R, nr1 = rows - r - 16 < 16 ? rows - r - 16 : 16;
            float *c = C + (size_t)r * ldc + (size_t)t * 16;
            const float *w = ws + (size_t)t * 16;
            AP(put_i32)(tmp[0], nr0, ncols - t * 16, xs + r, w, c, ldc);
            if (two_c) AP(put_i32)(tmp[1], nr0, ncols - t * 16 - 16, xs + r, w + 16, c + 16, ldc);
            if (two_r) AP(put_i32)(tmp[2], nr1, ncols - t * 16, xs + r + 16, w, c + 16 * ldc, ldc);
            if (two_r && two_c) AP(put_i32)(tmp[3], nr1, ncols - t * 16 - 16, xs + r + 16, w + 16, c + 16 * ldc + 16, ldc);
        }
    }
    TRELEASE();
}

#undef ALWAYS_INLINE
