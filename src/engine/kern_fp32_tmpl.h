/* fp32 panel GEMM, written once for any vector width (see kern.h for the contract).
 * The including file defines, then includes this file:
 *   KP(name)   function-name prefix      VF   vector type       VW   lanes (8 or 16)
 *   MR         rows per micro-kernel (2..12)
 *   vzero() vloadu(p) vbcast(f) vfma(a,b,c)=a*b+c vstoreu(p,v)
 *   vload_n(p,n)     lanes >= n read as 0, nothing past p+n is touched (n may be <= 0 or >= VW)
 *   vstore_n(p,v,n)  stores lanes < n only
 *   vmul(a,b) vadd(a,b)   lane-wise, not fused
 *   vload_q8(p)      VW int8 values at p (exactly VW bytes read) as floats
 *   vload_q4(p, lo, hi)  the low and the high nibbles of the VW bytes at p (exactly VW bytes read)
 *                    as floats 0..15, into the vectors lo and hi
 *   vload_q4t(p, t, lo, hi)  optional: the same nibbles as indices into the 16 floats at t, looked
 *                    up (without it, gemm_q8 ignores lut)
 *   vload_h(p)       VW fp16 values at byte address p as floats (exact)
 *   vload_bf(p)      VW bf16 values at byte address p as floats (exact)
 * Micro-kernel: MR rows x 2 vectors (NR = 2*VW outputs), B streamed from the panel, A broadcast. */

#define NR (2 * VW)
#define KC NV_KERN_FP32_KC /* depth block: a panel slice of KC*NR floats stays in L1 while rows stream by */
#define MC (24 * MR) /* row block: an A block of MC*KC floats stays in L2 while all panels stream by */
#define KS 64        /* depth slice of the few-rows order (gemm_few): a slice of KS*NR floats stays in L1 */
#define LINE_FLOATS 16 /* floats per 64-byte cache line */

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* pf/npf: while it runs, the kernel asks for the panel rows pf[0..npf) (NR floats each) ahead of
 * their use (npf = 0: none). */
static ALWAYS_INLINE void KP(ukern)(const int mr, int K, const float *A, size_t lda, const float *B, float *C, size_t ldc,
                                    int nc, int load_c, const float *pf, int npf) {
    VF c0[MR], c1[MR];
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) {
        if (load_c) {
            if (nc >= NR) {
                c0[r] = vloadu(C + r * ldc);
                c1[r] = vloadu(C + r * ldc + VW);
            } else {
                c0[r] = vload_n(C + r * ldc, nc);
                c1[r] = vload_n(C + r * ldc + VW, nc - VW);
            }
        } else {
            c0[r] = vzero();
            c1[r] = vzero();
        }
    }
    const float *a[MR];
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) a[r] = A + r * lda;
#define KP_STEP(kk)                                                                                                    \
    do {                                                                                                               \
        VF b0 = vloadu(B), b1 = vloadu(B + VW);                                                                        \
        B += NR;                                                                                                       \
        _Pragma("GCC unroll 12") for (int r = 0; r < mr; r++) {                                                        \
            VF x = vbcast(a[r][kk]);                                                                                   \
            c0[r] = vfma(x, b0, c0[r]);                                                                                \
            c1[r] = vfma(x, b1, c1[r]);                                                                                \
        }                                                                                                              \
    } while (0)
    /* Two loops, so that the steps that ask for nothing carry no test for it. */
    int kk = 0;
    for (; kk < npf && kk < K; kk++) {
        for (int q = 0; q < NR; q += LINE_FLOATS) __builtin_prefetch(pf + (size_t)kk * NR + q, 0, 0);
        KP_STEP(kk);
    }
    for (; kk < K; kk++) KP_STEP(kk);
#undef KP_STEP
#pragma GCC unroll 12
    for (int r = 0; r < mr; r++) {
        if (nc >= NR) {
            vstoreu(C + r * ldc, c0[r]);
            vstoreu(C + r * ldc + VW, c1[r]);
        } else {
            vstore_n(C + r * ldc, c0[r], nc);
            vstore_n(C + r * ldc + VW, c1[r], nc - VW);
        }
    }
}

/* One row against two panels (decode): four independent chains, the same arithmetic per element. */
static ALWAYS_INLINE void KP(ukern_row2)(int K, const float *a, const float *B0, const float *B1, float *C, int nc,
                                         int load_c) {
    VF c0, c1, c2, c3;
    if (load_c) {
        c0 = vload_n(C, nc);
        c1 = vload_n(C + VW, nc - VW);
        c2 = vload_n(C + NR, nc - NR);
        c3 = vload_n(C + NR + VW, nc - NR - VW);
    } else {
        c0 = c1 = c2 = c3 = vzero();
    }
    for (int kk = 0; kk < K; kk++) {
        VF x = vbcast(a[kk]);
        c0 = vfma(x, vloadu(B0), c0);
        c1 = vfma(x, vloadu(B0 + VW), c1);
        c2 = vfma(x, vloadu(B1), c2);
        c3 = vfma(x, vloadu(B1 + VW), c3);
        B0 += NR;
        B1 += NR;
    }
    vstore_n(C, c0, nc);
    vstore_n(C + VW, c1, nc - VW);
    vstore_n(C + NR, c2, nc - NR);
    vstore_n(C + NR + VW, c3, nc - NR - VW);
}

static void KP(block)(int mr, int K, const float *A, size_t lda, const float *B, float *C, size_t ldc, int nc, int load_c,
                     const float *pf, int npf) {
    switch (mr) {
#define KP_CASE(R) \
    case R: KP(ukern)(R, K, A, lda, B, C, ldc, nc, load_c, pf, npf); break;
        KP_CASE(1)
        KP_CASE(2)
#if MR >= 3
        KP_CASE(3)
#endif
#if MR >= 4
        KP_CASE(4)
#endif
#if MR >= 5
        KP_CASE(5)
#endif
#if MR >= 6
        KP_CASE(6)
#endif
#if MR >= 7
        KP_CASE(7)
#endif
#if MR >= 8
        KP_CASE(8)
#endif
#if MR >= 9
        KP_CASE(9)
#endif
#if MR >= 10
        KP_CASE(10)
#endif
#if MR >= 11
        KP_CASE(11)
#endif
#if MR >= 12
        KP_CASE(12)
#endif
#undef KP_CASE
    default: break;
    }
}

/* A few rows (decode steps): every weight is used by only these rows, so the product streams the
 * panels from memory once and the time goes to hiding that stream. Panels outermost, then depth
 * slices of KS in memory order: each slice stays in L1 for all row passes, and the next slice in
 * memory is the next one used, so each pass asks for its share of it ahead of time. */
static void KP(gemm_few)(const float *A, size_t lda, int rows, int K, const float *P, int np, float *C, size_t ldc,
                         int ncols, int accumulate) {
    const size_t pstride = (size_t)K * NR;
    const int npass = (rows + MR - 1) / MR;
    for (int p = 0; p < np; p++) {
        const int nc = ncols - p * NR;
        for (int k0 = 0; k0 < K; k0 += KS) {
            const int kc = K - k0 < KS ? K - k0 : KS, load_c = accumulate || k0 > 0;
            const float *B = P + p * pstride + (size_t)k0 * NR; /* the next slice starts at B + kc*NR */
            int next = k0 + kc < K ? (K - k0 - kc < KS ? K - k0 - kc : KS) : (p + 1 < np ? (K < KS ? K : KS) : 0);
            const int share = (next + npass - 1) / npass;
            for (int r = 0, j = 0; r < rows; r += MR, j++) {
                const int mr = rows - r < MR ? rows - r : MR, lo = j * share;
                const int npf = next - lo < share ? (next - lo > 0 ? next - lo : 0) : share;
                KP(block)(mr, kc, A + (size_t)r * lda + k0, lda, B, C + (size_t)r * ldc + (size_t)p * NR, ldc, nc, load_c,
                          B + (size_t)(kc + lo) * NR, npf);
            }
        }
    }
}

static void KP(gemm)(const float *A, size_t lda, int rows, int K, const float *P, int np, float *C, size_t ldc, int ncols,
                     int accumulate) {
    const size_t pstride = (size_t)K * NR;
    if (rows == 1) {
        int p = 0;
        for (; p + 1 < np; p += 2)
            KP(ukern_row2)(K, A, P + p * pstride, P + (p + 1) * pstride, C + (size_t)p * NR, ncols - p * NR, accumulate);
        if (p < np) KP(ukern)(1, K, A, lda, P + p * pstride, C + (size_t)p * NR, ldc, ncols - p * NR, accumulate, NULL, 0);
        return;
    }
    if (rows <= 4 * MR) {
        KP(gemm_few)(A, lda, rows, K, P, np, C, ldc, ncols, accumulate);
        return;
    }
    /* Depth blocks outermost, then row blocks: the A block (MC x KC) stays in L2 while every panel
     * slice (KC x NR, in L1 across the row block) streams by. Partial sums go through C (exact). */
    for (int k0 = 0, kc; k0 < K; k0 += kc) {
        /* a short last block would cost a pass over C for a few depths: the last block takes up
         * to KC/4 more (the sums are one chain per element, so any split gives the same bits) */
        kc = K - k0 <= KC + KC / 4 ? K - k0 : KC;
        int load_c = accumulate || k0 > 0;
        for (int r0 = 0; r0 < rows; r0 += MC) {
            int r1 = rows - r0 < MC ? rows : r0 + MC;
            for (int p = 0; p < np; p++) {
                const float *B = P + p * pstride + (size_t)k0 * NR;
                int nc = ncols - p * NR;
                /* the slice comes from far only for the first pass over it: that pass asks 16 depths
                 * ahead, never past the last panel's end */
                const long ahead = (long)(np - p) * K - k0 - 16;
                const int npf = ahead <= 0 ? 0 : ahead < kc ? (int)ahead : kc;
                for (int r = r0; r < r1; r += MR) {
                    int mr = r1 - r < MR ? r1 - r : MR;
                    /* C is read before the first multiply-add (the sums continue from it): ask for the
                     * next tile now, so that it arrives while this one computes. */
                    if (load_c) {
                        const int rn = r + MR < r1 ? r + MR : r0, pn = r + MR < r1 ? p : p + 1;
                        if (pn < np)
                            for (int i = 0; i < (r1 - rn < MR ? r1 - rn : MR); i++) {
                                const float *cp = C + (size_t)(rn + i) * ldc + (size_t)pn * NR;
                                __builtin_prefetch(cp, 1, 3); /* the tile's last column too: it may cross a line */
                                __builtin_prefetch(cp + (ncols - pn * NR < NR ? ncols - pn * NR : NR) - 1, 1, 3);
                            }
                    }
                    KP(block)(mr, kc, A + (size_t)r * lda + k0, lda, B, C + (size_t)r * ldc + (size_t)p * NR, ldc, nc,
                              load_c, npf ? B + 16 * NR : B, r == r0 ? npf : 0);
                }
            }
        }
    }
}

/* ---- block-quantized panels (kern.h): each slice of QS depths of a panel is turned into fp32
 * weights in an L1 buffer, then the fp32 micro-kernels run on it exactly as gemm() would.
 * BITS: 8 (int8 panels), 4 (NR/2 bytes per depth: byte c holds output c in its low nibble, c + VW
 * in its high), TAB4 (the same 4-bit panels holding indices into the 16 floats of lut), 16 (fp16
 * weights, 2*NR bytes per depth, no scales or offsets) or NV_QBITS_BF16 (bf16 weights, the same way). */
#define QS (NV_KERN_FP32_KC * 16 / NR) /* a slice buffer of QS*NR floats: 16 KiB */
#define TAB4 5
#define QW(BITS) NV_QPANEL_BYTES(NR, (BITS) == TAB4 ? 4 : (BITS)) /* panel bytes per depth */
#define HALF(BITS) ((BITS) >= 16) /* fp16 or bf16: the weights themselves, no scales or offsets */

#ifdef vload_q4t
#define LOAD_TAB(q, lut, w0, w1) vload_q4t(q, lut, w0, w1)
#else
#define LOAD_TAB(q, lut, w0, w1)                                                                                       \
    do {                                                                                                               \
        (void)(lut); /* not reached: gemm_q8 never picks TAB4 here */                                                  \
        vload_q4(q, w0, w1);                                                                                           \
    } while (0)
#endif
/* The 2*VW weights of one depth of a panel, before scale and offset (fp16, bf16: the weights). */
#define LOAD_Q(q, BITS, w0, w1)                                                                                        \
    do {                                                                                                               \
        if ((BITS) == 16) w0 = vload_h(q), w1 = vload_h((q) + 2 * VW);                                                 \
        else if ((BITS) == NV_QBITS_BF16) w0 = vload_bf(q), w1 = vload_bf((q) + 2 * VW);                               \
        else if ((BITS) == 4) vload_q4(q, w0, w1);                                                                     \
        else if ((BITS) == TAB4) LOAD_TAB(q, lut, w0, w1);                                                             \
        else w0 = vload_q8(q), w1 = vload_q8((q) + VW);                                                                \
    } while (0)

static ALWAYS_INLINE void KP(dequant_o)(const int8_t *Q, const float *lut, const float *S, const float *O, int qb, int k0,
                                        int kc, float *buf, const int HAS_O, const int BITS) {
    if (HALF(BITS)) {
        for (int kk = k0; kk < k0 + kc; kk++) {
            VF w0, w1;
            LOAD_Q(Q + (size_t)kk * QW(BITS), BITS, w0, w1);
            vstoreu(buf + (size_t)(kk - k0) * NR, w0);
            vstoreu(buf + (size_t)(kk - k0) * NR + VW, w1);
        }
        return;
    }
    for (int kb = k0; kb < k0 + kc;) { /* one scale block (or its part inside the slice) at a time */
        const int b = kb / qb, ke = (b + 1) * qb < k0 + kc ? (b + 1) * qb : k0 + kc;
        const VF s0 = vloadu(S + (size_t)b * NR), s1 = vloadu(S + (size_t)b * NR + VW);
        const VF o0 = HAS_O ? vloadu(O + (size_t)b * NR) : vzero(), o1 = HAS_O ? vloadu(O + (size_t)b * NR + VW) : vzero();
        for (int kk = kb; kk < ke; kk++) {
            const int8_t *q = Q + (size_t)kk * QW(BITS);
            float *d = buf + (size_t)(kk - k0) * NR;
            VF w0, w1;
            LOAD_Q(q, BITS, w0, w1);
            w0 = vmul(w0, s0), w1 = vmul(w1, s1);
            if (HAS_O) w0 = vadd(w0, o0), w1 = vadd(w1, o1);
            vstoreu(d, w0);
            vstoreu(d + VW, w1);
        }
        kb = ke;
    }
}

static ALWAYS_INLINE void KP(dequant)(const int8_t *Q, const float *lut, const float *S, const float *O, int qb, int k0, int kc,
                                      float *buf, int bits) {
    if (bits == 16) KP(dequant_o)(Q, lut, S, O, qb, k0, kc, buf, 0, 16);
    else if (bits == NV_QBITS_BF16) KP(dequant_o)(Q, lut, S, O, qb, k0, kc, buf, 0, NV_QBITS_BF16);
    else if (bits == TAB4) {
        if (O) KP(dequant_o)(Q, lut, S, O, qb, k0, kc, buf, 1, TAB4);
        else KP(dequant_o)(Q, lut, S, O, qb, k0, kc, buf, 0, TAB4);
    } else if (bits == 4) {
        if (O) KP(dequant_o)(Q, lut, S, O, qb, k0, kc, buf, 1, 4);
        else KP(dequant_o)(Q, lut, S, O, qb, k0, kc, buf, 0, 4);
    } else {
        if (O) KP(dequant_o)(Q, lut, S, O, qb, k0, kc, buf, 1, 8);
        else KP(dequant_o)(Q, lut, S, O, qb, k0, kc, buf, 0, 8);
    }
}

/* One row against two block-quantized panels (decode), each weight made in registers right before
 * its fused multiply-add: the same weights and the same chains as ukern_row2 over fp32 panels.
 * Panels are short streams (K x QW bytes), so the next pair (at pf, 2 x K x QW bytes) is asked for
 * meanwhile, every four depths. */
static ALWAYS_INLINE void KP(row2_q8_o)(int K, const float *a, const int8_t *Q0, const float *S0, const float *O0,
                                        const int8_t *Q1, const float *S1, const float *O1, int qb, float *C, int nc,
                                        const int8_t *pf, const float *lut, const int HAS_O, const int BITS) {
    VF c0 = vzero(), c1 = vzero(), c2 = vzero(), c3 = vzero();
    for (int k0 = 0; k0 < K; k0 += qb) {
        const int b = k0 / qb, ke = K - k0 < qb ? K : k0 + qb;
        VF s0 = vzero(), s1 = vzero(), s2 = vzero(), s3 = vzero(); /* fp16 and bf16 weights have no scales */
        if (!HALF(BITS)) {
            s0 = vloadu(S0 + (size_t)b * NR), s1 = vloadu(S0 + (size_t)b * NR + VW);
            s2 = vloadu(S1 + (size_t)b * NR), s3 = vloadu(S1 + (size_t)b * NR + VW);
        }
        for (int kk = k0; kk < ke; kk++) {
            if (pf && (kk & 3) == 0) /* four depths of the next pair, within its 2 x K x QW bytes */
                for (size_t off = (size_t)kk * 2 * QW(BITS), l = 0; l < 8 * QW(BITS) && off + l < (size_t)K * 2 * QW(BITS); l += 64)
                    __builtin_prefetch(pf + off + l, 0, 0);
            const VF x = vbcast(a[kk]);
            const int8_t *q0 = Q0 + (size_t)kk * QW(BITS), *q1 = Q1 + (size_t)kk * QW(BITS);
            VF w0, w1, w2, w3;
            LOAD_Q(q0, BITS, w0, w1);
            LOAD_Q(q1, BITS, w2, w3);
            if (!HALF(BITS)) w0 = vmul(w0, s0), w1 = vmul(w1, s1), w2 = vmul(w2, s2), w3 = vmul(w3, s3);
            if (HAS_O) {
                w0 = vadd(w0, vloadu(O0 + (size_t)b * NR));
                w1 = vadd(w1, vloadu(O0 + (size_t)b * NR + VW));
                w2 = vadd(w2, vloadu(O1 + (size_t)b * NR));
                w3 = vadd(w3, vloadu(O1 + (size_t)b * NR + VW));
            }
            c0 = vfma(x, w0, c0);
            c1 = vfma(x, w1, c1);
            c2 = vfma(x, w2, c2);
            c3 = vfma(x, w3, c3);
        }
    }
    vstore_n(C, c0, nc);
    vstore_n(C + VW, c1, nc - VW);
    vstore_n(C + NR, c2, nc - NR);
    vstore_n(C + NR + VW, c3, nc - NR - VW);
}

/* The same loop orders as gemm(): one row streams two panels at a time, a few rows take panels
 * outermost (the weights stream once), more rows take depth blocks outermost with row blocks of
 * MC (the A block stays in L2) and dequantize each slice once per row block. */
static void KP(gemm_q8)(const float *A, size_t lda, int rows, int K, const int8_t *Q, int bits, const float *lut, const float *S,
                        const float *O, int qb, int np, float *C, size_t ldc, int ncols) {
#ifdef vload_q4t
    if (bits == 4 && lut) bits = TAB4;
#endif
    const size_t qstride = (size_t)K * QW(bits), sstride = (size_t)((K + qb - 1) / qb) * NR;
    float buf0[QS * NR] __attribute__((aligned(64)));
#define PANEL(p) Q + (size_t)(p) * qstride, lut, S ? S + (size_t)(p) * sstride : NULL, O ? O + (size_t)(p) * sstride : NULL, qb
    if (rows == 1) {
        int p = 0;
        for (; p + 1 < np; p += 2) {
            const int8_t *q0 = Q + (size_t)p * qstride, *q1 = q0 + qstride;
            const float *s0 = S ? S + (size_t)p * sstride : NULL, *s1 = S ? s0 + sstride : NULL;
            const int8_t *pf = p + 3 < np ? q1 + qstride : NULL;
            const float *o0 = O ? O + (size_t)p * sstride : NULL, *o1 = O ? o0 + sstride : NULL;
#define ROW2(HAS_O, BITS) KP(row2_q8_o)(K, A, q0, s0, o0, q1, s1, o1, qb, C + (size_t)p * NR, ncols - p * NR, pf, lut, HAS_O, BITS)
            if (bits == 16) ROW2(0, 16);
            else if (bits == NV_QBITS_BF16) ROW2(0, NV_QBITS_BF16);
            else if (bits == TAB4) {
                if (O) ROW2(1, TAB4);
                else ROW2(0, TAB4);
            } else if (bits == 4) {
                if (O) ROW2(1, 4);
                else ROW2(0, 4);
            } else {
                if (O) ROW2(1, 8);
                else ROW2(0, 8);
            }
#undef ROW2
        }
        for (; p < np; p++)
            for (int k0 = 0; k0 < K; k0 += QS) {
                const int kc = K - k0 < QS ? K - k0 : QS;
                KP(dequant)(PANEL(p), k0, kc, buf0, bits);
                KP(ukern)(1, kc, A + k0, lda, buf0, C + (size_t)p * NR, ldc, ncols - p * NR, k0 > 0, NULL, 0);
            }
        return;
    }
    if (rows <= 4 * MR) {
        for (int p = 0; p < np; p++)
            for (int k0 = 0; k0 < K; k0 += QS) {
                const int kc = K - k0 < QS ? K - k0 : QS;
                KP(dequant)(PANEL(p), k0, kc, buf0, bits);
                for (int r = 0; r < rows; r += MR)
                    KP(block)(rows - r < MR ? rows - r : MR, kc, A + (size_t)r * lda + k0, lda, buf0,
                              C + (size_t)r * ldc + (size_t)p * NR, ldc, ncols - p * NR, k0 > 0, NULL, 0);
            }
        return;
    }
    for (int k0 = 0; k0 < K; k0 += QS) {
        const int kc = K - k0 < QS ? K - k0 : QS;
        for (int r0 = 0; r0 < rows; r0 += MC) {
            const int r1 = rows - r0 < MC ? rows : r0 + MC;
            for (int p = 0; p < np; p++) {
                KP(dequant)(PANEL(p), k0, kc, buf0, bits);
                for (int r = r0; r < r1; r += MR)
                    KP(block)(r1 - r < MR ? r1 - r : MR, kc, A + (size_t)r * lda + k0, lda, buf0,
                              C + (size_t)r * ldc + (size_t)p * NR, ldc, ncols - p * NR, k0 > 0, NULL, 0);
            }
        }
    }
#undef PANEL
}
#undef QS
#undef TAB4
#undef LOAD_TAB
#undef QW
#undef HALF
#undef LOAD_Q

#undef NR
#undef KS
#undef LINE_FLOATS
#undef KC
#undef MC
#undef ALWAYS_INLINE
