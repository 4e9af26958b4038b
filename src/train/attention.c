#include "train/attention.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/pool.h"
#include "base/vmath.h"

/* Query rows per block: the products of a block run on the engine's panel kernel with its register
 * blocking (64 rows take the kernel's many-rows order), and a block's keys stop at its last row,
 * so causality wastes only the block's own triangle. */
#define RB 64

static int pad8(int n) { return (n + 7) & ~7; }

/* Heads this narrow take the backward's products whose outputs are a head wide (dS K, dS^T q, P^T dout)
 * transposed: a head's hd outputs would fill a fraction of the engine's panel (32 floats on avx512),
 * so the block's rows or keys are the outputs instead (dq^T = K^T dS^T, ...), the head's dimensions
 * the rows. (The forward's P V, one such product beside the softmax, measured no faster so.) */
#define NARROW 32

/* Per task: keys and values packed (keys as hd x T for the scores and, backward, as T x hd too; values
 * as T x hd forward, hd x T backward), RB rows of scores and of probabilities, a transpose (T8 x RB)
 * and one block of query (or output gradient) rows packed as RB x hd. Narrow heads' backward also: a
 * block's scores packed either way and six head-wide matrices transposed (hd x T8: K^T, q^T, dout^T,
 * and the outputs dq^T, dk^T, dv^T). */
static size_t every_head_floats(const nv_config *c, int T) {
    const int T8 = pad8(T), hd = c->head_dim;
    return 2 * nv_bpack_floats(hd, T) + nv_bpack_floats(T, hd) + 2 * (size_t)RB * T8 + (size_t)T8 * RB + nv_bpack_floats(RB, hd);
}

static size_t task_floats(const nv_config *c, int T) {
    const int hd = c->head_dim;
    size_t n = every_head_floats(c, T);
    if (hd < NARROW) n += nv_bpack_floats(T, RB) + nv_bpack_floats(RB, T) + 6 * (size_t)hd * pad8(T);
    return n;
}

/* The narrow heads' buffers at the end of a task's workspace (task_floats); the matrices hd x T8. */
typedef struct {
    float *packt; /* a block's scores as B transposed (depth: keys, outputs: rows) */
    float *pack;  /* a block's scores as B (depth: rows, outputs: keys) */
    float *k;     /* K^T */
    float *q, *dout; /* a query head's q^T and dout^T */
    float *dq, *dk, *dv; /* a query head's dq^T; dk^T and dv^T, summed over the task's blocks */
} narrow_ws;

static narrow_ws narrow_of(const nv_config *c, int T, float *task_ws) {
    const int T8 = pad8(T), hd = c->head_dim;
    const size_t mat = (size_t)hd * T8;
    float *p = task_ws + every_head_floats(c, T);
    narrow_ws w;
    w.packt = p, p += nv_bpack_floats(T, RB);
    w.pack = p, p += nv_bpack_floats(RB, T);
    w.k = p, w.q = p + mat, w.dout = p + 2 * mat, w.dq = p + 3 * mat, w.dk = p + 4 * mat, w.dv = p + 5 * mat;
    return w;
}

/* dst[i * ldd + d] += src[d * lds + i] for i < n, d < hd: a transposed head-wide matrix added back
 * (8 x 8 blocks in registers, the edges one by one). */
static void add_transposed(float *dst, size_t ldd, const float *src, size_t lds, int n, int hd) {
    const int n8 = n & ~7, h8 = hd & ~7;
    for (int d = 0; d < h8; d += 8)
        for (int i = 0; i < n8; i += 8) {
            __m256 t[8];
            for (int r = 0; r < 8; r++) t[r] = _mm256_loadu_ps(src + (size_t)(d + r) * lds + i);
            nv_tr8x8_ps(t);
            for (int r = 0; r < 8; r++) {
                float *o = dst + (size_t)(i + r) * ldd + d;
                _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), t[r]));
            }
        }
    for (int i = 0; i < n; i++)
        for (int d = i < n8 ? h8 : 0; d < hd; d++) dst[(size_t)i * ldd + d] += src[(size_t)d * lds + i];
}

size_t nv_attention_workspace(const nv_config *c, int B, int T) { return (size_t)B * c->n_heads * task_floats(c, T); }

typedef struct {
    const nv_config *c;
    int B, T;
    nv_engine_id e;
    const float *q, *k, *v, *dout;
    float *stats, *out, *dq, *dk, *dv, *ws;
    const int *seg; /* [B*T] each row's first key, or NULL: 0 */
    int window;     /* the layer's sliding window (row t sees keys t - window + 1..t), or 0 */
    float scale;    /* the scores' factor: 1 / nv_config_attn_div */
} attn_job;

/* Row t's first key in sequence b: its document's start (packed windows), else 0, and not before
   its sliding window; a start outside 0..t (the caller's error) is taken as 0 or t, so that no row
   has fewer than one key. */
static int first_key(const attn_job *j, int b, int t) {
    int k0 = j->seg ? j->seg[(size_t)b * j->T + t] : 0;
    if (k0 < nv_window_start(j->window, t)) k0 = nv_window_start(j->window, t);
    return k0 < 0 ? 0 : k0 > t ? t : k0;
}

/* The first key any row of r0..r1 reads, rounded down to a multiple of al: the block's products
 * run over the keys from there to its last row (packed documents and sliding windows leave the
 * keys before it out of every row). */
static int block_first_key(const attn_job *j, int b, int r0, int r1, int al) {
    int lo = r1;
    for (int t = r0; t < r1; t++) {
        const int k0 = first_key(j, b, t);
        if (k0 < lo) lo = k0;
    }
    return lo / al * al;
}

/* The multiple a view of each of the packs (z may be NULL) starts at: powers of two, so the largest. */
static int key_align(const nv_bpack *x, const nv_bpack *y, const nv_bpack *z) {
    int a = nv_bpack_align(x), b = nv_bpack_align(y), c = z ? nv_bpack_align(z) : 1;
    a = a > b ? a : b;
    return a > c ? a : c;
}

/* Gemma 2's soft cap on the scores: s[u] = cap * tanh(scale * s[u] / cap) in place for u < n, and
 * with fac, fac[u] = d s / d (the raw score) = scale * (1 - tanh^2). The backward runs it on the
 * same raw scores as the forward did: the same bits. */
static void cap_row(float *s, int n, float scale, float cap, float *fac) {
    const __m256 vin = _mm256_set1_ps(scale / cap), vcap = _mm256_set1_ps(cap), vs = _mm256_set1_ps(scale),
                 one = _mm256_set1_ps(1.0f);
    for (int u = 0; u < n; u += 8) {
        const __m256 t = nv_tanh256(_mm256_mul_ps(nv_load8_n(s + u, n - u), vin));
        nv_store8_n(s + u, _mm256_mul_ps(vcap, t), n - u);
        if (fac) nv_store8_n(fac + u, _mm256_mul_ps(vs, _mm256_fnmadd_ps(t, t, one)), n - u);
    }
}

/* p[u] = exp(scale * s[u] - mx) * inv for u < n, zero for n <= u < n_zero (n_zero <= the row's
 * length rounded up to 8): one row's probabilities, backward, by the forward's operations. */
static void probs_row(float *p, const float *s, int n, int n_zero, float scale, float mx, float inv) {
    const __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(mx), vinv = _mm256_set1_ps(inv);
    for (int u = 0; u < n; u += 8) {
        const __m256 e = nv_exp256(_mm256_sub_ps(_mm256_mul_ps(nv_load8_n(s + u, n - u), vs), vm));
        nv_store8_n(p + u, _mm256_mul_ps(e, vinv), n - u);
    }
    for (int u = n; u < n_zero; u++) p[u] = 0.0f;
}

/* The softmax of scale * s[0..n) in place (zero from n to n_zero), its max and 1/sum into st[0..1]:
 * probs_row's operations, each exp computed once (kept in s, then scaled). */
static void softmax_row(float *s, int n, int n_zero, float scale, float *st) {
    const __m256 vs = _mm256_set1_ps(scale);
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    for (int u = 0; u < n; u += 8) { /* masked lanes read 0: -inf keeps them out of the max */
        const __m256 x = _mm256_mul_ps(nv_load8_n(s + u, n - u), vs);
        vmax = _mm256_max_ps(vmax, n - u >= 8 ? x : _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x,
                                                                         _mm256_castsi256_ps(nv_lane_mask8(n - u))));
    }
    const float mx = nv_hmax256(vmax);
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (int u = 0; u < n; u += 8) {
        const __m256 e = nv_exp256(_mm256_sub_ps(_mm256_mul_ps(nv_load8_n(s + u, n - u), vs), vm));
        nv_store8_n(s + u, e, n - u);
        vsum = _mm256_add_ps(vsum, n - u >= 8 ? e : _mm256_and_ps(e, _mm256_castsi256_ps(nv_lane_mask8(n - u))));
    }
    st[0] = mx;
    st[1] = 1.0f / nv_hsum256(vsum);
    const __m256 vinv = _mm256_set1_ps(st[1]);
    for (int u = 0; u < n; u += 8) nv_store8_n(s + u, _mm256_mul_ps(nv_load8_n(s + u, n - u), vinv), n - u);
    for (int u = n; u < n_zero; u++) s[u] = 0.0f;
}

/* One (sequence, query head): per block of RB query rows, S = Q K^T over the keys from the block's
 * first (block_first_key) up to its last row, each row's softmax in place (zero before the row's
 * first key and after the diagonal; its max and 1/sum kept in stats), then out = P V over the same
 * keys. */
static void forward_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const attn_job *j = ctx;
    const nv_config *c = j->c;
    const int T = j->T, T8 = pad8(T), H = c->n_heads, hd = c->head_dim, qd = nv_config_q_dim(c),
              kvd = nv_config_kv_dim(c);
    const int b = task / H, h = task % H, kv_mul = H / c->n_kv_heads;
    const size_t koff = (size_t)(h / kv_mul) * hd;
    float *ws = j->ws + (size_t)task * task_floats(c, T);
    float *kbuf = ws, *vbuf = kbuf + nv_bpack_floats(hd, T), *s = vbuf + nv_bpack_floats(T, hd);
    const float scale = j->scale, cap = c->attn_softcap;
    nv_bpack kp, vp;
    nv_bpack_rows(&kp, j->e, j->k + (size_t)b * T * kvd + koff, (size_t)kvd, T, hd, kbuf); /* B = K^T */
    nv_bpack_cols(&vp, j->e, j->v + (size_t)b * T * kvd + koff, (size_t)kvd, T, hd, vbuf); /* B = V */
    const float *q0 = j->q + (size_t)b * T * qd + (size_t)h * hd;
    float *st0 = j->stats + ((size_t)b * H + h) * T * 2, *out0 = j->out + (size_t)b * T * qd + (size_t)h * hd;
    const int al = key_align(&kp, &vp, NULL);
    for (int r0 = 0; r0 < T; r0 += RB) {
        const int r1 = T - r0 < RB ? T : r0 + RB, m = r1 - r0, lo = block_first_key(j, b, r0, r1, al);
        nv_bpack kv, vv; /* the keys and values from lo on */
        nv_bpack_skip(&kp, lo, 0, &kv);
        nv_bpack_skip(&vp, 0, lo, &vv);
        nv_bpack_run(&kv, q0 + (size_t)r0 * qd, (size_t)qd, m, hd, r1 - lo, s, (size_t)T8, 0);
        /* the probabilities over the scores (a row's entry u - lo for key u), zero before the row's
           first key and past the diagonal up to the block's last key (the product below reads them) */
        for (int t = r0; t < r1; t++) {
            float *row = s + (size_t)(t - r0) * T8;
            const int k0 = first_key(j, b, t) - lo;
            memset(row, 0, (size_t)k0 * sizeof(float));
            if (cap != 0.0f) cap_row(row + k0, t + 1 - lo - k0, scale, cap, NULL);
            softmax_row(row + k0, t + 1 - lo - k0, r1 - lo - k0, cap != 0.0f ? 1.0f : scale, st0 + (size_t)t * 2);
        }
        nv_bpack_run(&vv, s, (size_t)T8, m, r1 - lo, hd, out0 + (size_t)r0 * qd, (size_t)qd, 0);
    }
}

/* One (sequence, KV head), its query heads in turn, per block of RB query rows:
 *   P again from S = Q K^T and the forward's row max and 1/sum (the same operations, so the same
 *   bits as the forward's), dP = dout V^T, dS = P (dP - rowsum(P dP)) scale (zero before the row's
 *   first key and after the diagonal), dq += dS K, dk += dS^T q, dv += P^T dout over the forward's
 *   keys (the block's first to its last row).
 * The dk/dv rows a task adds to belong to its KV head alone. */
static void backward_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    const attn_job *j = ctx;
    const nv_config *c = j->c;
    const int T = j->T, T8 = pad8(T), H = c->n_heads, KVH = c->n_kv_heads, hd = c->head_dim;
    const int qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c), kv_mul = H / KVH;
    const int b = task / KVH, kvh = task % KVH;
    const size_t koff = (size_t)kvh * hd;
    float *ws = j->ws + (size_t)task * task_floats(c, T);
    float *vbuf = ws, *kbuf = vbuf + nv_bpack_floats(hd, T), *ktbuf = kbuf + nv_bpack_floats(T, hd);
    float *ds = ktbuf + nv_bpack_floats(hd, T), *pb = ds + (size_t)RB * T8, *tr = pb + (size_t)RB * T8;
    float *blk = tr + (size_t)T8 * RB;
    const float scale = j->scale, cap = c->attn_softcap;
    float *fac = tr; /* soft-capped scores: each score's factor (cap_row's), RB x T8, until tr's first transpose */
    float *dkb = j->dk + (size_t)b * T * kvd + koff, *dvb = j->dv + (size_t)b * T * kvd + koff;
    const float *kb = j->k + (size_t)b * T * kvd + koff;
    const int narrow = hd < NARROW;
    const narrow_ws nw = narrow ? narrow_of(c, T, ws) : (narrow_ws){0};
    nv_bpack vp, kp, ktp, bp;
    nv_bpack_rows(&vp, j->e, j->v + (size_t)b * T * kvd + koff, (size_t)kvd, T, hd, vbuf); /* B = V^T */
    if (narrow) { /* A = K^T; dk^T and dv^T summed over the blocks of every query head, added back at the end */
        nv_transpose(kb, (size_t)kvd, T, hd, nw.k, (size_t)T8);
        memset(nw.dk, 0, 2 * (size_t)hd * T8 * sizeof(float)); /* (dk and dv lie side by side) */
    } else {
        nv_bpack_cols(&kp, j->e, kb, (size_t)kvd, T, hd, kbuf); /* B = K */
    }
    nv_bpack_rows(&ktp, j->e, kb, (size_t)kvd, T, hd, ktbuf);                             /* B = K^T */
    const int al = narrow ? key_align(&vp, &ktp, NULL) : key_align(&vp, &kp, &ktp);
    for (int h = kvh * kv_mul; h < (kvh + 1) * kv_mul; h++) {
        if (narrow) { /* this head's q^T and dout^T, A of dk^T and dv^T */
            nv_transpose(j->q + (size_t)b * T * qd + (size_t)h * hd, (size_t)qd, T, hd, nw.q, (size_t)T8);
            nv_transpose(j->dout + (size_t)b * T * qd + (size_t)h * hd, (size_t)qd, T, hd, nw.dout, (size_t)T8);
        }
        for (int r0 = 0; r0 < T; r0 += RB) {
            const int r1 = T - r0 < RB ? T : r0 + RB, m = r1 - r0, lo = block_first_key(j, b, r0, r1, al), w = r1 - lo;
            const float *st0 = j->stats + ((size_t)b * H + h) * T * 2;
            const float *dout0 = j->dout + ((size_t)b * T + r0) * qd + (size_t)h * hd;
            const float *q0 = j->q + ((size_t)b * T + r0) * qd + (size_t)h * hd;
            nv_bpack vv, kv, ktv; /* V^T, K and K^T from key lo on: a row's entry u - lo is key u's */
            nv_bpack_skip(&vp, lo, 0, &vv);
            if (!narrow) nv_bpack_skip(&kp, 0, lo, &kv);
            nv_bpack_skip(&ktp, lo, 0, &ktv);
            nv_bpack_run(&ktv, q0, (size_t)qd, m, hd, w, pb, (size_t)T8, 0); /* the forward's scores */
            for (int t = r0; t < r1; t++) {
                float *p = pb + (size_t)(t - r0) * T8;
                const int k0 = first_key(j, b, t) - lo;
                memset(p, 0, (size_t)k0 * sizeof(float));
                if (cap != 0.0f) cap_row(p + k0, t + 1 - lo - k0, scale, cap, fac + (size_t)(t - r0) * T8 + k0);
                probs_row(p + k0, p + k0, t + 1 - lo - k0, w - k0, cap != 0.0f ? 1.0f : scale, st0[(size_t)t * 2],
                          st0[(size_t)t * 2 + 1]);
            }
            nv_bpack_run(&vv, dout0, (size_t)qd, m, hd, w, ds, (size_t)T8, 0);
            for (int t = r0; t < r1; t++) { /* over the row's keys k0..t (zero before and after) */
                const int k0 = first_key(j, b, t) - lo;
                const float *a = pb + (size_t)(t - r0) * T8 + k0;
                float *d = ds + (size_t)(t - r0) * T8 + k0;
                memset(d - k0, 0, (size_t)k0 * sizeof(float));
                const int n = t + 1 - lo - k0;
                __m256 vsum = _mm256_setzero_ps();
                int u = 0;
                for (; u + 8 <= n; u += 8) vsum = _mm256_fmadd_ps(_mm256_loadu_ps(a + u), _mm256_loadu_ps(d + u), vsum);
                float sum = nv_hsum256(vsum);
                for (; u < n; u++) sum += a[u] * d[u];
                if (cap != 0.0f) { /* dS = P (dP - rowsum(P dP)) times each score's own factor */
                    const float *f = fac + (size_t)(t - r0) * T8 + k0;
                    const __m256 vsm = _mm256_set1_ps(sum);
                    for (u = 0; u < n; u += 8)
                        nv_store8_n(d + u, _mm256_mul_ps(_mm256_mul_ps(nv_load8_n(a + u, n - u), _mm256_sub_ps(nv_load8_n(d + u, n - u), vsm)),
                                                         nv_load8_n(f + u, n - u)), n - u);
                    for (u = n; u < w - k0; u++) d[u] = 0.0f;
                    continue;
                }
                const __m256 vsm = _mm256_set1_ps(sum), vsc = _mm256_set1_ps(scale);
                for (u = 0; u + 8 <= n; u += 8)
                    _mm256_storeu_ps(d + u, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(a + u),
                                                                        _mm256_sub_ps(_mm256_loadu_ps(d + u), vsm)),
                                                          vsc));
                for (; u < n; u++) d[u] = a[u] * (d[u] - sum) * scale;
                for (; u < w - k0; u++) d[u] = 0.0f;
            }
            if (narrow) { /* transposed: the block's rows (or keys) are the outputs, the head's dimensions the rows */
                nv_bpack t; /* dq^T[rows r0..r1) = K^T dS^T */
                nv_bpack_rows(&t, j->e, ds, (size_t)T8, m, w, nw.packt);
                nv_bpack_run(&t, nw.k + lo, (size_t)T8, hd, w, m, nw.dq + r0, (size_t)T8, 0);
                nv_bpack_cols(&t, j->e, ds, (size_t)T8, m, w, nw.pack); /* dk^T[keys lo..r1) += q^T dS */
                nv_bpack_run(&t, nw.q + r0, (size_t)T8, hd, m, w, nw.dk + lo, (size_t)T8, 1);
                nv_bpack_cols(&t, j->e, pb, (size_t)T8, m, w, nw.pack); /* dv^T[keys lo..r1) += dout^T P */
                nv_bpack_run(&t, nw.dout + r0, (size_t)T8, hd, m, w, nw.dv + lo, (size_t)T8, 1);
                continue;
            }
            nv_bpack_run(&kv, ds, (size_t)T8, m, w, hd, j->dq + ((size_t)b * T + r0) * qd + (size_t)h * hd, (size_t)qd, 1);
            /* dk[lo..r1) += dS^T q over the block's rows */
            nv_transpose(ds, (size_t)T8, m, w, tr, RB);
            nv_bpack_cols(&bp, j->e, q0, (size_t)qd, m, hd, blk);
            nv_bpack_run(&bp, tr, RB, w, m, hd, dkb + (size_t)lo * kvd, (size_t)kvd, 1);
            /* dv[lo..r1) += P^T dout over the block's rows */
            nv_transpose(pb, (size_t)T8, m, w, tr, RB);
            nv_bpack_cols(&bp, j->e, dout0, (size_t)qd, m, hd, blk);
            nv_bpack_run(&bp, tr, RB, w, m, hd, dvb + (size_t)lo * kvd, (size_t)kvd, 1);
        }
        if (narrow) add_transposed(j->dq + (size_t)b * T * qd + (size_t)h * hd, (size_t)qd, nw.dq, (size_t)T8, T, hd);
    }
    if (narrow) {
        add_transposed(dkb, (size_t)kvd, nw.dk, (size_t)T8, T, hd);
        add_transposed(dvb, (size_t)kvd, nw.dv, (size_t)T8, T, hd);
    }
}

/* The engine for a head's products: a bf16 tile pads a head's depth to 32, so below 32 the fp32 one. */
static nv_engine_id head_engine(const nv_config *c, nv_engine_id e) {
    return c->head_dim < 32 && nv_engine_low_precision(e) ? nv_engine_best_fp32() : e;
}

void nv_attention_forward(const nv_config *c, nv_engine_id e, int B, int T, int layer, const float *q, const float *k,
                          const float *v, const int *seg, float *stats, float *out, float *ws) {
    e = head_engine(c, e);
    attn_job j = {c, B, T, e, q, k, v, NULL, stats, out, NULL, NULL, NULL, ws, seg, nv_config_layer_window(c, layer),
                  1.0f / nv_config_attn_div(c)};
    nv_pool_run(forward_task, &j, B * c->n_heads);
}

void nv_attention_backward(const nv_config *c, nv_engine_id e, int B, int T, int layer, const float *q, const float *k,
                           const float *v, const int *seg, const float *stats, const float *dout, float *dq, float *dk,
                           float *dv, float *ws) {
    e = head_engine(c, e);
    attn_job j = {c, B, T, e, q, k, v, dout, (float *)stats, NULL, dq, dk, dv, ws, seg, nv_config_layer_window(c, layer),
                  1.0f / nv_config_attn_div(c)};
    nv_pool_run(backward_task, &j, B * c->n_kv_heads);
}
