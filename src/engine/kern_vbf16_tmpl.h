/* The avx512-bf16 engine's product, written once (see kern.h for the operand layouts): the bf16
 * VNNI tiles of the AMX engine, read by vector instructions instead of the tile unit. A tile row
 * (64 bytes) holds, for 16 outputs, one pair of consecutive depths: exactly the B operand of
 * VDPBF16PS, which multiplies 16 pairs by a broadcast pair of A and adds both products into 16
 * fp32 lanes. So the AMX engine's packing, refresh, transposed tiles for dx and dW, and threading
 * serve this engine unchanged; only this loop differs.
 *
 * The including file defines, then includes this file:
 *   VB(name)            function-name prefix
 *   VF                  16 fp32 lanes          VBT   a B operand: 32 bf16 (one tile row)
 *   vloadb(p)           the 32 bf16 at p (64 bytes)
 *   vzero()  vadd(a,b)  vload_n(p,n) (lanes >= n read as 0, nothing past p+n touched)
 *   vstore_n(p,v,n)     (lanes < n only)
 *   vdp(acc, pair, b)   acc + the pairwise products of the broadcast 32-bit pair (two bf16) and the
 *                       32 bf16 at b, per lane: acc + a1*b[2i+1] + a0*b[2i] (VDPBF16PS)
 * Micro-kernel: up to MR rows x NT column tiles, one fp32 chain per output over the depth pairs in
 * order, whatever the blocking, so results depend neither on m nor on the thread split. Few rows
 * (decode) take four tiles at a time for more independent chains. */

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define VB_MR 8

static ALWAYS_INLINE void VB(ukern)(const int mr, const int nt, int KB, const uint16_t *A, size_t lda, const uint16_t *B,
                                    size_t tstride, float *C, size_t ldc, int nc, int accumulate) {
    VF acc[VB_MR][4];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[r][t] = vzero();
    for (int kb = 0; kb < KB; kb++) {
        const uint16_t *b = B + (size_t)kb * 512;
        const uint16_t *a = A + (size_t)kb * 32;
        for (int i = 0; i < 16; i++, b += 32, a += 2) {
            VBT bt[4];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) bt[t] = vloadb(b + (size_t)t * tstride);
#pragma GCC unroll 8
            for (int r = 0; r < mr; r++) {
                uint32_t pair;
                memcpy(&pair, a + (size_t)r * lda, sizeof pair);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) acc[r][t] = vdp(acc[r][t], pair, bt[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            float *c = C + (size_t)r * ldc + (size_t)t * 16;
            const int n = nc - t * 16;
            vstore_n(c, accumulate ? vadd(vload_n(c, n), acc[r][t]) : acc[r][t], n);
        }
}

static void VB(block)(int mr, int nt, int KB, const uint16_t *A, size_t lda, const uint16_t *B, size_t tstride, float *C,
                      size_t ldc, int nc, int accumulate) {
#define VB_CASE(R, T)                                                                                                  \
    case R * 8 + T: VB(ukern)(R, T, KB, A, lda, B, tstride, C, ldc, nc, accumulate); return;
    switch (mr * 8 + nt) {
        VB_CASE(1, 1) VB_CASE(1, 2) VB_CASE(1, 3) VB_CASE(1, 4)
        VB_CASE(2, 1) VB_CASE(2, 2) VB_CASE(2, 3) VB_CASE(2, 4)
        VB_CASE(3, 1) VB_CASE(3, 2)
        VB_CASE(4, 1) VB_CASE(4, 2)
        VB_CASE(5, 1) VB_CASE(5, 2)
        VB_CASE(6, 1) VB_CASE(6, 2)
        VB_CASE(7, 1) VB_CASE(7, 2)
        VB_CASE(8, 1) VB_CASE(8, 2)
    default: /* a shape bf16_gemm's blocking does not make: pieces that are cases above */
        for (int t = 0; t < nt; t += 2)
            for (int r = 0; r < mr; r += VB_MR)
                VB(block)(mr - r < VB_MR ? mr - r : VB_MR, nt - t < 2 ? nt - t : 2, KB, A + (size_t)r * lda, lda,
                          B + (size_t)t * tstride, tstride, C + (size_t)r * ldc + (size_t)t * 16, ldc, nc - t * 16, accumulate);
    }
#undef VB_CASE
}

/* C[rows x ncols] (+)= A . B over ntiles column tiles of 16 (kern.h's bf16_gemm contract). */
static void VB(bf16_gemm)(const uint16_t *A, size_t lda, int rows, int Kp, const uint16_t *B, int ntiles, float *C,
                          size_t ldc, int ncols, int accumulate) {
    if (rows <= 0 || ntiles <= 0) return;
    const int KB = Kp / 32, NT = rows <= 2 ? 4 : 2;
    const size_t tstride = (size_t)KB * 512; /* bf16 elements per column tile */
    for (int t = 0; t < ntiles; t += NT) {
        const int nt = ntiles - t < NT ? ntiles - t : NT;
        for (int r = 0; r < rows; r += VB_MR) {
            const int mr = rows - r < VB_MR ? rows - r : VB_MR;
            VB(block)(mr, nt, KB, A + (size_t)r * lda, lda, B + (size_t)t * tstride, tstride, C + (size_t)r * ldc + (size_t)t * 16,
                      ldc, ncols - t * 16, accumulate);
        }
    }
}

#undef VB_MR
#undef ALWAYS_INLINE
