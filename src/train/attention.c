#include "train/attention.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/pool.h"
#include "base/vmath.h"
#include "model/attn_kern.h"

/* backward: query rows whose dk/dv contributions are gathered per pass over the keys */
#define ROWS 16

static int pad8(int n) { return (n + 7) & ~7; }

size_t nv_attention_workspace(const nv_config *c, int B, int T) {
    /* per task: a transposed K or V block [hd][T8] and ROWS rows of scores [T8] */
    return (size_t)B * c->n_heads * ((size_t)c->head_dim + ROWS) * pad8(T);
}

typedef struct {
    const nv_config *c;
    int B, T;
    const float *q, *k, *v, *dout;
    float *att, *out, *dq, *dk, *dv, *ws;
} attn_job;

/* dst[i][u] = src[(b*T + u) * stride + i] for u < T, zero in the padding. */
static void transpose_block(float *dst, const float *src, int T, int T8, int hd, size_t stride) {
    nv_transpose(src, stride, T, hd, dst, (size_t)T8);
    for (int i = 0; i < hd; i++)
        for (int u = T; u < T8; u++) dst[(size_t)i * T8 + u] = 0.0f;
}

#define INLINE static inline __attribute__((always_inline))

/* s[r][u] = sum_i x[r][i] * mt[i][u] for R <= 4 rows and u < n rounded up to 8 (mt rows are T8
 * long), each a fused chain over i in order; mt is read once for the R rows (model/attn_kern.h). */
static void rows_times_transposed(int R, float *const *s, const float *const *x, const float *mt, int hd, int T8, int n) {
    const int n8 = pad8(n), all[4] = {n8, n8, n8, n8};
    for (int u = 0; u < n8; u += 16) scores_rows_any(R, n8 - u >= 16 ? 2 : 1, 1, x, hd, mt, 0, T8, u, all, 1.0f, s, 0);
}

/* a[u] = softmax(scale * s)[u] for u < n; s (n rounded up to 8 long) is scratch. */
static void softmax_row(float *a, float *s, int n, float scale) {
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    int n8 = pad8(n);
    for (int u = n; u < n8; u++) s[u] = -INFINITY; /* padding lanes add e^-inf = 0 */
    for (int u = 0; u < n8; u += 8) {
        __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + u), vs);
        _mm256_storeu_ps(s + u, x);
        vmax = _mm256_max_ps(vmax, x);
    }
    const __m256 vm = _mm256_set1_ps(nv_hmax256(vmax));
    __m256 vsum = _mm256_setzero_ps();
    for (int u = 0; u < n8; u += 8) {
        __m256 e = nv_exp256(_mm256_sub_ps(_mm256_loadu_ps(s + u), vm));
        _mm256_storeu_ps(s + u, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    const float inv = 1.0f / nv_hsum256(vsum);
    const __m256 vinv = _mm256_set1_ps(inv);
    int u = 0;
    for (; u + 8 <= n; u += 8) _mm256_storeu_ps(a + u, _mm256_mul_ps(_mm256_loadu_ps(s + u), vinv));
    for (; u < n; u++) a[u] = s[u] * inv; /* a's row is T long: no store past n */
}

/* o[0..8NV) (+)= sum_{u<n} a[u] v[u*stride + 0..8NV): two sets of sums (even and odd u) so
 * enough chains are in flight, added at the end. */
INLINE void weighted_block(const int NV, float *o, const float *a, int n, const float *v, size_t stride, int accumulate) {
    __m256 x0[4], x1[4];
    #pragma GCC unroll 8
    for (int w = 0; w < NV; w++) {
        x0[w] = accumulate ? _mm256_loadu_ps(o + 8 * w) : _mm256_setzero_ps();
        x1[w] = _mm256_setzero_ps();
    }
    int u = 0;
    for (; u + 2 <= n; u += 2) {
        const __m256 a0 = _mm256_broadcast_ss(a + u), a1 = _mm256_broadcast_ss(a + u + 1);
        const float *v0 = v + (size_t)u * stride, *v1 = v0 + stride;
        #pragma GCC unroll 8
        for (int w = 0; w < NV; w++) {
            x0[w] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(v0 + 8 * w), x0[w]);
            x1[w] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(v1 + 8 * w), x1[w]);
        }
    }
    if (u < n) {
        const __m256 a0 = _mm256_broadcast_ss(a + u);
        const float *v0 = v + (size_t)u * stride;
        #pragma GCC unroll 8
        for (int w = 0; w < NV; w++) x0[w] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(v0 + 8 * w), x0[w]);
    }
    #pragma GCC unroll 8
    for (int w = 0; w < NV; w++) _mm256_storeu_ps(o + 8 * w, _mm256_add_ps(x0[w], x1[w]));
}

/* y[i] += a * x[i] over hd values. */
INLINE void axpy(float *y, float a, const float *x, int hd) {
    int i = 0;
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= hd; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < hd; i++) y[i] += a * x[i];
}

/* o[0..hd) (+)= sum_{u<n} a[u] v[u*stride + 0..hd), 32 dimensions at a time. */
static void weighted_sum(float *o, const float *a, int n, const float *v, size_t stride, int hd, int accumulate) {
    if (hd % 8) { /* a head size that is not a multiple of 8 */
        if (!accumulate) memset(o, 0, (size_t)hd * sizeof(float));
        for (int u = 0; u < n; u++) axpy(o, a[u], v + (size_t)u * stride, hd);
        return;
    }
    for (int i0 = 0; i0 < hd; i0 += 32) {
        switch ((hd - i0) / 8) {
        case 1: weighted_block(1, o + i0, a, n, v + i0, stride, accumulate); break;
        case 2: weighted_block(2, o + i0, a, n, v + i0, stride, accumulate); break;
        case 3: weighted_block(3, o + i0, a, n, v + i0, stride, accumulate); break;
        default: weighted_block(4, o + i0, a, n, v + i0, stride, accumulate); break;
        }
    }
}

static void forward_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const attn_job *j = ctx;
    const nv_config *c = j->c;
    int T = j->T, T8 = pad8(T), H = c->n_heads, hd = c->head_dim, qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c);
    int b = task / H, h = task % H, kv_mul = H / c->n_kv_heads;
    size_t koff = (size_t)(h / kv_mul) * hd;
    float *kt = j->ws + (size_t)task * (hd + ROWS) * T8, *s = kt + (size_t)hd * T8;
    float scale = 1.0f / sqrtf((float)hd);
    transpose_block(kt, j->k + (size_t)b * T * kvd + koff, T, T8, hd, (size_t)kvd);
    for (int t0 = 0; t0 < T; t0 += 4) { /* four rows share each load of the transposed keys */
        const int R = T - t0 < 4 ? T - t0 : 4;
        const float *qr[4];
        float *sr[4];
        for (int r = 0; r < R; r++) {
            qr[r] = j->q + ((size_t)b * T + t0 + r) * qd + (size_t)h * hd;
            sr[r] = s + (size_t)r * T8;
        }
        rows_times_transposed(R, sr, qr, kt, hd, T8, t0 + R);
        for (int r = 0; r < R; r++) {
            const int t = t0 + r;
            float *a = j->att + (((size_t)b * H + h) * T + t) * T;
            softmax_row(a, sr[r], t + 1, scale);
            weighted_sum(j->out + ((size_t)b * T + t) * qd + (size_t)h * hd, a, t + 1, j->v + (size_t)b * T * kvd + koff,
                         (size_t)kvd, hd, 0);
        }
    }
}

/* dv_u += sum_j pa[j*pas] dout_j and dk_u += sum_j ps[j*pss] q_j over cnt rows j (rows rs
 * apart), 8NV dimensions: the contributions of a block of query rows to one key/value row. */
INLINE void gather_block(const int NV, float *dv_u, float *dk_u, const float *pa, size_t pas, const float *ps, size_t pss,
                         const float *dout, const float *q, size_t rs, int cnt) {
    __m256 av[4], ak[4];
    #pragma GCC unroll 8
    for (int w = 0; w < NV; w++) {
        av[w] = _mm256_loadu_ps(dv_u + 8 * w);
        ak[w] = _mm256_loadu_ps(dk_u + 8 * w);
    }
    for (int jj = 0; jj < cnt; jj++) {
        const __m256 bv = _mm256_broadcast_ss(pa + (size_t)jj * pas), bk = _mm256_broadcast_ss(ps + (size_t)jj * pss);
        const float *dr = dout + (size_t)jj * rs, *qr = q + (size_t)jj * rs;
        #pragma GCC unroll 8
        for (int w = 0; w < NV; w++) {
            av[w] = _mm256_fmadd_ps(bv, _mm256_loadu_ps(dr + 8 * w), av[w]);
            ak[w] = _mm256_fmadd_ps(bk, _mm256_loadu_ps(qr + 8 * w), ak[w]);
        }
    }
    #pragma GCC unroll 8
    for (int w = 0; w < NV; w++) {
        _mm256_storeu_ps(dv_u + 8 * w, av[w]);
        _mm256_storeu_ps(dk_u + 8 * w, ak[w]);
    }
}

static void backward_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const attn_job *j = ctx;
    const nv_config *c = j->c;
    int T = j->T, T8 = pad8(T), H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim;
    int qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c), kv_mul = H / KVH;
    int b = task / KVH, kvh = task % KVH;
    size_t koff = (size_t)kvh * hd;
    float *vt = j->ws + (size_t)task * (hd + ROWS) * T8, *ds0 = vt + (size_t)hd * T8; /* ds: ROWS rows of T8 */
    const float scale = 1.0f / sqrtf((float)hd);
    const float *kb = j->k + (size_t)b * T * kvd + koff;
    float *dkb = j->dk + (size_t)b * T * kvd + koff, *dvb = j->dv + (size_t)b * T * kvd + koff;
    transpose_block(vt, j->v + (size_t)b * T * kvd + koff, T, T8, hd, (size_t)kvd);
    for (int h = kvh * kv_mul; h < (kvh + 1) * kv_mul; h++)
        for (int t0 = 0; t0 < T; t0 += ROWS) {
            const int t1 = T - t0 < ROWS ? T : t0 + ROWS;
            const float *att0 = j->att + (((size_t)b * H + h) * T + t0) * T;
            const float *dout0 = j->dout + ((size_t)b * T + t0) * qd + (size_t)h * hd;
            const float *q0 = j->q + ((size_t)b * T + t0) * qd + (size_t)h * hd;
            /* dP = dout . v for the block's rows, four rows per load of the transposed values */
            for (int r0 = t0; r0 < t1; r0 += 4) {
                const int R = t1 - r0 < 4 ? t1 - r0 : 4;
                const float *xr[4];
                float *sr[4];
                for (int r = 0; r < R; r++) {
                    xr[r] = dout0 + (size_t)(r0 + r - t0) * qd;
                    sr[r] = ds0 + (size_t)(r0 + r - t0) * T8;
                }
                rows_times_transposed(R, sr, xr, vt, hd, T8, r0 + R);
            }
            /* each query row: dS = P (dP - rowsum(P dP)) scale, and dq = dS K */
            for (int t = t0; t < t1; t++) {
                const float *a = att0 + (size_t)(t - t0) * T;
                float *ds = ds0 + (size_t)(t - t0) * T8;
                const int n = t + 1;
                __m256 vsum = _mm256_setzero_ps();
                int u = 0;
                for (; u + 8 <= n; u += 8) vsum = _mm256_fmadd_ps(_mm256_loadu_ps(a + u), _mm256_loadu_ps(ds + u), vsum);
                float sum = nv_hsum256(vsum);
                for (; u < n; u++) sum += a[u] * ds[u];
                const __m256 vsm = _mm256_set1_ps(sum), vsc = _mm256_set1_ps(scale);
                for (u = 0; u + 8 <= n; u += 8)
                    _mm256_storeu_ps(ds + u, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(a + u),
                                                                         _mm256_sub_ps(_mm256_loadu_ps(ds + u), vsm)),
                                                           vsc));
                for (; u < n; u++) ds[u] = a[u] * (ds[u] - sum) * scale;
                weighted_sum(j->dq + ((size_t)b * T + t) * qd + (size_t)h * hd, ds, n, kb, (size_t)kvd, hd, 1);
            }
            /* the block's contributions to every key/value row it saw: dv_u += P[t][u] dout_t,
             * dk_u += dS[t][u] q_t over its rows t >= u */
            for (int u = 0; u < t1; u++) {
                const int ta = u > t0 ? u : t0, cnt = t1 - ta;
                const float *pa = att0 + (size_t)(ta - t0) * T + u, *ps = ds0 + (size_t)(ta - t0) * T8 + u;
                const float *dr = dout0 + (size_t)(ta - t0) * qd, *qr = q0 + (size_t)(ta - t0) * qd;
                float *dv_u = dvb + (size_t)u * kvd, *dk_u = dkb + (size_t)u * kvd;
                if (hd % 8) {
                    for (int jj = 0; jj < cnt; jj++) {
                        axpy(dv_u, pa[(size_t)jj * T], dr + (size_t)jj * qd, hd);
                        axpy(dk_u, ps[(size_t)jj * T8], qr + (size_t)jj * qd, hd);
                    }
                    continue;
                }
                for (int i0 = 0; i0 < hd; i0 += 32) {
                    switch ((hd - i0) / 8) {
                    case 1: gather_block(1, dv_u + i0, dk_u + i0, pa, T, ps, T8, dr + i0, qr + i0, qd, cnt); break;
                    case 2: gather_block(2, dv_u + i0, dk_u + i0, pa, T, ps, T8, dr + i0, qr + i0, qd, cnt); break;
                    case 3: gather_block(3, dv_u + i0, dk_u + i0, pa, T, ps, T8, dr + i0, qr + i0, qd, cnt); break;
                    default: gather_block(4, dv_u + i0, dk_u + i0, pa, T, ps, T8, dr + i0, qr + i0, qd, cnt); break;
                    }
                }
            }
        }
}

void nv_attention_forward(const nv_config *c, int B, int T, const float *q, const float *k, const float *v, float *att,
                          float *out, float *ws) {
    attn_job j = {c, B, T, q, k, v, NULL, att, out, NULL, NULL, NULL, ws};
    nv_pool_run(forward_task, &j, B * c->n_heads);
}

void nv_attention_backward(const nv_config *c, int B, int T, const float *q, const float *k, const float *v,
                           const float *att, const float *dout, float *dq, float *dk, float *dv, float *ws) {
    attn_job j = {c, B, T, q, k, v, dout, (float *)att, NULL, dq, dk, dv, ws};
    nv_pool_run(backward_task, &j, B * c->n_kv_heads);
}
