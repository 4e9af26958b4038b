/* Engines: probing, latching, the ladder; plans: packing, refresh, threading; the reference scalar
 * engine. The vector and tile loops live in kern_*.c (see kern.h). */
#include "engine/engine.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cpu.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "base/vmath.h"
#include "engine/kern.h"

static const char *const engine_names[NV_ENGINE_COUNT] = {"scalar",    "avx2",        "avx512",  "avx512-bf16", "amx-bf16",
                                                           "avx2-int8", "avx512-int8", "amx-int8"};

static int engines_ready;
static int pool_ready;
static int engine_on[NV_ENGINE_COUNT];
static char engine_why[NV_ENGINE_COUNT][160];
static atomic_long plan_build_count;
static int emulate;
static const nv_kern_fp32 *engine_fp32[NV_ENGINE_COUNT]; /* avx2, avx512 */
static const nv_kern_amx *engine_amx;                     /* amx-bf16, amx-int8 */
static const nv_kern_amx *engine_vbf16;                   /* avx512-bf16 */
/* The vector int8 engines: an int8 loop with avx512-bf16's bf16 one (their training products),
 * every pairing, filled once and never changed, so a plan's pointer stays valid across re-probes. */
enum { VINT8_AVX512, VINT8_AVX512_EMU, VINT8_AVX2, VINT8_AVXVNNI, VINT8_LOOPS };
static nv_kern_amx vint8_kerns[VINT8_LOOPS][2]; /* [int8 loop][0: VDPBF16PS, 1: its emulation] */
static pthread_once_t vint8_once = PTHREAD_ONCE_INIT;
static const nv_kern_amx *engine_vint8, *engine_avx2int8;
static int vint8_bf16; /* the bf16 column the engines above take: 1 where the CPU lacks AVX512_BF16 */
static void vint8_fill(void) {
    const nv_kern_amx *const int8[VINT8_LOOPS] = {&nv_kern_avx512int8, &nv_kern_avx512int8_emu, &nv_kern_avx2int8,
                                                  &nv_kern_avxvnni_int8};
    const nv_kern_amx *const bf16[2] = {&nv_kern_avx512bf16, &nv_kern_avx512bf16_emu};
    for (int i = 0; i < VINT8_LOOPS; i++)
        for (int b = 0; b < 2; b++) {
            vint8_kerns[i][b] = *int8[i];
            vint8_kerns[i][b].bf16_gemm = bf16[b]->bf16_gemm;
            vint8_kerns[i][b].bf16_a_tiles = bf16[b]->bf16_a_tiles;
        }
}
static int force_inline; /* self-test: every task on the calling thread */
static int force_split;  /* self-test: split even tiny products across the pool */

/* int8 products accumulate k * 127 * 127 in int32. */
#define INT8_MAX_K 131072

struct nv_plan {
    nv_engine_id engine;
    int n, k;
    const float *w;  /* scalar: the caller's weights, read in place */
    void *pack;      /* fp32 panels, bf16 or int8 VNNI tiles (64-byte aligned) */
    size_t pack_bytes;
    float *wscale;   /* int8: per-output-channel scales, padded to the tile columns */
    int32_t *wcomp;  /* int8: -128 * the sum of each output's quantised weights (kern.h's int8_unsigned) */
    int np;          /* fp32: panels of nr outputs; amx: column tiles of 16 */
    int kp;          /* amx: depth padded to the tile depth */
    const nv_kern_fp32 *kf;
    const nv_kern_amx *ka;
    /* block-quantized (nv_plan_build_quant): pack holds int8 panels (4-bit ones when every value
       is 0..15) with per-block scales and offsets beside them, or fp16 panels without them */
    int quant, bits, qb; /* bits per stored value: 4, 8, 16 (fp16) or NV_QBITS_BF16 */
    float *qscale, *qoff; /* [np][k/qb][nr] */
    /* block-quantized on an int8 engine (qdot): integer dot products with the activations quantized
       per block of kq depths: pack holds np column tiles of 16 outputs, each k/kq blocks of values,
       scales and offsets (kern.h's nv_qdot_b) */
    int qdot, kq, qoffsets, qbias; /* qbias: kern.h's nv_qdot_b.bias */
    int qsub;                      /* 0, or blocks per super-block: integer block scales (kern.h's nv_qdot_b.sub) */
    int has_lut;                   /* 4-bit indices into a table: qlut (qdot: kern.h's nv_qdot_b.lut) or flut */
    uint8_t qlut[16];
    float flut[16];
    /* tile engines' dx: W^T's tiles in a buffer kept for the plan's life, so a training step does not
       fault in and zero the pages of a fresh one (the classifier's is n x k bf16: 49 MB at 32,000 x
       768); a call that finds it in use by another thread takes a buffer of its own. On bf16 tiles,
       once a dx call has built them (dx_ok), every refresh rewrites them from the fp32 rows it packs
       (while those rows are in cache), so dx does not rebuild them by transposing the packed tiles;
       int8 plans rebuild them every call. */
    void *dx_tiles;
    atomic_int dx_busy, dx_ok;
    nv_plan_observer observe; /* sees each forward product's input first (nv_plan_observe) */
    void *observe_ctx;
};

/* ---------------------------------------------------------------- small helpers */

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }
static inline int cdiv(int a, int b) { return (a + b - 1) / b; }
static inline int rup(int a, int b) { return cdiv(a, b) * b; }

/* The engines that compute on bf16 VNNI tiles, and those on int8 ones (the same packing and
 * products, their own loop). */
static inline int bf16_tiles(nv_engine_id e) { return e == NV_ENGINE_AMX_BF16 || e == NV_ENGINE_AVX512_BF16; }
static inline int int8_tiles(nv_engine_id e) {
    return e == NV_ENGINE_AMX_INT8 || e == NV_ENGINE_AVX512_INT8 || e == NV_ENGINE_AVX2_INT8;
}
static inline const nv_kern_amx *tile_kern(nv_engine_id e) {
    return e == NV_ENGINE_AVX512_BF16   ? engine_vbf16
           : e == NV_ENGINE_AVX512_INT8 ? engine_vint8
           : e == NV_ENGINE_AVX2_INT8   ? engine_avx2int8
                                        : engine_amx;
}

static void *aalloc(size_t bytes) { return nv_alloc_large(64, bytes, 0); }
/* A plan's packed weights: kept for the plan's life, so worth huge pages. */
static void *pack_alloc(size_t bytes) { return nv_alloc_large(64, bytes, 1); }

static void run_tasks(void (*fn)(void *, int, int), void *ctx, int n) {
    if (force_inline || n <= 1)
        for (int t = 0; t < n; t++) fn(ctx, t, n);
    else
        nv_pool_run(fn, ctx, n);
}

/* Work split: rows in units of runit, columns in units of cunit (panels, tiles); a task owns one
 * block of the grid. Tiny products run as one task (the pool costs a few microseconds). */
typedef struct {
    int rows, runit, nru; /* rows, row unit, row units */
    int cols;             /* column units */
    int rt, ct;           /* row and column blocks */
} grid;

static int grid_tasks(int rows, int runit, double macs) {
    int T = force_inline ? 1 : nv_pool_threads();
    if (T > 1 && (macs >= 65536.0 || force_split))
        /* two tasks per thread balance uneven blocks; a few rows against many weights (decode)
         * split finer, so a thread held up elsewhere leaves little for the others to wait on */
        return T * (rows <= 4 * runit && macs >= 4194304.0 ? 8 : 2);
    return 1;
}

static void grid_init(grid *g, int rows, int runit, int cols) {
    g->rows = rows;
    g->runit = runit;
    g->nru = cdiv(rows, runit);
    g->cols = cols;
}

/* Columns split first: every task reads all rows of the activations, each its own weights. */
static int grid_make(grid *g, int rows, int runit, int cols, double macs) {
    const int T = grid_tasks(rows, runit, macs);
    grid_init(g, rows, runit, cols);
    g->ct = imax(1, imin(cols, T));
    g->rt = imax(1, imin(g->nru, cdiv(T, g->ct)));
    return g->rt * g->ct;
}

/* Rows split first: for a product whose row operand is the large one (dw's dy^T). */
static int grid_make_rows(grid *g, int rows, int runit, int cols, double macs) {
    const int T = grid_tasks(rows, runit, macs);
    grid_init(g, rows, runit, cols);
    g->rt = imax(1, imin(g->nru, T));
    g->ct = imax(1, imin(cols, cdiv(T, g->rt)));
    return g->rt * g->ct;
}

static void grid_task(const grid *g, int task, int *r0, int *r1, int *c0, int *c1) {
    int ci = task % g->ct, ri = task / g->ct;
    *c0 = (int)((long)g->cols * ci / g->ct);
    *c1 = (int)((long)g->cols * (ci + 1) / g->ct);
    int u0 = (int)((long)g->nru * ri / g->rt), u1 = (int)((long)g->nru * (ri + 1) / g->rt);
    *r0 = u0 * g->runit;
    *r1 = imin(g->rows, u1 * g->runit);
}

/* 8 floats -> 8 bf16, the same bits as nv_bf16_from_f32 (round to nearest even, NaN kept quiet). */
static inline __m128i bf16x8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), isnan);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08));
}

/* dst[j] = bf16(src[j] (* colscale[j])) for j < k. */
static void row_to_bf16_avx2(const float *src, const float *colscale, uint16_t *dst, int k) {
    int j = 0;
    for (; j + 8 <= k; j += 8) {
        __m256 v = _mm256_loadu_ps(src + j);
        if (colscale) v = _mm256_mul_ps(v, _mm256_loadu_ps(colscale + j));
        _mm_storeu_si128((__m128i *)(dst + j), bf16x8(v));
    }
    for (; j < k; j++) dst[j] = nv_bf16_from_f32(colscale ? src[j] * colscale[j] : src[j]);
}

/* Quantises one row: scale = max|x| / 127, q = round(x / scale) (to nearest even, as rintf and
 * cvtps2dq under the default MXCSR), each byte stored xor flip (0x80: q + 128 as u8). A NaN or
 * infinity in the row makes the scale NaN, so the row's outputs are NaN as they would be in fp32.
 * Returns the scale. */
static float row_to_int8(const float *src, int8_t *dst, int k, uint8_t flip) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps(), vnan = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= k; j += 8) {
        __m256 v = _mm256_loadu_ps(src + j);
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, absmask));
        vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8], amax = 0.0f;
    _mm256_storeu_ps(lanes, vmax);
    for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax;
    if (_mm256_movemask_ps(vnan)) amax = NAN;
    for (; j < k; j++) amax = fabsf(src[j]) > amax || src[j] != src[j] ? fabsf(src[j]) : amax;
    const int finite = isfinite(amax);
    const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127), pick = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
    for (j = 0; j + 8 <= k; j += 8) {
        __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(src + j), vinv));
        q = _mm256_max_epi32(_mm256_min_epi32(q, hi), lo); /* NaN converts to INT_MIN: -127 (the row is NaN anyway) */
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q, q), _mm256_setzero_si256());
        b = _mm256_xor_si256(b, _mm256_set1_epi8((char)flip));
        _mm_storel_epi64((__m128i *)(dst + j), _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(b, pick)));
    }
    for (; j < k; j++) {
        float v = rintf(src[j] * inv);
        dst[j] = (int8_t)((v > 127.0f ? 127 : v < -127.0f ? -127 : v == v ? (int)v : 0) ^ flip);
    }
    return finite ? amax / 127.0f : NAN;
}

/* The whole case of vnni_pair16 below: both rows, 16 columns. */
static void vnni_pair16_avx2(const float *r0, const float *r1, uint16_t *out) {
    for (int h = 0; h < 16; h += 8) {
        __m128i a = bf16x8(_mm256_loadu_ps(r0 + h)), b = bf16x8(_mm256_loadu_ps(r1 + h));
        _mm_storeu_si128((__m128i *)(out + 2 * h), _mm_unpacklo_epi16(a, b));
        _mm_storeu_si128((__m128i *)(out + 2 * h + 8), _mm_unpackhi_epi16(a, b));
    }
}

/* The conversions of activations, gradients and weights into the bf16 engines' operands: 16 at a
 * time where AVX-512 is on (nv_engines_init; the same bits either way). */
static void (*row_to_bf16_fn)(const float *, const float *, uint16_t *, int) = row_to_bf16_avx2;
static void (*vnni_pair16_fn)(const float *, const float *, uint16_t *) = vnni_pair16_avx2;

static inline void row_to_bf16(const float *src, const float *colscale, uint16_t *dst, int k) { row_to_bf16_fn(src, colscale, dst, k); }

/* 16 columns of two rows into VNNI pairs: out[2c + e] = bf16(row_e[c]); a NULL row or the columns
 * at and past nc are zero. */
static void vnni_pair16(const float *r0, const float *r1, int nc, uint16_t *out) {
    if (r0 && r1 && nc >= 16) {
        vnni_pair16_fn(r0, r1, out);
        return;
    }
    for (int c = 0; c < 16; c++) {
        out[2 * c] = r0 && c < nc ? nv_bf16_from_f32(r0[c]) : 0;
        out[2 * c + 1] = r1 && c < nc ? nv_bf16_from_f32(r1[c]) : 0;
    }
}

/* dst[c][r] = src[r][c] for an 8 x 8 block of 32-bit elements (bf16 pairs), strides in elements:
 * the float transpose's register shuffles, which move bits untouched. */
static inline void tr8x8_u32(const uint32_t *src, size_t lss, uint32_t *dst, size_t ldd) {
    __m256 r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps((const float *)(src + i * lss));
    nv_tr8x8_ps(r);
    for (int i = 0; i < 8; i++) _mm256_storeu_ps((float *)(dst + i * ldd), r[i]);
}

static void fill_nan(float *y, size_t count) {
    for (size_t i = 0; i < count; i++) y[i] = NAN;
}

/* ---------------------------------------------------------------- engines */

const char *nv_engine_name(nv_engine_id e) { return (unsigned)e < NV_ENGINE_COUNT ? engine_names[e] : "?"; }

nv_err nv_engine_parse(const char *name, nv_engine_id *out) {
    for (int i = 0; i < NV_ENGINE_COUNT; i++)
        if (strcmp(name, engine_names[i]) == 0) {
            *out = (nv_engine_id)i;
            return NV_OK;
        }
    return nv_fail(NV_EINVAL, "unknown engine '%s' (known: scalar, avx2, avx512, avx512-bf16, amx-bf16, avx2-int8, avx512-int8, amx-int8)",
                   name);
}

static void engine_latch(nv_engine_id e, const char *why) {
    engine_on[e] = 0;
    snprintf(engine_why[e], sizeof engine_why[e], "%s", why);
}

int nv_engine_available(nv_engine_id e) { return (unsigned)e < NV_ENGINE_COUNT && engine_on[e]; }
const char *nv_engine_why_off(nv_engine_id e) { return (unsigned)e < NV_ENGINE_COUNT ? engine_why[e] : "?"; }

nv_engine_id nv_engine_next_down(nv_engine_id e) { return e == NV_ENGINE_SCALAR ? e : (nv_engine_id)(e - 1); }

nv_engine_id nv_engine_best(void) {
    for (int e = NV_ENGINE_COUNT - 1; e > 0; e--)
        if (engine_on[e]) return (nv_engine_id)e;
    return NV_ENGINE_SCALAR;
}

int nv_engine_low_precision(nv_engine_id e) { return e >= NV_ENGINE_AVX512_BF16 && e < NV_ENGINE_COUNT; }

int nv_engine_int8(nv_engine_id e) { return int8_tiles(e); }

nv_engine_id nv_engine_bf16_of(nv_engine_id e) {
    return e == NV_ENGINE_AMX_INT8 ? NV_ENGINE_AMX_BF16 : int8_tiles(e) ? NV_ENGINE_AVX512_BF16 : e;
}

nv_engine_id nv_engine_best_float(void) {
    for (int e = NV_ENGINE_COUNT - 1; e > 0; e--)
        if (engine_on[e] && !int8_tiles((nv_engine_id)e)) return (nv_engine_id)e;
    return NV_ENGINE_SCALAR;
}

nv_engine_id nv_engine_best_fp32(void) {
    for (int e = NV_ENGINE_AVX512; e > 0; e--)
        if (engine_on[e]) return (nv_engine_id)e;
    return NV_ENGINE_SCALAR;
}

static nv_engine_id engine_resolve(nv_engine_id e) {
    if ((unsigned)e >= NV_ENGINE_COUNT) e = NV_ENGINE_SCALAR;
    while (e > NV_ENGINE_SCALAR && !nv_engine_available(e)) e = nv_engine_next_down(e); /* scalar: always there */
    return e;
}

void nv_engines_set_emulation(int on) { emulate = on; }
int nv_engines_emulated(void) { return emulate; }

void nv_engines_reset(void) {
    engines_ready = 0;
    for (int e = 0; e < NV_ENGINE_COUNT; e++) {
        engine_on[e] = 0;
        engine_why[e][0] = '\0';
    }
}

/* ---------------------------------------------------------------- packing */

typedef struct {
    nv_plan *p;
    const float *w;
    const nv_qweights *qw; /* block-quantized plans */
    int u0, u1;            /* the panels (amx: column tiles) to pack */
} pack_ctx;

/* Task's share of the panels u0..u1-1. */
static void pack_range(const pack_ctx *c, int task, int nt, int *lo, int *hi) {
    const long span = c->u1 - c->u0;
    *lo = c->u0 + (int)(span * task / nt);
    *hi = c->u0 + (int)(span * (task + 1) / nt);
}

/* Runs a packing task over the plan's panels, split over the pool when the matrix is large. */
static void pack_run(void (*fn)(void *, int, int), pack_ctx *c) {
    int tasks = 1;
    if (!force_inline && nv_pool_threads() > 1 && (double)c->p->n * c->p->k >= 65536.0)
        tasks = imin(c->p->np, 2 * nv_pool_threads());
    run_tasks(fn, c, tasks);
}

/* fp32 panels: P[p][kk][c] = W[p*nr + c][kk]. */
/* Panels p0..p1-1 of nr outputs of W (n rows of k, row stride ldw) at dst + p * k * nr, zero past n. */
static void fp32_panels_of_rows(const float *w, size_t ldw, int n, int k, int nr, int p0, int p1, float *dst) {
    for (int pi = p0; pi < p1; pi++) {
        float *d = dst + (size_t)pi * k * nr;
        const int rows = imin(nr, n - pi * nr); /* outputs of this panel; the rest are zero */
        for (int k0 = 0; k0 < k; k0 += 256)
            nv_transpose(w + (size_t)pi * nr * ldw + k0, ldw, rows, imin(256, k - k0), d + (size_t)k0 * nr, nr);
        if (rows < nr)
            for (int kk = 0; kk < k; kk++) memset(d + (size_t)kk * nr + rows, 0, (size_t)(nr - rows) * sizeof(float));
    }
}

static void pack_fp32_task(void *vc, int task, int nt) {
    pack_ctx *c = vc;
    const nv_plan *p = c->p;
    int p0, p1;
    pack_range(c, task, nt, &p0, &p1);
    fp32_panels_of_rows(c->w, (size_t)p->k, p->n, p->k, p->kf->nr, p0, p1, (float *)p->pack);
}

/* bf16 VNNI tiles: tile (t, kb), row i, column c, pair e holds W[t*16 + c][kb*32 + 2i + e].
 * A tile is a 16 x 16 matrix of 32-bit pairs, (i, c) = W[c][2i..2i+1]: the 16 rows' 32 depths are
 * made bf16 (8 at a time) and the matrix of pairs transposed in 8 x 8 blocks. Every optimizer step
 * refreshes every plan this way, so it is vectorised like the fp32 panels' packing. */
/* Column tiles t0..t1-1 of W (n rows of k, row stride ldw) as bf16 VNNI tiles of KB depth blocks
 * (zero past n and k) at dst + t * KB * 512. */
static void bf16_tiles_of_rows(const float *w, size_t ldw, int n, int k, int KB, int t0, int t1, uint16_t *dst) {
    uint32_t rows[16][16] __attribute__((aligned(32))); /* [c][i]: W[t*16 + c][kb*32 + 2i .. 2i+1] */
    for (int t = t0; t < t1; t++) {
        uint32_t *tiles = (uint32_t *)(dst + (size_t)t * KB * 512);
        const int valid = imin(16, n - t * 16); /* outputs of this tile; the rest are zero */
        for (int kb = 0; kb < KB; kb++) {
            const int d = imax(0, imin(32, k - kb * 32)); /* depths of this block inside W */
            for (int cc = 0; cc < 16; cc++) {
                uint16_t *r = (uint16_t *)rows[cc];
                const int dv = cc < valid ? d : 0;
                if (dv) row_to_bf16(w + (size_t)(t * 16 + cc) * ldw + (size_t)kb * 32, NULL, r, dv);
                memset(r + dv, 0, (size_t)(32 - dv) * sizeof(uint16_t));
            }
            uint32_t *tile = tiles + (size_t)kb * 256;
            for (int i0 = 0; i0 < 16; i0 += 8)
                for (int c0 = 0; c0 < 16; c0 += 8) tr8x8_u32(&rows[c0][i0], 16, tile + i0 * 16 + c0, 16);
        }
    }
}

/* The dx tiles (dx_tile's layout: tile (t, kb) at (t * KB + kb) * 512, KB = depth blocks of 32
 * outputs; row i, column c, pair e = W[kb*32 + 2i + e][t*16 + c]) of the outputs of column tiles
 * t0..t1-1 (16 rows each: half of a depth block), from W's fp32 rows: the same bf16 values as the
 * forward tiles hold. Rows past n stay as they are (zero since the buffer was built). */
static void dx_tiles_of_rows(const float *w, int n, int k, int t0, int t1, uint16_t *U) {
    const int KB = rup(n, 32) / 32, ktiles = cdiv(k, 16);
    for (int t = t0; t < t1; t++) {
        const int kb = t / 2, i0 = (t % 2) * 8, pairs = imin(8, (n - t * 16 + 1) / 2); /* pairs past n stay zero */
        for (int ct = 0; ct < ktiles; ct++) /* a tile's rows written together: 512 bytes in a row */
            for (int j = 0; j < pairs; j++) {
                const int o = t * 16 + 2 * j;
                const float *r0 = w + (size_t)o * k, *r1 = o + 1 < n ? w + (size_t)(o + 1) * k : NULL;
                vnni_pair16(r0 + ct * 16, r1 ? r1 + ct * 16 : NULL, k - ct * 16, U + ((size_t)ct * KB + kb) * 512 + (size_t)(i0 + j) * 32);
            }
    }
}

static void pack_bf16_task(void *vc, int task, int nt) {
    pack_ctx *c = vc;
    nv_plan *p = (nv_plan *)c->p;
    int t0, t1;
    pack_range(c, task, nt, &t0, &t1);
    bf16_tiles_of_rows(c->w, (size_t)p->k, p->n, p->k, p->kp / 32, t0, t1, (uint16_t *)p->pack);
    if (atomic_load(&p->dx_ok)) dx_tiles_of_rows(c->w, p->n, p->k, t0, t1, p->dx_tiles);
}

/* int8 VNNI tiles with per-output-channel scales: scale = max|W[row]| / 127,
 * q = round(W / scale) in [-127, 127]; tile (t, kb), row i, column c, quad e holds
 * q[t*16 + c][kb*64 + 4i + e]; wcomp[row] = -128 * sum q[row] (unsigned arithmetic: it wraps as
 * the kernels' int32 sums do). */
static void pack_int8_task(void *vc, int task, int nt) {
    pack_ctx *c = vc;
    const nv_plan *p = c->p;
    const int n = p->n, k = p->k, KB = p->kp / 64;
    int t0, t1;
    pack_range(c, task, nt, &t0, &t1);
    for (int t = t0; t < t1; t++) {
        int8_t *tile = (int8_t *)p->pack + (size_t)t * KB * 1024;
        for (int cc = 0; cc < 16; cc++) {
            int row = t * 16 + cc;
            const float *src = row < n ? c->w + (size_t)row * k : NULL;
            float amax = 0.0f;
            if (src)
                for (int kk = 0; kk < k; kk++) amax = fabsf(src[kk]) > amax || src[kk] != src[kk] ? fabsf(src[kk]) : amax;
            /* a NaN or infinity makes the channel's scale NaN: its outputs are NaN, as in fp32 */
            int finite = isfinite(amax);
            float scale = finite ? amax / 127.0f : NAN, inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
            p->wscale[row] = scale;
            uint32_t sum = 0;
            for (int kk = 0; kk < p->kp; kk++) {
                int q = 0;
                if (src && kk < k) {
                    float v = rintf(src[kk] * inv);
                    q = v > 127.0f ? 127 : v < -127.0f ? -127 : v == v ? (int)v : 0;
                }
                tile[(size_t)(kk / 64) * 1024 + ((kk % 64) / 4) * 64 + cc * 4 + (kk % 4)] = (int8_t)q;
                sum += (uint32_t)q;
            }
            if (p->wcomp) p->wcomp[row] = (int32_t)(0u - 128u * sum);
        }
    }
}

static void (*pack_fn(const nv_plan *p))(void *, int, int) {
    switch (p->engine) {
    case NV_ENGINE_AVX2:
    case NV_ENGINE_AVX512: return pack_fp32_task;
    case NV_ENGINE_AVX512_BF16:
    case NV_ENGINE_AMX_BF16: return pack_bf16_task;
    case NV_ENGINE_AVX2_INT8:
    case NV_ENGINE_AVX512_INT8:
    case NV_ENGINE_AMX_INT8: return pack_int8_task;
    default: return NULL;
    }
}

static void plan_pack(nv_plan *p, const float *w) {
    if (p->engine == NV_ENGINE_SCALAR) {
        p->w = w;
        return;
    }
    pack_ctx c = {p, w, NULL, 0, p->np};
    if (pack_fn(p)) pack_run(pack_fn(p), &c);
}

/* A zeroed plan of shape n x k on engine e (the shape already checked positive). */
static nv_err plan_new(nv_plan **out, nv_engine_id e, int n, int k) {
    if ((size_t)n * (size_t)k > ((size_t)1 << 40)) return nv_fail(NV_ENOMEM, "plan: %d x %d is too large", n, k);
    nv_plan *p = calloc(1, sizeof *p);
    if (!p) return nv_fail(NV_ENOMEM, "plan: out of memory");
    p->engine = e;
    p->n = n;
    p->k = k;
    *out = p;
    return NV_OK;
}

static nv_err plan_build_on(nv_plan **out, nv_engine_id e, const float *w, int n, int k) {
    if (n <= 0 || k <= 0) return nv_fail(NV_EINVAL, "plan: bad shape %d x %d", n, k);
    if (!w) return nv_fail(NV_EINVAL, "plan: no weights");
    nv_plan *p;
    NV_TRY(plan_new(&p, e, n, k));
    switch (e) {
    case NV_ENGINE_AVX2:
    case NV_ENGINE_AVX512:
        p->kf = engine_fp32[e];
        p->np = cdiv(n, p->kf->nr);
        p->pack_bytes = (size_t)p->np * p->kf->nr * k * sizeof(float);
        break;
    case NV_ENGINE_AVX512_BF16:
    case NV_ENGINE_AMX_BF16:
        p->ka = tile_kern(e);
        p->np = cdiv(n, 16);
        p->kp = rup(k, NV_AMX_BF16_DEPTH);
        p->pack_bytes = (size_t)p->np * 16 * p->kp * 2;
        break;
    case NV_ENGINE_AVX2_INT8:
    case NV_ENGINE_AVX512_INT8:
    case NV_ENGINE_AMX_INT8:
        p->ka = tile_kern(e);
        p->np = cdiv(n, 16);
        p->kp = rup(k, NV_AMX_INT8_DEPTH);
        p->pack_bytes = (size_t)p->np * 16 * p->kp;
        p->wscale = calloc((size_t)p->np * 16, sizeof(float));
        if (p->ka->int8_unsigned) p->wcomp = calloc((size_t)p->np * 16, sizeof(int32_t));
        if (!p->wscale || (p->ka->int8_unsigned && !p->wcomp)) {
            free(p->wscale);
            free(p->wcomp);
            free(p);
            return nv_fail(NV_ENOMEM, "plan: out of memory");
        }
        break;
    default: break;
    }
    if (p->pack_bytes && !(p->pack = pack_alloc(p->pack_bytes))) {
        size_t bytes = p->pack_bytes;
        free(p->wscale);
        free(p->wcomp);
        free(p);
        return nv_fail(NV_ENOMEM, "plan: out of memory for %zu bytes of packed weights", bytes);
    }
    plan_pack(p, w);
    *out = p;
    return NV_OK;
}

nv_err nv_plan_build(nv_plan **out, nv_engine_id want, const float *w, int n, int k) {
    if (!engines_ready) NV_TRY(nv_engines_init(NULL, 0));
    nv_engine_id e = engine_resolve(want);
    if (int8_tiles(e) && k > INT8_MAX_K) { /* the next floating-point rung that is on */
        while (int8_tiles(e)) e = nv_engine_next_down(e);
        e = engine_resolve(e);
    }
    NV_TRY(plan_build_on(out, e, w, n, k));
    atomic_fetch_add(&plan_build_count, 1);
    return NV_OK;
}

void nv_plan_refresh(nv_plan *p, const float *w) {
    if (p->quant) { /* inference-only: its values came from a quantized file, not from fp32 weights */
        nv_warn("plan: a block-quantized plan cannot be refreshed from fp32 weights; left as it is");
        return;
    }
    plan_pack(p, w);
}

int nv_plan_row_unit(const nv_plan *p) {
    return p->engine == NV_ENGINE_SCALAR ? 1 : p->kf ? p->kf->nr : 16; /* fp32 panels, else amx column tiles */
}

void nv_plan_refresh_rows(nv_plan *p, const float *w, int r0, int r1) {
    if (p->quant) { /* as nv_plan_refresh */
        nv_warn("plan: a block-quantized plan cannot be refreshed from fp32 weights; left as it is");
        return;
    }
    if (p->engine == NV_ENGINE_SCALAR) { /* reads the weights in place: the piece holding row 0 takes the
                                            pointer, so pieces refreshed at once do not all write it */
        if (r0 <= 0) p->w = w;
        return;
    }
    const int unit = nv_plan_row_unit(p);
    pack_ctx c = {p, w, NULL, imax(0, r0) / unit, cdiv(imin(r1, p->n), unit)};
    if (c.u0 < c.u1 && pack_fn(p)) pack_fn(p)(&c, 0, 1);
}

nv_engine_id nv_plan_engine(const nv_plan *p) { return p->engine; }
int nv_plan_n(const nv_plan *p) { return p->n; }
int nv_plan_k(const nv_plan *p) { return p->k; }
long nv_plan_builds(void) { return atomic_load(&plan_build_count); }

size_t nv_plan_packed_bytes(const nv_plan *p) {
    if (p->engine == NV_ENGINE_SCALAR) return (size_t)p->n * p->k * sizeof(float);
    if (p->qdot) return p->pack_bytes; /* values, scales and offsets */
    if (p->quant)
        return p->pack_bytes + (p->qscale ? (size_t)p->np * cdiv(p->k, p->qb) * p->kf->nr * sizeof(float) * (p->qoff ? 2 : 1) : 0);
    return p->pack_bytes + (p->wscale ? (size_t)p->n * sizeof(float) : 0) + (p->wcomp ? (size_t)p->n * sizeof(int32_t) : 0);
}

int nv_plan_quantized(const nv_plan *p) { return p->quant ? p->bits : 0; }

void nv_plan_free(nv_plan *p) {
    if (!p) return;
    free(p->pack);
    free(p->wscale);
    free(p->wcomp);
    free(p->qscale);
    free(p->qoff);
    free(p->dx_tiles);
    free(p);
}

/* ---------------------------------------------------------------- block-quantized plans */

/* Q[p][kk][c] = q[(p*nr + c)*k + kk] (4-bit panels: byte kk*nr/2 + c holds c and c + nr/2; fp16
 * and bf16 panels: h in place of q); S, O [p][b][c] = s, o[(p*nr + c)*nb + b]; zero past the last output. */
static void pack_quant_task(void *vc, int task, int nt) {
    pack_ctx *c = vc;
    const nv_plan *p = c->p;
    const nv_qweights *w = c->qw;
    const int nr = p->kf->nr, n = p->n, k = p->k, nb = cdiv(k, p->qb);
    int p0, p1;
    pack_range(c, task, nt, &p0, &p1);
    const int qw = (int)NV_QPANEL_BYTES(nr, p->bits); /* bytes per depth */
    for (int pi = p0; pi < p1; pi++) {
        int8_t *dq = (int8_t *)p->pack + (size_t)pi * k * qw;
        if (w->h) { /* fp16 or bf16 panels: H[p][kk][c] = h[(p*nr + c)*k + kk], zero past the last output */
            uint16_t *dh = (uint16_t *)dq;
            for (int cc = 0; cc < nr; cc++) {
                const int j = pi * nr + cc;
                for (int kk = 0; kk < k; kk++) dh[(size_t)kk * nr + cc] = j < n ? w->h[(size_t)j * k + kk] : 0;
            }
            continue;
        }
        float *ds = p->qscale + (size_t)pi * nb * nr, *dof = p->qoff ? p->qoff + (size_t)pi * nb * nr : NULL;
        if (p->bits == 4) memset(dq, 0, (size_t)k * qw);
        for (int cc = 0; cc < nr; cc++) {
            const int j = pi * nr + cc;
            const int8_t *q = j < n ? w->q + (size_t)j * k : NULL;
            if (p->bits == 8)
                for (int kk = 0; kk < k; kk++) dq[(size_t)kk * nr + cc] = q ? q[kk] : 0;
            else if (q)
                for (int kk = 0; kk < k; kk++)
                    dq[(size_t)kk * qw + cc % qw] |= (int8_t)(uint8_t)(q[kk] << (cc < qw ? 0 : 4));
            for (int b = 0; b < nb; b++) {
                ds[(size_t)b * nr + cc] = j < n ? w->s[(size_t)j * nb + b] : 0.0f;
                if (dof) dof[(size_t)b * nr + cc] = j < n ? w->o[(size_t)j * nb + b] : 0.0f;
            }
        }
    }
}

int nv_qweights_four_bit(const int8_t *q, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (q[i] < 0 || q[i] > 15) return 0;
    return 1;
}

/* The depth block of a block-quantized matrix's integer dot products: 32 or 16 (a block of qb cut
 * into equal pieces that keep its scale and offset), 0 when qb is a multiple of neither. */
static int qdot_kq(int qb) { return qb % 32 == 0 ? 32 : qb % 16 == 0 ? 16 : 0; }

/* Block kb of column tile t of a qdot plan's values into dq (kern.h's nv_qdot_b), zero past the last
 * output and past k. */
static void pack_qdot_values(uint8_t *dq, const nv_plan *p, const nv_qweights *w, int t, int kb) {
    const int n = p->n, k = p->k, kq = p->kq, four = p->bits == 4;
    memset(dq, four ? 0 : 0x80, (size_t)kq * (four ? 8 : 16)); /* value 0 (8-bit ones stored + 128) */
    for (int cc = 0; cc < 16 && t * 16 + cc < n; cc++) {
        const int8_t *q = w->q + (size_t)(t * 16 + cc) * k;
        for (int d = 0; d < kq && kb * kq + d < k; d++) {
            const int v = q[kb * kq + d];
            if (four) /* row d / 8: depths 0-3 of the eight in the low nibbles, 4-7 in the high ones */
                dq[(d / 8) * 64 + cc * 4 + d % 4] |= (uint8_t)(v << (d % 8 < 4 ? 0 : 4));
            else
                dq[(d / 4) * 64 + cc * 4 + d % 4] = (uint8_t)(v + 128);
        }
    }
}

/* Column tiles t0..t1-1 of a qdot plan: values, and float scales and offsets per block or integer
 * ones per block with floats per super-block (p->qsub), zero past the last output. */
static void pack_qdot_task(void *vc, int task, int nt) {
    pack_ctx *c = vc;
    const nv_plan *p = c->p;
    const nv_qweights *w = c->qw;
    const int n = p->n, k = p->k, kq = p->kq, nb = cdiv(k, kq), nbw = cdiv(k, w->qb), four = p->bits == 4, sub = p->qsub;
    const size_t qbytes = (size_t)kq * (four ? 8 : 16), bs = nv_qdot_block_bytes(kq, four, p->qoffsets);
    int t0, t1;
    pack_range(c, task, nt, &t0, &t1);
    for (int t = t0; t < t1; t++) {
        if (sub) { /* blocks are the weights' own (kq == qb) and rows whole super-blocks */
            const int nsb = nb / sub;
            const size_t sbs = nv_qdot_super_bytes(kq, four, p->qoffsets, sub), ints = (size_t)sub * qbytes;
            for (int sb = 0; sb < nsb; sb++) {
                uint8_t *base = (uint8_t *)p->pack + ((size_t)t * nsb + sb) * sbs;
                int8_t *isc = (int8_t *)(base + ints), *imn = p->qoffsets ? isc + sub * 16 : NULL;
                float *d = (float *)(void *)(base + nv_qdot_super_floats(kq, four, p->qoffsets, sub)), *dm = d + 16;
                for (int j = 0; j < sub; j++) pack_qdot_values(base + (size_t)j * qbytes, p, w, t, sb * sub + j);
                for (int cc = 0; cc < 16; cc++) {
                    const int row = t * 16 + cc, in = row < n;
                    const size_t b0 = (size_t)row * nb + (size_t)sb * sub, s0 = (size_t)row * nsb + (size_t)sb;
                    for (int j = 0; j < sub; j++) {
                        isc[j * 16 + cc] = in ? w->sub_s[b0 + (size_t)j] : 0;
                        if (imn) imn[j * 16 + cc] = in ? w->sub_o[b0 + (size_t)j] : 0;
                    }
                    d[cc] = in ? w->sup_s[s0] : 0.0f;
                    if (imn) dm[cc] = in ? w->sup_o[s0] : 0.0f;
                }
            }
            continue;
        }
        for (int kb = 0; kb < nb; kb++) {
            uint8_t *dq = (uint8_t *)p->pack + ((size_t)t * nb + kb) * bs;
            float *ds = (float *)(void *)(dq + qbytes), *dof = p->qoffsets ? ds + 16 : NULL;
            pack_qdot_values(dq, p, w, t, kb);
            for (int cc = 0; cc < 16; cc++) {
                const int j = t * 16 + cc;
                const size_t wb = (size_t)j * nbw + (size_t)kb * kq / w->qb; /* the source block holding this piece */
                ds[cc] = j < n ? w->s[wb] : 0.0f;
                if (dof) dof[cc] = j < n ? w->o[wb] : 0.0f;
            }
        }
    }
}

/* 1 when w's optional integer form of its scales (and offsets, unless folded) holds exactly for
 * every one of its blocks (engine.h's nv_qweights.sub) and fits a qdot plan: blocks of kq, rows whole
 * super-blocks. Not trusted: a form that does not multiply out to s and o is not used. */
static int qdot_super(const nv_qweights *w, int n, int k, int folded) {
    if (w->sub < 1 || w->sub > 16 || !w->sub_s || !w->sup_s || qdot_kq(w->qb) != w->qb || k % (w->qb * w->sub) ||
        (w->o && !folded && (!w->sub_o || !w->sup_o)))
        return 0;
    const size_t blocks = (size_t)n * (size_t)(k / w->qb);
    for (size_t b = 0; b < blocks; b++) {
        if (w->sup_s[b / (size_t)w->sub] * (float)w->sub_s[b] != w->s[b]) return 0;
        if (w->o && !folded && w->sup_o[b / (size_t)w->sub] * (float)w->sub_o[b] != w->o[b]) return 0;
    }
    return 1;
}

/* Plan p's operand for the kernel from column tile t0 on (kern.h's nv_qdot_b; q NULL before packing). */
static nv_qdot_b qdot_operand(const nv_plan *p, int t0) {
    nv_qdot_b b = {NULL, cdiv(p->k, p->kq), p->kq, p->bits == 4, p->qoffsets, p->qbias, p->has_lut ? p->qlut : NULL, p->qsub};
    if (p->pack) b.q = (const uint8_t *)p->pack + (size_t)t0 * nv_qdot_tile_bytes(&b);
    return b;
}

/* 1 with *c when every offset of w is c times its block's scale for one integer c (Q4_0: -8, Q5_0:
 * -16), which the integer sums can then take (kern.h's nv_qdot_b.bias); 0 otherwise. */
static int qdot_fold(const nv_qweights *w, size_t blocks, int *c) {
    float cf = 0.0f;
    int have = 0;
    for (size_t i = 0; i < blocks; i++) {
        if (w->s[i] == 0.0f) {
            if (w->o[i] != 0.0f) return 0;
            continue;
        }
        if (!have) {
            cf = w->o[i] / w->s[i];
            if (!(cf == rintf(cf) && fabsf(cf) <= 128.0f)) return 0;
            have = 1;
        }
        if (w->o[i] != cf * w->s[i]) return 0;
    }
    *c = (int)cf;
    return 1;
}

/* A qdot plan on int8 engine e (its kernel has qdot_gemm; w's qb a multiple of 16). */
static nv_err qdot_build_on(nv_plan **out, nv_engine_id e, const nv_qweights *w, int n, int k) {
    nv_plan *p;
    NV_TRY(plan_new(&p, e, n, k));
    p->ka = tile_kern(e);
    p->np = cdiv(n, 16);
    p->quant = p->qdot = 1;
    p->qb = w->qb;
    p->kq = qdot_kq(w->qb);
    p->bits = nv_qweights_four_bit(w->q, (size_t)n * k) ? 4 : 8;
    if (w->lut && (p->bits != 4 || p->kq != 32)) {
        nv_plan_free(p);
        return nv_fail(NV_EINVAL, "plan: table indices must be 0..15 in blocks of 32");
    }
    int fold = 0;
    p->qoffsets = w->o && !qdot_fold(w, (size_t)n * cdiv(k, w->qb), &fold);
    p->qsub = qdot_super(w, n, k, w->o && !p->qoffsets) ? w->sub : 0;
    p->has_lut = w->lut != NULL; /* indices packed as 4-bit values, the table's values + 128 looked up */
    for (int i = 0; p->has_lut && i < 16; i++) p->qlut[i] = (uint8_t)(w->lut[i] + 128);
    p->qbias = (p->bits == 4 && !p->has_lut ? 0 : -128) + fold;
    const nv_qdot_b shape = qdot_operand(p, 0);
    p->pack_bytes = (size_t)p->np * nv_qdot_tile_bytes(&shape);
    if (!(p->pack = pack_alloc(p->pack_bytes))) {
        nv_plan_free(p);
        return nv_fail(NV_ENOMEM, "plan: out of memory for %d x %d block-quantized weights", n, k);
    }
    pack_ctx c = {p, NULL, w, 0, p->np};
    pack_run(pack_qdot_task, &c);
    *out = p;
    return NV_OK;
}

/* The int8 engine a block-quantized plan asked of int8 engine e runs its integer dot products on:
 * e's vector loop (amx-int8: avx512-int8's, as tiles cannot scale each block of 16 or 32 depths),
 * or NV_ENGINE_COUNT when none is on or qb does not fit. */
static nv_engine_id qdot_loop(nv_engine_id e) {
    if (e == NV_ENGINE_AMX_INT8) e = engine_resolve(NV_ENGINE_AVX512_INT8);
    return int8_tiles(e) && e != NV_ENGINE_AMX_INT8 && tile_kern(e) && tile_kern(e)->qdot_gemm ? e : NV_ENGINE_COUNT;
}
static nv_engine_id qdot_engine(nv_engine_id e, const nv_qweights *w, int k) {
    if (!int8_tiles(e) || !w || w->h || !w->q || !w->s || !qdot_kq(w->qb) || w->qb > k || (w->lut && qdot_kq(w->qb) != 32))
        return NV_ENGINE_COUNT;
    return qdot_loop(e);
}

int nv_engine_int8_blocks(nv_engine_id e) {
    if (!engines_ready && nv_engines_init(NULL, 0) != NV_OK) return 0;
    e = engine_resolve(e);
    return int8_tiles(e) && qdot_loop(e) != NV_ENGINE_COUNT;
}

nv_err nv_plan_build_quant(nv_plan **out, nv_engine_id want, const nv_qweights *w, int n, int k) {
    *out = NULL;
    if (!engines_ready) NV_TRY(nv_engines_init(NULL, 0));
    nv_engine_id e = engine_resolve(want);
    const nv_engine_id qe = n > 0 && k > 0 ? qdot_engine(e, w, k) : NV_ENGINE_COUNT;
    if (qe != NV_ENGINE_COUNT) {
        NV_TRY(qdot_build_on(out, qe, w, n, k));
        atomic_fetch_add(&plan_build_count, 1);
        return NV_OK;
    }
    /* the vector bf16 engine, and the vector int8 ones for blocks their loop cannot take, read
       block-quantized values as they are on avx512 where it is on, else avx2 (no more bytes than their
       own int8 or bf16 copy, exact, no requantising); fp16 and bf16 values are as many bytes as bf16
       tiles and twice int8's: those engines make their own */
    if (!(w && w->h) && (e == NV_ENGINE_AVX512_BF16 || e == NV_ENGINE_AVX512_INT8 || e == NV_ENGINE_AVX2_INT8))
        e = engine_resolve(NV_ENGINE_AVX512);
    if (e != NV_ENGINE_AVX2 && e != NV_ENGINE_AVX512)
        return nv_fail(NV_EUNSUPPORTED, "plan: %s weights run on avx2 or avx512, not %s",
                       w && w->h ? "fp16 and bf16" : "block-quantized", engine_names[e]);
    if (n <= 0 || k <= 0 || !w || (!w->h && (!w->q || !w->s || w->qb < 1 || w->qb > k)))
        return nv_fail(NV_EINVAL, "plan: bad block-quantized weights (%d x %d, blocks of %d)", n, k, w ? w->qb : 0);
    const int four = !w->h && nv_qweights_four_bit(w->q, (size_t)n * k);
    if (w->lut && !w->h && !four) return nv_fail(NV_EINVAL, "plan: table indices must be 0..15");
    if (w->lut && !w->h && !engine_fp32[e]->lut4) { /* a kernel without lookups takes the table's values, looked up here */
        const size_t count = (size_t)n * k;
        int8_t *vals = malloc(count);
        if (!vals) return nv_fail(NV_ENOMEM, "plan: out of memory for %d x %d block-quantized weights", n, k);
        for (size_t i = 0; i < count; i++) vals[i] = w->lut[w->q[i]];
        nv_qweights wv = *w;
        wv.q = vals, wv.lut = NULL;
        const nv_err err = nv_plan_build_quant(out, e, &wv, n, k);
        free(vals);
        return err;
    }
    nv_plan *p;
    NV_TRY(plan_new(&p, e, n, k));
    p->kf = engine_fp32[e];
    p->np = cdiv(n, p->kf->nr);
    p->quant = 1;
    p->qb = w->h ? k : w->qb;
    /* 4-bit panels when the values allow (Q4_0, Q4_1, Q4_K, Q3_K, Q2_K; IQ4's indices, looked up in
       registers as the slices are made): half the bytes to stream */
    p->bits = w->h ? (w->h_bf16 ? NV_QBITS_BF16 : 16) : four ? 4 : 8;
    p->has_lut = !w->h && w->lut;
    for (int i = 0; p->has_lut && i < 16; i++) p->flut[i] = (float)w->lut[i];
    p->pack_bytes = (size_t)p->np * k * NV_QPANEL_BYTES(p->kf->nr, p->bits);
    const size_t ns = (size_t)p->np * cdiv(k, p->qb) * p->kf->nr;
    p->pack = pack_alloc(p->pack_bytes);
    if (!w->h) { /* fp16 and bf16 weights have no scales or offsets */
        p->qscale = pack_alloc(ns * sizeof(float));
        if (w->o) p->qoff = pack_alloc(ns * sizeof(float));
    }
    if (!p->pack || (!w->h && (!p->qscale || (w->o && !p->qoff)))) {
        nv_plan_free(p);
        return nv_fail(NV_ENOMEM, "plan: out of memory for %d x %d block-quantized weights", n, k);
    }
    pack_ctx c = {p, NULL, w, 0, p->np};
    pack_run(pack_quant_task, &c);
    atomic_fetch_add(&plan_build_count, 1);
    *out = p;
    return NV_OK;
}

/* ---------------------------------------------------------------- scalar engine */

typedef struct {
    const nv_plan *p;
    const nv_kern_fp32 *kf; /* dw: the engine's kernels (no plan) */
    const nv_kern_amx *ka;
    const float *a, *b; /* run: x; dx: dy; dw: dy, x */
    float *out;
    int m, n, k;
    grid g;
    void *abuf;              /* converted activations (amx) or x packed in panels (fp32 dw) */
    size_t lda;              /* elements per row of abuf */
    int depth;               /* padded reduction length */
    const float *colscale;   /* to_bf16: per-column factor (int8 dx folds the weight scales into dy) */
    float *rowscale;         /* int8: per-row activation scales (qdot: per row and block) */
    float *xsum;             /* qdot: per row and block, the activations' exact sum ... */
    int32_t *qsum;           /* ... and the sum of their quantised values */
    int accumulate;          /* dx, dw: add to the output instead of overwriting it */
    atomic_int fail;         /* a task ran out of memory and wrote NaN */
} op_ctx;

/* A task's scratch buffer, or NULL after marking the op failed and filling the task's block of the
 * output (rows r0..r1, columns col0..col0+cols clipped to k) with NaN: a failed allocation is
 * reported by the caller and never leaves silently wrong numbers behind. */
static void *task_scratch(op_ctx *c, size_t bytes, int r0, int r1, int col0, int cols) {
    void *p = aalloc(bytes);
    if (p) return p;
    atomic_store(&c->fail, 1);
    for (int r = r0; r < r1; r++) fill_nan(c->out + (size_t)r * c->k + col0, (size_t)imin(c->k - col0, cols));
    return NULL;
}

/* y = x . W^T: left-to-right fp32 sums, the exact arithmetic of llama2.c's matmul. */
static void scalar_run_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    int r0, r1, c0, c1;
    grid_task(&c->g, task, &r0, &r1, &c0, &c1);
    const int n = c->n, k = c->k;
    for (int r = r0; r < r1; r++) {
        const float *xr = c->a + (size_t)r * k;
        float *yr = c->out + (size_t)r * n;
        for (int i = c0; i < c1; i++) {
            const float *wi = c->p->w + (size_t)i * k;
            float val = 0.0f;
            for (int j = 0; j < k; j++) val += wi[j] * xr[j];
            yr[i] = val;
        }
    }
}

/* dx = dy . W: each element summed left to right over the n outputs. */
static void scalar_dx_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    int r0, r1, c0, c1;
    grid_task(&c->g, task, &r0, &r1, &c0, &c1);
    const int n = c->n, k = c->k;
    for (int r = r0; r < r1; r++) {
        const float *dy = c->a + (size_t)r * n;
        float *dx = c->out + (size_t)r * k;
        if (!c->accumulate)
            for (int j = c0; j < c1; j++) dx[j] = 0.0f;
        for (int i = 0; i < n; i++) {
            const float d = dy[i], *wi = c->p->w + (size_t)i * k;
            for (int j = c0; j < c1; j++) dx[j] += d * wi[j];
        }
    }
}

/* dw (+)= dy^T . x: each element summed left to right over the m rows, starting from dw (or 0). */
static void scalar_dw_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    int r0, r1, c0, c1;
    grid_task(&c->g, task, &r0, &r1, &c0, &c1);
    const int n = c->n, k = c->k;
    if (!c->accumulate)
        for (int a = r0; a < r1; a++)
            for (int j = c0; j < c1; j++) c->out[(size_t)a * k + j] = 0.0f;
    for (int i = 0; i < c->m; i++) {
        const float *dy = c->a + (size_t)i * n, *x = c->b + (size_t)i * k;
        for (int a = r0; a < r1; a++) {
            const float d = dy[a];
            float *dw = c->out + (size_t)a * k;
            for (int j = c0; j < c1; j++) dw[j] += d * x[j];
        }
    }
}

/* ---------------------------------------------------------------- fp32 panel engines */

static void fp32_run_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    const nv_plan *p = c->p;
    const int nr = p->kf->nr, n = c->n, k = c->k;
    int r0, r1, c0, c1;
    grid_task(&c->g, task, &r0, &r1, &c0, &c1);
    if (r0 >= r1 || c0 >= c1) return;
    if (p->quant) {
        const size_t sb = (size_t)c0 * cdiv(k, p->qb) * nr;
        p->kf->gemm_q8(c->a + (size_t)r0 * k, k, r1 - r0, k, (const int8_t *)p->pack + (size_t)c0 * k * NV_QPANEL_BYTES(nr, p->bits), p->bits,
                       p->has_lut ? p->flut : NULL, p->qscale ? p->qscale + sb : NULL,
                       p->qoff ? p->qoff + sb : NULL, p->qb, c1 - c0, c->out + (size_t)r0 * n + (size_t)c0 * nr, n,
                       n - c0 * nr);
        return;
    }
    p->kf->gemm(c->a + (size_t)r0 * k, k, r1 - r0, k, (const float *)p->pack + (size_t)c0 * k * nr, c1 - c0,
                c->out + (size_t)r0 * n + (size_t)c0 * nr, n, n - c0 * nr, 0);
}

#define SLICE_PANELS 32 /* panels gathered at once for dx: 32 x kc x nr floats (512 KiB for avx2) */

/* dx = dy . W with the n outputs as the depth: per depth slice a0..a0+ka (ka <= kc) and group of
 * output panels, gather the slice of W^T panels, T[q][a - a0][c] = W[a][(qg + q)*nr + c], from the
 * forward panels (each nr x nr block is a transpose of a contiguous block), and run the panel kernel
 * accumulating through dx. Slicing at multiples of kc keeps the kernel's arithmetic (kern.h). */
static void fp32_dx_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    const nv_plan *p = c->p;
    const nv_kern_fp32 *kf = p->kf;
    const int nr = kf->nr, kc = kf->kc, n = c->n, k = c->k;
    int r0, r1, q0, q1;
    grid_task(&c->g, task, &r0, &r1, &q0, &q1);
    if (r0 >= r1 || q0 >= q1) return;
    float *T = task_scratch(c, (size_t)SLICE_PANELS * kc * nr * sizeof(float), r0, r1, q0 * nr, (q1 - q0) * nr);
    if (!T) return;
    const float *P = p->pack;
    for (int qg = q0; qg < q1; qg += SLICE_PANELS) {
        const int g = imin(SLICE_PANELS, q1 - qg);
        for (int a0 = 0; a0 < n; a0 += kc) {
            const int ka = imin(kc, n - a0);
            for (int q = 0; q < g; q++) {
                const int j0 = (qg + q) * nr, jv = imin(nr, k - j0); /* valid columns of this panel */
                float *dst = T + (size_t)q * ka * nr;
                for (int a = a0; a < a0 + ka; a += nr) {
                    /* block: src[j][c2] = W[a + c2][j0 + j] (contiguous nr x nr), dst[c2][j] */
                    const float *src = P + ((size_t)(a / nr) * k + j0) * nr;
                    const int av = imin(nr, a0 + ka - a);
                    float *d = dst + (size_t)(a - a0) * nr;
                    nv_transpose(src, nr, jv, av, d, nr);
                    if (jv < nr)
                        for (int c2 = 0; c2 < av; c2++)
                            for (int j = jv; j < nr; j++) d[(size_t)c2 * nr + j] = 0.0f;
                }
            }
            kf->gemm(c->a + (size_t)r0 * n + a0, n, r1 - r0, ka, T, g, c->out + (size_t)r0 * k + (size_t)qg * nr, k, k - qg * nr,
                     a0 > 0 || c->accumulate);
        }
    }
    free(T);
}

/* x's columns as the depth slices of dw's panels, [slice][panel][i][c] = x[slice*kc + i][panel*nr + c]
 * (zero past column k): per depth slice the panels lie back to back, as the panel kernel reads them. */
/* One source row of n values into the same row of every nr-wide panel (zero past n), the panels
 * step floats apart. */
static void row_into_panels(const float *src, int n, int nr, float *d, size_t step) {
    for (int j0 = 0; j0 < n; j0 += nr, d += step) {
        const int jv = imin(nr, n - j0);
        memcpy(d, src + j0, (size_t)jv * sizeof(float));
        if (jv < nr) memset(d + jv, 0, (size_t)(nr - jv) * sizeof(float));
    }
}

static void pack_x_task(void *vc, int task, int nt) {
    op_ctx *c = vc;
    const int nr = c->kf->nr, kc = c->kf->kc, m = c->m, k = c->k, np = cdiv(k, nr);
    const int i0 = (int)((long)m * task / nt), i1 = (int)((long)m * (task + 1) / nt);
    float *Px = c->abuf;
    for (int i = i0; i < i1; i++) {
        const int s = i / kc, ki = imin(kc, m - s * kc);
        row_into_panels(c->b + (size_t)i * k, k, nr, Px + (size_t)s * kc * np * nr + (size_t)(i - s * kc) * nr, (size_t)ki * nr);
    }
}

/* dw rows per block: At (rows x kc) and the packed x slice (kc x k) should share L2 (measured on
 * 512 KiB: 16 micro-kernel rows when x is wide, more when x is narrow and the slice small). */
static int dw_block_rows(const nv_kern_fp32 *kf, int k) {
    const size_t budget = 384 << 10, slice = (size_t)kf->kc * rup(k, kf->nr) * sizeof(float);
    int units = 16;
    if (slice <= budget / 2) units = imin(48, (int)((budget - slice) / ((size_t)kf->kc * kf->mr * sizeof(float))));
    return imax(1, units) * kf->mr;
}

/* dw (+)= dy^T . x with the m rows as the depth. A task owns a block of dw's rows (dy's columns) and
 * of its panels; per block of rows and depth slice it transposes that piece of dy into a small
 * buffer, At[a][i] = dy[i0 + i][a0 + a], which stays in cache while the packed x slices stream by,
 * and runs the panel kernel accumulating into dw. dy is never copied whole (and read once unless
 * dw's columns are split too, when few rows leave threads idle). */
static void fp32_dw_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    const nv_kern_fp32 *kf = c->kf;
    const int nr = kf->nr, kc = kf->kc, m = c->m, n = c->n, k = c->k, np = cdiv(k, nr), rb = dw_block_rows(kf, k);
    int a0, a1, q0, q1;
    grid_task(&c->g, task, &a0, &a1, &q0, &q1);
    if (a0 >= a1 || q0 >= q1) return;
    float *At = task_scratch(c, (size_t)imin(rb, a1 - a0) * kc * sizeof(float), a0, a1, q0 * nr, (q1 - q0) * nr);
    if (!At) return;
    const float *Px = c->abuf;
    for (int b0 = a0; b0 < a1; b0 += rb) {
        const int rows = imin(rb, a1 - b0);
        for (int i0 = 0; i0 < m; i0 += kc) {
            const int ki = imin(kc, m - i0);
            nv_transpose(c->a + (size_t)i0 * n + b0, n, ki, rows, At, ki);
            kf->gemm(At, ki, rows, ki, Px + ((size_t)i0 * np + (size_t)q0 * ki) * nr, q1 - q0,
                     c->out + (size_t)b0 * k + (size_t)q0 * nr, k, k - q0 * nr, c->accumulate || i0 > 0);
        }
    }
    free(At);
}

/* ---------------------------------------------------------------- AMX engines */

/* Rows r0..r1 of src (cols floats each) -> bf16 rows of depth elements at dst (zero past cols),
 * optionally scaled per column. */
static void rows_to_bf16(const float *src, size_t lds, int cols, const float *colscale, int r0, int r1, uint16_t *dst,
                         int depth) {
    for (int r = r0; r < r1; r++) {
        uint16_t *d = dst + (size_t)(r - r0) * depth;
        row_to_bf16(src + (size_t)r * lds, colscale, d, cols);
        memset(d + cols, 0, (size_t)(depth - cols) * sizeof(uint16_t));
    }
}

/* Activation rows -> bf16 rows of depth elements (zero past k), optionally scaled per column. */
static void to_bf16_task(void *vc, int task, int nt) {
    op_ctx *c = vc;
    const int rows = c->m;
    const int r0 = (int)((long)rows * task / nt), r1 = (int)((long)rows * (task + 1) / nt);
    rows_to_bf16(c->a, (size_t)c->k, c->k, c->colscale, r0, r1, (uint16_t *)c->abuf + (size_t)r0 * c->depth, c->depth);
}

/* Activation rows -> int8 with a per-row scale: scale = max|x| / 127, q = round(x / scale); as
 * q + 128 (u8) for a kernel that takes A unsigned (kern.h's int8_unsigned). */
static void to_int8_task(void *vc, int task, int nt) {
    op_ctx *c = vc;
    const int rows = c->m, k = c->k, depth = c->depth;
    const uint8_t flip = c->p->ka->int8_unsigned ? 0x80 : 0; /* q ^ 0x80 == q + 128 as a byte */
    int r0 = (int)((long)rows * task / nt), r1 = (int)((long)rows * (task + 1) / nt);
    int8_t *dst = (int8_t *)c->abuf;
    for (int r = r0; r < r1; r++) {
        int8_t *d = dst + (size_t)r * depth;
        c->rowscale[r] = row_to_int8(c->a + (size_t)r * k, d, k, flip);
        memset(d + k, flip, (size_t)(depth - k)); /* q = 0 */
    }
}

/* Rows of A per block of a tile product, row_bytes each: the block (at most 512 KiB, half of a Zen 5
 * core's L2 and a quarter of an AMX core's 2 MiB) stays in L2 while the B tiles go by, each pair of
 * column tiles then read once per block instead of all of A streaming from L3 for every pair; at
 * least one tile pair, 32 rows. */
static int l2_block_rows(size_t row_bytes) { return imax(32, (int)((512u << 10) / row_bytes) / 32 * 32); }
/* The same for an A of depth bf16 per row, converted block by block as the backward products go. */
static int amx_block_rows(int depth) { return l2_block_rows((size_t)depth * 2); }

static void amx_run_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    const nv_plan *p = c->p;
    const int n = c->n;
    int r0, r1, u0, u1;
    grid_task(&c->g, task, &r0, &r1, &u0, &u1);
    int t0 = 2 * u0, t1 = imin(p->np, 2 * u1);
    if (r0 >= r1 || t0 >= t1) return;
    const int int8 = int8_tiles(p->engine), rb = l2_block_rows(c->lda * (int8 ? 1 : 2));
    for (int b0 = r0; b0 < r1; b0 += rb) { /* a block of A's rows stays in L2 while all the task's tiles go by */
        const int rows = imin(rb, r1 - b0);
        float *y = c->out + (size_t)b0 * n + (size_t)t0 * 16;
        if (int8)
            p->ka->int8_gemm((const int8_t *)c->abuf + (size_t)b0 * c->lda, c->lda, rows, p->kp,
                             (const int8_t *)p->pack + (size_t)t0 * (p->kp / 64) * 1024, t1 - t0, c->rowscale + b0,
                             p->wscale + (size_t)t0 * 16, p->wcomp ? p->wcomp + (size_t)t0 * 16 : NULL, y, n, n - t0 * 16);
        else
            p->ka->bf16_gemm((const uint16_t *)c->abuf + (size_t)b0 * c->lda, c->lda, rows, p->kp,
                             (const uint16_t *)p->pack + (size_t)t0 * (p->kp / 32) * 512, 0, t1 - t0, y, n, n - t0 * 16, 0);
    }
}

/* Builds the VNNI tile of W^T for dx: depth block kb (outputs a = kb*32 .. +31) x column tile t
 * (inputs j = t*16 .. +15): U[i][c][e] = W[kb*32 + 2i + e][t*16 + c]. It takes from the two forward
 * tiles of output tiles 2kb and 2kb+1 at the depth block holding those inputs. int8 plans give
 * their quantised values, which bf16 holds exactly (dy carries the scales). Outside W: zero (the
 * forward tiles are zero-padded; output tiles past the plan are skipped). */
static void dx_tile(const nv_plan *p, int t, int kb, uint16_t *U) {
    if (bf16_tiles(p->engine)) {
        /* A forward tile is a 16 x 16 matrix of 32-bit input pairs, (ii, ar) = W[ar][2ii..2ii+1]:
         * transposing the 8 rows of our 16 inputs gives W's rows (16 inputs each) for the tile's 16
         * outputs; U's row i then interleaves W's rows 2i and 2i+1 (outputs kb*32 + 2i + e). */
        uint32_t w[32][8] __attribute__((aligned(32))); /* [output][input pair] */
        for (int h = 0; h < 2; h++) {
            const int ft = 2 * kb + h;
            if (ft >= p->np) {
                memset(w[16 * h], 0, 16 * sizeof w[0]);
                continue;
            }
            const uint32_t *F = (const uint32_t *)((const uint16_t *)p->pack + ((size_t)ft * (p->kp / 32) + t / 2) * 512);
            for (int c0 = 0; c0 < 16; c0 += 8) tr8x8_u32(F + (t % 2) * 8 * 16 + c0, 16, w[16 * h + c0], 8);
        }
        for (int i = 0; i < 16; i++) {
            const __m128i a = _mm_load_si128((const __m128i *)w[2 * i]), a2 = _mm_load_si128((const __m128i *)w[2 * i] + 1);
            const __m128i b = _mm_load_si128((const __m128i *)w[2 * i + 1]), b2 = _mm_load_si128((const __m128i *)w[2 * i + 1] + 1);
            __m128i *u = (__m128i *)(U + i * 32);
            _mm_storeu_si128(u, _mm_unpacklo_epi16(a, b));
            _mm_storeu_si128(u + 1, _mm_unpackhi_epi16(a, b));
            _mm_storeu_si128(u + 2, _mm_unpacklo_epi16(a2, b2));
            _mm_storeu_si128(u + 3, _mm_unpackhi_epi16(a2, b2));
        }
        return;
    }
    /* int8 plans: the int8 values as bf16 (exact), element by element */
    memset(U, 0, 512 * sizeof(uint16_t));
    for (int h = 0; h < 2; h++) {
        const int ft = 2 * kb + h; /* forward column tile: outputs ft*16 .. +15 */
        if (ft >= p->np) break;
        const int8_t *F = (const int8_t *)p->pack + ((size_t)ft * (p->kp / 64) + t / 4) * 1024;
        for (int ar = 0; ar < 16; ar++) {
            const int i = (h * 16 + ar) >> 1, e = ar & 1;
            uint16_t *u = U + i * 32 + e;
            for (int c = 0; c < 16; c++) {
                const int jl = (t % 4) * 16 + c; /* input within the 64-deep block */
                u[c * 2] = nv_bf16_from_f32((float)F[(jl >> 2) * 64 + ar * 4 + (jl & 3)]);
            }
        }
    }
}

/* The VNNI tiles of W^T for dx (depth = n, columns = k), tile (t, kb) at (t * KB + kb) * 512.
 * Split over tiles. */
static void dx_tiles_task(void *vc, int task, int nt) {
    op_ctx *c = vc;
    const int KB = c->depth / 32, count = cdiv(c->k, 16) * KB;
    const int u0 = (int)((long)count * task / nt), u1 = (int)((long)count * (task + 1) / nt);
    for (int u = u0; u < u1; u++) dx_tile(c->p, u / KB, u % KB, (uint16_t *)c->abuf + (size_t)u * 512);
}

/* Rows of an AMX A buffer: exactly m below one tile, else whole tiles (zero rows at the end). */
static int amx_rows(int m) { return m < 16 ? m : rup(m, 16); }


/* Rows b0..b0+rows of dy^T, depths d0..d0+depth, as bf16 rows of depth elements: dst[a][i - d0] =
 * bf16(dy[i][b0 + a]), zero for i >= m (dy is m x n). Transposed through an L1 block of 64 x 64 (a
 * transpose rounding 8 x 8 blocks straight into dst measured slower: its stores go to 8 rows). */
static void dy_t_to_bf16(const float *dy, int m, int n, int b0, int rows, int d0, uint16_t *dst, int depth) {
    float tmp[64 * 64];
    const int i1 = imin(m, d0 + depth);
    for (int i0 = d0; i0 < i1; i0 += 64)
        for (int a0 = 0; a0 < rows; a0 += 64) {
            const int ib = imin(64, i1 - i0), ab = imin(64, rows - a0);
            nv_transpose(dy + (size_t)i0 * n + b0 + a0, n, ib, ab, tmp, 64);
            for (int a = 0; a < ab; a++) row_to_bf16(tmp + a * 64, NULL, dst + (size_t)(a0 + a) * depth + (i0 - d0), ib);
        }
    for (int a = 0; a < rows; a++)
        memset(dst + (size_t)a * depth + (i1 - d0), 0, (size_t)(depth - (i1 - d0)) * sizeof(uint16_t));
}

/* Past a depth of GRAD_SLICE_MIN the backward products take their depth in slices of GRAD_SLICE,
 * each slice's sums added to the output when complete. With the whole depth in one chain, every
 * block of 8 rows streamed its column tiles' whole depth (2 MiB for a pair of tiles at a 32,000-token
 * vocabulary's classifier) from memory; a slice of a tile pair (256 KiB) stays in L2 across a block of
 * rows. The boundaries are fixed multiples of GRAD_SLICE, so results still depend neither on m nor on
 * the threads. */
#define GRAD_SLICE 4096
#define GRAD_SLICE_MIN 8192
static int grad_slice(int depth) { return depth > GRAD_SLICE_MIN ? GRAD_SLICE : depth; }

/* x's VNNI tiles for dw (depth = m rows of x, columns = k), tile (t, kb) at (t * KB + kb) * 512:
 * [i][c][e] = bf16(x[kb*32 + 2i + e][t*16 + c]), zero outside x. Split over tiles. */
/* Tiles u0..u1-1 (tile u: column tile u / KB, depth block u % KB) of x (m rows = the depth, k
 * columns, row stride ldx) as bf16 VNNI tiles at X + u * 512: [i][c][e] = bf16(x[kb*32 + 2i + e][t*16
 * + c]), zero outside x. */
static void bf16_tiles_of_cols(const float *x, size_t ldx, int m, int k, int KB, int u0, int u1, uint16_t *X) {
    for (int u = u0; u < u1; u++) {
        const int t = u / KB, kb = u % KB;
        for (int i = 0; i < 16; i++) {
            const int row = kb * 32 + 2 * i;
            const float *r0 = row < m ? x + (size_t)row * ldx + t * 16 : NULL;
            const float *r1 = row + 1 < m ? x + (size_t)(row + 1) * ldx + t * 16 : NULL;
            vnni_pair16(r0, r1, k - t * 16, X + (size_t)u * 512 + i * 32);
        }
    }
}

static void pack_x_vnni_task(void *vc, int task, int nt) {
    op_ctx *c = vc;
    const int KB = c->depth / 32, count = cdiv(c->k, 16) * KB;
    const int u0 = (int)((long)count * task / nt), u1 = (int)((long)count * (task + 1) / nt);
    bf16_tiles_of_cols(c->b, (size_t)c->k, c->m, c->k, KB, u0, u1, c->abuf);
}

/* The AMX backward products with the shared B tiles (c->abuf): dx = dy . W (c->p set; A = dy's rows
 * times the weight scales, for int8 plans; B = W^T's tiles) or dw = dy^T . x (A = dy^T's rows, or
 * for a loop that takes A as tiles dy's row pairs, no transpose; B = x's tiles); with c->accumulate
 * each is added to the output instead. A task owns a block of the output's rows and of its column
 * tiles; per block of rows (and slice of a deep product's depth) it turns that piece of A into bf16
 * in a small buffer and runs the tile loop. dy is never converted whole; each output is one tile
 * chain per depth slice (one slice up to GRAD_SLICE_MIN), whatever the blocks, threads and A's
 * layout. */
static void amx_grad_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    const int dx = c->p != NULL, a_tiles = !dx && c->ka->bf16_a_tiles;
    const int m = c->m, n = c->n, k = c->k, depth = c->depth, KB = depth / 32, ktiles = cdiv(k, 16);
    const int slice = grad_slice(depth), rb = amx_block_rows(slice);
    int r0, r1, u0, u1;
    grid_task(&c->g, task, &r0, &r1, &u0, &u1);
    int t0 = 2 * u0, t1 = imin(ktiles, 2 * u1);
    if (r0 >= r1 || t0 >= t1) return;
    const int most = imin(rb, r1 - r0);
    uint16_t *A = task_scratch(c, (size_t)(a_tiles ? rup(most, 16) : amx_rows(most)) * slice * sizeof(uint16_t), r0, r1,
                               t0 * 16, (t1 - t0) * 16);
    if (!A) return;
    const uint16_t *B = (const uint16_t *)c->abuf + (size_t)t0 * KB * 512;
    for (int b0 = r0; b0 < r1; b0 += rb) {
        const int rows = imin(rb, r1 - b0), arows = amx_rows(rows);
        for (int d0 = 0; d0 < depth; d0 += slice) {
            const int sd = imin(slice, depth - d0); /* a multiple of 32, like depth and slice */
            if (dx)
                rows_to_bf16(c->a + d0, (size_t)n, imin(sd, n - d0), c->p->wscale ? c->p->wscale + d0 : NULL, b0,
                             b0 + rows, A, sd);
            else if (a_tiles) /* (zero past dy's rows and the block's columns) */
                bf16_tiles_of_cols(c->a + (size_t)d0 * n + b0, (size_t)n, imin(sd, m - d0), rows, sd / 32, 0,
                                   cdiv(rows, 16) * (sd / 32), A);
            else dy_t_to_bf16(c->a, m, n, b0, rows, d0, A, sd);
            if (!a_tiles) memset(A + (size_t)rows * sd, 0, (size_t)(arows - rows) * sd * sizeof(uint16_t)); /* the tile's zero rows */
            c->ka->bf16_gemm(A, a_tiles ? 0 : (size_t)sd, rows, sd, B + (size_t)(d0 / 32) * 512, (size_t)KB * 512, t1 - t0,
                             c->out + (size_t)b0 * k + (size_t)t0 * 16, k, k - t0 * 16, c->accumulate || d0 > 0);
        }
    }
    free(A);
}

static int conv_tasks(int rows, size_t elems) {
    if (force_inline || nv_pool_threads() <= 1 || elems < 65536) return 1;
    return imin(rows, 2 * nv_pool_threads());
}

/* ---------------------------------------------------------------- products on the calling thread */

#define BPACK_NR_MAX 32 /* the widest fp32 panel (avx512) */

size_t nv_bpack_floats(int k, int n) {
    const size_t fp32 = (size_t)k * (size_t)rup(n, BPACK_NR_MAX), tiles = (size_t)rup(k, 32) * (size_t)rup(n, 16) / 2;
    return fp32 > tiles ? fp32 : tiles;
}

/* The bf16 tile engine asked for when it is on (an int8 engine asks for its bf16 one: these
 * operands are activations, which bf16 keeps), else the next one on down the ladder. */
static void bpack_init(nv_bpack *bp, nv_engine_id e, int k, int n, float *buf) {
    e = nv_engine_bf16_of(e);
    bp->e = engine_resolve(e); /* down the ladder: a bf16 tile engine or an fp32 one */
    bp->k = k;
    bp->n = n;
    bp->nr = bp->e == NV_ENGINE_SCALAR || bf16_tiles(bp->e) ? 16 : engine_fp32[bp->e]->nr;
    bp->kstride = k;
    bp->data = buf;
}

/* Tiles: 16 outputs a column of tiles, 32 deep a tile. Panels: nr outputs, any depth. */
int nv_bpack_align(const nv_bpack *bp) { return bf16_tiles(bp->e) ? 32 : bp->nr; }

void nv_bpack_skip(const nv_bpack *bp, int col0, int d0, nv_bpack *view) {
    *view = *bp;
    view->k = bp->k - d0;
    view->n = bp->n - col0;
    if (bf16_tiles(bp->e)) {
        const size_t col_tiles = (size_t)cdiv(bp->kstride, 32) * 512; /* uint16 a column of tiles */
        view->data = (float *)((uint16_t *)bp->data + (size_t)(col0 / 16) * col_tiles + (size_t)(d0 / 32) * 512);
        return;
    }
    view->data = bp->data + (size_t)(col0 / bp->nr) * bp->kstride * bp->nr + (size_t)d0 * bp->nr;
}

void nv_bpack_rows(nv_bpack *bp, nv_engine_id e, const float *b, size_t ldb, int n, int k, float *buf) {
    bpack_init(bp, e, k, n, buf);
    const int nr = bp->nr;
    if (bf16_tiles(bp->e)) {
        bf16_tiles_of_rows(b, ldb, n, k, cdiv(k, 32), 0, cdiv(n, 16), (uint16_t *)buf);
        return;
    }
    fp32_panels_of_rows(b, ldb, n, k, nr, 0, cdiv(n, nr), buf);
}

void nv_bpack_cols(nv_bpack *bp, nv_engine_id e, const float *b, size_t ldb, int k, int n, float *buf) {
    bpack_init(bp, e, k, n, buf);
    const int nr = bp->nr;
    if (bf16_tiles(bp->e)) {
        const int KB = cdiv(k, 32);
        bf16_tiles_of_cols(b, ldb, k, n, KB, 0, cdiv(n, 16) * KB, (uint16_t *)buf);
        return;
    }
    for (int kk = 0; kk < k; kk++) /* b's row kk once, into every panel's row kk */
        row_into_panels(b + (size_t)kk * ldb, n, nr, buf + (size_t)kk * nr, (size_t)k * nr);
}

/* amx-bf16: A's rows made bf16 (zero past depth, up to the tile depth, and zero rows up to a whole
 * tile) in a buffer of its own, then the tile loop over a depth prefix of the tiles (laid out for the
 * packed depth). */
static void bpack_run_amx(const nv_bpack *bp, const float *A, size_t lda, int m, int depth, int ncols, float *C,
                          size_t ldc, int accumulate) {
    const int Kp = rup(depth, 32), rows = amx_rows(m), KBp = cdiv(bp->kstride, 32), nt = cdiv(ncols, 16);
    uint16_t *a = aalloc((size_t)rows * Kp * sizeof(uint16_t));
    if (!a) { /* no memory: the block says so rather than holding stale values */
        for (int r = 0; r < m; r++) fill_nan(C + (size_t)r * ldc, (size_t)ncols);
        return;
    }
    rows_to_bf16(A, lda, depth, NULL, 0, m, a, Kp);
    memset(a + (size_t)m * Kp, 0, (size_t)(rows - m) * Kp * sizeof(uint16_t));
    const uint16_t *B = (const uint16_t *)bp->data;
    const nv_kern_amx *ka = tile_kern(bp->e);
    ka->bf16_gemm(a, Kp, m, Kp, B, (size_t)KBp * 512, nt, C, ldc, ncols, accumulate);
    free(a);
}

void nv_bpack_run(const nv_bpack *bp, const float *A, size_t lda, int m, int depth, int ncols, float *C, size_t ldc,
                  int accumulate) {
    const int nr = bp->nr, np = cdiv(ncols, nr);
    if (m <= 0 || np <= 0) return;
    if (depth <= 0) { /* an empty sum on every engine: the kernels' loops would leave C as it was */
        if (!accumulate)
            for (int r = 0; r < m; r++) memset(C + (size_t)r * ldc, 0, (size_t)ncols * sizeof(float));
        return;
    }
    if (bf16_tiles(bp->e)) {
        bpack_run_amx(bp, A, lda, m, depth, ncols, C, ldc, accumulate);
        return;
    }
    if (bp->e == NV_ENGINE_SCALAR) { /* the reference: one chain per output over depth in order */
        for (int r = 0; r < m; r++)
            for (int j = 0; j < ncols; j++) {
                const float *pj = bp->data + (size_t)(j / nr) * bp->kstride * nr + j % nr;
                float acc = accumulate ? C[(size_t)r * ldc + j] : 0.0f;
                for (int kk = 0; kk < depth; kk++) acc += A[(size_t)r * lda + kk] * pj[(size_t)kk * nr];
                C[(size_t)r * ldc + j] = acc;
            }
        return;
    }
    const nv_kern_fp32 *kf = engine_fp32[bp->e];
    if (depth == bp->kstride) { /* whole panels: one call, the kernel's own blocking over all of them */
        kf->gemm(A, lda, m, depth, bp->data, np, C, ldc, ncols, accumulate);
        return;
    }
    /* a prefix of the depth (or a view's band of it): panels are kstride deep, so one panel per call */
    for (int p = 0; p < np; p++)
        kf->gemm(A, lda, m, depth, bp->data + (size_t)p * bp->kstride * nr, 1, C + (size_t)p * nr, ldc, ncols - p * nr,
                 accumulate);
}

/* ---------------------------------------------------------------- the tile engines' activations */

/* x's m rows made bf16 (or int8 with per-row scales, for the int8 engines) at the depth of plan p's tiles,
 * into c->abuf (and c->rowscale), which the caller frees; rows padded with zeros to whole tiles.
 * 0 when out of memory (nothing to free then). */
static int tile_prepare(op_ctx *c, const nv_plan *p, const float *x, int m) {
    const int rows = amx_rows(m), int8 = int8_tiles(p->engine), esize = int8 ? 1 : 2;
    void *abuf = aalloc((size_t)rows * p->kp * esize);
    float *xs = int8 ? aalloc((size_t)rows * sizeof(float)) : NULL;
    if (!abuf || (int8 && !xs)) {
        free(abuf);
        free(xs);
        return 0;
    }
    if (rows > m) memset((char *)abuf + (size_t)m * p->kp * esize, 0, (size_t)(rows - m) * p->kp * esize);
    if (xs)
        for (int r = m; r < rows; r++) xs[r] = 0.0f;
    op_ctx conv = {.p = p, .a = x, .m = m, .k = p->k, .abuf = abuf, .rowscale = xs, .depth = p->kp, .lda = (size_t)p->kp};
    run_tasks(int8 ? to_int8_task : to_bf16_task, &conv, conv_tasks(m, (size_t)m * p->k));
    c->abuf = abuf;
    c->rowscale = xs;
    c->depth = p->kp;
    c->lda = (size_t)p->kp;
    return 1;
}

/* ---------------------------------------------------------------- block-quantized plans on the int8 engines */

/* Activation rows quantized per block of kq depths for a qdot plan (kern.h's nv_qdot_a): each
 * block's signed bytes (as row_to_int8: scale = max|x| / 127 over the block), its scale, its exact
 * sum in order and the sum of its bytes. */
static void to_qdot_task(void *vc, int task, int nt) {
    op_ctx *c = vc;
    const int kq = c->p->kq, k = c->k, nb = cdiv(k, kq), sub = c->p->qsub ? c->p->qsub : 1,
              nxs = nv_qdot_row_scales(nb, c->p->qsub);
    const int r0 = (int)((long)c->m * task / nt), r1 = (int)((long)c->m * (task + 1) / nt);
    for (int r = r0; r < r1; r++) {
        const float *x = c->a + (size_t)r * k;
        int8_t *d = (int8_t *)c->abuf + (size_t)r * c->lda;
        for (int g = 0; g < nxs; g++) { /* one scale a block, or with super-blocks one a super-block (k a multiple then) */
            const int len = imin(kq * sub, k - g * kq * sub);
            c->rowscale[(size_t)r * nxs + g] = row_to_int8(x + g * kq * sub, d + g * kq * sub, len, 0);
        }
        memset(d + k, 0, (size_t)(nb * kq - k));
        for (int b = 0; b < nb; b++) {
            const int len = imin(kq, k - b * kq);
            const size_t at = (size_t)r * nb + b;
            int32_t qsum = 0;
            for (int i = 0; i < len; i++) qsum += d[b * kq + i];
            c->qsum[at] = qsum;
            if (c->xsum) {
                float sum = 0.0f;
                for (int i = 0; i < len; i++) sum += x[b * kq + i];
                c->xsum[at] = sum;
            }
        }
    }
}

/* x's m rows quantized for qdot plan p into c->abuf, c->rowscale, c->xsum and c->qsum, which the
 * caller frees (qdot_release); 0 when out of memory (nothing to free then). */
static int qdot_prepare(op_ctx *c, const nv_plan *p, const float *x, int m) {
    const int nb = cdiv(p->k, p->kq);
    const size_t lda = (size_t)nb * p->kq, blocks = (size_t)m * nb;
    void *abuf = aalloc((size_t)m * lda);
    /* super-blocks: a scale per super-block, the offsets' terms on qsum (no exact sums) */
    float *xs = aalloc((size_t)m * nv_qdot_row_scales(nb, p->qsub) * sizeof(float)), *xsum = p->qsub ? NULL : aalloc(blocks * sizeof(float));
    int32_t *qsum = aalloc(blocks * sizeof(int32_t));
    if (!abuf || !xs || (!xsum && !p->qsub) || !qsum) {
        free(abuf), free(xs), free(xsum), free(qsum);
        return 0;
    }
    op_ctx conv = {.p = p, .a = x, .m = m, .k = p->k, .abuf = abuf, .rowscale = xs, .xsum = xsum, .qsum = qsum, .lda = lda};
    run_tasks(to_qdot_task, &conv, conv_tasks(m, (size_t)m * p->k));
    c->abuf = abuf;
    c->rowscale = xs;
    c->xsum = xsum;
    c->qsum = qsum;
    c->lda = lda;
    return 1;
}

static void qdot_release(op_ctx *c) { free(c->abuf), free(c->rowscale), free(c->xsum), free(c->qsum); }

static void qdot_run_task(void *vc, int task, int nt) {
    (void)nt;
    op_ctx *c = vc;
    const nv_plan *p = c->p;
    int r0, r1, t0, t1;
    grid_task(&c->g, task, &r0, &r1, &t0, &t1);
    if (r0 >= r1 || t0 >= t1) return;
    const int nb = cdiv(p->k, p->kq), n = c->n, nxs = nv_qdot_row_scales(nb, p->qsub);
    const size_t at = (size_t)r0 * nb;
    const nv_qdot_a a = {(const int8_t *)c->abuf + (size_t)r0 * c->lda, c->lda, c->rowscale + (size_t)r0 * nxs,
                         c->xsum ? c->xsum + at : NULL, c->qsum + at};
    const nv_qdot_b b = qdot_operand(p, t0);
    p->ka->qdot_gemm(&a, r1 - r0, &b, t1 - t0, c->out + (size_t)r0 * n + (size_t)t0 * 16, n, n - t0 * 16);
}

/* Rows per qdot task unit: the widest micro-kernel's (zmm: 6). */
#define QDOT_ROWS 6

/* ---------------------------------------------------------------- plan groups */

#define GROUP_MAX 8

typedef struct {
    op_ctx c[GROUP_MAX];
    int count, tasks[GROUP_MAX];
    void (*fn)(void *, int, int);
    int cunit; /* output columns per grid column unit (plan 0) */
    nv_plan_epilogue ep;
    void *ep_ctx;
} group_ctx;

/* Task t runs task t of every plan (plans of one n share one grid, so the same block), then the
 * epilogue on that block. */
static void group_task(void *vg, int task, int nt) {
    (void)nt;
    group_ctx *g = vg;
    for (int i = 0; i < g->count; i++)
        if (task < g->tasks[i]) g->fn(&g->c[i], task, g->tasks[i]);
    if (!g->ep || task >= g->tasks[0]) return;
    int r0, r1, u0, u1;
    grid_task(&g->c[0].g, task, &r0, &r1, &u0, &u1);
    const int c0 = u0 * g->cunit, c1 = imin(g->c[0].n, u1 * g->cunit);
    if (r0 < r1 && c0 < c1) g->ep(g->ep_ctx, r0, r1, c0, c1);
}

typedef struct {
    nv_plan_epilogue ep;
    void *ctx;
    int m, n;
} rows_ep_ctx;

static void rows_ep_task(void *vc, int task, int nt) {
    const rows_ep_ctx *c = vc;
    int r0 = (int)((long)c->m * task / nt), r1 = (int)((long)c->m * (task + 1) / nt);
    if (r0 < r1) c->ep(c->ctx, r0, r1, 0, c->n);
}

static void plan_run(const nv_plan *p, const float *x, int m, float *y);

void nv_plan_observe(nv_plan *p, nv_plan_observer fn, void *ctx) {
    p->observe = fn;
    p->observe_ctx = ctx;
}

void nv_plan_run_group(const nv_plan *const *plans, int count, const float *x, int m, float *const *ys,
                       nv_plan_epilogue ep, void *ep_ctx) {
    if (m <= 0 || count <= 0) return;
    for (int i = 0; i < count; i++)
        if (plans[i]->observe) plans[i]->observe(plans[i]->observe_ctx, x, m, plans[i]->k);
    const nv_engine_id e = plans[0]->engine;
    const int qd = plans[0]->qdot, tiles = !qd && (bf16_tiles(e) || int8_tiles(e)); /* x converted once for all of them */
    int fused = count <= GROUP_MAX && (qd || tiles || e == NV_ENGINE_AVX2 || e == NV_ENGINE_AVX512 || e == NV_ENGINE_SCALAR);
    for (int i = 1; i < count; i++)
        if (plans[i]->engine != e || plans[i]->k != plans[0]->k || (ep && plans[i]->n != plans[0]->n) ||
            plans[i]->qdot != qd || plans[i]->kq != plans[0]->kq || plans[i]->qsub != plans[0]->qsub)
            fused = 0;
    op_ctx shared = {0};
    if (fused && (qd ? !qdot_prepare(&shared, plans[0], x, m) : tiles && !tile_prepare(&shared, plans[0], x, m)))
        fused = 0; /* out of memory: plan by plan */
    if (!fused) { /* one by one, then the epilogue by rows */
        for (int i = 0; i < count; i++) plan_run(plans[i], x, m, ys[i]);
        if (ep) {
            rows_ep_ctx rc = {ep, ep_ctx, m, plans[0]->n};
            run_tasks(rows_ep_task, &rc, conv_tasks(m, (size_t)m * plans[0]->n));
        }
        return;
    }
    group_ctx g = {.count = count, .ep = ep, .ep_ctx = ep_ctx};
    g.fn = qd ? qdot_run_task : tiles ? amx_run_task : e == NV_ENGINE_SCALAR ? scalar_run_task : fp32_run_task;
    g.cunit = qd ? 16 : tiles ? 32 : e == NV_ENGINE_SCALAR ? 1 : plans[0]->kf->nr; /* tiles: pairs of column tiles */
    int most = 0;
    for (int i = 0; i < count; i++) {
        const nv_plan *p = plans[i];
        op_ctx *c = &g.c[i];
        *c = (op_ctx){.p = p, .a = x, .out = ys[i], .m = m, .n = p->n, .k = p->k, .abuf = shared.abuf, .lda = shared.lda,
                      .depth = shared.depth, .rowscale = shared.rowscale, .xsum = shared.xsum, .qsum = shared.qsum};
        /* sized by the whole group's work, so a group of small products still splits */
        double macs = (double)m * p->k * p->n * count;
        g.tasks[i] = qd                       ? grid_make(&c->g, m, QDOT_ROWS, p->np, macs)
                     : tiles                  ? grid_make(&c->g, m, 32, cdiv(p->np, 2), macs)
                     : e == NV_ENGINE_SCALAR ? grid_make(&c->g, m, 1, p->n, macs)
                                             : grid_make(&c->g, m, p->kf->mr, p->np, macs);
        if (g.tasks[i] > most) most = g.tasks[i];
    }
    run_tasks(group_task, &g, most);
    if (qd) {
        qdot_release(&shared);
        return;
    }
    free(shared.abuf);
    free(shared.rowscale);
}

/* ---------------------------------------------------------------- plan entry points */

void nv_plan_run(const nv_plan *p, const float *x, int m, float *y) {
    if (m > 0 && p->observe) p->observe(p->observe_ctx, x, m, p->k);
    plan_run(p, x, m, y);
}

static void plan_run(const nv_plan *p, const float *x, int m, float *y) {
    if (m <= 0) return;
    const int n = p->n, k = p->k;
    const double macs = (double)m * n * k;
    op_ctx c = {.p = p, .a = x, .out = y, .m = m, .n = n, .k = k};
    if (p->qdot) {
        if (!qdot_prepare(&c, p, x, m)) {
            nv_warn("plan: out of memory for %d x %d activations; output set to NaN", m, k);
            fill_nan(y, (size_t)m * n);
            return;
        }
        run_tasks(qdot_run_task, &c, grid_make(&c.g, m, QDOT_ROWS, p->np, macs));
        qdot_release(&c);
        return;
    }
    switch (p->engine) {
    case NV_ENGINE_AVX2:
    case NV_ENGINE_AVX512:
        run_tasks(fp32_run_task, &c, grid_make(&c.g, m, p->kf->mr, p->np, macs));
        return;
    case NV_ENGINE_AVX512_BF16:
    case NV_ENGINE_AMX_BF16:
    case NV_ENGINE_AVX2_INT8:
    case NV_ENGINE_AVX512_INT8:
    case NV_ENGINE_AMX_INT8:
        if (!tile_prepare(&c, p, x, m)) {
            nv_warn("plan: out of memory for %d x %d activations; output set to NaN", m, k);
            fill_nan(y, (size_t)m * n);
            return;
        }
        run_tasks(amx_run_task, &c, grid_make(&c.g, m, 32, cdiv(p->np, 2), macs));
        free(c.abuf);
        free(c.rowscale);
        return;
    default:
        run_tasks(scalar_run_task, &c, grid_make(&c.g, m, 1, n, macs));
        return;
    }
}

static void plan_dx(const nv_plan *p, const float *dy, int m, float *dx, int accumulate) {
    if (m <= 0) return;
    if (p->quant) {
        nv_warn("plan: block-quantized plans are for inference; dx set to NaN");
        fill_nan(dx, (size_t)m * p->k);
        return;
    }
    const int n = p->n, k = p->k;
    const double macs = (double)m * n * k;
    op_ctx c = {.p = p, .a = dy, .out = dx, .m = m, .n = n, .k = k, .accumulate = accumulate};
    switch (p->engine) {
    case NV_ENGINE_AVX2:
    case NV_ENGINE_AVX512:
        run_tasks(fp32_dx_task, &c, grid_make(&c.g, m, p->kf->mr, cdiv(k, p->kf->nr), macs));
        break;
    case NV_ENGINE_AVX512_BF16:
    case NV_ENGINE_AMX_BF16:
    case NV_ENGINE_AVX2_INT8:
    case NV_ENGINE_AVX512_INT8:
    case NV_ENGINE_AMX_INT8: {
        const int depth = rup(n, 32);
        nv_plan *mp = (nv_plan *)p; /* the dx buffer is scratch, not the plan's weights */
        uint16_t *U = NULL;
        int pooled = !atomic_exchange(&mp->dx_busy, 1); /* the plan's buffer is this call's until released */
        if (pooled && !mp->dx_tiles) mp->dx_tiles = aalloc((size_t)cdiv(k, 16) * depth * 16 * sizeof(uint16_t));
        if (pooled && mp->dx_tiles) U = mp->dx_tiles;
        else if (pooled) atomic_store(&mp->dx_busy, 0), pooled = 0;
        if (!U) U = aalloc((size_t)cdiv(k, 16) * depth * 16 * sizeof(uint16_t));
        if (!U) {
            nv_warn("plan: out of memory for the %d x %d transposed weights; dx set to NaN", n, k);
            fill_nan(dx, (size_t)m * k);
            return;
        }
        c.ka = p->ka;
        c.abuf = U;
        c.depth = depth;
        if (!pooled || !atomic_load(&mp->dx_ok)) {
            run_tasks(dx_tiles_task, &c, conv_tasks(k, (size_t)n * k));
            if (pooled && bf16_tiles(p->engine)) atomic_store(&mp->dx_ok, 1); /* refreshes keep them now */
        }
        run_tasks(amx_grad_task, &c, grid_make_rows(&c.g, m, 32, cdiv(cdiv(k, 16), 2), macs));
        if (pooled) atomic_store(&mp->dx_busy, 0);
        else free(U);
        break;
    }
    default:
        run_tasks(scalar_dx_task, &c, grid_make(&c.g, m, 1, k, macs));
        break;
    }
    if (atomic_load(&c.fail)) nv_warn("plan: out of memory in dx; some outputs set to NaN");
}

void nv_plan_run_dx(const nv_plan *p, const float *dy, int m, float *dx) { plan_dx(p, dy, m, dx, 0); }
void nv_plan_run_dx_add(const nv_plan *p, const float *dy, int m, float *dx) { plan_dx(p, dy, m, dx, 1); }

/* dws[i] (+)= dys[i]^T . x for i < count on engine e as it is (no ladder): x packed once for all; an
 * empty product (ns[i] <= 0) is skipped. */
static void gemm_dw_on(nv_engine_id e, const float *const *dys, const int *ns, int count, const float *x, int m, int k,
                       float *const *dws, int accumulate) {
    op_ctx c = {.b = x, .m = m, .k = k, .accumulate = accumulate};
    /* the scalar loop over rows x columns unless the engine's packed x is there */
    void (*task)(void *, int, int) = scalar_dw_task;
    int runit = 1, cols = k, rows_first = 0;
    switch (e) {
    case NV_ENGINE_AVX2:
    case NV_ENGINE_AVX512:
        c.kf = engine_fp32[e];
        if (!(c.abuf = aalloc((size_t)m * rup(k, c.kf->nr) * sizeof(float)))) break;
        run_tasks(pack_x_task, &c, conv_tasks(m, (size_t)m * k));
        task = fp32_dw_task, runit = c.kf->mr, cols = cdiv(k, c.kf->nr), rows_first = 1;
        break;
    case NV_ENGINE_AVX512_BF16:
    case NV_ENGINE_AMX_BF16:
    case NV_ENGINE_AVX2_INT8:
    case NV_ENGINE_AVX512_INT8:
    case NV_ENGINE_AMX_INT8:
        c.depth = rup(m, 32);
        if (!(c.abuf = aalloc((size_t)cdiv(k, 16) * c.depth * 16 * sizeof(uint16_t)))) break;
        c.ka = tile_kern(e);
        run_tasks(pack_x_vnni_task, &c, conv_tasks(m, (size_t)m * k));
        task = amx_grad_task, runit = 32, cols = cdiv(cdiv(k, 16), 2), rows_first = 1;
        break;
    default: break;
    }
    for (int i = 0; i < count; i++) {
        if (ns[i] <= 0) continue;
        c.a = dys[i], c.n = ns[i], c.out = dws[i];
        const double macs = (double)m * c.n * k;
        run_tasks(task, &c, rows_first ? grid_make_rows(&c.g, c.n, runit, cols, macs) : grid_make(&c.g, c.n, runit, cols, macs));
    }
    free(c.abuf);
    if (atomic_load(&c.fail)) nv_warn("gemm_dw: out of memory; some outputs set to NaN");
}

void nv_gemm_dw_group(nv_engine_id e, const float *const *dys, const int *ns, int count, const float *x, int m, int k,
                      float *const *dws, int accumulate) {
    int any = 0;
    for (int i = 0; i < count; i++) any |= ns[i] > 0;
    if (k <= 0 || !any) return;
    if (m <= 0) { /* an empty sum: dws as they are, or zero */
        for (int i = 0; i < count && !accumulate; i++)
            if (ns[i] > 0) memset(dws[i], 0, (size_t)ns[i] * (size_t)k * sizeof(float));
        return;
    }
    if (!engines_ready && nv_engines_init(NULL, 0) != NV_OK) e = NV_ENGINE_SCALAR;
    gemm_dw_on(engine_resolve(e), dys, ns, count, x, m, k, dws, accumulate);
}

void nv_gemm_dw(nv_engine_id e, const float *dy, const float *x, int m, int n, int k, float *dw, int accumulate) {
    nv_gemm_dw_group(e, (const float *const[]){dy}, (const int[]){n}, 1, x, m, k, (float *const[]){dw}, accumulate);
}

/* ---------------------------------------------------------------- probing */

/* Deterministic test data in [-1, 1). */
static void fill_rand(float *v, size_t count, uint64_t *s) {
    for (size_t i = 0; i < count; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(*s >> 40) / (double)(1ull << 23) - 1.0);
    }
}

#define U32 (1.0 / 16777216.0) /* fp32 unit roundoff 2^-24 */

/* Worst-case bound on |engine - scalar| for one element of a product with reduction length K,
 * where S = sum |a||b| over the reduction (see engine.h for the derivations). qa and qb are the
 * int8 quantisation half-steps (scale / 2) of the two operands (0 when not quantised), sa and sb
 * the sums of |a| and |b| over the reduction, c0 the magnitude of a value accumulated into. */
static double elem_bound(nv_engine_id e, int K, double S, double sa, double sb, double qa, double qb, double c0) {
    double fp = 2.0 * (K + 2) * U32 * (S + c0);
    switch (e) {
    case NV_ENGINE_AVX512_BF16:
    case NV_ENGINE_AMX_BF16: return (1.0 / 128 + 1.0 / 65536) * S + fp * (1 + 1.0 / 64) + 1e-30 * K;
    case NV_ENGINE_AVX2_INT8:
    case NV_ENGINE_AVX512_INT8:
    case NV_ENGINE_AMX_INT8: {
        double Q = qb * sa + qa * sb + K * qa * qb;
        return Q + (K + 12) * U32 * (S + Q) + 2.0 * (K + 2) * U32 * (S + c0) + 1e-30 * K;
    }
    default: return fp;
    }
}

static float max_abs(const float *v, int count) {
    float a = 0.0f;
    for (int i = 0; i < count; i++) a = fmaxf(a, fabsf(v[i]));
    return a;
}

/* The same product split over the pool's threads must give identical bits (y2: room for them);
 * 0 with the reason in why when it does not. */
static int split_same(const nv_plan *pe, const float *x, int m, const float *y, float *y2, const char *what, char *why,
                      size_t len) {
    if (force_inline) return 1;
    force_split = 1;
    nv_plan_run(pe, x, m, y2);
    force_split = 0;
    if (!memcmp(y, y2, sizeof(float) * m * pe->n)) return 1;
    snprintf(why, len, "self-test: %s%dx%dx%d differs when split over %d threads", what, m, pe->n, pe->k, nv_pool_threads());
    return 0;
}

/* A vector int8 engine's product over block-quantized weights (qdot) against scalar over the same
 * weights as floats: 4-bit and 8-bit values, blocks of 16 and 32, with and without offsets (and
 * offsets -8 times the scale, folded into the integer sums), 4-bit indices into a table of uneven
 * values, depths past the last whole block;
 * within the activations' per-block quantisation bound Q = sum over blocks of xscale/2 *
 * sum (|q s| + |o|), plus fp32 terms; and identical bits split over the pool. */
static int selftest_qdot(nv_engine_id e, char *why, size_t len) {
    /* m, n, k, blocks, blocks per super-block (integer scales and offsets: nv_qweights.sub) */
    static const int shapes[][5] = {{17, 37, 100, 32, 0}, {1, 37, 100, 16, 0}, {3, 20, 45, 16, 0}, {6, 33, 96, 32, 0},
                                    {7, 21, 70, 32, 0},   {5, 20, 256, 16, 16}, {3, 35, 512, 32, 8}};
    static const int8_t table[16] = {-127, -100, -77, -58, -40, -27, -15, -3, 2, 11, 26, 41, 55, 74, 96, 127};
    int ok = 1;
    uint64_t seed = 0x9d070000u + (uint64_t)e;
    for (size_t si = 0; ok && si < sizeof shapes / sizeof shapes[0]; si++) {
        const int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2], qb = shapes[si][3], nb = cdiv(k, qb), sub = shapes[si][4];
        /* shape 3's offsets -8 times the scale (Q4_0's): folded; shape 4's values through the table */
        const int four = si % 2 == 0, off = si != 2 && si != 4;
        const int8_t *lut = si == 4 ? table : NULL;
        int8_t *q = malloc((size_t)n * k);
        float *sc = malloc(sizeof(float) * n * nb), *of = malloc(sizeof(float) * n * nb), *w = malloc(sizeof(float) * n * k);
        float *x = malloc(sizeof(float) * m * k), *y = malloc(sizeof(float) * m * n), *yr = malloc(sizeof(float) * m * n),
              *y2 = malloc(sizeof(float) * m * n);
        int8_t *isc = malloc((size_t)n * nb * 2); /* integer scales, then offsets */
        float *sup = malloc(sizeof(float) * n * nb * 2);
        nv_plan *pe = NULL, *ps = NULL;
        if (!q || !sc || !of || !w || !x || !y || !yr || !y2 || !isc || !sup) {
            snprintf(why, len, "self-test: out of memory");
            ok = 0;
            goto next;
        }
        fill_rand(sc, (size_t)n * nb, &seed);
        fill_rand(of, (size_t)n * nb, &seed);
        fill_rand(x, (size_t)m * k, &seed);
        fill_rand(sup, (size_t)n * nb * 2, &seed);
        for (size_t i = 0; si == 3 && i < (size_t)n * nb; i++) of[i] = -8.0f * sc[i];
        for (size_t i = 0; sub && i < (size_t)n * nb; i++) { /* scales and offsets of integers, as the k-quants' */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            isc[i] = (int8_t)(seed >> 56);
            isc[(size_t)n * nb + i] = (int8_t)(seed >> 48);
            sc[i] = sup[i / (size_t)sub] * (float)isc[i];
            of[i] = sup[(size_t)n * nb + i / (size_t)sub] * (float)isc[(size_t)n * nb + i];
        }
        for (size_t i = 0; i < (size_t)n * k; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            q[i] = four ? (int8_t)(seed >> 60) : (int8_t)(seed >> 56);
        }
        for (int j = 0; j < n; j++)
            for (int kk = 0; kk < k; kk++) {
                const size_t b = (size_t)j * nb + kk / qb;
                const int8_t qv = q[(size_t)j * k + kk];
                const float v = (float)(lut ? lut[qv] : qv) * sc[b];
                w[(size_t)j * k + kk] = off ? v + of[b] : v;
            }
        const nv_qweights qw = {q,   sc,  off ? of : NULL, qb, NULL, 0, lut, sub, sub ? isc : NULL, sub ? isc + (size_t)n * nb : NULL,
                                sub ? sup : NULL, sub ? sup + (size_t)n * nb : NULL};
        if (qdot_build_on(&pe, e, &qw, n, k) != NV_OK || plan_build_on(&ps, NV_ENGINE_SCALAR, w, n, k) != NV_OK) {
            snprintf(why, len, "self-test: %s", nv_errmsg());
            ok = 0;
            goto next;
        }
        if (pe->qsub != sub) {
            snprintf(why, len, "self-test: super-blocks of %d blocks not kept (%d)", sub, pe->qsub);
            ok = 0;
            goto next;
        }
        nv_plan_run(pe, x, m, y);
        nv_plan_run(ps, x, m, yr);
        for (int r = 0; ok && r < m; r++)
            for (int j = 0; ok && j < n; j++) {
                double S = 0, Q = 0;
                const int span = pe->kq * (sub ? sub : 1);
                for (int b0 = 0; b0 < k; b0 += span) { /* the activations' scaling blocks */
                    const int b1 = imin(k, b0 + span);
                    const double hx = max_abs(x + (size_t)r * k + b0, b1 - b0) / 127.0f * 0.5;
                    for (int i = b0; i < b1; i++) { /* a folded offset (c times the scale) meets quantised x too */
                        const int8_t qv = q[(size_t)j * k + i];
                        const double wq = fabs((double)(lut ? lut[qv] : qv) * sc[(size_t)j * nb + i / qb]) +
                                          (off ? fabs((double)of[(size_t)j * nb + i / qb]) : 0);
                        S += fabs((double)x[(size_t)r * k + i] * w[(size_t)j * k + i]) + fabs(x[(size_t)r * k + i]) * wq;
                        Q += hx * wq;
                    }
                }
                const double bound = Q + (k + 12) * U32 * (S + Q) + 2.0 * (k + 2) * U32 * S + 1e-30 * k;
                const double err = fabs((double)y[(size_t)r * n + j] - yr[(size_t)r * n + j]);
                if (!(err <= bound)) {
                    snprintf(why, len, "self-test: block-quantized y[%d][%d] of %dx%dx%d is %g, scalar %g", r, j, m, n, k,
                             y[(size_t)r * n + j], yr[(size_t)r * n + j]);
                    ok = 0;
                }
            }
        if (ok) ok = split_same(pe, x, m, y, y2, "block-quantized ", why, len);
    next:
        nv_plan_free(pe);
        nv_plan_free(ps);
        free(q), free(sc), free(of), free(w), free(x), free(y), free(yr), free(y2), free(isc), free(sup);
    }
    return ok;
}

/* One engine's self-test: y, dx and dw on awkward shapes against the scalar reference, every
 * element within the engine's worst-case bound, then the same run split over the pool must give
 * identical bits. Returns 1 when the engine passes, else 0 with the reason in why. */
static int selftest(nv_engine_id e, char *why, size_t len) {
    static const int shapes[][3] = {{17, 37, 100}, {1, 37, 100}, {3, 20, 45}, {40, 50, 70}};
    int ok = 1;
    uint64_t seed = 0x5eed0000u + (uint64_t)e;
    for (size_t si = 0; ok && si < sizeof shapes / sizeof shapes[0]; si++) {
        const int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2];
        float *w = malloc(sizeof(float) * n * k), *x = malloc(sizeof(float) * m * k), *dy = malloc(sizeof(float) * m * n);
        float *y = malloc(sizeof(float) * m * n), *yr = malloc(sizeof(float) * m * n), *y2 = malloc(sizeof(float) * m * n);
        float *dx = malloc(sizeof(float) * m * k), *dxr = malloc(sizeof(float) * m * k);
        float *dw = malloc(sizeof(float) * n * k), *dwr = malloc(sizeof(float) * n * k), *dw0 = malloc(sizeof(float) * n * k);
        nv_plan *pe = NULL, *ps = NULL;
        if (!w || !x || !dy || !y || !yr || !y2 || !dx || !dxr || !dw || !dwr || !dw0) {
            snprintf(why, len, "self-test: out of memory");
            ok = 0;
            goto next;
        }
        fill_rand(w, (size_t)n * k, &seed);
        fill_rand(x, (size_t)m * k, &seed);
        fill_rand(dy, (size_t)m * n, &seed);
        fill_rand(dw0, (size_t)n * k, &seed);
        if (plan_build_on(&pe, e, w, n, k) != NV_OK || plan_build_on(&ps, NV_ENGINE_SCALAR, w, n, k) != NV_OK) {
            snprintf(why, len, "self-test: %s", nv_errmsg());
            ok = 0;
            goto next;
        }
        nv_plan_run(pe, x, m, y);
        nv_plan_run(ps, x, m, yr);
        nv_plan_run_dx(pe, dy, m, dx);
        nv_plan_run_dx(ps, dy, m, dxr);
        memcpy(dw, dw0, sizeof(float) * n * k);
        memcpy(dwr, dw0, sizeof(float) * n * k);
        gemm_dw_on(e, (const float *const[]){dy}, (const int[]){n}, 1, x, m, k, (float *const[]){dw}, 1);
        gemm_dw_on(NV_ENGINE_SCALAR, (const float *const[]){dy}, (const int[]){n}, 1, x, m, k, (float *const[]){dwr}, 1);
        /* y: reduction over k */
        for (int r = 0; ok && r < m; r++) {
            double qx = int8_tiles(e) ? max_abs(x + (size_t)r * k, k) / 127.0f * 0.5 : 0;
            for (int j = 0; ok && j < n; j++) {
                double S = 0, sx = 0, sw = 0;
                for (int i = 0; i < k; i++) {
                    S += fabs((double)x[(size_t)r * k + i] * w[(size_t)j * k + i]);
                    sx += fabsf(x[(size_t)r * k + i]);
                    sw += fabsf(w[(size_t)j * k + i]);
                }
                double qw = int8_tiles(e) ? max_abs(w + (size_t)j * k, k) / 127.0f * 0.5 : 0;
                double err = fabs((double)y[(size_t)r * n + j] - yr[(size_t)r * n + j]);
                if (!(err <= elem_bound(e, k, S, sx, sw, qx, qw, 0))) {
                    snprintf(why, len, "self-test: y[%d][%d] of %dx%dx%d is %g, scalar %g", r, j, m, n, k, y[(size_t)r * n + j],
                             yr[(size_t)r * n + j]);
                    ok = 0;
                }
            }
        }
        /* dx: reduction over n; the int8 engine uses its quantised weights (half-step scale/2 per a) */
        for (int r = 0; ok && r < m; r++)
            for (int j = 0; ok && j < k; j++) {
                double S = 0, B = 0;
                for (int a = 0; a < n; a++) {
                    double d = fabs((double)dy[(size_t)r * n + a]), wa = fabs((double)w[(size_t)a * k + j]);
                    S += d * wa;
                    if (int8_tiles(e)) {
                        double h = max_abs(w + (size_t)a * k, k) / 127.0f * 0.5;
                        B += d * (h + 3 * U32 * wa) + d * (wa + h) * (1.0 / 256) * (1 + 1.0 / 8192);
                    }
                }
                double bound = int8_tiles(e) ? B + 2.0 * (n + 2) * U32 * (S + B) * (1 + 1.0 / 128) + 1e-30 * n
                                                       : elem_bound(e, n, S, 0, 0, 0, 0, 0);
                double err = fabs((double)dx[(size_t)r * k + j] - dxr[(size_t)r * k + j]);
                if (!(err <= bound)) {
                    snprintf(why, len, "self-test: dx[%d][%d] of %dx%dx%d is %g, scalar %g", r, j, m, n, k, dx[(size_t)r * k + j],
                             dxr[(size_t)r * k + j]);
                    ok = 0;
                }
            }
        /* dw: reduction over m, bf16 operands on both AMX engines */
        for (int a = 0; ok && a < n; a++)
            for (int j = 0; ok && j < k; j++) {
                double S = 0;
                for (int r = 0; r < m; r++) S += fabs((double)dy[(size_t)r * n + a] * x[(size_t)r * k + j]);
                nv_engine_id be = nv_engine_bf16_of(e);
                double bound = elem_bound(be, m, S, 0, 0, 0, 0, fabs((double)dw0[(size_t)a * k + j]));
                double err = fabs((double)dw[(size_t)a * k + j] - dwr[(size_t)a * k + j]);
                if (!(err <= bound)) {
                    snprintf(why, len, "self-test: dw[%d][%d] of %dx%dx%d is %g, scalar %g", a, j, m, n, k, dw[(size_t)a * k + j],
                             dwr[(size_t)a * k + j]);
                    ok = 0;
                }
            }
        if (ok) ok = split_same(pe, x, m, y, y2, "", why, len);
    next:
        nv_plan_free(pe);
        nv_plan_free(ps);
        free(w), free(x), free(dy), free(y), free(yr), free(y2), free(dx), free(dxr), free(dw), free(dwr), free(dw0);
    }
    if (ok && int8_tiles(e) && e != NV_ENGINE_AMX_INT8 && tile_kern(e)->qdot_gemm) ok = selftest_qdot(e, why, len);
    return ok;
}

/* A wrong instruction or configuration in a kernel faults (#UD -> SIGILL, #GP -> SIGSEGV) rather
 * than computing wrongly: the first self-test runs on this thread with those signals trapped, so
 * that, too, latches the engine off instead of killing the process. */
static sigjmp_buf probe_jmp;
static volatile sig_atomic_t probe_sig;
static void probe_trap(int sig) {
    probe_sig = sig;
    siglongjmp(probe_jmp, 1);
}

static int guarded_selftest(nv_engine_id e, char *why, size_t len) {
    static const int sigs[] = {SIGILL, SIGSEGV, SIGBUS, SIGFPE};
    struct sigaction sa, old[4];
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = probe_trap;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &sa, &old[i]);
    volatile int ok = 0;
    force_inline = 1;
    if (sigsetjmp(probe_jmp, 1) == 0) {
        ok = selftest(e, why, len);
    } else {
        snprintf(why, len, "self-test crashed with %s", probe_sig == SIGILL ? "SIGILL (illegal instruction)"
                                                       : probe_sig == SIGSEGV ? "SIGSEGV" : probe_sig == SIGBUS ? "SIGBUS" : "SIGFPE");
        ok = 0;
    }
    force_inline = 0;
    for (int i = 0; i < 4; i++) sigaction(sigs[i], &old[i], NULL);
    if (ok) ok = selftest(e, why, len); /* again through the pool */
    return ok;
}

/* Whether the CPU and OS offer what engine e needs; else the reason in why. */
static int engine_hw(nv_engine_id e, const nv_cpu_info *c, char *why, size_t len) {
    switch (e) {
    case NV_ENGINE_AVX2:
    case NV_ENGINE_AVX2_INT8:
        if (nv_cpu_has_avx2(c)) return 1;
        snprintf(why, len, "%s", !c->avx2 || !c->fma ? "CPU lacks AVX2/FMA" : "OS does not enable AVX state (XCR0)");
        return 0;
    case NV_ENGINE_AVX512:
    case NV_ENGINE_AVX512_BF16:
    case NV_ENGINE_AVX512_INT8: {
        if (emulate) {
            if (nv_cpu_has_avx2(c)) return 1;
            snprintf(why, len, "emulation needs AVX2");
            return 0;
        }
        const int bf16 = e == NV_ENGINE_AVX512_BF16, vnni = e == NV_ENGINE_AVX512_INT8;
        if (nv_cpu_has_avx512(c) && (!bf16 || c->avx512_bf16) && (!vnni || c->avx512_vnni)) return 1;
        snprintf(why, len, "%s", !(c->avx512f && c->avx512bw && c->avx512vl) ? "CPU lacks AVX-512F/BW/VL"
                                 : bf16 && !c->avx512_bf16                    ? "CPU lacks AVX512_BF16"
                                 : vnni && !c->avx512_vnni                    ? "CPU lacks AVX512_VNNI"
                                                                              : "OS does not enable AVX-512 state (XCR0)");
        return 0;
    }
    case NV_ENGINE_AMX_BF16:
    case NV_ENGINE_AMX_INT8: {
        if (emulate) return 1;
        int has = e == NV_ENGINE_AMX_BF16 ? nv_cpu_has_amx_bf16(c) : nv_cpu_has_amx_int8(c);
        if (has) return 1;
        if (c->amx_why[0]) snprintf(why, len, "%s", c->amx_why);
        else snprintf(why, len, "CPU lacks %s", e == NV_ENGINE_AMX_BF16 ? "AMX-BF16" : "AMX-INT8");
        return 0;
    }
    default: return 1;
    }
}

/* avx2-int8 on AVX-VNNI failed its self-test: the plain AVX2 loop (the same bits) is tried before
 * the engine is latched off. 1 when it passes. */
static int avx2int8_plain_retry(nv_engine_id e, char *why, size_t len) {
    if (e != NV_ENGINE_AVX2_INT8 || engine_avx2int8 != &vint8_kerns[VINT8_AVXVNNI][vint8_bf16]) return 0;
    nv_warn("engine avx2-int8: its AVX-VNNI loop failed the self-test (%s); trying the plain AVX2 loop", why);
    engine_avx2int8 = &vint8_kerns[VINT8_AVX2][vint8_bf16];
    return guarded_selftest(e, why, len);
}

nv_err nv_engines_init(const char *allow, int threads) {
    const nv_cpu_info *cpu = nv_cpu_probe(); /* the AMX permission is asked for before any worker starts */
    if (!pool_ready || threads > 0) {
        NV_TRY(nv_pool_init(threads));
        pool_ready = 1;
    }
    if (engines_ready) return NV_OK;
    if (!allow) allow = getenv("NERVE_ENGINES");
    int allowed[NV_ENGINE_COUNT];
    for (int i = 0; i < NV_ENGINE_COUNT; i++) allowed[i] = !allow || !*allow;
    if (allow && *allow) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", allow);
        for (char *save = NULL, *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
            nv_engine_id e = NV_ENGINE_SCALAR;
            NV_TRY(nv_engine_parse(tok, &e));
            allowed[e] = 1;
        }
    }
    engine_fp32[NV_ENGINE_AVX2] = &nv_kern_avx2;
    engine_fp32[NV_ENGINE_AVX512] = emulate ? &nv_kern_avx512_emu : &nv_kern_avx512;
    engine_amx = emulate ? &nv_kern_amx_emu : &nv_kern_amx_hw;
    engine_vbf16 = emulate ? &nv_kern_avx512bf16_emu : &nv_kern_avx512bf16;
    /* the vector int8 engines train on bf16 tiles: VDPBF16PS where the CPU has it (whether or not
     * the avx512-bf16 engine is allowed), else its emulation, the same bits */
    pthread_once(&vint8_once, vint8_fill);
    vint8_bf16 = emulate || !nv_cpu_has_avx512(cpu) || !cpu->avx512_bf16;
    engine_vint8 = &vint8_kerns[emulate ? VINT8_AVX512_EMU : VINT8_AVX512][vint8_bf16];
    /* avx2-int8 on AVX-VNNI where the CPU has it; the plain AVX2 loop when emulating (tests) */
    engine_avx2int8 = &vint8_kerns[!emulate && nv_cpu_has_avx_vnni(cpu) ? VINT8_AVXVNNI : VINT8_AVX2][vint8_bf16];
    engine_on[NV_ENGINE_SCALAR] = 1; /* the reference is always present, even when not allowed */
    engine_why[NV_ENGINE_SCALAR][0] = '\0';
    for (int i = 1; i < NV_ENGINE_COUNT; i++) {
        nv_engine_id e = (nv_engine_id)i;
        char why[160] = "";
        if (!allowed[i]) {
            engine_latch(e, "excluded by NERVE_ENGINES/--engine");
        } else if (!engine_hw(e, cpu, why, sizeof why)) {
            engine_latch(e, why);
            nv_debug("engine %s off: %s", engine_names[i], why);
        } else if (!guarded_selftest(e, why, sizeof why) && !avx2int8_plain_retry(e, why, sizeof why)) {
            engine_latch(e, why);
            nv_warn("engine %s latched off: %s", engine_names[i], why);
        } else {
            engine_on[i] = 1;
            engine_why[i][0] = '\0';
            nv_debug("engine %s on%s", engine_names[i], emulate && i >= NV_ENGINE_AVX512 && i != NV_ENGINE_AVX2_INT8 ? " (emulated)" : "");
        }
    }
    /* the conversions 16 at a time once an AVX-512 engine passed its probe and self-test on the
       hardware itself (set once, before any product of the program's runs) */
    if (!emulate && (engine_on[NV_ENGINE_AVX512] || engine_on[NV_ENGINE_AVX512_BF16])) {
        row_to_bf16_fn = nv_avx512_row_to_bf16;
        vnni_pair16_fn = nv_avx512_vnni_pair16;
    }
    engines_ready = 1;
    return NV_OK;
}
