/* Engines and matmul plans.
 *
 * An engine is one way of computing a matrix product: scalar (fp32 reference, always present),
 * avx2 (fp32 FMA), avx512 (fp32), avx512-bf16 (bf16 operands, fp32 accumulate/output, on the
 * vector unit's VDPBF16PS), amx-bf16 (the same on the tile unit), amx-int8 (W8A8: int8 weights
 * with per-output-channel scales, activations quantised per row at run time, int32 accumulate,
 * fp32 output), avx512-int8 (amx-int8's arithmetic on the vector unit's VPDPBUSD: the same bits)
 * and avx2-int8 (the same on AVX2 alone, VPDPBUSD emulated exactly). nv_engines_init() probes each once (CPUID, XCR0, the AMX
 * permission request, then a small product checked against scalar); a failure latches the engine
 * off with one log line giving the reason. NERVE_ENGINES (or the `allow` argument) restricts the
 * set so every fallback is testable on any machine.
 *
 * A plan is a weight matrix W (n outputs x k inputs, row-major fp32, the Linear layout of
 * llama2.c and PyTorch) packed once into an engine's layout. nv_plan_run computes
 * y[m x n] = x[m x k] . W^T for any m; nv_plan_refresh() rewrites the packed copy from new fp32
 * weights without rebuilding (the dynamic-weights rule). A plan asked for an engine that is off
 * falls down the ladder amx-int8 -> avx512-int8 -> avx2-int8 -> amx-bf16 -> avx512-bf16 -> avx512 -> avx2 -> scalar
 * (each int8 engine above the bf16 ones: a machine without AMX answers amx-int8 with the same bits,
 * amx-bf16 with bf16, never with int8).
 * The scalar engine sums each dot product left to right in fp32, exactly as llama2.c's run.c,
 * and reads the caller's weights in place (the caller keeps them alive for the plan's life).
 *
 * Plans run on the shared thread pool (nv_pool, sized by nv_engines_init's `threads`), split over
 * output channels and, when m is large, over rows. Results never depend on the thread count. For
 * avx2 and avx512 every output element is one chain of fused multiply-adds in input order, so
 * their results are bit-identical to each other, and nv_plan_run's rows do not depend on m (a
 * row's result does not depend on the rows batched with it).
 * A plan is read-only while it runs: any number of threads may run the same plan at once;
 * nv_plan_refresh must not overlap a run of the same plan. Non-scalar plans keep no pointer to w.
 *
 * Engines and their layouts:
 *   scalar    reads W in place; dx and dW summed left to right (the reference).
 *   avx2      W packed in panels of 16 outputs x k (P[p][kk][c] = W[16p+c][kk]); a 6 x 16 micro-kernel
 *             (12 ymm accumulators), depth blocks of 256; m == 1 streams two panels at a time.
 *   avx512    the same kernel source at 16 lanes: panels of 32 outputs, an 8 x 32 micro-kernel.
 *   amx-bf16  W rounded to bf16 in 1 KiB VNNI tiles (16 outputs x 32 inputs); x converted to bf16
 *             per call; 2 x 2 tile blocks (32 rows x 32 outputs), fp32 accumulate and output;
 *             below 16 rows the tiles are configured with exactly m rows (decode streams W once).
 *   avx512-bf16  amx-bf16's tiles, packing and products, the tile loop replaced by VDPBF16PS: a tile
 *             row is 16 outputs' pair of depths, multiplied by a broadcast pair of x; 8 rows x 32
 *             outputs per micro-kernel (16 zmm accumulators), 1-2 rows x 64 outputs for decode.
 *             Each output one fp32 chain over the depth pairs in order.
 *   amx-int8  W quantised per output channel (scale = max|W[n]| / 127) in VNNI tiles of 16 x 64;
 *             x quantised per row at run time (scale = max|x[r]| / 127), tdpbssd into int32,
 *             y = acc * xscale[r] * wscale[n]. Plans with k > 131072 (int32 could overflow) are
 *             built on amx-bf16 instead.
 *   avx512-int8  amx-int8's tiles, scales and quantisation; VPDPBUSD (unsigned x signed bytes) with x
 *             given as q + 128 and each output's int32 sum started at -128 * sum(q_w), which the
 *             offset's products cancel exactly: the sums, and so y, are amx-int8's bit for bit.
 *             Plans with k > 131072 are built on the next floating-point rung that is on.
 *   avx2-int8  avx512-int8's loop on pairs of ymm registers: AVX-VNNI's VPDPBUSD where the CPU has
 *             it, else VPDPBUSD emulated by VPMADDWD on the bytes widened to 16 bits (exact): the
 *             same bits again, on a quarter of fp32's weight bytes.
 * Training products on each engine:
 *   nv_plan_run_dx  avx2/avx512: the same panel kernel over panels of W^T gathered per task from
 *                   the forward panels. amx-bf16 and avx512-bf16: bf16 tiles (dy rounded to bf16, W^T tiles gathered
 *                   from the forward tiles). amx-int8, avx512-int8: bf16 tiles too, on the quantised
 *                   weights (exact in bf16) with the per-channel scales folded into dy before
 *                   rounding (the vector int8 engines: VDPBF16PS, emulated where the CPU lacks AVX512_BF16).
 *   nv_gemm_dw      avx2/avx512: the panel kernel on dy^T and panels of x, accumulating into dw;
 *                   x is packed once per call, dy transposed a block of rows x depth slice at a
 *                   time into a buffer that stays in cache (never a whole copy of dy).
 *                   the bf16 and int8 tile engines: bf16 tiles (dy and x rounded to bf16), fp32 accumulate.
 *   Both on the tile engines: a depth past 8,192 (dx: the outputs n, as a classifier's vocabulary;
 *                   dW: the rows m) runs in fixed slices of 4,096, each slice's sums added to the
 *                   output in order (one chain per slice), so a slice of B's tiles stays in L2.
 *
 * Accuracy against scalar, per element, with S = sum |a||b| over the reduction of length K and
 * u = 2^-24 (what the probe's self-test and tests/test_engine.c check):
 *   avx2, avx512  two fp32 summation orders: |err| <= 2 (K + 2) u S.
 *   bf16 (tiles)  each operand rounded to bf16 (relative 2^-8): |err| <= (2^-7 + 2^-16) S + fp32 terms.
 *   int8          with half-steps hx = xscale/2, hw = wscale/2:
 *                 |err| <= hw sum|x| + hx sum|w| + K hx hw + (K + 12) u (S + those) + fp32 terms.
 * The probe (nv_engines_init) runs y, dx and dW of each engine on awkward shapes against scalar
 * within these bounds, first on the calling thread with SIGILL/SIGSEGV trapped, then split over the
 * pool (which must give identical bits); any failure latches the engine off with one warning. */
#ifndef NV_ENGINE_H
#define NV_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base/err.h"

typedef enum {
    NV_ENGINE_SCALAR = 0,
    NV_ENGINE_AVX2,
    NV_ENGINE_AVX512,
    NV_ENGINE_AVX512_BF16,
    NV_ENGINE_AMX_BF16,
    NV_ENGINE_AVX2_INT8,
    NV_ENGINE_AVX512_INT8,
    NV_ENGINE_AMX_INT8,
    NV_ENGINE_COUNT
} nv_engine_id;

/* Probes every engine once (idempotent until nv_engines_reset). allow: comma-separated engine
 * names, or NULL to use $NERVE_ENGINES, or all when that is unset; an unknown name is NV_EINVAL.
 * threads: size of the shared pool, <= 0 for one per core this process may use; a later call with
 * threads > 0 resizes the pool (call it while no plan is running). */
nv_err nv_engines_init(const char *allow, int threads);
int nv_engine_available(nv_engine_id e);
const char *nv_engine_name(nv_engine_id e);
/* Why an engine is off ("" when it is on). */
const char *nv_engine_why_off(nv_engine_id e);
/* The highest rung that is on, for any work (may be bf16 or int8). */
nv_engine_id nv_engine_best(void);
/* The highest fp32 rung that is on (avx512, avx2 or scalar), for fp32-accurate work. */
nv_engine_id nv_engine_best_fp32(void);
/* The highest rung that is on whose operands are floating point (bf16 or fp32, not int8): for
 * training, which keeps its forward in the precision its backward assumes. */
nv_engine_id nv_engine_best_float(void);
/* 1 for the engines whose operands are rounded (bf16, int8), 0 for the fp32 ones. */
int nv_engine_low_precision(nv_engine_id e);
/* 1 for the W8A8 engines (amx-int8, avx512-int8, avx2-int8). */
int nv_engine_int8(nv_engine_id e);
/* 1 when block-quantized plans asked of int8 engine e multiply by integer dot products on this CPU
 * (avx512-int8's loop, AVX-VNNI's); 0 when they run on the exact fp32 vector loop instead (plain
 * AVX2, where the integer form would be slower). */
int nv_engine_int8_blocks(nv_engine_id e);
/* The bf16 engine an int8 engine's training products and activation-by-activation products run on
 * (amx-int8: amx-bf16, avx512-int8 and avx2-int8: avx512-bf16); e itself for the others. */
nv_engine_id nv_engine_bf16_of(nv_engine_id e);
nv_err nv_engine_parse(const char *name, nv_engine_id *out);
/* The next rung down the ladder from e (scalar stays scalar). */
nv_engine_id nv_engine_next_down(nv_engine_id e);

typedef struct nv_plan nv_plan;

nv_err nv_plan_build(nv_plan **out, nv_engine_id want, const float *w, int n, int k);
void nv_plan_refresh(nv_plan *p, const float *w);
/* y[m x n] = x[m x k] . W^T */
void nv_plan_run(const nv_plan *p, const float *x, int m, float *y);
/* Runs several plans on the same x as one job on the pool: ys[i] = x . W_i^T for i < count, each
 * exactly what nv_plan_run gives. With an epilogue, every plan must have the same n, and once all
 * products are done ep(ctx, r0, r1, c0, c1) runs on disjoint blocks of rows r0..r1-1 and output
 * columns c0..c1-1 covering m x n, each on the thread that computed that block where the engine
 * allows (SwiGLU, a residual add: elementwise work that would otherwise run on one thread after a
 * second hand-off). */
typedef void (*nv_plan_epilogue)(void *ctx, int r0, int r1, int c0, int c1);
/* fn(ctx, x, m, k) is called on the calling thread with the m x k input of every nv_plan_run and
 * nv_plan_run_group of p before the product (fn NULL: none): what an importance matrix collects. */
typedef void (*nv_plan_observer)(void *ctx, const float *x, int m, int k);
void nv_plan_observe(nv_plan *p, nv_plan_observer fn, void *ctx);
void nv_plan_run_group(const nv_plan *const *plans, int count, const float *x, int m, float *const *ys,
                       nv_plan_epilogue ep, void *ep_ctx);
/* The packed copy of rows r0..r1-1 of W (w: the whole n x k matrix) rewritten from w, on the
 * calling thread: for an optimizer that refreshes each block of rows right after updating it, while
 * the rows are still in cache. r0 must be a multiple of nv_plan_row_unit(p) and r1 one or n; whole
 * units of rows are packed. */
void nv_plan_refresh_rows(nv_plan *p, const float *w, int r0, int r1);
/* Rows one packed unit holds (fp32 panel width, 16 for AMX column tiles, 1 for scalar). */
int nv_plan_row_unit(const nv_plan *p);
nv_engine_id nv_plan_engine(const nv_plan *p);
int nv_plan_n(const nv_plan *p);
int nv_plan_k(const nv_plan *p);
void nv_plan_free(nv_plan *p);
/* Total plans built in this process (training checks this stays constant after step 1). */
long nv_plan_builds(void);

/* dx[m x k] = dy[m x n] . W (the gradient of nv_plan_run with respect to x). The tile engines build
 * W^T's tiles for it in a buffer the plan keeps from its first dx on (n x k bf16: training holds
 * that beside the packed weights; a concurrent dx of the same plan uses a buffer of its own). */
void nv_plan_run_dx(const nv_plan *p, const float *dy, int m, float *dx);
/* dx[m x k] += dy . W, as nv_plan_run_dx into the values dx holds (for a sum of several products'
 * gradients, without a temporary and a pass to add it): the fp32 engines continue each output's
 * chain from dx's value, the tile engines add each complete sum to it (past a depth of 8,192, each
 * 4,096-deep slice's sum in turn), scalar adds term by term. */
void nv_plan_run_dx_add(const nv_plan *p, const float *dy, int m, float *dx);
/* dw[n x k] += dy^T . x with dy m x n and x m x k (the weight gradient), on engine e or the next
 * rung down that is on; with accumulate 0, dw = dy^T . x (as nv_gemm_dw_group below). */
void nv_gemm_dw(nv_engine_id e, const float *dy, const float *x, int m, int n, int k, float *dw, int accumulate);
/* dws[i] += dys[i]^T . x for i < count (dys[i] m x ns[i]): the weight gradients of several products
 * of the same x (q, k and v; w1 and w3), x packed once; each exactly what nv_gemm_dw gives. With
 * accumulate 0 each dws[i] is overwritten instead, with the bits += gives on a zeroed dws[i] (but for
 * the sign of a zero sum): a trainer's first micro-batch neither clears its gradients in a pass of
 * its own nor reads them back. */
void nv_gemm_dw_group(nv_engine_id e, const float *const *dys, const int *ns, int count, const float *x, int m, int k,
                      float *const *dws, int accumulate);
/* Products on the calling thread, for work already split over the pool (one attention head per
 * task): an operand B (depth k x n outputs) is packed once into an engine's layout in a buffer the
 * caller owns, then any number of products C (+)= A . B run over a prefix of its depth and outputs.
 * fp32 engines: each output is one multiply-add chain over depth in order, the engine's panel
 * kernel. amx-bf16 and avx512-bf16 (an int8 engine asks for its bf16 one, as these operands are activations): B as bf16 VNNI
 * tiles, A's rows made bf16 per call, fp32 accumulation; B's values in the packed depth's last
 * 32-deep block past a shorter depth prefix must be finite (they meet zeros). An engine that is off
 * falls down the ladder (amx-bf16 to avx512-bf16 when that is on, else to the best fp32 engine). */
typedef struct {
    nv_engine_id e;
    int k, n, nr; /* depth, outputs, outputs per panel */
    int kstride;  /* the packed depth a panel's (or column of tiles') stride is laid out for: k unless a view */
    float *data;
} nv_bpack;
/* Floats of buffer a pack of depth k x n outputs needs on any engine. */
size_t nv_bpack_floats(int k, int n);
/* B[kk][j] = b[j*ldb + kk]: b holds n rows of k (the product is A . b^T). */
void nv_bpack_rows(nv_bpack *bp, nv_engine_id e, const float *b, size_t ldb, int n, int k, float *buf);
/* B[kk][j] = b[kk*ldb + j]: b holds k rows of n. */
void nv_bpack_cols(nv_bpack *bp, nv_engine_id e, const float *b, size_t ldb, int k, int n, float *buf);
/* C[r*ldc + j] (+)= sum_{kk < depth} A[r*lda + kk] * B[kk][j] for r < m, j < ncols (depth <= k,
 * ncols <= n). */
void nv_bpack_run(const nv_bpack *bp, const float *A, size_t lda, int m, int depth, int ncols, float *C, size_t ldc,
                  int accumulate);
/* The multiple (a power of two) that nv_bpack_skip's offsets must be of for this pack. */
int nv_bpack_align(const nv_bpack *bp);
/* *view = the part of bp from output col0 and depth d0 on (multiples of nv_bpack_align; no copy):
 * B'[kk][j] = B[d0 + kk][col0 + j]. Products over a band of B (attention's keys inside a window)
 * then skip what lies before it. */
void nv_bpack_skip(const nv_bpack *bp, int col0, int d0, nv_bpack *view);

/* Block-quantized weights, the form GGUF's quantized types decompose into exactly: for output j
 * and input kk, W[j][kk] = (float)q[j*k + kk] * s[j*nb + kk/qb], then + o[j*nb + kk/qb] when o is
 * not NULL (a separate add), with nb = ceil(k / qb); with lut, q holds indices 0..15 and the value
 * is lut[q] (IQ4_NL's and IQ4_XS's uneven levels, MXFP4's doubled FP4 values). Or half-precision weights: when h is not NULL,
 * W[j][kk] = h[j*k + kk] as fp16, or as bf16 with h_bf16 (q, s, o, qb unused). */
typedef struct {
    const int8_t *q;
    const float *s, *o;
    int qb;
    const uint16_t *h;
    int h_bf16;
    const int8_t *lut;
    /* Optional, the k-quants' own form of s and o, which a plan on an int8 engine then keeps (one
       byte a block instead of four or eight): sub blocks per super-block (at most 16), and per block an integer
       scale sub_s and (with o) an integer offset sub_o, per super-block the floats sup_s and sup_o,
       with s[b] == sup_s[b / sub] * sub_s[b] and o[b] == sup_o[b / sub] * sub_o[b] exactly in fp32. */
    int sub;
    const int8_t *sub_s, *sub_o;
    const float *sup_s, *sup_o;
} nv_qweights;
/* A plan over block-quantized weights, kept as int8 (about 1.1-1.3 bytes per weight instead of 4),
 * or as 4-bit values when every value is 0..15 (Q4_0, Q4_1, Q4_K, Q3_K, Q2_K: about 0.6-0.75 bytes per
 * weight; IQ4's 4-bit indices too on avx512, whose kernel looks its table up in registers),
 * or over fp16 or bf16 weights kept as they are (2 bytes per weight).
 * On avx2 and avx512 each slice is turned into fp32 in L1 just before the fp32 kernel uses it, so
 * nv_plan_run gives exactly the bits of an fp32 plan on the same engine built from those weights as
 * floats (avx512-bf16 builds block-quantized weights on avx512's panels).
 * On the int8 engines (amx-int8 on avx512-int8's loop: tiles cannot scale each block) block-quantized
 * weights whose blocks are a multiple of 16 stay their own values and are multiplied by the
 * activations quantized per block of 32 (16 where the blocks are of 16) with VPDPBUSD (indices into
 * a table as 4-bit values looked up in registers: blocks of 32 only; with the k-quants' integer
 * form (nv_qweights.sub), one activation scale per super-block and the integer scales kept as bytes),
 * as llama.cpp multiplies its quantized types by Q8 activations: the error is the activations' quantisation alone
 * (|err| <= sum over blocks of xscale/2 * sum |q s|, plus fp32 terms; kern_qdot_tmpl.h); the same
 * bits on every int8 engine. Other blocks, and avx2-int8 without AVX-VNNI (four instructions per
 * VPDPBUSD lose to the exact path), build on avx512 (avx2 where that is off).
 * fp16 and bf16 weights the bf16 and int8 engines take as floats into their own bf16 or int8 form
 * (NV_EUNSUPPORTED when want resolves to another engine than avx2, avx512 or an int8 one: build an
 * fp32 plan then).
 * Inference only: nv_plan_refresh leaves it unchanged and nv_plan_run_dx gives NaN. */
nv_err nv_plan_build_quant(nv_plan **out, nv_engine_id want, const nv_qweights *w, int n, int k);
/* 1 when every one of the n values is 0..15: such a plan keeps them at 4 bits. */
int nv_qweights_four_bit(const int8_t *q, size_t n);
/* bf16 weights kept as bf16: 16 bits a value as fp16's, a code of its own to tell them apart */
#define NV_QBITS_BF16 17
/* 0: fp32 weights; 4, 8 or 16 (fp16): bits per stored value; NV_QBITS_BF16: bf16 */
int nv_plan_quantized(const nv_plan *p);
/* Bytes of weight one pass of the plan reads: the packed copy (with the int8 engines' per-channel scales and sums, or
 * a block-quantized plan's int8 panels with their block scales and offsets), or for scalar the
 * caller's n x k floats. */
size_t nv_plan_packed_bytes(const nv_plan *p);

/* Test-only: forget the probe so that the next nv_engines_init() probes again with its new allow
 * list. Plans built before stay valid. */
void nv_engines_reset(void);

#endif
