/* The int8 engines' product over block-quantized weights (a GGUF file's Q8_0, Q4_0, Q4_K, Q6_K ...
 * matrices), written once for every vector instance: integer dot products of the weights' own
 * values with the activations quantized per block of the same depths, as llama.cpp multiplies its
 * quantized types by Q8 activations. Layout (kern.h, nv_qdot_a / nv_qdot_b): the weights are
 * VPDPBUSD's unsigned operand (4-bit values as they are, 8-bit ones as q + 128, or 4-bit indices
 * into a table of 16 such bytes: IQ4_NL's and IQ4_XS's uneven levels), the activations
 * its signed one, broadcast four depths at a time. A block's int32 sums start at bias times the
 * activations' sum over the block (-128 for 8-bit values: what the + 128 added; plus c for offsets
 * c times the scale, folded), and the output is,
 * block by block in order, one fp32 chain
 *     y = fma((float)isum, s * xs, y), then y = fma(o, xsum, y) with offsets,
 * s and o the weights' block scale and offset, xs the activations' block scale and xsum their exact
 * fp32 sum over the block: every instance gives the same bits, and a row's result depends neither on
 * the rows beside it nor on the thread split.
 *
 * The including file defines, then includes this file:
 *   QD(name)            function-name prefix
 *   VACC, VF            16 int32 lanes, 16 fp32 lanes        VBT  a B operand: one 64-byte row
 *   vqload(p)           the 8-bit row at p
 *   vqload4(p, tab, lo, hi)  the 4-bit row at p: its low nibbles' row into *lo, its high nibbles'
 *                       into *hi; with tab (16 bytes, else NULL), each nibble an index into tab
 *   vdq(acc, group, b)  acc + per lane the four products of b's lane (unsigned bytes) and the
 *                       broadcast group (signed bytes)
 *   vset(v)             16 int32 lanes of v                  vzero()  16 zero floats
 *   vblock(y, acc, s, xs)  fma((float)acc, load(s) * xs, y)  voff(y, o, xsum)  fma(load(o), xsum, y)
 *   vqout(c, y, n)      lanes 0..n-1 of y stored at c
 *   vsc(p)              16 int32 lanes of the 16 signed bytes at p      vmla(acc, u, v)  acc + u * v (int32 lanes)
 *   vfload(p), vfstore(p, y)  16 floats at p (64-byte aligned)
 * (names of their own, so that a file instantiating kern_vdot_tmpl.h too keeps its macros)
 * and optionally QD_MR (rows per micro-kernel, at most 6), QD_NT (column tiles above two rows, 1 or
 * 2) and QD_NT_FEW (at one or two rows, 1-4). */

#define ALWAYS_INLINE inline __attribute__((always_inline))
#ifndef QD_MR
#define QD_MR 6
#endif
#ifndef QD_NT
#define QD_NT 2
#endif
#ifndef QD_NT_FEW
#define QD_NT_FEW 4
#endif
_Static_assert(QD_MR >= 1 && QD_MR <= 6 && QD_NT >= 1 && QD_NT <= 2 && QD_NT_FEW >= 1 && QD_NT_FEW <= 4,
               "the micro-kernel cases below cover 6 rows x 2 tiles, or 2 rows x 4");

/* acc[r][t] = bias times row r's block sum (qsum[r * qstride]), plus the products of one block's
 * values (tile t's at bq + t * tstride) and the rows' activations (row r's at aq + r * lda); kq and
 * four (0: 8-bit values, 1: 4-bit ones, 2: 4-bit indices into lut) compile-time in each case below,
 * so the group loop unrolls whole (GCC otherwise copies the accumulators at its back edge). */
static ALWAYS_INLINE void QD(dot)(const int mr, const int nt, const int kq, const int four, VACC acc[6][4], int bias,
                                  const int32_t *qsum, size_t qstride, const uint8_t *bq, size_t tstride, const int8_t *aq,
                                  size_t lda, const uint8_t *lut) {
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
        const VACC start = vset(bias * qsum[(size_t)r * qstride]);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[r][t] = start;
    }
    if (four) {
#pragma GCC unroll 4
        for (int h = 0; h < kq / 8; h++) {
            VBT lo[4], hi[4];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) vqload4(bq + (size_t)t * tstride + (size_t)h * 64, four == 2 ? lut : NULL, &lo[t], &hi[t]);
#pragma GCC unroll 6
            for (int r = 0; r < mr; r++) {
                uint32_t g0, g1;
                memcpy(&g0, aq + (size_t)r * lda + 8 * h, 4);
                memcpy(&g1, aq + (size_t)r * lda + 8 * h + 4, 4);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) acc[r][t] = vdq(vdq(acc[r][t], g0, lo[t]), g1, hi[t]);
            }
        }
    } else {
#pragma GCC unroll 8
        for (int g = 0; g < kq / 4; g++) {
            VBT bt[4];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) bt[t] = vqload(bq + (size_t)t * tstride + (size_t)g * 64);
#pragma GCC unroll 6
            for (int r = 0; r < mr; r++) {
                uint32_t g0;
                memcpy(&g0, aq + (size_t)r * lda + 4 * g, 4);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) acc[r][t] = vdq(acc[r][t], g0, bt[t]);
            }
        }
    }
}

/* mr rows x nt column tiles over every block, a float scale (and offset) per block. */
static ALWAYS_INLINE void QD(ukern)(const int mr, const int nt, const int kq, const int four, const nv_qdot_a *a,
                                    const nv_qdot_b *b, float *C, size_t ldc, int nc) {
    const int nb = b->nb;
    const size_t qbytes = (size_t)kq * (four ? 8 : 16), bs = nv_qdot_block_bytes(kq, four, b->offsets),
                 tstride = (size_t)nb * bs;
    VF y[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) y[r][t] = vzero();
    for (int kb = 0; kb < nb; kb++) {
        const uint8_t *bq = b->q + (size_t)kb * bs;
        VACC acc[6][4];
        QD(dot)(mr, nt, kq, four, acc, b->bias, a->qsum + kb, (size_t)nb, bq, tstride, a->q + (size_t)kb * kq, a->lda, b->lut);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            const float xs = a->xs[(size_t)r * nb + kb];
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const float *sc = (const float *)(const void *)(bq + (size_t)t * tstride + qbytes);
                y[r][t] = vblock(y[r][t], acc[r][t], sc, xs);
                if (b->offsets) y[r][t] = voff(y[r][t], sc + 16, a->xsum[(size_t)r * nb + kb]);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) vqout(C + (size_t)r * ldc + (size_t)t * 16, y[r][t], nc - t * 16);
}

/* The same over super-blocks of b->sub blocks (kern.h's nv_qdot_b.sub): each block's int32 sums
 * times its integer scale into one int32 sum per super-block, which alone meets floats. The outputs
 * wait in memory (ys), touched once a super-block, leaving the registers to the two sets of sums. */
static ALWAYS_INLINE void QD(ukern_super)(const int mr, const int nt, const int kq, const int four, const nv_qdot_a *a,
                                          const nv_qdot_b *b, float *C, size_t ldc, int nc) {
    const int nb = b->nb, sub = b->sub, nsb = nb / sub;
    const size_t qbytes = (size_t)kq * (four ? 8 : 16), sbs = nv_qdot_super_bytes(kq, four, b->offsets, sub),
                 tstride = (size_t)nsb * sbs, ints = (size_t)sub * qbytes, floats = nv_qdot_super_floats(kq, four, b->offsets, sub);
    float ys[6][4][16] __attribute__((aligned(64)));
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) vfstore(ys[r][t], vzero());
    for (int sb = 0; sb < nsb; sb++) {
        const uint8_t *base = b->q + (size_t)sb * sbs;
        VACC isum[6][4];
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) isum[r][t] = vset(0);
        for (int j = 0; j < sub; j++) {
            const int kb = sb * sub + j;
            VACC acc[6][4];
            QD(dot)(mr, nt, kq, four, acc, b->bias, a->qsum + kb, (size_t)nb, base + (size_t)j * qbytes, tstride,
                    a->q + (size_t)kb * kq, a->lda, b->lut);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const VACC scale = vsc(base + (size_t)t * tstride + ints + (size_t)j * 16);
#pragma GCC unroll 6
                for (int r = 0; r < mr; r++) isum[r][t] = vmla(isum[r][t], acc[r][t], scale);
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const uint8_t *tb = base + (size_t)t * tstride;
            const float *d = (const float *)(const void *)(tb + floats);
            VACC imin[6];
#pragma GCC unroll 6
            for (int r = 0; r < mr; r++) imin[r] = vset(0);
            if (b->offsets) {
                for (int j = 0; j < sub; j++) {
                    const VACC mins = vsc(tb + ints + (size_t)(sub + j) * 16);
#pragma GCC unroll 6
                    for (int r = 0; r < mr; r++) imin[r] = vmla(imin[r], vset(a->qsum[(size_t)r * nb + sb * sub + j]), mins);
                }
            }
#pragma GCC unroll 6
            for (int r = 0; r < mr; r++) {
                const float xs = a->xs[(size_t)r * nsb + sb];
                VF y = vblock(vfload(ys[r][t]), isum[r][t], d, xs);
                if (b->offsets) y = vblock(y, imin[r], d + 16, xs);
                vfstore(ys[r][t], y);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) vqout(C + (size_t)r * ldc + (size_t)t * 16, vfload(ys[r][t]), nc - t * 16);
}

/* One micro-kernel of mr rows x nt column tiles, a shape QD(qdot_gemm) makes: only those are
 * compiled (the other cases' branches are constant-false and dropped before inlining), each in ten
 * forms (super-blocks or not, five kinds of values). */
#define QD_NT_OF(R) ((R) <= 2 ? QD_NT_FEW : QD_NT)
#define QD_MADE(R, T) (NV_KERN_PIECE_MADE(R, QD_MR) && NV_KERN_PIECE_MADE(T, QD_NT_OF(R)))
static void QD(block)(int mr, int nt, const nv_qdot_a *a, const nv_qdot_b *b, float *C, size_t ldc, int nc) {
#define QD_FORMS(K, R, T)                                                                                              \
    if (b->kq == 32 && b->lut)                                                                                         \
        K(R, T, 32, 2, a, b, C, ldc, nc);                                                                              \
    else if (b->kq == 32)                                                                                              \
        b->four ? K(R, T, 32, 1, a, b, C, ldc, nc) : K(R, T, 32, 0, a, b, C, ldc, nc);                                 \
    else                                                                                                               \
        b->four ? K(R, T, 16, 1, a, b, C, ldc, nc) : K(R, T, 16, 0, a, b, C, ldc, nc);
#define QD_CASE(R, T)                                                                                                  \
    case R * 8 + T:                                                                                                    \
        if (!QD_MADE(R, T)) return;                                                                                    \
        if (b->sub) {                                                                                                  \
            QD_FORMS(QD(ukern_super), R, T)                                                                            \
        } else {                                                                                                       \
            QD_FORMS(QD(ukern), R, T)                                                                                  \
        }                                                                                                              \
        return;
    switch (mr * 8 + nt) {
        QD_CASE(1, 1) QD_CASE(1, 2) QD_CASE(1, 3) QD_CASE(1, 4)
        QD_CASE(2, 1) QD_CASE(2, 2) QD_CASE(2, 3) QD_CASE(2, 4)
        QD_CASE(3, 1) QD_CASE(3, 2)
        QD_CASE(4, 1) QD_CASE(4, 2)
        QD_CASE(5, 1) QD_CASE(5, 2)
        QD_CASE(6, 1) QD_CASE(6, 2)
    default:
        break;
    }
#undef QD_CASE
#undef QD_FORMS
}

/* C[rows x ncols] over ntiles column tiles of 16 (kern.h's qdot_gemm), in the pieces nv_kern_piece
 * gives (as kern_vdot_tmpl.h's gemm). */
static void QD(qdot_gemm)(const nv_qdot_a *a, int rows, const nv_qdot_b *b, int ntiles, float *C, size_t ldc, int ncols) {
    if (rows <= 0 || ntiles <= 0) return;
    const int NT = rows <= 2 ? QD_NT_FEW : QD_NT;
    const size_t tstride = nv_qdot_tile_bytes(b);
    const int nxs = nv_qdot_row_scales(b->nb, b->sub);
    for (int t0 = 0; t0 < ntiles; t0 += NT) {
        const int nt = ntiles - t0 < NT ? ntiles - t0 : NT;
        for (int r = 0, mr; r < rows; r += mr) {
            mr = nv_kern_piece(rows - r, QD_MR);
            const size_t at = (size_t)r * b->nb;
            const nv_qdot_a ar = {a->q + (size_t)r * a->lda, a->lda, a->xs + (size_t)r * nxs, b->sub ? NULL : a->xsum + at,
                                  a->qsum + at};
            for (int t = t0, n; t < t0 + nt; t += n) {
                n = nv_kern_piece(t0 + nt - t, QD_NT_OF(mr));
                nv_qdot_b bt = *b;
                bt.q = b->q + (size_t)t * tstride;
                QD(block)(mr, n, &ar, &bt, C + (size_t)r * ldc + (size_t)t * 16, ldc, ncols - t * 16);
            }
        }
    }
}

#undef QD_MADE
#undef QD_NT_OF
#undef QD_MR
#undef QD_NT
#undef QD_NT_FEW
#undef ALWAYS_INLINE
