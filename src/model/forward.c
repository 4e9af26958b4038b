#include "model/forward.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "base/vmath.h"
#include "model/attn_kern.h"

/* Prompt rows of a chunk that attend together, per head: each key and value is read once for them. */
#define ATT_ROWS 32

nv_err nv_state_init(nv_state *s, const nv_config *c, int max_tokens, int cache_len, int all_logits) {
    memset(s, 0, sizeof *s);
    if (max_tokens < 1 || cache_len < 1 || cache_len > c->seq_len)
        return nv_fail(NV_EINVAL, "state: bad sizes (chunk %d, cache %d, model context %d)", max_tokens, cache_len,
                       c->seq_len);
    size_t kv = (size_t)nv_config_kv_dim(c);
    /* windowed layers: a ring of their window and a chunk, each position twice, when that saves memory */
    const long ring = (long)c->swa_window + max_tokens;
    s->ring = c->swa_window > 0 && nv_config_windowed_layers(c) > 0 && 2 * ring < cache_len ? (int)ring : 0;
    s->layer_at = malloc((size_t)c->n_layers * sizeof *s->layer_at);
    s->layer_slots = malloc((size_t)c->n_layers * sizeof *s->layer_slots);
    if (!s->layer_at || !s->layer_slots) {
        nv_state_free(s);
        return nv_fail(NV_ENOMEM, "cannot allocate the run state");
    }
    size_t cache = 0;
    for (int l = 0; l < c->n_layers; l++) {
        s->layer_slots[l] = s->ring && nv_config_layer_windowed(c, l) ? 2 * s->ring : cache_len;
        s->layer_at[l] = cache;
        cache += (size_t)s->layer_slots[l] * kv;
    }
    s->max_tokens = max_tokens;
    s->cache_len = cache_len;
    s->all_logits = all_logits;
    nv_err e = nv_rows_init(&s->r, c, max_tokens);
    if (e != NV_OK) return e;
    s->att_rows = max_tokens < ATT_ROWS ? max_tokens : ATT_ROWS;
    s->att = calloc((size_t)c->n_heads * s->att_rows * cache_len, sizeof(float));
    s->kt = calloc((size_t)nv_config_q_dim(c) * 16, sizeof(float));
    s->rope = nv_rope_table_new(c, cache_len, 0);
    s->rope_swa = nv_rope_table_new(c, cache_len, 1);
    s->logit_cap = all_logits ? max_tokens : 1;
    s->logits = calloc((size_t)s->logit_cap * (size_t)c->vocab_size, sizeof(float));
    s->key_cache = calloc(cache, sizeof(float));
    s->value_cache = calloc(cache, sizeof(float));
    if (!s->att || !s->kt || !s->rope || (c->rope_theta_swa != 0.0f && !s->rope_swa) || !s->logits || !s->key_cache || !s->value_cache) {
        nv_state_free(s);
        return nv_fail(NV_ENOMEM, "cannot allocate the run state (KV cache of %zu MB)", cache * 8 >> 20);
    }
    s->head_dim = c->head_dim;
    s->rope_key = nv_config_rope_key(c);
    return NV_OK;
}

void nv_state_free(nv_state *s) {
    nv_rows_free(&s->r);
    float *all[] = {s->att, s->kt, s->rope, s->rope_swa, s->logits, s->key_cache, s->value_cache};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(s->layer_at);
    free(s->layer_slots);
    memset(s, 0, sizeof *s);
}

nv_err nv_rows_init(nv_rows *r, const nv_config *c, int T) {
    memset(r, 0, sizeof *r);
    size_t n = (size_t)T, q = (size_t)nv_config_q_dim(c), kv = (size_t)nv_config_kv_dim(c);
    size_t d = (size_t)c->dim, h = (size_t)c->hidden_dim, wide = q > d ? q : d;
    r->x = calloc(n * d, sizeof(float));
    r->xb = calloc(n * wide, sizeof(float)); /* attention's output rows are q_dim wide */
    r->xb2 = calloc(n * d, sizeof(float));
    r->hb = calloc(n * h, sizeof(float));
    r->hb2 = calloc(n * h, sizeof(float));
    r->q = calloc(n * q, sizeof(float));
    r->k = calloc(n * kv, sizeof(float));
    r->v = calloc(n * kv, sizeof(float));
    int moe_ok = 1;
    if (c->n_experts) {
        const size_t E = (size_t)c->n_experts, k = (size_t)c->n_experts_used;
        r->moe_x = calloc(n * d, sizeof(float));
        r->moe_y = calloc(n * d, sizeof(float));
        r->moe_p = calloc(n * E, sizeof(float));
        r->moe_w = calloc(n * k, sizeof(float));
        r->moe_sel = calloc(n * k, sizeof(int));
        r->moe_rows = calloc(n * k, sizeof(int));
        r->moe_off = calloc(E + 1, sizeof(int));
        moe_ok = r->moe_x && r->moe_y && r->moe_p && r->moe_w && r->moe_sel && r->moe_rows && r->moe_off;
    }
    if (!r->x || !r->xb || !r->xb2 || !r->hb || !r->hb2 || !r->q || !r->k || !r->v || !moe_ok) {
        nv_rows_free(r);
        return nv_fail(NV_ENOMEM, "cannot allocate the activations of %d rows", T);
    }
    return NV_OK;
}

void nv_rows_free(nv_rows *r) {
    float *all[] = {r->x, r->xb, r->xb2, r->hb, r->hb2, r->q, r->k, r->v, r->moe_x, r->moe_y, r->moe_p, r->moe_w};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(r->moe_sel);
    free(r->moe_rows);
    free(r->moe_off);
    memset(r, 0, sizeof *r);
}

void nv_rmsnorm(float *o, const float *x, const float *weight, int size, float eps) {
    float ss = 0.0f;
    for (int j = 0; j < size; j++) ss += x[j] * x[j];
    ss /= (float)size;
    ss += eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = 0; j < size; j++) o[j] = weight[j] * (ss * x[j]);
}

/* x[i] = expf(x[i] - max) for i < size, llama2.c's values: the maximum (exact in any order: 8 lanes,
 * NaN ignored as the scalar comparison ignores it), expf 8 lanes at a time with its bits where
 * nv_expf_libm_matches(), libm's otherwise. A sink (gpt-oss's; -INFINITY: none) takes part in the
 * maximum; returns expf(sink - max), its share of the sum (0 without one). */
static float softmax_exps(float *x, int size, float sink) {
    float max_val = x[0];
    int i = 1;
    if (size >= 9) {
        __m256 m = _mm256_set1_ps(x[0]);
        for (; i + 8 <= size; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m); /* NaN in x: keeps m */
        float lanes[8];
        _mm256_storeu_ps(lanes, m);
        for (int j = 0; j < 8; j++)
            if (lanes[j] > max_val) max_val = lanes[j];
    }
    for (; i < size; i++)
        if (x[i] > max_val) max_val = x[i];
    if (sink > max_val) max_val = sink;
    i = 0;
    if (size >= 8 && nv_expf_libm_matches()) {
        const __m256 vmax = _mm256_set1_ps(max_val);
        for (; i + 8 <= size; i += 8) _mm256_storeu_ps(x + i, nv_expf256_exact(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmax)));
    }
    for (; i < size; i++) x[i] = expf(x[i] - max_val);
    return sink == -INFINITY ? 0.0f : expf(sink - max_val);
}

/* x[i] /= sum (8 lanes: the same correctly rounded division). */
static void softmax_divide(float *x, int size, float sum) {
    const __m256 vs = _mm256_set1_ps(sum);
    int i = 0;
    for (; i + 8 <= size; i += 8) _mm256_storeu_ps(x + i, _mm256_div_ps(_mm256_loadu_ps(x + i), vs));
    for (; i < size; i++) x[i] /= sum;
}

/* llama2.c's softmax, value for value: the exps, their sum left to right, then each divided by it. */
void nv_softmax(float *x, int size) { nv_softmax_sink(x, size, -INFINITY); }

void nv_softmax_sink(float *x, int size, float sink) {
    const float es = softmax_exps(x, size, sink);
    float sum = 0.0f;
    for (int i = 0; i < size; i++) sum += x[i];
    if (sink != -INFINITY) sum += es; /* (as ggml adds it: after the row's own) */
    softmax_divide(x, size, sum);
}

void nv_softmax_causal(float *x, size_t ld, int size0, int rows) { nv_softmax_causal_sink(x, ld, size0, rows, -INFINITY); }

void nv_softmax_causal_sink(float *x, size_t ld, int size0, int rows, float sink) {
    for (int g0 = 0; g0 < rows; g0 += 8) {
        const int R = rows - g0 < 8 ? rows - g0 : 8, last = size0 + g0 + R - 1;
        float es[8];
        for (int r = 0; r < R; r++) es[r] = softmax_exps(x + (size_t)(g0 + r) * ld, size0 + g0 + r, sink);
        /* eight rows' sums side by side, lane r row g0 + r: each still left to right (8 x 8 blocks
         * transposed in registers; a row's lanes past its end add +0, which changes no sum) */
        __m256 acc = _mm256_setzero_ps();
        for (int i0 = 0; i0 < last; i0 += 8) {
            __m256 t[8];
            for (int r = 0; r < 8; r++) {
                const int n = r < R ? size0 + g0 + r - i0 : 0;
                const float *row = n > 0 ? x + (size_t)(g0 + r) * ld + i0 : NULL;
                t[r] = n >= 8 ? _mm256_loadu_ps(row) : n > 0 ? _mm256_maskload_ps(row, nv_lane_mask8(n)) : _mm256_setzero_ps();
            }
            nv_tr8x8_ps(t);
            for (int c = 0; c < 8; c++) acc = _mm256_add_ps(acc, t[c]);
        }
        float sums[8];
        _mm256_storeu_ps(sums, acc);
        for (int r = 0; r < R; r++) softmax_divide(x + (size_t)(g0 + r) * ld, size0 + g0 + r, sink != -INFINITY ? sums[r] + es[r] : sums[r]);
    }
}

void nv_rope_table(float *cs, const nv_config *c, int npos) {
    const int hd = c->head_dim, rot = nv_config_rope_dim(c);
    const float mscale = nv_config_rope_mscale(c); /* an attention temperature (YaRN's, LongRoPE's); x 1 is exact */
    /* partial rotation: the pairs past rot turn by nothing (cos 1, sin 0 leave a finite value exactly
       as it was, untempered, as llama.cpp passes them through) */
    for (int i = rot; i < hd; i += 2)
        for (int pos = 0; pos < npos; pos++) cs[(size_t)pos * hd + i] = 1.0f, cs[(size_t)pos * hd + i + 1] = 0.0f;
    for (int i = 0; i < rot; i += 2) {
        /* the float expressions of run.c, so the rotation is bit-identical */
        const float base = 1.0f / powf(c->rope_theta, (float)i / (float)rot);
        /* Llama 3.1+: llama.cpp's theta / freq_factor; LongRoPE's short set below its original context */
        const float freq = c->n_rope_factors ? base / c->rope_factors[i / 2] : base;
        const float short_freq = c->longrope_orig ? base / c->rope_factors_short[i / 2] : freq;
        for (int pos = 0; pos < npos; pos++) {
            float val = (float)pos * (pos < c->longrope_orig ? short_freq : freq);
            cs[(size_t)pos * hd + i] = cosf(val) * mscale;
            cs[(size_t)pos * hd + i + 1] = sinf(val) * mscale;
        }
    }
}

float *nv_rope_table_new(const nv_config *c, int npos, int windowed) {
    if (windowed && c->rope_theta_swa == 0.0f) return NULL;
    float *cs = malloc((size_t)npos * (size_t)c->head_dim * sizeof(float));
    if (!cs) return NULL;
    nv_config lc = *c;
    if (windowed) { /* llama.cpp's windowed layers: their own base, no frequency scaling */
        lc.rope_theta = c->rope_theta_swa;
        lc.n_rope_factors = lc.longrope_orig = 0;
        lc.yarn = (nv_rope_yarn){0};
    }
    nv_rope_table(cs, &lc, npos);
    return cs;
}

void nv_embed(const nv_model *m, int token, float *x) {
    const int d = m->config.dim;
    memcpy(x, m->w.tok_emb + (size_t)token * d, (size_t)d * sizeof(float));
    const float scale = m->config.emb_scale;
    if (scale != 0.0f)
        for (int i = 0; i < d; i++) x[i] *= scale;
}

void nv_logits_finish(const nv_config *c, float *logits, int rows) {
    const size_t n = (size_t)rows * (size_t)c->vocab_size;
    const float div = nv_config_logit_div(c), cap = c->logit_softcap;
    if (div != 1.0f)
        for (size_t i = 0; i < n; i++) logits[i] /= div;
    if (cap == 0.0f) return;
    for (size_t i = 0; i < n; i++) logits[i] = cap * tanhf(logits[i] / cap);
}

void nv_window_mask(float *att, size_t ld, int from, int p0, int rows, int window) {
    for (int g = 0; g < rows; g++)
        for (int u = from; u <= p0 + g - window; u++) att[(size_t)g * ld + u] = -INFINITY;
}

void nv_attn_softcap(float *att, size_t ld, int from, int p0, int rows, float cap) {
    for (int g = 0; g < rows; g++)
        for (int u = from; u <= p0 + g; u++) att[(size_t)g * ld + u] = cap * tanhf(att[(size_t)g * ld + u] / cap);
}

void nv_gelu_mul(float *h, const float *g, int n) {
    /* 0.5 x (1 + tanh(y)) = x / (1 + exp(-2y)), y = sqrt(2/pi) (x + 0.044715 x^3) */
    const float k = -2.0f * 0.7978845608f, a = 0.044715f;
    int i = 0;
    for (const __m256 one = _mm256_set1_ps(1.0f), vk = _mm256_set1_ps(k), va = _mm256_set1_ps(a); i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(h + i);
        const __m256 y = _mm256_mul_ps(_mm256_mul_ps(vk, x), _mm256_add_ps(one, _mm256_mul_ps(va, _mm256_mul_ps(x, x))));
        const __m256 e = nv_expf256_exact(y);
        _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(g + i)));
    }
    for (; i < n; i++) {
        const float x = h[i];
        h[i] = x / (1.0f + expf(k * x * (1.0f + a * x * x))) * g[i];
    }
}

void nv_rope_apply(float *vec, int n_heads, int head_dim, const float *cs) {
    for (int h = 0; h < n_heads; h++) {
        float *v = vec + (size_t)h * head_dim;
        for (int i = 0; i < head_dim; i += 2) {
            float fcr = cs[i], fci = cs[i + 1];
            float v0 = v[i], v1 = v[i + 1];
            v[i] = v0 * fcr - v1 * fci;
            v[i + 1] = v0 * fci + v1 * fcr;
        }
    }
}

typedef struct {
    const nv_config *c;
    nv_state *s;
    const float *kc, *vc;
    int n, pos;
    int window; /* the layer's sliding window, or 0 */
    int slots;  /* positions a kv head's run holds */
    int ring;   /* the layer's ring (its positions at slot p % ring and again ring later), or 0 */
    const float *sinks; /* the layer's sink logit per head (gpt-oss), or NULL */
} attn_job;

/* The first position whose slot is 0 in the run that holds positions lo.. (0 without a ring): a
 * position u >= lo is at slot u - run_base, below 2 * ring for the ring's worth of positions. */
static inline int run_base(const attn_job *j, int lo) { return j->ring ? lo - lo % j->ring : 0; }

/* Scores of 8G consecutive positions (G groups of 8 lanes, G independent chains) into att[0..8G),
 * their keys from kbase on, stride apart: each lane sums q[i] k[i] over i in order, keys read 8 x 8
 * and transposed in registers. */
static inline __attribute__((always_inline)) void scores_groups(const int G, const float *q, const float *kbase,
                                                                int stride, int hd, __m256 vscale, float *att) {
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    const int hd8 = hd & ~7;
    for (int i0 = 0; i0 < hd8; i0 += 8) {
        __m256 k[2][8];
#pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
#pragma GCC unroll 8
            for (int l = 0; l < 8; l++) k[g][l] = _mm256_loadu_ps(kbase + (size_t)(8 * g + l) * stride + i0);
            nv_tr8x8_ps(k[g]);
        }
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            const __m256 qi = _mm256_set1_ps(q[i0 + i]);
#pragma GCC unroll 2
            for (int g = 0; g < G; g++) acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(qi, k[g][i]));
        }
    }
    for (int i = hd8; i < hd; i++) { /* a head size that is not a multiple of 8 */
        const __m256 qi = _mm256_set1_ps(q[i]);
        for (int g = 0; g < G; g++) {
            const float *kb = kbase + (size_t)(8 * g) * stride + i;
            const size_t st = (size_t)stride;
            const __m256 kv = _mm256_setr_ps(kb[0], kb[st], kb[2 * st], kb[3 * st], kb[4 * st], kb[5 * st], kb[6 * st], kb[7 * st]);
            acc[g] = _mm256_add_ps(acc[g], _mm256_mul_ps(qi, kv));
        }
    }
    for (int g = 0; g < G; g++) _mm256_storeu_ps(att + 8 * g, _mm256_div_ps(acc[g], vscale));
}

/* xb[g] = sum_u att[g][u] v[u] over u <= p0 + g for G rows (att rows ald apart, xb rows xld apart,
 * values [position - base][hd]): the values swept 64 positions at a time by every row that sees them, a
 * row's sums in registers within a sweep and in its output row between sweeps (an fp32 store and
 * load: exact), each lane summing over u in order, multiply then add, as llama2.c's loop. */
static void rows_values(const float *att, size_t ald, int G, int u_from, int p0, const float *vh, int base, int hd, float *xb,
                        size_t xld) {
    const int plast = p0 + G - 1;
    int i0 = 0;
    for (int nv; (nv = (hd - i0) / 8 < 8 ? (hd - i0) / 8 : 8) > 0; i0 += 8 * nv) {
        for (int g = 0; g < G; g++) memset(xb + (size_t)g * xld + i0, 0, sizeof(float) * 8 * nv);
        for (int u0 = u_from; u0 <= plast; u0 += 64) {
            const int zn = plast - u0 + 1 < 64 ? plast - u0 + 1 : 64;
            for (int g = u0 > p0 ? u0 - p0 : 0; g < G; g++)
                values_rows_add_any(nv, att + (size_t)g * ald + u0, vh + (size_t)(u0 - base) * hd + i0, (size_t)hd,
                                    p0 + g - u0 + 1 < zn ? p0 + g - u0 + 1 : zn, xb + (size_t)g * xld + i0);
        }
    }
    for (; i0 < hd; i0++) /* a head size that is not a multiple of 8 */
        for (int g = 0; g < G; g++) {
            const float *a = att + (size_t)g * ald;
            float o = 0.0f;
            for (int u = u_from; u <= p0 + g; u++) o += a[u] * vh[(size_t)(u - base) * hd + i0];
            xb[(size_t)g * xld + i0] = o;
        }
}

/* One query row t (position p) of head h: scores against keys 8 x 8 transposed in registers, then
 * the weighted sum of values. */
static void attend_row(const attn_job *j, int h, int t, float *att) {
    const nv_config *c = j->c;
    nv_state *s = j->s;
    const int hd = c->head_dim, q_dim = nv_config_q_dim(c), p = j->pos + t;
    const size_t hoff = (size_t)(h / (c->n_heads / c->n_kv_heads)) * j->slots * hd;
    const float *kh = j->kc + hoff, *vh = j->vc + hoff;
    const float *q = s->r.q + (size_t)t * q_dim + (size_t)h * hd;
    const float scale = nv_config_attn_div(c);
    const __m256 vscale = _mm256_set1_ps(scale);
    const int lo = nv_window_start(j->window, p), base = run_base(j, lo);
    int u = lo;
    for (; u + 16 <= p + 1; u += 16) scores_groups(2, q, kh + (size_t)(u - base) * hd, hd, hd, vscale, att + u);
    for (; u + 8 <= p + 1; u += 8) scores_groups(1, q, kh + (size_t)(u - base) * hd, hd, hd, vscale, att + u);
    for (; u <= p; u++) {
        const float *k = kh + (size_t)(u - base) * hd;
        float score = 0.0f;
        for (int i = 0; i < hd; i++) score += q[i] * k[i];
        att[u] = score / scale;
    }
    if (c->attn_softcap != 0.0f) nv_attn_softcap(att, 0, lo, p, 1, c->attn_softcap);
    nv_softmax_sink(att + lo, p + 1 - lo, j->sinks ? j->sinks[h] : -INFINITY);
    rows_values(att, s->cache_len, 1, lo, p, vh, base, hd, s->r.xb + (size_t)t * q_dim + (size_t)h * hd, q_dim);
}

/* Keys u0..u0+nu-1 (nu <= 16) of a head ([slot][hd]: u0 a slot) into kt[hd][16], zero past nu (no
 * key past the cache is read). */
static void keys_t16(const float *kh, int hd, int u0, int nu, float *kt) {
    nv_transpose(kh + (size_t)u0 * hd, (size_t)hd, nu, hd, kt, 16);
    for (int i = 0; nu < 16 && i < hd; i++) memset(kt + (size_t)i * 16 + nu, 0, (size_t)(16 - nu) * sizeof(float));
}

/* G consecutive query rows t0.. of head h (positions p0 = pos + t0 on): each 16 keys transposed once
 * for all of them and scored four rows at a time (eight sums in flight); then the values
 * (rows_values). The same sums as attend_row. */
static void attend_rows(const attn_job *j, int h, int t0, int G, float *att) {
    const nv_config *c = j->c;
    nv_state *s = j->s;
    const int hd = c->head_dim, q_dim = nv_config_q_dim(c), p0 = j->pos + t0, plast = p0 + G - 1;
    const size_t hoff = (size_t)(h / (c->n_heads / c->n_kv_heads)) * j->slots * hd, ald = (size_t)s->cache_len;
    const float *kh = j->kc + hoff, *vh = j->vc + hoff;
    float *kt = s->kt + (size_t)h * hd * 16;
    const float scale = nv_config_attn_div(c);
    /* a sliding window: no key before the first row's window is read; the later rows' earlier ones are masked */
    const int lo = nv_window_start(j->window, p0), base = run_base(j, lo);
    for (int u0 = lo; u0 <= plast; u0 += 16) {
        const int nu = plast - u0 + 1 < 16 ? plast - u0 + 1 : 16;
        keys_t16(kh, hd, u0 - base, nu, kt);
        for (int g = u0 > p0 ? u0 - p0 : 0; g < G; g += 4) {
            const int R = G - g < 4 ? G - g : 4;
            const float *qr[4];
            float *ar[4];
            int cnt[4];
            for (int r = 0; r < R; r++) {
                qr[r] = s->r.q + (size_t)(t0 + g + r) * q_dim + (size_t)h * hd;
                ar[r] = att + (size_t)(g + r) * ald + u0;
                cnt[r] = p0 + g + r - u0 + 1 < 16 ? p0 + g + r - u0 + 1 : 16;
            }
            scores_rows_any(R, nu > 8 ? 2 : 1, 0, qr, hd, kt, 0, 16, 0, cnt, scale, ar, 0);
        }
    }
    if (c->attn_softcap != 0.0f) nv_attn_softcap(att, ald, lo, p0, G, c->attn_softcap);
    if (j->window) nv_window_mask(att, ald, lo, p0, G, j->window);
    nv_softmax_causal_sink(att + lo, ald, p0 + 1 - lo, G, j->sinks ? j->sinks[h] : -INFINITY);
    rows_values(att, ald, G, lo, p0, vh, base, hd, s->r.xb + (size_t)t0 * q_dim + (size_t)h * hd, q_dim);
}

/* One head per task, over all n query rows: alone (decode) or in groups of att_rows (a prompt).
 * Vector lanes hold different positions (scores) or different dimensions (the weighted sum of
 * values), never parts of one sum, and multiply and add stay separate: every value is computed
 * exactly as llama2.c's scalar loops compute it. */
static void attention_head(void *ctx, int h, int n_heads) {
    (void)n_heads;
    const attn_job *j = ctx;
    nv_state *s = j->s;
    float *att = s->att + (size_t)h * s->att_rows * s->cache_len;
    for (int t0 = 0; t0 < j->n; t0 += s->att_rows) {
        const int G = j->n - t0 < s->att_rows ? j->n - t0 : s->att_rows;
        if (G == 1) attend_row(j, h, t0, att);
        else attend_rows(j, h, t0, G, att);
    }
}

/* Layer l's ring (a windowed layer's, when the state keeps one), or 0: its cache holds every position. */
static int layer_ring(const nv_state *s, int l) { return s->layer_slots[l] == s->cache_len ? 0 : s->ring; }

/* Causal attention of n query rows (positions pos..pos+n-1) over layer l's cache. */
static void attention(const nv_model *m, nv_state *s, int l, const float *kc, const float *vc, int n, int pos) {
    const nv_config *c = &m->config;
    attn_job j = {c, s, kc, vc, n, pos, nv_config_layer_window(c, l), s->layer_slots[l], layer_ring(s, l),
                  m->w.sinks ? m->w.sinks + (size_t)l * c->n_heads : NULL};
    /* a few microseconds of work (a small model's decode over a short context) is not worth waking
       the pool for; the heads' sums are the same either way */
    const double work = (double)c->n_heads * c->head_dim * n * (pos + n);
    if (work >= NV_POOL_MIN_WORK) nv_pool_run(attention_head, &j, c->n_heads);
    else
        for (int h = 0; h < c->n_heads; h++) attention_head(&j, h, c->n_heads);
}

typedef struct {
    float *o;
    const float *x, *w;
    int n, d;
    float eps;
} norm_job;

static void norm_task(void *ctx, int task, int n_tasks) {
    const norm_job *j = ctx;
    for (int t = (int)((long)j->n * task / n_tasks); t < (int)((long)j->n * (task + 1) / n_tasks); t++)
        nv_rmsnorm(j->o + (size_t)t * j->d, j->x + (size_t)t * j->d, j->w, j->d, j->eps);
}

void nv_rmsnorm_rows(float *o, const float *x, const float *w, int n, int d, float eps) {
    norm_job j = {o, x, w, n, d, eps};
    const int tasks = (size_t)n * d < 32768 ? 1 : 2 * nv_pool_threads();
    nv_pool_run(norm_task, &j, tasks < n ? tasks : n);
}

void nv_layer_input(const nv_model *m, int l, int ffn, float *o, const float *x, int n) {
    const nv_config *c = &m->config;
    const float *w = ffn ? m->w.rms_ffn : m->w.rms_att;
    if (!w) memcpy(o, x, (size_t)n * c->dim * sizeof(float)); /* OLMo 2: no norm before the branch */
    else nv_rmsnorm_rows(o, x, w + (size_t)l * c->dim, n, c->dim, c->norm_eps);
}

typedef struct {
    float *x;         /* the residual stream: x += scale y */
    const float *y;   /* residual: the product; SwiGLU: w3's output */
    float *h;         /* SwiGLU: w1's output, replaced by silu(h) * y (gelu(h) * y with gelu) */
    int stride;       /* floats per row of all of them */
    int rows;         /* rows of the product (a pass of its own over them) */
    int gelu;
    float scale;      /* residual: Granite's multiplier (nv_config_residual_scale; 1: x += y, the same bits) */
    const float *bh, *by; /* gpt-oss's expert: h's and y's biases (one row), and SwiGLU-OAI; NULL: neither */
} tail_ep;

static void residual_ep(void *vc, int r0, int r1, int c0, int c1) {
    const tail_ep *e = vc;
    const float s = e->scale;
    for (int r = r0; r < r1; r++) {
        float *x = e->x + (size_t)r * e->stride;
        const float *y = e->y + (size_t)r * e->stride;
        for (int i = c0; i < c1; i++) x[i] += s * y[i];
    }
}

void nv_silu_mul(float *h, const float *g, int n) {
    int i = 0;
    if (n >= 8 && nv_expf_libm_matches()) /* 8 lanes with the loop's operations and expf's bits */
        for (const __m256 one = _mm256_set1_ps(1.0f); i + 8 <= n; i += 8) {
            const __m256 val = _mm256_loadu_ps(h + i);
            const __m256 e = nv_expf256_exact(_mm256_xor_ps(val, _mm256_set1_ps(-0.0f)));
            _mm256_storeu_ps(h + i, _mm256_mul_ps(_mm256_mul_ps(val, _mm256_div_ps(one, _mm256_add_ps(one, e))), _mm256_loadu_ps(g + i)));
        }
    for (; i < n; i++) {
        float val = h[i];
        val *= (1.0f / (1.0f + expf(-val))); /* SiLU */
        val *= g[i];
        h[i] = val;
    }
}

static void residual_rows_task(void *ctx, int task, int n_tasks) {
    const tail_ep *e = ctx;
    for (int r = task; r < e->rows; r += n_tasks) residual_ep(ctx, r, r + 1, 0, e->stride);
}

/* A branch kept apart from the residual (post-norms, Granite's multiplier): y (e's product, its rows)
 * normed in place by weight w when there is one, then x += scale y. */
static void branch_residual(tail_ep *e, float *y, const float *w, float eps) {
    if (w) nv_rmsnorm_rows(y, y, w, e->rows, e->stride, eps);
    nv_pool_run(residual_rows_task, e, e->rows < 2 * nv_pool_threads() ? e->rows : 2 * nv_pool_threads());
}

void nv_swiglu_oai(float *g, const float *u, const float *bg, const float *bu, int n) {
    for (int i = 0; i < n; i++) {
        float x = g[i] + bg[i], y = u[i] + bu[i];
        x = x > 7.0f ? 7.0f : x; /* (a NaN stays one, as std::min(x, 7) keeps it) */
        y = y > 7.0f ? 7.0f : y < -7.0f ? -7.0f : y;
        g[i] = x / (1.0f + expf(1.702f * -x)) * (y + 1.0f);
    }
}

static void swiglu_ep(void *vc, int r0, int r1, int c0, int c1) {
    const tail_ep *e = vc;
    for (int r = r0; r < r1; r++) {
        float *h = e->h + (size_t)r * e->stride + c0;
        const float *y = e->y + (size_t)r * e->stride + c0;
        if (e->bh) nv_swiglu_oai(h, y, e->bh + c0, e->by + c0, c1 - c0);
        else (e->gelu ? nv_gelu_mul : nv_silu_mul)(h, y, c1 - c0);
    }
}

static void swiglu_rows_task(void *ctx, int task, int n_tasks) {
    const tail_ep *e = ctx;
    for (int r = task; r < e->rows; r += n_tasks) swiglu_ep(ctx, r, r + 1, 0, e->stride);
}

/* The K largest of p[0, E) into sel (ties to the lower index), and their values into w. */
static void moe_top(const float *p, int E, int K, int *sel, float *w) {
    for (int j = 0; j < K; j++) { /* by selection: K is small */
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j && !taken; i++) taken = sel[i] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[j] = best;
        w[j] = p[best];
    }
}

void nv_moe_route(float *p, int E, int K, int *sel, float *w) {
    float sum = 0.0f;
    nv_softmax(p, E);
    moe_top(p, E, K, sel, w);
    for (int j = 0; j < K; j++) sum += w[j];
    for (int j = 0; j < K; j++) w[j] /= sum;
}

void nv_moe_route_chosen(const float *p, int E, int K, int *sel, float *w) {
    moe_top(p, E, K, sel, w);
    nv_softmax(w, K);
}

void nv_moe_group(const int *sel, int n, int K, int E, int *off, int *order, int *at) {
    int cursor[NV_MOE_MAX_EXPERTS];
    memset(off, 0, (size_t)(E + 1) * sizeof(int));
    for (int i = 0; i < n * K; i++) off[sel[i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    memcpy(cursor, off, (size_t)E * sizeof(int));
    for (int i = 0; i < n * K; i++) {
        const int pos = cursor[sel[i]]++;
        order[pos] = i;
        if (at) at[i] = pos;
    }
}

/* A mixture of experts' FFN on the n normalised rows xn: x += the sum over each row's chosen experts
 * of weight * w2.(silu(w1.xn) * w3.xn). The router's softmax picks a row's n_experts_used most probable
 * experts (ties to the lower index), their probabilities renormalised to sum 1 (as Mixtral and
 * Qwen3-MoE, and llama.cpp running them). Each expert runs once on the rows that chose it, gathered;
 * a row's outputs are summed in expert order, so its result does not depend on the other rows. */
static void moe_ffn(const nv_model *m, int l, int n, nv_rows *r) {
    const nv_config *c = &m->config;
    const nv_layer_plans *lp = &m->plans[l];
    const int d = c->dim, h = c->hidden_dim, E = c->n_experts, K = c->n_experts_used;
    nv_plan_run(lp->router, r->xb, n, r->moe_p);
    const float *rb = m->w.router_b ? m->w.router_b + (size_t)l * E : NULL; /* gpt-oss's: biased logits, softmax over the chosen */
    for (int t = 0; t < n; t++) {
        float *p = r->moe_p + (size_t)t * E;
        if (rb) {
            for (int e = 0; e < E; e++) p[e] += rb[e];
            nv_moe_route_chosen(p, E, K, r->moe_sel + (size_t)t * K, r->moe_w + (size_t)t * K);
        } else
            nv_moe_route(p, E, K, r->moe_sel + (size_t)t * K, r->moe_w + (size_t)t * K);
    }
    float *acc = r->xb2; /* free after the attention's residual */
    memset(acc, 0, (size_t)n * d * sizeof(float));
    nv_moe_group(r->moe_sel, n, K, E, r->moe_off, r->moe_rows, NULL);
    for (int e = 0; e < E; e++) {
        const int *rows = r->moe_rows + r->moe_off[e], cnt = r->moe_off[e + 1] - r->moe_off[e];
        if (!cnt) continue;
        for (int i = 0; i < cnt; i++)
            memcpy(r->moe_x + (size_t)i * d, r->xb + (size_t)(rows[i] / K) * d, (size_t)d * sizeof(float));
        nv_plan *const *ep = &lp->experts[3 * e];
        const size_t eb = ((size_t)l * E + (size_t)e) * h; /* gpt-oss's biases of this expert */
        tail_ep glu = {NULL, r->hb2, r->hb, h, cnt, 0, 1.0f, m->w.b1 ? m->w.b1 + eb : NULL, m->w.b3 ? m->w.b3 + eb : NULL};
        nv_plan_run_group((const nv_plan *const[]){ep[0], ep[2]}, 2, r->moe_x, cnt, (float *const[]){r->hb, r->hb2}, swiglu_ep, &glu);
        nv_plan_run(ep[1], r->hb, cnt, r->moe_y);
        const float *b2 = m->w.b2 ? m->w.b2 + ((size_t)l * E + (size_t)e) * d : NULL;
        for (int i = 0; i < cnt; i++) {
            const int t = rows[i] / K;
            const float wt = r->moe_w[rows[i]], *y = r->moe_y + (size_t)i * d;
            float *a = acc + (size_t)t * d;
            if (b2)
                for (int j = 0; j < d; j++) a[j] += wt * (y[j] + b2[j]);
            else
                for (int j = 0; j < d; j++) a[j] += wt * y[j];
        }
    }
    const float rs = nv_config_residual_scale(c);
    for (size_t i = 0; i < (size_t)n * d; i++) r->x[i] += rs * acc[i];
}

void nv_layer_tail(const nv_model *m, int l, int n, nv_rows *r, const nv_adapter_rows *ad) {
    const nv_config *c = &m->config;
    const nv_layer_plans *lp = &m->plans[l];
    int d = c->dim, h = c->hidden_dim;
    float *x = r->x, *xb = r->xb, *xb2 = r->xb2, *hb = r->hb, *hb2 = r->hb2;
    /* each product's elementwise follow-up runs on the block's own thread, in the same job; an
     * adapter's update of wo or w2 adds to the residual after it (x += W y + B'A y) */
    const int post = c->post_norms;
    /* the product kept apart, its adapter's update with it, until it is normed (post-norms) or, with
     * an adapter, scaled by Granite's multiplier, and joins the residual */
    tail_ep res = {x, xb2, NULL, d, n, 0, nv_config_residual_scale(c), NULL, NULL};
    const float *bo = m->w.bo ? m->w.bo + (size_t)l * d : NULL; /* gpt-oss's output bias */
    const int apart = post || bo || (res.scale != 1.0f && nv_adapter_rows_target(ad, 3));
    nv_plan_run_group((const nv_plan *const[]){lp->wo}, 1, xb, n, (float *const[]){xb2}, apart ? NULL : residual_ep, &res);
    nv_adapter_rows_add(ad, c, l, 3, xb, apart ? xb2 : x);
    for (int t = 0; bo && t < n; t++)
        for (int i = 0; i < d; i++) xb2[(size_t)t * d + i] += bo[i];
    if (apart) branch_residual(&res, xb2, post ? m->w.post_att + (size_t)l * d : NULL, c->norm_eps);

    nv_layer_input(m, l, 1, xb, x, n);
    if (c->n_experts) { /* adapters: on the attention alone (nv_lora_validate) */
        moe_ffn(m, l, n, r);
        return;
    }
    tail_ep glu = {NULL, hb2, hb, h, n, c->ffn_gelu, 1.0f, NULL, NULL};
    if (nv_adapter_rows_target(ad, 4) || nv_adapter_rows_target(ad, 6)) { /* SwiGLU waits for the updates */
        nv_plan_run_group((const nv_plan *const[]){lp->w1, lp->w3}, 2, xb, n, (float *const[]){hb, hb2}, NULL, NULL);
        nv_adapter_rows_add(ad, c, l, 4, xb, hb);
        nv_adapter_rows_add(ad, c, l, 6, xb, hb2);
        nv_pool_run(swiglu_rows_task, &glu, n < 2 * nv_pool_threads() ? n : 2 * nv_pool_threads());
    } else {
        nv_plan_run_group((const nv_plan *const[]){lp->w1, lp->w3}, 2, xb, n, (float *const[]){hb, hb2}, swiglu_ep, &glu);
    }
    const int apart2 = post || (res.scale != 1.0f && nv_adapter_rows_target(ad, 5));
    tail_ep res2 = {x, xb, NULL, d, n, 0, res.scale, NULL, NULL};
    nv_plan_run_group((const nv_plan *const[]){lp->w2}, 1, hb, n, (float *const[]){xb}, apart2 ? NULL : residual_ep, &res2);
    nv_adapter_rows_add(ad, c, l, 5, hb, apart2 ? xb : x);
    if (apart2) branch_residual(&res2, xb, post ? m->w.post_ffn + (size_t)l * d : NULL, c->norm_eps);
}

void nv_qkv_finish(const nv_model *m, int l, float *q, float *k, float *v, const float *cs, int pos) {
    const nv_config *c = &m->config;
    const int hd = c->head_dim;
    if (c->qkv_bias) {
        const int qd = nv_config_q_dim(c), kvd = nv_config_kv_dim(c);
        const float *bq = m->w.bq + (size_t)l * qd, *bk = m->w.bk + (size_t)l * kvd, *bv = m->w.bv + (size_t)l * kvd;
        for (int i = 0; i < qd; i++) q[i] += bq[i];
        for (int i = 0; i < kvd; i++) k[i] += bk[i];
        for (int i = 0; i < kvd; i++) v[i] += bv[i];
    }
    if (c->qk_norm) { /* each head, or (OLMo 2) the whole projection as one */
        const int qn = nv_config_q_norm_len(c), kn = nv_config_k_norm_len(c);
        for (int at = 0; at < nv_config_q_dim(c); at += qn) nv_rmsnorm(q + at, q + at, m->w.q_norm + (size_t)l * qn, qn, c->norm_eps);
        for (int at = 0; at < nv_config_kv_dim(c); at += kn) nv_rmsnorm(k + at, k + at, m->w.k_norm + (size_t)l * kn, kn, c->norm_eps);
    }
    if (cs) {
        nv_rope_apply(q, c->n_heads, hd, cs);
        nv_rope_apply(k, c->n_kv_heads, hd, cs);
    }
    const float temp = nv_config_attn_temp(c, pos);
    if (temp != 1.0f)
        for (int i = 0; i < nv_config_q_dim(c); i++) q[i] *= temp;
}

typedef struct {
    const nv_model *m;
    nv_state *s;
    float *kc, *vc;
    int l, n, pos;
} rows_job;

/* Rows task, task + n_tasks, ...: biases, QK-norm, RoPE, and the row's key and value into the cache. */
static void qkv_rows_task(void *ctx, int task, int n_tasks) {
    const rows_job *j = ctx;
    const nv_config *c = &j->m->config;
    nv_state *s = j->s;
    const int hd = c->head_dim, q_dim = nv_config_q_dim(c), kv_dim = nv_config_kv_dim(c);
    const float *rope = nv_rope_of_layer(c, s->rope, s->rope_swa, j->l);
    for (int t = task; t < j->n; t += n_tasks) {
        float *q = s->r.q + (size_t)t * q_dim, *k = s->r.k + (size_t)t * kv_dim;
        const int p = j->pos + t;
        nv_qkv_finish(j->m, j->l, q, k, s->r.v + (size_t)t * kv_dim, rope ? rope + (size_t)p * hd : NULL, p);
        /* per head: [kv_heads][slots][hd]; in a ring at p % ring and again a ring later */
        const int slots = s->layer_slots[j->l], ring = layer_ring(s, j->l);
        for (int copy = 0; copy < (ring ? 2 : 1); copy++)
            for (int hh = 0; hh < c->n_kv_heads; hh++) {
                const size_t at = ((size_t)hh * slots + (size_t)(ring ? p % ring + copy * ring : p)) * hd;
                memcpy(j->kc + at, k + (size_t)hh * hd, (size_t)hd * sizeof(float));
                memcpy(j->vc + at, s->r.v + (size_t)t * kv_dim + (size_t)hh * hd, (size_t)hd * sizeof(float));
            }
    }
}

static void layer_forward(const nv_model *m, nv_state *s, int l, int n, int pos) {
    const nv_layer_plans *lp = &m->plans[l];
    rows_job rj = {m, s, s->key_cache + s->layer_at[l], s->value_cache + s->layer_at[l], l, n, pos};
    nv_layer_input(m, l, 0, s->r.xb, s->r.x, n);
    nv_plan_run_group((const nv_plan *const[]){lp->wq, lp->wk, lp->wv}, 3, s->r.xb, n,
                      (float *const[]){s->r.q, s->r.k, s->r.v}, NULL, NULL);
    const int tasks = n < 4 ? 1 : 2 * nv_pool_threads();
    nv_pool_run(qkv_rows_task, &rj, tasks < n ? tasks : n);
    attention(m, s, l, rj.kc, rj.vc, n, pos);
    nv_layer_tail(m, l, n, &s->r, NULL);
}

nv_err nv_logits_reserve(float **logits, int *cap, int rows, int vocab) {
    if (rows <= *cap) return NV_OK;
    float *grown = realloc(*logits, (size_t)rows * (size_t)vocab * sizeof(float));
    if (!grown) return nv_fail(NV_ENOMEM, "out of memory for the logits of %d rows", rows);
    *logits = grown;
    *cap = rows;
    return NV_OK;
}

int nv_state_resumable(const nv_state *s, int pos) { return !s->ring || pos == 0 || pos >= s->hi - s->max_tokens - 1; }

nv_err nv_forward(const nv_model *m, nv_state *s, const int *tokens, int n, int pos) {
    return nv_forward_rows(m, s, tokens, n, pos, s->all_logits ? n : 1);
}

nv_err nv_forward_rows(const nv_model *m, nv_state *s, const int *tokens, int n, int pos, int rows) {
    const nv_config *c = &m->config;
    if (!m->plans) return nv_fail(NV_EINVAL, "forward: plans not built");
    if (rows < 1 || rows > n) return nv_fail(NV_EINVAL, "forward: the logits of %d of %d rows", rows, n);
    if (s->head_dim != c->head_dim || s->rope_key != nv_config_rope_key(c))
        return nv_fail(NV_EINVAL, "forward: the state was made for another model shape");
    if (n < 1 || n > s->max_tokens) return nv_fail(NV_EINVAL, "forward: %d tokens do not fit a chunk of %d", n, s->max_tokens);
    if (pos < 0 || pos + n > s->cache_len)
        return nv_fail(NV_ERANGE, "forward: positions %d..%d exceed the context of %d", pos, pos + n - 1, s->cache_len);
    if (!nv_state_resumable(s, pos))
        return nv_fail(NV_ERANGE, "forward: the windowed layers keep %d positions and have gone past %d; run again from position 0",
                       s->ring, pos);
    NV_TRY(nv_logits_reserve(&s->logits, &s->logit_cap, rows, c->vocab_size)); /* before any work: a failure changes nothing */
    int d = c->dim;
    for (int t = 0; t < n; t++) {
        if (tokens[t] < 0 || tokens[t] >= c->vocab_size)
            return nv_fail(NV_ERANGE, "forward: token id %d outside the vocabulary of %d", tokens[t], c->vocab_size);
        nv_embed(m, tokens[t], s->r.x + (size_t)t * d);
    }
    for (int l = 0; l < c->n_layers; l++) layer_forward(m, s, l, n, pos);
    s->hi = pos == 0 || pos + n > s->hi ? pos + n : s->hi;
    const int first = n - rows;
    nv_rmsnorm_rows(s->r.xb, s->r.x + (size_t)first * d, m->w.rms_final, rows, d, c->norm_eps);
    nv_plan_run(m->cls_plan, s->r.xb, rows, s->logits);
    nv_logits_finish(c, s->logits, rows);
    return NV_OK;
}
