/* LoRA adapters: every adapter tensor's gradient matches central finite differences (GQA, QK-norm,
 * biases, targets all or some); the adapted forward equals the merged model's; training moves the
 * adapters alone with plans built once; adapters round-trip through llama.cpp's GGUF form (qwen's
 * reordered rows included) and malformed files are refused; checkpoints keep the adapters and
 * version 1 files still load. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/hash.h"
#include "base/rng.h"
#include "engine/engine.h"
#include "model/gguf.h"
#include "model/lora.h"
#include "train/ckpt.h"
#include "train/optim.h"
#include "train/tmodel.h"
#include "base/mem.h"
#include "t.h"

static void make_batch(int n, int V, int *in, int *tg, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        in[i] = (int)(nv_xorshift_u32(&seed) % (unsigned)V);
        tg[i] = (int)(nv_xorshift_u32(&seed) % (unsigned)V);
    }
}

/* A base model whose every path carries a visible gradient: weights well past the 0.02 init, norms
 * around 1, biases set. */
static float *base_weights(const nv_config *c, uint64_t seed) {
    nv_model m;
    if (nv_model_alloc(&m, c) != NV_OK) return NULL;
    nv_model_init_random(&m, seed);
    nv_rng r;
    nv_rng_seed(&r, seed + 1);
    for (uint64_t i = 0; i < m.n_params; i++) m.params[i] *= 12.0f;
    const size_t nn = (size_t)c->n_layers * c->dim * 2 + c->dim;
    for (size_t i = 0; i < nn; i++) m.w.rms_att[i] = 1.0f + 0.3f * nv_rng_normal(&r);
    for (int i = 0; c->qk_norm && i < c->n_layers * c->head_dim; i++)
        m.w.q_norm[i] = 1.0f + 0.3f * nv_rng_normal(&r), m.w.k_norm[i] = 1.0f + 0.3f * nv_rng_normal(&r);
    for (int i = 0; c->qkv_bias && i < c->n_layers * nv_config_q_dim(c); i++) m.w.bq[i] = 0.5f * nv_rng_normal(&r);
    for (int i = 0; c->qkv_bias && i < c->n_layers * nv_config_kv_dim(c); i++)
        m.w.bk[i] = 0.5f * nv_rng_normal(&r), m.w.bv[i] = 0.5f * nv_rng_normal(&r);
    float *p = malloc((size_t)m.n_params * sizeof(float));
    if (p) memcpy(p, m.params, (size_t)m.n_params * sizeof(float));
    nv_model_free(&m);
    return p;
}

/* Adapters with B not zero (a fresh adapter's B is, which leaves A's gradient zero). */
static float *random_adapters(const nv_config *c, const nv_lora_shape *s, uint64_t seed, float b_scale) {
    const uint64_t n = nv_lora_param_count(c, s);
    float *p = malloc((size_t)n * sizeof(float));
    if (p) nv_lora_init_nonzero(c, s, p, seed, b_scale);
    return p;
}

static float fd_lora_dropout; /* the adapters' dropout in the loss checked (its mask fixed; no merged model to compare) */

static void check_fd(const nv_config *c, const nv_lora_shape *s, int B, int T) {
    float *base = base_weights(c, 5), *adapters = random_adapters(c, s, 11, 0.4f);
    nv_tmodel tm;
    nv_err e = base && adapters ? nv_tmodel_init_lora(&tm, c, base, 5, B, T, NV_ENGINE_SCALAR, s, adapters) : NV_ENOMEM;
    T_CHECK(e == NV_OK, "%s", nv_errmsg());
    if (e) {
        free(base), free(adapters);
        return;
    }
    T_CHECK(tm.grads == NULL && tm.n_train == nv_lora_param_count(c, s), "the base has gradients, or the block is %llu floats",
            (unsigned long long)tm.n_train);
    int in[64], tg[64];
    make_batch(B * T, c->vocab_size, in, tg, 77);
    T_CHECK(nv_tmodel_set_dropout(&tm, 0.0f, fd_lora_dropout, 31, 0) == NV_OK, "%s", nv_errmsg());
    const float loss = nv_tmodel_forward(&tm, in, tg);
    T_CHECK(isfinite(loss) && loss > 0, "loss %f", loss);
    nv_tmodel_backward(&tm, 1.0f);
    float *grads = malloc((size_t)tm.n_train * sizeof(float));
    memcpy(grads, tm.lora_grads, (size_t)tm.n_train * sizeof(float));

    /* the adapted forward is the merged model's: the same loss from a plain model */
    float *merged = malloc((size_t)nv_config_param_count(c) * sizeof(float));
    memcpy(merged, base, (size_t)nv_config_param_count(c) * sizeof(float));
    nv_model mm = {.config = *c};
    nv_weights_point(&mm.w, c, merged);
    mm.params = merged;
    nv_lora_merge(&mm, s, adapters, 1.0f);
    nv_tmodel plain;
    if (!fd_lora_dropout && nv_tmodel_init(&plain, c, merged, 5, B, T, NV_ENGINE_SCALAR) == NV_OK) {
        const float lp = nv_tmodel_forward(&plain, in, tg);
        T_CHECK(fabsf(lp - loss) <= 2e-5f * loss, "adapted loss %.7g, merged model's %.7g", loss, lp);
        nv_tmodel_free(&plain);
    }
    free(merged);

    const float h = fd_lora_dropout > 0 ? 3e-3f : 1e-2f; /* the kept inputs, 1 / (1 - p) larger, bend sooner */
    int bad = 0, checked = 0, rerouted = 0;
    float worst_an = 0, worst_fd = 0;
    /* a mixture of experts: an entry whose +-h moves a token's choice of experts (a jump in the loss) is
       skipped, and counted */
    nv_tmodel_forward(&tm, in, tg);
    const size_t n_sel = (size_t)c->n_layers * B * T * c->n_experts_used;
    int *sel = c->n_experts ? malloc(n_sel * sizeof(int)) : NULL;
    if (sel) memcpy(sel, tm.a.moe_sel, n_sel * sizeof(int));
    for (int l = 0; l < c->n_layers; l++)
        for (int t = 0; t < NV_LAYER_MATRICES; t++) {
            if (!(s->targets & (1u << t))) continue;
            int out, in_dim;
            nv_lora_dims(c, t, &out, &in_dim);
            const uint64_t off = nv_lora_offset(c, s, l, t);
            for (int half = 0; half < 2; half++) { /* A, then B^T: its largest gradient and 3 random entries */
                const uint64_t o0 = off + (half ? (uint64_t)s->rank * in_dim : 0), n = (uint64_t)s->rank * (half ? out : in_dim);
                uint64_t pick[4] = {0}, st = 1234 + (uint64_t)(l * 16 + t * 2 + half);
                for (uint64_t i = 1; i < n; i++)
                    if (fabsf(grads[o0 + i]) > fabsf(grads[o0 + pick[0]])) pick[0] = i;
                for (int j = 1; j < 4; j++) pick[j] = nv_xorshift_u32(&st) % n;
                for (int j = 0; j < 4; j++) {
                    float *p = &tm.lora_params[o0 + pick[j]];
                    const float orig = *p;
                    *p = orig + h;
                    nv_tmodel_refresh(&tm);
                    const double lp = nv_tmodel_forward(&tm, in, tg);
                    int same = !sel || !memcmp(sel, tm.a.moe_sel, n_sel * sizeof(int));
                    *p = orig - h;
                    nv_tmodel_refresh(&tm);
                    const double lm = nv_tmodel_forward(&tm, in, tg);
                    same &= !sel || !memcmp(sel, tm.a.moe_sel, n_sel * sizeof(int));
                    *p = orig;
                    nv_tmodel_refresh(&tm);
                    if (!same) {
                        rerouted++;
                        continue;
                    }
                    const float fd = (float)((lp - lm) / (2.0 * h)), an = grads[o0 + pick[j]];
                    checked++;
                    if (fabsf(fd - an) > 3e-4f + 3e-2f * fabsf(an)) bad++, worst_an = an, worst_fd = fd;
                }
            }
        }
    T_CHECK(bad == 0, "%d of %d adapter entries differ (e.g. analytic %.6g vs finite difference %.6g)", bad, checked, worst_an,
            worst_fd);
    /* the largest gradient of every tensor is not zero: every adapter is reached */
    T_CHECK(checked > 0 && rerouted * 4 <= checked, "%d checked, %d across a change of experts", checked, rerouted);
    if (sel) printf("    %d adapter entries checked, %d across a change of experts\n", checked, rerouted);
    free(sel);
    free(grads);
    nv_tmodel_free(&tm); /* before the frozen weights it used in place */
    free(base);
    free(adapters);
}

static void test_fd_all_targets_gqa(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape s = {3, 5.0f, NV_LORA_ALL};
    check_fd(&c, &s, 2, 5);
}

/* Granite's multipliers: the updates of wo and w2 join their products before the residual scaling */
static void test_fd_granite(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    nv_config_set_granite(&c, 3.0, 0.4, 0.3, 1.5);
    const nv_lora_shape s = {3, 5.0f, NV_LORA_ALL};
    check_fd(&c, &s, 2, 5);
}

/* the adapters' dropout (PEFT's lora_dropout), each adapter's mask its own: with the masks fixed,
 * every adapter's gradient, those reaching it through the dropped inputs of later ones included */
static void test_fd_lora_dropout(void) {
    fd_lora_dropout = 0.3f;
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape s = {3, 5.0f, NV_LORA_ALL};
    check_fd(&c, &s, 2, 5);
    nv_config q = {12, 20, 2, 2, 1, 8, 19, 8, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape u = {2, 2.0f, NV_LORA_Q | NV_LORA_O | NV_LORA_DOWN};
    check_fd(&q, &u, 2, 6);
    fd_lora_dropout = 0.0f;
}

/* gate adapted without up (SwiGLU's inputs changed before it), QK-norm and a separate classifier */
static void test_fd_some_targets_qknorm(void) {
    nv_config c = {12, 20, 2, 2, 1, 8, 19, 8, 10000.0f, 1e-5f, 0, 1, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape s = {2, 2.0f, NV_LORA_Q | NV_LORA_K | NV_LORA_O | NV_LORA_GATE};
    check_fd(&c, &s, 2, 6);
    const nv_lora_shape u = {4, 4.0f, NV_LORA_V | NV_LORA_UP | NV_LORA_DOWN};
    check_fd(&c, &u, 1, 7);
}

/* a mixture of experts: adapters on the attention, the gradient reaching them through the experts
 * and the router (frozen) */
static void test_fd_moe_attention(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    c.n_experts = 4, c.n_experts_used = 2;
    const nv_lora_shape s = {3, 5.0f, NV_LORA_ATTN};
    check_fd(&c, &s, 2, 5);
    const nv_lora_shape ffn = {3, 5.0f, NV_LORA_Q | NV_LORA_UP};
    T_CHECK(nv_lora_validate(&c, &ffn) == NV_EUNSUPPORTED && strstr(nv_errmsg(), "(gate, down, up)"), "%s", nv_errmsg());
}

static void test_fd_qkv_bias(void) {
    nv_config c = {16, 24, 1, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 1, NV_CONFIG_PLAIN};
    const nv_lora_shape s = {2, 3.0f, NV_LORA_ALL};
    check_fd(&c, &s, 2, 5);
}

/* The fastest floating-point engine's adapter gradients against fp32's. */
static void test_engine_matches_fp32(void) {
    const nv_engine_id e = nv_engine_best_float();
    nv_config c = {64, 96, 2, 4, 2, 16, 50, 32, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape s = {8, 16.0f, NV_LORA_ALL};
    float *base = base_weights(&c, 3), *adapters = random_adapters(&c, &s, 4, 0.05f);
    for (uint64_t i = 0; base && i < nv_config_param_count(&c); i++) base[i] /= 6.0f; /* a trained model's scale */
    const int B = 2, T = 32;
    int in[64], tg[64];
    make_batch(B * T, c.vocab_size, in, tg, 9);
    nv_tmodel a, b;
    T_CHECK(nv_tmodel_init_lora(&a, &c, base, 1, B, T, NV_ENGINE_SCALAR, &s, adapters) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_tmodel_init_lora(&b, &c, base, 1, B, T, e, &s, adapters) == NV_OK, "%s", nv_errmsg());
    const float la = nv_tmodel_forward(&a, in, tg), lb = nv_tmodel_forward(&b, in, tg);
    nv_tmodel_backward(&a, 1.0f);
    nv_tmodel_backward(&b, 1.0f);
    double num = 0, den = 0;
    for (uint64_t i = 0; i < a.n_train; i++) {
        const double d = (double)a.lora_grads[i] - b.lora_grads[i];
        num += d * d, den += (double)a.lora_grads[i] * a.lora_grads[i];
    }
    const double rel = sqrt(num / (den > 0 ? den : 1)), bound = nv_engine_low_precision(e) ? 3e-2 : 1e-4;
    T_CHECK(rel < bound && den > 0, "%s: adapter gradients %.3g from fp32's (bound %.0e)", nv_engine_name(e), rel, bound);
    T_CHECK(fabsf(la - lb) < 1e-2f * la, "%s: loss %g vs fp32's %g", nv_engine_name(e), lb, la);
    nv_tmodel_free(&a);
    nv_tmodel_free(&b);
    free(base);
    free(adapters);
}

/* Optimizer steps on stories260K: the frozen weights keep their bits, the adapters move, the loss on
 * the batch falls, no plan is rebuilt, and the memory estimate is a fraction of full training's. */
static void test_training_moves_adapters_only(void) {
    const char *path = t_data("models/stories260K.bin");
    if (!path) return;
    nv_model src;
    if (nv_model_load(path, &src) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    const nv_config *c = &src.config;
    const nv_lora_shape s = {8, 16.0f, NV_LORA_ALL};
    const int B = 4, T = 64;
    nv_tmodel tm;
    if (nv_tmodel_init_lora(&tm, c, src.params, 3, B, T, nv_engine_best_float(), &s, NULL) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        nv_model_free(&src);
        return;
    }
    const uint64_t before = nv_hash64(tm.m.params, (size_t)tm.m.n_params * sizeof(float), 0);
    float *start = malloc((size_t)tm.n_train * sizeof(float));
    memcpy(start, tm.lora_params, (size_t)tm.n_train * sizeof(float));
    nv_adamw opt;
    nv_adamw_opts o;
    nv_adamw_defaults(&o);
    o.lr = 3e-3f;
    o.total_steps = 20;
    T_CHECK(nv_adamw_init(&opt, &o, NULL, tm.n_train) == NV_OK, "%s", nv_errmsg());
    int in[256], tg[256];
    uint64_t st = 5;
    for (int i = 0; i < B * T; i++) in[i] = (int)(nv_xorshift_u32(&st) % 400) + 3;
    for (int i = 0; i < B * T; i++) tg[i] = i + 1 < B * T ? in[i + 1] : 3;
    float first = 0, last = 0;
    long builds = 0;
    for (int step = 0; step < 20; step++) {
        const float loss = nv_tmodel_forward(&tm, in, tg);
        nv_tmodel_backward(&tm, 1.0f);
        float lr;
        nv_tmodel_optimize(&tm, &opt, &lr);
        if (step == 0) first = loss, builds = nv_plan_builds();
        last = loss;
    }
    T_CHECK(last < first - 0.1f, "loss %g -> %g: the adapters did not learn the batch", first, last);
    T_CHECK(nv_plan_builds() == builds, "%ld plans built after step 1", nv_plan_builds() - builds);
    T_CHECK(nv_hash64(tm.m.params, (size_t)tm.m.n_params * sizeof(float), 0) == before, "the frozen weights changed");
    T_CHECK(memcmp(start, tm.lora_params, (size_t)tm.n_train * sizeof(float)) != 0, "the adapters did not move");
    /* the adapted model's forward through plans refreshed by the optimizer is the merged model's */
    const float adapted = nv_tmodel_forward(&tm, in, tg);
    T_CHECK(tm.m.params == src.params, "the frozen weights were copied");
    T_CHECK(nv_model_own_params(&tm.m) == NV_OK && tm.m.params != src.params, "no copy of its own to merge into");
    nv_lora_merge(&tm.m, &s, tm.lora_params, 1.0f);
    nv_tmodel plain;
    if (nv_tmodel_init(&plain, c, tm.m.params, 3, B, T, nv_engine_best_float()) == NV_OK) {
        const float merged = nv_tmodel_forward(&plain, in, tg);
        T_CHECK(fabsf(adapted - merged) < 2e-2f * merged, "adapted loss %g, merged model's %g", adapted, merged);
        nv_tmodel_free(&plain);
    }
    const double full = nv_tmodel_memory_bytes(c, B, T, NULL, 0), lora = nv_tmodel_memory_bytes(c, B, T, &s, 0);
    T_CHECK(lora < full, "LoRA's estimate %.0f is not below full training's %.0f", lora, full);
    nv_config big;
    nv_config_preset("qwen3-0.6B", &big);
    const double bf = nv_tmodel_memory_bytes(&big, 1, 64, NULL, 0), bl = nv_tmodel_memory_bytes(&big, 1, 64, &s, 0);
    T_CHECK(bl < 0.5 * bf, "qwen3-0.6B: LoRA %.2f GB against %.2f GB", bl / 1e9, bf / 1e9);
    nv_adamw_free(&opt);
    free(start);
    nv_tmodel_free(&tm);
    nv_model_free(&src);
}

static void test_shapes_and_targets(void) {
    unsigned m = 0;
    T_CHECK(nv_lora_parse_targets("q,v", &m) == NV_OK && m == (NV_LORA_Q | NV_LORA_V), "q,v -> %u", m);
    T_CHECK(nv_lora_parse_targets("attn,up", &m) == NV_OK && m == (NV_LORA_Q | NV_LORA_K | NV_LORA_V | NV_LORA_O | NV_LORA_UP),
            "attn,up -> %u", m);
    T_CHECK(nv_lora_parse_targets("all", &m) == NV_OK && m == NV_LORA_ALL, "all -> %u", m);
    const char *bad[] = {"", "q,", ",q", "x", "q,,v", "qq", "averyveryverylongname"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        T_CHECK(nv_lora_parse_targets(bad[i], &m) == NV_EINVAL && !strchr(nv_errmsg(), '\n'), "'%s' accepted", bad[i]);
    char text[64];
    T_CHECK(!strcmp(nv_lora_targets_text(NV_LORA_ALL, text, sizeof text), "q,k,v,o,gate,down,up"), "%s", text);
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape ok = {8, 16, NV_LORA_ALL}, big = {9, 16, NV_LORA_ALL}, none = {4, 4, 0}, neg = {4, -1, NV_LORA_Q},
                        nan_alpha = {4, NAN, NV_LORA_Q}, zero = {0, 1, NV_LORA_Q};
    T_CHECK(nv_lora_validate(&c, &ok) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_lora_validate(&c, &big) == NV_EINVAL && strstr(nv_errmsg(), "1 to 8"), "rank 9 of a 8-wide matrix: %s", nv_errmsg());
    T_CHECK(nv_lora_validate(&c, &none) == NV_EINVAL, "no targets accepted");
    T_CHECK(nv_lora_validate(&c, &neg) == NV_EINVAL && nv_lora_validate(&c, &nan_alpha) == NV_EINVAL, "bad alpha accepted");
    T_CHECK(nv_lora_validate(&c, &zero) == NV_EINVAL, "rank 0 accepted");
    /* offsets tile the block: each matrix's A and B^T right after the one before */
    uint64_t at = 0;
    for (int l = 0; l < c.n_layers; l++)
        for (int t = 0; t < NV_LAYER_MATRICES; t++) {
            int out, in;
            nv_lora_dims(&c, t, &out, &in);
            T_CHECK(nv_lora_offset(&c, &ok, l, t) == at, "layer %d matrix %d at %llu, expected %llu", l, t,
                    (unsigned long long)nv_lora_offset(&c, &ok, l, t), (unsigned long long)at);
            at += (uint64_t)ok.rank * (uint64_t)(in + out);
        }
    T_CHECK(at == nv_lora_param_count(&c, &ok), "count %llu, tiled %llu", (unsigned long long)nv_lora_param_count(&c, &ok),
            (unsigned long long)at);
}

/* W += k B A computed in double, against nv_lora_merge. */
static void test_merge_reference(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const nv_lora_shape s = {3, 4.5f, NV_LORA_O | NV_LORA_DOWN};
    float *base = base_weights(&c, 2), *ad = random_adapters(&c, &s, 3, 1.0f);
    const size_t n = (size_t)nv_config_param_count(&c);
    float *w = malloc(n * sizeof(float));
    memcpy(w, base, n * sizeof(float));
    nv_model m = {.config = c, .params = w, .n_params = n};
    nv_weights_point(&m.w, &c, w);
    nv_lora_merge(&m, &s, ad, 0.5f);
    nv_weights bw;
    nv_weights_point(&bw, &c, base);
    double worst = 0;
    for (int l = 0; l < c.n_layers; l++) {
        int out, in;
        nv_lora_dims(&c, 5, &out, &in);
        const float *a = ad + nv_lora_offset(&c, &s, l, 5), *bt = a + (size_t)s.rank * in;
        for (int o = 0; o < out; o++)
            for (int i = 0; i < in; i++) {
                double sum = 0;
                for (int r = 0; r < s.rank; r++) sum += (double)bt[(size_t)r * out + o] * a[(size_t)r * in + i];
                const size_t at = (size_t)l * out * in + (size_t)o * in + i;
                const double want = bw.w2[at] + 0.5 * 4.5 / 3 * sum;
                worst = fmax(worst, fabs(want - m.w.w2[at]) / (fabs(want) + 1e-3));
            }
    }
    T_CHECK(worst < 1e-4, "merged ffn_down off by %.3g relative", worst);
    T_CHECK(!memcmp(m.w.wq, bw.wq, (size_t)c.n_layers * nv_config_q_dim(&c) * c.dim * sizeof(float)), "an untargeted matrix changed");
    free(w), free(base), free(ad);
}

/* nerve's adapter file loads back exactly, in llama's and qwen3's row order (whose q and k rows of B
 * are stored reordered, as llama.cpp's converter writes them for that architecture). */
static void test_gguf_round_trip(void) {
    nv_config cs[2] = {{16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN},
                       {32, 48, 2, 4, 2, 8, 23, 8, 1e6f, 1e-6f, 1, 1, 0, {0}, 0, NV_CONFIG_PLAIN}};
    for (int k = 0; k < 2; k++) {
        const nv_lora_shape s = {4, 8.0f, k ? NV_LORA_ALL : (NV_LORA_Q | NV_LORA_V | NV_LORA_UP)};
        float *ad = random_adapters(&cs[k], &s, 21, 1.0f), *back = NULL;
        const char *path = t_path(k ? "qwen3.adapter.gguf" : "llama.adapter.gguf");
        T_CHECK(nv_gguf_save_lora(&cs[k], &s, ad, path) == NV_OK, "%s", nv_errmsg());
        nv_lora_shape r;
        T_CHECK(nv_gguf_load_lora(path, &cs[k], &r, &back) == NV_OK, "%s", nv_errmsg());
        T_CHECK(r.rank == s.rank && r.alpha == s.alpha && r.targets == s.targets, "shape %d/%g/%u back as %d/%g/%u", s.rank,
                (double)s.alpha, s.targets, r.rank, (double)r.alpha, r.targets);
        T_CHECK(back && !memcmp(back, ad, (size_t)nv_lora_param_count(&cs[k], &s) * sizeof(float)), "adapters differ after the round trip");
        free(back);
        back = NULL;
        /* the file itself: llama.cpp's names, types and dims */
        nv_gguf g;
        if (nv_gguf_open(path, &g) == NV_OK) {
            size_t len = 0;
            const char *arch = nv_gguf_string(&g, "general.architecture", &len);
            T_CHECK(arch && len == 5 && !memcmp(arch, k ? "qwen3" : "llama", 5), "architecture");
            const nv_gguf_kv *alpha = nv_gguf_find(&g, "adapter.lora.alpha");
            T_CHECK(alpha && alpha->type == 6, "adapter.lora.alpha is not an F32 value");
            const nv_gguf_tensor *a = nv_gguf_tensor_find(&g, "blk.1.attn_q.weight.lora_a"),
                                 *b = nv_gguf_tensor_find(&g, "blk.1.attn_q.weight.lora_b");
            T_CHECK(a && b && a->dims[0] == (uint64_t)cs[k].dim && a->dims[1] == 4 && b->dims[0] == 4 &&
                        b->dims[1] == (uint64_t)nv_config_q_dim(&cs[k]) && a->type == 0,
                    "lora_a/lora_b dims");
            if (k && b) { /* qwen's RoPE order: B's row 1 holds nerve's row 2 */
                const float *bt = ad + nv_lora_offset(&cs[k], &s, 1, 0) + (size_t)4 * cs[k].dim;
                float stored;
                memcpy(&stored, b->data + 1 * 4 * sizeof(float), sizeof stored); /* row 1, rank 0 */
                T_CHECK(stored == bt[2], "row 1 of qwen3's lora_b is %g, nerve's row 2 is %g", (double)stored, (double)bt[2]);
            }
            nv_gguf_close(&g);
        }
        /* another model's shape: refused */
        T_CHECK(nv_gguf_load_lora(path, &cs[1 - k], &r, &back) != NV_OK && back == NULL, "loaded for another model");
        free(ad);
    }
}

/* Writes a hand-made adapter: its KV pairs (general.type, adapter.type, architecture, alpha as
 * given) and tensors named, dims [d0, d1], F32 values 0.01 * i. */
typedef struct {
    const char *name;
    uint64_t d0, d1;
    size_t len; /* of the name; 0: strlen */
} adapter_tensor;
/* alpha_f32: adapter.lora.alpha as F32 (1e30 when 2), else as a string */
static void write_adapter(const char *path, const char *type, const char *atype, const char *arch, int alpha_f32,
                          const adapter_tensor *ts, int nt) {
    nv_buf w = {0};
    uint32_t u;
    uint64_t q;
    nv_buf_append(&w, "GGUF", 4);
    u = 3, nv_buf_append(&w, &u, 4);
    q = (uint64_t)nt, nv_buf_append(&w, &q, 8);
    q = 4, nv_buf_append(&w, &q, 8);
    const char *keys[3] = {"general.architecture", "general.type", "adapter.type"}, *vals[3] = {arch, type, atype};
    for (int i = 0; i < 3; i++) {
        q = strlen(keys[i]), nv_buf_append(&w, &q, 8), nv_buf_append(&w, keys[i], q);
        u = 8, nv_buf_append(&w, &u, 4);
        q = strlen(vals[i]), nv_buf_append(&w, &q, 8), nv_buf_append(&w, vals[i], q);
    }
    q = 18, nv_buf_append(&w, &q, 8), nv_buf_append(&w, "adapter.lora.alpha", 18);
    if (alpha_f32) {
        u = 6, nv_buf_append(&w, &u, 4);
        float a = alpha_f32 == 2 ? 1e30f : 8.0f;
        nv_buf_append(&w, &a, 4);
    } else {
        u = 8, nv_buf_append(&w, &u, 4);
        q = 1, nv_buf_append(&w, &q, 8), nv_buf_append(&w, "8", 1);
    }
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        q = ts[i].len ? ts[i].len : strlen(ts[i].name), nv_buf_append(&w, &q, 8), nv_buf_append(&w, ts[i].name, q);
        u = 2, nv_buf_append(&w, &u, 4);
        nv_buf_append(&w, &ts[i].d0, 8);
        nv_buf_append(&w, &ts[i].d1, 8);
        u = 0, nv_buf_append(&w, &u, 4);
        nv_buf_append(&w, &off, 8);
        off += (ts[i].d0 * ts[i].d1 * 4 + 31) / 32 * 32;
    }
    static const uint8_t zeros[32];
    nv_buf_append(&w, zeros, (32 - w.len % 32) % 32);
    for (int i = 0; i < nt; i++) {
        const uint64_t n = ts[i].d0 * ts[i].d1;
        for (uint64_t j = 0; j < n; j++) {
            float v = 0.01f * (float)j;
            nv_buf_append(&w, &v, 4);
        }
        nv_buf_append(&w, zeros, (32 - (n * 4) % 32) % 32);
    }
    nv_iov part = {w.data, w.len};
    nv_file_write_atomic(path, &part, 1);
    nv_buf_free(&w);
}

/* Adapters as llama.cpp's converter writes them, some layers only; and malformed ones, each
 * refused with one line. */
static void test_foreign_and_malformed_adapters(void) {
    nv_config c = {16, 24, 2, 4, 2, 4, 23, 8, 10000.0f, 1e-5f, 1, 0, 0, {0}, 0, NV_CONFIG_PLAIN};
    const char *path = t_path("hand.adapter.gguf");
    /* layer 1's q only, rank 2 */
    const adapter_tensor one[] = {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}, {"blk.1.attn_q.weight.lora_b", 2, 16, 0}};
    write_adapter(path, "adapter", "lora", "llama", 1, one, 2);
    nv_lora_shape s;
    float *p = NULL;
    T_CHECK(nv_gguf_load_lora(path, &c, &s, &p) == NV_OK, "%s", nv_errmsg());
    if (p) {
        T_CHECK(s.rank == 2 && s.alpha == 8.0f && s.targets == NV_LORA_Q, "shape %d %g %u", s.rank, (double)s.alpha, s.targets);
        const float *a0 = p + nv_lora_offset(&c, &s, 0, 0), *a1 = p + nv_lora_offset(&c, &s, 1, 0);
        int zero0 = 1;
        for (int i = 0; i < 2 * (16 + 16); i++) zero0 &= a0[i] == 0.0f;
        T_CHECK(zero0, "layer 0, absent from the file, is not zero");
        T_CHECK(a1[5] == 0.01f * 5.0f, "A[0][5] is %g", (double)a1[5]);
        /* B^T[r][o] is the file's B[o][r], value index o * 2 + r */
        const float *bt1 = a1 + 2 * 16;
        T_CHECK(bt1[1 * 16 + 3] == 0.01f * (3 * 2 + 1), "B^T[1][3] is %g", (double)bt1[1 * 16 + 3]);
        free(p);
    }
    struct {
        const char *what, *type, *atype, *arch;
        int alpha_f32;
        adapter_tensor t[2];
        int nt;
        const char *says;
    } bad[] = {
        {"not an adapter", "model", "lora", "llama", 1, {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}, {"blk.1.attn_q.weight.lora_b", 2, 16, 0}}, 2, "not an adapter"},
        {"a control vector", "adapter", "cvec", "llama", 1, {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}, {"blk.1.attn_q.weight.lora_b", 2, 16, 0}}, 2, "only LoRA"},
        {"another architecture", "adapter", "lora", "qwen2", 1, {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}, {"blk.1.attn_q.weight.lora_b", 2, 16, 0}}, 2, "architecture qwen2"},
        {"alpha as text", "adapter", "lora", "llama", 0, {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}, {"blk.1.attn_q.weight.lora_b", 2, 16, 0}}, 2, "not a number"},
        {"lora_b missing", "adapter", "lora", "llama", 1, {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}}, 1, "without lora_b"},
        {"lora_a not transposed", "adapter", "lora", "llama", 1, {{"blk.1.attn_q.weight.lora_a", 2, 16, 0}, {"blk.1.attn_q.weight.lora_b", 2, 16, 0}}, 2, "expected [16, rank]"},
        {"ranks differ", "adapter", "lora", "llama", 1, {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}, {"blk.1.attn_q.weight.lora_b", 3, 16, 0}}, 2, "one rank"},
        {"a layer past the model", "adapter", "lora", "llama", 1, {{"blk.2.attn_q.weight.lora_a", 16, 2, 0}, {"blk.2.attn_q.weight.lora_b", 2, 16, 0}}, 2, "not an adapter of"},
        {"the embedding", "adapter", "lora", "llama", 1, {{"token_embd.weight.lora_a", 16, 2, 0}, {"token_embd.weight.lora_b", 2, 23, 0}}, 2, "not an adapter of"},
        {"another suffix", "adapter", "lora", "llama", 1, {{"blk.1.attn_q.weight", 16, 16, 0}}, 1, "not an adapter of"},
        {"twice", "adapter", "lora", "llama", 1, {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}, {"blk.1.attn_q.weight.lora_a", 16, 2, 0}}, 2, "twice"},
        {"empty", "adapter", "lora", "llama", 1, {{"", 0, 0, 0}}, 0, "no tensors"},
        {"rank past the matrix", "adapter", "lora", "llama", 1, {{"blk.0.attn_k.weight.lora_a", 16, 9, 0}, {"blk.0.attn_k.weight.lora_b", 9, 8, 0}}, 2, "rank 9"},
        {"a NUL in a name", "adapter", "lora", "llama", 1,
         {{"blk.1.attn_q.weight\0.lora_a", 16, 2, 27}, {"blk.1.attn_q.weight.lora_b", 2, 16, 0}}, 2, "not an adapter of"},
        {"alpha past 1e6", "adapter", "lora", "llama", 2, {{"blk.1.attn_q.weight.lora_a", 16, 2, 0}, {"blk.1.attn_q.weight.lora_b", 2, 16, 0}}, 2, "at most 1e6"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_adapter(path, bad[i].type, bad[i].atype, bad[i].arch, bad[i].alpha_f32, bad[i].t, bad[i].nt);
        p = NULL;
        const nv_err e = nv_gguf_load_lora(path, &c, &s, &p);
        T_CHECK(e != NV_OK && p == NULL && strstr(nv_errmsg(), bad[i].says) && !strchr(nv_errmsg(), '\n'), "%s: %s", bad[i].what,
                e == NV_OK ? "accepted" : nv_errmsg());
        free(p);
    }
    /* a truncated file */
    write_adapter(path, "adapter", "lora", "llama", 1, one, 2);
    T_CHECK(truncate(path, 300) == 0, "truncate");
    T_CHECK(nv_gguf_load_lora(path, &c, &s, &p) == NV_EFORMAT, "truncated: %s", nv_errmsg());
}

/* A LoRA checkpoint keeps its adapters and shape; a version 1 checkpoint (the format before LoRA)
 * still loads; a LoRA header whose count does not fit its shape is refused. */
static void test_checkpoints(void) {
    nv_config c;
    nv_config_preset("stories260K", &c);
    const nv_lora_shape s = {4, 8.0f, NV_LORA_Q | NV_LORA_V};
    nv_ckpt_header h;
    memset(&h, 0, sizeof h);
    nv_ckpt_header_set_config(&h, &c);
    h.n_params = nv_lora_param_count(&c, &s);
    h.lora_rank = s.rank, h.lora_alpha = s.alpha, h.lora_targets = s.targets, h.base_hash = 99, h.step = 3;
    const size_t n = (size_t)h.n_params;
    float *p = calloc(3 * n, sizeof(float));
    for (size_t i = 0; i < 3 * n; i++) p[i] = (float)i;
    const char *path = t_path("lora.ckpt");
    T_CHECK(nv_ckpt_save(path, &h, p, p + n, p + 2 * n) == NV_OK, "%s", nv_errmsg());
    nv_ckpt k;
    T_CHECK(nv_ckpt_load(path, &k) == NV_OK, "%s", nv_errmsg());
    if (k.map.data) {
        T_CHECK(k.h.lora_rank == 4 && k.h.base_hash == 99 && k.h.lora_targets == s.targets && !memcmp(k.v, p + 2 * n, n * 4),
                "round trip");
        nv_ckpt_close(&k);
    }
    h.n_params += 1;
    float *q = calloc(3 * (n + 1), sizeof(float));
    T_CHECK(nv_ckpt_save(path, &h, q, q + n + 1, q + 2 * n + 2) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_ckpt_load(path, &k) == NV_EFORMAT && strstr(nv_errmsg(), "does not match"), "a wrong count: %s", nv_errmsg());
    h.n_params = n;
    h.lora_rank = 100000;
    T_CHECK(nv_ckpt_save(path, &h, p, p + n, p + 2 * n) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_ckpt_load(path, &k) == NV_EFORMAT && strstr(nv_errmsg(), "rank"), "rank 100000: %s", nv_errmsg());
    free(q);
    free(p);

    /* version 1: a 120-byte header and the whole model's state, checksummed part by part */
    memset(&h, 0, sizeof h);
    nv_ckpt_header_set_config(&h, &c);
    h.n_params = nv_config_param_count(&c);
    h.step = 5;
    const size_t m = (size_t)h.n_params;
    float *w = calloc(3 * m, sizeof(float));
    for (size_t i = 0; i < 3 * m; i++) w[i] = (float)(i % 1000) * 1e-3f;
    uint32_t version = 1, hbytes = 120;
    uint64_t sum = nv_checksum64("NVCKPT01", 8, 0);
    sum = nv_checksum64(&version, 4, sum);
    sum = nv_checksum64(&hbytes, 4, sum);
    sum = nv_checksum64(&h, 120, sum);
    for (int part = 0; part < 3; part++) sum = nv_checksum64(w + part * m, m * 4, sum);
    nv_iov parts[] = {{"NVCKPT01", 8}, {&version, 4}, {&hbytes, 4}, {&h, 120}, {w, 3 * m * 4}, {&sum, 8}};
    const char *v1 = t_path("v1.ckpt");
    T_CHECK(nv_file_write_atomic(v1, parts, 6) == NV_OK, "%s", nv_errmsg());
    T_CHECK(nv_ckpt_load(v1, &k) == NV_OK, "a version 1 checkpoint: %s", nv_errmsg());
    if (k.map.data) {
        T_CHECK(k.h.step == 5 && k.h.lora_rank == 0 && k.h.n_params == m && !memcmp(k.m, w + m, m * 4), "version 1 read back");
        nv_ckpt_close(&k);
    }
    free(w);
}


/* NV_TMODEL_RELEASE_BASE: on every engine that packs its own copy, the frozen matrices' fp32 pages
 * go (they read zeros after, in an anonymous block), the token embedding and norms stay, and the
 * steps are the same bits as with the base kept; scalar, which multiplies by the caller's floats,
 * keeps them. */
static void test_released_base(void) {
    const char *path = t_data("models/stories260K.bin");
    nv_model src;
    if (!path || nv_model_load(path, &src) != NV_OK) {
        T_CHECK(!path, "%s", nv_errmsg());
        return;
    }
    const nv_config *c = &src.config;
    const size_t n = (size_t)src.n_params;
    const nv_lora_shape s = {4, 8.0f, NV_LORA_ALL};
    const int B = 2, T = 32;
    int in[64], tg[64];
    uint64_t st = 9;
    for (int i = 0; i < B * T; i++) in[i] = (int)(nv_xorshift_u32(&st) % 400) + 3;
    for (int i = 0; i < B * T; i++) tg[i] = i + 1 < B * T ? in[i + 1] : 3;
    const nv_engine_id engines[] = {NV_ENGINE_SCALAR, NV_ENGINE_AVX2, NV_ENGINE_AVX512, NV_ENGINE_AVX512_BF16, NV_ENGINE_AMX_BF16};
    T_CHECK(nv_engines_init(NULL, 0) == NV_OK, "%s", nv_errmsg());
    int ran = 0;
    for (size_t k = 0; k < sizeof engines / sizeof *engines; k++) {
        const nv_engine_id e = engines[k];
        if (!nv_engine_available(e)) continue;
        /* the base in an anonymous block of whole pages, as a decomposed GGUF file's */
        float *kept = nv_reserve_zeroed(n * sizeof(float)), *given = nv_reserve_zeroed(n * sizeof(float));
        memcpy(kept, src.params, n * sizeof(float));
        memcpy(given, src.params, n * sizeof(float));
        nv_tmodel a, b;
        T_CHECK(nv_tmodel_init_ex(&a, c, kept, 3, B, T, e, &s, NULL, 0) == NV_OK, "%s", nv_errmsg());
        T_CHECK(nv_tmodel_init_ex(&b, c, given, 3, B, T, e, &s, NULL, NV_TMODEL_RELEASE_BASE) == NV_OK, "%s", nv_errmsg());
        const int packs = e != NV_ENGINE_SCALAR;
        ran += packs;
        T_CHECK(!a.base_released && b.base_released == packs, "%s: released %d", nv_engine_name(e), b.base_released);
        nv_weights w;
        nv_weights_point(&w, c, given);
        /* a whole page inside the first layer's w1 (172 x 64 floats) reads zeros where it went */
        const float *page = (const float *)(((uintptr_t)w.w1 + 4095) & ~(uintptr_t)4095);
        float sum = 0;
        for (int i = 0; i < 1024; i++) sum += fabsf(page[i]);
        T_CHECK(packs ? sum == 0 : sum > 0, "%s: the frozen w1 %s", nv_engine_name(e), packs ? "was kept" : "was let go");
        T_CHECK(!memcmp(w.tok_emb, src.w.tok_emb, (size_t)c->vocab_size * c->dim * sizeof(float)) &&
                    !memcmp(w.rms_att, src.w.rms_att, (size_t)c->n_layers * c->dim * sizeof(float)),
                "%s: the embedding or the norms changed", nv_engine_name(e));
        nv_adamw oa, ob;
        nv_adamw_opts o;
        nv_adamw_defaults(&o);
        o.lr = 3e-3f;
        o.total_steps = 3;
        T_CHECK(nv_adamw_init(&oa, &o, NULL, a.n_train) == NV_OK && nv_adamw_init(&ob, &o, NULL, b.n_train) == NV_OK, "%s", nv_errmsg());
        for (int step = 0; step < 3; step++) {
            const float la = nv_tmodel_forward(&a, in, tg), lb = nv_tmodel_forward(&b, in, tg);
            T_CHECK(la == lb, "%s: step %d's loss %.9g, with the base kept %.9g", nv_engine_name(e), step, lb, la);
            nv_tmodel_backward(&a, 1.0f);
            nv_tmodel_backward(&b, 1.0f);
            float lr;
            nv_tmodel_optimize(&a, &oa, &lr);
            nv_tmodel_optimize(&b, &ob, &lr);
        }
        T_CHECK(!memcmp(a.lora_params, b.lora_params, (size_t)a.n_train * sizeof(float)), "%s: the adapters differ",
                nv_engine_name(e));
        /* a refresh (a resumed or data-parallel run's) leaves the frozen plans as they are */
        nv_tmodel_refresh(&a);
        nv_tmodel_refresh(&b);
        T_CHECK(nv_tmodel_forward(&a, in, tg) == nv_tmodel_forward(&b, in, tg), "%s: the loss after a refresh differs",
                nv_engine_name(e));
        /* its plans cannot be built again from what is left */
        T_CHECK(!packs || nv_model_build_plans(&b.m, e) == NV_EINVAL, "%s: plans rebuilt from released weights", nv_engine_name(e));
        nv_adamw_free(&oa);
        nv_adamw_free(&ob);
        nv_tmodel_free(&a);
        nv_tmodel_free(&b);
        nv_reserve_free(kept, n * sizeof(float));
        nv_reserve_free(given, n * sizeof(float));
    }
    T_CHECK(ran >= 1, "no engine that packs its weights ran");
    nv_config big;
    nv_config_preset("qwen3-0.6B", &big);
    const double whole = nv_tmodel_memory_bytes(&big, 1, 64, &s, 0), given = nv_tmodel_memory_bytes(&big, 1, 64, &s, NV_TMODEL_RELEASE_BASE);
    T_CHECK(given < 0.75 * whole, "qwen3-0.6B: released %.2f GB against %.2f GB", given / 1e9, whole / 1e9);
    nv_model_free(&src);
}

int main(void) {
    T_RUN(test_shapes_and_targets);
    T_RUN(test_fd_all_targets_gqa);
    T_RUN(test_fd_granite);
    T_RUN(test_fd_lora_dropout);
    T_RUN(test_fd_some_targets_qknorm);
    T_RUN(test_fd_qkv_bias);
    T_RUN(test_fd_moe_attention);
    T_RUN(test_engine_matches_fp32);
    T_RUN(test_merge_reference);
    T_RUN(test_training_moves_adapters_only);
    T_RUN(test_released_base);
    T_RUN(test_gguf_round_trip);
    T_RUN(test_foreign_and_malformed_adapters);
    T_RUN(test_checkpoints);
    return t_done();
}
