#include "model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/pool.h"
#include "base/rng.h"

static const char *const target_names[NV_LAYER_MATRICES] = {"q", "k", "v", "o", "gate", "down", "up"};

nv_err nv_lora_parse_targets(const char *spec, unsigned *mask) {
    unsigned m = 0;
    const char *p = spec;
    while (1) {
        const size_t n = strcspn(p, ",");
        char word[16];
        if (n == 0 || n >= sizeof word)
            return nv_fail(NV_EINVAL, "LoRA targets \"%s\": a comma-separated list of q, k, v, o, gate, down, up, attn, ffn or all",
                           spec);
        memcpy(word, p, n);
        word[n] = 0;
        unsigned bit = 0;
        for (int t = 0; t < NV_LAYER_MATRICES; t++)
            if (!strcmp(word, target_names[t])) bit = 1u << t;
        if (!strcmp(word, "attn")) bit = NV_LORA_ATTN;
        else if (!strcmp(word, "ffn")) bit = NV_LORA_FFN;
        else if (!strcmp(word, "all")) bit = NV_LORA_ALL;
        if (!bit)
            return nv_fail(NV_EINVAL, "LoRA targets: \"%s\" is not one of q, k, v, o, gate, down, up, attn, ffn, all", word);
        m |= bit;
        if (!p[n]) break;
        p += n + 1;
    }
    *mask = m;
    return NV_OK;
}

const char *nv_lora_targets_text(unsigned mask, char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    for (int t = 0; t < NV_LAYER_MATRICES; t++)
        if (mask & (1u << t) && len < cap) len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? "," : "", target_names[t]);
    return out;
}

void nv_lora_dims(const nv_config *c, int t, int *out, int *in) {
    const int d = c->dim, q = nv_config_q_dim(c), kv = nv_config_kv_dim(c), h = c->hidden_dim;
    static const int which[NV_LAYER_MATRICES][2] = {{1, 0}, {2, 0}, {2, 0}, {0, 1}, {3, 0}, {0, 3}, {3, 0}};
    const int size[4] = {d, q, kv, h};
    *out = size[which[t][0]];
    *in = size[which[t][1]];
}

/* Floats of a layer's adapters on its matrices before t (t = NV_LAYER_MATRICES: all of them). */
static uint64_t layer_prefix(const nv_config *c, const nv_lora_shape *s, int t) {
    uint64_t n = 0;
    for (int u = 0; u < t; u++) {
        int out, in;
        nv_lora_dims(c, u, &out, &in);
        if (s->targets & (1u << u)) n += (uint64_t)s->rank * (uint64_t)(out + in);
    }
    return n;
}

uint64_t nv_lora_param_count(const nv_config *c, const nv_lora_shape *s) {
    return s->rank > 0 ? layer_prefix(c, s, NV_LAYER_MATRICES) * (uint64_t)c->n_layers : 0;
}

uint64_t nv_lora_offset(const nv_config *c, const nv_lora_shape *s, int l, int t) {
    return layer_prefix(c, s, NV_LAYER_MATRICES) * (uint64_t)l + layer_prefix(c, s, t);
}

nv_err nv_lora_validate(const nv_config *c, const nv_lora_shape *s) {
    if (!(s->targets & NV_LORA_ALL) || (s->targets & ~NV_LORA_ALL))
        return nv_fail(NV_EINVAL, "LoRA needs at least one target matrix (q, k, v, o, gate, down, up)");
    if (c->n_experts && (s->targets & NV_LORA_FFN)) /* one gate, down, up a layer: a mixture has E of each */
        return nv_fail(NV_EUNSUPPORTED, "LoRA adapters on a mixture of experts' FFN (gate, down, up) are not supported: "
                                        "adapt its attention (q, k, v, o)");
    if (!isfinite(s->alpha) || s->alpha <= 0 || s->alpha > 1e6f)
        return nv_fail(NV_EINVAL, "LoRA alpha %g: must be above 0 and at most 1e6", (double)s->alpha);
    for (int t = 0; t < NV_LAYER_MATRICES; t++) {
        int out, in;
        nv_lora_dims(c, t, &out, &in);
        const int most = out < in ? out : in;
        if (s->targets & (1u << t) && (s->rank < 1 || s->rank > most || s->rank > 1024))
            return nv_fail(NV_EINVAL, "LoRA rank %d: must be 1 to %d for this model (its %s matrix is %d x %d)", s->rank,
                           most < 1024 ? most : 1024, target_names[t], out, in);
    }
    return NV_OK;
}

void nv_lora_init(const nv_config *c, const nv_lora_shape *s, float *p, uint64_t seed) {
    nv_rng r;
    nv_rng_seed(&r, seed ^ 0x4c6f5241ull); /* apart from the base model's own initialisation stream */
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < NV_LAYER_MATRICES; t++) {
            if (!(s->targets & (1u << t))) continue;
            int out, in;
            nv_lora_dims(c, t, &out, &in);
            float *a = p + nv_lora_offset(c, s, l, t), *bt = a + (size_t)s->rank * in;
            const float bound = 1.0f / sqrtf((float)in);
            for (size_t i = 0; i < (size_t)s->rank * in; i++) a[i] = (2.0f * nv_rng_uniform(&r) - 1.0f) * bound;
            memset(bt, 0, (size_t)s->rank * out * sizeof(float));
        }
}

typedef struct {
    float *w;
    const float *a, *bt;
    int out, in, rank;
    float k;
} merge_job;

static void merge_task(void *ctx, int task, int n_tasks) {
    const merge_job *j = ctx;
    const int o0 = (int)((long)j->out * task / n_tasks), o1 = (int)((long)j->out * (task + 1) / n_tasks);
    for (int o = o0; o < o1; o++) {
        float *wr = j->w + (size_t)o * j->in;
        for (int r = 0; r < j->rank; r++) {
            const float b = j->k * j->bt[(size_t)r * j->out + o];
            const float *ar = j->a + (size_t)r * j->in;
            for (int i = 0; i < j->in; i++) wr[i] += b * ar[i];
        }
    }
}

void nv_lora_merge_matrix(float *w, int out, int in, int rank, const float *a, const float *bt, float k) {
    merge_job j = {w, a, bt, out, in, rank, k};
    const int tasks = 2 * nv_pool_threads();
    nv_pool_run(merge_task, &j, out < tasks ? out : tasks);
}

void nv_lora_merge(nv_model *m, const nv_lora_shape *s, const float *p, float scale) {
    const nv_config *c = &m->config;
    const float k = scale * s->alpha / (float)s->rank;
    float *const base[NV_LAYER_MATRICES] = {m->w.wq, m->w.wk, m->w.wv, m->w.wo, m->w.w1, m->w.w2, m->w.w3};
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < NV_LAYER_MATRICES; t++) {
            if (!(s->targets & (1u << t))) continue;
            int out, in;
            nv_lora_dims(c, t, &out, &in);
            const float *a = p + nv_lora_offset(c, s, l, t);
            nv_lora_merge_matrix(base[t] + (size_t)l * out * in, out, in, s->rank, a, a + (size_t)s->rank * in, k);
            /* a GGUF file's quantized (or fp16) source no longer holds this matrix: plans must take
               the merged fp32 weights */
            if (m->quant) nv_qmatrix_drop(&m->quant[l * NV_LAYER_MATRICES + t]);
        }
}

void nv_lora_init_nonzero(const nv_config *c, const nv_lora_shape *s, float *p, uint64_t seed, float b_scale) {
    nv_lora_init(c, s, p, seed);
    nv_rng r;
    nv_rng_seed(&r, seed + 9);
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < NV_LAYER_MATRICES; t++) {
            if (!(s->targets & (1u << t))) continue;
            int out, in;
            nv_lora_dims(c, t, &out, &in);
            float *bt = p + nv_lora_offset(c, s, l, t) + (size_t)s->rank * in;
            for (size_t i = 0; i < (size_t)s->rank * out; i++) bt[i] = b_scale * nv_rng_normal(&r);
        }
}
