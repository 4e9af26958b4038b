/* Internal interface between engine.c (plans, packing, threading, probing) and the kernels.
 * Not part of the public API; tests include it only to switch on the emulated kernels.
 *
 * fp32 panel kernels (avx2, avx512): the right-hand operand is packed in column panels of NR
 * outputs: panel p holds P[p][kk][c] = W[p*NR + c][kk] for kk < K, c < NR (zero past the last
 * output), so the inner loop streams it contiguously. gemm() computes, for rows r < rows and
 * columns j < min(ncols, np*NR):
 *     C[r*ldc + j] = (accumulate ? C[r*ldc + j] : 0) + sum_kk A[r*lda + kk] * P[j/NR][kk][j%NR]
 * Every element is one fused-multiply-add chain over kk = 0..K-1 in order, whatever the row or
 * panel grouping, so results do not depend on how work is split across threads or on m.
 *
 * Block-quantized panels (gemm_q8): the same panels with int8 values, Q[p][kk][c], and per block
 * of qb depths a scale S[p][kk/qb][c] and, when O is not NULL, an offset O[p][kk/qb][c]; with q4,
 * values 0..15 two to a byte, NR/2 bytes per depth: byte c holds output c in its low nibble and
 * output c + NR/2 in its high one (Q4_0/Q4_1/Q4_K weights: ~0.6-0.75 bytes per weight), or with
 * lut, 4-bit indices into its 16 floats (IQ4_NL, IQ4_XS: the weight is lut[Q] * S); with
 * bits 16, fp16 weights, 2*NR bytes per depth, S and O NULL (the weight is the fp16 value); with
 * bits NV_QBITS_BF16, bf16 weights the same way (the weight is the bf16 value: its bits shifted up). The
 * weight is (float)Q * S (+ O: a separate add), computed in fp32 into a slice buffer in L1 just
 * before use, then the fp32 micro-kernels run on it: the result is bit-identical to gemm() over
 * panels holding those fp32 weights (GGUF's quantized types decompose exactly into this form).
 *
 * AMX kernels: A is row-major (bf16 or int8) with a row stride of lda elements, K padded with zeros
 * to the tile depth (32 bf16 / 64 int8); when rows >= 16 the buffer must hold rows rounded up to a
 * multiple of 16 (zero rows). B is a sequence of 1 KiB tiles in VNNI layout, column tile t and depth
 * block kb at B + (t*KB + kb)*TILE: tile row i, column c holds the 2 (bf16) or 4 (int8) consecutive
 * K values kb*D + i*2 + e (resp. i*4 + e) of output column t*16 + c. Each call configures the tile
 * registers of the calling thread itself and releases them at the end. */
#ifndef NV_KERN_H
#define NV_KERN_H

#include <stddef.h>
#include <stdint.h>

#include "base/half.h"
#include "engine/engine.h"

#define NV_KERN_FP32_KC 256
/* Bytes per depth of a quantized panel of nr outputs holding bits (4, 8, 16 or NV_QBITS_BF16) per value. */
#define NV_QPANEL_BYTES(nr, bits) ((size_t)(nr) * ((bits) == NV_QBITS_BF16 ? 16 : (bits)) / 8)

/* The vector templates' blocking (kern_vdot_tmpl.h, kern_qdot_tmpl.h): n rows (or column tiles) of a
 * block go to micro-kernels of `most`, then of the largest powers of two that fit, so an instance
 * compiles a micro-kernel (each a large unrolled body) for those sizes only, not one for every
 * remainder. Every output is one chain whatever the piece, so the split changes no bit. */
static inline int nv_kern_piece(int n, int most) {
    if (n >= most) return most;
    int p = 1;
    while (2 * p <= n) p *= 2;
    return p;
}
/* Whether nv_kern_piece(., most) can give n (a compile-time constant in the templates' cases). */
#define NV_KERN_PIECE_MADE(n, most) ((n) == (most) || ((n) < (most) && ((n) & ((n) - 1)) == 0))

typedef struct {
    const char *name;
    int nr; /* outputs per panel */
    int mr; /* rows per micro-kernel */
    int kc; /* depth block of gemm(): splitting K at multiples of kc (accumulating through C) gives
               the same bits as one call */
    void (*gemm)(const float *A, size_t lda, int rows, int K, const float *P, int np, float *C, size_t ldc, int ncols,
                 int accumulate);
    void (*gemm_q8)(const float *A, size_t lda, int rows, int K, const int8_t *Q, int bits, const float *lut, const float *S,
                    const float *O, int qb, int np, float *C, size_t ldc, int ncols);
    int lut4; /* gemm_q8 takes 4-bit indices into lut (else lut is ignored: give it the values) */
} nv_kern_fp32;

extern const nv_kern_fp32 nv_kern_avx2;
extern const nv_kern_fp32 nv_kern_avx512;
extern const nv_kern_fp32 nv_kern_avx512_emu; /* the avx512 kernel logic on pairs of AVX2 vectors */
/* AVX-512 (kern_avx512.c): dst[j] = bf16(src[j] (* colscale[j])) for j < k, and 16 columns of two
 * rows as VNNI pairs (out[2c + e] = bf16(row_e[c])): nv_bf16_from_f32's bits, 16 at a time. */
void nv_avx512_row_to_bf16(const float *src, const float *colscale, uint16_t *dst, int k);
void nv_avx512_vnni_pair16(const float *r0, const float *r1, uint16_t *out);

/* The int8 engines' product over block-quantized weights (kern_qdot_tmpl.h has the arithmetic):
 * activations quantized per depth block of kq (16 or 32) to signed bytes; weights in column tiles
 * of 16 outputs, each tile nb blocks in a row, a block being its values (kq/4 rows of 64 bytes,
 * VPDPBUSD's unsigned operand: output c's four depths at bytes 4c..4c+3, as q + 128; or with four,
 * values 0..15 as they are (or as indices into a table, lut) in kq/8 rows whose low nibbles hold the
 * first four depths of eight and high nibbles the next four), then 16 fp32 scales and, with offsets, 16 fp32 offsets: one stream.
 * Offsets that are one integer c times their block's scale (Q4_0's -8, Q5_0's -16) are not stored:
 * c joins the integer sums through bias. */
typedef struct {
    const int8_t *q;          /* rows x lda bytes, zero past k to nb * kq */
    size_t lda;               /* bytes per row */
    const float *xs, *xsum;   /* [rows][nb]: each block's scale (max |x| / 127) and exact sum; with
                                 super-blocks (nv_qdot_b.sub) xs is [rows][nb / sub], one scale a
                                 super-block, and xsum unused */
    const int32_t *qsum;      /* [rows][nb]: the block's sum of q */
} nv_qdot_a;
typedef struct {
    const uint8_t *q;         /* tile t at q + t * nb * nv_qdot_block_bytes(kq, four, offsets) */
    int nb, kq, four, offsets;
    int bias;                 /* a block's int32 sums start at bias * its qsum: -128 for values stored
                                 + 128, plus c where every offset is c times its scale (Q4_0: -8) */
    const uint8_t *lut;       /* NULL, or with four and kq 32: the nibbles are indices into these 16
                                 bytes (values + 128: bias -128) */
    int sub;                  /* 0, or blocks per super-block (the k-quants' 8 or 16; nb a multiple):
                                 then a block's scale is an integer (int8) times its super-block's
                                 fp32 scale, and its offset one times the super-block's fp32 offset
                                 factor; each block's int32 sum is multiplied by its integer scale
                                 and summed over the super-block, the offsets' integers by the
                                 activations' block sums (qsum) likewise, and the output takes
                                 per super-block
                                     y = fma((float)isum, d * xs, y), then y = fma((float)imin, dm * xs, y)
                                 (llama.cpp's k-quants times Q8_K): a super-block of a tile is its
                                 sub blocks' values, sub x 16 int8 scales, with offsets sub x 16 int8
                                 offset integers, 16 fp32 d, with offsets 16 fp32 dm */
} nv_qdot_b;
/* Bytes of one tile's block: values, scales, offsets. */
static inline size_t nv_qdot_block_bytes(int kq, int four, int offsets) {
    return (size_t)kq * (four ? 8 : 16) + 64 + (offsets ? 64 : 0);
}
/* Offset in a tile's super-block of sub blocks (nv_qdot_b.sub) of its 16 fp32 d (then 16 dm):
 * past the blocks' values and integer scales (and offsets). */
static inline size_t nv_qdot_super_floats(int kq, int four, int offsets, int sub) {
    return (size_t)sub * ((size_t)kq * (four ? 8 : 16) + 16 * (offsets ? 2 : 1));
}
/* Bytes of one tile's super-block of sub blocks. */
static inline size_t nv_qdot_super_bytes(int kq, int four, int offsets, int sub) {
    return nv_qdot_super_floats(kq, four, offsets, sub) + 64 * (offsets ? 2 : 1);
}
/* Activation scales a row (nv_qdot_a.xs) of nb blocks: one a block, or one a super-block of sub. */
static inline int nv_qdot_row_scales(int nb, int sub) { return sub ? nb / sub : nb; }
/* Bytes of one column tile of a qdot operand. */
static inline size_t nv_qdot_tile_bytes(const nv_qdot_b *b) {
    return b->sub ? (size_t)(b->nb / b->sub) * nv_qdot_super_bytes(b->kq, b->four, b->offsets, b->sub)
                  : (size_t)b->nb * nv_qdot_block_bytes(b->kq, b->four, b->offsets);
}

typedef struct {
    const char *name;
    /* C[rows x ncols] (+)= A . B over ntiles column tiles of 16, Kp a multiple of 32; column tile t
     * starts at B + t * bstride (bf16 elements; 0: Kp / 32 tiles of 512, tiles packed at depth Kp),
     * so a product can take a slice of depth out of tiles packed deeper. With accumulate the sums
     * are added to C once complete (C + sum, not a chain started from C). */
    void (*bf16_gemm)(const uint16_t *A, size_t lda, int rows, int Kp, const uint16_t *B, size_t bstride, int ntiles,
                      float *C, size_t ldc, int ncols, int accumulate);
    /* C[r][j] = (float)(A . B)[r][j] * xscale[r] * wscale[j], Kp a multiple of 64. With
     * int8_unsigned, A's bytes are q + 128 (u8) and the sum for output j starts at wcomp[j] =
     * -128 * sum of B's column j (which cancels the offset exactly); else A is q (s8), wcomp unused. */
    void (*int8_gemm)(const int8_t *A, size_t lda, int rows, int Kp, const int8_t *B, int ntiles, const float *xscale,
                      const float *wscale, const int32_t *wcomp, float *C, size_t ldc, int ncols);
    int int8_unsigned;
    /* C[rows x ncols] = A . B of block-quantized B (nv_qdot_b) over ntiles column tiles (the int8
     * loops only; NULL elsewhere) */
    void (*qdot_gemm)(const nv_qdot_a *a, int rows, const nv_qdot_b *b, int ntiles, float *C, size_t ldc, int ncols);
    /* bf16_gemm also takes A as VNNI tiles, B's layout (lda 0: row tile u at A + u * Kp / 32 * 512),
     * which pairing two rows of dy gives dW's dy^T without a transpose: the vector loops (a tile
     * unit's A tiles are rows) */
    int bf16_a_tiles;
} nv_kern_amx;

extern const nv_kern_amx nv_kern_amx_hw;
extern const nv_kern_amx nv_kern_amx_emu; /* tile registers emulated in C, checked against the ISA rules */
/* avx512-bf16: the bf16 product over the same tiles with VDPBF16PS (int8_gemm NULL); and that loop
 * on AVX2 with the instruction emulated. */
extern const nv_kern_amx nv_kern_avx512bf16;
extern const nv_kern_amx nv_kern_avx512bf16_emu;
/* avx512-int8: the int8 product over amx-int8's tiles with VPDPBUSD (bf16_gemm NULL: the engine
 * takes avx512-bf16's for its training products); and that loop on AVX2 with VPDPBUSD emulated. */
extern const nv_kern_amx nv_kern_avx512int8;
extern const nv_kern_amx nv_kern_avx512int8_emu;
/* avx2-int8: that emulation's loop as an engine (no fault-injection check): amx-int8's bits on AVX2;
 * and the same loop with AVX-VNNI's 256-bit VPDPBUSD where the CPU has it. */
extern const nv_kern_amx nv_kern_avx2int8;
extern const nv_kern_amx nv_kern_avxvnni_int8;

#define NV_AMX_TILE_BYTES 1024
#define NV_AMX_BF16_DEPTH 32
#define NV_AMX_INT8_DEPTH 64

/* The 64-byte tile configuration (palette 1). */
typedef struct {
    uint8_t palette_id;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((aligned(64))) nv_amx_cfg;
_Static_assert(sizeof(nv_amx_cfg) == 64, "tile config must be 64 bytes");

/* Test-only: make the next nv_engines_init() run avx512, avx512-bf16, avx512-int8, amx-bf16 and
 * amx-int8 on their emulated kernels (whatever this CPU has), so their packing, tiling and remainder logic is tested here. */
void nv_engines_set_emulation(int on);
int nv_engines_emulated(void);
/* Test-only fault injection into the emulated kernels, to prove the probe's self-test catches a
 * subtly wrong kernel: amx drops the last K group of every tile product (2 of 32 bf16 terms, 4 of
 * 64 int8 terms); avx512 scales every broadcast A value by 1 + 2^-12; avx512-bf16 drops one
 * product in sixteen. */
void nv_kern_amx_emu_inject(int on);
void nv_kern_avx512_emu_inject(int on);
/* avx512-bf16: every eighth emulated VDPBF16PS drops its even depth's product. */
void nv_kern_avx512bf16_emu_inject(int on);
/* avx512-int8: every eighth emulated VPDPBUSD drops its last depth's product. */
void nv_kern_avx512int8_emu_inject(int on);

#endif
