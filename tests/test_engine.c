/* Engines and plans against the scalar reference.
 *
 * For every engine that is on here: y = x.W^T on awkward shapes (M in {1,3,16,17,255,256}, K in
 * {31,64,100,768}, N in {1,15,16,33,100}), refresh without rebuilding, dx = dy.W, dW += dy^T.x,
 * and identical bits with 1 and 2 threads. Engines this CPU lacks print skipped with the reason;
 * avx512, avx512-bf16, avx512-int8, amx-bf16 and amx-int8 then run the same cases on their emulated
 * kernels (the real kernel source over emulated vectors / tile registers), so their packing, tiling
 * and remainder logic is checked on any machine; avx512-int8 gives amx-int8's bits, kernel against
 * kernel (hardware and emulated) and plan against plan. Then the ladder (NERVE_ENGINES restrictions)
 * and the probe: a subtly wrong kernel must be latched off by the self-test.
 *
 * Tolerances, per element, with S = sum |a||b| over the reduction of length K, u = 2^-24:
 *   avx2, avx512  1e-5 S (two fp32 summation orders differ by at most 2 (K+2) u S in the worst
 *                 case; 1e-5 is the contract's figure).
 *   bf16 tiles    a and b each rounded to bf16 (8 significant bits, relative error <= 2^-8), so a
 *                 product is off by <= (2^-7 + 2^-16)|a||b|; plus both fp32 sums: 2 (K+2) u S.
 *   int8          x quantised per row with half-step hx = (max|x|/127)/2 and W per output channel
 *                 with hw = (max|W[n]|/127)/2 (each up to 3u|v| more from fp32 scale arithmetic):
 *                 |xw - x'w'| <= |x| hw + |w| hx + hx hw, summed: hw sum|x| + hx sum|w| + K hx hw,
 *                 plus (K+12) u (S + that) for the scale roundings and 2 (K+2) u S for the sums.
 *   int8 dx       the quantised weights (exact in bf16) times dy scaled per channel and rounded to
 *                 bf16: sum_a |dy_a| (hw_a + 3u|W_a|) + 2^-8 (1 + 2^-13) sum_a |dy_a| (|W_a| + hw_a). */
#include <immintrin.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>

#include "base/log.h"
#include "base/pool.h"
#include "engine/engine.h"
#include "engine/kern.h"
#include "t.h"

#define U (1.0 / 16777216.0)

static nv_engine_id E; /* the engine under test */
static int emulated_section; /* the engines were probed on their emulated kernels */


static void rnd(float *v, size_t n, uint64_t *s) {
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (float)((double)(*s >> 40) / (double)(1ull << 23) - 1.0);
    }
}

static double half_step(const float *v, int n) {
    float a = 0.0f;
    for (int i = 0; i < n; i++) a = fmaxf(a, fabsf(v[i]));
    return (double)(a / 127.0f) * 0.5;
}

static double bf16_tol(int K, double S, double c0) {
    return (1.0 / 128 + 1.0 / 65536) * S + 2.0 * (K + 2) * U * (S + c0) * (1 + 1.0 / 64) + 1e-30 * K;
}

/* Tolerance for y[r][j] of engine e: sa = sum|x_r|, sb = sum|w_j|, ha, hb their int8 half-steps. */
static double y_tol(nv_engine_id e, int K, double S, double sa, double sb, double ha, double hb) {
    switch (e) {
    case NV_ENGINE_AVX512_BF16:
    case NV_ENGINE_AMX_BF16: return bf16_tol(K, S, 0);
    case NV_ENGINE_AVX2_INT8:
    case NV_ENGINE_AVX512_INT8:
    case NV_ENGINE_AMX_INT8: {
        double Q = hb * sa + ha * sb + K * ha * hb;
        return Q + (K + 12) * U * (S + Q) + 2.0 * (K + 2) * U * S + 1e-30 * K;
    }
    default: return 1e-5 * S;
    }
}

/* ---------------------------------------------------------------- y on awkward shapes */

static const int Ms[] = {1, 3, 16, 17, 255, 256}, Ks[] = {31, 64, 100, 768}, Ns[] = {1, 15, 16, 33, 100};
#define NM 6
#define NK 4
#define NN 5

/* Per shape, computed once and shared by every engine: data, the scalar result, and the sums the
 * tolerances need. */
typedef struct {
    int ready, m, n, k;
    float *x, *w, *y;
    double *S, *sa, *sb, *ha, *hb;
} shape_ref;
static shape_ref refs[NM][NK][NN];

static const shape_ref *ref_get(int mi, int ki, int ni) {
    shape_ref *r = &refs[mi][ki][ni];
    if (r->ready) return r;
    const int m = Ms[mi], k = Ks[ki], n = Ns[ni];
    uint64_t seed = 1000003u * (uint64_t)(mi * 100 + ki * 10 + ni + 1);
    r->m = m, r->n = n, r->k = k;
    r->x = malloc(sizeof(float) * m * k);
    r->w = malloc(sizeof(float) * n * k);
    r->y = malloc(sizeof(float) * m * n);
    r->S = malloc(sizeof(double) * m * n);
    r->sa = malloc(sizeof(double) * m);
    r->ha = malloc(sizeof(double) * m);
    r->sb = malloc(sizeof(double) * n);
    r->hb = malloc(sizeof(double) * n);
    rnd(r->x, (size_t)m * k, &seed);
    rnd(r->w, (size_t)n * k, &seed);
    nv_plan *p;
    if (nv_plan_build(&p, NV_ENGINE_SCALAR, r->w, n, k) != NV_OK) abort();
    nv_plan_run(p, r->x, m, r->y);
    nv_plan_free(p);
    for (int i = 0; i < m; i++) {
        const float *x = r->x + (size_t)i * k;
        r->sa[i] = 0;
        for (int kk = 0; kk < k; kk++) r->sa[i] += fabsf(x[kk]);
        r->ha[i] = half_step(x, k);
        for (int j = 0; j < n; j++) {
            const float *w = r->w + (size_t)j * k;
            double S = 0;
            for (int kk = 0; kk < k; kk++) S += fabs((double)x[kk] * w[kk]);
            r->S[(size_t)i * n + j] = S;
        }
    }
    for (int j = 0; j < n; j++) {
        const float *w = r->w + (size_t)j * k;
        r->sb[j] = 0;
        for (int kk = 0; kk < k; kk++) r->sb[j] += fabsf(w[kk]);
        r->hb[j] = half_step(w, k);
    }
    r->ready = 1;
    return r;
}

static void refs_free(void) {
    for (int a = 0; a < NM; a++)
        for (int b = 0; b < NK; b++)
            for (int c = 0; c < NN; c++) {
                shape_ref *r = &refs[a][b][c];
                if (!r->ready) continue;
                free(r->x), free(r->w), free(r->y), free(r->S), free(r->sa), free(r->sb), free(r->ha), free(r->hb);
                r->ready = 0;
            }
}

/* Checks y against the reference; returns the number of elements out of bounds. */
static int check_y(nv_engine_id e, const shape_ref *r, const float *y, const char *what) {
    int bad = 0;
    for (int i = 0; i < r->m; i++)
        for (int j = 0; j < r->n; j++) {
            size_t at = (size_t)i * r->n + j;
            double tol = y_tol(e, r->k, r->S[at], r->sa[i], r->sb[j], r->ha[i], r->hb[j]);
            double err = fabs((double)y[at] - r->y[at]);
            if (!(err <= tol)) {
                if (bad++ == 0)
                    T_CHECK(0, "%s %s m=%d n=%d k=%d: y[%d][%d] = %.9g, scalar %.9g, |err| %.3g > tol %.3g", nv_engine_name(e), what,
                            r->m, r->n, r->k, i, j, y[at], r->y[at], err, tol);
            }
        }
    return bad;
}

static void test_run_shapes(void) {
    for (int mi = 0; mi < NM; mi++)
        for (int ki = 0; ki < NK; ki++)
            for (int ni = 0; ni < NN; ni++) {
                if (Ks[ki] == 768 && Ms[mi] > 17) continue; /* the large K only where it is cheap */
                const shape_ref *r = ref_get(mi, ki, ni);
                nv_plan *p;
                T_CHECK(nv_plan_build(&p, E, r->w, r->n, r->k) == NV_OK, "build: %s", nv_errmsg());
                T_CHECK(nv_plan_engine(p) == E, "plan on %s, asked %s", nv_engine_name(nv_plan_engine(p)), nv_engine_name(E));
                T_CHECK(nv_plan_n(p) == r->n && nv_plan_k(p) == r->k, "plan shape");
                float *y = malloc(sizeof(float) * (r->m * r->n + 1));
                y[r->m * r->n] = 12345.0f; /* guard past the end */
                nv_plan_run(p, r->x, r->m, y);
                check_y(E, r, y, "plan_run");
                T_CHECK(y[r->m * r->n] == 12345.0f, "wrote past y (m=%d n=%d k=%d)", r->m, r->n, r->k);
                nv_plan_run(p, r->x, 0, y); /* m = 0: nothing */
                T_CHECK(y[r->m * r->n] == 12345.0f, "m = 0 wrote");
                free(y);
                nv_plan_free(p);
            }
}

/* ---------------------------------------------------------------- refresh */

static void test_refresh(void) {
    const shape_ref *r = ref_get(3, 2, 3); /* 17 x 33 x 100 */
    const int m = r->m, n = r->n, k = r->k;
    float *w2 = malloc(sizeof(float) * n * k), *y1 = malloc(sizeof(float) * m * n), *y2 = malloc(sizeof(float) * m * n),
          *yr = malloc(sizeof(float) * m * n);
    uint64_t seed = 77;
    rnd(w2, (size_t)n * k, &seed);
    for (int i = 0; i < n * k; i++) w2[i] *= 3.0f; /* a different magnitude too */
    nv_plan *p, *ps;
    T_CHECK(nv_plan_build(&p, E, r->w, n, k) == NV_OK, "build");
    size_t bytes = nv_plan_packed_bytes(p);
    T_CHECK(bytes >= (nv_engine_int8(E) ? (size_t)n * k : (size_t)n * k * 2), "packed bytes %zu", bytes);
    long builds = nv_plan_builds();
    nv_plan_run(p, r->x, m, y1);
    nv_plan_refresh(p, w2);
    nv_plan_run(p, r->x, m, y2);
    T_CHECK(nv_plan_builds() == builds, "refresh counted as a build");
    T_CHECK(nv_plan_packed_bytes(p) == bytes, "refresh changed the packed size");
    T_CHECK(memcmp(y1, y2, sizeof(float) * m * n) != 0, "refresh did not change the result");
    T_CHECK(nv_plan_build(&ps, NV_ENGINE_SCALAR, w2, n, k) == NV_OK, "build scalar");
    nv_plan_run(ps, r->x, m, yr);
    int bad = 0;
    for (int i = 0; i < m && !bad; i++) {
        double sa = 0;
        for (int kk = 0; kk < k; kk++) sa += fabsf(r->x[(size_t)i * k + kk]);
        for (int j = 0; j < n; j++) {
            double S = 0, sb = 0;
            for (int kk = 0; kk < k; kk++) {
                S += fabs((double)r->x[(size_t)i * k + kk] * w2[(size_t)j * k + kk]);
                sb += fabsf(w2[(size_t)j * k + kk]);
            }
            double tol = y_tol(E, k, S, sa, sb, half_step(r->x + (size_t)i * k, k), half_step(w2 + (size_t)j * k, k));
            if (!(fabs((double)y2[(size_t)i * n + j] - yr[(size_t)i * n + j]) <= tol)) {
                T_CHECK(0, "after refresh y[%d][%d] = %g, scalar %g", i, j, y2[(size_t)i * n + j], yr[(size_t)i * n + j]);
                bad = 1;
                break;
            }
        }
    }
    nv_plan_free(p);
    nv_plan_free(ps);
    free(w2), free(y1), free(y2), free(yr);
}

/* dx after a refresh (whole, or by pieces of rows as the optimizer does) gives the bits of a plan
 * built from the new weights: the tile engines keep W^T's tiles between calls and refresh them
 * with the weights. n = 33 leaves a half depth block of padding, n = 8 and 7 (LoRA's ranks) less
 * than a tile; k = 100 a partial column tile. */
static void dx_after_refresh(int n);
static void test_dx_after_refresh(void) {
    dx_after_refresh(33);
    dx_after_refresh(8);
    dx_after_refresh(7);
}

static void dx_after_refresh(int n) {
    const int m = 5, k = 100;
    float *w = malloc(sizeof(float) * n * k * 3), *dy = malloc(sizeof(float) * m * n);
    float *dxp = malloc(sizeof(float) * m * k), *dxq = malloc(sizeof(float) * m * k);
    uint64_t seed = 91;
    rnd(w, (size_t)n * k * 3, &seed);
    rnd(dy, (size_t)m * n, &seed);
    nv_plan *p, *q;
    T_CHECK(nv_plan_build(&p, E, w, n, k) == NV_OK, "build");
    nv_plan_run_dx(p, dy, m, dxp); /* builds and keeps W^T's tiles */
    for (int round = 1; round <= 2; round++) {
        const float *wr = w + (size_t)round * n * k;
        if (round == 1) nv_plan_refresh(p, wr);
        else {
            const int unit = nv_plan_row_unit(p);
            for (int r0 = 0; r0 < n; r0 += unit) nv_plan_refresh_rows(p, wr, r0, r0 + unit < n ? r0 + unit : n);
        }
        nv_plan_run_dx(p, dy, m, dxp);
        T_CHECK(nv_plan_build(&q, E, wr, n, k) == NV_OK, "build");
        nv_plan_run_dx(q, dy, m, dxq);
        T_CHECK(memcmp(dxp, dxq, sizeof(float) * m * k) == 0, "n %d, %s: dx differs from a fresh plan's", n,
                round == 1 ? "after a whole refresh" : "after a refresh by rows");
        nv_plan_free(q);
    }
    nv_plan_free(p);
    free(w), free(dy), free(dxp), free(dxq);
}

/* A NaN in x poisons its row of y and an infinity in W its column; the other outputs stay finite
 * (the int8 engine marks the row's or channel's scale NaN rather than quantising garbage). */
static void test_nonfinite_propagates(void) {
    const int m = 3, n = 20, k = 40;
    float w[20 * 40], x[3 * 40], y[3 * 20];
    uint64_t seed = 5;
    rnd(w, sizeof w / sizeof w[0], &seed);
    rnd(x, sizeof x / sizeof x[0], &seed);
    x[1 * k + 7] = NAN;
    w[2 * k + 3] = INFINITY;
    nv_plan *p;
    T_CHECK(nv_plan_build(&p, E, w, n, k) == NV_OK, "build");
    nv_plan_run(p, x, m, y);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            int poisoned = i == 1 || j == 2;
            T_CHECK(poisoned ? !isfinite(y[i * n + j]) : isfinite(y[i * n + j]), "y[%d][%d] = %g", i, j, y[i * n + j]);
        }
    nv_plan_free(p);
}

/* ---------------------------------------------------------------- dx and dW */

static const int train_shapes[][3] = {{1, 15, 31}, {3, 16, 64}, {17, 33, 100}, {16, 1, 64}, {40, 100, 15}, {256, 100, 100}, {255, 37, 768},
                                           {8193, 100, 20},  /* deep enough for several AMX dw row blocks per task */
                                           {40, 8300, 20}};  /* dx's depth in slices on the tile engines */
#define NTRAIN (int)(sizeof train_shapes / sizeof train_shapes[0])

static void test_dx(void) {
    for (int s = 0; s < NTRAIN; s++) {
        const int m = train_shapes[s][0], n = train_shapes[s][1], k = train_shapes[s][2];
        float *w = malloc(sizeof(float) * n * k), *dy = malloc(sizeof(float) * m * n), *dx = malloc(sizeof(float) * (m * k + 1)),
              *dxr = malloc(sizeof(float) * m * k), *base = malloc(sizeof(float) * m * k), *dxa = malloc(sizeof(float) * m * k);
        double *h = malloc(sizeof(double) * n);
        uint64_t seed = 4242 + s;
        rnd(w, (size_t)n * k, &seed);
        rnd(dy, (size_t)m * n, &seed);
        rnd(base, (size_t)m * k, &seed);
        memcpy(dxa, base, sizeof(float) * m * k);
        for (int a = 0; a < n; a++) h[a] = half_step(w + (size_t)a * k, k);
        nv_plan *p, *ps;
        T_CHECK(nv_plan_build(&p, E, w, n, k) == NV_OK && nv_plan_build(&ps, NV_ENGINE_SCALAR, w, n, k) == NV_OK, "build");
        dx[m * k] = 777.0f;
        nv_plan_run_dx(p, dy, m, dx);
        nv_plan_run_dx(ps, dy, m, dxr);
        nv_plan_run_dx_add(p, dy, m, dxa);
        T_CHECK(dx[m * k] == 777.0f, "dx wrote past its end");
        /* the tile engines add a whole sum once complete (below a sliced depth): exactly base + dx */
        const int exact_add = nv_engine_low_precision(E) && n <= 8192;
        int bad = 0, bad_add = 0;
        for (int i = 0; i < m && !bad; i++)
            for (int j = 0; j < k; j++) {
                double S = 0, B = 0;
                for (int a = 0; a < n; a++) {
                    double d = fabs((double)dy[(size_t)i * n + a]), wa = fabs((double)w[(size_t)a * k + j]);
                    S += d * wa;
                    B += d * (h[a] + 3 * U * wa) + d * (wa + h[a]) * (1.0 / 256) * (1 + 1.0 / 8192);
                }
                double tol = nv_engine_int8(E)                   ? B + 2.0 * (n + 2) * U * (S + B) * (1 + 1.0 / 128) + 1e-30 * n
                             : nv_engine_low_precision(E) ? bf16_tol(n, S, 0)
                                                       : 1e-5 * S;
                const size_t at = (size_t)i * k + j;
                double err = fabs((double)dx[at] - dxr[at]);
                if (!(err <= tol)) {
                    T_CHECK(0, "m=%d n=%d k=%d: dx[%d][%d] = %.9g, scalar %.9g, |err| %.3g > %.3g", m, n, k, i, j, dx[at],
                            dxr[at], err, tol);
                    bad = 1;
                    break;
                }
                /* past a sliced depth the tile engines add each slice to base in turn: against their own dx
                   (the same slice sums), only fp32 additions differ, so base may not be lost */
                const double c0 = fabs((double)base[at]);
                const double err_add = nv_engine_low_precision(E) ? fabs((double)dxa[at] - ((double)dx[at] + base[at]))
                                                                  : fabs((double)dxa[at] - ((double)dxr[at] + base[at]));
                const double tol_add = nv_engine_low_precision(E) ? 4 * U * (S + c0) : tol + 4 * U * (S + c0);
                if (!bad_add && (exact_add ? dxa[at] != dx[at] + base[at] : !(err_add <= tol_add))) {
                    T_CHECK(0, "m=%d n=%d k=%d: dx_add[%d][%d] = %.9g, dx + base %.9g (%s)", m, n, k, i, j, dxa[at], dx[at] + base[at],
                            exact_add ? "must be exact" : "out of bounds");
                    bad_add = 1;
                }
            }
        nv_plan_free(p);
        nv_plan_free(ps);
        free(w), free(dy), free(dx), free(dxr), free(base), free(dxa), free(h);
    }
}

static void test_dw(void) {
    for (int s = 0; s < NTRAIN; s++) {
        const int m = train_shapes[s][0], n = train_shapes[s][1], k = train_shapes[s][2];
        float *x = malloc(sizeof(float) * m * k), *dy = malloc(sizeof(float) * m * n), *dw0 = malloc(sizeof(float) * n * k),
              *dw = malloc(sizeof(float) * (n * k + 1)), *dwr = malloc(sizeof(float) * n * k);
        uint64_t seed = 999 + s;
        rnd(x, (size_t)m * k, &seed);
        rnd(dy, (size_t)m * n, &seed);
        rnd(dw0, (size_t)n * k, &seed);
        memcpy(dw, dw0, sizeof(float) * n * k);
        memcpy(dwr, dw0, sizeof(float) * n * k);
        dw[n * k] = 555.0f;
        nv_gemm_dw(E, dy, x, m, n, k, dw, 1);
        nv_gemm_dw(NV_ENGINE_SCALAR, dy, x, m, n, k, dwr, 1);
        T_CHECK(dw[n * k] == 555.0f, "dw wrote past its end");
        int bad = 0;
        for (int a = 0; a < n && !bad; a++)
            for (int j = 0; j < k; j++) {
                double S = 0, c0 = fabs((double)dw0[(size_t)a * k + j]);
                for (int i = 0; i < m; i++) S += fabs((double)dy[(size_t)i * n + a] * x[(size_t)i * k + j]);
                double tol = nv_engine_low_precision(E) ? bf16_tol(m, S, c0) : 1e-5 * (S + c0);
                double err = fabs((double)dw[(size_t)a * k + j] - dwr[(size_t)a * k + j]);
                if (!(err <= tol)) {
                    T_CHECK(0, "m=%d n=%d k=%d: dw[%d][%d] = %.9g, scalar %.9g, |err| %.3g > %.3g", m, n, k, a, j, dw[(size_t)a * k + j],
                            dwr[(size_t)a * k + j], err, tol);
                    bad = 1;
                    break;
                }
            }
        free(x), free(dy), free(dw0), free(dw), free(dwr);
    }
}

/* dw written instead of added to (a trainer's first micro-batch): over NaNs, the bits an add to zeros
 * gives (as floats: a zero sum's sign may differ), on every train shape (sliced depths included),
 * nothing past the end; no rows at all write zeros. */
static void test_dw_overwrite(void) {
    for (int s = 0; s < NTRAIN; s++) {
        const int m = train_shapes[s][0], n = train_shapes[s][1], k = train_shapes[s][2];
        float *x = malloc(sizeof(float) * m * k), *dy = malloc(sizeof(float) * m * n), *dwz = calloc((size_t)n * k, sizeof(float)),
              *dw = malloc(sizeof(float) * (n * k + 1));
        uint64_t seed = 4242 + s;
        rnd(x, (size_t)m * k, &seed);
        rnd(dy, (size_t)m * n, &seed);
        for (int i = 0; i < n * k; i++) dw[i] = NAN;
        dw[n * k] = 555.0f;
        nv_gemm_dw(E, dy, x, m, n, k, dwz, 1);
        nv_gemm_dw(E, dy, x, m, n, k, dw, 0);
        int bad = -1;
        for (int i = n * k - 1; i >= 0; i--)
            if (!(dw[i] == dwz[i])) bad = i;
        T_CHECK(bad < 0, "m=%d n=%d k=%d: written dw[%d] = %.9g, added to zeros %.9g", m, n, k, bad, bad >= 0 ? dw[bad] : 0.0f,
                bad >= 0 ? dwz[bad] : 0.0f);
        T_CHECK(dw[n * k] == 555.0f, "dw written past its end");
        nv_gemm_dw(E, dy, x, 0, n, k, dw, 0);
        int zero = 1;
        for (int i = 0; i < n * k; i++) zero &= dw[i] == 0.0f;
        T_CHECK(zero && dw[n * k] == 555.0f, "m=0 n=%d k=%d: an empty sum written is not zero", n, k);
        free(x), free(dy), free(dwz), free(dw);
    }
}

/* A group of weight gradients over one x gives each product's nv_gemm_dw bits (x packed once); an
 * empty member is skipped. */
static void test_dw_group(void) {
    enum { M = 40, K = 37 };
    static const int ns[3] = {33, 16, 100};
    float x[M * K], *dy[3], *one[3], *grp[3];
    uint64_t seed = 2024;
    rnd(x, (size_t)M * K, &seed);
    for (int i = 0; i < 3; i++) {
        dy[i] = malloc(sizeof(float) * M * ns[i]);
        one[i] = malloc(sizeof(float) * ns[i] * K);
        grp[i] = malloc(sizeof(float) * ns[i] * K);
        rnd(dy[i], (size_t)M * ns[i], &seed);
        rnd(one[i], (size_t)ns[i] * K, &seed);
        memcpy(grp[i], one[i], sizeof(float) * ns[i] * K);
        nv_gemm_dw(E, dy[i], x, M, ns[i], K, one[i], 1);
    }
    nv_gemm_dw_group(E, (const float *const *)dy, ns, 3, x, M, K, grp, 1);
    /* an empty member is skipped, the others still computed */
    float untouched = 7.0f;
    nv_gemm_dw(E, dy[1], x, M, ns[1], K, one[1], 1);
    nv_gemm_dw_group(E, (const float *const[]){dy[0], dy[1]}, (const int[]){0, ns[1]}, 2, x, M, K,
                     (float *const[]){&untouched, grp[1]}, 1);
    T_CHECK(untouched == 7.0f, "an empty group member was written");
    for (int i = 0; i < 3; i++) {
        T_CHECK(memcmp(one[i], grp[i], sizeof(float) * ns[i] * K) == 0, "group member %d differs from its own nv_gemm_dw", i);
        free(dy[i]), free(one[i]), free(grp[i]);
    }
}

/* ---------------------------------------------------------------- threads */

/* y, dx and dW with 1 and with 2 threads: identical bits (every element is computed by the same
 * operations whatever the split). */
static void test_threads_identical(void) {
    static const int shapes[][3] = {{256, 100, 100}, {1, 100, 768}, {40, 37, 64}, {100, 8300, 40}, {8300, 40, 40}};
    int before = nv_pool_threads();
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *w = malloc(sizeof(float) * n * k), *x = malloc(sizeof(float) * m * k), *dy = malloc(sizeof(float) * m * n);
        float *y[2], *dx[2], *dw[2];
        uint64_t seed = 31337 + s;
        rnd(w, (size_t)n * k, &seed);
        rnd(x, (size_t)m * k, &seed);
        rnd(dy, (size_t)m * n, &seed);
        nv_plan *p;
        T_CHECK(nv_plan_build(&p, E, w, n, k) == NV_OK, "build");
        for (int t = 0; t < 2; t++) {
            nv_pool_init(t + 1);
            y[t] = malloc(sizeof(float) * m * n);
            dx[t] = malloc(sizeof(float) * m * k);
            dw[t] = calloc((size_t)n * k, sizeof(float));
            nv_plan_run(p, x, m, y[t]);
            nv_plan_run_dx(p, dy, m, dx[t]);
            nv_gemm_dw(E, dy, x, m, n, k, dw[t], 1);
        }
        T_CHECK(memcmp(y[0], y[1], sizeof(float) * m * n) == 0, "y differs between 1 and 2 threads (%dx%dx%d)", m, n, k);
        T_CHECK(memcmp(dx[0], dx[1], sizeof(float) * m * k) == 0, "dx differs between 1 and 2 threads (%dx%dx%d)", m, n, k);
        T_CHECK(memcmp(dw[0], dw[1], sizeof(float) * n * k) == 0, "dw differs between 1 and 2 threads (%dx%dx%d)", m, n, k);
        nv_plan_free(p);
        for (int t = 0; t < 2; t++) free(y[t]), free(dx[t]), free(dw[t]);
        free(w), free(x), free(dy);
    }
    nv_pool_init(before);
}

/* avx2 and avx512 compute every element as the same chain of fused multiply-adds in input order
 * (only the vector width and blocking differ), so their y, dx and dW must agree bit for bit. */
static void test_avx512_bits_equal_avx2(void) {
    if (!nv_engine_available(NV_ENGINE_AVX512) || !nv_engine_available(NV_ENGINE_AVX2)) {
        t_skip(!nv_engine_available(NV_ENGINE_AVX512) ? nv_engine_why_off(NV_ENGINE_AVX512) : nv_engine_why_off(NV_ENGINE_AVX2));
        return;
    }
    static const int shapes[][3] = {{1, 100, 768}, {17, 33, 100}, {255, 100, 31}, {40, 37, 600}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *w = malloc(sizeof(float) * n * k), *x = malloc(sizeof(float) * m * k), *dy = malloc(sizeof(float) * m * n);
        float *y[2], *dx[2], *dw[2];
        uint64_t seed = 2024 + s;
        rnd(w, (size_t)n * k, &seed);
        rnd(x, (size_t)m * k, &seed);
        rnd(dy, (size_t)m * n, &seed);
        for (int i = 0; i < 2; i++) {
            nv_engine_id e = i ? NV_ENGINE_AVX512 : NV_ENGINE_AVX2;
            nv_plan *p;
            T_CHECK(nv_plan_build(&p, e, w, n, k) == NV_OK && nv_plan_engine(p) == e, "build");
            y[i] = malloc(sizeof(float) * m * n);
            dx[i] = malloc(sizeof(float) * m * k);
            dw[i] = malloc(sizeof(float) * n * k);
            memcpy(dw[i], w, sizeof(float) * n * k);
            nv_plan_run(p, x, m, y[i]);
            nv_plan_run_dx(p, dy, m, dx[i]);
            nv_gemm_dw(e, dy, x, m, n, k, dw[i], 1);
            nv_plan_free(p);
        }
        T_CHECK(memcmp(y[0], y[1], sizeof(float) * m * n) == 0, "y bits differ (%dx%dx%d)", m, n, k);
        T_CHECK(memcmp(dx[0], dx[1], sizeof(float) * m * k) == 0, "dx bits differ (%dx%dx%d)", m, n, k);
        T_CHECK(memcmp(dw[0], dw[1], sizeof(float) * n * k) == 0, "dw bits differ (%dx%dx%d)", m, n, k);
        for (int i = 0; i < 2; i++) free(y[i]), free(dx[i]), free(dw[i]);
        free(w), free(x), free(dy);
    }
}

/* out[r][c] == the chain acc = fmaf(A[r*ars + d*ads], B[c*bcs + d*bds], acc) over d < depth, from
 * init[r][c] (or 0), bit for bit; reports the first difference. */
static int check_chain(const char *what, const float *out, int rows, int cols, int depth, const float *A, size_t ars,
                       size_t ads, const float *B, size_t bcs, size_t bds, const float *init) {
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            float acc = init ? init[(size_t)r * cols + c] : 0.0f;
            for (int d = 0; d < depth; d++) acc = fmaf(A[r * ars + d * ads], B[c * bcs + d * bds], acc);
            if (memcmp(&acc, &out[(size_t)r * cols + c], sizeof acc)) {
                T_CHECK(0, "%s[%d][%d] = %.9g, the chain gives %.9g", what, r, c, out[(size_t)r * cols + c], acc);
                return 0;
            }
        }
    return 1;
}

/* The 16-wide bf16 conversions (the bf16 engines' operands where AVX-512 is on) give
 * nv_bf16_from_f32's bits for every kind of float: ties to even, subnormals (which VCVTNEPS2BF16
 * would take as zero), infinities, NaNs of either sign and payload, the largest values (rounding up
 * to infinity); with a column scale; every length 1..40 (the masked tail, its source and scale
 * ending at an unreadable page: nothing past k read or written); and the VNNI pairs. */
static void test_bf16_conversions_avx512(void) {
    if (!nv_engine_available(NV_ENGINE_AVX512)) {
        t_skip(nv_engine_why_off(NV_ENGINE_AVX512));
        return;
    }
    enum { N = 4096 };
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u, 0x3f808000u,
                                       0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f800000u, 0xff800000u,
                                       0x7f800001u, 0x7fc00000u, 0xffbfffffu, 0x7fffffffu, 0x3f800000u, 0xbf7fffffu};
    float *x = malloc(sizeof(float) * N), *scale = malloc(sizeof(float) * N);
    /* two pages each followed by an unreadable one: the tails end where reading on would fault */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *guard = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    T_CHECK(guard != MAP_FAILED && mprotect(guard + page, page, PROT_NONE) == 0 && mprotect(guard + 3 * page, page, PROT_NONE) == 0, "guard pages");
    if (guard == MAP_FAILED) return;
    float *edge = (float *)(guard + page), *edge_scale = (float *)(guard + 3 * page);
    uint16_t *got = malloc(sizeof(uint16_t) * (N + 64)), *pairs = malloc(sizeof(uint16_t) * 32);
    uint64_t seed = 77;
    for (int i = 0; i < N; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(seed >> 32);
        if (i % 5 == 0) u = special[(seed >> 16) % (sizeof special / sizeof *special)];
        if (i % 7 == 0) u &= 0x807fffffu; /* subnormals */
        memcpy(&x[i], &u, 4);
        scale[i] = (float)(1 + (int)(seed % 9)) * 0.37f;
    }
    int bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        const float *cs = pass ? scale : NULL;
        nv_avx512_row_to_bf16(x, cs, got, N);
        for (int i = 0; i < N; i++) bad += got[i] != nv_bf16_from_f32(cs ? x[i] * cs[i] : x[i]);
        for (int len = 1; len <= 40; len++) { /* the tail: nothing past len read or written */
            for (int i = 0; i < 64; i++) got[i] = 0xabcd;
            memcpy(edge - len, x + len, (size_t)len * sizeof(float));
            if (cs) memcpy(edge_scale - len, cs + len, (size_t)len * sizeof(float));
            nv_avx512_row_to_bf16(edge - len, cs ? edge_scale - len : NULL, got, len);
            for (int i = 0; i < 64; i++) bad += got[i] != (i < len ? nv_bf16_from_f32(cs ? x[len + i] * cs[len + i] : x[len + i]) : 0xabcd);
        }
    }
    for (int at = 0; at + 32 <= N; at += 32) {
        nv_avx512_vnni_pair16(x + at, x + at + 16, pairs);
        for (int c = 0; c < 16; c++) bad += pairs[2 * c] != nv_bf16_from_f32(x[at + c]) || pairs[2 * c + 1] != nv_bf16_from_f32(x[at + 16 + c]);
    }
    T_CHECK(bad == 0, "%d conversions differ from nv_bf16_from_f32", bad);
    free(x), free(scale), free(got), free(pairs);
    munmap(guard, 4 * page);
}

/* The fp32 engines compute every element of y, dx and dW as one chain of fused multiply-adds in
 * input order (dW continuing from its old value), however they block the depth, the rows and the
 * threads: shapes whose depths cross several depth blocks (and a last block a little over one),
 * and dW row counts past one row block, checked bit for bit against fmaf. */
static void test_fma_chains(void) {
    /* depths 288 and 576 end in a block over kc (with more rows than the few-rows order takes);
     * 600 x 7 x 330 splits dW's columns too; on 1, 2 and 3 threads */
    static const int shapes[][3] = {{600, 300, 20}, {300, 70, 330}, {30, 290, 7}, {1, 50, 330}, {7, 9, 600},
                                    {30, 40, 288}, {50, 20, 576}, {600, 7, 330}};
    const int before = nv_pool_threads();
    for (size_t t = 0; t < 3 * sizeof shapes / sizeof shapes[0]; t++) {
        const size_t s = t % (sizeof shapes / sizeof shapes[0]);
        if (s == 0) nv_pool_init(1 + (int)(t / (sizeof shapes / sizeof shapes[0])));
        const int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
        float *w = malloc(sizeof(float) * n * k), *x = malloc(sizeof(float) * m * k), *dy = malloc(sizeof(float) * m * n);
        float *y = malloc(sizeof(float) * m * n), *dx = malloc(sizeof(float) * m * k), *dw = malloc(sizeof(float) * n * k);
        uint64_t seed = 4242 + s;
        rnd(w, (size_t)n * k, &seed);
        rnd(x, (size_t)m * k, &seed);
        rnd(dy, (size_t)m * n, &seed);
        memcpy(dw, w, sizeof(float) * n * k);
        nv_plan *p;
        T_CHECK(nv_plan_build(&p, E, w, n, k) == NV_OK && nv_plan_engine(p) == E, "build");
        nv_plan_run(p, x, m, y);
        nv_plan_run_dx(p, dy, m, dx);
        nv_gemm_dw(E, dy, x, m, n, k, dw, 1);
        T_CHECK(check_chain("y", y, m, n, k, x, k, 1, w, k, 1, NULL) && check_chain("dx", dx, m, k, n, dy, n, 1, w, 1, k, NULL) &&
                    check_chain("dw", dw, n, k, m, dy, 1, n, x, 1, k, w),
                "%dx%dx%d, %d threads", m, n, k, nv_pool_threads());
        nv_plan_free(p);
        free(w), free(x), free(dy), free(y), free(dx), free(dw);
    }
    nv_pool_init(before);
}

/* ---------------------------------------------------------------- per engine */

static char skip_why[200];
static void skip_case(void) { t_skip(skip_why); }

/* A group of plans on one x gives each plan's nv_plan_run bits, and its epilogue visits every
 * element of m x n exactly once, after that element's products (it checks they are in place). */
typedef struct {
    int n;
    int *visits;
    const float *y0, *y1, *want0, *want1;
    int bad;
} visit_ctx;

static void visit_ep(void *vc, int r0, int r1, int c0, int c1) {
    visit_ctx *v = vc;
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) {
            size_t i = (size_t)r * v->n + c;
            __atomic_add_fetch(&v->visits[i], 1, __ATOMIC_RELAXED);
            if (memcmp(&v->y0[i], &v->want0[i], sizeof(float)) || memcmp(&v->y1[i], &v->want1[i], sizeof(float)))
                __atomic_store_n(&v->bad, 1, __ATOMIC_RELAXED);
        }
}

static void test_group(void) {
    static const int ms[] = {1, 3, 17, 40, 256};
    const int k = 100, ns[3] = {33, 16, 100};
    uint64_t seed = 4242;
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
        const int m = ms[mi];
        float *x = malloc(sizeof(float) * m * k), *w[3], *y[3], *want[3];
        nv_plan *p[3];
        rnd(x, (size_t)m * k, &seed);
        for (int i = 0; i < 3; i++) {
            w[i] = malloc(sizeof(float) * ns[i] * k);
            rnd(w[i], (size_t)ns[i] * k, &seed);
            T_CHECK(nv_plan_build(&p[i], E, w[i], ns[i], k) == NV_OK, "build");
            y[i] = malloc(sizeof(float) * m * ns[i]);
            want[i] = malloc(sizeof(float) * m * ns[i]);
            nv_plan_run(p[i], x, m, want[i]);
        }
        /* three plans of different widths (q, k, v of a GQA layer), no epilogue */
        nv_plan_run_group((const nv_plan *const *)p, 3, x, m, y, NULL, NULL);
        for (int i = 0; i < 3; i++)
            T_CHECK(!memcmp(y[i], want[i], sizeof(float) * m * ns[i]), "m=%d: plan %d of the group differs from its own run", m, i);
        /* two plans of one width with an epilogue (w1, w3 and SwiGLU; here both from the same W) */
        nv_plan *w13[2];
        T_CHECK(nv_plan_build(&w13[0], E, w[2], 100, k) == NV_OK && nv_plan_build(&w13[1], E, w[2], 100, k) == NV_OK, "build");
        float *y13[2] = {y[2], malloc(sizeof(float) * m * 100)};
        visit_ctx v = {100, calloc((size_t)m * 100, sizeof(int)), y13[0], y13[1], want[2], want[2], 0};
        nv_plan_run_group((const nv_plan *const *)w13, 2, x, m, y13, visit_ep, &v);
        int once = 1;
        for (int i = 0; i < m * 100; i++) once &= v.visits[i] == 1;
        T_CHECK(once, "m=%d: the epilogue did not visit every element exactly once", m);
        T_CHECK(!v.bad, "m=%d: the epilogue ran before its block's products were in place", m);
        free(y13[1]), free(v.visits);
        nv_plan_free(w13[0]), nv_plan_free(w13[1]);
        for (int i = 0; i < 3; i++) nv_plan_free(p[i]), free(w[i]), free(y[i]), free(want[i]);
        free(x);
    }
}

/* The int8 engine a block-quantized plan asked of E takes its integer dot products to (amx-int8:
 * avx512-int8's loop), or NV_ENGINE_COUNT for the engines that do not take them. */
static nv_engine_id qdot_on(nv_engine_id e) {
    __builtin_cpu_init();
    const int avxvnni = __builtin_cpu_supports("avxvnni") && !emulated_section; /* avx2-int8's loop with a dot product */
    if (e == NV_ENGINE_AMX_INT8)
        e = nv_engine_available(NV_ENGINE_AVX512_INT8) ? NV_ENGINE_AVX512_INT8
            : nv_engine_available(NV_ENGINE_AVX2_INT8) ? NV_ENGINE_AVX2_INT8
                                                        : NV_ENGINE_COUNT;
    return e == NV_ENGINE_AVX512_INT8 || (e == NV_ENGINE_AVX2_INT8 && avxvnni) ? e : NV_ENGINE_COUNT;
}

/* The bound on a qdot plan's |y - fp32 y| for row x against output j's values q (scales s, offsets
 * o or NULL, blocks of qb; the plan's blocks kq = 32 or 16): the activations quantised per kq-block
 * with half-step hx = (max|x|/127)/2 move the products of q s by at most hx |q s| (the offset's
 * term uses x's exact sum, or, folded as c times the scale, meets the quantised x too: hx |o|);
 * plus fp32 terms over S = 2 sum |x| (|q s| + |o|). */
static double qdot_tol(const float *x, const int8_t *q, const float *s, const float *o, int qb, int k) {
    const int kq = qb % 32 == 0 ? 32 : 16;
    double S = 0, Q = 0;
    for (int b0 = 0; b0 < k; b0 += kq) {
        const int len = k - b0 < kq ? k - b0 : kq;
        const double hx = half_step(x + b0, len);
        for (int i = b0; i < b0 + len; i++) {
            const double qs = fabs((double)q[i] * s[i / qb]) + (o ? fabs((double)o[i / qb]) : 0); /* a folded offset too */
            S += 2 * fabs((double)x[i]) * qs;
            Q += hx * qs;
        }
    }
    return Q + (k + 12) * U * (S + Q) + 2.0 * (k + 2) * U * S + 1e-30 * k;
}

/* Block-quantized plans (int8 values, per-block scales and optional offsets, slices turned into
 * fp32 in L1) give exactly the bits of an fp32 plan on the same weights as floats, with 8-bit panels
 * and, when every value is 0..15, with 4-bit ones; so do fp16 weights kept as fp16 (bits 16) and
 * bf16 ones kept as bf16 (NV_QBITS_BF16); the AMX engines refuse them (the caller then builds an fp32
 * plan); and 4-bit indices into a table of 16 values (IQ4's), looked up as the slices are made. On
 * the int8 engines a block-quantized plan multiplies its values by the activations quantized per
 * block (qdot): within qdot_tol of the fp32 plan, and its packed size is the values (4 or 8 bits,
 * indices 4), a scale and an offset per 16 or 32 of them. */
static void test_quant(void) {
    static const int shapes[][3] = {{1, 37, 288}, {1, 64, 512}, {1, 80, 96}, {2, 64, 96}, {3, 33, 64}, {5, 20, 100},
                                    {7, 100, 288}, {16, 48, 512}, {17, 15, 32}, {25, 64, 96}, {200, 40, 288}};
    uint64_t seed = 4242;
    static const int kinds[] = {4, 8, 16, NV_QBITS_BF16, -4}; /* -4: indices into lut */
    static const int8_t lut[16] = {-128, -101, -80, -62, -47, -33, -20, -8, 3, 14, 27, 40, 55, 72, 93, 127};
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++)
    for (int table = kinds[ki] < 0, qb = table ? 32 : 16, bits = table ? 4 : kinds[ki], half = bits >= 16; qb <= (half ? 16 : 32);
         qb += 16) /* fp16, bf16: no blocks, no offsets; tables: blocks of 32, as IQ4's */
        for (int off = 0; off < (half ? 1 : 3); off++) /* off 2: offsets -8 times the scale, as Q4_0's */
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const int m = shapes[si][0], n = shapes[si][1], k = shapes[si][2], nb = (k + qb - 1) / qb;
                int8_t *q = malloc((size_t)n * k);
                float *s = malloc(sizeof(float) * n * nb), *o = malloc(sizeof(float) * n * nb);
                float *w = malloc(sizeof(float) * n * k), *x = malloc(sizeof(float) * m * k);
                float *y0 = malloc(sizeof(float) * m * n), *y1 = malloc(sizeof(float) * m * n);
                rnd(s, (size_t)n * nb, &seed);
                rnd(o, (size_t)n * nb, &seed);
                for (int i = 0; off == 2 && i < n * nb; i++) o[i] = -8.0f * s[i];
                rnd(x, (size_t)m * k, &seed);
                for (size_t i = 0; i < (size_t)n * k; i++) {
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    q[i] = bits == 4 ? (int8_t)(seed >> 60) : (int8_t)(seed >> 56);
                }
                if (bits == 8) q[(size_t)n * k / 2] = 16; /* one value past 4 bits keeps the plan at 8 */
                uint16_t *h = half ? malloc(sizeof(uint16_t) * n * k) : NULL;
                int8_t *qv = malloc((size_t)n * k); /* the values the indices stand for */
                for (size_t i = 0; i < (size_t)n * k; i++) qv[i] = table ? lut[q[i]] : q[i];
                for (int j = 0; j < n; j++)
                    for (int kk = 0; kk < k; kk++) {
                        float v = (float)qv[(size_t)j * k + kk] * s[(size_t)j * nb + kk / qb];
                        if (off) v = v + o[(size_t)j * nb + kk / qb];
                        uint16_t *hv = h ? h + (size_t)j * k + kk : NULL;
                        if (hv && bits == 16) { /* fp16 weights, of every exponent fp16 has */
                            *hv = (uint16_t)_cvtss_sh(v * 1e-3f * (float)(1 << (kk % 20)), _MM_FROUND_TO_NEAREST_INT);
                            v = _cvtsh_ss(*hv);
                        } else if (hv) { /* bf16 weights, of exponents far past fp16's */
                            *hv = nv_bf16_from_f32(v * ldexpf(1.0f, kk % 160 - 80));
                            v = nv_f32_from_bf16(*hv);
                        }
                        w[(size_t)j * k + kk] = v;
                    }
                nv_qweights qw = {.q = h ? NULL : q, .s = h ? NULL : s, .o = off ? o : NULL, .qb = qb, .h = h, .h_bf16 = bits == NV_QBITS_BF16,
                                  .lut = table ? lut : NULL};
                nv_plan *pq = NULL, *pf = NULL;
                const char *kind = table ? "4-bit indices" : bits == 4 ? "4-bit" : bits == 8 ? "8-bit" : bits == 16 ? "fp16" : "bf16";
                nv_err e = nv_plan_build_quant(&pq, E, &qw, n, k);
                /* the vector bf16 and int8 engines keep block-quantized values on avx512's panels (avx2-int8
                   on avx2's where avx512 is off); fp16 and bf16 ones they refuse (their own form is as small) */
                const nv_engine_id qe = half ? NV_ENGINE_COUNT : qdot_on(E);
                const nv_engine_id on = half ? E
                                        : E == NV_ENGINE_AVX512_BF16 || E == NV_ENGINE_AVX512_INT8 ? NV_ENGINE_AVX512
                                        : E == NV_ENGINE_AVX2_INT8 ? (nv_engine_available(NV_ENGINE_AVX512) ? NV_ENGINE_AVX512 : NV_ENGINE_AVX2)
                                                                   : E;
                const nv_engine_id fe = nv_engine_available(NV_ENGINE_AVX512) ? NV_ENGINE_AVX512 : NV_ENGINE_AVX2;
                if (qe != NV_ENGINE_COUNT) {
                    if (e != NV_OK || nv_plan_engine(pq) != qe || nv_plan_build(&pf, fe, w, n, k) != NV_OK) {
                        T_CHECK(0, "build on %s: %s", nv_engine_name(qe), e == NV_OK ? nv_engine_name(nv_plan_engine(pq)) : nv_errmsg());
                    } else {
                        nv_plan_run(pq, x, m, y0);
                        nv_plan_run(pf, x, m, y1);
                        int bad = 0;
                        for (int r = 0; r < m; r++)
                            for (int j = 0; j < n; j++) {
                                const double tol = qdot_tol(x + (size_t)r * k, qv + (size_t)j * k, s + (size_t)j * nb,
                                                            off ? o + (size_t)j * nb : NULL, qb, k);
                                bad += !(fabs((double)y0[(size_t)r * n + j] - y1[(size_t)r * n + j]) <= tol);
                            }
                        T_CHECK(!bad, "%dx%dx%d, %s, blocks of %d%s on %s: %d outputs past the bound", m, n, k, kind, qb,
                                off ? " with offsets" : "", nv_engine_name(qe), bad);
                        const size_t want = (size_t)(n + 15) / 16 * ((size_t)(k + qb - 1) / qb) *
                                            ((size_t)qb * (bits == 4 ? 8 : 16) + 64 + (off == 1 ? 64 : 0)); /* folded: none */
                        T_CHECK(nv_plan_quantized(pq) == bits && nv_plan_packed_bytes(pq) == want, "%s on %s: quantized %d, packed bytes %zu, not %zu",
                                kind, nv_engine_name(qe), nv_plan_quantized(pq), nv_plan_packed_bytes(pq), want);
                    }
                } else if (on != NV_ENGINE_AVX2 && on != NV_ENGINE_AVX512) {
                    T_CHECK(e == NV_EUNSUPPORTED && !pq, "%s built a block-quantized plan", nv_engine_name(E));
                } else if (e != NV_OK || nv_plan_engine(pq) != on || nv_plan_build(&pf, on, w, n, k) != NV_OK) {
                    T_CHECK(0, "build: %s", nv_errmsg());
                } else {
                    nv_plan_run(pq, x, m, y0);
                    nv_plan_run(pf, x, m, y1);
                    T_CHECK(memcmp(y0, y1, sizeof(float) * m * n) == 0, "%dx%dx%d, %s, blocks of %d%s: differs from the fp32 plan",
                            m, n, k, kind, qb, off ? " with offsets" : "");
                    /* the padded outputs (fp32 panels: 4 bytes per weight) times bits per value, plus the
                     * float scales (and offsets) per block; avx2's kernel has no lookup: the table's values, 8-bit */
                    const int pbits = table && on == NV_ENGINE_AVX2 ? 8 : bits;
                    const size_t outs = nv_plan_packed_bytes(pf) / 4 / (size_t)k;
                    const size_t want = outs * (size_t)k * (half ? 16 : pbits) / 8 + (h ? 0 : outs * (size_t)nb * 4 * (off ? 2 : 1));
                    T_CHECK(nv_plan_quantized(pq) == pbits && !nv_plan_quantized(pf) && nv_plan_packed_bytes(pq) == want,
                            "%s: quantized %d, packed bytes %zu vs %zu", kind, nv_plan_quantized(pq),
                            nv_plan_packed_bytes(pq), nv_plan_packed_bytes(pf));
                }
                nv_plan_free(pq);
                nv_plan_free(pf);
                free(q), free(qv), free(s), free(o), free(w), free(x), free(y0), free(y1), free(h);
            }
    nv_plan *p = NULL;
    nv_qweights bad = {.qb = 32};
    T_CHECK(nv_plan_build_quant(&p, E, &bad, 4, 64) != NV_OK && !p, "weights without values accepted");
}

/* The k-quants' integer form (nv_qweights.sub: integer scales and offsets per block, floats per
 * super-block): an int8 engine's plan keeps it, one byte a block's scale or offset instead of four,
 * and lands within the bound of the activations quantised per super-block (hx per 256 or 512
 * depths; the offsets' terms on the quantised activations: hx |o|) of the fp32 plan over the same
 * weights; an integer form that does not multiply out to the float scales is not used (the plan
 * keeps float scales per block: larger, still within its bound). */
static void test_quant_super(void) {
    const nv_engine_id qe = qdot_on(E);
    if (qe == NV_ENGINE_COUNT) return;
    /* m, n, k, qb, blocks per super-block, 4-bit values, offsets (integer minimums) */
    static const int forms[][7] = {{1, 40, 512, 32, 8, 1, 1},  {7, 33, 256, 16, 16, 0, 0}, {3, 17, 256, 16, 16, 1, 1},
                                   {16, 16, 768, 32, 8, 0, 1}, {2, 50, 512, 16, 16, 0, 0}};
    uint64_t seed = 777;
    for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++)
        for (int broken = 0; broken < 2; broken++) {
            const int m = forms[fi][0], n = forms[fi][1], k = forms[fi][2], qb = forms[fi][3], sub = forms[fi][4], four = forms[fi][5],
                      off = forms[fi][6], nb = k / qb, nsb = nb / sub;
            int8_t *q = malloc((size_t)n * k), *isc = malloc((size_t)n * nb), *imn = malloc((size_t)n * nb);
            float *s = malloc(sizeof(float) * n * nb), *o = malloc(sizeof(float) * n * nb), *d = malloc(sizeof(float) * n * nsb),
                  *dm = malloc(sizeof(float) * n * nsb), *w = malloc(sizeof(float) * n * k), *x = malloc(sizeof(float) * m * k),
                  *y0 = malloc(sizeof(float) * m * n), *y1 = malloc(sizeof(float) * m * n);
            rnd(d, (size_t)n * nsb, &seed);
            rnd(dm, (size_t)n * nsb, &seed);
            rnd(x, (size_t)m * k, &seed);
            for (int i = 0; i < n * nb; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                isc[i] = four ? (int8_t)(seed >> 58) : (int8_t)(seed >> 56); /* 0..63, as Q4_K's; or any byte, as Q6_K's */
                imn[i] = (int8_t)((seed >> 20) & 63);
                s[i] = d[i / sub] * (float)isc[i];
                o[i] = dm[i / sub] * (float)imn[i];
            }
            if (broken) s[n * nb / 2] = nextafterf(s[n * nb / 2], INFINITY); /* one scale off its integer form */
            for (size_t i = 0; i < (size_t)n * k; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                q[i] = four ? (int8_t)(seed >> 60) : (int8_t)((int)(seed >> 58) - 32);
                const size_t b = i / (size_t)qb;
                w[i] = off ? (float)q[i] * s[b] + o[b] : (float)q[i] * s[b];
            }
            const nv_qweights qw = {.q = q, .s = s, .o = off ? o : NULL, .qb = qb, .sub = sub, .sub_s = isc,
                                    .sub_o = off ? imn : NULL, .sup_s = d, .sup_o = off ? dm : NULL};
            nv_plan *pq = NULL, *pf = NULL;
            if (nv_plan_build_quant(&pq, E, &qw, n, k) != NV_OK || nv_plan_build(&pf, NV_ENGINE_AVX512, w, n, k) != NV_OK) {
                T_CHECK(0, "build: %s", nv_errmsg());
            } else {
                nv_plan_run(pq, x, m, y0);
                nv_plan_run(pf, x, m, y1);
                const int span = broken ? (qb % 32 ? 16 : 32) : qb * sub; /* the activations' scaling blocks */
                int bad = 0;
                for (int r = 0; r < m; r++)
                    for (int j = 0; j < n; j++) {
                        double S = 0, Q = 0;
                        for (int b0 = 0; b0 < k; b0 += span) {
                            const double hx = half_step(x + (size_t)r * k + b0, span);
                            for (int i = b0; i < b0 + span; i++) {
                                const size_t wi = (size_t)j * k + i, bi = wi / (size_t)qb;
                                const double qs = fabs((double)q[wi] * s[bi]) + (off ? fabs((double)o[bi]) : 0);
                                S += 2 * fabs((double)x[(size_t)r * k + i]) * qs;
                                Q += hx * qs;
                            }
                        }
                        const double tol = Q + (k + 12) * U * (S + Q) + 2.0 * (k + 2) * U * S;
                        bad += !(fabs((double)y0[(size_t)r * n + j] - y1[(size_t)r * n + j]) <= tol);
                    }
                const size_t tiles = (size_t)(n + 15) / 16,
                             want = broken ? tiles * nb * ((size_t)qb * (four ? 8 : 16) + 64 + (off ? 64 : 0))
                                           : tiles * nsb * ((size_t)sub * ((size_t)qb * (four ? 8 : 16) + 16 * (off ? 2 : 1)) + 64 * (off ? 2 : 1));
                T_CHECK(!bad && nv_plan_engine(pq) == qe && nv_plan_packed_bytes(pq) == want,
                        "%dx%dx%d, blocks of %d, %d a super-block%s%s on %s: %d outputs past the bound, %zu packed bytes (want %zu)",
                        m, n, k, qb, sub, off ? ", offsets" : "", broken ? ", an inexact integer form" : "",
                        nv_engine_name(nv_plan_engine(pq)), bad, nv_plan_packed_bytes(pq), want);
            }
            nv_plan_free(pq), nv_plan_free(pf);
            free(q), free(isc), free(imn), free(s), free(o), free(d), free(dm), free(w), free(x), free(y0), free(y1);
        }
}

/* nv_bpack: B packed from n rows of k (rows) or k rows of n (cols), then C (+)= A . B over the whole
 * depth and outputs, a prefix of each and no depth at all, of the pack and of a view from an aligned
 * output and depth on, against a double reference (amx engines: bf16 tiles,
 * within the bf16 bound); nothing outside the m x ncols block of C is written. */
static void test_bpack(void) {
    static const int kn[][2] = {{1, 1}, {31, 15}, {64, 33}, {100, 100}, {300, 17}};
    static const int ms[] = {1, 5, 30, 70};
    uint64_t seed = 99;
    for (size_t si = 0; si < sizeof kn / sizeof kn[0]; si++)
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
            for (int layout = 0; layout < 2; layout++) {
                const int k = kn[si][0], n = kn[si][1], m = ms[mi], lda = k + 3, ldb = (layout ? n : k) + 2, ldc = n + 5;
                float *a = malloc((size_t)m * lda * 4), *b = malloc((size_t)(layout ? k : n) * ldb * 4);
                float *c = malloc((size_t)(m + 1) * ldc * 4), *buf = malloc(nv_bpack_floats(k, n) * 4);
                rnd(a, (size_t)m * lda, &seed);
                rnd(b, (size_t)(layout ? k : n) * ldb, &seed);
                nv_bpack bp;
                if (layout) nv_bpack_cols(&bp, E, b, (size_t)ldb, k, n, buf);
                else nv_bpack_rows(&bp, E, b, (size_t)ldb, n, k, buf);
                T_CHECK(bp.k == k && bp.n == n, "pack shape");
                /* activations: an int8 engine packs for its bf16 one (or the next on below it), every
                   other engine for itself */
                nv_engine_id want = nv_engine_bf16_of(E);
                while (!nv_engine_available(want)) want = nv_engine_next_down(want);
                T_CHECK(bp.e == want, "packed for %s on %s", nv_engine_name(bp.e), nv_engine_name(E));
                /* the whole pack, then a view from an aligned output and depth on (nv_bpack_skip) */
                const int al = nv_bpack_align(&bp);
                T_CHECK(al >= 1 && (al & (al - 1)) == 0, "alignment %d is a power of two", al);
                for (int skip = 0; skip < 2; skip++) {
                    const int col0 = skip && n > al ? al : 0, d0 = skip && k > al ? al : 0, vk = k - d0, vn = n - col0;
                    nv_bpack view;
                    nv_bpack_skip(&bp, col0, d0, &view);
                    T_CHECK(view.k == vk && view.n == vn, "view shape");
                    const int depths[3] = {vk, vk / 2 + 1, 0}, cols[2] = {vn, vn > 1 ? vn - 1 : 1};
                    for (int v = 0; v < 12; v++) { /* every depth x outputs x accumulate */
                        const int depth = depths[v % 3], ncols = cols[v / 3 % 2], acc = v >= 6;
                        for (size_t i = 0; i < (size_t)(m + 1) * ldc; i++) c[i] = 0.5f;
                        nv_bpack_run(&view, a, (size_t)lda, m, depth, ncols, c, (size_t)ldc, acc);
                        for (int r = 0; r <= m; r++)
                            for (int j = 0; j < ldc; j++) {
                                const float got = c[(size_t)r * ldc + j];
                                if (r == m || j >= ncols) {
                                    T_CHECK(got == 0.5f, "wrote outside C's block: [%d][%d] (m=%d ncols=%d)", r, j, m, ncols);
                                    continue;
                                }
                                double want = acc ? 0.5 : 0.0, S = 0.0;
                                for (int kk = 0; kk < depth; kk++) {
                                    const double bv = layout ? b[(size_t)(d0 + kk) * ldb + col0 + j] : b[(size_t)(col0 + j) * ldb + d0 + kk];
                                    want += (double)a[(size_t)r * lda + kk] * bv;
                                    S += fabs((double)a[(size_t)r * lda + kk] * bv);
                                }
                                const double tol = nv_engine_low_precision(bp.e) ? bf16_tol(depth, S, acc ? 0.5 : 0.0) : 1e-5 * (S + (acc ? 0.5 : 0.0)) + 1e-30;
                                T_CHECK(fabs(got - want) <= tol, "%s k=%d n=%d m=%d from %d,%d depth=%d ncols=%d acc=%d: C[%d][%d] = %.9g, want %.9g",
                                        layout ? "cols" : "rows", k, n, m, col0, d0, depth, ncols, acc, r, j, got, want);
                            }
                    }
                }
                free(a), free(b), free(c), free(buf);
            }
}

static void run_engine_cases(nv_engine_id e, const char *suffix) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"plan_run on awkward shapes", test_run_shapes},
                 {"refresh without rebuilding", test_refresh},
                 {"NaN and infinity propagate", test_nonfinite_propagates},
                 {"run_dx", test_dx},
                 {"dx after refresh equals a fresh plan's", test_dx_after_refresh},
                 {"gemm_dw", test_dw},
                 {"a gemm_dw group gives each product's bits", test_dw_group},
                 {"gemm_dw written instead of added: the bits added to zeros give", test_dw_overwrite},
                 {"1 and 2 threads give identical bits", test_threads_identical},
                 {"a plan group gives its plans' bits and one epilogue pass", test_group},
                 {"block-quantized plans: the bits of fp32 plans (int8 engines: within the per-block bound)", test_quant},
                 {"k-quant super-blocks with integer scales: within their bound on the int8 engines", test_quant_super},
                 {"products on the calling thread (nv_bpack)", test_bpack}};
    E = e;
    snprintf(skip_why, sizeof skip_why, "engine %s is off: %s", nv_engine_name(e), nv_engine_why_off(e));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s%s: %s", nv_engine_name(e), suffix, cases[i].name);
        t_run(name, nv_engine_available(e) ? cases[i].fn : skip_case);
    }
    if (e == NV_ENGINE_AVX2 || e == NV_ENGINE_AVX512) {
        char name[160];
        snprintf(name, sizeof name, "%s%s: y, dx and dW are one fused multiply-add chain per element", nv_engine_name(e), suffix);
        t_run(name, nv_engine_available(e) ? test_fma_chains : skip_case);
    }
}

/* ---------------------------------------------------------------- the int8 engines agree */

/* The int8 kernels on the same tiles: amx-int8's (emulated tiles) on A as signed bytes; on A + 128
 * with the sums started at -128 * sum(B's column), avx512-int8's emulation, the avx2-int8 loop, and
 * where the CPU has them the AVX512_VNNI and AVX-VNNI loops: all the same bits, on random bytes, alternating extremes, and every byte
 * 127 at the deepest depth a plan takes (131,072), where the unsigned sums pass 2^31 and wrap while
 * the true ones (2.11e9) do not. */
static void test_int8_kernels_agree(void) {
    static const int shapes[][3] = {{1, 1, 64}, {2, 5, 128}, {3, 2, 192}, {8, 3, 64}, {17, 4, 320}, {33, 1, 64}, {1, 1, 131072}};
    enum { NK8 = 5 };
    const nv_kern_amx *k8[NK8] = {&nv_kern_amx_emu, &nv_kern_avx512int8_emu, &nv_kern_avx2int8, NULL, NULL};
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni"))
        k8[3] = &nv_kern_avx512int8;
    if (__builtin_cpu_supports("avxvnni")) k8[4] = &nv_kern_avxvnni_int8;
    uint64_t seed = 8;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int extreme = 0; extreme < 3; extreme++) {
            const int rows = shapes[si][0], nt = shapes[si][1], Kp = shapes[si][2], n = nt * 16, arows = (rows + 15) / 16 * 16;
            int8_t *A = calloc((size_t)arows * Kp, 1), *Au = calloc((size_t)arows * Kp, 1), *B = malloc((size_t)n * Kp);
            float *xs = malloc(sizeof(float) * rows), *ws = malloc(sizeof(float) * n), *C[NK8];
            int32_t *wc = calloc((size_t)n, sizeof(int32_t));
            for (int i = 0; i < rows * Kp; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                A[i] = extreme == 2 ? 127 : extreme ? (i % 3 ? 127 : -127) : (int8_t)((int)(seed >> 56) % 255 - 127);
                Au[i] = (int8_t)(A[i] ^ 0x80);
            }
            for (int i = 0; i < n * Kp; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                B[i] = extreme == 2 ? 127 : extreme ? (i % 5 ? -127 : 127) : (int8_t)((int)(seed >> 56) % 255 - 127);
            }
            /* tile (t, kb), row i, column c, byte e holds output t*16 + c at depth kb*64 + 4i + e */
            for (int t = 0; t < nt; t++)
                for (int kk = 0; kk < Kp; kk++)
                    for (int c = 0; c < 16; c++)
                        wc[t * 16 + c] -= 128 * B[((size_t)t * (Kp / 64) + kk / 64) * 1024 + ((kk % 64) / 4) * 64 + c * 4 + kk % 4];
            rnd(xs, (size_t)rows, &seed);
            rnd(ws, (size_t)n, &seed);
            for (int v = 0; v < NK8; v++) {
                C[v] = malloc(sizeof(float) * rows * n);
                if (!k8[v]) continue;
                T_CHECK(k8[v]->int8_unsigned == (v > 0), "%s: int8_unsigned", k8[v]->name);
                k8[v]->int8_gemm(v ? Au : A, (size_t)Kp, rows, Kp, B, nt, xs, ws, wc, C[v], (size_t)n, n - 3);
                if (v)
                    for (int r = 0; r < rows; r++)
                        T_CHECK(memcmp(C[0] + (size_t)r * n, C[v] + (size_t)r * n, sizeof(float) * (n - 3)) == 0,
                                "%s differs from amx-int8 at row %d of %d x %d x %d%s", k8[v]->name, r, rows, n, Kp,
                                extreme ? " (extreme bytes)" : "");
            }
            if (si == 0 && extreme == 0 && (!k8[3] || !k8[4]))
                printf("    (not run here: %s%s%s)\n", k8[3] ? "" : "the AVX512_VNNI loop", !k8[3] && !k8[4] ? " and " : "",
                       k8[4] ? "" : "the AVX-VNNI loop");
            free(A), free(Au), free(B), free(xs), free(ws), free(wc);
            for (int v = 0; v < NK8; v++) free(C[v]);
        }
}

/* Runs instance kq's qdot_gemm and counts the outputs that differ from want in their bits, and
 * those written at or past ncols (got is rows x n). */
static void qdot_instance_check(const nv_kern_amx *kq, const nv_qdot_a *a, int rows, const nv_qdot_b *b, int nt, int n, int ncols,
                                const float *want, float *got, int *bad, int *past) {
    for (int e = 0; e < rows * n; e++) got[e] = 12345.0f;
    kq->qdot_gemm(a, rows, b, nt, got, (size_t)n, ncols);
    *bad = *past = 0;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n; j++) {
            const float g = got[(size_t)r * n + j];
            if (j >= ncols) *past += g != 12345.0f;
            else *bad += memcmp(&g, &want[(size_t)r * n + j], sizeof g) != 0;
        }
}

/* The block-quantized loop (kern.h's qdot_gemm) of every instance — the emulated VPDPBUSD, and
 * where the CPU has them AVX512_VNNI and AVX-VNNI — gives exactly a reference
 * written from the definition: per block the int32 sum of the values (4-bit as they are, 8-bit
 * stored + 128) times the signed activations, started at bias times the activations' sum, then the fp32 chain
 * y = fma((float)sum, s * xs, y) and y = fma(o, xsum, y); on 1-13 rows, 1-5 tiles, blocks of 16 and
 * 32, extreme bytes included; nothing past ncols is written. */
static void test_qdot_kernels_agree(void) {
    enum { NQ = 4 };
    const nv_kern_amx *kq[NQ] = {&nv_kern_avx512int8_emu, NULL, NULL, NULL};
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni"))
        kq[2] = &nv_kern_avx512int8;
    if (__builtin_cpu_supports("avxvnni")) kq[3] = &nv_kern_avxvnni_int8;
    static const int shapes[][3] = {{1, 1, 1}, {2, 3, 2}, {3, 2, 3}, {5, 5, 1}, {6, 2, 4}, {7, 4, 2}, {13, 3, 3}}; /* rows, tiles, blocks */
    uint64_t seed = 31;
    int runs = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int v = 0; v < 10; v++) { /* 8 and 9: 4-bit indices into a table of 16 bytes (IQ4's), blocks of 32 */
            const int table = v >= 8, rows = shapes[si][0], nt = shapes[si][1], nb = shapes[si][2];
            const int kqd = !table && v & 1 ? 16 : 32, four = table || (v >> 1 & 1), off = table ? v & 1 : v >> 2 & 1, extreme = si == 4;
            static const uint8_t lut[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 255};
            const int n = nt * 16, ncols = n - (int)(si % 3), k = nb * kqd;
            const size_t bs = nv_qdot_block_bytes(kqd, four, off), qbytes = (size_t)kqd * (four ? 8 : 16);
            int8_t *A = malloc((size_t)rows * k);
            uint8_t *B = malloc((size_t)nt * nb * bs);
            float *xs = malloc(sizeof(float) * rows * nb), *xsum = malloc(sizeof(float) * rows * nb);
            int32_t *qsum = malloc(sizeof(int32_t) * rows * nb);
            const int bias = (four && !table ? 0 : -128) - (si % 2 ? 8 : 0); /* offsets -8 times the scale folded, or none */
            float *want = malloc(sizeof(float) * rows * n), *got = malloc(sizeof(float) * rows * n);
            for (int i = 0; i < rows * k; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                A[i] = extreme ? (i % 2 ? 127 : -127) : (int8_t)((int)(seed >> 56) % 255 - 127);
            }
            for (size_t i = 0; i < (size_t)nt * nb * bs; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                B[i] = extreme ? 255 : (uint8_t)(seed >> 56);
            }
            rnd(xs, (size_t)rows * nb, &seed);
            rnd(xsum, (size_t)rows * nb, &seed);
            for (int i = 0; i < rows * nb; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                qsum[i] = (int32_t)(seed >> 52) - 2048;
            }
            for (int t = 0; t < nt; t++)
                for (int b = 0; b < nb; b++) { /* scales and offsets: finite floats in the blocks' float slots */
                    float *f = (float *)(void *)(B + ((size_t)t * nb + b) * bs + qbytes);
                    rnd(f, off ? 32 : 16, &seed);
                }
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < n; j++) {
                    const int t = j / 16, c = j % 16;
                    float y = 0.0f;
                    for (int b = 0; b < nb; b++) {
                        const uint8_t *blk = B + ((size_t)t * nb + b) * bs;
                        int32_t sum = bias * qsum[r * nb + b];
                        for (int d = 0; d < kqd; d++) {
                            int wv = four ? (blk[(d / 8) * 64 + c * 4 + d % 4] >> (d % 8 < 4 ? 0 : 4)) & 15
                                          : blk[(d / 4) * 64 + c * 4 + d % 4];
                            if (table) wv = lut[wv];
                            sum += wv * A[(size_t)r * k + b * kqd + d];
                        }
                        const float *f = (const float *)(const void *)(blk + qbytes);
                        y = fmaf((float)sum, f[c] * xs[r * nb + b], y);
                        if (off) y = fmaf(f[16 + c], xsum[r * nb + b], y);
                    }
                    want[(size_t)r * n + j] = y;
                }
            const nv_qdot_a a = {A, (size_t)k, xs, xsum, qsum};
            const nv_qdot_b qb = {B, nb, kqd, four, off, bias, table ? lut : NULL, 0};
            for (int i = 0; i < NQ; i++) {
                if (!kq[i]) continue;
                int bad, past;
                qdot_instance_check(kq[i], &a, rows, &qb, nt, n, ncols, want, got, &bad, &past);
                T_CHECK(!bad && !past, "%s: %d outputs differ from the reference, %d written past ncols (%d rows, %d tiles, %d blocks of %d, %s%s)",
                        kq[i]->name, bad, past, rows, nt, nb, kqd, table ? "table" : four ? "4-bit" : "8-bit", off ? ", offsets" : "");
                runs++;
            }
            free(A), free(B), free(xs), free(xsum), free(qsum), free(want), free(got);
        }
    if (!kq[2] || !kq[3])
        printf("    (not run here: %s%s%s)\n", kq[2] ? "" : "the AVX512_VNNI loop", !kq[2] && !kq[3] ? " and " : "",
               kq[3] ? "" : "the AVX-VNNI loop");
    printf("    %d products equal the reference\n", runs);
}

/* The loop over super-blocks (nv_qdot_b.sub) of every instance gives exactly a reference written
 * from the definition: per block the int32 sum started at bias times the activations' block sum,
 * times the block's integer scale, summed over the super-block (and the offsets' integers times the
 * block sums), then y = fma((float)isum, d * xs, y), y = fma((float)imin, dm * xs, y); the five
 * forms of the k-quants (Q4_K/Q5_K-like, Q6_K, Q2_K, Q3_K's folded -4, IQ4_XS's table), random
 * bytes everywhere (the int32 sums wrap as the instructions' do). */
static void test_qdot_super_kernels_agree(void) {
    const nv_kern_amx *kq[3] = {&nv_kern_avx512int8_emu, NULL, NULL};
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512vnni"))
        kq[1] = &nv_kern_avx512int8;
    if (__builtin_cpu_supports("avxvnni")) kq[2] = &nv_kern_avxvnni_int8;
    /* kq, four (2: table), offsets, blocks per super-block, bias */
    static const int forms[][5] = {{32, 1, 1, 8, 0}, {32, 0, 1, 8, -128}, {16, 0, 0, 16, -128}, {16, 1, 1, 16, 0}, {16, 1, 0, 16, -4}, {32, 2, 0, 8, -128}};
    static const int shapes[][3] = {{1, 1, 1}, {2, 3, 2}, {5, 2, 1}, {7, 4, 2}, {13, 1, 1}}; /* rows, tiles, super-blocks */
    static const uint8_t lut[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 255};
    uint64_t seed = 4711;
    int runs = 0;
    for (size_t fi = 0; fi < sizeof forms / sizeof forms[0]; fi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int kqd = forms[fi][0], four = forms[fi][1], off = forms[fi][2], sub = forms[fi][3], bias = forms[fi][4];
            const int rows = shapes[si][0], nt = shapes[si][1], nsb = shapes[si][2], nb = nsb * sub, k = nb * kqd;
            const int n = nt * 16, ncols = n - (int)(si % 3);
            const nv_qdot_b qb = {NULL, nb, kqd, four != 0, off, bias, four == 2 ? lut : NULL, sub};
            const size_t sbs = nv_qdot_super_bytes(kqd, four != 0, off, sub), qbytes = (size_t)kqd * (four ? 8 : 16);
            uint8_t *B = malloc(nv_qdot_tile_bytes(&qb) * nt);
            int8_t *A = malloc((size_t)rows * k);
            float *xs = malloc(sizeof(float) * rows * nsb), *want = malloc(sizeof(float) * rows * n), *got = malloc(sizeof(float) * rows * n);
            int32_t *qsum = malloc(sizeof(int32_t) * rows * nb);
            for (int i = 0; i < rows * k; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                A[i] = (int8_t)((int)(seed >> 56) % 255 - 127);
            }
            for (size_t i = 0; i < nv_qdot_tile_bytes(&qb) * nt; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                B[i] = (uint8_t)(seed >> 56);
            }
            for (int t = 0; t < nt; t++) /* d and dm: finite floats in their slots */
                for (int sb = 0; sb < nsb; sb++)
                    rnd((float *)(void *)(B + ((size_t)t * nsb + sb) * sbs + nv_qdot_super_floats(kqd, four != 0, off, sub)), off ? 32 : 16, &seed);
            rnd(xs, (size_t)rows * nsb, &seed);
            for (int i = 0; i < rows * nb; i++) {
                seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                qsum[i] = (int32_t)(seed >> 52) - 2048;
            }
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < n; j++) {
                    const int t = j / 16, c = j % 16;
                    float y = 0.0f;
                    for (int sb = 0; sb < nsb; sb++) {
                        const uint8_t *base = B + ((size_t)t * nsb + sb) * sbs;
                        const int8_t *isc = (const int8_t *)(base + (size_t)sub * qbytes), *imn = isc + sub * 16;
                        const float *f = (const float *)(const void *)(base + nv_qdot_super_floats(kqd, four != 0, off, sub));
                        int64_t isum = 0, imin = 0;
                        for (int jb = 0; jb < sub; jb++) {
                            const uint8_t *blk = base + (size_t)jb * qbytes;
                            const int kb = sb * sub + jb;
                            int64_t sum = (int64_t)bias * qsum[r * nb + kb];
                            for (int dd = 0; dd < kqd; dd++) {
                                int wv = four ? (blk[(dd / 8) * 64 + c * 4 + dd % 4] >> (dd % 8 < 4 ? 0 : 4)) & 15
                                              : blk[(dd / 4) * 64 + c * 4 + dd % 4];
                                if (four == 2) wv = lut[wv];
                                sum += (int64_t)wv * A[(size_t)r * k + kb * kqd + dd];
                            }
                            isum += (int64_t)(int32_t)(uint32_t)sum * isc[jb * 16 + c];
                            if (off) imin += (int64_t)imn[jb * 16 + c] * qsum[r * nb + kb];
                        }
                        y = fmaf((float)(int32_t)(uint32_t)isum, f[c] * xs[r * nsb + sb], y);
                        if (off) y = fmaf((float)(int32_t)(uint32_t)imin, f[16 + c] * xs[r * nsb + sb], y);
                    }
                    want[(size_t)r * n + j] = y;
                }
            const nv_qdot_a a = {A, (size_t)k, xs, NULL, qsum};
            nv_qdot_b bq = qb;
            bq.q = B;
            for (int i = 0; i < 3; i++) {
                if (!kq[i]) continue;
                int bad, past;
                qdot_instance_check(kq[i], &a, rows, &bq, nt, n, ncols, want, got, &bad, &past);
                T_CHECK(!bad && !past, "%s: %d outputs differ from the reference, %d written past ncols (%d rows, %d tiles, %d super-blocks of %d x %d, %s%s)",
                        kq[i]->name, bad, past, rows, nt, nsb, sub, kqd, four == 2 ? "table" : four ? "4-bit" : "8-bit", off ? ", offsets" : "");
                runs++;
            }
            free(A), free(B), free(xs), free(qsum), free(want), free(got);
        }
    printf("    %d products equal the reference\n", runs);
}

/* Plans: every int8 engine that is on (amx-int8, avx512-int8, avx2-int8) gives the same y from the
 * same weights, bit for bit. */
static void test_int8_plans_agree(void) {
    const nv_engine_id all[3] = {NV_ENGINE_AMX_INT8, NV_ENGINE_AVX512_INT8, NV_ENGINE_AVX2_INT8};
    nv_engine_id on[3];
    int non = 0;
    for (int i = 0; i < 3; i++)
        if (nv_engine_available(all[i])) on[non++] = all[i];
    if (non < 2) {
        t_skip("fewer than two int8 engines on");
        return;
    }
    for (int mi = 0; mi < NM; mi++)
        for (int ki = 0; ki < NK; ki++) {
            const shape_ref *r = ref_get(mi, ki, 4);
            float *y[3];
            for (int i = 0; i < non; i++) {
                nv_plan *p;
                T_CHECK(nv_plan_build(&p, on[i], r->w, r->n, r->k) == NV_OK && nv_plan_engine(p) == on[i], "build");
                y[i] = malloc(sizeof(float) * r->m * r->n);
                nv_plan_run(p, r->x, r->m, y[i]);
                nv_plan_free(p);
                T_CHECK(memcmp(y[0], y[i], sizeof(float) * r->m * r->n) == 0, "%s and %s: y bits differ (%dx%dx%d)",
                        nv_engine_name(on[0]), nv_engine_name(on[i]), r->m, r->n, r->k);
            }
            for (int i = 0; i < non; i++) free(y[i]);
        }
    printf("    %d int8 engines agree\n", non);
}

/* An int8 plan deeper than its int32 sums allow is built on the next floating-point rung that is on. */
static void test_deep_int8_plans_fall_to_float(void) {
    const int n = 3, k = 131072 + 17;
    float *w = malloc(sizeof(float) * n * k), *x = malloc(sizeof(float) * k), y[3];
    uint64_t seed = 5;
    rnd(w, (size_t)n * k, &seed);
    rnd(x, (size_t)k, &seed);
    for (int i = 0; i < 3; i++) {
        const nv_engine_id want = i == 2 ? NV_ENGINE_AVX2_INT8 : i ? NV_ENGINE_AMX_INT8 : NV_ENGINE_AVX512_INT8;
        nv_engine_id expect = NV_ENGINE_AMX_BF16;
        while (!nv_engine_available(expect)) expect = nv_engine_next_down(expect);
        nv_plan *p;
        T_CHECK(nv_plan_build(&p, want, w, n, k) == NV_OK, "build: %s", nv_errmsg());
        T_CHECK(nv_plan_engine(p) == expect, "k = %d on %s: built on %s, want %s", k, nv_engine_name(want),
                nv_engine_name(nv_plan_engine(p)), nv_engine_name(expect));
        nv_plan_run(p, x, 1, y);
        T_CHECK(isfinite(y[0]) && isfinite(y[2]), "y");
        nv_plan_free(p);
    }
    free(w), free(x);
}

/* ---------------------------------------------------------------- ladder and probe */

static void reinit(const char *allow) {
    nv_engines_reset();
    T_CHECK(nv_engines_init(allow, 0) == NV_OK, "init(%s): %s", allow ? allow : "NULL", nv_errmsg());
}

static void test_ladder_scalar_only(void) {
    reinit("scalar");
    for (int e = 1; e < NV_ENGINE_COUNT; e++) {
        T_CHECK(!nv_engine_available((nv_engine_id)e), "%s on with allow=scalar", nv_engine_name((nv_engine_id)e));
        T_CHECK(strstr(nv_engine_why_off((nv_engine_id)e), "excluded") != NULL, "why: %s", nv_engine_why_off((nv_engine_id)e));
    }
    T_CHECK(nv_engine_best() == NV_ENGINE_SCALAR, "best is %s", nv_engine_name(nv_engine_best()));
    float w[6] = {1, 2, 3, 4, 5, 6}, x[3] = {1, -1, 2}, y[2], dx[3], dw[6] = {0};
    nv_plan *p;
    T_CHECK(nv_plan_build(&p, NV_ENGINE_AMX_BF16, w, 2, 3) == NV_OK, "build");
    T_CHECK(nv_plan_engine(p) == NV_ENGINE_SCALAR, "amx-bf16 plan fell to %s, want scalar", nv_engine_name(nv_plan_engine(p)));
    nv_plan_run(p, x, 1, y);
    T_CHECK(y[0] == 5.0f && y[1] == 11.0f, "y = %g %g", y[0], y[1]);
    float dy[2] = {1, 2};
    nv_plan_run_dx(p, dy, 1, dx);
    T_CHECK(dx[0] == 9.0f && dx[1] == 12.0f && dx[2] == 15.0f, "dx = %g %g %g", dx[0], dx[1], dx[2]);
    nv_gemm_dw(NV_ENGINE_AMX_INT8, dy, x, 1, 2, 3, dw, 1);
    T_CHECK(dw[0] == 1 && dw[1] == -1 && dw[2] == 2 && dw[3] == 2 && dw[4] == -2 && dw[5] == 4, "dw");
    nv_plan_free(p);
}

static void test_ladder_avx2_only(void) {
    reinit("avx2");
    if (!nv_engine_available(NV_ENGINE_AVX2)) {
        char why[200];
        snprintf(why, sizeof why, "avx2 is off: %s", nv_engine_why_off(NV_ENGINE_AVX2));
        t_skip(why);
        return;
    }
    T_CHECK(!nv_engine_available(NV_ENGINE_AMX_INT8) && !nv_engine_available(NV_ENGINE_AVX512), "only avx2 (and scalar)");
    float w[4] = {1, 2, 3, 4};
    nv_plan *p;
    T_CHECK(nv_plan_build(&p, NV_ENGINE_AMX_INT8, w, 2, 2) == NV_OK, "build");
    T_CHECK(nv_plan_engine(p) == NV_ENGINE_AVX2, "amx-int8 plan fell to %s, want avx2", nv_engine_name(nv_plan_engine(p)));
    T_CHECK(nv_engine_best() == NV_ENGINE_AVX2 && nv_engine_best_fp32() == NV_ENGINE_AVX2, "best");
    nv_plan_free(p);
    T_CHECK(nv_engine_next_down(NV_ENGINE_AMX_INT8) == NV_ENGINE_AVX512_INT8 &&
                nv_engine_next_down(NV_ENGINE_AVX512_INT8) == NV_ENGINE_AVX2_INT8 &&
                nv_engine_next_down(NV_ENGINE_AVX2_INT8) == NV_ENGINE_AMX_BF16 &&
                nv_engine_next_down(NV_ENGINE_AMX_BF16) == NV_ENGINE_AVX512_BF16 &&
                nv_engine_next_down(NV_ENGINE_AVX512_BF16) == NV_ENGINE_AVX512 &&
                nv_engine_next_down(NV_ENGINE_AVX512) == NV_ENGINE_AVX2 && nv_engine_next_down(NV_ENGINE_AVX2) == NV_ENGINE_SCALAR &&
                nv_engine_next_down(NV_ENGINE_SCALAR) == NV_ENGINE_SCALAR,
            "ladder order");
}

static void test_bad_allow_list(void) {
    nv_engines_reset();
    T_CHECK(nv_engines_init("scalar,warp-drive", 0) == NV_EINVAL, "unknown engine accepted");
    nv_engine_id e;
    T_CHECK(nv_engine_parse("amx-int8", &e) == NV_OK && e == NV_ENGINE_AMX_INT8, "parse");
    T_CHECK(nv_engine_parse("avx512-int8", &e) == NV_OK && e == NV_ENGINE_AVX512_INT8, "parse");
    T_CHECK(nv_engine_parse("avx2-int8", &e) == NV_OK && e == NV_ENGINE_AVX2_INT8, "parse");
    T_CHECK(nv_engine_parse("AMX", &e) != NV_OK, "parse accepted junk");
}

/* A kernel that is subtly wrong (emulated avx512 off by 2^-12 per value, emulated AMX dropping the
 * last K group of each tile product, emulated VDPBF16PS and VPDPBUSD dropping a product now and
 * then) must fail the probe's self-test: latched off with the reason, and plans fall down the ladder
 * past them. avx2-int8 is latched through its training products (the emulated VDPBF16PS); its int8
 * loop is the emulated avx512-int8's less the injection hook, which that engine's latch covers. */
static void test_probe_latches_wrong_kernels(void) {
    nv_engines_set_emulation(1);
    nv_kern_amx_emu_inject(1);
    nv_kern_avx512_emu_inject(1);
    nv_kern_avx512bf16_emu_inject(1);
    nv_kern_avx512int8_emu_inject(1);
    reinit(NULL);
    nv_kern_amx_emu_inject(0);
    nv_kern_avx512_emu_inject(0);
    nv_kern_avx512bf16_emu_inject(0);
    nv_kern_avx512int8_emu_inject(0);
    nv_engines_set_emulation(0);
    for (int e = NV_ENGINE_AVX512; e < NV_ENGINE_COUNT; e++) {
        const char *why = nv_engine_why_off((nv_engine_id)e);
        if (strstr(why, "emulation needs AVX2")) continue;
        T_CHECK(!nv_engine_available((nv_engine_id)e), "wrong %s kernel passed the self-test", nv_engine_name((nv_engine_id)e));
        T_CHECK(strncmp(why, "self-test", 9) == 0, "%s why: '%s'", nv_engine_name((nv_engine_id)e), why);
    }
    float w[4] = {1, 2, 3, 4};
    nv_plan *p;
    T_CHECK(nv_plan_build(&p, NV_ENGINE_AMX_INT8, w, 2, 2) == NV_OK, "build");
    T_CHECK(nv_plan_engine(p) <= NV_ENGINE_AVX2, "plan on %s", nv_engine_name(nv_plan_engine(p)));
    nv_plan_free(p);
}

static void test_probe_report(void) {
    reinit(NULL);
    for (int e = 0; e < NV_ENGINE_COUNT; e++)
        printf("    %-12s %s%s\n", nv_engine_name((nv_engine_id)e), nv_engine_available((nv_engine_id)e) ? "on" : "off: ",
               nv_engine_why_off((nv_engine_id)e));
    T_CHECK(nv_engine_available(NV_ENGINE_SCALAR), "scalar off");
    /* an engine this CPU has is never latched off by its own self-test: a wrong kernel must fail here,
       not turn its cases into skips */
    for (int e = 0; e < NV_ENGINE_COUNT; e++)
        T_CHECK(strncmp(nv_engine_why_off((nv_engine_id)e), "self-test", 9) != 0, "%s: %s", nv_engine_name((nv_engine_id)e),
                nv_engine_why_off((nv_engine_id)e));
    T_CHECK(nv_engine_best() >= nv_engine_best_float() && nv_engine_best_float() >= nv_engine_best_fp32(), "best");
    T_CHECK(!nv_engine_int8(nv_engine_best_float()) && nv_engine_best_fp32() <= NV_ENGINE_AVX512, "best_float %s, best_fp32 %s",
            nv_engine_name(nv_engine_best_float()), nv_engine_name(nv_engine_best_fp32()));
    T_CHECK(nv_pool_threads() >= 1, "pool");
}

int main(void) {
    nv_engines_init(NULL, 2);
    T_RUN(test_probe_report);
    E = NV_ENGINE_SCALAR;
    t_run("scalar: products on the calling thread (nv_bpack)", test_bpack);
    for (int e = NV_ENGINE_AVX2; e < NV_ENGINE_COUNT; e++) run_engine_cases((nv_engine_id)e, "");
    T_RUN(test_avx512_bits_equal_avx2);
    T_RUN(test_bf16_conversions_avx512);
    T_RUN(test_int8_kernels_agree);
    T_RUN(test_qdot_kernels_agree);
    T_RUN(test_qdot_super_kernels_agree);
    T_RUN(test_int8_plans_agree);
    T_RUN(test_deep_int8_plans_fall_to_float);
    /* The engines this CPU lacks, on their emulated kernels. */
    nv_engines_set_emulation(1);
    nv_engines_reset();
    nv_engines_init(NULL, 2);
    nv_engines_set_emulation(0);
    emulated_section = 1;
    for (int e = NV_ENGINE_AVX512; e < NV_ENGINE_COUNT; e++) run_engine_cases((nv_engine_id)e, " (emulated)");
    t_run("test_avx512_bits_equal_avx2 (emulated)", test_avx512_bits_equal_avx2);
    t_run("test_int8_plans_agree (emulated)", test_int8_plans_agree);
    t_run("test_deep_int8_plans_fall_to_float (emulated)", test_deep_int8_plans_fall_to_float);
    T_RUN(test_ladder_scalar_only);
    T_RUN(test_ladder_avx2_only);
    T_RUN(test_bad_allow_list);
    T_RUN(test_probe_latches_wrong_kernels);
    nv_engines_reset();
    nv_engines_init(NULL, 0);
    refs_free();
    nv_pool_shutdown();
    return t_done();
}
