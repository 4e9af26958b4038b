#include "train/attention.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/pool.h"

static int pad8(int n) { return (n + 7) & ~7; }

size_t nv_attention_workspace(const nv_config *c, int B, int T) {
    /* per task: a transposed K or V block [hd][T8] and one row of scores [T8] */
    return (size_t)B * c->n_heads * ((size_t)c->head_dim + 1) * pad8(T);
}

typedef struct {
    const nv_config *c;
    int B, T;
    const float *q, *k, *v, *dout;
    float *att, *out, *dq, *dk, *dv, *ws;
} attn_job;

/* dst[i][u] = src[(b*T + u) * stride + i] for u < T, zero in the padding. */
static void transpose_block(float *dst, const float *src, int T, int T8, int hd, size_t stride) {
    for (int u = 0; u < T; u++)
        for (int i = 0; i < hd; i++) dst[(size_t)i * T8 + u] = src[(size_t)u * stride + i];
    for (int i = 0; i < hd; i++)
        for (int u = T; u < T8; u++) dst[(size_t)i * T8 + u] = 0.0f;
}

/* s[u] = sum_i x[i] * mt[i][u] for u < n (n rounded up to 8; mt rows are T8 long). */
static inline __attribute__((always_inline)) void row_times_transposed(float *s, const float *x, const float *mt, int hd, int T8, int n) {
    int n8 = pad8(n);
    for (int u = 0; u < n8; u += 8) _mm256_storeu_ps(s + u, _mm256_setzero_ps());
    for (int i = 0; i < hd; i++) {
        __m256 xi = _mm256_set1_ps(x[i]);
        const float *row = mt + (size_t)i * T8;
        for (int u = 0; u < n8; u += 8)
            _mm256_storeu_ps(s + u, _mm256_fmadd_ps(xi, _mm256_loadu_ps(row + u), _mm256_loadu_ps(s + u)));
    }
}

/* y[i] += a * x[i] over hd values. */
static inline __attribute__((always_inline)) void axpy(float *y, float a, const float *x, int hd) {
    int i = 0;
    __m256 va = _mm256_set1_ps(a);
    for (; i + 8 <= hd; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < hd; i++) y[i] += a * x[i];
}

static void forward_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const attn_job *j = ctx;
    const nv_config *c = j->c;
    int T = j->T, T8 = pad8(T), H = c->n_heads, hd = c->head_dim, qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c);
    int b = task / H, h = task % H, kv_mul = H / c->n_kv_heads;
    size_t koff = (size_t)(h / kv_mul) * hd;
    float *kt = j->ws + (size_t)task * (hd + 1) * T8, *s = kt + (size_t)hd * T8;
    float scale = 1.0f / sqrtf((float)hd);
    transpose_block(kt, j->k + (size_t)b * T * kvd + koff, T, T8, hd, (size_t)kvd);
    for (int t = 0; t < T; t++) {
        const float *qt = j->q + ((size_t)b * T + t) * qd + (size_t)h * hd;
        float *a = j->att + (((size_t)b * H + h) * T + t) * T;
        row_times_transposed(s, qt, kt, hd, T8, t + 1);
        float maxv = -INFINITY;
        for (int u = 0; u <= t; u++) {
            s[u] *= scale;
            if (s[u] > maxv) maxv = s[u];
        }
        float sum = 0.0f;
        for (int u = 0; u <= t; u++) {
            a[u] = expf(s[u] - maxv);
            sum += a[u];
        }
        float inv = 1.0f / sum;
        float *o = j->out + ((size_t)b * T + t) * qd + (size_t)h * hd;
        memset(o, 0, (size_t)hd * sizeof(float));
        for (int u = 0; u <= t; u++) {
            a[u] *= inv;
            axpy(o, a[u], j->v + ((size_t)b * T + u) * kvd + koff, hd);
        }
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
    float *vt = j->ws + (size_t)task * (hd + 1) * T8, *datt = vt + (size_t)hd * T8;
    float scale = 1.0f / sqrtf((float)hd);
    transpose_block(vt, j->v + (size_t)b * T * kvd + koff, T, T8, hd, (size_t)kvd);
    for (int h = kvh * kv_mul; h < (kvh + 1) * kv_mul; h++)
        for (int t = 0; t < T; t++) {
            const float *a = j->att + (((size_t)b * H + h) * T + t) * T;
            const float *dot_ = j->dout + ((size_t)b * T + t) * qd + (size_t)h * hd;
            const float *qt = j->q + ((size_t)b * T + t) * qd + (size_t)h * hd;
            float *dqt = j->dq + ((size_t)b * T + t) * qd + (size_t)h * hd;
            row_times_transposed(datt, dot_, vt, hd, T8, t + 1); /* datt[u] = dout . v_u */
            float sum = 0.0f;
            for (int u = 0; u <= t; u++) sum += a[u] * datt[u];
            if (hd % 8 == 0 && hd <= 128) {
                /* dq of this row stays in registers across the u loop */
                __m256 acc[16];
                int nv = hd / 8;
                for (int w = 0; w < nv; w++) acc[w] = _mm256_loadu_ps(dqt + 8 * w);
                for (int u = 0; u <= t; u++) {
                    size_t row = ((size_t)b * T + u) * kvd + koff;
                    axpy(j->dv + row, a[u], dot_, hd);
                    float ds = a[u] * (datt[u] - sum) * scale;
                    __m256 vds = _mm256_set1_ps(ds);
                    const float *ku = j->k + row;
                    for (int w = 0; w < nv; w++) acc[w] = _mm256_fmadd_ps(vds, _mm256_loadu_ps(ku + 8 * w), acc[w]);
                    axpy(j->dk + row, ds, qt, hd);
                }
                for (int w = 0; w < nv; w++) _mm256_storeu_ps(dqt + 8 * w, acc[w]);
            } else {
                for (int u = 0; u <= t; u++) {
                    size_t row = ((size_t)b * T + u) * kvd + koff;
                    axpy(j->dv + row, a[u], dot_, hd);
                    float ds = a[u] * (datt[u] - sum) * scale;
                    axpy(dqt, ds, j->k + row, hd);
                    axpy(j->dk + row, ds, qt, hd);
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
