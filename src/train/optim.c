#include "train/optim.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/pool.h"
#include "model/model.h"

void nv_adamw_defaults(nv_adamw_opts *o) {
    o->lr = 1e-3f;
    o->min_lr_frac = 0.1f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eps = 1e-8f;
    o->weight_decay = 0.1f;
    o->grad_clip = 1.0f;
    o->warmup_steps = 0;
    o->total_steps = 1;
    o->decay_embeddings = 0;
    o->schedule = NV_LR_COSINE;
    o->decay_frac = 0.2f;
}

nv_err nv_adamw_init(nv_adamw *a, const nv_adamw_opts *o, const nv_config *c, uint64_t n_params) {
    memset(a, 0, sizeof *a);
    a->o = *o;
    a->n = n_params;
    a->m = nv_calloc_large((size_t)n_params, sizeof(float));
    a->v = nv_calloc_large((size_t)n_params, sizeof(float));
    a->decay = calloc((size_t)n_params, 1);
    if (!a->m || !a->v || !a->decay) {
        nv_adamw_free(a);
        return nv_fail(NV_ENOMEM, "cannot allocate optimizer state");
    }
    if (!c) { /* a block of matrices alone (LoRA adapters): all decay */
        memset(a->decay, 1, (size_t)n_params);
        return NV_OK;
    }
    /* Mark the matrices: point a weights struct at a block of the same layout, read offsets. */
    nv_weights w;
    nv_weights_point(&w, c, a->m);
    const float *base = a->m;
    size_t L = (size_t)c->n_layers, d = (size_t)c->dim, h = (size_t)c->hidden_dim, V = (size_t)c->vocab_size;
    size_t qd = (size_t)nv_config_q_dim(c), kvd = (size_t)nv_config_kv_dim(c), sets = (size_t)nv_config_ffn_sets(c);
    struct {
        const float *p;
        size_t n;
    } mats[] = {{w.wq, L * qd * d}, {w.wk, L * kvd * d}, {w.wv, L * kvd * d}, {w.wo, L * d * qd},
                {w.w1, L * sets * h * d},   {w.w2, L * sets * d * h},   {w.w3, L * sets * h * d},
                {w.router, L * (size_t)c->n_experts * d}, /* NULL in a dense model */
                {c->shared_classifier ? NULL : w.wcls, V * d},
                {o->decay_embeddings ? w.tok_emb : NULL, V * d}};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
        if (mats[i].p) memset(a->decay + (mats[i].p - base), 1, mats[i].n);
    return NV_OK;
}

void nv_adamw_free(nv_adamw *a) {
    free(a->m);
    free(a->v);
    free(a->decay);
    memset(a, 0, sizeof *a);
}

nv_err nv_lr_schedule_parse(const char *name, nv_lr_schedule *out) {
    static const char *const names[] = {"cosine", "linear", "constant", "wsd"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(name, names[i])) {
            *out = (nv_lr_schedule)i;
            return NV_OK;
        }
    return nv_fail(NV_EINVAL, "unknown learning-rate schedule '%s' (cosine, linear, constant or wsd)", name);
}

float nv_lr_at(const nv_adamw_opts *o, long step) {
    if (o->warmup_steps > 0 && step < o->warmup_steps) return o->lr * (float)(step + 1) / (float)o->warmup_steps;
    long span = o->total_steps - o->warmup_steps;
    if (span <= 0 || o->schedule == NV_LR_CONSTANT) return o->lr;
    double frac = (double)(step - o->warmup_steps) / (double)span;
    if (o->schedule == NV_LR_WSD) { /* stable, then the decay over the last decay_frac of all the steps */
        const double decay = (double)o->decay_frac * (double)o->total_steps, from = (double)o->total_steps - decay;
        if ((double)step < from || decay <= 0) return o->lr;
        frac = ((double)step - from) / decay;
    }
    if (frac > 1.0) frac = 1.0;
    double floor_lr = (double)o->lr * o->min_lr_frac;
    if (o->schedule != NV_LR_COSINE) return (float)((double)o->lr - ((double)o->lr - floor_lr) * frac);
    return (float)(floor_lr + 0.5 * ((double)o->lr - floor_lr) * (1.0 + cos(M_PI * frac)));
}

/* Both passes are memory-bound: split into fixed chunks over the pool. The chunking does not
 * depend on the thread count, and partial sums are added in chunk order, so results are the same
 * on any number of threads (resume stays bit-exact). */
#define OPT_CHUNKS 64

typedef struct {
    const float *g;
    uint64_t n;
    double partial[OPT_CHUNKS];
} norm_job;

#define NORM_SIDE 4 /* chunks summed side by side by one task */

/* Chunks task*4 .. task*4+3, each its own left-to-right double sum of squares (the same value as
 * alone): four independent chains in flight instead of one add waiting on the last, ~3x faster. */
static void norm_task(void *ctx, int task, int n_tasks) {
    (void)n_tasks;
    norm_job *j = ctx;
    uint64_t a[NORM_SIDE], b[NORM_SIDE];
    double s[NORM_SIDE];
    for (int q = 0; q < NORM_SIDE; q++) {
        const uint64_t c = (uint64_t)(task * NORM_SIDE + q);
        a[q] = j->n * c / OPT_CHUNKS;
        b[q] = j->n * (c + 1) / OPT_CHUNKS;
        s[q] = 0.0;
    }
    uint64_t common = b[0] - a[0];
    for (int q = 1; q < NORM_SIDE; q++) common = b[q] - a[q] < common ? b[q] - a[q] : common;
    const float *g0 = j->g + a[0], *g1 = j->g + a[1], *g2 = j->g + a[2], *g3 = j->g + a[3];
    for (uint64_t i = 0; i < common; i++) {
        s[0] += (double)g0[i] * g0[i];
        s[1] += (double)g1[i] * g1[i];
        s[2] += (double)g2[i] * g2[i];
        s[3] += (double)g3[i] * g3[i];
    }
    for (int q = 0; q < NORM_SIDE; q++) {
        for (uint64_t i = a[q] + common; i < b[q]; i++) s[q] += (double)j->g[i] * j->g[i];
        j->partial[task * NORM_SIDE + q] = s[q];
    }
}

double nv_grad_norm(const float *g, uint64_t n) {
    norm_job j = {g, n, {0}};
    nv_pool_run(norm_task, &j, OPT_CHUNKS / NORM_SIDE);
    double s = 0.0;
    for (int i = 0; i < OPT_CHUNKS; i++) s += j.partial[i];
    return sqrt(s);
}

void nv_adamw_range(const nv_adamw *a, const nv_adamw_update *u, float *params, const float *grads, uint64_t lo,
                    uint64_t hi) {
    const nv_adamw_opts *o = &a->o;
    float b1 = o->beta1, b2 = o->beta2, wd = o->weight_decay, eps = o->eps;
    float clip = u->clip, lr = u->lr, ibc1 = 1.0f / u->bc1, ibc2 = 1.0f / u->bc2;
    float *p = params, *m = a->m, *v = a->v;
    const float *gr = grads;
    const uint8_t *dk = a->decay;
    /* 8 lanes with the scalar loop's operations in its order (no fused multiply-add): the same bits */
    const __m256 vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2), vc1 = _mm256_set1_ps(1.0f - b1),
                 vc2 = _mm256_set1_ps(1.0f - b2), vwd = _mm256_set1_ps(wd), veps = _mm256_set1_ps(eps),
                 vclip = _mm256_set1_ps(clip), vlr = _mm256_set1_ps(lr), vi1 = _mm256_set1_ps(ibc1),
                 vi2 = _mm256_set1_ps(ibc2);
    uint64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(gr + i), vclip), pi = _mm256_loadu_ps(p + i);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(vc1, g));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + i)), _mm256_mul_ps(_mm256_mul_ps(vc2, g), g));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        __m256 update = _mm256_div_ps(_mm256_mul_ps(mi, vi1), _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(vi, vi2)), veps));
        __m128i d8 = _mm_loadl_epi64((const __m128i *)(dk + i));
        __m256 decay = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(d8), _mm256_setzero_si256()));
        update = _mm256_blendv_ps(update, _mm256_add_ps(update, _mm256_mul_ps(vwd, pi)), decay);
        _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_mul_ps(vlr, update)));
    }
    for (; i < hi; i++) {
        float g = gr[i] * clip;
        float mi = m[i] = b1 * m[i] + (1.0f - b1) * g;
        float vi = v[i] = b2 * v[i] + (1.0f - b2) * g * g;
        float update = (mi * ibc1) / (sqrtf(vi * ibc2) + eps);
        if (dk[i]) update += wd * p[i];
        p[i] -= lr * update;
    }
}

float nv_adamw_count(nv_adamw *a) { return nv_lr_at(&a->o, a->step++); }

nv_adamw_update nv_adamw_begin(nv_adamw *a, const float *grads) {
    const nv_adamw_opts *o = &a->o;
    nv_adamw_update u;
    u.norm = nv_grad_norm(grads, a->n);
    u.skip = !isfinite(u.norm);
    u.clip = 1.0f;
    if (o->grad_clip > 0 && u.norm > o->grad_clip) u.clip = (float)(o->grad_clip / u.norm);
    u.lr = nv_adamw_count(a);
    u.bc1 = 1.0f - powf(o->beta1, (float)a->step);
    u.bc2 = 1.0f - powf(o->beta2, (float)a->step);
    return u;
}

typedef struct {
    const nv_adamw *a;
    const nv_adamw_update *u;
    float *params;
    const float *grads;
} adam_job;

static void adam_task(void *ctx, int task, int n_tasks) {
    const adam_job *j = ctx;
    const uint64_t n = j->a->n;
    nv_adamw_range(j->a, j->u, j->params, j->grads, n * (uint64_t)task / (uint64_t)n_tasks,
                   n * (uint64_t)(task + 1) / (uint64_t)n_tasks);
}

double nv_adamw_step(nv_adamw *a, float *params, const float *grads, float *lr_out) {
    const nv_adamw_update u = nv_adamw_begin(a, grads);
    adam_job j = {a, &u, params, grads};
    if (!u.skip) nv_pool_run(adam_task, &j, OPT_CHUNKS);
    if (lr_out) *lr_out = u.lr;
    return u.norm;
}
