/* The vector dot-product engines' product, written once (see kern.h for the operand layouts):
 * the AMX engines' VNNI tiles read by vector instructions instead of the tile unit. A tile row
 * (64 bytes) holds, for 16 outputs, one group of consecutive depths (a pair of bf16, or four int8):
 * exactly the B operand of VDPBF16PS and VPDPBUSD, which multiply 16 groups by a broadcast group of
 * A and add the products into 16 32-bit lanes. So the AMX engines' packing, refresh, transposed
 * tiles for dx and dW, and threading serve the vector engines unchanged; only this loop differs.
 *
 * The including file defines, then includes this file:
 *   VB(name)            function-name prefix
 *   VB_ELEM             an A and B element (uint16_t: bf16; uint8_t: int8)
 *   VB_GROUP            elements per 32-bit group (2 or 4); a tile row is 16 groups, a tile 16 rows
 *   VACC                16 32-bit accumulator lanes      VBT   a B operand: one tile row
 *   vloadb(p)           the tile row at p (64 bytes)
 *   vdp(acc, group, b)  acc + per lane the products of the broadcast 32-bit group of A and lane's
 *                       group of b (VDPBF16PS: a1*b[2i+1] + a0*b[2i]; VPDPBUSD: four u8 x s8)
 *   vinit(o, t)         the accumulators' start for column tile t of the block
 *   vout(o, c, r, t, acc, n)  writes row r's column tile t (the n <= 16 valid lanes) at c
 * with o a const VB(out) * carrying what vinit and vout read (the block's own pieces of them), and
 * optionally VB_MR (rows per micro-kernel, at most 8), VB_NT (column tiles per micro-kernel above two
 * rows, 1 or 2) and VB_NT_FEW (at one or two rows, 1-4): zmm has 32 registers, a pair of ymm for 16
 * lanes leaves the AVX2 instances 16, so they take fewer rows and tiles per block.
 * Micro-kernel: up to MR rows x NT column tiles, one 32-bit chain per output over the depth groups
 * in order, whatever the blocking, so results depend neither on m nor on the thread split. Few rows
 * (decode) take four tiles at a time for more independent chains. */

#define ALWAYS_INLINE inline __attribute__((always_inline))
#ifndef VB_MR
#define VB_MR 8
#endif
#ifndef VB_NT
#define VB_NT 2
#endif
#ifndef VB_NT_FEW
#define VB_NT_FEW 4
#endif
_Static_assert(VB_MR >= 1 && VB_MR <= 8 && VB_NT >= 1 && VB_NT <= 2 && VB_NT_FEW >= 1 && VB_NT_FEW <= 4,
               "the micro-kernel cases below cover 8 rows x 2 tiles, or 2 rows x 4");
#define VB_TILE (256 * VB_GROUP)  /* elements of a 1 KiB tile */
#define VB_DEPTH (16 * VB_GROUP)  /* depths of a tile */

/* The output side: bf16 sums go to C (added to it when accumulate); int8 sums start at the weights'
 * offset correction wc and leave scaled by xs[row] * ws[column]. Pointers are the block's own. */
typedef struct {
    int accumulate;
    const float *xs, *ws;
    const int32_t *wc;
} VB(out);

/* A is rows (lda elements apart) or, with at, VNNI tiles as B's (at A: the block's first row, at most
 * 16 - its row within the tile rows on; the next depth tile VB_TILE on): bf16 only (dW's dy). */
static ALWAYS_INLINE void VB(ukern)(const int mr, const int nt, const int at, int KB, const VB_ELEM *A, size_t lda,
                                    const VB_ELEM *B, size_t tstride, float *C, size_t ldc, int nc, const VB(out) *o) {
    VACC acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[r][t] = vinit(o, t);
    for (int kb = 0; kb < KB; kb++) {
        const VB_ELEM *b = B + (size_t)kb * VB_TILE;
        const VB_ELEM *a = A + (size_t)kb * (at ? VB_TILE : VB_DEPTH);
        const size_t ars = at ? VB_GROUP : lda, ags = at ? 16 * VB_GROUP : VB_GROUP; /* a row's, a depth group's step */
        /* unrolled whole: GCC otherwise copies every accumulator at the loop's back edge (the
           instructions overwrite their accumulator), a third of VPDPBUSD's loop */
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++, b += 16 * VB_GROUP, a += ags) {
            VBT bt[4];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) bt[t] = vloadb(b + (size_t)t * tstride);
#pragma GCC unroll 8
            for (int r = 0; r < mr; r++) {
                uint32_t group;
                memcpy(&group, a + (size_t)r * ars, sizeof group);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) acc[r][t] = vdp(acc[r][t], group, bt[t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) vout(o, C + (size_t)r * ldc + (size_t)t * 16, r, t, acc[r][t], nc - t * 16);
}

/* The block's own piece of o: rows from r, column tiles from t. */
static inline VB(out) VB(out_at)(const VB(out) *o, int r, int t) {
    return (VB(out)){o->accumulate, o->xs ? o->xs + r : NULL, o->ws ? o->ws + (size_t)t * 16 : NULL,
                     o->wc ? o->wc + (size_t)t * 16 : NULL};
}

/* One micro-kernel of mr rows x nt column tiles, a shape VB(gemm) makes: only those are compiled
 * (the other cases' branches are constant-false and dropped before inlining). */
#define VB_NT_OF(R) ((R) <= 2 ? VB_NT_FEW : VB_NT)
#define VB_MADE(R, T) (NV_KERN_PIECE_MADE(R, VB_MR) && NV_KERN_PIECE_MADE(T, VB_NT_OF(R)))
static void VB(block)(int mr, int nt, int at, int KB, const VB_ELEM *A, size_t lda, const VB_ELEM *B, size_t tstride,
                      float *C, size_t ldc, int nc, const VB(out) *o) {
#define VB_CASE(R, T)                                                                                                  \
    case R * 8 + T:                                                                                                    \
        if (VB_MADE(R, T) && VB_GROUP == 2 && at) VB(ukern)(R, T, 1, KB, A, lda, B, tstride, C, ldc, nc, o);           \
        else if (VB_MADE(R, T)) VB(ukern)(R, T, 0, KB, A, lda, B, tstride, C, ldc, nc, o);                             \
        return;
    switch (mr * 8 + nt) {
        VB_CASE(1, 1) VB_CASE(1, 2) VB_CASE(1, 3) VB_CASE(1, 4)
        VB_CASE(2, 1) VB_CASE(2, 2) VB_CASE(2, 3) VB_CASE(2, 4)
        VB_CASE(3, 1) VB_CASE(3, 2)
        VB_CASE(4, 1) VB_CASE(4, 2)
        VB_CASE(5, 1) VB_CASE(5, 2)
        VB_CASE(6, 1) VB_CASE(6, 2)
        VB_CASE(7, 1) VB_CASE(7, 2)
        VB_CASE(8, 1) VB_CASE(8, 2)
    default:
        break;
    }
#undef VB_CASE
}

/* C[rows x ncols] over ntiles column tiles of 16, Kp a multiple of the tile depth; column tile t at
 * B + t * bstride (0: tiles packed at depth Kp); A rows lda apart, or (lda 0) VNNI tiles as B's
 * packed at depth Kp, row tile u at A + u * Kp / VB_DEPTH * VB_TILE, a micro-kernel's rows then
 * within one of them. A group of column tiles is swept by every row block while it is in cache;
 * blocks and groups go in the pieces nv_kern_piece gives. */
static void VB(gemm)(const VB_ELEM *A, size_t lda, int rows, int Kp, const VB_ELEM *B, size_t bstride, int ntiles,
                     float *C, size_t ldc, int ncols, const VB(out) *o) {
    if (rows <= 0 || ntiles <= 0) return;
    const int KB = Kp / VB_DEPTH, NT = rows <= 2 ? VB_NT_FEW : VB_NT, at = lda == 0;
    const size_t tstride = bstride ? bstride : (size_t)KB * VB_TILE; /* elements per column tile */
    for (int t0 = 0; t0 < ntiles; t0 += NT) {
        const int nt = ntiles - t0 < NT ? ntiles - t0 : NT;
        for (int r = 0, mr; r < rows; r += mr) {
            mr = nv_kern_piece(at && rows - r > 16 - r % 16 ? 16 - r % 16 : rows - r, VB_MR);
            const VB_ELEM *a = at ? A + (size_t)(r / 16) * KB * VB_TILE + (size_t)(r % 16) * VB_GROUP : A + (size_t)r * lda;
            for (int t = t0, n; t < t0 + nt; t += n) {
                n = nv_kern_piece(t0 + nt - t, VB_NT_OF(mr));
                const VB(out) sub = VB(out_at)(o, r, t);
                VB(block)(mr, n, at, KB, a, lda, B + (size_t)t * tstride, tstride, C + (size_t)r * ldc + (size_t)t * 16, ldc,
                          ncols - t * 16, &sub);
            }
        }
    }
}

/* kern.h's entry points */
#if VB_GROUP == 4
static void VB(int8_gemm)(const int8_t *A, size_t lda, int rows, int Kp, const int8_t *B, int ntiles, const float *xs,
                          const float *ws, const int32_t *wc, float *C, size_t ldc, int ncols) {
    const VB(out) o = {0, xs, ws, wc};
    VB(gemm)((const VB_ELEM *)A, lda, rows, Kp, (const VB_ELEM *)B, 0, ntiles, C, ldc, ncols, &o);
}
#else
static void VB(bf16_gemm)(const uint16_t *A, size_t lda, int rows, int Kp, const uint16_t *B, size_t bstride, int ntiles,
                          float *C, size_t ldc, int ncols, int accumulate) {
    const VB(out) o = {accumulate, NULL, NULL, NULL};
    VB(gemm)(A, lda, rows, Kp, B, bstride, ntiles, C, ldc, ncols, &o);
}
#endif

#undef VB_MADE
#undef VB_NT_OF
#undef VB_MR
#undef VB_NT
#undef VB_NT_FEW
#undef VB_TILE
#undef VB_DEPTH
#undef ALWAYS_INLINE
